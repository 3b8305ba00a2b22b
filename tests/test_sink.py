"""The test sound card: paced like a real card, it sees the writer being late.

Writers go through the real path (sounddevice → PortAudio → ALSA file plugin →
FIFO) in a subprocess whose HOME holds the sink's .asoundrc.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from harness import AlsaSink, cpu_cgroup_available, cpu_limited, wait_for

RATE = 44100
BYTES_PER_SECOND = RATE * 4

TONE = """
def tone(start, frames):  # never exactly zero, so a hole in it counts as in speech
    i = np.arange(start, start + frames)
    return (0.25 + 0.1 * np.sin(i * 0.0627)).astype(np.float32)
"""
exec(TONE)

WRITER = TONE + r"""
import json, sys, time
import numpy as np, sounddevice as sd
t0, n = time.monotonic(), 0
with sd.OutputStream(samplerate=44100, channels=1, dtype="float32") as stream:
    for kind, seconds in json.loads(sys.argv[1]):
        if kind == "sleep":
            time.sleep(seconds)
            continue
        frames = round(seconds * 44100)
        data = tone(n, frames) if kind == "audio" else np.zeros(frames, np.float32)
        n += frames
        for i in range(0, frames, 2048):
            stream.write(data[i:i + 2048].reshape(-1, 1))
print(json.dumps({"wall": time.monotonic() - t0}))
"""


def expected(steps) -> np.ndarray:
    parts, n = [], 0
    for kind, seconds in steps:
        if kind != "sleep":
            frames = round(seconds * RATE)
            parts.append(tone(n, frames) if kind == "audio" else np.zeros(frames, np.float32))
            n += frames
    return np.concatenate(parts)


def play(sink: AlsaSink, steps) -> dict:
    """Run the writer; return its report once the card has taken everything."""
    r = subprocess.run([sys.executable, "-c", WRITER, json.dumps(steps)], capture_output=True, text=True,
                       timeout=30, env={**os.environ, "HOME": str(sink.home)})
    assert r.returncode == 0, r.stderr
    wait_for(lambda: [o for o in sink.opens if o.first_data] and sink.opens[-1].eof, 5, what="the card to finish")
    played = np.fromfile(sink.raw, dtype="<f4")
    assert np.array_equal(played, expected(steps))  # every sample, nothing inserted for holes
    return json.loads(r.stdout)


# The writer is ahead of the card by the pipe and the card's period: a gap of
# g seconds in the writer's writes leaves the card dry for g minus that lead.
def lead(sink: AlsaSink) -> float:
    return (sink.buffer_bytes + sink.period_bytes) / BYTES_PER_SECOND


@pytest.fixture
def sink(tmp_path):
    s = AlsaSink(tmp_path)
    yield s
    s.stop()


def test_a_steady_writer_leaves_no_holes_and_takes_real_time(sink):
    report = play(sink, [("audio", 2.0)])
    assert sink.holes == []
    assert report["wall"] >= 1.8
    assert sink.played_seconds() == pytest.approx(2.0, abs=0.001)
    (o,) = [o for o in sink.opens if o.first_data]
    assert o.start == 0 and o.end == 2 * BYTES_PER_SECOND
    assert o.opened <= o.first_data <= o.closed <= o.eof
    assert o.eof - o.first_data == pytest.approx(2.0 - sink.period_bytes / BYTES_PER_SECOND, abs=0.1)


def test_a_late_writer_makes_a_hole_in_speech(sink):
    play(sink, [("audio", 0.5), ("sleep", 0.4), ("audio", 0.5)])
    (hole,) = sink.holes
    assert sink.holes_in_speech() == [hole] and sink.holes_in_pauses() == []
    assert 0.25 <= hole.seconds <= 0.55
    assert hole.seconds == pytest.approx(0.4 - lead(sink), abs=0.05)
    # ALSA's file plugin holds back its buffer (1915 frames) until the next write
    assert 0.5 * BYTES_PER_SECOND - 0.1 * BYTES_PER_SECOND <= hole.pos <= 0.5 * BYTES_PER_SECOND
    assert hole.pos % 4 == 0


def test_silence_written_in_time_is_no_hole(sink):
    play(sink, [("audio", 0.5), ("zeros", 0.4), ("audio", 0.5)])
    assert sink.holes == []


def test_a_hole_in_a_pause_is_told_from_one_in_speech(sink):
    play(sink, [("audio", 0.5), ("zeros", 0.3), ("sleep", 0.4), ("audio", 0.5)])
    (hole,) = sink.holes_in_pauses()
    assert sink.holes_in_speech() == []
    assert hole.seconds == pytest.approx(0.4 - lead(sink), abs=0.05)
    assert 0.5 * BYTES_PER_SECOND < hole.pos <= 0.8 * BYTES_PER_SECOND


def test_a_gap_before_the_end_is_no_hole(sink):
    play(sink, [("audio", 0.5), ("sleep", 0.4)])
    assert sink.holes == []
    sink.reset_records()
    assert sink.holes == [] and sink.opens == []


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def cpu_group(pid: int) -> str:
    return next(line for line in open(f"/proc/{pid}/cgroup") if ":cpu:" in line)


def test_cpu_limited_holds_all_threads_of_a_process_to_its_share():
    reason = cpu_cgroup_available()
    if reason:
        pytest.skip(reason)
    # two busy threads each, started before the move: they must all go along
    busy = "import threading\nfor _ in range(2): threading.Thread(target=lambda: [0 for _ in iter(int, 1)]).start()\n"
    free = subprocess.Popen([sys.executable, "-c", busy])
    held = subprocess.Popen([sys.executable, "-c", busy])
    try:
        wait_for(lambda: len(os.listdir(f"/proc/{held.pid}/task")) == 3, 5, what="the threads")
        home = cpu_group(held.pid)
        with cpu_limited(held.pid, 0.3) as group:
            assert sorted(group.threads()) == sorted(int(t) for t in os.listdir(f"/proc/{held.pid}/task"))
            t0, held0, free0 = time.monotonic(), cpu_seconds(held.pid), cpu_seconds(free.pid)
            time.sleep(1.0)
            wall = time.monotonic() - t0
            held_rate = (cpu_seconds(held.pid) - held0) / wall
            free_rate = (cpu_seconds(free.pid) - free0) / wall
            assert group.throttled() > 0
        assert held_rate < 0.5, held_rate
        assert free_rate > 0.6, free_rate  # the same work, unlimited, in the same wall time
        assert not group.path.exists()
        assert cpu_group(held.pid) == home
    finally:
        for proc in (free, held):
            proc.kill()
            proc.wait()


def test_a_thread_let_out_runs_outside_the_quota_and_the_threads_it_starts_inside():
    reason = cpu_cgroup_available()
    if reason:
        pytest.skip(reason)
    # a thread named "speaker" (in the kernel) starts a thread for each line it reads, and says its id
    script = ("import ctypes, sys, threading, time\n"
              "def started():\n"
              "    print(threading.get_native_id(), flush=True)\n"
              "    time.sleep(60)\n"
              "def speaker():\n"
              "    ctypes.CDLL(None).prctl(15, b'speaker', 0, 0, 0)\n"
              "    print(threading.get_native_id(), flush=True)\n"
              "    for line in sys.stdin:\n"
              "        threading.Thread(target=started, daemon=True).start()\n"
              "threading.Thread(target=speaker).start()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        speaker = int(proc.stdout.readline())
        with cpu_limited(proc.pid, 0.3) as group:
            assert group.let_out(proc.pid, "speaker") == speaker
            assert speaker not in group.threads()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            born = int(proc.stdout.readline())  # in the speaker's group, outside
            wait_for(lambda: born in group.threads(), 2, what="the new thread moved inside")
            assert speaker not in group.threads()
        assert not group.path.exists()
    finally:
        proc.kill()
        proc.wait()
