"""Finding, checking and loading a voice: its config, style vectors and synthesizer,
with what prepare made from it (the decoder apart, in the form tuned for this CPU or
in 8 bits where engine.decoder asks and the gate let it, on decoder lanes where they
are faster) when there is a derived folder."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .. import layout
from .errors import ModelError
from .lanes import DecoderLanes, lane_threads
from .quantize import INT8_NAME, read_int8
from .sessions import open_session, shared_session_weights
from .split import cached_split, decoder_margin
from .tune import read_tuning
from .whole import require_prepared

log = logging.getLogger("hayakoe_pi.voices")

SPEAKERS_DIR = Path(layout.SPEAKERS_DIR)
SYNTH_INPUTS = (
    "x", "x_lengths", "sid", "tone", "language", "bert", "style_vec",
    "noise_scale", "length_scale", "noise_scale_w", "sdp_ratio",
)


@dataclass
class Voice:
    name: str
    sample_rate: int
    hop_length: int
    speakers: dict[str, int]
    styles: dict[str, int]
    style_vectors: np.ndarray  # [num_styles, style_dim]; row 0 is the mean
    synth: ort.InferenceSession  # the whole synthesizer, or the part before the decoder
    synth_outputs: list[str]
    decoder: ort.InferenceSession | None = None  # HiFi-GAN alone, when the graph was split
    # sessions of the same decoder on a share of the cores each, when two windows
    # decoded at once are done sooner than one after the other on this CPU (tune.py)
    decoder_lanes: DecoderLanes | None = None
    decoder_inputs: tuple[str, ...] = ()  # names of z (and g) in synth's outputs
    decoder_margin: int = 0  # latent frames of overlap that make windowed decoding exact
    files: list[Path] = field(default_factory=list)
    tuning: dict | None = None  # the decoder form chosen on this CPU, and its timings
    decoder_kind: str = "fp32"  # or "int8": the 8-bit decoder in use
    int8: dict | None = None  # the 8-bit decoder's record, where engine.decoder asked for one

    @property
    def tuned_speed(self) -> tuple[float, int] | None:
        """(seconds, latent frames) of the decoder's full window as prepare timed it on this CPU."""
        if self.decoder_kind == "int8":
            return self.int8["seconds"]["int8"], self.int8["frames"]
        t = self.tuning
        return (t["seconds"][t["form"]][-1], t["frames"][-1]) if t else None

    @property
    def has_durations(self) -> bool:
        return "durations" in self.synth_outputs

    def style_vector(self, style: str, weight: float) -> np.ndarray:
        if style not in self.styles:
            raise ValueError(
                f"voice {self.name!r} has no style {style!r}; styles: {', '.join(self.styles)}"
            )
        mean = self.style_vectors[0]
        return (mean + (self.style_vectors[self.styles[style]] - mean) * weight).astype(np.float32)

    def speaker_id(self, speaker: str | int | None) -> int:
        if speaker is None:
            return 0
        if isinstance(speaker, str):
            if speaker not in self.speakers:
                raise ValueError(
                    f"voice {self.name!r} has no speaker {speaker!r}; speakers: {', '.join(self.speakers)}"
                )
            return self.speakers[speaker]
        if not 0 <= speaker < max(1, len(self.speakers)):
            raise ValueError(
                f"speaker id {speaker} out of range for voice {self.name!r} "
                f"(0..{max(1, len(self.speakers)) - 1})"
            )
        return speaker


def read_config(path: Path) -> dict:
    if not path.is_file():
        raise ModelError(f"voice config not found: {path}")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"voice config {path} is not valid JSON ({e})") from None
    version = str(config.get("version", ""))
    if not version.endswith("JP-Extra"):
        raise ModelError(
            f"voice config {path}: version {version!r} is not a JP-Extra model "
            "(only Style-Bert-VITS2 JP-Extra voices are supported)"
        )
    data = config.get("data")
    if not isinstance(data, dict):
        raise ModelError(f"voice config {path} has no 'data' section")
    for key, kind in (("sampling_rate", int), ("hop_length", int), ("style2id", dict)):
        if not isinstance(data.get(key), kind):
            raise ModelError(f"voice config {path}: data.{key} is missing or not a {kind.__name__}")
    return config


def installed_voices(models_dir: Path) -> list[str]:
    root = Path(models_dir) / SPEAKERS_DIR
    if not root.is_dir():
        return []
    return sorted(d.name for d in root.iterdir() if (d / "synthesizer.onnx").is_file())


def _voice_directory(models_dir: Path, name: str) -> Path:
    if not name or name.startswith(".") or any(c in name for c in "/\\\0"):
        raise ModelError(f"invalid voice name {name!r}: a voice is a folder name under {SPEAKERS_DIR}")
    directory = models_dir / SPEAKERS_DIR / name
    if not directory.is_dir():
        installed = installed_voices(models_dir)
        raise ModelError(
            f"voice {name!r} not found in {models_dir / SPEAKERS_DIR}; "
            f"installed voices: {', '.join(installed) or 'none'}"
        )
    return directory


def _style_vectors(vectors_path: Path, config_path: Path, styles: dict, num_styles: int) -> np.ndarray:
    """The voice's style vectors, checked against its config.json."""
    if num_styles != len(styles):
        raise ModelError(
            f"voice config {config_path}: num_styles is {num_styles} but style2id lists {len(styles)} styles"
        )
    if not vectors_path.is_file():
        raise ModelError(f"style vectors not found: {vectors_path}")
    try:
        vectors = np.load(vectors_path, allow_pickle=False)
    except Exception as e:
        raise ModelError(f"style vectors {vectors_path} cannot be read ({e})") from None
    if vectors.ndim != 2 or vectors.shape[0] != num_styles:
        raise ModelError(
            f"style vectors {vectors_path} have shape {vectors.shape}, "
            f"expected [{num_styles}, 256] for the {num_styles} styles in config.json"
        )
    if not np.all(np.isfinite(vectors)):
        raise ModelError(f"style vectors {vectors_path} contain NaN or infinite values")
    bad_ids = [s for s, i in styles.items() if not (isinstance(i, int) and 0 <= i < num_styles)]
    if bad_ids:
        raise ModelError(f"voice config {config_path}: style ids out of range for {', '.join(bad_ids)}")
    return vectors.astype(np.float32)


def _input_dim(session: ort.InferenceSession, name: str, axis: int):
    for i in session.get_inputs():
        if i.name == name:
            return i.shape[axis]
    return None


def _check_synthesizer(synth: ort.InferenceSession, synth_path: Path, vectors_path: Path, style_dim: int,
                       bert_hidden: int | None) -> None:
    """The synthesizer takes JP-Extra's inputs, of the style vectors' and BERT's sizes."""
    inputs = [i.name for i in synth.get_inputs()]
    missing = [n for n in SYNTH_INPUTS if n not in inputs]
    if missing:
        raise ModelError(
            f"synthesizer {synth_path} lacks the inputs {', '.join(missing)}; "
            "it is not a Style-Bert-VITS2 JP-Extra export"
        )
    expected_style = _input_dim(synth, "style_vec", 1)
    if isinstance(expected_style, int) and expected_style != style_dim:
        raise ModelError(
            f"style vectors {vectors_path} are {style_dim}-dimensional but {synth_path} expects {expected_style}"
        )
    bert_dim = _input_dim(synth, "bert", 1)
    if bert_hidden is not None and isinstance(bert_dim, int) and isinstance(bert_hidden, int) \
            and bert_dim != bert_hidden:
        raise ModelError(
            f"synthesizer {synth_path} expects {bert_dim}-d BERT features, the BERT model gives {bert_hidden}"
        )


def load_voice(models_dir: Path, name: str, bert_hidden: int | None = None,
               derived_dir: Path | None = None, decoder: str | None = "fp32") -> Voice:
    """One voice's sessions. With `derived_dir`, from what prepare made there: the
    decoder apart (run in windows) in the form tuned for this CPU, optimized copies;
    with `decoder` int8 or auto, the 8-bit decoder where its record says so; None: no
    decoder session, the front alone (calibrate.py)."""
    directory = _voice_directory(models_dir, name)
    config_path = directory / "config.json"
    config = read_config(config_path)
    data = config["data"]
    styles = dict(data["style2id"])
    vectors_path = directory / "style_vectors.npy"
    vectors = _style_vectors(vectors_path, config_path, styles, data.get("num_styles", len(styles)))

    synth_path = directory / "synthesizer.onnx"
    parts = cached_split(synth_path, derived_dir) if derived_dir and synth_path.is_file() else None
    whole = None if parts else require_prepared(synth_path, derived_dir, "synthesizer")
    synth = open_session(synth_path, "synthesizer", parts.front if parts else whole)
    _check_synthesizer(synth, synth_path, vectors_path, vectors.shape[1], bert_hidden)
    outputs = [o.name for o in synth.get_outputs()]
    decoder_session, lanes, decoder_inputs, margin, tuning, int8 = None, None, (), 0, None, None
    kind = "fp32"
    if parts:
        tuning = read_tuning(parts.folder)
        form = tuning["form"] if tuning and tuning.get("form") in parts.decoders else "1d"
        graph, count = parts.decoders[form], tuning.get("lanes", 1) if tuning else 1
        int8 = read_int8(parts.folder) if decoder in ("int8", "auto") else None
        if int8 and int8["use"]:
            graph, count, kind = parts.folder / INT8_NAME, int8["lanes"], "int8"
        count = count if decoder else 0
        weights = shared_session_weights(graph) if count > 1 else None
        if count:
            decoder_session = open_session(synth_path, "synthesizer decoder", graph, weights=weights)
        if count > 1:
            lanes = DecoderLanes([open_session(synth_path, "synthesizer decoder", graph,
                                               threads=lane_threads(count), weights=weights)
                                  for _ in range(count)], weights)
        decoder_inputs = (parts.z_name, parts.g_name) if parts.g_name else (parts.z_name,)
        margin = decoder_margin(config.get("model", {}))
        outputs = [o for o in outputs if o not in decoder_inputs]
    if decoder == "int8" and kind != "int8":  # auto decides silently
        why = int8["reason"] if int8 else "this voice has no 8-bit decoder (not prepared, or kept whole)"
        log.warning("engine.decoder is int8, but voice %s keeps its FP32 decoder: %s", name, why)

    # duration_predictor.onnx, when present, is not loaded: the synthesizer's own
    # timing and our pause table do its job here, and it would cost memory.
    return Voice(
        name=name, sample_rate=data["sampling_rate"], hop_length=data["hop_length"],
        speakers=dict(data.get("spk2id") or {name: 0}), styles=styles, style_vectors=vectors,
        synth=synth, synth_outputs=outputs, decoder=decoder_session, decoder_lanes=lanes, decoder_inputs=decoder_inputs,
        decoder_margin=margin, files=[config_path, vectors_path, synth_path], tuning=tuning,
        decoder_kind=kind, int8=int8,
    )
