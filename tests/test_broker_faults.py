"""Never a lost message: the broker goes away and comes back, every QoS 1 `say` is spoken once.

A real mosquitto with persistence (its own persistence_location), stopped with
SIGTERM (it writes its database then) and started again on the same port, so
it keeps the daemon's persistent session, its subscriptions and the QoS 1
messages queued for it. The daemon as a subprocess; ALSA into a FIFO drained
at real-time speed.

"Spoken exactly once" is checked three ways for every id: one `queued`, one
`started` and one `finished` event (deliveries the broker itself repeats with
the DUP flag after its restart are set aside by the probe); that `finished`
says `cached: false` (a second speaking of the same text would come from the
phrase cache); and the audio that reached the sound card is exactly the sum of
the utterances, once each.
"""

import json
import threading
import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from harness import Probe, SessionProbe, appliance, settle, wait_for

pytestmark = pytest.mark.broker_restart

LONG_TEXT = "冷蔵庫のドアが開いています。閉めてください。" * 2  # about 9 s with the tiny voice
BYTES_PER_SECOND = 44100 * 4


def short_text(n: int) -> str:
    """A different text for every id (about 1 s), so a repeat would be a cache hit."""
    return f"{n}番のお知らせ。"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    work = tmp_path_factory.mktemp("broker-faults")
    # persistence true, location work/broker/; as root mosquitto would become user
    # `mosquitto` and fail to write its database into our folder: stay who we are
    with appliance(work, lambda port, prefix: SessionProbe(port, prefix, client_id=f"probe-{prefix}"),
                   queue={"max_length": 50, "max_text_chars": 300}) as app:
        assert "persistence true" in app.broker.conf.read_text()
        yield app


# --- helpers ---------------------------------------------------------------------------

def connects(app) -> int:
    return app.daemon.output().count("connected to MQTT broker")


def disconnects(app) -> int:
    return app.daemon.output().count("disconnected from MQTT broker")


def cache_entries(app) -> dict:
    return {p.name: p.stat().st_size for p in (app.work / "cache").glob("*.f32")}


def publish_once(port: int, topic: str, payload) -> None:
    """A separate, short-lived client: connect, publish QoS 1, wait for the broker's PUBACK."""
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"once-{time.monotonic_ns()}")
    c.connect("127.0.0.1", port, keepalive=5)
    c.loop_start()
    try:
        info = c.publish(topic, json.dumps(payload, ensure_ascii=False), qos=1)
        info.wait_for_publish(5)
        assert info.is_published()
    finally:
        c.disconnect()
        c.loop_stop()


class Outage:
    """Stop the broker (SIGTERM: it saves its database) and later start it on the same port."""

    def __init__(self, app):
        self.app = app
        self.connects = connects(app)
        self.mark = len(app.probe.messages)

    def begin(self) -> None:
        before = disconnects(self.app)
        self.app.broker.stop()
        self.t0 = time.monotonic()
        wait_for(lambda: disconnects(self.app) > before, 10, what="the daemon to notice the broker is gone")

    def end(self, down: float) -> None:
        """Start the broker again `down` s after it stopped."""
        time.sleep(max(0.0, self.t0 + down - time.monotonic()))
        self.app.broker.start()

    def wait_back(self, timeout: float = 30) -> None:
        """The daemon reconnected by itself and announced `online` again."""
        app = self.app
        wait_for(lambda: connects(app) > self.connects, timeout, what="the daemon to reconnect")
        assert app.daemon.proc.poll() is None, app.daemon.output()[-3000:]
        # the probe resumes its session without subscribing again, so this is a new publish
        wait_for(lambda: (app.probe.topic("status"), b"online", False) in app.probe.messages[self.mark:],
                 15, what="status online again")
        assert "session resumed" in app.daemon.output().split("connected to MQTT broker")[-1].splitlines()[0]
        late = Probe(app.broker.port, app.prefix)  # and it is retained
        try:
            wait_for(lambda: late.last("status") == b"online", 10, what="retained online")
            assert all(r for t, _, r in late.messages if t.endswith("/status"))
        finally:
            late.close()


def assert_spoken_once(app, ids, played_bytes: int, new_entries: dict, sent_twice=()) -> None:
    """Each of `ids` spoken once; a `duplicate` answer only for those `sent_twice` on purpose."""
    probe = app.probe
    for rid in ids:
        mine = [e for e in probe.event_log if e.get("id") == rid]
        assert [e for e in mine if e["event"] == "error"] == [], mine
        assert probe.count("duplicate", rid) == (1 if rid in sent_twice else 0), mine
        # (a `duplicate` would acknowledge the broker's copy while the message still waits
        # or plays here: a crash then would lose it; BrokerLink drops redeliveries itself)
        assert probe.count("queued", rid) == 1, mine
        assert probe.count("started", rid) == 1, mine
        assert probe.count("finished", rid) == 1, mine
        finished = next(e for e in mine if e["event"] == "finished")
        assert finished["cached"] is False and "interrupted" not in finished, finished
    # the sound card got every utterance once: exactly the audio that went into the cache
    assert len(new_entries) == len(ids)
    expected = sum(new_entries.values())
    assert abs(played_bytes - expected) <= 0.05 * BYTES_PER_SECOND * len(ids), (played_bytes, expected)


class Scenario:
    def __init__(self, app):
        settle(app)
        self.app = app
        self.sink_before = app.sink.raw.stat().st_size
        self.cache_before = cache_entries(app)

    def check(self, ids, sent_twice=()) -> None:
        settle(self.app)
        played = self.app.sink.raw.stat().st_size - self.sink_before
        new = {k: v for k, v in cache_entries(self.app).items() if k not in self.cache_before}
        assert_spoken_once(self.app, ids, played, new, sent_twice)


# --- tests -----------------------------------------------------------------------------

def test_broker_restart_while_idle(app):
    s = Scenario(app)
    app.probe.publish("say", {"text": short_text(1), "id": "a-before"})
    app.probe.next_event(event="finished", id="a-before")
    settle(app)
    outage = Outage(app)
    outage.begin()
    # down 3.5 s: the daemon's attempts at ~1 s and ~3 s fail, the next comes at ~7 s
    outage.end(down=3.5)
    # published while the broker is up again but the daemon is still away:
    # the broker queues it in the daemon's persistent session
    publish_once(app.broker.port, f"{app.prefix}/say", {"text": short_text(2), "id": "a-away"})
    assert connects(app) == outage.connects, "the daemon was already back: the test proves nothing"
    outage.wait_back()
    app.probe.next_event(event="finished", id="a-away")
    app.probe.publish("say", {"text": short_text(3), "id": "a-after"})
    app.probe.next_event(event="finished", id="a-after")
    s.check(["a-before", "a-away", "a-after"])


def without_id(app, text: str) -> str:
    """The id the daemon gave a message sent as plain text, which must have come once."""
    queued = [e for e in app.probe.event_log if e["event"] == "queued" and e["text"] == text]
    assert len(queued) == 1, queued  # a redelivered copy without an id would be queued again
    return queued[0]["id"]


def test_broker_restart_while_speaking(app):
    """The broker hands back every message not yet acknowledged (DUP set) when the daemon
    reconnects: those it holds are dropped by BrokerLink, with or without an id."""
    s = Scenario(app)
    app.probe.publish("say", {"text": LONG_TEXT, "id": "b-long"})
    app.probe.publish("say", {"text": short_text(11), "id": "b-1"})  # waiting behind it
    app.probe.publish("say", {"text": short_text(12), "id": "b-2"})
    app.probe.publish("say", short_text(14))  # plain text: no id to tell a copy by
    app.probe.next_event(event="started", id="b-long")
    time.sleep(1.0)
    outage = Outage(app)
    outage.begin()
    played = app.sink.raw.stat().st_size
    outage.end(down=3.5)
    # speech went on without the broker
    assert app.sink.raw.stat().st_size - played > 2.0 * BYTES_PER_SECOND
    publish_once(app.broker.port, f"{app.prefix}/say", {"text": short_text(13), "id": "b-3"})
    assert connects(app) == outage.connects, "the daemon was already back: the test proves nothing"
    outage.wait_back()
    for rid in ("b-long", "b-1", "b-2", "b-3"):
        app.probe.next_event(event="finished", id=rid, timeout=60)
    s.check(["b-long", "b-1", "b-2", without_id(app, short_text(14)), "b-3"])


def test_broker_restart_while_a_client_publishes(app):
    s = Scenario(app)
    # the publisher has its own persistent session; what it publishes while the broker
    # is down stays in paho's queue and is sent when it is back
    publisher = SessionProbe(app.broker.port, app.prefix, client_id=f"pub-{app.prefix}")
    ids = [f"c-{i}" for i in range(8)]
    mids: list[int] = []

    def publish_series():
        for i, rid in enumerate(ids):
            mids.append(publisher.publish_nowait("say", {"text": short_text(20 + i), "id": rid}))
            time.sleep(0.4)

    try:
        t = threading.Thread(target=publish_series)
        t.start()
        time.sleep(0.9)  # two or three are out, the rest come during and after the outage
        outage = Outage(app)
        outage.begin()
        outage.end(down=1.5)
        t.join(10)
        assert not t.is_alive()
        outage.wait_back()
        wait_for(lambda: set(mids) <= publisher.published, 30, what="the broker to acknowledge all")
        for rid in ids:
            app.probe.next_event(event="finished", id=rid, timeout=60)
        s.check(ids)
    finally:
        publisher.close()


def test_repeated_id_is_ignored(app):
    """The de-duplication the above relies on: the same id twice is spoken once, and the
    repeat is answered with a `duplicate` event."""
    s = Scenario(app)
    for _ in range(2):
        app.probe.publish("say", {"text": short_text(40), "id": "d-1"})
    app.probe.next_event(event="duplicate", id="d-1")
    app.probe.publish("say", {"text": short_text(41), "id": "d-2"})
    app.probe.next_event(event="finished", id="d-2")
    s.check(["d-1", "d-2"], sent_twice=["d-1"])
    assert "ignoring message id 'd-1': already received" in app.daemon.output()


def test_retained_say_is_not_spoken_again_on_reconnect(app):
    """A `say` published with retain (a common slip in Home Assistant) is spoken once, when
    it comes; the broker hands it out again on every (re)subscription, which is no new message."""
    text = "保持されたメッセージです。"
    topic = f"{app.prefix}/say"
    settle(app)
    try:
        app.probe.client.publish(topic, text, qos=1, retain=True).wait_for_publish(5)
        app.probe.next_event(event="finished", text=text)
        settle(app)
        outage = Outage(app)
        outage.begin()
        outage.end(down=0.5)
        outage.wait_back()
        app.probe.publish("say", {"text": short_text(50), "id": "r-after"})
        app.probe.next_event(event="finished", id="r-after")
        settle(app)
        spoken = [e for e in app.probe.event_log if e.get("text") == text and e["event"] == "queued"]
        assert len(spoken) == 1, spoken
    finally:
        app.probe.client.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)  # clear it


def all_answered(app, ids) -> dict | None:
    """Each id's last word (`finished` or `error`), once all have one."""
    final = {e["id"]: e for e in app.probe.event_log if e.get("id") in ids and e["event"] in ("finished", "error")}
    return final if len(final) == len(ids) else None


def test_a_retained_stop_cancels_nothing_at_a_reconnect(app):
    """A Home Assistant button with `retain: true` leaves `<id>/stop` retained. Before, the broker
    handed it out again at every reconnect and it cancelled what waited (answered `cancelled` and
    acknowledged: lost)."""
    topic = app.probe.topic(f"{app.probe.device}/stop")  # this Pi's own
    try:
        app.probe.client.publish(topic, "PRESS", qos=1, retain=True).wait_for_publish(5)
        s = Scenario(app)
        long_text = "洗濯機の運転が終わりました。洗濯物を干してください。" * 2  # not in the cache yet
        app.probe.publish("say", {"text": long_text, "id": "s-long"})
        ids = [f"s-{i}" for i in range(4)]
        for i, rid in enumerate(ids):
            app.probe.publish("say", {"text": short_text(60 + i), "id": rid})  # QoS 1, waiting behind it
        app.probe.next_event(event="started", id="s-long")
        wait_for(lambda: all(app.probe.count("queued", rid) for rid in ids), 10, what="all queued")
        outage = Outage(app)
        outage.begin()
        outage.end(down=0.5)
        outage.wait_back()
        done = wait_for(lambda: all_answered(app, ["s-long", *ids]), 90, what="every message answered")
        assert all(e["event"] == "finished" and "interrupted" not in e for e in done.values()), done
        s.check(["s-long", *ids])
        assert app.daemon.output().count(f"ignoring a retained message on {topic}") == 1
    finally:
        app.probe.client.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)  # clear it


def test_a_retained_setting_is_not_applied_again_at_a_reconnect(app):
    topic = app.probe.topic("volume/set")
    ignored = f"ignoring a retained message on {topic}"
    try:
        app.probe.client.publish(topic, "30", qos=1, retain=True).wait_for_publish(5)
        wait_for(lambda: app.probe.last("volume") == b"30", 10, what="volume 30")  # live: a command
        app.probe.publish("volume/set", "60")
        wait_for(lambda: app.probe.last("volume") == b"60", 10, what="volume 60")
        for n in (1, 2):
            outage = Outage(app)
            outage.begin()
            outage.end(down=0.5)
            outage.wait_back()
            # the copy handed out with the subscription: before, applied again (30)
            wait_for(lambda: ignored in app.daemon.output() or app.probe.last("volume") == b"30", 10,
                     what="the retained copy handled")
            time.sleep(1.0)
            assert app.probe.last("volume") == b"60"
        assert app.daemon.output().count(ignored) == 1  # said once, not at every reconnect
    finally:
        app.probe.client.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)  # clear it
        app.probe.publish("volume/set", "100")


def test_a_retained_birth_message_still_announces(app):
    """Home Assistant's birth topic is no command: its retained `online` is acted on at a reconnect
    (discovery once for the connect, once more for the birth message)."""
    topic = "homeassistant/status"
    say_config = "homeassistant/notify/pi/say/config"
    try:
        app.probe.client.publish(topic, "online", qos=1, retain=True).wait_for_publish(5)
        outage = Outage(app)
        outage.begin()
        outage.end(down=0.5)
        outage.wait_back()
        wait_for(lambda: [t for t, _, _ in app.probe.messages[outage.mark:]].count(say_config) >= 2, 10,
                 what="discovery for the connect and for the birth message")
        assert "ignoring a retained message on homeassistant/status" not in app.daemon.output()
    finally:
        app.probe.client.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)  # clear it
