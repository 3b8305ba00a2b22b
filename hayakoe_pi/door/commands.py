"""Settings and dictionary commands, on threads of their own: loading a voice or compiling the
words takes a second or more, and never holds up MQTT's network threads.

Two lanes: `control` for the settings, `dictionary` for the words (and SIGHUP's reload), so a
setting never waits behind a compile. The changes to the words that wait while one compile runs
are applied together, with one compile and one save; each is still answered on its own, in order.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging

from .command_lane import CommandLane
from ..broker.payloads import error_event, parse_volume, parse_word
from .reports import Reports
from ..speech.service import SpeechService
from ..broker.topics import SELECTION

log = logging.getLogger("hayakoe_pi")

MAX_WAITING = 100  # commands waiting in each lane; one more is answered `busy`
RELOAD = object()  # SIGHUP's reload, in the dictionary lane's queue


class Commands:
    def __init__(self, speech: SpeechService, reports: Reports):
        self.speech, self.reports = speech, reports
        self._settings = CommandLane("control", self._run_settings, MAX_WAITING)
        self._words = CommandLane("dictionary", self._run_words, MAX_WAITING, batch=MAX_WAITING)

    # --- from the network threads and the signal handler: never wait ---------------------------

    def queue_setting(self, name: str, payload: bytes) -> None:
        """hayakoe/<id>/<name>/set: volume, voice, style, chime, quiet_hours."""
        self._queue(self._settings, (name, payload), f"{name} not changed", payload)

    def queue_dictionary_change(self, adding: bool, payload: bytes) -> None:
        """hayakoe/dictionary/add and /remove."""
        self._queue(self._words, (adding, payload), "dictionary not changed", payload)

    def queue_reload(self) -> None:
        """SIGHUP, after a hand edit of the file: after the changes already waiting."""
        self._queue(self._words, RELOAD, "dictionary not reloaded", None)

    def _queue(self, lane: CommandLane, item, what: str, payload: bytes | None) -> None:
        if not lane.offer(item):  # the lane logs it, once per time it fills
            text = payload.decode("utf-8", errors="replace") if payload is not None else None
            why = "the daemon is stopping" if lane.closed else f"{lane.limit} waiting"
            self.reports.event(error_event(f"{what}: busy, {why}; try again later", text=text, code="busy"))

    def stop(self) -> None:
        self._settings.close()
        self._words.close()

    # --- on the lanes --------------------------------------------------------------------------

    def _guarded(self, task, *args, answers: int = 1) -> None:
        """Run `task`; a bug in it is logged and each of the `answers` messages it had is answered."""
        try:
            task(*args)
        except Exception as e:
            log.exception("error in %s", task.__name__)
            for _ in range(answers):
                self.reports.event(error_event(f"internal error: {type(e).__name__}: {e}", code="internal"))

    def _run_settings(self, items: list) -> None:
        for name, payload in items:
            self._guarded(self.change_selection if name in SELECTION else self.change_announcement, name, payload)

    def _run_words(self, items: list) -> None:
        for reload, group in itertools.groupby(items, key=lambda item: item is RELOAD):
            if reload:
                self._guarded(self.reload_dictionary)  # once for reloads back to back
            else:
                changes = list(group)
                self._guarded(self.change_dictionary, changes, answers=len(changes))

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

    def change_dictionary(self, changes: list[tuple[bool, bytes]]) -> None:
        """dictionary/add and /remove payloads, `(adding, payload)` each: one compile for them all."""
        taken = []
        for adding, payload in changes:
            try:
                data = parse_word(payload, adding)
                taken.append((adding, data if adding else data.get("surface")))
            except ValueError as e:
                taken.append(e)
        results = iter(self.speech.change_words([t for t in taken if not isinstance(t, Exception)]))
        for (adding, _), parsed in zip(changes, taken):
            entry = parsed if isinstance(parsed, Exception) else next(results)
            if isinstance(entry, Exception):
                self.reports.error(f"dictionary not changed: {entry}", code="bad_word")
                continue
            action = "added" if adding else "removed"
            log.info("dictionary: %s %r (%s, accent %d)", action, entry.surface, entry.reading, entry.accent)
            self.reports.event({"event": "dictionary", "action": action, **dataclasses.asdict(entry)})

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
