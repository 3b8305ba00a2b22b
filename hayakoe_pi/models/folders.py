"""A model's folder of derived files: where it is (never beside the model), its stamp
(what it was made from, written last: a folder without a valid one is made again),
and graphs saved into it durably."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from ..durable import durable_replace

STAMP_NAME = "prepared.json"  # written last: a folder without a valid one is made again


def model_folder(source: Path, cache_root: Path) -> Path:
    """Where what is derived from `source` is kept. Never beside the model: model
    folders may be read-only or shared."""
    return cache_root / hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]


def _source_stamp(source: Path) -> dict:
    st = source.stat()
    return {"source": str(source.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "version": 3}


def read_stamp(folder: Path, source: Path) -> dict | None:
    """The folder's stamp if it was made, whole, from `source` as it is now."""
    try:
        stamp = json.loads((folder / STAMP_NAME).read_text())
        want = _source_stamp(source)
    except (OSError, ValueError):
        return None
    return stamp if {k: stamp.get(k) for k in want} == want else None


def write_stamp(folder: Path, source: Path, **facts) -> None:
    tmp = folder / f"{STAMP_NAME}.tmp"
    tmp.write_text(json.dumps({**_source_stamp(source), **facts}))
    durable_replace(tmp, folder / STAMP_NAME)


def clear_folder(folder: Path) -> None:
    """Start a folder again; its stamp goes first, so a half-removed folder is never trusted."""
    (folder / STAMP_NAME).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, mode=0o700)


def save_graph(model, path: Path) -> None:
    """Write a graph whose tensors are external (small), durably."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(model.SerializeToString())
    durable_replace(tmp, path)
