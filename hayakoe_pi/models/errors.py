"""The model side's one error: a model file missing, unreadable or not fitting the others.

Every problem with the model files is reported as one ModelError naming the
file and what is wrong with it.
"""

from __future__ import annotations

from pathlib import Path


class ModelError(Exception):
    """A model file is missing, unreadable or does not fit the others."""


def _reason(e: Exception) -> str:
    """ONNX Runtime's message, its first line (the rest is a stack of its own)."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def unreadable(what: str, path: Path, e: Exception) -> ModelError:
    reason = _reason(e)
    return ModelError(f"{what} {path} cannot be loaded ({reason}); the file is probably truncated "
                      "or corrupted: download it again")


class DerivedFileError(ModelError):
    """A file prepare made (`path`: an optimized copy) cannot be loaded: it is made again,
    never blamed on the model file it was made from."""

    def __init__(self, message: str, path: Path, reason: str):
        super().__init__(message)
        self.path, self.reason = path, reason


def unreadable_derived(what: str, copy: Path, e: Exception) -> DerivedFileError:
    reason = _reason(e)
    return DerivedFileError(f"the prepared copy of the {what}, {copy}, cannot be loaded ({reason}); "
                            "`hayakoe-pi prepare` makes it again", copy, reason)
