"""Audio output: WAV files (and, later, the sound card)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


def to_pcm16(audio: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] → 16-bit PCM, clipping anything beyond."""
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2")


def write_wav(path: str | Path, audio: np.ndarray, sample_rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(to_pcm16(audio).tobytes())


class AudioError(Exception):
    """The sound card is missing, busy or failed while playing."""


def output_devices() -> list[dict]:
    import sounddevice as sd

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
    import sounddevice as sd

    try:
        sd._terminate()
        sd._initialize()
    except sd.PortAudioError:
        pass


def check_device(device: str | int | None) -> str:
    """Name of the output device, or AudioError saying what exists instead."""
    import sounddevice as sd

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
    """Plays float32 chunks on one ALSA/PortAudio device as they arrive.

    Chunks are written back to back, so sentences join without gaps; a short
    fade at the start, at the end and when stopped avoids clicks. Only the
    last few milliseconds of each chunk are held back (to fade the very end),
    so the first sound does not wait for the rest of the text.
    """

    BLOCK = 2048  # frames per write: how often a stop request is noticed

    def __init__(self, device: str | int | None = "default", fade_ms: float = 8.0):
        self.device = device
        self.fade_ms = fade_ms
        self._progress = None

    def play(self, chunks, sample_rate: int, volume: float = 1.0, stop=None, progress=None) -> bool:
        """Play all chunks; False if `stop` (a threading.Event) cut it short.

        `progress()` is called after every block written: a sign of life for
        the watchdog, since a wedged device blocks the write.
        """
        import sounddevice as sd

        self._progress = progress
        fade = max(1, int(sample_rate * self.fade_ms / 1000))
        ramp = np.linspace(0.0, 1.0, fade, dtype=np.float32)
        try:
            stream = sd.OutputStream(samplerate=sample_rate, channels=1, dtype="float32",
                                     device=_device_arg(self.device))
        except (ValueError, sd.PortAudioError) as e:
            raise AudioError(f"cannot open audio device {self.device!r}: {e}") from None
        try:
            stream.start()
            held = np.zeros(0, dtype=np.float32)
            first = True
            for chunk in chunks:
                data = np.concatenate([held, np.asarray(chunk, dtype=np.float32) * volume])
                if first and data.size:
                    n = min(fade, data.size)
                    data[:n] *= ramp[:n]
                    first = False
                body, held = data[:-fade], data[-fade:].copy()
                written = self._write(stream, body, stop)
                if written < body.size:  # stopped: fade out from where it was cut
                    self._fade_out(stream, data[written:written + fade], ramp)
                    return False
            self._fade_out(stream, held, ramp)
            return True
        except sd.PortAudioError as e:
            raise AudioError(f"audio device {self.device!r} failed while playing: {e}") from None
        finally:
            stream.close(ignore_errors=True)

    def _write(self, stream, data: np.ndarray, stop) -> int:
        """Frames written before `stop` was set (all of them if it was not)."""
        for start in range(0, data.size, self.BLOCK):
            if stop is not None and stop.is_set():
                return start
            stream.write(np.clip(data[start:start + self.BLOCK], -1.0, 1.0).reshape(-1, 1))
            if self._progress:
                self._progress()
        return data.size

    @staticmethod
    def _fade_out(stream, tail: np.ndarray, ramp: np.ndarray) -> None:
        if tail.size:
            stream.write(np.clip(tail * ramp[::-1][-tail.size:], -1.0, 1.0).reshape(-1, 1))
        stream.stop()  # returns once the buffered audio has been played
