"""Home Assistant MQTT discovery payloads against the keys Home Assistant's schemas accept.

The lists are written out from Home Assistant Core's MQTT integration
(homeassistant/components/mqtt/: schemas.py MQTT_ENTITY_COMMON_SCHEMA with
`default_entity_id` (2025.10 and later), config.py MQTT_RW_SCHEMA/MQTT_RO_SCHEMA,
and each platform's schema), read for Home Assistant 2025.10–2026.x. Discovery
drops unknown keys silently (REMOVE_EXTRA), so a misspelled key would only
show as a feature that does not work: hence this test.
"""

from hayakoe_pi import __version__
from hayakoe_pi.settings.config import Config, DeviceConfig, MqttConfig
from hayakoe_pi.broker.discovery import discovery_messages, retained_topics
from hayakoe_pi.broker.topics import Topics

COMMON = {
    "availability", "availability_mode", "availability_template", "availability_topic", "default_entity_id",
    "device", "enabled_by_default", "entity_category", "entity_picture", "icon", "json_attributes_template",
    "json_attributes_topic", "message_expiry_interval", "name", "origin", "payload_available",
    "payload_not_available", "unique_id", "visible_by_default",
}
PLATFORM = {
    "notify": {"command_template", "command_topic", "encoding", "qos", "retain"},
    "sensor": {"device_class", "encoding", "expire_after", "force_update", "last_reset_value_template",
               "options", "qos", "state_class", "state_topic", "suggested_display_precision",
               "unit_of_measurement", "value_template"},
    "number": {"command_template", "command_topic", "device_class", "encoding", "max", "min", "mode",
               "optimistic", "payload_reset", "qos", "retain", "state_topic", "step", "unit_of_measurement",
               "value_template"},
    "select": {"command_template", "command_topic", "encoding", "optimistic", "options", "qos", "retain",
               "state_topic", "value_template"},
    "button": {"command_template", "command_topic", "device_class", "encoding", "payload_press", "qos", "retain"},
    "switch": {"command_topic", "device_class", "encoding", "optimistic", "payload_off", "payload_on", "qos",
               "retain", "state_off", "state_on", "state_topic", "value_template"},
    "binary_sensor": {"device_class", "encoding", "expire_after", "force_update", "off_delay", "payload_off",
                      "payload_on", "qos", "state_topic", "value_template"},
}
REQUIRED = {"notify": {"command_topic"}, "sensor": {"state_topic"}, "number": {"command_topic"},
            "select": {"command_topic", "options"}, "button": {"command_topic"}, "switch": {"command_topic"},
            "binary_sensor": {"state_topic"}}
DEVICE = {"configuration_url", "connections", "hw_version", "identifiers", "manufacturer", "model", "model_id",
          "name", "serial_number", "suggested_area", "sw_version", "via_device"}
ORIGIN = {"name", "support_url", "sw_version"}

# the entity ids of a Pi installed before device.id (client id hayakoe-pi), which an upgrade keeps
PROMISED = {"notify.hayakoe_pi_say", "sensor.hayakoe_pi_state", "number.hayakoe_pi_volume",
            "select.hayakoe_pi_voice", "select.hayakoe_pi_style", "button.hayakoe_pi_stop",
            "select.hayakoe_pi_chime", "switch.hayakoe_pi_quiet_hours",  # announcements (#36)
            "sensor.hayakoe_pi_disk_free", "binary_sensor.hayakoe_pi_disk_low"}  # diagnostic (#45)


def messages(config: Config = Config()):
    me = config.identity()
    return discovery_messages(Topics("hayakoe", me.id), me, ["jvnv-F1-jp"], ["Neutral"])


def assert_home_assistant_accepts(found):
    for topic, config in found:
        platform = topic.split("/")[1]
        unknown = set(config) - COMMON - PLATFORM[platform]
        assert not unknown, (topic, unknown)
        assert REQUIRED[platform] <= set(config), topic
        assert set(config["device"]) <= DEVICE and config["device"]["identifiers"]
        assert set(config["origin"]) <= ORIGIN


def test_every_payload_uses_only_keys_home_assistant_accepts():
    assert_home_assistant_accepts(messages())


def test_default_entity_id_and_origin_are_sent_and_keep_the_promised_ids():
    ids = set()
    for topic, config in messages():
        platform, node, key = topic.split("/")[1:4]
        assert config["default_entity_id"] == f"{platform}.hayakoe_pi_{key}"
        assert "object_id" not in config  # replaced by default_entity_id (2025.10), ignored since 2026.4
        assert config["origin"] == {"name": "hayakoe-pi", "sw_version": __version__}
        ids.add(config["default_entity_id"])
    assert ids == PROMISED


def test_an_old_client_id_gives_entity_ids_home_assistant_accepts():
    me = Config(mqtt=MqttConfig(client_id="Küche Pi #2")).identity()
    for _, config in discovery_messages(Topics("hk", me.id), me, [], []):
        domain, object_id = config["default_entity_id"].split(".")
        assert object_id.replace("_", "").isalnum() and object_id == object_id.lower() and object_id.isascii()


def test_each_pi_is_its_own_device_in_its_area():
    kitchen = messages(Config(device=DeviceConfig(id="kitchen-3fa2c1", name="Kitchen", area="Kitchen")))
    bedroom = messages(Config(device=DeviceConfig(id="bedroom", name="寝室")))
    for found in (kitchen, bedroom):
        assert_home_assistant_accepts(found)
    ids = [config["unique_id"] for _, config in kitchen + bedroom]
    assert len(set(ids)) == len(ids) == 20
    assert len({topic for topic, _ in kitchen + bedroom}) == 20
    _, say = kitchen[0]
    assert say["unique_id"] == "kitchen-3fa2c1_say" and say["default_entity_id"] == "notify.kitchen_3fa2c1_say"
    assert say["device"]["name"] == "Kitchen" and say["device"]["suggested_area"] == "Kitchen"
    assert say["command_topic"] == "hayakoe/kitchen-3fa2c1/say"  # the room's notify speaks in that room
    assert say["availability_topic"] == "hayakoe/kitchen-3fa2c1/status"
    _, say = bedroom[0]
    assert say["device"] == {**say["device"], "identifiers": ["bedroom"], "name": "寝室"}
    assert "suggested_area" not in say["device"]


# Value types and allowed values, as Home Assistant's voluptuous schemas check them (the same
# sources as the key lists above): a wrong type or value makes Home Assistant drop the entity.
TOPIC = "a topic (no wildcards)"
VALUES = {
    "name": str, "unique_id": str, "default_entity_id": str, "icon": str,
    "availability_topic": TOPIC, "command_topic": TOPIC, "state_topic": TOPIC,
    "payload_available": str, "payload_not_available": str, "payload_press": str,
    "qos": {0, 1, 2}, "min": float, "max": float, "step": float, "mode": {"auto", "box", "slider"},
    "unit_of_measurement": str, "options": list, "device": dict, "origin": dict,
    "payload_on": str, "payload_off": str, "state_on": str, "state_off": str,
    "entity_category": {"config", "diagnostic"},
    "state_class": {"measurement", "measurement_angle", "total", "total_increasing"},
    "device_class": str,  # one of the platform's classes: DEVICE_CLASSES below
}
# the device classes used here, each in its platform's list (SensorDeviceClass, BinarySensorDeviceClass),
# with the units Home Assistant accepts for it (sensor/const.py DEVICE_CLASS_UNITS)
DEVICE_CLASSES = {("sensor", "data_size"): {"bit", "kbit", "Mbit", "Gbit", "B", "kB", "MB", "GB", "TB", "PB", "EB",
                                            "ZB", "YB", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"},
                  ("binary_sensor", "problem"): {None}}


def check_value(key, value):
    kind = VALUES[key]
    if kind is TOPIC:
        return isinstance(value, str) and value and not set("+#") & set(value) and "\0" not in value
    if isinstance(kind, set):
        return value in kind and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def test_every_value_has_the_type_and_range_home_assistant_wants():
    for found in (messages(), messages(Config(device=DeviceConfig(id="kitchen", name="台所", area="Kitchen")))):
        for topic, config in found:
            platform = topic.split("/")[1]
            for key, value in config.items():
                assert check_value(key, value), (topic, key, value)
            assert config["icon"].startswith("mdi:")
            domain, object_id = config["default_entity_id"].split(".")
            assert domain == platform and object_id.isidentifier() and object_id == object_id.lower()
            if platform == "number":
                assert config["min"] < config["max"] and config["step"] > 0
            if platform == "select":
                assert all(isinstance(o, str) for o in config["options"])
            if "device_class" in config:
                units = DEVICE_CLASSES[platform, config["device_class"]]
                assert config.get("unit_of_measurement") in units, (topic, config.get("unit_of_measurement"))
            device = config["device"]
            assert all(isinstance(v, str) for v in device["identifiers"])
            assert all(isinstance(device[k], str) for k in device if k != "identifiers")
            assert all(isinstance(v, str) for v in config["origin"].values())


def test_disk_space_is_shown_by_two_diagnostic_entities_that_forget_clears():
    me = Config().identity()
    topics = Topics("hayakoe", me.id)
    by_id = {config["unique_id"]: config for _, config in messages()}
    free, low = by_id["hayakoe-pi_disk_free"], by_id["hayakoe-pi_disk_low"]
    assert free["state_topic"] == "hayakoe/hayakoe-pi/disk_free" and free["unit_of_measurement"] == "MB"
    assert low["state_topic"] == "hayakoe/hayakoe-pi/disk_low" and low["device_class"] == "problem"
    assert (low["payload_on"], low["payload_off"]) == ("ON", "OFF")
    assert free["entity_category"] == low["entity_category"] == "diagnostic"
    assert not any("entity_category" in c for c in by_id.values() if c not in (free, low))  # the others: controls
    assert {free["state_topic"], low["state_topic"]} <= set(retained_topics(topics, me))


def test_no_select_offers_an_option_home_assistant_shows_as_unknown(tmp_path):
    """Home Assistant's MQTT select takes a state equal to "none", in any case, for no option at
    all: it would show the chime as unknown whenever there is none (seen in Home Assistant
    2026.11, tools/ha-check). The options as the daemon sends them (reports.py)."""
    from hayakoe_pi.settings.announcements import AnnouncementSettings

    me = Config().identity()
    for configured in ("none", "off", "default", str(tmp_path / "bell.wav")):
        chimes = AnnouncementSettings(tmp_path / "announcements.json", configured, None).chime_options
        for _, config in discovery_messages(Topics("hayakoe", me.id), me, ["jvnv-F1-jp"], ["Neutral"], chimes):
            for option in config.get("options", []):
                assert option.lower() != "none", (config["unique_id"], config["options"])
