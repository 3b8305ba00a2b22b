#!/usr/bin/env python3
"""Rooms in step at the ear: how long after `"at"` each room's first sample is heard.

    python bench/run.py in-step [--runs 5] [--ahead 2.5] [--baseline REPO] [--json FILE]

One private mosquitto and one `hayakoe-pi run` a room (the tiny test voice of
tests/fixtures), each on its own test sound card of tests/harness.py (ALSA's
file plugin into a pipe read at the sample rate: a card that takes audio on a
real-time schedule). The cards differ in what they hold when full (the pipe,
what the card has taken ahead of playing, and ALSA's one buffer the file
plugin keeps back), and in being kept open (`audio.keep_open_s`: full of
silence when the message comes) or opened fresh. Each run sends every kept
room a message first, then every room the same text with the same `"at"`,
`--ahead` seconds ahead. Heard is when the card's real-time drain plays the
first non-zero sample (harness.AlsaSink.heard_at), not what the daemon thinks;
`late_s` is what the daemon's `started` event said. The spread is, per run,
the latest room less the earliest. `--baseline REPO` runs another checkout of
hayakoe-pi the same way after this one (e.g. `git archive main | tar -x -C /tmp/base`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO / "tests"), str(HERE)]

from harness import message_before, rooms, say_at  # noqa: E402

RATE = 44100
DEEPER = int(0.1 * RATE) * 4  # bytes: 0.1 s more taken ahead
CARDS = {  # name: (what it holds when full, AlsaSink options, audio config)
    "fresh": ("pipe 16 KiB", {}, {"keep_open_s": 0}),
    "kept": ("pipe 16 KiB", {}, {"keep_open_s": 60}),
    "kept-deeper": ("pipe 16 KiB, 0.1 s more ahead", {"period_bytes": 4096 + DEEPER}, {"keep_open_s": 60}),
    "fresh-big": ("pipe 64 KiB", {"buffer_bytes": 65536}, {"keep_open_s": 0}),
    "kept-big": ("pipe 64 KiB", {"buffer_bytes": 65536}, {"keep_open_s": 60}),
}


def measure(repo: Path, runs: int, ahead: float) -> list[dict]:
    """Every run: {card: (seconds after at it was heard, late_s)}."""
    cards = {name: (sink, audio) for name, (_, sink, audio) in CARDS.items()}
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-in-step-") as work, rooms(Path(work), cards, repo) as house:
        for run in range(runs):
            for name, (_, _, audio) in CARDS.items():
                if audio["keep_open_s"]:
                    message_before(house, name)
            heard = say_at(house, list(CARDS), time.time() + ahead, f"run-{run}")
            results.append({name: (late, started.get("late_s", 0.0)) for name, (started, late) in heard.items()})
            print(json.dumps({"run": run, **results[-1]}), file=sys.stderr)
    return results


def table(builds: dict[str, list[dict]]) -> str:
    lines = ["| build | card | holds | heard after at, ms: median | min | max | late_s said, ms: max |",
             "|---|---|---|--:|--:|--:|--:|"]
    for build, results in builds.items():
        for name, (holds, _, _) in CARDS.items():
            heard = [r[name][0] * 1000 for r in results]
            said = [r[name][1] * 1000 for r in results]
            lines.append(f"| {build} | {name} | {holds} | {statistics.median(heard):+.1f} | {min(heard):+.1f} | "
                         f"{max(heard):+.1f} | {max(said):.0f} |")
    lines += ["", "| build | runs | spread between rooms, ms: median | max |", "|---|--:|--:|--:|"]
    for build, results in builds.items():
        spreads = [(max(v[0] for v in r.values()) - min(v[0] for v in r.values())) * 1000 for r in results]
        lines.append(f"| {build} | {len(results)} | {statistics.median(spreads):.1f} | {max(spreads):.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ahead", type=float, default=2.5, help="seconds from the publish to at")
    ap.add_argument("--baseline", type=Path, help="another hayakoe-pi checkout, run the same way")
    ap.add_argument("--json", type=Path, help="write every run here")
    args = ap.parse_args(argv)
    builds = {"this": measure(REPO, args.runs, args.ahead)}
    if args.baseline:
        builds["baseline"] = measure(args.baseline.resolve(), args.runs, args.ahead)
    print(table(builds))
    if args.json:
        args.json.write_text(json.dumps(builds, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
