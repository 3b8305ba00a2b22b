"""Writes that survive a power cut: a file renamed into place only once its bytes are on disk.
And writes that fail (a full disk): logged once, not at every message, until one works again."""

from __future__ import annotations

import logging
import os
import re
import stat
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("hayakoe_pi")


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


# write_durably's temporary files: "." + the file's name + "." + mkstemp's 8 characters + ".tmp"
_LEFTOVER_RE = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


def remove_leftovers(folder: Path) -> list[str]:
    """Remove the temporary files of writes cut short (a kill, a power cut) from `folder`;
    their names. Only write_durably's, and only plain files."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        path = Path(folder) / name
        try:
            if _LEFTOVER_RE.fullmatch(name) and stat.S_ISREG(path.lstat().st_mode):
                path.unlink()
                removed.append(name)
        except OSError as e:
            log.warning("cannot remove %s, left by an interrupted write (%s)", path, e.strerror or e)
    if removed:
        log.info("removed %d temporary file%s left in %s by an interrupted write: %s", len(removed),
                 "s" * (len(removed) != 1), folder, ", ".join(sorted(removed)))
    return removed


class FailingWrites:
    """One kind of write the daemon does at every message (the phrase cache, speaking.json, received.json).

    A full disk (ENOSPC, EFBIG, EDQUOT, EROFS, EIO) fails it at every message: logged once as
    `failed` says, then not again until a write has worked (logged as `again`).
    """

    def __init__(self, failed: str, again: str):
        self.failed_text, self.again_text = failed, again
        self._failing = False
        self._lock = threading.Lock()  # the speaker and Wyoming's threads store alike

    def failed(self, error: OSError) -> None:
        with self._lock:
            first, self._failing = not self._failing, True
        if first:
            log.warning("%s (%s); said once, until a write works again", self.failed_text, error.strerror or error)

    def worked(self) -> None:
        with self._lock:
            was_failing, self._failing = self._failing, False
        if was_failing:
            log.info("%s", self.again_text)
