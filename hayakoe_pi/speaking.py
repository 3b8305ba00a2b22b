"""The request being spoken, on disk (speaking.json beside the state file): a start that
finds it tells Home Assistant that the last run died while speaking it (`interrupted`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .mqtt_api import EVENT_TEXT_CHARS, SayRequest

log = logging.getLogger("hayakoe_pi")


class SpeakingFile:
    def __init__(self, path: Path):
        self.path = path

    def write(self, request: SayRequest) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.path.write_text(json.dumps({"id": request.id, "text": request.text[:EVENT_TEXT_CHARS],
                                             "prepare": not request.play}, ensure_ascii=False))
        except OSError as e:
            log.debug("cannot write %s: %s", self.path, e)

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
