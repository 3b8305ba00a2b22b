"""The decoder in 8 bits, made from a voice's own 1-D decoder and kept only where it keeps
the voice and wins time on this CPU (gate.py). Its record, int8.<cpu key>.json, is
written last: a preparation killed before it leaves nothing a later start trusts.

Static QDQ quantization: the convolutions' weights 8-bit signed per output
channel, their inputs 8-bit unsigned with ranges measured on the voice's own
latents (calibrate.py); the transposed convolutions (ONNX Runtime has no 8-bit one on
the CPU) and the decoder's two ends stay FP32 (`kept_in_fp32`), and so do the
element-wise ops between (leaky ReLU, the residual sums): in 8 bits each of these rounds
the residual stream itself, and took 10-15 dB of SNR (bench/README.md, issue 49). The
1-D form is the one a Pi runs (no blocked kernels on ARM: forms.py).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from ..durable import durable_replace
from .cpu import cpu_key, cpu_threads
from .gate import compare, decide
from .lanes import LANE_WINDOW_FRAMES
from .polyphase import as_convolutions
from .sessions import open_session, optimized_path
from .split import SplitModel
from .tune import TUNE_FRAMES, TUNE_REPEATS, WARM_UP_ROUNDS, choose_lanes, time_two_at_once

INT8_NAME = "decoder-int8.onnx"
LATENTS_NAME = "latents.npz"  # calibrate.py's: each sentence's decoder inputs
INT8_VERSION = 1
DECODER_CHOICES = ("fp32", "int8", "auto")  # engine.decoder
# Latent frames a calibration run decodes at once: ONNX Runtime's calibration keeps every
# tensor of a run alive to its end (measured, full-size voice: 180 MB + 10 MB a frame; a
# whole 200-frame sentence peaked at 1.3 GB), so the sentences go through in short windows.
CALIBRATION_FRAMES = 24


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
                     upsamplers: bool = False) -> None:
    """The 1-D decoder at `source` in 8 bits at `target`; with `upsamplers`, its transposed
    convolutions too (as convolutions: polyphase.py). prepare leaves them FP32: in 8 bits
    they took 10-12 dB of SNR from every test voice for 3 % of the multiply-adds
    (bench/README.md; bench/int8_work.py measures both)."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)

    class Latents(CalibrationDataReader):
        def __init__(self):
            self._feeds = iter(calibration)

        def get_next(self):
            return next(self._feeds, None)

    model = str(source)
    if upsamplers:
        model = onnx.load(str(source))
        as_convolutions(model)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    quantize_static(model, str(tmp), Latents(), quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=["Conv"], nodes_to_exclude=kept_in_fp32(source),
                    per_channel=True, weight_type=QuantType.QInt8,
                    activation_type=QuantType.QUInt8, calibrate_method=CalibrationMethod.MinMax)
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


def make_int8(parts: SplitModel, tuning: dict, latents: dict, sample_rate: int) -> dict:
    """Make, check and time the 8-bit decoder; its record (written last) says whether it is used."""
    folder, target = parts.folder, parts.folder / INT8_NAME
    _remove(target)  # what a killed run left: its optimized copy would be taken for this one's
    calibration = [window for feeds in latents["calibration"]
                   for window in _windows(feeds, parts.z_name, CALIBRATION_FRAMES)]
    quantize_decoder(parts.decoders["1d"], target, calibration)
    fp32_path = parts.decoders[tuning["form"]]
    fp32 = open_session(fp32_path, "synthesizer decoder", fp32_path)
    int8 = open_session(target, "8-bit decoder", target)
    pairs = [(fp32.run(None, feeds)[0].reshape(-1), int8.run(None, feeds)[0].reshape(-1))
             for feeds in latents["held_out"]]
    quality = compare(pairs, sample_rate)
    margin, frames = tuning["margin"], TUNE_FRAMES[-1]
    window = _window_feeds(latents["held_out"], parts.z_name, frames + 2 * margin)
    fp32_seconds, int8_seconds = _best_times([fp32, int8], window)
    del fp32, int8
    use, reason = decide(quality, fp32_seconds, int8_seconds)
    record = {"version": INT8_VERSION, "use": use, "reason": reason, **quality, "frames": frames,
              "fp32_form": tuning["form"], "seconds": {"fp32": round(fp32_seconds, 4), "int8": round(int8_seconds, 4)},
              "speedup": round(fp32_seconds / int8_seconds, 3), "threads": cpu_threads(), "lanes": 1}
    if use and cpu_threads() > 1:
        lane_feeds = {k: (v[:, :, :LANE_WINDOW_FRAMES + 2 * margin] if k == parts.z_name else v)
                      for k, v in window.items()}
        two_at_once = time_two_at_once(target, lane_feeds)
        record["lanes"] = choose_lanes(int8_seconds / frames, two_at_once / (2 * LANE_WINDOW_FRAMES), cpu_threads())
        record["lane_seconds"], record["lane_frames"] = round(two_at_once, 4), LANE_WINDOW_FRAMES
    if not use:  # only the record is kept: a later start knows without making it again
        _remove(target)
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
    used = "int8" if record["use"] else "FP32 kept"
    return (f"{used}: {record['reason']} (int8 {record['seconds']['int8'] * 1000:.0f} ms against FP32 "
            f"{record['seconds']['fp32'] * 1000:.0f} ms for {record['frames']} frames; "
            f"{record['sentences']} held-out sentences: SNR mean {record['snr_db']['mean']:.1f} dB, "
            f"worst {record['snr_db']['worst']:.1f} dB; log-mel mean {record['mel_db']['mean']:.2f} dB, "
            f"worst {record['mel_db']['worst']:.2f} dB)")
