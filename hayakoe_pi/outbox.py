"""What the control connection sends: every publish within the bound, and none the broker keeps
refusing left in paho's queue.

A broker closes the connection on a packet it refuses (one over its max_packet_size), without a
word; paho sends the same QoS 1 packet again at every reconnect, so the connection would fall
every time, for ever, and look like another device taking the session (BrokerLink's clash
detector). The bound (bounds.MAX_PUBLISH_BYTES) keeps that from happening with the installer's
broker; for a stricter one, a publish still unconfirmed at REFUSALS drops in a row is taken out
of paho's queue, said once, and nothing that large is sent again.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

from .bounds import MAX_PUBLISH_BYTES, bounded_payload

log = logging.getLogger("hayakoe_pi.mqtt")

_QUEUED = (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN)  # paho keeps (or sent) it


class Outbox:
    REFUSALS = 2  # connections the broker closed while one publish stayed unconfirmed: it refuses that one

    def __init__(self, client: paho.Client):
        self.client = client
        self.limit = MAX_PUBLISH_BYTES  # lowered below a publish the broker refused
        self._lock = threading.Lock()
        self._unconfirmed: deque = deque()  # (info, topic, size) of QoS 1 publishes, oldest first
        self._stuck = None  # the oldest unconfirmed publish at the last drop ...
        self._drops = 0     # ... and at how many drops in a row
        self._said: set[tuple[str, str]] = set()  # (what, topic): said once

    def publish(self, topic: str, payload, retain: bool, qos: int, cuttable: bool) -> paho.MQTTMessageInfo | None:
        """Send within the bound: an event (`cuttable`) cut to fit, anything else too large not at all (None)."""
        data, cut = bounded_payload(payload, cuttable, self.limit)
        if data is None:
            self._say_once("not sent", topic, f"not publishing on {topic}: over {self.limit} bytes")
            return None
        if cut:
            self._say_once("cut", topic, f"an event on {topic} was cut to {len(data)} bytes (limit {self.limit})")
        with self._lock:  # noted before the network thread can see the connection fall on it
            info = self.client.publish(topic, data, qos=qos, retain=retain)
            if qos and info.rc in _QUEUED:
                self._forget_confirmed()
                self._unconfirmed.append((info, topic, len(data)))
        return info

    def _say_once(self, what: str, topic: str, line: str) -> None:
        if (what, topic) not in self._said:
            self._said.add((what, topic))
            log.warning("%s", line)

    def _forget_confirmed(self) -> None:
        while self._unconfirmed and self._unconfirmed[0][0].is_published():
            self._unconfirmed.popleft()

    def dropped(self) -> bool:
        """The broker closed the connection: True when a publish was unconfirmed then (the broker
        may have closed it for that one: not a sign of another device with our client id)."""
        with self._lock:
            self._forget_confirmed()
            oldest = self._unconfirmed[0] if self._unconfirmed else None
            if oldest is not None and oldest is self._stuck:
                self._drops += 1
            else:
                self._stuck, self._drops = oldest, int(oldest is not None)
            return oldest is not None

    def drop_refused(self) -> None:
        """At a reconnect, before paho sends its queue again: the publish the broker closed the
        connection on REFUSALS times in a row leaves paho's queue; the rest is sent again."""
        with self._lock:
            if self._drops < self.REFUSALS:
                return
            info, topic, size = self._stuck
            self._stuck, self._drops = None, 0
            self.limit = min(self.limit, size - 1)
            kept = [m for m in self.client.drop_out_messages() if m.mid != info.mid]
            self._unconfirmed.clear()
        log.error("the MQTT broker closed the connection each time this device sent a message of %d bytes on %s "
                  "(is its max_packet_size smaller?): dropped it; events are cut to %d bytes from now on",
                  size, topic, self.limit)
        for m in kept:
            self.publish(m.topic, m.payload, m.retain, m.qos, cuttable=False)
