"""engine.decoder int8/auto: the 8-bit decoder made by prepare from the voice's own latents,
used only where the gate finds it keeps the voice and is faster; killed half-way, never trusted.

The tiny voice's decoder is too small for 8 bits to pay on any CPU (0.6× here), so the
tests that need it in use lower the speed bar as arm64-check does
(HAYAKOE_PI_INT8_MIN_SPEEDUP=0, read by the children prepare starts)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURE_MODELS, REPO
from harness import wait_for
from hayakoe_pi.speech.cache import voice_fingerprint
from hayakoe_pi.settings.config import ConfigError, load_config
from hayakoe_pi.synthesis.engine import Engine
from hayakoe_pi.models import gate
from hayakoe_pi.models import prepare as prep
from hayakoe_pi.models.prepare import synthesizer_path
from hayakoe_pi.models.quantize import INT8_NAME, int8_record_path, read_int8
from hayakoe_pi.models.sessions import open_session, optimized_path
from hayakoe_pi.models.split import cached_split
from hayakoe_pi.models.store import ModelStore

VOICE = "tiny-voice"
QUIET = dict(noise=0.0, noise_w=0.0)
TEXT = "玄関の鍵が開いています。"


def _folder(models: Path, derived: Path, voice: str = VOICE) -> Path:
    return cached_split(synthesizer_path(models, voice), derived).folder


@pytest.fixture
def any_speedup(monkeypatch):
    monkeypatch.setenv("HAYAKOE_PI_INT8_MIN_SPEEDUP", "0")


def test_the_gate_weighs_the_worst_sentence_and_the_speed():
    rng = np.random.default_rng(1)
    speech = [rng.standard_normal(44100).astype(np.float32) * 0.3 for _ in range(3)]
    close = [(a, a + rng.standard_normal(a.size).astype(np.float32) * 0.003) for a in speech]  # 40 dB
    quality = gate.compare(close, 44100)
    assert quality["snr_db"]["worst"] > 35 and quality["mel_db"]["worst"] < 0.5
    use, why = gate.decide(quality, 1.0, 0.5)
    assert use and "2.00× faster" in why
    # one sentence far (6 dB quieter) among close ones: the mean passes, the worst does not
    far = close[:2] + [(speech[2], speech[2] * 0.5)]
    mixed = gate.compare(far, 44100)
    assert mixed["mel_db"]["mean"] < gate.MAX_MEL_DB < mixed["mel_db"]["worst"]
    use, why = gate.decide(mixed, 1.0, 0.5)
    assert not use and "worst sentence" in why
    # a change where the speech is quiet: the SNR hardly sees it, the log-mel distance does
    t = np.arange(44100) / 44100
    low = (0.5 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
    hiss = np.diff(rng.standard_normal(44101)).astype(np.float32) * 0.01  # high bands, 33 dB under
    hissed = gate.compare([(low, low + hiss)], 44100)
    assert hissed["snr_db"]["worst"] > 25 and hissed["mel_db"]["worst"] > gate.MAX_MEL_DB
    use, why = gate.decide(hissed, 1.0, 0.5)
    assert not use and "log-mel" in why
    # auto keeps FP32 when int8 is not faster enough on this CPU (timings given)
    use, why = gate.decide(quality, 1.0, 1.0 / 1.2)
    assert not use and "not faster enough" in why and "1.20×" in why
    assert gate.decide(quality, 1.0, 1.0 / 1.3)[0]


def test_log_mel_distance_grows_with_a_change_the_ear_hears():
    t = np.arange(44100) / 44100
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    assert gate.mel_distance_db(tone, tone, 44100) == 0
    noise = np.random.default_rng(2).standard_normal(44100).astype(np.float32) * 0.1  # every band heard
    assert 5.9 < gate.mel_distance_db(noise, noise * 0.5, 44100) < 6.1  # 6 dB quieter everywhere
    # bands 80 dB under the loudest are not weighed: a pure tone's distance is its own band's
    assert gate.mel_distance_db(tone, tone * 0.5, 44100) < 6.1
    other = (0.3 * np.sin(2 * np.pi * 1200 * t)).astype(np.float32)
    assert gate.mel_distance_db(tone, other, 44100) > 10  # each band's difference capped by the floor


def test_noise_in_the_pauses_and_valleys_of_speech_is_weighed_as_pesq_hears_it():
    """Speech has pauses and valleys between its harmonics; a random-weight voice has
    neither. PESQ-WB (tools/pesq_wb.py) hears a noise 49 dB under a voice with silent
    pauses (3.2: refused) and one 60 dB under it hardly (4.2); a hiss 30 dB under it in the
    pauses alone is plain (2.2). The gate refuses the first and the last by their log-mel
    distance, bands counted down to 80 dB under the loudest (a 60 dB floor passed the first
    at 0.15 dB), though their SNR is far above any limit an SNR gate had."""
    t = np.arange(3 * 44100) / 44100
    syllables = (t % 0.7) < 0.4  # 0.4 s voiced, 0.3 s of silence
    voiced = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 30))
    speech = (0.3 * syllables * voiced / np.abs(voiced).max()).astype(np.float32)
    rng = np.random.default_rng(3)

    def with_noise(snr_db: float, where: np.ndarray) -> np.ndarray:
        noise = rng.standard_normal(speech.size) * where
        noise *= np.sqrt(np.sum(speech.astype(np.float64) ** 2) / np.sum(noise ** 2) / 10 ** (snr_db / 10))
        return speech + noise.astype(np.float32)

    heard = gate.compare([(speech, with_noise(49, np.ones(speech.size)))], 44100)
    assert heard["snr_db"]["worst"] > 48 and heard["mel_db"]["worst"] > 3 * gate.MAX_MEL_DB, heard
    use, why = gate.decide(heard, 1.0, 0.5)
    assert not use and "log-mel" in why
    hiss = gate.compare([(speech, with_noise(30, ~syllables))], 44100)
    assert hiss["snr_db"]["worst"] > 29 and hiss["mel_db"]["worst"] > 3 * gate.MAX_MEL_DB, hiss
    assert not gate.decide(hiss, 1.0, 0.5)[0]


def test_the_upsamplers_in_8_bits_run_as_8_bit_convolutions_but_stay_fp32_by_default(tmp_path):
    """ONNX Runtime has no 8-bit transposed convolution on the CPU: rewritten as convolutions
    (polyphase.py) the upsamplers run as 8-bit convolutions too; prepare keeps them FP32,
    which keeps the voice closer (bench/README.md: 10-12 dB SNR for 2 % of the instructions)."""
    import onnx

    from hayakoe_pi.models.quantize import CALIBRATION_FRAMES, LATENTS_NAME, _windows, quantize_decoder, read_latents

    where = ["--models", str(FIXTURE_MODELS), "--derived", str(tmp_path)]
    steps = (["hayakoe_pi.models.make", "--voice", VOICE, "--keep-weights"], ["hayakoe_pi.synthesis.calibrate", "--voice", VOICE])
    for step in steps:  # what prepare runs before the 8-bit decoder, leaving its latents
        subprocess.run([sys.executable, "-m", *step, *where], check=True, capture_output=True, cwd=REPO)
    folder = _folder(FIXTURE_MODELS, tmp_path)
    parts = cached_split(synthesizer_path(FIXTURE_MODELS, VOICE), tmp_path)
    latents = read_latents(folder / LATENTS_NAME)
    calibration = [w for feeds in latents["calibration"] for w in _windows(feeds, parts.z_name, CALIBRATION_FRAMES)]
    fp32 = open_session(parts.decoders["1d"], "decoder", parts.decoders["1d"])
    source = onnx.load(str(parts.decoders["1d"]), load_external_data=False).graph.node
    upsamplers = sum(n.op_type == "ConvTranspose" for n in source)
    assert upsamplers == 5
    snr = {}
    for name, in_8_bits in (("default", None), ("upsamplers", True)):
        target = tmp_path / f"{name}.onnx"
        quantize_decoder(parts.decoders["1d"], target, calibration,
                         **({} if in_8_bits is None else {"upsamplers": in_8_bits}))
        int8 = open_session(target, "8-bit decoder", target)
        ops = [n.op_type for n in onnx.load(str(optimized_path(target)), load_external_data=False).graph.node]
        if in_8_bits:
            assert "ConvTranspose" not in ops  # all five as 8-bit convolutions, the ends FP32 still
            assert ops.count("QLinearConv") == sum(n.op_type == "Conv" for n in source) - 2 + upsamplers
        else:
            assert ops.count("ConvTranspose") == upsamplers
        pairs = [(fp32.run(None, f)[0].reshape(-1), int8.run(None, f)[0].reshape(-1)) for f in latents["held_out"]]
        snr[name] = gate.compare(pairs, 44100)["snr_db"]["worst"]
    # on this fixture's random weights the upsamplers in FP32 gain about 5 dB (the calibration latents
    # differ from run to run: 4.6-4.7 in three runs of 2026-12-07 here, over 5 in others); none if not rewritten
    assert snr["default"] > snr["upsamplers"] + 3 and snr["upsamplers"] > 20, snr


def _outlier_voice(models: Path) -> None:
    """The tiny voice with, in every residual block, one channel scaled up 10⁴× and the next
    convolution's input scaled down as much: nearly the same samples in FP32 (leaky ReLU is
    homogeneous; the bias is not scaled), but that channel's range swamps the 8-bit scale
    of its tensor, whose other channels round to nothing."""
    import onnx
    from onnx import numpy_helper

    path = synthesizer_path(models, VOICE)
    model = onnx.load(str(path))
    weights = {t.name: t for t in model.graph.initializer}

    def scale(name: str, index, factor: float) -> None:
        array = numpy_helper.to_array(weights[name]).copy()
        array[index] *= factor
        weights[name].CopyFrom(numpy_helper.from_array(array, name))

    dilated = [n.input[1] for n in model.graph.node if n.op_type == "Conv" and ".dilated." in n.input[1]]
    assert dilated, "the tiny voice's residual blocks are not where this expects them"
    for name in dilated:
        scale(name, 0, 1e4)
        scale(name.replace(".dilated.", ".plain."), (slice(None), 0), 1e-4)
    onnx.save(model, str(path))


@pytest.mark.prepares_models
def test_a_decoder_made_far_on_purpose_keeps_stages_fp32_from_the_output_end_until_it_passes(models_copy, tmp_path,
                                                                                            any_speedup):
    _outlier_voice(models_copy)
    record = prep.prepare(models_copy, tmp_path / "derived", [VOICE], decoder="int8")[1].int8
    tried = record["tried"]
    assert tried[0]["fp32_stages"] == [] and not tried[0]["passes"] and tried[0]["snr_db"] < gate.MIN_SNR_DB, tried
    # each next precision one more stage FP32, from the output end; the last tried passed
    assert [t["fp32_stages"] for t in tried] == [[], [5], [4, 5], [3, 4, 5], [2, 3, 4, 5]][:len(tried)]
    assert tried[-1]["passes"] and not any(t["passes"] for t in tried[:-1]) and len(tried) > 1
    assert record["use"] and record["fp32_stages"] == tried[-1]["fp32_stages"]
    assert [s["stage"] for s in record["stages"] if s["fp32"]][-len(tried[-1]["fp32_stages"]):] == record["fp32_stages"]
    assert record["mel_db"]["worst"] <= gate.MAX_MEL_DB and record["snr_db"]["worst"] >= gate.MIN_SNR_DB
    assert "FP32 kept in stage" in record["reason"]
    line = prep.describe_int8(record)  # what check and the journal say: the stages and each tried
    assert "stages tried on the calibration sentences: none FP32: too far" in line and "passed" in line, line


def test_the_ranges_cut_the_same_tails_as_a_sort_of_every_value_window_by_window():
    from hayakoe_pi.models.ranges import _Tails

    rng = np.random.default_rng(4)
    windows = [rng.standard_t(2, size=(1, 8, n)).astype(np.float32) for n in (300, 300, 120, 300)]
    windows[2][0, 3, 7] = 1e4  # a far value late: the tails kept must still hold it
    every = np.sort(np.concatenate([w.ravel() for w in windows]))
    for percentile in (99.99, 99.9, 100.0):
        tails = _Tails(int(every.size * (100 - percentile) / 200 * 1.25) + 2)
        for w in windows:
            tails.add(w)
        cut = int(np.floor(every.size * (100 - percentile) / 200))
        assert tails.bounds(percentile) == (every[cut], every[every.size - 1 - cut])
    assert tails.bounds(100.0) == (every[0], every[-1]) == (every[0], 1e4)


@pytest.mark.prepares_models
def test_an_8_bit_decoder_that_does_not_pay_is_refused_and_fp32_kept_with_a_warning(models_copy, tmp_path, caplog):
    derived = tmp_path / "derived"  # the tiny voice's decoder is never faster in 8 bits (see the top)
    record = prep.prepare(models_copy, derived, [VOICE], decoder="int8")[1].int8
    assert not record["use"] and "not faster enough" in record["reason"], record
    assert not optimized_path(_folder(models_copy, derived) / INT8_NAME).exists()  # only the record kept
    with caplog.at_level(logging.WARNING, "hayakoe_pi"):
        voice = ModelStore(models_copy, derived_dir=derived, decoder="int8").voice(VOICE)
    assert voice.decoder_kind == "fp32"
    assert [r for r in caplog.records if "keeps its FP32 decoder" in r.getMessage() and "not faster" in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.WARNING, "hayakoe_pi"):  # auto decides silently
        assert ModelStore(models_copy, derived_dir=derived, decoder="auto").voice(VOICE).decoder_kind == "fp32"
    assert not [r for r in caplog.records if "FP32" in r.getMessage()]


@pytest.mark.prepares_models
def test_a_killed_8_bit_preparation_leaves_nothing_a_later_start_trusts(tmp_path, any_speedup):
    models, derived = FIXTURE_MODELS, tmp_path
    prep.prepare(models, derived, [VOICE])  # FP32 prepared first, as on an install from before
    where = ["--models", str(models), "--derived", str(derived)]
    run = lambda *args: subprocess.run([sys.executable, "-m", *args, *where], check=True,  # noqa: E731
                                       capture_output=True, cwd=REPO)
    run("hayakoe_pi.models.make", "--voice", VOICE, "--keep-weights")
    run("hayakoe_pi.synthesis.calibrate", "--voice", VOICE)
    folder = _folder(models, derived)
    child = subprocess.Popen([sys.executable, "-m", "hayakoe_pi.models.make", "--int8", VOICE, *where], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # killed while it writes the 8-bit graph: a power cut's moment too
    wait_for(lambda: list(folder.glob(INT8_NAME + ".*.tmp")) or child.poll() is not None, timeout=60,
             interval=0.002, what="the 8-bit graph being written")
    child.send_signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL, "the step ended before it could be killed"
    assert read_int8(folder) is None and not int8_record_path(folder).exists()
    assert prep.missing(models, derived, VOICE, "int8") and not prep.missing(models, derived, VOICE)
    assert ModelStore(models, derived_dir=derived).voice(VOICE).decoder_kind == "fp32"
    voice = ModelStore(models, derived_dir=derived, decoder="int8").voice(VOICE)  # made again, whole
    assert voice.decoder_kind == "int8" and read_int8(folder)["use"]


def test_engine_decoder_in_the_config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("engine:\n  decoder: auto\n")
    assert load_config(path).engine.decoder == "auto"
    assert load_config(None).engine.decoder == "fp32"  # the mission's FP32 synthesizer by default
    path.write_text("engine:\n  decoder: int4\n")
    with pytest.raises(ConfigError, match="engine.decoder must be one of fp32, int8, auto"):
        load_config(path)
