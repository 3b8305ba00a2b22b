"""Decoder lanes: decoder windows run two at once where prepare (tune.py) found that
faster on this CPU, each lane a thread with a session of its own on its share of the cores."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import onnxruntime as ort

from ..threads import lower_compute_priority, name_os_thread
from .cpu import cpu_threads

# Latent frames of a decoder window on a lane (the engine's full window is 256):
# two in flight at once need ONNX Runtime's arena to hold both, and two of 256
# frames took it 36 MB further than two of 224 (full-size voice), for 1.5 % more
# overlap decoded.
LANE_WINDOW_FRAMES = 224


def lane_threads(lanes: int) -> int:
    """Threads of each decoder lane: the cores shared out."""
    return max(1, cpu_threads() // lanes)


T = TypeVar("T")


class DecoderLanes:
    """Decoder runs, several at once: each lane is a thread with a session of its own
    (on its share of the cores). Runs are taken in the order given."""

    def __init__(self, sessions: list[ort.InferenceSession], weights: list | None = None):
        self._weights = weights  # what the sessions read: kept for as long as they live
        self._sessions: queue.SimpleQueue = queue.SimpleQueue()
        for session in sessions:
            self._sessions.put(session)
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(len(sessions), thread_name_prefix="decoder lane",
                                        initializer=self._start_lane)
        self.count = len(sessions)

    def _start_lane(self) -> None:
        name_os_thread("decoder lane")
        lower_compute_priority()  # like every synthesis thread: the player goes first
        self._local.session = self._sessions.get()

    def submit(self, job: Callable[[ort.InferenceSession], T]) -> Future[T]:
        """Run job(session) on the next free lane."""
        return self._pool.submit(lambda: job(self._local.session))
