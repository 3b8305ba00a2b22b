"""A broker stricter than the daemon's bound (bounds.MAX_PUBLISH_BYTES): a real mosquitto with
`max_packet_size 600`, under the size of several of the Pi's discovery configs (600-650 bytes
on the wire), and the daemon on the test voice.

The broker closes the connection on a packet over its limit without a word (MQTT 3.1.1), and
paho sends it again at every reconnect. What it refused must be found by its size, not by its
place in paho's queue (issue #56: the oldest unconfirmed publish, a 3-byte retained volume, was
blamed, the limit became 2 bytes, and the Pi said nothing more on MQTT while it still spoke).
"""

import re
import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from harness import appliance, wait_for

LIMIT = 600  # the broker's max_packet_size
SETTINGS = ("status", "state", "event", "volume", "voice", "style", "chime", "quiet_hours")  # the daemon's


def packet_size(topic: str, payload: bytes) -> int:
    """A QoS 1 PUBLISH on the wire (MQTT 3.1.1)."""
    remaining = 2 + len(topic.encode()) + 2 + len(payload)  # topic length, topic, packet id, payload
    return 1 + (1 if remaining < 128 else 2 if remaining < 16384 else 3) + remaining


def retained(port: int, topics: list[str], wait: float = 3.0) -> dict[str, bytes]:
    """What a new subscriber is handed on `topics` (the retained copies), by a client of its own."""
    got: dict[str, bytes] = {}
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"late-{time.monotonic_ns()}")
    c.on_message = lambda client, userdata, m: got.__setitem__(m.topic, m.payload) if m.retain else None
    c.connect("127.0.0.1", port)
    c.subscribe([(t, 1) for t in topics])
    c.loop_start()
    time.sleep(wait)
    c.loop_stop()
    c.disconnect()
    return got


def discovery_topics(probe) -> set[str]:
    from hayakoe_pi.broker.discovery import discovery_messages
    from hayakoe_pi.broker.topics import Topics
    from hayakoe_pi.settings.config import Identity

    identity = Identity(probe.device, probe.device, None, "unused", legacy=False)
    return {t for t, _ in discovery_messages(Topics(probe.prefix, probe.device), identity, [], [])}


def named_in_log(text: str) -> list[str]:
    """The topics the daemon said it did not (or could not) publish."""
    return (re.findall(r"not publishing on (\S+):", text)
            + re.findall(r"sent a packet of \d+ bytes on (\S+) \(its max_packet_size", text))


@pytest.fixture
def strict(tmp_path):
    with appliance(tmp_path, broker_conf={"extra_conf": f"allow_anonymous true\nmax_packet_size {LIMIT}\n"}) as app:
        yield app


def test_a_refused_discovery_config_costs_that_config_and_nothing_else(strict):
    app, probe = strict, strict.probe
    log = app.daemon.output
    configs = discovery_topics(probe)
    assert len(configs) == 10

    def sent() -> dict[str, bytes]:
        own = {f"{probe.prefix}/{probe.device}/{s}" for s in SETTINGS}
        return {t: p for t, p, _ in probe.messages if t in configs or t in own}

    # every config is either published or named once as too large for this broker
    wait_for(lambda: configs <= set(sent()) | set(named_in_log(log())), 120,
             what="every discovery config published or said to be too large")
    assert "max_packet_size" in log()  # it did meet the broker's limit (at least one config is over it)
    assert probe.reply("say", {"text": "届きました。", "id": "after"})["event"] == "finished"
    probe.publish("volume/set", "37")
    wait_for(lambda: probe.last("volume") == b"37", 10, what="the volume applied")
    drops = log().count("disconnected from MQTT broker")
    time.sleep(4)  # a connection the broker keeps closing would have fallen (and said so) again by now
    out = log()
    assert out.count("disconnected from MQTT broker") == drops, out

    late = retained(app.broker.port, ["homeassistant/#", f"{probe.prefix}/{probe.device}/#"])
    assert late.get(probe.topic("status")) == b"online", late
    assert late.get(probe.topic("volume")) == b"37", late
    published = {t for t in late if t in configs}
    named = named_in_log(out)
    assert len(named) == len(set(named)), out  # each said once
    assert published | set(named) == configs and not published & set(named), (published, named)
    assert drops <= len(named) + 1, out  # two drops for the first refused, one for each other
    assert len(published) >= 3, published  # the small ones (say, stop, state) fit

    # the limit it learned is under what was refused, never under what the broker took
    limits = [int(n) for n in re.findall(r"packets are held to (\d+) bytes", out)]
    took = max(packet_size(t, p) for t, p in sent().items())
    assert limits and min(limits) >= took, (limits, took, out)
    assert "another device" not in out
