"""Playback through the real sounddevice → PortAudio → ALSA path, into a file sink."""

import json
import os
import subprocess
import sys
import wave

import numpy as np

from conftest import REPO
from harness import AlsaSink
from hayakoe_pi.audio import to_pcm16, write_wav

PLAY = """
import json, sys, threading, numpy as np
from hayakoe_pi.audio import Player, AudioError
args = json.loads(sys.argv[1])
chunks = [np.full(n, 0.5, np.float32) for n in args["chunks"]]
stop = threading.Event()
if args.get("stop_after"):
    threading.Timer(args["stop_after"], stop.set).start()
try:
    done = Player(args.get("device", "default")).play(iter(chunks), 44100, args["volume"], stop=stop)
    print(json.dumps({"done": done}))
except AudioError as e:
    print(json.dumps({"error": str(e)}))
"""


def play(sink, **args):
    env = dict(os.environ, HOME=str(sink.home), PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", PLAY, json.dumps(args)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def played(sink):
    import time

    size = -1
    while sink.raw.stat().st_size != size:  # let the paced reader finish
        size = sink.raw.stat().st_size
        time.sleep(0.3)
    return np.fromfile(sink.raw, dtype="<f4")


def test_chunks_play_back_to_back_with_volume_and_fades(tmp_path):
    sink = AlsaSink(tmp_path)
    try:
        assert play(sink, chunks=[4410, 3000, 5000], volume=0.5) == {"done": True}
        pcm = played(sink)
    finally:
        sink.stop()
    assert pcm.size == 4410 + 3000 + 5000
    fade = int(44100 * 0.008)
    assert abs(pcm[0]) < 0.01 and abs(pcm[-1]) < 0.01  # faded in and out
    assert np.all(np.diff(pcm[:fade]) >= 0) and np.all(np.diff(pcm[-fade:]) <= 0)
    # between the fades: exactly the signal at half volume, no gap or click at chunk joins
    assert np.allclose(pcm[fade:-fade], 0.25)


def test_stop_cuts_playback_short_with_a_fade(tmp_path):
    sink = AlsaSink(tmp_path)
    try:
        assert play(sink, chunks=[44100 * 4], volume=1.0, stop_after=1.0) == {"done": False}
        pcm = played(sink)
    finally:
        sink.stop()
    assert 0 < pcm.size < 44100 * 3
    assert abs(pcm[-1]) < 0.05


def test_missing_device_is_a_clear_error(tmp_path):
    sink = AlsaSink(tmp_path)
    try:
        result = play(sink, chunks=[100], volume=1.0, device="no-such-card")
    finally:
        sink.stop()
    assert "no-such-card" in result["error"]


def test_wav_is_16_bit_mono(tmp_path):
    audio = np.array([0.0, 0.5, -0.5, 1.5, -2.0], np.float32)
    write_wav(tmp_path / "a.wav", audio, 22050)
    with wave.open(str(tmp_path / "a.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 22050, 5)
        data = np.frombuffer(w.readframes(5), "<i2")
    assert list(data) == list(to_pcm16(audio)) == [0, 16384, -16384, 32767, -32767]
