"""say/prepare messages in, on paho's intake thread: each parsed, admitted and placed in the
queue, or answered at once. None is lost: whatever goes wrong with one (a bug too) is answered
with an `error` and acknowledged, and its id is left to the next message."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from ..broker.payloads import PayloadError, SayRequest, event, parse_say
from ..speech.service import SpeechService
from .admission import Admission
from .reports import Reports

log = logging.getLogger("hayakoe_pi")


class Intake:
    """The door of the queue of say requests (one bound for all; alerts before every waiting
    message). `cond` guards `queue`, which the speaker thread takes from."""

    def __init__(self, speech: SpeechService, chime_file: Callable[[str], object], admission: Admission,
                 reports: Reports, queue: deque[SayRequest], cond: threading.Condition, cut: threading.Event,
                 max_length: int):
        self.speech, self.chime_file, self.admission, self.reports = speech, chime_file, admission, reports
        self.queue, self.cond, self.cut, self.max_length = queue, cond, cut, max_length

    def submit(self, payload: bytes, play: bool = True, ack: Callable[[], None] = lambda: None,
               packet_id: int = 0, redelivered: bool = False) -> SayRequest | None:
        """The request queued, or None: answered already."""
        try:
            request = parse_say(payload, self.speech, play, self.chime_file)
        except PayloadError as e:
            return self._refuse(str(e), ack, e.request_id, e.text, e.code)
        except Exception as e:  # a bug in parsing: this payload is answered all the same
            log.exception("cannot read a %s payload", "say" if play else "prepare")
            return self._refuse(f"cannot read this payload: {type(e).__name__}: {e}", ack)
        request.ack, request.packet_id, request.redelivered = ack, packet_id, redelivered
        try:
            return self._admit(request)
        except Exception as e:  # in answering it: answered now, never claimed (admit() comes last)
            log.exception("cannot take %r", request.id)
            return self._refuse(f"cannot take this message: {type(e).__name__}: {e}", ack, request.id, request.text)

    def _admit(self, request: SayRequest) -> SayRequest | None:
        with self.cond:
            if len(self.queue) >= self.max_length:  # interrupt too: nothing queued is dropped for a newcomer
                return self._refuse(f"queue full ({self.max_length} waiting); try again later", request.ack,
                                    request.id, request.text, "queue_full")
            refusal = self.admission.refusal(request)
            if refusal == "duplicate":
                # answered, so an automation waiting for this id hears why nothing more comes
                log.info("ignoring message id %r: already received", request.id)
                self.reports.event(event("duplicate", request))
                request.ack()
                return None
            if refusal == "poison":
                log.error("not speaking %r again: the daemon died while speaking it twice", request.id)
                self.reports.error("not spoken: the daemon died twice while speaking this message", request.id,
                                   request.text, "poison")
                self.admission.answered(request, admitted=False)
                request.ack()
                return None
            self.admission.date(request)
            self.reports.event(event("queued", request))
            self.admission.admit(request)  # its id taken only once nothing more can fail on the way in
            self._place(request)
            self.cond.notify()
        return request

    def _place(self, request: SayRequest) -> None:
        if request.interrupt:  # never a prepare's (parse_say): it plays nothing, so it cuts nothing
            self.queue.appendleft(request)
            self.cut.set()
        elif request.alert:  # before every waiting message, after the alerts already waiting
            ahead = next((i for i, r in enumerate(self.queue) if not r.alert), len(self.queue))
            self.queue.insert(ahead, request)
        else:
            self.queue.append(request)

    def _refuse(self, reason: str, ack: Callable[[], None], request_id: str | None = None, text: str | None = None,
                code: str = "bad_payload") -> None:
        self.reports.error(reason, request_id, text, code)
        ack()
        return None
