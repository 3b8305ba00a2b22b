"""The latents an 8-bit decoder is calibrated and checked with: the voice's own front on
fixed Japanese sentences, in a child process of its own (BERT and the voice loaded as
the daemon loads them; its memory goes back when it exits).

    python -m hayakoe_pi.synthesis.calibrate --models DIR --derived DIR --voice NAME

writes latents.npz into the voice's folder of derived files and prints its peak
memory as one line of JSON. Run by models/prepare.py before `make --int8`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ..durable import durable_replace
from ..models.errors import ModelError
from ..models.folders import model_folder
from ..models.prepare import synthesizer_path
from ..models.make import peak_mb
from ..models.quantize import LATENTS_NAME

# What the 8-bit decoder's activation ranges are measured on: announcements of the
# kind the appliance speaks, short and long, statements and questions.
CALIBRATION = (
    "玄関のドアが開きました。",
    "おはようございます。今日の東京の天気は晴れ、最高気温は十八度の予想です。",
    "洗濯機の運転が終わりました！早めに干してくださいね。",
    "リビングの室温が二十八度を超えました。エアコンをつけますか？",
    "午後三時から、駅前の会議室で打ち合わせがあります。",
    "お風呂が沸きました。",
    "ゴミの日です。燃えるゴミは朝八時までに出してください。",
    "電池の残りが少なくなっています。充電してください。",
)
# The gate's sentences: never calibrated on, so the gate sees what a new text gets.
HELD_OUT = (
    "冷蔵庫のドアが開いたままです。閉め忘れていませんか？",
    "まもなく、お子さんのお迎えの時間です。",
    "ただいま、雨が降り始めました。窓が開いている部屋があります。",
    "明日の朝七時に目覚ましをセットしました。おやすみなさい。",
)


def latents_path(models_dir: Path, derived: Path, voice: str) -> Path:
    return model_folder(synthesizer_path(models_dir, voice), derived) / LATENTS_NAME


def write_latents(models_dir: Path, derived: Path, voice: str) -> Path:
    """Each sentence's decoder inputs, calibration ones first, saved durably (a killed run
    leaves no file that a later one would trust)."""
    from .engine import Engine
    from ..models.store import ModelStore

    # the fronts alone: what makes the latents (a decoder would only cost memory here)
    engine = Engine(models_dir, voice=voice, store=ModelStore(models_dir, derived_dir=derived, decoder=None))
    arrays: dict[str, np.ndarray] = {}
    for group, sentences in (("calibration", CALIBRATION), ("held_out", HELD_OUT)):
        for i, text in enumerate(sentences):
            # with the voice's default noise, as the daemon speaks: calibrated without it, the
            # ranges were too narrow for speech with it (the tiny voice: 15 dB SNR, not 30)
            for j, feeds in enumerate(engine.decoder_feeds(text)):
                for name, value in feeds.items():
                    arrays[f"{group}/{i}.{j}/{name}"] = value
    target = latents_path(models_dir, derived, voice)
    tmp = target.with_name(target.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    durable_replace(tmp, target)
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hayakoe_pi.synthesis.calibrate")
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--derived", required=True, type=Path)
    ap.add_argument("--voice", required=True)
    args = ap.parse_args(argv)
    try:
        write_latents(args.models, args.derived, args.voice)
    except ModelError as e:
        print(f"hayakoe-pi: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"peak_mb": round(peak_mb(), 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
