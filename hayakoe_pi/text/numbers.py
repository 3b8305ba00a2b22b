"""Numbers read aloud: kanji numerals as num2words(lang="ja") writes them, digit by
digit for codes, and English digit names after an acronym (USB3)."""

from __future__ import annotations

import re

from .table import TABLE

__all__ = ["number_to_kanji", "read_number", "spoken_digits", "english_number"]

_NUM = TABLE["numerals"]
_DIGITS: list[str] = _NUM["digits"]
_TENS: list[str] = _NUM["tens"]
_MYRIADS: list[str] = _NUM["myriads"]
_POINT: str = _NUM["point"]
_SPOKEN_DIGITS: list[str] = _NUM["spoken_digits"]
_EN_DIGITS: list[str] = _NUM["english_digits"]
_EN_POINT: str = _NUM["english_point"]
_MINUS: str = TABLE["signs"]["-"]


def _group_reading(group: int) -> str:
    """Reading of 1..9999 (no leading 一 before 十, 百, 千)."""
    out = []
    for power in (3, 2, 1):
        d, group = divmod(group, 10**power)
        if d:
            out.append(("" if d == 1 else _DIGITS[d]) + _TENS[power - 1])
    if group:
        out.append(_DIGITS[group])
    return "".join(out)


def _integer_to_kanji(digits: str) -> str:
    digits = digits.lstrip("0")
    if not digits:
        return _DIGITS[0]
    if len(digits) > 4 * (len(_MYRIADS) + 1):  # beyond 極: nothing to name it with
        return "".join(_DIGITS[int(c)] for c in digits)
    out = []
    groups = []
    while digits:
        groups.append(int(digits[-4:]))
        digits = digits[:-4]
    for i in range(len(groups) - 1, -1, -1):
        if groups[i]:
            out.append(_group_reading(groups[i]) + (_MYRIADS[i - 1] if i else ""))
    return "".join(out)


_NUMBER_STRING_RE = re.compile(r"([-−+]?)(\d+(?:,\d{3})*)(?:\.(\d*))?")


def number_to_kanji(number: str) -> str:
    """Kanji reading of a decimal number string, as num2words(lang="ja") writes it.

    ``"4560"`` → 四千五百六十, ``"4,560"`` → 四千五百六十, ``"21.5"`` → 二十一点五,
    ``"0.8"`` → 零点八, ``"1.50"`` → 一点五, ``"-3"`` → マイナス三.
    """
    m = _NUMBER_STRING_RE.fullmatch(number.strip())
    if not m:
        raise ValueError(f"not a decimal number: {number!r}")
    sign, integer, fraction = m.groups()
    out = _MINUS if sign in ("-", "−") else ""
    out += _integer_to_kanji(integer.replace(",", ""))
    fraction = (fraction or "").rstrip("0")
    if fraction:
        out += _POINT + "".join(_DIGITS[int(c)] for c in fraction)
    return out


def spoken_digits(digits: str) -> str:
    return "".join(_SPOKEN_DIGITS[int(c)] for c in digits)


def read_number(number: str) -> str:
    """A number as it appears in running text (see the module docstring)."""
    if number.isdigit() and (len(number) >= 17 or (number[0] == "0" and len(number) >= 4)):
        return spoken_digits(number)
    return number_to_kanji(number)


def english_number(number: str) -> str:
    integer, _, fraction = number.partition(".")
    if len(integer) != 1:
        return number_to_kanji(number)
    out = _EN_DIGITS[int(integer)]
    if fraction:
        out += _EN_POINT + "".join(_EN_DIGITS[int(c)] for c in fraction)
    return out
