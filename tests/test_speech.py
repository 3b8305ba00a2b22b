"""The speech service and the MQTT API in-process: the rules both front doors share."""

import json
import shutil

import numpy as np
import pytest

from conftest import FIXTURE_MODELS
from hayakoe_pi.speech.cache import PhraseCache
from hayakoe_pi.synthesis.engine import SPEED_RANGE
from hayakoe_pi.models.store import ModelStore
from hayakoe_pi.broker.payloads import PayloadError, parse_say, parse_volume
from hayakoe_pi.synthesis.sentences import PAUSE_AFTER
from hayakoe_pi.speech.service import SavedSelection, SpeechError, SpeechService, first_style

LIMIT = 50


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The fixture models plus a voice whose styles have no Neutral."""
    root = tmp_path_factory.mktemp("models") / "models"
    shutil.copytree(FIXTURE_MODELS, root)
    two = root / "onnx/speakers/two-styles"
    shutil.copytree(root / "onnx/speakers/tiny-voice", two)
    config = json.loads((two / "config.json").read_text())
    names = ["Whisper", "Happy", "Sad", "Calm", "Fear", "Surprise", "Disgust"]  # no Neutral, no Angry
    config["data"]["style2id"] = {name: i for i, name in enumerate(names)}
    (two / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def store(models, tmp_path_factory):
    return ModelStore(models, derived_dir=tmp_path_factory.mktemp("derived"))


def make_service(store, tmp_path, state=None, **kw):
    path = tmp_path / "state.json"
    if state is not None:
        path.write_text(state)
    selection = SavedSelection(path, 1.0, "tiny-voice", "Neutral")
    args = dict(voice="tiny-voice", style="Neutral", speed=1.0, style_weight=1.0, max_text_chars=LIMIT)
    args.update(kw)
    return SpeechService(store, PhraseCache(tmp_path / "cache", 10), selection, **args)


@pytest.fixture
def service(store, tmp_path):
    return make_service(store, tmp_path)


def code_of(call, *args):
    with pytest.raises(SpeechError) as e:
        call(*args)
    return e.value.code, str(e.value)


def test_texts_are_checked_once_for_both_doors(service):
    assert service.check_text("  こんにちは\n") == "こんにちは"
    assert code_of(service.check_text, " \n ")[0] == "empty-text"
    assert code_of(service.check_text, "あ" * (LIMIT + 1)) == (
        "text-too-long", f"text too long ({LIMIT + 1} characters, limit {LIMIT})")
    assert code_of(service.check_text, "ベル\x07です") == ("bad-text", "text contains control characters")
    assert code_of(service.check_text, 42)[0] == "bad-text"
    assert service.check_text("タブ\tと改行\r\nはよい") == "タブ\tと改行\r\nはよい"
    # a text in parts: the limit is on the whole
    service.check_part("あ" * 40, 0)
    assert code_of(service.check_part, "あ" * 11, 40) == (
        "text-too-long", f"text too long ({LIMIT + 1} characters so far, limit {LIMIT})")


def test_a_reading_in_the_text_is_checked_and_read_by_both_doors(service):
    assert service.check_text("市場《イチバ》です") == "市場《イチバ》です"  # the engine reads the markup
    assert code_of(service.check_text, "市場《いちば》です") == (
        "bad-reading", "reading 《いちば》 of 市場 must be katakana: 市場《イチバ》")
    with pytest.raises(PayloadError, match="must be katakana"):  # MQTT: an error event with the reason
        parse_say('{"text": "市場《market》", "id": "r"}'.encode(), service)
    assert service.engine.analyze("市場《イチバ》です").phones == service.engine.analyze("イチバです").phones


def test_voice_and_style_come_from_the_request_else_the_selection(service):
    assert service.voices() == ["tiny-voice", "tiny-voice-nodur", "two-styles"]
    choice = service.choose()
    assert (choice.voice, choice.style, choice.sample_rate) == ("tiny-voice", "Neutral", 44100)
    chosen = service.choose("tiny-voice-nodur", "Sad")
    assert (chosen.voice, chosen.style) == ("tiny-voice-nodur", "Sad")
    service.set_style("Happy")
    assert service.choose("tiny-voice-nodur").style == "Happy"  # the current style, where the voice has it
    service.set_style("Angry")
    assert service.choose("two-styles").style == "Whisper"  # no Angry, no Neutral: its first
    code, message = code_of(service.check_voice, "../../etc/passwd")
    assert code == "unknown-voice" and "installed: tiny-voice, tiny-voice-nodur, two-styles" in message
    code, message = code_of(service.check_style, "Angry", "two-styles")
    assert code == "unknown-style" and message == ('unknown style "Angry" of two-styles; '
                                             "styles: Whisper, Happy, Sad, Calm, Fear, Surprise, Disgust")
    assert code_of(service.check_style, "Sleepy", "tiny-voice", "speaker")[0] == "unknown-speaker"
    assert first_style(["Whisper", "Neutral"], "Angry") == "Neutral"


def test_the_selection_is_saved_and_survives_a_restart(store, tmp_path):
    service = make_service(store, tmp_path)
    service.set_voice("two-styles")
    assert service.shown("style") == "Whisper"  # Neutral is not one of its styles
    service.set_volume(35)
    assert (service.shown("volume"), service.current_volume()) == ("35", 0.35)
    for bad in (101, -1, float("nan"), True):
        with pytest.raises(ValueError):
            service.set_volume(bad)
    assert code_of(service.set_voice, "no-such-voice")[0] == "unknown-voice"
    assert code_of(service.set_style, "Neutral")[0] == "unknown-style"
    again = make_service(store, tmp_path)
    assert (again.current_voice(), again.shown("style"), again.current_volume()) == ("two-styles", "Whisper", 0.35)
    # each change with the config value it was made against
    assert json.loads((tmp_path / "state.json").read_text()) == {"changes": {
        "volume": {"value": 0.35, "config": 1.0}, "voice": {"value": "two-styles", "config": "tiny-voice"},
        "style": {"value": "Whisper", "config": "Neutral"}}}


@pytest.mark.parametrize("state", ['{"voice": "gone-voice", "style": "Happy"}', "{not json", "[1, 2]"])
def test_a_saved_selection_that_cannot_be_used_falls_back_to_the_config(store, tmp_path, state):
    service = make_service(store, tmp_path, state=state)
    assert (service.current_voice(), service.shown("style")) == ("tiny-voice", "Neutral")


def test_a_complete_synthesis_is_cached_and_served_from_the_cache(service):
    choice = service.choose()
    first = service.utterance("はい。", choice)
    assert not first.cached
    index = 0
    while not first.ahead.at_end(index):
        if first.ahead.get(index, timeout=1.0) is not None:
            index += 1
    first.close(True)
    audio = first.ahead.audio()
    second = service.utterance("はい。", choice)
    second.ahead.join(5)  # a cached utterance too is handed out by a thread of its own
    assert second.cached and np.array_equal(second.ahead.audio(), audio)
    # another speed is another phrase; a cut one is not stored
    cut = service.utterance("はい。", choice, speed=2.0)
    assert not cut.cached
    cut.close(False)
    assert not service.utterance("はい。", choice, speed=2.0).cached


def test_the_pause_after_a_streamed_piece_follows_the_engines_rule(service):
    sr = 44100
    loud = np.ones(sr, dtype=np.float32)
    assert service.pause_after("本当？", loud, sr).size == round(PAUSE_AFTER["？"] * sr)
    quiet_end = np.concatenate([loud, np.zeros(sr // 10, dtype=np.float32)])  # 0.1 s already silent
    assert abs(service.pause_after("本当？", quiet_end, sr).size - round((PAUSE_AFTER["？"] - 0.1) * sr)) < sr // 100
    slow = make_service(service.store, service.cache.dir.parent / "slow", speed=0.5)
    assert slow.pause_after("本当？", loud, sr).size == round(2 * PAUSE_AFTER["？"] * sr)


# --- the MQTT API ---------------------------------------------------------------------------

def test_plain_text_and_json_payloads_become_requests(service):
    r = parse_say("  玄関のドアが開いています。 ".encode(), service)
    assert r.text == "玄関のドアが開いています。" and len(r.id) == 12 and r.play
    r = parse_say(b"[\xe3\x81\x8a\xe7\x9f\xa5\xe3\x82\x89\xe3\x81\x9b] x", service, play=False)  # "[お知らせ] x"
    assert r.text == "[お知らせ] x" and not r.play
    r = parse_say(json.dumps({"text": "はい", "id": 7, "voice": "two-styles", "style": "Happy", "speed": 1.5,
                              "volume": 40, "interrupt": True}).encode(), service)
    assert (r.id, r.text, r.voice, r.style, r.speed, r.volume, r.interrupt) == (
        "7", "はい", "two-styles", "Happy", 1.5, 0.4, True)


@pytest.mark.parametrize("payload, complaint, has_id", [
    (b"\xff\xfe", "payload is not valid UTF-8 text", False),
    (b'{"text": "x",', "invalid JSON", False),
    (b'["a"]', "JSON payload must be an object", False),
    (b'{"text": "x", "id": true}', "id must be a string or integer", False),
    (b'{"text": "x", "id": "a", "colour": 1}', "unknown field 'colour'", True),
    (b'{"id": "a"}', "'text' must be a string", True),
    (b'{"text": "x", "id": "a", "style": "Neutral", "voice": "two-styles"}', "unknown style", True),
    (b'{"text": "x", "id": "a", "speed": 9}', f"speed must be between {SPEED_RANGE[0]:g} and {SPEED_RANGE[1]:g}", True),
    (b'{"text": "x", "id": "a", "volume": "loud"}', "volume must be a number", True),
    (b'{"text": "x", "id": "a", "interrupt": 1}', "interrupt must be true or false", True),
    (b'{"text": "   ", "id": "a"}', "empty text", True),
])
def test_bad_payloads_are_refused_with_the_reason_and_their_id(service, payload, complaint, has_id):
    with pytest.raises(PayloadError) as e:
        parse_say(payload, service)
    assert complaint in str(e.value)
    assert (e.value.request_id == "a") == has_id


@pytest.mark.parametrize("payload", ["{笑}ただいま", "{お知らせ} 洗濯が終わりました", "{ text: 1 }"])
def test_text_opening_with_a_brace_is_spoken_as_text(service, payload):
    r = parse_say(payload.encode(), service)
    assert r.text == payload.strip() and len(r.id) == 12


@pytest.mark.parametrize("payload", ['{"text": "x", "id": "a"', ' { "text": }', "{}"])
def test_json_shaped_payloads_stay_json(service, payload):
    with pytest.raises(PayloadError, match="invalid JSON|'text' must be a string"):
        parse_say(payload.encode(), service)


def test_volume_payloads():
    assert parse_volume(b" 35 ") == 35.0
    for bad in (b"loud", b"101", b"nan"):
        with pytest.raises(ValueError):
            parse_volume(bad)


def test_changing_the_words_never_holds_up_speech(store, tmp_path, monkeypatch):
    """Compiling a large dictionary takes seconds on a Pi: requests go on meanwhile; only the swap
    waits for the engine, between two of its steps."""
    import threading

    import hayakoe_pi.speech.service as speech_module
    from hayakoe_pi.text.dictionary import UserDictionary, activate

    service = make_service(store, tmp_path, dictionary=UserDictionary(tmp_path / "words.yaml"),
                           dictionary_build_dir=tmp_path / "build")
    compiling, release = threading.Event(), threading.Event()
    real_prepare = speech_module.prepare

    def slow_prepare(entries, build_dir):
        compiling.set()
        release.wait(10)
        return real_prepare(entries, build_dir)

    monkeypatch.setattr(speech_module, "prepare", slow_prepare)
    adding = threading.Thread(target=service.add_word, args=({"surface": "晴翔", "reading": "ハルト", "accent": 1},))
    adding.start()
    try:
        assert compiling.wait(10)
        done = threading.Event()
        threading.Thread(target=lambda: (service.choose(None, None), service.current_volume(), done.set()),
                         daemon=True).start()
        assert done.wait(2), "a request waited for the dictionary to compile"
        assert not (tmp_path / "words.yaml").exists()  # not saved before it compiled
    finally:
        release.set()
        adding.join(30)
    try:
        assert "晴翔" in service.dictionary.entries and (tmp_path / "words.yaml").exists()
    finally:
        activate([], tmp_path / "none")  # OpenJTalk is process-wide: no user words for the next tests


@pytest.mark.parametrize("saved", ['{"volume": Infinity}', '{"volume": NaN}', '{"volume": 5}', '{"volume": "70"}',
                                   '{"voice": 3, "style": null}', '[1]', '"x"'])
def test_state_file_values_out_of_range_are_replaced_with_the_configs(store, tmp_path, saved):
    (tmp_path / "state.json").write_text(saved)
    selection = SavedSelection(tmp_path / "state.json", 0.7, "tiny-voice", "Neutral")
    assert (selection.volume, selection.voice, selection.style) == (0.7, "tiny-voice", "Neutral")
    assert selection.shown("volume") == "70"
    assert json.loads((tmp_path / "state.json").read_text()) == {"changes": {}}  # written back without them
