"""prepare's 8-bit route on any decoder graph: its precision chosen per stage, judged and
timed as prepare judges a voice's, so that anyone can try it on a decoder of their own and
listen to what it made.

    tools/int8-check --decoder D.onnx --latents L.npz --out DIR [--sample-rate 22050]

D.onnx: a decoder whose inputs are named in the latents file (a latent or a mel, and a
speaker embedding where it has one) and whose first output is the audio. L.npz: the
project's latents format (docs/int8-check.md): np.savez arrays named
`calibration/<sentence>.<piece>/<input>` and `held_out/<sentence>.<piece>/<input>`, each
the decoder's input as fed (batch 1, time frames on the last axis). Prints one line of
JSON: use, the worst SNR and log-mel, the speedup, the stages kept FP32 and the reason;
writes the 8-bit decoder it made to DIR/decoder-int8.onnx, used or not.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hayakoe_pi.models.quantize import INT8_NAME, choose_int8, read_latents  # noqa: E402
from hayakoe_pi.models.tune import TUNE_FRAMES  # noqa: E402


def time_input(latents: dict) -> str:
    """The input that grows with the text: the longest last axis (a speaker embedding has one frame)."""
    feeds = latents["calibration"][0]
    return max(feeds, key=lambda name: feeds[name].shape[-1])


def copy_decoder(decoder: Path, folder: Path) -> Path:
    """The decoder in DIR with its weights beside it: the optimized copies prepare's sessions
    make go there, not beside the user's file."""
    import onnx

    target = folder / "decoder.onnx"
    model = onnx.load(str(decoder))
    (folder / "decoder.onnx.data").unlink(missing_ok=True)
    onnx.save_model(model, str(target), save_as_external_data=True, location="decoder.onnx.data")
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/int8-check", description=__doc__.splitlines()[0])
    ap.add_argument("--decoder", required=True, type=Path)
    ap.add_argument("--latents", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--sample-rate", type=int, default=44100, help="of the decoder's audio (default 44100)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    latents = read_latents(args.latents)
    work = args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    decoder = copy_decoder(args.decoder, work)
    record = choose_int8(decoder, decoder, work / INT8_NAME, latents, time_input(latents), args.sample_rate,
                         TUNE_FRAMES[-1], keep=True)
    made = work / INT8_NAME
    if made.is_file():
        shutil.copyfile(made, args.out / INT8_NAME)  # the QDQ graph holds its weights itself
    shutil.rmtree(work)
    print(json.dumps({"use": record["use"], "snr_db": record.get("snr_db", {}).get("worst"),
                      "mel_db": record.get("mel_db", {}).get("worst"), "speedup": record.get("speedup"),
                      "fp32_stages": record["fp32_stages"], "reason": record["reason"],
                      "tried": record["tried"], "stages": record["stages"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
