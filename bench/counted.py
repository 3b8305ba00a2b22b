#!/usr/bin/env python3
"""The Pi's CPUs, counted: instructions of each synthesis step on a Cortex-A72 (Pi 4) and
Cortex-A76 (Pi 5), emulated, and the real time estimated from them (bench/pi_cores.py).

    python bench/run.py counted --cache DIR [--models /work/bench-models/full] [--voice full-voice]
                                [--cpus pi4,pi5] [--parts fp32,int8,bert,front] [--out bench/out/counted]

DIR is a cache prepared as a Pi prepares it, with the 8-bit decoder:
``HAYAKOE_PI_ARM_PATH=1 hayakoe-pi prepare --models M --cache DIR --voice V --decoder int8``.
Its 8-bit graph is the same on every CPU; prepare keeps no other graph with its
weights, only optimized copies, which are made for one CPU. So the synthesizer is
split again here into OUT/split (with its weights), BERT is read from its model
file, and every graph is optimized as it loads, under emulation, for the emulated
CPU, as a Pi optimizes for its own.

Each step runs in the Pi's userland (tools/arm64-check's root: Debian 13 arm64,
Python 3.13, the locked wheels) under qemu user mode with a counting plugin
(bench/qemu_count/), on one thread (the process pinned to one CPU: every
session then has one thread). Each step's program runs twice, making its
sessions and then doing the work once or not at all; the difference is one
run, without Python's start, the imports and the sessions' making (a first
run's allocations stay in it: emulation is too slow to afford a second run):

- fp32, int8: one decoder window of the engine's full size (windows.DECODER_WINDOW_FRAMES
  latent frames and the voice's margin each side), the 1-D FP32 decoder (the ARM
  path's form) and the 8-bit one, on random latents;
- bert: BERT over the characters of bench/texts.py's "long" text as one sequence;
- front: the rest of the synthesizer (text encoder, durations, flow) over that
  text's sentences, BERT features random, noise 0 (the same frames every run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from pi_cores import CLASSES, CORES, bound_cycles, seconds  # noqa: E402
from texts import TEXTS  # noqa: E402

PARTS = ("fp32", "int8", "bert", "front")
CPUS = {"pi4": "cortex-a72", "pi5": "cortex-a76"}
TEXT = dict(TEXTS)["long"]
FRAMES_PER_SECOND = 44100 / 512  # the voices' latent frames: 512 samples at 44.1 kHz
# A Pi's 4 cores against one, assumed, not counted: on this machine's 2 cores the decoder's
# convolutions ran 1.8-2.0x faster than on one (bench/README.md, section 5); 4 cores
# sharing a Pi's memory are taken at 75 % each.
FOUR_CORES = 4 * 0.75


# --------------------------------------------------------------------------
# guest: runs on arm64, under qemu
# --------------------------------------------------------------------------


def _sentences(models: Path):
    from hayakoe_pi import layout
    from hayakoe_pi.synthesis.sentences import split_sentences
    from hayakoe_pi.text import FrontEnd

    frontend = FrontEnd(models / layout.VOCAB_PATH)
    return [frontend.analyze(t) for t in split_sentences(TEXT)]


def _decoder(part: str, models: Path, voice: str, split: Path, cache: Path):
    import numpy as np
    import onnx

    from hayakoe_pi.models.folders import model_folder
    from hayakoe_pi.models.graphs import input_channels
    from hayakoe_pi.models.quantize import INT8_NAME
    from hayakoe_pi.models.sessions import open_session
    from hayakoe_pi.models.split import cached_split, decoder_margin
    from hayakoe_pi.models.voices import read_config
    from hayakoe_pi.synthesis.windows import DECODER_WINDOW_FRAMES

    directory = models / "onnx" / "speakers" / voice
    synth = directory / "synthesizer.onnx"
    parts = cached_split(synth, split)
    graph = parts.decoders["1d"] if part == "fp32" else model_folder(synth, cache / "models") / INT8_NAME
    session = open_session(graph, "synthesizer decoder")  # optimized as it loads, for the emulated CPU
    frames = DECODER_WINDOW_FRAMES + 2 * decoder_margin(read_config(directory / "config.json").get("model", {}))
    cut = onnx.load(str(parts.decoders["1d"]), load_external_data=False).graph
    rng = np.random.default_rng(0)
    feeds = {parts.z_name: rng.standard_normal((1, input_channels(cut, parts.z_name), frames), dtype=np.float32)}
    if parts.g_name:
        feeds[parts.g_name] = rng.standard_normal((1, input_channels(cut, parts.g_name), 1), dtype=np.float32)
    return lambda: session.run(None, feeds), {"frames": frames, "kept": DECODER_WINDOW_FRAMES}


def _bert(models: Path):
    from hayakoe_pi.models.bert import Bert

    bert = Bert(models)  # its model file, optimized as it loads
    analyses = _sentences(models)
    ids = [analyses[0].input_ids[0], *(i for a in analyses for i in a.input_ids[1:-1]), analyses[0].input_ids[-1]]
    return lambda: bert(ids), {"tokens": len(ids)}


def _front(models: Path, voice_name: str, split: Path):
    import numpy as np

    from hayakoe_pi.models.sessions import open_session
    from hayakoe_pi.models.split import cached_split

    directory = models / "onnx" / "speakers" / voice_name
    parts = cached_split(directory / "synthesizer.onnx", split)
    front = open_session(parts.front, "synthesizer front")  # optimized as it loads, for the emulated CPU
    style = np.load(directory / "style_vectors.npy")[:1].astype(np.float32)
    rng = np.random.default_rng(0)
    scalar = lambda v: np.array([v], dtype=np.float32)  # noqa: E731
    feeds = []
    for a in _sentences(models):
        n = len(a.phones)
        feeds.append({"x": np.array([a.phones], dtype=np.int64), "x_lengths": np.array([n], dtype=np.int64),
                      "sid": np.array([0], dtype=np.int64), "tone": np.array([a.tones], dtype=np.int64),
                      "language": np.array([a.language], dtype=np.int64),
                      "bert": rng.standard_normal((1, 1024, n), dtype=np.float32), "style_vec": style,
                      "noise_scale": scalar(0.0), "length_scale": scalar(1.0), "noise_scale_w": scalar(0.0),
                      "sdp_ratio": scalar(0.2)})
    run_all = lambda: [front.run([parts.z_name], f)[0].shape[2] for f in feeds]  # noqa: E731
    return run_all, {"frames": sum(run_all()), "tokens": sum(len(a.input_ids) - 2 for a in _sentences(models))}


def guest(part: str, runs: int, models: Path, voice: str, cache: Path, split: Path) -> dict:
    """Do one part's work `runs` times, after everything it needs is made (its size in the result)."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one CPU: every session on one thread
    if part in ("fp32", "int8"):
        work, size = _decoder(part, models, voice, split, cache)
    elif part == "bert":
        work, size = _bert(models)
    else:
        work, size = _front(models, voice, split)
    for _ in range(runs):
        work()
    return size


# --------------------------------------------------------------------------
# host: drives qemu, subtracts, estimates
# --------------------------------------------------------------------------


def split_with_weights(synth: Path, folder: Path) -> None:
    """The synthesizer split as prepare splits it on a Pi (the 1-D decoder alone), its weights kept (once)."""
    os.environ["HAYAKOE_PI_ARM_PATH"] = "1"
    sys.path.insert(0, str(REPO))
    from hayakoe_pi.models.sessions import prepare_options
    from hayakoe_pi.models.split import split_synthesizer

    if split_synthesizer(synth, folder, prepare_options) is None:
        raise SystemExit(f"{synth} cannot be split")


def count(cpu: str, part: str, runs: int, a, folder: Path) -> tuple[dict, dict]:
    """Instructions by class of the guest program doing `part` `runs` times, and its size."""
    out = folder / f"{cpu}-{part}-{runs}.txt"
    cmd = ["nice", "-n", "19", str(HERE / "qemu_count" / "qemu-count"), "--cpu", cpu, "--out", str(out), "--",
           str(Path(__file__).resolve()), "--guest", part, "--runs", str(runs), "--models", str(a.models),
           "--voice", a.voice, "--cache", str(a.cache), "--out", str(a.out)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{cpu} {part} x{runs} failed (rc={p.returncode}):\n{p.stderr[-3000:]}")
    counts = {name: int(n) for name, n in (ln.split() for ln in out.read_text().splitlines())}
    return counts, json.loads(lines[-1])


def per_unit(without: dict, once: dict, units: float) -> dict:
    """One run's instructions (the program with it less the program without) by class, per
    unit of work (window, token, frame)."""
    return {k: (once[k] - without[k]) / units for k in CLASSES}


def estimate(results: dict, core: str, clock_ghz: float) -> dict:
    """Seconds per second of speech on one core (fastest, slowest): BERT for the text's
    characters, the front and a decoder for its frames, each decoder window's margins paid."""
    speech = results["front"]["size"]["frames"] / FRAMES_PER_SECOND
    tokens_per_second = results["front"]["size"]["tokens"] / speech
    windows_per_second = FRAMES_PER_SECOND / results["fp32"]["size"]["kept"]

    def rtf(decoder: str) -> tuple[float, float]:
        parts = [(results["bert"]["per_unit"], tokens_per_second),
                 (results["front"]["per_unit"], FRAMES_PER_SECOND),
                 (results[decoder]["per_unit"], windows_per_second)]
        low = sum(seconds(c, core, clock_ghz)[0] * n for c, n in parts)
        high = sum(seconds(c, core, clock_ghz)[1] * n for c, n in parts)
        return low, high

    return {"fp32": rtf("fp32"), "int8": rtf("int8"),
            "decoder_window_s": {d: seconds(results[d]["per_unit"], core, clock_ghz) for d in ("fp32", "int8")}}


def markdown(report: dict) -> str:
    rows = ["| | FP32 1-D decoder, a window | 8-bit decoder, a window | int8 fewer instructions | "
            "BERT, a token | the rest, a frame |", "|---|--:|--:|--:|--:|--:|"]
    for cpu, results in report["cpus"].items():
        total = {p: sum(r["per_unit"].values()) for p, r in results.items()}
        rows.append(f"| {CORES[CPUS[cpu]]['name']} | {total['fp32'] / 1e9:.1f} G | {total['int8'] / 1e9:.1f} G | "
                    f"{total['fp32'] / total['int8']:.2f}× | {total['bert'] / 1e6:.0f} M | "
                    f"{total['front'] / 1e6:.1f} M |")
    rows += ["", "| | part | " + " | ".join(CLASSES) + " | bound by |", "|---|---|" + "--:|" * len(CLASSES) + "---|"]
    for cpu, results in report["cpus"].items():
        for part, r in results.items():
            total = sum(r["per_unit"].values())
            share = " | ".join(f"{100 * r['per_unit'][k] / total:.1f} %" for k in CLASSES)
            rows.append(f"| {cpu} | {part} | {share} | {bound_cycles(r['per_unit'], CPUS[cpu])[1]} |")
    rows += ["", "| | clock | FP32 decoder, a window | int8, a window | int8 / FP32 | "
             "× real time, 1 core, FP32 | int8 | 4 cores (assumed 3×), FP32 | int8 |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for cpu, results in report["cpus"].items():
        core = CPUS[cpu]
        for clock in CORES[core]["clock_ghz"]:
            e = estimate(results, core, clock)
            w = e["decoder_window_s"]
            ratio = (w["fp32"][0] / w["int8"][0])
            speed = [f"{n / e[d][1]:.2f}–{n / e[d][0]:.2f}" for n in (1, FOUR_CORES) for d in ("fp32", "int8")]
            rows.append(f"| {CORES[core]['name']} | {clock} GHz | {w['fp32'][0]:.1f}–{w['fp32'][1]:.1f} s | "
                        f"{w['int8'][0]:.1f}–{w['int8'][1]:.1f} s | {ratio:.2f}× | {' | '.join(speed)} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, default=Path("/work/bench-models/full"))
    ap.add_argument("--voice", default="full-voice")
    ap.add_argument("--cache", type=Path, required=True, help="a cache prepared as a Pi does (see above)")
    ap.add_argument("--cpus", default="pi4,pi5")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--out", type=Path, default=HERE / "out" / "counted")
    ap.add_argument("--guest", choices=PARTS, help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.models, a.cache = a.models.resolve(), a.cache.resolve()
    if a.guest:
        print(json.dumps(guest(a.guest, a.runs, a.models, a.voice, a.cache, a.out / "split")), flush=True)
        return 0
    split_with_weights(a.models / "onnx" / "speakers" / a.voice / "synthesizer.onnx", a.out / "split")
    cpus = [c for c in a.cpus.split(",") if c]
    parts = [p for p in a.parts.split(",") if p]
    a.out.mkdir(parents=True, exist_ok=True)
    report_path = a.out / "counted.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {"cpus": {}}
    with tempfile.TemporaryDirectory(prefix="counted-") as tmp:
        for part in parts:
            for cpu in cpus:
                none, size = count(cpu, part, 0, a, Path(tmp))
                once, _ = count(cpu, part, 1, a, Path(tmp))
                units = size.get("tokens" if part == "bert" else "frames", 1) if part in ("bert", "front") else 1
                report["cpus"].setdefault(cpu, {})[part] = {"size": size, "none": none, "once": once,
                                                            "per_unit": per_unit(none, once, units)}
                report_path.write_text(json.dumps(report, indent=1) + "\n")
                total = sum(report["cpus"][cpu][part]["per_unit"].values())
                print(f"{cpu} {part}: {total / 1e6:,.1f} M instructions a {'window' if units == 1 else 'unit'}",
                      file=sys.stderr, flush=True)
    if all(set(PARTS) <= set(r) for r in report["cpus"].values()):
        table = markdown(report)
        (a.out / "counted.md").write_text(table)
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
