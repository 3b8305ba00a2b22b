"""A sound card as the player sees it: what it holds (`Card`), and kept open between
utterances, fed with silence (audio.keep_open_s, `KeptOpen`)."""

from __future__ import annotations

import threading
import time

import numpy as np


class Card:
    """An open output stream and how much audio it holds: what is written next is heard
    that much later, on top of what the card does not tell (audio.latency_ms).

    Counted here, from what was written against the card's real-time pace: PortAudio's
    own count (write_available) covers ALSA's ring buffer only, and a plugin that takes
    the audio at once (the test card's file plugin into a pipe) leaves it empty there.
    """

    # the most the card held in its first seconds is all it can hold: later counts may
    # grow by the card's clock drifting from this one's (~50 ppm) over a long keep-open
    LEARN_SECONDS = 5.0

    def __init__(self, stream, sample_rate: int, latency: float = 0.0):
        self.stream, self.sample_rate, self.latency = stream, sample_rate, latency
        self._opened = time.monotonic()
        self._played_out = self._opened  # when the card will have played all it was given
        self._capacity = 0.0

    def write(self, frames: np.ndarray) -> bool:
        """Write (blocks while the card is full); True if the card had run dry before."""
        before = time.monotonic()
        dry = self.stream.write(frames)
        # a card that ran dry plays what comes at once: it starts over from the write
        self._played_out = max(self._played_out, before) + len(frames) / self.sample_rate
        if before - self._opened < self.LEARN_SECONDS:
            self._capacity = max(self._capacity, self._played_out - time.monotonic())
        return dry

    def held(self) -> float:
        """Seconds of audio in the card, not heard yet."""
        now = time.monotonic()
        left = max(0.0, self._played_out - now)
        return left if now - self._opened < self.LEARN_SECONDS else min(left, self._capacity)

    def heard_next(self) -> float:
        """When (time.monotonic()) what is written next is heard."""
        return time.monotonic() + self.held() + self.latency

    def close(self, drain: bool = False) -> None:
        if drain:
            try:
                self.stream.stop()  # returns once the buffered audio has been played
            except Exception:  # a card gone meanwhile: nothing left to play
                pass
        self.stream.close(ignore_errors=True)


class KeptOpen:
    """A card left open after an utterance, fed with silence until taken or `seconds` pass
    (then drained and closed, on this thread). A card that fails meanwhile is closed.

    The thread is a daemon thread: `hayakoe-pi say` ends at once with its last sound.
    """

    def __init__(self, stream: Card, seconds: float, block_seconds: float):
        self.stream = stream
        self._block = np.zeros((max(1, int(stream.sample_rate * block_seconds)), 1), dtype=np.float32)
        self._taken = threading.Event()
        self._until = time.monotonic() + seconds
        self._thread = threading.Thread(target=self._feed, name="card kept open", daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        try:
            while not self._taken.is_set() and time.monotonic() < self._until:
                self.stream.write(self._block)  # blocks while the card's buffer is full: paced by the card
        except Exception:  # the card failed or went away: the next utterance opens it again
            self.stream.close()
            self.stream = None
            return
        if not self._taken.is_set():
            self.stream.close(drain=True)
            self.stream = None

    def take(self):
        """Stop the silence; the stream, or None if it was closed meanwhile."""
        self._taken.set()
        self._thread.join()
        return self.stream
