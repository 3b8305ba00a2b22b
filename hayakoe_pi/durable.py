"""Writes that survive a power cut: a file renamed into place only once its bytes are on disk."""

from __future__ import annotations

import os
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
