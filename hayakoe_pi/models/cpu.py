"""This CPU: the cores ONNX Runtime may use (those the process may run on, and no more
than its cgroups' CPU quota lets it keep busy), and the key of this CPU and ONNX Runtime
that derived files and timings are kept under."""

from __future__ import annotations

import hashlib
import math
import os
import platform
from pathlib import Path

import onnxruntime as ort


def cpu_threads() -> int:
    """Threads for ONNX Runtime: the cores this process may run on, at most as many as
    its CPU quota covers (a container's --cpus, systemd's CPUQuota): a thread more than
    the quota only waits for it, and the decoder lanes share these out."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cores = max(1, os.cpu_count() or 1)
    quota = cgroup_cpus()
    return cores if quota is None else max(1, min(cores, math.ceil(quota - 1e-6)))


def cgroup_cpus() -> float | None:
    """CPUs this process's cgroups let it use (CFS quota over period, the least of its
    group and the groups above it, cgroup v1 or v2); None: no quota."""
    try:
        groups = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except (OSError, ValueError):
        return None
    limits = []
    for mount in mounts:
        fields, _, fs = mount.partition(" - ")
        root, point = fields.split()[3:5]
        kind, _, options = (fs.split() + ["", "", ""])[:3]
        if kind == "cgroup2":
            group = groups.get("")
        elif kind == "cgroup" and "cpu" in options.split(","):
            group = next((g for c, g in groups.items() if "cpu" in c.split(",")), None)
        else:
            continue
        if group is None or not (group + "/").startswith(root.rstrip("/") + "/"):
            continue  # not this process's part of that hierarchy
        folder = Path(point, group[len(root.rstrip("/")):].lstrip("/"))
        while True:
            limits.append(_quota(folder, kind))
            if folder == Path(point):
                break
            folder = folder.parent
    limits = [cpus for cpus in limits if cpus is not None]
    return min(limits) if limits else None


def _quota(folder: Path, kind: str) -> float | None:
    try:
        if kind == "cgroup2":
            quota, period = (folder / "cpu.max").read_text().split()
        else:
            quota, period = ((folder / f"cpu.cfs_{name}_us").read_text().strip() for name in ("quota", "period"))
        return None if quota in ("max", "-1") else int(quota) / int(period)
    except (OSError, ValueError):
        return None


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
