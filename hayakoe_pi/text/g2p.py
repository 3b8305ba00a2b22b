"""Grapheme to phoneme with accent-derived tones, as Style-Bert-VITS2 JP-Extra does it.

Two views of the same OpenJTalk analysis are combined:
- the full-context labels give phonemes with accent rises and falls, but lose
  punctuation;
- the word list (`run_frontend`) keeps punctuation and word boundaries, which
  decide where pauses go and how phonemes map to characters (`word2ph`).
Tones from the first are laid onto the phonemes of the second.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyopenjtalk

from .normalize import protected_word, replace_punctuation
from .openjtalk import TooLong, frontend
from .phonemes import PUNCTUATIONS, VOWELS, katakana_to_phonemes
from .tokenizer import CharTokenizer


class TextError(ValueError):
    """The text cannot be turned into phonemes."""


@dataclass
class Words:
    surfaces: list[str]  # normalized text split into OpenJTalk's words
    readings: list[str]  # katakana reading of each, or its punctuation


def split_words(norm_text: str, features: list[dict] | None = None) -> Words:
    """Words of the normalized text and their readings."""
    if features is None:
        features = _features(norm_text)
    surfaces, readings = [], []
    for f in features:
        # a user word keeps its digits and marks (PS5, R&D), as normalize_text left it
        surface = protected_word(f["string"]) or replace_punctuation(f["string"])
        reading = f["pron"].replace("’", "")  # ’ marks devoicing; not a sound
        if reading == "、":
            # Punctuation, or a character OpenJTalk could not read: the latter
            # is voiced as a short break, one "'" per character.
            reading = surface if all(c in PUNCTUATIONS for c in surface) else "'" * len(surface)
        elif reading == "？":
            reading = "?"
        elif not reading:
            raise TextError(f"OpenJTalk gave no reading for {surface!r}")
        surfaces.append(surface)
        readings.append(reading)
    return Words(surfaces, readings)


# Fields of an HTS full-context label; absent fields ("xx") read as -50.
_LABEL_FIELDS = {
    "phoneme": re.compile(r"-(.*?)\+"),
    "a1": re.compile(r"/A:([0-9\-]+)\+"),
    "a2": re.compile(r"\+(\d+)\+"),
    "a3": re.compile(r"\+(\d+)/"),
    "e3": re.compile(r"!(\d+)_"),
    "f1": re.compile(r"/F:(\d+)_"),
}


def _field(label: str, name: str) -> int:
    m = _LABEL_FIELDS[name].search(label)
    return int(m.group(1)) if m else -50


def _tones_without_punctuation(features: list[dict]) -> list[tuple[str, int]]:
    """(phoneme, tone 0/1) for every spoken phoneme, from the accent marks of the labels.

    Within an accent phrase the pitch starts at 0, goes up one step after a
    rise and down one after the accent nucleus; each phrase is then shifted to
    the 0/1 range. Pauses and phrase boundaries start a new phrase.
    """
    # Nothing but punctuation and unreadable characters has no phoneme: OpenJTalk's labeler would
    # give no labels either, after printing a warning into the journal (straight to stderr, from C)
    spoken = any(f["pron"] not in ("、", "？") for f in features)
    labels = pyopenjtalk.make_label(features) if spoken else []
    result: list[tuple[str, int]] = []
    phrase: list[tuple[str, int]] = []
    tone = 0

    def close_phrase() -> None:
        nonlocal phrase, tone
        result.extend(_shift_to_binary(phrase))
        phrase, tone = [], 0

    last = len(labels) - 1
    for n, label in enumerate(labels):
        phoneme = _LABEL_FIELDS["phoneme"].search(label).group(1)
        if phoneme in ("A", "E", "I", "O", "U"):
            phoneme = phoneme.lower()  # devoiced vowels are still vowels
        if phoneme == "sil":
            # The closing silence ends the last phrase only for a statement or
            # a question; any other sentence type leaves it open (its tones
            # then fall back to 0 in alignment), as the reference does.
            if n == last and n > 0 and _field(label, "e3") in (0, 1):
                close_phrase()
            continue
        if phoneme == "pau":
            close_phrase()
            continue
        phrase.append(("q" if phoneme == "cl" else phoneme, tone))

        a1, a2, a3 = _field(label, "a1"), _field(label, "a2"), _field(label, "a3")
        next_a2 = _field(labels[n + 1], "a2")
        if a3 == 1 and next_a2 == 1 and phoneme in "aeiouAEIOUNcl":
            close_phrase()  # accent phrase boundary
        elif a1 == 0 and next_a2 == a2 + 1 and a2 != _field(label, "f1"):
            tone -= 1  # pitch falls after the accent nucleus
        elif a2 == 1 and next_a2 == 2:
            tone += 1  # pitch rises after the first mora
    return result


def _shift_to_binary(phrase: list[tuple[str, int]]) -> list[tuple[str, int]]:
    tones = {t for _, t in phrase}
    if tones <= {0, 1}:
        return phrase
    if tones == {-1, 0}:
        return [(p, t + 1) for p, t in phrase]
    raise TextError(f"unexpected accent pattern {sorted(tones)} in {[p for p, _ in phrase]}")


def _resolve_long_marks(word_phonemes: list[list[str]]) -> None:
    """A word that starts with "ー" lengthens the previous word's last vowel
    (or っ); after anything else, or at the start, it is taken for a dash."""
    for i, phonemes in enumerate(word_phonemes):
        if not phonemes:
            continue
        if phonemes[0] == "ー":
            prev = word_phonemes[i - 1][-1] if i > 0 and word_phonemes[i - 1] else None
            phonemes[0] = prev if prev is not None and (prev in VOWELS or prev == "q") else "-"
        for j in range(1, len(phonemes)):
            if phonemes[j] == "ー":
                phonemes[j] = phonemes[j - 1][-1]


def _align(phonemes: list[str], toned: list[tuple[str, int]]) -> list[int]:
    tones: list[int] = []
    k = 0
    for p in phonemes:
        if k < len(toned) and p == toned[k][0]:
            tones.append(toned[k][1])
            k += 1
        elif k >= len(toned) or p in PUNCTUATIONS:
            tones.append(0)
        else:
            raise TextError(f"phoneme {p!r} does not match the accent analysis ({toned[k][0]!r})")
    return tones


def _spread(n_phonemes: int, n_chars: int) -> list[int]:
    """Share a word's phonemes among its characters, extra ones to the left."""
    if n_chars == 0:
        return []
    base, extra = divmod(n_phonemes, n_chars)
    return [base + 1] * extra + [base] * (n_chars - extra)


@dataclass
class G2P:
    phones: list[str]  # with "_" at both ends
    tones: list[int]  # 0/1, same length
    word2ph: list[int]  # phonemes per BERT token, [CLS] and [SEP] included
    bert_text: str  # the characters BERT sees


def _features(norm_text: str) -> list[dict]:
    try:
        return frontend(norm_text)
    except TooLong as e:
        raise TextError(str(e)) from None


def g2p(norm_text: str) -> G2P:
    features = _features(norm_text)
    toned = _tones_without_punctuation(features)
    words = split_words(norm_text, features)
    word_phonemes = []
    for reading in words.readings:
        try:
            word_phonemes.append(katakana_to_phonemes(reading))
        except ValueError as e:
            raise TextError(str(e)) from None
    _resolve_long_marks(word_phonemes)

    phonemes = [p for w in word_phonemes for p in w]
    tones = _align(phonemes, toned)

    word2ph: list[int] = []
    for surface, phs in zip(words.surfaces, word_phonemes):
        n_chars = 1 if surface in PUNCTUATIONS else len(CharTokenizer.tokenize(surface))
        word2ph += _spread(len(phs), n_chars)

    phones = ["_", *phonemes, "_"]
    tones = [0, *tones, 0]
    word2ph = [1, *word2ph, 1]
    if sum(word2ph) != len(phones):
        raise TextError(f"cannot map phonemes onto characters of {norm_text!r}")
    return G2P(phones, tones, word2ph, "".join(words.surfaces))
