"""What prepare made, as it made it: each optimized copy's files (the graph and its weights)
with their sizes and digests, recorded when the copy is made and checked where it is trusted.

An SD card or a power cut can leave a derived file short or garbled; loading it then fails
at every start, and only making it again helps. Two checks:

- quick (every start, `missing`): each file's size, and the SHA-256 of a sample of it: the
  whole file under SAMPLE_WHOLE_BYTES (the graphs), else SAMPLE_BLOCKS blocks spread over
  it, its first and last included: 256 KiB read whatever the size, milliseconds.
- full (`hayakoe-pi check` and `hayakoe-pi prepare`, run by hand or by the installer): the
  SHA-256 of every byte. The weights are hundreds of MB (BERT 366 MB, a voice 223 MB):
  measured here 1.35 GB/s (x86 with SHA instructions); a Pi 4 has none and reads an SD card
  at tens of MB/s, so a full check is seconds to tens of seconds: not at every start.

A truncated file (what a power cut leaves) fails the quick check by its size; a block
garbled in place fails it only where sampled, the full check always. A copy an earlier
release made has no record: it is recorded as it is (`adopt`, by prepare) rather than made
again (minutes on a Pi, the 8-bit decoder's longer); one it cannot load is made again then.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..durable import durable_replace

RECORD_SUFFIX = ".sums.json"  # beside the copy: front.<cpu key>.onnx.sums.json
RECORD_VERSION = 1
SAMPLE_BLOCK = 4096
SAMPLE_BLOCKS = 64
SAMPLE_WHOLE_BYTES = 4 << 20


def record_path(copy: Path) -> Path:
    return copy.with_name(copy.name + RECORD_SUFFIX)


def _sha256(fd: int, at: int, length: int) -> str:
    digest = hashlib.sha256()
    while length > 0:
        piece = os.pread(fd, min(1 << 20, length), at)
        if not piece:
            break
        digest.update(piece)
        at, length = at + len(piece), length - len(piece)
    return digest.hexdigest()


def _sample(fd: int, size: int) -> str:
    """The SHA-256 of the whole file when small, else of SAMPLE_BLOCKS blocks spread evenly."""
    if size <= SAMPLE_WHOLE_BYTES:
        return _sha256(fd, 0, size)
    digest = hashlib.sha256()
    last = size - SAMPLE_BLOCK
    for i in range(SAMPLE_BLOCKS):
        digest.update(os.pread(fd, SAMPLE_BLOCK, last * i // (SAMPLE_BLOCKS - 1)))
    return digest.hexdigest()


def _sums(path: Path, full: bool) -> dict:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        sums = {"size": size, "sample": _sample(fd, size)}
        if full:
            sums["sha256"] = _sha256(fd, 0, size)
        return sums
    finally:
        os.close(fd)


def write_record(copy: Path, files: dict[str, Path]) -> None:
    """Record the files of `copy` (name → where it is now: the graph may still be a temporary
    file), durably, before the copy takes its name: a copy is never without its record."""
    record = {"version": RECORD_VERSION, "files": {name: _sums(path, full=True) for name, path in files.items()}}
    target = record_path(copy)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    durable_replace(tmp, target)


def recorded(copy: Path) -> bool:
    return record_path(copy).is_file()


def adopt(copy: Path) -> None:
    """Record a copy made before records as it is now (its weights too, when it has them)."""
    weights = copy.with_name(copy.name + ".weights")
    write_record(copy, {path.name: path for path in (copy, weights) if path.is_file()})


def damage(copy: Path, full: bool = False) -> str | None:
    """What is wrong with the optimized copy `copy` and its weights, as prepare recorded them
    (None: whole, or not recorded yet); `full` reads every byte, else the quick check (see above)."""
    if not recorded(copy):
        return None
    try:
        record = json.loads(record_path(copy).read_text())
        files = record["files"] if record.get("version") == RECORD_VERSION else None
    except (OSError, ValueError, TypeError, KeyError):
        files = None
    if not isinstance(files, dict) or copy.name not in files:
        return f"{record_path(copy)}, the record of what it was when made, is damaged"
    for name, want in files.items():
        path = copy.with_name(name)
        try:
            got = _sums(path, full)
        except OSError as e:
            return f"{path} cannot be read ({e.strerror or e})"
        if got["size"] != want.get("size"):
            return f"{path} is damaged: {got['size']} bytes, {want.get('size')} when it was made"
        if got["sample"] != want.get("sample") or full and got["sha256"] != want.get("sha256"):
            return f"{path} is damaged: its SHA-256 is not the one recorded when it was made"
    return None


def remove(copy: Path) -> None:
    """A damaged copy gone, with its weights and record: what needs it is made again."""
    for path in (copy, copy.with_name(copy.name + ".weights"), record_path(copy)):
        path.unlink(missing_ok=True)
