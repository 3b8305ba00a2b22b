"""Playback through the real sounddevice → PortAudio → ALSA path, into a file sink."""

import json
import os
import subprocess
import sys
import wave

import numpy as np

from conftest import REPO
from harness import AlsaSink
from hayakoe_pi.sound.player import to_pcm16, write_wav

PLAY = """
import json, sys, threading, numpy as np
from hayakoe_pi.sound.player import Player, AudioError
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


# What Debian's pipewire-alsa and pulseaudio packages put in /etc/alsa/conf.d.
PIPEWIRE_DEFAULT = """pcm.!default {
    type pipewire
    playback_node "-1"
    capture_node  "-1"
    hint {
        show on
        description "Default ALSA Output (currently PipeWire Media Server)"
    }
}

ctl.!default {
    type pipewire
}
"""
PIPEWIRE_PCM = """pcm.pipewire {
    @args [ NODE ]
    type pipewire
}
"""
PULSE_IF_RUNNING = """hook_func.pulse_load_if_running {
\tlib "libasound_module_conf_pulse.so"
\tfunc "conf_pulse_hook_load_if_running"
}

@hooks [
\t{
\t\tfunc pulse_load_if_running
\t\tfiles [
\t\t\t"/usr/share/alsa/pulse-alsa.conf"
\t\t]
\t\terrors false
\t}
]
"""


def test_a_desktop_sound_server_owning_alsas_default_is_found(tmp_path):
    from hayakoe_pi.sound.player import desktop_sound_server

    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    asound = tmp_path / "asound.conf"
    (conf_d / "50-pipewire.conf").write_text(PIPEWIRE_PCM)  # defines a pcm, leaves default alone
    (conf_d / "99-pulse.conf").write_text(PULSE_IF_RUNNING)  # only inside a running PulseAudio session
    (conf_d / "99-pipewire-default.conf.example").write_text(PIPEWIRE_DEFAULT)  # not loaded by ALSA
    asound.write_text("# pcm.!default pulse\npcm.!default { type plug slave.pcm \"dmix\" }\n")
    assert desktop_sound_server([str(conf_d), str(asound), str(tmp_path / "absent.conf")]) is None

    (conf_d / "99-pipewire-default.conf").write_text(PIPEWIRE_DEFAULT)
    assert desktop_sound_server([str(conf_d)]) == ("PipeWire", str(conf_d / "99-pipewire-default.conf"))
    asound.write_text("pcm.!default pulse\nctl.!default pulse\n")
    assert desktop_sound_server([str(asound)]) == ("PulseAudio", str(asound))
    asound.write_text('pcm.!default {\n  type plug\n  slave.pcm "pulse"\n}\n')
    assert desktop_sound_server([str(asound)]) == ("PulseAudio", str(asound))


PI4_DEVICES = ["vc4-hdmi-0: MAI PCM i2s-hifi-0 (plughw:0,0)", "vc4-hdmi-1: MAI PCM i2s-hifi-0 (plughw:1,0)",
               "bcm2835 Headphones: - (plughw:2,0)", "sysdefault", "hdmi", "pipewire", "dmix", "default"]


def test_the_card_suggested_instead_of_a_sound_servers_default():
    from hayakoe_pi.sound.player import suggested_device

    def devices(names):
        return [{"name": n} for n in names]

    server = ("PipeWire", "/etc/alsa/conf.d/99-pipewire-default.conf")
    assert suggested_device(devices(PI4_DEVICES), None) == "default"
    # the analog output before HDMI, by the card's name (card numbers change between boots)
    assert suggested_device(devices(PI4_DEVICES), server) == "bcm2835 Headphones"
    assert suggested_device(devices(PI4_DEVICES[:2] + ["default"]), server) == "vc4-hdmi-0"
    # a card with two outputs: its name alone would pick both, so the whole name
    usb = ["USB Audio Device: - (hw:3,0)", "USB Audio Device: #1 (hw:3,1)", "default"]
    assert suggested_device(devices(usb), server) == "USB Audio Device: - (hw:3,0)"
    assert suggested_device(devices(["default", "pipewire", "sysdefault"]), server) is None
