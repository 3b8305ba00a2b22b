import json

import pytest

from conftest import FIXTURE_MODELS, GOLDEN, REF_MODELS, needs_shared
from hayakoe_pi.text import FrontEnd, normalize_text
from hayakoe_pi.text.g2p import g2p
from hayakoe_pi.text.phonemes import SYMBOLS, katakana_to_phonemes
from hayakoe_pi.text.tokenizer import CharTokenizer

FIELDS = ("norm", "phones", "tones", "language", "word2ph", "input_ids")


@pytest.fixture(scope="module")
def frontend():
    return FrontEnd(FIXTURE_MODELS / "bert" / "tokenizer" / "vocab.txt")


@needs_shared
@pytest.mark.parametrize("golden_file", ["frontend_public.jsonl", "readings_public.golden.jsonl"])
def test_matches_hayakoe_frontend(golden_file):
    fe = FrontEnd(REF_MODELS / "bert" / "tokenizer" / "vocab.txt")
    rows = [json.loads(line) for line in (GOLDEN / golden_file).read_text().splitlines()]
    mismatches = []
    for row in rows:
        got = fe.analyze(row["text"]).as_dict()
        bad = [k for k in FIELDS if got[k] != row[k]]
        if bad:
            mismatches.append((row["text"], bad))
    assert mismatches == [], f"{len(rows) - len(mismatches)}/{len(rows)} equal"


def test_symbol_table_is_the_models():
    assert len(SYMBOLS) == 112
    assert SYMBOLS[0] == "_" and SYMBOLS[-2:] == ("SP", "UNK")
    assert SYMBOLS.index("N") == 5 and SYMBOLS.index("a") == 8 and SYMBOLS.index(".") == 107


def test_phonemes_and_tones_of_a_word():
    r = g2p(normalize_text("こんにちは"))
    assert r.phones == ["_", "k", "o", "N", "n", "i", "ch", "i", "w", "a", "_"]
    # heiban: low first mora, high after
    assert r.tones == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0]
    assert r.word2ph[0] == 1 and r.word2ph[-1] == 1 and sum(r.word2ph) == len(r.phones)


def test_accent_nucleus_falls():
    # 雨 (ame) is atamadaka: high then low
    r = g2p("雨")
    assert list(zip(r.phones[1:-1], r.tones[1:-1])) == [("a", 1), ("m", 0), ("e", 0)]


def test_punctuation_is_kept_and_folded():
    assert normalize_text("えっ、本当？！「はい」…") == "えっ,本当?!'はい'..."
    r = g2p("えっ,本当?")
    assert "," in r.phones and r.phones[-2] == "?"


def test_long_vowel_marks():
    assert katakana_to_phonemes("カーテン") == ["k", "a", "a", "t", "e", "N"]
    assert katakana_to_phonemes("ンー") == ["N", "N"]
    assert g2p("ーはい").phones[1] == "-"  # a leading mark is a dash


def test_unreadable_characters_are_dropped():
    assert normalize_text("こんにちは😊") == "こんにちは"
    assert normalize_text("안녕、こんにちは") == ",こんにちは"


def test_add_blank_and_offsets(frontend):
    a = frontend.analyze("お風呂が沸きました。")
    assert a.phones[0::2] == [0] * (len(a.phones) // 2 + 1)  # blanks between all symbols
    assert set(a.tones[1::2]) <= {6, 7}  # Japanese tones start at 6
    assert set(a.language[1::2]) == {1} and set(a.language[0::2]) == {0}
    assert sum(a.word2ph) == len(a.phones)
    assert len(a.word2ph) == len(a.input_ids)
    assert a.word2ph[0] % 2 == 1  # the leading slot also takes the first blank


def test_tokenizer_takes_special_ids_from_vocab(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]", "あ", "A"]) + "\n")
    tok = CharTokenizer(vocab)
    # NFKC folds the full-width letter; unknown characters become [UNK]; spaces vanish
    assert tok.encode("あ Ａ漢") == [3, 5, 6, 0, 1]


def test_tokenizer_reports_missing_specials(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("あ\nい\n")
    with pytest.raises(ValueError, match=r"\[CLS\]"):
        CharTokenizer(vocab)


def test_text_with_nothing_to_read_has_no_tokens(frontend):
    a = frontend.analyze("😊")
    assert a.norm == ""
    assert a.input_ids == [frontend.tokenizer.cls_id, frontend.tokenizer.sep_id]


@needs_shared
def test_home_automation_readings_give_the_wanted_phones():
    """Raw text (column 1) must sound like the reference front end on the wanted reading (column 2)."""
    fe = FrontEnd(REF_MODELS / "bert" / "tokenizer" / "vocab.txt")
    raw = [line.split("\t")[0] for line in (GOLDEN / "readings_public.tsv").read_text("utf-8").splitlines()
           if line.strip()]
    wanted = [json.loads(line) for line in (GOLDEN / "readings_public.golden.jsonl").read_text().splitlines()]
    assert len(raw) == len(wanted) == 30
    wrong = [r for r, w in zip(raw, wanted)
             if (lambda a: (a.phones, a.tones) != (w["phones"], w["tones"]))(fe.analyze(r))]
    assert wrong == []


def test_text_without_a_phoneme_leaves_no_openjtalk_warning_on_stderr(capfd):
    """OpenJTalk's labeler writes `WARNING: JPCommonLabel_make() ... No phoneme.` straight to
    the process's stderr (the journal) for such text; the front end does not call it then."""
    from hayakoe_pi.text.g2p import g2p

    for text in ("。", "？", "😀。", "{{{{"):
        assert g2p(text).phones[0] == "_"
    assert "JPCommonLabel" not in capfd.readouterr().err
