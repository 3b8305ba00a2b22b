"""Real parts for end-to-end tests: a mosquitto broker, an ALSA sink, the daemon process."""

from __future__ import annotations

import json
import os
import pwd
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

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
            # as root mosquitto would switch to its own user and fail to save its database here
            + (f"user {pwd.getpwuid(os.getuid()).pw_name}\n" if os.getuid() == 0 else "")
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


def settle(app, timeout: float = 60):
    """Wait until the daemon has spoken everything and the sink is drained."""
    wait_for(lambda: app.probe.last("state") == b"idle", timeout, what="idle")
    size = -1
    while app.sink.raw.stat().st_size != size:
        size = app.sink.raw.stat().st_size
        time.sleep(0.4)


class AlsaSink:
    """ALSA's default device written to a FIFO that is drained at real-time speed.

    The file plugin has no clock of its own; reading the FIFO at the sample
    rate makes playback take as long as on a real sound card, so stop and
    interrupt can be tested. Everything played lands in `raw` (float32 mono).
    """

    def __init__(self, workdir: Path, sample_rate: int = 44100, bytes_per_frame: int = 4,
                 paced: bool = True):
        self.home = workdir / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.fifo = workdir / "alsa.fifo"
        self.raw = workdir / "played.raw"
        self.rate = sample_rate * bytes_per_frame if paced else float("inf")
        os.mkfifo(self.fifo)
        self.raw.write_bytes(b"")
        self.set_named_device(None)
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._plugged = threading.Event()
        self._plugged.set()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            self._plugged.wait()
            try:
                f = open(self.fifo, "rb", buffering=0)
            except OSError:  # unplugged just now
                time.sleep(0.05)
                continue
            with f, open(self.raw, "ab") as out:
                started, got = time.monotonic(), 0
                while self._plugged.is_set():
                    self._running.wait()
                    block = f.read(8192)
                    if not block:
                        break
                    out.write(block)
                    out.flush()
                    got += len(block)
                    ahead = got / self.rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)

    def set_named_device(self, name: str | None) -> None:
        """Besides `default`, offer (or withdraw, with None) a card called `name`.

        Takes effect when PortAudio next scans for devices, as a USB speaker
        plugged in or pulled out would.
        """
        sink = f'type file; slave.pcm "null"; file "{self.fifo}"; format "raw"'
        text = f"pcm.!default {{ {sink} }}\n"
        if name:
            text += f'pcm.{name} {{ {sink}; hint {{ show on; description "test card" }} }}\n'
        (self.home / ".asoundrc").write_text(text)

    def pause(self) -> None:
        """Stop draining: the next writes block, like a wedged sound card."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def unplug(self) -> None:
        """Pull the card out: the reader goes away mid-write (ALSA reports an I/O
        error, as for a USB card pulled out) and the device cannot be opened again."""
        self._plugged.clear()
        away = self.fifo.with_name(self.fifo.name + ".away")
        self.fifo.rename(away)
        self.fifo.mkdir()  # opening a directory for writing fails
        self._wake_reader(away)

    def plug_in(self) -> None:
        away = self.fifo.with_name(self.fifo.name + ".away")
        self.fifo.rmdir()
        away.rename(self.fifo)
        self._plugged.set()

    @staticmethod
    def _wake_reader(fifo: Path) -> None:
        """Unblock a reader waiting in open() for a writer."""
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    def played_seconds(self) -> float:
        return self.raw.stat().st_size / self.rate

    def stop(self) -> None:
        self._stop.set()
        self._running.set()
        self._plugged.set()
        self._wake_reader(self.fifo)


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
    def __init__(self, config: Path, home: Path, log: Path, env: dict | None = None):
        env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
               **(env or {})}
        if "NOTIFY_SOCKET" not in (env or {}):
            env.pop("NOTIFY_SOCKET", None)
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-m", "hayakoe_pi.cli", "run", "--config", str(config)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

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


@contextmanager
def running_daemon(work: Path, port: int, prefix: str, probe, sink_kwargs: dict | None = None,
                   env: dict | None = None, **config_sections):
    """The daemon on the broker at `port`, playing into its own ALSA sink, until the block ends.

    `probe` (already subscribed) tells when it is online. Yields a namespace
    with work, sink, probe, daemon, prefix and config.
    """
    sink = AlsaSink(work, **(sink_kwargs or {}))
    config = write_config(work / "config.yaml", port, prefix, work, **config_sections)
    daemon = DaemonProcess(config, sink.home, work / "daemon.log", env=env)
    try:
        wait_for(lambda: probe.last("status") == b"online" or daemon.proc.poll() is not None, 90,
                 what="the daemon to come online")
        assert daemon.proc.poll() is None, daemon.output()
        yield SimpleNamespace(work=work, sink=sink, probe=probe, daemon=daemon, prefix=prefix, config=config)
    finally:
        daemon.stop()
        sink.stop()


@contextmanager
def appliance(work: Path, make_probe=None, sink_kwargs: dict | None = None, env: dict | None = None,
              **config_sections):
    """A private broker, a probe (`make_probe(port, prefix)`, default Probe) and the daemon."""
    broker = Mosquitto(work / "broker").start()
    prefix = f"hk{broker.port}"
    probe = (make_probe or Probe)(broker.port, prefix)
    try:
        with running_daemon(work, broker.port, prefix, probe, sink_kwargs, env, **config_sections) as app:
            app.broker = broker
            yield app
    finally:
        probe.close()
        broker.stop()


class NotifySocket:
    """Stands in for systemd: records what the daemon sends to $NOTIFY_SOCKET."""

    def __init__(self, path: Path):
        self.path = path
        self.received: list[tuple[float, str]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except OSError:
                continue
            for field in data.decode().splitlines():
                self.received.append((time.monotonic(), field))

    def since(self, t: float, field: str) -> int:
        return sum(1 for when, f in self.received if when >= t and f == field)

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


class SessionProbe(Probe):
    """A Probe that survives broker restarts and can log in.

    Own persistent session (fixed client id, clean_session off) unless told
    otherwise, so the broker queues what it misses while the broker restarts;
    subscribes again on every connect; optional user name, password and TLS CA.
    Deliveries flagged DUP that repeat an earlier payload (the broker
    resending after a restart) are kept in `dups`, not in `messages`/`events`.
    """

    def __init__(self, port: int, prefix: str, discovery_prefix: str = "homeassistant",
                 client_id: str | None = None, clean_session: bool = False,
                 username: str | None = None, password: str | None = None,
                 ca_file: str | Path | None = None, wait: float = 10.0):
        self.messages = []
        self.events = queue.Queue()
        self.event_log: list[dict] = []  # every event, in order of arrival
        self.dups: list[tuple[str, bytes]] = []
        self.prefix = prefix
        self.topics = [(f"{prefix}/#", 1), (f"{discovery_prefix}/#", 1)]
        self.connected = threading.Event()
        self.refused: list = []
        self.published: set[int] = set()
        self._seen: set[tuple[str, bytes]] = set()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id or f"probe-{free_port()}",
                                  clean_session=clean_session, protocol=paho.MQTTv311)
        if username is not None:
            self.client.username_pw_set(username, password)
        if ca_file is not None:
            self.client.tls_set(ca_certs=str(ca_file))
        self.client.reconnect_delay_set(min_delay=0.3, max_delay=1)
        self.client.on_message = self._on_message
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda *a: self.connected.clear()
        self.client.on_publish = lambda client, userdata, mid, rc, props: self.published.add(mid)
        self.client.connect_async("127.0.0.1", port, keepalive=5)
        self.client.loop_start()
        if wait:
            wait_for(lambda: self.connected.is_set() or self.refused, wait, what="the probe to connect")
            if self.refused:
                self.close()  # or paho would keep on trying
                raise AssertionError(f"probe refused by the broker: {self.refused[-1]}")

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self.refused.append(reason_code)
            return
        if not flags.session_present:  # a resumed session keeps its subscriptions (and no retained replay)
            client.subscribe(self.topics)
        self.connected.set()

    def _on_message(self, client, userdata, msg) -> None:
        key = (msg.topic, bytes(msg.payload))
        if msg.dup and key in self._seen:
            self.dups.append(key)
            return
        self._seen.add(key)
        super()._on_message(client, userdata, msg)
        if msg.topic == f"{self.prefix}/event":
            self.event_log.append(json.loads(msg.payload))

    def publish_nowait(self, subtopic: str, payload, qos: int = 1):
        """Hand a message to paho; it is sent (again) once connected. Returns its mid."""
        if isinstance(payload, (dict, list)):
            payload = json.dumps(payload, ensure_ascii=False)
        return self.client.publish(f"{self.prefix}/{subtopic}", payload, qos=qos).mid

    def count(self, event: str, id) -> int:
        return sum(1 for e in self.event_log if e.get("event") == event and e.get("id") == id)
