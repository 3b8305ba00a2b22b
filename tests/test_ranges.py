"""Ranges between times, dates and numbers with a unit read から (hayakoe_pi.text.ranges), and the
hyphens that are not ranges left as they are."""

from __future__ import annotations

import unicodedata

import pytest

from hayakoe_pi.text.readings import expand_readings


def expand(s: str) -> str:
    return expand_readings(unicodedata.normalize("NFKC", s))


RANGES = [
    # times, with a hyphen, an en dash, a wave dash or a tilde
    ("夜間料金は23:00-7:00です", "夜間料金は二十三時から七時です"),
    ("受付は10:30–18:45", "受付は十時三十分から十八時四十五分"),
    ("工事は13:00〜16:30の予定", "工事は十三時から十六時三十分の予定"),
    ("停電は9:15~9:45", "停電は九時十五分から九時四十五分"),
    ("営業時間 11:00 - 20:00", "営業時間 十一時から二十時"),
    ("6:30PM-8:00PMに配達", "午後六時三十分から午後八時に配達"),
    ("放送は22:00-翌5:00", "放送は二十二時から翌五時"),
    ("午前8時-午後3時", "午前八時から午後三時"),
    # dates
    ("点検は11/20-11/22です", "点検は十一月二十日から十一月二十二日です"),
    ("2/9(月)–2/13(金)は休校", "二月九日月曜日から二月十三日金曜日は休校"),
    ("2027/1/4-2027/1/8", "二千二十七年一月四日から二千二十七年一月八日"),
    ("4月28日-5月6日", "四月二十八日から五月六日"),
    # numbers with a unit or counter
    ("明日は12-18℃", "明日は十二から十八度"),
    ("7℃–15℃になります", "七度から十五度になります"),
    ("2-4人で使えます", "二から四人で使えます"),
    ("配達は2–3日後", "配達は二から三日後"),
    ("500-800円の範囲", "五百から八百円の範囲"),
    ("湿度は35~45%", "湿度は三十五から四十五パーセント"),
]


@pytest.mark.parametrize("raw,want", RANGES, ids=[r[0] for r in RANGES])
def test_ranges_read_kara(raw, want):
    assert expand(raw) == want


NOT_RANGES = [
    ("電話は06-6123-4567まで", "電話はゼロロクのロクイチニーサンのヨンゴーロクナナまで"),  # a phone number
    ("型番はMS-06です", "型番はエムエス-六です"),  # a model number: letters before the hyphen
    ("ZX-10R", "ゼットエックス-十R"),
    ("外気温は-7℃", "外気温はマイナス七度"),  # a negative number
    ("-3〜-1℃", "マイナス三からマイナス一度"),
    ("住所は2-14-3です", "住所は二-十四-三です"),  # an address
    ("試合は4-1で勝ちました", "試合は四-一で勝ちました"),  # a score: no unit
    ("2026-03-05T06:00:00-09:00に開始", "二千二十六年三月五日六時-九時に開始"),  # a time-zone offset
]


@pytest.mark.parametrize("raw,want", NOT_RANGES, ids=[r[0] for r in NOT_RANGES])
def test_hyphens_that_are_not_ranges_stay(raw, want):
    assert expand(raw) == want
