"""received.json: when this Pi first received each message not yet answered, kept across a power cut.

A message the broker hands over again after a crash or a restart has the
same bytes: its age still counts from the first receipt, so an announcement
queued before a power cut is not spoken hours later.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from .durable import FailingWrites, write_durably

log = logging.getLogger("hayakoe_pi")

FORGET_AFTER_SECONDS = 7 * 86400.0  # a receipt never answered (its message lost) is dropped after this


class Receipts:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._times: dict[str, float] = {}
        self._writes = FailingWrites(f"cannot save {path}: a restart would count ages anew", f"{path} saved again")
        try:
            data = json.loads(path.read_text("utf-8"))
            now = time.time()
            self._times = {k: float(v) for k, v in data.items()
                           if isinstance(k, str) and isinstance(v, (int, float)) and now - v < FORGET_AFTER_SECONDS}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, AttributeError) as e:
            log.warning("ignoring %s (%s)", path, e)

    def first(self, digest: str) -> float:
        """When the message with this digest was first received (now, recorded, if never before)."""
        with self._lock:
            if digest in self._times:
                return self._times[digest]
            self._times[digest] = now = time.time()
            self._save()
            return now

    def forget(self, digest: str) -> None:
        """The message is answered: the broker will not hand it over again."""
        with self._lock:
            if self._times.pop(digest, None) is not None:
                self._save()

    def _save(self) -> None:
        try:
            write_durably(self.path, json.dumps(self._times))
        except OSError as e:  # a full disk: the message is spoken all the same
            self._writes.failed(e)
            return
        self._writes.worked()
