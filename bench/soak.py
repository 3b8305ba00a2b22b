"""Soak: the real daemon for a long time, with messages, junk and broker restarts.

    python bench/soak.py --minutes 30 [--models DIR --voice NAME] [--restart-every 120]

Starts a private mosquitto with the installer's settings (its packet limit
too) on a loopback port and the daemon (ALSA into a file sink drained at
real-time speed, as in the tests), then until the time is up: publishes a
mix of valid and invalid `say` messages with ids, and junk on the command
topics (a 60 KB dictionary word, settings out of range, bad JSON), restarts
the broker every `--restart-every` seconds, and samples the daemon's RSS. A
retained `stop` and a retained volume lie on the broker from the start: the
daemon is handed them again at every reconnect and must ignore them.
At the end it prints what happened to every message and the RSS curve, and
fails (exit 1) if a message got no answer (an invalid one with an id: no
`error` with it), a valid one was spoken other than once, the daemon died,
a connection fell other than by a broker restart, or a retained command was
obeyed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from harness import DEVICE, AlsaSink, DaemonProcess, Mosquitto, SessionProbe, write_config  # noqa: E402

VALID = ["お風呂が沸きました。", "洗濯機の運転が終わりました。", "リビングは{n}.5℃、湿度{m}%です。",
         "玄関の鍵が開いています。", "{n}時{m}分になりました。", "CO2濃度は{n}00ppmです。",
         "PS5を起動しました。", "Wi-Fi6のルーターが再起動しました。", "R&D棟の照明を消しました。"]
INVALID = [b"\xff\xfe", b"", b"{\"text\": 5}", b"{\"text\": \"x\", \"voice\": \"../etc\"}", "😊".encode(),
           b"{\"text\": \"x\", \"speed\": 99}", b"{broken"]
# invalid with an id: each must be answered `error` with it (a lone surrogate, a whole number too
# large for a float, one too long to read)
INVALID_WITH_ID = ['{{"text": "テスト\\ud800です", "id": "{id}"}}', '{{"text": "x", "volume": 1{zeros}, "id": "{id}"}}',
                   '{{"text": "x", "speed": 5{digits}, "id": "{id}"}}']
# (subtopic, payload) on the command topics; the dictionary words are refused (PS5 is added: a word with a digit)
JUNK_COMMANDS = [("dictionary/add", json.dumps({"surface": "バックスラッシュ", "reading": "\\" * 30000})),
                 ("dictionary/add", b"{broken"), ("dictionary/remove", b"\xff\xfe"),
                 ("{device}/volume/set", b"Infinity"), ("{device}/style/set", "x" * 10000),
                 ("{device}/chime/set", b"../../etc/passwd.wav"),
                 ("dictionary/add", json.dumps({"surface": "PS5", "reading": "ピーエスファイブ"})),
                 ("dictionary/add", json.dumps({"surface": "1.5", "reading": "イッテンゴ"}))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--models", default=str(REPO / "tests/fixtures/models/tiny"))
    ap.add_argument("--voice", default="tiny-voice")
    ap.add_argument("--restart-every", type=float, default=120, help="seconds between broker restarts")
    ap.add_argument("--interval", type=float, default=3.5,
                    help="seconds between messages (shorter than the utterances fills the queue: "
                         "then 'queue full' errors are expected)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hayakoe-soak-"))
    broker = Mosquitto(work / "broker", as_installed=True).start()  # the installer's limits (max_packet_size)
    sink = AlsaSink(work)
    prefix = f"soak{broker.port}"
    config = write_config(work / "config.yaml", broker.port, prefix, work, models={"dir": args.models},
                          voice={"name": args.voice}, queue={"max_length": 50}, log={"level": "INFO"})
    probe = SessionProbe(broker.port, prefix, client_id=f"soak-probe-{broker.port}")
    # retained commands: handed to the daemon at each (re)subscription, which must not obey them
    probe.client.publish(f"{prefix}/{DEVICE}/stop", b"STOP", qos=1, retain=True).wait_for_publish(5)
    probe.client.publish(f"{prefix}/{DEVICE}/volume/set", b"5", qos=1, retain=True).wait_for_publish(5)
    daemon = DaemonProcess(config, sink.home, work / "daemon.log")
    rng = random.Random(0)
    sent_valid, sent_invalid, sent_bad_ids, rss = [], [], [], []
    junk_commands = restarts = onlines = 0
    try:
        deadline = time.monotonic() + 90
        while probe.last("status") != b"online":
            if time.monotonic() > deadline or daemon.proc.poll() is not None:
                print(daemon.output())
                return 1
            time.sleep(0.2)
        start = time.monotonic()
        end = start + args.minutes * 60
        next_restart = start + args.restart_every
        i = 0
        while time.monotonic() < end and daemon.proc.poll() is None:
            i += 1
            if rng.random() < 0.8:
                text = rng.choice(VALID).format(n=rng.randint(1, 30), m=rng.randint(0, 59))
                rid = f"v{i}"
                probe.client.publish(f"{prefix}/say", json.dumps({"text": text, "id": rid}), qos=1)
                sent_valid.append(rid)
            elif rng.random() < 0.5:
                if rng.random() < 0.5:
                    probe.client.publish(f"{prefix}/say", rng.choice(INVALID), qos=1)
                else:
                    payload = rng.choice(INVALID_WITH_ID).format(id=f"bad{i}", zeros="0" * 400, digits="0" * 5000)
                    probe.client.publish(f"{prefix}/say", payload, qos=1)
                    sent_bad_ids.append(f"bad{i}")
                sent_invalid.append(i)
            else:
                subtopic, payload = rng.choice(JUNK_COMMANDS)
                probe.client.publish(f"{prefix}/{subtopic.format(device=DEVICE)}", payload, qos=1)
                junk_commands += 1
            if time.monotonic() > next_restart:
                broker.stop()
                time.sleep(rng.uniform(0.5, 3))
                broker.start()
                restarts += 1
                next_restart += args.restart_every
            rss.append((time.monotonic() - start, daemon.rss_mb()))
            time.sleep(args.interval)
        drain_until = time.monotonic() + 300  # let the queue drain
        time.sleep(2)
        while probe.last("state") != b"idle" and time.monotonic() < drain_until:
            time.sleep(1)
        time.sleep(3)
        events = list(probe.event_log)
        # every connect says online (live, not a retained copy): the first, one after each broker restart;
        # any more is a connection the broker dropped
        onlines = sum(1 for topic, payload, retained in probe.messages
                      if topic == probe.topic("status") and payload == b"online" and not retained)
    finally:
        alive = daemon.proc.poll() is None
        daemon.stop()
        probe.close()
        broker.stop()
        sink.stop()

    finished = {}
    for e in events:
        if e["event"] == "finished" and e.get("id"):
            finished[e["id"]] = finished.get(e["id"], 0) + 1
    errors = [e for e in events if e["event"] == "error"]
    unanswered = [r for r in sent_valid if r not in finished and not any(e.get("id") == r for e in errors)]
    twice = [r for r, n in finished.items() if n > 1]
    unanswered += [r for r in sent_bad_ids if not any(e.get("id") == r for e in errors)]
    print(f"# soak: {args.minutes:g} min, voice {args.voice}, broker restarted every {args.restart_every:g} s")
    print(f"valid sent {len(sent_valid)}, finished {len(finished)}, spoken twice {len(twice)}, "
          f"unanswered {len(unanswered)}; invalid sent {len(sent_invalid)}, junk commands {junk_commands}, "
          f"error events {len(errors)}")
    flaps = onlines - 1 - restarts
    retained_volume_obeyed = probe.last("volume") == b"5"
    print(f"connections dropped other than by a broker restart: {flaps} (online {onlines} times, the broker "
          f"restarted {restarts} times); the retained volume 5 % obeyed: {retained_volume_obeyed}")
    if rss:
        first = min(r for t, r in rss if t >= min(60, rss[-1][0] / 2))
        print(f"RSS MB: start {rss[0][1]:.0f}, after warm-up {first:.0f}, end {rss[-1][1]:.0f}, "
              f"max {max(r for _, r in rss):.0f}")
    print(f"daemon alive at the end: {alive}; log: {work / 'daemon.log'}")
    ok = alive and not unanswered and not twice and flaps <= 0 and not retained_volume_obeyed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
