"""Making what is derived from the model files, one model at a time, each in a child process.

Per model file, once: its graph apart from its weights with its constants
folded (weights.py), for a voice the split into the decoder and the rest
with the decoder's 2-D forms (split.py), ONNX Runtime's optimized copy of
each graph, and for a voice the decoder form that is fastest on this CPU
(tune.py); where engine.decoder asks for it, the 8-bit decoder (quantize.py)
from latents of the voice's own front (calibrate.py, a child too). Loading a
model whole to do this held it several times over (the full-size voice
peaked at 1.3 GB, more than a 1 GB Pi has free); here no
step holds its weights in memory, and each model's step runs in a child of
its own, whose memory goes back when it exits. The daemon then loads only
finished files, memory-mapped.

`prepare()` runs the steps that are missing, each as

    python -m hayakoe_pi.models.make --models DIR --derived DIR (--bert | --voice NAME)

(make.py); for an 8-bit decoder `--voice NAME --keep-weights`, then
`python -m hayakoe_pi.synthesis.calibrate`, then `make --int8 NAME`. A new CPU or ONNX
Runtime makes new optimized copies and timings (cpu.cpu_key).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .bert import BERT_PATH
from .errors import ModelError
from .folders import read_stamp
from .sessions import optimized_path
from .split import SplitModel, cached_split
from .quantize import describe_int8, read_int8
from .tune import describe_tuning, read_tuning
from .voices import SPEAKERS_DIR, installed_voices
from .whole import prepared_whole

MAKE = "hayakoe_pi.models.make"


@dataclass
class Step:
    what: str  # "bert" or a voice name
    done: bool  # nothing was left to make
    seconds: float = 0.0
    peak_mb: float = 0.0  # the child's peak resident memory
    tuning: dict | None = None  # a voice's decoder timings; BERT's {"unsigned_int8": …}
    int8: dict | None = None  # the 8-bit decoder's record (quantize.py), when it was made

    def line(self) -> str:
        name = "BERT" if self.what == "bert" else f"voice {self.what}"
        if self.done:
            return f"{name}: up to date"
        details = [f"{name}: prepared in {self.seconds:.1f} s, peak memory {self.peak_mb:.0f} MB"]
        if self.tuning:
            details.append(describe_bert(self.tuning["unsigned_int8"]) if self.what == "bert"
                           else describe_tuning(self.tuning))
        if self.int8:
            details.append(f"decoder {describe_int8(self.int8)}")
        return "; ".join(details)


def describe_bert(unsigned_int8: bool) -> str:
    if unsigned_int8:
        return "8-bit weights made unsigned (this CPU's signed 8-bit products saturate)"
    return "8-bit products exact on this CPU"


def synthesizer_path(models_dir: Path, voice: str) -> Path:
    return models_dir / SPEAKERS_DIR / voice / "synthesizer.onnx"


def _graphs_needed(parts: SplitModel) -> list[Path]:
    """The graphs a voice runs: the front and the decoder form tuned for this CPU."""
    tuning = read_tuning(parts.folder)
    return [parts.front, parts.decoders[tuning["form"]]] if tuning else []


def missing(models_dir: Path, derived: Path, what: str, decoder: str = "fp32") -> bool:
    """Whether a step has something left to make (cheap: only file names and stamps); with
    an 8-bit `decoder` asked for, a voice's 8-bit decoder made (or refused) on this CPU too."""
    return _fp32_missing(models_dir, derived, what) or (
        decoder != "fp32" and what != "bert" and _int8_missing(models_dir, derived, what))


def _int8_missing(models_dir: Path, derived: Path, voice: str) -> bool:
    parts = cached_split(synthesizer_path(models_dir, voice), derived)
    return parts is not None and read_int8(parts.folder) is None  # a voice kept whole has none


def _fp32_missing(models_dir: Path, derived: Path, what: str) -> bool:
    source = models_dir / BERT_PATH if what == "bert" else synthesizer_path(models_dir, what)
    if not source.is_file():
        return True  # the child says what is wrong
    parts = None if what == "bert" else cached_split(source, derived)
    graphs = _graphs_needed(parts) if parts else [prepared_whole(source, derived)]
    if what == "bert" and graphs[0] is not None and "unsigned_int8" not in read_stamp(graphs[0].parent, source):
        return True  # made before BERT's 8-bit products were checked on the CPU
    return not graphs or not all(g is not None and optimized_path(g).is_file() for g in graphs)


def _child(what: str, module: str, *args: str) -> dict:
    """Run one step's child process; its JSON line, or the error it gave."""
    child = subprocess.run([sys.executable, "-m", module, *args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if child.returncode != 0:
        message = child.stderr.strip().splitlines()[-1] if child.stderr.strip() else ""
        if child.returncode < 0 or not message:
            message = (f"preparing {what} stopped (exit {child.returncode}"
                       f"{', out of memory?' if child.returncode in (-9, 137) else ''})")
        raise ModelError(message.removeprefix("hayakoe-pi: error: "))
    return json.loads(child.stdout.strip().splitlines()[-1])


def _make(models_dir: Path, derived: Path, what: str, decoder: str) -> Step:
    began = time.monotonic()
    where = ["--models", str(models_dir), "--derived", str(derived)]
    if what == "bert":
        made = _child(what, MAKE, *where, "--bert")
        return Step(what, False, time.monotonic() - began, made["peak_mb"], made.get("tuning"))
    int8 = decoder != "fp32"
    made = _child(what, MAKE, *where, "--voice", what, *(["--keep-weights"] if int8 else []))
    peaks, record = [made["peak_mb"]], None
    if int8 and _int8_missing(models_dir, derived, what):
        peaks.append(_child(what, "hayakoe_pi.synthesis.calibrate", *where, "--voice", what)["peak_mb"])
        made_int8 = _child(what, MAKE, *where, "--int8", what)
        peaks.append(made_int8["peak_mb"])
        record = made_int8["tuning"]
    return Step(what, False, time.monotonic() - began, max(peaks), made.get("tuning"), record)


def prepare(models_dir: str | Path, derived: str | Path, voices: list[str] | None = None,
            report: Callable[[Step], None] | None = None, decoder: str = "fp32") -> list[Step]:
    """Make what is missing for BERT and `voices` (default: every installed voice), and
    where `decoder` is int8 or auto, each voice's 8-bit decoder."""
    models_dir, derived = Path(models_dir).expanduser(), Path(derived)
    if not models_dir.is_dir():
        raise ModelError(f"models directory not found: {models_dir}")
    steps = []
    for what in ["bert", *(installed_voices(models_dir) if voices is None else voices)]:
        step = (Step(what, done=True) if not missing(models_dir, derived, what, decoder)
                else _make(models_dir, derived, what, decoder))
        steps.append(step)
        if report:
            report(step)
    return steps
