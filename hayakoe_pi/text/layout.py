"""The pauses a notification's layout means: `label: value`, values side by side, bullets.

Home Assistant's notifications are often laid out rather than written:
`電源: オフ`, `CPU温度 55℃ / ファン 1200rpm`, `温度 | 湿度`, one item a line
behind `・`, `- ` or `* `. A reader pauses at each of these marks, so they
become 、 before the readings run (a line break is a pause already). Marks
that are not layout stay as they are, for the readings to take: a colon
between digits (12:30, 3:2), a slash between digits or Latin letters (1/2,
24/7, 2024/12/05, km/h, m/s), anything inside a URL.
"""

from __future__ import annotations

import re

PAUSE = "、"

# ASCII after NFKC: ：→:, ／→/, ｜→|, ･→・
_URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
# a bullet at the start of a line, with the spaces around it: the line break before it is the pause
_BULLET_RE = re.compile(r"^[ \t\u3000]*(?:[・•●○■□◆◇▪‣]|[-*+](?=[ \t\u3000]))[ \t\u3000]*", re.MULTILINE)
_COLON_RE = re.compile(r"(?:(?<!\d):|:(?!\d))\s*")
# a slash with a space on either side, or between two characters that are neither ASCII letters nor digits
_SLASH_RE = re.compile(r"\s+/\s*|/\s+|(?<=[^\x00-\x7f])/(?=[^\x00-\x7f])")
_PIPE_RE = re.compile(r"\s*\|\s*")


def _marks_to_pauses(text: str) -> str:
    text = _BULLET_RE.sub("", text)
    text = _COLON_RE.sub(PAUSE, text)
    text = _SLASH_RE.sub(PAUSE, text)
    return _PIPE_RE.sub(PAUSE, text)


def layout_pauses(text: str) -> str:
    """`text` (NFKC) with its layout marks made pauses; URLs left as they are."""
    parts, last = [], 0
    for m in _URL_RE.finditer(text):
        parts += [_marks_to_pauses(text[last:m.start()]), m.group()]
        last = m.end()
    return "".join(parts) + _marks_to_pauses(text[last:])
