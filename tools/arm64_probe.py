#!/usr/bin/env python3
"""What tools/arm64-check compares between this machine and arm64 under qemu.

    python tools/arm64_probe.py run --models DIR --out DIR [--child-python PROG]
    python tools/arm64_probe.py compare X86_DIR ARM64_DIR

`run` prepares the models into a fresh folder (split, decoder form, optimized
copies: the children of hayakoe_pi.models.prepare), then writes `frontend.jsonl`
(what `hayakoe-pi frontend` prints for SENTENCES), `audio.npz`
(`Engine.synthesize` with the noise off: every sentence with the
first voice, the second-last with the others) and
`run.json` (machine, versions, decoder form and lanes chosen, whether BERT's
8-bit weights were made unsigned, kanalizer's readings of KANALIZER_WORDS, and
of a sample of the list of its readings made ahead on x86 where they differ), and
`int8.npz`: the first voice's 8-bit decoder (engine.decoder int8), made and
gated on each side, speaking INT8_SENTENCES. `--child-python` is the
program the children are started with: under qemu user mode without
binfmt_misc the guest cannot exec an arm64 binary itself, only a host script
that starts qemu again.

`compare` exits 1 unless the front end is byte-identical, kanalizer loads
and reads alike on both and on arm64 reads the sampled words of the list as
the list does, every audio array has the same length and differs by at most
1e-4, and the 8-bit decoder passed its gate on both and sounds alike
(INT8_MIN_SNR_DB).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
MAX_DIFFERENCE = 1e-4
# The 8-bit decoders of the two machines differ more than rounding: 8-bit kernels differ
# between CPUs (x86's u8s8 products, ARM's NEON), and each side calibrates on latents of
# its own (the front's noise is random). Each is ~30 dB from its FP32 (the gate's figure):
# two of them within 20 dB of each other are the same sound; a broken kernel is not.
INT8_MIN_SNR_DB = 20.0
INT8_SENTENCES = 3  # the first ones of SENTENCES: emulation is slow
KANALIZER_WORDS = ["doorbell", "powerwall", "ecobee"]  # read by kanalizer's model on each machine
LISTED_STEP = 3000  # every 3000th word of the list of readings made ahead (on x86) read again on each machine

# Plain Japanese, the readings table (numbers, units, times, dates, Latin
# letters), and texts long enough for several BERT and decoder windows.
SENTENCES = [
    "玄関の鍵を閉めました。",
    "おはようございます！今日は晴れのち曇り、最高気温は28.5℃の予想です。",
    "午前7時30分にアラームを鳴らします。",
    "電気代は今月1,280円でした、先月より12%少ないです。",
    "リビングのエアコンをつけました？　いいえ、まだです…",
    "SwitchBotのバッテリー残量は15%です。",
    "12月3日(木)は燃えるゴミの日です。",
    # English words through kanalizer (its aarch64 wheel); a range and a reading written in the text
    "Front Porchのカメラとecobeeによると、晴れです。",
    "8:00-9:30は明日《アス》も晴れです。",
    "おかえりなさい。リビングのエアコンを冷房二十六度でつけておきました。玄関の鍵は閉まっています。"
    "お風呂はあと十分ほどで沸きます。明日の朝は七時に起こします。",
]


def run(models: Path, out: Path, child_python: str | None) -> None:
    if child_python:
        sys.executable = child_python  # what hayakoe_pi.models.prepare starts its children with
    out.mkdir(parents=True, exist_ok=True)
    frontend = subprocess.run(
        [sys.executable, "-m", "hayakoe_pi.cli", "frontend", "--models", str(models)],
        input="\n".join(SENTENCES) + "\n", capture_output=True, text=True, check=True)
    (out / "frontend.jsonl").write_text(frontend.stdout, encoding="utf-8")

    from hayakoe_pi.synthesis.engine import Engine
    from hayakoe_pi.models.folders import model_folder
    from hayakoe_pi.models.prepare import prepare
    from hayakoe_pi.models.store import ModelStore
    from hayakoe_pi.models.tune import read_tuning
    from hayakoe_pi.models.voices import installed_voices

    import onnxruntime

    derived = out / "derived"
    steps = prepare(models, derived, report=lambda step: print(f"  {step.line()}", flush=True))
    store = ModelStore(models, derived_dir=derived)
    audio, forms, timed, lanes = {}, {}, {}, {}
    for n, voice in enumerate(installed_voices(models)):
        engine = Engine(models, voice=voice, store=store)
        # every sentence with the first voice; emulation is slow (CI has 30 minutes), so the
        # others speak one short sentence: the long text's paths are the first voice's too
        for i, text in enumerate(SENTENCES if n == 0 else SENTENCES[-2:-1]):
            audio[f"{voice}/{i}"] = engine.synthesize(text, noise=0.0, noise_w=0.0)
        synthesizer = models / "onnx" / "speakers" / voice / "synthesizer.onnx"
        tuning = read_tuning(model_folder(synthesizer, derived))
        forms[voice] = tuning["form"] if tuning else "whole"
        timed[voice] = list(tuning["seconds"]) if tuning else []
        lanes[voice] = tuning["lanes"] if tuning else 1
    np.savez(out / "audio.npz", **audio)
    # the first voice's 8-bit decoder, used whatever its speed: the tiny voice is too small for
    # 8 bits to pay, and emulated timings mean nothing
    os.environ["HAYAKOE_PI_INT8_MIN_SPEEDUP"] = "0"
    first = installed_voices(models)[0]
    int8_store = ModelStore(models, derived_dir=derived, decoder="int8")
    engine = Engine(models, voice=first, store=int8_store)
    int8 = {f"{first}/{i}": engine.synthesize(text, noise=0.0, noise_w=0.0)
            for i, text in enumerate(SENTENCES[:INT8_SENTENCES])}
    np.savez(out / "int8.npz", **int8)
    try:
        import kanalizer

        guesses = {"version": kanalizer.__version__, "readings": {w: kanalizer.convert(w) for w in KANALIZER_WORDS},
                   "listed": listed_alike(kanalizer)}
    except Exception as e:  # the front end would fall back to spelling: reported, and compare fails
        guesses = {"error": f"{type(e).__name__}: {e}"}
    (out / "run.json").write_text(json.dumps({
        "machine": platform.machine(), "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
        "prepared": [s.what for s in steps if not s.done], "decoder_form": forms, "forms_timed": timed,
        "decoder_lanes": lanes,
        "bert_unsigned_int8": store.bert.unsigned_int8, "kanalizer": guesses,
        "int8": engine.voice.int8, "int8_used": engine.voice.decoder_kind == "int8"},
        indent=1))


def listed_alike(kanalizer) -> dict:
    """A sample of the list of kanalizer's readings made ahead (english_list.py), read by this machine's
    kanalizer: the words it reads otherwise than the list, which english.py would read on its behalf."""
    from hayakoe_pi.text.english import kanalizer_reading
    from hayakoe_pi.text.english_list import LIST_PATH

    sample = [line.split("\t") for line in LIST_PATH.read_text(encoding="utf-8").splitlines()[1::LISTED_STEP]]
    said = {word: kanalizer_reading(kanalizer, word) or "" for word, _ in sample}
    return {"checked": len(sample), "differ": {w: [r, said[w]] for w, r in sample if said[w] != r}}


def compare(x86: Path, arm64: Path) -> int:
    failures = []
    a = (x86 / "frontend.jsonl").read_bytes()
    b = (arm64 / "frontend.jsonl").read_bytes()
    if a != b:
        for n, (la, lb) in enumerate(zip(a.splitlines(), b.splitlines()), 1):
            if la != lb:
                failures.append(f"frontend line {n} differs:\n  x86:   {la.decode()}\n  arm64: {lb.decode()}")
                break
        else:
            failures.append("frontend output differs in length")
    audio_a, audio_b = np.load(x86 / "audio.npz"), np.load(arm64 / "audio.npz")
    if sorted(audio_a.files) != sorted(audio_b.files):
        failures.append(f"audio arrays differ: {sorted(audio_a.files)} vs {sorted(audio_b.files)}")
    worst = 0.0
    for key in sorted(set(audio_a.files) & set(audio_b.files)):
        x, y = audio_a[key], audio_b[key]
        if x.shape != y.shape:
            failures.append(f"audio {key}: {x.size} samples on x86, {y.size} on arm64")
            continue
        difference = float(np.abs(x.astype(np.float64) - y).max()) if x.size else 0.0
        worst = max(worst, difference)
        if difference > MAX_DIFFERENCE:
            failures.append(f"audio {key}: differs by {difference:.2e} (limit {MAX_DIFFERENCE:.0e})")
    runs = [json.loads((d / "run.json").read_text()) for d in (x86, arm64)]
    for d, r in zip(("x86", "arm64"), runs):
        print(f"  {d}: {r['machine']}, Python {r['python']}, onnxruntime {r['onnxruntime']}, "
              f"numpy {r['numpy']}, prepared {', '.join(r['prepared']) or 'nothing'}, "
              f"decoder {r['decoder_form']} of {r.get('forms_timed', {})}, lanes {r.get('decoder_lanes', {})}, "
              f"BERT weights {'made unsigned' if r.get('bert_unsigned_int8') else 'as published'}")
    failures += _compare_int8(x86, arm64, runs)
    guesses = [r.get("kanalizer", {}) for r in runs]
    if "error" in guesses[1] or guesses[0] != guesses[1]:
        failures.append(f"kanalizer on arm64: {guesses[1].get('error') or guesses[1]} (x86: {guesses[0]})")
    else:
        print(f"  kanalizer {guesses[1].get('version')}: {guesses[1].get('readings')} on both")
    listed = guesses[1].get("listed", {})
    if "error" not in guesses[1] and (not listed.get("checked") or listed.get("differ")):
        failures.append(f"kanalizer on arm64 reads {len(listed.get('differ', {}))} of {listed.get('checked', 0)} "
                        f"words of the list made ahead otherwise (list, arm64): {listed.get('differ')}")
    elif listed:
        print(f"  the list made ahead: {listed['checked']} of its words read alike by kanalizer on arm64")
    lines = a.count(b"\n")
    print(f"  frontend: {lines} lines, {'byte-identical' if a == b else 'DIFFERENT'}")
    print(f"  audio: {len(audio_a.files)} arrays, largest difference {worst:.2e} (limit {MAX_DIFFERENCE:.0e})")
    for failure in failures:
        print(f"arm64-check: {failure}", file=sys.stderr)
    return 1 if failures else 0


def _compare_int8(x86: Path, arm64: Path, runs: list[dict]) -> list[str]:
    from hayakoe_pi.models.gate import snr_db  # the gate's own measure (arm64-check gives the repo's path)

    failures = []
    for d, r in zip(("x86", "arm64"), runs):
        record = r.get("int8") or {}
        print(f"  int8 on {d}: {'used' if r.get('int8_used') else 'NOT USED'}; gate: SNR worst "
              f"{record.get('snr_db', {}).get('worst')} dB, log-mel worst {record.get('mel_db', {}).get('worst')} dB")
        if not r.get("int8_used"):
            failures.append(f"the 8-bit decoder is not used on {d}: {record.get('reason', 'not made')}")
    a, b = np.load(x86 / "int8.npz"), np.load(arm64 / "int8.npz")
    worst = np.inf
    for key in sorted(set(a.files) | set(b.files)):
        if key not in a.files or key not in b.files or a[key].shape != b[key].shape:
            failures.append(f"int8 audio {key}: missing or of another length on one side")
            continue
        worst = min(worst, snr_db(a[key], b[key]))
    print(f"  int8 audio: {len(a.files)} arrays, x86 against arm64 worst {worst:.1f} dB SNR "
          f"(at least {INT8_MIN_SNR_DB:g})")
    if worst < INT8_MIN_SNR_DB:
        failures.append(f"int8 audio differs from x86's: {worst:.1f} dB SNR (limit {INT8_MIN_SNR_DB:g})")
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(prog="arm64_probe.py")
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--models", type=Path, default=REPO / "tests/fixtures/models/tiny")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--child-python")
    c = sub.add_parser("compare")
    c.add_argument("x86", type=Path)
    c.add_argument("arm64", type=Path)
    args = ap.parse_args()
    if args.command == "run":
        run(args.models, args.out, args.child_python)
        return 0
    return compare(args.x86, args.arm64)


if __name__ == "__main__":
    sys.exit(main())
