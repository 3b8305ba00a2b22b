"""Decoder windows decoded in playing order: the first sentence's alone, later ones on the decoder lanes.

engine.py cuts each sentence's latent frames into windows (windows.py) and
hands them here as `Window`s; what comes out are `Piece`s, the chunks a player
schedules (ahead.py).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, replace

import numpy as np

from ..models.lanes import LANE_WINDOW_FRAMES
from ..models.voices import Voice

log = logging.getLogger("hayakoe_pi.engine")


@dataclass
class Piece:
    """One chunk of an utterance, with what a player needs to schedule it.

    A sentence's length is known once its synthesizer front has run, before
    its decoder starts: `windows` lists every decoder window of the sentence
    as (first sample, end sample, latent frames decoded), so a player can tell
    whether the rest will be ready in time.
    """

    audio: np.ndarray
    sentence: int  # index of the sentence in the text
    pause: bool = False  # silence after the sentence, not speech
    offset: int = 0  # first sample of `audio` within the sentence's speech
    sentence_samples: int = 0  # the sentence's speech, in samples
    windows: tuple[tuple[int, int, int], ...] = ()
    decode_seconds: float = 0.0  # time the decoder took for this piece (0: not decoded in windows)
    frames: int = 0  # latent frames decoded for it, margins included
    on_lane: bool = False  # decoded beside another window (decode_seconds is not the decoder's alone)

    def described(self) -> dict:
        """What a room needs to schedule this piece, sent with its audio over Wyoming (no audio)."""
        return {"sentence": self.sentence, "pause": self.pause, "offset": self.offset,
                "sentence_samples": self.sentence_samples, "windows": [list(w) for w in self.windows],
                "decode_seconds": self.decode_seconds, "frames": self.frames, "on_lane": self.on_lane,
                "samples": int(self.audio.size)}

    @classmethod
    def from_description(cls, data: dict, audio: np.ndarray) -> "Piece":
        """The piece a voice server described (`described`); ValueError for what is not one."""
        try:
            return cls(audio, int(data["sentence"]), bool(data["pause"]), int(data["offset"]),
                       int(data["sentence_samples"]),
                       tuple((int(a), int(b), int(c)) for a, b, c in data["windows"]),
                       float(data["decode_seconds"]), int(data["frames"]), bool(data["on_lane"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a piece description: {type(e).__name__}: {e}") from None

    @property
    def starts_sentence(self) -> bool:
        return not self.pause and self.offset == 0

    @property
    def ends_sentence(self) -> bool:
        return self.pause or self.offset + self.audio.size >= self.sentence_samples


def decoded(voice: Voice, work: Iterator[Piece | Window]) -> Iterator[Piece]:
    """Pieces in playing order, the windows decoded.

    The first sentence's windows run alone on every core and each is given
    out at once: it may start to play before its last window is ready
    (ahead.py times that by this decoder speed alone). With decoder lanes
    (tune.py found two windows at once faster on this CPU: the
    decoder's small layers leave cores idle), every later sentence's
    windows go to the lanes, two at once, while the next sentence's front
    runs, and the sentence is given out whole once its last window is
    decoded: no window is ever waited for while it plays. The windows
    under way at once hold at most two lane windows' frames: each holds
    ONNX Runtime's arena for its tensors (0.2 MB a frame, full-size voice).
    """
    lanes = voice.decoder_lanes
    budget = lanes.count * (LANE_WINDOW_FRAMES + 2 * voice.decoder_margin) if lanes else 0
    units: deque[list] = deque()  # later sentences under way: their windows' futures, in order
    try:
        for item in work:
            if isinstance(item, Piece) or lanes is None or item.piece.sentence == 0:
                yield item if isinstance(item, Piece) else item.decode(voice.decoder)
                continue
            if not units or units[-1][0].piece.sentence != item.piece.sentence:
                while len(units) > 1:  # at most this sentence and the one before under way
                    yield from _whole(units.popleft())
                units.append([])
                log.debug("sentence %d on the decoder lanes", item.piece.sentence)
            while _frames_under_way(units) + item.piece.frames > budget:
                if len(units) > 1:  # the sentence before, whole
                    yield from _whole(units.popleft())
                    continue
                busy = [w.future for w in units[0] if not w.future.done()]  # this sentence's own
                if not busy:
                    break
                wait(busy, return_when=FIRST_COMPLETED)
            units[-1].append(_OnLane(item, lanes.submit(item.decode_on_lane)))
        while units:
            yield from _whole(units.popleft())
    finally:
        for unit in units:  # a stopped utterance: windows not begun are dropped
            for window in unit:
                window.future.cancel()

def _whole(unit: list[_OnLane]) -> Iterator[Piece]:
    pieces = [window.future.result() for window in unit]  # all decoded before the first plays
    yield from pieces


def _frames_under_way(units) -> int:
    return sum(w.piece.frames for unit in units for w in unit if not w.future.done())


@dataclass
class _OnLane:
    window: Window
    future: Future

    @property
    def piece(self) -> Piece:
        return self.window.piece


@dataclass
class Window:
    """One decoder window of a sentence: its inputs and the piece its kept samples make."""

    feeds: dict
    piece: Piece  # all but the audio and the time it took
    keep: slice  # the samples kept: the margins only served the ones between
    test_cpu_s: float = 0.0  # tests only: CPU time its decoding takes at least (TEST_DECODER_CPU)

    def decode(self, session, on_lane: bool = False) -> Piece:
        began, cpu_began = time.perf_counter(), time.thread_time()
        audio = session.run(None, self.feeds)[0].reshape(-1)
        if self.test_cpu_s:  # never in production; timed with the run, as a heavier decoder would be
            _burn_cpu(until=cpu_began + self.test_cpu_s)
        return replace(self.piece, audio=audio[self.keep], decode_seconds=time.perf_counter() - began,
                       on_lane=on_lane)

    def decode_on_lane(self, session) -> Piece:
        return self.decode(session, on_lane=True)


_burn_rate = 1e6  # pbkdf2 rounds a CPU-second on this CPU, learnt as _burn_cpu burns


def _burn_cpu(until: float) -> None:
    """Compute on this thread until its CPU clock (time.thread_time) reads `until`, with the
    GIL released throughout, as in a decoder's run: pbkdf2_hmac holds it for none of its
    rounds, and as many are asked for at once as should take the time left."""
    global _burn_rate
    while (left := until - time.thread_time()) > 0:
        rounds = max(1000, int(left * _burn_rate))
        began = time.thread_time()
        hashlib.pbkdf2_hmac("sha256", b"", b"", rounds)
        took = time.thread_time() - began
        if took > 0:
            _burn_rate = rounds / took
