"""hayakoe-pi: offline Japanese speech for Home Assistant on a Raspberry Pi."""

from .engine import Engine
from .models.errors import ModelError
from .text import TextError

__all__ = ["Engine", "ModelError", "TextError"]
__version__ = "0.1.0"
