"""Timing the decoder's forms on this CPU (and two windows at once, on decoder lanes),
choosing, and the record of it that the voice's sessions are made by (tuning.<cpu key>.json)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from .cpu import cpu_key, cpu_threads
from .graphs import input_channels
from .lanes import LANE_WINDOW_FRAMES, lane_threads
from .sessions import open_session
from .split import SplitModel

# Decoder windows timed by the tuner (latent frames, margins added): the short
# first window and the engine's full one.
TUNE_FRAMES = (48, 256)
# Best of 3; tools/arm64-check asks for 1 (HAYAKOE_PI_TUNE_REPEATS), and no warm-up round:
# emulated timings mean nothing, and each emulated run of a 256-frame window takes 10 s.
TUNE_REPEATS = max(1, int(os.environ.get("HAYAKOE_PI_TUNE_REPEATS", "3")))
WARM_UP_ROUNDS = 1 if TUNE_REPEATS > 1 else 0  # a first round of two at once, untimed
SAME_SAMPLES = 1e-4  # a form is a candidate only if it gives the samples of the one cut
# Two decoder lanes (two windows at once, on half the cores each) are kept only
# if a frame kept costs at least this much less than with one window at a time
# on every core: a second window in flight costs its working memory (~50 MB).
LANES_GAIN = 0.05
TUNING_VERSION = 2  # 2: decoder lanes timed too; an older record is timed again


def tuning_path(folder: Path) -> Path:
    """The decoder timings prepare measured on this CPU (see tune)."""
    return folder / f"tuning.{cpu_key()}.json"


def read_tuning(folder: Path) -> dict | None:
    try:
        tuning = json.loads(tuning_path(folder).read_text())
    except (OSError, ValueError):
        return None
    return tuning if isinstance(tuning, dict) and tuning.get("version") == TUNING_VERSION else None


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


def time_two_at_once(path: Path, feeds: dict) -> float:
    """Least wall time of two runs of the decoder at `path` at once, each on a lane."""
    from concurrent.futures import ThreadPoolExecutor

    lanes = [open_session(path, "synthesizer decoder", path, threads=lane_threads(2)) for _ in range(2)]
    seconds = []
    with ThreadPoolExecutor(2) as pool:
        for _ in range(WARM_UP_ROUNDS + TUNE_REPEATS):
            began = time.perf_counter()
            list(pool.map(lambda lane: lane.run(None, feeds), lanes))
            seconds.append(time.perf_counter() - began)
    return min(seconds[WARM_UP_ROUNDS:])


def tune(parts: SplitModel, margin: int) -> dict:
    """Time each decoder form on this CPU, with the threads the daemon uses, and choose."""
    import onnx

    graph = onnx.load(str(parts.decoders["1d"]), load_external_data=False).graph
    rng = np.random.default_rng(0)
    feeds_by_size = []
    for frames in TUNE_FRAMES:
        feeds = {parts.z_name: rng.standard_normal((1, input_channels(graph, parts.z_name),
                                                    frames + 2 * margin), dtype=np.float32)}
        if parts.g_name:
            feeds[parts.g_name] = rng.standard_normal((1, input_channels(graph, parts.g_name), 1),
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
        two_at_once = time_two_at_once(parts.decoders[form], lane_feeds)
        # a frame kept: each window decodes its margins too
        tuning["lanes"] = choose_lanes(seconds[form][-1] / TUNE_FRAMES[-1],
                                       two_at_once / (2 * LANE_WINDOW_FRAMES), threads)
        tuning["lane_seconds"] = round(two_at_once, 4)  # a lane's window, beside another
        tuning["lane_frames"] = LANE_WINDOW_FRAMES
    return tuning
