"""This CPU: the cores ONNX Runtime may use, the compute threads' lower priority, and
the key of this CPU and ONNX Runtime that derived files and timings are kept under."""

from __future__ import annotations

import hashlib
import os
import platform
import threading
from pathlib import Path

import onnxruntime as ort


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
