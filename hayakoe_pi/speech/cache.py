"""Phrase cache: finished audio kept on disk, least recently used evicted.

The key covers everything that changes the sound: text, voice, style and its
weight, speed, and the identity (size, mtime) of the model files, so a new
download never serves stale audio.

A store that fails (a full disk, a file-size limit, a read-only or failing
card) costs the cache, never the message: its temporary file goes, and the
failure is logged once until a store works again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import threading
from pathlib import Path

import numpy as np

from ..durable import FailingWrites

log = logging.getLogger("hayakoe_pi")


def files_fingerprint(paths) -> list:
    out = []
    for p in paths:
        st = Path(p).stat()
        out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def voice_fingerprint(store, voice) -> list:
    """Identity of every model file that shapes `voice`'s sound (its own and BERT), and
    the 8-bit decoder where it is in use (its sound differs a little)."""
    decoder = ["decoder int8"] if voice.decoder_kind == "int8" else []  # FP32 keys as before
    return files_fingerprint([*voice.files, store.bert.path]) + decoder


def cache_key(text: str, voice: str, style: str, style_weight: float, speed: float,
              model_fingerprint: list) -> str:
    blob = json.dumps([text, voice, style, float(style_weight), float(speed), model_fingerprint],
                      ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class PhraseCache:
    SUFFIX = ".f32"
    TEMPORARY = ".tmp"  # a store being written: <key>-<rate>.tmp<pid>-<thread>

    def __init__(self, directory: str | Path, max_mb: float):
        self.dir = Path(directory)
        self.max_bytes = int(max_mb * 1024 * 1024)
        self._lock = threading.Lock()
        self._stores = FailingWrites(f"phrase cache: cannot store in {self.dir}: messages are spoken all the same, "
                                     "not kept", "phrase cache: storing again")
        if self.max_bytes > 0:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        """Temporary files of stores cut by a crash or a power cut: never read, but they take space."""
        for p in self.dir.glob(f"*{self.TEMPORARY}*"):
            try:
                if p.is_file():
                    p.unlink()
            except OSError as e:
                log.warning("phrase cache: cannot remove %s (%s)", p, e.strerror or e)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def _path(self, key: str, sample_rate: int) -> Path:
        return self.dir / f"{key}-{sample_rate}{self.SUFFIX}"

    def get(self, key: str, sample_rate: int) -> np.ndarray | None:
        if not self.enabled:
            return None
        path = self._path(key, sample_rate)
        try:
            audio = np.fromfile(path, dtype="<f4")
        except OSError:
            return None
        try:
            os.utime(path)  # mark as recently used
        except OSError:  # a card gone read-only: the entry is still good to hear
            pass
        return audio if audio.size else None

    def put(self, key: str, sample_rate: int, audio: np.ndarray) -> None:
        if not self.enabled or audio.nbytes > self.max_bytes:
            return
        path = self._path(key, sample_rate)
        tmp = path.with_suffix(f"{self.TEMPORARY}{os.getpid()}-{threading.get_ident()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(np.ascontiguousarray(audio, dtype="<f4").tobytes())
            os.replace(tmp, path)  # readers never see half a file
            self._evict()
        except OSError as e:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:  # a card gone read-only: nothing more to do here
                pass
            self._stores.failed(e)
            return
        self._stores.worked()

    def _files(self) -> list[tuple[int, int, Path]]:
        """(mtime, size, path) of every file in the folder: entries and stores being written
        alike count against the limit (the folders beside them, derived models, do not)."""
        files = []
        for p in self.dir.iterdir():
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                files.append((st.st_mtime_ns, st.st_size, p))
        return files

    def _evict(self) -> None:
        with self._lock:
            files = self._files()
            total = sum(size for _, size, _ in files)
            for _, size, p in sorted(f for f in files if f[2].suffix == self.SUFFIX):
                if total <= self.max_bytes:
                    break
                p.unlink(missing_ok=True)
                total -= size

    def size_bytes(self) -> int:
        return sum(size for _, size, _ in self._files()) if self.enabled else 0
