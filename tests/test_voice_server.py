"""A hayakoe-pi as the household's voice server (#57): identical requests at about the same time
synthesized once, for rooms (the `hayakoe` extension: speed, pieces described) and for Home
Assistant alike. The real daemon, its Wyoming socket, clients on loopback."""

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from harness import (HEAVY_DECODER, AlsaSink, DaemonProcess, Mosquitto, Probe, free_port, listening, wait_for,
                     write_config)
from hayakoe_pi.remote.protocol import ROOM_PIECE, ROOM_REQUEST, EventSocket
from hayakoe_pi.synthesis.decoding import Piece

TEXT = "玄関のドアが開いています。窓も開いています。"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("voice-server")
    broker = Mosquitto(work / "broker").start()
    sink = AlsaSink(work)
    prefix, port = f"hk{broker.port}", free_port()
    config = write_config(work / "config.yaml", broker.port, prefix, work,
                          wyoming={"enabled": True, "host": "127.0.0.1", "port": port, "zeroconf": False,
                                   "max_syntheses": 2})
    probe = Probe(broker.port, prefix)
    # a decoder as heavy as a real one: a synthesis lasts long enough for every client to arrive during it
    daemon = DaemonProcess(config, sink.home, work / "daemon.log", env=HEAVY_DECODER)

    try:
        wait_for(lambda: listening(port, daemon.proc), 90, what="the Wyoming server to listen")
        assert daemon.proc.poll() is None, daemon.output()
        yield SimpleNamespace(work=work, daemon=daemon, port=port)
    finally:
        daemon.stop()
        probe.close()
        broker.stop()
        sink.stop()


def ask(port: int, text: str, room: dict | None) -> SimpleNamespace:
    """One synthesize; its events until audio-stop (or an error)."""
    events = EventSocket.connect("127.0.0.1", port, timeout=5)
    data = {"text": text, "voice": {"name": "tiny-voice", "speaker": "Neutral"}}
    if room is not None:
        data[ROOM_REQUEST] = room
    events.write("synthesize", data)
    got = []
    try:
        while True:
            kind, data, payload = events.read(timeout=120)
            got.append((kind, data, payload))
            if kind in ("audio-stop", "error"):
                break
    finally:
        events.close()
    audio = b"".join(p for k, _, p in got if k == "audio-chunk")
    return SimpleNamespace(events=got, kinds=[k for k, _, _ in got],
                           samples=np.frombuffer(audio, dtype="<i2"))


def syntheses_of(server, text: str) -> int:
    return server.daemon.output().count(f"synthesizing {len(text)} characters with tiny-voice/Neutral")


def at_once(server, text: str, rooms: list[dict | None]) -> list[SimpleNamespace]:
    results = [None] * len(rooms)

    def one(i):
        results[i] = ask(server.port, text, rooms[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(rooms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return results


def test_three_rooms_and_home_assistant_asking_at_once_are_served_one_synthesis(server):
    text = "一階の" + TEXT
    before = syntheses_of(server, text)
    rooms = [{"speed": 1.0}] * 3 + [None]  # three rooms, and Home Assistant (no extension)
    results = at_once(server, text, rooms)
    for result in results:
        assert result.kinds[-1] == "audio-stop", result.kinds
        assert result.samples.size > 44100 // 2
    assert all(np.array_equal(r.samples, results[0].samples) for r in results)
    assert syntheses_of(server, text) - before == 1, server.daemon.output()[-3000:]
    # a later repeat comes from the phrase cache: no synthesis at all
    again = ask(server.port, text, {"speed": 1.0})
    assert np.array_equal(again.samples, results[0].samples)
    assert syntheses_of(server, text) - before == 1


def test_a_room_gets_the_rate_at_once_and_every_piece_described(server):
    text = "二階の" + TEXT
    result = ask(server.port, text, {"speed": 1.0})
    assert result.kinds[0] == "audio-start"  # before any audio: the room opens its card meanwhile
    pieces, pending = [], None
    for kind, data, payload in result.events:
        if kind != "audio-chunk":
            continue
        if ROOM_PIECE in data:
            pending = (data[ROOM_PIECE], bytearray())
            pieces.append(pending)
        pending[1].extend(payload)
    rebuilt = [Piece.from_description(d, np.frombuffer(bytes(a), dtype="<i2")) for d, a in pieces]
    assert all(p.audio.size == d["samples"] for p, (d, _) in zip(rebuilt, pieces))
    speech = [p for p in rebuilt if not p.pause]
    assert {p.sentence for p in speech} == {0, 1}
    assert any(p.pause for p in rebuilt)  # the pause between the two sentences is told as one
    for p in speech:  # each sentence's windows cover it, as the room's player needs them
        assert p.windows[0][0] == 0 and p.windows[-1][1] == p.sentence_samples
    assert sum(p.audio.size for p in rebuilt) == result.samples.size


def test_a_room_asks_at_its_own_speed_and_a_bad_one_is_refused(server):
    text = "三階の" + TEXT
    slow, fast = (ask(server.port, text, {"speed": s}) for s in (0.8, 1.25))
    assert slow.samples.size > fast.samples.size * 1.3
    refused = ask(server.port, text, {"speed": 9})
    assert refused.kinds == ["error"] and refused.events[0][1]["code"] == "bad-speed"
    refused = ask(server.port, text, {"speed": "fast"})
    assert refused.kinds == ["error"] and refused.events[0][1]["code"] == "bad-speed"


def test_a_room_that_stops_ends_the_servers_work_for_it(server):
    text = "四階の" + TEXT * 4  # several seconds of synthesis on the heavy decoder
    log_before = len(server.daemon.output())
    events = EventSocket.connect("127.0.0.1", server.port, timeout=5)
    events.write("synthesize", {"text": text, ROOM_REQUEST: {"speed": 1.0}})
    assert events.read(timeout=30)[0] == "audio-start"
    kind, data, _ = events.read(timeout=60)
    assert kind == "audio-chunk" and ROOM_PIECE in data  # its first piece is on its way
    events.close()  # a stop in the room
    closed = time.monotonic()
    wait_for(lambda: "synthesis stopped: everyone listening to it has gone" in server.daemon.output()[log_before:],
             10, what="the server to stop the synthesis")
    assert time.monotonic() - closed < 3.0  # at once, not at its next write
    after = ask(server.port, "五階の" + TEXT, {"speed": 1.0})  # and the next is served
    assert after.kinds[-1] == "audio-stop"


class Recording:
    """Stands in for a SynthesisAhead: what the shared views tell it."""

    complete = False

    def __init__(self):
        self.played_to, self.cancelled = [], 0

    def played(self, samples):
        self.played_to.append(samples)

    def cancel(self):
        self.cancelled += 1


def test_a_shared_synthesis_runs_for_its_fastest_reader_and_stops_when_the_last_leaves():
    from hayakoe_pi.speech.shared import SharedSyntheses

    syntheses, made = SharedSyntheses(), []
    start = lambda: made.append(Recording()) or made[-1]  # noqa: E731
    first, others = syntheses.read("k", start)
    second, others_then = syntheses.read("k", start)
    assert (len(made), others, others_then) == (1, 0, 1)
    first.played(5000)
    second.played(1000)
    assert made[0].played_to[-1] == 5000  # the slower reader does not hold synthesis back
    assert first.store_once() and not second.store_once()  # the phrase cache is written once
    first.cancel()  # a stop in one room
    assert made[0].cancelled == 0 and syntheses.running("k")
    second.cancel()
    second.cancel()  # twice is once
    assert made[0].cancelled == 1 and not syntheses.running("k")
    syntheses.read("k", start)  # after it ended, the same request is a new synthesis
    assert len(made) == 2


def read_all(ahead, timeout: float = 120) -> list:
    pieces, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        piece = ahead.get(len(pieces), timeout=0.5)
        if piece is not None:
            pieces.append(piece)
            ahead.played(sum(p.audio.size for p in pieces))
        elif ahead.at_end(len(pieces)):
            return pieces
    raise AssertionError("the synthesis did not end")


def test_a_room_reads_the_servers_pieces_as_its_own_synthesis(server):
    from hayakoe_pi.remote.client import VoiceServer

    text = "六階の" + TEXT
    voice_server = VoiceServer(f"127.0.0.1:{server.port}")
    ahead = voice_server.utterance(text, "tiny-voice", "Neutral", 1.0)
    assert ahead.sample_rate == 44100
    pieces = read_all(ahead)
    assert ahead.complete and {p.sentence for p in pieces if not p.pause} == {0, 1}
    assert ahead.can_flow(0, time.monotonic())  # all there: the player may start
    assert ahead.speed.seconds_per_frame > 0  # how fast pieces come, for the next sentence's start
    heard = ask(server.port, text, {"speed": 1.0})  # the same request again, as raw events
    assert np.abs(ahead.audio() * 32768 - heard.samples).max() <= 1


def test_a_room_is_told_what_the_server_refuses_and_when_none_answers(server):
    from hayakoe_pi.remote.client import CONNECT_S, ServerRefused, VoiceServer
    from hayakoe_pi.remote.protocol import ServerGone

    with pytest.raises(ServerRefused) as refused:
        VoiceServer(f"127.0.0.1:{server.port}").utterance("テストです。", "no-such-voice")
    assert refused.value.code == "unknown-voice"
    started = time.monotonic()
    with pytest.raises(ServerGone):
        VoiceServer(f"127.0.0.1:{free_port()}").utterance("テストです。")
    # an address where nothing answers at all (TEST-NET-1): given up after CONNECT_S
    with pytest.raises(ServerGone):
        VoiceServer("192.0.2.1:10200").utterance("テストです。")
    assert time.monotonic() - started < CONNECT_S + 2


def test_voice_server_addresses():
    from hayakoe_pi.remote.client import parse_address

    assert parse_address("10.0.0.5") == ("10.0.0.5", 10200)
    assert parse_address("ha.local:10300") == ("ha.local", 10300)
    assert parse_address("[fd00::1]:10201") == ("fd00::1", 10201)
    assert parse_address("[fd00::1]") == ("fd00::1", 10200)
    for bad in ("", ":10200", "host:0", "host:http", "host:99999"):
        with pytest.raises(ValueError):
            parse_address(bad)
