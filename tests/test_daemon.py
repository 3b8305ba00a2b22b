"""End to end: real mosquitto, the daemon as a subprocess, ALSA writing to a file."""

import json
import os
import socket
import stat
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from conftest import REPO
from harness import ENTITIES, AlsaSink, Mosquitto, Probe, appliance, free_port, settle, wait_for, write_config

LONG_TEXT = "冷蔵庫のドアが開いています。閉めてください。" * 4


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with appliance(tmp_path_factory.mktemp("appliance"), queue={"max_length": 3, "max_text_chars": 300}) as app:
        yield app


def test_speaks_a_plain_text_message(app):
    settle(app)
    before = app.sink.raw.stat().st_size
    app.probe.publish("say", "お風呂が沸きました。")
    queued = app.probe.next_event(event="queued", text="お風呂が沸きました。")
    app.probe.next_event(event="started", id=queued["id"])
    app.probe.next_event(event="finished", id=queued["id"])
    settle(app)
    pcm = np.frombuffer(app.sink.raw.read_bytes()[before:], dtype="<f4")
    assert pcm.size > 0.3 * 44100
    assert np.all(np.isfinite(pcm)) and 0.001 < np.abs(pcm).max() <= 1.0


def test_status_and_state_are_retained(app):
    late = Probe(app.broker.port, app.prefix)  # a newcomer sees the retained values
    try:
        wait_for(lambda: late.last("status") == b"online" and late.last("state") is not None
                 and late.last("volume") is not None and late.last("voice") is not None, 10,
                 what="retained status, state and settings")
        assert all(retain for topic, _, retain in late.messages if topic.endswith("/status"))
        assert late.last("volume") is not None and late.last("voice") == b"tiny-voice"
    finally:
        late.close()


def test_json_request_with_settings_and_id(app):
    app.probe.publish("say", {"text": "ジュースを冷やしておきました。", "id": "json-1", "style": "Happy",
                              "speed": 1.3, "volume": 40})
    app.probe.next_event(event="queued", id="json-1")
    assert app.probe.next_event(event="finished", id="json-1")["text"] == "ジュースを冷やしておきました。"


@pytest.mark.parametrize("payload, reason", [
    (b"\xff\xfe\xfa", "UTF-8"),
    (b"", "empty"),
    (b"   \n ", "empty"),
    (b'{"text": 5}', "'text' must be a string"),
    (b'{"text": "x", "voice": "../../etc/passwd"}', "unknown voice"),
    (b'{"text": "x", "style": "Sleepy"}', "unknown style"),
    (b'{"text": "x", "speed": 100}', "speed"),
    (b'{"text": "x", "volume": "loud"}', "volume"),
    (b'{"text": "x", "interrupt": "yes"}', "interrupt"),
    (b'{"text": "x", "color": "red"}', "unknown field"),
    (b'{"text": {"nested": 1}}', "'text' must be a string"),
    (b'{"text": "x"', "invalid JSON"),
    (b'{"text": "x", "id": true}', "id must be"),
    ("あ" * 301, "too long"),
    ("ベル\x07です", "control characters"),
    ("😊🎉", "nothing to speak"),
    ("。。。！", "nothing to speak"),
    ("市場《いちば》です", "must be katakana: 市場《イチバ》"),
])
def test_unspeakable_payloads_get_an_error_and_the_next_is_spoken(app, payload, reason):
    error = app.probe.reply("say", payload)  # the answer to this payload, not any error
    assert error["event"] == "error" and reason in error["error"], error
    after = f"after-{uuid.uuid4().hex[:12]}"  # a free port may come again: its id would be a duplicate
    app.probe.publish("say", {"text": "はい。", "id": after})
    ok = app.probe.next_event(event="finished", id=after)
    assert ok["text"] == "はい。"
    assert app.daemon.proc.poll() is None


def hearing(app, seconds: float = 0.3) -> None:
    """Wait until the card has played `seconds` more: speech is under way."""
    played = app.sink.played_seconds()
    wait_for(lambda: app.sink.played_seconds() > played + seconds, 30, what=f"{seconds:g} s of speech played")


def test_stop_cuts_speech_and_clears_the_queue(app):
    settle(app)
    app.probe.publish("say", {"text": LONG_TEXT, "id": "long-1"})
    app.probe.publish("say", {"text": "一つ目。", "id": "q-1"})
    app.probe.publish("say", {"text": "二つ目。", "id": "q-2"})
    app.probe.next_event(event="started", id="long-1")
    hearing(app)
    started = time.monotonic()
    app.probe.publish("stop", "stop")
    finished, *cancelled = app.probe.expect({"event": "finished", "id": "long-1"},
                                            {"event": "error", "id": "q-1"}, {"event": "error", "id": "q-2"})
    assert finished.get("interrupted") is True
    assert time.monotonic() - started < 3
    assert all("cancelled" in e["error"] for e in cancelled)
    settle(app)


def test_interrupt_speaks_now(app):
    settle(app)
    app.probe.publish("say", {"text": LONG_TEXT, "id": "long-2"})
    app.probe.next_event(event="started", id="long-2")
    hearing(app)
    app.probe.publish("say", {"text": "緊急のお知らせです。", "id": "urgent", "interrupt": True})
    assert app.probe.next_event(event="finished", id="long-2").get("interrupted") is True
    app.probe.next_event(event="started", id="urgent")
    assert "interrupted" not in app.probe.next_event(event="finished", id="urgent")


def test_full_queue_refuses_with_an_error(app):
    settle(app)
    app.probe.publish("say", {"text": LONG_TEXT, "id": "long-3"})
    app.probe.next_event(event="started", id="long-3")
    for i in range(3):  # max_length is 3
        app.probe.publish("say", {"text": f"待ち{i}番目。", "id": f"wait-{i}"})
    app.probe.publish("say", {"text": "入りません。", "id": "overflow"})
    assert "queue full" in app.probe.next_event(event="error", id="overflow")["error"]
    app.probe.publish("stop", "")
    settle(app)


def test_repeats_come_from_the_cache(app):
    text = "玄関の鍵が開いたままです。"
    app.probe.publish("say", {"text": text, "id": "c-1"})
    assert app.probe.next_event(event="finished", id="c-1")["cached"] is False
    app.probe.publish("say", {"text": text, "id": "c-2"})
    assert app.probe.next_event(event="finished", id="c-2")["cached"] is True
    files = list((app.work / "cache").glob("*.f32"))
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)


def test_prepare_fills_the_cache_without_playing(app):
    settle(app)
    app.sink.reset_records()
    before = app.sink.raw.stat().st_size
    app.probe.publish("prepare", {"text": "まもなく会議が始まります。", "id": "p-1"})
    assert app.probe.next_event(event="finished", id="p-1")["prepare"] is True
    app.probe.publish("say", {"text": "まもなく会議が始まります。", "id": "p-2"})
    said = app.probe.next_event(event="finished", id="p-2")
    assert said["cached"] is True
    wait_for(lambda: [o for o in app.sink.opens if o.first_data] and app.sink.opens[-1].eof, 30,
             what="the card to play it all")
    # the card played once, the say's audio and no more: the prepare played nothing
    assert len([o for o in app.sink.opens if o.first_data]) == 1, app.sink.opens
    played = (app.sink.raw.stat().st_size - before) / 4 / 44100
    assert abs(played - said["seconds"]) <= 0.05, (played, said)


def test_settings_are_validated_persisted_and_retained(app):
    probe = app.probe
    wait_for(lambda: all(probe.last(n) is not None for n in ("volume", "voice", "style")), 10,
             what="the settings")
    initial = {n: probe.last(n) for n in ("volume", "voice", "style")}
    try:
        _change_settings(app)
    finally:  # the tests after this one hear the module's daemon as it was
        for name in ("voice", "style", "volume"):  # the style after the voice: it must be one of its
            if probe.last(name) != initial[name]:
                probe.publish(f"{name}/set", initial[name])
                wait_for(lambda: probe.last(name) == initial[name], 30, what=f"{name} restored")


def _change_settings(app):
    probe = app.probe
    probe.publish("volume/set", "35")
    wait_for(lambda: probe.last("volume") == b"35", 10, what="volume state")
    error = probe.reply("volume/set", "150")
    assert error["event"] == "error" and "volume" in error["error"], error
    probe.publish("voice/set", "tiny-voice-nodur")
    wait_for(lambda: probe.last("voice") == b"tiny-voice-nodur", 30, what="voice state")
    error = probe.reply("voice/set", "no-such-voice")
    assert error["event"] == "error" and "unknown voice" in error["error"], error
    probe.publish("style/set", "Angry")
    wait_for(lambda: probe.last("style") == b"Angry", 10, what="style state")
    state = json.loads((app.work / "state" / "state.json").read_text())
    assert state == {"changes": {"volume": {"value": 0.35, "config": 1.0},  # each with the config's value then
                                 "voice": {"value": "tiny-voice-nodur", "config": "tiny-voice"},
                                 "style": {"value": "Angry", "config": "Neutral"}}}
    assert stat.S_IMODE((app.work / "state" / "state.json").stat().st_mode) == 0o600
    probe.publish("say", {"text": "声が変わりました。", "id": "v-1"})
    probe.next_event(event="finished", id="v-1")


def test_home_assistant_discovery(app):
    app.probe.client.publish("homeassistant/status", "online", qos=1).wait_for_publish(5)
    node = "pi"  # device.id

    def configs():
        found = {}
        for topic, payload, retained in app.probe.messages:
            if topic.startswith("homeassistant/") and topic.endswith("/config") and payload:
                found[topic] = json.loads(payload)
        return found if len(found) >= ENTITIES else None

    found = wait_for(configs, 10, what="discovery")
    by_kind = {t.split("/")[1] + ":" + t.split("/")[3]: c for t, c in found.items() if t.split("/")[2] == node}
    assert set(by_kind) == {"notify:say", "sensor:state", "number:volume", "select:voice",
                            "select:style", "button:stop", "select:chime", "switch:quiet_hours",
                            "sensor:disk_free", "binary_sensor:disk_low"}
    for config in by_kind.values():
        assert config["availability_topic"] == f"{app.prefix}/pi/status"
        assert config["device"]["identifiers"] == [node]
        assert config["unique_id"].startswith(node)
    assert by_kind["notify:say"]["command_topic"] == f"{app.prefix}/pi/say"  # this room's
    assert by_kind["number:volume"]["command_topic"] == f"{app.prefix}/pi/volume/set"
    assert by_kind["select:voice"]["options"] == ["tiny-voice", "tiny-voice-nodur"]
    assert "Neutral" in by_kind["select:style"]["options"]
    assert by_kind["button:stop"]["command_topic"] == f"{app.prefix}/pi/stop"
    assert by_kind["select:chime"]["options"] == ["off", "default"]
    assert by_kind["switch:quiet_hours"]["command_topic"] == f"{app.prefix}/pi/quiet_hours/set"
    late = Probe(app.broker.port, app.prefix)  # retained, so a restarted HA finds them too
    try:
        wait_for(lambda: sum(1 for t, _, r in late.messages if r and t.endswith("/config") and t.split("/")[2] == node) >= ENTITIES,
                 10, what="retained discovery")
    finally:
        late.close()


def test_sigterm_goes_offline_and_exits(tmp_path):
    with appliance(tmp_path) as app:  # its own daemon: it ends it
        app.probe.publish("say", {"text": LONG_TEXT, "id": "term"})
        app.probe.next_event(event="started", id="term")
        started = time.monotonic()
        assert app.daemon.stop() == 0
        assert time.monotonic() - started < 2.5
        wait_for(lambda: app.probe.last("status") == b"offline", 5, what="offline status")


# --- start-up errors: no broker needed ---------------------------------------------------

def run_cli(*args, home=None, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if home:
        env["HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "hayakoe_pi.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


@pytest.mark.parametrize("change, words", [
    ({"mqtt": {"hots": "x"}}, ["mqtt.hots", "known keys"]),
    ({"mqtt": {"port": "many"}}, ["mqtt.port", "integer"]),
    ({"voice": {"speed": True}}, ["voice.speed", "number"]),
    ({"audio": {"volume": 3}}, ["audio.volume", "between"]),
    ({"models": {"dir": "/nonexistent/models"}}, ["models.dir", "/nonexistent/models", "install"]),
    ({"voice": {"name": "jvnv-F1-jp"}}, ["voice.name", "jvnv-F1-jp", "tiny-voice"]),
    ({"voice": {"style": "Sleepy"}}, ["voice.style", "Sleepy", "Neutral"]),
])
def test_bad_config_stops_with_a_message(tmp_path, change, words):
    config = write_config(tmp_path / "c.yaml", free_port(), "bad", tmp_path, **change)
    r = run_cli("run", "--config", str(config))
    assert r.returncode == 2
    for w in words:
        assert w in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_config_that_is_not_yaml(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("mqtt: [unclosed\n")
    r = run_cli("run", "--config", str(bad))
    assert r.returncode == 2 and "not valid YAML" in r.stderr


def test_missing_config_file(tmp_path):
    r = run_cli("check", "--config", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "config file not found" in r.stderr


def test_check_reports_broker_and_audio(tmp_path):
    broker = Mosquitto(tmp_path / "broker").start()
    sink = AlsaSink(tmp_path)
    try:
        good = write_config(tmp_path / "good.yaml", broker.port, "chk", tmp_path)
        assert run_cli("prepare", "--config", str(good)).returncode == 0  # check itself never prepares
        r = run_cli("check", "--config", str(good), home=sink.home)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "ok   mqtt" in r.stdout and "ok   audio" in r.stdout and "ok   models" in r.stdout
        assert "ok   decoder: decoder " in r.stdout and "chosen on this CPU" in r.stdout  # the tuning
        assert "ok   bert: 8-bit " in r.stdout  # how its products are made exact here
        with socket.socket() as closed:
            # bound but not listening: refused, and never someone's ephemeral port (a free
            # port can be the checker's own source port, and TCP then connects to itself)
            closed.bind(("127.0.0.1", 0))
            bad = write_config(tmp_path / "bad.yaml", closed.getsockname()[1], "chk", tmp_path,
                               audio={"device": "no-such-card"})
            r = run_cli("check", "--config", str(bad), home=sink.home)
        assert r.returncode == 1
        assert "FAIL mqtt" in r.stdout and "cannot reach broker" in r.stdout
        assert "FAIL audio" in r.stdout and "no-such-card" in r.stdout
    finally:
        broker.stop()
        sink.stop()


def test_forget_takes_the_device_out_of_home_assistant(tmp_path):
    """`hayakoe-pi forget` (install.sh --uninstall): no retained discovery config, status,
    state or setting is left for Home Assistant or any later subscriber."""
    def retained(port, prefix, settle_s=1.0):
        newcomer = Probe(port, prefix)  # a new subscriber is handed only what is retained
        time.sleep(settle_s)
        newcomer.close()
        return {t for t, payload, kept in newcomer.messages if kept and payload}

    def announced(topics, prefix):
        # status and state are retained before the discovery configs: wait for all of them
        return any(t.startswith("homeassistant/") and t.endswith("/config") for t in topics) \
            and {f"{prefix}/pi/status", f"{prefix}/pi/volume"} <= topics

    with appliance(tmp_path) as app:
        wait_for(lambda: announced(retained(app.broker.port, app.prefix, 0.5), app.prefix), 30,
                 what="retained discovery configs, status and volume")
        app.daemon.stop()
        cli = [sys.executable, "-m", "hayakoe_pi.cli", "forget", "--config", str(app.config)]
        r = subprocess.run(cli, capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert r.returncode == 0, r.stderr
        assert "removed the device from Home Assistant" in r.stdout
        assert retained(app.broker.port, app.prefix) == set()
        app.broker.stop()
        r = subprocess.run(cli, capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert r.returncode == 1 and "cannot reach broker" in r.stderr and "Traceback" not in r.stderr


def test_the_birth_topic_is_its_own_setting(tmp_path):
    """Home Assistant says `online` on homeassistant/status whatever the discovery prefix: configurable."""
    with appliance(tmp_path, make_probe=lambda port, prefix: Probe(port, prefix, discovery_prefix="hk-discovery"),
                   mqtt={"discovery_prefix": "hk-discovery", "birth_topic": "hk-ha/birth"}) as app:
        def announced():
            return sum(1 for t, _, _ in app.probe.messages if t.startswith("hk-discovery/") and t.endswith("/config"))

        wait_for(lambda: announced() >= ENTITIES, 10, what="discovery under the configured prefix")
        before = announced()
        app.probe.client.publish("hk-discovery/status", "online", qos=1).wait_for_publish(5)  # not the birth topic
        app.probe.client.publish("hk-ha/birth", "online", qos=1).wait_for_publish(5)
        app.probe.publish("volume/set", "50")  # handled after both, on the same connection
        wait_for(lambda: app.probe.last("volume") == b"50", 10, what="the volume after the birth messages")
        assert announced() == before + ENTITIES  # announced again once: for the birth topic alone
