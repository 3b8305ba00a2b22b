#!/usr/bin/env python3
"""One HiFi-GAN stage's convolutions, 1-D against 2-D, on this CPU and its threads.

    python bench/conv_layers.py [--frames 256] [--kernel 7] [--repeats 7]

Why the decoder has the forms it has (models/forms.py, rows.py): ONNX Runtime runs a 1-D
convolution as im2col + GEMM, a 2-D one (x86) with its blocked NCHWc kernels,
which share the work among threads by output rows and by groups of 4 channel
blocks. Per channel width of a JP-Extra decoder's stages (at the length a
window of FRAMES latent frames has there), two convolutions with a leaky ReLU
between, timed as 1-D, as 2-D of height 1, and as 2-D of 2 rows (the `2d`
form's narrow stages, without the small margin), on 1 thread and on every
core: least of REPEATS runs, in ms and GFLOP/s. Where a height-1 2-D layer is
no faster on every core than on one, its work was not shared.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

# channels of a JP-Extra decoder's stages, and their samples per latent frame
STAGES = [(256, 8), (128, 64), (64, 128), (32, 256), (16, 512)]


def _model(channels: int, length: int, kernel: int, rows: int | None) -> tuple[bytes, list[int]]:
    """Two convolutions (same weights) with a leaky ReLU between; rows=None: 1-D."""
    rng = np.random.default_rng(0)
    two_d = rows is not None
    weight = rng.standard_normal((channels, channels, *([1, kernel] if two_d else [kernel])), dtype=np.float32)
    shape = [1, channels, rows, length // rows] if two_d else [1, channels, length]
    pads = [0, kernel // 2, 0, kernel // 2] if two_d else [kernel // 2, kernel // 2]
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=pads),
             helper.make_node("LeakyRelu", ["a"], ["b"], alpha=0.1),
             helper.make_node("Conv", ["b", "w"], ["y"], pads=pads)]
    graph = helper.make_graph(nodes, "stage", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(weight * 0.05, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), shape


def least_seconds(model: bytes, shape: list[int], threads: int, repeats: int) -> float:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    x = {"x": np.random.default_rng(1).standard_normal(shape, dtype=np.float32)}
    session.run(None, x)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        session.run(None, x)
        best = min(best, time.perf_counter() - began)
    return best


def table(frames: int, kernel: int, repeats: int, stages=STAGES, cores: int | None = None) -> list[str]:
    cores = cores or len(os.sched_getaffinity(0))
    forms = [("1-D", None), ("2-D", 1), ("2-D 2 rows", 2)]
    threads = [1] if cores == 1 else [1, cores]
    head = [f"{name}, {t} thread{'s' * (t > 1)}" for t in threads for name, _ in forms]
    lines = ["| channels | samples | " + " | ".join(head) + " |", "|--:|--:|" + "--:|" * len(head)]
    for channels, per_frame in stages:
        length = frames * per_frame
        gflop = 2 * 2 * channels * channels * kernel * length / 1e9
        cells = []
        for t in threads:
            for _, rows in forms:
                seconds = least_seconds(*_model(channels, length, kernel, rows), t, repeats)
                cells.append(f"{seconds * 1e3:.1f} ms, {gflop / seconds:.0f} GF/s")
        lines.append(f"| {channels} | {length} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=256, help="latent frames of the window (default 256)")
    ap.add_argument("--kernel", type=int, default=7, help="kernel width (the residual blocks have 3, 7, 11)")
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args(argv)
    print(f"# onnxruntime {ort.__version__}; kernel {a.kernel}; a {a.frames}-frame window; least of {a.repeats}")
    print("\n".join(table(a.frames, a.kernel, a.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
