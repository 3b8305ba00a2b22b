"""Synthesis ahead of playback, and when a sentence may start to play.

A thread synthesizes an utterance into a buffer bounded in seconds of audio
while the sound card (or a Wyoming client) plays what is ready. The rule that
keeps sentences whole on a CPU slower than real time: a sentence starts to
play only once every decoder window still to come will, at this voice's
measured decoder speed, be ready before playback reaches it. Until then the
pause before it grows; a word is never cut.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import numpy as np

from .decoding import Piece
from ..threads import lower_compute_priority, name_os_thread
from .windows import paced_windows

AHEAD_SECONDS = 30.0  # synthesis may run this far ahead of playback (memory stays flat)
SAFETY = 1.25  # predicted decoder time is taken this much longer than measured
GUARD_SECONDS = 0.1  # and this much is kept in hand for thread wake-ups and the card's buffer


class DecoderSpeed:
    """Seconds per latent frame (margins included) of one voice's decoder, as measured here.

    It follows a slowdown at once (another request sharing the CPU) and a
    speed-up slowly, so one lucky window does not make the next sentence late.
    """

    def __init__(self, seconds_per_frame: float | None = None):
        self.seconds_per_frame = seconds_per_frame
        self._lock = threading.Lock()

    def observe(self, seconds: float, frames: int) -> None:
        if frames <= 0 or seconds <= 0:
            return
        x = seconds / frames
        with self._lock:
            old = self.seconds_per_frame
            if old is None:
                self.seconds_per_frame = x
            else:
                alpha = 1.0 if x > old else 0.2
                self.seconds_per_frame = old + alpha * (x - old)


_speeds: dict[str, DecoderSpeed] = {}
_speeds_lock = threading.Lock()


def decoder_speed(voice: str) -> DecoderSpeed:
    """The (process-wide) speed record of a voice: kept up to date by every utterance."""
    with _speeds_lock:
        return _speeds.setdefault(voice, DecoderSpeed())


class SynthesisAhead:
    """An utterance's pieces, synthesized on a thread of their own ahead of playback.

    Readers take pieces by index (`get`), so a player that must start over
    (the sound card failed) reads from 0 again while synthesis goes on. All
    pieces are kept: the phrase cache stores the whole utterance anyway.
    """

    def __init__(self, pieces: Iterable[Piece], sample_rate: int, speed: DecoderSpeed | None = None,
                 ahead_seconds: float = AHEAD_SECONDS, progress: Callable[[], None] | None = None):
        self.sample_rate = sample_rate
        self.speed = speed or DecoderSpeed()
        self.pieces: list[Piece] = []
        self._source = pieces
        self._limit = int(ahead_seconds * sample_rate)
        self._progress = progress
        self._cond = threading.Condition()
        self._produced = 0  # samples
        self._played = 0  # samples the reader has taken
        self._busy_since: float | None = None  # when the step in progress began
        self._done = False
        self._exhausted = False  # the source ran to its end
        self._error: BaseException | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._produce, name="synthesis", daemon=True)
        self._thread.start()

    @classmethod
    def of_chunks(cls, chunks: Iterable[np.ndarray], sample_rate: int) -> "SynthesisAhead":
        """Plain audio chunks, each taken as whole (a cached utterance, a test signal)."""
        def pieces():
            for i, chunk in enumerate(chunks):
                chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
                yield Piece(chunk, i, sentence_samples=chunk.size, windows=((0, chunk.size, 0),))
        return cls(pieces(), sample_rate)

    # --- the synthesis thread ---------------------------------------------------------

    def _produce(self) -> None:
        name_os_thread("synthesis")
        lower_compute_priority()  # the player must never wait behind synthesis
        steps = iter(self._source)
        try:
            while True:
                with self._cond:
                    while self._produced - self._played > self._limit and not self._cancelled:
                        self._cond.wait(0.5)
                    if self._cancelled:
                        return
                    self._busy_since = time.monotonic()
                piece = next(steps, None)
                if piece is None:
                    self._exhausted = True
                    return
                self._measure(piece, time.monotonic() - self._busy_since)
                with self._cond:
                    self.pieces.append(piece)
                    self._produced += piece.audio.size
                    self._busy_since = None
                    self._cond.notify_all()
                if self._progress:
                    self._progress()
        except BaseException as e:  # handed to the reader
            self._error = e
        finally:
            close = getattr(steps, "close", None)
            if close:
                close()
            with self._cond:
                self._done, self._busy_since = True, None
                self._cond.notify_all()

    def _measure(self, piece: Piece, elapsed: float) -> None:
        if not piece.frames or piece.on_lane:  # a whole sentence on a lane is never timed ahead
            return
        # a later window's wall time includes waiting for the engine behind another
        # request: that is the speed playback will see. A sentence's first window
        # also paid for the synthesizer front, so only its decoder time counts.
        seconds = piece.decode_seconds if piece.offset == 0 else max(elapsed, piece.decode_seconds)
        self.speed.observe(seconds, piece.frames)

    # --- readers ------------------------------------------------------------------------

    def get(self, index: int, timeout: float = 0.0) -> Piece | None:
        """Piece `index`, or None if it is not ready within `timeout` (or there is none).

        Raises what synthesis raised once every piece before the failure was read.
        """
        with self._cond:
            self._cond.wait_for(lambda: len(self.pieces) > index or self._done, timeout)
            if len(self.pieces) > index:
                return self.pieces[index]
            if self._done and self._error is not None:
                raise self._error
            return None

    def at_end(self, index: int) -> bool:
        """True when synthesis has finished and there is no piece `index`."""
        with self._cond:
            if len(self.pieces) > index:
                return False
            if self._done and self._error is not None:
                raise self._error
            return self._done

    def played(self, samples: int) -> None:
        """The reader has taken this many samples (from the start): synthesis may run on."""
        with self._cond:
            self._played = samples
            self._cond.notify_all()

    def waits_for_reader(self, played: int | None = None) -> bool:
        """Synthesis is as far ahead of a reader at `played` samples (default: as last told) as it
        may be, so it waits and computes nothing (the Wyoming server gives up its turn meanwhile)."""
        with self._cond:
            played = self._played if played is None else played
            return not self._done and self._produced - played > self._limit

    def unplayed(self) -> int:
        """Samples synthesized that the reader has not taken yet."""
        with self._cond:
            return self._produced - self._played

    def can_flow(self, index: int, start_at: float) -> bool:
        """Would the sentence that piece `index` starts play to its end without running dry,
        if its first sample plays at `start_at` (time.monotonic())?"""
        with self._cond:
            first = self.pieces[index]
            ready_end = first.offset + first.audio.size
            for p in self.pieces[index + 1:]:
                if p.pause or p.sentence != first.sentence:
                    break
                ready_end = p.offset + p.audio.size
            pending = [(start, frames) for start, end, frames in first.windows if start >= ready_end]
            if not pending:
                return True
            if self._done:  # synthesis failed or was cancelled: nothing more will come
                return True
            per_frame = self.speed.seconds_per_frame
            if per_frame is None:
                return False
            ready_at = self._busy_since or time.monotonic()
        for start, frames in pending:
            ready_at += frames * per_frame * SAFETY
            if ready_at + GUARD_SECONDS > start_at + start / self.sample_rate:
                return False
        return True

    def audio(self) -> np.ndarray:
        """The whole utterance (once synthesis has finished)."""
        with self._cond:
            chunks = [p.audio for p in self.pieces]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)

    @property
    def complete(self) -> bool:
        """Synthesis ran to the end of the text."""
        with self._cond:
            return self._exhausted

    def cancel(self) -> None:
        """Stop synthesis after the step in progress."""
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def synthesizing(self) -> bool:
        """Its thread still works (or waits for its listener to catch up)."""
        return self._thread.is_alive()


def synthesize_ahead(engine, text: str, voice: str | None = None, progress=None,
                     **settings) -> SynthesisAhead:
    """Start synthesizing `text` with `engine` (Engine.pieces settings) ahead of playback."""
    name = voice or engine.voice.name
    v = engine.store.voice(name)
    speed = decoder_speed(name)
    if speed.seconds_per_frame is None and v.tuned_speed:
        speed.observe(*v.tuned_speed)  # the first text after a start is planned by it, not blind
    frame_seconds = v.hop_length / v.sample_rate

    def plan_windows(frames: int, window: int, margin: int):
        # each window as long as can be decoded before playback reaches it
        per_frame = speed.seconds_per_frame
        if per_frame is None:  # not measured yet: the engine's plan
            return None
        return paced_windows(frames, window, margin, ratio=per_frame * SAFETY / frame_seconds,
                             guard=GUARD_SECONDS / frame_seconds, lead=ahead.unplayed() / v.hop_length)

    ahead = SynthesisAhead(engine.pieces(text, voice=voice, plan_windows=plan_windows, **settings),
                           v.sample_rate, speed, progress=progress)
    return ahead
