"""Audio output: WAV files and the sound card."""

from __future__ import annotations

import os
import re
import time
import wave
from pathlib import Path

import numpy as np

from .card import Card, KeptOpen


def to_pcm16(audio: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] → 16-bit PCM, clipping anything beyond."""
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2")


def write_wav(path, audio: np.ndarray, sample_rate: int) -> None:
    """To a path, or a file opened for writing in binary (closed here)."""
    # the file opened first: a path that cannot be written is a plain OSError
    with (path if hasattr(path, "write") else open(path, "wb")) as f, wave.open(f, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(to_pcm16(audio).tobytes())


class AudioError(Exception):
    """The sound card is missing, busy or failed while playing."""


def _sounddevice():
    # A card chosen by name opens as plughw, not hw: ALSA then converts rate and
    # format for cards that cannot play the voice's 44.1 kHz as it is (most USB
    # speakers take 48 kHz only). Read once, when PortAudio starts.
    os.environ.setdefault("PA_ALSA_PLUGHW", "1")
    import sounddevice

    return sounddevice


# ALSA configuration that hands "default" to a desktop sound server: Debian's
# pipewire-alsa does it for everyone (conf.d/99-pipewire-default.conf), while
# pulseaudio's hook (99-pulse.conf) does it only while PulseAudio runs for the
# user at hand, never for a system service, unless the default is set by hand.
ALSA_CONFIG = ("/etc/alsa/conf.d", "/etc/asound.conf")
_SERVER_DEFAULT = re.compile(
    r'pcm\.!?default\s*(?:\{[^}]*?\b(?:type|pcm)\s+"?(pipewire|pulse)\b|"?(pipewire|pulse)\b)')


def desktop_sound_server(paths=None) -> tuple[str, str] | None:
    """(server, file) when ALSA's default goes through PipeWire or PulseAudio.

    Desktop Pi OS does this for the logged-in user's session; a system service
    has no such session, so "default" does not reach the card there.
    HAYAKOE_ALSA_CONFIG (colon-separated) replaces the files looked at (tests).
    """
    if paths is None:
        paths = os.environ.get("HAYAKOE_ALSA_CONFIG", ":".join(ALSA_CONFIG)).split(":")
    files: list[Path] = []
    for path in map(Path, filter(None, paths)):
        files += sorted(path.glob("*.conf")) if path.is_dir() else [path]
    for f in files:
        try:
            text = re.sub(r"#.*", "", f.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        m = _SERVER_DEFAULT.search(text)
        if m:
            return ("PipeWire" if "pipewire" in (m.group(1) or m.group(2) or "") else "PulseAudio"), str(f)
    return None


def _card_device(name: str) -> bool:
    return re.search(r"\((plug)?hw:\d+,\d+\)$", name) is not None


def suggested_device(devices: list[dict], sound_server: tuple[str, str] | None) -> str | None:
    """What audio.device should be: "default", unless a desktop sound server owns it.

    Then a sound card itself, as the shortest name that picks it alone (the
    card's name, which survives the card numbers changing, else the whole
    name); the analog/USB output before HDMI. None when there is no card.
    """
    if sound_server is None:
        return "default"
    cards = [d["name"] for d in devices if _card_device(d["name"])]
    cards.sort(key=lambda n: "hdmi" in n.lower())  # stable: otherwise in PortAudio's order
    if not cards:
        return None
    card = cards[0].split(":")[0].strip()
    if sum(card.lower() in d["name"].lower() for d in devices) == 1:
        return card
    return cards[0]


def sound_server_hint(device) -> str:
    """Why "default" will not play here and what to set instead; "" when it will."""
    if device not in (None, "default"):
        return ""
    server = desktop_sound_server()
    if server is None:
        return ""
    try:
        suggestion = suggested_device(output_devices(), server)
    except Exception:  # PortAudio itself missing: the caller reports that
        suggestion = None
    fix = (f'set audio.device: "{suggestion}" in the config' if suggestion else
           "connect a sound card, then set audio.device to it (hayakoe-pi devices lists them)")
    return (f"ALSA's default device goes through {server[0]} ({server[1]}), which runs in a desktop "
            f"user's session and a system service cannot reach: {fix}")


def output_devices() -> list[dict]:
    sd = _sounddevice()
    return [dict(d, index=i) for i, d in enumerate(sd.query_devices()) if d["max_output_channels"] > 0]


def _device_arg(device: str | int | None):
    """'default' / None → PortAudio's default; a number (even as text) → index; else a name."""
    if device is None or device == "default":
        return None
    if isinstance(device, str) and device.strip().isdigit():
        return int(device)
    return device


def rescan_devices() -> None:
    """Restart PortAudio so it lists the sound cards (and ALSA config) present now.

    PortAudio takes its device list once; without this a USB speaker that was
    unplugged and plugged in again stays missing until the daemon restarts.
    Only call it while no stream is open.
    """
    sd = _sounddevice()
    try:
        sd._terminate()
        sd._initialize()
    except sd.PortAudioError:
        pass


def check_device(device: str | int | None) -> str:
    """Name of the output device, or AudioError saying what exists instead.

    "default" sent to a desktop sound server is an error too, even when
    PortAudio lists it: the service would fail at its first sentence.
    """
    sd = _sounddevice()
    hint = sound_server_hint(device)
    if hint:
        raise AudioError(hint)
    try:
        info = sd.query_devices(_device_arg(device), "output")
    except (ValueError, sd.PortAudioError) as e:
        names = ", ".join(f"{d['index']}: {d['name']}" for d in output_devices()) or "none"
        raise AudioError(
            f"audio device {device!r} not available ({e}); output devices: {names}. "
            "Set audio.device in the config to one of them, or check that the sound card is connected"
        ) from None
    return info["name"]


class Player:
    """Plays an utterance on one ALSA/PortAudio device while it is synthesized.

    It reads a SynthesisAhead (or plain chunks) piece by piece and writes
    them back to back. Between sentences, a sentence that could not play to
    its end without the card running dry waits, and the pause before it
    grows with written silence; inside a sentence nothing is ever added. A
    short fade at the start, at the end and when stopped avoids clicks. Only
    the last few milliseconds are held back (to fade the very end).

    `lead_in_ms` of silence go first whenever the card is opened: speakers and
    amplifiers wake up meanwhile instead of losing the first syllable. After an
    utterance the card stays open for `keep_open_s`, fed with silence by a
    thread of its own (a daemon thread: it never keeps a process alive), so the
    next utterance needs no lead-in; then it is closed, free for others.

    `latency_ms`: how much later than the card's buffer says the card is heard
    (a receiver's or amplifier's own delay): sound due at a time starts that much sooner.
    """

    BLOCK = 2048  # frames per write: how often a stop request is noticed
    WAIT_SECONDS = 0.02  # silence written at a time while the next sentence is not ready

    def __init__(self, device: str | int | None = "default", fade_ms: float = 8.0, lead_in_ms: float = 0.0,
                 keep_open_s: float = 0.0, latency_ms: float = 0.0):
        self.device = device
        self.latency = latency_ms / 1000
        self.fade_ms = fade_ms
        self.lead_in = lead_in_ms / 1000
        self.keep_open_s = keep_open_s
        self.underruns = 0  # times the card ran dry during the last play()
        self._progress = None
        self._kept: KeptOpen | None = None

    @classmethod
    def for_config(cls, audio) -> "Player":
        """The player config.audio (an AudioConfig) describes."""
        return cls(audio.device, lead_in_ms=audio.lead_in_ms, keep_open_s=audio.keep_open_s,
                   latency_ms=audio.latency_ms)

    def play(self, source, sample_rate: int, volume: float = 1.0, stop=None, progress=None,
             start_at: float | None = None, on_start=None, prelude=None) -> bool:
        """Play everything; False if `stop` (a threading.Event) cut it short.

        `source` is a SynthesisAhead, or an iterable of float32 chunks. The
        device is opened once the first sentence can flow. `progress()` is
        called after every block written: a sign of life for the watchdog,
        since a wedged device blocks the write. `start_at` (time.monotonic()):
        the first sound is heard then, with silence (the lead-in included)
        written before it, less what the card still holds; if the first sentence
        cannot flow by then, as soon as it can. `on_start(late)` once the first
        sound is due: how many seconds after `start_at` it is heard (0.0 on time,
        or without `start_at`).
        `prelude` (float32 samples, a chime): played at once, before the
        first sentence can flow; speech follows it once it can flow.
        """
        sd = _sounddevice()

        from ..synthesis.ahead import SynthesisAhead

        # a synthesis (or a shared view of one: speech/shared.py) is read by index; plain chunks are wrapped
        ahead = source if hasattr(source, "can_flow") else SynthesisAhead.of_chunks(source, sample_rate)
        self._progress = progress
        self.underruns = 0
        stop = stop or _NEVER
        fade = max(1, int(sample_rate * self.fade_ms / 1000))
        ramp = np.linspace(0.0, 1.0, fade, dtype=np.float32)
        silence = np.zeros(int(sample_rate * self.WAIT_SECONDS), dtype=np.float32)
        stream = self._take_kept(sample_rate)
        begun = False  # the first sound (the prelude's, or speech's) is due: the lead-in is written
        held = np.zeros(0, dtype=np.float32)
        index = played = 0
        in_sentence = False  # the last piece written did not end its sentence
        start = start_at
        ahead.played(0)
        try:
            if prelude is not None and prelude.size:
                stream, begun = self._begin(sd, stream, start, sample_rate, stop, on_start)
                if not begun:
                    return False
                if self._write(stream, prelude * volume, stop) < prelude.size:
                    return False  # cut: the chime fades by itself, the card stays open
            while True:
                if stop.is_set():
                    if stream is not None:
                        self._write_tail(stream, held, ramp)
                    return False
                # in a pause on an open card the silence written paces the loop:
                # waiting for the next piece on top of it would let the card run dry
                pausing = stream is not None and not in_sentence
                piece = ahead.get(index, timeout=0.0 if pausing else self.WAIT_SECONDS)
                if piece is None and ahead.at_end(index):
                    break
                now = time.monotonic()
                first_at = now if begun else max(now + (0.0 if stream is not None else self.lead_in),
                                                  start if start is not None else now)
                waiting = piece is None or (piece.starts_sentence and not ahead.can_flow(index, first_at))
                if waiting:
                    # inside a sentence nothing can be done but wait (if the card runs
                    # dry it is counted); between sentences the pause grows
                    if pausing:
                        self._write(stream, np.concatenate([held, silence]), stop)
                        held = held[:0]
                    elif piece is not None:
                        stop.wait(self.WAIT_SECONDS)
                    continue
                if not begun:
                    stream, begun = self._begin(sd, stream, start, sample_rate, stop, on_start)
                    if not begun:
                        return False
                data = np.concatenate([held, piece.audio.astype(np.float32, copy=False) * volume])
                if played == 0 and held.size == 0:
                    n = min(fade, data.size)
                    data[:n] *= ramp[:n]
                on_card = played - (data.size - piece.audio.size)  # before the held-back tail
                body, held = data[:-fade], data[-fade:].copy()
                # synthesis plans by what is still to play: tell it block by block
                written = self._write(stream, body, stop, lambda n: ahead.played(on_card + n))
                if written < body.size:  # stopped: fade out from where it was cut
                    self._write_tail(stream, data[written:written + fade], ramp)
                    return False
                index += 1
                played += piece.audio.size
                ahead.played(played)
                in_sentence = not piece.ends_sentence
            if stream is not None:
                self._write_tail(stream, held, ramp)
            return True
        except sd.PortAudioError as e:
            if stream is not None:
                stream.close()
            stream = None
            raise AudioError(f"audio device {self.device!r} failed while playing: {e}") from None
        finally:
            self._release(stream)

    def _begin(self, sd, stream: Card | None, start: float | None, sample_rate: int, stop, on_start):
        """The card (opened if it is not) and silence on it until the first sound is due:
        the lead-in after an open, and until it is heard at `start` (time.monotonic()); then
        `on_start(how late it is heard: 0.0 on time)`. (stream, False) if stopped meanwhile."""
        lead = 0.0
        if stream is None:
            stream = self._open(sd, sample_rate)
            lead = self.lead_in
        # what is written now is heard once the card has played what it holds (a kept card's silence)
        wait = max(lead, 0.0 if start is None else start - stream.heard_next())
        frames = int(round(wait * sample_rate))
        block = np.zeros(min(frames, self.BLOCK), dtype=np.float32)
        while frames > 0:
            n = min(frames, block.size)
            if self._write(stream, block[:n], stop) < n:
                return stream, False
            frames -= n
        if on_start:
            # to the millisecond: the silence is written in whole frames
            on_start(0.0 if start is None else max(0.0, round(stream.heard_next() - start, 3)))
        return stream, True

    def _open(self, sd, sample_rate: int):
        try:
            stream = sd.OutputStream(samplerate=sample_rate, channels=1, dtype="float32",
                                     device=_device_arg(self.device))
        except (ValueError, sd.PortAudioError) as e:
            raise AudioError(f"cannot open audio device {self.device!r}: {e}") from None
        stream.start()
        return Card(stream, sample_rate, self.latency)

    def _take_kept(self, sample_rate: int):
        """The card still open from the last utterance (its silence stopped), or None."""
        kept, self._kept = self._kept, None
        if kept is None:
            return None
        stream = kept.take()
        if stream is not None and stream.sample_rate != sample_rate:
            stream.close(drain=True)
            return None
        return stream

    def _release(self, stream: Card | None) -> None:
        """After an utterance: keep the card open, fed with silence, or close it."""
        if stream is None:
            return
        if self.keep_open_s > 0:
            self._kept = KeptOpen(stream, self.keep_open_s, self.WAIT_SECONDS)
        else:
            stream.close(drain=True)

    def close(self) -> None:
        """Close a card kept open (at shutdown)."""
        kept, self._kept = self._kept, None
        stream = kept.take() if kept is not None else None
        if stream is not None:
            stream.close(drain=True)

    def _write(self, stream, data: np.ndarray, stop, written=None) -> int:
        """Frames written before `stop` was set (all of them if it was not); `written(n)` after each block."""
        for start in range(0, data.size, self.BLOCK):
            if stop.is_set():
                return start
            block = data[start:start + self.BLOCK]
            if stream.write(np.clip(block, -1.0, 1.0).reshape(-1, 1)):
                self.underruns += 1  # PortAudio: the card ran dry before this block
            if written:
                written(start + block.size)
            if self._progress:
                self._progress()
        return data.size

    def _write_tail(self, stream, tail: np.ndarray, ramp: np.ndarray) -> None:
        if tail.size:
            if stream.write(np.clip(tail * ramp[::-1][-tail.size:], -1.0, 1.0).reshape(-1, 1)):
                self.underruns += 1


class _Never:
    @staticmethod
    def is_set() -> bool:
        return False

    @staticmethod
    def wait(timeout: float) -> bool:
        time.sleep(timeout)
        return False


_NEVER = _Never()
