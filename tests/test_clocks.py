"""The wall clock stepped under the real daemon (libfaketime: only its wall clock, never the
steady one): an `"at"` that waits is not delayed, a message that waits does not expire, and a
`sent` in milliseconds is refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness import appliance

FAKETIME = next(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"), None)
pytestmark = pytest.mark.skipif(FAKETIME is None, reason="libfaketime (Debian's faketime) not installed")

WAIT_BEHIND = "冷蔵庫のドアが開いています。閉めてください。" * 2  # ~5 s: the next message waits meanwhile


@pytest.fixture
def app(tmp_path):
    offset = tmp_path / "wall-clock-offset"
    offset.write_text("+0\n")
    env = {"LD_PRELOAD": str(FAKETIME), "FAKETIME_TIMESTAMP_FILE": str(offset), "FAKETIME_NO_CACHE": "1",
           "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    with appliance(tmp_path, env=env, queue={"max_age_s": 20}) as app:
        app.step_wall_clock = lambda seconds: offset.write_text(f"{seconds:+d}\n")
        yield app


def queue_behind_a_long_one(app, payload: dict) -> None:
    app.probe.publish("say", {"text": WAIT_BEHIND, "id": "first"})
    app.probe.next_event(event="started", id="first", timeout=60)
    app.probe.publish("say", payload)
    app.probe.next_event(event="queued", id=payload["id"], timeout=10)


def test_a_wall_clock_stepped_back_while_at_waits_delays_nothing(app):
    at = time.time() + 8  # after the first message ends
    queue_behind_a_long_one(app, {"text": "揃って鳴ります。", "id": "together", "at": at})
    app.step_wall_clock(-30)  # an NTP step back while it waits
    started = app.probe.next_event(event="started", id="together", timeout=60)
    heard = time.time()
    assert started["at"] == at
    assert heard - at < 15, f"started {heard - at:.1f} s after at: the step back delayed it ({started})"
    assert app.probe.next_event(event="finished", id="together", timeout=60)


def test_a_wall_clock_stepped_forward_while_a_message_waits_expires_nothing(app):
    queue_behind_a_long_one(app, {"text": "まだ新しいお知らせです。", "id": "young"})
    app.step_wall_clock(+3600)  # NTP after a boot on fake-hwclock: an hour forward
    last = app.probe.next_event(id="young", timeout=60, event="finished")
    assert last["event"] == "finished"


def test_a_message_received_after_the_step_still_counts_its_own_age(app):
    """The step changes no age; a message older than its max_age still expires."""
    app.step_wall_clock(+3600)
    queue_behind_a_long_one(app, {"text": "すぐ古くなるお知らせです。", "id": "brief", "max_age": 1})
    expired = app.probe.next_event(event="expired", id="brief", timeout=60)
    assert 1 < expired["age_s"] < 60, expired


def test_sent_in_milliseconds_is_refused_with_a_clear_error(app):
    answer = app.probe.reply("say", {"text": "ミリ秒です。", "id": "ms", "sent": time.time() * 1000})
    assert answer["event"] == "error" and answer["code"] == "bad_payload", answer
    assert "milliseconds" in answer["error"], answer


def test_sent_ahead_of_this_clock_is_spoken_and_said_once(app):
    for n in range(2):
        answer = app.probe.reply("say", {"text": "時計が遅れています。", "id": f"ahead{n}", "sent": time.time() + 600})
        assert answer["event"] == "finished", answer
    assert app.daemon.output().count("ahead of this device's clock") == 1
