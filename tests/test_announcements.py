"""Announcements (#36): a lead-in the speaker wakes up in, a card kept open between
messages, a chime while the Pi thinks, quiet hours at night, alerts first.

The real daemon into the real-time test card (harness.AlsaSink, as in
test_gapless): what the card played is read back sample by sample.
"""

import os
import time

import numpy as np
import pytest

from harness import HEAVY_DECODER, appliance, cpu_cgroup_available, settle, slow_cpu, wait_for
from hayakoe_pi.settings.announcements import QuietHours, playing_volume
from hayakoe_pi.sound.chime import default_chime

RATE = 44100
LEAD_MS = 500    # long enough to tell a lead-in from the card's own latency (~0.2 s)
KEEP_S = 1.5     # short: every test waits for the card to close
QUIET = 5        # percent, at night
SHORT = "はい。"
TEXT = "冷蔵庫のドアが開いています。閉めてください。"
LONG = "リビングの窓が開いたままです、雨が降りそうなので閉めてください、洗濯物も取り込んでください。"


def night_tz(hour: int = 23) -> str:
    """A POSIX TZ in which it is now `hour` o'clock: the daemon's local clock set to night."""
    utc = time.gmtime()
    offset = (hour * 60 - (utc.tm_hour * 60 + utc.tm_min)) % 1440
    offset -= 1440 if offset > 720 else 0
    sign = "-" if offset >= 0 else "+"  # POSIX: the offset west of UTC
    return f"NIGHT{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with appliance(tmp_path_factory.mktemp("announce"), env={"TZ": night_tz()},
                   audio={"lead_in_ms": LEAD_MS, "keep_open_s": KEEP_S,
                          "quiet_hours": {"from": "22:00", "to": "07:00", "volume": QUIET}}) as app:
        yield app


@pytest.fixture(scope="module")
def slow_app(tmp_path_factory):
    """The daemon on one core as slow as a Pi (harness.slow_cpu: synthesis slower than real time,
    the player outside the quota); the default chime."""
    reason = cpu_cgroup_available()
    if reason:
        pytest.skip(reason)
    with appliance(tmp_path_factory.mktemp("announce-slow"), cores={min(os.sched_getaffinity(0))},
                   env=HEAVY_DECODER, cache={"max_mb": 0},
                   audio={"lead_in_ms": 300, "keep_open_s": 0.5, "chime": "default"}) as app:
        with slow_cpu(app.daemon.proc.pid) as group:
            app.cpu = group
            yield app


def card_closed(app) -> bool:
    return bool(app.sink.opens) and app.sink.opens[-1].eof is not None


def played(app, rec) -> np.ndarray:
    """What the card played during one open, as float32 samples."""
    with open(app.sink.raw, "rb") as f:
        f.seek(rec.start)
        data = f.read((rec.end if rec.end is not None else app.sink.raw.stat().st_size) - rec.start)
    return np.frombuffer(data[:len(data) // 4 * 4], dtype="<f4")


def say(app, payload: dict, timeout: float = 120) -> tuple[float, dict]:
    """Publish; (the monotonic time of the publish, its `started` event)."""
    t0 = time.monotonic()
    app.probe.publish("say", payload)
    return t0, app.probe.next_event(event="started", id=payload["id"], timeout=timeout)


def fresh(app) -> None:
    """Nothing playing, the card closed (keep-open over), the records cleared."""
    settle(app)
    wait_for(lambda: not app.sink.opens or card_closed(app), KEEP_S + 10, what="the card to close")
    app.sink.reset_records()
    app.probe.drain()


def test_the_first_sound_comes_after_the_lead_in(app):
    fresh(app)
    say(app, {"text": SHORT, "id": "lead-in"})
    app.probe.next_event(event="finished", id="lead-in")
    wait_for(lambda: card_closed(app), KEEP_S + 10, what="the card to close")
    [rec] = app.sink.opens
    first = int(np.flatnonzero(played(app, rec))[0])
    # the card plays from its first byte on, which came after the open
    assert first / RATE >= LEAD_MS / 1000, f"first sound {first / RATE:.3f} s into the card's stream"


def test_the_card_stays_open_between_messages_then_closes(app):
    fresh(app)
    say(app, {"text": TEXT, "id": "keep-1"})
    app.probe.next_event(event="finished", id="keep-1")
    time.sleep(0.3)
    t_second, _ = say(app, {"text": TEXT, "id": "keep-2"})  # from the phrase cache: ready at once
    finished = app.probe.next_event(event="finished", id="keep-2")
    assert finished["cached"] is True
    t_finished = time.monotonic()
    assert len(app.sink.opens) == 1, "the card was opened again for the second message"
    wait_for(lambda: card_closed(app), KEEP_S + 10, what="the card to close after keep_open_s")
    [rec] = app.sink.opens
    assert app.sink.holes == [], app.sink.holes
    assert KEEP_S - 0.3 <= rec.closed - t_finished <= KEEP_S + 1.5, rec.closed - t_finished
    # when the second message's first sound played (the card plays its stream in real time)
    pcm = played(app, rec)
    due = int((t_second - rec.first_data) * RATE)
    first = due + int(np.flatnonzero(pcm[due:])[0])
    latency = rec.first_data + first / RATE - t_second
    assert latency < LEAD_MS / 1000, f"second message heard {latency:.3f} s after its publish: a lead-in"


def test_at_with_a_lead_in_still_starts_at_its_moment(app):
    """The lead-in is written before "at", not added after it."""
    fresh(app)
    wall_minus_steady = time.time() - time.monotonic()
    at = time.time() + 2.0
    _, started = say(app, {"text": SHORT, "id": "at", "at": at})
    assert started["at"] == at and "late_s" not in started, started
    app.probe.next_event(event="finished", id="at")
    wait_for(lambda: card_closed(app), KEEP_S + 10, what="the card to close")
    [rec] = app.sink.opens
    first = int(np.flatnonzero(played(app, rec))[0])
    assert first / RATE >= LEAD_MS / 1000  # the lead-in is there
    offset = rec.first_data + first / RATE + wall_minus_steady - at
    assert abs(offset) <= 0.03, f"the sound started {offset:+.3f} s after at"


def peak(app, message_id: str) -> float:
    """The loudest sample of a message played alone on the card."""
    app.probe.next_event(event="finished", id=message_id)
    wait_for(lambda: card_closed(app), KEEP_S + 10, what="the card to close")
    return float(np.abs(played(app, app.sink.opens[-1])).max())


def test_quiet_hours_at_night_and_an_alert_through_them(app):
    fresh(app)
    _, started = say(app, {"text": TEXT, "id": "night", "volume": 100})
    assert started.get("quiet_hours") is True, started
    night = peak(app, "night")
    fresh(app)
    _, started = say(app, {"text": TEXT, "id": "alert", "volume": 100, "priority": "alert"})
    assert "quiet_hours" not in started, started
    loud = peak(app, "alert")
    assert 0 < night <= QUIET / 100 + 1e-6, night
    assert loud > 2 * night, (loud, night)  # its own volume: the same text, 20 times louder


def test_quiet_hours_cover_the_night_across_midnight():
    quiet = QuietHours.parse({"from": "22:00", "to": "07:00", "volume": 30})
    at = lambda hour, minute=0: time.struct_time((2026, 1, 1, hour, minute, 0, 3, 1, 0))  # noqa: E731
    assert playing_volume(0.8, quiet, False, at(23)) == (0.3, True)
    assert playing_volume(0.8, quiet, False, at(6, 59)) == (0.3, True)
    assert playing_volume(0.2, quiet, False, at(2)) == (0.2, False)  # quieter already
    assert playing_volume(0.8, quiet, False, at(7)) == (0.8, False)
    assert playing_volume(0.8, quiet, False, at(21, 59)) == (0.8, False)
    assert playing_volume(0.8, quiet, True, at(23)) == (0.8, False)  # an alert
    assert playing_volume(0.8, None, False, at(23)) == (0.8, False)


def test_an_alert_goes_before_every_waiting_message(app):
    fresh(app)
    app.probe.publish("say", {"text": TEXT, "id": "current"})
    app.probe.next_event(event="started", id="current")
    ids = [f"waiting-{i}" for i in range(5)]
    for rid in ids:
        app.probe.publish("say", {"text": SHORT, "id": rid})
    app.probe.publish("say", {"text": SHORT, "id": "urgent", "priority": "alert"})
    order = ["current"]
    while len(order) < 7:
        event = app.probe.next_event(event="started", timeout=120)
        order.append(event["id"])
    assert order == ["current", "urgent", *ids], order


# --- the chime, on a CPU as slow as a Pi's --------------------------------------------------

def chime_starts_at(pcm: np.ndarray) -> int | None:
    """Where the default chime plays whole in `pcm` (its first sound sample), else None."""
    chime = default_chime(RATE)
    sound = chime[int(np.flatnonzero(chime)[0]):]
    first = int(np.flatnonzero(pcm)[0])
    if np.array_equal(pcm[first:first + sound.size], sound):
        return first
    return None


def test_the_chime_plays_while_the_pi_thinks_and_speech_follows_whole(slow_app):
    app = slow_app
    fresh(app)
    say(app, {"text": SHORT, "id": "warm-up", "chime": False})
    fresh(app)
    throttled = app.cpu.throttled()
    t0, started = say(app, {"text": TEXT, "id": "chimed"})
    assert started.get("chime") is True, started
    finished = app.probe.next_event(event="finished", id="chimed", timeout=120)
    wait_for(lambda: card_closed(app), 30, what="the card to close")
    [rec] = app.sink.opens
    pcm = played(app, rec)
    start = chime_starts_at(pcm)
    assert start is not None, "the chime is not what the card played first"
    heard = rec.first_data + start / RATE - t0
    assert heard <= 0.3 + 0.2, f"the chime came {heard:.3f} s after the publish"
    assert app.cpu.throttled() > throttled
    # speech after the chime, with no hole inside a sentence
    speech = np.flatnonzero(pcm[start + default_chime(RATE).size:])
    assert speech.size, "no speech after the chime"
    assert [h for h in app.sink.holes_in_speech() if h.seconds >= 0.03] == [], app.sink.holes
    assert finished["seconds"] > 0

    fresh(app)
    _, started = say(app, {"text": TEXT, "id": "no-chime", "chime": False})
    assert "chime" not in started, started
    app.probe.next_event(event="finished", id="no-chime", timeout=120)
    wait_for(lambda: card_closed(app), 30, what="the card to close")
    assert chime_starts_at(played(app, app.sink.opens[-1])) is None, "a chime with \"chime\": false"


def test_on_a_cpu_slower_than_real_time_speech_waits_after_the_chime_until_it_can_flow(slow_app):
    """Synthesis slower than real time (as the full-size voice on a Pi): speech must not start
    right after the chime and then run dry."""
    app = slow_app
    fresh(app)
    t0, _ = say(app, {"text": LONG, "id": "chimed-slow"})
    finished = app.probe.next_event(event="finished", id="chimed-slow", timeout=180)
    wait_for(lambda: card_closed(app), 30, what="the card to close")
    [rec] = app.sink.opens
    start = chime_starts_at(played(app, rec))
    assert start is not None
    heard = rec.first_data + start / RATE - t0
    print(f"slow: chime after {heard:.3f} s, {finished['seconds']:.2f} s of speech in {rec.eof - t0:.2f} s; "
          f"holes {app.sink.holes}")
    assert finished["seconds"] / (rec.eof - t0) < 1.0, "synthesis was not slower than real time"
    assert heard <= 0.3 + 0.2, f"the chime came {heard:.3f} s after the publish: it waited for synthesis"
    assert [h for h in app.sink.holes_in_speech() if h.seconds >= 0.03] == [], app.sink.holes


def test_a_message_may_name_only_wav_files_in_the_chime_folder(tmp_path):
    from hayakoe_pi.sound.player import write_wav
    from hayakoe_pi.sound.chime import Chimes
    from hayakoe_pi.broker.payloads import parse_chime

    folder = tmp_path / "chimes"
    folder.mkdir()
    write_wav(folder / "bell.wav", default_chime(22050), 22050)
    write_wav(tmp_path / "outside.wav", default_chime(22050), 22050)
    (folder / "notes.txt").write_text("not a sound")
    chimes = Chimes("none", folder)
    bell = str(folder / "bell.wav")
    assert parse_chime("bell.wav", chimes.resolve) == parse_chime(bell, chimes.resolve) == bell
    assert parse_chime(False, chimes.resolve) is False and parse_chime("default", chimes.resolve) == "default"
    for bad in ("../outside.wav", str(tmp_path / "outside.wav"), "/etc/passwd", "notes.txt", "missing.wav", 3):
        with pytest.raises(ValueError, match="chime"):
            parse_chime(bad, chimes.resolve)
    assert abs(chimes.audio(bell, 44100).size - default_chime(44100).size) <= 2  # resampled to the voice's rate


def test_no_chime_is_off_and_none_is_still_taken_for_it(tmp_path):
    """Home Assistant's select shows a state "none" as no option (unknown): the chime's is "off".
    "none", its former name, still works in config.yaml, in chime/set, in a message and in a
    kept announcements.json."""
    from hayakoe_pi.settings.announcements import AnnouncementSettings
    from hayakoe_pi.sound.chime import Chimes
    from hayakoe_pi.settings.config import ConfigError, load_config
    from hayakoe_pi.broker.payloads import parse_chime

    path = tmp_path / "announcements.json"
    for configured in ("none", "off", False):  # False: YAML's bare `chime: off`
        settings = AnnouncementSettings(path, configured, None)
        assert settings.chime == "off" and settings.chime_options == ["off", "default"]
        assert Chimes(configured).audio(settings.chime, 22050) is None
    settings = AnnouncementSettings(path, "default", None)
    settings.set("chime", b"none")
    assert settings.chime == settings.shown("chime") == "off"
    assert AnnouncementSettings(path, "default", None).chime == "off"  # kept as the change it is
    path.write_text('{"changes": {"chime": {"value": "none", "config": "default"}}}')  # an older version's
    assert AnnouncementSettings(path, "default", None).chime == "off"
    path.write_text('{"changes": {"chime": {"value": "default", "config": "none"}}}')
    assert AnnouncementSettings(path, "off", None).chime == "default"  # the config is as it was then
    assert parse_chime("none") == parse_chime("off") == "off" and parse_chime(False) is False
    for text in ("chime: off", "chime: none", "chime: 'off'"):
        (tmp_path / "config.yaml").write_text(f"audio:\n  {text}\n")
        assert load_config(tmp_path / "config.yaml").audio.chime in ("off", "none", False)
    (tmp_path / "config.yaml").write_text("audio:\n  chime: on\n")
    with pytest.raises(ConfigError, match="audio.chime must be off, default or a WAV"):
        load_config(tmp_path / "config.yaml")
