"""The shared Japanese BERT, loaded from what prepare made of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import layout
from .errors import ModelError
from .folders import read_stamp
from .sessions import open_session
from .whole import require_prepared

BERT_PATH = Path(layout.BERT_PATH)


class Bert:
    """The shared Japanese BERT: token ids → one 1024-d feature per token."""

    def __init__(self, models_dir: Path, derived_dir: Path | None = None):
        self.path = models_dir / BERT_PATH
        prepared = require_prepared(self.path, derived_dir, "BERT model")
        self.session = open_session(self.path, "BERT model", prepared, prepack=False)
        # whether prepare made its 8-bit weights unsigned for this CPU (`hayakoe-pi check` says)
        self.unsigned_int8 = bool(prepared and read_stamp(prepared.parent, self.path).get("unsigned_int8"))
        names = [i.name for i in self.session.get_inputs()]
        if "input_ids" not in names:
            raise ModelError(f"BERT model {self.path} has no 'input_ids' input (inputs: {names})")
        self.input_names = names
        self.output_name = self.session.get_outputs()[0].name
        self.hidden_size = self.session.get_outputs()[0].shape[-1]

    def __call__(self, input_ids: list[int]) -> np.ndarray:
        ids = np.asarray([input_ids], dtype=np.int64)
        feeds = {"input_ids": ids}
        if "attention_mask" in self.input_names:
            feeds["attention_mask"] = np.ones_like(ids)
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        return self.session.run([self.output_name], feeds)[0][0]  # [tokens, hidden]
