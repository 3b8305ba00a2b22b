"""MQTT topic names: the household's, this Pi's own, and Home Assistant's birth topic.

    household (every Pi acts on it)   <prefix>/say, /stop, /prepare, /dictionary/add|remove
    this Pi only                      <prefix>/<device.id>/say, /stop, /prepare, /<setting>/set
                                      (settings: volume, voice, style, chime, quiet_hours)
    what this Pi publishes            <prefix>/<device.id>/status, /state, /event, /<setting>,
                                      /disk_free, /disk_low (diskspace.py)
"""

from __future__ import annotations

SELECTION = ("volume", "voice", "style")  # what Home Assistant sets and sees (retained)
ANNOUNCEMENT = ("chime", "quiet_hours")  # the same, for announcements (announcements.py)


class Topics:
    """All topic names of one Pi, under the configured prefixes."""

    def __init__(self, prefix: str, device_id: str, discovery_prefix: str = "homeassistant",
                 birth_topic: str = "homeassistant/status"):
        self.prefix = prefix
        self.discovery_prefix = discovery_prefix
        self.own = f"{prefix}/{device_id}"
        # the household's: every Pi on the broker takes them
        self.say = f"{prefix}/say"
        self.stop = f"{prefix}/stop"
        self.prepare = f"{prefix}/prepare"
        self.dictionary_add = f"{prefix}/dictionary/add"
        self.dictionary_remove = f"{prefix}/dictionary/remove"
        # this Pi's alone
        self.room_say = f"{self.own}/say"
        self.room_stop = f"{self.own}/stop"
        self.room_prepare = f"{self.own}/prepare"
        self.status = f"{self.own}/status"
        self.state = f"{self.own}/state"
        self.event = f"{self.own}/event"
        self.disk_free = f"{self.own}/disk_free"  # MB free where the service writes (retained)
        self.disk_low = f"{self.own}/disk_low"  # ON / OFF (retained)
        self.ha_status = birth_topic  # Home Assistant's birth message: `online` when it (re)starts

    def setting(self, name: str) -> str:
        """Retained state topic of a setting (volume, voice, style, chime, quiet_hours)."""
        return f"{self.own}/{name}"

    def setting_set(self, name: str) -> str:
        return f"{self.own}/{name}/set"

    def requests(self) -> list[str]:
        """What the intake subscribes to: say and prepare, the household's and this Pi's."""
        return [self.say, self.prepare, self.room_say, self.room_prepare]

    def commands(self) -> list[str]:
        """What the control connection subscribes to."""
        return [self.stop, self.room_stop, *(self.setting_set(s) for s in SELECTION + ANNOUNCEMENT),
                self.dictionary_add,
                self.dictionary_remove, self.ha_status]

    def before_rooms(self) -> list[str]:
        """What a session of an older version subscribed to and no longer belongs to the control
        connection: say and prepare (the intake's now), the settings without a device."""
        return [self.say, self.prepare, *(f"{self.prefix}/{s}/set" for s in SELECTION)]

    def before_rooms_retained(self) -> list[str]:
        """What a single Pi of an older version kept retained without a device in the topic."""
        return [f"{self.prefix}/{name}" for name in ("status", "state", *SELECTION)]
