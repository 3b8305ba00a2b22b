"""Real parts for end-to-end tests: a mosquitto broker, an ALSA sink, the daemon process."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from conftest import FIXTURE_MODELS, REPO

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


class Mosquitto:
    """A private broker on a free loopback port."""

    def __init__(self, workdir: Path, extra_conf: str = "", port: int | None = None):
        self.port = port or free_port()
        self.workdir = workdir
        self.conf = workdir / "mosquitto.conf"
        self.extra_conf = extra_conf
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Mosquitto":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            + (self.extra_conf or "allow_anonymous true\n")
            + f"persistence true\npersistence_location {self.workdir}/\n"
        )
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=open(self.workdir / "mosquitto.log", "ab"))

        def listening():
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_for(listening, 10, what="mosquitto to listen")
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class AlsaSink:
    """ALSA's default device written to a FIFO that is drained at real-time speed.

    The file plugin has no clock of its own; reading the FIFO at the sample
    rate makes playback take as long as on a real sound card, so stop and
    interrupt can be tested. Everything played lands in `raw` (float32 mono).
    """

    def __init__(self, workdir: Path, sample_rate: int = 44100, bytes_per_frame: int = 4):
        self.home = workdir / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.fifo = workdir / "alsa.fifo"
        self.raw = workdir / "played.raw"
        self.rate = sample_rate * bytes_per_frame
        os.mkfifo(self.fifo)
        self.raw.write_bytes(b"")
        (self.home / ".asoundrc").write_text(
            f'pcm.!default {{ type file; slave.pcm "null"; file "{self.fifo}"; format "raw" }}\n'
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            with open(self.fifo, "rb", buffering=0) as f, open(self.raw, "ab") as out:
                started, got = time.monotonic(), 0
                while True:
                    block = f.read(8192)
                    if not block:
                        break
                    out.write(block)
                    out.flush()
                    got += len(block)
                    ahead = got / self.rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)

    def played_seconds(self) -> float:
        return self.raw.stat().st_size / self.rate

    def stop(self) -> None:
        self._stop.set()
        try:  # unblock a reader waiting for a writer
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass


class Probe:
    """An MQTT client that records everything under the daemon's prefix."""

    def __init__(self, port: int, prefix: str, discovery_prefix: str = "homeassistant"):
        self.messages: list[tuple[str, bytes, bool]] = []
        self.events: "queue.Queue[dict]" = queue.Queue()
        self.prefix = prefix
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"probe-{free_port()}")
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe([(f"{prefix}/#", 1), (f"{discovery_prefix}/#", 1)])
        self.client.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        self.messages.append((msg.topic, msg.payload, bool(msg.retain)))
        if msg.topic == f"{self.prefix}/event":
            self.events.put(json.loads(msg.payload))

    def publish(self, subtopic: str, payload, qos: int = 1) -> None:
        if isinstance(payload, (dict, list)):
            payload = json.dumps(payload, ensure_ascii=False)
        self.client.publish(f"{self.prefix}/{subtopic}", payload, qos=qos).wait_for_publish(5)

    def next_event(self, timeout: float = 60.0, **match) -> dict:
        """The next event whose fields equal `match` (others are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no event matching {match} within {timeout:g} s")
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if all(event.get(k) == v for k, v in match.items()):
                return event

    def expect(self, *matches: dict, timeout: float = 60.0) -> list[dict]:
        """Events matching each of `matches`, in whatever order they come."""
        found: list[dict | None] = [None] * len(matches)
        deadline = time.monotonic() + timeout
        while None in found:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [m for m, f in zip(matches, found) if f is None]
                raise AssertionError(f"no events matching {missing} within {timeout:g} s")
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            for i, m in enumerate(matches):
                if found[i] is None and all(event.get(k) == v for k, v in m.items()):
                    found[i] = event
                    break
        return found

    def last(self, subtopic: str) -> bytes | None:
        topic = f"{self.prefix}/{subtopic}"
        for t, payload, _ in reversed(self.messages):
            if t == topic:
                return payload
        return None

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def write_config(path: Path, port: int, prefix: str, workdir: Path, **sections) -> Path:
    config = {
        "mqtt": {"host": "127.0.0.1", "port": port, "topic_prefix": prefix,
                 "client_id": f"hayakoe-test-{prefix}", "keepalive": 5},
        "models": {"dir": str(FIXTURE_MODELS)},
        "voice": {"name": "tiny-voice"},
        "audio": {"retry_seconds": 0.5},
        "cache": {"dir": str(workdir / "cache"), "max_mb": 50},
        "state": {"file": str(workdir / "state" / "state.json")},
        "log": {"level": "DEBUG"},
    }
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    return path


class DaemonProcess:
    def __init__(self, config: Path, home: Path, log: Path):
        env = dict(os.environ, HOME=str(home), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        env.pop("NOTIFY_SOCKET", None)
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-m", "hayakoe_pi.cli", "run", "--config", str(config)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
