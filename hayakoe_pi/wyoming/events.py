"""Reading Wyoming events with limits on what a client may make us buffer."""

from __future__ import annotations

import asyncio
import json

from wyoming.event import Event

MAX_EVENT_BYTES = 1 << 20  # data or payload of one incoming event


class RequestError(Exception):
    """A Wyoming request that cannot be served: answered with an error event, then the connection closes."""

    def __init__(self, text: str, code: str):
        super().__init__(text)
        self.code = code


class ProtocolError(RequestError):
    """Bytes that are not a Wyoming event: the stream cannot be followed any further."""

    def __init__(self, text: str):
        super().__init__(text, "bad-event")


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """The next event, None at the end of the stream, ProtocolError for malformed input.

    Like wyoming.event.async_read_event, but with limits on what a client may
    make us buffer, and malformed input reported instead of ending the
    connection silently.
    """
    try:
        line = await reader.readline()
    except ValueError:  # longer than the stream's limit (64 KiB)
        raise ProtocolError("event header too long") from None
    if not line.endswith(b"\n"):
        return None  # end of stream, possibly in the middle of a header
    try:
        header = json.loads(line)
    except ValueError:
        raise ProtocolError("event header is not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str) or not header["type"]:
        raise ProtocolError("event header must be a JSON object with a 'type' string")
    data = header.get("data")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProtocolError("event 'data' must be a JSON object")
    lengths = {}
    for field in ("data_length", "payload_length"):
        n = header.get(field)
        if n is None:
            n = 0
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_EVENT_BYTES:
            raise ProtocolError(f"event {field} must be an integer from 0 to {MAX_EVENT_BYTES}")
        lengths[field] = n
    try:
        if lengths["data_length"]:
            try:
                extra = json.loads(await reader.readexactly(lengths["data_length"]))
            except ValueError:
                raise ProtocolError("event data is not JSON") from None
            if not isinstance(extra, dict):
                raise ProtocolError("event data must be a JSON object")
            data.update(extra)
        payload = await reader.readexactly(lengths["payload_length"]) if lengths["payload_length"] else None
    except asyncio.IncompleteReadError:
        return None
    return Event(type=header["type"], data=data, payload=payload)
