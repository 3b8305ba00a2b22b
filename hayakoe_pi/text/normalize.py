"""Text normalization before g2p.

The output holds only what OpenJTalk can read plus seven punctuation marks
(! ? … , . ' -): kana, kanji, Latin and Greek letters, and the user
dictionary's words as they are written (PS5, R&D: OpenJTalk finds them so).
For ordinary Japanese it is identical to Style-Bert-VITS2's normalizer (models were trained on that
text); numbers, units and acronyms go through our own readings first
(readings.py), English words through english.py, a reading written into
the text (明日《アス》, inline.py) replaces its word before anything else, and
the marks of a notification's layout (`電源: オフ`, ` / `, bullets) become
pauses (layout.py) before the readings.
"""

from __future__ import annotations

import re
import unicodedata

from .english import clear_cache, read_latin_words
from .inline import apply_inline_readings
from .layout import layout_pauses
from .openjtalk import as_written
from .phonemes import PUNCTUATIONS
from .readings import expand_readings

# Marks folded onto the seven punctuation symbols the model knows.
_PUNCT_MAP: dict[str, str] = {
    "：": ",", "；": ",", "，": ",", "、": ",", "·": ",", "・": ",",
    "。": ".", "．": ".", "\n": ".", "$": ".",
    "！": "!", "？": "?",
    "…": "...", "···": "...", "・・・": "...",
}
_PUNCT_MAP.update(dict.fromkeys("“”\"‘’（）()《》【】[]「」", "'"))
# Dashes and minus signs (after NFKC) all become an ASCII hyphen.
_PUNCT_MAP.update(dict.fromkeys(
    "\u02d7\u2010\u2012\u2013\u2014\u2015\u2043\u2212\u23af\u23e4\u2500\u2501\u2e3a\u2e3b", "-"))

_PUNCT_RE = re.compile("|".join(re.escape(k) for k in sorted(_PUNCT_MAP, key=len, reverse=True)))

# Everything outside these ranges is dropped: kana, kanji (々 and 〇 too),
# half- and full-width Latin, Greek, and the punctuation symbols.
_UNREADABLE_RE = re.compile(
    "[^\u3040-\u309f\u30a0-\u30ff\u4e00-\u9fff\u3400-\u4dbf\u3005\u3007"
    "A-Za-z\uff21-\uff3a\uff41-\uff5a\u0370-\u03ff\u1f00-\u1fff"
    + re.escape("".join(PUNCTUATIONS)) + "]+"
)


def replace_punctuation(text: str) -> str:
    """Fold punctuation onto the model's symbols and drop what cannot be read."""
    text = _PUNCT_RE.sub(lambda m: _PUNCT_MAP[m.group()], text)
    return _UNREADABLE_RE.sub("", text)


_protected: re.Pattern | None = None  # the user dictionary's words, left as written


def protect_words(words: list[str]) -> None:
    """Keep these words (the user dictionary's) out of the readings: OpenJTalk reads them."""
    global _protected
    longest_first = sorted(set(words), key=len, reverse=True)
    _protected = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None
    clear_cache()


def protected_word(mecab_surface: str) -> str | None:
    """A user word as MeCab found it (ＰＳ５), as it was written (PS5); None for any other word."""
    protected = _protected
    if protected is None:
        return None
    written = as_written(mecab_surface)
    return written if protected.fullmatch(written) else None


def _readings(text: str) -> str:
    """Readings, then only what OpenJTalk can read, of text outside the user's words."""
    text = read_latin_words(expand_readings(text))
    text = text.replace("~", "ー").replace("～", "ー").replace("〜", "ー")
    return replace_punctuation(text)


def normalize_text(text: str) -> str:
    """The text as g2p reads it; InlineReadingError (a ValueError) for a reading in it that is not katakana."""
    text = layout_pauses(apply_inline_readings(unicodedata.normalize("NFKC", text)))
    protected = _protected
    if protected is None:
        text = _readings(text)
    else:  # the user's words as written, digits and marks too (PS5, Wi-Fi6, R&D): OpenJTalk reads them
        parts, last = [], 0
        for m in protected.finditer(text):
            parts += [_readings(text[last:m.start()]), m.group()]
            last = m.end()
        text = "".join(parts) + _readings(text[last:])
    # Stray combining (semi-)voiced marks: "あ゛" → "あ".
    return text.replace("\u3099", "").replace("\u309a", "")
