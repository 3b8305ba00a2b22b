#!/usr/bin/env python3
"""Benchmark hayakoe-pi against HayaKoe 1.3.1 on the same ONNX model files.

    python bench/run.py --models /work/bench-models/full [--out bench/out] [--repeats 3]
    python bench/run.py playback --models ...   # holes, pause stretch, underruns (bench/playback.py)
    python bench/run.py memory --models ...     # a first start inside a memory limit (bench/memory.py)
    python bench/run.py in-step                 # rooms' first samples as heard after "at" (bench/in_step.py)
    python bench/run.py counted --cache DIR     # instructions on a Pi 4's and Pi 5's cores (bench/counted.py)

For each text and implementation it starts a fresh Python process that imports
the implementation, loads BERT and the voice, speaks the text once untimed
(warm-up: first-call allocations, dictionary load) and once timed through the
streaming API, then reports its peak RSS (VmHWM).  The implementations
alternate (A, B, A, B, ...) for every text, ``--repeats`` times; the table gives
the medians.  Writes ``results.json`` (every raw run), ``results.md`` (the
table) and ``results.png`` (chart) to ``--out``.  See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # texts.py, playback.py, memory.py: beside it
from report import DECODER_GFLOP_PER_AUDIO_SECOND, IMPLS, PI_VARIANTS, chart, markdown  # noqa: E402
from texts import TEXTS  # noqa: E402

ARM_PATH_CACHE = Path.home() / ".cache" / "hayakoe-pi-arm-path"  # XDG_CACHE_HOME of --arm-path's variants


# --------------------------------------------------------------------------
# worker: one fresh process = one implementation x one text
# --------------------------------------------------------------------------


def _status_kb(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def _offline_env() -> None:
    # HayaKoe pulls in huggingface_hub/transformers: never let them go online.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _load(impl: str, models: Path, voice: str, cache: Path):
    """Import + load; returns stream(text) -> iterator of (samples, silent samples, sample_rate).

    Silent samples are those exactly 0: the silence each implementation puts
    between sentences (synthesized audio, even of random weights, is never
    exactly 0), which costs no synthesis.
    """
    import numpy as np

    if impl in PI_VARIANTS:
        from hayakoe_pi import Engine

        eng = Engine(models, voice=voice, decoder=PI_VARIANTS[impl]["decoder"])
        sr = eng.sample_rate

        def stream(text: str):
            for chunk in eng.stream(text, style="Neutral", speed=1.0):
                yield len(chunk), int(np.count_nonzero(chunk == 0)), sr
        return stream

    if impl == "hayakoe":
        from hayakoe import TTS

        # A plain path is HayaKoe's LocalSource: BERT from <models>/onnx/bert/q8,
        # its tokenizer from <models>/bert/tokenizer, the voice from
        # <models>/onnx/speakers/<voice>; nothing is fetched or cached.
        tts = (TTS(device="cpu", cache_dir=cache, bert_source=str(models))
               .load(voice, source=str(models))
               .prepare())
        speaker = tts.speakers[voice]

        def stream(text: str):
            for chunk in speaker.stream(text, style="Neutral", speed=1.0):
                data = np.asarray(chunk.data)
                yield len(data), int(np.count_nonzero(data == 0)), chunk.sr
        return stream

    raise ValueError(impl)


def _timed(stream, text: str) -> dict:
    t0 = time.perf_counter()
    first = None
    samples = silent = chunks = 0
    sr = 0
    for n, zeros, sr in stream(text):
        if first is None:
            first = time.perf_counter() - t0
        samples += n
        silent += zeros
        chunks += 1
    total = time.perf_counter() - t0
    return {"first_s": first, "total_s": total, "samples": samples, "sample_rate": sr,
            "chunks": chunks, "audio_s": samples / sr if sr else 0.0,
            "speech_s": (samples - silent) / sr if sr else 0.0}


def worker(impl: str, models: Path, voice: str, text: str) -> dict:
    _offline_env()
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as cache:
        t0 = time.perf_counter()
        stream = _load(impl, models, voice, Path(cache))
        load_s = time.perf_counter() - t0
        rss_loaded = _status_kb("VmRSS")
        cold = _timed(stream, text)
        warm = _timed(stream, text)
    return {"impl": impl, "load_s": load_s, "rss_after_load_mb": rss_loaded / 1024,
            "cold": cold, **warm, "peak_rss_mb": _status_kb("VmHWM") / 1024}


# --------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------


def run_worker(impl: str, models: Path, voice: str, text: str, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", impl,
           "--models", str(models), "--voice", voice, "--text", text]
    env = dict(os.environ)
    if PI_VARIANTS.get(impl, {}).get("arm_path"):  # prepared apart: the 1-D forms alone
        env.update(HAYAKOE_PI_ARM_PATH="1", XDG_CACHE_HOME=str(ARM_PATH_CACHE))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{impl} worker failed (rc={p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(lines[-1])


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git_rev(repo: Path) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        return rev or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_info() -> dict:
    model, physical = "unknown", set()
    phys_id = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key in ("model name", "Model") and model == "unknown":
                    model = value
                elif key == "physical id":
                    phys_id = value
                elif key == "core id":
                    physical.add((phys_id, value))
    except OSError:
        pass
    mem_gb = 0.0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            mem_gb = int(f.readline().split()[1]) / 1024 / 1024
    except (OSError, ValueError, IndexError):
        pass
    return {"cpu": model, "logical_cpus": os.cpu_count(),
            "physical_cores": len(physical) or None, "memory_gb": round(mem_gb, 1),
            "machine": platform.machine(), "kernel": platform.release(),
            "python": platform.python_version()}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(runs: list[dict]) -> dict:
    out: dict = {}
    for key in ("load_s", "first_s", "total_s", "audio_s", "peak_rss_mb", "chunks"):
        out[key] = median([r[key] for r in runs])
    out["rtf"] = median([r["audio_s"] / r["total_s"] for r in runs])
    out["speech_s"] = median([r["speech_s"] for r in runs])
    out["speech_rtf"] = median([r["speech_s"] / r["total_s"] for r in runs])
    out["cold_first_s"] = median([r["cold"]["first_s"] for r in runs])
    out["cold_total_s"] = median([r["cold"]["total_s"] for r in runs])
    out["decoder_gflops"] = out["speech_rtf"] * DECODER_GFLOP_PER_AUDIO_SECOND  # silence is not decoded
    return out


def pair_advantage(pi_runs: list[dict], hk_runs: list[dict]) -> dict:
    """hayakoe-pi's advantage in each pair of runs made one after the other, median
    over the pairs: the machine's speed drifts from minute to minute, and a pair
    shares it while the medians of each implementation's runs may not."""
    def rtf(r: dict, key: str) -> float:
        return r[key] / r["total_s"]

    pairs = list(zip(pi_runs, hk_runs))
    return {"total_s": median([h["total_s"] / p["total_s"] for p, h in pairs]),
            "rtf": median([rtf(p, "audio_s") / rtf(h, "audio_s") for p, h in pairs]),
            "speech_rtf": median([rtf(p, "speech_s") / rtf(h, "speech_s") for p, h in pairs])}


def count_sentences(text: str) -> int:
    return sum(text.count(c) for c in "。！？!?") or 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["playback"]:  # speech as heard on a real-time card: bench/playback.py
        from playback import main as playback
        return playback(argv[1:])
    if argv[:1] == ["in-step"]:  # rooms' first samples as heard after "at": bench/in_step.py
        from in_step import main as in_step
        return in_step(argv[1:])
    if argv[:1] == ["counted"]:  # instructions on a Pi's cores, emulated, and time estimated: bench/counted.py
        from counted import main as counted
        return counted(argv[1:])
    if argv[:1] == ["memory"]:  # a first start inside a memory limit: bench/memory.py
        from memory import main as memory
        return memory(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, required=True,
                    help="HayaKoe-layout models dir (python tools/make_models.py --size full)")
    ap.add_argument("--voice", default="full-voice")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--texts", default="", help="comma-separated text names (default: all)")
    ap.add_argument("--only", choices=IMPLS, help="run a single implementation (no ratios)")
    ap.add_argument("--arm-path", action="store_true",
                    help="hayakoe-pi also as a Pi runs it (1-D decoder forms only), FP32 and int8 decoders")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per worker process, seconds")
    ap.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    ap.add_argument("--text", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    models = a.models.resolve()
    if a.worker:
        print(json.dumps(worker(a.worker, models, a.voice, a.text)), flush=True)
        return 0

    voice_dir = models / "onnx" / "speakers" / a.voice
    bert = models / "onnx" / "bert" / "q8" / "bert_q8.onnx"
    for need in (bert, voice_dir / "synthesizer.onnx", models / "bert" / "tokenizer" / "vocab.txt"):
        if not need.is_file():
            ap.error(f"missing {need} (build with: python tools/make_models.py --out {models} "
                     "--size full)")
    impls = (a.only,) if a.only else IMPLS if a.arm_path else ("hayakoe-pi", "hayakoe")
    wanted = [s.strip() for s in a.texts.split(",") if s.strip()]
    texts = [(n, t) for n, t in TEXTS if not wanted or n in wanted]
    if not texts:
        ap.error(f"--texts: choose from {', '.join(n for n, _ in TEXTS)}")

    import numpy
    import onnxruntime

    repo = Path(__file__).resolve().parent.parent
    results: dict = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
        "versions": {"hayakoe-pi": _version("hayakoe-pi"), "hayakoe-pi git": _git_rev(repo),
                     "hayakoe": _version("hayakoe"), "onnxruntime": onnxruntime.__version__,
                     "numpy": numpy.__version__, "transformers": _version("transformers")},
        "models": str(models), "voice": a.voice, "repeats": a.repeats,
        "model_sizes_mb": {"bert_q8.onnx": bert.stat().st_size / 1e6,
                           "synthesizer.onnx": (voice_dir / "synthesizer.onnx").stat().st_size / 1e6},
        "decoder_gflop_per_audio_second": DECODER_GFLOP_PER_AUDIO_SECOND,
        "texts": [],
    }
    m = results["machine"]
    print(f"# {m['cpu']}, {m['logical_cpus']} CPUs; {results['date']}", file=sys.stderr)

    # Priming (untimed): fills the OS page cache with the model files for both,
    # and lets hayakoe-pi make its one-time synthesizer split (cached per model file).
    for impl in impls:
        print(f"priming {impl} ...", file=sys.stderr, flush=True)
        run_worker(impl, models, a.voice, texts[0][1], a.timeout)

    for name, text in texts:
        runs: dict[str, list[dict]] = {impl: [] for impl in impls}
        for rep in range(a.repeats):
            order = impls if rep % 2 == 0 else impls[::-1]  # A B, B A, A B, ...
            for impl in order:
                r = run_worker(impl, models, a.voice, text, a.timeout)
                runs[impl].append(r)
                print(f"{name:>10} #{rep + 1} {impl:>10}: load {r['load_s']:.2f}s, first "
                      f"{r['first_s']:.2f}s, total {r['total_s']:.2f}s for {r['audio_s']:.1f}s "
                      f"audio (RTF {r['audio_s'] / r['total_s']:.2f}), peak "
                      f"{r['peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
        entry = {"name": name, "text": text, "sentences": count_sentences(text), "runs": runs,
                 "summary": {impl: summarize(rs) for impl, rs in runs.items()}}
        if "hayakoe" in impls and len(impls) > 1:
            hk = entry["summary"]["hayakoe"]
            entry["advantage"], entry["pair_advantage"] = {}, {}
            for impl in impls[:-1]:
                pi = entry["summary"][impl]
                entry["advantage"][impl] = {
                    **{k: hk[k] / pi[k] for k in ("load_s", "first_s", "total_s", "peak_rss_mb")},
                    **{k: pi[k] / hk[k] for k in ("rtf", "speech_rtf", "decoder_gflops")},
                }
                entry["pair_advantage"][impl] = pair_advantage(runs[impl], runs["hayakoe"])
        results["texts"].append(entry)

    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n",
                                        encoding="utf-8")
    if len(impls) > 1:
        table = markdown(results)
        (a.out / "results.md").write_text(table, encoding="utf-8")
        chart(results, a.out / "results.png")
        print(table)
    else:
        for t in results["texts"]:
            print(t["name"], json.dumps(t["summary"]))
    print(f"wrote {a.out}/results.json" + (", results.md, results.png" if len(impls) > 1 else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
