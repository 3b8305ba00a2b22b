"""This CPU: the cores ONNX Runtime may use, and the key of this CPU and ONNX Runtime
that derived files and timings are kept under."""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

import onnxruntime as ort


def cpu_threads() -> int:
    """Threads for ONNX Runtime: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


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
