"""Free space where the service writes (the phrase cache, the state files): for `check` and Home Assistant.

A full disk costs the phrase cache, never a message (cache.py); this is how the
owner learns of it before then: `hayakoe-pi check` warns, and the daemon keeps
two retained topics (free MB, low ON/OFF) for Home Assistant's diagnostic sensors.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

LOW_FREE_MB = 100  # under this the phrase cache soon stops storing, and the state files may fail
CHECK_SECONDS = 30.0  # how often the daemon looks (statvfs: cheap)
REPORT_EVERY_SECONDS = 300.0  # a figure that drifts is published at most this often (no broker noise)
REPORT_CHANGE = 0.1  # ... and only once it moved by this share; a crossing of LOW_FREE_MB goes out at once
MB = 1024 * 1024


@dataclass(frozen=True)
class Space:
    folder: Path
    free_mb: float  # what the service's user may still write (without root's reserve)
    total_mb: float

    @property
    def low(self) -> bool:
        return self.free_mb < LOW_FREE_MB

    def line(self) -> str:
        share = f" ({100 * self.free_mb / self.total_mb:.0f} %)" if self.total_mb else ""
        text = f"{self.folder}: {self.free_mb:.0f} MB free of {self.total_mb:.0f} MB{share}"
        if self.low:
            text += (f"; low (under {LOW_FREE_MB} MB): once it is full the phrase cache stores nothing more "
                     "and a restart may lose the state files; free some space")
        return text


def space_of(folder: str | Path) -> Space:
    """The free space of `folder`'s file system (of its nearest existing parent, when it is not made yet)."""
    path = Path(folder).expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return Space(Path(folder), st.f_bavail * st.f_frsize / MB, st.f_blocks * st.f_frsize / MB)


def service_folders(cache_dir: str | Path, state_file: str | Path) -> list[Path]:
    """The folders the service writes to: the phrase cache (and derived models), the state files."""
    return [Path(cache_dir), Path(state_file).parent]


class DiskWatch:
    """What the daemon publishes of its folders' space: the least free MB and whether any is low.

    `figures(force)` is asked often (the main thread's loop) and on each connect (force):
    it looks every CHECK_SECONDS at most, and answers only what is worth publishing.
    """

    def __init__(self, folders: list[Path]):
        self.folders = folders
        self._lock = threading.Lock()  # the main thread and paho's (on connect)
        self._checked = self._published = float("-inf")
        self._shown: tuple[int, bool] | None = None

    def figures(self, force: bool = False) -> tuple[int, bool] | None:
        """(free MB, low) to publish now, or None."""
        now = time.monotonic()
        with self._lock:
            if not force and now - self._checked < CHECK_SECONDS:
                return None
            self._checked = now
            current = self._measure()
            if current is None or not (force or self._worth_publishing(current, now)):
                return None
            self._shown, self._published = current, now
            return current

    def _measure(self) -> tuple[int, bool] | None:
        spaces = []
        for folder in self.folders:
            try:
                spaces.append(space_of(folder))
            except OSError:  # a folder on a card gone away: the daemon says so elsewhere
                continue
        if not spaces:
            return None
        return round(min(s.free_mb for s in spaces)), any(s.low for s in spaces)

    def _worth_publishing(self, current: tuple[int, bool], now: float) -> bool:
        if self._shown is None or current[1] != self._shown[1]:
            return True
        moved = abs(current[0] - self._shown[0]) >= REPORT_CHANGE * max(self._shown[0], 1)
        return moved and now - self._published >= REPORT_EVERY_SECONDS
