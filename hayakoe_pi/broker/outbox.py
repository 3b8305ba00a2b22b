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
from collections import OrderedDict

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

from ..bounds import MAX_PUBLISH_BYTES, bounded_payload

log = logging.getLogger("hayakoe_pi.mqtt")

_QUEUED = (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN)  # paho keeps (or sent) it


class Outbox:
    REFUSALS = 2  # connections the broker closed while one publish stayed unconfirmed: it refuses that one

    def __init__(self, client: paho.Client):
        self.client = client
        self.limit = MAX_PUBLISH_BYTES  # lowered below a publish the broker refused
        self._lock = threading.Lock()
        # QoS 1 publishes the broker has not acknowledged, oldest first: packet id -> (topic, size).
        # From paho's on_publish: a MQTTMessageInfo queued while disconnected cannot be asked.
        self._unconfirmed: OrderedDict[int, tuple[str, int]] = OrderedDict()
        self._early: set[int] = set()  # acknowledged before publish() had noted them
        self._stuck: int | None = None  # the oldest unconfirmed publish at the last reconnect ...
        self._drops = 0                 # ... and at how many in a row
        self._said: set[tuple[str, str]] = set()  # (what, topic): said once
        client.on_publish = self._acknowledged

    def publish(self, topic: str, payload, retain: bool, qos: int, cuttable: bool) -> paho.MQTTMessageInfo | None:
        """Send within the bound: an event (`cuttable`) cut to fit, anything else too large not at all (None)."""
        data, cut = bounded_payload(payload, cuttable, self.limit)
        if data is None:
            self._say_once("not sent", topic, f"not publishing on {topic}: over {self.limit} bytes")
            return None
        if cut:
            self._say_once("cut", topic, f"an event on {topic} was cut to {len(data)} bytes (limit {self.limit})")
        info = self.client.publish(topic, data, qos=qos, retain=retain)
        if qos and info.rc in _QUEUED:
            with self._lock:  # never held while calling paho: its network thread may wait for it
                if info.mid in self._early:
                    self._early.discard(info.mid)
                else:
                    self._unconfirmed[info.mid] = (topic, len(data))
        return info

    def _acknowledged(self, client, userdata, mid, reason_code, properties) -> None:
        with self._lock:
            if self._unconfirmed.pop(mid, None) is None:
                self._early.add(mid)

    def _say_once(self, what: str, topic: str, line: str) -> None:
        if (what, topic) not in self._said:
            self._said.add((what, topic))
            log.warning("%s", line)

    def reconnected(self) -> bool:
        """At the reconnect after the broker closed the connection, before paho sends its queue
        again: True when a publish was left unconfirmed (the broker may have closed it for that
        one: no sign of another device with our client id). The same one left at REFUSALS drops
        in a row leaves paho's queue; the rest is sent again."""
        with self._lock:
            oldest = next(iter(self._unconfirmed), None)
            if oldest is not None and oldest == self._stuck:
                self._drops += 1
            else:
                self._stuck, self._drops = oldest, int(oldest is not None)
            if self._drops < self.REFUSALS:
                return oldest is not None
            topic, size = self._unconfirmed[oldest]
            self._stuck, self._drops = None, 0
            self.limit = min(self.limit, size - 1)
            kept = [m for m in self.client.drop_out_messages() if m.mid != oldest]
            self._unconfirmed.clear()
        log.error("the MQTT broker closed the connection each time this device sent a message of %d bytes on %s "
                  "(is its max_packet_size smaller?): dropped it; events are cut to %d bytes from now on",
                  size, topic, self.limit)
        for m in kept:
            self.publish(m.topic, m.payload, m.retain, m.qos, cuttable=False)
        return True
