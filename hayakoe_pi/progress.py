"""Preparing the models, step by step, in the log (the journal) and in systemd's STATUS.

A first start with engine.decoder int8 or auto makes the 8-bit decoder: minutes on a Pi,
longer than TimeoutStartSec allows a start that only loads. Each step's start asks
systemd for more time (EXTEND_TIMEOUT_USEC), so a start is stopped only by a step that hangs.
"""

from __future__ import annotations

import logging

from . import sdnotify
from .models.prepare import Stage

log = logging.getLogger("hayakoe_pi")

STEP_LIMIT_S = 3600  # the longest step on the slowest Pi takes minutes; an hour is a hang


def announce(stage: Stage, seconds: float | None) -> None:
    """prepare's `progress`: one line when a step starts, one when it ends."""
    log.info("%s", stage.line(seconds))
    more_time = [f"EXTEND_TIMEOUT_USEC={STEP_LIMIT_S * 1_000_000}"] if seconds is None else []
    sdnotify.notify(f"STATUS={stage.line(seconds)}", *more_time)
