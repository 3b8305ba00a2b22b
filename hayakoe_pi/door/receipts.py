"""received.json: when this Pi first received each message in hand, kept across a power cut.

A message the broker hands back after a crash or a restart keeps its age
from its first receipt, so an announcement queued before a power cut is not
spoken hours later. Only such a redelivery: a receipt is keyed by the
broker's packet id and the payload's digest, and it dates only a delivery
the broker marks as a redelivery (DUP set, the same packet id). A new message
with the same bytes (a daily automation) is new, its age counted from now. A
QoS 0 message is never handed back: no receipt of it is kept.

At start the last run's receipts wait for their messages: the broker resends
a resumed session's unacknowledged messages as soon as it accepts the
connection, before it confirms the intake's subscription (mosquitto, and TCP
keeps the order). What has not come back RESEND_GRACE_S after that
confirmation never will (a session ended by `hayakoe-pi forget`, a broker
restarted without its persistence): its receipt is dropped.

Made once at start, they also clear the state folder of the temporary files
that writes cut short there left (`durable.remove_leftovers`): received.json,
written at every message, is the likeliest to leave one.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from ..durable import FailingWrites, remove_leftovers, write_durably

log = logging.getLogger("hayakoe_pi")

FORGET_AFTER_SECONDS = 7 * 86400.0  # a last resort: no receipt is kept longer
RESEND_GRACE_S = 10.0  # for a broker slower than mosquitto to resend what it held (it needs milliseconds)
FORMAT = 2  # 1 (no "format" field): keyed by the digest alone, so a new message could match


class Receipts:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._times: dict[str, float] = {}  # this run's: "packet id:digest" → Unix time
        self._writes = FailingWrites(f"cannot save {path}: a restart would count ages anew", f"{path} saved again")
        self._earlier: dict[str, float] = {}  # the last run's, until the broker has handed their messages back
        self._waiting = False
        remove_leftovers(path.parent)
        self._earlier = self._load()  # (after the two above: it may save)

    def _load(self) -> dict[str, float]:
        try:
            data = json.loads(self.path.read_text("utf-8"))
            if isinstance(data, dict) and "format" not in data:
                log.warning("dropping the receipts in %s, of an older version: a message queued before this "
                            "start counts its age from now", self.path)
                self._save()  # said once: the next start finds this version
                return {}
            if data["format"] != FORMAT:
                raise ValueError(f"unknown format {data['format']!r}")
            now = time.time()
            return {k: float(v) for k, v in data["received"].items()
                    if isinstance(k, str) and isinstance(v, (int, float)) and now - v < FORGET_AFTER_SECONDS}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError, KeyError) as e:
            log.warning("ignoring %s (%s)", self.path, e)
            return {}

    def first(self, digest: str, packet_id: int, redelivered: bool) -> float:
        """When this message was first received: now (recorded) unless it is a redelivery of one
        received before. `packet_id` 0: QoS 0, never handed back, nothing recorded."""
        now = time.time()
        if not packet_id:
            return now
        key = f"{packet_id}:{digest}"
        with self._lock:
            # the broker gives a packet id again without DUP only once its last message is gone
            earlier = self._earlier.pop(key, None)
            if redelivered:
                self._times.setdefault(key, now if earlier is None else earlier)
            else:
                self._times[key] = now
            self._save()
            return self._times[key]

    def forget(self, digest: str, packet_id: int) -> None:
        """The message is answered: the broker will not hand it over again."""
        with self._lock:
            if self._times.pop(f"{packet_id}:{digest}", None) is not None:
                self._save()

    def intake_subscribed(self) -> None:
        """The intake is subscribed: RESEND_GRACE_S later, drop the last run's receipts whose
        messages the broker did not hand back (once per run)."""
        with self._lock:
            if self._waiting:
                return
            self._waiting = True
        timer = threading.Timer(RESEND_GRACE_S, self._drop_unclaimed)
        timer.daemon = True
        timer.start()

    def _drop_unclaimed(self) -> None:
        with self._lock:
            lost, self._earlier = len(self._earlier), {}
            if lost:
                self._save()
        if lost:
            log.info("dropped %d receipts of messages the broker did not hand back (their session ended, "
                     "or they were answered)", lost)

    def _save(self) -> None:
        try:
            write_durably(self.path, json.dumps({"format": FORMAT, "received": {**self._earlier, **self._times}}))
        except OSError as e:  # a full disk: the message is spoken all the same
            self._writes.failed(e)
            return
        self._writes.worked()
