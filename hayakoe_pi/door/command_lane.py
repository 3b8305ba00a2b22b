"""One thread for a kind of command, behind a bounded queue: MQTT's network thread hands a
command on without ever waiting, and a command that finds the queue full is refused at once
(the caller answers it), never dropped unanswered nor left to pile up without end."""

from __future__ import annotations

import logging
import threading
from collections import deque

log = logging.getLogger("hayakoe_pi")


class CommandLane:
    """Runs `run(items)` on a thread named `name`, with up to `batch` of the waiting items at a
    time, in the order they came; at most `limit` wait."""

    def __init__(self, name: str, run, limit: int, batch: int = 1):
        self.name, self.limit = name, limit
        self._run, self._batch = run, batch
        self._waiting: deque = deque()
        self._cond = threading.Condition()
        self.closed = False
        self._full_logged = False  # once per time it fills, not once per command refused
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def offer(self, item) -> bool:
        """Queue `item`; False, at once, when `limit` items are waiting (or the lane is closed)."""
        with self._cond:
            if self.closed:
                return False
            full = len(self._waiting) >= self.limit
            if not full:
                self._waiting.append(item)
                self._cond.notify()
                return True
            first_refusal, self._full_logged = not self._full_logged, True
        if first_refusal:
            log.warning("%s: the command queue is full (%d waiting); answering busy until it is done",
                        self.name, self.limit)
        return False

    def close(self) -> None:
        """What is waiting is dropped (the daemon is going down); what runs ends on its own."""
        with self._cond:
            self.closed = True
            self._waiting.clear()
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self.closed:
                    self._full_logged = False  # all done: a queue full again later is logged again
                    self._cond.wait()
                if self.closed:
                    return
                items = [self._waiting.popleft() for _ in range(min(self._batch, len(self._waiting)))]
            self._run(items)
