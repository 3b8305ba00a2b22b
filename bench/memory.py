#!/usr/bin/env python3
"""A first start on a small Pi: prepare and synthesize inside a memory limit.

    python bench/run.py memory --models /work/bench-models/full [--limits 400,700,900] [--baseline REPO]
                               [--decoder fp32|int8|auto]

For each limit, on a fresh cache and with the page cache dropped, it runs in a
memory cgroup of that size (cgroup v1 `memory.limit_in_bytes`, as root; the
kernel's OOM killer acts as on a Pi with that much free): `hayakoe-pi prepare`
of BERT and the voice, then `hayakoe-pi synth` of a short text and of the 38 s
text, with `engine.decoder` given by --decoder (int8: prepare makes the 8-bit decoder
too, in two more children). It prints, per run, whether it succeeded and how long it took, and the
per-step peaks prepare reports (the group's own peak says little: the page
cache fills it to the limit, and the kernel reclaims that before it kills). `--baseline REPO` runs another
checkout the same way (`git worktree add /tmp/base HEAD~1`).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO / "tests"), str(HERE)]

from harness import memory_cgroup_available, run_with_memory_limit  # noqa: E402
from texts import TEXTS  # noqa: E402


def _run(repo: Path, limit: int, cache: Path, args: list[str]) -> dict:
    subprocess.run(["sync"], check=False)
    Path("/proc/sys/vm/drop_caches").write_text("3")
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(repo)}
    began = time.monotonic()
    done, _ = run_with_memory_limit([sys.executable, "-m", "hayakoe_pi.cli", *args], limit,
                                       cwd=repo, env=env, capture_output=True, text=True)
    steps = re.findall(r"^(BERT|voice \S+): prepared in [\d.]+ s, peak memory (\d+) MB", done.stdout, re.M)
    return {"ok": done.returncode == 0, "exit": done.returncode, "seconds": time.monotonic() - began,
            "steps": ", ".join(f"{w} {mb}" for w, mb in steps),
            "error": (done.stderr.strip().splitlines() or [""])[-1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/run.py memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--voice", default="full-voice")
    ap.add_argument("--limits", default="400,700,900", help="memory limits in MB, comma-separated")
    ap.add_argument("--baseline", type=Path, help="another checkout to run the same way")
    ap.add_argument("--decoder", default="fp32", choices=("fp32", "int8", "auto"), help="engine.decoder")
    a = ap.parse_args(argv)
    why = memory_cgroup_available()
    if why:
        ap.error(why)
    texts = dict(TEXTS)
    builds = [("now", REPO)] + ([("baseline", a.baseline.resolve())] if a.baseline else [])
    print("| limit MB | build | prepare | step peaks MB (VmHWM) | synth short | synth 38 s |")
    print("|--:|---|---|---|---|---|")
    for limit in (int(x) for x in a.limits.split(",")):
        for label, repo in builds:
            with tempfile.TemporaryDirectory(prefix="hayakoe-memory-") as cache:
                cache = Path(cache)
                config = cache / "config.yaml"
                # engine: only where asked for (a baseline may not know it)
                engine = f"engine: {{decoder: {a.decoder}}}\n" if a.decoder != "fp32" else ""
                config.write_text(f"models: {{dir: '{a.models}'}}\nvoice: {{name: '{a.voice}'}}\n"
                                  f"cache: {{dir: '{cache / 'cache'}'}}\n{engine}")
                runs = [_run(repo, limit, cache, ["prepare", "--config", str(config), "--voice", a.voice])]
                for text in (texts["short"], texts["very long"]):
                    runs.append(_run(repo, limit, cache, ["synth", "--config", str(config), "--models", str(a.models),
                                                          "--voice", a.voice, "-o", str(cache / "out.wav"), text]))
            cells = [f"ok, {r['seconds']:.1f} s" if r["ok"]
                     else f"**failed** (exit {r['exit']}{', OOM-killed' if r['exit'] in (-9, 137) or 'out of memory' in r['error'] else ''})"
                     for r in runs]
            print(f"| {limit} | {label} | {cells[0]} | {runs[0]['steps'] or '–'} | {cells[1]} | {cells[2]} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
