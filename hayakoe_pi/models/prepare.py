"""Making what is derived from the model files, one model at a time, each in a child process.

Per model file, once: its graph apart from its weights with its constants
folded (weights.py), for a voice the split into the decoder and the rest
with the decoder's 2-D forms (split.py), ONNX Runtime's optimized copy of
each graph, and for a voice the decoder form that is fastest on this CPU
(tune.py). Loading a model whole to do this held it several times over (the
full-size voice peaked at 1.3 GB, more than a 1 GB Pi has free); here no
step holds its weights in memory, and each model's step runs in a child of
its own, whose memory goes back when it exits. The daemon then loads only
finished files, memory-mapped.

`prepare()` runs the steps that are missing, each as

    python -m hayakoe_pi.models.make --models DIR --derived DIR (--bert | --voice NAME)

(make.py). A new CPU or ONNX Runtime makes new optimized copies and timings (cpu.cpu_key).
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
from .tune import describe_tuning, read_tuning
from .voices import SPEAKERS_DIR, installed_voices
from .whole import prepared_whole


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


def missing(models_dir: Path, derived: Path, what: str) -> bool:
    """Whether a step has something left to make (cheap: only file names and stamps)."""
    source = models_dir / BERT_PATH if what == "bert" else synthesizer_path(models_dir, what)
    if not source.is_file():
        return True  # the child says what is wrong
    parts = None if what == "bert" else cached_split(source, derived)
    graphs = _graphs_needed(parts) if parts else [prepared_whole(source, derived)]
    if what == "bert" and graphs[0] is not None and "unsigned_int8" not in read_stamp(graphs[0].parent, source):
        return True  # made before BERT's 8-bit products were checked on the CPU
    return not graphs or not all(g is not None and optimized_path(g).is_file() for g in graphs)


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
                [sys.executable, "-m", "hayakoe_pi.models.make", "--models", str(models_dir),
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
