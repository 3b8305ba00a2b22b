"""BrokerLink's intake in-process: what is handed on, what is acknowledged, and when."""

from types import SimpleNamespace

from hayakoe_pi.settings.config import MqttConfig
from hayakoe_pi.broker.link import BrokerLink
from hayakoe_pi.broker.topics import Topics


class FakeIntake:
    def __init__(self):
        self.acks = []

    def ack(self, mid, qos):
        self.acks.append((mid, qos))


def make_link():
    handed = []
    link = BrokerLink(MqttConfig(), "hayakoe-pi-pi", Topics("hk", "pi"), on_command=lambda t, p: None,
                      on_request=lambda t, p, ack, *delivery: handed.append((p, ack)), on_connected=lambda: None)
    link.intake = FakeIntake()
    return link, handed


def message(mid, payload=b"hello", dup=False, retain=False, topic="hk/say", qos=1):
    return SimpleNamespace(mid=mid, payload=payload, dup=dup, retain=retain, topic=topic, qos=qos)


def test_a_request_is_acknowledged_once_when_answered():
    link, handed = make_link()
    link._request(link.intake, None, message(5))
    (payload, ack), = handed
    assert payload == b"hello" and link.intake.acks == []  # not on receipt
    ack()
    ack()
    assert link.intake.acks == [(5, 1)]


def test_redeliveries_of_a_packet_in_hand_or_answered_are_dropped():
    link, handed = make_link()
    link._request(link.intake, None, message(7))
    link._request(link.intake, None, message(7, dup=True))  # after a reconnect, still queued here
    assert len(handed) == 1 and link.intake.acks == []
    handed[0][1]()
    link._request(link.intake, None, message(7, dup=True))  # answered, but the PUBACK was lost
    assert len(handed) == 1 and link.intake.acks == [(7, 1), (7, 1)]
    # the packet id used again for another message, or a first delivery: handed on
    link._request(link.intake, None, message(7, payload=b"other", dup=True))
    link._request(link.intake, None, message(7))
    assert [p for p, _ in handed] == [b"hello", b"other", b"hello"]


def test_a_retained_request_is_acknowledged_and_not_spoken():
    link, handed = make_link()
    link._request(link.intake, None, message(3, retain=True))
    assert handed == [] and link.intake.acks == [(3, 1)]


def test_a_failing_handler_still_acknowledges():
    link, _ = make_link()

    def broken(topic, payload, ack, *delivery):
        raise RuntimeError("bug")

    link._on_request = broken
    link._request(link.intake, None, message(9))
    assert link.intake.acks == [(9, 1)]


def test_connections_closed_right_after_connecting_are_said_once_and_slow_the_reconnects(caplog):
    link, _ = make_link()
    delays = []
    link._set_reconnect_delay = lambda low, high: delays.append((low, high))
    for lived in (40.0, 2.0, 1.0):  # a long one, then two quick drops: a flaky network, not yet a clash
        link._note_drop(lived, broker_away=False)
    link._note_drop(1.0, broker_away=True)  # the broker was gone meanwhile: a restart, not a clash
    assert not link.clash and delays == []
    for lived in (1.0, 2.0, 1.5):
        link._note_drop(lived, broker_away=False)
    link._note_drop(35.0, broker_away=False)  # backed off, connections last longer: still a clash
    assert link.clash and delays == [BrokerLink.CLASH_DELAY]
    clash_lines = [r.message for r in caplog.records if "another device" in r.message]
    assert len(clash_lines) == 1 and "hayakoe-pi-pi" in clash_lines[0] and "device.id" in clash_lines[0]
    link._note_drop(BrokerLink.STABLE_SECONDS + 1, broker_away=False)  # the other device is gone
    assert not link.clash and delays[-1] == (1, 60)


def test_drops_while_a_publish_is_unconfirmed_are_no_clash():
    """The broker closes the connection on a publish it refuses (Outbox): no sign of another device."""
    link, _ = make_link()
    delays = []
    link._set_reconnect_delay = lambda low, high: delays.append((low, high))
    for _ in range(2 * BrokerLink.QUICK_DROPS):
        link._note_drop(1.0, broker_away=False, refusing=True)
    assert not link.clash and delays == []


def test_no_exception_escapes_a_paho_callback(caplog):
    """One in on_connect (a bad state value, once) left the link alive but deaf."""
    link, _ = make_link()
    subscribed = []
    client = SimpleNamespace(unsubscribe=lambda topics: None, subscribe=subscribed.append)
    link.client = client
    link._intake_started = link._intake_ready = True

    def broken():
        raise OverflowError("cannot convert float infinity to integer")

    link._on_connected = broken
    ok = SimpleNamespace(is_failure=False)
    link._connected(client, None, SimpleNamespace(session_present=True), ok, None)  # does not raise
    assert subscribed and link.connected  # it still listens
    assert any("OverflowError" in r.exc_text for r in caplog.records if r.exc_text)


def queued(link) -> list[tuple[str, bytes]]:
    """What paho would send at the next connect (taken out of its queue to be read)."""
    return [(m.topic, m.payload) for m in link.client.drop_out_messages()]


def test_the_refused_publish_is_found_by_its_size_not_its_place():
    """Issue #56: a broker with max_packet_size 600 closed the connection on a 628-byte discovery
    config; the oldest unconfirmed publish, a 3-byte retained volume, was blamed and the limit
    became 2 bytes: no `online`, no event, no discovery from then on. Its acknowledgement had not
    come (the broker closes before it sends those of the packets ahead): size tells, not place."""
    link, _ = make_link()
    volume, config = "hk/pi/volume", "homeassistant/select/pi/voice/config"
    link.publish(volume, "100", retain=True)  # the oldest, unconfirmed
    link.publish(config, "x" * 628, retain=True)
    link.publish("hk/pi/status", "online", retain=True)
    assert link.outbox.reconnected()  # may be a refusal: no sign of another device
    assert link.outbox.reconnected()  # the same suspect again: it leaves paho's queue
    assert queued(link) == [(volume, b"100"), ("hk/pi/status", b"online")]
    assert link.publish("hk/pi/status", "online", retain=True) is not None
    assert link.publish(config, "x" * 628, retain=True) is None  # not sent again
    event = link.publish("hk/pi/event", {"event": "error", "id": "a", "error": "e" * 2000})
    assert event is not None and len(event_payload := queued(link)[-1][1]) < 628, event_payload
    style = "homeassistant/select/pi/style/config"
    assert link.publish(style, "s" * 610, retain=True) is not None  # under what was refused: sent
    assert link.outbox.reconnected()  # the broker refuses packets: one drop is enough now
    assert queued(link) == [] and link.publish(style, "s" * 610, retain=True) is None
    assert link.publish("hk/pi/status", "online", retain=True) is not None


def test_the_limit_never_goes_under_what_the_broker_acknowledged():
    """A drop with only packets no larger than one the broker took is no refusal: nothing is
    dropped (and the clash detector may count it)."""
    link, _ = make_link()
    config = "homeassistant/select/pi/voice/config"
    info = link.publish(config, "x" * 500, retain=True)
    link.outbox._acknowledged(link.client, None, info.mid, None, None)  # as paho does on the PUBACK
    link.client.drop_out_messages()  # as paho does on it, too
    link.publish("hk/pi/volume", "100", retain=True)
    link.publish(config, "y" * 500, retain=True)
    for _ in range(3):
        assert not link.outbox.reconnected()
    assert [t for t, _ in queued(link)] == ["hk/pi/volume", config]
    assert link.outbox.packet_limit is None
