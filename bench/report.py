"""bench/run.py's report: the markdown table (every implementation, and each hayakoe-pi
variant's advantage over HayaKoe) and the chart."""

from __future__ import annotations

from pathlib import Path

# hayakoe-pi as the daemon runs it on this CPU, and as a Pi would (--arm-path: the 1-D decoder
# form only, as on ARM, where ONNX Runtime has no blocked kernels), each with the FP32 and the
# 8-bit decoder (engine.decoder int8)
PI_VARIANTS = {
    "hayakoe-pi": {"decoder": "fp32", "arm_path": False},
    "hayakoe-pi int8": {"decoder": "int8", "arm_path": False},
    "hayakoe-pi arm": {"decoder": "fp32", "arm_path": True},
    "hayakoe-pi arm int8": {"decoder": "int8", "arm_path": True},
}
IMPLS = (*PI_VARIANTS, "hayakoe")
LABEL = {"hayakoe-pi": "hayakoe-pi", "hayakoe-pi int8": "hayakoe-pi int8",
         "hayakoe-pi arm": "hayakoe-pi ARM path FP32", "hayakoe-pi arm int8": "hayakoe-pi ARM path int8",
         "hayakoe": "HayaKoe 1.3.1"}
COLORS = {"hayakoe-pi": "#2a7ab9", "hayakoe-pi int8": "#6fb3e0", "hayakoe-pi arm": "#2e8b57",
          "hayakoe-pi arm int8": "#8fd19e", "hayakoe": "#d9822b"}
DECODER_GFLOP_PER_AUDIO_SECOND = 54.0


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
        for i, impl in enumerate(s):
            r = s[impl]
            lines.append(
                f"| {name if i == 0 else ''} | {LABEL[impl]} | {_f(r['audio_s'], 1)} | "
                f"{_f(r['speech_s'], 1)} | {_f(r['load_s'])} | {_f(r['first_s'])} | {_f(r['total_s'])} | "
                f"{_f(r['rtf'])} | {_f(r['speech_rtf'])} | {_f(r['decoder_gflops'], 1)} | "
                f"{r['peak_rss_mb']:.0f} |")
        for impl, a in t.get("advantage", {}).items():
            pair = t["pair_advantage"][impl]
            lines.append(
                f"| | **{LABEL[impl]}: advantage** | | | **{_f(a['load_s'])}×** | **{_f(a['first_s'])}×** | "
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
    for ax, (key, title) in zip(axes, metrics):
        impls = list(results["texts"][0]["summary"])
        width = 0.76 / len(impls)
        for j, impl in enumerate(impls):
            vals = [t["summary"][impl][key] for t in results["texts"]]
            xs = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(names))]
            bars = ax.bar(xs, vals, width, label=LABEL[impl], color=COLORS[impl])
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
