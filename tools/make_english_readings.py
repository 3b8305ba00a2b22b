#!/usr/bin/env python3
"""Make hayakoe_pi/text/data/english_readings.txt: kanalizer's readings of common English words, made ahead.

    .venv/bin/python tools/make_english_readings.py [--words FILE ...]

kanalizer takes about 4 ms a word (x86_64; more on a Pi), once per word per
process. english.py looks a word up in this list before asking kanalizer, so
common words cost a lookup instead. The list must hold exactly what kanalizer
says (english.kanalizer_reading, the one call), so that it changes no
reading: tests/test_english_list.py compares a sample with the installed
kanalizer, and english.py uses the list only with the kanalizer version named
in its first line. Rerun this after a kanalizer upgrade (about 5 minutes of
one core for 71 000 words here).

The words: Debian's wamerican (SCOWL size 50: `apt-get install wamerican`),
whose licence is copied beside the list (english_readings.COPYRIGHT), and
the words of Home Assistant's integration names (tools/data/
home_assistant_words.txt: the brands its notifications name, ecobee,
powerwall, which no dictionary holds). Kept:
words of letters a-z only (no possessives, no accents), lower-cased as
english.py hands them to kanalizer, of 3-24 letters (what it guesses), and
neither in the readings table's english_words nor known whole to OpenJTalk's
dictionary: english.py reads those first, so they never reach kanalizer. A
word kanalizer has no complete reading for is kept with an empty reading.

The file: one comment line (the version tag), then `word<TAB>reading` lines
sorted by the word's bytes, so that a lookup is a binary search over a memory
map (hayakoe_pi/text/english_list.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hayakoe_pi.text import english  # noqa: E402
from hayakoe_pi.text.english_list import COPYRIGHT_PATH, LIST_PATH  # noqa: E402

WORDS = Path("/usr/share/dict/words")
HOME_ASSISTANT_WORDS = REPO / "tools" / "data" / "home_assistant_words.txt"
COPYRIGHT = Path("/usr/share/doc/wamerican/copyright")


def candidates(lines) -> list[str]:
    """The words english.py would hand to kanalizer, sorted by their bytes."""
    words = {w.lower() for w in (line.strip() for line in lines) if re.fullmatch(r"[A-Za-z]+", w)}
    return sorted(w for w in words
                  if english.MIN_GUESSED_LETTERS <= len(w) <= english.MAX_GUESSED_LETTERS
                  and w not in english.ENGLISH_WORDS and english._dictionary_word(w) is None)


def source_name(words: Path) -> str:
    if words.resolve() == WORDS.resolve():
        version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "wamerican"],
                                 capture_output=True, text=True).stdout.strip()
        return f"Debian's wamerican {version or '(version unknown)'} (SCOWL: see english_readings.COPYRIGHT)"
    if words.resolve() == HOME_ASSISTANT_WORDS.resolve():
        return "Home Assistant's integration names (tools/data/home_assistant_words.txt)"
    return words.name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/make_english_readings.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--words", type=Path, nargs="+", default=[WORDS, HOME_ASSISTANT_WORDS],
                    help="files of one word a line (default: wamerican's, Home Assistant's)")
    ap.add_argument("--out", type=Path, default=LIST_PATH)
    args = ap.parse_args(argv)
    import kanalizer

    words = candidates(line for path in args.words for line in path.read_text(encoding="utf-8").splitlines())
    print(f"{len(words)} words to read with kanalizer {kanalizer.__version__}", flush=True)
    began, lines, missing = time.monotonic(), [], 0
    for n, word in enumerate(words, 1):
        reading = english.kanalizer_reading(kanalizer, word) or ""
        missing += not reading
        lines.append(f"{word}\t{reading}\n")
        if n % 5000 == 0:
            print(f"{n} words, {time.monotonic() - began:.0f} s", flush=True)
    sources = " and ".join(source_name(path) for path in args.words)
    header = (f"# kanalizer {kanalizer.__version__}: its readings of {len(words)} words of {sources},"
              f" by tools/make_english_readings.py;"
              f" word<TAB>reading sorted by bytes, empty: no complete reading\n")
    tmp = args.out.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(header)
        f.writelines(lines)
    os.replace(tmp, args.out)
    if any(path.resolve() == WORDS.resolve() for path in args.words) and COPYRIGHT.exists():
        shutil.copyfile(COPYRIGHT, COPYRIGHT_PATH)
    print(f"{args.out}: {len(words)} words ({missing} without a complete reading), "
          f"{args.out.stat().st_size} bytes, {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
