#!/usr/bin/env python3
"""The 8-bit decoder heard on trained decoders: each recipe's gate measures beside PESQ-WB
(ITU-T P.862.2, the listening-test model) against FP32, per held-out sentence.

    python bench/listening.py [--trained ROOT] [--out DIR] [--json FILE]

ROOT: what tools/trained-decoders made (its default folder when not given). For each
trained decoder and recipe (today's before issue 55: full ranges, every stage in 8 bits;
then percentile ranges with 0, 1, 2, … stages kept FP32 from the output end), the worst
held-out sentence's SNR, log-mel distance and the gate's verdict on the sound, beside the
worst PESQ-WB, and the 1-thread speed-up of a 256-frame window. --json keeps every
sentence's figures (what the gate's thresholds were set from).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from hayakoe_pi.models import gate, precision, quantize, ranges  # noqa: E402

WINDOW = 256  # latent frames timed


def trained_root(given: Path | None = None) -> Path:
    """The trained decoders, made (or found cached) by tools/trained-decoders."""
    cmd = [str(REPO / "tools" / "trained-decoders")] + (["--out", str(given)] if given else [])
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return Path(done.stdout.strip().splitlines()[-1])


def pesq_wb(root: Path, pairs: list[tuple[np.ndarray, np.ndarray]], sample_rate: int) -> list[float]:
    """PESQ-WB of each (reference, degraded) pair, by the tools venv's `pesq` (an sdist: it
    has no place in the appliance's lock)."""
    with tempfile.TemporaryDirectory() as tmp:
        arrays = {f"ref/{i}": a for i, (a, _) in enumerate(pairs)} | {f"deg/{i}": b for i, (_, b) in enumerate(pairs)}
        np.savez(f"{tmp}/pairs.npz", sample_rate=np.array(sample_rate), **arrays)
        done = subprocess.run([str(root / "venv" / "bin" / "python"), str(REPO / "tools" / "pesq_wb.py"),
                               f"{tmp}/pairs.npz"], check=True, capture_output=True, text=True)
    return json.loads(done.stdout)["pesq_wb"]


def session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = 1, 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def recipes(decoder: Path, latents: dict, z_name: str) -> list[tuple[str, dict, list[str]]]:
    """(name, ranges, convolutions left FP32) of each recipe tried."""
    import onnx

    calibration = [w for feeds in latents["calibration"] for w in quantize._windows(feeds, z_name, quantize.CALIBRATION_FRAMES)]
    full = ranges.activation_ranges(decoder, calibration, 100.0)
    cut = ranges.activation_ranges(decoder, calibration)
    stages = precision.conv_stages(onnx.load(str(decoder), load_external_data=False))
    ends = quantize.kept_in_fp32(decoder)
    found = [("today's (full ranges, every stage 8-bit)", full, ends)]
    for kept in precision.fp32_choices(stages, ends):
        name = "percentile, " + (f"stages {','.join(str(s.index) for s in kept)} FP32" if kept else "every stage 8-bit")
        found.append((name, cut, precision.excluded(kept, ends)))
    return found


def measure(root: Path, name: str, out: Path) -> list[dict]:
    folder = root / name
    voice = json.loads((folder / "voice.json").read_text())
    rate, z_name = voice["sample_rate"], voice["time_input"]
    latents = quantize.read_latents(folder / "latents.npz")
    decoder = folder / "decoder.onnx"
    fp32 = session(decoder)
    reference = [fp32.run(None, f)[0].reshape(-1) for f in latents["held_out"]]
    window = quantize._window_feeds(latents["held_out"], z_name, WINDOW)
    rows = []
    for i, (recipe, tensor_ranges, exclude) in enumerate(recipes(decoder, latents, z_name)):
        target = out / f"{name}-{i}.onnx"
        quantize.quantize_decoder(decoder, target, [], exclude=exclude, ranges=tensor_ranges)
        int8 = session(target)
        pairs = [(a, int8.run(None, f)[0].reshape(-1)) for a, f in zip(reference, latents["held_out"])]
        seconds = []
        for s in (fp32, int8, fp32, int8, fp32, int8):
            began = time.perf_counter()
            s.run(None, window)
            seconds.append(time.perf_counter() - began)
        sentences = [{**gate.compare([pair], rate), "pesq_wb": score}
                     for pair, score in zip(pairs, pesq_wb(root, pairs, rate))]
        quality = gate.compare(pairs, rate)
        rows.append({"decoder": name, "recipe": recipe, **quality, "sound": gate.sound(quality),
                     "pesq_wb_worst": min(s["pesq_wb"] for s in sentences),
                     "speedup": min(seconds[0::2]) / min(seconds[1::2]), "sentences": sentences})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| trained decoder | recipe | worst SNR | worst log-mel | worst PESQ-WB | speedup, 1 thread | gate's sound |",
             "|---|---|--:|--:|--:|--:|---|"]
    for r in rows:
        lines.append(f"| {r['decoder']} | {r['recipe']} | {r['snr_db']['worst']:.1f} dB | {r['mel_db']['worst']:.2f} dB "
                     f"| {r['pesq_wb_worst']:.2f} | {r['speedup']:.2f}× | {'passes' if r['sound'][0] else 'refuses'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trained", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    root = trained_root(args.trained)
    out = args.out or Path(tempfile.mkdtemp(prefix="listening-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = [row for name in ("piper-joe", "hifigan-v1") for row in measure(root, name, out)]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
