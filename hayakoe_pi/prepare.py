"""Making what is derived from the model files, one model at a time, each in a child process.

The split of a synthesizer, its decoder form and ONNX Runtime's optimized
copies are made once per model file. Making them holds the model several
times over (the full-size voice peaks at 1.3 GB when it is all done in one
process, more than a 1 GB Pi has free); in a child of its own each model's
step holds only that model, and its memory goes back when the child exits.
The daemon then loads only finished files, memory-mapped.

    python -m hayakoe_pi.prepare --models DIR --derived DIR (--bert | --voice NAME)

is one step (the child); `prepare()` runs the steps that are missing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .models import (BERT_PATH, SPEAKERS_DIR, Bert, ModelError, installed_voices, load_voice,
                     optimized_path)
from .split import cached_split


@dataclass
class Step:
    what: str  # "bert" or a voice name
    done: bool  # nothing was left to make
    seconds: float = 0.0
    peak_mb: float = 0.0  # the child's peak resident memory

    def line(self) -> str:
        name = "BERT" if self.what == "bert" else f"voice {self.what}"
        if self.done:
            return f"{name}: up to date"
        return f"{name}: prepared in {self.seconds:.1f} s, peak memory {self.peak_mb:.0f} MB"


def _split_dir(derived: Path) -> Path:
    return derived / "split"


def _optimized_dir(derived: Path) -> Path:
    return derived / "optimized"


def missing(models_dir: Path, derived: Path, what: str) -> bool:
    """Whether a step has something left to make (cheap: only file names and stamps)."""
    if what == "bert":
        bert = models_dir / BERT_PATH
        return not (bert.is_file() and optimized_path(bert, _optimized_dir(derived)).is_file())
    synth = models_dir / SPEAKERS_DIR / what / "synthesizer.onnx"
    if not synth.is_file():
        return True  # the child says what is wrong
    parts = cached_split(synth, _split_dir(derived))
    if parts is None:
        return True
    return not all(optimized_path(p, _optimized_dir(derived)).is_file() for p in (parts.front, parts.decoder))


def _peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _make(models_dir: Path, derived: Path, what: str) -> None:
    """One step, in this process."""
    if what == "bert":
        Bert(models_dir, _optimized_dir(derived))
    else:
        load_voice(models_dir, what, None, _split_dir(derived), _optimized_dir(derived))


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
            peak = json.loads(child.stdout.strip().splitlines()[-1])["peak_mb"]
            step = Step(what, done=False, seconds=time.monotonic() - began, peak_mb=peak)
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
        _make(args.models, args.derived, "bert" if args.bert else args.voice)
    except ModelError as e:
        print(f"hayakoe-pi: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"peak_mb": round(_peak_mb(), 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
