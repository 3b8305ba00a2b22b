"""Which setting wins: config.yaml, or a change made at run time (over MQTT, by Home Assistant).

One rule for every setting Home Assistant can change (volume, voice, style, chime, quiet hours):

- a change made at run time is kept on disk (state.json, announcements.json) with the config
  value it was made against; nothing else is kept there;
- at start a kept change wins while the config still says what it said then; once the config's
  value has changed (an edit, `install.sh --voice`), the config wins and the change is dropped;
- a change back to the config's value is no change: it is dropped too.

The daemon logs at start which wins for each setting (`volume 40 % (set over MQTT; config says
70 %)`), and `hayakoe-pi check` shows the same.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..durable import write_durably

log = logging.getLogger("hayakoe_pi")


@dataclass(frozen=True)
class Setting:
    """A setting in effect and where it comes from."""

    name: str
    value: Any
    config: Any
    changed: bool  # set at run time (and kept), else the config's

    def line(self, show: Callable[[Any], str] = str) -> str:
        if self.changed:
            return f"{self.name} {show(self.value)} (set over MQTT; config says {show(self.config)})"
        return f"{self.name} {show(self.value)} (config)"


class RuntimeChanges:
    """The changes made at run time to `config`'s settings (name → the config's value), in `path`.

    `current(name, value)` names a kept value as this version does (a value renamed since).
    `usable(name, value)` says whether a kept value can still be used (a volume in range, a voice
    still installed): one that cannot is dropped. `config_mtime`: when the config file was last
    changed, to read a file of an older version, which kept its values without the config's
    (taken as changes only when the file is newer than the config). `read_only`: never write
    (`check`). What was dropped, and why, is in `dropped` (the owner logs it).
    """

    def __init__(self, path: Path, config: dict[str, Any], usable: Callable[[str, Any], bool] | None = None,
                 config_mtime: float | None = None, read_only: bool = False,
                 shows: dict[str, Callable[[Any], str]] | None = None,
                 current: Callable[[str, Any], Any] | None = None):
        self.path, self.config, self.read_only, self.shows = path, dict(config), read_only, shows or {}
        self.values: dict[str, Any] = {}  # name → value, for the changes that win
        self.dropped: list[str] = []
        try:
            saved = json.loads(path.read_text("utf-8"))
            if not isinstance(saved, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            self.dropped.append(f"{path} cannot be read ({e}); the config's values are used")
            self.save()
            return
        for name, value, against in self._entries(saved, config_mtime):
            if name not in self.config:
                continue
            if current is not None:  # an older version's name for a value, as named now
                value, against = current(name, value), current(name, against)
            show = self.shown(name)
            if against != self.config[name]:
                self.dropped.append(f"{name} {show(value)}, set over MQTT when the config said {show(against)}, "
                                    f"is dropped: the config says {show(self.config[name])} now, and wins")
            elif value == self.config[name]:
                continue
            elif usable is not None and not usable(name, value):
                self.dropped.append(f"{name} {_json(value)} in {path} cannot be used; the config's "
                                    f"{show(self.config[name])} is")
            else:
                self.values[name] = value
        if self.dropped or "changes" not in saved:
            self.save()  # in this version's form, without what was dropped

    def _entries(self, saved: dict, config_mtime: float | None):
        """(name, value, the config's value it was set against) of each change in the file."""
        if "changes" in saved:
            changes = saved["changes"] if isinstance(saved["changes"], dict) else {}
            for name, change in changes.items():
                if isinstance(change, dict) and {"value", "config"} <= set(change):
                    yield name, change["value"], change["config"]
            return
        # an older version's file: every value, changed or not, without the config's then
        try:
            newer = config_mtime is None or os.stat(self.path).st_mtime >= config_mtime
        except OSError:
            newer = True
        for name, value in saved.items():
            if name in self.config:
                yield name, value, (self.config[name] if newer else _UNKNOWN)

    def shown(self, name: str) -> Callable[[Any], str]:
        """How a value of `name` is written for people (the volume in percent)."""
        show = self.shows.get(name, _plain)

        def shown(value: Any) -> str:
            if isinstance(value, _Unknown):
                return repr(value)
            try:
                return show(value)
            except (TypeError, ValueError, OverflowError):  # a value from the file that is no volume
                return _json(value)

        return shown

    def value(self, name: str) -> Any:
        return self.values.get(name, self.config[name])

    def setting(self, name: str, value: Any = None) -> Setting:
        """`name` in effect (`value`, when its owner had to fall back from the one kept)."""
        value = self.value(name) if value is None else value
        return Setting(name, value, self.config[name], value != self.config[name])

    def update(self, values: dict[str, Any]) -> None:
        """Changes at run time (each kept only while it differs from the config's); saved once."""
        for name, value in values.items():
            if value == self.config[name]:
                self.values.pop(name, None)
            else:
                self.values[name] = value
        self.save()

    def save(self) -> None:
        if self.read_only:
            return
        changes = {name: {"value": value, "config": self.config[name]} for name, value in self.values.items()}
        try:
            write_durably(self.path, json.dumps({"changes": changes}, ensure_ascii=False))
        except OSError as e:
            log.warning("cannot save the settings changed at run time to %s (%s)", self.path, e)


def config_changed_at(config_file: str | Path | None) -> float | None:
    """When the config file was last changed (to read the files of older versions by)."""
    try:
        return os.stat(config_file).st_mtime if config_file else None
    except OSError:
        return None


class _Unknown:
    """The config value an older version's change was made against, when the config changed since."""

    def __repr__(self) -> str:
        return "something else (the config file changed since)"


_UNKNOWN = _Unknown()


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else _json(value)
