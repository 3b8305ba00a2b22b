"""hayakoe-pi prepare: derived model files made once, each model in a child process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURE_MODELS, REPO
from harness import cpu_cgroup_available, cpu_limited, memory_cgroup_available, run_with_memory_limit
from hayakoe_pi.synthesis.engine import Engine
from hayakoe_pi.models import make, tune
from hayakoe_pi.models import prepare as prep
from hayakoe_pi.models.cpu import cpu_key
from hayakoe_pi.models.split import SPLIT_VERSION
from hayakoe_pi.models.store import ModelStore
from hayakoe_pi.models.tune import TUNING_VERSION
from hayakoe_pi.models.unsigned import signed_int8_products_exact

VOICE = "tiny-voice"
TEXT = "おはようございます。今日は晴れです。"
QUIET = dict(noise=0.0, noise_w=0.0)
pytestmark = pytest.mark.prepares_models


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def test_each_model_is_prepared_in_a_child_once_then_loaded_without_one(tmp_path, monkeypatch):
    steps = prep.prepare(FIXTURE_MODELS, tmp_path)
    assert [s.what for s in steps] == ["bert", "tiny-voice", "tiny-voice-nodur"]
    assert all(not s.done and s.peak_mb > 10 for s in steps)  # the child's own peak
    made = _files(tmp_path)
    assert not [f for f in made if f.endswith(".tmp")]

    again = prep.prepare(FIXTURE_MODELS, tmp_path)
    assert all(s.done for s in again) and _files(tmp_path) == made  # a second run does nothing

    def no_child(*args, **kwargs):
        raise AssertionError("a prepared store started a child")

    monkeypatch.setattr(subprocess, "run", no_child)
    store = ModelStore(FIXTURE_MODELS, derived_dir=tmp_path)
    assert Engine(FIXTURE_MODELS, voice=VOICE, store=store).synthesize(TEXT, **QUIET).size
    assert _files(tmp_path) == made


def test_a_store_prepares_what_is_missing_in_children(tmp_path):
    store = ModelStore(FIXTURE_MODELS, derived_dir=tmp_path)
    store.voice(VOICE)
    assert not prep.missing(FIXTURE_MODELS, tmp_path, "bert")
    assert not prep.missing(FIXTURE_MODELS, tmp_path, VOICE)
    assert prep.missing(FIXTURE_MODELS, tmp_path, "tiny-voice-nodur")  # never asked for


def test_a_killed_preparation_is_redone_never_trusted(tmp_path):
    """kill -9 at several moments of a voice's preparation: whatever it left, the next
    preparation gives a voice that speaks exactly as one prepared in one go."""
    reference = tmp_path / "reference"
    prep.prepare(FIXTURE_MODELS, reference, [VOICE])
    want = Engine(FIXTURE_MODELS, voice=VOICE, store=ModelStore(FIXTURE_MODELS, derived_dir=reference)) \
        .synthesize(TEXT, **QUIET)
    cmd = [sys.executable, "-m", "hayakoe_pi.models.make", "--models", str(FIXTURE_MODELS)]
    left_unfinished = 0
    for i, after in enumerate((0.8, 1.4, 2.0, 2.6)):
        derived = tmp_path / f"killed-{i}"
        prep.prepare(FIXTURE_MODELS, derived, [])  # BERT
        child = subprocess.Popen([*cmd, "--derived", str(derived), "--voice", VOICE], cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(after)
        killed = child.poll() is None
        os.kill(child.pid, signal.SIGKILL) if killed else None
        child.wait()
        if killed and prep.missing(FIXTURE_MODELS, derived, VOICE):
            left_unfinished += 1
            redone = prep.prepare(FIXTURE_MODELS, derived, [VOICE])
            assert not redone[1].done
        store = ModelStore(FIXTURE_MODELS, derived_dir=derived)
        got = Engine(FIXTURE_MODELS, voice=VOICE, store=store).synthesize(TEXT, **QUIET)
        assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5, after
    assert left_unfinished, "no kill landed before the preparation had finished: kill sooner"


def test_preparation_fits_a_memory_limit_and_says_so_when_it_does_not(tmp_path):
    why = memory_cgroup_available()
    if why:
        pytest.skip(why)
    cmd = [sys.executable, "-m", "hayakoe_pi.cli", "prepare", "--models", str(FIXTURE_MODELS)]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "fits")}
    done, group_peak = run_with_memory_limit(cmd, 400, env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    steps = {m.group(1): float(m.group(2))
             for m in re.finditer(r"^(BERT|voice [\w-]+): prepared in .* peak memory (\d+) MB", done.stdout, re.M)}
    assert set(steps) == {"BERT", "voice tiny-voice", "voice tiny-voice-nodur"}, done.stdout
    # the steps ran inside the group: its peak is of their size (their RSS also counts shared
    # libraries the group was not charged for), and well under the limit, not pressed against it
    assert 0.5 * max(steps.values()) <= group_peak < 0.8 * 400, (steps, group_peak)
    assert not prep.missing(FIXTURE_MODELS, tmp_path / "fits" / "hayakoe-pi" / "models", VOICE)
    # room for the parent (the CLI with what it imports), not for a step: the child is killed,
    # the parent lives and says why
    _, parent = run_with_memory_limit([sys.executable, "-c", "import hayakoe_pi.cli.main, hayakoe_pi.models.prepare"],
                                      400, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    limit = int(parent + min(steps.values()) / 2)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "too-small")}
    done, _ = run_with_memory_limit(cmd, limit, env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode != 0 and "out of memory?" in done.stderr, (limit, parent, done.returncode, done.stderr)


def test_the_tuner_keeps_the_fastest_form_that_gives_the_same_samples():
    same = {"1d": 0.0, "2d": 3e-6}
    assert tune.choose_form({"1d": [0.30, 1.20], "2d": [0.28, 1.10]}, same) == "2d"
    assert tune.choose_form({"1d": [0.30, 1.10], "2d": [0.28, 1.20]}, same) == "1d"  # the whole time counts
    assert tune.choose_form({"1d": [0.30, 1.20], "2d": [0.30, 1.20]}, same) == "1d"  # a tie keeps the cut
    assert tune.choose_form({"1d": [0.30, 1.20], "2d": [0.10, 0.40]}, {"1d": 0.0, "2d": 2e-4}) == "1d"
    assert tune.choose_form({"1d": [0.30, 1.20], "2d": [0.10, 0.40]}, {"1d": 0.0}) == "1d"  # never compared


def test_the_tuner_takes_two_decoder_lanes_only_where_they_are_clearly_faster():
    # seconds a frame kept: one window after another on every core, and two lanes at once
    assert tune.choose_lanes(1.0, 0.85, threads=2) == 2
    assert tune.choose_lanes(1.0, 0.95, threads=2) == 2  # 5 % sooner
    assert tune.choose_lanes(1.0, 0.97, threads=2) == 1  # not worth a second window's memory
    assert tune.choose_lanes(1.0, 1.20, threads=2) == 1  # slower at once
    assert tune.choose_lanes(1.0, 0.60, threads=1) == 1  # one core: nothing to share out


def _threads_in(group: Path) -> int:
    """cpu_threads() as a process started inside cgroup `group` finds it."""
    def join():
        (group / "cgroup.procs").write_text(str(os.getpid()))

    done = subprocess.run([sys.executable, "-c", "from hayakoe_pi.models.cpu import cpu_threads; print(cpu_threads())"],
                          preexec_fn=join, capture_output=True, text=True, check=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return int(done.stdout)


def test_the_threads_follow_the_cpu_quota_not_only_the_cores():
    """In a container given fewer CPUs than the board has (--cpus, CPUQuota), the threads,
    the lanes shared out of them and what prepare times follow the quota: a thread more
    only waits for it."""
    reason = cpu_cgroup_available()
    if reason:
        pytest.skip(reason)
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: no fewer threads to choose")
    with cpu_limited(None, cores - 1) as group:
        assert _threads_in(group.path) == cores - 1
        group.set(0.3)  # less than a core: still one thread
        assert _threads_in(group.path) == 1
        inner = group.path / "inner"  # a group of its own without a quota, inside the limited one
        inner.mkdir()
        try:
            assert _threads_in(inner) == 1
        finally:
            inner.rmdir()
        group.set(cores + 0.5)  # more than the cores: the cores
        assert _threads_in(group.path) == cores


def test_a_tuning_record_of_an_older_version_is_timed_again(tmp_path):
    prep.prepare(FIXTURE_MODELS, tmp_path, [VOICE])
    [record] = tmp_path.rglob("tuning.*.json")
    older = json.loads(record.read_text())
    for key in ("version", "lanes", "lane_seconds", "lane_frames"):
        older.pop(key, None)
    record.write_text(json.dumps(older))  # as the last release wrote it: no lanes timed
    assert prep.missing(FIXTURE_MODELS, tmp_path, VOICE) and not prep.missing(FIXTURE_MODELS, tmp_path, "bert")
    [bert, voice] = prep.prepare(FIXTURE_MODELS, tmp_path, [VOICE])
    assert bert.done and not voice.done
    tuning = json.loads(record.read_text())
    assert tuning["version"] == TUNING_VERSION and tuning["lanes"] in (1, 2) and tuning == voice.tuning
    assert ("lane_seconds" in tuning) == (tuning["threads"] > 1) and "lane" in voice.line()


def test_a_voice_split_before_the_wide_2d_form_is_split_and_timed_again(tmp_path):
    prep.prepare(FIXTURE_MODELS, tmp_path, [VOICE])
    [stamp] = [p for p in tmp_path.glob("*/prepared.json") if json.loads(p.read_text())["kind"] == "split"]
    older = json.loads(stamp.read_text())
    del older["split_version"]
    stamp.write_text(json.dumps(older))  # as the release before it wrote it: forms 1d and 2d only
    assert prep.missing(FIXTURE_MODELS, tmp_path, VOICE) and not prep.missing(FIXTURE_MODELS, tmp_path, "bert")
    [bert, voice] = prep.prepare(FIXTURE_MODELS, tmp_path, [VOICE])
    assert bert.done and not voice.done and voice.tuning
    assert json.loads(stamp.read_text())["split_version"] == SPLIT_VERSION
    assert not prep.missing(FIXTURE_MODELS, tmp_path, VOICE)


def test_prepared_voice_keeps_one_copy_of_each_weight_and_its_timings(tmp_path):
    [_, step] = prep.prepare(FIXTURE_MODELS, tmp_path, [VOICE])
    assert step.tuning["form"] in ("1d", "2d") and step.tuning["threads"] >= 1
    assert set(step.tuning["seconds"]) == {"1d", "2d"} and "decoder" in step.line()
    names = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert not [n for n in names if n in ("weights", "folded.weights")]  # the working copies are gone
    copies = [n for n in names if n.endswith(".onnx.weights")]
    assert len(copies) == 3  # BERT, the front, and the decoder form chosen; not the other one
    store = ModelStore(FIXTURE_MODELS, derived_dir=tmp_path)
    assert store.voice(VOICE).tuning == step.tuning  # the daemon loads the form chosen


def test_a_new_cpu_or_onnx_runtime_prepares_and_tunes_again(tmp_path, monkeypatch):
    prep.prepare(FIXTURE_MODELS, tmp_path, [VOICE])
    want = Engine(FIXTURE_MODELS, voice=VOICE, store=ModelStore(FIXTURE_MODELS, derived_dir=tmp_path)) \
        .synthesize(TEXT, **QUIET)
    key = cpu_key()
    for path in list(tmp_path.rglob(f"*.{key}.*")):  # as a CPU with another key would have left them
        path.rename(path.with_name(path.name.replace(key, "0another0cpu")))
    assert prep.missing(FIXTURE_MODELS, tmp_path, "bert") and prep.missing(FIXTURE_MODELS, tmp_path, VOICE)
    steps = prep.prepare(FIXTURE_MODELS, tmp_path, [VOICE])
    assert not any(s.done for s in steps) and steps[1].tuning
    assert not list(tmp_path.rglob("*0another0cpu*"))  # nothing stale is left behind
    got = Engine(FIXTURE_MODELS, voice=VOICE, store=ModelStore(FIXTURE_MODELS, derived_dir=tmp_path)) \
        .synthesize(TEXT, **QUIET)
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-4


BERT_SOURCE = FIXTURE_MODELS / "onnx" / "bert" / "q8" / "bert_q8.onnx"
IDS = [1, *range(5, 45), 2]


def _bert_with_exact_products() -> bytes:
    """The fixture BERT with each MatMulInteger computed in float64 (exact for 8-bit
    operands): the features every CPU must give."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(BERT_SOURCE))
    nodes = []
    for n, node in enumerate(model.graph.node):
        if node.op_type != "MatMulInteger":
            nodes.append(node)
            continue
        operands = []
        for side, (x, zero) in enumerate([(node.input[0], node.input[2:3]), (node.input[1], node.input[3:4])]):
            value = f"exact{n}.{side}"
            nodes.append(helper.make_node("Cast", [x], [value], to=TensorProto.DOUBLE))
            if zero and zero[0]:
                nodes.append(helper.make_node("Cast", [zero[0]], [value + "z"], to=TensorProto.DOUBLE))
                nodes.append(helper.make_node("Sub", [value, value + "z"], [value + "c"]))
                value += "c"
            operands.append(value)
        nodes.append(helper.make_node("MatMul", operands, [f"exact{n}.y"]))
        nodes.append(helper.make_node("Cast", [f"exact{n}.y"], list(node.output), to=TensorProto.INT32))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model.SerializeToString()


def _hidden(session) -> np.ndarray:
    ids = np.array([IDS], dtype=np.int64)
    return session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0]


def test_bert_gives_the_exact_features_on_every_cpu(tmp_path):
    """On an x86 CPU without VNNI, ONNX Runtime's uint8 × int8 products saturate and the
    published Q8 BERT gives other features than an arm64 Pi (the arm64 check found the
    audio 1-6 % longer there); prepared, it gives the exact ones everywhere."""
    import onnxruntime as ort

    exact = _hidden(ort.InferenceSession(_bert_with_exact_products(), providers=["CPUExecutionProvider"]))
    published = _hidden(ort.InferenceSession(str(BERT_SOURCE), providers=["CPUExecutionProvider"]))
    saturates = not signed_int8_products_exact()
    # the probe tells the truth about this CPU
    assert (np.abs(published - exact).max() > 1e-3) == saturates
    [step] = prep.prepare(FIXTURE_MODELS, tmp_path, [])
    assert step.tuning == {"unsigned_int8": saturates} and ("unsigned" in step.line()) == saturates
    got = ModelStore(FIXTURE_MODELS, derived_dir=tmp_path).bert(IDS)
    assert np.abs(got - exact).max() <= 1e-4


def _weight_types(derived: Path) -> set[int]:
    import onnx

    [graph] = derived.rglob(f"model.{cpu_key()}.onnx")  # BERT's optimized copy, loaded by the daemon
    return {t.data_type for t in onnx.load(str(graph), load_external_data=False).graph.initializer}


def test_bert_is_made_again_when_its_products_need_other_weights(tmp_path, monkeypatch):
    """Prepared where signed products are exact, then found on a CPU where they saturate
    (or prepared by a release that never asked): made again, unsigned."""
    from onnx import TensorProto

    monkeypatch.setattr(make, "signed_int8_products_exact", lambda: True)
    assert make._prepare_bert(FIXTURE_MODELS, tmp_path) == {"unsigned_int8": False}
    assert TensorProto.INT8 in _weight_types(tmp_path)
    assert not prep.missing(FIXTURE_MODELS, tmp_path, "bert")
    [stamp] = tmp_path.rglob("prepared.json")
    older = json.loads(stamp.read_text())
    del older["unsigned_int8"]
    stamp.write_text(json.dumps(older))  # as the last release wrote it
    assert prep.missing(FIXTURE_MODELS, tmp_path, "bert")

    monkeypatch.setattr(make, "signed_int8_products_exact", lambda: False)
    assert make._prepare_bert(FIXTURE_MODELS, tmp_path) == {"unsigned_int8": True}
    assert not prep.missing(FIXTURE_MODELS, tmp_path, "bert")
    assert json.loads(stamp.read_text())["unsigned_int8"] is True
    types = _weight_types(tmp_path)
    assert TensorProto.UINT8 in types and TensorProto.INT8 not in types


def test_check_names_a_damaged_prepared_file_and_prepare_makes_it_again(tmp_path):
    """A prepared front cut short and a byte of BERT's prepared weights garbled (an SD card):
    `check` names each derived file and the fix, never the model files; `prepare` makes them
    again, never "up to date"."""
    derived = tmp_path / "cache" / "models"
    prep.prepare(FIXTURE_MODELS, derived, [VOICE])
    [front] = derived.rglob(f"front.{cpu_key()}.onnx")
    [weights] = derived.rglob(f"model.{cpu_key()}.onnx.weights")
    os.truncate(front, front.stat().st_size // 2)
    fd = os.open(weights, os.O_RDWR)
    os.pwrite(fd, bytes(b ^ 0xFF for b in os.pread(fd, 8, weights.stat().st_size // 2)), weights.stat().st_size // 2)
    os.close(fd)
    config = tmp_path / "config.yaml"
    config.write_text(f"models: {{dir: {FIXTURE_MODELS}}}\nvoice: {{name: {VOICE}}}\n"
                      f"cache: {{dir: {derived.parent}}}\nmqtt: {{port: 1}}\n")

    def run(*command: str) -> str:
        return subprocess.run([sys.executable, "-m", "hayakoe_pi.cli", *command, "--config", str(config)],
                              capture_output=True, text=True, cwd=REPO, timeout=300).stdout

    out = run("check")
    for damaged in (front, weights):
        [line] = [line for line in out.splitlines() if str(damaged) in line]
        assert line.startswith(f"FAIL models: prepared file {damaged} is damaged: ") and "hayakoe-pi prepare" in line
    assert "download it again" not in out and "synthesizer.onnx" not in out and "bert_q8.onnx" not in out, out
    made = run("prepare")
    assert "up to date" not in made.split(f"voice {VOICE}-nodur")[0], made
    assert len(re.findall(r"^preparing .*\(made again: .* is damaged: ", made, re.M)) == 2, made
    out = run("check")
    assert "ok   models: " in out and "FAIL models" not in out, out


def test_a_prepared_copy_that_cannot_be_loaded_is_made_again_once(tmp_path, caplog):
    """A copy whose record matches but which ONNX Runtime cannot load (what the quick check
    cannot see): the store makes it again and loads the voice, blaming the copy, not the model."""
    from hayakoe_pi.models import checksums
    from hayakoe_pi.models.errors import ModelError

    prep.prepare(FIXTURE_MODELS, tmp_path, [VOICE])
    [front] = tmp_path.rglob(f"front.{cpu_key()}.onnx")
    weights = front.with_name(front.name + ".weights")

    def spoil():
        front.write_bytes(b"not a graph" * 100)
        checksums.write_record(front, {front.name: front, weights.name: weights})

    spoil()
    voice = ModelStore(FIXTURE_MODELS, derived_dir=tmp_path).voice(VOICE)
    assert voice.decoder is not None and checksums.damage(front, full=True) is None
    said = [r.getMessage() for r in caplog.records if str(front) in r.getMessage()]
    assert len(said) == 1 and "cannot be loaded" in said[0] and "making it again" in said[0], said
    spoil()
    with pytest.raises(ModelError) as e:  # without repair (check): the copy named, and the fix
        ModelStore(FIXTURE_MODELS, derived_dir=tmp_path, repair=False).voice(VOICE)
    assert str(front) in str(e.value) and "hayakoe-pi prepare" in str(e.value)
    assert "synthesizer.onnx" not in str(e.value) and "download" not in str(e.value)


def test_copies_an_earlier_release_made_are_recorded_not_made_again(tmp_path):
    """Copies without a record (made before records): prepare records them as they are and
    makes nothing again (an upgrade on a Pi would pay minutes, the 8-bit decoder more)."""
    from hayakoe_pi.models import checksums

    prep.prepare(FIXTURE_MODELS, tmp_path, [VOICE])
    records = sorted(tmp_path.rglob(f"*{checksums.RECORD_SUFFIX}"))
    assert records
    made = {path: path.stat().st_mtime_ns for path in tmp_path.rglob(f"*.{cpu_key()}.onnx*")
            if not path.name.endswith(checksums.RECORD_SUFFIX)}
    for record in records:
        record.unlink()
    steps = prep.prepare(FIXTURE_MODELS, tmp_path, [VOICE], full_check=True)
    assert all(step.done for step in steps), steps  # "up to date": nothing made
    assert sorted(tmp_path.rglob(f"*{checksums.RECORD_SUFFIX}")) == records
    assert {path: path.stat().st_mtime_ns for path in made} == made
