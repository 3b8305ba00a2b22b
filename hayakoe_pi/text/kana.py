"""Readings in katakana: what makes one (for the user dictionary and readings written into a text)."""

from __future__ import annotations

import re

MAX_READING_MORAS = 40
_SMALL_KANA = set("ァィゥェォャュョヮ")  # joined to the kana before them: no mora of their own
_KATAKANA_RE = re.compile(r"[ァ-ヶー]+")


def moras(reading: str) -> int:
    return sum(c not in _SMALL_KANA for c in reading)


def reading_problem(reading) -> str | None:
    """What is wrong with a reading (katakana, as a word starts, at most MAX_READING_MORAS moras), or None."""
    if not isinstance(reading, str) or not _KATAKANA_RE.fullmatch(reading) or reading[0] in _SMALL_KANA | {"ー"}:
        return "must be katakana (e.g. ハルト)"
    if moras(reading) > MAX_READING_MORAS:
        return f"is longer than {MAX_READING_MORAS} moras"
    return None
