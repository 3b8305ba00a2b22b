"""The chime before an announcement: a soft two-tone sound made here, or a WAV file."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from ..bounds import quoted_repr

# No chime is "off": Home Assistant's MQTT select takes a state "none" (in any case) for no
# option at all, and would show the chime as unknown. "none", its former name, is still accepted.
OFF = "off"
CHOICES = (OFF, "default")  # audio.chime, besides a path to a WAV file
TONES_HZ = (880.0, 660.0)      # A5 then E5: a falling fourth, the classic "ding-dong"
TONE_SECONDS = 0.22            # each tone sounds this long (the second overlaps the first's decay)
PEAK = 0.35                    # soft: well below full scale before the message's volume
MAX_WAV_SECONDS = 10.0


def chime_choice(value):
    """audio.chime, a chime/set payload or a kept value as named now: "none" and YAML's bare
    `off` (false) are "off"; anything else is as given."""
    return OFF if value is False or value == "none" else value


def default_chime(sample_rate: int) -> np.ndarray:
    """Two sine tones, each with a quick attack and an exponential decay; made in code, so
    there is no sound file to license. Starts and ends at zero (no click)."""
    n = int(TONE_SECONDS * sample_rate)
    t = np.arange(2 * n + n // 2) / sample_rate
    out = np.zeros(t.size, dtype=np.float64)
    attack = int(0.005 * sample_rate)
    for i, hz in enumerate(TONES_HZ):
        start = i * n
        tt = t[: t.size - start]
        envelope = np.exp(-tt * 7.0)
        envelope[:attack] *= np.linspace(0.0, 1.0, attack)
        out[start:] += np.sin(2 * np.pi * hz * tt) * envelope
    fade = int(0.02 * sample_rate)
    out[-fade:] *= np.linspace(1.0, 0.0, fade)
    return (out * (PEAK / np.abs(out).max())).astype(np.float32)


def read_wav(path: str | Path, sample_rate: int) -> np.ndarray:
    """A 16-bit PCM WAV file (mono or stereo, any rate) as float32 mono at `sample_rate`;
    ValueError saying why it cannot be used."""
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            if width != 2:
                raise ValueError(f"chime {path}: only 16-bit PCM WAV files are played (this one has "
                                 f"{8 * width}-bit samples)")
            if frames > MAX_WAV_SECONDS * rate:
                raise ValueError(f"chime {path}: longer than {MAX_WAV_SECONDS:g} s")
            data = np.frombuffer(w.readframes(frames), dtype="<i2")
    except (OSError, EOFError, wave.Error) as e:
        raise ValueError(f"chime {path} cannot be read as a WAV file: {e}") from None
    audio = data.reshape(-1, channels).mean(axis=1) / 32768.0
    if rate != sample_rate and audio.size:
        out_n = int(round(audio.size * sample_rate / rate))
        audio = np.interp(np.arange(out_n) * (rate / sample_rate), np.arange(audio.size), audio)
    return audio.astype(np.float32)


class Chimes:
    """The chime sounds, made or read once per (choice, sample rate).

    `configured` is audio.chime: "off", "default" or a path; a message's
    choice is one of those too ("file" names the configured path), or a WAV
    file in `folder` (audio.chime_dir), the only files a payload may name."""

    def __init__(self, configured: str, folder: str | Path = "/etc/hayakoe-pi/chimes"):
        self.configured = chime_choice(configured)
        self.folder = Path(folder)
        self._made: dict[tuple[str, int], np.ndarray] = {}

    def resolve(self, name: str) -> str:
        """A payload's "chime" file (a name in the folder, or a path there) as its full path;
        ValueError for anything else, or a file that cannot be played."""
        folder = self.folder.resolve()
        path = (folder / name).resolve()  # an absolute `name` stays itself
        if path.parent != folder or path.suffix.lower() != ".wav" or any(ord(c) < 32 for c in name):
            raise ValueError(f"chime must be true, false, \"default\", \"off\" or a .wav file in {folder} "
                             f"(audio.chime_dir), got {quoted_repr(name, 80)}")
        read_wav(path, 44100)  # ValueError saying why it cannot be played
        return str(path)

    @property
    def path(self) -> str | None:
        return None if self.configured in CHOICES else self.configured

    def audio(self, choice: str, sample_rate: int) -> np.ndarray | None:
        """The chime's samples, or None for "off"."""
        if chime_choice(choice) == OFF:
            return None
        if choice == "file":
            choice = self.path or "default"
        if choice not in ("default", self.path):  # a message's own file: read each time, never kept
            return read_wav(choice, sample_rate)
        key = (choice, sample_rate)
        if key not in self._made:
            self._made[key] = default_chime(sample_rate) if choice == "default" else read_wav(choice, sample_rate)
        return self._made[key]
