"""Character tokenizer for the Japanese DeBERTa (ku-nlp char-wwm), read from vocab.txt.

The model's tokenizer splits text into single characters after NFKC and
drops white space and control characters; every character becomes its
vocabulary id or [UNK]. This is all `transformers` did for us, so we do it
here and keep that library out of memory.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path


class VocabError(ValueError):
    pass


def _is_dropped(ch: str) -> bool:
    """White space and control characters produce no token."""
    if ch.isspace():
        return True
    return unicodedata.category(ch).startswith("C") or ch == "\ufffd"


class CharTokenizer:
    def __init__(self, vocab_path: str | Path):
        path = Path(vocab_path)
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except FileNotFoundError:
            raise VocabError(f"{path}: tokenizer vocabulary not found") from None
        except UnicodeDecodeError as e:
            raise VocabError(f"{path}: not UTF-8 text ({e.reason})") from None
        if lines and lines[-1] == "":
            lines.pop()
        self.vocab: dict[str, int] = {}
        for i, token in enumerate(lines):
            self.vocab.setdefault(token, i)
        missing = [t for t in ("[CLS]", "[SEP]", "[UNK]", "[PAD]") if t not in self.vocab]
        if missing:
            raise VocabError(f"{path}: special tokens {', '.join(missing)} missing from the vocabulary")
        self.cls_id = self.vocab["[CLS]"]
        self.sep_id = self.vocab["[SEP]"]
        self.unk_id = self.vocab["[UNK]"]
        self.pad_id = self.vocab["[PAD]"]

    def __len__(self) -> int:
        return len(self.vocab)

    @staticmethod
    def tokenize(text: str) -> list[str]:
        chars = [ch for ch in unicodedata.normalize("NFC", text) if not _is_dropped(ch)]
        return [c for ch in chars for c in unicodedata.normalize("NFKC", ch) if not _is_dropped(c)]

    def encode(self, text: str) -> list[int]:
        """[CLS] + one id per character + [SEP]."""
        unk = self.unk_id
        return [self.cls_id, *(self.vocab.get(t, unk) for t in self.tokenize(text)), self.sep_id]
