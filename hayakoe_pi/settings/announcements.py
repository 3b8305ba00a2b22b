"""How an announcement sounds on this Pi: its chime, and quiet hours at night.

Both are per-Pi settings Home Assistant changes (a select and a switch, like the
volume): the changes kept in announcements.json beside the state file (runtime.py's
rule), shown retained under hayakoe/<device.id>/chime and /quiet_hours.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..bounds import quoted_repr
from ..sound.chime import CHOICES as CHIME_CHOICES, OFF, chime_choice
from .runtime import RuntimeChanges, Setting

log = logging.getLogger("hayakoe_pi")

SWITCH = ("ON", "OFF")               # the quiet hours switch's payloads
_CLOCK = re.compile(r"([01]?\d|2[0-3]):([0-5]\d)")


@dataclass(frozen=True)
class QuietHours:
    """audio.quiet_hours: from `start` to `end` (minutes after local midnight; may wrap
    past midnight) messages play at `volume` (0..1) at most."""

    start: int
    end: int
    volume: float

    @classmethod
    def parse(cls, given: dict) -> "QuietHours":
        """{from: "22:00", to: "07:00", volume: 30} → QuietHours, or ValueError saying what is wrong."""
        unknown = set(given) - {"from", "to", "volume"}
        if unknown or not {"from", "to", "volume"} <= set(given):
            raise ValueError('give {from: "22:00", to: "07:00", volume: 30} (local time, volume 0-100)')
        minutes = []
        for key in ("from", "to"):
            m = _CLOCK.fullmatch(str(given[key]).strip())
            if not isinstance(given[key], str) or not m:
                raise ValueError(f"{key} must be a time of day as \"HH:MM\" in quotes, got {given[key]!r}")
            minutes.append(int(m[1]) * 60 + int(m[2]))
        volume = given["volume"]
        if isinstance(volume, bool) or not isinstance(volume, (int, float)) or not 0 <= volume <= 100:
            raise ValueError(f"volume must be a number from 0 to 100, got {volume!r}")
        if minutes[0] == minutes[1]:
            raise ValueError("from and to must differ")
        return cls(minutes[0], minutes[1], volume / 100)

    def covers(self, local: time.struct_time) -> bool:
        now = local.tm_hour * 60 + local.tm_min
        if self.start < self.end:
            return self.start <= now < self.end
        return now >= self.start or now < self.end  # across midnight


def playing_volume(volume: float, quiet: QuietHours | None, alert: bool,
                   local: time.struct_time | None = None) -> tuple[float, bool]:
    """The volume a message plays at, and whether quiet hours lowered it.

    Local time (time.localtime(): the system's time zone, or TZ)."""
    if quiet is None or alert or not quiet.covers(local or time.localtime()):
        return volume, False
    return min(volume, quiet.volume), volume > quiet.volume


class AnnouncementSettings:
    """The chime chosen (off / default / file) and quiet hours on or off: the config's, or as
    Home Assistant changed them (kept by runtime.py's rule: a changed config wins)."""

    NAMES = ("chime", "quiet_hours")

    def __init__(self, path: Path, chime: str, quiet: QuietHours | None, config_mtime: float | None = None,
                 read_only: bool = False):
        self.path, self.quiet_hours_config = path, quiet
        chime = chime_choice(chime)
        self.chime_options = [*CHIME_CHOICES] + ([] if chime in CHIME_CHOICES else ["file"])
        configured = {"chime": chime if chime in CHIME_CHOICES else "file", "quiet_hours": quiet is not None}
        self.changes = RuntimeChanges(path, configured, self._usable, config_mtime, read_only,
                                      shows={"quiet_hours": lambda on: SWITCH[not on]},
                                      current=lambda name, value: chime_choice(value) if name == "chime" else value)
        for note in self.changes.dropped:
            log.warning("%s", note)
        self.chime, self.quiet_on = self.changes.value("chime"), self.changes.value("quiet_hours")
        self._lock = threading.Lock()

    def _usable(self, name: str, value) -> bool:
        if name == "chime":
            return value in self.chime_options
        return isinstance(value, bool) and (self.quiet_hours_config is not None or not value)

    def settings(self) -> list[Setting]:
        """Each setting in effect and where it comes from."""
        return [self.changes.setting("chime", self.chime), self.changes.setting("quiet_hours", self.quiet_on)]

    def describe(self) -> str:
        return ", ".join(s.line(self.changes.shown(s.name)) for s in self.settings())

    @property
    def quiet(self) -> QuietHours | None:
        """The quiet hours in force: configured and switched on."""
        return self.quiet_hours_config if self.quiet_on else None

    def chime_for(self, asked: bool | str | None) -> str:
        """A message's chime: its "chime" field (true: this Pi's chime, or the default one if
        this Pi has none; false: none; "default", "off" or a WAV's path), else this Pi's."""
        if asked is None:
            return self.chime
        if asked is True:
            return "default" if self.chime == OFF else self.chime
        return chime_choice(asked)

    def shown(self, name: str) -> str:
        return self.chime if name == "chime" else SWITCH[not self.quiet_on]

    def set(self, name: str, payload: bytes) -> None:
        """A chime/set or quiet_hours/set payload; ValueError saying what is accepted."""
        value = payload.decode("utf-8", errors="replace").strip()
        with self._lock:
            if name == "chime":
                value = chime_choice(value)
                if value not in self.chime_options:
                    raise ValueError(f"chime must be one of {', '.join(self.chime_options)}, "
                                     f"got {quoted_repr(value, 40)}")
                self.chime = value
            else:
                if value.upper() not in SWITCH:
                    raise ValueError(f"quiet_hours must be ON or OFF, got {quoted_repr(value, 40)}")
                if self.quiet_hours_config is None and value.upper() == "ON":
                    raise ValueError("no quiet hours are configured (audio.quiet_hours in the config)")
                self.quiet_on = value.upper() == "ON"
            self.changes.update({"chime": self.chime, "quiet_hours": self.quiet_on})
