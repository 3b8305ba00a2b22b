"""Loading HayaKoe-layout model files into ONNX Runtime sessions.

A models directory has the layout published in lemondouble/hayakoe (layout.py).
Every problem with these files is reported as one ModelError naming the file
and what is wrong with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import onnxruntime as ort

from . import layout
from .split import cached_split, decoder_margin
from .weights import durable_replace, prepared_whole, read_stamp, shared_weights
from .text import FrontEnd, VocabError

BERT_PATH = Path(layout.BERT_PATH)
VOCAB_PATH = Path(layout.VOCAB_PATH)
SPEAKERS_DIR = Path(layout.SPEAKERS_DIR)
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


COMPUTE_NICE = 5  # how much lower than the rest of the daemon synthesis runs


def lower_compute_priority() -> None:
    """Run the calling thread (and the threads it starts) below the rest of the process.

    On a CPU slower than real time the compute threads take every cycle they
    get; at the same priority the thread that feeds the sound card waits
    behind them and the card runs dry in the middle of a sentence, audio
    ready or not (measured on 2 cores held to 0.05 CPU: 5.5 s of holes in a
    12 s text at the same priority, 0.4 s at +5). Nice is per thread on
    Linux; a higher value needs no privilege.
    """
    try:
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < base + COMPUTE_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, base + COMPUTE_NICE))
    except (AttributeError, OSError):  # not Linux, or not allowed: priorities stay equal
        pass


_arena: bool | None = None  # one memory arena shared by all sessions
ARENA_FIRST_REGION = 256 << 20


def _shared_arena() -> bool:
    """One memory arena for all sessions (BERT, synthesizer, decoder), registered
    before ONNX Runtime's environment makes sessions: each session with an arena
    of its own keeps its own peak; one arena is reused by them in turn
    (measured: 40 MB less at the peak on a 38 s text)."""
    global _arena
    if _arena is None:
        # an offline appliance: onnxruntime sends no usage events from here
        if hasattr(ort, "disable_telemetry_events"):
            ort.disable_telemetry_events()
        try:
            cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            # 0: no limit; 0: grow by powers of two (growing by what is asked
            # fragments: measured 37-164 MB more); a first region of 256 MB (address
            # space only, until used), so the tensors of two decoder lanes at once
            # are not spread over regions of growing size (measured: 20 MB less
            # resident on a 38 s text); -1: the default for the rest
            ort.create_and_register_allocator(cpu, ort.OrtArenaCfg(0, 0, ARENA_FIRST_REGION, -1))
            _arena = True
        except Exception:  # registered already, or not in this ONNX Runtime
            _arena = False
    return _arena


def _session_options(level: ort.GraphOptimizationLevel, prepack: bool = True,
                     threads: int | None = None) -> ort.SessionOptions:
    """Options for a session computing on `threads` threads (default: every core).

    Each session has its threads, which sleep as soon as a run is over: a
    thread left spinning after its run takes the cores from the next session
    (measured: short texts 10 % slower on 2 cores), and ONNX Runtime's one
    process-wide pool instead cannot give two decoder lanes a thread each.
    """
    opts = ort.SessionOptions()
    if _shared_arena():
        opts.add_session_config_entry("session.use_env_allocators", "1")
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.graph_optimization_level = level
    # Shapes change with every sentence and window: a memory plan made for one
    # only holds on to its peak (measured: 100 MB less on the decoder without).
    opts.enable_mem_pattern = False
    opts.intra_op_num_threads = threads or cpu_threads()
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.log_severity_level = 3  # errors only; ORT's warnings mean nothing to users
    return opts


def _new_session(path: Path, opts: ort.SessionOptions) -> ort.InferenceSession:
    """A session made from a thread of lowered priority: the threads it starts inherit it."""
    made: list = []

    def make():
        lower_compute_priority()
        try:
            made.append(ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]))
        except Exception as e:  # raised in the caller's thread
            made.append(e)

    t = threading.Thread(target=make, name="make session")
    t.start()
    t.join()
    if isinstance(made[0], Exception):
        raise made[0]
    return made[0]


def _cpu_signature() -> str:
    """The CPU's instruction sets: the optimized graph's layouts (NCHWc blocks) depend on them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpu_key() -> str:
    """This CPU and ONNX Runtime: optimized graphs hold layouts (NCHWc blocks) and the
    decoder timings hold only for them, so a new CPU or ONNX Runtime makes new ones."""
    return hashlib.sha256(
        f"{ort.__version__}|{platform.machine()}|{_cpu_signature()}".encode()).hexdigest()[:12]


def signed_int8_products_exact() -> bool:
    """Whether ONNX Runtime multiplies uint8 by int8 exactly on this CPU.

    x86 without VNNI adds pairs of such products in 16 bits, saturating
    (255 × -128 twice is -65,280): the Q8 BERT is then made unsigned
    (weights.unsigned_integer_weights). Tried, not inferred from CPU flags,
    with the options of the BERT session.
    """
    from onnx import TensorProto, helper, numpy_helper

    depth = 64
    a = np.full((4, depth), 255, dtype=np.uint8)
    b = np.full((depth, 16), -128, dtype=np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape)],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)], [numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(),
                                   _session_options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, prepack=False),
                                   providers=["CPUExecutionProvider"])
    return bool((session.run(None, {"a": a})[0] == 255 * -128 * depth).all())


def optimized_path(graph: Path) -> Path:
    """Where the optimized copy of a prepared graph is kept: beside it, one per CPU key."""
    return graph.with_name(f"{graph.stem}.{cpu_key()}.onnx")


def optimize(graph: Path) -> Path:
    """Save `graph` after ONNX Runtime's graph optimizations (once; see optimized_path).

    Optimizing at every load builds the optimized weights beside the original
    ones (the Q8 BERT takes 1.1 GB that way). The saved result keeps its
    weights in a separate file that ONNX Runtime memory-maps: no copy is made
    while loading, and the kernel may drop those pages under pressure. The
    numbers are the same. The graph is renamed into place last, after its
    weights are on disk: an interrupted copy is never trusted, only redone.
    """
    target = optimized_path(graph)
    if not target.is_file():
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        weights = target.name + ".weights"
        # prepacked weights are not saved: making them here would only raise the peak
        opts = _session_options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, prepack=False)
        opts.optimized_model_filepath = str(tmp)
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", weights)
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
        with open(target.parent / weights, "rb") as f:
            os.fsync(f.fileno())
        durable_replace(tmp, target)  # the graph names its weights file, written beside it
    return target


def open_session(path: Path, what: str, prepared: Path | None = None, prepack: bool = True,
                 threads: int | None = None, weights: list | None = None) -> ort.InferenceSession:
    """A CPU session for the model file `path`; with `prepared` (its graph made by
    prepare), from that graph's optimized copy; on `threads` threads (default: every
    core); with `weights` (shared_session_weights), reading those instead of its own map.

    prepack=False keeps ONNX Runtime from making a second, repacked copy of the
    weights: for the Q8 BERT that saves 140 MB for 10 % more BERT time (BERT is
    a few per cent of the whole).
    """
    if not path.is_file():
        raise ModelError(f"{what} not found: {path}")
    try:
        if prepared is not None:
            opts = _session_options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, prepack, threads)
            for name, value in weights or ():
                opts.add_initializer(name, value)
            return _new_session(optimize(prepared), opts)
        return _new_session(path, _session_options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, prepack, threads))
    except Exception as e:  # ORT raises its own exception types for bad files
        raise unreadable(what, path, e) from None


def shared_session_weights(graph: Path) -> list[tuple[str, ort.OrtValue]]:
    """The weights of a prepared graph's optimized copy, for several sessions of it to
    share: each session mapping the file itself counts its pages once more in the
    process's memory (measured: 46 MB a decoder session with the full-size voice)."""
    return [(name, ort.OrtValue.ortvalue_from_numpy(array))
            for name, array in shared_weights(optimize(graph)).items()]


def prepare_options() -> ort.SessionOptions:
    """Options for the sessions that prepare a model (fold its constants, check its decoder):
    no optimization, which would fold every constant of the whole model in memory."""
    return _session_options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, prepack=False)


def unreadable(what: str, path: Path, e: Exception) -> ModelError:
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ModelError(f"{what} {path} cannot be loaded ({reason}); the file is probably truncated "
                      "or corrupted: download it again")


def _input_dim(session: ort.InferenceSession, name: str, axis: int):
    for i in session.get_inputs():
        if i.name == name:
            return i.shape[axis]
    return None


class Bert:
    """The shared Japanese BERT: token ids → one 1024-d feature per token."""

    def __init__(self, models_dir: Path, derived_dir: Path | None = None):
        self.path = models_dir / BERT_PATH
        prepared = _prepared(prepared_whole, self.path, derived_dir, "BERT model")
        self.session = open_session(self.path, "BERT model", prepared, prepack=False)
        # whether prepare made its 8-bit weights unsigned for this CPU (`hayakoe-pi check` says)
        self.unsigned_int8 = bool(prepared and read_stamp(prepared.parent, self.path).get("unsigned_int8"))
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


T = TypeVar("T")


class DecoderLanes:
    """Decoder runs, several at once: each lane is a thread with a session of its own
    (on its share of the cores). Runs are taken in the order given."""

    def __init__(self, sessions: list[ort.InferenceSession], weights: list | None = None):
        self._weights = weights  # what the sessions read: kept for as long as they live
        self._sessions: queue.SimpleQueue = queue.SimpleQueue()
        for session in sessions:
            self._sessions.put(session)
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(len(sessions), thread_name_prefix="decoder lane",
                                        initializer=self._start_lane)
        self.count = len(sessions)

    def _start_lane(self) -> None:
        lower_compute_priority()  # like every synthesis thread: the player goes first
        self._local.session = self._sessions.get()

    def submit(self, job: Callable[[ort.InferenceSession], T]) -> Future[T]:
        """Run job(session) on the next free lane."""
        return self._pool.submit(lambda: job(self._local.session))


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
    # decoded at once are done sooner than one after the other on this CPU (prepare.tune)
    decoder_lanes: DecoderLanes | None = None
    decoder_inputs: tuple[str, ...] = ()  # names of z (and g) in synth's outputs
    decoder_margin: int = 0  # latent frames of overlap that make windowed decoding exact
    files: list[Path] = field(default_factory=list)
    tuning: dict | None = None  # the decoder form chosen on this CPU, and its timings

    @property
    def tuned_speed(self) -> tuple[float, int] | None:
        """(seconds, latent frames) of the decoder's full window as prepare timed it on this CPU."""
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


def _prepared(lookup, path: Path, derived_dir: Path | None, what: str):
    """What prepare made from `path` under `derived_dir` (None: use the file as it is)."""
    if derived_dir is None or not path.is_file():
        return None  # open_session says what is missing
    found = lookup(path, derived_dir)
    if found is None:
        raise ModelError(f"{what} {path} is not prepared yet: run `hayakoe-pi prepare`")
    return found


def tuning_path(folder: Path) -> Path:
    """The decoder timings prepare measured on this CPU (see prepare.tune)."""
    return folder / f"tuning.{cpu_key()}.json"


TUNING_VERSION = 2  # 2: decoder lanes timed too; an older record is timed again


def read_tuning(folder: Path) -> dict | None:
    try:
        tuning = json.loads(tuning_path(folder).read_text())
    except (OSError, ValueError):
        return None
    return tuning if isinstance(tuning, dict) and tuning.get("version") == TUNING_VERSION else None


# Latent frames of a decoder window on a lane (the engine's full window is 256):
# two in flight at once need ONNX Runtime's arena to hold both, and two of 256
# frames took it 36 MB further than two of 224 (full-size voice), for 1.5 % more
# overlap decoded.
LANE_WINDOW_FRAMES = 224


def lane_threads(lanes: int) -> int:
    """Threads of each decoder lane: the cores shared out."""
    return max(1, cpu_threads() // lanes)


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
               derived_dir: Path | None = None) -> Voice:
    """One voice's sessions. With `derived_dir`, from what prepare made there: the
    decoder apart (run in windows) in the form tuned for this CPU, optimized copies."""
    directory = _voice_directory(models_dir, name)
    config_path = directory / "config.json"
    config = read_config(config_path)
    data = config["data"]
    styles = dict(data["style2id"])
    vectors_path = directory / "style_vectors.npy"
    vectors = _style_vectors(vectors_path, config_path, styles, data.get("num_styles", len(styles)))

    synth_path = directory / "synthesizer.onnx"
    parts = cached_split(synth_path, derived_dir) if derived_dir and synth_path.is_file() else None
    whole = None if parts else _prepared(prepared_whole, synth_path, derived_dir, "synthesizer")
    synth = open_session(synth_path, "synthesizer", parts.front if parts else whole)
    _check_synthesizer(synth, synth_path, vectors_path, vectors.shape[1], bert_hidden)
    outputs = [o.name for o in synth.get_outputs()]
    decoder, lanes, decoder_inputs, margin, tuning = None, None, (), 0, None
    if parts:
        tuning = read_tuning(parts.folder)
        form = tuning["form"] if tuning and tuning.get("form") in parts.decoders else "1d"
        count = tuning.get("lanes", 1) if tuning else 1
        weights = shared_session_weights(parts.decoders[form]) if count > 1 else None
        decoder = open_session(synth_path, "synthesizer decoder", parts.decoders[form], weights=weights)
        if count > 1:
            lanes = DecoderLanes([open_session(synth_path, "synthesizer decoder", parts.decoders[form],
                                               threads=lane_threads(count), weights=weights)
                                  for _ in range(count)], weights)
        decoder_inputs = (parts.z_name, parts.g_name) if parts.g_name else (parts.z_name,)
        margin = decoder_margin(config.get("model", {}))
        outputs = [o for o in outputs if o not in decoder_inputs]

    # duration_predictor.onnx, when present, is not loaded: the synthesizer's own
    # timing and our pause table do its job here, and it would cost memory.
    return Voice(
        name=name, sample_rate=data["sampling_rate"], hop_length=data["hop_length"],
        speakers=dict(data.get("spk2id") or {name: 0}), styles=styles, style_vectors=vectors,
        synth=synth, synth_outputs=outputs, decoder=decoder, decoder_lanes=lanes, decoder_inputs=decoder_inputs,
        decoder_margin=margin, files=[config_path, vectors_path, synth_path], tuning=tuning,
    )


def installed_voices(models_dir: Path) -> list[str]:
    root = Path(models_dir) / SPEAKERS_DIR
    if not root.is_dir():
        return []
    return sorted(d.name for d in root.iterdir() if (d / "synthesizer.onnx").is_file())


class ModelStore:
    """BERT, its tokenizer and the voices of one models directory.

    Voices are loaded on first use and share the one BERT session; only the
    `max_voices` most recently used stay loaded, so switching voices all day
    does not grow memory. What is derived from the model files (the split,
    the decoder form, optimized copies) is made once, under `derived_dir`
    (default ~/.cache/hayakoe-pi/models), by prepare.py in child processes;
    prepared=False loads the files as they are (whole, optimized at each load).
    """

    def __init__(self, models_dir: str | Path, max_voices: int = 2, prepared: bool = True,
                 derived_dir: str | Path | None = None):
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
        self.derived = (Path(derived_dir) if derived_dir else default_derived_dir()) if prepared else None
        self._prepare([])
        self.bert = Bert(self.dir, self.derived)
        self.max_voices = max(1, max_voices)
        self._voices: dict[str, Voice] = {}  # in order of use, most recent last
        self._lock = threading.Lock()

    def voices(self) -> list[str]:
        return installed_voices(self.dir)

    def voice(self, name: str) -> Voice:
        with self._lock:
            voice = self._voices.pop(name, None)
            if voice is None:
                self._prepare([name])
                voice = load_voice(self.dir, name, self.bert.hidden_size, self.derived)
            self._voices[name] = voice
            while len(self._voices) > self.max_voices:
                self._voices.pop(next(iter(self._voices)))
            return voice

    def _prepare(self, voices: list[str]) -> None:
        """Make what is missing, each model in a child process (memory: see prepare.py)."""
        from .prepare import prepare

        if self.derived is not None and (not voices or voices[0] in installed_voices(self.dir)):
            prepare(self.dir, self.derived, voices)


def default_derived_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hayakoe-pi" / "models"
