"""prepare's progress, step by step: in the daemon's journal and systemd's STATUS while a
first start prepares (engine.decoder auto: the 8-bit decoder too), and in `hayakoe-pi check`
on a half-prepared cache, which it never prepares itself (the service may be at it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import FIXTURE_MODELS, REPO
from harness import AlsaSink, DaemonProcess, Mosquitto, NotifySocket, wait_for, write_config
from hayakoe_pi.models import prepare as prep
from hayakoe_pi.models.quantize import read_int8

VOICE = "tiny-voice"
STEPS = ["BERT 1/1: graph, optimized copy",
         f"voice {VOICE} 1/3: split, decoder forms, timings",
         f"voice {VOICE} 2/3: latents of 12 sentences for the 8-bit decoder",
         f"voice {VOICE} 3/3: 8-bit decoder: quantize, gate, timings"]


def test_a_first_start_logs_each_step_as_it_starts_and_ends_and_tells_systemd(tmp_path):
    broker = Mosquitto(tmp_path / "broker").start()
    sink = AlsaSink(tmp_path)
    notify = NotifySocket(tmp_path / "notify.sock")
    config = write_config(tmp_path / "config.yaml", broker.port, f"hk{broker.port}", tmp_path,
                          engine={"decoder": "auto"})
    # timed once, not best of 3 (as arm64-check): the 8-bit decoder's first start in less time
    daemon = DaemonProcess(config, sink.home, tmp_path / "daemon.log",
                           env={"NOTIFY_SOCKET": str(notify.path), "HAYAKOE_PI_TUNE_REPEATS": "1"})
    try:
        wait_for(lambda: notify.since(0, "READY=1") or daemon.proc.poll() is not None, 600, what="READY=1")
        log = daemon.output()
        assert daemon.proc.poll() is None, log
    finally:
        daemon.stop()
        notify.close()
        sink.stop()
        broker.stop()
    progress = [line.split("hayakoe_pi: ", 1)[1] for line in log.splitlines()
                if "hayakoe_pi: preparing " in line or "hayakoe_pi: prepared " in line]
    assert len(progress) == 2 * len(STEPS), log  # one line each, never one per window
    for i, step in enumerate(STEPS):
        assert progress[2 * i] == f"preparing {step}", progress
        assert progress[2 * i + 1].startswith(f"prepared {step} in ") and progress[2 * i + 1].endswith(" s")
    fields = [field for _, field in notify.received]
    status = [f for f in fields if f.startswith("STATUS=prepar")]
    assert [s for s in status if s.startswith("STATUS=preparing ")] == [f"STATUS=preparing {s}" for s in STEPS]
    assert len(status) == 2 * len(STEPS)
    # each step asks for more time than TimeoutStartSec, all before the service is ready
    extend = [i for i, f in enumerate(fields) if f.startswith("EXTEND_TIMEOUT_USEC=")]
    assert len(extend) == len(STEPS) and max(extend) < fields.index("READY=1")
    assert all(int(fields[i].split("=")[1]) > 180 * 1_000_000 for i in extend)


def _child(module: str, *args: str, derived) -> None:
    subprocess.run([sys.executable, "-m", module, "--models", str(FIXTURE_MODELS), "--derived", str(derived), *args],
                   check=True, capture_output=True, cwd=REPO)


@pytest.mark.prepares_models  # the 8-bit decoder made here
def test_check_lists_the_steps_done_and_to_do_and_a_start_goes_on_from_there(tmp_path):
    derived = tmp_path / "cache" / "models"
    # a start stopped after the latents, as TimeoutStartSec or a power cut would stop it
    _child("hayakoe_pi.models.make", "--bert", derived=derived)
    _child("hayakoe_pi.models.make", "--voice", VOICE, "--keep-weights", derived=derived)
    _child("hayakoe_pi.synthesis.calibrate", "--voice", VOICE, derived=derived)
    config = tmp_path / "config.yaml"
    config.write_text(f"models: {{dir: {FIXTURE_MODELS}}}\nvoice: {{name: {VOICE}}}\n"
                      f"cache: {{dir: {derived.parent}}}\nengine: {{decoder: auto}}\nmqtt: {{port: 1}}\n")
    out = subprocess.run([sys.executable, "-m", "hayakoe_pi.cli", "check", "--config", str(config)],
                         capture_output=True, text=True, cwd=REPO, timeout=120).stdout
    assert f"voice {VOICE}: not prepared yet in {derived}" in out, out
    listed = [line for line in out.splitlines() if line.startswith("ok   prepare: ")]
    assert listed == [f"ok   prepare: done: {s}" for s in STEPS[:3]] + [f"ok   prepare: to do: {STEPS[3]}"], out
    folder = prep.cached_split(prep.synthesizer_path(FIXTURE_MODELS, VOICE), derived).folder
    assert read_int8(folder) is None  # check made nothing

    ran = []
    prep.prepare(FIXTURE_MODELS, derived, [VOICE], decoder="auto",
                 progress=lambda stage, seconds: seconds is None and ran.append(stage.name()))
    assert ran == [STEPS[3]]  # neither the voice nor its latents made again
    assert read_int8(folder) is not None
    assert all(stage.done for what in ("bert", VOICE) for stage in prep.stages(FIXTURE_MODELS, derived, what, "auto"))
