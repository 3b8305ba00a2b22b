"""Settings and dictionary commands, on a control thread of their own: loading a voice or
compiling the words takes a second or more, and never holds up MQTT's network threads."""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor

from .mqtt_api import parse_volume, parse_word
from .reports import Reports
from .speech import SpeechService

log = logging.getLogger("hayakoe_pi")


class Commands:
    def __init__(self, speech: SpeechService, reports: Reports):
        self.speech, self.reports = speech, reports
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="control")

    def submit(self, task, *args) -> None:
        """Run `task` on the control thread; a bug in it is logged and answered, and the thread lives on."""
        def guarded():
            try:
                task(*args)
            except Exception as e:
                log.exception("error in %s", task.__name__)
                self.reports.error(f"internal error: {type(e).__name__}: {e}", code="internal")

        self._thread.submit(guarded)

    def stop(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    def change_selection(self, name: str, payload: bytes) -> None:
        """hayakoe/<id>/volume/set, /voice/set, /style/set."""
        try:
            if name == "volume":
                self.speech.set_volume(parse_volume(payload))
            else:
                value = payload.decode("utf-8", errors="replace").strip()
                (self.speech.set_voice if name == "voice" else self.speech.set_style)(value)
        except ValueError as e:  # SpeechError too
            self.reports.error(f"{name} not changed: {e}", code="bad_setting")
        else:
            log.info("%s set to %s", name, self.speech.shown(name))
            if name == "voice":
                self.reports.discovery()  # the style list follows the voice
        self.reports.selection()  # on refusal too, so Home Assistant shows the real value

    def change_announcement(self, name: str, payload: bytes) -> None:
        """hayakoe/<id>/chime/set (none, default, file) and /quiet_hours/set (ON, OFF)."""
        settings = self.reports.announcements
        try:
            settings.set(name, payload)
        except ValueError as e:
            self.reports.error(f"{name} not changed: {e}", code="bad_setting")
        else:
            log.info("%s set to %s", name, settings.shown(name))
        self.reports.selection()

    def change_dictionary(self, adding: bool, payload: bytes) -> None:
        """hayakoe/dictionary/add and /remove."""
        try:
            data = parse_word(payload, adding)
            entry = self.speech.add_word(data) if adding else self.speech.remove_word(data.get("surface"))
        except (ValueError, RuntimeError, OSError) as e:
            self.reports.error(f"dictionary not changed: {e}", code="bad_word")
            return
        log.info("dictionary: %s %r (%s, accent %d)", "added" if adding else "removed", entry.surface,
                 entry.reading, entry.accent)
        self.reports.event({"event": "dictionary", "action": "added" if adding else "removed",
                            **dataclasses.asdict(entry)})

    def reload_dictionary(self, announce: bool = True) -> None:
        """At start, and on SIGHUP after a hand edit of the file."""
        try:
            problems = self.speech.reload_dictionary()
        except (RuntimeError, OSError) as e:
            log.error("the user dictionary cannot be used (%s); speaking without it", e)
            problems = [str(e)]
        words = len(self.speech.dictionary.entries)
        log.info("dictionary: %d words from %s", words, self.speech.dictionary.path)
        if announce:
            self.reports.event({"event": "dictionary", "action": "reloaded", "words": words, "problems": problems})
