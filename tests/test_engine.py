import json
import shutil
import threading
import time

import numpy as np
import pytest

from conftest import FIXTURE_MODELS, GOLDEN, REF_MODELS, needs_shared
from harness import prepare_with_two_lanes
from hayakoe_pi import Engine, ModelError, TextError
from hayakoe_pi.synthesis import engine as engine_module
from hayakoe_pi.models.lanes import LANE_WINDOW_FRAMES
from hayakoe_pi.models.split import decoder_margin
from hayakoe_pi.models.store import ModelStore
from hayakoe_pi.synthesis.sentences import split_sentences, trailing_silence
from hayakoe_pi.synthesis.windows import FIRST_WINDOW_FRAMES, decoder_windows, paced_windows

VOICE = "tiny-voice"
QUIET = dict(noise=0.0, noise_w=0.0)


@pytest.fixture(scope="module")
def engine():
    return Engine(FIXTURE_MODELS, voice=VOICE)


@pytest.mark.prepares_models  # the reference models, prepared for it alone
@needs_shared
def test_single_sentence_equals_hayakoe_raw_output():
    eng = Engine(REF_MODELS, voice="ref-voice")
    rows = [json.loads(line) for line in (GOLDEN / "audio" / "index.jsonl").read_text().splitlines()]
    assert rows
    for row in rows:
        ref = np.load(GOLDEN / "audio" / row["file"]).reshape(-1)
        got = eng.synthesize(row["text"], style="Neutral", style_weight=1.0, speed=1.0, sdp_ratio=0.2, **QUIET)
        assert got.shape == ref.shape, row["text"]
        assert np.abs(got - ref).max() <= 1e-4, row["text"]


def test_synthesize_returns_float32_audio(engine):
    audio = engine.synthesize("お風呂が沸きました。")
    assert engine.sample_rate == 44100
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert audio.size > engine.sample_rate * 0.1
    assert np.all(np.isfinite(audio)) and np.abs(audio).max() > 0


def test_noise_free_synthesis_is_deterministic(engine):
    a = engine.synthesize("玄関の鍵が開いたままです。", **QUIET)
    b = engine.synthesize("玄関の鍵が開いたままです。", **QUIET)
    assert np.array_equal(a, b)


LONG_SENTENCE = "冷蔵庫のドアが開いたままになっていますので、お手数ですが台所まで行って閉めてください。"


def _one_pass_store(engine: Engine) -> ModelStore:
    """The model files as published (synthesizer.onnx unsplit), with the prepared engine's
    BERT: on an x86 CPU without VNNI the published BERT's products saturate (prepare makes
    them exact), and what these tests compare is the synthesizer."""
    store = ModelStore(FIXTURE_MODELS, prepared=False)
    store.bert = engine.store.bert
    return store


def _raw_synthesizer_output(engine: Engine, text: str) -> np.ndarray:
    """The unsplit synthesizer.onnx run once on the whole sentence."""
    store = _one_pass_store(engine)
    voice = store.voice(VOICE)
    a = store.frontend.analyze(text)
    bert = np.repeat(store.bert(a.input_ids), a.word2ph, axis=0).T[np.newaxis].astype(np.float32)
    feeds = {
        "x": np.array([a.phones]), "x_lengths": np.array([len(a.phones)]), "sid": np.array([0]),
        "tone": np.array([a.tones]), "language": np.array([a.language]), "bert": bert,
        "style_vec": voice.style_vectors[:1].copy(),
        "noise_scale": np.zeros(1, np.float32), "length_scale": np.ones(1, np.float32),
        "noise_scale_w": np.zeros(1, np.float32), "sdp_ratio": np.full(1, 0.2, np.float32),
    }
    return voice.synth.run(["audio"], feeds)[0].reshape(-1)


def test_single_sentence_is_the_raw_synthesizer_output(engine):
    """Windowed decoding of the split graph gives the one-shot output of synthesizer.onnx."""
    assert engine.voice.decoder is not None  # the fixture's graph was split
    raw = _raw_synthesizer_output(engine, LONG_SENTENCE)
    chunks = list(engine.stream(LONG_SENTENCE, **QUIET))
    assert len(chunks) >= 3  # several decoder windows
    got = np.concatenate(chunks)
    assert got.shape == raw.shape
    assert np.abs(got - raw).max() <= 1e-4


@pytest.fixture(scope="module")
def lanes_engine(tmp_path_factory):
    """The fixture voice with two decoder lanes, whatever the tuner chose on this CPU."""
    derived = tmp_path_factory.mktemp("lanes")
    prepare_with_two_lanes(derived)
    # windows of a lane's size also without lanes, for the pieces to compare
    eng = Engine(FIXTURE_MODELS, voice=VOICE, store=ModelStore(FIXTURE_MODELS, derived_dir=derived),
                 window_frames=LANE_WINDOW_FRAMES)
    assert eng.voice.decoder_lanes is not None and eng.voice.decoder_lanes.count == 2
    return eng


# sentences of one window and of several
LANES_TEXT = LONG_SENTENCE + "閉めてください。" + "電気も消してね。" + LONG_SENTENCE + "また明日。"


def _shape(pieces) -> list[tuple]:
    return [(p.sentence, p.pause, p.offset, p.audio.size, p.frames) for p in pieces]


def test_decoder_lanes_take_the_sentences_after_the_first(lanes_engine, monkeypatch):
    """The first sentence's windows alone on every core (first sound soon, and it may play
    before its last window is ready); every later sentence's on the lanes, given out
    whole; the same pieces in the same order as one decoder gives."""
    voice = lanes_engine.voice
    lanes = voice.decoder_lanes
    on_lanes = []  # (sentence, future, frames) of each window given to the lanes
    budget = 2 * (LANE_WINDOW_FRAMES + 2 * voice.decoder_margin)
    beside = []  # frames under way on the lanes as each window was given to them

    def submit(job):
        under_way = sum(frames for _, f, frames in on_lanes if not f.done())
        # the lanes' memory: two lane windows' frames at most under way, or one window alone
        assert under_way == 0 or under_way + job.__self__.piece.frames <= budget
        beside.append(under_way)
        on_lanes.append((job.__self__.piece.sentence, submit_to_lanes(job), job.__self__.piece.frames))
        return on_lanes[-1][1]

    submit_to_lanes = lanes.submit
    monkeypatch.setattr(lanes, "submit", submit)
    got = []
    for piece in lanes_engine.pieces(LANES_TEXT, **QUIET):
        # a sentence from the lanes comes whole: none of its windows is still being decoded
        assert all(f.done() for s, f, _ in on_lanes if s == piece.sentence)
        got.append(piece)
    assert sorted({s for s, _, _ in on_lanes}) == [1, 2, 3, 4]
    assert any(beside)  # two windows at once, now and then
    monkeypatch.setattr(voice, "decoder_lanes", None)
    want = list(lanes_engine.pieces(LANES_TEXT, **QUIET))
    assert _shape(got) == _shape(want)
    windows = {s: len([p for p in want if p.sentence == s and not p.pause]) for s in range(5)}
    assert windows[0] > 1 and windows[3] > 1 and windows[1] == windows[2] == windows[4] == 1
    assert [p.sentence for p in got if not p.pause and not p.on_lane] == [0] * windows[0]
    assert all(p.on_lane for p in got if p.sentence > 0 and not p.pause)
    for g, w in zip(got, want):
        assert np.abs(g.audio - w.audio).max(initial=0) <= 1e-6


def test_decoder_lanes_free_again_after_a_stop_and_shared_by_two_texts(lanes_engine):
    texts = [LANES_TEXT, "お風呂が沸きました。" + LONG_SENTENCE]
    want = [lanes_engine.synthesize(t, **QUIET) for t in texts]
    steps = lanes_engine.pieces(LANES_TEXT, **QUIET)
    while not next(steps).on_lane:
        pass
    steps.close()  # stopped with windows under way (or waiting) on the lanes
    got = [None, None]

    def speak(i):
        got[i] = lanes_engine.synthesize(texts[i], **QUIET)

    threads = [threading.Thread(target=speak, args=(i,)) for i in range(2)]  # MQTT and Wyoming at once
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for g, w in zip(got, want):
        assert g is not None and g.shape == w.shape and np.abs(g - w).max() <= 1e-6


def test_with_lanes_a_later_sentence_is_at_most_a_lane_window_at_once(lanes_engine):
    """Two sentences decoded at once hold ONNX Runtime's arena twice: with lanes, the
    windows after the first sentence are of the lanes' size, not the engine's."""
    margin = lanes_engine.voice.decoder_margin
    eng = Engine(FIXTURE_MODELS, voice=VOICE, store=lanes_engine.store)  # full windows of 256 frames
    assert eng.voice.decoder_lanes is not None
    windows = [p for p in eng.pieces("はい。" + LONG_SENTENCE, **QUIET) if p.sentence == 1 and not p.pause]
    assert len(windows) >= 2 and windows[0].frames == LANE_WINDOW_FRAMES + margin


def test_a_later_sentence_is_cut_into_full_windows(engine):
    """Only the text's first sentence starts with a short window (first sound soon): the
    later ones are decoded while those before them play, and each boundary costs margins."""
    eng = Engine(FIXTURE_MODELS, voice=VOICE, store=engine.store, window_frames=64)
    pieces = [p for p in eng.pieces(LONG_SENTENCE + LONG_SENTENCE, **QUIET) if not p.pause]
    first = [p.audio.size // eng.voice.hop_length for p in pieces if p.sentence == 0]
    later = [p.audio.size // eng.voice.hop_length for p in pieces if p.sentence == 1]
    assert first[0] == FIRST_WINDOW_FRAMES and first[1] == 64
    assert len(later) >= 3 and later[:-1] == [64] * (len(later) - 1) and later[-1] >= 32


def test_first_window_is_short(engine):
    chunks = list(engine.stream(LONG_SENTENCE, **QUIET))
    assert chunks[0].size <= FIRST_WINDOW_FRAMES * engine.voice.hop_length
    assert chunks[0].size < chunks[1].size  # then they grow


def test_the_test_only_heavy_decoder_burns_cpu_for_its_audio_and_keeps_the_samples(engine, monkeypatch):
    """HAYAKOE_PI_TEST_DECODER_CPU (test_gapless's slow CPU): each window takes at least that many
    CPU-seconds a second of the audio it decodes, its margins included (as a real decoder's time
    grows), counted in its decoder time, and decodes the same samples."""
    plain = list(engine.pieces(LONG_SENTENCE, **QUIET))
    monkeypatch.setattr(engine_module, "TEST_DECODER_CPU", 0.3)
    began = time.thread_time()
    heavy = list(engine.pieces(LONG_SENTENCE, **QUIET))
    burnt = time.thread_time() - began
    assert burnt >= 0.3 * sum(p.audio.size for p in heavy) / engine.sample_rate
    assert [p.audio.size for p in heavy] == [p.audio.size for p in plain]
    hop = engine.store.voice(engine.voice.name).hop_length
    assert sum(p.frames for p in heavy) * hop > sum(p.audio.size for p in heavy)  # windows with margins
    for a, b in zip(plain, heavy):
        assert np.array_equal(a.audio, b.audio)
        assert b.decode_seconds >= 0.3 * b.frames * hop / engine.sample_rate


def test_short_sentence_is_decoded_in_one_pass(engine):
    chunks = list(engine.stream("はい。", **QUIET))
    assert len(chunks) == 1


@pytest.mark.parametrize("frames", [1, 7, 31, 32, 40, 200, 1000, 5000])
def test_decoder_windows_cover_every_frame_once(frames):
    covered, sizes = [], []
    for start, end, lo, hi in decoder_windows(frames, 256, 14, first=48):
        assert lo <= start < end <= hi and start - lo <= 14 and hi - end <= 14
        covered.extend(range(start, end))
        sizes.append(end - start)
    assert covered == list(range(frames))
    if frames <= 256:
        assert sizes == [frames]  # one pass
    else:
        assert sizes[0] <= 48 and max(sizes) < 384  # short first, bounded (memory) after


@pytest.mark.parametrize("frames", [60, 166, 400, 2000])
@pytest.mark.parametrize("ratio", [0.2, 0.4, 0.55])
@pytest.mark.parametrize("lead", [0, 30, 120, 1000])
def test_paced_windows_each_ready_before_playback_reaches_it(frames, ratio, lead):
    """At a known decode/play ratio below 1, every window (margins counted) is decoded
    `guard` frames before playback reaches it: after the lead, or, where a first
    window cannot be ready within the lead, from when it is."""
    guard, margin = 8.6, 14
    plan = paced_windows(frames, 256, margin, ratio, guard, lead=lead, first=48)
    assert [f for s, e, _, _ in plan for f in range(s, e)] == list(range(frames))
    assert all(lo == max(0, s - margin) and hi == min(frames, e + margin) and hi - lo <= 256 + 2 * margin
               for s, e, lo, hi in plan)
    ready = np.cumsum([(hi - lo) * ratio for _, _, lo, hi in plan])
    plays_at = lead if ready[0] + guard <= lead else ready[0]
    for (start, _, _, _), at in zip(plan, ready):
        assert at + guard <= plays_at + start + 1e-9 or start == 0, (plan, start)
    if lead == 0:
        assert plan[0][1] <= 48  # first sound soon
    if lead >= 1000:
        assert len(plan) == -(-frames // 256)  # time enough: the fewest windows


def _start_needed(plan, ratio, guard, lead):
    """When playback may reach a sentence's first frame for every window of `plan` to be in time."""
    ready = np.cumsum([(hi - lo) * ratio for _, _, lo, hi in plan])
    first = lead if ready[0] + guard <= lead else ready[0]
    return max([first] + [at + guard - start for (start, _, _, _), at in zip(plan[1:], ready[1:])])


@pytest.mark.parametrize("ratio", [0.55, 0.75, 1.5, 4.0])
@pytest.mark.parametrize("frames,lead", [(171, 0), (1000, 0), (1000, 200)])
def test_windows_too_slow_to_keep_up_start_no_later_than_the_plain_ones(frames, ratio, lead):
    """Where windows cannot keep ahead of playback, the sentence waits: the plan is one
    that makes it wait least, never longer than the plain doubling plan would."""
    guard = 8.6
    plan = paced_windows(frames, 256, 14, ratio, guard, lead=lead, first=48)
    plain = list(decoder_windows(frames, 256, 14, first=48, one_pass_if_fits=False))
    assert [f for s, e, _, _ in plan for f in range(s, e)] == list(range(frames))
    assert all(hi - lo <= 256 + 28 for _, _, lo, hi in plan)
    assert _start_needed(plan, ratio, guard, lead) <= _start_needed(plain, ratio, guard, lead) + 1e-9
    if lead == 0 and ratio < 1:
        assert plan[0][1] <= 48  # faster than real time: the first sound still comes soon
    if frames == 171 and ratio == 0.55:  # a sentence of 2 s at ~2x real time: no wait at all
        assert _start_needed(plan, ratio, guard, lead) <= (plan[0][3] - plan[0][2]) * ratio + 1e-9


def test_decoder_margin_covers_the_receptive_field():
    config = json.loads((FIXTURE_MODELS / "onnx/speakers" / VOICE / "config.json").read_text())
    # HiFi-GAN v1 (rates 8,8,2,2,2; resblock kernels 3,7,11) reaches 14 frames; windows with
    # that much overlap give the one-pass output (test_single_sentence_is_the_raw_...)
    assert decoder_margin(config["model"]) == 14


def test_stream_and_synthesize_are_each_sentence_then_its_pause(engine):
    """Streamed (split graph, decoder windows) and whole, the utterance is what another path
    gives: each sentence from the unsplit synthesizer.onnx in one pass (the first as it is
    alone), each but the last followed by the silence its end calls for (。 0.35 s, ！ 0.3 s,
    less the silence already at the sentence's end)."""
    first, text = "おはようございます。", "おはようございます。朝ごはんの時間です！今日は晴れますか？"
    one_pass = Engine(FIXTURE_MODELS, voice=VOICE, store=_one_pass_store(engine))
    assert one_pass.voice.decoder is None and engine.voice.decoder is not None
    sentences = [p.audio for p in one_pass.pieces(text, **QUIET) if not p.pause]
    assert len(sentences) == 3
    alone = one_pass.synthesize(first, **QUIET)
    assert sentences[0].shape == alone.shape and np.abs(sentences[0] - alone).max() <= 1e-4
    sr = engine.sample_rate

    def pause(seconds, sentence):
        return np.zeros(int(round((seconds - trailing_silence(sentence, sr)) * sr)), np.float32)

    expected = np.concatenate([sentences[0], pause(0.35, sentences[0]), sentences[1], pause(0.3, sentences[1]),
                               sentences[2]])
    chunks = list(engine.stream(text, **QUIET))
    assert len(chunks) >= 5  # three sentences, two pauses
    for got in (np.concatenate(chunks), engine.synthesize(text, **QUIET)):
        assert got.shape == expected.shape
        assert np.abs(got - expected).max() <= 1e-4


def test_bert_sees_each_character_once_first_sentence_alone(monkeypatch):
    eng = Engine(FIXTURE_MODELS, voice=VOICE)
    calls = []
    real = eng.store.bert.__call__

    class CountingBert:
        hidden_size = eng.store.bert.hidden_size

        def __call__(self, ids):
            calls.append(len(ids))
            return real(ids)

    monkeypatch.setattr(eng.store, "bert", CountingBert())
    sentences = ["冷蔵庫のドアが開いています。", "閉めてください。", "電気も消してね。"]
    list(eng.stream("".join(sentences), **QUIET))
    chars = [len(eng.analyze(t).input_ids) - 2 for t in sentences]
    # the first sentence alone (its sound need not wait), the rest in one sequence
    assert calls == [chars[0] + 2, chars[1] + chars[2] + 2]

    # after a short first sentence the next does not wait for BERT over all the rest:
    # each window holds up to twice the characters of the one before
    calls.clear()
    sentences = ["はい。", "冷蔵庫のドアが開いています。", "閉めてください。", "電気も消してね。",
                 "明日の朝は七時に起こしますので早めに寝てください。"]
    list(eng.stream("".join(sentences), **QUIET))
    chars = [len(eng.analyze(t).input_ids) - 2 for t in sentences]
    assert chars[1] > 2 * chars[0] and chars[2] + chars[3] <= 2 * chars[1] < sum(chars[2:])
    assert calls == [chars[0] + 2, chars[1] + 2, chars[2] + chars[3] + 2, chars[4] + 2]


def test_first_of_several_sentences_starts_with_a_short_window(engine):
    first = "洗濯機の運転が終わりました。"
    alone = list(engine.stream(first, **QUIET))
    assert len(alone) == 1  # a lone sentence that fits a window: one pass
    assert alone[0].size > FIRST_WINDOW_FRAMES * engine.voice.hop_length
    chunks = list(engine.stream(first + "乾燥機に移してください。", **QUIET))
    assert chunks[0].size <= FIRST_WINDOW_FRAMES * engine.voice.hop_length


def test_pause_between_sentences(engine):
    first, second = "ドアが開いています。", "閉めてください。"
    chunks = list(engine.stream(first + second, **QUIET))
    sr = engine.sample_rate
    # the first sentence's last chunk ends with about a third of a second of silence
    paused = [c for c in chunks if c.size > sr // 10 and not np.any(c[-sr // 10:])]
    assert len(paused) == 1 and paused[0] is not chunks[-1]
    assert 0.3 <= trailing_silence(paused[0], sr) <= 0.5
    assert trailing_silence(chunks[-1], sr) < 0.3  # nothing added after the last sentence


def test_speed_changes_length(engine):
    slow = engine.synthesize("タイマーが終了しました。", speed=0.5, **QUIET)
    fast = engine.synthesize("タイマーが終了しました。", speed=2.0, **QUIET)
    assert slow.size > 1.5 * fast.size


def test_split_sentences():
    assert split_sentences("はい。いいえ！本当？") == ["はい。", "いいえ！", "本当？"]
    assert split_sentences("……はい。！？") == ["……はい。！？"]
    assert split_sentences("一行目\n二行目") == ["一行目\n", "二行目"]
    long = "あ" * 150 + "、" + "い" * 100 + "。"
    assert all(len(s) <= 160 for s in split_sentences(long))
    assert "".join(split_sentences(long)) == long


def test_empty_text_is_a_text_error(engine):
    for text in ("", "   ", "😊😊", "。。。"):
        with pytest.raises(TextError):
            engine.synthesize(text)


def test_bad_settings_are_rejected(engine):
    with pytest.raises(ValueError, match="styles: Neutral"):
        engine.synthesize("はい。", style="Sleepy")
    with pytest.raises(ValueError, match="speed"):
        engine.synthesize("はい。", speed=0)
    with pytest.raises(ValueError, match="noise"):
        engine.synthesize("はい。", noise=float("nan"))


def test_voice_without_durations_output_and_with_two_speakers():
    eng = Engine(FIXTURE_MODELS, voice="tiny-voice-nodur", speaker=1)
    assert not eng.voice.has_durations
    assert eng.synthesize("はい。", **QUIET).size > 0
    with pytest.raises(ValueError, match="out of range"):
        Engine(FIXTURE_MODELS, voice="tiny-voice-nodur", speaker=7)


def test_voices_share_one_bert_session(store):
    a = Engine(FIXTURE_MODELS, voice=VOICE, store=store)
    b = Engine(FIXTURE_MODELS, voice="tiny-voice-nodur", store=store)
    assert a.store.bert is b.store.bert
    assert store.voices() == ["tiny-voice", "tiny-voice-nodur"]


# --- clear errors for broken model directories ---------------------------------

def _error(models_dir, voice=VOICE) -> str:
    with pytest.raises(ModelError) as e:
        Engine(models_dir, voice=voice)
    return str(e.value)


def test_missing_models_dir(tmp_path):
    assert "models directory not found" in _error(tmp_path / "nope")


def test_missing_bert(models_copy):
    (models_copy / "onnx/bert/q8/bert_q8.onnx").unlink()
    assert "bert_q8.onnx" in _error(models_copy)


def test_missing_vocab(models_copy):
    (models_copy / "bert/tokenizer/vocab.txt").unlink()
    assert "vocab.txt" in _error(models_copy)


def test_unknown_voice_lists_installed(models_copy):
    msg = _error(models_copy, voice="jvnv-F1-jp")
    assert "jvnv-F1-jp" in msg and "tiny-voice" in msg


@pytest.mark.parametrize("name", ["../tiny-voice", "/etc", ".hidden", "a\\b"])
def test_path_like_voice_names_are_refused(models_copy, name):
    assert "invalid voice name" in _error(models_copy, voice=name)


def test_truncated_synthesizer(models_copy):
    path = models_copy / "onnx/speakers" / VOICE / "synthesizer.onnx"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    msg = _error(models_copy)
    assert "synthesizer.onnx" in msg and "truncated" in msg


def test_corrupted_bert(models_copy):
    path = models_copy / "onnx/bert/q8/bert_q8.onnx"
    path.write_bytes(b"\x00garbage" * 100)
    assert "bert_q8.onnx" in _error(models_copy)


def test_config_of_wrong_version(models_copy):
    path = models_copy / "onnx/speakers" / VOICE / "config.json"
    config = json.loads(path.read_text())
    config["version"] = "2.4.1"
    path.write_text(json.dumps(config))
    msg = _error(models_copy)
    assert "config.json" in msg and "JP-Extra" in msg


def test_style_vectors_of_wrong_shape(models_copy):
    path = models_copy / "onnx/speakers" / VOICE / "style_vectors.npy"
    np.save(path, np.zeros((3, 256), np.float32))
    msg = _error(models_copy)
    assert "style_vectors.npy" in msg and "(3, 256)" in msg


def test_style_count_mismatch_in_config(models_copy):
    path = models_copy / "onnx/speakers" / VOICE / "config.json"
    config = json.loads(path.read_text())
    config["data"]["num_styles"] = 9
    path.write_text(json.dumps(config))
    assert "num_styles" in _error(models_copy)


def test_missing_style_vectors(models_copy):
    (models_copy / "onnx/speakers" / VOICE / "style_vectors.npy").unlink()
    assert "style_vectors.npy" in _error(models_copy)


def test_a_copied_voice_loads_under_its_folder_name(models_copy):
    shutil.copytree(models_copy / "onnx/speakers" / VOICE, models_copy / "onnx/speakers/my-voice")
    store = ModelStore(models_copy)
    assert "my-voice" in store.voices()
    assert Engine(models_copy, voice="my-voice", store=store).synthesize("はい。").size > 0
