"""How much of what it was sent the daemon repeats: user text quoted up to a fixed length, and no
publish larger than a broker takes (one it refuses closes the connection, and paho sends it
again at every reconnect: every Pi on a household topic would be cut off), nor one UTF-8 cannot
carry (an answer that cannot be encoded is never sent: its message would go unanswered)."""

from __future__ import annotations

import json
import re

QUOTE_CHARS = 200  # a say's text, a word, a setting's value: quoted at most this long in events and logs
REASON_CHARS = 1000  # an error's reason, quotes and all
# Every publish, after JSON encoding (escapes included) in UTF-8 bytes: a quarter of the installer's
# broker limit (mosquitto/hayakoe-pi.conf, max_packet_size 65536), room for a stricter broker.
MAX_PUBLISH_BYTES = 16384
_LIST_ITEMS = 20  # of a list in an event cut to fit
_LAST_RESORT = ("event", "device", "id", "code", "action")  # what an event cut to the bone keeps


# What UTF-8 cannot carry: a lone surrogate (JSON's "\ud800", a JavaScript string cut inside an emoji)
_UNENCODABLE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """`text` with what UTF-8 cannot carry replaced by U+FFFD: an answer quoting it can always be sent."""
    return _UNENCODABLE.sub("\ufffd", text)


def unencodable(text: str) -> str | None:
    """The first character of `text` that UTF-8 cannot carry, else None."""
    found = _UNENCODABLE.search(text)
    return found.group() if found else None


def quoted(text: str, limit: int = QUOTE_CHARS) -> str:
    """`text` up to `limit` characters; a longer one is cut with a marker that says how long it was."""
    if len(text) <= limit:
        return encodable(text)
    return f"{encodable(text[:limit])}… ({len(text)} characters)"


def quoted_repr(value, limit: int = QUOTE_CHARS) -> str:
    """`value` as Python shows it (in quotes, escaped), its text cut to `limit` characters as by quoted()."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}… ({len(value)} characters)"
    return quoted(repr(value), limit)


def _encode(payload) -> bytes:
    if isinstance(payload, (dict, list)):
        payload = json.dumps(payload, ensure_ascii=False)
    if isinstance(payload, str):
        payload = encodable(payload).encode("utf-8")  # JSON leaves a surrogate as it is, in a string
    return bytes(payload or b"")


def _cut(value, chars: int):
    """Every string in `value` quoted up to `chars`, every list up to _LIST_ITEMS items."""
    if isinstance(value, str):
        return quoted(value, chars)
    if isinstance(value, list):
        return [_cut(v, chars) for v in value[:_LIST_ITEMS]]
    if isinstance(value, dict):
        return {k: _cut(v, chars) for k, v in value.items()}
    return value


def bounded_payload(payload, cuttable: bool, limit: int = MAX_PUBLISH_BYTES) -> tuple[bytes | None, bool]:
    """`payload` as the broker gets it (dicts and lists as JSON), at most `limit` bytes (None:
    not to be sent), and whether it was cut.

    An event (`cuttable`) over it is cut and says `"truncated": true`; anything else over it
    (a discovery config, a retained state) would be wrong once cut: None, not sent."""
    data = _encode(payload)
    if len(data) <= limit:
        return data, False
    if not cuttable or not isinstance(payload, dict):
        return None, False
    for chars in (QUOTE_CHARS, 16):
        data = _encode({**_cut(payload, chars), "truncated": True})
        if len(data) <= limit:
            return data, True
    data = _encode({**{k: _cut(payload[k], 16) for k in _LAST_RESORT if k in payload}, "truncated": True})
    return (data if len(data) <= limit else None), True
