"""bench/run.py's arithmetic: speech apart from the silence put between sentences, and pairs of runs;
bench/conv_layers.py's forms."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("bench_run", Path(__file__).parent.parent / "bench" / "run.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _run(audio_s: float, speech_s: float, total_s: float) -> dict:
    return {"audio_s": audio_s, "speech_s": speech_s, "total_s": total_s, "load_s": 1.0, "first_s": 0.5,
            "peak_rss_mb": 800.0, "chunks": 3, "cold": {"first_s": 0.6, "total_s": total_s}}


def test_timed_counts_the_zero_samples_between_sentences_as_silence_not_speech():
    def stream(text):  # (samples, samples exactly 0, rate) per chunk: a sentence, a pause, a sentence
        yield from [(1000, 0, 1000), (500, 500, 1000), (1500, 2, 1000)]

    r = bench._timed(stream, "text")
    assert r["audio_s"] == pytest.approx(3.0)
    assert r["speech_s"] == pytest.approx(2.498)
    assert r["chunks"] == 3


def test_speech_rtf_and_decoder_rate_leave_the_silence_out():
    s = bench.summarize([_run(4.0, 3.0, 2.0), _run(4.0, 3.0, 1.0), _run(4.0, 3.0, 1.5)])
    assert s["rtf"] == pytest.approx(4.0 / 1.5)
    assert s["speech_rtf"] == pytest.approx(3.0 / 1.5)
    assert s["decoder_gflops"] == pytest.approx(2.0 * bench.DECODER_GFLOP_PER_AUDIO_SECOND)


def test_pairs_compare_runs_made_one_after_the_other():
    # pair ratios 1.5, 1.2 and 1.4 (the second pair on a slower machine): the median is 1.4
    pi = [_run(10.0, 9.0, 4.0), _run(10.0, 9.0, 7.5), _run(10.0, 9.0, 5.0)]
    hk = [_run(10.0, 9.9, 6.0), _run(10.0, 9.9, 9.0), _run(10.0, 9.9, 7.0)]
    pair = bench.pair_advantage(pi, hk)
    assert pair["total_s"] == pytest.approx(1.4)
    assert pair["rtf"] == pytest.approx(1.4)
    assert pair["speech_rtf"] == pytest.approx(1.4 * 9.0 / 9.9)


layers_spec = importlib.util.spec_from_file_location(
    "conv_layers", Path(__file__).parent.parent / "bench" / "conv_layers.py")
conv_layers = importlib.util.module_from_spec(layers_spec)
layers_spec.loader.exec_module(conv_layers)


def test_conv_layers_times_the_same_computation_in_each_form():
    import numpy as np
    import onnxruntime as ort

    x = np.random.default_rng(2).standard_normal((1, 8, 64), dtype=np.float32)
    outputs = []
    for rows in (None, 1):
        model, shape = conv_layers._model(8, 64, 7, rows)
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        outputs.append(session.run(None, {"x": x.reshape(shape)})[0].reshape(x.shape))
    assert np.abs(outputs[0] - outputs[1]).max() <= 1e-4
    lines = conv_layers.table(frames=2, kernel=3, repeats=1, stages=[(8, 4)], cores=2)
    assert len(lines) == 3 and lines[2].startswith("| 8 | 8 |") and lines[2].count("GF/s") == 6
