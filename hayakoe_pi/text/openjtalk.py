"""The one way text reaches OpenJTalk: within what it can take, and ASCII as it sees it.

pyopenjtalk kills the whole process (SIGSEGV, or a hang on a corrupted lock) on two kinds of
text, found by trying runs of kana, kanji, Latin letters, digits, Greek, Cyrillic, Hangul and
marks, alone and mixed, of every length:

- an unknown word of 344 kana or more (1,032 bytes): MeCab makes a run of kana it has no word
  for (ア…, ヴァヴァ…, ゔぁゔぁ…) one unknown word, and OpenJTalk overruns a buffer with it;
- a text over 8 KiB as OpenJTalk reads it (it makes ASCII full-width, 3 bytes a character):
  2,734 characters of nearly anything.

`frontend` cuts a run of kana with a pause every MAX_KANA_RUN characters (no word is that long;
a sentence of the daemon is 160 characters at most) and refuses a text over MAX_BYTES with
TooLong, a ValueError, instead of the crash.
"""

from __future__ import annotations

import re

import pyopenjtalk

MAX_KANA_RUN = 200
MAX_BYTES = 8000  # the buffer is 8 KiB: 8,199 bytes were still read, 8,202 crashed
_KANA_RUN_RE = re.compile(f"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]{{{MAX_KANA_RUN + 1},}}")
CUT = ","

# ASCII as OpenJTalk hands it to MeCab: full-width, but for these
_MECAB_ASCII = {"-": "\u2212", "'": "\u2019", '"': "\u201d", "`": "\u2018", "\\": "\uffe5", "~": "\u301c"}
_WRITTEN = {v: k for k, v in _MECAB_ASCII.items()}


class TooLong(ValueError):
    """The text is more than OpenJTalk can take at once."""


def as_mecab_sees(text: str) -> str:
    """`text` as OpenJTalk hands it to MeCab: what a user word's surface must be to be found."""
    return "".join(_MECAB_ASCII.get(c) or (chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c) for c in text)


def as_written(surface: str) -> str:
    """A word as MeCab saw it back in the normalized text's form (ＰＳ５ → PS5, Ｗｉ−Ｆｉ → Wi-Fi)."""
    return "".join(_WRITTEN.get(c) or (chr(ord(c) - 0xFEE0) if "！" <= c <= "～" else c) for c in surface)


def cut_kana_runs(text: str) -> str:
    """`text` with a pause in every run of kana longer than MAX_KANA_RUN."""
    if len(text) <= MAX_KANA_RUN:
        return text
    return _KANA_RUN_RE.sub(lambda m: CUT.join(m.group()[i:i + MAX_KANA_RUN]
                                               for i in range(0, len(m.group()), MAX_KANA_RUN)), text)


def openjtalk_bytes(text: str) -> int:
    """The bytes of `text` as OpenJTalk reads it: ASCII made full-width."""
    return len(text.encode("utf-8", "surrogatepass")) + 2 * len(text.encode("ascii", "ignore"))


def frontend(text: str) -> list[dict]:
    """pyopenjtalk.run_frontend of `text`, its kana runs cut; TooLong over MAX_BYTES."""
    cut = cut_kana_runs(text)
    if len(cut) * 4 > MAX_BYTES and openjtalk_bytes(cut) > MAX_BYTES:
        raise TooLong(f"too long to read at once: {len(text)} characters ({openjtalk_bytes(cut)} bytes as "
                      f"OpenJTalk reads them, at most {MAX_BYTES}); split the text")
    return pyopenjtalk.run_frontend(cut)
