"""One step of prepare.py, in a child process of its own: what is derived from BERT or
from one voice, made and checked by loading it as the daemon will.

    python -m hayakoe_pi.models.make --models DIR --derived DIR (--bert | --voice NAME [--keep-weights]
                                                                 | --int8 NAME)

--voice with --keep-weights keeps what --int8 quantizes (run after calibrate.py). Each
prints its peak memory and what it found on this CPU as one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..durable import durable_replace
from .bert import BERT_PATH
from .checksums import remove
from .errors import ModelError, unreadable
from .folders import clear_folder, model_folder, read_stamp
from .prepare import missing, synthesizer_path
from .quantize import LATENTS_NAME, make_int8, read_latents
from .sessions import optimize, optimized_path, prepare_options
from .split import cached_split, decoder_margin, split_synthesizer
from .tune import read_tuning, tune, tuning_path
from .unsigned import signed_int8_products_exact
from .voices import load_voice, read_config
from .weights import UnreadableModel, drop_weights, has_weights
from .whole import make_whole, prepared_whole


def peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


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


def _prepare_voice(models_dir: Path, voice: str, derived: Path, keep_weights: bool = False) -> dict | None:
    """The split, forms, optimized copies and timings; with keep_weights, the weights the
    8-bit decoder is made from stay (a voice prepared before without them is made again)."""
    source = synthesizer_path(models_dir, voice)
    tuning = None
    folder = model_folder(source, derived)
    if source.is_file() and (missing(models_dir, derived, voice) or (keep_weights and not has_weights(folder))):
        parts = cached_split(source, derived)
        whole = None if parts else prepared_whole(source, derived)
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
                    remove(optimized_path(graph))
        else:
            optimize(whole)
        if not keep_weights:
            drop_weights(folder)
    load_voice(models_dir, voice, None, derived)  # as the daemon will: every other file checked too
    return tuning


def _prepare_int8(models_dir: Path, voice: str, derived: Path) -> dict | None:
    """The 8-bit decoder from the latents calibrate.py saved; the weights dropped after."""
    source = synthesizer_path(models_dir, voice)
    parts = cached_split(source, derived)
    tuning = read_tuning(parts.folder) if parts else None
    if parts is None or tuning is None or not has_weights(parts.folder):
        raise ModelError(f"voice {voice}: its decoder is not prepared for 8 bits (run --voice --keep-weights)")
    latents = read_latents(parts.folder / LATENTS_NAME)
    sample_rate = read_config(source.parent / "config.json")["data"]["sampling_rate"]
    record = make_int8(parts, tuning, latents, sample_rate)
    drop_weights(parts.folder)
    (parts.folder / LATENTS_NAME).unlink(missing_ok=True)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hayakoe_pi.models.make")
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--derived", required=True, type=Path)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--bert", action="store_true")
    which.add_argument("--voice")
    which.add_argument("--int8", metavar="VOICE")
    ap.add_argument("--keep-weights", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.bert:
            tuning = _prepare_bert(args.models, args.derived)
        elif args.int8:
            tuning = _prepare_int8(args.models, args.int8, args.derived)
        else:
            tuning = _prepare_voice(args.models, args.voice, args.derived, args.keep_weights)
    except ModelError as e:
        print(f"hayakoe-pi: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"peak_mb": round(peak_mb(), 1), "tuning": tuning}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
