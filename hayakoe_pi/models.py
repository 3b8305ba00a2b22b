"""Loading HayaKoe-layout model files into ONNX Runtime sessions.

Layout of a models directory (as published in lemondouble/hayakoe):
    onnx/bert/q8/bert_q8.onnx
    bert/tokenizer/vocab.txt
    onnx/speakers/<voice>/synthesizer.onnx, config.json, style_vectors.npy
                          [duration_predictor.onnx]
Every problem with these files is reported as one ModelError naming the file
and what is wrong with it.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .split import SplitModel, UnreadableModel, decoder_margin, split_synthesizer
from .text import FrontEnd, VocabError

BERT_PATH = Path("onnx/bert/q8/bert_q8.onnx")
VOCAB_PATH = Path("bert/tokenizer/vocab.txt")
SPEAKERS_DIR = Path("onnx/speakers")
SYNTH_INPUTS = (
    "x", "x_lengths", "sid", "tone", "language", "bert", "style_vec",
    "noise_scale", "length_scale", "noise_scale_w", "sdp_ratio",
)


class ModelError(Exception):
    """A model file is missing, unreadable or does not fit the others."""


def cpu_threads() -> int:
    """Threads for ONNX Runtime: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def open_session(path: Path, what: str) -> ort.InferenceSession:
    if not path.is_file():
        raise ModelError(f"{what} not found: {path}")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = cpu_threads()
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # errors only; ORT's warnings mean nothing to users
    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own exception types for bad files
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(
            f"{what} {path} cannot be loaded ({reason}); the file is probably truncated "
            "or corrupted: download it again"
        ) from None


def _input_dim(session: ort.InferenceSession, name: str, axis: int):
    for i in session.get_inputs():
        if i.name == name:
            return i.shape[axis]
    return None


class Bert:
    """The shared Japanese BERT: token ids → one 1024-d feature per token."""

    def __init__(self, models_dir: Path):
        self.path = models_dir / BERT_PATH
        self.session = open_session(self.path, "BERT model")
        names = [i.name for i in self.session.get_inputs()]
        if "input_ids" not in names:
            raise ModelError(f"BERT model {self.path} has no 'input_ids' input (inputs: {names})")
        self.input_names = names
        self.output_name = self.session.get_outputs()[0].name
        self.hidden_size = self.session.get_outputs()[0].shape[-1]

    def __call__(self, input_ids: list[int]) -> np.ndarray:
        ids = np.asarray([input_ids], dtype=np.int64)
        feeds = {"input_ids": ids}
        if "attention_mask" in self.input_names:
            feeds["attention_mask"] = np.ones_like(ids)
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        return self.session.run([self.output_name], feeds)[0][0]  # [tokens, hidden]


@dataclass
class Voice:
    name: str
    directory: Path
    config: dict
    sample_rate: int
    hop_length: int
    add_blank: bool
    speakers: dict[str, int]
    styles: dict[str, int]
    style_vectors: np.ndarray  # [num_styles, style_dim]; row 0 is the mean
    synth: ort.InferenceSession  # the whole synthesizer, or the part before the decoder
    synth_outputs: list[str]
    decoder: ort.InferenceSession | None = None  # HiFi-GAN alone, when the graph was split
    decoder_inputs: tuple[str, ...] = ()  # names of z (and g) in synth's outputs
    decoder_margin: int = 0  # latent frames of overlap that make windowed decoding exact
    duration_predictor: ort.InferenceSession | None = None
    files: list[Path] = field(default_factory=list)

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


def _read_config(path: Path) -> dict:
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


def load_voice(models_dir: Path, name: str, bert_hidden: int | None = None,
               split_decoder: bool = True, split_cache: Path | None = None) -> Voice:
    if not name or name.startswith(".") or any(c in name for c in "/\\\0"):
        raise ModelError(f"invalid voice name {name!r}: a voice is a folder name under {SPEAKERS_DIR}")
    directory = models_dir / SPEAKERS_DIR / name
    if not directory.is_dir():
        installed = installed_voices(models_dir)
        raise ModelError(
            f"voice {name!r} not found in {models_dir / SPEAKERS_DIR}; "
            f"installed voices: {', '.join(installed) or 'none'}"
        )
    config_path = directory / "config.json"
    config = _read_config(config_path)
    data = config["data"]
    styles = dict(data["style2id"])
    num_styles = data.get("num_styles", len(styles))
    if num_styles != len(styles):
        raise ModelError(
            f"voice config {config_path}: num_styles is {num_styles} but style2id lists {len(styles)} styles"
        )

    vectors_path = directory / "style_vectors.npy"
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

    synth_path = directory / "synthesizer.onnx"
    parts = _split(synth_path, split_cache) if split_decoder else None
    synth = open_session(parts.front if parts else synth_path, "synthesizer")
    inputs = [i.name for i in synth.get_inputs()]
    missing = [n for n in SYNTH_INPUTS if n not in inputs]
    if missing:
        raise ModelError(
            f"synthesizer {synth_path} lacks the inputs {', '.join(missing)}; "
            "it is not a Style-Bert-VITS2 JP-Extra export"
        )
    style_dim = _input_dim(synth, "style_vec", 1)
    if isinstance(style_dim, int) and style_dim != vectors.shape[1]:
        raise ModelError(
            f"style vectors {vectors_path} are {vectors.shape[1]}-dimensional but "
            f"{synth_path} expects {style_dim}"
        )
    bert_dim = _input_dim(synth, "bert", 1)
    if bert_hidden is not None and isinstance(bert_dim, int) and isinstance(bert_hidden, int) \
            and bert_dim != bert_hidden:
        raise ModelError(
            f"synthesizer {synth_path} expects {bert_dim}-d BERT features, the BERT model gives {bert_hidden}"
        )
    outputs = [o.name for o in synth.get_outputs()]
    decoder, decoder_inputs, margin = None, (), 0
    if parts:
        decoder = open_session(parts.decoder, "synthesizer decoder")
        decoder_inputs = (parts.z_name, parts.g_name) if parts.g_name else (parts.z_name,)
        margin = decoder_margin(config.get("model", {}))
        outputs = [o for o in outputs if o not in decoder_inputs]

    files = [config_path, vectors_path, synth_path]
    dp_path = directory / "duration_predictor.onnx"
    dp = None
    if dp_path.exists():
        dp = open_session(dp_path, "duration predictor")
        files.append(dp_path)

    speakers = data.get("spk2id") or {name: 0}
    return Voice(
        name=name, directory=directory, config=config,
        sample_rate=data["sampling_rate"], hop_length=data["hop_length"],
        add_blank=bool(data.get("add_blank", True)), speakers=dict(speakers), styles=styles,
        style_vectors=vectors.astype(np.float32), synth=synth, synth_outputs=outputs,
        decoder=decoder, decoder_inputs=decoder_inputs, decoder_margin=margin,
        duration_predictor=dp, files=files,
    )


def _split(synth_path: Path, cache_root: Path | None) -> SplitModel | None:
    if not synth_path.is_file():
        raise ModelError(f"synthesizer not found: {synth_path}")
    try:
        return split_synthesizer(synth_path, cache_root)
    except UnreadableModel as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else "unreadable"
        raise ModelError(
            f"synthesizer {synth_path} cannot be loaded ({reason}); the file is probably truncated "
            "or corrupted: download it again"
        ) from None


def installed_voices(models_dir: Path) -> list[str]:
    root = Path(models_dir) / SPEAKERS_DIR
    if not root.is_dir():
        return []
    return sorted(d.name for d in root.iterdir() if (d / "synthesizer.onnx").is_file())


class ModelStore:
    """BERT, its tokenizer and the voices of one models directory.

    Voices are loaded on first use and share the one BERT session; only the
    `max_voices` most recently used stay loaded, so switching voices all day
    does not grow memory.
    """

    def __init__(self, models_dir: str | Path, max_voices: int = 2, split_decoder: bool = True,
                 split_cache: str | Path | None = None):
        self.dir = Path(models_dir).expanduser()
        if not self.dir.is_dir():
            raise ModelError(f"models directory not found: {self.dir}")
        vocab = self.dir / VOCAB_PATH
        if not vocab.is_file():
            raise ModelError(f"BERT tokenizer vocabulary not found: {vocab}")
        try:
            self.frontend = FrontEnd(vocab)
        except VocabError as e:
            raise ModelError(str(e)) from None
        self.bert = Bert(self.dir)
        self.split_decoder = split_decoder
        self.split_cache = Path(split_cache) if split_cache else None  # default: ~/.cache
        self.max_voices = max(1, max_voices)
        self._voices: dict[str, Voice] = {}  # in order of use, most recent last
        self._lock = threading.Lock()

    def voices(self) -> list[str]:
        return installed_voices(self.dir)

    def voice(self, name: str) -> Voice:
        with self._lock:
            voice = self._voices.pop(name, None)
            if voice is None:
                voice = load_voice(self.dir, name, self.bert.hidden_size, self.split_decoder,
                                   self.split_cache)
            self._voices[name] = voice
            while len(self._voices) > self.max_voices:
                self._voices.pop(next(iter(self._voices)))
            return voice
