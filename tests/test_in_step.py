"""Rooms in step at the ear (#46): `"at"` is when the first sample is heard, whatever the card holds.

Real daemons on one real mosquitto, each with its own real-time test card (harness.rooms):
heard means when the card's real-time drain plays the sample (AlsaSink.heard_at), not when the
daemon wrote it. A card kept open from a message before is full of silence; a card with a deeper
buffer holds more of it; the test card tells ALSA neither. bench/in_step.py measures more runs.
"""

import time

import pytest

from harness import message_before, rooms, say_at

IN_STEP = 0.03  # seconds: rooms' first samples are heard within this of each other and of "at"
RUNS = 3
AHEAD = 2.5     # seconds from the publish to "at"
DEEPER = 0.1    # seconds more that the deep card holds
KEEP_OPEN_S = 60

CARDS = {  # device.id: (AlsaSink options, audio config)
    "kept": ({}, {"keep_open_s": KEEP_OPEN_S}),
    "fresh": ({}, {"keep_open_s": 0}),
    "deep": ({"period_bytes": 4096 + int(DEEPER * 44100) * 4}, {"keep_open_s": KEEP_OPEN_S}),
    "receiver": ({}, {"keep_open_s": 0, "latency_ms": 100}),  # an AV receiver heard 0.1 s after its card
}


@pytest.fixture(scope="module")
def house(tmp_path_factory):
    with rooms(tmp_path_factory.mktemp("in_step"), CARDS) as house:
        yield house


def heard_in_step(house, names, rid: str) -> None:
    heard = say_at(house, names, time.time() + AHEAD, rid)
    lateness = {name: round(late, 4) for name, (_, late) in heard.items()}
    holes = {name: house.rooms[name].sink.holes for name in names}  # the daemon late: it could be the cause
    print(f"{rid}: heard {lateness} s after at; holes {holes}")
    assert max(lateness.values()) - min(lateness.values()) <= IN_STEP, (lateness, holes)
    assert all(abs(late) <= IN_STEP for late in lateness.values()), (lateness, holes)


def test_a_card_kept_open_and_a_fresh_one_are_heard_in_step(house):
    """The kept-open card holds ~0.15 s of silence when the message comes; the fresh one nothing."""
    for run in range(RUNS):
        message_before(house, "kept")
        message_before(house, "fresh")  # its card closed again at once (and the daemon warm)
        heard_in_step(house, ("kept", "fresh"), f"kept-fresh-{run}")


def test_cards_whose_buffers_differ_by_100_ms_are_heard_in_step(house):
    """Both kept open, so both full: the deep card holds 0.1 s more than the other."""
    for run in range(RUNS):
        message_before(house, "kept")
        message_before(house, "deep")
        heard_in_step(house, ("kept", "deep"), f"deep-{run}")


def test_started_says_how_late_the_first_sample_is_heard(house):
    """"at" sooner than the deep card's silence can be played out: late by at least what it holds."""
    message_before(house, "deep")
    [(started, late)] = say_at(house, ("deep",), time.time() + 0.1, "too-soon").values()
    print(f"too soon: heard {late:.4f} s after at, started {started}")
    assert late > 0.1, late
    assert "late_s" in started and abs(started["late_s"] - late) <= IN_STEP, (started, late)


def test_latency_ms_starts_that_much_sooner(house):
    """The test card adds nothing after itself: a room told its receiver takes 0.1 s is heard 0.1 s early."""
    for name in ("fresh", "receiver"):  # not the first message of a daemon: it may not be ready by "at"
        message_before(house, name)
    heard = say_at(house, ("fresh", "receiver"), time.time() + AHEAD, "receiver")
    lateness = {name: round(late, 4) for name, (_, late) in heard.items()}
    print(f"receiver: heard {lateness} s after at; started {[s for s, _ in heard.values()]}")
    assert abs(lateness["fresh"]) <= IN_STEP and abs(lateness["receiver"] + 0.1) <= IN_STEP, lateness
