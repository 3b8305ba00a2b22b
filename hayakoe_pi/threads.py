"""Our threads as the kernel sees them: a name it shows (`top -H`, `ps -L`), and a lower
priority for those that compute, so that the thread feeding the sound card never waits
behind them."""

from __future__ import annotations

import os
import threading


def name_os_thread(name: str) -> None:
    """Give the calling thread its name in the kernel too (`top -H`, `ps -L`,
    /proc/PID/task/TID/comm): Python keeps thread names to itself."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):  # not Linux
        pass


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
