"""The model side's one error: a model file missing, unreadable or not fitting the others.

Every problem with the model files is reported as one ModelError naming the
file and what is wrong with it.
"""

from __future__ import annotations

from pathlib import Path


class ModelError(Exception):
    """A model file is missing, unreadable or does not fit the others."""


def unreadable(what: str, path: Path, e: Exception) -> ModelError:
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ModelError(f"{what} {path} cannot be loaded ({reason}); the file is probably truncated "
                      "or corrupted: download it again")
