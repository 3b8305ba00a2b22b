"""Whether a voice's 8-bit decoder may replace its FP32 one on this CPU: the sound kept
(measured against FP32 from the same latents, on sentences it was not calibrated on)
and the time won (measured with the daemon's threads)."""

from __future__ import annotations

import os

import numpy as np

# The worst held-out sentence must keep this signal-to-noise ratio against FP32: the
# 8-bit rounding is a noise added to the speech, shaped like it by the layers after, and
# 20 dB under it is masked by it. Measured here: four full-size test voices (seeds 10,
# 20, 11, 21) 35.4-40.7 dB and the tiny one 36.9 dB (28.6-30.5 and 30.0 with the
# decoder's ends in 8 bits); a decoder made far on purpose (an activation outlier in each
# residual block, tests/test_int8.py) 6.4 dB.
MIN_SNR_DB = 20.0
# ... and stay this close in log-mel spectrum: the mean over frames of each frame's RMS
# difference over 80 mel bands, in dB, bands more than MEL_FLOOR_DB under the loudest not
# weighed. That is the sound as an ear weighs it (a quiet band changed counts, phase does
# not), where the SNR sees only the loud parts. 1 dB is about the smallest change of
# loudness heard. Measured: the full-size test voices 0.06-0.07 dB, the tiny one 0.07
# (0.18-0.19 and 0.24 with the decoder's ends in 8 bits); the far one 2.3 dB.
MAX_MEL_DB = 1.0
# int8 is used only if it decodes a window at least this much faster than the FP32
# form this CPU was tuned for: below that the audible risk buys too little time.
# tools/arm64-check sets HAYAKOE_PI_INT8_MIN_SPEEDUP=0 (emulated timings mean nothing), as
# do the tests whose tiny voice is too small for 8 bits to pay.
MIN_SPEEDUP = float(os.environ.get("HAYAKOE_PI_INT8_MIN_SPEEDUP", "1.25"))

MEL_BANDS = 80
# 60 dB, not 80: a Pi's speech peaks near 70 dB SPL where it is heard, and a quiet room
# is 25-35 dBA, so a band 60 dB under the loudest is under the room's own noise. Speech
# has silent pauses and valleys between its harmonics (a random-weight voice has
# neither): counted down to 80 dB, a noise 49 dB under the speech, heard by no one,
# made 10.8 dB there (tests/test_int8.py), and the gate's verdict on a real voice
# would have hung on how quiet its pauses are.
MEL_FLOOR_DB = 60.0


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((reference.astype(np.float64) - test) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    if noise == 0:
        return float("inf")
    return 10 * np.log10(max(signal, 1e-30) / noise)


def _mel_filters(sample_rate: int, n_fft: int, bands: int) -> np.ndarray:
    """Triangular filters on the mel scale (HTK's formula), [bands, n_fft // 2 + 1]."""
    mel = lambda hz: 2595 * np.log10(1 + hz / 700)  # noqa: E731
    hz = lambda m: 700 * (10 ** (m / 2595) - 1)  # noqa: E731
    edges = hz(np.linspace(0, mel(sample_rate / 2), bands + 2))
    freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    lower = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None])
    upper = (edges[2:, None] - freqs[None, :]) / (edges[2:, None] - edges[1:-1, None])
    return np.maximum(0, np.minimum(lower, upper))


def log_mel_db(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """[frames, MEL_BANDS] power in dB; ~46 ms windows, a quarter of that apart."""
    n_fft = 1 << int(np.round(np.log2(sample_rate * 0.046)))
    hop = n_fft // 4
    audio = np.pad(audio.astype(np.float64), (0, max(0, n_fft - audio.size)))
    frames = np.lib.stride_tricks.sliding_window_view(audio, n_fft)[::hop] * np.hanning(n_fft)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    return 10 * np.log10(power @ _mel_filters(sample_rate, n_fft, MEL_BANDS).T + 1e-20)


def mel_distance_db(reference: np.ndarray, test: np.ndarray, sample_rate: int) -> float:
    ref, other = log_mel_db(reference, sample_rate), log_mel_db(test, sample_rate)
    floor = ref.max() - MEL_FLOOR_DB
    ref, other = np.maximum(ref, floor), np.maximum(other, floor)
    return float(np.mean(np.sqrt(np.mean((ref - other) ** 2, axis=1))))


def compare(pairs: list[tuple[np.ndarray, np.ndarray]], sample_rate: int) -> dict:
    """SNR and log-mel distance of each (FP32, int8) pair of sentences: mean and worst."""
    snrs = [snr_db(a, b) for a, b in pairs]
    mels = [mel_distance_db(a, b, sample_rate) for a, b in pairs]
    return {"snr_db": {"mean": round(float(np.mean(snrs)), 2), "worst": round(min(snrs), 2)},
            "mel_db": {"mean": round(float(np.mean(mels)), 3), "worst": round(max(mels), 3)},
            "sentences": len(pairs)}


def decide(quality: dict, fp32_seconds: float, int8_seconds: float) -> tuple[bool, str]:
    """(use int8, why): only if the worst sentence passes both measures and int8 is faster enough."""
    snr, mel = quality["snr_db"]["worst"], quality["mel_db"]["worst"]
    speedup = fp32_seconds / int8_seconds if int8_seconds > 0 else 0.0
    if snr < MIN_SNR_DB:
        return False, f"8-bit decoder too far from FP32 (worst sentence {snr:.1f} dB SNR, under {MIN_SNR_DB:g})"
    if mel > MAX_MEL_DB:
        return False, (f"8-bit decoder too far from FP32 (worst sentence {mel:.2f} dB log-mel distance, "
                       f"over {MAX_MEL_DB:g})")
    if speedup < MIN_SPEEDUP:
        return False, f"8-bit decoder not faster enough on this CPU ({speedup:.2f}×, under {MIN_SPEEDUP:g}×)"
    return True, f"8-bit decoder {speedup:.2f}× faster, worst sentence {snr:.1f} dB SNR, {mel:.2f} dB log-mel"
