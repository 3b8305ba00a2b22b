"""What the control connection sends: every publish within the bound and within what the broker
takes, and none the broker keeps refusing left in paho's queue.

A broker closes the connection on a packet over its max_packet_size. The link speaks MQTT 3.1.1
(its persistent sessions are 3.1.1's), where the broker says nothing about it: mosquitto 2.0 names
its limit in CONNACK and answers "packet too large" only to an MQTT 5 client. paho sends every
unconfirmed QoS 1 packet again at every reconnect, so the connection would fall each time, for
ever, and look like another device taking the session (BrokerLink's clash detector).

The bound (bounds.MAX_PUBLISH_BYTES) keeps that from happening with the installer's broker. For a
stricter one, the refused packet is found by its size, not by its place in the queue: the broker
takes packets in order, but it closes with the refused one unread, which resets the connection,
and the acknowledgements of those ahead of it that paho had not read yet are lost: they are
unconfirmed too, and smaller. The suspect is the largest unconfirmed packet, if it is
larger than any the broker acknowledged (else the drop was no refusal). The same one at REFUSALS
drops in a row (one, once the broker has refused a packet) leaves paho's queue, is said once,
and nothing that large is sent again; the rest is sent again. The limit never goes under the
largest packet the broker acknowledged.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

from ..bounds import MAX_PUBLISH_BYTES, bounded_payload

log = logging.getLogger("hayakoe_pi.mqtt")

_QUEUED = (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN)  # paho keeps (or sent) it


def packet_size(topic: str, payload_bytes: int) -> int:
    """A QoS 1 PUBLISH on the wire (MQTT 3.1.1), as max_packet_size counts it (mosquitto 2.0
    counts the length field as one byte: up to 3 fewer)."""
    remaining = 2 + len(topic.encode("utf-8")) + 2 + payload_bytes  # topic length, topic, packet id
    length_field = next(n for n in (1, 2, 3, 4) if remaining < 128 ** n)
    return 1 + length_field + remaining


class Outbox:
    # connections the broker closed while the same packet was the suspect: it refuses that one (a
    # network drop meanwhile is not taken for a refusal). Once it has refused one, one drop is enough:
    # each config over the limit would cost two more drops otherwise, at every start of the service.
    REFUSALS = 2

    def __init__(self, client: paho.Client):
        self.client = client
        self.packet_limit: int | None = None  # under the smallest packet the broker refused (None: none yet)
        self._confirmed = 0  # the largest packet the broker acknowledged: it takes at least that
        self._lock = threading.Lock()
        # QoS 1 publishes the broker has not acknowledged, oldest first: packet id -> (topic, packet size).
        # From paho's on_publish: a MQTTMessageInfo queued while disconnected cannot be asked.
        self._unconfirmed: OrderedDict[int, tuple[str, int]] = OrderedDict()
        self._early: dict[int, None] = {}  # acknowledged before publish() had noted them
        self._dropped: set[int] = set()  # taken out of paho's queue (and sent again) before publish() noted them
        self._cuttable: set[str] = set()  # topics of events: cut to fit when sent again
        self._suspect: int | None = None  # the packet blamed at the last reconnect ...
        self._drops = 0                   # ... and at how many in a row
        self._said: set[tuple[str, str]] = set()  # (what, topic): said once
        client.on_publish = self._acknowledged

    def payload_limit(self, topic: str) -> int:
        """The largest payload sent on `topic`: the bound, or less if the broker takes less."""
        if self.packet_limit is None:
            return MAX_PUBLISH_BYTES
        payload = max(0, self.packet_limit - packet_size(topic, 0))
        while payload and packet_size(topic, payload) > self.packet_limit:  # a longer length field
            payload -= 1
        return min(MAX_PUBLISH_BYTES, payload)

    def publish(self, topic: str, payload, retain: bool, qos: int, cuttable: bool) -> paho.MQTTMessageInfo | None:
        """Send within the bound: an event (`cuttable`) cut to fit, anything else too large not at all (None)."""
        limit = self.payload_limit(topic)
        data, cut = bounded_payload(payload, cuttable, limit)
        if data is None:
            whose = "" if limit == MAX_PUBLISH_BYTES else " (what the broker takes)"
            self._say_once("not sent", topic, f"not publishing on {topic}: over {limit} bytes{whose}")
            return None
        if cut:
            self._say_once("cut", topic, f"an event on {topic} was cut to {len(data)} bytes (limit {limit})")
        if cuttable:
            self._cuttable.add(topic)
        info = self.client.publish(topic, data, qos=qos, retain=retain)
        if qos and info.rc in _QUEUED:
            size = packet_size(topic, len(data))
            with self._lock:  # never held while calling paho: its network thread may wait for it
                if info.mid in self._early:
                    del self._early[info.mid]
                    self._confirmed = max(self._confirmed, size)
                elif info.mid in self._dropped:
                    self._dropped.discard(info.mid)
                else:
                    self._unconfirmed[info.mid] = (topic, size)
        return info

    def _acknowledged(self, client, userdata, mid, reason_code, properties) -> None:
        with self._lock:
            noted = self._unconfirmed.pop(mid, None)
            if noted is None:
                self._early[mid] = None
                while len(self._early) > 1000:  # QoS 0 ones are never noted
                    del self._early[next(iter(self._early))]
            else:
                self._confirmed = max(self._confirmed, noted[1])

    def _say_once(self, what: str, topic: str, line: str) -> None:
        if (what, topic) not in self._said:
            self._said.add((what, topic))
            log.warning("%s", line)

    def _largest_unconfirmed(self) -> int | None:
        """The packet the broker may have refused: the largest unconfirmed (the oldest of those as
        large), if larger than any it acknowledged."""
        suspect, largest = None, self._confirmed
        for mid, (_, size) in self._unconfirmed.items():
            if size > largest:
                suspect, largest = mid, size
        return suspect

    def reconnected(self, broker_was_away: bool = False) -> bool:
        """At the reconnect after the connection fell, before paho sends its queue again: True
        when the broker may have closed it for a packet it refused (no sign of another device with
        our client id). The same suspect at REFUSALS drops in a row leaves paho's queue; the rest
        is sent again. `broker_was_away`: a connect failed since the drop (a restart, perhaps with
        another limit): what it acknowledged before proves nothing now."""
        with self._lock:
            if broker_was_away:
                self._confirmed, self._suspect, self._drops = 0, None, 0
                return False
            suspect = self._largest_unconfirmed()
            if suspect is None:
                self._suspect, self._drops = None, 0
                return False
            if suspect == self._suspect:
                self._drops += 1
            else:
                self._suspect, self._drops = suspect, 1
            if self._drops < (self.REFUSALS if self.packet_limit is None else 1):
                return True
            topic, size = self._unconfirmed[suspect]
            self._suspect, self._drops = None, 0
            queued = self.client.drop_out_messages()
            refused = any(m.mid == suspect for m in queued)  # else it had left paho's queue: not to blame
            event = topic in self._cuttable  # sent again, cut to fit
            if refused:
                self.packet_limit = max(self._confirmed, min(self.packet_limit or size, size - 1))
                if not event:
                    self._said.add(("not sent", topic))  # the line below says it
            kept = [m for m in queued if m.mid != suspect or event]
            self._dropped = {m.mid for m in kept} - set(self._unconfirmed)  # publish() has yet to note them
            self._unconfirmed.clear()
        if refused:
            log.error("the MQTT broker closed the connection each time this device sent a packet of %d bytes on %s "
                      "(its max_packet_size is smaller): %s; packets are held to %d bytes from now on "
                      "(events cut to fit, larger retained messages not sent) until this service restarts",
                      size, topic, "cut it to fit" if event else "dropped it", self.packet_limit)
        for m in kept:
            self._send_again(m)
        return True

    def _send_again(self, message: paho.MQTTMessage) -> None:
        """A publish taken out of paho's queue, sent again within the limit (an event cut to fit)."""
        payload, cuttable = message.payload, message.topic in self._cuttable
        if cuttable:
            try:
                payload = json.loads(payload)
            except ValueError:
                cuttable = False
        self.publish(message.topic, payload, message.retain, message.qos, cuttable)
