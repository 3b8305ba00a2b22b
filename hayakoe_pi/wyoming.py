"""The Wyoming protocol: Home Assistant Assist uses the appliance as a local TTS engine.

A TCP server (config `wyoming`) in its own thread with its own asyncio loop,
beside the MQTT side and sharing its engine, voices, settings and phrase
cache. Nothing received here is played on the Pi: the audio goes back to the
client as 16-bit mono PCM.

    describe                      -> info (voices, their styles as speakers)
    synthesize                    -> audio-start, audio-chunk..., audio-stop
    synthesize-start, synthesize-chunk..., synthesize-stop
                                  -> audio-start, audio-chunk..., audio-stop, synthesize-stopped
    ping                          -> pong
    anything else                 -> error (the connection stays open)

Synthesis runs ahead of sending in a thread of its own (ahead.py). Home
Assistant plays streamed audio as it arrives, so each sentence goes out once
it can flow to its end at real-time pace; inside a sentence each piece is
sent at once. The engine lets the steps of several callers (this server, the
speaker thread) take turns under its lock, so a Wyoming request and local
playback share the cores window by window and never mix their audio.

A bad request (unknown voice or speaker, empty or too long text, text with
nothing to say) is answered with an `error` event and the connection is
closed, as Home Assistant waits for audio until then; a malformed event the
same. A client that goes away mid-stream stops its synthesis at the next
engine step. Every failure is logged in one line, and the server goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice, TtsVoiceSpeaker
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler, AsyncTcpServer
from wyoming.tts import (Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop,
                         SynthesizeStopped, SynthesizeVoice)

from . import __version__
from .ahead import synthesize_ahead
from .cache import cache_key, voice_fingerprint
from .config import voice_styles
from .engine import TextError
from .models import ModelError

try:  # the pause the engine puts between sentences; also between streamed pieces here
    from .engine import DEFAULT_PAUSE, PAUSE_AFTER
except ImportError:  # pragma: no cover
    PAUSE_AFTER, DEFAULT_PAUSE = {"。": 0.35, "！": 0.3, "？": 0.4, "\n": 0.5}, 0.3

log = logging.getLogger("hayakoe_pi.wyoming")

SERVICE_TYPE = "_wyoming._tcp.local."
PROGRAM = "hayakoe-pi"
LANGUAGES = ["ja"]
SAMPLES_PER_CHUNK = 1024  # per audio-chunk event (23 ms at 44.1 kHz)
MAX_EVENT_BYTES = 1 << 20  # data or payload of one incoming event
SYNTH_THREADS = 4  # syntheses running at once (they take turns in the engine anyway)
BIND_RETRY_SECONDS = 5.0
ZEROCONF_RETRY_SECONDS = 30.0
DRAIN_BEFORE_CLOSE_SECONDS = 2.0
IDLE_SECONDS = 120.0  # a client that sends nothing for this long is disconnected
MAX_CLIENTS = 16  # connections at once; more are refused with an error
WAIT_SECONDS = 0.02  # how often a waiting sentence is looked at again
# A streamed text is synthesized up to its last sentence end as soon as that arrives.
_SENTENCE_END_RE = re.compile(r"[。！？!?\n]")
_PROGRAM_ATTRIBUTION = ("hayakoe-pi", "")
_VOICE_ATTRIBUTION = ("HayaKoe / Style-Bert-VITS2 JP-Extra", "https://huggingface.co/lemondouble/hayakoe")


class RequestError(Exception):
    """A request that cannot be served: answered with an error event, then the connection closes."""

    def __init__(self, text: str, code: str):
        super().__init__(text)
        self.code = code


class ProtocolError(RequestError):
    """Bytes that are not a Wyoming event: the stream cannot be followed any further."""

    def __init__(self, text: str):
        super().__init__(text, "bad-event")


@dataclass
class VoiceChoice:
    name: str
    style: str
    sample_rate: int
    fingerprint: list


# --- pure helpers ----------------------------------------------------------------------

def to_pcm16(audio: np.ndarray) -> bytes:
    """Float32 samples (-1..1) as little-endian 16-bit PCM."""
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


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


def ready_text(buffer: str) -> tuple[str, str]:
    """(text up to and including the last sentence end, the rest)."""
    last = None
    for last in _SENTENCE_END_RE.finditer(buffer):
        pass
    if last is None:
        return "", buffer
    return buffer[:last.end()], buffer[last.end():]


def check_text(text, limit: int) -> str:
    """The text to speak, stripped; RequestError when it cannot be."""
    if not isinstance(text, str):
        raise RequestError("'text' must be a string", "bad-text")
    if len(text) > limit:
        raise RequestError(f"text too long ({len(text)} characters, limit {limit})", "text-too-long")
    if any(ord(c) < 32 and c not in "\t\n\r" for c in text):
        raise RequestError("text contains control characters", "bad-text")
    text = text.strip()
    if not text:
        raise RequestError("empty text: nothing to speak", "empty-text")
    return text


def instance_name(hostname: str | None = None) -> str:
    """The zeroconf instance name: one DNS label."""
    host = (hostname or socket.gethostname()).split(".")[0] or "localhost"
    return f"{PROGRAM}-{host}"[:63]


def local_address(host: str) -> str:
    """The IPv4 address to announce for a server bound to `host`; OSError while there is none."""
    if host not in ("", "0.0.0.0", "::"):
        return socket.gethostbyname(host)
    # the interface that multicast leaves by (connecting a UDP socket sends nothing)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("224.0.0.251", 5353))
        address = s.getsockname()[0]
    if address.startswith("127.") or address == "0.0.0.0":
        raise OSError(f"no network address yet (got {address})")
    return address


def service_info(name: str, port: int, address: str):
    """The zeroconf record announcing `name` as a Wyoming service (not registered)."""
    from zeroconf.asyncio import AsyncServiceInfo

    return AsyncServiceInfo(
        SERVICE_TYPE, f"{name}.{SERVICE_TYPE}", port=port,
        addresses=[socket.inet_aton(address)],
        properties={"program": PROGRAM, "version": __version__, "languages": ",".join(LANGUAGES)},
    )


# --- the server --------------------------------------------------------------------------

class WyomingServer:
    """The Wyoming TCP server of a Daemon, in its own thread and asyncio loop."""

    def __init__(self, daemon):
        self.daemon = daemon
        self.config = daemon.config["wyoming"]
        self.pool = ThreadPoolExecutor(max_workers=SYNTH_THREADS, thread_name_prefix="wyoming-synth")
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listening = threading.Event()
        self._stop: asyncio.Event | None = None
        self._stop_requested = threading.Event()
        self.clients = 0
        self._thread = threading.Thread(target=self._run, name="wyoming", daemon=True)

    # lifecycle (called from the daemon's threads)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop_requested.set()
        loop, stop = self.loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # loop already closed
                pass
        self._thread.join(timeout)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def alive(self) -> bool:
        return self._thread.is_alive() or self._stop_requested.is_set()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("wyoming: server thread failed")

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stop_requested.is_set():
            return
        host, port = self.config["host"], self.config["port"]
        server = AsyncTcpServer(host, port)
        while True:
            try:
                await server.start(lambda r, w: Handler(r, w, self))
                break
            except OSError as e:
                log.error("wyoming: cannot listen on %s:%d (%s); retrying in %g s",
                          host, port, e.strerror or e, BIND_RETRY_SECONDS)
                try:
                    await asyncio.wait_for(self._stop.wait(), BIND_RETRY_SECONDS)
                    return
                except asyncio.TimeoutError:
                    continue
        self.listening.set()
        log.info("wyoming: serving on %s:%d", host, port)
        announce = asyncio.create_task(self._announce()) if self.config["zeroconf"] else None
        try:
            await self._stop.wait()
        finally:
            log.info("wyoming: stopping")
            if announce is not None:
                announce.cancel()
                try:
                    await announce
                except (asyncio.CancelledError, Exception):
                    pass
            try:
                await server.stop()
            except Exception as e:
                log.warning("wyoming: error while stopping: %s", e)

    async def _announce(self) -> None:
        """Register the zeroconf service (retrying while the network is not up); unregister on cancel."""
        try:
            from zeroconf import InterfaceChoice, IPVersion
            from zeroconf.asyncio import AsyncZeroconf
        except ImportError:
            log.error("wyoming: zeroconf is not installed; add the integration by host and port")
            return
        name = instance_name()
        while True:
            aiozc = None
            try:
                info = service_info(name, self.config["port"], local_address(self.config["host"]))
                # Default interface, IPv4: no interface enumeration (no netlink socket needed)
                aiozc = AsyncZeroconf(interfaces=InterfaceChoice.Default, ip_version=IPVersion.V4Only)
                registered = await aiozc.async_register_service(info, allow_name_change=True)
                await registered  # probing and the first announcements done
                log.info("wyoming: announced as %s (%s) over zeroconf", info.name, info.parsed_addresses()[0])
                break
            except asyncio.CancelledError:
                if aiozc is not None:
                    await aiozc.async_close()
                raise
            except Exception as e:
                log.warning("wyoming: zeroconf announcement failed (%s: %s); retrying in %g s",
                            type(e).__name__, e, ZEROCONF_RETRY_SECONDS)
                if aiozc is not None:
                    try:
                        await aiozc.async_close()
                    except Exception:
                        pass
                await asyncio.sleep(ZEROCONF_RETRY_SECONDS)
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            try:
                await asyncio.wait_for(aiozc.async_unregister_all_services(), 1.0)
                await asyncio.wait_for(aiozc.async_close(), 1.0)
            except Exception as e:
                log.debug("wyoming: zeroconf close: %s", e)

    # what the handlers need (blocking parts run in the pool)

    def info(self) -> Info:
        store = self.daemon.store
        voices = []
        for name in store.voices():
            styles = voice_styles(store.dir, name)
            if not styles:
                log.warning("wyoming: voice %s has no readable styles; not listed", name)
                continue
            voices.append(TtsVoice(
                name=name, description=name, attribution=Attribution(*_VOICE_ATTRIBUTION),
                installed=True, version=None, languages=list(LANGUAGES),
                speakers=[TtsVoiceSpeaker(name=s) for s in styles],
            ))
        program = TtsProgram(
            name=PROGRAM, description="HayaKoe Pi: offline Japanese text to speech (Style-Bert-VITS2 JP-Extra)",
            attribution=Attribution(*_PROGRAM_ATTRIBUTION), installed=True, version=__version__,
            voices=voices, supports_synthesize_streaming=True,
        )
        return Info(tts=[program])

    def choose_voice(self, requested: SynthesizeVoice | None) -> VoiceChoice:
        """The voice and style a request names, else the daemon's current ones."""
        store, settings = self.daemon.store, self.daemon.settings
        installed = store.voices()
        name = settings.voice
        if requested is not None and requested.name is not None:
            name = requested.name
            if not isinstance(name, str) or name not in installed:
                raise RequestError(f"unknown voice {json.dumps(name, ensure_ascii=False)[:60]}; "
                                   f"installed: {', '.join(installed)}", "unknown-voice")
        elif requested is not None and requested.language is not None and \
                str(requested.language).split("-")[0].split("_")[0].lower() not in LANGUAGES:
            raise RequestError(f"language {str(requested.language)[:20]!r} not supported; only ja",
                               "unknown-language")
        speaker = requested.speaker if requested is not None else None
        if speaker is not None:
            styles = voice_styles(store.dir, name)
            if not isinstance(speaker, str) or speaker not in styles:
                raise RequestError(f"unknown speaker (style) {json.dumps(speaker, ensure_ascii=False)[:60]} "
                                   f"of {name}; speakers: {', '.join(styles)}", "unknown-speaker")
        try:
            voice = store.voice(name)
        except (ModelError, ValueError) as e:
            raise RequestError(f"voice {name} cannot be used: {e}", "voice-error") from None
        style = speaker or (settings.style if settings.style in voice.styles else next(iter(voice.styles)))
        return VoiceChoice(name, style, voice.sample_rate, voice_fingerprint(store, voice))

    def settings(self) -> tuple[float, float]:
        voice = self.daemon.config["voice"]
        return voice["speed"], voice["style_weight"]


class Handler(AsyncEventHandler):
    """One client connection."""

    def __init__(self, reader, writer, server: WyomingServer):
        super().__init__(reader, writer)
        self.server = server
        self.daemon = server.daemon
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.limit = self.daemon.config["queue"]["max_text_chars"]
        self.speed, self.weight = server.settings()
        # the audio stream of the current request
        self.audio_started = False
        self.samples_sent = 0
        self.rate = 0
        # a streamed request
        self.streaming = False
        self.stream_voice: VoiceChoice | None = None
        self.stream_text = ""  # received, not yet handed to synthesis
        self.stream_chars = 0
        self.stream_pieces: asyncio.Queue | None = None
        self.stream_task: asyncio.Task | None = None
        self.last_piece_end = ""  # punctuation that ended the last synthesized piece
        self.stream_text_seen = False  # a piece with text was handed to synthesis

    # connection ----------------------------------------------------------------------

    async def run(self) -> None:
        log.debug("wyoming: %s connected", self.peer)
        if self.server.clients >= MAX_CLIENTS:
            log.warning("wyoming: %s refused: %d clients connected already", self.peer, self.server.clients)
            await self._close_with_error(f"busy: {MAX_CLIENTS} clients connected; try again later", "busy")
            self.writer.close()
            return
        self.server.clients += 1
        try:
            while True:
                try:
                    try:
                        event = await asyncio.wait_for(read_event(self.reader), IDLE_SECONDS)
                    except asyncio.TimeoutError:
                        log.info("wyoming: %s idle for %g s: disconnected", self.peer, IDLE_SECONDS)
                        break
                    if event is None:
                        break
                    if not await self.handle_event(event):
                        break
                except RequestError as e:
                    log.warning("wyoming: %s: %s", self.peer, e)
                    self._abandon_stream()
                    await self._close_with_error(str(e), e.code)
                    return
        except (ConnectionError, OSError) as e:
            log.warning("wyoming: %s went away: %s", self.peer, e.strerror or type(e).__name__)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug must not end the server
            log.exception("wyoming: internal error with %s", self.peer)
            self._abandon_stream()
            await self._close_with_error(f"internal error: {type(e).__name__}: {e}", "internal-error")
        finally:
            self.server.clients -= 1
            self._abandon_stream()
            self.writer.close()
            log.debug("wyoming: %s disconnected", self.peer)

    def _abandon_stream(self) -> None:
        """Stop the synthesis of a streamed request that will not be finished."""
        task, self.stream_task = self.stream_task, None
        if task is None:
            return
        if not task.done():
            task.cancel()
            log.info("wyoming: %s: streamed request abandoned", self.peer)
        elif not task.cancelled() and task.exception() is not None:  # the cause was logged already
            log.debug("wyoming: %s: streamed synthesis ended with %r", self.peer, task.exception())

    async def write_event(self, event: Event) -> None:
        await async_write_event(event, self.writer)

    async def _close_with_error(self, text: str, code: str) -> None:
        """Send an error, say nothing more is coming, and let the client read it before closing."""
        try:
            await self.write_event(Error(text=text, code=code).event())
            if self.writer.can_write_eof():
                self.writer.write_eof()
            # read what the client still sends, so closing does not reset the connection
            # (which could discard the error before the client reads it)
            deadline = time.monotonic() + DRAIN_BEFORE_CLOSE_SECONDS
            while (left := deadline - time.monotonic()) > 0:
                if not await asyncio.wait_for(self.reader.read(65536), left):
                    break
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass

    # events --------------------------------------------------------------------------

    async def handle_event(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            info = await asyncio.get_running_loop().run_in_executor(self.server.pool, self.server.info)
            await self.write_event(info.event())
            return True
        if Ping.is_type(event.type):
            await self.write_event(Pong(text=event.data.get("text")).event())
            return True
        if Synthesize.is_type(event.type):
            if self.streaming:
                # Home Assistant repeats the whole streamed text for older servers: already spoken
                log.debug("wyoming: %s: synthesize inside a streamed request ignored", self.peer)
                return True
            await self._synthesize(event)
            return True
        if SynthesizeStart.is_type(event.type):
            await self._stream_start(event)
            return True
        if SynthesizeChunk.is_type(event.type):
            self._stream_chunk(event)
            return True
        if SynthesizeStop.is_type(event.type):
            await self._stream_stop()
            return True
        log.warning("wyoming: %s: unknown event type %r", self.peer, event.type[:60])
        await self.write_event(Error(text=f"unknown event type {event.type[:60]!r}",
                                     code="unknown-event").event())
        return True

    def _voice(self, data: dict) -> SynthesizeVoice | None:
        voice = data.get("voice")
        if voice is None:
            return None
        if not isinstance(voice, dict):
            raise RequestError("'voice' must be an object", "bad-voice")
        return SynthesizeVoice.from_dict(voice)

    async def _choose_voice(self, data: dict) -> VoiceChoice:
        requested = self._voice(data)
        return await asyncio.get_running_loop().run_in_executor(self.server.pool, self.server.choose_voice,
                                                                requested)

    async def _synthesize(self, event: Event) -> None:
        text = check_text(event.data.get("text"), self.limit)
        voice = await self._choose_voice(event.data)
        started = time.monotonic()
        self._begin_audio(voice)
        source = await self._speak(text, voice, errors=True)
        await self._end_audio()
        log.info("wyoming: %s: spoke %d characters with %s/%s%s in %.2f s", self.peer, len(text),
                 voice.name, voice.style, " (cached)" if source == "cached" else "",
                 time.monotonic() - started)

    async def _stream_start(self, event: Event) -> None:
        if self.streaming:
            raise RequestError("synthesize-start: a streamed request is already open", "bad-sequence")
        voice = await self._choose_voice(event.data)
        self.streaming, self.stream_voice = True, voice
        self.stream_text, self.stream_chars, self.last_piece_end = "", 0, ""
        self.stream_text_seen = False
        self._begin_audio(voice)
        self.stream_pieces = asyncio.Queue()
        self.stream_task = asyncio.create_task(self._stream_speak(voice))
        log.debug("wyoming: %s: streamed request with %s/%s", self.peer, voice.name, voice.style)

    def _stream_chunk(self, event: Event) -> None:
        if not self.streaming:
            raise RequestError("synthesize-chunk without synthesize-start", "bad-sequence")
        text = event.data.get("text")
        if not isinstance(text, str):
            raise RequestError("'text' must be a string", "bad-text")
        self.stream_chars += len(text)
        if self.stream_chars > self.limit:
            raise RequestError(f"text too long ({self.stream_chars} characters so far, limit {self.limit})",
                               "text-too-long")
        if any(ord(c) < 32 and c not in "\t\n\r" for c in text):
            raise RequestError("text contains control characters", "bad-text")
        if self.stream_task is None or self.stream_task.done():  # failed: the error comes out at the stop
            return
        ready, self.stream_text = ready_text(self.stream_text + text)
        if ready.strip():
            self.stream_pieces.put_nowait(ready)
        elif ready:
            self.stream_text = ready + self.stream_text

    async def _stream_stop(self) -> None:
        if not self.streaming:
            raise RequestError("synthesize-stop without synthesize-start", "bad-sequence")
        if self.stream_text.strip():
            self.stream_pieces.put_nowait(self.stream_text)
        self.stream_pieces.put_nowait(None)
        spoken = await self.stream_task
        self.streaming, self.stream_task, self.stream_pieces = False, None, None
        if not spoken:
            if self.stream_text_seen:
                raise RequestError("cannot speak this text: nothing readable in it", "bad-text")
            raise RequestError("empty text: nothing to speak", "empty-text")
        await self._end_audio()
        await self.write_event(SynthesizeStopped().event())
        log.info("wyoming: %s: spoke a streamed text of %d characters with %s/%s", self.peer,
                 self.stream_chars, self.stream_voice.name, self.stream_voice.style)

    async def _stream_speak(self, voice: VoiceChoice) -> int:
        """Speak the pieces as they come; returns how many were spoken."""
        spoken = 0
        while (piece := await self.stream_pieces.get()) is not None:
            piece = piece.strip()
            if not piece:
                continue
            self.stream_text_seen = True
            # the pause after the previous piece, sent once this one has something to say
            pause = PAUSE_AFTER.get(self.last_piece_end, DEFAULT_PAUSE) / self.speed if spoken else 0.0
            if await self._speak(piece, voice, errors=False,
                                 lead=np.zeros(int(pause * voice.sample_rate), dtype=np.float32)):
                spoken += 1
                self.last_piece_end = piece[-1]
        return spoken

    # audio ---------------------------------------------------------------------------

    def _begin_audio(self, voice: VoiceChoice) -> None:
        self.audio_started, self.samples_sent, self.rate = False, 0, voice.sample_rate
        self.play_end = 0.0  # when the client will have played what was sent, if it plays on arrival

    async def _send_audio(self, audio: np.ndarray) -> None:
        if not self.audio_started:
            # sent with the first audio, so a request refused by the engine gets only its error
            await self.write_event(AudioStart(rate=self.rate, width=2, channels=1, timestamp=0).event())
            self.audio_started = True
        self.play_end = max(self.play_end, time.monotonic()) + audio.size / self.rate
        pcm = to_pcm16(audio)
        step = SAMPLES_PER_CHUNK * 2
        for i in range(0, len(pcm), step):
            timestamp = self.samples_sent * 1000 // self.rate
            self.samples_sent += len(pcm[i:i + step]) // 2
            await self.write_event(AudioChunk(rate=self.rate, width=2, channels=1, audio=pcm[i:i + step],
                                              timestamp=timestamp).event())

    async def _end_audio(self) -> None:
        if not self.audio_started:
            await self.write_event(AudioStart(rate=self.rate, width=2, channels=1, timestamp=0).event())
            self.audio_started = True
        await self.write_event(AudioStop(timestamp=self.samples_sent * 1000 // self.rate).event())

    async def _speak(self, text: str, voice: VoiceChoice, errors: bool,
                     lead: np.ndarray | None = None) -> str | None:
        """Send `text` spoken, from the phrase cache or as the engine yields it.

        Returns "cached" or "synthesized", or None when the engine refused the
        text and `errors` is false (a streamed piece with nothing to say: logged
        and skipped); with `errors` true that raises RequestError. `lead`
        (silence) goes out just before the first audio.
        """
        loop = asyncio.get_running_loop()
        cache = self.daemon.cache
        key = cache_key(text, voice.name, voice.style, self.weight, self.speed, voice.fingerprint)
        cached = await loop.run_in_executor(self.server.pool, cache.get, key, voice.sample_rate)
        if cached is not None:
            if lead is not None and lead.size:
                await self._send_audio(lead)
            await self._send_audio(cached)
            return "cached"
        ahead = synthesize_ahead(self.daemon.engine, text, voice=voice.name, style=voice.style,
                                 style_weight=self.weight, speed=self.speed)
        index = samples = 0
        try:
            while True:
                piece = ahead.get(index)
                if piece is None and ahead.at_end(index):
                    break
                # Home Assistant plays the audio as it arrives, with no buffer of its own:
                # a sentence goes out once it can flow to its end at the client's pace
                if piece is None or (piece.starts_sentence and
                                     not ahead.can_flow(index, max(self.play_end, time.monotonic()))):
                    await asyncio.sleep(WAIT_SECONDS)
                    continue
                if index == 0 and lead is not None and lead.size:
                    await self._send_audio(lead)
                await self._send_audio(piece.audio)
                index, samples = index + 1, samples + piece.audio.size
                ahead.played(samples)
        except (TextError, ValueError) as e:
            if errors:
                raise RequestError(f"cannot speak this text: {e}", "bad-text") from None
            log.info("wyoming: %s: skipped %r: %s", self.peer, text[:40], e)
            return None
        finally:
            ahead.cancel()  # also when the client went away: stop after the step in progress
        if ahead.complete:
            await loop.run_in_executor(self.server.pool, cache.put, key, voice.sample_rate, ahead.audio())
        return "synthesized"
