"""The activation ranges the 8-bit decoder is quantized with: for every tensor a
convolution reads or writes, the range that leaves out its rarest far values, measured
once on the voice's own calibration windows and reused by every precision tried
(precision.py).

Why not the full range (ONNX Runtime's MinMax): a trained decoder has a few far values in
some channels, and a range set by them leaves every other value a few steps of 8 bits.
Cutting 0.01 % off each tensor's tails (PERCENTILE, the clipping ONNX Runtime's
percentile calibration does) kept 2-5 dB more SNR and PESQ 4.5 instead of 3.2 on the
trained HiFi-GAN V1 (bench/README.md, issue 55). Computed here exactly, from the tails
alone: ONNX Runtime's own percentile calibrator keeps every tensor of every window until
the end (gigabytes on a full-size voice), this one window at a time.
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import numpy as np

PERCENTILE = 99.99  # of each tensor's values kept inside its range, the tails cut evenly


def conv_tensors(model) -> list[str]:
    """The activations every convolution reads and writes (what QDQ quantization needs a
    range for): its first input and its output, never a weight."""
    weights = {t.name for t in model.graph.initializer}
    names: dict[str, None] = {}
    for node in model.graph.node:
        if node.op_type == "Conv":
            for name in (node.input[0], node.output[0]):
                if name not in weights:
                    names[name] = None
    return list(names)


class _Tails:
    """A tensor's lowest and highest `keep` values seen so far, and how many values in all."""

    def __init__(self, keep: int):
        self.keep, self.count = keep, 0
        self.low = np.empty(0, np.float32)
        self.high = np.empty(0, np.float32)

    def add(self, values: np.ndarray) -> None:
        values = values.reshape(-1)
        self.count += values.size
        full = self.low.size == self.keep  # then only values past the tails kept can enter them
        low = np.concatenate([self.low, values[values < self.low.max()] if full else values])
        high = np.concatenate([self.high, values[values > self.high.min()] if full else values])
        if low.size > self.keep:
            low = np.partition(low, self.keep - 1)[:self.keep]
            high = np.partition(high, high.size - self.keep)[-self.keep:]
        self.low, self.high = low, high

    def bounds(self, percentile: float) -> tuple[float, float]:
        cut = math.floor(self.count * (100.0 - percentile) / 200.0)  # values left out each side
        cut = min(cut, self.low.size - 1)  # (never more than kept: then the range is wider, not narrower)
        low, high = np.sort(self.low), np.sort(self.high)
        return float(low[cut]), float(high[high.size - 1 - cut])


def activation_ranges(decoder, windows: list[dict[str, np.ndarray]],
                      percentile: float = PERCENTILE) -> dict[str, tuple[float, float]]:
    """{tensor: (low, high)} over `windows` (the decoder's feeds) with the tails cut;
    `decoder` a path or an ONNX model (not changed)."""
    import onnx
    import onnxruntime as ort

    if isinstance(decoder, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(decoder)
    else:
        model = onnx.load(str(decoder))
    names = conv_tensors(model)
    outputs = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in outputs)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    del model
    frames = sum(_frames(w) for w in windows)
    tails: dict[str, _Tails] = {}
    for feeds in windows:
        values = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        for name in names:
            if name not in tails:  # enough kept for the whole calibration: sizes grow with frames
                per_frame = values[name].size / max(1, _frames(feeds))
                tails[name] = _Tails(math.ceil(per_frame * frames * 1.25 * (100.0 - percentile) / 200.0) + 2)
            tails[name].add(values[name])
        del values
    return {name: t.bounds(percentile) for name, t in tails.items()}


def _frames(feeds: dict[str, np.ndarray]) -> int:
    """A window's latent frames: the longest last axis among its inputs."""
    return max(v.shape[-1] for v in feeds.values())


def write_ranges(ranges: dict[str, tuple[float, float]], path: Path) -> None:
    """The ranges as ONNX Runtime's calibration cache (quantize_static reads it, skipping
    its own calibration)."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData, save_tensors_data

    data = {name: (np.array(low, np.float32), np.array(high, np.float32)) for name, (low, high) in ranges.items()}
    with contextlib.redirect_stdout(io.StringIO()):  # a child's stdout is its one line of JSON
        save_tensors_data(TensorsData(CalibrationMethod.MinMax, data), path)
