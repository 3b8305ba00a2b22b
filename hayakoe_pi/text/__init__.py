"""Japanese text front end: text → symbol, tone and language ids plus BERT input.

>>> fe = FrontEnd("models/bert/tokenizer/vocab.txt")
>>> a = fe.analyze("今日は23.5℃です。")
>>> a.norm, a.phones[:5], a.input_ids[:3]
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from . import english
from .g2p import TextError, g2p
from .inline import InlineReadingError
from .normalize import normalize_text
from .phonemes import JP_LANGUAGE_ID, JP_TONE_OFFSET, SYMBOL_ID
from .tokenizer import CharTokenizer, VocabError

__all__ = ["Analysis", "FrontEnd", "TextError", "VocabError", "normalize_text"]


@dataclass
class Analysis:
    text: str
    norm: str
    phones: list[int]  # symbol ids, with blanks between symbols
    tones: list[int]  # tone ids (Japanese offset applied)
    language: list[int]
    word2ph: list[int]  # symbols per BERT token, summing to len(phones)
    input_ids: list[int]  # BERT token ids: [CLS] chars [SEP]

    def as_dict(self) -> dict:
        return asdict(self)


def _intersperse(seq: list[int], blank: int = 0) -> list[int]:
    out = [blank] * (2 * len(seq) + 1)
    out[1::2] = seq
    return out


class FrontEnd:
    def __init__(self, vocab_path: str | Path, add_blank: bool = True):
        self.tokenizer = CharTokenizer(vocab_path)
        self.add_blank = add_blank
        # kanalizer's model loads while the voices do, not on the first English word
        threading.Thread(target=english.warm_up, name="kanalizer-warm-up", daemon=True).start()

    def analyze(self, text: str) -> Analysis:
        try:
            norm = normalize_text(text)
        except InlineReadingError as e:
            raise TextError(str(e)) from None
        result = g2p(norm)
        input_ids = self.tokenizer.encode(result.bert_text)
        if len(input_ids) != len(result.word2ph):
            raise TextError(f"BERT tokens and characters disagree for {norm!r}")
        try:
            phones = [SYMBOL_ID[p] for p in result.phones]
        except KeyError as e:
            raise TextError(f"phoneme {e.args[0]!r} is not in the model's symbol table") from None
        tones = [t + JP_TONE_OFFSET for t in result.tones]
        language = [JP_LANGUAGE_ID] * len(phones)
        word2ph = list(result.word2ph)
        if self.add_blank:
            phones, tones, language = (_intersperse(s) for s in (phones, tones, language))
            word2ph = [2 * n for n in word2ph]
            word2ph[0] += 1
        return Analysis(text, norm, phones, tones, language, word2ph, input_ids)
