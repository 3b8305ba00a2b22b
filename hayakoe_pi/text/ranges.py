"""Range marks between two values, read から: 8:00-9:30 → 8:00から9:30.

Run on the text before the values themselves are read (readings.py), so the
readers see 10℃から20℃ and never a mark they could take for a minus sign.
A wave dash or tilde (〜 ～ ~) is a range after a number, a time or a number
with its unit or counter, when a number follows. A hyphen or en dash (- ‐ –)
is a range only where it cannot be anything else:

* between two times: ``8:00-9:30``, ``7:30PM–9:00PM``, ``9:00 - 17:30``
  (not a time-zone offset: ``14:30:00-05:00`` after a ``T`` stays);
* between two dates: ``12/1-12/5``, ``1/5(月)–1/9(金)``, ``2026/12/1-2026/12/5``;
* after a number with its unit or counter: ``10℃-20℃``, ``9時–17時``,
  ``午前9時-午後5時``;
* between two numbers when the second has its unit or counter: ``3-5人``,
  ``1,000-2,000円``, ``5-6月``.

Phone numbers (``03-1234-5678``), model numbers (``RX-78``, letters before
the hyphen), addresses (``1-2-3``), scores (``3-2``) and negative numbers
(``-5℃``, no digit before the sign) are none of these and stay as they are.
"""

from __future__ import annotations

import re

from .table import TABLE, alternation

__all__ = ["mark_ranges"]

_RANGE: str = TABLE["words"]["range"]
_COUNTER = f"(?:{alternation([row[0] for row in TABLE['units']] + TABLE['range_counters'])})"
_SIGN_CHARS = re.escape("".join(TABLE["signs"]))
_CUR = f"[{re.escape(''.join(TABLE['currency_prefix']))}]"
_AMPM = f"(?:{alternation(TABLE['am_pm'])})"
_BEFORE_HOUR = f"(?:{_AMPM}|午前|午後|翌)"  # what may stand before the second value's hour (22:00-翌6:00)
_TILDE = "[〜~～]"
_DASH = "[-‐–]"
_MARK = f"(?:{_TILDE}|{_DASH})"
_NUMBER = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"

_TIME = rf"\d{{1,2}}:\d\d(?::\d\d)?(?: ?{_AMPM}(?![A-Za-z]))?"
_WEEKDAY = rf"(?: ?\((?:{alternation(TABLE['weekdays'])})(?:・(?:{alternation(TABLE['weekdays'])}))*\))"
_DATE = rf"(?:\d{{4}}(?P<sep>[/.-])\d{{1,2}}(?P=sep)\d{{1,2}}|\d{{1,2}}/\d{{1,2}}|\d{{1,2}}月\d{{1,2}}日){_WEEKDAY}?"
_DATE_AHEAD = r"(?:\d{4}[/.-]\d{1,2}[/.-]\d{1,2}|\d{1,2}/\d{1,2}(?![\d/])|\d{1,2}月\d{1,2}日)"

_PASSES = [
    # a number, time, or number with its counter, then a wave dash or tilde: 10〜20℃, 3〜5人
    re.compile(rf"(\d(?::\d\d)?{_COUNTER}?)[ ]*{_TILDE}[ ]*(?=[{_SIGN_CHARS}]?{_CUR}?\d)"),
    # two times; no T before the first (2026-12-02T14:30:00-05:00 is an offset)
    re.compile(rf"(?<![\dT:.])({_TIME})[ ]*{_MARK}[ ]*(?={_BEFORE_HOUR}? ?\d{{1,2}}:\d\d)"),
    # two dates
    re.compile(rf"(?<![\d/.\-])({_DATE})[ ]*{_MARK}[ ]*(?={_DATE_AHEAD})"),
    # a number with its counter, then a hyphen: 10℃-20℃, 9時-午後5時
    re.compile(rf"(\d{_COUNTER})[ ]*{_DASH}[ ]*(?={_BEFORE_HOUR}? ?{_CUR}?\d)"),
    # two numbers, the second with its counter: 3-5人; not inside 1-2-3 or after letters (RX-7-8人)
    re.compile(rf"(?<![0-9A-Za-z.,:/\-‐–])({_NUMBER})[ ]*{_DASH}[ ]*(?={_NUMBER} ?{_COUNTER})"),
]


def mark_ranges(text: str) -> str:
    """Replace the marks of ranges between values with から (see the module docstring)."""
    for pattern in _PASSES:
        text = pattern.sub(lambda m: m[1] + _RANGE, text)
    return text
