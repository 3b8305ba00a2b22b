"""The decoder in 8 bits, made from a voice's own 1-D decoder and kept only where it keeps
the voice and wins time on this CPU (gate.py). Its record, int8.<cpu key>.json, is
written last: a preparation killed before it leaves nothing a later start trusts.

Static QDQ quantization: the convolutions' weights 8-bit signed per output
channel, their inputs 8-bit unsigned with ranges measured once on the voice's own
latents (calibrate.py, ranges.py); the stages nearest the output kept FP32 as far as
the sound needs (precision.py, `choose_int8`); the transposed convolutions (ONNX Runtime has no 8-bit one on
the CPU) and the decoder's two ends stay FP32 (`kept_in_fp32`), and so do the
element-wise ops between (leaky ReLU, the residual sums): in 8 bits each of these rounds
the residual stream itself, and took 10-15 dB of SNR (bench/README.md, issue 49). The
1-D form is the one a Pi runs (no blocked kernels on ARM: forms.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from ..durable import durable_replace
from .cpu import cpu_key, cpu_threads
from .gate import compare, decide, sound
from .lanes import LANE_WINDOW_FRAMES
from .polyphase import as_convolutions
from .precision import conv_stages, describe, excluded, fp32_choices
from .ranges import PERCENTILE, activation_ranges, write_ranges
from .sessions import open_session, optimized_path
from .split import SplitModel
from .tune import TUNE_FRAMES, TUNE_REPEATS, WARM_UP_ROUNDS, choose_lanes, time_two_at_once

INT8_NAME = "decoder-int8.onnx"
LATENTS_NAME = "latents.npz"  # calibrate.py's: each sentence's decoder inputs
INT8_VERSION = 2  # 2: precision chosen per stage, percentile ranges (issue 55); made again
DECODER_CHOICES = ("fp32", "int8", "auto")  # engine.decoder
# Latent frames a calibration run decodes at once: ONNX Runtime's calibration keeps every
# tensor of a run alive to its end (measured, full-size voice: 180 MB + 10 MB a frame; a
# whole 200-frame sentence peaked at 1.3 GB), so the sentences go through in short windows.
CALIBRATION_FRAMES = 24
# Calibration sentences each precision tried is heard on: its stages are chosen on these,
# the verdict is given on the held-out ones.
CHOOSING_SENTENCES = 3


def int8_record_path(folder: Path) -> Path:
    return folder / f"int8.{cpu_key()}.json"


def read_int8(folder: Path) -> dict | None:
    """The 8-bit decoder's record on this CPU (used or not, and why); None: not made yet,
    or its files are gone."""
    try:
        record = json.loads(int8_record_path(folder).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != INT8_VERSION:
        return None
    if record.get("use") and not optimized_path(folder / INT8_NAME).is_file():
        return None
    return record


def read_latents(path: Path) -> dict[str, list[dict[str, np.ndarray]]]:
    """{"calibration": [feeds…], "held_out": [feeds…]} from calibrate.py's file."""
    groups: dict[str, dict[str, dict[str, np.ndarray]]] = {"calibration": {}, "held_out": {}}
    with np.load(path) as data:
        for key in data.files:
            group, sentence, name = key.split("/", 2)
            groups[group].setdefault(sentence, {})[name] = data[key]
    return {group: list(feeds.values()) for group, feeds in groups.items()}


def quantize_decoder(source: Path, target: Path, calibration: list[dict[str, np.ndarray]],
                     upsamplers: bool = False, exclude: list[str] | None = None,
                     ranges: dict[str, tuple[float, float]] | None = None) -> None:
    """The 1-D decoder at `source` in 8 bits at `target`, the convolutions named in `exclude`
    (default: the two ends, kept_in_fp32) left FP32, with `ranges` (ranges.py; measured on
    `calibration` when not given). With `upsamplers`, its transposed convolutions too (as
    convolutions: polyphase.py); prepare leaves them FP32: in 8 bits they took 10-12 dB of
    SNR from every test voice for 3 % of the multiply-adds (bench/README.md; bench/int8_work.py
    measures both)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    model = str(source)
    if upsamplers:
        model = onnx.load(str(source))
        as_convolutions(model)
        ranges = None  # the rewrite's own tensors need theirs
    if ranges is None:
        ranges = activation_ranges(model, calibration)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    cache = target.with_name(f"{target.name}.{os.getpid()}.ranges.json")
    write_ranges(ranges, cache)
    logging.disable(logging.WARNING)  # its advice to pre-process, at every call: noise in the journal
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # ONNX Runtime prints as it goes
            quantize_static(model, str(tmp), None, quant_format=QuantFormat.QDQ, op_types_to_quantize=["Conv"],
                            nodes_to_exclude=kept_in_fp32(source) if exclude is None else exclude,
                            per_channel=True, weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8,
                            calibrate_method=CalibrationMethod.MinMax, calibration_cache_path=str(cache))
    finally:
        logging.disable(logging.NOTSET)
        cache.unlink(missing_ok=True)
    durable_replace(tmp, target)  # on disk before it takes the name


def kept_in_fp32(decoder: Path) -> list[str]:
    """The first and the last convolution, by name: the first reads the latents (a
    range set by a few far values leaves the rest coarse), the last makes the samples
    themselves (its rounding is heard as it is). Together a sliver of the decoder's work
    (one pass at the latents' rate, one output channel), and most of the distance int8
    had from FP32 (issue 49, held-out sentences, worst: full-size seed-20 voice 30.5 dB
    SNR and 0.18 dB log-mel with them in 8 bits, 39.4 dB and 0.06 dB without; tiny voice
    30.0 and 0.24, 36.9 and 0.07)."""
    import onnx

    convs = [node.name for node in onnx.load(str(decoder), load_external_data=False).graph.node
             if node.op_type == "Conv"]
    return [convs[0], convs[-1]] if convs else []


def _best_times(sessions: list, feeds: dict) -> list[float]:
    """Least time of each session over TUNE_REPEATS runs, taken in turn (after a warm-up)."""
    best = [np.inf] * len(sessions)
    for _ in range(WARM_UP_ROUNDS + TUNE_REPEATS):
        for i, session in enumerate(sessions):
            began = time.perf_counter()
            session.run(None, feeds)
            best[i] = min(best[i], time.perf_counter() - began)
    return best


def choose_int8(source: Path, fp32_path: Path, target: Path, latents: dict, z_name: str, sample_rate: int,
                window_frames: int, keep: bool = False) -> dict:
    """The 8-bit decoder of the 1-D decoder `source` at `target`, its precision chosen stage
    by stage on the calibration sentences (precision.py: FP32 kept from the output end until
    the sound passes), then judged on the held-out ones and timed against `fp32_path` over a
    window of `window_frames`; its record (without the lanes). `target` is removed when not
    used, unless `keep` (the last one tried then stays, to be heard)."""
    import onnx

    _remove(target)  # what a killed run left: its optimized copy would be taken for this one's
    calibration = [window for feeds in latents["calibration"]
                   for window in _windows(feeds, z_name, CALIBRATION_FRAMES)]
    ranges = activation_ranges(source, calibration)
    stages = conv_stages(onnx.load(str(source), load_external_data=False))
    ends = kept_in_fp32(source)
    fp32 = open_session(fp32_path, "synthesizer decoder", fp32_path)
    choosing = latents["calibration"][:CHOOSING_SENTENCES]
    reference = [fp32.run(None, feeds)[0].reshape(-1) for feeds in choosing]
    tried, chosen, why = [], None, "no stage of its own to put in 8 bits"
    for kept in fp32_choices(stages, ends):
        _remove(target)
        quantize_decoder(source, target, [], exclude=excluded(kept, ends), ranges=ranges)
        int8 = open_session(target, "8-bit decoder", target)
        quality = compare([(a, int8.run(None, f)[0].reshape(-1)) for a, f in zip(reference, choosing)], sample_rate)
        del int8
        passes, why = sound(quality)
        tried.append({"fp32_stages": [s.index for s in kept], "passes": passes, **_worst(quality)})
        if passes:
            chosen = kept
            break
    record = {"version": INT8_VERSION, "calibration": {"percentile": PERCENTILE}, "tried": tried,
              "stages": [{"stage": s.index, "rate": s.rate, "share": round(s.share, 3),
                          "fp32": chosen is None or s in chosen or not set(s.convs) - set(ends)} for s in stages]}
    if chosen is None:
        if not keep:
            _remove(target)
        return {**record, "use": False, "fp32_stages": [s.index for s in stages],
                "reason": f"8-bit decoder too far from FP32 with every stage but the first kept FP32 ({why})"}
    int8 = open_session(target, "8-bit decoder", target)
    quality = compare([(fp32.run(None, f)[0].reshape(-1), int8.run(None, f)[0].reshape(-1))
                       for f in latents["held_out"]], sample_rate)
    window = _window_feeds(latents["held_out"], z_name, window_frames)
    fp32_seconds, int8_seconds = _best_times([fp32, int8], window)
    del fp32, int8
    use, reason = decide(quality, fp32_seconds, int8_seconds)
    if not use and not keep:
        _remove(target)
    return {**record, "use": use, "reason": f"{reason}; {describe(chosen)}", **quality,
            "fp32_stages": [s.index for s in chosen], "seconds": {"fp32": round(fp32_seconds, 4),
                                                                   "int8": round(int8_seconds, 4)},
            "speedup": round(fp32_seconds / int8_seconds, 3)}


def _worst(quality: dict) -> dict:
    return {key: quality[key]["worst"] for key in quality if isinstance(quality[key], dict)}


def make_int8(parts: SplitModel, tuning: dict, latents: dict, sample_rate: int) -> dict:
    """Make, check and time the 8-bit decoder; its record (written last) says whether it is used."""
    folder, target = parts.folder, parts.folder / INT8_NAME
    margin, frames = tuning["margin"], TUNE_FRAMES[-1]
    record = choose_int8(parts.decoders["1d"], parts.decoders[tuning["form"]], target, latents, parts.z_name,
                         sample_rate, frames + 2 * margin)
    record.update({"frames": frames, "fp32_form": tuning["form"], "threads": cpu_threads(), "lanes": 1})
    if record["use"] and cpu_threads() > 1:
        window = _window_feeds(latents["held_out"], parts.z_name, LANE_WINDOW_FRAMES + 2 * margin)
        two_at_once = time_two_at_once(target, window)
        record["lanes"] = choose_lanes(record["seconds"]["int8"] / frames, two_at_once / (2 * LANE_WINDOW_FRAMES),
                                       cpu_threads())
        record["lane_seconds"], record["lane_frames"] = round(two_at_once, 4), LANE_WINDOW_FRAMES
    path = int8_record_path(folder)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    durable_replace(tmp, path)
    return record


def _remove(graph: Path) -> None:
    for path in (optimized_path(graph), graph):
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".weights").unlink(missing_ok=True)


def _windows(feeds: dict, z_name: str, frames: int) -> list[dict]:
    z = feeds[z_name]
    return [{**feeds, z_name: np.ascontiguousarray(z[:, :, start:start + frames])}
            for start in range(0, z.shape[2], frames)]


def _window_feeds(sentences: list[dict], z_name: str, frames: int) -> dict:
    """A decoder window of `frames` latent frames made of the held-out sentences' own z."""
    z = np.concatenate([feeds[z_name] for feeds in sentences], axis=2)
    z = np.tile(z, (1, 1, -(-frames // z.shape[2])))[:, :, :frames]
    return {**sentences[0], z_name: np.ascontiguousarray(z)}


def describe_int8(record: dict) -> str:
    """The record in one line: used or not, why, which stages stayed FP32, the figures."""
    used = "int8" if record["use"] else "FP32 kept"
    tried = "; ".join(f"{'none' if not t['fp32_stages'] else ','.join(map(str, t['fp32_stages']))} FP32: "
                      f"{'passed' if t['passes'] else 'too far'}" for t in record["tried"])
    line = f"{used}: {record['reason']} (stages tried on the calibration sentences: {tried}"
    if "seconds" not in record:  # no precision passed: nothing judged or timed
        return line + ")"
    return (f"{line}; int8 {record['seconds']['int8'] * 1000:.0f} ms against FP32 "
            f"{record['seconds']['fp32'] * 1000:.0f} ms for {record['frames']} frames; "
            f"{record['sentences']} held-out sentences: SNR mean {record['snr_db']['mean']:.1f} dB, "
            f"worst {record['snr_db']['worst']:.1f} dB; log-mel mean {record['mel_db']['mean']:.2f} dB, "
            f"worst {record['mel_db']['worst']:.2f} dB)")
