"""What the daemon tells the broker: events (each naming this Pi), status, state, settings, discovery."""

from __future__ import annotations

import logging

from ..settings.config import Identity
from ..broker.discovery import discovery_messages
from .diskspace import DiskWatch
from ..broker.link import BrokerLink
from ..broker.payloads import error_event
from ..speech.service import SpeechService
from ..settings.announcements import AnnouncementSettings
from ..broker.topics import ANNOUNCEMENT, SELECTION, Topics

log = logging.getLogger("hayakoe_pi")


class Reports:
    """Publishes under this Pi's own topics; none of it blocks (paho queues it)."""

    def __init__(self, link: BrokerLink, topics: Topics, identity: Identity, speech: SpeechService,
                 announcements: AnnouncementSettings, disk: DiskWatch):
        self.link, self.topics, self.identity, self.speech = link, topics, identity, speech
        self.announcements, self.disk = announcements, disk

    def event(self, payload: dict) -> None:
        """An event on this Pi's event topic; every event names the Pi, for automations that
        listen to several (hayakoe/+/event)."""
        self.link.publish(self.topics.event, {"event": payload["event"], "device": self.identity.id, **payload})

    def error(self, reason: str, request_id: str | None = None, text: str | None = None, code: str = "") -> None:
        answer = error_event(reason, request_id, text, code)
        log.warning("error%s: %s", f" ({request_id!r})" if request_id else "", answer["error"])  # cut as sent
        self.event(answer)

    def online(self, busy: bool) -> None:
        """Everything retained, (again) on each connect: status, state, settings and the device."""
        self.link.publish(self.topics.status, "online", retain=True)
        if self.identity.legacy:  # an older version's retained topics without the device: stale now
            for topic in self.topics.before_rooms_retained():
                self.link.publish(topic, b"", retain=True)
        self.state("speaking" if busy else "idle")
        self.selection()
        self.disk_space(force=True)
        self.discovery()

    def state(self, state: str) -> None:
        self.link.publish(self.topics.state, state, retain=True)

    def disk_space(self, force: bool = False) -> None:
        """Free space where the service writes: on connect, then when it changed meaningfully (DiskWatch)."""
        figures = self.disk.figures(force)
        if figures is not None:
            free_mb, low = figures
            self.link.publish(self.topics.disk_free, str(free_mb), retain=True)
            self.link.publish(self.topics.disk_low, "ON" if low else "OFF", retain=True)

    def selection(self) -> None:
        for name in SELECTION:
            self.link.publish(self.topics.setting(name), self.speech.shown(name), retain=True)
        for name in ANNOUNCEMENT:
            self.link.publish(self.topics.setting(name), self.announcements.shown(name), retain=True)

    def discovery(self) -> None:
        styles = self.speech.styles(self.speech.current_voice())
        for topic, config in discovery_messages(self.topics, self.identity, self.speech.voices(), styles,
                                                self.announcements.chime_options):
            self.link.publish(topic, config, retain=True)
