"""config.yaml: defaults, types and checks with messages that say how to fix them."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import yaml

from .engine import SPEED_RANGE
from .layout import DEFAULT_VOICE
from .models import SPEAKERS_DIR, installed_voices


class ConfigError(Exception):
    pass


_NUMBER = (int, float)
_OPT_STR = (str, type(None))

# Every key with its default and the types it accepts. A tuple
# (default, types[, (low, high)]) is a leaf; a dict is a section.
SCHEMA: dict[str, Any] = {
    "mqtt": {
        "host": ("localhost", str),
        "port": (1883, int, (1, 65535)),
        "username": (None, _OPT_STR),
        "password": (None, _OPT_STR),
        "tls": {
            "enabled": (False, bool),
            "ca_file": (None, _OPT_STR),
            "insecure": (False, bool),
        },
        "client_id": ("hayakoe-pi", str),
        "topic_prefix": ("hayakoe", str),
        "discovery_prefix": ("homeassistant", str),
        "keepalive": (60, int, (5, 3600)),
    },
    "models": {"dir": ("/var/lib/hayakoe-pi/models", str)},
    "voice": {
        "name": (DEFAULT_VOICE, str),
        "style": ("Neutral", str),
        "style_weight": (1.0, _NUMBER, (0.0, 20.0)),
        "speed": (1.0, _NUMBER, SPEED_RANGE),
    },
    "audio": {
        "device": ("default", (str, int)),
        "volume": (1.0, _NUMBER, (0.0, 1.0)),
        "retry_seconds": (5.0, _NUMBER, (0.1, 3600.0)),
    },
    "cache": {
        "dir": ("/var/cache/hayakoe-pi", str),
        "max_mb": (200, _NUMBER, (0, 100000)),
    },
    "queue": {
        "max_length": (20, int, (1, 10000)),
        "max_text_chars": (1000, int, (1, 100000)),
    },
    "wyoming": {
        "enabled": (False, bool),
        "host": ("0.0.0.0", str),
        "port": (10200, int, (1, 65535)),
        "zeroconf": (True, bool),
    },
    "state": {"file": ("/var/lib/hayakoe-pi/state.json", str)},
    "watchdog": {"stuck_seconds": (90.0, _NUMBER, (1.0, 3600.0))},
    "log": {"level": ("INFO", str)},
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def defaults(schema: dict = SCHEMA) -> dict:
    return {k: defaults(v) if isinstance(v, dict) else copy.copy(v[0]) for k, v in schema.items()}


def _type_name(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
             type(None): "null"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def _merge(schema: dict, given: Any, path: str, out: dict) -> None:
    if not isinstance(given, dict):
        raise ConfigError(f"{path or 'the file'} must be a mapping of keys, got {type(given).__name__}")
    for key, value in given.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in schema:
            known = ", ".join(schema)
            raise ConfigError(f"unknown key {where!r}; known keys here: {known}")
        spec = schema[key]
        if isinstance(spec, dict):
            _merge(spec, {} if value is None else value, where, out[key])
            continue
        types = spec[1] if isinstance(spec[1], tuple) else (spec[1],)
        # YAML's yes/no are bools, which Python also counts as ints: not a number here.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ConfigError(f"{where} must be {_type_name(spec[1])}, got {given[key]!r}")
        if len(spec) > 2 and isinstance(value, (int, float)) and not isinstance(value, bool):
            low, high = spec[2]
            if not (math.isfinite(value) and low <= value <= high):
                raise ConfigError(f"{where} must be between {low} and {high}, got {value!r}")
        out[key] = value


def load_config(path: str | Path | None) -> dict:
    """Read and type-check a config file; omitted keys take their defaults."""
    config = defaults()
    if path is None:
        return config
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    try:
        given = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    try:
        _merge(SCHEMA, given or {}, "", config)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    if config["log"]["level"].upper() not in LOG_LEVELS:
        raise ConfigError(f"{path}: log.level must be one of {', '.join(LOG_LEVELS)}")
    mqtt = config["mqtt"]
    for key in ("topic_prefix", "discovery_prefix"):
        if not mqtt[key] or any(c in mqtt[key] for c in "#+\0") or mqtt[key].startswith("/"):
            raise ConfigError(f"{path}: mqtt.{key} {mqtt[key]!r} is not a valid MQTT topic prefix")
    if mqtt["tls"]["enabled"] and mqtt["tls"]["ca_file"] and not Path(mqtt["tls"]["ca_file"]).is_file():
        raise ConfigError(f"{path}: mqtt.tls.ca_file {mqtt['tls']['ca_file']} does not exist")
    return config


def voice_styles(models_dir: Path, voice: str) -> list[str]:
    """Styles of an installed voice, read from its config.json without loading models."""
    try:
        data = json.loads((models_dir / SPEAKERS_DIR / voice / "config.json").read_text("utf-8"))
        return list(data["data"]["style2id"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def check_models(config: dict) -> None:
    """The model directory and the configured voice and style exist."""
    models_dir = Path(config["models"]["dir"]).expanduser()
    if not models_dir.is_dir():
        raise ConfigError(
            f"models.dir {models_dir} does not exist: install the models "
            "(sudo ./install.sh) or point models.dir at a HayaKoe-layout models folder"
        )
    voices = installed_voices(models_dir)
    name = config["voice"]["name"]
    if name not in voices:
        raise ConfigError(
            f"voice.name {name!r} is not installed in {models_dir / SPEAKERS_DIR}; "
            f"installed: {', '.join(voices) or 'none'} (sudo ./install.sh --voice {name} installs it)"
        )
    styles = voice_styles(models_dir, name)
    if config["voice"]["style"] not in styles:
        raise ConfigError(
            f"voice.style {config['voice']['style']!r} is not a style of {name}; styles: {', '.join(styles)}"
        )
