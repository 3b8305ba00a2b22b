#!/usr/bin/env python3
"""Speech as a listener hears it: the real daemon into a sound card that plays in real time.

    python bench/run.py playback --models /work/bench-models/full [--baseline REPO] [--cpus 0.6,0.45]
                                 [--chime default|none] [--lead-in-ms 300]

For each text it starts a private mosquitto, the test sound card of
tests/harness.py (ALSA's file plugin into a pipe of ~93 ms that is read at the
sample rate, recording every moment the card ran dry) and `hayakoe-pi run`
with the given models and a fresh phrase cache. After one warm-up message it
publishes the text and measures, from the publish: the first sound, the end of
the sound, the holes (the card ran dry) inside speech and between sentences,
how much longer the pauses got than the engine made them (played length minus
the `seconds` of the `finished` event), and the underruns PortAudio reported.
The daemon plays the default chime before each message (`--chime none`: no
chime) after a lead-in of `--lead-in-ms`, as installed: the time to the chime
and to the first word (the first sound after the chime) are reported too.
`--cpus 0.6` also runs the `--cpu-texts` with the daemon limited to that
share of the CPU (cgroup v1 cpu controller; root only): about a Raspberry Pi
4's speed with the full-size models (several shares, comma-separated).
`--baseline REPO` runs another checkout of hayakoe-pi (e.g. the commit before
this change, `git worktree add /tmp/base HEAD~1`) side by side, alternating.
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

from harness import (AlsaSink, DaemonProcess, Mosquitto, Probe, cpu_cgroup_available,  # noqa: E402
                     cpu_limited, wait_for, write_config)
from texts import TEXTS  # noqa: E402

from hayakoe_pi.sound.chime import default_chime  # noqa: E402

PIPE_BYTES = 16384  # ~93 ms of float32 mono at 44.1 kHz: a real card's buffer
RATE = 44100


def _sound_starts(sink: AlsaSink, opened, chime: bool) -> tuple[float | None, float]:
    """(seconds after the card's first byte the chime starts, else None; the first word starts)."""
    import numpy as np

    with open(sink.raw, "rb") as f:
        f.seek(opened.start)
        pcm = np.frombuffer(f.read(opened.end - opened.start), dtype="<f4")
    first = int(np.flatnonzero(pcm)[0])
    if not chime:
        return None, first / RATE
    sound = default_chime(RATE)
    sound = sound[int(np.flatnonzero(sound)[0]):]
    assert np.array_equal(pcm[first:first + sound.size], sound), "the card did not play the chime first"
    word = first + sound.size + int(np.flatnonzero(pcm[first + sound.size:])[0])
    return first / RATE, word / RATE


def one_run(repo: Path, models: Path, voice: str, text: str, cpus: float | None, work: Path,
            chime: bool = True, lead_in_ms: float = 300) -> dict:
    broker = Mosquitto(work / "broker").start()
    prefix = f"pb{broker.port}"
    probe = Probe(broker.port, prefix)
    sink = AlsaSink(work, buffer_bytes=PIPE_BYTES)
    config = write_config(work / "config.yaml", broker.port, prefix, work,
                          models={"dir": str(models)}, voice={"name": voice}, log={"level": "INFO"},
                          audio={"chime": "default" if chime else "none", "lead_in_ms": lead_in_ms,
                                 "keep_open_s": 0})
    daemon = DaemonProcess(config, sink.home, work / "daemon.log", repo=repo)
    try:
        wait_for(lambda: probe.last("status") == b"online" or daemon.proc.poll() is not None, 300,
                 what="the daemon to come online")
        assert daemon.proc.poll() is None, daemon.output()
        probe.publish("say", {"text": "準備ができました。", "id": "warm-up"})
        probe.next_event(event="finished", id="warm-up", timeout=300)
        wait_for(lambda: sink.opens and sink.opens[-1].eof is not None, 30, what="warm-up played")
        sink.reset_records()
        start = sink.raw.stat().st_size
        limit = cpu_limited(daemon.proc.pid, cpus) if cpus else None
        if limit:
            limit.__enter__()
        try:
            t0 = time.monotonic()
            probe.publish("say", {"text": text, "id": "measured"})
            finished = probe.next_event(event="finished", id="measured", timeout=900)
            wait_for(lambda: sink.opens and sink.opens[-1].eof is not None, 60, what="end of sound")
        finally:
            if limit:
                limit.__exit__(None, None, None)
        opened = sink.opens[-1]
        played = (sink.raw.stat().st_size - start) / 4 / RATE
        chime_at, word_at = _sound_starts(sink, opened, chime)
        speech, pauses = sink.holes_in_speech(), sink.holes_in_pauses()
        return {
            "audio_s": finished.get("seconds"),
            "first_sound_s": opened.first_data - t0,
            "chime_s": None if chime_at is None else opened.first_data + chime_at - t0,
            "first_word_s": opened.first_data + word_at - t0,
            "total_s": opened.eof - t0,
            "holes_in_speech": len(speech), "holes_in_speech_s": sum(h.seconds for h in speech),
            "longest_hole_s": max([h.seconds for h in speech], default=0.0),
            "holes_in_pauses": len(pauses), "holes_in_pauses_s": sum(h.seconds for h in pauses),
            # the lead-in and the chime are no pause
            "pause_stretch_s": played - finished["seconds"] - lead_in_ms / 1000
            - (default_chime(RATE).size / RATE if chime else 0.0) if finished.get("seconds") else None,
            "underruns": finished.get("underruns"),
        }
    finally:
        daemon.stop()
        sink.stop()
        probe.close()
        broker.stop()


COLUMNS = [("audio s", "audio_s", "{:.1f}"), ("card opened s", "first_sound_s", "{:.2f}"),
           ("chime s", "chime_s", "{:.2f}"), ("first word s", "first_word_s", "{:.2f}"),
           ("speaking took s", "total_s", "{:.1f}"), ("holes in speech", "holes_in_speech", "{:d}"),
           ("their s", "holes_in_speech_s", "{:.2f}"), ("longest s", "longest_hole_s", "{:.2f}"),
           ("holes in pauses", "holes_in_pauses", "{:d}"), ("pause stretch s", "pause_stretch_s", "{:.2f}"),
           ("underruns", "underruns", "{}")]


def _cell(fmt: str, value) -> str:
    if value is None:
        return "–"
    return fmt.format(int(value)) if "d" in fmt else fmt.format(value)


def table(results: list[dict]) -> str:
    lines = ["| text | CPU | build | " + " | ".join(c[0] for c in COLUMNS) + " |",
             "|---|---|---|" + "--:|" * len(COLUMNS)]
    for r in results:
        median = {key: statistics.median(run[key] for run in r["runs"]) if r["runs"][0][key] is not None
                  else None for _, key, _ in COLUMNS}
        lines.append(f"| {r['text']} | {r['cpu']} | {r['build']} | "
                     + " | ".join(_cell(fmt, median[key]) for _, key, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--voice", default="full-voice")
    ap.add_argument("--texts", default="medium,long,very long", help="comma-separated text names")
    ap.add_argument("--cpus", default="", help="also run with the daemon at these CPU shares (e.g. 0.6,0.45)")
    ap.add_argument("--cpu-texts", default="long", help="texts for the --cpus runs")
    ap.add_argument("--baseline", type=Path, help="another hayakoe-pi checkout, run side by side")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write every run here")
    ap.add_argument("--chime", choices=("default", "none"), default="default", help="the chime before each text")
    ap.add_argument("--lead-in-ms", type=float, default=300, help="audio.lead_in_ms")
    args = ap.parse_args(argv)

    texts = dict(TEXTS)
    cases = [(name, None) for name in args.texts.split(",")]
    if args.cpus:
        reason = cpu_cgroup_available()
        if reason:
            print(f"skipping the --cpus runs: {reason}", file=sys.stderr)
        else:
            cases += [(name, float(c)) for c in args.cpus.split(",") for name in args.cpu_texts.split(",")]
    builds = [("this", REPO)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    results = {(n, c, b): {"text": n, "cpu": f"{c:g}" if c else "all", "build": b, "runs": []}
               for n, c in cases for b, _ in builds}
    for _ in range(args.repeats):
        for name, cpus in cases:
            for build, repo in builds:  # alternating, so drift on a shared machine hits both
                with tempfile.TemporaryDirectory(prefix="bench-playback-") as work:
                    run = one_run(repo, args.models, args.voice, texts[name], cpus, Path(work),
                                  args.chime == "default", args.lead_in_ms)
                print(json.dumps({"text": name, "cpus": cpus, "build": build, **run}), file=sys.stderr)
                results[(name, cpus, build)]["runs"].append(run)
    print(table(list(results.values())))
    if args.json:
        args.json.write_text(json.dumps(list(results.values()), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
