"""speaking.json: the request being spoken, on disk, so the next start knows what a crash cut.

It also counts the runs that died while speaking the same message (by its
digest): one that killed the daemon POISON_DEATHS times is not spoken again.
A shutdown (SIGTERM) marks the record clean: that is no death.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..durable import FailingWrites
from ..broker.payloads import EVENT_TEXT_CHARS, SayRequest

log = logging.getLogger("hayakoe_pi")

POISON_DEATHS = 2


class SpeakingRecord:
    """Written when a request's turn comes, removed when it has its last event (beside the state file)."""

    def __init__(self, path: Path):
        self.path = path
        self._writes = FailingWrites(f"cannot write {path}: a crash while speaking would go unreported",
                                     f"{path} written again")

    def write(self, request: SayRequest, deaths: int = 0) -> None:
        """`deaths`: the earlier runs that died speaking this same message."""
        self._save({"id": request.id, "text": request.text[:EVENT_TEXT_CHARS], "prepare": not request.play,
                    "digest": request.digest, "deaths": deaths})

    def mark_clean(self) -> None:
        """The run is shutting down on purpose: what it was speaking did not kill it."""
        try:
            data = json.loads(self.path.read_text("utf-8"))
        except (OSError, ValueError):
            return
        self._save({**data, "clean": True})

    def _save(self, data: dict) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            # flushed to disk: a power cut right after must still find it
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(json.dumps(data, ensure_ascii=False))
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:  # a full disk: the message is spoken all the same
            self._writes.failed(e)
            return
        self._writes.worked()

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def take(self) -> dict | None:
        """What the last run was speaking when it died (read once, then removed)."""
        try:
            data = json.loads(self.path.read_text("utf-8"))
            self.path.unlink()
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("ignoring %s (%s)", self.path, e)
            self.path.unlink(missing_ok=True)
            return None
        return data if isinstance(data, dict) and isinstance(data.get("id"), str) else None


def died_speaking(record: dict) -> tuple[str, int]:
    """(digest, how many runs died speaking it) for a record SpeakingRecord.take() gave."""
    deaths = record.get("deaths", 0)
    deaths = deaths if isinstance(deaths, int) and not isinstance(deaths, bool) else 0
    digest = record.get("digest")
    return (digest if isinstance(digest, str) else ""), deaths + (0 if record.get("clean") else 1)
