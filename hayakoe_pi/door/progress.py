"""Preparing the models, step by step, in the log (the journal) and in systemd's STATUS.

A first start with engine.decoder int8 or auto makes the 8-bit decoder: minutes on a Pi,
longer than TimeoutStartSec allows a start that only loads. Each step's start asks
systemd for more time (EXTEND_TIMEOUT_USEC), so a start is stopped only by a step that hangs.
A step ends once, done or failed (its child's error, or the signal that killed it): from
then on the watchdog is fed only for the speaker's own progress.
"""

from __future__ import annotations

import logging
import time

from . import sdnotify
from ..models.prepare import Stage

log = logging.getLogger("hayakoe_pi")

STEP_LIMIT_S = 3600  # the longest step on the slowest Pi takes minutes; an hour is a hang


def announce(stage: Stage, seconds: float | None) -> None:
    """prepare's `progress`: one line when a step starts, one when it ends."""
    failed, remade = seconds is not None and stage.failed, seconds is None and stage.remade
    log.log(logging.ERROR if failed else logging.WARNING if remade else logging.INFO, "%s", stage.line(seconds))
    more_time = [f"EXTEND_TIMEOUT_USEC={STEP_LIMIT_S * 1_000_000}"] if seconds is None else []
    sdnotify.notify(f"STATUS={stage.line(seconds)}", *more_time)


class PrepareSteps:
    """The daemon's `progress`: each step announced, and whether one runs now: a voice
    prepared on first use keeps the worker for minutes on a Pi, and that is not stuck."""

    def __init__(self) -> None:
        self._since: float | None = None

    def __call__(self, stage: Stage, seconds: float | None) -> None:
        self._since = time.monotonic() if seconds is None else None  # ended, failed or not
        announce(stage, seconds)

    def running(self) -> bool:
        return self._since is not None and time.monotonic() - self._since < STEP_LIMIT_S
