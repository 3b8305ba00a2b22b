"""Writes that survive a power cut: a file renamed into place only once its bytes are on disk."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync(path: Path) -> None:
    """Wait until the file's bytes are on disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def durable_replace(tmp: Path, target: Path) -> None:
    """Rename `tmp` to `target` only once its bytes are on disk: after a power cut
    there is either no `target` or a whole one."""
    fsync(tmp)
    tmp.replace(target)
    _fsync_dir(target.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # a file system without directory fsync
        pass


def write_durably(path: Path, text: str, mode: int = 0o600) -> None:
    """Write `text` to `path` whole or not at all. The temporary file has a name of its own
    (made with O_EXCL: never a link someone planted), and is renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            os.fchmod(f.fileno(), mode)
        durable_replace(Path(tmp), path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
