"""What the daemon says back stays small: a careless or hostile payload cannot make an event the
broker refuses, and so cannot cut the Pi (every Pi, on a household topic) off its broker.

The broker as the installer configures it (mosquitto/hayakoe-pi.conf: max_packet_size 65536), or
one stricter than that; the daemon as a subprocess on the test voice.
"""

import json
import time

import pytest

from harness import Mosquitto, Probe, appliance, running_daemon, wait_for

BACKSLASHES = "\\" * 30000  # 60 KB as JSON, under the broker's limit; JSON-escaped again, twice that


def statuses(probe) -> list[bytes]:
    return [p for t, p, _ in probe.messages if t == probe.topic("status")]


@pytest.fixture
def installed(tmp_path):
    """The daemon on a broker configured as install.sh configures it."""
    with appliance(tmp_path, broker_conf={"as_installed": True}) as app:
        yield app


def test_a_60_kb_dictionary_message_cuts_no_pi_off(installed):
    """Before: its refusal quoted the reading in full, 120 KB once JSON-escaped: the broker closed
    the connection at every resend, status flapped, the volume was never applied, the say's
    events were lost."""
    app, probe = installed, installed.probe
    probe.publish("dictionary/add", {"surface": "晴翔", "reading": BACKSLASHES, "accent": 1})
    refused = probe.next_event(event="error", code="bad_word", timeout=30)
    assert "too large" in refused["error"], refused
    probe.publish("volume/set", "37")
    wait_for(lambda: probe.last("volume") == b"37", 5, what="the volume applied")
    assert probe.reply("say", {"text": "音量を変えました。", "id": "after"})["event"] == "finished"
    time.sleep(2)  # a connection the broker closed would be back (and said so) by now
    assert statuses(probe) == [b"online"]  # never offline, never announced again
    assert "disconnected from MQTT broker" not in app.daemon.output()


def test_a_refused_word_is_quoted_cut_and_says_so(installed):
    """Under the dictionary payload's limit, the reading is still quoted only so far."""
    probe = installed.probe
    probe.publish("dictionary/add", {"surface": "晴翔", "reading": "\\" * 1000, "accent": 1})
    refused = probe.next_event(event="error", code="bad_word", timeout=30)
    assert "reading" in refused["error"] and "… (1000 characters)" in refused["error"], refused
    assert len(json.dumps(refused, ensure_ascii=False).encode()) < 2000, refused
    log = installed.daemon.output()
    assert "\\" * 1000 not in log and "… (1000 characters)" in log


def test_a_long_text_is_quoted_cut_and_says_so(installed):
    text = "長いお知らせです。" * 40  # 360 characters
    finished = installed.probe.reply("prepare", {"text": text, "id": "long"})  # not 70 s of playing
    assert finished["event"] == "finished", finished
    assert finished["text"] == text[:200] + "…" and finished["truncated"] is True, finished


def test_a_broker_stricter_than_the_bound_loses_one_event_and_no_more(tmp_path):
    """A broker that takes no packet over 1 KiB: the error answering 200 control characters
    (quoted, each escaped to 6 bytes: 1.4 KB) is refused, and the broker closes the connection.
    paho would send it again at every reconnect; it is dropped after two, said once, and what
    follows is cut to fit."""
    broker = Mosquitto(tmp_path / "broker", extra_conf="allow_anonymous true\nmax_packet_size 1024\n").start()
    prefix = f"hk{broker.port}"
    probe = Probe(broker.port, prefix)
    junk = "\x01" * 200
    try:
        with running_daemon(tmp_path, broker.port, prefix, probe) as app:
            probe.publish("say", junk)
            log = app.daemon.output
            wait_for(lambda: "closed the connection each time" in log(), 30, what="the refused event dropped")
            probe.publish("volume/set", "37")
            wait_for(lambda: probe.last("volume") == b"37", 5, what="the volume applied")
            assert probe.reply("say", {"text": "音量を変えました。", "id": "after"})["event"] == "finished"
            cut = probe.reply("say", junk)  # the same answer again: now cut to fit
            assert cut["event"] == "error" and cut["truncated"] is True, cut
            drops = log().count("disconnected from MQTT broker")
            time.sleep(3)
            assert log().count("disconnected from MQTT broker") == drops == 2, log()
            assert log().count("closed the connection each time") == 1
            assert "another device" not in log()
            assert statuses(probe)[-1] == b"online"
    finally:
        probe.close()
        broker.stop()


def test_nothing_over_the_bound_is_published():
    """The one place every publish passes: an event is cut to fit (and says so), after JSON
    escaping, counting UTF-8 bytes; anything else too large is not sent."""
    from hayakoe_pi.bounds import MAX_PUBLISH_BYTES, bounded_payload

    event = {"event": "error", "device": "pi", "id": "x", "code": "internal", "error": "\\" * 20000,
             "problems": ["晴" * 3000] * 50}
    data, cut = bounded_payload(event, cuttable=True)
    assert cut and len(data) <= MAX_PUBLISH_BYTES
    cut = json.loads(data)
    assert cut["truncated"] is True and cut["event"] == "error" and cut["code"] == "internal", cut
    assert cut["error"].startswith("\\" * 16)
    small = {"event": "finished", "id": "a", "text": "はい。"}
    assert bounded_payload(small, cuttable=True) == (json.dumps(small, ensure_ascii=False).encode(), False)
    assert bounded_payload({"config": "x" * MAX_PUBLISH_BYTES}, cuttable=False) == (None, False)
    assert bounded_payload("online", cuttable=False) == (b"online", False)


def test_an_error_reason_is_cut_where_every_error_is_made():
    """Whatever a reason embeds (an exception's message, a value), the event and the journal line
    (Reports.error logs the event's reason) quote it up to REASON_CHARS."""
    from hayakoe_pi.bounds import REASON_CHARS
    from hayakoe_pi.broker.payloads import error_event

    answer = error_event("internal error: ValueError: " + "x" * 5000, text="あ" * 300, code="internal")
    assert len(answer["error"]) < REASON_CHARS + 40 and answer["error"].endswith("… (5028 characters)"), answer
    assert answer["text"] == "あ" * 200 + "…" and answer["truncated"] is True


def test_an_answer_quoting_text_utf_8_cannot_hold_is_still_sent():
    """A lone surrogate (JSON's "\\ud800": a JavaScript string cut inside an emoji) in what an
    event quotes is replaced by U+FFFD. Before: the event could not be encoded, so the message
    it answered got no answer at all."""
    from hayakoe_pi.bounds import bounded_payload, quoted
    from hayakoe_pi.broker.payloads import error_event

    answer = error_event("unknown field '\ud800'", "sur", "テスト\ud800です", "bad_payload")
    assert answer["text"] == "テスト\ufffdです" and answer["error"] == "unknown field '\ufffd'", answer
    data, cut = bounded_payload({"event": "finished", "id": "\udfff", "text": "あ\ud83d"}, cuttable=True)
    assert json.loads(data.decode("utf-8")) == {"event": "finished", "id": "\ufffd", "text": "あ\ufffd"} and not cut
    assert bounded_payload("テ\ud800", cuttable=False) == ("テ\ufffd".encode(), False)
    assert quoted("😀\ud800" * 300).startswith("😀\ufffd")
