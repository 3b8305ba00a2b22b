"""Wyoming (Home Assistant Assist): the daemon as a local TTS engine.

Against the real daemon process (with mosquitto and the ALSA sink, so the MQTT
side runs too), spoken to with the wyoming package's own client. Zeroconf is
off here (no multicast from tests); its record is checked without registering.
"""

import asyncio
import dataclasses
import socket
import time
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import (Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop,
                         SynthesizeStopped, SynthesizeVoice)

from conftest import FIXTURE_MODELS
from harness import AlsaSink, DaemonProcess, Mosquitto, Probe, free_port, listening, wait_for, write_config
from hayakoe_pi.settings.config import Config, DeviceConfig, WyomingConfig, load_config, voice_styles
from hayakoe_pi.sound.player import to_pcm16
from hayakoe_pi.wyoming import SERVICE_TYPE, instance_name, read_event, ready_text, service_info

VOICES = ["tiny-voice", "tiny-voice-nodur"]
MAX_CHARS = 300
LONG_TEXT = "冷蔵庫のドアが開いています。閉めてください。" * 6
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with wyoming_app(tmp_path_factory.mktemp("wyoming")) as app:
        yield app


@contextmanager
def wyoming_app(work):
    """The daemon with its Wyoming server on, a broker, a probe and a sink, until the block ends."""
    broker = Mosquitto(work / "broker").start()
    sink = AlsaSink(work)
    prefix = f"hk{broker.port}"
    port = free_port()
    config = write_config(work / "config.yaml", broker.port, prefix, work,
                          queue={"max_text_chars": MAX_CHARS},
                          wyoming={"enabled": True, "host": "127.0.0.1", "port": port, "zeroconf": False})
    probe = Probe(broker.port, prefix)
    daemon = DaemonProcess(config, sink.home, work / "daemon.log")

    try:
        wait_for(lambda: probe.last("status") == b"online" or daemon.proc.poll() is not None, 90,
                 what="the daemon to come online")
        wait_for(lambda: listening(port, daemon.proc), 30, what="the Wyoming server to listen")
        assert daemon.proc.poll() is None, daemon.output()
        yield SimpleNamespace(work=work, broker=broker, sink=sink, probe=probe, daemon=daemon,
                              prefix=prefix, port=port)
    finally:
        daemon.stop()
        probe.close()
        broker.stop()
        sink.stop()


# --- a small client -----------------------------------------------------------------------

def client(app) -> AsyncTcpClient:
    return AsyncTcpClient("127.0.0.1", app.port, connect_timeout=10, read_timeout=TIMEOUT)


async def read_until(c: AsyncTcpClient, *types: str) -> list[Event]:
    """Events up to and including the first of `types` (or an error, or the end of the stream)."""
    events = []
    while True:
        event = await c.read_event()
        if event is None:
            return events
        events.append(event)
        if event.type in types or Error.is_type(event.type):
            return events


def audio_of(events: list[Event]) -> SimpleNamespace:
    starts = [AudioStart.from_event(e) for e in events if AudioStart.is_type(e.type)]
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    pcm = b"".join(c.audio for c in chunks)
    return SimpleNamespace(starts=starts, chunks=chunks, pcm=np.frombuffer(pcm, dtype="<i2"),
                           stops=sum(AudioStop.is_type(e.type) for e in events),
                           types=[e.type for e in events])


async def synthesize(app, text: str, voice: SynthesizeVoice | None = None) -> SimpleNamespace:
    async with client(app) as c:
        await c.write_event(Synthesize(text=text, voice=voice).event())
        return audio_of(await read_until(c, AudioStop().event().type))


async def describe(app) -> Info:
    async with client(app) as c:
        await c.write_event(Describe().event())
        events = await read_until(c, "info")
        assert events and Info.is_type(events[-1].type), [e.type for e in events]
        return Info.from_event(events[-1])


async def error_for(app, *events: Event, raw: bytes = b"") -> Error:
    """Send `events` (or raw bytes); the server answers with an error and closes."""
    async with client(app) as c:
        for e in events:
            await c.write_event(e)
        if raw:
            c._writer.write(raw)
            await c._writer.drain()
        got = await read_until(c)
        assert got and Error.is_type(got[-1].type), [e.type for e in got]
        assert await c.read_event() is None  # then the connection closes
        return Error.from_event(got[-1])


def run(coro):
    return asyncio.run(coro)


def assert_spoken(audio: SimpleNamespace, min_seconds: float = 0.3):
    assert len(audio.starts) == 1 and audio.types[0] == "audio-start", audio.types[:3]
    start = audio.starts[0]
    assert (start.rate, start.width, start.channels) == (44100, 2, 1)
    assert audio.chunks and all((c.rate, c.width, c.channels) == (44100, 2, 1) for c in audio.chunks)
    assert all(0 < len(c.audio) <= 2048 for c in audio.chunks)  # at most 1024 samples each
    assert audio.stops == 1
    assert audio.pcm.size > min_seconds * 44100
    assert np.abs(audio.pcm).max() > 30  # not silence


# --- pure parts ---------------------------------------------------------------------------

def test_zeroconf_record_is_built_right():
    info = service_info("hayakoe-pi-kitchen", 10200, "192.168.1.20")
    assert info.type == SERVICE_TYPE == "_wyoming._tcp.local."
    assert info.name == "hayakoe-pi-kitchen._wyoming._tcp.local."
    assert info.port == 10200
    assert info.parsed_addresses() == ["192.168.1.20"]
    assert info.properties[b"program"] == b"hayakoe-pi"
    assert info.properties[b"languages"] == b"ja"
    assert b"version" in info.properties
    assert instance_name("kitchen-pi.lan") == "hayakoe-pi-kitchen-pi"
    assert len(instance_name("x" * 100)) == 63


class FakeZeroconf:
    """Stands in for zeroconf.asyncio.AsyncZeroconf: records, sends nothing."""

    made: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []
        FakeZeroconf.made.append(self)

    async def async_register_service(self, info, **kwargs):
        self.calls.append(("register", info, kwargs))
        done = asyncio.get_running_loop().create_future()  # like zeroconf: an awaitable for completion
        done.set_result(None)
        return done

    async def async_unregister_all_services(self):
        self.calls.append(("unregister",))

    async def async_close(self):
        self.calls.append(("close",))


def announced_name(monkeypatch, identity=None) -> str:
    """The instance name a server with this identity registers (zeroconf faked)."""
    import zeroconf.asyncio

    from hayakoe_pi.wyoming import WyomingServer

    monkeypatch.setattr(zeroconf.asyncio, "AsyncZeroconf", FakeZeroconf)
    FakeZeroconf.made.clear()
    server = WyomingServer(WyomingConfig(enabled=True, host="127.0.0.1", port=free_port(), zeroconf=True),
                           speech=None, identity=identity)
    server.start()
    try:
        wait_for(lambda: FakeZeroconf.made and FakeZeroconf.made[0].calls, 10, what="registration")
    finally:
        server.stop(timeout=5)
    return FakeZeroconf.made[0].calls[0][1].name


def test_each_pi_announces_itself_under_its_own_name(monkeypatch):
    """Every Pi OS image is called raspberrypi: the name comes from device.id, and Home Assistant
    names the engine after the program, which carries device.name."""
    from hayakoe_pi.wyoming.server import build_info

    kitchen = Config(device=DeviceConfig(id="kitchen-3fa2c1", name="Kitchen")).identity()
    bedroom = Config(device=DeviceConfig(id="bedroom")).identity()
    names = {announced_name(monkeypatch, me) for me in (kitchen, bedroom)}
    assert names == {f"hayakoe-pi-kitchen-3fa2c1.{SERVICE_TYPE}", f"hayakoe-pi-bedroom.{SERVICE_TYPE}"}
    assert announced_name(monkeypatch) == f"{instance_name()}.{SERVICE_TYPE}"  # before device.id: as it was
    speech = SimpleNamespace(voices=lambda: [], styles=lambda name: [])
    assert build_info(speech, kitchen).tts[0].name == "HayaKoe Kitchen"
    assert build_info(speech, Config().identity()).tts[0].name == "hayakoe-pi"


def test_server_announces_and_withdraws_without_interface_scan(monkeypatch):
    import zeroconf
    import zeroconf.asyncio

    from hayakoe_pi.wyoming import WyomingServer

    monkeypatch.setattr(zeroconf.asyncio, "AsyncZeroconf", FakeZeroconf)
    FakeZeroconf.made.clear()
    port = free_port()
    server = WyomingServer(WyomingConfig(enabled=True, host="127.0.0.1", port=port, zeroconf=True), speech=None)
    server.start()
    try:
        assert server.listening.wait(10)
        wait_for(lambda: FakeZeroconf.made and FakeZeroconf.made[0].calls, 10, what="registration")
        assert server.alive()
    finally:
        server.stop(timeout=5)
    assert not server._thread.is_alive()
    (zc,) = FakeZeroconf.made
    assert zc.kwargs == {"interfaces": zeroconf.InterfaceChoice.Default,
                         "ip_version": zeroconf.IPVersion.V4Only}  # no netlink needed under systemd
    (kind, info, kwargs), *rest = zc.calls
    assert kind == "register" and kwargs == {"allow_name_change": True}
    assert info.port == port and info.parsed_addresses() == ["127.0.0.1"]
    assert info.name == f"{instance_name()}.{SERVICE_TYPE}"
    assert rest == [("unregister",), ("close",)]


def test_port_in_use_is_retried_without_ending_the_server(caplog):
    from hayakoe_pi.wyoming import WyomingServer

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = WyomingServer(WyomingConfig(enabled=True, host="127.0.0.1", port=port, zeroconf=False), speech=None)
        with caplog.at_level("ERROR", logger="hayakoe_pi.wyoming"):
            server.start()
            wait_for(lambda: "cannot listen" in caplog.text, 10, what="the bind error to be logged")
            assert server.alive() and not server.listening.is_set()
            started = time.monotonic()
            server.stop(timeout=5)
    assert not server._thread.is_alive() and time.monotonic() - started < 2


def test_idle_clients_are_dropped_and_too_many_refused(monkeypatch):
    import hayakoe_pi.wyoming.limits as limits
    from hayakoe_pi.wyoming import WyomingServer

    monkeypatch.setattr(limits, "MAX_CLIENTS", 1)
    port = free_port()
    server = WyomingServer(WyomingConfig(enabled=True, host="127.0.0.1", port=port, zeroconf=False,
                                         idle_timeout_s=1.0), speech=None)
    server.start()

    async def go():
        first = AsyncTcpClient("127.0.0.1", port, read_timeout=10)
        await first.connect()
        await asyncio.sleep(0.1)
        async with AsyncTcpClient("127.0.0.1", port, read_timeout=10) as second:
            refused = await second.read_event()
        started = time.monotonic()
        assert await first.read_event() is None  # idle: disconnected
        waited = time.monotonic() - started
        await first.disconnect()
        return Error.from_event(refused), waited

    try:
        assert server.listening.wait(10)
        error, waited = run(go())
    finally:
        server.stop(timeout=5)
    assert error.code == "busy"
    assert waited < 3


@pytest.mark.prepares_models  # its own derived folder
def test_the_server_in_process_answers_with_the_speech_services_audio(tmp_path):
    """No daemon: the server needs only a speech service."""
    from hayakoe_pi.speech.cache import PhraseCache
    from hayakoe_pi.models.store import ModelStore
    from hayakoe_pi.speech.service import SavedSelection, SpeechService
    from hayakoe_pi.wyoming import WyomingServer

    store = ModelStore(FIXTURE_MODELS, derived_dir=tmp_path / "derived")
    speech = SpeechService(store, PhraseCache(tmp_path / "cache", 10),
                           SavedSelection(tmp_path / "state.json", 1.0, "tiny-voice", "Neutral"),
                           "tiny-voice", "Neutral", 1.0, 1.0, MAX_CHARS)
    port = free_port()
    server = WyomingServer(WyomingConfig(enabled=True, host="127.0.0.1", port=port, zeroconf=False), speech)
    server.start()

    async def go():
        async with AsyncTcpClient("127.0.0.1", port) as c:
            voice = SynthesizeVoice(name="tiny-voice", speaker="Happy")
            await c.write_event(Synthesize(text="はい。", voice=voice).event())
            return audio_of(await read_until(c, AudioStop().event().type))

    try:
        assert server.listening.wait(10)
        audio = run(go())
    finally:
        server.stop(timeout=5)
    assert_spoken(audio)
    # what was sent is what the service stored for this text, voice and style
    stored = speech.utterance("はい。", speech.choose("tiny-voice", "Happy"))
    assert stored.cached
    stored.ahead.join(5)  # handed out by a thread of its own
    assert np.array_equal(audio.pcm, to_pcm16(stored.ahead.audio()))


def test_config_defaults_and_checks(tmp_path):
    defaults = load_config(None).wyoming
    assert dataclasses.asdict(defaults) == {"enabled": False, "host": "0.0.0.0", "port": 10200, "zeroconf": True,
                                            "max_syntheses": 2, "write_timeout_s": 30.0, "idle_timeout_s": 120.0}
    path = tmp_path / "c.yaml"
    path.write_text("wyoming:\n  enabled: true\n  port: 70000\n")
    with pytest.raises(Exception, match="wyoming.port must be between"):
        load_config(path)


def test_sentence_boundaries_for_streamed_text():
    assert ready_text("今日は晴れ") == ("", "今日は晴れ")
    assert ready_text("今日は晴れです。明日は") == ("今日は晴れです。", "明日は")
    assert ready_text("本当？はい！それと\n次") == ("本当？はい！それと\n", "次")
    assert ready_text("Wi-Fi!OK?") == ("Wi-Fi!OK?", "")


def test_pcm_conversion_clips():
    pcm = np.frombuffer(to_pcm16(np.array([0.0, 0.5, 1.0, -1.0, 2.0, -3.0], dtype=np.float32)), "<i2")
    assert pcm.tolist() == [0, 16384, 32767, -32767, 32767, -32767]


@pytest.mark.parametrize("raw, ok", [
    (b'{"type": "describe"}\n', True),
    (b'{"type": "synthesize", "data_length": 15}\n{"text": "\xe3\x81\x82"}', True),
    (b"not json\n", False),
    (b"[1, 2]\n", False),
    (b'{"data": {}}\n', False),
    (b'{"type": "x", "data_length": 99999999999}\n', False),
    (b'{"type": "x", "data_length": 2}\n[]', False),
    (b'{"type": "x", "payload_length": -1}\n', False),
])
def test_event_reader_limits(raw, ok):
    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        return await read_event(reader)

    if ok:
        assert run(go()).type in ("describe", "synthesize")
    else:
        with pytest.raises(Exception, match="event"):
            run(go())


# --- against the daemon -------------------------------------------------------------------

def test_describe_lists_voices_with_styles_as_speakers(app):
    info = run(describe(app))
    assert len(info.tts) == 1
    program = info.tts[0]
    assert program.installed and program.supports_synthesize_streaming
    assert program.attribution.name and program.version
    assert sorted(v.name for v in program.voices) == VOICES
    for voice in program.voices:
        assert voice.installed and voice.languages == ["ja"]
        assert voice.attribution.name and voice.attribution.url
        assert [s.name for s in voice.speakers] == voice_styles(FIXTURE_MODELS, voice.name)
        assert "Happy" in [s.name for s in voice.speakers]


def test_synthesize_answers_with_pcm(app):
    assert_spoken(run(synthesize(app, "お風呂が沸きました。")))


def test_synthesize_with_voice_and_speaker(app):
    audio = run(synthesize(app, "ジュースを冷やしておきました。",
                           SynthesizeVoice(name="tiny-voice-nodur", speaker="Happy")))
    assert_spoken(audio)


def test_first_audio_comes_before_the_whole_text_is_synthesized(app):
    async def go():
        async with client(app) as c:
            await c.write_event(Synthesize(text=LONG_TEXT + "まだ続きます。").event())
            times = {}
            while True:
                event = await c.read_event()
                assert event is not None and not Error.is_type(event.type)
                times.setdefault(event.type, time.monotonic())
                if AudioStop.is_type(event.type):
                    return times

    times = run(go())
    # sentences come one by one: the first chunk long before the end (tiny models: ~0.1 s each)
    assert times["audio-chunk"] < times["audio-stop"] - 0.2, times


def test_streaming_synthesis_speaks_as_text_arrives(app):
    async def go():
        async with client(app) as c:
            await c.write_event(SynthesizeStart(voice=SynthesizeVoice(name="tiny-voice", speaker="Sad")).event())
            await c.write_event(SynthesizeChunk(text="今日は晴れ").event())
            await c.write_event(SynthesizeChunk(text="です。明日は").event())
            # the first sentence is spoken before the rest of the text is even sent
            first = await read_until(c, "audio-chunk")
            assert [e.type for e in first] == ["audio-start", "audio-chunk"], [e.type for e in first]
            await c.write_event(SynthesizeChunk(text="雨でしょう。").event())
            # Home Assistant also sends the whole text for older servers: not spoken twice
            await c.write_event(Synthesize(text="今日は晴れです。明日は雨でしょう。").event())
            await c.write_event(SynthesizeStop().event())
            rest = await read_until(c, SynthesizeStopped().event().type)
            return audio_of(first + rest)

    audio = run(go())
    assert audio.types[-2:] == ["audio-stop", "synthesize-stopped"], audio.types[-3:]
    assert_spoken(audio, min_seconds=0.6)
    # spoken once: each sentence as it is spoken alone (from the phrase cache: the same samples),
    # the pause after "。" between them, and nothing more
    voice = SynthesizeVoice(name="tiny-voice", speaker="Sad")
    first = run(synthesize(app, "今日は晴れです。", voice)).pcm
    second = run(synthesize(app, "明日は雨でしょう。", voice)).pcm
    gap = audio.pcm.size - first.size - second.size
    assert abs(gap - 0.35 * 44100) <= 1, (audio.pcm.size, first.size, second.size)
    assert np.array_equal(audio.pcm[:first.size], first)
    assert not audio.pcm[first.size:first.size + gap].any()
    assert np.array_equal(audio.pcm[first.size + gap:], second)


@pytest.mark.parametrize("parts", [
    ("電気を", "消し", "ました"),  # no sentence end: spoken at the stop
    ("🎉🎉！", "お誕生日", "おめでとう！"),  # a piece with nothing to say is skipped
])
def test_streamed_pieces_are_spoken_whatever_their_ends(app, parts):
    async def go():
        async with client(app) as c:
            await c.write_event(SynthesizeStart().event())
            for part in parts:
                await c.write_event(SynthesizeChunk(text=part).event())
            await c.write_event(SynthesizeStop().event())
            return audio_of(await read_until(c, SynthesizeStopped().event().type))

    audio = run(go())
    assert audio.types[-1] == "synthesize-stopped"
    assert_spoken(audio)


def test_client_leaving_mid_stream_then_next_client_is_served(app):
    async def leave_early():
        c = client(app)
        await c.connect()
        await c.write_event(Synthesize(text=LONG_TEXT).event())
        got = await read_until(c, "audio-chunk")
        assert got[-1].type == "audio-chunk"
        await c.disconnect()

    async def leave_streaming():
        c = client(app)
        await c.connect()
        await c.write_event(SynthesizeStart().event())
        await c.write_event(SynthesizeChunk(text=LONG_TEXT).event())
        await read_until(c, "audio-chunk")
        await c.disconnect()

    run(leave_early())
    run(leave_streaming())
    assert_spoken(run(synthesize(app, "次のお客様、どうぞ。")))
    assert run(describe(app)).tts[0].voices
    assert app.daemon.proc.poll() is None
    wait_for(lambda: "went away" in app.daemon.output() or "abandoned" in app.daemon.output(), 10,
             what="the disconnect to be logged")


@pytest.mark.parametrize("events, code, words", [
    ([Synthesize(text="こんにちは。", voice=SynthesizeVoice(name="no-such-voice"))], "unknown-voice", "no-such-voice"),
    ([Synthesize(text="こんにちは。", voice=SynthesizeVoice(name="tiny-voice", speaker="Sleepy"))],
     "unknown-speaker", "Sleepy"),
    ([Synthesize(text="")], "empty-text", "empty"),
    ([Synthesize(text="  \n ")], "empty-text", "empty"),
    ([Synthesize(text="あ" * (MAX_CHARS + 1))], "text-too-long", "too long"),
    ([Synthesize(text="😊🎉")], "nothing-to-speak", "nothing to speak"),  # at the door, before synthesis
    ([Synthesize(text="ベル\x07です")], "bad-text", "control"),
    ([Event(type="synthesize", data={"text": 5})], "bad-text", "string"),
    ([Event(type="synthesize", data={"text": "はい", "voice": "tiny-voice"})], "bad-voice", "object"),
    ([Synthesize(text="はい", voice=SynthesizeVoice(language="en"))], "unknown-language", "ja"),
    ([SynthesizeChunk(text="はい。")], "bad-sequence", "without synthesize-start"),
    ([SynthesizeStop()], "bad-sequence", "without synthesize-start"),
    ([SynthesizeStart(voice=SynthesizeVoice(name="../../etc/passwd"))], "unknown-voice", "unknown voice"),
    ([SynthesizeStart(), SynthesizeChunk(text="あ" * 200), SynthesizeChunk(text="い" * 200)],
     "text-too-long", "too long"),
    ([SynthesizeStart(), SynthesizeStop()], "empty-text", "empty"),
    ([SynthesizeStart(), SynthesizeChunk(text="😊🎉。"), SynthesizeChunk(text="…"), SynthesizeStop()],
     "bad-text", "nothing readable"),
    ([SynthesizeStart(), SynthesizeStart()], "bad-sequence", "already"),
    ([Synthesize(text="市場《いちば》です。")], "bad-reading", "katakana: 市場《イチバ》"),
    ([SynthesizeStart(), SynthesizeChunk(text="市場《いち"), SynthesizeChunk(text="ば》です。")],
     "bad-reading", "katakana"),
])
def test_bad_requests_get_an_error_and_the_server_goes_on(app, events, code, words):
    error = run(error_for(app, *[e if isinstance(e, Event) else e.event() for e in events]))
    assert error.code == code and words in error.text, error
    assert run(describe(app)).tts[0].voices  # served on


@pytest.mark.parametrize("raw", [
    b"this is not json\n",
    b'{"type": 42}\n',
    b'{"type": "synthesize", "data_length": 999999999}\n',
    b'{"type": "synthesize", "data_length": 3}\n[1]',
    b'{"type": "synthesize", "data": {}}\n',  # no text
    b"{" * 70000 + b"\n",  # header over the line limit
])
def test_malformed_events_get_an_error_and_the_server_goes_on(app, raw):
    error = run(error_for(app, raw=raw))
    assert error.code in ("bad-event", "bad-text"), error
    assert run(describe(app)).tts[0].voices


def test_unknown_event_type_gets_an_error_and_the_connection_stays(app):
    async def go():
        async with client(app) as c:
            await c.write_event(Event(type="transcribe", data={"language": "ja"}))
            error = Error.from_event((await read_until(c))[-1])
            await c.write_event(Ping(text="hi").event())
            pong = (await read_until(c, "pong"))[-1]
            await c.write_event(Synthesize(text="はい。").event())
            return error, pong, audio_of(await read_until(c, "audio-stop"))

    error, pong, audio = run(go())
    assert error.code == "unknown-event" and "transcribe" in error.text
    assert Pong.from_event(pong).text == "hi"
    assert_spoken(audio, min_seconds=0.1)


def test_phrase_cache_is_shared_with_mqtt(app):
    # Wyoming first: a miss, stored; MQTT then plays it from the cache
    text = "玄関の鍵が開いたままです。"
    assert_spoken(run(synthesize(app, text)))
    app.probe.publish("say", {"text": text, "id": "wy-cache-1"})
    assert app.probe.next_event(event="finished", id="wy-cache-1", timeout=TIMEOUT)["cached"] is True
    # MQTT first: prepared into the cache; Wyoming then sends exactly that audio
    text = "まもなく会議が始まります。"
    before = set((app.work / "cache").glob("*.f32"))
    app.probe.publish("prepare", {"text": text, "id": "wy-cache-2"})
    app.probe.next_event(event="finished", id="wy-cache-2", timeout=TIMEOUT)
    (entry,) = set((app.work / "cache").glob("*.f32")) - before
    audio = run(synthesize(app, text))
    assert_spoken(audio)
    assert np.array_equal(audio.pcm, np.frombuffer(to_pcm16(np.fromfile(entry, dtype="<f4")), "<i2"))


def test_mqtt_say_works_while_a_wyoming_request_runs(app):
    wait_for(lambda: app.probe.last("state") == b"idle", TIMEOUT, what="idle")
    played_before = app.sink.raw.stat().st_size

    async def go():
        async with client(app) as c:
            await c.write_event(Synthesize(text=LONG_TEXT).event())
            first = await read_until(c, "audio-chunk")
            # while the Wyoming text is being synthesized, MQTT speaks on the Pi
            app.probe.publish("say", {"text": "お湯が沸きました。", "id": "wy-mqtt-1"})
            finished = asyncio.get_running_loop().run_in_executor(
                None, lambda: app.probe.next_event(event="finished", id="wy-mqtt-1", timeout=TIMEOUT))
            rest = await read_until(c, "audio-stop")
            return audio_of(first + rest), await finished

    audio, finished = run(go())
    assert_spoken(audio, min_seconds=3.0)  # the whole long text came through
    assert "interrupted" not in finished
    wait_for(lambda: app.sink.raw.stat().st_size > played_before + 0.3 * 44100 * 4, 20,
             what="the MQTT text to be played")


def test_concurrent_clients_are_all_served(app):
    texts = ["一番目のお知らせです。", "三番目。", "二番目のお知らせは少し長めです。",
             "四番目のお知らせは、これまでのどれよりもずっと長くなっています。"]

    async def go():
        return await asyncio.gather(*(synthesize(app, text) for text in texts))

    together = run(go())
    for audio in together:
        assert_spoken(audio)
    # each client got the audio of its own text: what one client alone gets for it
    # (from the phrase cache the concurrent syntheses filled: the same samples)
    for text, audio in zip(texts, together):
        alone = run(synthesize(app, text))
        assert np.array_equal(audio.pcm, alone.pcm), (text, audio.pcm.size, alone.pcm.size)
    sizes = [a.pcm.size for a in together]
    assert len(set(sizes)) == len(texts) and sizes[1] == min(sizes) and sizes[3] == max(sizes), sizes


def test_sigterm_with_a_client_mid_request_stops_promptly(tmp_path):
    with wyoming_app(tmp_path) as app:  # its own daemon: it ends it
        _sigterm_mid_request(app)


def _sigterm_mid_request(app):
    stopped = {}

    async def go():
        c = client(app)
        await c.connect()
        await c.write_event(Synthesize(text=LONG_TEXT * 2).event())
        await read_until(c, "audio-chunk")
        started = time.monotonic()
        stopped["rc"] = await asyncio.get_running_loop().run_in_executor(None, app.daemon.stop)
        stopped["seconds"] = time.monotonic() - started
        try:
            while await c.read_event() is not None:
                pass
        except (ConnectionError, OSError):
            pass

    run(go())
    assert stopped["rc"] == 0, app.daemon.output()[-2000:]
    assert stopped["seconds"] < 5, stopped
    assert "Traceback" not in app.daemon.output()
