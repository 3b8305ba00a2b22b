"""Home Assistant MQTT discovery payloads against the keys Home Assistant's schemas accept.

The lists are written out from Home Assistant Core's MQTT integration
(homeassistant/components/mqtt/: schemas.py MQTT_ENTITY_COMMON_SCHEMA with
`default_entity_id` (2025.10 and later), config.py MQTT_RW_SCHEMA/MQTT_RO_SCHEMA,
and each platform's schema), read for Home Assistant 2025.10–2026.x. Discovery
drops unknown keys silently (REMOVE_EXTRA), so a misspelled key would only
show as a feature that does not work: hence this test.
"""

from hayakoe_pi import __version__
from hayakoe_pi.mqtt import Topics, discovery_messages

COMMON = {
    "availability", "availability_mode", "availability_template", "availability_topic", "default_entity_id",
    "device", "enabled_by_default", "entity_category", "entity_picture", "icon", "json_attributes_template",
    "json_attributes_topic", "message_expiry_interval", "name", "origin", "payload_available",
    "payload_not_available", "unique_id", "visible_by_default",
    "object_id",  # Home Assistant before 2025.10 (deprecated there, ignored from 2026.4): same entity ids
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
}
REQUIRED = {"notify": {"command_topic"}, "sensor": {"state_topic"}, "number": {"command_topic"},
            "select": {"command_topic", "options"}, "button": {"command_topic"}}
DEVICE = {"configuration_url", "connections", "hw_version", "identifiers", "manufacturer", "model", "model_id",
          "name", "serial_number", "suggested_area", "sw_version", "via_device"}
ORIGIN = {"name", "support_url", "sw_version"}

# the entity ids the README promises (default client id hayakoe-pi)
PROMISED = {"notify.hayakoe_pi_say", "sensor.hayakoe_pi_state", "number.hayakoe_pi_volume",
            "select.hayakoe_pi_voice", "select.hayakoe_pi_style", "button.hayakoe_pi_stop"}


def messages():
    return discovery_messages(Topics("hayakoe", "homeassistant"), "hayakoe-pi", ["jvnv-F1-jp"], ["Neutral"])


def test_every_payload_uses_only_keys_home_assistant_accepts():
    for topic, config in messages():
        platform = topic.split("/")[1]
        unknown = set(config) - COMMON - PLATFORM[platform]
        assert not unknown, (topic, unknown)
        assert REQUIRED[platform] <= set(config), topic
        assert set(config["device"]) <= DEVICE and config["device"]["identifiers"]
        assert set(config["origin"]) <= ORIGIN


def test_default_entity_id_and_origin_are_sent_and_keep_the_promised_ids():
    ids = set()
    for topic, config in messages():
        platform, node, key = topic.split("/")[1:4]
        assert config["default_entity_id"] == f"{platform}.hayakoe_pi_{key}"
        assert config["object_id"] == f"{node}_{key}"  # older Home Assistant: slugified to the same id
        assert config["origin"] == {"name": "hayakoe-pi", "sw_version": __version__}
        ids.add(config["default_entity_id"])
    assert ids == PROMISED


def test_another_client_id_gives_entity_ids_home_assistant_accepts():
    for _, config in discovery_messages(Topics("hk", "homeassistant"), "Küche Pi #2", [], []):
        domain, object_id = config["default_entity_id"].split(".")
        assert object_id.replace("_", "").isalnum() and object_id == object_id.lower() and object_id.isascii()
