"""English words outside the readings table (hayakoe_pi.text.english): kanalizer, camel case,
names written with spaces, the per-word cache, and the same text without kanalizer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import FIXTURE_MODELS, REPO
from hayakoe_pi.text import english
from hayakoe_pi.text.normalize import normalize_text

pytest.importorskip("kanalizer")


def _forget_readings():
    for cached in (english.latin_word, english._guess):
        getattr(cached, "cache_clear", lambda: None)()


@pytest.fixture
def fresh_cache():
    _forget_readings()
    yield
    _forget_readings()


# Words in none of the tables, nor whole in OpenJTalk's dictionary: spelled
# letter by letter before kanalizer.
GUESSED = [
    ("ecobeeの室温は22度です", "エコビーの室温は二十二度です"),
    ("Front Porchの照明が点きました", "フロントポーチの照明が点きました"),  # two words, one name
    ("Tesla Powerwallの残量は80%です", "テスラパワーウォールの残量は八十パーセントです"),
    ("SmartThingsから通知", "スマートシングスから通知"),  # camel case: Smart + Things
    ("TPLinkのプラグ", "ティーピーリンクのプラグ"),  # capitals inside a name are spelled
    ("ALARMが鳴りました", "アラームが鳴りました"),  # capitals the table marks as a word
    ("Mailbox Sensorが開きました", "メイルボックスセンサーが開きました"),
]


@pytest.mark.parametrize("raw,want", GUESSED, ids=[g[0] for g in GUESSED])
def test_words_outside_the_table_are_read_by_kanalizer(raw, want):
    assert normalize_text(raw) == want


@pytest.mark.parametrize("raw,want", [
    ("Sesame Touchが解錠しました", "セサミタッチが解錠しました"),  # kanalizer says シーセイム
    ("Uber Eatsが到着", "ウーバーイーツが到着"),  # kanalizer says ユーバー
    ("Laundryが終わりました", "ランドリーが終わりました"),  # kanalizer says ロンドリー
])
def test_the_table_comes_before_kanalizer(raw, want):
    assert normalize_text(raw) == want


@pytest.mark.parametrize("raw,want", [
    ("Deviceが見つかりました", "デバイスが見つかりました"),  # OpenJTalk knows device (kanalizer: デヴィス)
    ("Newsを再生します", "ニュースを再生します"),  # kanalizer: ニューズ
    ("DeNAのアプリ", "ディーエヌエーのアプリ"),  # known whole: not De + N + A
])
def test_openjtalks_own_words_come_before_kanalizer(raw, want):
    assert normalize_text(raw) == want


@pytest.mark.parametrize("raw,want", [
    ("HUBの電源", "エイチユービーの電源"),  # capitals not marked as a word: an acronym
    ("ABCDEFGの順", "ABCDEFGの順"),  # long capitals: left to OpenJTalk, as before
    ("is onの表示", "イズオンの表示"),  # two letters: OpenJTalk's reading, never a guess
    ("Qi充電", "キューアイ充電"),  # kanalizer would say キ
])
def test_what_kanalizer_does_not_guess(raw, want):
    assert normalize_text(raw) == want


def test_a_name_with_spaces_has_no_pause_inside():
    from hayakoe_pi.text.g2p import g2p

    result = g2p(normalize_text("Front Porch Lightが点きました"))
    spoken = result.phones[1:result.phones.index("g")]  # up to が
    assert not set(spoken) & {",", ".", "'", "-", "SP"}
    assert "".join(spoken) == "furoNtopoochiraito"


def test_each_word_is_guessed_once(monkeypatch, fresh_cache):
    calls = []

    class Counting:
        IncompleteConversionError = RuntimeError

        @staticmethod
        def convert(word, **kwargs):
            calls.append(word)
            return "ワード"

    monkeypatch.setattr(english, "_kanalizer", Counting)
    assert normalize_text("Zorbix, zorbix and Zorbix Quaxle") == "ワード,ワードアンドワードワード"
    assert sorted(calls) == ["quaxle", "zorbix"]



def test_a_reading_cut_short_is_asked_again_longer_and_only_then():
    """kanalizer's default length (the word's + 2) cuts fix (フィックス) short: asked again with a longer
    one; a word read whole at once is asked once, as before (its reading unchanged)."""
    asked = []

    class Cutting:
        class IncompleteConversionError(Exception):
            pass

        @staticmethod
        def convert(word, **kwargs):
            asked.append((word, kwargs.get("max_length", "auto")))
            if word == "fix" and kwargs.get("max_length", "auto") == "auto":
                raise Cutting.IncompleteConversionError(word)
            return {"fix": "フィックス", "patio": "パティオ"}.get(word, "")

    assert english.kanalizer_reading(Cutting, "patio") == "パティオ" and asked == [("patio", "auto")]
    asked.clear()
    assert english.kanalizer_reading(Cutting, "fix") == "フィックス"
    assert asked == [("fix", "auto"), ("fix", english.RETRY_LENGTH * 3 + 2)]
    kanalizer = pytest.importorskip("kanalizer")
    assert english.kanalizer_reading(kanalizer, "duty") == "デューティー"

def test_a_failing_kanalizer_falls_back_with_one_warning(monkeypatch, fresh_cache, caplog):
    class Broken:
        class IncompleteConversionError(Exception):
            pass

        @staticmethod
        def convert(word, **kwargs):
            raise RuntimeError("model file damaged")

    monkeypatch.setattr(english, "_kanalizer", Broken)
    with caplog.at_level("WARNING", logger="hayakoe_pi"):
        first = normalize_text("ecobeeとFront Porch")
        second = normalize_text("Tesla Powerwall")
    assert first == "ecobeeとFrontPorch" and second == "TeslaPowerwall"  # as before kanalizer
    warnings = [r for r in caplog.records if "kanalizer" in r.getMessage()]
    assert len(warnings) == 1 and "model file damaged" in warnings[0].getMessage()


def test_without_kanalizer_the_same_text_is_spoken_with_one_warning(tmp_path):
    """kanalizer not installed (its import fails): the text is still spoken, read as before."""
    script = f"""
import json, logging, sys
sys.modules["kanalizer"] = None  # import kanalizer now raises ImportError
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from hayakoe_pi.synthesis.engine import Engine
engine = Engine({str(FIXTURE_MODELS)!r}, voice="tiny-voice")
audio = engine.synthesize("ecobeeの室温は22度です。Front Porchの照明が点きました。")
print(json.dumps({{"samples": int(audio.size), "norm": engine.analyze("ecobeeとFront Porch").norm}}))
"""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["samples"] > 0
    assert result["norm"] == "ecobeeとFrontPorch"
    warnings = [line for line in run.stderr.splitlines() if line.startswith("WARNING") and "kanalizer" in line]
    assert len(warnings) == 1, run.stderr
