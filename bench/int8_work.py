#!/usr/bin/env python3
"""The work around the 8-bit decoder's kernels: its graph after ONNX Runtime's
optimizations, node by node, with the transposed convolutions FP32 (as before issue 49)
and in 8 bits (quantize.py now), the gate's figures for each, and the work of one
decoder window.

    python bench/int8_work.py FOLDER [--out DIR] [--instructions] [--repeats 5]

FOLDER: a voice's prepared folder holding decoder.onnx and latents.npz (what prepare
leaves between its children: `make --keep-weights` and `python -m hayakoe_pi.synthesis.calibrate`
make them; prepare removes latents.npz once the 8-bit decoder is made). Each variant is
quantized into DIR, optimized as the daemon's sessions are (sessions.optimize), and
compared with FP32 on the held-out sentences (gate.compare). A window is 256 latent frames
and the margins (284), the voice's own latents: wall time on 1 thread (median of
--repeats) and, with --instructions, the instructions that window executes on 1 thread
after a first run (callgrind, counting only while that run lasts: callgrind_control),
which unlike wall time hold under load. ONNX Runtime's profiler gives each node type's share.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hayakoe_pi.models import quantize  # noqa: E402
from hayakoe_pi.models.gate import compare  # noqa: E402
from hayakoe_pi.models.sessions import optimize  # noqa: E402

WINDOW = 256 + 2 * 14  # latent frames: the engine's window and the decoder's margins
VARIANTS = {"upsamplers FP32": False, "upsamplers 8-bit": True}


def _session(path: Path, profile: bool = False) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level, opts.enable_profiling = 1, 3, profile
    opts.profile_file_prefix = str(path.parent / "profile")  # beside the graph, not in the checkout
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # optimized already
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _window(folder: Path, z_name: str) -> dict:
    return quantize._window_feeds(quantize.read_latents(folder / quantize.LATENTS_NAME)["held_out"], z_name, WINDOW)


def counted_window(optimized: Path, folder: Path, z_name: str) -> None:
    """The child under callgrind: a first window, then one counted (this process is valgrind's)."""
    session, feeds = _session(optimized), _window(folder, z_name)
    session.run(None, feeds)
    toggle = ["callgrind_control", "-i", "on", str(os.getpid())]
    subprocess.run(toggle, check=True, capture_output=True)
    session.run(None, feeds)
    subprocess.run(toggle[:2] + ["off", toggle[3]], check=True, capture_output=True)


def instructions(optimized: Path, folder: Path, z_name: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={tmp}/cg",
                               sys.executable, __file__, str(folder), "--child", str(optimized), z_name],
                              capture_output=True, text=True, check=True)
    return int(re.search(r"Collected : (\d+)", done.stderr).group(1))


def measure(folder: Path, out: Path, upsamplers: bool, z_name: str, repeats: int, count: bool) -> dict:
    latents = quantize.read_latents(folder / quantize.LATENTS_NAME)
    target = out / f"decoder-int8-{'all' if upsamplers else 'convs'}.onnx"
    if not target.is_file():
        calibration = [w for feeds in latents["calibration"]
                       for w in quantize._windows(feeds, z_name, quantize.CALIBRATION_FRAMES)]
        quantize.quantize_decoder(folder / "decoder.onnx", target, calibration, upsamplers=upsamplers)
    optimized = optimize(target)
    nodes = collections.Counter(n.op_type for n in onnx.load(str(optimized), load_external_data=False).graph.node)
    fp32, int8 = _session(optimize(folder / "decoder.onnx")), _session(optimized, profile=True)
    pairs = [(fp32.run(None, f)[0].reshape(-1), int8.run(None, f)[0].reshape(-1)) for f in latents["held_out"]]
    feeds, seconds = _window(folder, z_name), []
    for _ in range(repeats):
        began = time.perf_counter()
        int8.run(None, feeds)
        seconds.append(time.perf_counter() - began)
    by_op = collections.Counter()
    for event in json.loads(Path(int8.end_profiling()).read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
    total = sum(by_op.values())
    result = {"nodes": dict(sorted(nodes.items())), **compare(pairs, 44100),
              "window_s": round(float(np.median(seconds)), 3),
              "time_share": {op: round(us / total, 3) for op, us in by_op.most_common()}}
    if count:
        result["instructions"] = instructions(optimized, folder, z_name)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        counted_window(Path(args.child[0]), args.folder, args.child[1])
        return
    z_name = json.loads((args.folder / "prepared.json").read_text())["z"]
    out = args.out or Path(tempfile.mkdtemp(prefix="int8-work-"))
    out.mkdir(parents=True, exist_ok=True)
    for name, upsamplers in VARIANTS.items():
        print(name, json.dumps(measure(args.folder, out, upsamplers, z_name, args.repeats, args.instructions)),
              flush=True)


if __name__ == "__main__":
    main()
