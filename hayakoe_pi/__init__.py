"""hayakoe-pi: offline Japanese speech for Home Assistant on a Raspberry Pi."""

import os

# onnxruntime writes a telemetry device id and database into ~/.cache/Microsoft/DeveloperTools/
# when it is imported (`sudo hayakoe-pi ...` left them in /root/.cache); not with this set first.
# Child processes (prepare's steps) inherit it.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

from .synthesis.engine import Engine
from .models.errors import ModelError
from .text import TextError

__all__ = ["Engine", "ModelError", "TextError"]
__version__ = "0.1.0"
