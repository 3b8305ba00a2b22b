"""A sound card kept open between utterances, fed with silence (audio.keep_open_s)."""

from __future__ import annotations

import threading
import time

import numpy as np


class KeptOpen:
    """A card left open after an utterance, fed with silence until taken or `seconds` pass
    (then drained and closed, on this thread). A card that fails meanwhile is closed.

    The thread is a daemon thread: `hayakoe-pi say` ends at once with its last sound.
    """

    def __init__(self, stream, sample_rate: int, seconds: float, block_seconds: float, close):
        self.stream, self.sample_rate, self._close = stream, sample_rate, close
        self._block = np.zeros((max(1, int(sample_rate * block_seconds)), 1), dtype=np.float32)
        self._taken = threading.Event()
        self._until = time.monotonic() + seconds
        self._thread = threading.Thread(target=self._feed, name="card kept open", daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        try:
            while not self._taken.is_set() and time.monotonic() < self._until:
                self.stream.write(self._block)  # blocks while the card's buffer is full: paced by the card
        except Exception:  # the card failed or went away: the next utterance opens it again
            self._close(self.stream)
            self.stream = None
            return
        if not self._taken.is_set():
            self._close(self.stream, drain=True)
            self.stream = None

    def take(self):
        """Stop the silence; the stream, or None if it was closed meanwhile."""
        self._taken.set()
        self._thread.join()
        return self.stream
