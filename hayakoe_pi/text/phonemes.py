"""Symbol table and katakana → phoneme rules of Style-Bert-VITS2 (JP-Extra).

The models were trained on these exact ids, so the order below is part of the
model contract: "_" first, then the sorted union of the Chinese, Japanese and
English phoneme inventories, then punctuation and two special tokens.
"""

from __future__ import annotations

# Phoneme inventories the symbol table is built from (the model embeds all of
# them even though only the Japanese ones are ever produced here).
_ZH = (
    "E En a ai an ang ao b c ch d e ei en eng er f g h i i0 ia ian iang iao ie in ing "
    "iong ir iu j k l m n o ong ou p q r s sh t u ua uai uan uang ui un uo v van ve vn "
    "w x y z zh AA EE OO"
).split()
_JP = (
    "N a a: b by ch d dy e e: f g gy h hy i i: j k ky m my n ny o o: p py q r ry s sh "
    "t ts ty u u: w y z zy"
).split()
_EN = (
    "aa ae ah ao aw ay b ch d dh eh er ey f g hh ih iy jh k l m n ng ow oy p r s sh t "
    "th uh uw V w y z zh"
).split()

PUNCTUATIONS = ("!", "?", "…", ",", ".", "'", "-")
SYMBOLS: tuple[str, ...] = ("_", *sorted(set(_ZH + _JP + _EN)), *PUNCTUATIONS, "SP", "UNK")
SYMBOL_ID = {s: i for i, s in enumerate(SYMBOLS)}

JP_TONE_OFFSET = 6  # Chinese tones (6) come first in the shared tone embedding
JP_LANGUAGE_ID = 1  # ZH=0, JP=1, EN=2

# Phonemes after which a long-vowel mark repeats the sound; "N" counts as a vowel here.
VOWELS = frozenset("aiueoN")


def _build_mora_table() -> dict[str, tuple[str, ...]]:
    """Katakana mora → phonemes, following OpenJTalk's mora inventory."""
    table: dict[str, tuple[str, ...]] = {}
    vowels = "aiueo"
    # Plain rows: consonant for the five vowel columns (None = no such kana).
    rows = {
        "": "アイウエオ", "k": "カキクケコ", "g": "ガギグゲゴ", "s": "サシスセソ",
        "z": "ザジズゼゾ", "t": "タチツテト", "d": "ダヂヅデド", "n": "ナニヌネノ",
        "h": "ハヒフヘホ", "b": "バビブベボ", "p": "パピプペポ", "m": "マミムメモ",
        "y": "ヤ_ユ_ヨ", "r": "ラリルレロ", "w": "ワ___ヲ",
    }
    for consonant, kana_row in rows.items():
        for kana, vowel in zip(kana_row, vowels):
            if kana != "_":
                table[kana] = (consonant, vowel) if consonant else (vowel,)
    # Columns whose consonant differs from the row's.
    table.update({
        "シ": ("sh", "i"), "ジ": ("j", "i"), "チ": ("ch", "i"), "ツ": ("ts", "u"),
        "ヂ": ("j", "i"), "ヅ": ("z", "u"), "フ": ("f", "u"), "ヲ": ("o",),
        "ン": ("N",), "ッ": ("q",), "ヴ": ("v", "u"), "ヰ": ("i",), "ヱ": ("e",),
        "ヮ": ("w", "a"), "ヶ": ("k", "e"),
        "ァ": ("a",), "ィ": ("i",), "ゥ": ("u",), "ェ": ("e",), "ォ": ("o",),
        "ャ": ("y", "a"), "ュ": ("y", "u"), "ョ": ("y", "o"),
    })
    # Palatalised syllables: <i-column kana> + small ャュョ (and ェ for most).
    palatal = {
        "キ": "ky", "ギ": "gy", "シ": "sh", "ジ": "j", "チ": "ch", "ニ": "ny", "ヒ": "hy",
        "ビ": "by", "ピ": "py", "ミ": "my", "リ": "ry",
    }
    for base, consonant in palatal.items():
        for small, vowel in zip("ャュョェ", "auoe"):
            table[base + small] = (consonant, vowel)
    for base, consonant in (("テ", "ty"), ("デ", "dy"), ("ヴ", "by")):
        for small, vowel in zip("ャュョ", "auo"):
            table[base + small] = (consonant, vowel)
    # Foreign-sound digraphs.
    for base, consonant, smalls in (
        ("ヴ", "v", "ァィェォ"), ("フ", "f", "ァィェォ"), ("ツ", "ts", "ァィェォ"),
        ("ウ", "w", "_ィェォ"),
    ):
        for small, vowel in zip(smalls, "aieo"):
            if small != "_":
                table[base + small] = (consonant, vowel)
    table.update({
        "ティ": ("t", "i"), "ディ": ("d", "i"), "トゥ": ("t", "u"), "ドゥ": ("d", "u"),
        "スィ": ("s", "i"), "ズィ": ("z", "i"), "イェ": ("y", "e"),
        "クヮ": ("kw", "a"), "グヮ": ("gw", "a"),
    })
    return table


MORA_PHONEMES = _build_mora_table()


def katakana_to_phonemes(kana: str) -> list[str]:
    """Phonemes of one word's katakana reading, or its punctuation marks as they are.

    A long-vowel mark inside the word repeats the phoneme before it; one at the
    start of the word is kept as "ー" for the caller to resolve across words.
    """
    if all(ch in PUNCTUATIONS for ch in kana):
        return list(kana)
    phonemes: list[str] = []
    i = 0
    while i < len(kana):
        pair = kana[i:i + 2]
        if len(pair) == 2 and pair in MORA_PHONEMES:
            phonemes.extend(MORA_PHONEMES[pair])
            i += 2
            continue
        ch = kana[i]
        if ch in MORA_PHONEMES:
            phonemes.extend(MORA_PHONEMES[ch])
        elif ch == "ー":
            phonemes.append(phonemes[-1][-1] if phonemes else "ー")
        elif "\u30a0" <= ch <= "\u30ff":
            phonemes.append(ch)  # a katakana sign with no sound of its own
        else:
            raise ValueError(f"not a katakana reading: {kana!r}")
        i += 1
    return phonemes
