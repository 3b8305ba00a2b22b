"""A text's sentences, and the pause after each: how the engine plans what it speaks."""

from __future__ import annotations

import re

import numpy as np

# Longer sentences are cut at commas (then anywhere): the synthesizer's
# attention grows with the square of the sentence length.
MAX_SENTENCE_CHARS = 160

SENTENCE_ENDS = "。！？!?\n"  # a sentence ends after one of these (also in streamed Wyoming text)
_AFTER_SENTENCE_END_RE = re.compile(f"(?<=[{SENTENCE_ENDS}])")
_CLAUSE_END_RE = re.compile(r"(?<=[、，,;；:：])")
_SPEECH_RE = re.compile(r"[ぁ-ゖァ-ヺ一-鿿㐀-䶿々〆〇A-Za-z0-9０-９Ａ-Ｚａ-ｚｦ-ﾟ]")

# Silence (seconds at speed 1.0) between a sentence and the next, by how it ends.
PAUSE_AFTER = {"。": 0.35, ".": 0.35, "．": 0.35, "！": 0.3, "!": 0.3, "？": 0.4, "?": 0.4, "\n": 0.5}
DEFAULT_PAUSE = 0.3
SILENCE_WINDOW_S = 0.01
SILENCE_LEVEL = 0.02  # of the sentence's peak


def _cut(text: str, limit: int) -> list[str]:
    """Cut an over-long sentence at clause ends, then at the limit."""
    pieces: list[str] = []
    for clause in _CLAUSE_END_RE.split(text):
        if pieces and len(pieces[-1]) + len(clause) <= limit:
            pieces[-1] += clause
        else:
            pieces.extend(clause[i:i + limit] for i in range(0, len(clause), limit))
    return [p for p in pieces if p]


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, each ending with its punctuation.

    Pieces with nothing to say (punctuation, white space) join the sentence
    before them, or the one after when they come first.
    """
    sentences: list[str] = []
    leading = ""
    for piece in _AFTER_SENTENCE_END_RE.split(text):
        if not _SPEECH_RE.search(piece):
            if sentences:
                sentences[-1] += piece
            else:
                leading += piece
            continue
        sentences.extend(_cut(leading + piece, MAX_SENTENCE_CHARS))
        leading = ""
    if leading and not sentences:
        sentences.append(leading)
    return [s for s in sentences if s.strip()] or ([text] if text.strip() else [])


def pause_samples(sentence: str, audio: np.ndarray, sr: int, length_scale: float) -> int:
    """Silence to add after `sentence` (its speech ending in `audio`) when more follows.

    The pause its final punctuation asks for, less the silence the synthesizer
    already put at the end.
    """
    end = sentence.rstrip(" \t\u3000")[-1:]
    if sentence.endswith("\n"):
        end = "\n"
    target = PAUSE_AFTER.get(end, DEFAULT_PAUSE) * length_scale
    return max(0, int(round((target - trailing_silence(audio, sr)) * sr)))


def trailing_silence(audio: np.ndarray, sr: int) -> float:
    """Seconds of near-silence already at the end of `audio`."""
    if audio.size == 0:
        return 0.0
    peak = float(np.abs(audio).max())
    if peak == 0.0:
        return audio.size / sr
    window = max(1, int(sr * SILENCE_WINDOW_S))
    n_windows = audio.size // window
    tail = np.abs(audio[audio.size - n_windows * window:]).reshape(n_windows, window).max(axis=1)
    loud = np.nonzero(tail > peak * SILENCE_LEVEL)[0]
    quiet_windows = n_windows - (loud[-1] + 1) if loud.size else n_windows
    return quiet_windows * window / sr
