"""Real parts for end-to-end tests: a mosquitto broker, an ALSA sink, the daemon process."""

from __future__ import annotations

import bisect
import errno
import fcntl
import itertools
import json
import os
import pwd
import queue
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import paho.mqtt.client as paho
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from conftest import FIXTURE_MODELS, REPO
from slow_kinds import PREPARES_MODELS, REALTIME_CARD, slow

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int, proc) -> bool:
    """Something accepts connections on 127.0.0.1:`port`, or the process `proc` (Popen) has ended."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return proc.poll() is not None


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


class Mosquitto:
    """A private broker on a free loopback port (the same port again after a restart).

    `as_installed`: configured with the drop-in install.sh writes (mosquitto/hayakoe-pi.conf).
    """

    def __init__(self, workdir: Path, extra_conf: str = "", port: int | None = None, as_installed: bool = False):
        self.port = port or free_port()
        self.workdir = workdir
        self.conf = workdir / "mosquitto.conf"
        self.extra_conf = extra_conf
        self.as_installed = as_installed
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Mosquitto":
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.as_installed:
            text = (REPO / "mosquitto" / "hayakoe-pi.conf").read_text()
            text = text.replace("@PORT@", str(self.port)).replace("@ADDRESS@", "127.0.0.1") + self.extra_conf
        else:
            text = (f"listener {self.port} 127.0.0.1\n" + (self.extra_conf or "allow_anonymous true\n")
                    + "persistence true\n")
        self.conf.write_text(
            text + f"persistence_location {self.workdir}/\n"
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

    def kill(self) -> None:
        """kill -9: no clean shutdown, so no last save of its store."""
        self.proc.kill()
        self.proc.wait(10)


def settle(app, timeout: float = 60):
    """Wait until the daemon has spoken everything and the sink is drained."""
    wait_for(lambda: app.probe.last("state") == b"idle", timeout, what="idle")
    size = -1
    while app.sink.raw.stat().st_size != size:
        size = app.sink.raw.stat().st_size
        time.sleep(0.4)


class Hole(NamedTuple):
    """The card ran dry because the writer was late."""

    pos: int        # offset into AlsaSink.raw where the late data starts
    seconds: float  # how long the card had nothing to play
    at: float       # monotonic time the late data came


@dataclass
class SinkOpen:
    """One open of the device by the writer (PortAudio opens it per stream)."""

    opened: float                    # monotonic time the writer opened the FIFO
    start: int                       # offset into raw of its first byte
    first_data: float | None = None  # when its first byte came
    closed: float | None = None      # when the writer closed its end (seen within a tick)
    eof: float | None = None         # when the card had taken its last byte
    end: int | None = None           # offset into raw after its last byte


F_SETPIPE_SZ = 1031


@slow(REALTIME_CARD)
class AlsaSink:
    """ALSA's default device written to a FIFO, drained like a sound card.

    ALSA's file plugin (over the null pcm, which never blocks) writes to the
    FIFO from inside the writer's snd_pcm write, so the writer is paced only by
    the pipe. Paced, the reader shrinks the pipe to `buffer_bytes` and plays the
    part of a card: it takes `rate` bytes/s, keeping about `period_bytes` ahead,
    so playback takes as long as on a real card, and when the card runs dry
    while the pipe is empty (the writer was late) that is recorded in `holes`.
    Everything played lands in `raw` (float32 mono, nothing inserted for holes);
    every open of the device in `opens`; when each byte was heard in `heard_at`.
    What the card holds, never reported to ALSA (its null pcm takes everything
    at once), is the pipe plus the `period_bytes` it has taken ahead: a larger
    `period_bytes` is a card with a deeper buffer.

    In front of the pipe, ALSA's file plugin holds back one ALSA buffer (1915
    frames = 7660 bytes at PortAudio's default latency, `held_back_bytes`) and
    writes it out only at the writer's next write or at drain: a hole's `pos`
    lies that much before the late write, and data after a gap of no more than
    `flush_bytes` followed by EOF is that drain, the end of the stream, not a
    hole. A card plays its buffer before it runs dry: so does this one, in
    `heard_at` (what comes first after a hole is heard on the old schedule).
    """

    def __init__(self, workdir: Path, sample_rate: int = 44100, bytes_per_frame: int = 4,
                 paced: bool = True, buffer_bytes: int = 16384, period_bytes: int = 4096,
                 tick: float = 0.004, min_hole: float = 0.002, flush_bytes: int = 8192,
                 held_back_bytes: int = 7660):
        self.home = workdir / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.fifo = workdir / "alsa.fifo"
        self.raw = workdir / "played.raw"
        self.sample_rate, self.bytes_per_frame, self.paced = sample_rate, bytes_per_frame, paced
        self.rate = sample_rate * bytes_per_frame if paced else float("inf")
        self.buffer_bytes, self.period_bytes, self.tick = buffer_bytes, period_bytes, tick
        self.min_hole, self.flush_bytes, self.held_back_bytes = min_hole, flush_bytes, held_back_bytes
        self.holes: list[Hole] = []
        self.opens: list[SinkOpen] = []
        self._size = 0  # bytes in raw
        self._heard: tuple[list[int], list[float]] = ([], [])  # a block's offset in raw, when it began to play
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

    def _gone(self) -> bool:
        return self._stop.is_set() or not self._plugged.is_set()

    def _drain(self) -> None:
        keep = None  # a reader end held while plugged: the pipe, and its size, outlive each writer
        while not self._stop.is_set():
            if not self._plugged.wait(0.1):
                continue
            if keep is None:
                try:
                    # O_NONBLOCK: creates the pipe without waiting for a writer, so it
                    # can be shrunk before a writer can have filled it
                    keep = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
                except OSError:  # unplugged just now
                    time.sleep(0.05)
                    continue
                if not stat.S_ISFIFO(os.fstat(keep).st_mode):  # the directory unplug() leaves
                    os.close(keep)
                    keep = None
                    time.sleep(0.05)
                    continue
                self._shrunk = not self.paced or self._shrink(keep)
            # a blocking open of the same FIFO returns when a writer opens it: the time of the open
            fd = os.open(f"/proc/self/fd/{keep}", os.O_RDONLY)
            try:
                if not self._gone():
                    os.set_blocking(fd, False)  # the card never waits for data
                    self._take(fd)
            finally:
                os.close(fd)
                if self._gone():  # the writer's next write fails, as for a card pulled out
                    os.close(keep)
                    keep = None
        if keep is not None:
            os.close(keep)

    def _shrink(self, fd: int) -> bool:
        try:
            fcntl.fcntl(fd, F_SETPIPE_SZ, self.buffer_bytes)
            return True
        except OSError as e:  # EBUSY: a writer waiting for us already put more in
            if e.errno != errno.EBUSY:
                raise
            return False

    def _take(self, fd: int) -> None:
        """Play what one writer sends until it closes (or the card goes away)."""
        rec = SinkOpen(opened=time.monotonic(), start=self._size)
        self.opens.append(rec)
        period = self.period_bytes / self.rate
        card_end = None     # when the card will have played all it took; its clock starts at the first byte
        empty_since = None  # the pipe was found empty at this moment, and no data came since
        pending = None      # a hole, until enough data follows it to tell it from the drain at the end
        held_back = 0       # after a hole: bytes of the buffer the file plugin held back, still to come
        dry = False         # the card ran dry: it starts again once the held-back buffer has come
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        with open(self.raw, "ab") as out:
            while not self._gone():
                if not self._running.is_set():
                    # a wedged card: neither its silence nor the writer blocked behind it is the writer's fault
                    left = card_end - time.monotonic() if card_end is not None else None
                    while not self._running.wait(0.05):
                        if self._gone():
                            return
                    if left is not None:
                        card_end = time.monotonic() + max(left, 0.0)
                    empty_since = None
                    continue
                now = time.monotonic()
                if rec.closed is None and any(ev & select.POLLHUP for _, ev in poller.poll(0)):
                    rec.closed = now
                level = card_end - now if card_end is not None else 0.0
                if self.paced and level >= period:
                    time.sleep(self.tick)
                    continue
                want = 1 << 16 if not self.paced else \
                    max(1, int((period - max(level, 0.0)) * self.sample_rate)) * self.bytes_per_frame
                try:
                    block = os.read(fd, want)
                except BlockingIOError:
                    if empty_since is None:
                        empty_since = now
                    # dry: wake at the writer's next byte, which ends the hole; else look again next tick
                    poller.poll(50 if level <= 0 else self.tick * 1000)
                    continue
                now = time.monotonic()
                if not block:
                    rec.eof = now
                    rec.closed = rec.closed or now
                    rec.end = self._size
                    return  # a pending hole was the end of the stream
                if not self._shrunk:
                    self._shrunk = self._shrink(fd)
                if card_end is None:
                    rec.first_data = card_end = now
                elif not dry and now > card_end and (empty_since is not None or not self.paced):
                    # dry: the pipe was empty, the writer was late (dry already: the same hole goes on)
                    if self.paced and now - max(card_end, empty_since) >= self.min_hole:
                        if pending:
                            self.holes.append(pending)
                        pending = Hole(self._size, now - max(card_end, empty_since), now)
                    held_back, dry = self.held_back_bytes if self.paced else 0, True
                # else a late reader (this process busy) found data waiting: a card plays it on time
                early = min(held_back, len(block))  # played before the card ran dry
                held_back -= early
                if early:
                    self._heard_from(self._size, card_end)
                    card_end += early / self.rate
                if early < len(block):
                    if dry:
                        card_end, dry = max(card_end, now), False
                    self._heard_from(self._size + early, card_end)
                    card_end += (len(block) - early) / self.rate
                empty_since = None
                out.write(block)
                out.flush()
                self._size += len(block)
                if pending and self._size - pending.pos > self.flush_bytes:
                    self.holes.append(pending)
                    pending = None
                if self.paced:
                    time.sleep(self.tick)

    def _heard_from(self, pos: int, when: float) -> None:
        """The card plays byte `pos` on at `when` (once it has played all it took before)."""
        self._heard[0].append(pos)
        self._heard[1].append(when)

    def heard_at(self, pos: int) -> float:
        """When (time.monotonic()) the card played byte `pos` of raw: what is heard then."""
        i = bisect.bisect_right(self._heard[0], pos) - 1
        assert i >= 0, f"byte {pos} not played yet"
        return self._heard[1][i] + (pos - self._heard[0][i]) / self.rate

    def first_heard(self, after: int, timeout: float = 10) -> float:
        """When (time.monotonic()) the first sound from byte `after` on was heard (waits for it)."""
        pos = wait_for(lambda: self.first_sound(after), timeout, what="a sound to be played")
        return self.heard_at(pos)

    def first_sound(self, after: int) -> int | None:
        """Offset in raw of the first non-zero sample from byte `after` on (None: silence only)."""
        import numpy as np

        with open(self.raw, "rb") as f:
            f.seek(after)
            data = f.read()
        pcm = np.frombuffer(data[:len(data) // 4 * 4], dtype="<f4")
        nonzero = np.flatnonzero(pcm)
        return after + int(nonzero[0]) * self.bytes_per_frame if nonzero.size else None

    def holes_in_speech(self, min_seconds: float = 0.0) -> list[Hole]:
        """Holes with sound within 10 ms of them (the engine's pauses are exact zeros)."""
        return [h for h in self.holes if h.seconds >= min_seconds and self._sound_near(h.pos)]

    def holes_in_pauses(self) -> list[Hole]:
        return [h for h in self.holes if not self._sound_near(h.pos)]

    def _sound_near(self, pos: int) -> bool:
        import numpy as np

        span = int(0.01 * self.sample_rate) * self.bytes_per_frame
        start = max(0, pos - span - pos % self.bytes_per_frame)
        with open(self.raw, "rb") as f:
            f.seek(start)
            data = f.read(pos + span - start)
        return bool(np.frombuffer(data[:len(data) // 4 * 4], dtype="<f4").any())

    def reset_records(self) -> None:
        self.holes.clear()
        self.opens.clear()

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
        """Stop draining: the next writes block, like a wedged sound card.

        The card's fault, so the silence is no hole; its clock resumes with resume()."""
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
        for _ in range(20):  # a wake-up can slip in just before the reader starts to wait
            self._wake_reader(self.fifo)
            self._thread.join(0.1)
            if not self._thread.is_alive():
                break


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
_cgroup_names = itertools.count()


def cpu_cgroup_available() -> str | None:
    """None if cpu_limited() can work here, else why not (for pytest.skip)."""
    if os.geteuid() != 0:
        return "limiting CPU with cgroups needs root"
    if not (CPU_CGROUP / "cpu.cfs_quota_us").is_file():
        return f"no cgroup v1 cpu controller with CFS bandwidth mounted at {CPU_CGROUP}"
    probe = CPU_CGROUP / f"hayakoe-probe-{os.getpid()}-{next(_cgroup_names)}"
    try:
        probe.mkdir()
        try:
            (probe / "cpu.cfs_quota_us").write_text("50000")
        finally:
            probe.rmdir()
    except OSError as e:
        return f"cannot create a cpu cgroup under {CPU_CGROUP}: {e}"
    return None


MEMORY_CGROUP = Path("/sys/fs/cgroup/memory")


def memory_cgroup_available() -> str | None:
    """None if run_with_memory_limit() can work here, else why not (for pytest.skip)."""
    if os.geteuid() != 0:
        return "limiting memory with cgroups needs root"
    if not (MEMORY_CGROUP / "memory.limit_in_bytes").is_file():
        return f"no cgroup v1 memory controller mounted at {MEMORY_CGROUP}"
    probe = MEMORY_CGROUP / f"hayakoe-probe-{os.getpid()}-{next(_cgroup_names)}"
    try:
        probe.mkdir()
        try:
            (probe / "memory.limit_in_bytes").write_text(str(512 << 20))
        finally:
            probe.rmdir()
    except OSError as e:
        return f"cannot create a memory cgroup under {MEMORY_CGROUP}: {e}"
    return None


def run_with_memory_limit(cmd: list[str], limit_mb: int, **kwargs) -> tuple[subprocess.CompletedProcess, float]:
    """Run `cmd` (and all it starts) in a memory cgroup of `limit_mb`: over it, the kernel's
    OOM killer kills it as on a Pi with that much free. Returns the result and the group's peak (MB)."""
    group = MEMORY_CGROUP / f"hayakoe-test-{os.getpid()}-{next(_cgroup_names)}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_mb << 20))
        procs = str(group / "cgroup.procs")

        def join():  # in the child before exec: everything it runs is inside
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        done = subprocess.run(cmd, preexec_fn=join, **kwargs)
        peak = int((group / "memory.max_usage_in_bytes").read_text()) / (1 << 20)
        return done, peak
    finally:
        for _ in range(50):  # the group empties once its last process is reaped
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


class CpuLimit:
    """A child group of the cgroup v1 cpu controller: its processes share `cpus` CPUs.

    CFS bandwidth: per period the group may run cpus × period, then it is
    throttled until the next one. The period is short (20 ms) so that, like
    on a slow CPU, no thread stops for longer than a sound card's buffer
    (~93 ms) lasts: a longer period would starve the player thread as well.
    The kernel's smallest quota is 1 ms, so the least is 0.05 CPU. The quota
    is shared by all cores: a thread spinning on one uses up the time a
    thread on another needs, which no real slow CPU does; to stand for one
    slow core, start the process on one core (DaemonProcess `cores`).
    """

    PERIOD_US = 20000

    def __init__(self, cpus: float):
        self.path = CPU_CGROUP / f"hayakoe-test-{os.getpid()}-{next(_cgroup_names)}"
        self.path.mkdir()
        self._home: dict[int, Path] = {}  # pid → the group it came from
        self._closing = threading.Event()
        self._keepers: list[threading.Thread] = []  # let_out's: they move new threads in
        (self.path / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
        self.set(cpus)

    def set(self, cpus: float) -> None:
        (self.path / "cpu.cfs_quota_us").write_text(str(max(1000, int(cpus * self.PERIOD_US))))

    def add(self, pid: int) -> None:
        """Move a process in. cgroup v1 `cgroup.procs` moves all its threads at once
        (`tasks` would move one); threads and children it makes later are born inside."""
        self._home[pid] = self._group_of(pid)
        (self.path / "cgroup.procs").write_text(str(pid))

    def let_out(self, pid: int, thread: str) -> int:
        """Move process `pid`'s thread called `thread` (its kernel name) back where
        the process came from, alone: it runs at full speed beside the quota.

        A thread is born in its creator's group: the threads it starts later
        (the speaker's synthesis thread, one an utterance) would run outside
        too. Until close(), every other thread of `pid` found outside is moved
        in, within POLL_S of its start."""
        for tid in os.listdir(f"/proc/{pid}/task"):
            if Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() == thread:
                (self._home[pid] / "tasks").write_text(tid)
                keeper = threading.Thread(target=self._keep_in, args=(pid, int(tid)), daemon=True)
                keeper.start()
                self._keepers.append(keeper)
                return int(tid)
        raise AssertionError(f"process {pid} has no thread called {thread!r}")

    POLL_S = 0.005

    def _keep_in(self, pid: int, outside: int) -> None:
        while not self._closing.wait(self.POLL_S):
            try:
                inside = set(self.threads())
                for tid in map(int, os.listdir(f"/proc/{pid}/task")):
                    if tid != outside and tid not in inside:
                        (self.path / "tasks").write_text(str(tid))
            except (OSError, ProcessLookupError):  # the thread (or the process) ended meanwhile
                pass

    def threads(self) -> list[int]:
        return [int(t) for t in (self.path / "tasks").read_text().split()]

    def throttled(self) -> int:
        """How many periods the group was held back in."""
        stats = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return int(stats["nr_throttled"])

    @staticmethod
    def _group_of(pid: int) -> Path:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, rel = line.split(":", 2)
            if "cpu" in controllers.split(","):
                group = CPU_CGROUP / rel.lstrip("/")
                return group if group.is_dir() else CPU_CGROUP
        return CPU_CGROUP

    def close(self) -> None:
        """Move every process still inside (children too) back, and remove the group."""
        self._closing.set()
        for keeper in self._keepers:
            keeper.join()
        for _ in range(50):
            pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            for pid in pids:
                try:
                    (self._home.get(pid, CPU_CGROUP) / "cgroup.procs").write_text(str(pid))
                except (OSError, ProcessLookupError):  # gone meanwhile
                    pass
            try:
                self.path.rmdir()
                return
            except OSError as e:  # EBUSY: a process was still on its way out (or forked)
                if e.errno != errno.EBUSY:
                    raise
                time.sleep(0.02)
        raise AssertionError(f"cannot remove {self.path}: still has {pids}")


@contextmanager
def cpu_limited(pid: int | None, cpus: float):
    """Hold process `pid` (None: nobody yet, use .add) to `cpus` CPUs while the block runs."""
    group = CpuLimit(cpus)
    try:
        if pid is not None:
            group.add(pid)
        yield group
    finally:
        group.close()


# The tiny test voice decodes a second of audio in 0.02 CPU-seconds: even at the least
# quota (0.05 CPU) it is faster than real time, and no sentence ever has to wait. With
# this its decoder takes 0.4 CPU-seconds a second (engine.TEST_DECODER_CPU), as a real
# voice's on a slow CPU: on SLOW_CPUS, 1.6x slower than real time or more, on any
# machine. Slow enough that a long sentence's first window, however long paced_windows
# makes it, is ready before the rest can keep up, and only can_flow holds the sentence
# back (at 0.3 the first window took all the waiting: a slow-CPU test passed without can_flow).
HEAVY_DECODER = {"HAYAKOE_PI_TEST_DECODER_CPU": "0.4"}
SLOW_CPUS = 0.25


@contextmanager
def slow_cpu(pid: int, cpus: float = SLOW_CPUS):
    """Daemon `pid` under a CPU quota of `cpus`, all but its player thread.

    A quota stops every thread of the group for whole periods, and each compute
    thread runnable beside the player makes it wait for more of them: with the
    player inside, holes of 30-170 ms came in 4 of 8 runs of a slow-CPU test (in
    those looked into, the audio was ready; 0.1-0.3 s with two lanes), and at
    0.05 CPU a thread stopped while it holds Python's lock (the GIL) stops the
    player too. No real CPU stops a thread like that: on one, the player at
    nice 0 runs before the compute threads at nice 5 within a time slice. The
    synthesis thread the player starts for each utterance is moved inside
    (CpuLimit.let_out). Start the daemon with HEAVY_DECODER to be slower than
    real time."""
    with cpu_limited(pid, cpus) as group:
        group.let_out(pid, "speaker")
        yield group


DEVICE = "pi"  # the device.id write_config gives a daemon
# Home Assistant entities a Pi announces: say, state, volume, voice, style, stop, chime, quiet hours,
# disk free, disk low
ENTITIES = 10
OWN_TOPICS = ("status", "state", "event", "volume", "voice", "style")  # under the device: what it publishes


class Probe:
    """An MQTT client that records everything under the daemon's prefix.

    Subtopics name the household's topics (`say`, `stop`, ...) or, for what a
    Pi publishes and its settings (`event`, `status`, `volume/set`, ...), those
    of the probe's `device`; `<device>/say` is one Pi's own.
    """

    def __init__(self, port: int, prefix: str, discovery_prefix: str = "homeassistant", device: str = DEVICE):
        self.messages: list[tuple[str, bytes, bool]] = []
        self.events: "queue.Queue[dict]" = queue.Queue()
        self.prefix = prefix
        self.device = device
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"probe-{free_port()}")
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe([(f"{prefix}/#", 1), (f"{discovery_prefix}/#", 1)])
        self.client.loop_start()

    def topic(self, subtopic: str) -> str:
        if subtopic.split("/")[0] in OWN_TOPICS:
            return f"{self.prefix}/{self.device}/{subtopic}"
        return f"{self.prefix}/{subtopic}"

    def _on_message(self, client, userdata, msg) -> None:
        self.messages.append((msg.topic, msg.payload, bool(msg.retain)))
        if msg.topic == self.topic("event"):
            self.events.put(json.loads(msg.payload))

    def publish(self, subtopic: str, payload, qos: int = 1) -> None:
        if isinstance(payload, (dict, list)):
            payload = json.dumps(payload, ensure_ascii=False)
        self.client.publish(self.topic(subtopic), payload, qos=qos).wait_for_publish(5)

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

    def drain(self) -> None:
        """Drop the events received so far (answers to earlier requests)."""
        while True:
            try:
                self.events.get_nowait()
            except queue.Empty:
                return

    def reply(self, subtopic: str, payload, timeout: float = 60.0) -> dict:
        """Publish a request and return the daemon's last word on it: the first `error`,
        `finished`, `duplicate` or `expired` event with the request's id.

        The id is the payload's own "id" where it names a valid one. Otherwise the
        daemon makes one up (plain text, JSON without an id) or has none to give (a
        payload it cannot read, a setting): then the request's id is that of the
        first event after it. So events already received are dropped first, and the
        caller must have let earlier requests end (waited for their last event).
        """
        rid = payload.get("id") if isinstance(payload, dict) else None
        rid = str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None
        self.drain()
        self.publish(subtopic, payload)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no answer to {str(payload)[:80]!r} (id {rid}) within {timeout:g} s")
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if rid is None:  # the first event after the request: it names the request's id
                rid = event.get("id")
            elif event.get("id") != rid:
                continue
            if event.get("event") in ("error", "finished", "duplicate", "expired"):
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
        topic = self.topic(subtopic)
        for t, payload, _ in reversed(self.messages):
            if t == topic:
                return payload
        return None

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@slow(PREPARES_MODELS)
def prepare_with_two_lanes(derived: Path, voice: str = "tiny-voice") -> None:
    """Prepare `voice` of the fixture models into `derived` with two decoder lanes,
    whatever the tuner chose on this CPU (on one core it never would)."""
    from hayakoe_pi.models.lanes import LANE_WINDOW_FRAMES
    from hayakoe_pi.models.prepare import prepare

    prepare(FIXTURE_MODELS, derived, [voice])
    [record] = derived.rglob("tuning.*.json")
    tuning = json.loads(record.read_text())
    one_window = tuning["seconds"][tuning["form"]][-1]
    record.write_text(json.dumps({**tuning, "lanes": 2, "lane_seconds": 2 * one_window,
                                  "lane_frames": LANE_WINDOW_FRAMES}))


def write_config(path: Path, port: int, prefix: str, workdir: Path, **sections) -> Path:
    config = {
        "device": {"id": DEVICE},
        "mqtt": {"host": "127.0.0.1", "port": port, "topic_prefix": prefix,
                 "client_id": f"hayakoe-test-{prefix}", "keepalive": 5},
        "models": {"dir": str(FIXTURE_MODELS)},
        "voice": {"name": "tiny-voice"},
        # no lead-in, the card closed after each message: tests measure sound from the card's open
        # (test_announcements asks for a lead-in and keep-open)
        "audio": {"retry_seconds": 0.5, "lead_in_ms": 0, "keep_open_s": 0},
        "cache": {"dir": str(workdir / "cache"), "max_mb": 50},
        "state": {"file": str(workdir / "state" / "state.json")},
        # the test's own: the default (/var/lib/hayakoe-pi) would carry words from test to test
        "dictionary": {"file": str(workdir / "state" / "dictionary.yaml")},
        "log": {"level": "DEBUG"},
    }
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    return path


class DaemonProcess:
    def __init__(self, config: Path, home: Path, log: Path, env: dict | None = None, repo: Path = REPO,
                 cores: set[int] | None = None):
        env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(repo), "PYTHONUNBUFFERED": "1",
               **(env or {})}
        if "NOTIFY_SOCKET" not in (env or {}):
            env.pop("NOTIFY_SOCKET", None)
        self.log = log
        # `cores`: the daemon sees only these from the start (and sizes its thread pool to them)
        pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
        self.proc = subprocess.Popen([sys.executable, "-m", "hayakoe_pi.cli", "run", "--config", str(config)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"),
                                     preexec_fn=pin, cwd=repo)  # -m imports from the cwd first

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


@slow(REALTIME_CARD)
@contextmanager
def running_daemon(work: Path, port: int, prefix: str, probe, sink_kwargs: dict | None = None,
                   env: dict | None = None, cores: set[int] | None = None, **config_sections):
    """The daemon on the broker at `port`, playing into its own ALSA sink, until the block ends.

    `probe` (already subscribed) tells when it is online. Yields a namespace
    with work, sink, probe, daemon, prefix and config.
    """
    sink = AlsaSink(work, **(sink_kwargs or {}))
    config = write_config(work / "config.yaml", port, prefix, work, **config_sections)
    daemon = DaemonProcess(config, sink.home, work / "daemon.log", env=env, cores=cores)
    try:
        wait_for(lambda: probe.last("status") == b"online" or daemon.proc.poll() is not None, 90,
                 what="the daemon to come online")
        assert daemon.proc.poll() is None, daemon.output()
        yield SimpleNamespace(work=work, sink=sink, probe=probe, daemon=daemon, prefix=prefix, config=config)
    finally:
        daemon.stop()
        sink.stop()


@slow(REALTIME_CARD)
@contextmanager
def appliance(work: Path, make_probe=None, sink_kwargs: dict | None = None, env: dict | None = None,
              cores: set[int] | None = None, broker_conf: dict | None = None, **config_sections):
    """A private broker (`broker_conf`: Mosquitto's arguments), a probe (`make_probe(port, prefix)`,
    default Probe) and the daemon."""
    broker = Mosquitto(work / "broker", **(broker_conf or {})).start()
    prefix = f"hk{broker.port}"
    probe = (make_probe or Probe)(broker.port, prefix)
    try:
        with running_daemon(work, broker.port, prefix, probe, sink_kwargs, env, cores, **config_sections) as app:
            app.broker = broker
            yield app
    finally:
        probe.close()
        broker.stop()


@slow(REALTIME_CARD)
@contextmanager
def rooms(work: Path, cards: dict[str, tuple[dict, dict]], repo: Path = REPO):
    """A broker and a daemon a room, each on its own real-time test card: `cards` is
    {device.id: (AlsaSink options, audio config)}. Yields a namespace: `rooms` by name
    (sink, probe, daemon) and `sender`, a probe to publish with."""
    with ExitStack() as stack:
        broker = Mosquitto(work / "broker").start()
        stack.callback(broker.stop)
        prefix = f"hk{broker.port}"
        found = {}
        for name, (sink_kwargs, audio) in cards.items():
            (work / name).mkdir()
            sink = AlsaSink(work / name, **sink_kwargs)
            stack.callback(sink.stop)
            probe = Probe(broker.port, prefix, device=name)
            stack.callback(probe.close)
            config = write_config(work / name / "config.yaml", broker.port, prefix, work / name,
                                  device={"id": name}, mqtt={"client_id": None}, audio=audio)
            daemon = DaemonProcess(config, sink.home, work / name / "daemon.log", repo=repo)
            stack.callback(daemon.stop)
            found[name] = SimpleNamespace(name=name, sink=sink, probe=probe, daemon=daemon)
        for room in found.values():
            wait_for(lambda: room.probe.last("status") == b"online" or room.daemon.proc.poll() is not None, 90,
                     what=f"{room.name} to come online")
            assert room.daemon.proc.poll() is None, room.daemon.output()
        sender = Probe(broker.port, prefix, device="automation")
        stack.callback(sender.close)
        yield SimpleNamespace(rooms=found, sender=sender, broker=broker)


def say_at(house, names, at: float, rid: str, text: str = "夕ご飯ができました。") -> dict:
    """Rooms `names` of `rooms()` say `text` at `at` (Unix time): {name: (its `started`
    event, how many seconds after `at` its first sample was heard)}."""
    picked = [house.rooms[n] for n in names]
    for room in picked:
        wait_for(lambda: room.probe.last("state") == b"idle", 60, what=f"{room.name} idle")
        room.probe.drain()
    before = {room.name: room.sink.raw.stat().st_size for room in picked}
    for room in picked:
        house.sender.publish(f"{room.name}/say", {"text": text, "id": rid, "at": at})
    wall_minus_steady = time.time() - time.monotonic()
    heard = {}
    for room in picked:
        started = room.probe.next_event(event="started", id=rid, timeout=30)
        room.probe.next_event(event="finished", id=rid, timeout=30)
        heard[room.name] = (started, room.sink.first_heard(before[room.name]) + wall_minus_steady - at)
    return heard


def message_before(house, name: str) -> None:
    """A message to room `name` (its card then kept open, full of silence, if it keeps it),
    and half a second more of the card's sound (or the card closed), so that none of the
    message is left in it."""
    room = house.rooms[name]
    rid = f"before-{time.monotonic_ns()}"
    house.sender.publish(f"{name}/say", {"text": "準備します。", "id": rid})
    room.probe.next_event(event="finished", id=rid, timeout=60)
    size = room.sink.raw.stat().st_size
    half_second = room.sink.sample_rate * room.sink.bytes_per_frame // 2
    wait_for(lambda: room.sink.raw.stat().st_size >= size + half_second
             or (room.sink.opens and room.sink.opens[-1].eof is not None), 10, what="half a second more")


class NotifySocket:
    """Stands in for systemd: records what the daemon sends to $NOTIFY_SOCKET."""

    def __init__(self, path: Path):
        self.path = path
        self.received: list[tuple[float, str]] = []
        self.made = time.monotonic()
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

    def quiet_for(self, field: str) -> float:
        """Seconds since `field` last came (since the socket was made, if never)."""
        last = max((when for when, f in self.received if f == field), default=self.made)
        return time.monotonic() - last

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
                 client_id: str | None = None, clean_session: bool = False, device: str = DEVICE,
                 username: str | None = None, password: str | None = None,
                 ca_file: str | Path | None = None, wait: float = 10.0):
        self.messages = []
        self.events = queue.Queue()
        self.event_log: list[dict] = []  # every event, in order of arrival
        self.dups: list[tuple[str, bytes]] = []
        self.prefix = prefix
        self.device = device
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
        if msg.topic == self.topic("event"):
            self.event_log.append(json.loads(msg.payload))

    def publish_nowait(self, subtopic: str, payload, qos: int = 1):
        """Hand a message to paho; it is sent (again) once connected. Returns its mid."""
        if isinstance(payload, (dict, list)):
            payload = json.dumps(payload, ensure_ascii=False)
        return self.client.publish(self.topic(subtopic), payload, qos=qos).mid

    def count(self, event: str, id) -> int:
        return sum(1 for e in self.event_log if e.get("event") == event and e.get("id") == id)
