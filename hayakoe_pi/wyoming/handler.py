"""One Wyoming client connection: its requests, answered with audio from the speech service.

Synthesis runs ahead of sending in a thread of its own (ahead.py). Home
Assistant plays streamed audio as it arrives, so each sentence goes out once
it can flow to its end at real-time pace; inside a sentence each piece is
sent at once.

A bad request (unknown voice or speaker, empty or too long text, text with
nothing to say) is answered with an `error` event and the connection is
closed, as Home Assistant waits for audio until then; a malformed event the
same. A client that goes away mid-stream stops its synthesis at the next
engine step. Every failure is logged in one line, and the server goes on.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from ..remote.protocol import ROOM_PIECE, ROOM_REQUEST, ROOM_SAMPLES_PER_CHUNK, RoomRequest
from ..sound.player import to_pcm16
from ..synthesis.sentences import SENTENCE_ENDS, split_sentences
from ..speech.service import Choice, SpeechError, SpeechService, check_number
from ..synthesis.engine import SPEED_RANGE, TextError
from .announce import LANGUAGES
from .connection import Connection
from .events import RequestError
from .limits import MAX_UNKNOWN_EVENTS, Connections, FreeTurn, ReadPace

log = logging.getLogger("hayakoe_pi.wyoming")

SAMPLES_PER_CHUNK = 1024  # per audio-chunk event (23 ms at 44.1 kHz)
WAIT_SECONDS = 0.02  # how often a waiting sentence is looked at again
_SENTENCE_END_RE = re.compile(f"[{SENTENCE_ENDS}]")


def ready_text(buffer: str) -> tuple[str, str]:
    """(text up to and including the last sentence end, the rest): a streamed text is
    synthesized up to its last sentence end as soon as that arrives."""
    last = None
    for last in _SENTENCE_END_RE.finditer(buffer):
        pass
    if last is None:
        return "", buffer
    return buffer[:last.end()], buffer[last.end():]


@dataclass
class AudioOut:
    """The audio stream of the request being answered."""

    rate: int
    pace: ReadPace
    started: bool = False
    samples_sent: int = 0
    play_end: float = 0.0  # when the client will have played what was sent, if it plays on arrival


@dataclass
class StreamedRequest:
    """synthesize-start … synthesize-stop: text arriving in chunks, spoken sentence by sentence."""

    choice: Choice
    pieces: asyncio.Queue = field(default_factory=asyncio.Queue)  # text ready to speak; None ends it
    task: asyncio.Task | None = None
    pending: str = ""  # received, not yet handed to synthesis
    chars: int = 0
    had_text: bool = False  # a piece with text was handed to synthesis


class Handler(Connection):
    """One client connection: its requests and their audio."""

    # the events that ask for work: only they keep a connection (pings and unknown events do not)
    request_types = frozenset({"describe", "synthesize", "synthesize-start", "synthesize-chunk", "synthesize-stop"})

    def __init__(self, reader, writer, speech: SpeechService, pool: Executor, connections: Connections,
                 describe):
        super().__init__(reader, writer, connections)
        self.speech, self.pool, self.describe = speech, pool, describe
        self.out: AudioOut | None = None
        self.stream: StreamedRequest | None = None
        self.unknown_events = 0

    async def _blocking(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, function, *args)

    # connection ----------------------------------------------------------------------

    def _abandon_stream(self) -> None:
        """Stop the synthesis of a streamed request that will not be finished."""
        stream, self.stream = self.stream, None
        task = stream.task if stream is not None else None
        if task is None:
            return
        if not task.done():
            task.cancel()
            log.info("wyoming: %s: streamed request abandoned", self.peer)
        elif not task.cancelled() and task.exception() is not None:  # the cause was logged already
            log.debug("wyoming: %s: streamed synthesis ended with %r", self.peer, task.exception())

    def _waited(self, seconds: float) -> None:
        if self.out is not None:
            self.out.pace.waited_for(seconds, self.out.samples_sent)

    def answering(self) -> bool:
        return super().answering() or self.stream is not None

    # events --------------------------------------------------------------------------

    async def handle_event(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event((await self._blocking(self.describe)).event())
        elif Ping.is_type(event.type):
            await self.write_event(Pong(text=event.data.get("text")).event())
        elif Synthesize.is_type(event.type):
            if self.stream is not None:
                # Home Assistant repeats the whole streamed text for older servers: already spoken
                log.debug("wyoming: %s: synthesize inside a streamed request ignored", self.peer)
            else:
                await self._synthesize(event)
        elif SynthesizeStart.is_type(event.type):
            await self._stream_start(event)
        elif SynthesizeChunk.is_type(event.type):
            self._stream_chunk(event)
        elif SynthesizeStop.is_type(event.type):
            await self._stream_stop()
        else:
            self.unknown_events += 1
            if self.unknown_events > MAX_UNKNOWN_EVENTS:
                raise RequestError(f"{MAX_UNKNOWN_EVENTS} unknown events already; closing", "too-many-unknown")
            if self.unknown_events == 1:  # one line a connection: they cost the log nothing more
                log.warning("wyoming: %s: unknown event type %r", self.peer, event.type[:60])
            await self.write_event(Error(text=f"unknown event type {event.type[:60]!r}",
                                         code="unknown-event").event())
        return True

    def _choose_now(self, data: dict) -> Choice:
        """The voice and speaker (style) a request names, else the current ones (blocking: may load a voice)."""
        voice = data.get("voice")
        name = speaker = None
        if voice is not None:
            if not isinstance(voice, dict):
                raise RequestError("'voice' must be an object", "bad-voice")
            # as wyoming's SynthesizeVoice reads it: a speaker only with a name, else a language
            name, speaker = voice.get("name"), voice.get("speaker") if "name" in voice else None
            language = voice.get("language") if "name" not in voice else None
            if name is not None:
                name = self.speech.check_voice(name)
            elif language is not None and str(language).split("-")[0].split("_")[0].lower() not in LANGUAGES:
                raise RequestError(f"language {str(language)[:20]!r} not supported; only ja", "unknown-language")
            if speaker is not None:
                self.speech.check_style(speaker, name or self.speech.current_voice(), what="speaker")
        return self.speech.choose(name, speaker)

    async def _choose(self, data: dict) -> Choice:
        return await self._checked(self._blocking(self._choose_now, data))

    @staticmethod
    async def _checked(awaitable):
        """The speech service's refusals as this protocol's (answered, then the connection closes)."""
        try:
            return await awaitable
        except SpeechError as e:
            raise RequestError(str(e), e.code) from None

    @staticmethod
    def _checked_now(check, *args):
        try:
            return check(*args)
        except SpeechError as e:
            raise RequestError(str(e), e.code) from None

    async def _synthesize(self, event: Event) -> None:
        text = self._checked_now(self.speech.check_text, event.data.get("text"))
        room = self._room_request(event.data.get(ROOM_REQUEST))
        choice = await self._choose(event.data)
        started = time.monotonic()
        self.out = self._audio_out(choice)
        if room is not None:  # the rate at once: the room opens its card before the first audio
            await self._start_audio()
        cached, _ = await self._speak(text, choice, errors=True, room=room)
        await self._end_audio()
        log.info("wyoming: %s: spoke %d characters with %s/%s%s%s in %.2f s", self.peer, len(text),
                 choice.voice, choice.style, " for a room" if room is not None else "",
                 " (cached)" if cached else "", time.monotonic() - started)

    @staticmethod
    def _room_request(data) -> RoomRequest | None:
        """What a room of this project adds to a synthesize (its speed), checked."""
        if data is None:
            return None
        if not isinstance(data, dict):
            raise RequestError(f"{ROOM_REQUEST!r} must be an object", "bad-request")
        speed = data.get("speed")
        try:
            speed = None if speed is None else check_number(speed, "speed", *SPEED_RANGE)
        except ValueError as e:
            raise RequestError(str(e), "bad-speed") from None
        return RoomRequest(speed)

    async def _stream_start(self, event: Event) -> None:
        if self.stream is not None:
            raise RequestError("synthesize-start: a streamed request is already open", "bad-sequence")
        choice = await self._choose(event.data)
        self.out = self._audio_out(choice)
        self.stream = StreamedRequest(choice)
        self.stream.task = asyncio.create_task(self._stream_speak(self.stream))
        log.debug("wyoming: %s: streamed request with %s/%s", self.peer, choice.voice, choice.style)

    def _stream_chunk(self, event: Event) -> None:
        stream = self.stream
        if stream is None:
            raise RequestError("synthesize-chunk without synthesize-start", "bad-sequence")
        text = event.data.get("text")
        self._checked_now(self.speech.check_part, text, stream.chars)
        stream.chars += len(text)
        if stream.task.done():  # failed: the error comes out at the stop
            return
        ready, stream.pending = ready_text(stream.pending + text)
        # a reading (明日《アス》) never spans a sentence end: whole in what is ready
        self._checked_now(self.speech.check_readings, ready)
        if ready.strip():
            stream.pieces.put_nowait(ready)
        elif ready:
            stream.pending = ready + stream.pending

    async def _stream_stop(self) -> None:
        stream = self.stream
        if stream is None:
            raise RequestError("synthesize-stop without synthesize-start", "bad-sequence")
        if stream.pending.strip():
            stream.pieces.put_nowait(stream.pending)
        stream.pieces.put_nowait(None)
        spoken = await stream.task
        self.stream = None
        if not spoken:
            if stream.had_text:
                raise RequestError("cannot speak this text: nothing readable in it", "bad-text")
            raise RequestError("empty text: nothing to speak", "empty-text")
        await self._end_audio()
        await self.write_event(SynthesizeStopped().event())
        log.info("wyoming: %s: spoke a streamed text of %d characters with %s/%s", self.peer,
                 stream.chars, stream.choice.voice, stream.choice.style)

    async def _stream_speak(self, stream: StreamedRequest) -> int:
        """Speak the pieces as they come; returns how many were spoken."""
        spoken = 0
        pause = None  # after the last piece spoken, sent once the next has something to say
        while (piece := await stream.pieces.get()) is not None:
            piece = piece.strip()
            if not piece:
                continue
            stream.had_text = True
            result = await self._speak(piece, stream.choice, errors=False, lead=pause)
            if result is not None:
                spoken += 1
                pause = self.speech.pause_after(split_sentences(piece)[-1], result[1], stream.choice.sample_rate)
        return spoken

    # audio ---------------------------------------------------------------------------

    def _audio_out(self, choice: Choice) -> AudioOut:
        return AudioOut(choice.sample_rate, ReadPace(choice.sample_rate, self.connections.write_timeout))

    async def _start_audio(self) -> None:
        out = self.out
        if not out.started:
            await self.write_event(AudioStart(rate=out.rate, width=2, channels=1, timestamp=0).event())
            out.started = True

    async def _send_piece(self, piece) -> None:
        """A piece for a room: its description on its first chunk, the audio in large chunks."""
        out = self.out
        pcm = to_pcm16(piece.audio).tobytes()
        step = ROOM_SAMPLES_PER_CHUNK * 2
        for i in range(0, max(len(pcm), 1), step):
            chunk = AudioChunk(rate=out.rate, width=2, channels=1, audio=pcm[i:i + step],
                               timestamp=out.samples_sent * 1000 // out.rate).event()
            if i == 0:
                chunk.data[ROOM_PIECE] = piece.described()
            out.samples_sent += len(pcm[i:i + step]) // 2
            await self.write_event(chunk)

    async def _send_audio(self, audio: np.ndarray) -> None:
        out = self.out
        # sent with the first audio, so a request refused by the engine gets only its error
        await self._start_audio()
        out.play_end = max(out.play_end, time.monotonic()) + audio.size / out.rate
        pcm = to_pcm16(audio).tobytes()
        step = SAMPLES_PER_CHUNK * 2
        for i in range(0, len(pcm), step):
            timestamp = out.samples_sent * 1000 // out.rate
            out.samples_sent += len(pcm[i:i + step]) // 2
            await self.write_event(AudioChunk(rate=out.rate, width=2, channels=1, audio=pcm[i:i + step],
                                              timestamp=timestamp).event())

    async def _end_audio(self) -> None:
        out = self.out
        await self._start_audio()
        await self.write_event(AudioStop(timestamp=out.samples_sent * 1000 // out.rate).event())

    async def _speak(self, text: str, choice: Choice, errors: bool, lead: np.ndarray | None = None,
                     room: RoomRequest | None = None) -> tuple[bool, np.ndarray] | None:
        """Send `text` spoken, from the phrase cache or as the engine yields it.

        Returns (from the cache?, the last audio sent: the pause after it depends
        on how it ends), or None when the engine refused the text and `errors`
        is false (a streamed piece with nothing to say: logged and skipped); with
        `errors` true that raises RequestError. `lead` (silence) goes out just
        before the first audio. A `room` takes each piece as soon as it is made, described, and
        schedules it itself (its card plays a sentence once it can flow).

        The same request under way for another client is read, not synthesized again, and
        needs no turn of its own.
        """
        speed = room.speed if room is not None else None
        joining = await self._blocking(self.speech.under_way, text, choice, speed)
        turn = None if joining else await self.connections.synthesis_turn(self.host)
        try:
            utterance = await self._blocking(self.speech.utterance, text, choice, speed)
        except BaseException:
            if turn is not None:
                turn.give_back()
            raise
        ahead = utterance.ahead
        if turn is not None and utterance.shared_with:  # another began it meanwhile
            turn.give_back()
            turn = None
        turn = turn or FreeTurn()
        turn.follow(ahead)
        index = samples = 0
        last = None
        sent_all = False
        try:
            while True:
                piece = ahead.get(index, timeout=0.0)
                if piece is None and ahead.at_end(index):
                    sent_all = True
                    break
                # Home Assistant plays the audio as it arrives, with no buffer of its own:
                # a sentence goes out once it can flow to its end at the client's pace
                if piece is None or (room is None and not utterance.cached and piece.starts_sentence and
                                     not ahead.can_flow(index, max(self.out.play_end, time.monotonic()))):
                    await asyncio.sleep(WAIT_SECONDS)
                    continue
                if index == 0 and lead is not None and lead.size:
                    await self._send_audio(lead)
                if room is not None:
                    await self._send_piece(piece)
                else:
                    await self._send_audio(piece.audio)
                last = piece.audio
                index, samples = index + 1, samples + piece.audio.size
                turn.taken(samples)
        except (TextError, ValueError) as e:
            if errors:
                raise RequestError(f"cannot speak this text: {e}", "bad-text") from None
            log.info("wyoming: %s: skipped %r: %s", self.peer, text[:40], e)
            return None
        finally:
            turn.close()  # given back once synthesis stops (at once if it waits for this client)
            if sent_all:  # store it (file I/O, in the pool)
                await self._blocking(utterance.close, True)
            else:  # also when the client went away: synthesis stops after the step in progress
                utterance.close(False)
        return utterance.cached, last
