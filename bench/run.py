#!/usr/bin/env python3
"""Benchmark hayakoe-pi against HayaKoe 1.3.1 on the same ONNX model files.

    python bench/run.py --models /work/bench-models/full [--out bench/out] [--repeats 3]
    python bench/run.py playback --models ...   # holes, pause stretch, underruns (bench/playback.py)
    python bench/run.py memory --models ...     # a first start inside a memory limit (bench/memory.py)

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
from texts import TEXTS  # noqa: E402

IMPLS = ("hayakoe-pi", "hayakoe")
LABEL = {"hayakoe-pi": "hayakoe-pi", "hayakoe": "HayaKoe 1.3.1"}
DECODER_GFLOP_PER_AUDIO_SECOND = 54.0


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

    if impl == "hayakoe-pi":
        from hayakoe_pi import Engine

        eng = Engine(models, voice=voice)
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
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
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


def _f(v: float, digits: int = 2) -> str:
    return f"{v:.{digits}f}"


def markdown(results: dict) -> str:
    m = results["machine"]
    v = results["versions"]
    lines = [
        f"Machine: {m['cpu']}, {m['physical_cores'] or '?'} cores / {m['logical_cpus']} threads, "
        f"{m['memory_gb']} GB, {m['machine']}, Linux {m['kernel']}, Python {m['python']}  ",
        f"Date: {results['date']}; hayakoe-pi {v['hayakoe-pi']} ({v['hayakoe-pi git']}), "
        f"HayaKoe {v['hayakoe']}, onnxruntime {v['onnxruntime']}, numpy {v['numpy']}, "
        f"transformers {v['transformers']}  ",
        f"Models: `{results['models']}` voice `{results['voice']}` (random weights, full "
        f"JP-Extra size; BERT Q8 {results['model_sizes_mb']['bert_q8.onnx']:.0f} MB, "
        f"synthesizer {results['model_sizes_mb']['synthesizer.onnx']:.0f} MB); style Neutral, "
        f"speed 1.0, each API's default noise; median of {results['repeats']} runs, "
        "implementations alternating, each run a fresh process (load, one untimed warm-up "
        "of the same text, one timed streaming run).",
        "",
        "| text | implementation | audio s | speech s | load s | first audio s | total s | RTF | "
        "speech RTF | decoder GFLOP/s | peak RSS MB |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for t in results["texts"]:
        s = t["summary"]
        name = f"{t['name']} ({len(t['text'])} chars, {t['sentences']} sent.)"
        for impl in IMPLS:
            r = s[impl]
            lines.append(
                f"| {name if impl == IMPLS[0] else ''} | {LABEL[impl]} | {_f(r['audio_s'], 1)} | "
                f"{_f(r['speech_s'], 1)} | {_f(r['load_s'])} | {_f(r['first_s'])} | {_f(r['total_s'])} | "
                f"{_f(r['rtf'])} | {_f(r['speech_rtf'])} | {_f(r['decoder_gflops'], 1)} | "
                f"{r['peak_rss_mb']:.0f} |")
        a, pair = t["advantage"], t["pair_advantage"]
        lines.append(
            f"| | **hayakoe-pi advantage** | | | **{_f(a['load_s'])}×** | **{_f(a['first_s'])}×** | "
            f"**{_f(a['total_s'])}×** | **{_f(a['rtf'])}×** | **{_f(a['speech_rtf'])}×** | "
            f"**{_f(a['decoder_gflops'])}×** | **{_f(a['peak_rss_mb'])}×** |")
        lines.append(f"| | median of the pairs' advantage | | | | | {_f(pair['total_s'])}× | "
                     f"{_f(pair['rtf'])}× | {_f(pair['speech_rtf'])}× | | |")
    lines += [
        "",
        "RTF = seconds of audio per second of synthesis (>1: faster than real time). Speech "
        "is the audio less the silence each implementation puts between sentences (samples "
        "exactly 0: they cost no synthesis, and hayakoe-pi's pauses are longer), speech RTF "
        "its seconds per second of synthesis. "
        f"Decoder GFLOP/s = speech RTF × {DECODER_GFLOP_PER_AUDIO_SECOND:g} GFLOP per second of speech "
        "(the HiFi-GAN decoder's cost; BERT and the rest are on top, so it is a lower bound). "
        "\"advantage\" > 1 means hayakoe-pi is better: HayaKoe ÷ hayakoe-pi for times and "
        "memory, hayakoe-pi ÷ HayaKoe for RTF and GFLOP/s; \"median of the pairs\" takes "
        "it in each pair of runs made one after the other, which share the machine's speed "
        "of the minute. Load includes importing the "
        "package; first audio is the first chunk of each one's streaming API "
        "(`Engine.stream`, `Speaker.stream`); peak RSS is the process's VmHWM, load included.",
    ]
    return "\n".join(lines) + "\n"


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [t["name"] for t in results["texts"]]
    metrics = [("first_s", "time to first audio (s)"), ("total_s", "total synthesis (s)"),
               ("rtf", "real-time factor (×)"), ("peak_rss_mb", "peak RSS (MB)")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 4))
    width = 0.38
    colors = {"hayakoe-pi": "#2a7ab9", "hayakoe": "#d9822b"}
    for ax, (key, title) in zip(axes, metrics):
        for j, impl in enumerate(IMPLS):
            vals = [t["summary"][impl][key] for t in results["texts"]]
            xs = [i + (j - 0.5) * width for i in range(len(names))]
            bars = ax.bar(xs, vals, width, label=LABEL[impl], color=colors[impl])
            ax.bar_label(bars, fmt="%.3g" if key != "peak_rss_mb" else "%.0f", fontsize=7)
        ax.set_xticks(range(len(names)),
                      [f"{n}\n{t['summary']['hayakoe-pi']['audio_s']:.0f} s audio"
                       for n, t in zip(names, results["texts"])], fontsize=8)
        ax.set_title(title, fontsize=10)
        if key == "rtf":
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    axes[0].legend(fontsize=8)
    m = results["machine"]
    fig.suptitle(f"hayakoe-pi vs HayaKoe {results['versions']['hayakoe']} — {m['cpu']}, "
                 f"{m['logical_cpus']} CPUs — {results['date'][:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def count_sentences(text: str) -> int:
    return sum(text.count(c) for c in "。！？!?") or 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["playback"]:  # speech as heard on a real-time card: bench/playback.py
        from playback import main as playback
        return playback(argv[1:])
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
    impls = (a.only,) if a.only else IMPLS
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
        if len(impls) == 2:
            pi, hk = entry["summary"]["hayakoe-pi"], entry["summary"]["hayakoe"]
            entry["advantage"] = {
                **{k: hk[k] / pi[k] for k in ("load_s", "first_s", "total_s", "peak_rss_mb")},
                **{k: pi[k] / hk[k] for k in ("rtf", "speech_rtf", "decoder_gflops")},
            }
            entry["pair_advantage"] = pair_advantage(runs["hayakoe-pi"], runs["hayakoe"])
        results["texts"].append(entry)

    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n",
                                        encoding="utf-8")
    if len(impls) == 2:
        table = markdown(results)
        (a.out / "results.md").write_text(table, encoding="utf-8")
        chart(results, a.out / "results.png")
        print(table)
    else:
        for t in results["texts"]:
            print(t["name"], json.dumps(t["summary"]))
    print(f"wrote {a.out}/results.json" + (", results.md, results.png" if len(impls) == 2 else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
