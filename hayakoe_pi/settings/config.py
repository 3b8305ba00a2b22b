"""config.yaml, read once into frozen dataclasses, with messages that say how to fix it.

Each section is a dataclass; a setting's type is its annotation, its range
(if any) given with `setting(default, low, high)`: the one place both are
written. load_config() checks a file against them and returns a Config.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .announcements import QuietHours
from ..sound.chime import CHOICES as CHIME_CHOICES, chime_choice, read_wav
from ..synthesis.engine import SPEED_RANGE
from ..layout import DEFAULT_VOICE
from ..models.quantize import DECODER_CHOICES
from ..models.voices import SPEAKERS_DIR, installed_voices


class ConfigError(Exception):
    pass


def setting(default, low: float, high: float):
    """A number with the range it must be in."""
    return field(default=default, metadata={"range": (low, high)})


def section(cls):
    return field(default_factory=cls)


DEVICE_ID_RE = re.compile(r"[a-z0-9_-]{1,64}")
LEGACY_CLIENT_ID = "hayakoe-pi"  # the one client id, node id and device of every Pi before device.id
DEFAULT_DEVICE_NAME = "HayaKoe Pi"


@dataclass(frozen=True)
class DeviceConfig:
    id: str | None = None    # [a-z0-9_-]: topics hayakoe/<id>/..., client and Home Assistant ids
    name: str | None = None  # what Home Assistant shows
    area: str | None = None  # Home Assistant's suggested_area


@dataclass(frozen=True)
class Identity:
    """Who this Pi is on the broker, in Home Assistant and on the LAN (Config.identity())."""

    id: str
    name: str
    area: str | None
    client_id: str  # the control connection's; the intake adds -intake
    legacy: bool    # no device.id: the ids of a single Pi installed before there were several


@dataclass(frozen=True)
class TlsConfig:
    enabled: bool = False
    ca_file: str | None = None
    insecure: bool = False


@dataclass(frozen=True)
class MqttConfig:
    host: str = "localhost"
    port: int = setting(1883, 1, 65535)
    username: str | None = None
    password: str | None = None
    tls: TlsConfig = section(TlsConfig)
    client_id: str | None = None  # null: hayakoe-pi-<device.id> (only configs from before device.id set it)
    topic_prefix: str = "hayakoe"
    discovery_prefix: str = "homeassistant"
    birth_topic: str = "homeassistant/status"
    keepalive: int = setting(60, 5, 3600)

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ModelsConfig:
    dir: str = "/var/lib/hayakoe-pi/models"


@dataclass(frozen=True)
class VoiceConfig:
    name: str = DEFAULT_VOICE
    style: str = "Neutral"
    style_weight: float = setting(1.0, 0.0, 20.0)
    speed: float = setting(1.0, *SPEED_RANGE)


@dataclass(frozen=True)
class EngineConfig:
    # fp32: the synthesizer as published. int8 or auto: each voice's decoder in 8 bits where
    # prepare measured that it keeps the voice and is at least 1.25x faster on this CPU
    # (models/gate.py); else FP32, int8 with a warning. auto is the choice on a Pi 3/4/Zero 2 W.
    decoder: str = "fp32"


@dataclass(frozen=True)
class AudioConfig:
    device: str | int = "default"
    volume: float = setting(1.0, 0.0, 1.0)
    retry_seconds: float = setting(5.0, 0.1, 3600.0)
    # silence written when the card opens, before the first sound: speakers and amplifiers
    # wake up meanwhile (HDMI, USB: 300-500 ms; Bluetooth: 1000-1500 ms)
    lead_in_ms: float = setting(300.0, 0.0, 5000.0)
    # after a message the card stays open, fed with silence, this long: the next one needs no lead-in
    keep_open_s: float = setting(10.0, 0.0, 3600.0)
    # how much later the card is heard than its buffer says (a receiver's or amplifier's own
    # delay): "at" starts this much sooner here, to keep rooms in step (snapcast's client latency)
    latency_ms: float = setting(0.0, -1000.0, 2000.0)
    chime: str | bool = "off"  # off (YAML's bare off is false; "none", the former name), default or a WAV
    chime_dir: str = "/etc/hayakoe-pi/chimes"  # the WAV files a message's "chime" may name
    quiet_hours: dict | None = None  # {from: "22:00", to: "07:00", volume: 30}, local time

    def quiet(self) -> QuietHours | None:
        return None if self.quiet_hours is None else QuietHours.parse(self.quiet_hours)


@dataclass(frozen=True)
class CacheConfig:
    dir: str = "/var/cache/hayakoe-pi"
    max_mb: float = setting(200, 0, 100000)

    @property
    def models_dir(self) -> Path:
        """Where the files derived from the models live (split, optimized copies): one rule for
        the service and for the CLI given this config."""
        return Path(self.dir) / "models"

    @property
    def dictionary_dir(self) -> Path:
        """The user dictionary compiled for OpenJTalk."""
        return Path(self.dir) / "dictionary"


@dataclass(frozen=True)
class QueueConfig:
    max_length: int = setting(20, 1, 10000)
    max_text_chars: int = setting(1000, 1, 100000)
    duplicate_window_s: float = setting(600.0, 0.0, 86400.0)
    max_age_s: float = setting(900.0, 1.0, 7 * 86400.0)


@dataclass(frozen=True)
class WyomingConfig:
    enabled: bool = False
    host: str = "0.0.0.0"
    port: int = setting(10200, 1, 65535)
    zeroconf: bool = True
    max_syntheses: int = setting(2, 1, 16)
    write_timeout_s: float = setting(30.0, 1.0, 600.0)
    idle_timeout_s: float = setting(120.0, 1.0, 3600.0)


@dataclass(frozen=True)
class StateConfig:
    file: str = "/var/lib/hayakoe-pi/state.json"


@dataclass(frozen=True)
class DictionaryConfig:
    file: str = "/var/lib/hayakoe-pi/dictionary.yaml"
    max_entries: int = setting(5000, 1, 100000)


@dataclass(frozen=True)
class WatchdogConfig:
    stuck_seconds: float = setting(90.0, 1.0, 3600.0)


@dataclass(frozen=True)
class LogConfig:
    level: str = "INFO"


@dataclass(frozen=True)
class Config:
    device: DeviceConfig = section(DeviceConfig)
    mqtt: MqttConfig = section(MqttConfig)
    models: ModelsConfig = section(ModelsConfig)
    voice: VoiceConfig = section(VoiceConfig)
    engine: EngineConfig = section(EngineConfig)
    audio: AudioConfig = section(AudioConfig)
    cache: CacheConfig = section(CacheConfig)
    queue: QueueConfig = section(QueueConfig)
    wyoming: WyomingConfig = section(WyomingConfig)
    state: StateConfig = section(StateConfig)
    dictionary: DictionaryConfig = section(DictionaryConfig)
    watchdog: WatchdogConfig = section(WatchdogConfig)
    log: LogConfig = section(LogConfig)

    def identity(self) -> Identity:
        """device.id and its ids; without one, those of a Pi installed before device.id
        existed (client id `hayakoe-pi`, or mqtt.client_id), so Home Assistant keeps its entities."""
        device = self.device
        if device.id is not None:
            client_id = self.mqtt.client_id or f"{LEGACY_CLIENT_ID}-{device.id}"
            return Identity(device.id, device.name or device.id, device.area, client_id, legacy=False)
        client_id = self.mqtt.client_id or LEGACY_CLIENT_ID
        node = re.sub(r"[^A-Za-z0-9_-]", "_", client_id)
        return Identity(node, device.name or DEFAULT_DEVICE_NAME, device.area, client_id, legacy=True)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def defaults() -> dict:
    """Every setting's default, as nested dicts (the shape of config.yaml)."""
    return dataclasses.asdict(Config())


def _accepted(annotation) -> tuple[type, ...]:
    kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    # a whole number is a number; YAML's yes/no are bools, which Python also counts as ints: not here
    return tuple(t for k in kinds for t in ((int, float) if k is float else (k,)))


def _type_name(annotation) -> str:
    kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null",
             dict: "a mapping"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _build(cls, given, path: str):
    if not isinstance(given, dict):
        raise ConfigError(f"{path or 'the file'} must be a mapping of keys, got {type(given).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in given.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            raise ConfigError(f"unknown key {where!r}; known keys here: {', '.join(fields)}")
        kind = hints[key]
        if dataclasses.is_dataclass(kind):
            values[key] = _build(kind, {} if value is None else value, where)
            continue
        accepted = _accepted(kind)
        if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
            raise ConfigError(f"{where} must be {_type_name(kind)}, got {value!r}")
        limits = fields[key].metadata.get("range")
        if limits and not (math.isfinite(value) and limits[0] <= value <= limits[1]):
            raise ConfigError(f"{where} must be between {limits[0]} and {limits[1]}, got {value!r}")
        values[key] = value
    return cls(**values)


class _NoRepeatsLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error: plain YAML
    keeps the last and drops the first without a word (a `wyoming:` section pasted above the
    installed one would be lost)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    earlier = first.get(key)
                except TypeError:  # an unhashable key: SafeLoader says so itself
                    continue
                if earlier is not None:
                    raise ConfigError(f"line {line}: {key!r} is given a second time (first on line {earlier}); "
                                      "YAML would keep only the last one: merge the two into one")
                first[key] = line
        return super().construct_mapping(node, deep)


def read_yaml(text: str):
    """YAML text → data, refusing a key repeated in a mapping (ConfigError, with both lines)."""
    return yaml.load(text, Loader=_NoRepeatsLoader)


def load_config(path: str | Path | None) -> Config:
    """Read and check a config file; omitted keys take their defaults."""
    if path is None:
        return Config()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    try:
        given = read_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    try:
        config = _build(Config, given or {}, "")
        _check(config)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return config


def _check(config: Config) -> None:
    """What a type and a range cannot say."""
    device = config.device
    if device.id is not None and not DEVICE_ID_RE.fullmatch(device.id):
        raise ConfigError(f"device.id {device.id!r} must be 1 to 64 of a-z, 0-9, '_' and '-' "
                          "(it is part of MQTT topics and Home Assistant ids)")
    for key in ("name", "area"):
        value = getattr(device, key)
        if value is not None and (not value.strip() or any(ord(c) < 32 for c in value)):
            raise ConfigError(f"device.{key} must be a non-empty line of text, got {value!r}")
    if config.engine.decoder not in DECODER_CHOICES:
        raise ConfigError(f"engine.decoder must be one of {', '.join(DECODER_CHOICES)}, "
                          f"got {config.engine.decoder!r}")
    if config.log.level.upper() not in LOG_LEVELS:
        raise ConfigError(f"log.level must be one of {', '.join(LOG_LEVELS)}")
    for key in ("topic_prefix", "discovery_prefix", "birth_topic"):
        prefix = getattr(config.mqtt, key)
        if not prefix or any(c in prefix for c in "#+\0") or prefix.startswith("/"):
            raise ConfigError(f"mqtt.{key} {prefix!r} is not a valid MQTT topic prefix")
    audio = config.audio
    try:
        audio.quiet()
    except ValueError as e:
        raise ConfigError(f"audio.quiet_hours: {e}") from None
    chime = chime_choice(audio.chime)
    if chime is True:
        raise ConfigError("audio.chime must be off, default or a WAV file's path, got true")
    if chime not in CHIME_CHOICES:
        try:
            read_wav(chime, 44100)
        except ValueError as e:
            raise ConfigError(f"audio.chime must be off, default or a WAV file: {e}") from None
    tls = config.mqtt.tls
    if tls.enabled and tls.ca_file and not Path(tls.ca_file).is_file():
        raise ConfigError(f"mqtt.tls.ca_file {tls.ca_file} does not exist")


def voice_styles(models_dir: Path, voice: str) -> list[str]:
    """Styles of an installed voice, read from its config.json without loading models."""
    try:
        data = json.loads((models_dir / SPEAKERS_DIR / voice / "config.json").read_text("utf-8"))
        return list(data["data"]["style2id"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def check_models(config: Config) -> None:
    """The model directory and the configured voice and style exist."""
    models_dir = Path(config.models.dir).expanduser()
    if not models_dir.is_dir():
        raise ConfigError(
            f"models.dir {models_dir} does not exist: install the models "
            "(sudo ./install.sh) or point models.dir at a HayaKoe-layout models folder"
        )
    voices = installed_voices(models_dir)
    name = config.voice.name
    if name not in voices:
        raise ConfigError(
            f"voice.name {name!r} is not installed in {models_dir / SPEAKERS_DIR}; "
            f"installed: {', '.join(voices) or 'none'} (sudo ./install.sh --voice {name} installs it)"
        )
    styles = voice_styles(models_dir, name)
    if config.voice.style not in styles:
        raise ConfigError(f"voice.style {config.voice.style!r} is not a style of {name}; styles: {', '.join(styles)}")
