"""Which say/prepare messages are queued, and which are answered at once instead.

- a duplicate: its id is that of a message waiting or being spoken, or
  answered less than `queue.duplicate_window_s` ago (a redelivery); later
  the same id is a new message;
- poison: the same message (by its bytes) was being spoken when the daemon
  died POISON_DEATHS times: spoken again, it would kill it again;
- expired (when its turn comes): older than its `max_age`, else
  `queue.max_age_s`, counted from its `sent`, else its first receipt here
  (a redelivery's, receipts.py).
"""

from __future__ import annotations

import logging
import threading
import time

from ..broker.payloads import SayRequest
from .receipts import Receipts
from .speaking import POISON_DEATHS

PRUNE_AT = 1000  # ids remembered before the expired ones are dropped
SENT_AHEAD_TOLERANCE_S = 5.0  # a sender's clock this far ahead is normal drift, not worth a word

log = logging.getLogger("hayakoe_pi")


class Admission:
    def __init__(self, duplicate_window_s: float, max_age_s: float, receipts: Receipts,
                 deaths: dict[str, int] | None = None):
        self.duplicate_window_s, self.max_age_s = duplicate_window_s, max_age_s
        self.receipts = receipts
        self.deaths = dict(deaths or {})  # digest → runs that died speaking it
        self._lock = threading.Lock()
        self._ids: dict[str, float | None] = {}  # id → until when it is a duplicate (None: in hand)
        self._ahead_logged = False

    def refusal(self, request: SayRequest) -> str | None:
        """"duplicate" or "poison" for a message not to queue, else None (then admit() it)."""
        if self.deaths.get(request.digest, 0) >= POISON_DEATHS:
            return "poison"
        with self._lock:
            until = self._ids.get(request.id, 0.0)
            return "duplicate" if until is None or until > time.monotonic() else None

    def date(self, request: SayRequest) -> None:
        """On arrival, before anything is published of it: its receipt, and how old it is now
        (a wall clock stepped once its `queued` is out must not age it)."""
        request.received = self.receipts.first(request.digest, request.packet_id, request.redelivered)
        self._date(request)

    def admit(self, request: SayRequest) -> None:
        """The message is queued: its id in hand (a duplicate) until it is answered. Only now: a
        message refused, or lost on the way in, leaves its id to the next one."""
        now = time.monotonic()
        with self._lock:
            if len(self._ids) >= PRUNE_AT:
                self._ids = {k: v for k, v in self._ids.items() if v is None or v > now}
            self._ids[request.id] = None

    def _date(self, request: SayRequest) -> None:
        """How old the request is now, on arrival: the wall clock only against `sent` or an earlier
        run's receipt; from here its age grows on the steady clock, which NTP never steps."""
        request.received_steady = time.monotonic()
        origin = request.sent if request.sent is not None else request.received
        age = time.time() - origin
        if age < -SENT_AHEAD_TOLERANCE_S and not self._ahead_logged:
            self._ahead_logged = True  # once a run: a clock not yet set would say it of every message
            log.warning("a message's sent time is %.0f s ahead of this device's clock: its age is counted from "
                        "now. Is the clock set (NTP: timedatectl)? Said once.", -age)
        request.age_at_receipt = max(0.0, age)

    def answered(self, request: SayRequest, admitted: bool = True) -> None:
        """The request has its last event: its id stays a duplicate for the window, and the broker
        will not hand the message over again. `admitted`: admit() had let it in."""
        if admitted:
            with self._lock:
                if request.id in self._ids:
                    self._ids[request.id] = time.monotonic() + self.duplicate_window_s
            self.receipts.forget(request.digest, request.packet_id)
        self.deaths.pop(request.digest, None)

    def age_over_limit(self, request: SayRequest) -> tuple[float, float] | None:
        """(age, limit) in seconds when the request is too old to speak now, else None."""
        limit = request.max_age if request.max_age is not None else self.max_age_s
        age = request.age_at_receipt + time.monotonic() - request.received_steady
        return (age, limit) if age > limit else None
