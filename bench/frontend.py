#!/usr/bin/env python3
"""The text front end's time on a 200-character notification with 10 English words, against another revision.

    python bench/frontend.py [--base 8111dab] [--repeats 30]

Each revision runs in fresh processes (the base one from `git archive` of
REV into a temporary folder, this tree as it is), `FrontEnd.analyze` of
TEXT with the tiny fixture model's vocabulary:

* first text: the first analysis of a fresh process, right after the front
  end is made (kanalizer's model, where it is used, still loading), and 1 s
  later, as in the daemon (the model loaded by then, alongside the voices),
  median over processes;
* new words: every reading cache of the front end emptied before each run, so
  the 10 words are read as if never seen: those in the list of kanalizer's
  readings made ahead (hayakoe_pi/text/data/english_readings.txt: common words
  and the words of Home Assistant's integration names) looked up, any other
  guessed by kanalizer's model;
* new words outside the list: the same with the list left unused, so that
  kanalizer's model guesses all 10, as for words no list holds (a tree without
  the list: the same as new words);
* seen words: the same text again, the words' readings cached, as a
  household's recurring notifications are.

It prints a table of medians (ms) and the ratio this tree ÷ base. Timings on a
shared machine are noisy: rerun, or raise --repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VOCAB = REPO / "tests/fixtures/models/tiny/bert/tokenizer/vocab.txt"

# 10 English words, none of them in the readings table: Front, Porch, ecobee, Tesla, Powerwall,
# Mailbox, Plastic, Bottle, Patio, Sprinkler.
WORDS = ["Front", "Porch", "ecobee", "Tesla", "Powerwall", "Mailbox", "Plastic", "Bottle", "Patio", "Sprinkler"]
TEXT = ("Front Porchのカメラが人を検知しました。ecobeeによると室温は21.5℃、"
        "湿度は45%です。Tesla Powerwallの残量は80%で、昼間は太陽光で充電します。Mailboxに郵便物が届きました。"
        "今日はPlastic Bottleの回収日なので、8:00までに出してください。Patioの照明は22時に消えます。"
        "Sprinklerは明日の朝6:30から15分間動きます。窓を閉めてね。")

CHILD = r"""
import json, sys, time, importlib, pkgutil
import hayakoe_pi.text as text
from hayakoe_pi.text import FrontEnd
mode, vocab, repeats, sample = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
fe = FrontEnd(vocab)

def forget():  # every reading cache of the front end (functools caches in hayakoe_pi.text.*)
    for info in pkgutil.iter_modules(text.__path__):
        module = importlib.import_module("hayakoe_pi.text." + info.name)
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()

def timed():
    began = time.perf_counter()
    fe.analyze(sample)
    return (time.perf_counter() - began) * 1000

if mode == "unlisted":  # no word found in the list of readings made ahead (a tree without it: as "new")
    try:
        from hayakoe_pi.text.english_list import READINGS
    except ImportError:
        pass
    else:
        READINGS.reading = lambda word, version: None
    mode = "new"
if mode in ("first", "started"):
    if mode == "started":
        time.sleep(1.0)  # as in the daemon, whose models take seconds to load: kanalizer's warm-up is done
    out = [timed()]
elif mode == "new":
    fe.analyze(sample)  # libraries loaded
    out = []
    for _ in range(repeats):
        forget()
        out.append(timed())
else:
    fe.analyze(sample)
    out = [timed() for _ in range(repeats)]
print(json.dumps({"ms": out, "norm": fe.analyze(sample).norm}))
"""


def measure(tree: Path, mode: str, repeats: int) -> tuple[list[float], str]:
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(VOCAB), str(repeats), TEXT],
                       capture_output=True, text=True, check=True, cwd=tree,  # python -c imports from cwd first
                       env={"PYTHONPATH": str(tree), "PATH": "/usr/bin"})
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["ms"], out["norm"]


def listed_words(tree: Path, words: list[str]) -> list[str]:
    """Which of these words the tree's list of kanalizer's readings made ahead holds."""
    path = tree / "hayakoe_pi/text/data/english_readings.txt"
    if not path.exists():
        return []
    held = {line.split("\t")[0] for line in path.read_text(encoding="utf-8").splitlines()[1:]}
    return [w for w in words if w.lower() in held]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/frontend.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="8111dab", help="the revision to compare with (default: 8111dab)")
    ap.add_argument("--repeats", type=int, default=30, help="runs in one process (new and seen words)")
    ap.add_argument("--processes", type=int, default=7, help="fresh processes for the first text")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hayakoe-pi-base-") as base_dir:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.base, "hayakoe_pi"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", base_dir], input=archive, check=True)
        trees = {args.base: Path(base_dir), "this tree": REPO}
        rows, norms = {}, {}
        listed = listed_words(REPO, WORDS)
        for mode, label in (("first", "first text of a process"), ("started", "first text, 1 s after start"),
                            ("new", f"10 new words ({len(listed)} listed)"),
                            ("unlisted", "10 new words, none listed"), ("seen", "words seen before")):
            rows[label] = {}
            for name, tree in trees.items():
                samples: list[float] = []
                for _ in range(args.processes if mode in ("first", "started") else 1):
                    ms, norms[name] = measure(tree, mode, args.repeats)
                    samples += ms
                rows[label][name] = statistics.median(samples)
    names = list(trees)
    print(f"words in this tree's list of readings made ahead: {', '.join(listed) or 'none'}")
    print(f"front end of {len(TEXT)} characters with 10 English words (FrontEnd.analyze), median ms "
          f"({args.processes} processes for a first text, {args.repeats} runs otherwise)")
    print(f"| {'':28} | {names[0]:>10} | {names[1]:>10} | ratio |")
    print(f"|{'-' * 30}|{'-' * 12}|{'-' * 12}|-------|")
    for label, by in rows.items():
        print(f"| {label:28} | {by[names[0]]:10.2f} | {by[names[1]]:10.2f} | {by[names[1]] / by[names[0]]:5.2f} |")
    for name in names:
        print(f"{name}: {norms[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
