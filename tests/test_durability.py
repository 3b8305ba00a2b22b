"""Nothing lost when the daemon or the broker dies (kill -9), and a torn state file.

A request is acknowledged to the broker only once it has its last event, so
whatever was queued or being spoken when the daemon died comes again.
"""

import json
from collections import Counter

import pytest

from hayakoe_pi.models.cpu import cpu_key

from harness import AlsaSink, DaemonProcess, Mosquitto, Probe, appliance, running_daemon, wait_for, write_config

SAMPLE_BYTES = 4  # float32 mono


def events_of(probe) -> list[dict]:
    return [json.loads(p) for t, p, _ in probe.messages if t == probe.topic("event")]


def count(events, kind) -> Counter:
    return Counter(e["id"] for e in events if e["event"] == kind)


def cut_mid_queue(tmp_path, texts: dict[str, str], stop) -> list[dict]:
    """Say `texts` (id → text), stop the daemon with `stop(daemon)` while the first plays and the
    rest wait, start it again as systemd would; every event once all are finished."""
    broker = Mosquitto(tmp_path / "broker").start()
    prefix = f"hk{broker.port}"
    probe = Probe(broker.port, prefix)
    sink = AlsaSink(tmp_path)
    config = write_config(tmp_path / "config.yaml", broker.port, prefix, tmp_path, cache={"max_mb": 0})
    ids = list(texts)
    daemon = DaemonProcess(config, sink.home, tmp_path / "first.log")
    try:
        wait_for(lambda: probe.last("status") == b"online", 90, what="the daemon to come online")
        for i, text in texts.items():
            probe.publish("say", {"id": i, "text": text})
        probe.next_event(event="started", id=ids[0], timeout=60)
        wait_for(lambda: sink.raw.stat().st_size > 0.3 * 44100 * SAMPLE_BYTES, 30, what="the first to be heard")
        wait_for(lambda: count(events_of(probe), "queued")[ids[-1]] == 1, 30, what="all queued")
        stop(daemon)
        assert not count(events_of(probe), "finished")
        daemon = DaemonProcess(config, sink.home, tmp_path / "second.log")
        wait_for(lambda: len(count(events_of(probe), "finished")) == len(ids), 180,
                 what="every message to be spoken after the restart")
    finally:
        daemon.stop()
        sink.stop()
        probe.close()
        broker.stop()
    events = events_of(probe)
    assert count(events, "finished") == {i: 1 for i in ids}
    assert [e["id"] for e in events if e["event"] == "finished"] == ids  # in the order sent
    # the cut one again from its start; the others once
    assert count(events, "started") == {i: 2 if i == ids[0] else 1 for i in ids}
    assert not [e for e in events if e["event"] in ("error", "duplicate")], events
    return events


def test_sigterm_mid_queue_acknowledges_nothing_unfinished(tmp_path):
    """systemctl restart during a queue: what was cut and what waited come back, each spoken once,
    in order, the cut one from its start (shutdown acknowledges none of them)."""
    texts = {"t0": "冷蔵庫のドアが開いています。閉めてください。" * 3,
             **{f"t{i}": f"{i}番目のお知らせです。" for i in range(1, 5)}}
    def sigterm(daemon):  # as systemctl restart sends it
        assert daemon.stop() == 0

    cut_mid_queue(tmp_path, texts, sigterm)


def test_kill_9_of_the_daemon_mid_queue_loses_nothing(tmp_path):
    def kill_9(daemon):  # as the OOM killer would
        daemon.proc.kill()
        daemon.proc.wait(10)

    texts = {f"m{i}": f"{i}番目のお知らせです。" for i in range(11)}  # one spoken, ten queued behind it
    events = cut_mid_queue(tmp_path, texts, kill_9)
    assert [(e["id"], e["text"]) for e in events if e["event"] == "interrupted"] == [("m0", "0番目のお知らせです。")]


@pytest.mark.broker_restart
def test_kill_9_of_the_broker_as_installed_loses_no_waiting_message(tmp_path):
    broker = Mosquitto(tmp_path / "broker", as_installed=True).start()
    prefix = f"hk{broker.port}"
    ids = ["w1", "w2", "w3"]
    probe = Probe(broker.port, prefix)
    with running_daemon(tmp_path / "first", broker.port, prefix, probe) as app:
        assert app.probe.reply("say", {"id": "w0", "text": "はい。"})["event"] == "finished"
    # the daemon is away (its sessions stay): requests wait in the broker for it
    for i in ids:
        probe.publish("say", {"id": i, "text": "お待たせしました。"})
    probe.close()
    broker.kill()
    broker.start()
    probe = Probe(broker.port, prefix)
    try:
        with running_daemon(tmp_path / "second", broker.port, prefix, probe):
            for i in ids:
                assert probe.next_event(event="finished", id=i, timeout=60)
    finally:
        probe.close()
        broker.stop()


def test_a_torn_state_file_is_reported_and_the_configs_values_used(tmp_path):
    state = tmp_path / "state" / "state.json"
    state.parent.mkdir()
    state.write_text('{"volume": 0.3, "voi')  # cut by a power failure
    with appliance(tmp_path) as app:
        assert app.probe.reply("say", "はい。")["event"] == "finished"
        wait_for(lambda: app.probe.last("volume") == b"100", 10, what="the config's volume")
        assert f"{state} cannot be read" in app.daemon.output()
        assert "the config's values are used" in app.daemon.output()
    assert json.loads(state.read_text()) == {"changes": {}}


def test_temporary_files_left_by_interrupted_writes_are_removed_at_start(tmp_path):
    """A stray .received.json.*.tmp was once left in the state folder after a stop (a write cut short)."""
    folder = tmp_path / "state"
    folder.mkdir()
    leftovers = [".received.json.k3j_x9ab.tmp", ".speaking.json.0a1b2c3d.tmp", ".state.json.zzzz_999.tmp"]
    for name in leftovers:
        (folder / name).write_text('{"rece')
    others = ["notes.tmp", ".received.json.tmp", "mine.json"]  # no write of ours is named so
    for name in others:
        (folder / name).write_text("kept")
    with appliance(tmp_path) as app:
        assert app.probe.reply("say", "はい。")["event"] == "finished"
        assert "removed 3 temporary files left in" in app.daemon.output()
        assert not [name for name in leftovers if (folder / name).exists()]
        assert all((folder / name).read_text() == "kept" for name in others)


def test_an_onnx_runtime_upgrade_prepares_again_and_speaks_what_was_sent_meanwhile(tmp_path):
    """`git pull && sudo ./install.sh` with another ONNX Runtime in the lock: the prepared models'
    CPU key changes, so the service prepares them again at its start; what was sent while it did
    waits in the broker and is spoken afterwards, in order."""
    broker = Mosquitto(tmp_path / "broker").start()
    prefix = f"hk{broker.port}"
    probe = Probe(broker.port, prefix)
    cache = {"dir": str(tmp_path / "cache"), "max_mb": 0}
    derived = tmp_path / "cache" / "models"
    ids = ["u1", "u2", "u3"]
    daemon = None
    try:
        with running_daemon(tmp_path / "before", broker.port, prefix, probe, cache=cache) as app:
            assert app.probe.reply("say", {"id": "u0", "text": "はい。"})["event"] == "finished"
        key = cpu_key()
        stale = list(derived.rglob(f"*.{key}.*"))
        assert stale
        for path in stale:  # as the ONNX Runtime before the upgrade would have named them
            path.rename(path.with_name(path.name.replace(key, "0older0ort0")))

        sink = AlsaSink(tmp_path / "after")
        config = write_config(tmp_path / "after" / "config.yaml", broker.port, prefix, tmp_path / "after", cache=cache)
        daemon = DaemonProcess(config, sink.home, tmp_path / "after" / "daemon.log")
        for i in ids:
            probe.publish("say", {"id": i, "text": "お待たせしました。"})
        assert probe.last("status") != b"online"  # sent before the service was ready
        for i in ids:
            assert probe.next_event(event="finished", id=i, timeout=180)
    finally:
        if daemon:
            daemon.stop()
            sink.stop()
        probe.close()
        broker.stop()
    finished = [e["id"] for e in events_of(probe) if e["event"] == "finished"]
    assert finished == ["u0", *ids]
    assert len(list(derived.rglob(f"*.{key}.*"))) == len(stale)  # made again for this ONNX Runtime
    assert not list(derived.rglob("*0older0ort0*"))  # and nothing stale left behind
