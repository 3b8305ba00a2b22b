"""The MQTT API: payloads turned into typed requests, and the events that answer them.

    hayakoe/[<device>/]say, /prepare   plain text, or JSON {"text", "voice", "style", "speed",
                                       "volume", "id", "interrupt", "at", "max_age", "sent",
                                       "chime", "priority"}  -> SayRequest
    hayakoe/<device>/<setting>/set     volume 0-100, a voice, a style  -> the value
    hayakoe/<device>/event             {"event": ..., "id", "text", ...}  <- event(), error_event()
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ..bounds import QUOTE_CHARS, REASON_CHARS, encodable, quoted, quoted_repr, unencodable
from ..sound.chime import CHOICES as CHIME_CHOICES, chime_choice
from ..synthesis.engine import SPEED_RANGE
from ..speech.service import SpeechError, SpeechService, check_number

REQUEST_FIELDS = ("text", "voice", "style", "speed", "volume", "id", "interrupt", "at", "max_age", "sent",
                  "chime", "priority")
PRIORITIES = ("normal", "alert")  # alert: before every waiting message, and louder than quiet hours
EVENT_TEXT_CHARS = QUOTE_CHARS  # events quote at most this much of the text
MAX_ID_CHARS = 128
# "at" (Unix time) further ahead than this is refused: a room waiting for it holds its queue
AT_MAX_AHEAD_SECONDS = 60.0
# "sent" above this is not a Unix time in seconds (it is the year 5138): milliseconds, most likely
SENT_MAX = 1e11
MAX_AGE_RANGE = (1.0, 7 * 86400.0)  # "max_age", seconds
PAYLOAD_OVERHEAD_BYTES = 4096  # JSON fields around the text
# A dictionary/add|remove payload: a word (40 characters), its reading (40 moras) and three small
# fields take a few hundred bytes; a larger one is refused before it is parsed
MAX_WORD_BYTES = 4096


def max_payload_bytes(max_text_chars: int) -> int:
    """The largest payload read at all (checked before decoding): the text at 4 bytes a character."""
    return 4 * max_text_chars + PAYLOAD_OVERHEAD_BYTES


class PayloadError(ValueError):
    """A payload that cannot become a request: answered with an error event (with `code`)."""

    def __init__(self, reason: str, request_id: str | None = None, text: str | None = None,
                 code: str = "bad_payload"):
        super().__init__(reason)
        self.request_id = request_id
        self.text = text
        self.code = code


@dataclass
class SayRequest:
    id: str
    text: str
    voice: str | None = None
    style: str | None = None
    speed: float | None = None
    volume: float | None = None  # 0..1
    interrupt: bool = False
    at: float | None = None  # Unix time to start the sound at (rooms in step); None: as soon as it can
    at_steady: float | None = None  # `at` on time.monotonic(), fixed on arrival: a wall clock stepped meanwhile moves nothing
    max_age: float | None = None  # seconds; None: queue.max_age_s
    sent: float | None = None  # Unix time the sender sent it, when it says so
    chime: bool | str | None = None  # True: this Pi's chime, False: none, a WAV in audio.chime_dir; None: as set
    alert: bool = False  # "priority": "alert"
    received: float = 0.0  # Unix time this Pi first received it (kept across restarts)
    age_at_receipt: float = 0.0  # seconds old when this run received it (from `sent`, or an earlier run's receipt)
    received_steady: float = 0.0  # time.monotonic() when this run received it: its age grows on the steady clock
    digest: str = ""  # of the payload's bytes (poison; a receipt's key, with packet_id)
    packet_id: int = 0  # the broker's, on the intake (0: QoS 0, or not from the broker)
    redelivered: bool = False  # the broker hands it over again (DUP): its first receipt may be older
    play: bool = True  # False: only synthesize into the cache (prepare)
    # called once the request has its last event: the broker may then forget the message
    ack: Callable[[], None] = field(default=lambda: None, repr=False, compare=False)


# JSON is meant when the payload opens an object the way JSON does: `{"` or `{}`
# (spaces allowed). Any other text is spoken, braces and all; broken JSON of
# that shape is refused with its error.
_JSON_OBJECT_RE = re.compile(r'\s*\{\s*(?:"|\})')


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


def payload_digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()[:24]


def _code(e: SpeechError) -> str:
    return e.code.replace("-", "_")  # MQTT's codes are snake_case; Wyoming keeps its own


def parse_say(payload: bytes, service: SpeechService, play: bool = True, chime_file=None) -> SayRequest:
    """A `say` (or `prepare`) payload as a checked request, or PayloadError.

    `chime_file(name)`: a "chime" given as a WAV file's name or path, as the file
    to play (only files in audio.chime_dir: chime.Chimes.resolve), or ValueError."""
    limit = max_payload_bytes(service.max_text_chars)
    if len(payload) > limit:  # before decoding: a huge payload is never copied into text
        raise PayloadError(f"payload too large ({len(payload)} bytes, limit {limit})", code="too_large")
    try:
        raw = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise PayloadError("payload is not valid UTF-8 text") from None
    if _JSON_OBJECT_RE.match(raw) or raw.lstrip().startswith("["):
        request = _parse_json(raw, service, chime_file)
    else:  # plain text, also when it starts with a brace: {笑}ただいま
        request = SayRequest(id=_new_id(), text=raw)
    request.play = play
    request.interrupt = request.interrupt and play  # a prepare plays nothing, so it cuts nothing either
    request.digest = payload_digest(payload)
    try:
        request.text = service.check_text(request.text)
    except SpeechError as e:
        raise PayloadError(str(e), request.id, request.text, _code(e)) from None
    return request


class _LongNumber:
    """A JSON number of more digits than int() reads (Python's limit: 4,300), kept to be refused."""

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))


def _whole_number(digits: str) -> int | _LongNumber:
    try:
        return int(digits)
    except ValueError:
        return _LongNumber(digits)


def _untakeable(data: dict) -> str | None:
    """Why JSON that parsed cannot be taken as it is, else None: a string that UTF-8 cannot carry
    (a lone surrogate) or a number too long to read, in any field, nested or not, or a name."""
    waiting = [(name, name) for name in data] + list(data.items())  # (the field, a value in it)
    while waiting:  # not recursive: JSON nested a thousand deep is still a payload
        name, value = waiting.pop()
        if isinstance(value, _LongNumber):
            return f"{quoted_repr(name, 40)} holds a number of {value.digits} digits, too long to read"
        if isinstance(value, str) and (bad := unencodable(value)):
            return (f"{quoted_repr(name, 40)} holds a lone surrogate (\\u{ord(bad):04x}), which UTF-8 cannot "
                    "carry: text cut inside an emoji?")
        if isinstance(value, dict):
            waiting += [(name, key) for key in value] + [(name, v) for v in value.values()]
        elif isinstance(value, list):
            waiting += [(name, v) for v in value]
    return None


def _number(value, name: str, low: float, high: float) -> float:
    """check_number, also for a whole number too large for a float (JSON sets no bound)."""
    try:
        return check_number(value, name, low, high)
    except OverflowError:
        span = f" ({low:g} to {high:g})" if math.isfinite(high) else ""
        raise ValueError(f"{name} is a whole number of {len(str(abs(value)))} digits: too large{span}") from None


def _parse_json(raw: str, service: SpeechService, chime_file=None) -> SayRequest:
    try:
        data = json.loads(raw, parse_int=_whole_number)
    except (json.JSONDecodeError, RecursionError) as e:
        if raw.lstrip().startswith("["):  # "[お知らせ]…" is text, not broken JSON
            return SayRequest(id=_new_id(), text=raw)
        raise PayloadError(f"invalid JSON: {getattr(e, 'msg', e)}") from None
    if not isinstance(data, dict):
        raise PayloadError("JSON payload must be an object")
    rid = data.get("id")
    if rid is not None and (isinstance(rid, bool) or not isinstance(rid, (str, int))
                            or not 0 < len(str(rid)) <= MAX_ID_CHARS):
        raise PayloadError(f"id must be a string or integer of at most {MAX_ID_CHARS} characters")
    if isinstance(rid, str) and (any(ord(c) < 32 or 127 <= ord(c) < 160 for c in rid) or unencodable(rid)):
        raise PayloadError("id must not contain control characters or lone surrogates")
    rid = str(rid) if rid is not None else _new_id()
    text = data.get("text")
    said = text if isinstance(text, str) else None
    if problem := _untakeable(data):
        raise PayloadError(problem, rid, said)
    try:
        unknown = sorted(k for k in data if k not in REQUEST_FIELDS)
        if unknown:
            raise ValueError(f"unknown field {quoted(', '.join(map(repr, unknown)), 80)}; "
                             f"known: {', '.join(REQUEST_FIELDS)}")
        if not isinstance(text, str):
            raise ValueError("'text' must be a string")
        request = SayRequest(id=rid, text=text)
        if data.get("voice") is not None:
            request.voice = service.check_voice(data["voice"])
        if data.get("style") is not None:
            request.style = service.check_style(data["style"], request.voice or service.current_voice())
        if data.get("speed") is not None:
            request.speed = _number(data["speed"], "speed", *SPEED_RANGE)
        if data.get("volume") is not None:
            request.volume = _number(data["volume"], "volume", 0, 100) / 100
        if data.get("interrupt") is not None:
            if not isinstance(data["interrupt"], bool):
                raise ValueError("interrupt must be true or false")
            request.interrupt = data["interrupt"]
        if data.get("at") is not None:
            request.at = parse_at(data["at"])
            if request.at is not None:
                request.at_steady = time.monotonic() + (request.at - time.time())
        if data.get("max_age") is not None:
            request.max_age = _number(data["max_age"], "max_age (seconds)", *MAX_AGE_RANGE)
        if data.get("chime") is not None:
            request.chime = parse_chime(data["chime"], chime_file)
        if data.get("priority") is not None:
            if data["priority"] not in PRIORITIES:
                raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}")
            request.alert = data["priority"] == "alert"
        if data.get("sent") is not None:
            request.sent = parse_sent(data["sent"])
    except SpeechError as e:
        raise PayloadError(str(e), rid, said, _code(e)) from None
    except ValueError as e:
        raise PayloadError(str(e), rid, said) from None
    return request


def parse_chime(value, chime_file=None) -> bool | str:
    """The "chime" field: true (this Pi's chime), false (none), "default", "off" ("none"), or a
    WAV file in audio.chime_dir (its name or path; nothing else in a payload is read as a file)."""
    if isinstance(value, bool):
        return value
    if value in ("none", *CHIME_CHOICES):
        return chime_choice(value)
    if not isinstance(value, str) or not value.strip() or chime_file is None:
        raise ValueError("chime must be true, false, \"default\", \"off\" or a WAV file in audio.chime_dir")
    return chime_file(value)


def parse_at(value, now: float | None = None) -> float | None:
    """The "at" field: a Unix time in seconds; one already past means now (None)."""
    now = time.time() if now is None else now
    at = _number(value, "at (a Unix time in seconds)", 0, math.inf)
    if at > now + AT_MAX_AHEAD_SECONDS:
        raise ValueError(f"at is {at - now:.0f} s ahead of this device's clock; at most "
                         f"{AT_MAX_AHEAD_SECONDS:g} s is accepted (is the sender's clock right?)")
    return at if at > now else None


def parse_sent(value) -> float:
    """The "sent" field: a Unix time in seconds; one in milliseconds is refused (its age would be
    negative: the message would never expire)."""
    sent = _number(value, "sent (a Unix time in seconds)", 0, math.inf)
    if sent > SENT_MAX:
        raise ValueError(f"sent must be a Unix time in seconds, got {sent:.0f}: milliseconds? "
                         f"(in Home Assistant: {{{{ now().timestamp() }}}}, or {sent / 1000:.0f})")
    return sent


def parse_volume(payload: bytes) -> float:
    """A volume/set payload: percent, 0 to 100."""
    value = payload.decode("utf-8", errors="replace").strip()
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"volume must be a number from 0 to 100, got {quoted_repr(value, 40)}") from None
    return check_number(number, "volume", 0, 100)


def parse_word(payload: bytes, adding: bool) -> dict:
    """A dictionary/add or /remove payload: JSON {"surface", "reading", "accent", ...}, or as
    plain text "晴翔 ハルト 1" (add) and "晴翔" (remove), which a Home Assistant text entity sends."""
    if len(payload) > MAX_WORD_BYTES:  # before decoding: never parsed, never quoted back
        raise ValueError(f"payload too large ({len(payload)} bytes, limit {MAX_WORD_BYTES}): give one word, "
                         "its reading and accent")
    try:
        raw = payload.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError("payload is not valid UTF-8 text") from None
    if raw.startswith("{"):
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ValueError(f"invalid JSON: {getattr(e, 'msg', e)}") from None
        if not isinstance(data, dict):
            raise ValueError("JSON payload must be an object")
        return data
    parts = raw.split()
    if adding and len(parts) == 3 and parts[2].isdigit():
        return {"surface": parts[0], "reading": parts[1], "accent": int(parts[2])}
    if not adding and len(parts) == 1:
        return {"surface": parts[0]}
    raise ValueError('give JSON {"surface": "晴翔", "reading": "ハルト", "accent": 1}'
                     + (' or "晴翔 ハルト 1"' if adding else ' or the word alone'))


def _quoted_text(text: str | None) -> dict:
    """The "text" field of an event: up to EVENT_TEXT_CHARS, cut with "…" and `"truncated": true`."""
    if not isinstance(text, str):
        return {"text": None}
    if len(text) <= EVENT_TEXT_CHARS:
        return {"text": encodable(text)}
    return {"text": encodable(text[:EVENT_TEXT_CHARS]) + "…", "truncated": True}


def event(kind: str, request: SayRequest, **extra) -> dict:
    payload = {"event": kind, "id": request.id, **_quoted_text(request.text), **extra}
    if not request.play:
        payload["prepare"] = True
    return payload


def error_event(reason: str, request_id: str | None = None, text: str | None = None, code: str = "") -> dict:
    """An error; `code` names the kind (bad_payload, nothing_to_speak, queue_full, poison, ...). The reason
    may quote what was sent (an exception's message too): cut to REASON_CHARS."""
    return {"event": "error", "id": request_id, **_quoted_text(text), "error": quoted(reason, REASON_CHARS),
            **({"code": code} if code else {})}
