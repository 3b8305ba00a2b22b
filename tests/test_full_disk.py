"""A full disk costs the phrase cache, never the message (#45).

The real daemon, broker and ALSA sink, the real Wyoming socket. The disk is
made unable to write in two real ways: a file-size limit on the running
daemon (RLIMIT_FSIZE: Python ignores SIGXFSZ, so its writes fail with EFBIG,
the path a full disk takes), and, as root, a small tmpfs filled to the last
block under the cache and the state files (ENOSPC).
"""

import asyncio
import errno
import os
import resource
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from conftest import REPO
from harness import Mosquitto, appliance, free_port, wait_for, write_config

# texts not spoken before in the test: each is synthesized, so the cache tries to store it
TEXTS = iter(f"{n}番の部屋の窓が開いています。閉めてください。" for n in range(1, 1000))
CANNOT_STORE = "phrase cache: cannot store"  # the daemon's log line, said once until a store works


def temporary_files(cache_dir: Path) -> list[Path]:
    return [p for p in cache_dir.iterdir() if p.is_file() and ".tmp" in p.name]


def cached_phrases(cache_dir: Path) -> list[Path]:
    return list(cache_dir.glob("*.f32"))


def wyoming_request(port: int, text: str) -> list[str]:
    """The types of the events a Wyoming client gets for `text`, up to audio-stop, an error or the end."""
    async def go():
        async with AsyncTcpClient("127.0.0.1", port, connect_timeout=10, read_timeout=60) as c:
            await c.write_event(Synthesize(text=text).event())
            types = []
            while True:
                event = await c.read_event()
                if event is None:
                    return types
                types.append(event.type)
                if event.type in ("audio-stop", "error"):
                    return types

    return asyncio.run(go())


@contextmanager
def speaking_appliance(work: Path, **sections):
    """The daemon with Wyoming on (a port of its own), until the block ends."""
    port = free_port()
    with appliance(work, wyoming={"enabled": True, "host": "127.0.0.1", "port": port, "zeroconf": False},
                   **sections) as app:
        def listening():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_for(listening, 30, what="the Wyoming server to listen")
        app.wyoming_port = port
        yield app


def assert_spoken_in_full(app, cache_dir: Path) -> None:
    """A new text over Wyoming ends with audio-stop, one over MQTT is `finished`; no temporary file is left."""
    types = wyoming_request(app.wyoming_port, next(TEXTS))
    assert types[0] == "audio-start" and types[-1] == "audio-stop", types
    answer = app.probe.reply("say", {"text": next(TEXTS), "id": f"full-{time.monotonic()}"}, timeout=90)
    assert answer["event"] == "finished", answer
    assert not answer.get("interrupted"), answer
    assert temporary_files(cache_dir) == []


def test_a_file_size_limit_costs_the_cache_not_the_message(tmp_path):
    """EFBIG (the path of a full disk): every message is heard and answered `finished`, every Wyoming
    stream ends with audio-stop, no temporary file stays, and the log says so once, not per message."""
    with speaking_appliance(tmp_path) as app:
        cache_dir = tmp_path / "cache"
        assert app.probe.reply("say", {"text": next(TEXTS), "id": "before"}, timeout=90)["event"] == "finished"
        stored = len(cached_phrases(cache_dir))
        assert stored == 1
        # below any phrase's size, above what the daemon's log (written by it too) grows to meanwhile
        limit = app.daemon.log.stat().st_size + 256 * 1024
        resource.prlimit(app.daemon.proc.pid, resource.RLIMIT_FSIZE, (limit, limit))
        for _ in range(2):
            assert_spoken_in_full(app, cache_dir)
        assert len(cached_phrases(cache_dir)) == stored  # nothing stored, nothing half-stored
        assert app.daemon.output().count(CANNOT_STORE) == 1, app.daemon.output()[-3000:]
        assert "File too large" in app.daemon.output()
        assert app.daemon.proc.poll() is None


def test_a_leftover_temporary_file_is_removed_at_start(tmp_path):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    leftover = cache_dir / ("0" * 64 + "-44100.tmp4242-140000000000")  # a store cut by a crash
    leftover.write_bytes(b"\0" * 4096)
    with appliance(tmp_path):
        assert not leftover.exists()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@contextmanager
def small_disk(folder: Path, size: str):
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path, leave_bytes: int = 0) -> Path:
    """Fill the file system of `folder` up to its last `leave_bytes` (0: every block)."""
    filler = folder / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize - leave_bytes
                if free <= 0:
                    break
                f.write(b"\0" * min(free, 1 << 20))
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


@needs_root
def test_a_full_disk_costs_the_cache_not_the_message(tmp_path):
    """ENOSPC under the phrase cache and the state files (speaking.json and received.json are written at
    each message): messages are `finished`, Wyoming ends its streams, Home Assistant's diagnostic
    sensor says the disk is low; once space is back the cache stores again."""
    with small_disk(tmp_path / "disk", "160m") as disk:
        cache_dir = disk / "cache"
        with speaking_appliance(tmp_path, cache={"dir": str(cache_dir)},
                                state={"file": str(disk / "state" / "state.json")}) as app:
            wait_for(lambda: app.probe.last("pi/disk_low") == b"OFF", 10, what="the disk space sensor at connect")
            filler = fill(disk)
            for _ in range(2):
                assert_spoken_in_full(app, cache_dir)
            assert cached_phrases(cache_dir) == []
            log = app.daemon.output()
            assert log.count(CANNOT_STORE) == 1, log[-3000:]
            assert "No space left on device" in log
            assert log.count("received.json") <= 1 and log.count("speaking.json") <= 1, log[-3000:]
            wait_for(lambda: app.probe.last("pi/disk_low") == b"ON", 60, what="the disk space sensor to say low")
            from hayakoe_pi.door.diskspace import LOW_FREE_MB

            assert float(app.probe.last("pi/disk_free")) < LOW_FREE_MB

            filler.unlink()
            answer = app.probe.reply("say", {"text": next(TEXTS), "id": "space-again"}, timeout=90)
            assert answer["event"] == "finished"
            assert len(cached_phrases(cache_dir)) == 1
            assert "phrase cache: storing again" in app.daemon.output()


@needs_root
def test_check_warns_of_low_disk_space(tmp_path):
    with small_disk(tmp_path / "disk", "8m") as disk:
        broker = Mosquitto(tmp_path / "broker").start()
        try:
            config = write_config(tmp_path / "c.yaml", broker.port, "chk", disk,
                                  state={"file": str(tmp_path / "state" / "state.json")})
            fill(disk, leave_bytes=1 << 20)
            r = subprocess.run([sys.executable, "-m", "hayakoe_pi.cli", "check", "--config", str(config)],
                               capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, PYTHONPATH=str(REPO)))
        finally:
            broker.stop()
    lines = [line for line in r.stdout.splitlines() if " disk: " in line]
    cache_line = next(line for line in lines if str(disk / "cache") in line)
    assert cache_line.startswith("warn") and "MB free" in cache_line and "low" in cache_line, r.stdout
    state_line = next(line for line in lines if str(tmp_path / "state") in line)
    assert state_line.startswith("ok"), r.stdout
