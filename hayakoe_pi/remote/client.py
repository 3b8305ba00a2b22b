"""A room's side of a voice server: a text sent over Wyoming, its audio back as a synthesis to play.

The pieces arrive as the server makes them, each described (protocol.py), and
fill a `SynthesisAhead` as the room's own engine would: the player starts a
sentence once it can flow to its end at the pace the pieces arrive, so a slow
network or server makes a longer pause, never a hole. From a server that is
not a hayakoe-pi (no descriptions) the audio is played once it is all there.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..synthesis.ahead import SynthesisAhead, decoder_speed
from ..synthesis.decoding import Piece
from .protocol import ROOM_PIECE, ROOM_REQUEST, EventSocket, ServerGone

DEFAULT_PORT = 10200
CONNECT_S = 3.0  # a server on the LAN answers in milliseconds: this long and it is away
# the longest a server may say nothing inside a request (it may wait for a turn behind other clients)
SILENCE_S = 30.0


class ServerRefused(Exception):
    """The server answered the request with an error (an unknown voice, a text it cannot speak)."""

    def __init__(self, text: str, code: str):
        super().__init__(text)
        self.code = code


def parse_address(address: str) -> tuple[str, int]:
    """`host[:port]` (an IPv6 host in brackets); ValueError with what is wrong."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or "]" in port:
        host, port = address.strip(), str(DEFAULT_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"a voice server is host or host:port (port 1-65535), got {address!r}")
    return host, int(port)


def _samples(pcm: bytes | bytearray) -> np.ndarray:
    return np.frombuffer(bytes(pcm), dtype="<i2").astype(np.float32) / 32768.0


class RemoteAhead(SynthesisAhead):
    """A synthesis read from a voice server; cancelling it closes the connection, which ends
    the server's work for this room (speech/shared.py: unless other rooms read it)."""

    def __init__(self, events: EventSocket, sample_rate: int, speed, progress=None):
        self._events = events
        super().__init__(_pieces(events), sample_rate, speed, progress=progress)

    def cancel(self) -> None:
        super().cancel()
        self._events.close()


def _pieces(events: EventSocket):
    description, audio, whole = None, bytearray(), bytearray()
    try:
        while True:
            kind, data, payload = events.read(SILENCE_S)
            if kind == "error":
                raise ServerRefused(str(data.get("text") or "error"), str(data.get("code") or "error"))
            if kind == "audio-stop":
                if whole:  # a server that does not describe its pieces: the whole text as one
                    audio_all = _samples(whole)
                    yield Piece(audio_all, 0, sentence_samples=audio_all.size, windows=((0, audio_all.size, 0),))
                return
            if kind != "audio-chunk":
                continue
            if ROOM_PIECE in data:
                description, audio = data[ROOM_PIECE], bytearray()
            if description is None:
                whole.extend(payload)
                continue
            audio.extend(payload)
            if len(audio) // 2 >= int(description.get("samples", 0)):
                yield Piece.from_description(description, _samples(audio))
                description = None
    finally:
        events.close()


class VoiceServer:
    """A Wyoming TTS server the room speaks with (`engine.server`)."""

    def __init__(self, address: str):
        self.address = address
        self.host, self.port = parse_address(address)

    def utterance(self, text: str, voice: str | None = None, style: str | None = None,
                  speed: float | None = None, progress: Callable[[], None] | None = None) -> SynthesisAhead:
        """`text` asked for; returns once the server has said its sample rate. ServerGone when it
        cannot be reached or goes away, ServerRefused when it answers with an error."""
        events = EventSocket.connect(self.host, self.port, CONNECT_S)
        try:
            request = {"text": text, ROOM_REQUEST: {"speed": speed}}
            if voice is not None:
                request["voice"] = {"name": voice, **({"speaker": style} if style is not None else {})}
            events.write("synthesize", request)
            kind, data, _ = events.read(SILENCE_S)
            if kind == "error":
                raise ServerRefused(str(data.get("text") or "error"), str(data.get("code") or "error"))
            if kind != "audio-start" or not isinstance(data.get("rate"), int) or data.get("width") != 2 \
                    or data.get("channels") != 1:
                raise ServerGone(f"the server answered {kind!r}, not 16-bit mono audio")
        except BaseException:
            events.close()
            raise
        # arrival measured per server and voice, as the room's own decoder speed is per voice
        return RemoteAhead(events, data["rate"], decoder_speed(f"{self.address}/{voice}"), progress)
