"""The broker connections: the daemon's two persistent sessions, `check`'s probe and `forget`."""

from __future__ import annotations

import functools
import hashlib
import logging
import random
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from ..settings.config import Config, MqttConfig
from .discovery import retained_topics
from .outbox import Outbox
from .topics import Topics

log = logging.getLogger("hayakoe_pi.mqtt")


def _never_raises(callback):
    """For a paho callback: an exception there would end up in paho's network thread and leave
    the link alive but deaf (seen: a bad value in the state file at connect); logged instead."""
    @functools.wraps(callback)
    def guarded(self, *args):
        try:
            return callback(self, *args)
        except Exception:
            log.exception("error in the MQTT callback %s", callback.__name__)

    return guarded


def _client(mqtt_config: MqttConfig, client_id: str, clean_session: bool,
            manual_ack: bool = False) -> paho.Client:
    """A client with the configured credentials and TLS."""
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean_session,
                    protocol=paho.MQTTv311, manual_ack=manual_ack)
    if mqtt_config.username is not None:
        c.username_pw_set(mqtt_config.username, mqtt_config.password)
    tls = mqtt_config.tls
    if tls.enabled:
        c.tls_set(ca_certs=tls.ca_file, cert_reqs=ssl.CERT_REQUIRED)
        c.tls_insecure_set(bool(tls.insecure))
    return c


class BrokerLink:
    """Two persistent-session connections to the broker, each reconnecting by itself.

    Fixed client ids and clean_session off: the broker keeps the QoS 1
    subscriptions and queues messages while the daemon is away.

    - control (the configured client id): the commands (stop, voice, style,
      volume, Home Assistant's birth message), everything the daemon
      publishes, and the last will;
    - intake (`<client id>-intake`): `say` and `prepare` (the household's and this
      Pi's own), acknowledged by hand
      (paho's manual_ack) once the request has its last event. Until then the
      broker keeps the message and hands it back after a reconnect or a restart
      of the daemon; its in-flight window (mosquitto's max_inflight_messages,
      20) holds the rest back. On a connection of their own, requests waiting
      in that window never hold back a command.

    Two devices with one client id (an SD card cloned after the install) take
    the session from each other at every connect: the broker closes the older
    connection, which reconnects and closes the other's. Seen as connections
    the broker keeps closing soon after accepting them while it is there all
    along (the reconnect succeeds at once: not a broker restart), it is said
    once, and both connections then wait CLASH_DELAY seconds (random, so the
    two devices drift apart) before reconnecting, instead of fighting every second.
    """

    QUICK_DROP_SECONDS = 5.0  # a connection closed this soon after it was accepted, the broker still up ...
    QUICK_DROPS = 3           # ... this many times in a row: another device has our client id
    CLASH_DELAY = (30.0, 90.0)
    STABLE_SECONDS = 300.0     # a connection that lasted this long ends the suspicion

    def __init__(self, mqtt_config: MqttConfig, client_id: str, topics: Topics,
                 on_command: Callable[[str, bytes], None],
                 on_request: Callable[[str, bytes, Callable[[], None], int, bool], None],
                 on_connected: Callable[[], None]):
        self.config = mqtt_config
        self.topics = topics
        self._on_command = on_command
        self._on_request = on_request
        self._on_connected = on_connected
        self.connected = False
        self._stopping = False
        self._intake_started = False
        self._intake_ready = False  # subscribed once: its session (and subscriptions) then live in the broker
        self._announce_when_subscribed = False
        self._lock = threading.Lock()
        self._held: dict = {}  # requests handed on, not yet acknowledged: (packet id, topic, payload hash)
        self._done: OrderedDict = OrderedDict()  # lately acknowledged, by the same key
        self.client_id = client_id
        self._connected_at = 0.0
        self._dropped_after: float | None = None  # how long the last connection lived, until the next
        self._broker_away = False  # a reconnect failed since that drop
        self._quick_drops = 0
        self.clash = False  # the broker keeps handing our session to another device
        self._retained_seen: set[str] = set()  # command topics whose retained copy was said to be ignored
        self.client = self._make(client_id, self._connected, self._command)
        self.client.will_set(topics.status, "offline", qos=1, retain=True)
        self.client.max_queued_messages_set(1000)
        self.outbox = Outbox(self.client)
        self.intake = self._make(f"{client_id}-intake", self._intake_connected, self._request,
                                 manual_ack=True)
        self.intake.on_subscribe = self._intake_subscribed

    def _make(self, client_id: str, on_connect, on_message, manual_ack: bool = False) -> paho.Client:
        c = _client(self.config, client_id, clean_session=False, manual_ack=manual_ack)
        c.reconnect_delay_set(min_delay=1, max_delay=60)
        c.on_connect = on_connect
        c.on_disconnect = self._disconnected
        c.on_connect_fail = self._connect_failed
        c.on_message = on_message
        return c

    @property
    def where(self) -> str:
        return self.config.where

    def start(self) -> None:
        """Connect; the intake follows once the control connection is accepted (wrong
        credentials or a broker away: the broker is tried by one connection only)."""
        log.info("connecting to MQTT broker %s as %s", self.where, self.client_id)
        self._begin(self.client)

    def _begin(self, c: paho.Client) -> None:
        c.connect_async(self.config.host, self.config.port, self.config.keepalive)
        c.loop_start()

    def stop(self) -> None:
        self._stopping = True
        if self.connected and (offline := self.publish(self.topics.status, "offline", retain=True)):
            offline.wait_for_publish(2)
        for c in (self.intake, self.client):
            c.disconnect()
            if c is self.client or self._intake_started:
                c.loop_stop()

    def publish(self, topic: str, payload, retain: bool = False, qos: int = 1):
        """Every publish of the daemon passes here: within the bound, events cut to fit (Outbox)."""
        return self.outbox.publish(topic, payload, retain, qos, cuttable=topic == self.topics.event)

    # paho callbacks (network threads) ------------------------------------------------

    def _refused(self, client, reason_code) -> bool:
        if not reason_code.is_failure:
            return False
        if client is self.client:  # the intake is refused for the same reason: said once
            hint = ": check mqtt.username and mqtt.password" if reason_code.value in (4, 5, 134, 135) else ""
            log.error("MQTT broker %s refused the connection (%s)%s; retrying", self.where, reason_code, hint)
        return True

    @_never_raises
    def _connected(self, client, userdata, flags, reason_code, properties) -> None:
        if self._refused(client, reason_code):
            return
        self.connected = True
        self._connected_at = time.monotonic()
        if self._dropped_after is not None:
            self._note_drop(self._dropped_after, self._broker_away,
                            refusing=self.outbox.reconnected(self._broker_away))
            self._dropped_after = None
        log.info("connected to MQTT broker %s (session %s)", self.where,
                 "resumed" if flags.session_present else "new")
        # a session of an older version took say/prepare and the settings without a device here
        client.unsubscribe(self.topics.before_rooms())
        client.subscribe([(t, 1) for t in self.topics.commands()])
        with self._lock:
            announce = self._intake_ready
            self._announce_when_subscribed = not announce
            start_intake, self._intake_started = not self._intake_started, True
        if start_intake:
            self._begin(self.intake)
        if announce:
            self._on_connected()

    @_never_raises
    def _intake_connected(self, client, userdata, flags, reason_code, properties) -> None:
        if not self._refused(client, reason_code):
            client.subscribe([(t, 1) for t in self.topics.requests()])

    @_never_raises
    def _intake_subscribed(self, client, userdata, mid, reason_codes, properties) -> None:
        # `online` only once requests can be received: a say sent on seeing it is not missed
        with self._lock:
            first, self._intake_ready = not self._intake_ready, True
            announce, self._announce_when_subscribed = self._announce_when_subscribed, False
        if first and announce:
            self._on_connected()

    @_never_raises
    def _disconnected(self, client, userdata, flags, reason_code, properties) -> None:
        if client is self.client:
            if self.connected and not self._stopping:
                log.warning("disconnected from MQTT broker %s (%s); reconnecting", self.where, reason_code)
                self._dropped_after, self._broker_away = time.monotonic() - self._connected_at, False
            self.connected = False

    def _note_drop(self, lived: float, broker_away: bool, refusing: bool = False) -> None:
        """At a reconnect: count connections the broker closed soon after accepting them while it
        stayed up; at QUICK_DROPS in a row, say that another device has this client id (once) and
        reconnect slowly. A drop with a publish unconfirmed larger than any the broker took is not
        counted: the broker may have refused that one (Outbox), which is no sign of another device."""
        if refusing:
            return
        if broker_away or lived >= self.STABLE_SECONDS or (not self.clash and lived >= self.QUICK_DROP_SECONDS):
            self._quick_drops = 0
            if self.clash:
                self.clash = False
                self._set_reconnect_delay(1, 60)
            return
        self._quick_drops += 1
        if self._quick_drops < self.QUICK_DROPS or self.clash:
            return
        self.clash = True
        log.error("the MQTT broker %s keeps closing this device's connection right after accepting it: "
                  "another device most likely uses the same client id %s (device.id in its config; an SD "
                  "card cloned after the install keeps it). Give this one its own: set device.id (a-z, 0-9, "
                  "_ and -) in the config, e.g. `device: {id: kitchen}`, then restart it. Until then it "
                  "reconnects only every %g-%g s", self.where, self.client_id, *self.CLASH_DELAY)
        self._set_reconnect_delay(*self.CLASH_DELAY)

    def _set_reconnect_delay(self, low: float, high: float) -> None:
        delay = random.uniform(low, high)
        for c in (self.client, self.intake):
            c.reconnect_delay_set(min_delay=delay, max_delay=max(60, delay))

    @_never_raises
    def _connect_failed(self, client, userdata) -> None:
        if client is self.client:
            self._broker_away = True
            log.warning("cannot reach MQTT broker %s; retrying (is it running? check mqtt.host/port)",
                        self.where)

    def _command(self, client, userdata, message) -> None:
        if message.retain and message.topic != self.topics.ha_status:
            # The broker hands a retained command out again on every (re)subscription, i.e. after
            # each reconnect: an old message, not a new command (a stop would cancel the queue
            # again). Home Assistant's birth message is retained on purpose.
            self._ignore_retained(message.topic)
            return
        try:
            self._on_command(message.topic, message.payload)
        except Exception:  # never let one message kill the network thread
            log.exception("error while handling a message on %s", message.topic)

    def _ignore_retained(self, topic: str) -> None:
        """Said once per topic: not at every reconnect, where the broker hands the copy out again."""
        if topic not in self._retained_seen:
            self._retained_seen.add(topic)
            log.warning("ignoring a retained message on %s (publish commands without retain; clear it "
                        "with an empty retained message)", topic)

    def _request(self, client, userdata, message) -> None:
        key = (message.mid, message.topic, hashlib.sha1(message.payload).digest())
        ack = functools.partial(self._ack, key, message.mid, message.qos)
        if message.retain:  # old, as on the command topics
            self._ignore_retained(message.topic)
            client.ack(message.mid, message.qos)
            return
        with self._lock:
            # A QoS 1 message not acknowledged yet comes again (DUP set, same packet id)
            # after a reconnect: in hand already, or done and its acknowledgement lost.
            again = message.dup and (key in self._held or key in self._done)
            done = again and key not in self._held
            if not again:
                self._held[key] = None
        if again:
            log.info("ignoring a redelivered message on %s (%s)", message.topic,
                     "answered already" if done else "still in hand")
            if done:
                client.ack(message.mid, message.qos)
            return
        try:
            # the packet id and DUP: whether a receipt of an earlier run may date it (receipts.py)
            self._on_request(message.topic, message.payload, ack, message.mid, bool(message.dup))
        except Exception:  # never let one message kill the network thread
            log.exception("error while handling a message on %s", message.topic)
            ack()

    def _ack(self, key, mid: int, qos: int) -> None:
        """The request has its last event: the broker may forget the message (once)."""
        with self._lock:
            if key not in self._held:
                return  # acknowledged already
            del self._held[key]
            self._done[key] = None
            while len(self._done) > 1000:
                self._done.popitem(last=False)
        self.intake.ack(mid, qos)


def _connect_once(mqtt_config: MqttConfig, client_id: str, timeout: float,
                  then: Callable[[paho.Client, str], str]) -> tuple[bool, str]:
    """Connect with a clean session (the configured credentials and TLS), run
    `then(client, "host:port")`, report."""
    result: dict = {}
    done = threading.Event()
    c = _client(mqtt_config, client_id, clean_session=True)
    c.connect_timeout = timeout

    def connected(client, userdata, flags, reason_code, properties):
        result["rc"] = reason_code
        done.set()

    c.on_connect = connected
    where = mqtt_config.where
    try:
        c.connect(mqtt_config.host, mqtt_config.port, keepalive=10)
    except (OSError, ssl.SSLError) as e:
        return False, f"cannot reach broker {where} ({e}); check mqtt.host and mqtt.port, and that it runs"
    c.loop_start()
    try:
        if not done.wait(timeout):
            return False, f"broker {where} did not answer within {timeout:g} s"
        rc = result["rc"]
        if rc.is_failure:
            return False, f"broker {where} refused the connection: {rc} (check mqtt.username/password)"
        return True, then(c, where)
    except (OSError, RuntimeError) as e:  # lost on the way
        return False, f"broker {where}: {e}"
    finally:
        c.disconnect()
        c.loop_stop()


def probe_broker(config: Config, timeout: float = 5.0) -> tuple[bool, str]:
    """Connect once and report how it went."""
    return _connect_once(config.mqtt, f"{config.identity().client_id}-check", timeout,
                         lambda client, where: f"broker {where} accepted the connection")


def forget_device(config: Config, timeout: float = 10.0) -> tuple[bool, str]:
    """Take this Pi out of Home Assistant and the broker (on uninstall, the service stopped).

    An empty retained discovery config removes an entity; this Pi's other
    retained topics are cleared so nothing stale is handed to the next
    subscriber; another Pi's are left alone. The connections use this Pi's
    client ids with a clean session, which ends its persistent sessions (and
    the messages the broker kept for them).
    """
    mqtt_config, identity = config.mqtt, config.identity()
    topics = Topics(mqtt_config.topic_prefix, identity.id, mqtt_config.discovery_prefix, mqtt_config.birth_topic)

    def clear(client: paho.Client, where: str) -> str:
        names = retained_topics(topics, identity) + (topics.before_rooms_retained() if identity.legacy else [])
        sent = [client.publish(topic, b"", qos=1, retain=True) for topic in names]
        for info in sent:
            info.wait_for_publish(timeout)
        if not all(info.is_published() for info in sent):
            raise OSError(f"the broker did not confirm clearing the retained topics within {timeout:g} s")
        return (f"removed the device from Home Assistant (device.id {identity.id}, broker {where}: {len(names)} "
                f"retained topics cleared, the service's MQTT sessions ended)")

    # the intake's session too: a clean connect with its id ends it (and drops its waiting requests)
    ok, detail = _connect_once(mqtt_config, f"{identity.client_id}-intake", timeout, lambda c, w: "")
    if not ok:
        return ok, detail
    return _connect_once(mqtt_config, identity.client_id, timeout, clear)
