"""The retained `state` says what is heard: `idle` once a message ends and nothing waits, however
it ends (finished, expired, cancelled by stop, refused at its turn). Automations wait for it."""

import pytest

from harness import appliance, wait_for

THREE_SECONDS = "冷蔵庫のドアが開いています。閉めてください。"  # about 3-4 s with the tiny voice


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with appliance(tmp_path_factory.mktemp("state")) as app:
        yield app


def states(app) -> list[bytes]:
    return [p for t, p, _ in app.probe.messages if t == app.probe.topic("state")]


def ends_idle(app) -> None:
    """The retained state's last value, once everything has been answered, is `idle`."""
    wait_for(lambda: states(app)[-1:] == [b"idle"], 10, what="state idle")


def test_an_expired_message_behind_another_ends_idle(app):
    """Before: the expired message skipped the `idle` after it, and `speaking` stayed."""
    app.probe.publish("say", {"text": THREE_SECONDS, "id": "first"})
    app.probe.publish("say", {"text": "もう古いお知らせです。", "id": "stale", "max_age": 1})
    app.probe.next_event(event="finished", id="first")
    app.probe.next_event(event="expired", id="stale")
    ends_idle(app)


def test_a_stop_ends_idle(app):
    app.probe.publish("say", {"text": THREE_SECONDS * 3, "id": "long"})
    app.probe.publish("say", {"text": "次のお知らせです。", "id": "waiting"})
    app.probe.next_event(event="started", id="long")
    wait_for(lambda: states(app)[-1:] == [b"speaking"], 10, what="state speaking")
    app.probe.publish("stop", "")
    app.probe.expect({"event": "finished", "id": "long"}, {"event": "error", "id": "waiting", "code": "cancelled"})
    ends_idle(app)

