"""kanalizer's readings of common English words, made ahead: data/english_readings.txt.

kanalizer takes milliseconds a word; this list holds its readings of some
71 000 words (tools/make_english_readings.py made it from Debian's
wamerican and the names of Home Assistant's integrations), so english.py
asks it first. The file is `word<TAB>reading`
lines sorted by bytes after one comment line naming the kanalizer version
that read them. A lookup is a binary search over a read-only memory map: it
touches a few pages of the file, which stay the kernel's page cache (shared,
dropped under memory pressure), not this process's heap. A missing or
unreadable file means no list, with one warning: kanalizer reads every word.
"""

from __future__ import annotations

import logging
import mmap
import re
import threading
from pathlib import Path

__all__ = ["COPYRIGHT_PATH", "LIST_PATH", "ReadingList", "READINGS"]

log = logging.getLogger("hayakoe_pi")

LIST_PATH = Path(__file__).resolve().parent / "data" / "english_readings.txt"
COPYRIGHT_PATH = LIST_PATH.with_suffix(".COPYRIGHT")  # the word list's licence (SCOWL)
_HEADER_RE = re.compile(rb"# kanalizer (\S+):")


class ReadingList:
    """The list in one file, opened on first use."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._opened = False
        self._map: mmap.mmap | None = None
        self._start = 0  # the first word's line
        self._version: str | None = None
        self._mismatch_warned = False

    def _open(self) -> None:
        with self._lock:
            if self._opened:
                return
            try:
                with open(self.path, "rb") as f:
                    mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                header = _HEADER_RE.match(mapped)
                if header is None:
                    raise ValueError("its first line names no kanalizer version")
            except (OSError, ValueError) as e:
                log.warning("the list of English readings cannot be used (%s: %s); kanalizer reads every "
                            "English word", type(e).__name__, e)
            else:
                if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_RANDOM"):
                    mapped.madvise(mmap.MADV_RANDOM)  # a lookup reads ~17 scattered pages: no read-ahead
                self._map, self._version = mapped, header[1].decode("ascii")
                self._start = mapped.find(b"\n") + 1
            self._opened = True

    @property
    def version(self) -> str | None:
        """The kanalizer version whose readings the list holds (None: no list)."""
        self._open()
        return self._version

    def find(self, word: str) -> str | None:
        """The listed reading of a lower-case word: "" when kanalizer has no complete one, None when unlisted."""
        self._open()
        mapped = self._map
        if mapped is None or not word.isascii():
            return None
        key = word.encode("ascii")
        lo, hi = self._start, len(mapped)  # both at the start of a line
        while lo < hi:
            mid = (lo + hi) // 2
            start = mapped.rfind(b"\n", lo, mid) + 1 or lo  # the start of the line holding mid
            end = mapped.find(b"\n", start)
            end = len(mapped) if end < 0 else end
            line = mapped[start:end]
            listed, _, reading = line.partition(b"\t")
            if listed == key:
                return reading.decode("utf-8")
            if listed < key:
                lo = end + 1
            else:
                hi = start
        return None

    def reading(self, word: str, kanalizer_version: str) -> str | None:
        """As `find`, only when the list holds this kanalizer version's readings (else one warning, and None)."""
        version = self.version
        if version is None:
            return None
        if version != kanalizer_version:
            if not self._mismatch_warned:
                self._mismatch_warned = True
                log.warning("the list of English readings was made with kanalizer %s, not %s: not used (every "
                            "English word asks kanalizer); remake it with tools/make_english_readings.py",
                            version, kanalizer_version)
            return None
        return self.find(word)


READINGS = ReadingList(LIST_PATH)
