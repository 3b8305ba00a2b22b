#!/usr/bin/env python3
"""A voice's 8-bit decoder with its last stages kept FP32, laid out where bench/counted.py
reads a prepared 8-bit decoder, so that the Pi's CPUs can be counted with the stages the
trained decoders needed FP32 (issue 55) on a random-weight full-size voice, whose own gate
would keep none (random weights have no quiet bands for the hiss to show in).

    python bench/int8_stages.py --models /work/bench-models/full --voice full-voice --fp32-stages 1 --cache DIR

then `python bench/run.py counted --cache DIR --parts int8 ...`. The ranges come from random
latents: they change the 8-bit values, not the instructions a window executes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from hayakoe_pi.models import precision, quantize  # noqa: E402
from hayakoe_pi.models.folders import model_folder  # noqa: E402
from hayakoe_pi.models.graphs import input_channels  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--voice", required=True)
    ap.add_argument("--fp32-stages", type=int, required=True, help="how many stages from the output end stay FP32")
    ap.add_argument("--cache", type=Path, required=True)
    a = ap.parse_args()
    import onnx

    from hayakoe_pi.models.sessions import prepare_options
    from hayakoe_pi.models.split import split_synthesizer

    synth = a.models / "onnx" / "speakers" / a.voice / "synthesizer.onnx"
    parts = split_synthesizer(synth, a.cache / "split", prepare_options)
    decoder = parts.decoders["1d"]
    graph = onnx.load(str(decoder), load_external_data=False)
    rng = np.random.default_rng(0)
    feeds = {parts.z_name: rng.standard_normal((1, input_channels(graph.graph, parts.z_name), 24), dtype=np.float32)}
    if parts.g_name:
        feeds[parts.g_name] = rng.standard_normal((1, input_channels(graph.graph, parts.g_name), 1), dtype=np.float32)
    stages, ends = precision.conv_stages(graph), quantize.kept_in_fp32(decoder)
    kept = precision.fp32_choices(stages, ends)[a.fp32_stages]
    target = model_folder(synth, a.cache / "models") / quantize.INT8_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    quantize.quantize_decoder(decoder, target, [feeds] * 4, exclude=precision.excluded(kept, ends))
    print(f"{target}: {precision.describe(kept)}")


if __name__ == "__main__":
    main()
