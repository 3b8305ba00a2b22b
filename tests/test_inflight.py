"""The queue and the broker's in-flight window, as the README states them.

The broker hands the daemon's intake at most `max_inflight_messages` unacknowledged QoS 1
messages (mosquitto's default: 20) and keeps the rest, in order; a message is acknowledged only
with its last event, so the one being spoken holds a place in that window too.
"""

import json
import time

from harness import Mosquitto, Probe, running_daemon

LONG = "冷蔵庫のドアが開いています。閉めてください。" * 2  # ~5 s


def events(probe) -> list[dict]:
    found = []
    while not probe.events.empty():
        found.append(probe.events.get())
    return found


def burst(tmp_path, qos: int, extra_conf: str = "", **config) -> list[dict]:
    """26 messages at once, the first a long one, on the broker install.sh sets up; every event until
    each has its last (or 60 s)."""
    broker = Mosquitto(tmp_path / "broker", extra_conf=extra_conf, as_installed=True).start()
    prefix = f"hk{broker.port}"
    probe = Probe(broker.port, prefix)
    try:
        with running_daemon(tmp_path, broker.port, prefix, probe, sink_kwargs={"paced": False},
                            cache={"max_mb": 0}, **config):
            for i in range(26):
                payload = {"text": LONG if i == 0 else f"{i}番目のお知らせです。", "id": f"b{i}"}
                probe.client.publish(f"{prefix}/say", json.dumps(payload, ensure_ascii=False), qos=qos)
            seen, deadline = [], time.monotonic() + 120
            while time.monotonic() < deadline:
                seen += events(probe)
                done = {e["id"] for e in seen if e["event"] in ("finished", "error")}
                if {f"b{i}" for i in range(26)} <= done:
                    break
                time.sleep(0.2)
            return seen
    finally:
        probe.close()
        broker.stop()


def test_a_burst_of_26_at_qos_1_is_each_answered_in_order_the_overflow_refused(tmp_path):
    """The README said the queue (20) is never full of QoS 1 messages, as the broker's window (20)
    holds back the rest; a burst of 26 gave 4 `queue full`. mosquitto 2.0 (Debian 12's) keeps to
    its window only until the daemon answers the first message: then it hands over every message
    it held. So what is true: each message is answered, in order, and the overflow is refused
    with an error event, never dropped in silence."""
    seen = burst(tmp_path / "qos1", qos=1)
    finished = [e["id"] for e in seen if e["event"] == "finished"]
    refused = [e for e in seen if e["event"] == "error"]
    assert all(e["code"] == "queue_full" for e in refused), refused
    assert sorted(finished + [e["id"] for e in refused], key=lambda i: int(i[1:])) == [f"b{i}" for i in range(26)]
    assert finished == [f"b{i}" for i in range(len(finished))] and len(finished) >= 21, finished


def test_a_burst_of_26_at_qos_0_is_each_answered_the_overflow_refused(tmp_path):
    seen = burst(tmp_path / "qos0", qos=0)
    refused = [e for e in seen if e["event"] == "error"]
    assert refused and all(e["code"] == "queue_full" for e in refused), refused
    assert len(refused) + len([e for e in seen if e["event"] == "finished"]) == 26


def test_an_interrupt_behind_a_full_window_waits_for_the_message_being_spoken(tmp_path):
    """The README said "an interrupt still fits"; it does not when the window is full: the message
    being spoken holds a place in it, so with the window's worth in hand the interrupt waits in the
    broker until the spoken one ends. A window one larger than the queue leaves room for it."""
    for window, waits in ((4, True), (5, False)):
        broker = Mosquitto(tmp_path / f"broker-{window}", extra_conf=f"max_inflight_messages {window}\n",
                           as_installed=True).start()
        prefix = f"hk{broker.port}"
        probe = Probe(broker.port, prefix)
        try:
            with running_daemon(tmp_path / f"pi-{window}", broker.port, prefix, probe, queue={"max_length": 4}):
                probe.publish("say", {"text": LONG, "id": "long"})
                probe.next_event(event="started", id="long")
                for i in range(3):
                    probe.publish("say", {"text": f"{i}番目のお知らせです。", "id": f"q{i}"})
                probe.publish("say", {"text": "急ぎのお知らせです。", "id": "urgent", "interrupt": True})
                probe.next_event(event="started", id="urgent", timeout=60)
                log = [json.loads(p) for t, p, _ in list(probe.messages) if t == probe.topic("event")]
                order = [(e["event"], e["id"]) for e in log]
                assert ("queued", "urgent") in order
                if waits:  # queued only once the long one had its last event
                    assert order.index(("finished", "long")) < order.index(("queued", "urgent")), order
                else:  # at once, cutting the long one
                    assert order.index(("queued", "urgent")) < order.index(("finished", "long")), order
                    assert next(e for e in log if e["event"] == "finished" and e["id"] == "long")["interrupted"]
        finally:
            probe.close()
            broker.stop()
