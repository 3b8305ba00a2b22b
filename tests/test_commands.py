"""The control thread under a burst: settings never wait behind the words, a burst of words is
compiled once and each message still answered in order, and a full queue answers `busy`.

The real daemon and a real mosquitto, as in test_daemon.
"""

import json
import re
import time

import pytest
import yaml

from harness import appliance, wait_for

BURST = 40
WAITING = 100  # commands.MAX_WAITING: a burst well over it must meet a full queue


def word(i: int) -> dict:
    return {"surface": f"単語{i}", "reading": "タンゴ", "accent": 0}


def compiles(app) -> int:
    return len(re.findall(r"dictionary: \d+ changes? compiled in \d+ ms", app.daemon.output()))


def burst(app, payloads) -> None:
    """Hand every payload to paho at once (no wait for each): they reach the daemon back to back."""
    for payload in payloads:
        app.probe.client.publish(app.probe.topic("dictionary/add"), json.dumps(payload, ensure_ascii=False), qos=1)


def answers(app, count: int, timeout: float) -> list[dict]:
    """The next `count` dictionary and error events, in the order they came, all within `timeout`."""
    found, deadline = [], time.monotonic() + timeout
    while len(found) < count:
        event = app.probe.next_event(timeout=max(0.0, deadline - time.monotonic()))
        if event["event"] in ("dictionary", "error"):
            found.append(event)
    return found


# Each compile at least as slow as on a Pi (2 CPU-seconds, in the compiler's process): the volume
# comes while the words are compiled, and must not wait for them.
PI_COMPILE = {"HAYAKOE_PI_TEST_COMPILE_CPU": "2.0"}


@pytest.mark.parametrize("env", [None, PI_COMPILE], ids=["here", "slow_compile"])
def test_a_setting_does_not_wait_behind_a_burst_of_words(tmp_path, env):
    with appliance(tmp_path, env=env, dictionary={"file": str(tmp_path / "dictionary.yaml")}) as app:
        wait_for(lambda: app.probe.last("volume") is not None, 10, what="the volume")
        payloads = [word(i) for i in range(BURST)]
        payloads.insert(BURST // 2, {"surface": "晴翔", "reading": "はると", "accent": 1})  # refused alone
        app.probe.drain()
        burst(app, payloads)
        app.probe.publish("volume/set", "37")  # after the burst, on the same connection: the daemon has it last
        sent = time.monotonic()
        wait_for(lambda: app.probe.last("volume") == b"37", 60, interval=0.02, what="the volume")
        waited = time.monotonic() - sent
        got = answers(app, len(payloads), timeout=120)
        # each its own answer, in the order sent: every word added, the bad one refused alone
        assert [e.get("surface") for e in got] == [p["surface"] if p["reading"] == "タンゴ" else None
                                                   for p in payloads]
        assert all(e["action"] == "added" for e in got if e["event"] == "dictionary")
        refused = got[BURST // 2]
        assert refused["event"] == "error" and refused["code"] == "bad_word" and "katakana" in refused["error"]
        # a second here on 2 loaded cores (10.4 s when one thread compiled the words one by one)
        assert waited < 2.0, f"the volume took {waited:.1f} s behind {BURST} dictionary changes"
        assert 1 <= compiles(app) <= 5, app.daemon.output()[-3000:]
        assert len(yaml.safe_load((tmp_path / "dictionary.yaml").read_text())) == BURST


def test_a_full_command_queue_answers_busy(tmp_path):
    count = WAITING * 6
    with appliance(tmp_path, dictionary={"file": str(tmp_path / "dictionary.yaml")}) as app:
        app.probe.drain()
        burst(app, [word(i) for i in range(count)])
        got = answers(app, count, timeout=90)  # every one answered: none dropped
        busy = [e for e in got if e["event"] == "error"]
        assert busy, "a burst of 600 changes never met a full queue"
        assert all(e["code"] == "busy" and f"{WAITING} waiting" in e["error"] for e in busy), busy[:3]
        assert all(e["action"] == "added" for e in got if e["event"] == "dictionary")
        # a thing repeated is logged once (per time the queue fills), not once per refusal
        logged = app.daemon.output().count("queue is full")
        assert 1 <= logged <= 3 < len(busy), app.daemon.output()[-3000:]
        # and the daemon still takes commands
        app.probe.publish("volume/set", "42")
        wait_for(lambda: app.probe.last("volume") == b"42", 10, what="the volume after the burst")
