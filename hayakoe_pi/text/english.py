"""English words in Japanese text, read in katakana: Apple Watch → アップルウォッチ.

Each run of Latin letters left after the readings table (numbers, units,
acronyms, known words: readings.py) is read here, first found wins:

1. the table's Japanese names in romaji (``japanese_names`` in
   data/readings.yaml: Mazda → マツダ, Seiko → セイコー, where kanalizer's
   English spelling gives マズダ, セイコ), then its English words
   (``english_words``), which hold the readings users say (roomba → ルンバ,
   not kanalizer's ルームバ);
2. camel case whose parts are all in that table (AirPods → エアーポッズ);
3. OpenJTalk's own dictionary, when it knows the word whole (mail → メール,
   device → デバイス, PlayStation, DeNA): what the reference front end
   reads, in the spelling Japanese uses for loanwords;
4. camel case read part by part, each part as here (SmartThings → スマート +
   シングス, TPLink → ティーピー + リンク), when every part can be read;
5. kanalizer, VOICEVOX's English-to-kana model (eufy → ユーフィー), for a word
   of 3 or more letters not all in capitals, or in capitals that the table
   lists as a word (``capital_words``: ALARM → アラーム, not エーエルエーアールエム):
   first its readings of 71 000 common words made ahead (english_list.py:
   a lookup, where the model takes milliseconds a word), used only with the
   kanalizer version that made them, then the model itself.

Anything else is left as it was before kanalizer: OpenJTalk's reading if it
has one, else the letters, which OpenJTalk spells. The words of a name
written with spaces (Front Door) lose the spaces later in normalization, so
the name is one run of katakana, with no pause inside. Readings are cached
per word. Without kanalizer (not installed, or failing) the same text is
still read, as before, after one warning.
"""

from __future__ import annotations

import logging
import re
import threading
from functools import lru_cache

from .english_list import READINGS
from .openjtalk import TooLong, frontend
from .table import TABLE

__all__ = ["CAPITAL_WORDS", "ENGLISH_WORDS", "JAPANESE_NAMES", "clear_cache", "read_latin_words", "warm_up"]

log = logging.getLogger("hayakoe_pi")

ENGLISH_WORDS: dict[str, str] = {k.lower(): v for k, v in TABLE["english_words"].items()}
JAPANESE_NAMES: dict[str, str] = {k.lower(): v for k, v in TABLE["japanese_names"].items()}
CAPITAL_WORDS: frozenset[str] = frozenset(TABLE["capital_words"])
_LETTERS: dict[str, str] = TABLE["letters"]
MIN_GUESSED_LETTERS = 3  # shorter words (is, on, my) are left to OpenJTalk
MAX_GUESSED_LETTERS = 24  # longer runs are codes or tokens, not words
MAX_ACRONYM_LETTERS = 5  # readings.py spells 2-5 capitals; longer ones are left as they are

_LATIN_WORD_RE = re.compile(r"[A-Za-z]+")
# Home, Pod; TP, Link; eufy, Cam
_CAMEL_PARTS_RE = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


# --- OpenJTalk's dictionary -----------------------------------------------------------------

@lru_cache(maxsize=4096)
def _openjtalk(word: str) -> tuple[str | None, bool]:
    """(OpenJTalk's katakana reading of a Latin word, whether it knows it as a whole word).

    Unknown words come back as fillers spelled letter by letter: no reading.
    A reading put together from letter names (done → ディー + オン + イー) is
    a reading, but not of a word.
    """
    try:
        features = frontend(word)
    except TooLong:  # no word of its dictionary is that long
        return None, False
    if any(f["pos"] == "フィラー" for f in features):
        return None, False
    reading = "".join(f["pron"] for f in features if f["pron"]).replace("’", "")
    return reading or None, bool(reading) and all(f["pos"] != "記号" for f in features)


def _dictionary_word(word: str) -> str | None:
    """OpenJTalk's reading of a word it knows whole, as written or in another case (Device, device)."""
    for variant in dict.fromkeys((word, word.lower(), word.capitalize())):
        reading, whole = _openjtalk(variant)
        if whole:
            return reading
    return None


# --- kanalizer ---------------------------------------------------------------------------------

_kanalizer = None  # the module once imported; False when it is missing or failed (warned once)
_kanalizer_lock = threading.Lock()  # the warm-up thread and the first text may both reach for it


def _warn(problem: Exception) -> None:
    log.warning("kanalizer cannot be used (%s: %s); English words outside the readings table are read as "
                "before: OpenJTalk's dictionary, else spelled", type(problem).__name__, problem)


def _unavailable(problem: Exception) -> None:
    global _kanalizer
    with _kanalizer_lock:
        warned, _kanalizer = _kanalizer is False, False
    if not warned:
        _warn(problem)


def _kanalizer_module():
    global _kanalizer
    problem = None
    with _kanalizer_lock:
        if _kanalizer is None:
            try:
                import kanalizer
            except Exception as e:  # not installed, or a wheel that does not load on this machine
                _kanalizer, problem = False, e
            else:
                _kanalizer = kanalizer
    if problem is not None:
        _warn(problem)
    return _kanalizer or None


def warm_up() -> None:
    """Load kanalizer's model now (60 ms on a desktop CPU) rather than on the first English word."""
    kanalizer = _kanalizer_module()
    if kanalizer is not None:
        try:
            kanalizer.convert("a")
        except Exception as e:
            _unavailable(e)


RETRY_LENGTH = 3  # katakana per letter allowed when kanalizer's default length was too short


def kanalizer_reading(kanalizer, word: str) -> str | None:
    """kanalizer's katakana for a lower-case word, None when it has no complete one.

    The one call to its model: also tools/make_english_readings.py's, which made the list.
    """
    try:
        return kanalizer.convert(word, on_incomplete="error") or None
    except kanalizer.IncompleteConversionError:
        pass
    try:  # its default length (the word's + 2) cuts an x (fix: フィックス) or a y (duty): only then a longer one
        return kanalizer.convert(word, on_incomplete="error", max_length=RETRY_LENGTH * len(word) + 2) or None
    except kanalizer.IncompleteConversionError:
        log.debug("kanalizer has no reading for %r", word)
        return None


@lru_cache(maxsize=4096)
def _guess(word: str) -> str | None:
    """kanalizer's katakana for a lower-case word; None without kanalizer or when it gives none."""
    kanalizer = _kanalizer_module()
    if kanalizer is None:
        return None
    version = getattr(kanalizer, "__version__", None)
    listed = READINGS.reading(word, version) if version else None  # made ahead by this very version
    if listed is not None:
        return listed or None
    try:
        return kanalizer_reading(kanalizer, word)
    except Exception as e:  # a broken model or library: stop asking it
        _unavailable(e)
        return None


def guessable(word: str) -> bool:
    if not MIN_GUESSED_LETTERS <= len(word) <= MAX_GUESSED_LETTERS:
        return False
    return not word.isupper() or word in CAPITAL_WORDS


# --- words ---------------------------------------------------------------------------------------

def _part(part: str) -> str | None:
    """The reading of one part of a camel-case name, None when it has none."""
    if part.isupper() and part not in CAPITAL_WORDS and len(part) <= MAX_ACRONYM_LETTERS:
        return "".join(_LETTERS[c] for c in part)  # TP of TPLink, Q of myQ
    known = _table_part(part) or _dictionary_word(part)
    if known:
        return known
    return _guess(part.lower()) if guessable(part) else None


def _camel_case(word: str, read_part) -> str | None:
    parts = _CAMEL_PARTS_RE.findall(word)
    if len(parts) < 2 or "".join(parts) != word:
        return None
    readings = [read_part(p) for p in parts]
    return "".join(readings) if all(readings) else None


def _table_part(part: str) -> str | None:
    """The table's reading of a word or a part of a name: a Japanese name first, else an English word."""
    return JAPANESE_NAMES.get(part.lower()) or ENGLISH_WORDS.get(part.lower())


@lru_cache(maxsize=4096)
def latin_word(word: str) -> str:
    """The reading of one run of Latin letters (the word itself when it has none)."""
    capitals = word.isupper()
    if capitals and len(word) <= MAX_ACRONYM_LETTERS and word not in CAPITAL_WORDS:
        # an acronym (readings.py spelled those it knows how to): as OpenJTalk reads it
        return _openjtalk(word)[0] or word
    known = _table_part(word)
    if known:
        return known
    if not guessable(word):
        return _openjtalk(word)[0] or word
    # AirPods (both parts in the table) before OpenJTalk's whole words (DeNA, PlayStation), before any parts
    reading = (_camel_case(word, _table_part) or _dictionary_word(word) or _camel_case(word, _part)
               or _guess(word.lower()))
    return reading or _openjtalk(word)[0] or word


def read_latin_words(text: str) -> str:
    # Read word by word: left in place, the spaces between English words would
    # be dropped later and the words run together into one spelled-out blob.
    return _LATIN_WORD_RE.sub(lambda m: latin_word(m.group()), text)


def clear_cache() -> None:
    """Forget the readings that came from OpenJTalk (its words changed: a new user dictionary)."""
    _openjtalk.cache_clear()
    latin_word.cache_clear()
