"""Making what is derived from the model files, one model at a time, each in a child process.

Per model file, once: its graph apart from its weights with its constants
folded (weights.py), for a voice the split into the decoder and the rest
with the decoder's 2-D forms (split.py), ONNX Runtime's optimized copy of
each graph, and for a voice the decoder form that is fastest on this CPU
(`tune`). Loading a model whole to do this held it several times over (the
full-size voice peaked at 1.3 GB, more than a 1 GB Pi has free); here no
step holds its weights in memory, and each model's step runs in a child of
its own, whose memory goes back when it exits. The daemon then loads only
finished files, memory-mapped.

    python -m hayakoe_pi.prepare --models DIR --derived DIR (--bert | --voice NAME)

is one step (the child); `prepare()` runs the steps that are missing. A new
CPU or ONNX Runtime makes new optimized copies and timings (models.cpu_key).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .models import (BERT_PATH, LANE_WINDOW_FRAMES, SPEAKERS_DIR, TUNING_VERSION, ModelError, cpu_threads,
                     installed_voices, lane_threads, load_voice, open_session, optimize, optimized_path,
                     prepare_options, read_config, read_tuning, signed_int8_products_exact, tuning_path,
                     unreadable)
from .split import SplitModel, _input_channels, cached_split, decoder_margin, split_synthesizer
from .weights import (UnreadableModel, clear_folder, drop_weights, durable_replace, has_weights, make_whole,
                      model_folder, prepared_whole, read_stamp)

# Decoder windows timed by the tuner (latent frames, margins added): the short
# first window and the engine's full one.
TUNE_FRAMES = (48, 256)
# Best of 3; tools/arm64-check asks for 1 (HAYAKOE_PI_TUNE_REPEATS): emulated timings mean
# nothing, and each emulated run of a 256-frame window takes 10 s.
TUNE_REPEATS = max(1, int(os.environ.get("HAYAKOE_PI_TUNE_REPEATS", "3")))
SAME_SAMPLES = 1e-4  # a form is a candidate only if it gives the samples of the one cut
# Two decoder lanes (two windows at once, on half the cores each) are kept only
# if a frame kept costs at least this much less than with one window at a time
# on every core: a second window in flight costs its working memory (~50 MB).
LANES_GAIN = 0.05


@dataclass
class Step:
    what: str  # "bert" or a voice name
    done: bool  # nothing was left to make
    seconds: float = 0.0
    peak_mb: float = 0.0  # the child's peak resident memory
    tuning: dict | None = None  # a voice's decoder timings; BERT's {"unsigned_int8": …}

    def line(self) -> str:
        name = "BERT" if self.what == "bert" else f"voice {self.what}"
        if self.done:
            return f"{name}: up to date"
        line = f"{name}: prepared in {self.seconds:.1f} s, peak memory {self.peak_mb:.0f} MB"
        if not self.tuning:
            return line
        detail = describe_bert(self.tuning["unsigned_int8"]) if self.what == "bert" else describe_tuning(self.tuning)
        return f"{line}; {detail}"


def describe_tuning(tuning: dict) -> str:
    times = ", ".join(
        f"{form} {' / '.join(f'{s * 1000:.0f}' for s in seconds)} ms"
        for form, seconds in tuning["seconds"].items())
    frames = " / ".join(str(f) for f in tuning["frames"])
    line = (f"decoder {tuning['form']} ({times} for {frames} frames, "
            f"{tuning['threads']} thread{'s' if tuning['threads'] != 1 else ''})")
    if "lane_seconds" in tuning:
        line += (f", {tuning['lanes']} lane{'s' if tuning['lanes'] != 1 else ''} "
                 f"(two {tuning['lane_frames']}-frame windows at once: {tuning['lane_seconds'] * 1000:.0f} ms)")
    return line


def describe_bert(unsigned_int8: bool) -> str:
    if unsigned_int8:
        return "8-bit weights made unsigned (this CPU's signed 8-bit products saturate)"
    return "8-bit products exact on this CPU"


def _synthesizer(models_dir: Path, voice: str) -> Path:
    return models_dir / SPEAKERS_DIR / voice / "synthesizer.onnx"


def _graphs_needed(parts: SplitModel) -> list[Path]:
    """The graphs a voice runs: the front and the decoder form tuned for this CPU."""
    tuning = read_tuning(parts.folder)
    return [parts.front, parts.decoders[tuning["form"]]] if tuning else []


def missing(models_dir: Path, derived: Path, what: str) -> bool:
    """Whether a step has something left to make (cheap: only file names and stamps)."""
    source = models_dir / BERT_PATH if what == "bert" else _synthesizer(models_dir, what)
    if not source.is_file():
        return True  # the child says what is wrong
    parts = None if what == "bert" else cached_split(source, derived)
    graphs = _graphs_needed(parts) if parts else [prepared_whole(source, derived)]
    if what == "bert" and graphs[0] is not None and "unsigned_int8" not in read_stamp(graphs[0].parent, source):
        return True  # made before BERT's 8-bit products were checked on the CPU
    return not graphs or not all(g is not None and optimized_path(g).is_file() for g in graphs)


def _peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def choose_form(seconds: dict[str, list[float]], differences: dict[str, float]) -> str:
    """The fastest decoder form (least time over the timed windows) of those giving the
    samples of the one cut; "1d" is that one."""
    candidates = [f for f in seconds if f == "1d" or differences.get(f, np.inf) <= SAME_SAMPLES]
    return min(candidates, key=lambda f: (sum(seconds[f]), f != "1d"))


def choose_lanes(alone: float, two_lanes: float, threads: int) -> int:
    """Decoder lanes for this CPU: 2 if windows decoded two at once, each lane on half
    the cores, take clearly less time a frame (`two_lanes`, margins paid) than one
    window after another on every core (`alone`), else 1."""
    if threads < 2:
        return 1
    return 2 if two_lanes <= alone * (1 - LANES_GAIN) else 1


def _time_two_at_once(path: Path, feeds: dict) -> float:
    """Least wall time of two runs of the decoder at `path` at once, each on a lane."""
    from concurrent.futures import ThreadPoolExecutor

    lanes = [open_session(path, "synthesizer decoder", path, threads=lane_threads(2)) for _ in range(2)]
    seconds = []
    with ThreadPoolExecutor(2) as pool:
        for _ in range(TUNE_REPEATS + 1):
            began = time.perf_counter()
            list(pool.map(lambda lane: lane.run(None, feeds), lanes))
            seconds.append(time.perf_counter() - began)
    return min(seconds[1:])  # the first round warms the lanes up


def tune(parts: SplitModel, margin: int) -> dict:
    """Time each decoder form on this CPU, with the threads the daemon uses, and choose."""
    import onnx

    graph = onnx.load(str(parts.decoders["1d"]), load_external_data=False).graph
    rng = np.random.default_rng(0)
    feeds_by_size = []
    for frames in TUNE_FRAMES:
        feeds = {parts.z_name: rng.standard_normal((1, _input_channels(graph, parts.z_name),
                                                    frames + 2 * margin), dtype=np.float32)}
        if parts.g_name:
            feeds[parts.g_name] = rng.standard_normal((1, _input_channels(graph, parts.g_name), 1),
                                                      dtype=np.float32)
        feeds_by_size.append(feeds)
    sessions = {form: open_session(path, "synthesizer decoder", path) for form, path in parts.decoders.items()}
    seconds = {form: [np.inf] * len(TUNE_FRAMES) for form in sessions}
    outputs = {}
    for _ in range(TUNE_REPEATS):  # forms in turn, so a noisy moment hits each
        for form, session in sessions.items():
            for i, feeds in enumerate(feeds_by_size):
                began = time.perf_counter()
                out = session.run(None, feeds)[0]
                seconds[form][i] = min(seconds[form][i], time.perf_counter() - began)
                outputs[form, i] = out
    differences = {form: max(float(np.abs(outputs[form, i] - outputs["1d", i]).max())
                             for i in range(len(TUNE_FRAMES))) for form in sessions}
    form = choose_form(seconds, differences)
    del sessions
    threads = cpu_threads()
    tuning = {"version": TUNING_VERSION, "form": form, "frames": list(TUNE_FRAMES), "margin": margin,
              "threads": threads, "seconds": {f: [round(s, 4) for s in t] for f, t in seconds.items()},
              "max_difference": differences, "lanes": 1}
    if threads > 1:
        lane_feeds = {name: (x[:, :, :LANE_WINDOW_FRAMES + 2 * margin] if name == parts.z_name else x)
                      for name, x in feeds_by_size[-1].items()}
        two_at_once = _time_two_at_once(parts.decoders[form], lane_feeds)
        # a frame kept: each window decodes its margins too
        tuning["lanes"] = choose_lanes(seconds[form][-1] / TUNE_FRAMES[-1],
                                       two_at_once / (2 * LANE_WINDOW_FRAMES), threads)
        tuning["lane_seconds"] = round(two_at_once, 4)  # a lane's window, beside another
        tuning["lane_frames"] = LANE_WINDOW_FRAMES
    return tuning


def _prepare_bert(models_dir: Path, derived: Path) -> dict:
    source = models_dir / BERT_PATH
    if not source.is_file():
        raise ModelError(f"BERT model not found: {source}")
    # the same features on every CPU: where signed 8-bit products saturate, unsigned weights
    unsigned = not signed_int8_products_exact()
    graph = prepared_whole(source, derived)
    if (graph is None or read_stamp(graph.parent, source).get("unsigned_int8") != unsigned
            or not (optimized_path(graph).is_file() or has_weights(graph.parent))):
        # new, made for another CPU, or before weights were made unsigned where needed
        graph = _made(make_whole, "BERT model", source, derived, unsigned_int8=unsigned)
    optimize(graph)
    drop_weights(graph.parent)
    return {"unsigned_int8": unsigned}


def _made(make, what: str, source: Path, derived: Path, **options):
    try:
        return make(source, derived, prepare_options, **options)
    except UnreadableModel as e:
        raise unreadable(what, source, e) from None


def _prepare_voice(models_dir: Path, voice: str, derived: Path) -> dict | None:
    source = _synthesizer(models_dir, voice)
    tuning = None
    if source.is_file() and missing(models_dir, derived, voice):
        parts = cached_split(source, derived)
        whole = None if parts else prepared_whole(source, derived)
        folder = model_folder(source, derived)
        if not has_weights(folder):  # new, or made for another CPU: its weights are gone
            clear_folder(folder)
            parts = whole = None
        if not (parts or whole):
            parts = _made(split_synthesizer, "synthesizer", source, derived)
            whole = None if parts else _made(make_whole, "synthesizer", source, derived)
        if parts:
            for graph in [parts.front, *parts.decoders.values()]:
                optimize(graph)
            config = read_config(source.parent / "config.json")
            tuning = tune(parts, decoder_margin(config.get("model", {})))
            tmp = folder / "tuning.tmp"
            tmp.write_text(json.dumps(tuning))
            durable_replace(tmp, tuning_path(folder))
            for form, graph in parts.decoders.items():  # the slower form's copy is not kept
                if form != tuning["form"]:
                    copy = optimized_path(graph)
                    copy.unlink(missing_ok=True)
                    copy.with_name(copy.name + ".weights").unlink(missing_ok=True)
        else:
            optimize(whole)
        drop_weights(folder)
    load_voice(models_dir, voice, None, derived)  # as the daemon will: every other file checked too
    return tuning


def prepare(models_dir: str | Path, derived: str | Path, voices: list[str] | None = None,
            report: Callable[[Step], None] | None = None) -> list[Step]:
    """Make what is missing for BERT and `voices` (default: every installed voice)."""
    models_dir, derived = Path(models_dir).expanduser(), Path(derived)
    if not models_dir.is_dir():
        raise ModelError(f"models directory not found: {models_dir}")
    steps = []
    for what in ["bert", *(installed_voices(models_dir) if voices is None else voices)]:
        if not missing(models_dir, derived, what):
            step = Step(what, done=True)
        else:
            began = time.monotonic()
            child = subprocess.run(
                [sys.executable, "-m", "hayakoe_pi.prepare", "--models", str(models_dir),
                 "--derived", str(derived), *(["--bert"] if what == "bert" else ["--voice", what])],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if child.returncode != 0:
                message = child.stderr.strip().splitlines()[-1] if child.stderr.strip() else ""
                if child.returncode < 0 or not message:
                    message = (f"preparing {what} stopped (exit {child.returncode}"
                               f"{', out of memory?' if child.returncode in (-9, 137) else ''})")
                raise ModelError(message.removeprefix("hayakoe-pi: error: "))
            result = json.loads(child.stdout.strip().splitlines()[-1])
            step = Step(what, done=False, seconds=time.monotonic() - began, peak_mb=result["peak_mb"],
                        tuning=result.get("tuning"))
        steps.append(step)
        if report:
            report(step)
    return steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hayakoe_pi.prepare")
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--derived", required=True, type=Path)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--bert", action="store_true")
    which.add_argument("--voice")
    args = ap.parse_args(argv)
    try:
        if args.bert:
            tuning = _prepare_bert(args.models, args.derived)
        else:
            tuning = _prepare_voice(args.models, args.voice, args.derived)
    except ModelError as e:
        print(f"hayakoe-pi: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"peak_mb": round(_peak_mb(), 1), "tuning": tuning}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
