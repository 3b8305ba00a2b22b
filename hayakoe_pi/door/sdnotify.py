"""systemd's notify protocol (READY, STATUS, WATCHDOG, STOPPING) over $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket


def notify(*fields: str) -> bool:
    """Send e.g. notify("READY=1", "STATUS=…"); False when not run by systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract socket namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall("\n".join(fields).encode("utf-8"))
        return True
    except OSError:
        return False


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half the unit's WatchdogSec), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.5, int(usec) / 2_000_000)
    except ValueError:
        return None
