"""A model kept whole (BERT, a synthesizer that cannot be split): its graph apart from
its weights, constants folded, 8-bit weights made unsigned where this CPU needs it."""

from __future__ import annotations

from pathlib import Path

from .errors import ModelError
from .folders import clear_folder, model_folder, read_stamp, save_graph, write_stamp
from .unsigned import unsigned_integer_weights
from .weights import fold_constants, weightless

GRAPH_NAME = "model.onnx"  # a model kept whole (BERT, a synthesizer that cannot be split)


def prepared_whole(source: Path, cache_root: Path) -> Path | None:
    """The weightless graph of `source` made by `make_whole`, if it is there."""
    folder = model_folder(source, cache_root)
    stamp = read_stamp(folder, source)
    graph = folder / GRAPH_NAME
    return graph if stamp and stamp.get("kind") == "whole" and graph.is_file() else None


def make_whole(source: Path, cache_root: Path, session_options, unsigned_int8: bool = False) -> Path:
    """`source`'s graph, weights apart and constants folded, in its model folder; with
    `unsigned_int8`, its integer products' weights made unsigned (unsigned_integer_weights)."""
    folder = model_folder(source, cache_root)
    clear_folder(folder)
    model = weightless(source, folder)
    fold_constants(model, folder, session_options)
    if unsigned_int8:
        unsigned_integer_weights(model, folder)
    save_graph(model, folder / GRAPH_NAME)
    write_stamp(folder, source, kind="whole", unsigned_int8=unsigned_int8)
    return folder / GRAPH_NAME


def require_prepared(path: Path, derived_dir: Path | None, what: str) -> Path | None:
    """The whole graph prepare made from `path` under `derived_dir` (None: use the file as it is)."""
    if derived_dir is None or not path.is_file():
        return None  # open_session says what is missing
    found = prepared_whole(path, derived_dir)
    if found is None:
        raise ModelError(f"{what} {path} is not prepared yet: run `hayakoe-pi prepare`")
    return found
