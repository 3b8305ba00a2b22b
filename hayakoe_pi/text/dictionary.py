"""The household's own words, read the way it says them: OpenJTalk's user dictionary.

The entries live in one YAML file the service owns (`dictionary.file`):

    - surface: 晴翔       # as it is written in the texts
      reading: ハルト     # katakana
      accent: 1          # 0: flat (heiban); n: the pitch drops after the n-th mora
      kind: person       # proper (default), person, place, organization, noun
      priority: 5        # 0-10 (default 5): how strongly it wins over OpenJTalk's own words

They are compiled into a MeCab user dictionary (in a child process: the
compiler prints progress bars) and handed to OpenJTalk. A user word is also
kept out of the readings table's way (numbers, units, spelled-out letters),
so 「SwitchBot」 reaches OpenJTalk as written. OpenJTalk is process-wide:
`activate` swaps it for every caller at once; the engine calls it between
two of its steps.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from ..bounds import quoted, quoted_repr
from .kana import moras, reading_problem
from .openjtalk import as_mecab_sees, frontend

log = logging.getLogger("hayakoe_pi")

# MeCab features (品詞, 細分類 1-3) of each kind of word
KINDS = {
    "proper": "名詞,固有名詞,一般,*",
    "person": "名詞,固有名詞,人名,一般",
    "place": "名詞,固有名詞,地域,一般",
    "organization": "名詞,固有名詞,組織,*",
    "noun": "名詞,一般,*,*",
}
MAX_SURFACE_CHARS = 40
# A one-character word, or a particle or auxiliary alone (の, が, です), would change nearly every
# sentence (Assist's answers too): such surfaces only at this priority or lower, below OpenJTalk's words.
FUNCTION_WORD_PRIORITY = 3
FUNCTION_POS = ("助詞", "助動詞", "接続詞", "フィラー")  # alone, から is read as a conjunction, だ as a filler
# letters, digits, kana, kanji; inner - ・ ' & . +, and + at the end (C++, Disney+)
_SURFACE_RE = re.compile(r"[^\W_]+(?:[-・'&.+][^\W_]+)*\+{0,2}")


@dataclass(frozen=True)
class Entry:
    surface: str
    reading: str
    accent: int
    kind: str = "proper"
    priority: int = 5

    def csv_line(self) -> str:
        """One MeCab dictionary line; the ids are left for the compiler to find from the features."""
        # lower wins: 5 (the default) beats a common word OpenJTalk knows (東京), 0 only unknown ones
        cost = 5000 - 800 * self.priority
        surface = as_mecab_sees(self.surface)
        return (f"{surface},,,{cost},{KINDS[self.kind]},*,*,{surface},{self.reading},{self.reading},"
                f"{self.accent}/{moras(self.reading)},*")


def check_entry(data) -> Entry:
    """An entry as given (YAML, JSON or the CLI), checked; ValueError says what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("an entry must be a mapping with surface, reading and accent")
    unknown = sorted(map(str, set(data) - {"surface", "reading", "accent", "kind", "priority"}))
    if unknown:
        raise ValueError(f"unknown field {quoted(', '.join(map(repr, unknown)), 80)}; known: surface, reading, "
                         "accent, kind, priority")
    surface = data.get("surface")
    if not isinstance(surface, str) or not surface.strip():
        raise ValueError("surface must be a non-empty text")
    surface = unicodedata.normalize("NFKC", surface.strip())
    # digits and marks alone would be found in the numbers of every text (21.5℃) and break them
    if len(surface) > MAX_SURFACE_CHARS or not _SURFACE_RE.fullmatch(surface) or \
            not any(c.isalpha() for c in surface):
        raise ValueError(f"surface {quoted_repr(surface, MAX_SURFACE_CHARS)} must be one word of letters, kana or "
                         f"kanji, with digits and - ・ ' & . + inside it if need be (not only digits and marks), "
                         f"at most {MAX_SURFACE_CHARS} characters")
    reading = data.get("reading")
    if isinstance(reading, str):
        reading = unicodedata.normalize("NFKC", reading.strip())
    problem = reading_problem(reading)
    if problem:
        raise ValueError(f"reading {quoted_repr(reading)} of {surface} {problem}")
    count = moras(reading)
    accent = data.get("accent")
    if isinstance(accent, bool) or not isinstance(accent, int) or not 0 <= accent <= count:
        raise ValueError(f"accent of {surface} must be a whole number from 0 (flat) to {count} "
                         f"(the moras of {reading}), got {quoted_repr(accent, 40)}")
    kind = data.get("kind", "proper")
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"kind of {surface} must be one of {', '.join(KINDS)}, got {quoted_repr(kind, 40)}")
    priority = data.get("priority", 5)
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 10:
        raise ValueError(f"priority of {surface} must be a whole number from 0 to 10, "
                         f"got {quoted_repr(priority, 40)}")
    return Entry(surface, reading, accent, kind, priority)


def function_word(surface: str) -> bool:
    """A particle, auxiliary or other grammatical word alone, as OpenJTalk reads it. Uses OpenJTalk:
    call it where no synthesis runs beside (the speech service holds the engine for it)."""
    features = frontend(surface)
    return bool(features) and all(f["pos"] in FUNCTION_POS for f in features)


def check_guard(entry: Entry, is_function_word: bool) -> None:
    """ValueError when the entry would take over every sentence: see FUNCTION_WORD_PRIORITY."""
    if entry.priority <= FUNCTION_WORD_PRIORITY:
        return
    what = ("one character" if len(entry.surface) == 1 else
            "a particle or auxiliary (の, が, です ...)" if is_function_word else None)
    if what:
        raise ValueError(f"{entry.surface!r} is {what}: at priority {entry.priority} it would change nearly every "
                         f"sentence; add it with priority {FUNCTION_WORD_PRIORITY} or less, or as a longer word "
                         "that includes it")


# How entries become words OpenJTalk finds, and how the front end reads them: a change makes
# every dictionary compile again and its phrases leave the cache. 2: digits and marks kept
# (PS5 had lost its 5), - and ' written as MeCab sees them.
WORDS_FORMAT = 2


def fingerprint(entries) -> str:
    """Identity of a set of entries ("" for none): part of the phrase cache's key."""
    if not entries:
        return ""
    blob = json.dumps([WORDS_FORMAT, sorted(list(asdict(e).values()) for e in entries)], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


# --- what OpenJTalk uses now (process-wide) ------------------------------------------------

_active = ""  # fingerprint of the entries in use


def active_words() -> str:
    """Fingerprint of the user words OpenJTalk uses now ("" for none)."""
    return _active


@dataclass(frozen=True)
class Prepared:
    """A set of entries ready to be used: compiled, loaded into an OpenJTalk of its own."""

    fingerprint: str
    words: tuple[str, ...]
    jtalk: object  # pyopenjtalk's instance manager


def prepare(entries: list[Entry], build_dir: Path) -> Prepared:
    """The slow part (compiling, loading the dictionaries), done while the engine goes on.

    Compiled once per set of entries into `build_dir`, a file named by their
    fingerprint, written whole or not at all; raises when it cannot be.
    """
    import pyopenjtalk

    with pyopenjtalk._global_jtalk():  # pyopenjtalk finds its system dictionary on first use
        pass
    if not entries:  # the system dictionary alone (pyopenjtalk has no call for going back to it)
        return Prepared("", (), pyopenjtalk._global_instance_manager(pyopenjtalk._jtalk_factory))
    print_ = fingerprint(entries)
    dic = build_dir / f"user-{print_}.dic"
    if not dic.is_file():
        _compile(entries, build_dir, dic)
    jtalk = pyopenjtalk.OpenJTalk(dn_mecab=pyopenjtalk.OPEN_JTALK_DICT_DIR, userdic=str(dic).encode("utf-8"))
    return Prepared(print_, tuple(e.surface for e in entries), pyopenjtalk._global_instance_manager(instance=jtalk))


def use(prepared: Prepared) -> None:
    """Make OpenJTalk (and the readings table) use the prepared entries: a swap, at once."""
    global _active
    import pyopenjtalk

    from . import normalize

    pyopenjtalk._global_jtalk = prepared.jtalk
    normalize.protect_words(list(prepared.words))
    _active = prepared.fingerprint


def activate(entries: list[Entry], build_dir: Path) -> None:
    """prepare, then use (for callers with nothing running alongside: the CLI)."""
    use(prepare(entries, build_dir))


# tests only: the CPU-seconds a compile takes at least, as on a slow Pi (spent in the compiler's
# own process, as the compile's are: the daemon's threads go on meanwhile)
TEST_COMPILE_CPU = float(os.environ.get("HAYAKOE_PI_TEST_COMPILE_CPU", "0"))
_COMPILER = ("import sys, time, pyopenjtalk\n"
             "while time.process_time() < float(sys.argv[3]): pass\n"
             "pyopenjtalk.mecab_dict_index(sys.argv[1], sys.argv[2])")


def _compile(entries: list[Entry], build_dir: Path, dic: Path) -> None:
    build_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    csv = dic.with_suffix(".csv")
    csv.write_text("".join(e.csv_line() + "\n" for e in entries), "utf-8")
    tmp = dic.with_suffix(".dic.tmp")
    r = subprocess.run([sys.executable, "-c", _COMPILER, str(csv), str(tmp), str(TEST_COMPILE_CPU)],
                       capture_output=True, text=True, timeout=120)
    csv.unlink(missing_ok=True)
    if r.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"compiling the user dictionary failed: {(r.stderr or r.stdout).strip()[-300:]}")
    tmp.replace(dic)
    for old in build_dir.glob("user-*.dic"):  # one set in use at a time
        if old != dic:
            old.unlink(missing_ok=True)


# --- the file ---------------------------------------------------------------------------------

class UserDictionary:
    """The entries of one dictionary file: read (bad entries reported and skipped), changed, saved.

    Adding checks the entry (check_entry), the guard against words that would take over
    every sentence (`is_function_word` asks OpenJTalk), and `max_entries`.
    """

    def __init__(self, path: Path, max_entries: int = 5000, is_function_word=function_word):
        self.path = Path(path)
        self.max_entries = max_entries
        self.is_function_word = is_function_word
        self.entries: dict[str, Entry] = {}

    def load(self) -> list[str]:
        """Read the file; returns what was wrong with it (each bad entry, or the whole file)."""
        self.entries = {}
        try:
            data = yaml.safe_load(self.path.read_text("utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            return [f"{self.path} cannot be read ({e}); speaking without the user dictionary"]
        if data is None:
            return []
        if not isinstance(data, list):
            return [f"{self.path} must be a list of entries; speaking without the user dictionary"]
        problems = []
        for i, item in enumerate(data, 1):
            try:
                entry = check_entry(item)
                if len(self.entries) >= self.max_entries:
                    raise ValueError(f"more than dictionary.max_entries ({self.max_entries}) entries")
            except ValueError as e:
                problems.append(f"{self.path} entry {i} skipped: {e}")
                continue
            self.entries[entry.surface] = entry
        return problems

    def add(self, data, use=None) -> Entry:
        """Add (or replace) an entry. `use(entries)`, when given, prepares the new set (and may
        return the call that swaps it in, made once the file is saved): if it fails, nothing changes."""
        return self._one(True, data, use)

    def remove(self, surface, use=None) -> Entry:
        return self._one(False, surface, use)

    def _one(self, adding: bool, data, use) -> Entry:
        result = self.apply([(adding, data)], use)[0]
        if isinstance(result, Exception):
            raise result
        return result

    def apply(self, changes, use=None) -> list:
        """Several changes, `(adding, entry or surface)` each, prepared, saved and swapped in once.

        Each is judged against the entries as the changes before it left them, so the end is
        that of applying them one by one; a refused one (its ValueError in its place) leaves
        the others be. Returns, in order, each change's Entry or its error: when the new set
        cannot be used (RuntimeError, OSError), every change taken gets that error and nothing changes.
        """
        entries = dict(self.entries)
        results: list = []
        for adding, data in changes:
            try:
                results.append(self._added(entries, data) if adding else self._removed(entries, data))
            except ValueError as e:
                results.append(e)
        if any(isinstance(r, Entry) for r in results):
            try:
                self._change(entries, use)
            except (RuntimeError, OSError) as e:
                return [e if isinstance(r, Entry) else r for r in results]
        return results

    def _added(self, entries: dict[str, Entry], data) -> Entry:
        entry = check_entry(data)
        check_guard(entry, len(entry.surface) > 1 and entry.priority > FUNCTION_WORD_PRIORITY
                    and self.is_function_word(entry.surface))
        if entry.surface not in entries and len(entries) >= self.max_entries:
            raise ValueError(f"the dictionary is full ({self.max_entries} entries, dictionary.max_entries): "
                             "remove a word first")
        entries[entry.surface] = entry
        return entry

    @staticmethod
    def _removed(entries: dict[str, Entry], surface) -> Entry:
        key = unicodedata.normalize("NFKC", surface.strip()) if isinstance(surface, str) else None
        if key not in entries:
            raise ValueError(f"{quoted_repr(surface, MAX_SURFACE_CHARS)} is not in the dictionary")
        return entries.pop(key)

    def _change(self, entries: dict[str, Entry], use) -> None:
        swap = use(list(entries.values())) if use is not None else None
        self.save(entries)
        self.entries = entries
        if swap is not None:
            swap()

    def save(self, entries: dict[str, Entry] | None = None) -> None:
        from ..durable import write_durably

        items = [{k: v for k, v in asdict(e).items() if (k, v) not in (("kind", "proper"), ("priority", 5))}
                 for e in sorted((self.entries if entries is None else entries).values(), key=lambda e: e.surface)]
        write_durably(self.path, yaml.safe_dump(items, allow_unicode=True, sort_keys=False))
