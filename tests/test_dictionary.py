"""The user dictionary: entries checked, compiled into OpenJTalk, used by the real front end."""

import json
import re
import signal

import pytest
import yaml

from conftest import FIXTURE_MODELS, GOLDEN, REF_MODELS, needs_shared
from harness import appliance, wait_for
from hayakoe_pi.speech.cache import PhraseCache
from hayakoe_pi.models.store import ModelStore
from hayakoe_pi.speech.service import SavedSelection, SpeechService
from hayakoe_pi.text import FrontEnd
from hayakoe_pi.text.dictionary import Entry, UserDictionary, activate, check_entry, moras, prepare
from hayakoe_pi.text.g2p import g2p
from hayakoe_pi.text.normalize import normalize_text

HARUTO = {"surface": "晴翔", "reading": "ハルト", "accent": 1, "kind": "person"}


@pytest.fixture
def use_words(tmp_path):
    """Put entries to work in this process; back to no user words afterwards."""
    def use(*entries):
        activate([check_entry(e) for e in entries], tmp_path / "build")
    yield use
    activate([], tmp_path / "build")


def phones_and_tones(text):
    r = g2p(normalize_text(text))
    return list(zip(r.phones, r.tones))


# --- entries --------------------------------------------------------------------------------

def test_moras_count_small_kana_with_the_kana_before():
    assert [moras(r) for r in ("ハルト", "キャット", "ショー", "ヴァイオリン", "ン")] == [3, 3, 2, 5, 1]


@pytest.mark.parametrize("entry, reason", [
    ({"surface": "", "reading": "ハルト", "accent": 1}, "surface must be a non-empty text"),
    ({"surface": "晴翔", "reading": "はると", "accent": 1}, "must be katakana"),
    ({"surface": "晴翔", "reading": "ハルト", "accent": 4}, "from 0 (flat) to 3"),
    ({"surface": "晴翔", "reading": "ハルト", "accent": -1}, "from 0 (flat) to 3"),
    ({"surface": "晴翔", "reading": "ハルト", "accent": "1"}, "accent of 晴翔 must be a whole number"),
    ({"surface": "晴翔", "reading": "ハルト"}, "accent of 晴翔 must be a whole number"),
    ({"surface": "123", "reading": "イチニサン", "accent": 0}, "not only digits"),
    ({"surface": "a,b", "reading": "エービー", "accent": 0}, "must be one word"),
    # digits and marks alone would be found inside the numbers of every text (21.5℃, 13-4)
    ({"surface": "1.5", "reading": "イッテンゴ", "accent": 0}, "not only digits and marks"),
    ({"surface": "3-4", "reading": "サンヨン", "accent": 0}, "not only digits and marks"),
    ({"surface": "晴翔", "reading": "ハルト", "accent": 1, "kind": "pet"}, "kind of 晴翔 must be one of"),
    ({"surface": "晴翔", "reading": "ハルト", "accent": 1, "priority": 11}, "priority of 晴翔"),
    ({"surface": "晴翔", "reading": "ハルト", "accent": 1, "colour": "red"}, "unknown field 'colour'"),
    ("晴翔", "must be a mapping"),
    # wrong types answer like wrong values (a TypeError killed the control thread, or the start)
    ({"surface": "晴翔", "reading": "ハルト", "accent": 1, "kind": []}, "kind of 晴翔 must be one of"),
    ({"surface": "晴翔", "reading": "ハルト", "accent": 1, "kind": {"a": 1}}, "kind of 晴翔 must be one of"),
    ({"surface": "晴翔", "reading": "ハルト", "accent": 1, 3: "x"}, "unknown field '3'"),
    ({"surface": ["晴翔"], "reading": "ハルト", "accent": 1}, "surface must be a non-empty text"),
    ({"surface": "晴翔", "reading": ["ハルト"], "accent": 1}, "must be katakana"),
])
def test_bad_entries_are_refused_with_the_reason(entry, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        check_entry(entry)


@pytest.mark.parametrize("surface, reading, priority, refused", [
    ("の", "ウンコ", 10, "one character"),
    ("は", "ワ", 4, "one character"),
    ("です", "ニャン", 10, "particle or auxiliary"),
    ("から", "カラ", 8, "particle or auxiliary"),
    ("の", "ノ", 3, None),  # weak enough: OpenJTalk's own words win wherever it has one
    ("です", "デス", 2, None),
    ("晴翔", "ハルト", 10, None),
    ("猫", "ネコ", 5, "one character"),
])
def test_words_that_would_change_every_sentence_need_a_low_priority(tmp_path, surface, reading, priority, refused):
    words = UserDictionary(tmp_path / "d.yaml")
    entry = {"surface": surface, "reading": reading, "accent": 0, "priority": priority}
    if refused is None:
        assert words.add(entry).surface == surface
        return
    with pytest.raises(ValueError, match=refused) as e:
        words.add(entry)
    assert "priority 3 or less" in str(e.value)
    assert not (tmp_path / "d.yaml").exists()


def test_the_dictionary_holds_at_most_max_entries(tmp_path):
    words = UserDictionary(tmp_path / "d.yaml", max_entries=2)
    for surface in ("晴翔", "陽葵"):
        words.add({"surface": surface, "reading": "ハルト", "accent": 1})
    with pytest.raises(ValueError, match="full .2 entries, dictionary.max_entries"):
        words.add({"surface": "陽向", "reading": "ヒナタ", "accent": 0})
    words.add({"surface": "晴翔", "reading": "ハルト", "accent": 2})  # replacing one is no new entry
    (tmp_path / "big.yaml").write_text("".join(f"- {{surface: 名前{i}, reading: ナマエ, accent: 0}}\n"
                                               for i in range(4)))
    big = UserDictionary(tmp_path / "big.yaml", max_entries=3)
    problems = big.load()
    assert len(big.entries) == 3 and len(problems) == 1 and "max_entries" in problems[0]


def test_the_file_skips_bad_entries_and_survives_a_corrupt_one(tmp_path):
    path = tmp_path / "dictionary.yaml"
    path.write_text("- {surface: 晴翔, reading: ハルト, accent: 1}\n- {surface: 陽葵, reading: ひまり, accent: 1}\n")
    words = UserDictionary(path)
    problems = words.load()
    assert list(words.entries) == ["晴翔"]
    assert len(problems) == 1 and "entry 2 skipped" in problems[0] and "katakana" in problems[0]
    path.write_text("- {surface: 晴翔, reading: [")
    assert "cannot be read" in words.load()[0] and words.entries == {}
    # changes are saved, and a change that cannot be put to work changes nothing
    words.add(HARUTO)

    def cannot_compile(entries):
        raise RuntimeError("compiling the user dictionary failed")

    with pytest.raises(RuntimeError):
        words.add({"surface": "陽葵", "reading": "ヒマリ", "accent": 1}, use=cannot_compile)
    assert list(words.entries) == ["晴翔"]
    again = UserDictionary(path)
    assert again.load() == [] and list(again.entries) == ["晴翔"]
    again.remove("晴翔")
    assert UserDictionary(path).load() == [] and path.read_text().strip() == "[]"


# A burst as it may come from Home Assistant: each change is judged against the words the ones
# before it left (max_entries 3 here), as if it came alone.
BURST = [
    (True, HARUTO),
    (True, {"surface": "陽葵", "reading": "ヒマリ", "accent": 1}),
    (True, {"surface": "陽向", "reading": "ひなた", "accent": 0}),  # refused alone: not katakana
    (False, "陽葵"),  # added, then removed
    (True, dict(HARUTO, accent=0)),  # the same surface again: replaces the first
    (False, "蒼空"),  # not there (yet)
    (True, {"surface": "蒼空", "reading": "ソラ", "accent": 1}),
    (True, {"surface": "湊斗", "reading": "ミナト", "accent": 0}),
    (True, {"surface": "律希", "reading": "リツキ", "accent": 1}),  # a fourth: full
    (False, "蒼空"),
]


def outcome(result):
    return result if isinstance(result, Entry) else f"{type(result).__name__}: {result}"


def test_a_burst_of_changes_is_compiled_once_and_ends_as_one_by_one(tmp_path):
    compiled = []

    def use(entries):  # compiles for real, as the daemon does; the swap is left out (this process)
        compiled.append(len(entries))
        prepare(entries, tmp_path / "build")

    alone = UserDictionary(tmp_path / "alone.yaml", max_entries=3)
    expected = []
    for adding, data in BURST:
        try:
            expected.append(alone.add(data, use=use) if adding else alone.remove(data, use=use))
        except ValueError as e:
            expected.append(e)
    compiled.clear()
    together = UserDictionary(tmp_path / "together.yaml", max_entries=3)
    got = together.apply(BURST, use=use)
    assert [outcome(r) for r in got] == [outcome(r) for r in expected]
    assert sum(isinstance(r, Entry) for r in got) == 7 and "full" in str(got[8]) and "katakana" in str(got[2])
    assert compiled == [2]  # once, for the set the burst ends with
    assert together.entries == alone.entries
    assert (tmp_path / "together.yaml").read_text() == (tmp_path / "alone.yaml").read_text()


def test_a_burst_that_cannot_be_compiled_changes_nothing_and_each_change_says_so(tmp_path):
    path = tmp_path / "dictionary.yaml"
    words = UserDictionary(path)
    words.add(HARUTO)
    before = path.read_text()

    def cannot_compile(entries):
        raise RuntimeError("compiling the user dictionary failed")

    got = words.apply(BURST[:4], use=cannot_compile)
    assert [type(r) for r in got] == [RuntimeError, RuntimeError, ValueError, RuntimeError]
    assert list(words.entries) == ["晴翔"] and path.read_text() == before
    assert words.apply([(True, {"surface": "陽向", "reading": "ひなた", "accent": 0})], use=cannot_compile)[0] \
        .args[0].startswith("reading")  # nothing accepted: nothing compiled, the refusal is its own


# --- in the front end ------------------------------------------------------------------------

def test_an_entry_sets_the_reading_and_the_accent(use_words):
    before = phones_and_tones("晴翔です")
    assert [p for p, _ in before[1:7]] == ["h", "a", "r", "e", "sh", "o"]  # OpenJTalk alone: 晴 + 翔
    use_words(HARUTO)
    # accent 1 (atamadaka): the first mora high, then low
    assert phones_and_tones("晴翔です")[1:9] == [("h", 1), ("a", 1), ("r", 0), ("u", 0), ("t", 0), ("o", 0),
                                               ("d", 0), ("e", 0)]
    use_words(dict(HARUTO, accent=0))
    # accent 0 (heiban): low, then high to the end and on through the particle
    assert phones_and_tones("晴翔です")[1:9] == [("h", 0), ("a", 0), ("r", 1), ("u", 1), ("t", 1), ("o", 1),
                                               ("d", 1), ("e", 1)]


def test_priority_decides_against_openjtalks_own_word(use_words):
    tokyo = {"surface": "東京", "reading": "ヒガシキョウ", "accent": 2}
    use_words(dict(tokyo, priority=0))
    assert g2p(normalize_text("東京に行く")).phones[1:5] == ["t", "o", "o", "ky"]
    use_words(tokyo)  # the default priority wins over a common word
    assert g2p(normalize_text("東京に行く")).phones[1:7] == ["h", "i", "g", "a", "sh", "i"]


def test_user_words_and_the_readings_table_work_around_each_other(use_words):
    assert normalize_text("SwitchBotの電池は20%です") == "スイッチボットの電池は二十パーセントです"
    use_words({"surface": "SwitchBot", "reading": "スイッチボット", "accent": 5},
              HARUTO, {"surface": "LED", "reading": "レッド", "accent": 1})
    # the user words reach OpenJTalk as written; numbers and units around them are read as before
    assert normalize_text("SwitchBotの電池は20%です") == "SwitchBotの電池は二十パーセントです"
    assert normalize_text("晴翔の部屋は3℃、LEDは2個") == "晴翔の部屋は三度,LEDは二個"
    phones = " ".join(g2p(normalize_text("晴翔の部屋は3℃、LEDは2個")).phones)
    assert phones.startswith("_ h a r u t o n o") and " r e q d o w a " in phones


def test_an_empty_dictionary_changes_nothing(use_words):
    fe = FrontEnd(FIXTURE_MODELS / "bert" / "tokenizer" / "vocab.txt")
    texts = ["晴翔が帰りました。", "東京は3℃です。", "SwitchBotの電池が20%です。"]
    before = [fe.analyze(t).as_dict() for t in texts]
    use_words(HARUTO, {"surface": "SwitchBot", "reading": "スイッチボット", "accent": 5})
    assert [fe.analyze(t).as_dict() for t in texts] != before
    use_words()
    assert [fe.analyze(t).as_dict() for t in texts] == before


@needs_shared
def test_after_words_come_and_go_the_front_end_is_hayakoes(use_words):
    use_words(HARUTO)
    use_words()
    fe = FrontEnd(REF_MODELS / "bert" / "tokenizer" / "vocab.txt")
    rows = [json.loads(line) for line in (GOLDEN / "frontend_public.jsonl").read_text().splitlines()]
    assert all(fe.analyze(r["text"]).as_dict()["phones"] == r["phones"] for r in rows)


# --- in the speech service -----------------------------------------------------------------

@pytest.mark.prepares_models  # its own derived folder
def test_a_new_word_is_not_served_the_old_cached_audio(tmp_path, use_words):
    store = ModelStore(FIXTURE_MODELS, derived_dir=tmp_path / "derived")
    speech = SpeechService(store, PhraseCache(tmp_path / "cache", 10),
                           SavedSelection(tmp_path / "state.json", 1.0, "tiny-voice", "Neutral"),
                           "tiny-voice", "Neutral", 1.0, 1.0, 100,
                           UserDictionary(tmp_path / "dictionary.yaml"), tmp_path / "build")

    def speak():
        u = speech.utterance("晴翔です。", speech.choose())
        index = 0
        while not u.ahead.at_end(index):
            index += u.ahead.get(index, timeout=1.0) is not None
        u.close(True)
        return u

    assert not speak().cached and speak().cached
    speech.add_word(HARUTO)
    with_word = speak()
    assert not with_word.cached  # another reading: not the old audio
    assert speak().cached
    speech.remove_word("晴翔")
    assert speak().cached  # the first reading again, from the cache
    assert UserDictionary(tmp_path / "dictionary.yaml").load() == []


# --- over MQTT ---------------------------------------------------------------------------------

def test_words_with_digits_and_marks_are_taken_over_mqtt_and_one_that_cannot_be_kept_is_refused(tmp_path):
    words = tmp_path / "dictionary.yaml"
    with appliance(tmp_path, dictionary={"file": str(words)}) as app:
        for surface, reading in (("PS5", "プレステファイブ"), ("R&D", "アールアンドデー"), ("Disney+", "ディズニープラス")):
            app.probe.publish("dictionary/add", {"surface": surface, "reading": reading, "accent": 0})
            added = app.probe.next_event(event="dictionary", surface=surface)
            assert (added["action"], added["reading"]) == ("added", reading)
        error = app.probe.reply("dictionary/add", {"surface": "1.5", "reading": "イッテンゴ", "accent": 0})
        assert error["event"] == "error" and "not only digits and marks" in error["error"], error
        assert app.probe.reply("say", {"id": "ps5", "text": "PS5を起動しました。"})["event"] == "finished"
        assert [e["surface"] for e in yaml.safe_load(words.read_text())] == ["Disney+", "PS5", "R&D"]


def test_a_surface_that_cannot_be_kept_is_refused_by_the_cli_with_the_reason(tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    config = tmp_path / "c.yaml"
    config.write_text(f"dictionary: {{file: {tmp_path / 'words.yaml'}}}\n")
    r = subprocess.run([sys.executable, "-m", "hayakoe_pi.cli", "dict", "add", "1.5", "イッテンゴ", "0",
                        "--config", str(config)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and "not only digits and marks" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "words.yaml").exists()


LONG = "冷蔵庫のドアが開いています。閉めてください。" * 3


def test_a_word_added_from_home_assistant_is_used_from_the_next_announcement(tmp_path):
    words = tmp_path / "dictionary.yaml"
    words.write_text("- {surface: 陽葵, reading: ヒマリ, accent: 1}\n- {surface: bad, reading: x, accent: 9}\n")
    with appliance(tmp_path, dictionary={"file": str(words)}) as app:
        assert "entry 2 skipped" in app.daemon.output()
        before = app.probe.reply("say", {"id": "b", "text": "晴翔が帰りました。"})
        app.probe.drain()
        app.probe.publish("say", {"id": "long", "text": LONG})
        app.probe.next_event(event="started", id="long")
        app.probe.publish("dictionary/add", {"surface": "晴翔", "reading": "ハルト", "accent": 1})
        added = app.probe.next_event(event="dictionary")
        assert (added["action"], added["surface"], added["reading"], added["accent"]) == ("added", "晴翔", "ハルト", 1)
        long = app.probe.next_event(event="finished", id="long", timeout=90)
        assert "interrupted" not in long  # the utterance in progress goes on as it was
        # the phrase spoken (and cached) with the old reading is not served again
        assert before["cached"] is False
        assert app.probe.reply("say", {"id": "a", "text": "晴翔が帰りました。"})["cached"] is False
        assert app.probe.reply("say", {"id": "a2", "text": "晴翔が帰りました。"})["cached"] is True
        # the plain forms a Home Assistant text entity sends, and a refusal
        app.probe.publish("dictionary/add", "陽向 ヒナタ 0")
        assert app.probe.next_event(event="dictionary", surface="陽向")["action"] == "added"
        error = app.probe.reply("dictionary/add", {"surface": "晴翔", "reading": "はると", "accent": 1})
        assert error["event"] == "error" and "katakana" in error["error"]
        app.probe.publish("dictionary/remove", "陽向")
        assert app.probe.next_event(event="dictionary", surface="陽向")["action"] == "removed"
        assert [e["surface"] for e in yaml.safe_load(words.read_text())] == ["晴翔", "陽葵"]
        # a hand edit, then systemctl reload (SIGHUP)
        words.write_text("- {surface: 晴翔, reading: ハルト, accent: 1}\n- {surface: x, reading: エックス, accent: 9}\n")
        app.probe.drain()
        app.daemon.proc.send_signal(signal.SIGHUP)
        reloaded = app.probe.next_event(event="dictionary", action="reloaded")
        assert reloaded["words"] == 1 and len(reloaded["problems"]) == 1 and "entry 2" in reloaded["problems"][0]


def test_a_corrupt_dictionary_at_start_is_logged_and_speech_goes_on(tmp_path):
    words = tmp_path / "dictionary.yaml"
    words.write_text("- {surface: 晴翔, reading: [")
    with appliance(tmp_path, dictionary={"file": str(words)}) as app:
        assert app.probe.reply("say", "晴翔が帰りました。")["event"] == "finished"
        wait_for(lambda: "cannot be read" in app.daemon.output(), 5, what="the problem logged")


@pytest.mark.prepares_models  # its own derived folder
def test_the_next_utterance_has_the_new_reading_and_the_one_in_progress_keeps_the_old(use_words, tmp_path):
    """The word is in the utterance's last sentence, which is synthesized after the swap: it is
    still read as it was when the utterance began (never half of each); the next one reads the new way."""
    import numpy as np

    from hayakoe_pi.synthesis.engine import Engine

    engine = Engine(FIXTURE_MODELS, voice="tiny-voice", store=ModelStore(FIXTURE_MODELS, derived_dir=tmp_path / "d"))
    exact = {"noise": 0.0, "noise_w": 0.0, "sdp_ratio": 0.0}  # the same samples for the same reading
    text = "雨が降りそうです。洗濯物を取り込んでください。" * 2 + "晴翔が帰りました。"
    before = engine.synthesize(text, **exact)
    pieces = engine.pieces(text, **exact)
    first = next(pieces)  # the utterance has begun ...
    with engine.exclusive():
        use_words(HARUTO)  # ... when the word comes (between two steps, as the service swaps it)
    in_progress = np.concatenate([first.audio, *(p.audio for p in pieces)])
    after = engine.synthesize(text, **exact)
    assert np.array_equal(in_progress, before)  # to its end as it began
    assert after.size != before.size or not np.allclose(after, before)  # ハルト, not ハレショウ
    assert phones_and_tones("晴翔が")[1:6] == [("h", 1), ("a", 1), ("r", 0), ("u", 0), ("t", 0)]
