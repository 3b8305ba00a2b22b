"""The speech engine: Japanese text → float32 audio with a HayaKoe-layout voice.

    eng = Engine(models_dir, voice="jvnv-F1-jp")
    audio = eng.synthesize("こんにちは。")           # whole utterance
    for chunk in eng.stream(long_text): play(chunk)   # sentence by sentence

Text is split into sentences (sentences.py); BERT runs once over all of them (in windows of
at most 510 characters), then each sentence goes through the synthesizer and
is yielded at once (in decoder windows: windows.py, decoded by decoding.py), followed by a pause
fitting its final punctuation.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .decoding import Piece, Window, decoded
from ..layout import DEFAULT_VOICE
from ..models.lanes import LANE_WINDOW_FRAMES
from ..models.store import ModelStore
from ..models.voices import Voice
from .sentences import pause_samples, split_sentences
from ..text import Analysis, TextError
from ..text.phonemes import PUNCTUATIONS
from .windows import DECODER_WINDOW_FRAMES, FIRST_WINDOW_FRAMES, decoder_windows

__all__ = ["Engine", "Piece", "TextError"]

log = logging.getLogger("hayakoe_pi.engine")

# BERT's position limit is 512 tokens including [CLS] and [SEP].
MAX_BERT_CHARS = 510

# The speeds every way in accepts (config, MQTT, the CLI, the API): beyond them
# the voice is no longer understandable.
SPEED_RANGE = (0.25, 4.0)

# Tests only (tests/test_gapless.py): CPU-seconds the decoder spends, at least, on each
# second of audio it decodes, margins included as in a real decoder's cost (on the kept
# audio alone a short first window looked 1.2x cheaper per frame than the next, and a
# sentence started on that ran dry); the tiny test voice's takes 0.02, faster than real
# time even on the least CPU quota. The service never sets it: no burn.
TEST_DECODER_CPU = float(os.environ.get("HAYAKOE_PI_TEST_DECODER_CPU", "0"))


@dataclass
class SynthesisSettings:
    style: str = "Neutral"
    style_weight: float = 1.0
    speed: float = 1.0
    sdp_ratio: float = 0.2
    noise: float = 0.6
    noise_w: float = 0.8

    def check(self) -> None:
        for name, low, high in (
            ("style_weight", 0.0, 20.0), ("speed", *SPEED_RANGE), ("sdp_ratio", 0.0, 1.0),
            ("noise", 0.0, 2.0), ("noise_w", 0.0, 2.0),
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or \
                    not math.isfinite(value) or not low <= value <= high:
                raise ValueError(f"{name} must be a number from {low} to {high}, got {value!r}")


class Engine:
    def __init__(self, models_dir: str | Path, voice: str = DEFAULT_VOICE,
                 speaker: str | int | None = None, store: ModelStore | None = None,
                 window_frames: int = DECODER_WINDOW_FRAMES, decoder: str = "fp32"):
        # decoder: fp32, or int8/auto (each voice's 8-bit decoder where prepare found it keeps the
        # voice and is faster on this CPU); a given store has its own
        self.store = store or ModelStore(models_dir, decoder=decoder)
        self.window_frames = window_frames
        self._lock = threading.Lock()
        self.voice: Voice = self.store.voice(voice)
        self.speaker = self.voice.speaker_id(speaker)

    @property
    def sample_rate(self) -> int:
        return self.voice.sample_rate

    def exclusive(self) -> threading.Lock:
        """Held, no synthesis step runs (for swapping what every step shares: OpenJTalk's dictionary)."""
        return self._lock

    def voices(self) -> list[str]:
        return self.store.voices()

    def analyze(self, text: str) -> Analysis:
        return self.store.frontend.analyze(text)

    def synthesize(self, text: str, **settings) -> np.ndarray:
        """The whole utterance as one float32 array (raw synthesizer output plus pauses)."""
        chunks = list(self.stream(text, **settings))
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)

    def stream(self, text: str, **settings) -> Iterator[np.ndarray]:
        """Float32 chunks in playing order, each as soon as it is synthesized."""
        for piece in self.pieces(text, **settings):
            yield piece.audio

    def pieces(self, text: str, style: str = "Neutral", style_weight: float = 1.0,
               speed: float = 1.0, sdp_ratio: float = 0.2, noise: float = 0.6,
               noise_w: float = 0.8, voice: str | None = None,
               speaker: str | int | None = None, plan_windows=None) -> Iterator[Piece]:
        """The utterance as Pieces in playing order, each as soon as it is synthesized.

        `voice` (and `speaker`) pick another loaded voice for this text only.
        `plan_windows(frames, window, margin)` may plan each sentence's decoder
        windows (as decoder_windows does; None: its plan), e.g. by the measured speed.
        Several threads may stream at once: their steps take turns (OpenJTalk
        is not thread-safe, and two syntheses at once would only share the cores).
        """
        steps = self._stream(text, SynthesisSettings(style, style_weight, speed, sdp_ratio, noise, noise_w),
                             voice, speaker, plan_windows)
        while True:
            with self._lock:
                piece = next(steps, None)
            if piece is None:
                return
            yield piece

    def decoder_feeds(self, text: str, **settings) -> Iterator[dict[str, np.ndarray]]:
        """Each sentence's decoder inputs (z, g) whole, as the voice's own front makes them:
        what prepare calibrates and checks an 8-bit decoder with."""
        whole = lambda frames, window, margin: [(0, frames, 0, frames)]  # noqa: E731
        _, _, work = self._work(text, SynthesisSettings(**settings), None, None, whole)
        for item in work:
            if isinstance(item, Window):
                yield item.feeds

    def _stream(self, text: str, s: SynthesisSettings, voice_name: str | None,
                speaker: str | int | None, plan_windows=None) -> Iterator[Piece]:
        voice, sentences, work = self._work(text, s, voice_name, speaker, plan_windows)
        last = len(sentences) - 1
        length_scale = 1.0 / s.speed
        for piece in decoded(voice, work):
            yield piece
            if piece.ends_sentence and piece.sentence < last:
                pause = pause_samples(sentences[piece.sentence], piece.audio, voice.sample_rate, length_scale)
                if pause:
                    yield Piece(np.zeros(pause, dtype=np.float32), piece.sentence, pause=True)

    def _work(self, text: str, s: SynthesisSettings, voice_name: str | None, speaker: str | int | None,
              plan_windows) -> tuple[Voice, list[str], Iterator[Piece | Window]]:
        """The voice, the text's sentences, and their synthesis steps before the decoder runs."""
        s.check()
        if voice_name is None:
            voice, sid = self.voice, self.speaker  # a voice switch mid-stream does not tear it
        else:
            voice = self.store.voice(voice_name)
            sid = voice.speaker_id(speaker)
        style_vec = voice.style_vector(s.style, s.style_weight)[np.newaxis]
        sentences = split_sentences(text)
        if not sentences:
            raise TextError("nothing to speak: the text is empty")
        analyses = [self.analyze(t) for t in sentences]
        if not any(c not in PUNCTUATIONS and c != "ー" for a in analyses for c in a.norm):
            raise TextError(f"nothing to speak in {text[:80]!r}: no readable characters")
        length_scale = 1.0 / s.speed
        features = self._bert_features(analyses)
        last = len(sentences) - 1

        def work() -> Iterator[Piece | Window]:
            for i, a in enumerate(analyses):
                # the first of several sentences starts with a short decoder window: first sound soon
                yield from self._sentence_work(voice, sid, i, a, next(features), style_vec, s, length_scale,
                                               quick_start=i == 0 < last, plan_windows=plan_windows)

        return voice, sentences, work()

    def _bert_features(self, analyses: list[Analysis]) -> Iterator[np.ndarray]:
        """Per-sentence phone-level BERT features [1024, phones]; BERT sees each character once.

        The first sentence runs alone, so its sound does not wait for BERT over
        the whole text (a lone sentence is exactly a single-sentence run, as the
        reference does it). The others are packed into windows, each run as one
        sequence while the sentences before it play, each window up to twice
        the characters of the one before (at most MAX_BERT_CHARS): the next
        sentence never waits for BERT over the whole rest of the text (1.05 s
        for the 38 s text here, behind a first sentence of 1.2 s). Each
        sentence takes its characters' features and the window's [CLS]/[SEP]
        features for its two boundary slots.
        """
        i, limit = 0, 0
        while i < len(analyses):
            window = [analyses[i]]
            size = len(analyses[i].input_ids) - 2
            while i > 0 and i + len(window) < len(analyses):
                extra = len(analyses[i + len(window)].input_ids) - 2
                if size + extra > limit:
                    break
                window.append(analyses[i + len(window)])
                size += extra
            limit = min(MAX_BERT_CHARS, 2 * max(size, limit))
            ids = [window[0].input_ids[0]]
            for a in window:
                ids += a.input_ids[1:-1]
            ids.append(window[0].input_ids[-1])
            if len(ids) > MAX_BERT_CHARS + 2:  # one sentence alone too long for BERT
                ids = ids[:MAX_BERT_CHARS + 1] + ids[-1:]
            hidden = self.store.bert(ids)
            offset = 1
            for a in window:
                n = len(a.input_ids) - 2
                rows = hidden[offset:offset + n]
                if len(rows) < n:  # beyond BERT's reach in one over-long sentence
                    rows = np.concatenate([rows, np.repeat(hidden[-2:-1], n - len(rows), axis=0)])
                rows = np.concatenate([hidden[:1], rows, hidden[-1:]])
                offset += n
                yield np.repeat(rows, a.word2ph, axis=0).T.astype(np.float32, copy=False)
            i += len(window)

    def _sentence_work(self, voice: Voice, sid: int, index: int, a: Analysis, bert: np.ndarray,
                       style_vec: np.ndarray, s: SynthesisSettings, length_scale: float,
                       quick_start: bool = False, plan_windows=None) -> Iterator[Piece | Window]:
        """The sentence's audio whole, or its decoder windows when the graph is split."""
        n = len(a.phones)
        scalar = lambda v: np.array([v], dtype=np.float32)  # noqa: E731
        feeds = {
            "x": np.array([a.phones], dtype=np.int64),
            "x_lengths": np.array([n], dtype=np.int64),
            "sid": np.array([sid], dtype=np.int64),
            "tone": np.array([a.tones], dtype=np.int64),
            "language": np.array([a.language], dtype=np.int64),
            "bert": bert[np.newaxis],
            "style_vec": style_vec,
            "noise_scale": scalar(s.noise),
            "length_scale": scalar(length_scale),
            "noise_scale_w": scalar(s.noise_w),
            "sdp_ratio": scalar(s.sdp_ratio),
        }
        if not voice.decoder_inputs:  # kept whole
            audio = voice.synth.run([voice.synth_outputs[0]], feeds)[0].reshape(-1)
            yield Piece(audio, index, sentence_samples=audio.size, windows=((0, audio.size, 0),))
            return
        latent = dict(zip(voice.decoder_inputs, voice.synth.run(list(voice.decoder_inputs), feeds)))
        z = latent[voice.decoder_inputs[0]]
        hop = voice.hop_length
        window = self.window_frames
        if voice.decoder_lanes is not None and index > 0:  # its windows go to the lanes, two at once
            window = min(window, LANE_WINDOW_FRAMES)
        plan = plan_windows(z.shape[2], window, voice.decoder_margin) if plan_windows else None
        if plan is None:
            # only the text's first sentence needs a short first window: the later ones are
            # decoded while the ones before them play
            plan = list(decoder_windows(z.shape[2], window, voice.decoder_margin,
                                        first=FIRST_WINDOW_FRAMES if index == 0 else window,
                                        one_pass_if_fits=not quick_start))
        windows = tuple((start * hop, end * hop, hi - lo) for start, end, lo, hi in plan)
        for start, end, lo, hi in plan:
            yield Window({**latent, voice.decoder_inputs[0]: z[:, :, lo:hi]},
                          Piece(np.zeros(0, dtype=np.float32), index, offset=start * hop,
                                sentence_samples=z.shape[2] * hop, windows=windows, frames=hi - lo),
                          keep=slice((start - lo) * hop, (end - lo) * hop),
                          test_cpu_s=TEST_DECODER_CPU * (hi - lo) * hop / voice.sample_rate)
