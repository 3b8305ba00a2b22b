"""A reading written into the message for one word: 明日《アス》は休みです → アスは休みです.

The notation is the ruby of Japanese plain text (Aozora Bunko, Kakuyomu,
Narou): the reading in 《 》 right after the word. The word is the run of
kanji just before 《 (明日《アス》), or of Latin letters and digits
(Aqara《アカラ》); any other word starts with a bar, ｜ or |
(｜Philips Hue《フィリップスヒュー》, ｜おこめ《オコメ》). Neither { } nor
% is used, so Home Assistant's templates ({{ }}, {% %}, {# #}) leave it
alone, and braces keep meaning nothing (`{笑}ただいま` is spoken as before).

The reading must be katakana (as a user dictionary's): anything else is
refused with InlineReadingError saying what to write. 《 》 are brackets,
read as before, where they cannot be a reading: no word right before them
(《お知らせ》, 本日の《お知らせ》, a space before 《), or kanji inside them
without a bar (速報《緊急》, 重要《お知らせ》). Neither the word nor the
reading spans a sentence end or a comma, so a text cut into sentences or
pieces never cuts one in two.
"""

from __future__ import annotations

import re
import unicodedata

from .kana import reading_problem

__all__ = ["InlineReadingError", "apply_inline_readings", "check_inline_readings"]

MAX_WORD_CHARS = 40
_KANJI = "\u4e00-\u9fff\u3400-\u4dbf\u3005-\u3007\u30f6"  # with 々 〆 〇 ヶ
_NOT_INSIDE = "|《》\n。！？!?、,"
_RUBY_RE = re.compile(
    rf"(?:\|(?P<marked>[^{_NOT_INSIDE}]{{1,{MAX_WORD_CHARS}}})|(?P<word>[{_KANJI}]+|[A-Za-z0-9]+))"
    rf"《(?P<reading>[^{_NOT_INSIDE}]*)》"
)
_HIRAGANA = re.compile("[ぁ-ゖ]")
_KANJI_RE = re.compile(f"[{_KANJI}]")


class InlineReadingError(ValueError):
    """A reading in the message that cannot be used."""


def _reading(m: re.Match) -> str:
    word = m["marked"] if m["marked"] is not None else m["word"]
    if m["marked"] is None and _KANJI_RE.search(m["reading"]):
        return m.group()  # 速報《緊急》: brackets around words, never a reading
    reading = "".join(m["reading"].split())  # フィリップス ヒュー: one reading
    problem = reading_problem(reading)
    if problem is None:
        return reading
    if not reading:
        raise InlineReadingError(f"the reading of {word} is empty: write it in katakana, e.g. {word}《アス》")
    example = _HIRAGANA.sub(lambda h: chr(ord(h.group()) + 0x60), reading)
    bar = "｜" if m["marked"] is not None else ""
    if reading_problem(example) is None:  # hiragana: the same in katakana
        hint = f": {bar}{word}《{example}》"
    else:
        hint = " (《 》 meant as brackets: put a space before 《)"
    raise InlineReadingError(f"reading 《{reading}》 of {word} {problem.replace(' (e.g. ハルト)', '')}{hint}")


def apply_inline_readings(text: str) -> str:
    """`text` (NFKC-normalized) with each word《reading》 replaced by its reading.

    Raises InlineReadingError for the first reading that is not katakana.
    """
    if "《" not in text:
        return text
    return _RUBY_RE.sub(_reading, text)


def check_inline_readings(text: str) -> None:
    """Raise InlineReadingError when a reading in `text` cannot be used."""
    apply_inline_readings(unicodedata.normalize("NFKC", text))
