"""kanalizer's readings made ahead (hayakoe_pi/text/english_list.py, data/english_readings.txt): the file,
its lookup, that it changes no reading (kanalizer's own, the table's and OpenJTalk's words first, nothing
without kanalizer), that a listed word is not asked of kanalizer, and what a lookup costs in memory."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time

import pytest

from conftest import REPO
from hayakoe_pi.text import english
from hayakoe_pi.text.english_list import COPYRIGHT_PATH, LIST_PATH, READINGS, ReadingList
from hayakoe_pi.text.normalize import normalize_text

LINE_RE = re.compile(r"([a-z]{3,24})\t([ァ-ヴー]*)")


def _lines() -> list[str]:
    return LIST_PATH.read_text(encoding="utf-8").splitlines()


@pytest.fixture
def fresh_cache():
    english.latin_word.cache_clear()
    english._guess.cache_clear()
    yield
    english.latin_word.cache_clear()
    english._guess.cache_clear()


class Recording:
    """A kanalizer that says ワード for every word and records what it was asked."""

    IncompleteConversionError = RuntimeError

    def __init__(self, version: str | None):
        self.__version__ = version
        self.asked: list[str] = []

    def convert(self, word, **kwargs):
        self.asked.append(word)
        return "ワード"


# --- the file ----------------------------------------------------------------------------------

def test_the_file_names_its_kanalizer_version_and_is_sorted_word_tab_katakana():
    lines = _lines()
    assert re.fullmatch(r"# kanalizer \d+\.\d+\.\d+: .*", lines[0])
    assert READINGS.version == lines[0].split()[2].rstrip(":")
    entries = [LINE_RE.fullmatch(line) for line in lines[1:]]
    assert all(entries), next(line for line, e in zip(lines[1:], entries) if not e)
    words = [e[1].encode() for e in entries]
    assert all(a < b for a, b in zip(words, words[1:]))  # sorted by bytes, no word twice
    assert len(words) > 60_000
    assert LIST_PATH.stat().st_size < 2_200_000
    assert "SCOWL" in lines[0] and "Kevin Atkinson" in COPYRIGHT_PATH.read_text(encoding="utf-8")


def test_the_list_holds_no_word_read_before_kanalizer():
    listed = {line.split("\t")[0] for line in _lines()[1:]}
    assert not listed & set(english.ENGLISH_WORDS)  # the table's words: ルンバ, not kanalizer's
    assert not {"mail", "device", "news", "door"} & listed  # OpenJTalk's whole words
    assert {"front", "porch", "sprinkler", "bottle"} <= listed



def test_the_names_of_home_assistants_integrations_are_listed():
    """The brands Home Assistant's notifications name (ecobee, Powerwall), which no dictionary holds, cost a
    lookup too, not kanalizer's model (tools/data/home_assistant_words.txt)."""
    sys.path.insert(0, str(REPO / "tools"))
    from make_english_readings import HOME_ASSISTANT_WORDS, candidates

    listed = {line.split("\t")[0] for line in _lines()[1:]}
    wanted = candidates(HOME_ASSISTANT_WORDS.read_text(encoding="utf-8").splitlines())
    assert len(wanted) > 500 and not set(wanted) - listed, sorted(set(wanted) - listed)[:20]
    assert {"ecobee", "powerwall", "switchbot", "nanoleaf"} <= listed
    assert "Home Assistant" in _lines()[0]

def test_the_list_says_what_kanalizer_says():
    """A random sample (seed printed on failure) read by the installed kanalizer, which must be the list's version."""
    kanalizer = pytest.importorskip("kanalizer")
    assert kanalizer.__version__ == READINGS.version, "remake the list: tools/make_english_readings.py"
    seed = int(os.environ.get("ENGLISH_LIST_SEED", random.randrange(1 << 30)))
    sample = random.Random(seed).sample(_lines()[1:], 150)
    differ = {}
    for line in sample:
        word, reading = line.split("\t")
        said = english.kanalizer_reading(kanalizer, word) or ""
        if said != reading:
            differ[word] = (reading, said)
    assert not differ, f"ENGLISH_LIST_SEED={seed}: list, kanalizer: {differ}"


# --- the lookup ----------------------------------------------------------------------------------

def test_lookup_finds_every_word_and_nothing_else(tmp_path):
    path = tmp_path / "list.txt"
    entries = {"abc": "エービーシー", "abcd": "", "abd": "アブド", "mmm": "ム", "zzz": "ズ"}
    path.write_text("# kanalizer 0.1.1: test\n" + "".join(f"{w}\t{r}\n" for w, r in sorted(entries.items())),
                    encoding="utf-8")
    small = ReadingList(path)
    assert {w: small.find(w) for w in entries} == entries  # the first, the last, between; "" kept
    for absent in ("aaa", "ab", "abca", "abce", "mm", "mmmm", "zzzz", "zzy", "kanalizer", "ÄBC", ""):
        assert small.find(absent) is None, absent
    assert small.version == "0.1.1"


def test_lookup_of_the_shipped_list():
    """Every 37th word and its neighbours that are not words, found as binary search finds them: ~4000
    lookups in well under a second (10 µs each here; a search that scans lines takes ~10 ms)."""
    lines = _lines()[1:]
    READINGS.find("front")
    began = time.perf_counter()
    for line in lines[::37] + [lines[0], lines[-1]]:
        word, reading = line.split("\t")
        assert READINGS.find(word) == reading
        assert READINGS.find(word + "qx") is None
    assert time.perf_counter() - began < 1.0
    assert READINGS.find("zorbix") is None


@pytest.mark.parametrize("content", [None, b"", b"front\t\xe3\x83\x95\n"], ids=["missing", "empty", "untagged"])
def test_a_missing_or_broken_list_is_no_list_with_one_warning(tmp_path, caplog, content):
    path = tmp_path / "list.txt"
    if content is not None:
        path.write_bytes(content)
    broken = ReadingList(path)
    with caplog.at_level("WARNING", logger="hayakoe_pi"):
        assert broken.reading("front", "0.1.1") is None and broken.find("front") is None
    assert len([r for r in caplog.records if "English readings" in r.getMessage()]) == 1


# --- in the front end ------------------------------------------------------------------------------

def test_a_listed_word_is_read_from_the_list_without_asking_kanalizer(monkeypatch, fresh_cache):
    fake = Recording(READINGS.version)
    monkeypatch.setattr(english, "_kanalizer", fake)
    assert normalize_text("Sprinklerが止まりました") == f"{READINGS.find('sprinkler')}が止まりました"
    assert normalize_text("Plastic Bottleの日") == READINGS.find("plastic") + READINGS.find("bottle") + "の日"
    assert fake.asked == []
    assert normalize_text("Zorbixが来ました") == "ワードが来ました"  # not listed: kanalizer
    assert fake.asked == ["zorbix"]


def test_a_listed_word_without_a_complete_reading_is_read_as_without_kanalizer(monkeypatch, fresh_cache, tmp_path):
    path = tmp_path / "list.txt"
    path.write_text(f"# kanalizer {READINGS.version}: test\nzorbix\t\n", encoding="utf-8")  # no complete reading
    monkeypatch.setattr(english, "READINGS", ReadingList(path))
    monkeypatch.setattr(english, "_kanalizer", False)
    before = normalize_text("Zorbixの合図")
    english.latin_word.cache_clear()
    fake = Recording(READINGS.version)
    monkeypatch.setattr(english, "_kanalizer", fake)
    assert normalize_text("Zorbixの合図") == before and fake.asked == []


def test_every_listed_word_has_a_reading():
    """Words kanalizer's default length cuts short (an x: fix, fox; a y: duty, ivy) are asked again with a
    longer one (english.kanalizer_reading), so none of the list is spelled for want of a reading."""
    assert [line for line in _lines()[1:] if line.endswith("\t")] == []
    assert READINGS.find("fix") == "フィックス" and READINGS.find("duty") == "デューティー"


def test_another_kanalizer_version_ignores_the_list_with_one_warning(monkeypatch, fresh_cache, caplog):
    monkeypatch.setattr(READINGS, "_mismatch_warned", False)
    fake = Recording("9.9.9")
    monkeypatch.setattr(english, "_kanalizer", fake)
    with caplog.at_level("WARNING", logger="hayakoe_pi"):
        assert normalize_text("Sprinkler, Patio") == "ワード,ワード"
    assert fake.asked == ["sprinkler", "patio"]
    assert len([r for r in caplog.records if "9.9.9" in r.getMessage()]) == 1


def test_the_table_and_openjtalks_words_still_come_first(monkeypatch, fresh_cache, tmp_path):
    """Even a list that held them (made from another word list) cannot change those words."""
    path = tmp_path / "list.txt"
    path.write_text(f"# kanalizer {READINGS.version}: test\ndevice\tデヴィス\nlaundry\tロンドリー\nroomba\tルームバ\n"
                    "zorbix\tゾービックス\n", encoding="utf-8")
    monkeypatch.setattr(english, "READINGS", ReadingList(path))
    monkeypatch.setattr(english, "_kanalizer", Recording(READINGS.version))
    assert normalize_text("Roomba, Laundry, Device, Zorbix") == "ルンバ,ランドリー,デバイス,ゾービックス"


def test_without_kanalizer_listed_words_are_read_as_before(monkeypatch, fresh_cache):
    """The list is kanalizer's answers ahead of time: no kanalizer, no list (spelled later by OpenJTalk)."""
    monkeypatch.setattr(english, "_kanalizer", False)
    assert normalize_text("Sprinklerが止まりました") == "Sprinklerが止まりました"


def test_lookups_take_no_heap():
    """The list stays in the file's pages: opening it and 5000 lookups add under 1 MB of the process's
    own memory (RssAnon; a dict of the 71 000 readings would take ~15 MB)."""
    words = [line.split("\t")[0] for line in _lines()[1:]]
    sample = random.Random(1).sample(words, 5000)
    script = """
import json, sys
from hayakoe_pi.text.english_list import READINGS

def anon_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

sample = sys.stdin.read().split()
before = anon_kb()
found = sum(READINGS.find(w) is not None for w in sample)
print(json.dumps({"found": found, "grew_kb": anon_kb() - before}))
"""
    run = subprocess.run([sys.executable, "-c", script], input="\n".join(sample), capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["found"] == 5000
    assert result["grew_kb"] < 1024, result
