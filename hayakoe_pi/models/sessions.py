"""ONNX Runtime sessions: their options (one memory arena shared by all, threads that
sleep between runs), made at the compute threads' priority, from each prepared
graph's optimized copy (made once, memory-mapped) when there is one."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import onnxruntime as ort

from ..durable import durable_replace
from ..threads import lower_compute_priority
from .checksums import write_record
from .cpu import cpu_key, cpu_threads
from .errors import ModelError, unreadable, unreadable_derived
from .wire import shared_weights

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
    weights and the record of both (checksums.py) are on disk: an interrupted
    copy is never trusted, only redone.
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
        # what it is as made, checked where it is trusted (checksums.py), before it takes its name
        write_record(target, {target.name: tmp, weights: target.parent / weights})
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
    if prepared is not None:  # a failure is the prepared copy's, never the model file's
        opts = _session_options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, prepack, threads)
        for name, value in weights or ():
            opts.add_initializer(name, value)
        try:
            return _new_session(optimize(prepared), opts)
        except Exception as e:  # ORT raises its own exception types for bad files
            raise unreadable_derived(what, optimized_path(prepared), e) from None
    try:
        return _new_session(path, _session_options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, prepack, threads))
    except Exception as e:
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
