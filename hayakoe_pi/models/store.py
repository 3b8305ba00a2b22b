"""The model store: BERT, its tokenizer and the voices of one models directory, each
prepared (prepare.py) the first time it is needed, then loaded; a prepared copy that cannot
be loaded is made again once.

A voice prepared on first use takes minutes on a Pi: the loaded voices stay at hand
meanwhile (their lock is never held across a prepare), and one voice is prepared and
loaded at a time (a child's memory once, on a 1 GB Pi)."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from .. import layout
from ..text import FrontEnd, VocabError
from .bert import Bert
from .checksums import remove
from .errors import DerivedFileError, ModelError
from .prepare import Progress, prepare
from .quantize import DECODER_CHOICES
from .voices import Voice, installed_voices, load_voice

log = logging.getLogger("hayakoe_pi.models")

VOCAB_PATH = Path(layout.VOCAB_PATH)


class ModelStore:
    """BERT, its tokenizer and the voices of one models directory.

    Voices are loaded on first use and share the one BERT session; only the
    `max_voices` most recently used stay loaded, so switching voices all day
    does not grow memory. What is derived from the model files (the split,
    the decoder form, optimized copies) is made once, under `derived_dir`
    (default ~/.cache/hayakoe-pi/models), by prepare.py in child processes;
    prepared=False loads the files as they are (whole, optimized at each load).
    `decoder` (engine.decoder): fp32, or int8/auto for each voice's 8-bit decoder where
    prepare's gate found it keeps the voice and is faster on this CPU. `progress` is told
    of each child's start and end (the daemon logs them). repair=False (`hayakoe-pi check`,
    which never prepares) leaves a prepared copy that cannot be loaded as it is.
    """

    def __init__(self, models_dir: str | Path, max_voices: int = 2, prepared: bool = True,
                 derived_dir: str | Path | None = None, decoder: str | None = "fp32",
                 progress: Progress | None = None, repair: bool = True):
        if decoder is not None and decoder not in DECODER_CHOICES:
            raise ModelError(f"decoder must be one of {', '.join(DECODER_CHOICES)}, got {decoder!r}")
        self.decoder = decoder
        self.progress = progress
        self.repair = repair
        self.dir = Path(models_dir).expanduser()
        if not self.dir.is_dir():
            raise ModelError(f"models directory not found: {self.dir}")
        vocab = self.dir / VOCAB_PATH
        if not vocab.is_file():
            raise ModelError(f"BERT tokenizer vocabulary not found: {vocab}")
        try:
            self.frontend = FrontEnd(vocab)
        except VocabError as e:
            raise ModelError(str(e)) from None
        self.derived = (Path(derived_dir) if derived_dir else default_derived_dir()) if prepared else None
        self._prepare([])
        self.bert = self._load([], lambda: Bert(self.dir, self.derived))
        self.max_voices = max(1, max_voices)
        self._voices: dict[str, Voice] = {}  # in order of use, most recent last
        self._lock = threading.Lock()  # the loaded voices: held to look one up or put one in
        self._making = threading.Lock()  # held while a voice is prepared and loaded

    def voices(self) -> list[str]:
        return installed_voices(self.dir)

    def voice(self, name: str) -> Voice:
        voice = self._use(name)
        if voice is None:
            with self._making:  # another voice being made: wait for it, then make this one
                voice = self._use(name)  # made meanwhile
                if voice is None:
                    self._prepare([name])
                    voice = self._load([name], lambda: load_voice(self.dir, name, self.bert.hidden_size,
                                                                  self.derived, self.decoder))
                    with self._lock:
                        self._voices[name] = voice
                        while len(self._voices) > self.max_voices:
                            self._voices.pop(next(iter(self._voices)))
        return voice

    def _use(self, name: str) -> Voice | None:
        """The voice if it is loaded, now the most recently used."""
        with self._lock:
            voice = self._voices.pop(name, None)
            if voice is not None:
                self._voices[name] = voice
            return voice

    def _load(self, voices: list[str], load):
        """load(); a prepared copy it cannot load (what the quick check cannot see) removed and
        made again, once."""
        try:
            return load()
        except DerivedFileError as e:
            if self.derived is None or not self.repair:
                raise
            log.warning("prepared file %s cannot be loaded (%s): making it again", e.path, e.reason)
            remove(e.path)
            self._prepare(voices)
            return load()

    def _prepare(self, voices: list[str]) -> None:
        """Make what is missing, each model in a child process (memory: see prepare.py)."""
        if self.derived is not None and (not voices or voices[0] in installed_voices(self.dir)):
            prepare(self.dir, self.derived, voices, decoder=self.decoder or "fp32", progress=self.progress)


def default_derived_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hayakoe-pi" / "models"
