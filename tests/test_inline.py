"""A reading written into the message for one word (hayakoe_pi.text.inline): 市場《イチバ》."""

from __future__ import annotations

import pytest

from conftest import FIXTURE_MODELS
from hayakoe_pi.text import FrontEnd, TextError
from hayakoe_pi.text.g2p import g2p
from hayakoe_pi.text.inline import InlineReadingError, check_inline_readings
from hayakoe_pi.text.normalize import normalize_text


@pytest.mark.parametrize("raw,want", [
    ("市場《イチバ》は混んでいます", "イチバは混んでいます"),  # OpenJTalk alone: シジョー
    ("今日は生《ナマ》です", "今日はナマです"),
    ("Aqara《アカラ》のドアが開きました", "アカラのドアが開きました"),  # Latin letters before 《
    ("｜Nuki Smart Lock《ヌキ スマートロック》を施錠", "ヌキスマートロックを施錠"),  # a bar marks any word
    ("|おこめ《オコメ》券", "オコメ券"),
    ("ｌｉｖｉｎｇ《リビング》", "リビング"),  # full width, after NFKC
    ("上手《ウワテ》と上手《ジョウズ》", "ウワテとジョウズ"),  # each word its own reading
])
def test_the_reading_replaces_its_word(raw, want):
    assert normalize_text(raw) == want


def test_only_that_word_is_read_differently():
    assert "ichiba" in "".join(g2p(normalize_text("市場《イチバ》は混んでいます")).phones)
    assert "shijoo" in "".join(g2p(normalize_text("市場は混んでいます")).phones)


@pytest.mark.parametrize("text", [
    "《お知らせ》洗濯が終わりました",  # no word before 《: brackets, as before
    "本日の《お知らせ》です",
    "重要 《お知らせ》",  # a space before 《
    "速報《緊急》が入りました",  # kanji inside: no reading
    "重要《お知らせ》",
    "{笑}ただいま",  # braces mean nothing
    "明日{アス}",
])
def test_brackets_that_are_no_reading_stay_as_before(text):
    check_inline_readings(text)
    assert normalize_text(text) == normalize_text(text.replace("《", "「").replace("》", "」"))


@pytest.mark.parametrize("text, words", [
    ("市場《いちば》は混んでいます", "must be katakana: 市場《イチバ》"),  # hiragana: the katakana shown
    ("｜Front Door《ふろんと》", "must be katakana: ｜Front Door《フロント》"),
    ("市場《market》", "must be katakana (《 》 meant as brackets: put a space before 《)"),
    ("｜市場《市場》", "must be katakana"),  # a bar: meant as a reading, whatever is inside
    ("市場《ーイチバ》", "must be katakana"),
    ("市場《》", "empty"),
])
def test_a_reading_that_is_not_katakana_is_refused(text, words):
    with pytest.raises(InlineReadingError) as e:
        check_inline_readings(text)
    assert words in str(e.value)


def test_the_front_end_refuses_it_as_a_text_error():
    fe = FrontEnd(FIXTURE_MODELS / "bert" / "tokenizer" / "vocab.txt")
    with pytest.raises(TextError, match="katakana"):
        fe.analyze("市場《いちば》")
    assert fe.analyze("市場《イチバ》").norm == "イチバ"
