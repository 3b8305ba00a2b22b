"""One synthesis for identical requests at about the same time.

A `hayakoe/say` to the whole house reaches every room at once; rooms on one
voice server then ask it for the same text, voice, style and speed within
milliseconds. The first request starts the synthesis; the others read the
same pieces as they are made, each at its own pace (`SharedView`). The
synthesis runs on while anyone reads it, is cancelled once every reader has
gone, and is stored in the phrase cache once, so later repeats come from there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..synthesis.ahead import SynthesisAhead

log = logging.getLogger("hayakoe_pi")


class _Synthesis:
    def __init__(self, ahead: SynthesisAhead):
        self.ahead = ahead
        self.positions: dict[int, int] = {}  # each reader's samples taken
        self.readers = 0
        self.stored = False


class SharedView:
    """One reader's side of a synthesis others may read too: what it has taken lets synthesis
    run on only as far ahead of the fastest reader; `cancel` is its leaving."""

    def __init__(self, synthesis: _Synthesis, registry: "SharedSyntheses", key: str):
        self._synthesis, self._registry, self._key = synthesis, registry, key
        self._left = False

    def __getattr__(self, name):  # get, at_end, can_flow, audio, complete, sample_rate, join ...
        return getattr(self._synthesis.ahead, name)

    def played(self, samples: int) -> None:
        with self._registry.lock:
            positions = self._synthesis.positions
            positions[id(self)] = samples
            furthest = max(positions.values(), default=samples)
        self._synthesis.ahead.played(furthest)

    def cancel(self) -> None:
        self._registry.leave(self._key, self._synthesis, self)

    def store_once(self) -> bool:
        """True for the first reader to ask: that one stores the audio in the phrase cache."""
        with self._registry.lock:
            first, self._synthesis.stored = not self._synthesis.stored, True
        return first


class SharedSyntheses:
    """The syntheses under way, by request key (speech/cache.py's `cache_key`)."""

    def __init__(self):
        self.lock = threading.Lock()
        self._running: dict[str, _Synthesis] = {}

    def running(self, key: str) -> bool:
        with self.lock:
            return key in self._running

    def read(self, key: str, start: Callable[[], SynthesisAhead]) -> tuple[SharedView, int]:
        """A view of the synthesis of `key`, started by `start()` if none is under way, and how
        many others read it already (0: this request started it)."""
        with self.lock:
            synthesis = self._running.get(key)
            others = synthesis.readers if synthesis is not None else 0
            if synthesis is None:
                synthesis = self._running[key] = _Synthesis(start())
            synthesis.readers += 1
            view = SharedView(synthesis, self, key)
            synthesis.positions[id(view)] = 0
        return view, others

    def leave(self, key: str, synthesis: _Synthesis, view: SharedView) -> None:
        with self.lock:
            if view._left:
                return
            view._left = True
            synthesis.readers -= 1
            synthesis.positions.pop(id(view), None)
            last = synthesis.readers == 0
            if last and self._running.get(key) is synthesis:
                del self._running[key]
        if last:
            if not synthesis.ahead.complete:
                log.info("synthesis stopped: everyone listening to it has gone")
            synthesis.ahead.cancel()  # after the step in progress
