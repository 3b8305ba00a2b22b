"""Home Assistant MQTT discovery: one device per Pi, its entities, and the retained topics it leaves."""

from __future__ import annotations

import re

from .. import __version__
from ..sound.chime import CHOICES as CHIME_CHOICES
from ..settings.config import Identity
from .topics import ANNOUNCEMENT, SELECTION, Topics


def entity_slug(text: str) -> str:
    """As Home Assistant makes an object id into an entity id: lower case, underscores."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


# Who sends the discovery messages: Home Assistant's log names it for any problem with them.
ORIGIN = {"name": "hayakoe-pi", "sw_version": __version__}


def discovery_messages(topics: Topics, identity: Identity, voices: list[str],
                       styles: list[str], chimes: list[str] = CHIME_CHOICES) -> list[tuple[str, dict]]:
    """(topic, config) for each Home Assistant entity of this Pi's device."""
    node = identity.id
    device = {
        "identifiers": [node], "name": identity.name, "manufacturer": "hayakoe-pi",
        "model": "Offline Japanese TTS (Style-Bert-VITS2)", "sw_version": __version__,
    }
    if identity.area:
        device["suggested_area"] = identity.area
    common = {
        "availability_topic": topics.status, "payload_available": "online",
        "payload_not_available": "offline", "device": device,
    }

    def entity(component: str, key: str, name: str, **fields) -> tuple[str, dict]:
        # default_entity_id (Home Assistant 2025.10 and later, the oldest the README supports) names
        # the entity; object_id, which it replaced, is no longer sent
        config = {"name": name, "unique_id": f"{node}_{key}",
                  "default_entity_id": f"{component}.{entity_slug(node)}_{key}", "origin": ORIGIN,
                  **common, **fields}
        return f"{topics.discovery_prefix}/{component}/{node}/{key}/config", config

    return [
        entity("notify", "say", "Say", command_topic=topics.room_say, qos=1, icon="mdi:account-voice"),
        entity("sensor", "state", "State", state_topic=topics.state, icon="mdi:speaker"),
        entity("number", "volume", "Volume", command_topic=topics.setting_set("volume"),
               state_topic=topics.setting("volume"), min=0, max=100, step=1, mode="slider",
               unit_of_measurement="%", qos=1, icon="mdi:volume-high"),
        entity("select", "voice", "Voice", command_topic=topics.setting_set("voice"),
               state_topic=topics.setting("voice"), options=voices, qos=1, icon="mdi:account-music"),
        entity("select", "style", "Style", command_topic=topics.setting_set("style"),
               state_topic=topics.setting("style"), options=styles, qos=1, icon="mdi:emoticon"),
        entity("button", "stop", "Stop", command_topic=topics.room_stop, payload_press="stop", qos=1,
               icon="mdi:stop"),
        entity("select", "chime", "Chime", command_topic=topics.setting_set("chime"),
               state_topic=topics.setting("chime"), options=list(chimes), qos=1, icon="mdi:bell-ring"),
        entity("switch", "quiet_hours", "Quiet hours", command_topic=topics.setting_set("quiet_hours"),
               state_topic=topics.setting("quiet_hours"), payload_on="ON", payload_off="OFF", state_on="ON",
               state_off="OFF", qos=1, icon="mdi:weather-night"),
        # where the phrase cache and the state files are written (diskspace.py)
        entity("sensor", "disk_free", "Free disk space", state_topic=topics.disk_free, unit_of_measurement="MB",
               device_class="data_size", state_class="measurement", entity_category="diagnostic",
               icon="mdi:harddisk"),
        entity("binary_sensor", "disk_low", "Disk space low", state_topic=topics.disk_low, payload_on="ON",
               payload_off="OFF", device_class="problem", entity_category="diagnostic",
               icon="mdi:harddisk-remove"),
    ]


def retained_topics(topics: Topics, identity: Identity) -> list[str]:
    """Every topic this Pi publishes retained: its discovery configs, status, state, settings, disk space."""
    return [topic for topic, _ in discovery_messages(topics, identity, [], [])] + \
        [topics.status, topics.state, *(topics.setting(s) for s in SELECTION + ANNOUNCEMENT), topics.disk_free,
         topics.disk_low]
