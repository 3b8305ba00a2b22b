#!/usr/bin/env python3
"""Sanity-check a HayaKoe-layout models dir with onnxruntime only (no torch).

    python tools/check_models.py tests/fixtures/models/tiny [--ref /path/to/other/models]

For the BERT and every voice: the ONNX I/O contract (names, dtypes, ranks),
deterministic output with noise 0, finite non-silent audio within [-1, 1],
len(audio) == sum(durations) * hop_length, and agreement between
duration_predictor.onnx and the synthesizer's ``durations`` output.
With --ref, input/output names, dtypes and ranks are compared with the
corresponding models of another models dir (first voice of each).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

SYNTH_IN = {
    "x": ("tensor(int64)", 2), "x_lengths": ("tensor(int64)", 1), "sid": ("tensor(int64)", 1),
    "tone": ("tensor(int64)", 2), "language": ("tensor(int64)", 2),
    "bert": ("tensor(float)", 3), "style_vec": ("tensor(float)", 2),
    "noise_scale": ("tensor(float)", 1), "length_scale": ("tensor(float)", 1),
    "noise_scale_w": ("tensor(float)", 1), "sdp_ratio": ("tensor(float)", 1),
}
DP_IN = {k: v for k, v in SYNTH_IN.items() if k != "noise_scale"}
BERT_IN = {"input_ids": ("tensor(int64)", 2), "attention_mask": ("tensor(int64)", 2)}

failures: list[str] = []


def check(cond: bool, msg: str) -> None:
    print(("  ok   " if cond else "  FAIL ") + msg)
    if not cond:
        failures.append(msg)


def session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def signature(sess: ort.InferenceSession) -> tuple[dict, dict]:
    ins = {i.name: (i.type, len(i.shape)) for i in sess.get_inputs()}
    outs = {o.name: (o.type, len(o.shape)) for o in sess.get_outputs()}
    return ins, outs


def feeds(t: int, cfg: dict, styles: np.ndarray, rng: np.random.Generator, sid: int = 0,
          noise: float = 0.0, length_scale: float = 1.0, noise_w: float = 0.0,
          sdp_ratio: float = 0.2) -> dict:
    x = rng.integers(1, 112, size=(1, t)).astype(np.int64)
    x[0, ::2] = 0
    return {
        "x": x,
        "x_lengths": np.array([t], dtype=np.int64),
        "sid": np.array([sid], dtype=np.int64),
        "tone": rng.integers(6, 8, size=(1, t)).astype(np.int64),
        "language": np.ones((1, t), dtype=np.int64),
        "bert": (rng.standard_normal((1, 1024, t)) * 0.5).astype(np.float32),
        "style_vec": styles[:1].astype(np.float32),
        "noise_scale": np.array([noise], dtype=np.float32),
        "length_scale": np.array([length_scale], dtype=np.float32),
        "noise_scale_w": np.array([noise_w], dtype=np.float32),
        "sdp_ratio": np.array([sdp_ratio], dtype=np.float32),
    }


def check_bert(root: Path, ref: Path | None) -> None:
    path = root / "onnx" / "bert" / "q8" / "bert_q8.onnx"
    print(f"[bert] {path}")
    vocab = (root / "bert" / "tokenizer" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    check(vocab[:5] == ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"], "vocab specials at ids 0-4")
    check(len(set(vocab)) == len(vocab), f"vocab entries unique ({len(vocab)})")
    missing = [ch for ch in "▁、。「」ーあア々〆〇日本語ａ！αΩ!?" if ch not in vocab]
    check(not missing, f"vocab covers kana/kanji/punctuation/full-width/Greek (missing {missing})")
    sess = session(path)
    ins, outs = signature(sess)
    check(ins == BERT_IN, f"bert inputs {ins}")
    check(outs == {"hidden_states": ("tensor(float)", 3)}, f"bert outputs {outs}")
    ids = np.array([[1, 100, 200, 300, 2, 0], [1, 5000, 2, 0, 0, 0]], dtype=np.int64)
    mask = (np.arange(6)[None] < np.array([[5], [3]])).astype(np.int64)
    mask[0, 5] = 0
    h = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    check(h.shape == (2, 6, 1024) and h.dtype == np.float32, f"hidden_states shape {h.shape}")
    check(bool(np.isfinite(h).all()) and float(h.std()) > 1e-3, f"hidden_states finite, std {h.std():.3f}")
    quant = any(n.op_type in ("MatMulInteger", "DynamicQuantizeLinear") for n in _nodes(path))
    check(quant, "dynamically quantized (MatMulInteger present)")
    if ref is not None:
        r_ins, r_outs = signature(session(ref / "onnx" / "bert" / "q8" / "bert_q8.onnx"))
        check((r_ins, r_outs) == (ins, outs), "bert I/O identical to reference")


def _nodes(path: Path):
    try:
        import onnx
    except ImportError:  # onnx is optional here
        return []
    return onnx.load(str(path), load_external_data=False).graph.node


def check_voice(vdir: Path, ref_sig: tuple | None) -> None:
    print(f"[voice] {vdir.name}")
    cfg = json.loads((vdir / "config.json").read_text(encoding="utf-8"))
    styles = np.load(vdir / "style_vectors.npy")
    hop = cfg["data"]["hop_length"]
    check(cfg["version"].endswith("JP-Extra"), f"version {cfg['version']}")
    check(styles.dtype == np.float32 and styles.shape == (cfg["data"]["num_styles"], 256),
          f"style_vectors {styles.shape} {styles.dtype}")
    check(np.allclose(styles[0], styles[1:].mean(0), atol=1e-5), "style row 0 = mean of the others")
    check(list(cfg["data"]["style2id"]) == ["Neutral", "Happy", "Sad", "Angry", "Fear", "Surprise",
                                            "Disgust"], "seven styles")
    check(len(cfg["data"]["spk2id"]) == cfg["data"]["n_speakers"], f"spk2id {cfg['data']['spk2id']}")

    sess = session(vdir / "synthesizer.onnx")
    ins, outs = signature(sess)
    has_dur = "durations" in outs
    check(ins == SYNTH_IN, "synthesizer inputs")
    exp_out = {"audio": ("tensor(float)", 3)}
    if has_dur:
        exp_out["durations"] = ("tensor(float)", 2)
    check(outs == exp_out, f"synthesizer outputs {sorted(outs)}")
    if ref_sig is not None:
        r_ins, r_outs = ref_sig
        check(ins == r_ins, "synthesizer inputs identical to reference")
        check({k: v for k, v in outs.items() if k in r_outs} == {k: v for k, v in r_outs.items()
                                                                 if k in outs},
              "shared outputs identical to reference")

    rng = np.random.default_rng(0)
    dp_sess = session(vdir / "duration_predictor.onnx") if (vdir / "duration_predictor.onnx").exists() else None
    if dp_sess is not None:
        d_ins, d_outs = signature(dp_sess)
        check(d_ins == DP_IN and d_outs == {"durations": ("tensor(float)", 2)}, "duration_predictor I/O")

    for t in (41, 7, 120):
        for sid in range(cfg["data"]["n_speakers"]):
            f = feeds(t, cfg, styles, rng, sid=sid)
            a = sess.run(None, f)
            b = sess.run(None, f)
            audio = a[0]
            tag = f"T={t} sid={sid}"
            check(audio.shape[:2] == (1, 1) and audio.dtype == np.float32, f"{tag} audio shape {audio.shape}")
            check(all(np.array_equal(u, v) for u, v in zip(a, b)), f"{tag} deterministic at noise 0")
            check(bool(np.isfinite(audio).all()) and float(np.abs(audio).max()) <= 1.0,
                  f"{tag} audio finite, |max| {np.abs(audio).max():.3f}")
            check(float(audio.std()) > 0.01, f"{tag} audio not silent (std {audio.std():.3f})")
            frames = audio.shape[2] / hop
            check(audio.shape[2] % hop == 0 and 1.5 * t <= frames <= 5 * t,
                  f"{tag} {frames:.0f} frames = {frames / t:.2f}/symbol")
            if has_dur:
                d = a[1]
                check(d.shape == (1, t) and d.dtype == np.float32, f"{tag} durations shape {d.shape}")
                check(bool((d == np.ceil(d)).all() and (d >= 1).all()), f"{tag} durations integral >= 1")
                check(int(d.sum()) * hop == audio.shape[2], f"{tag} sum(durations)*{hop} == samples")
            if dp_sess is not None:
                dd = dp_sess.run(None, {k: v for k, v in f.items() if k in DP_IN})[0]
                check(dd.shape == (1, t), f"{tag} duration_predictor shape {dd.shape}")
                if has_dur:
                    check(np.array_equal(dd, a[1]), f"{tag} duration_predictor == synthesizer durations")

    # length_scale and noise behave
    f = feeds(41, cfg, styles, rng)
    n1 = sess.run(None, f)[0].shape[2]
    n2 = sess.run(None, dict(f, length_scale=np.array([2.0], np.float32)))[0].shape[2]
    check(1.6 * n1 <= n2 <= 2.4 * n1, f"length_scale 2 -> {n2 / n1:.2f}x samples")
    fn = dict(f, noise_scale=np.array([0.667], np.float32), noise_scale_w=np.array([0.8], np.float32),
              sdp_ratio=np.array([1.0], np.float32))
    r1, r2 = sess.run(None, fn)[0], sess.run(None, fn)[0]
    check(r1.shape != r2.shape or not np.array_equal(r1, r2), "noise > 0 is random")
    check(bool(np.isfinite(r1).all()), "noise > 0 output finite")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("--ref", type=Path, default=None)
    a = ap.parse_args()
    ref_sig = None
    if a.ref is not None:
        ref_voice = sorted((a.ref / "onnx" / "speakers").iterdir())[0]
        ref_sig = signature(session(ref_voice / "synthesizer.onnx"))
    check_bert(a.root, a.ref)
    for vdir in sorted((a.root / "onnx" / "speakers").iterdir()):
        check_voice(vdir, ref_sig)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
