"""PESQ-WB (ITU-T P.862.2) of pairs of sounds, by PyPI's `pesq`; runs in tools/trained-decoders'
venv (an sdist: no place in the appliance's lock).

    python tools/pesq_wb.py PAIRS.npz   → {"pesq_wb": [score of each pair]}

PAIRS.npz: `ref/N` and `deg/N` (mono float audio), `sample_rate` (a scalar); each pair is
taken to 16 kHz first.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from pesq import pesq


def to_16k(audio: np.ndarray, rate: int) -> np.ndarray:
    n_out = round(audio.size * 16000 / rate)
    return np.fft.irfft(np.fft.rfft(audio.astype(np.float64))[: n_out // 2 + 1], n_out) * (n_out / audio.size)


def main() -> None:
    with np.load(sys.argv[1]) as pairs:
        rate = int(pairs["sample_rate"])
        count = sum(key.startswith("ref/") for key in pairs.files)
        scores = [float(pesq(16000, to_16k(pairs[f"ref/{i}"], rate), to_16k(pairs[f"deg/{i}"], rate), "wb"))
                  for i in range(count)]
    print(json.dumps({"pesq_wb": scores}))


if __name__ == "__main__":
    main()
