"""What a careless automation or a hostile LAN sends: every payload answered, none queued that
cannot be spoken, nothing stale spoken, no message that can kill the daemon twice.

The real daemon and a real mosquitto, as in test_daemon; restarts by kill -9, as the OOM
killer or a power cut would do them.
"""

import json
import math
import os
import subprocess
import sys
import time

import pytest

from conftest import REPO
from harness import DaemonProcess, appliance, wait_for
from hayakoe_pi.broker.payloads import payload_digest

LONG = "冷蔵庫のドアが開いています。閉めてください。" * 6  # ~15 s


def events(probe, kind=None) -> list[dict]:
    found = [json.loads(p) for t, p, _ in probe.messages if t == probe.topic("event")]
    return [e for e in found if kind is None or e["event"] == kind]


def restart(app, name: str, down: float = 0.0) -> None:
    """kill -9 the daemon and start it again `down` s later, as systemd (or the power coming back)
    would; wait until it is online again."""
    app.daemon.proc.kill()
    app.daemon.proc.wait(10)
    time.sleep(down)
    mark = len(app.probe.messages)
    app.daemon = DaemonProcess(app.config, app.sink.home, app.work / f"{name}.log")
    app.extra.append(app.daemon)
    wait_for(lambda: any(t == app.probe.topic("status") and p == b"online" for t, p, _ in app.probe.messages[mark:]),
             90, what="online again")


@pytest.fixture
def app(tmp_path, request):
    sections = getattr(request, "param", {})
    with appliance(tmp_path, **sections) as app:
        app.extra = []
        try:
            yield app
        finally:
            for daemon in app.extra:
                daemon.stop()


SURROGATE = '{"text": "テスト\\ud800です", "id": "sur"}'  # a JavaScript string cut inside an emoji
JUNK = [
    "😀🎉", "{{{{", "。。。！", "ーーー", "🔥" * 50, "}{", "※※※", "♪♪♪",  # nothing readable
    b"\xff\xfe\xfa",  # not UTF-8
    b"x" * 20000,  # larger than any text it takes
    '{"text": "x"', '{"text": 5}', '{"text": "ok", "speed": "fast"}', '{"text": "ok", "volume": 1e999}',
    '{"text": "ok", "id": "a\\n<0>emergency"}', '{"text": "ok", "id": "\\u0007bell"}',
    '{"text": "ok", "interrupt": 1}', '{"text": "ok", "at": 9999999999}', '{"text": "ok", "max_age": "soon"}',
    '{"text": "ok", "sent": [1]}', '{"text": "ok", "voice": ["a"]}', '{"text": "ok", "color": "red"}',
    '{"text": "ok", "style": {"a": 1}}', '{"text": "😀😀", "interrupt": true}', "[1, 2]",
    SURROGATE, '{"text": "ok", "volume": 1' + "0" * 400 + "}", '{"text": "ok", "sent": ' + "9" * 5000 + "}",
    '{"text": "ok", "id": "\\udfff"}', '{"\\ud800": 1, "text": "ok"}', "[" + "1" * 5000 + "]",
    '{"text": "PS5を起動", "speed": 1' + "0" * 400 + "}", '{"text": "Wi-Fi6\\ud83d", "id": "wifi"}',
]
# Text the front end reads with care (digits and `&` in a word): spoken, each answered
WORDS_WITH_DIGITS = ["PS5を起動しました。", "Wi-Fi6に繋ぎました。", "x2で再生します。", "R&Dの会議です。"]


def test_300_junk_payloads_are_each_answered_and_a_valid_one_is_still_spoken(app):
    """Before: emoji and braces were queued and failed only at their turn, so the queue (20)
    was full for the valid message that came next."""
    sent = [JUNK[i % len(JUNK)] for i in range(300)]
    for i, payload in enumerate(sent):
        app.probe.publish("say", payload)
        if i % 75 == 0:
            app.probe.publish("say", {"text": WORDS_WITH_DIGITS[i // 75], "id": f"word-{i // 75}"})
    app.probe.publish("say", {"text": "正しいお知らせです。🎉🎉！", "id": "valid"})
    app.probe.next_event(event="finished", id="valid", timeout=120)
    errors = events(app.probe, "error")
    assert len(errors) == 300, [e["error"] for e in errors][:20]
    words = [f"word-{i}" for i in range(len(WORDS_WITH_DIGITS))]
    assert [e["id"] for e in events(app.probe, "finished")] == words + ["valid"]
    assert [e["id"] for e in events(app.probe, "queued")] == words + ["valid"]  # none of the junk waited
    codes = {e.get("code") for e in errors}
    assert {"nothing_to_speak", "too_large", "bad_payload"} <= codes, codes
    log = app.daemon.output()
    assert "JPCommonLabel" not in log and "No phoneme" not in log  # OpenJTalk's C warnings
    assert "\n<0>" not in log  # an id never writes lines of its own into the journal
    assert app.daemon.proc.poll() is None


UNREADABLE = [  # (topic, payload, its id): JSON the door parses but cannot take as it is
    ("say", SURROGATE, "sur"),
    ("say", '{"text": "はい。", "volume": 1' + "0" * 400 + ', "id": "huge"}', "huge"),  # too large for a float
    ("prepare", '{"text": "はい。", "at": 1' + "0" * 400 + ', "id": "huge-at"}', "huge-at"),
    ("say", '{"text": "はい。", "speed": ' + "7" * 5000 + ', "id": "digits"}', "digits"),  # over int()'s 4300
]


def test_a_payload_the_door_cannot_take_is_answered_and_its_id_spoken_later(app):
    """Before: no answer at all, the message acknowledged (lost), and for the surrogate its id
    answered `duplicate` until the next restart (the id claimed before the event failed)."""
    for topic, payload, rid in UNREADABLE:
        error = app.probe.reply(topic, payload, timeout=30)
        assert error["event"] == "error" and error["code"] == "bad_payload" and error["id"] == rid, error
        valid = {"text": "はい。", "id": rid}
        assert app.probe.reply(topic, valid)["event"] == "finished", rid
        assert [e["event"] for e in events(app.probe) if e["id"] == rid][-4:-2] == ["error", "queued"], rid
    sur = next(e for e in events(app.probe, "error") if e["id"] == "sur")
    assert sur["text"] == "テスト\ufffdです" and "surrogate" in sur["error"], sur
    assert app.daemon.proc.poll() is None


def test_a_prepare_with_interrupt_cuts_nothing(app):
    """Before: the prepare cut the alert being spoken (`"interrupted": true`), and the alert was
    never played again, though a prepare plays nothing."""
    app.probe.publish("say", {"text": LONG, "id": "alert", "priority": "alert"})
    app.probe.next_event(event="started", id="alert", timeout=60)
    time.sleep(1.0)
    app.probe.publish("prepare", {"text": "あとで使う言葉です。", "id": "ahead", "interrupt": True})
    alert, prepared = app.probe.expect({"event": "finished", "id": "alert"}, {"event": "finished", "id": "ahead"},
                                       timeout=120)
    assert "interrupted" not in alert and alert["seconds"] > 10, alert
    assert prepared["prepare"] is True and "interrupted" not in prepared, prepared
    finished = [e["id"] for e in events(app.probe, "finished")]
    assert finished == ["alert", "ahead"], finished  # the prepare waited its turn


@pytest.mark.parametrize("app", [{"queue": {"duplicate_window_s": 1.0}}], indirect=True)
def test_an_id_is_a_duplicate_only_while_its_message_is_in_hand_and_shortly_after(app):
    payload = {"text": "リビングは二十一度です。", "id": "temp-report"}
    assert app.probe.reply("say", payload)["event"] == "finished"
    assert app.probe.reply("say", payload)["event"] == "duplicate"  # a redelivery, lately answered
    time.sleep(1.2)
    assert app.probe.reply("say", payload)["event"] == "finished"  # the automation ran again


def test_the_readme_automation_run_three_times_is_spoken_three_times(app):
    """The README's mqtt.publish example, its template rendered as Home Assistant would."""
    for _ in range(3):
        rendered = {"text": "リビングは21℃です。", "style": "Happy", "speed": 1.1, "volume": 70,
                    "sent": time.time(), "max_age": 600}
        assert app.probe.reply("say", rendered)["event"] == "finished"


@pytest.mark.parametrize("app", [{"queue": {"max_length": 3}}], indirect=True)
def test_interrupt_is_held_to_the_queue_bound_and_nothing_queued_is_lost(app):
    app.probe.publish("say", {"text": LONG, "id": "long"})
    app.probe.next_event(event="started", id="long")
    for i in range(3):
        app.probe.publish("say", {"text": f"{i}番目の用件です。", "id": f"q{i}"})
    refused = app.probe.reply("say", {"text": "急ぎの用件です。", "id": "urgent", "interrupt": True})
    assert refused["event"] == "error" and refused["code"] == "queue_full", refused
    app.probe.publish("stop", "stop")  # cancels the three: each answered, none lost in silence
    for i in range(3):
        app.probe.next_event(event="error", id=f"q{i}")


def test_a_message_that_killed_the_daemon_twice_is_answered_poison_and_the_next_is_spoken(app):
    app.probe.publish("say", {"text": LONG, "id": "killer"})
    app.probe.publish("say", {"text": "次のお知らせです。", "id": "next"})
    for n in (1, 2):
        app.probe.next_event(event="started", id="killer", timeout=60)
        restart(app, f"after-death-{n}")
    wait_for(lambda: len([e for e in events(app.probe, "interrupted") if e["id"] == "killer"]) == 2, 30,
             what="both deaths told")
    poison = wait_for(lambda: next((e for e in events(app.probe, "error") if e["id"] == "killer"), None), 60,
                      what="the poison answer")
    assert poison["code"] == "poison" and poison["text"].startswith("冷蔵庫のドア"), poison
    app.probe.next_event(event="finished", id="next", timeout=60)
    assert len([e for e in events(app.probe, "started") if e["id"] == "killer"]) == 2  # never a third time
    # and the broker forgot it: a fourth start hears nothing of it
    restart(app, "after-poison")
    time.sleep(2)
    assert len([e for e in events(app.probe) if e["id"] == "killer" and e["event"] in ("queued", "error")]) == 3


def test_a_sigterm_mid_message_is_no_death(app):
    """A restart by systemd (SIGTERM) twice while the same message plays: spoken a third time."""
    app.probe.publish("say", {"text": LONG, "id": "restarted"})
    for n in (1, 2):
        app.probe.next_event(event="started", id="restarted", timeout=60)
        assert app.daemon.stop() == 0
        mark = len(app.probe.messages)
        app.daemon = DaemonProcess(app.config, app.sink.home, app.work / f"term-{n}.log")
        app.extra.append(app.daemon)
        wait_for(lambda: any(t == app.probe.topic("status") and p == b"online"
                             for t, p, _ in app.probe.messages[mark:]), 90, what="online again")
    app.probe.next_event(event="started", id="restarted", timeout=60)
    assert not [e for e in events(app.probe, "error") if e["id"] == "restarted"]


@pytest.mark.parametrize("app", [{"queue": {"max_age_s": 3}, "cache": {"max_mb": 0}}], indirect=True)
def test_messages_older_than_their_max_age_after_a_crash_are_expired_not_spoken(app):
    ids = ["washing", "dryer", "oven"]
    for i, rid in enumerate(ids):
        app.probe.publish("say", {"text": LONG if i == 0 else f"{rid}が終わりました。", "id": rid})
    app.probe.next_event(event="started", id="washing", timeout=60)
    wait_for(lambda: len(events(app.probe, "queued")) == 3, 10, what="all queued")
    restart(app, "down-for-a-while", down=3.5)  # a power cut longer than their max_age
    before = app.sink.raw.stat().st_size
    expired = [app.probe.next_event(event="expired", id=rid, timeout=60) for rid in ids]
    assert all(e["age_s"] > 3 and e["max_age_s"] == 3 for e in expired), expired
    assert not [e for e in events(app.probe, "finished") if e["id"] in ids]
    started = [e["id"] for e in events(app.probe, "started")]
    assert started == ["washing"]  # only before the crash
    assert app.sink.raw.stat().st_size - before < 0.3 * 44100 * 4
    # "sent" in the payload: its age counts from then, whenever it arrives
    sent = app.probe.reply("say", {"text": "古いお知らせです。", "id": "old", "sent": time.time() - 60})
    assert sent["event"] == "expired", sent
    fresh = app.probe.reply("say", {"text": "新しいお知らせです。", "id": "new", "sent": time.time() - 60,
                                    "max_age": 120})
    assert fresh["event"] == "finished", fresh


DAILY = "洗濯が終わりました。"  # plain text, as a daily automation sends it: the same bytes every day


def final_event(app, rid: str) -> dict | None:
    return next((e for e in events(app.probe) if e["id"] == rid and e["event"] in ("finished", "expired", "error")),
                None)


def wait_out_max_age(since: float, max_age_s: float) -> None:
    time.sleep(max(0.0, since + max_age_s + 1.0 - time.monotonic()))


@pytest.mark.parametrize("app", [{"queue": {"max_age_s": 5}, "cache": {"max_mb": 0}}], indirect=True)
def test_the_same_text_after_a_qos0_message_lost_at_a_crash_is_spoken(app):
    """Before: the lost message's receipt (keyed by the payload's digest) dated the new one:
    `expired` until the receipt was pruned, 7 days later."""
    app.probe.publish("say", {"text": LONG, "id": "long"})
    app.probe.next_event(event="started", id="long", timeout=60)
    app.probe.publish("say", DAILY, qos=0)  # waits behind the long one: lost at the crash
    lost_at = time.monotonic()
    wait_for(lambda: [e for e in events(app.probe, "queued") if e["text"] == DAILY], 10, what="queued")
    restart(app, "after-the-loss")
    app.probe.publish("stop", "stop")  # the long one comes back (QoS 1): cut, so the next is not kept waiting
    wait_for(lambda: final_event(app, "long"), 60, what="the long message answered")
    wait_out_max_age(lost_at, 5)
    answer = app.probe.reply("say", DAILY)  # QoS 1, the same bytes
    assert answer["event"] == "finished", answer


@pytest.mark.parametrize("app", [{"queue": {"max_age_s": 3}, "cache": {"max_mb": 0}}], indirect=True)
def test_messages_sent_again_after_their_session_ended_are_new_and_their_receipts_dropped(app):
    """`hayakoe-pi forget` ends the sessions while three messages wait: never handed back. Sent
    again, the same bytes come with the same packet ids (a new session counts from 1 again),
    but not as redeliveries: new messages, spoken. Their old receipts are dropped at start.
    Before: the same text inherited the old receipt's time (`expired`) until pruned, 7 days later."""
    long = {"text": LONG, "id": "long"}
    app.probe.publish("say", long)
    app.probe.next_event(event="started", id="long", timeout=60)
    app.probe.publish("say", DAILY)
    lost_at = time.monotonic()
    app.probe.publish("say", "乾燥が終わりました。")  # never sent again
    wait_for(lambda: len(events(app.probe, "queued")) == 3, 10, what="queued")
    app.daemon.proc.kill()
    app.daemon.proc.wait(10)
    forget = subprocess.run([sys.executable, "-m", "hayakoe_pi.cli", "forget", "--config", str(app.config)],
                            capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert forget.returncode == 0, forget.stderr
    restart(app, "after-forget")
    assert [e["id"] for e in events(app.probe, "queued")].count("long") == 1  # not handed back
    wait_out_max_age(lost_at, 3)
    app.probe.publish("say", long)  # soon after the start, its old receipt not dropped yet
    answer = wait_for(lambda: [e["event"] for e in events(app.probe)
                               if e["id"] == "long" and e["event"] in ("started", "expired")][1:], 60,
                      what="the long message sent again answered")
    assert answer == ["started"], answer
    app.probe.publish("stop", "stop")
    wait_for(lambda: final_event(app, "long"), 60, what="the long message cut")
    answer = app.probe.reply("say", DAILY)
    assert answer["event"] == "finished", answer
    wait_for(lambda: "receipts of messages the broker did not hand back" in app.daemon.output(), 30,
             what="the old receipts dropped")
    assert json.loads((app.work / "state" / "received.json").read_text())["received"] == {}


def test_an_old_receipts_file_dates_no_message_and_is_dropped_once(tmp_path):
    """A received.json of an older version, keyed by the payload's digest alone, cannot tell a
    redelivery from a new message: dropped, said once."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "received.json").write_text(json.dumps({payload_digest(DAILY.encode()): time.time() - 60}))
    with appliance(tmp_path, queue={"max_age_s": 20}) as app:
        app.extra = []
        try:
            assert app.daemon.output().count("received.json") == 1, app.daemon.output()
            restart(app, "again")  # before any message
            assert "received.json" not in app.daemon.output()  # said once: the file is of this version now
            assert app.probe.reply("say", DAILY)["event"] == "finished"
        finally:
            for daemon in app.extra:
                daemon.stop()


def test_an_infinite_volume_in_the_state_file_starts_online_and_speaks(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.json").write_text(json.dumps({"volume": math.inf, "voice": "tiny-voice", "style": 5}))
    with appliance(tmp_path) as app:
        assert app.probe.reply("say", {"text": "音量が戻りました。", "id": "loud"})["event"] == "finished"
        assert app.probe.last("volume") == b"100"  # audio.volume, the default
        assert "volume Infinity" in app.daemon.output()  # said, and dropped
