"""What a room and a hayakoe-pi voice server add to Wyoming, and Wyoming's events over a plain socket.

A room's `synthesize` carries `hayakoe` ({"speed": …}); other servers ignore
the field. A hayakoe-pi server answers such a request with `audio-start` at
once, then every piece as soon as it is made, its first `audio-chunk`
describing it (`hayakoe_piece`: its sentence, offset, the sentence's decoder
windows: synthesis/decoding.py's `Piece.described`), so the room schedules
the audio itself, gapless as with its own synthesis.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass

ROOM_REQUEST = "hayakoe"
ROOM_PIECE = "hayakoe_piece"
ROOM_SAMPLES_PER_CHUNK = 8192
MAX_EVENT_BYTES = 4 << 20  # data or payload of one event a room takes from its server
WYOMING_VERSION = "1.5.3"


@dataclass(frozen=True)
class RoomRequest:
    speed: float | None


class ServerGone(ConnectionError):
    """The server cannot be reached, closed the connection, or sent what is not Wyoming."""


class EventSocket:
    """Wyoming events over a blocking TCP socket; every read waits at most its timeout."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._file = sock.makefile("rb")

    @classmethod
    def connect(cls, host: str, port: int, timeout: float) -> "EventSocket":
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise ServerGone(f"cannot connect: {e.strerror or e}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock)

    def write(self, kind: str, data: dict | None = None) -> None:
        body = json.dumps(data or {}, ensure_ascii=False).encode()
        header = json.dumps({"type": kind, "version": WYOMING_VERSION, "data_length": len(body),
                             "payload_length": 0}).encode()
        try:
            self.sock.sendall(header + b"\n" + body)
        except OSError as e:
            raise ServerGone(f"cannot send: {e.strerror or e}") from None

    def read(self, timeout: float) -> tuple[str, dict, bytes]:
        """(type, data, payload) of the next event; ServerGone when none came within `timeout`."""
        self.sock.settimeout(timeout)
        try:
            line = self._file.readline(65536)
            if not line.endswith(b"\n"):
                raise ServerGone("the connection was closed" if not line else "an event header is too long")
            header = json.loads(line)
            data = header.get("data") or {}
            sizes = [header.get("data_length") or 0, header.get("payload_length") or 0]
            if not all(isinstance(n, int) and 0 <= n <= MAX_EVENT_BYTES for n in sizes):
                raise ServerGone("an event's length is out of range")
            if sizes[0]:
                data = {**data, **json.loads(self._read_exactly(sizes[0]))}
            payload = self._read_exactly(sizes[1]) if sizes[1] else b""
        except TimeoutError:
            raise ServerGone(f"nothing from the server for {timeout:g} s") from None
        except (OSError, ValueError, AttributeError) as e:
            raise ServerGone(f"cannot read: {getattr(e, 'strerror', None) or e}") from None
        if not isinstance(header.get("type"), str) or not isinstance(data, dict):
            raise ServerGone("the server sent what is not a Wyoming event")
        return header["type"], data, payload

    def _read_exactly(self, n: int) -> bytes:
        data = self._file.read(n)
        if len(data) < n:
            raise ServerGone("the connection was closed inside an event")
        return data

    def close(self) -> None:
        """Also from another thread, to end a read that waits (the server sees the room go)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
