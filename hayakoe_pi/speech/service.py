"""The speech service: the one set of rules both front doors serve requests by.

MQTT (daemon.py) and Wyoming (wyoming/) hand it texts and what a request
names; it checks the text, picks the voice and style (from the request, else
the current selection), and gives the audio: from the phrase cache, or
synthesized ahead of playing (ahead.py) and stored once complete. The
current selection (voice, style, volume) lives here too, behind one lock,
saved to the state file.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..synthesis.ahead import SynthesisAhead, synthesize_ahead
from ..bounds import quoted
from .cache import PhraseCache, cache_key, voice_fingerprint
from .shared import SharedSyntheses
from ..settings.config import voice_styles
from ..durable import write_durably
from ..synthesis.engine import Engine
from ..models.errors import ModelError
from ..models.store import ModelStore
from ..synthesis.sentences import pause_samples
from ..settings.runtime import RuntimeChanges, Setting
from ..text.dictionary import Entry, UserDictionary, active_words, function_word, prepare, use
from ..text.inline import InlineReadingError, check_inline_readings

log = logging.getLogger("hayakoe_pi")


class SpeechError(ValueError):
    """A request that cannot be served; `code` names the kind (Wyoming sends it)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def check_number(value, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number, got {quoted(json.dumps(value), 40)}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low:g} and {high:g}, got {value:g}")
    return float(value)


def _has_control_characters(text: str) -> bool:
    return any(ord(c) < 32 and c not in "\t\n\r" for c in text)


def readable(text: str) -> bool:
    """Has a letter or a digit of any script (what the front end can read), not only
    emoji, symbols, punctuation or long-vowel marks: judged without OpenJTalk, at the door."""
    return any(unicodedata.category(c)[0] in "LN" and c != "ー" for c in unicodedata.normalize("NFKC", text))


def first_style(styles: list[str], preferred: str) -> str:
    """The style to use when the one asked for is not a style of the voice."""
    for style in (preferred, "Neutral"):
        if style in styles:
            return style
    return styles[0]


def percent(volume: float) -> str:
    return f"{round(volume * 100):d} %"


def _usable(name: str, value) -> bool:
    """Whether a kept volume, voice or style can be used at all (the voice's own checks come later)."""
    if name == "volume":  # NaN and inf fail the range too
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0
    return isinstance(value, str) and bool(value) and not _has_control_characters(value)


class SavedSelection:
    """Voice, style and volume in effect: the config's, or as changed over MQTT.

    Which wins is runtime.py's rule: the state file keeps only the changes made at run time,
    each with the config value it was made against, and a changed config wins. Written whole
    or not at all (temporary file, fsync, rename): a power cut leaves the old file or the new
    one. One that cannot be read, or a value that cannot be used, is reported and dropped.
    """

    NAMES = ("volume", "voice", "style")

    def __init__(self, path: Path, volume: float, voice: str, style: str, config_mtime: float | None = None,
                 read_only: bool = False):
        self.path = path
        self.changes = RuntimeChanges(path, {"volume": volume, "voice": voice, "style": style}, _usable,
                                      config_mtime, read_only, shows={"volume": percent})
        for note in self.changes.dropped:
            log.warning("%s", note)
        self.volume, self.voice, self.style = (self.changes.value(name) for name in self.NAMES)

    def save(self) -> None:
        self.changes.update({"volume": self.volume, "voice": self.voice, "style": self.style})

    def shown(self, name: str) -> str:
        """A setting as its retained MQTT state shows it (volume in percent)."""
        return f"{round(self.volume * 100):d}" if name == "volume" else getattr(self, name)

    def settings(self) -> list[Setting]:
        """Each setting in effect and where it comes from."""
        return [self.changes.setting(name, getattr(self, name)) for name in self.NAMES]

    def describe(self) -> str:
        return ", ".join(s.line(self.changes.shown(s.name)) for s in self.settings())


def settle_selection(selection: SavedSelection, installed: list[str], styles_of, voice: str, style: str) -> None:
    """A kept voice that is no longer installed gives way to the config's; a style that is not
    one of the voice's to the config's, else Neutral, else the voice's first."""
    if selection.voice not in installed:
        log.warning("saved voice %r is not installed; using %s", selection.voice, voice)
        selection.voice, selection.style = voice, style
    styles = styles_of(selection.voice)
    if styles and selection.style not in styles:
        selection.style = first_style(styles, style)


@dataclass(frozen=True)
class Choice:
    """The voice and style one request is spoken with."""

    voice: str
    style: str
    sample_rate: int
    fingerprint: tuple  # the model files that shape the sound (part of the cache key)


class Utterance:
    """The audio of one text: cached, synthesized ahead of its listener, or borrowed from a voice server.

    `ahead` gives the pieces either way. Call `close(completed)` at the end:
    a synthesis that ran to its end, for a listener who heard it all, is
    stored in the phrase cache. `shared_with`: how many other listeners read
    the same synthesis (speech/shared.py). `fallback`: why a room on a voice
    server synthesized this itself; `not_passed`: what a server that is not
    a hayakoe-pi could not be told.
    """

    def __init__(self, ahead, cached: bool, store_as: tuple[PhraseCache, str, int] | None, shared_with: int = 0,
                 fallback: str | None = None, not_passed: tuple[str, ...] = ()):
        self.ahead, self.cached, self._store_as = ahead, cached, store_as
        self.shared_with, self.fallback, self.not_passed = shared_with, fallback, not_passed

    def close(self, completed: bool) -> None:
        self.ahead.cancel()  # stops synthesis after the window in progress (once no one else reads it)
        if completed and self._store_as is not None and self.ahead.complete and self.ahead.store_once():
            cache, key, rate = self._store_as
            cache.put(key, rate, self.ahead.audio())

    def extra(self) -> dict:
        """What the request's events tell of how it was made."""
        extra = {"fallback": self.fallback} if self.fallback else {}
        if self.not_passed:
            extra["not_passed"] = list(self.not_passed)
        return extra


class SpeechService:
    """Loads the current voice at once (a broken one fails the start), the others when asked for."""

    def __init__(self, store: ModelStore, cache: PhraseCache, selection: SavedSelection, voice: str,
                 style: str, speed: float, style_weight: float, max_text_chars: int,
                 dictionary: UserDictionary | None = None, dictionary_build_dir: Path | None = None):
        self.store, self.cache, self.selection = store, cache, selection
        self.dictionary, self.dictionary_build_dir = dictionary, dictionary_build_dir
        self.default_style, self.speed, self.style_weight = style, speed, style_weight
        self.max_text_chars = max_text_chars
        self.syntheses = SharedSyntheses()
        self.lock = threading.Lock()  # the selection: read by every request, changed by commands
        self.dictionary_lock = threading.Lock()  # one change of the words at a time; speech never waits for it
        settle_selection(selection, store.voices(), self.styles, voice, style)
        self.engine = Engine(store.dir, voice=selection.voice, store=store)
        if dictionary is not None:  # OpenJTalk is asked between two engine steps
            dictionary.is_function_word = self._function_word

    # --- texts ---------------------------------------------------------------------------

    def check_text(self, text) -> str:
        """The text to speak, stripped; SpeechError when it cannot be spoken."""
        self.check_part(text, 0)
        text = text.strip()
        if not text:
            raise SpeechError("empty text: nothing to speak", "empty-text")
        if not readable(text):
            raise SpeechError("nothing to speak: no letter, kana, kanji or digit in the text", "nothing-to-speak")
        self.check_readings(text)
        return text

    @staticmethod
    def check_readings(text: str) -> None:
        """The readings written into a text (明日《アス》): SpeechError unless each is katakana."""
        try:
            check_inline_readings(text)
        except InlineReadingError as e:
            raise SpeechError(str(e), "bad-reading") from None

    def check_part(self, text, chars_before: int) -> None:
        """One part of a text that arrives in parts, `chars_before` characters already in."""
        if not isinstance(text, str):
            raise SpeechError("'text' must be a string", "bad-text")
        total, limit = chars_before + len(text), self.max_text_chars
        if total > limit:
            so_far = " so far" if chars_before else ""
            raise SpeechError(f"text too long ({total} characters{so_far}, limit {limit})", "text-too-long")
        if _has_control_characters(text):
            raise SpeechError("text contains control characters", "bad-text")

    # --- voices and styles ---------------------------------------------------------------

    def voices(self) -> list[str]:
        return self.store.voices()

    def styles(self, voice: str) -> list[str]:
        return voice_styles(self.store.dir, voice)

    def check_voice(self, name) -> str:
        installed = self.voices()
        if not isinstance(name, str) or name not in installed:
            raise SpeechError(f"unknown voice {quoted(json.dumps(name, ensure_ascii=False), 60)}; "
                              f"installed: {', '.join(installed)}", "unknown-voice")
        return name

    def check_style(self, style, voice: str, what: str = "style") -> str:
        """`what`: the word the front door uses (Wyoming says "speaker")."""
        styles = self.styles(voice)
        if not isinstance(style, str) or style not in styles:
            raise SpeechError(f"unknown {what} {quoted(json.dumps(style, ensure_ascii=False), 60)} of {voice}; "
                              f"{what}s: {', '.join(styles)}", f"unknown-{what}")
        return style

    def choose(self, voice: str | None = None, style: str | None = None) -> Choice:
        """The voice and style a request names (already checked), else the current ones."""
        with self.lock:
            name = voice or self.selection.voice
            current_style = self.selection.style
        try:
            loaded = self.store.voice(name)
        except (ModelError, ValueError) as e:
            raise SpeechError(f"voice {name} cannot be used: {e}", "voice-error") from None
        chosen = style or first_style(list(loaded.styles), current_style)
        return Choice(name, chosen, loaded.sample_rate, tuple(voice_fingerprint(self.store, loaded)))

    # --- audio ---------------------------------------------------------------------------

    def _key(self, text: str, choice: Choice, speed: float) -> str:
        shaped_by = list(choice.fingerprint)
        words = active_words()
        if words:  # a phrase read with other user words is another phrase
            shaped_by.append(words)
        return cache_key(text, choice.voice, choice.style, self.style_weight, speed, shaped_by)

    def under_way(self, text: str, choice: Choice, speed: float | None = None) -> bool:
        """The same request is being synthesized now: a new one reads it (no turn of its own needed)."""
        return self.syntheses.running(self._key(text, choice, self.speed if speed is None else speed))

    def utterance(self, text: str, choice: Choice, speed: float | None = None, progress=None) -> Utterance:
        """`text` (checked) spoken with `choice`: from the phrase cache, else synthesized ahead,
        once for every request of the same text at the same time."""
        speed = self.speed if speed is None else speed
        key = self._key(text, choice, speed)
        cached = self.cache.get(key, choice.sample_rate)
        if cached is not None:
            return Utterance(SynthesisAhead.of_chunks([cached], choice.sample_rate), True, None)

        def start() -> SynthesisAhead:
            log.info("synthesizing %d characters with %s/%s", len(text), choice.voice, choice.style)
            return synthesize_ahead(self.engine, text, voice=choice.voice, progress=progress, style=choice.style,
                                    style_weight=self.style_weight, speed=speed)

        ahead, others = self.syntheses.read(key, start)
        if others:
            log.info("%d characters with %s/%s: synthesis under way read by one more (%d in all)", len(text),
                     choice.voice, choice.style, others + 1)
        return Utterance(ahead, False, (self.cache, key, choice.sample_rate), shared_with=others)

    def pause_after(self, text: str, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        """The silence to put after `text` (spoken as `audio`) when more speech follows."""
        samples = pause_samples(text, audio, sample_rate, 1.0 / self.speed)
        return np.zeros(samples, dtype=np.float32)

    # --- changing the selection (MQTT commands) ------------------------------------------

    def set_volume(self, percent: float) -> None:
        with self.lock:
            self.selection.volume = check_number(percent, "volume", 0, 100) / 100
            self.selection.save()

    def set_voice(self, name) -> None:
        self.check_voice(name)
        try:
            self.store.voice(name)  # load now: a broken voice is refused here
        except (ModelError, ValueError) as e:
            raise SpeechError(f"voice {name} cannot be used: {e}", "voice-error") from None
        with self.lock:
            self.selection.voice = name
            styles = self.styles(name)
            if self.selection.style not in styles:
                self.selection.style = first_style(styles, self.default_style)
            self.selection.save()

    def set_style(self, style) -> None:
        with self.lock:
            self.check_style(style, self.selection.voice)
            self.selection.style = style
            self.selection.save()

    def shown(self, name: str) -> str:
        with self.lock:
            return self.selection.shown(name)

    # --- the user dictionary ---------------------------------------------------------------

    # Compiling and saving run beside speech (the selection's lock is not held): only the swap
    # waits for the engine, between two of its steps.

    def reload_dictionary(self) -> list[str]:
        """Read the dictionary file and use it; returns the problems found (each also logged)."""
        with self.dictionary_lock:
            problems = self.dictionary.load()
            for problem in problems:
                log.warning("%s", problem)
            self._use_words(list(self.dictionary.entries.values()))()
        return problems

    def add_word(self, data) -> Entry:
        """Add (or replace) an entry: used from the next utterance on, and saved."""
        with self.dictionary_lock:
            return self.dictionary.add(data, use=self._use_words)

    def remove_word(self, surface) -> Entry:
        with self.dictionary_lock:
            return self.dictionary.remove(surface, use=self._use_words)

    def change_words(self, changes: list[tuple[bool, object]]) -> list:
        """Several adds and removes with one compile (UserDictionary.apply): each one's Entry or error."""
        with self.dictionary_lock:
            started = time.monotonic()
            results = self.dictionary.apply(changes, use=self._use_words)
            taken = sum(isinstance(r, Entry) for r in results)
            if taken:
                log.info("dictionary: %d change%s compiled in %d ms", taken, "s" * (taken != 1),
                         (time.monotonic() - started) * 1000)
        return results

    def _use_words(self, entries: list[Entry]):
        """Compile `entries` (a second or more: speech goes on); returns the swap."""
        ready = prepare(entries, self.dictionary_build_dir)

        def swap() -> None:
            # between two engine steps: an utterance is read with one dictionary, never half of each
            with self.engine.exclusive():
                use(ready)

        return swap

    def _function_word(self, surface: str) -> bool:
        with self.engine.exclusive():
            return function_word(surface)

    def current_voice(self) -> str:
        with self.lock:
            return self.selection.voice

    def current_volume(self) -> float:
        with self.lock:
            return self.selection.volume
