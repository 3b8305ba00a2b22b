"""Which setting wins, the config or a change made over MQTT (settings/runtime.py): one rule, said in the
log at start and by `check`.

Before: state.json kept volume, voice and style whatever had changed, and silently overrode
config.yaml: with voice.name: voice-b in the config and voice-a in the state, `check` printed
voice-b and the daemon loaded voice-a (also after `install.sh --voice`).
"""

import json
import logging
import os
import subprocess
import sys
import time

from conftest import REPO
from harness import Mosquitto, Probe, running_daemon, wait_for, write_config
from hayakoe_pi.settings.announcements import AnnouncementSettings, QuietHours
from hayakoe_pi.speech.service import SavedSelection


def selection(path, volume=0.7, voice="tiny-voice", style="Neutral", **kw):
    return SavedSelection(path, volume, voice, style, **kw)


def test_a_change_over_mqtt_wins_while_the_config_says_what_it_said_then(tmp_path):
    state = tmp_path / "state.json"
    s = selection(state)
    assert s.describe() == "volume 70 % (config), voice tiny-voice (config), style Neutral (config)"
    s.volume = 0.4
    s.save()
    # only what changed is kept, with the config value it was made against
    assert json.loads(state.read_text()) == {"changes": {"volume": {"value": 0.4, "config": 0.7}}}
    again = selection(state)
    assert again.volume == 0.4
    assert again.describe().startswith("volume 40 % (set over MQTT; config says 70 %), voice tiny-voice (config)")


def test_a_changed_config_wins_over_an_older_change_and_the_change_is_dropped(tmp_path, caplog):
    state = tmp_path / "state.json"
    s = selection(state, voice="voice-x")
    s.volume, s.voice = 0.4, "voice-a"
    s.save()
    with caplog.at_level(logging.WARNING, logger="hayakoe_pi"):
        now = selection(state, voice="voice-b")  # the config's voice changed since: voice-x → voice-b
    assert (now.voice, now.volume) == ("voice-b", 0.4)  # the volume's config did not change: its change stays
    assert ("voice voice-a, set over MQTT when the config said voice-x, is dropped: the config says "
            "voice-b now, and wins") in caplog.text
    assert json.loads(state.read_text()) == {"changes": {"volume": {"value": 0.4, "config": 0.7}}}
    assert now.describe().endswith("voice voice-b (config), style Neutral (config)")
    # and back to the old config value: the dropped change does not come back
    assert selection(state, voice="voice-x").voice == "voice-x"


def test_a_change_back_to_the_configs_value_is_no_change(tmp_path):
    state = tmp_path / "state.json"
    s = selection(state)
    s.volume = 0.4
    s.save()
    s.volume = 0.7
    s.save()
    assert json.loads(state.read_text()) == {"changes": {}}
    assert selection(state, volume=0.5).volume == 0.5  # nothing left to win over a new config value


def test_a_state_file_of_an_older_version_counts_as_changes_only_if_newer_than_the_config(tmp_path):
    """Older versions kept every value, changed or not, without the config's: a value that differs
    from the config is a change made over MQTT if the file is newer than the config, else stale."""
    state, config = tmp_path / "state.json", tmp_path / "config.yaml"
    old = {"volume": 0.4, "voice": "voice-a", "style": "Neutral"}
    config.write_text("{}\n")
    state.write_text(json.dumps(old))
    os.utime(config, (time.time() - 60,) * 2)  # the config edited before HA's last change
    kept = selection(state, config_mtime=config.stat().st_mtime)
    assert (kept.volume, kept.voice, kept.style) == (0.4, "voice-a", "Neutral")
    assert json.loads(state.read_text()) == {"changes": {"volume": {"value": 0.4, "config": 0.7},
                                                         "voice": {"value": "voice-a", "config": "tiny-voice"}}}
    state.write_text(json.dumps(old))
    os.utime(state, (time.time() - 120,) * 2)  # the config edited after it (install.sh --voice)
    dropped = selection(state, config_mtime=config.stat().st_mtime)
    assert (dropped.volume, dropped.voice) == (0.7, "tiny-voice")
    assert json.loads(state.read_text()) == {"changes": {}}


def test_the_chime_and_quiet_hours_follow_the_same_rule(tmp_path):
    path = tmp_path / "announcements.json"
    quiet = QuietHours.parse({"from": "22:00", "to": "07:00", "volume": 30})
    a = AnnouncementSettings(path, "default", quiet)
    a.set("quiet_hours", b"OFF")
    assert json.loads(path.read_text()) == {"changes": {"quiet_hours": {"value": False, "config": True}}}
    assert AnnouncementSettings(path, "default", quiet).describe() == \
        "chime default (config), quiet_hours OFF (set over MQTT; config says ON)"
    a.set("chime", b"none")
    # the config's chime changed since: its value wins, the quiet hours switch is still Home Assistant's
    b = AnnouncementSettings(path, "none", quiet)
    assert (b.chime, b.quiet) == ("off", None)
    assert AnnouncementSettings(path, "default", quiet).chime == "default"  # the change was dropped for good


def run_cli(*args, home):
    env = dict(os.environ, PYTHONPATH=str(REPO), HOME=str(home))
    return subprocess.run([sys.executable, "-m", "hayakoe_pi.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_the_daemon_says_at_start_which_wins_and_check_shows_the_same(tmp_path):
    broker = Mosquitto(tmp_path / "broker").start()
    prefix = f"hk{broker.port}"
    probe = Probe(broker.port, prefix)
    work = tmp_path / "pi"
    work.mkdir()
    try:
        with running_daemon(work, broker.port, prefix, probe, audio={"volume": 0.7}) as app:
            assert "settings: volume 70 % (config), voice tiny-voice (config)" in app.daemon.output()
            probe.publish("volume/set", "40")
            probe.publish("voice/set", "tiny-voice-nodur")
            wait_for(lambda: probe.last("voice") == b"tiny-voice-nodur", 30, what="the voice set")
        r = run_cli("check", "--config", str(app.config), home=app.sink.home)
        assert "ok   setting: volume 40 % (set over MQTT; config says 70 %)\n" in r.stdout, r.stdout + r.stderr
        assert "ok   setting: voice tiny-voice-nodur (set over MQTT; config says tiny-voice)\n" in r.stdout

        # the config's volume changes: it wins over the older change, in check and in the daemon alike
        write_config(app.config, broker.port, prefix, work, audio={"volume": 0.5})
        r = run_cli("check", "--config", str(app.config), home=app.sink.home)
        assert "ok   setting: volume 50 % (config)\n" in r.stdout, r.stdout + r.stderr
        assert "ok   setting: voice tiny-voice-nodur (set over MQTT; config says tiny-voice)\n" in r.stdout
        probe.messages.clear()
        (work / "alsa.fifo").unlink()  # the sink's, made again
        with running_daemon(work, broker.port, prefix, probe, audio={"volume": 0.5}) as app:
            log = app.daemon.output()
            assert ("settings: volume 50 % (config), voice tiny-voice-nodur (set over MQTT; config says "
                    "tiny-voice), style Neutral (config)") in log, log
            assert ("volume 40 %, set over MQTT when the config said 70 %, is dropped: the config says 50 % "
                    "now, and wins") in log
            wait_for(lambda: probe.last("volume") is not None and probe.last("voice") is not None, 10,
                     what="the settings' states")
            assert (probe.last("volume"), probe.last("voice")) == (b"50", b"tiny-voice-nodur")
    finally:
        probe.close()
        broker.stop()
