"""Readings for numbers, units and alphanumeric words in Japanese text.

``expand_readings`` rewrites the parts of an (already NFKC-normalized) text
that OpenJTalk would misread — numbers, times, dates, money, units after a
number, acronyms and a table of known words — into kanji numerals and
katakana.  Text without digits, Latin letters or the unit/currency symbols is
returned unchanged, byte for byte, and no character outside a recognized
pattern is ever touched.

How things are read lives in ``data/readings.yaml``; this module holds only
the patterns that find them.  Rules, in the order they are tried at each
position of the text:

* known words (``CO2`` → シーオーツー, ``Wi-Fi`` → ワイファイ, ``ON`` → オン);
* dates ``2026/12/2``, ``2026-12-02``, ``2026.12.02`` → 二千二十六年十二月二日,
  ``2026/12`` → 二千二十六年十二月;
* phone numbers ``090-1234-5678`` → digit by digit, groups joined with の;
* ``a/b``: a date (``12/25`` → 十二月二十五日) when a is a month and b a day,
  except the common fractions 1/2, 1/3, 2/3, 1/4, 3/4 and anything followed
  by a fraction context (程度, くらい, 以上, …), which read as fractions
  (``1/2`` → 二分の一, ``3/4`` → 四ぶんの三: see the data file for why ぶん);
  a weekday mark right after (``1/2(金)``) always means a date.  With a unit
  after it a/b is a pair of values (``120/80mmHg`` → 百二十の八十ミリメートル
  エイチジー).  Any other a/b is a fraction;
* durations ``1h30m`` → 一時間三十分, ``5m30s`` → 五分三十秒;
* times ``7:30`` → 七時三十分, ``14:00`` → 十四時, ``7:30:15`` → 七時三十分十五秒
  (hours 0–30, two-digit minutes), with AM/PM before or after → 午前/午後;
  ``7am`` → 午前七時;
* ratios ``16:9`` → 十六対九; dotted versions/addresses ``1.2.3`` → 一点二点三;
* ``×`` (and ``x`` between digits) → かける; ordinals ``1st`` → ファースト,
  ``21st`` → 二十一番目;
* money with the symbol first: ``¥1,000`` → 千円, ``$5`` → 五ドル;
* numbers, with a sign (``-2°C`` → マイナス二度, ``+3℃`` → プラス三度) when the
  sign is not glued to a preceding letter or digit, an optional unit after
  them (``0.8kW`` → 零点八キロワット, ``12m/s`` → 秒速十二メートル) and ranges
  (``10〜20℃`` → 十から二十度, ``10-20%`` → 十から二十パーセント; the range
  marks between times, dates and counted numbers became から before, in
  ranges.py: ``8:00-9:30``, ``2-4人``);
* other runs of 2–5 capital letters, spelled with the letter names
  (``LED`` → エルイーディー).  Digits glued to such a run are read in English
  when the integer part is one digit (``USB3`` → ユーエスビースリー,
  ``USB3.0`` → ユーエスビースリーポイントゼロ), otherwise as a kanji number
  (``ABC12`` → エービーシー十二); capitals the table lists as words (``ALARM``)
  are left to english.py.

Numbers read exactly as ``num2words(n, lang="ja")`` does (the reference front
end uses it): ``1000`` → 千, ``10000`` → 一万, ``21.5`` → 二十一点五, trailing
zeros after the point dropped (``1.50`` → 一点五, ``1.0`` → 一).  Two kinds of
digit string are read digit by digit instead (ゼロ, イチ, ニー, …): integers of
17 or more digits (≥ 10^16) and integers of 4 or more digits starting with 0
(``0120``, ``09012345678``) — codes and phone numbers, not quantities.
Other Latin words are left as they are for the caller (english.py).
"""

from __future__ import annotations

import re
from functools import lru_cache

from .english import CAPITAL_WORDS
from .numbers import english_number as _english_number
from .numbers import number_to_kanji
from .numbers import read_number as _read_number
from .numbers import spoken_digits as _spoken_digits
from .openjtalk import TooLong, frontend
from .ranges import mark_ranges
from .table import TABLE as _DATA
from .table import alternation

__all__ = ["expand_readings", "number_to_kanji"]

_NUM = _DATA["numerals"]
_POINT: str = _NUM["point"]
_SPOKEN_SEP: str = _NUM["spoken_separator"]
_SIGNS: dict[str, str] = _DATA["signs"]
_W: dict[str, str] = _DATA["words"]
_ORDINALS: dict[str, str] = _DATA["ordinals"]
_AM_PM: dict[str, str] = _DATA["am_pm"]
_CURRENCY: dict[str, str] = _DATA["currency_prefix"]
_LETTERS: dict[str, str] = _DATA["letters"]
_UNITS: dict[str, tuple[str, str]] = {
    row[0]: (row[1], row[2] if len(row) > 2 else "") for row in _DATA["units"]
}
_FRACTIONS = _DATA["fractions"]
_KNOWN: dict[str, str] = dict(_DATA["known_words"])
_KNOWN_CI: dict[str, str] = {k.lower(): v for k, v in _DATA["known_words_ignore_case"].items()}

# ---------------------------------------------------------------------------
# Patterns


# Atomic: a number is never cut short to let a later part of a pattern match.
_NUMBER = r"(?>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?)"


def _unit_pattern(unit: str) -> str:
    # "3mm" is not 3 m + "m"; "50%OFF" is still 50 %.
    if unit[-1].isascii() and unit[-1].isalpha():
        return re.escape(unit) + "(?![A-Za-z])"
    if unit[-1].isdigit():
        return re.escape(unit) + r"(?!\d)"
    return re.escape(unit)


_UNIT = "(?:" + "|".join(_unit_pattern(u) for u in sorted(_UNITS, key=len, reverse=True)) + ")"
_VERSION_MARKERS: dict[str, str] = _DATA["version_markers"]
_SIGN_CHARS = re.escape("".join(_SIGNS))
# A sign counts only where it cannot be a hyphen inside a word or a range.
_SIGN = rf"(?<![0-9A-Za-z{_SIGN_CHARS}])[{_SIGN_CHARS}]"
_CUR = f"[{re.escape(''.join(_CURRENCY))}]"
_TILDE = "[〜~～]"
_AMPM = f"(?:{alternation(_AM_PM)})"


def _known_pattern(word: str, ignore_case: bool) -> str:
    body = r"\s*".join(re.escape(part) for part in word.split(" "))
    if ignore_case:
        body = f"(?i:{body})"
    left = r"(?<![A-Za-z0-9.])" if word[0].isdigit() else r"(?<![A-Za-z])"
    right = r"(?![A-Za-z0-9]|\.\d)" if word[-1].isdigit() else r"(?![A-Za-z])"
    return left + body + right


_KNOWN_RE = "|".join(
    [_known_pattern(w, False) for w in sorted(_KNOWN, key=len, reverse=True)]
    + [_known_pattern(w, True) for w in sorted(_KNOWN_CI, key=len, reverse=True)]
)

_WEEKDAYS: dict[str, str] = _DATA["weekdays"]
_WEEKDAY = f"(?:{alternation(_WEEKDAYS)})"

_RULES: list[tuple[str, str]] = [
    ("known", _KNOWN_RE),
    ("version", rf"(?<![A-Za-z])(?P<ve_m>{alternation(_VERSION_MARKERS)}) ?(?P<ve_n>\d+(?:\.\d+)+)(?!\d)"),
    ("postal", r"〒 ?(?P<po_a>\d{3})-(?P<po_b>\d{4})(?!\d)"),
    ("ymd", r"(?<![\d.])(?P<ymd_y>\d{4})(?P<ymd_s>[/\-.])(?P<ymd_m>0?[1-9]|1[0-2])(?P=ymd_s)"
            r"(?P<ymd_d>0?[1-9]|[12]\d|3[01])(?![\d/]|\.\d)(?:T(?=\d{1,2}:\d\d))?"),
    ("phone", r"(?<![\d\-])0\d{1,4}-\d{1,4}-\d{3,4}(?![\d\-])"),
    ("ym", r"(?<![\d./])(?P<ym_y>\d{4})/(?P<ym_m>0?[1-9]|1[0-2])(?![\d/]|\.\d)"),
    ("slash", rf"(?<![\d./])(?P<sl_a>\d+)/(?P<sl_b>\d+)(?![\d/]|\.\d)(?: ?(?P<sl_u>{_UNIT}))?"),
    ("weekday", rf"(?:(?<=\d日)|(?<=\d/\d)|(?<=\d/\d\d)) ?[(\[](?P<wd>{_WEEKDAY}(?:・{_WEEKDAY})*)[)\]]"),
    ("hm", r"(?<![\d.])(?P<hm_h>\d+)h ?(?P<hm_m>\d+)m(?:in)?(?![A-Za-z])"),
    ("ms", r"(?<![\d.])(?P<ms_m>\d+)m ?(?P<ms_s>\d+)s(?![A-Za-z])"),
    ("time", rf"(?:(?<![A-Za-z])(?P<t_pre>{_AMPM}) ?)?(?<![\d:.])(?P<t_h>[01]?\d|2\d|30):"
             rf"(?P<t_m>[0-5]\d)(?::(?P<t_s>[0-5]\d))?(?![\d:])"
             rf"(?: ?(?P<t_post>{_AMPM})(?![A-Za-z0-9]))?"),
    ("hour", rf"(?<![\d.:])(?P<ho_h>1[0-2]|0?\d) ?(?P<ho_ap>{_AMPM})(?![A-Za-z0-9])"),
    ("ratio", r"(?<![\d:.])(?P<ra_a>\d+):(?P<ra_b>\d+)(?![\d:])"),
    ("dotted", r"(?<![\d.])\d+(?:\.\d+){2,}(?!\d)"),
    ("basement", r"(?<![A-Za-z])B(?P<ba_n>\d+)F(?![A-Za-z])"),
    ("per", rf"(?<=[\d円])/ ?(?P<pe_u>{_UNIT})"),
    ("times", r"(?<=[0-9A-Za-z°%)]) ?× ?(?=\d)|(?<=\d)x(?=\d)"),
    ("ordinal", r"(?<![\d.A-Za-z])(?P<or_n>\d+)(?P<or_s>st|nd|rd|th)(?![A-Za-z])"),
    ("money", rf"(?P<c_sign>{_SIGN})?(?P<c_cur>{_CUR}) ?(?P<c_1>{_NUMBER})(?P<c_x1>[万億兆]*)"
              rf"(?:\s*(?:から|{_TILDE}|[-–])\s*{_CUR}? ?(?P<c_2>{_NUMBER})(?P<c_x2>[万億兆]*))?"
              rf"(?P<c_dup>{alternation(set(_CURRENCY.values()))})?"),
    ("number", rf"(?P<n_s1>{_SIGN})?(?P<n_1>{_NUMBER})"
               rf"(?: ?(?P<n_u1>{_UNIT})"
               rf"|\s*(?:から|{_TILDE}|[-–](?=[{_SIGN_CHARS}]?{_NUMBER} ?{_UNIT}))\s*"
               rf"(?P<n_s2>[{_SIGN_CHARS}])?(?P<n_2>{_NUMBER})(?![:/]\d)(?: ?(?P<n_u2>{_UNIT}))?)?"),
    ("acronym", r"(?<![A-Za-z])(?P<ac_l>[A-Z]{2,5})(?P<ac_n>\d+(?:\.\d+)?)?(?![A-Za-z0-9])"),
]
_MASTER_RE = re.compile("|".join(f"(?P<{name}>{pat})" for name, pat in _RULES))

_FRACTION_AFTER_RE = re.compile(f"(?:{alternation(_FRACTIONS['followed_by'])})")
_WEEKDAY_AFTER_RE = re.compile(rf" ?[(\[]?[{''.join(_FRACTIONS['weekdays'])}](?:曜|[)\]])")
_DATE_AFTER_RE = re.compile(f"(?:{alternation(_FRACTIONS['date_after'])})")
_DATE_BEFORE_RE = re.compile(f"(?:{alternation(_FRACTIONS['date_before'])})[はがの:：]? ?$")
_DATE_RANGE_AFTER_RE = re.compile(rf" ?(?:{_TILDE}|から|-) ?\d{{1,2}}/\d{{1,2}}(?!\d)")
_DATE_RANGE_BEFORE_RE = re.compile(rf"(?<![\d/])\d{{1,2}}/\d{{1,2}} ?(?:{_TILDE}|から|-) ?$")
_ANY_TARGET_RE = re.compile(r"[0-9A-Za-z%°℃℉¥$€£₩‰Ωμ×]")

# ---------------------------------------------------------------------------
# Rule handlers (each gets the match and returns the reading)


def _sign(s: str | None) -> str:
    return _SIGNS[s] if s else ""


def _date(y: str | None, mo: str, d: str | None) -> str:
    out = number_to_kanji(y) + _W["year"] if y else ""
    out += number_to_kanji(mo) + _W["month"]
    return out + (number_to_kanji(d) + _W["day"] if d else "")


def _fraction(numerator: str, denominator: str) -> str:
    kanji_ok = str(int(denominator)) in _FRACTIONS["kanji_denominators"]
    word = _W["fraction"] if kanji_ok else _W["fraction_kana"]
    return number_to_kanji(denominator) + word + number_to_kanji(numerator)


def _slash(m: re.Match) -> str:
    """a/b: a date or a fraction, by what is around it (rules in data/readings.yaml: fractions)."""
    a, b = m["sl_a"], m["sl_b"]
    if m["sl_u"]:  # a pair of values sharing a unit: 120/80mmHg
        return _with_unit(m, number_to_kanji(a) + _W["pair"] + number_to_kanji(b), m["sl_u"])
    before, after = m.string[:m.start()], m.string[m.end():]
    is_date = 1 <= int(a) <= 12 and 1 <= int(b) <= 31
    if is_date and not _date_context(before, after):
        if f"{int(a)}/{int(b)}" in _FRACTIONS["always"] or _FRACTION_AFTER_RE.match(after):
            is_date = False
    return _date(None, a, b) if is_date else _fraction(a, b)


def _date_context(before: str, after: str) -> bool:
    """A weekday after it, a word of dates after or before it, or another date of a range."""
    return bool(_WEEKDAY_AFTER_RE.match(after) or _DATE_AFTER_RE.match(after) or _DATE_BEFORE_RE.search(before)
                or _DATE_RANGE_AFTER_RE.match(after) or _DATE_RANGE_BEFORE_RE.search(before))


def _dotted(number: str) -> str:
    return _POINT.join(number_to_kanji(p) for p in number.split("."))


def _clock(h: str, mi: str, s: str | None) -> str:
    out = number_to_kanji(h) + _W["hour"]
    if int(mi) or (s and int(s)):
        out += number_to_kanji(mi) + _W["minute"]
    if s and int(s):
        out += number_to_kanji(s) + _W["second"]
    return out


def _time(m: re.Match) -> str:
    ap = m["t_pre"] or m["t_post"]
    return (_W[_AM_PM[ap]] if ap else "") + _clock(m["t_h"], m["t_m"], m["t_s"])


def _with_unit(m: re.Match, reading: str, unit: str | None) -> str:
    if not unit:
        return reading
    word, prefix = _UNITS[unit]
    if prefix and not m.string[: m.start()].endswith(prefix):
        return prefix + reading + word
    return reading + word


def _number(m: re.Match) -> str:
    first = _sign(m["n_s1"]) + _read_number(m["n_1"])
    if m["n_u1"]:
        return _with_unit(m, first, m["n_u1"])
    if m["n_2"] is None:
        return first
    both = first + _W["range"] + _sign(m["n_s2"]) + _read_number(m["n_2"])
    return _with_unit(m, both, m["n_u2"])


def _money(m: re.Match) -> str:
    out = _sign(m["c_sign"]) + _read_number(m["c_1"]) + m["c_x1"]
    if m["c_2"]:
        out += _W["range"] + _read_number(m["c_2"]) + m["c_x2"]
    word = _CURRENCY[m["c_cur"]]
    # "¥1,000円" is still 千円; any other word after it is kept.
    return out + word + (m["c_dup"] if m["c_dup"] and m["c_dup"] != word else "")


@lru_cache(maxsize=4096)
def _dictionary_acronym(letters: str) -> str | None:
    """OpenJTalk's own reading of a capital-letter word it knows as a noun (NHK, ABC, JR).

    The reference front end reads such words from the same dictionary, so
    plain text keeps the same sound; unknown ones are spelled by letter names.
    """
    try:
        features = frontend(letters)
    except TooLong:  # no word of its dictionary is that long
        return None
    if len(features) != 1 or features[0]["pos"] != "名詞" or not features[0]["pron"]:
        return None
    return features[0]["pron"].replace("’", "")


def _acronym(m: re.Match) -> str:
    if m["ac_l"] in CAPITAL_WORDS and not m["ac_n"]:  # a word in capitals (DOOR): english.py reads it
        return m.group()
    known = _dictionary_acronym(m["ac_l"])
    if known and "K" in m["ac_l"]:  # ケー, as broadcasters and everyday speech say K (OpenJTalk: ケイ)
        known = known.replace("ケイ", _LETTERS["K"])
    out = known or "".join(_LETTERS[c] for c in m["ac_l"])
    return out + (_english_number(m["ac_n"]) if m["ac_n"] else "")


# Known words may be written with or without their spaces ("HomeAssistant").
_KNOWN_SQUASHED = {"".join(k.split()): v for k, v in _KNOWN.items()}
_KNOWN_CI_SQUASHED = {"".join(k.split()): v for k, v in _KNOWN_CI.items()}


def _known(m: re.Match) -> str:
    word = "".join(m.group().split())
    return _KNOWN_SQUASHED.get(word) or _KNOWN_CI_SQUASHED[word.lower()]


_HANDLERS = {
    "known": _known,
    "version": lambda m: _VERSION_MARKERS[m["ve_m"]] + _dotted(m["ve_n"]),
    "postal": lambda m: _W["postal"] + _spoken_digits(m["po_a"]) + _SPOKEN_SEP + _spoken_digits(m["po_b"]),
    "basement": lambda m: _W["basement"] + number_to_kanji(m["ba_n"]) + _W["floor"],
    "per": lambda m: _W["per"] + _UNITS[m["pe_u"]][0],
    "ymd": lambda m: _date(m["ymd_y"], m["ymd_m"], m["ymd_d"]),
    "phone": lambda m: _SPOKEN_SEP.join(_spoken_digits(g) for g in m.group().split("-")),
    "ym": lambda m: _date(m["ym_y"], m["ym_m"], None),
    "slash": _slash,
    "weekday": lambda m: "".join(_WEEKDAYS[d] for d in m["wd"].split("・")),
    "hm": lambda m: number_to_kanji(m["hm_h"]) + _W["hours"] + number_to_kanji(m["hm_m"]) + _W["minute"],
    "ms": lambda m: number_to_kanji(m["ms_m"]) + _W["minute"] + number_to_kanji(m["ms_s"]) + _W["second"],
    "time": _time,
    "hour": lambda m: _W[_AM_PM[m["ho_ap"]]] + number_to_kanji(m["ho_h"]) + _W["hour"],
    "ratio": lambda m: number_to_kanji(m["ra_a"]) + _W["ratio"] + number_to_kanji(m["ra_b"]),
    "dotted": lambda m: _dotted(m.group()),
    "times": lambda m: _W["times"],
    "ordinal": lambda m: _ORDINALS.get(m.group()) or number_to_kanji(m["or_n"]) + _W["nth"],
    "money": _money,
    "number": _number,
    "acronym": _acronym,
}


def _dispatch(m: re.Match) -> str:
    for name, _ in _RULES:
        if m.group(name) is not None:
            return _HANDLERS[name](m)
    return m.group()  # pragma: no cover


def expand_readings(text: str) -> str:
    """Rewrite numbers, units and known alphanumeric words as Japanese readings.

    ``text`` is expected to be NFKC-normalized already.
    """
    if not _ANY_TARGET_RE.search(text):
        return text
    text = mark_ranges(text)
    return _MASTER_RE.sub(_dispatch, text)
