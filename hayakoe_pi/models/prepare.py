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
Runtime makes new optimized copies and timings (cpu.cpu_key). Each child is a `Stage`,
told to `progress` when it starts and ends, failed or not (the daemon's journal), and
listed done or not by `stages` (`hayakoe-pi check`).

A prepared copy that is not what it was when made (`damaged`: checksums.py, quickly at
every start, fully in `hayakoe-pi prepare` and `check`) is removed first, and what needs it
made again; the stage that makes it says why.
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
from .checksums import adopt, damage, recorded, remove
from .errors import ModelError
from .folders import read_stamp
from .sessions import optimized_path
from .split import SplitModel, cached_split
from .quantize import INT8_NAME, LATENTS_NAME, describe_int8, read_int8, read_latents
from .tune import describe_tuning, read_tuning
from .voices import SPEAKERS_DIR, installed_voices
from .weights import has_weights
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


@dataclass
class Stage:
    """One child process of a model's preparation."""
    what: str  # "bert" or a voice name
    number: int  # 1-based, of `count` for this model
    count: int
    task: str  # what the child makes
    done: bool = False
    remade: str = ""  # why it is made again: the damaged prepared files it makes anew
    failed: str = ""  # why it did not end: the child's error, or how it died

    def name(self) -> str:
        model = "BERT" if self.what == "bert" else f"voice {self.what}"
        return f"{model} {self.number}/{self.count}: {self.task}"

    def line(self, seconds: float | None = None) -> str:
        """What `progress` says at the stage's start (None), then at its end."""
        if seconds is None:
            return f"preparing {self.name()}" + (f" (made again: {self.remade})" if self.remade else "")
        if self.failed:
            return f"preparing {self.name()} failed after {seconds:.1f} s: {self.failed}"
        return f"prepared {self.name()} in {seconds:.1f} s"


VOICE_TASKS = ("split, decoder forms, timings",
               "latents of 12 sentences for the 8-bit decoder",
               "8-bit decoder: quantize, gate, timings")


def stages(models_dir: str | Path, derived: str | Path, what: str, decoder: str = "fp32") -> list[Stage]:
    """The children `what` is prepared in, in order, each done or not (cheap, as `missing`)."""
    models_dir, derived = Path(models_dir).expanduser(), Path(derived)
    if what == "bert":
        return [Stage(what, 1, 1, "graph, optimized copy", not _fp32_missing(models_dir, derived, what))]
    if decoder == "fp32":
        return [Stage(what, 1, 1, VOICE_TASKS[0], not _fp32_missing(models_dir, derived, what))]
    fp32_done = not _fp32_missing(models_dir, derived, what)
    int8_done = fp32_done and not _int8_missing(models_dir, derived, what)
    latents = int8_done or fp32_done and _latents_made(models_dir, derived, what)  # gone once used
    # prepared for FP32 alone, its weights are gone: the 8-bit decoder needs the voice made again
    done = [int8_done or latents or fp32_done and _weights_kept(models_dir, derived, what), latents, int8_done]
    return [Stage(what, i + 1, len(VOICE_TASKS), task, made) for i, (task, made) in enumerate(zip(VOICE_TASKS, done))]


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


def _split_folder(models_dir: Path, derived: Path, voice: str) -> Path | None:
    """The voice's split folder, None while it is not split (or kept whole)."""
    parts = cached_split(synthesizer_path(models_dir, voice), derived)
    return parts.folder if parts is not None else None


def _int8_missing(models_dir: Path, derived: Path, voice: str) -> bool:
    folder = _split_folder(models_dir, derived, voice)
    return folder is not None and read_int8(folder) is None  # a voice kept whole has none


def _latents_made(models_dir: Path, derived: Path, voice: str) -> bool:
    """calibrate.py's latents, saved durably: a start killed after them does not make them again."""
    folder = _split_folder(models_dir, derived, voice)  # cut short or garbled: made again, over it
    return folder is not None and (folder / LATENTS_NAME).is_file() and _latents_readable(folder / LATENTS_NAME)


def _weights_kept(models_dir: Path, derived: Path, voice: str) -> bool:
    """The split's weights kept for the 8-bit decoder to be made from (make.py --keep-weights)."""
    folder = _split_folder(models_dir, derived, voice)
    return folder is not None and has_weights(folder)


def _latents_readable(path: Path) -> bool:
    try:
        read_latents(path)  # every array, each checked by the zip's CRC
    except Exception:  # a file cut short or garbled: BadZipFile, OSError, ValueError …
        return False
    return True


def _copies(models_dir: Path, derived: Path, what: str) -> list[Path]:
    """The prepared copies the daemon loads for `what` (BERT or a voice), those there now."""
    source = models_dir / BERT_PATH if what == "bert" else synthesizer_path(models_dir, what)
    if not source.is_file():
        return []
    parts = None if what == "bert" else cached_split(source, derived)
    graphs = [*_graphs_needed(parts), parts.folder / INT8_NAME] if parts else [prepared_whole(source, derived)]
    return [optimized_path(g) for g in graphs if g is not None and optimized_path(g).is_file()]


def damaged(models_dir: str | Path, derived: str | Path, what: str, full: bool = False) -> list[tuple[Path, str]]:
    """The prepared copies of `what` that are not what they were when made, each with what is
    wrong (checksums.py: `full` reads every byte, else sizes and a sample)."""
    models_dir, derived = Path(models_dir).expanduser(), Path(derived)
    found = [(copy, damage(copy, full)) for copy in _copies(models_dir, derived, what)]
    return [(copy, why) for copy, why in found if why]


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


Progress = Callable[[Stage, "float | None"], None]  # at a stage's start (None), then its end (seconds)


def _make(models_dir: Path, derived: Path, what: str, decoder: str, progress: Progress, remade: str = "") -> Step:
    began = time.monotonic()
    where = ["--models", str(models_dir), "--derived", str(derived)]
    plan = stages(models_dir, derived, what, decoder)
    for stage in plan[:1] if remade else []:  # the first to run makes the removed copies again
        stage.remade = remade

    def run(stage: Stage, module: str, *args: str) -> dict:
        progress(stage, None)
        started = time.monotonic()
        try:
            made = _child(what, module, *where, *args)
        except BaseException as e:  # an error, a child killed, Ctrl-C: the stage ends, failed
            stage.failed = str(e) or type(e).__name__
            progress(stage, time.monotonic() - started)
            raise
        progress(stage, time.monotonic() - started)
        return made

    if what == "bert":
        made = run(plan[0], MAKE, "--bert")
        return Step(what, False, time.monotonic() - began, made["peak_mb"], made.get("tuning"))
    int8 = decoder != "fp32"
    # a start stopped after the voice's step (or the latents) goes on from there
    made = ({"peak_mb": 0.0} if plan[0].done
            else run(plan[0], MAKE, "--voice", what, *(["--keep-weights"] if int8 else [])))
    peaks, record = [made["peak_mb"]], None
    if int8 and _int8_missing(models_dir, derived, what):
        if not _latents_made(models_dir, derived, what):
            peaks.append(run(plan[1], "hayakoe_pi.synthesis.calibrate", "--voice", what)["peak_mb"])
        made_int8 = run(plan[2], MAKE, "--int8", what)
        peaks.append(made_int8["peak_mb"])
        record = made_int8["tuning"]
    return Step(what, False, time.monotonic() - began, max(peaks), made.get("tuning"), record)


def prepare(models_dir: str | Path, derived: str | Path, voices: list[str] | None = None,
            report: Callable[[Step], None] | None = None, decoder: str = "fp32",
            progress: Progress | None = None, full_check: bool = False) -> list[Step]:
    """Make what is missing for BERT and `voices` (default: every installed voice), and
    where `decoder` is int8 or auto, each voice's 8-bit decoder; a damaged copy is made
    again (checked quickly, or every byte with `full_check`); `progress` is told of each
    child's start and end."""
    models_dir, derived = Path(models_dir).expanduser(), Path(derived)
    if not models_dir.is_dir():
        raise ModelError(f"models directory not found: {models_dir}")
    steps = []
    for what in ["bert", *(installed_voices(models_dir) if voices is None else voices)]:
        for copy in _copies(models_dir, derived, what):
            if not recorded(copy):  # made by an earlier release
                adopt(copy)
        harm = damaged(models_dir, derived, what, full_check)
        for copy, _ in harm:
            remove(copy)
        remade = "; ".join(why for _, why in harm)
        step = (Step(what, done=True) if not missing(models_dir, derived, what, decoder)
                else _make(models_dir, derived, what, decoder, progress or (lambda stage, seconds: None), remade))
        steps.append(step)
        if report:
            report(step)
    return steps
