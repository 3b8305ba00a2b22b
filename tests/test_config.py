import re

import pytest

from conftest import REPO
from hayakoe_pi.settings.config import Config, ConfigError, Identity, defaults, load_config


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_documented_config_equals_the_defaults():
    assert load_config(REPO / "config.yaml") == Config()


def documented_keys(text: str) -> dict[str, bool]:
    """Each key of a block-style YAML file at its path ("mqtt.tls.enabled"): has its line a comment?"""
    found, stack = {}, []  # stack: (indent, key) of the sections the line is in
    for line in text.splitlines():
        m = re.match(r"( *)([A-Za-z_][A-Za-z0-9_]*):(\s|$)", line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [m.group(2)])
        found[path] = "#" in line[m.end():]
        stack.append((indent, m.group(2)))
    return found


def test_every_default_key_is_documented_with_a_comment():
    documented = documented_keys((REPO / "config.yaml").read_text())

    def keys(section, prefix=""):
        for k, v in section.items():
            yield from keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]

    for key in keys(defaults()):
        assert key in documented, f"{key} is not in config.yaml at its place"
        assert documented[key], f"{key} in config.yaml has no comment"


def test_omitted_keys_take_defaults(tmp_path):
    config = load_config(write(tmp_path, "mqtt:\n  host: broker.lan\nvoice:\n  speed: 1.5\n"))
    assert config.mqtt.host == "broker.lan" and config.mqtt.port == 1883
    assert config.voice.speed == 1.5 and config.voice.name == "jvnv-F1-jp"


def test_empty_file_is_all_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == Config()


@pytest.mark.parametrize("text, words", [
    ("mqtt:\n  hostname: x\n", ["mqtt.hostname", "known keys here: host"]),
    ("speakers: 3\n", ["unknown key 'speakers'"]),
    ("mqtt:\n  port: '1883'\n", ["mqtt.port must be an integer"]),
    ("mqtt:\n  port: 70000\n", ["mqtt.port must be between 1 and 65535"]),
    ("audio:\n  volume: yes\n", ["audio.volume must be"]),
    ("mqtt:\n  tls: true\n", ["mqtt.tls must be a mapping"]),
    ("mqtt:\n  topic_prefix: 'a/#'\n", ["topic prefix"]),
    ("log:\n  level: LOUD\n", ["log.level"]),
    ("- a\n- b\n", ["mapping"]),
    ("mqtt:\n  tls:\n    enabled: true\n    ca_file: /nonexistent/ca.pem\n", ["ca_file", "does not exist"]),
    ("device:\n  id: Kitchen\n", ["device.id 'Kitchen'", "a-z"]),
    ("device:\n  id: kitchen/2\n", ["device.id", "topics"]),
    ("device:\n  id: ''\n", ["device.id"]),
    ("device:\n  name: \"a\\nb\"\n", ["device.name"]),
])
def test_bad_values_name_the_key(tmp_path, text, words):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    for w in words:
        assert w in str(e.value)
    assert "config.yaml" in str(e.value)


def test_device_may_be_a_name_or_an_index(tmp_path):
    assert load_config(write(tmp_path, "audio:\n  device: 2\n")).audio.device == 2
    assert load_config(write(tmp_path, "audio:\n  device: 'hw:1,0'\n")).audio.device == "hw:1,0"


def test_the_config_is_typed_and_cannot_change_once_loaded(tmp_path):
    import dataclasses

    from hayakoe_pi.synthesis.engine import SPEED_RANGE

    config = load_config(write(tmp_path, "voice:\n  speed: 2\ncache:\n  dir: /srv/cache\n"))
    assert config.voice.speed == 2 and config.cache.models_dir.as_posix() == "/srv/cache/models"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.voice.speed = 3.0
    # one range per setting: the engine's speed range is the config's
    for speed in (SPEED_RANGE[0] - 0.01, SPEED_RANGE[1] + 0.01):
        with pytest.raises(ConfigError, match=f"voice.speed must be between {SPEED_RANGE[0]} and {SPEED_RANGE[1]}"):
            load_config(write(tmp_path, f"voice:\n  speed: {speed}\n"))
    with pytest.raises(ConfigError, match="voice.speed must be a number, got 'fast'"):
        load_config(write(tmp_path, "voice:\n  speed: fast\n"))
    with pytest.raises(ConfigError, match="mqtt.username must be a string or null"):
        load_config(write(tmp_path, "mqtt:\n  username: 5\n"))


def test_each_pi_has_its_ids_from_device_id_and_an_old_config_keeps_its_own(tmp_path):
    kitchen = load_config(write(tmp_path, "device:\n  id: kitchen-3fa2c1\n  name: Kitchen\n  area: 台所\n"))
    assert kitchen.identity() == Identity("kitchen-3fa2c1", "Kitchen", "台所", "hayakoe-pi-kitchen-3fa2c1",
                                          legacy=False)
    # a config from before device.id: the one client id, node and device name there were
    old = load_config(write(tmp_path, "mqtt:\n  client_id: hayakoe-pi\n"))
    assert old.identity() == Identity("hayakoe-pi", "HayaKoe Pi", None, "hayakoe-pi", legacy=True)
    assert load_config(write(tmp_path, "{}\n")).identity() == old.identity()
    assert load_config(write(tmp_path, "mqtt:\n  client_id: 'Pi #2'\n")).identity().id == "Pi__2"


def test_a_section_given_twice_is_refused_with_both_lines(tmp_path):
    """The README's `wyoming:` block pasted above the installed one: plain YAML would keep the
    last section and drop the pasted one without a word (Wyoming stayed off)."""
    text = "wyoming:\n  enabled: true\n  port: 10200\nmqtt:\n  host: localhost\nwyoming:\n  enabled: false\n"
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    assert "config.yaml: line 6: 'wyoming' is given a second time (first on line 1)" in str(e.value)


def test_a_key_given_twice_in_a_section_is_refused_with_both_lines(tmp_path):
    with pytest.raises(ConfigError, match=r"line 4: 'host' is given a second time \(first on line 2\)"):
        load_config(write(tmp_path, "mqtt:\n  host: broker.lan\n  port: 1883\n  host: localhost\n"))
    with pytest.raises(ConfigError, match=r"line 1: 'volume' is given a second time"):
        load_config(write(tmp_path, "audio: {volume: 0.5, volume: 0.7}\n"))
    # the same key in two sections is no repeat, and neither is the installed config
    config = load_config(write(tmp_path, "voice:\n  name: tiny-voice\ndevice:\n  name: Kitchen\n"))
    assert (config.voice.name, config.device.name) == ("tiny-voice", "Kitchen")
