"""Synthesis ahead of playback: the bounded buffer and the rule for starting a sentence."""

import threading
import time

import numpy as np
import pytest

from hayakoe_pi.synthesis.ahead import GUARD_SECONDS, SAFETY, DecoderSpeed, SynthesisAhead
from hayakoe_pi.synthesis.engine import Piece

SR = 1000  # samples per second: easy arithmetic
HOP = 10  # samples per latent frame


def sentence(index: int, windows_frames: list[int], margin: int = 0):
    """The Pieces of one sentence decoded in windows of these many frames."""
    plan, start = [], 0
    for frames in windows_frames:
        plan.append((start * HOP, (start + frames) * HOP, frames + margin))
        start += frames
    total = start * HOP
    return [Piece(np.ones(end - begin, np.float32), index, offset=begin, sentence_samples=total,
                  windows=tuple(plan), frames=frames) for begin, end, frames in plan]


class Gate:
    """A source that yields its pieces only when released, one by one."""

    def __init__(self, pieces):
        self.pieces = pieces
        self.released = threading.Semaphore(0)

    def __iter__(self):
        for p in self.pieces:
            self.released.acquire()
            yield p

    def release(self, n=1):
        for _ in range(n):
            self.released.release()


def wait_pieces(ahead, n, timeout=5):
    deadline = time.monotonic() + timeout
    while len(ahead.pieces) < n:
        assert time.monotonic() < deadline, f"only {len(ahead.pieces)} of {n} pieces"
        time.sleep(0.005)


def test_sentence_flows_only_when_the_rest_is_ready_in_time():
    # 3 windows of 100 frames = 1 s each; decoding takes 0.004 s a frame = 0.4 s a window
    gate = Gate(sentence(0, [100, 100, 100]))
    ahead = SynthesisAhead(gate, SR, DecoderSpeed(0.004))
    gate.release()
    wait_pieces(ahead, 1)
    now = time.monotonic()
    # window 2 is needed after 1 s of playback and is ready ~0.5 s from now; window 3 by ~1 s, needed at 2 s
    assert ahead.can_flow(0, now)
    # much slower decoding: window 2 would come 1.25 * 1.2 s = 1.5 s from now, after playback needs it
    ahead.speed.seconds_per_frame = 0.012
    assert not ahead.can_flow(0, now)
    # ... unless the sentence starts later: the pause before it grows by the difference
    needed = 2 * 100 * 0.012 * SAFETY + GUARD_SECONDS - 2.0  # for the 3rd window, the latest
    assert ahead.can_flow(0, now + max(needed, 100 * 0.012 * SAFETY + GUARD_SECONDS - 1.0) + 0.05)
    gate.release(2)
    wait_pieces(ahead, 3)
    assert ahead.can_flow(0, now)  # everything is there
    ahead.cancel()


def test_unknown_speed_waits_for_the_whole_sentence():
    gate = Gate(sentence(0, [50, 50]))
    ahead = SynthesisAhead(gate, SR, DecoderSpeed(None))
    ahead._measure = lambda piece, elapsed: None  # keep the speed unknown
    gate.release()
    wait_pieces(ahead, 1)
    assert not ahead.can_flow(0, time.monotonic() + 10)
    gate.release()
    wait_pieces(ahead, 2)
    assert ahead.can_flow(0, time.monotonic())


def test_speed_follows_a_slowdown_at_once_and_a_speedup_slowly():
    speed = DecoderSpeed()
    speed.observe(1.0, 100)
    assert speed.seconds_per_frame == pytest.approx(0.01)
    speed.observe(3.0, 100)
    assert speed.seconds_per_frame == pytest.approx(0.03)
    speed.observe(1.0, 100)
    assert 0.02 < speed.seconds_per_frame < 0.03


def test_synthesis_runs_at_most_the_bound_ahead_of_playback():
    def endless():
        i = 0
        while True:
            yield Piece(np.zeros(SR, np.float32), i, sentence_samples=SR, windows=((0, SR, 0),))
            i += 1

    ahead = SynthesisAhead(endless(), SR, ahead_seconds=3.0)
    time.sleep(0.3)
    assert len(ahead.pieces) == 4  # 4 s produced, then it waits: more than 3 s ahead
    assert ahead.waits_for_reader() and not ahead.waits_for_reader(played=SR)  # 1 s taken: it would go on
    ahead.played(2 * SR)
    time.sleep(0.3)
    assert len(ahead.pieces) == 6 and ahead.waits_for_reader()
    ahead.cancel()
    ahead.join(2)
    assert not ahead._thread.is_alive() and not ahead.complete


def test_a_synthesis_error_comes_after_the_pieces_before_it():
    def failing():
        yield from sentence(0, [10])
        raise ValueError("bad text")

    ahead = SynthesisAhead(failing(), SR)
    assert ahead.get(0, timeout=2) is not None
    with pytest.raises(ValueError, match="bad text"):
        ahead.get(1, timeout=2)
    with pytest.raises(ValueError):
        ahead.at_end(1)
    assert not ahead.complete


def test_whole_utterance_is_kept_for_the_cache():
    pieces = sentence(0, [10, 20]) + [Piece(np.zeros(5, np.float32), 0, pause=True)] + sentence(1, [7])
    ahead = SynthesisAhead(iter(pieces), SR)
    ahead.join(2)
    assert ahead.complete and ahead.at_end(len(pieces))
    assert ahead.audio().size == 100 + 200 + 5 + 70
    assert [p.starts_sentence for p in pieces] == [True, False, False, True]
    assert [p.ends_sentence for p in pieces] == [False, True, True, True]


def test_synthesis_threads_run_below_the_player(tmp_path):
    """ONNX Runtime's pool and the synthesis thread are niced; the rest of the process is not."""
    import json
    import subprocess
    import sys

    from conftest import FIXTURE_MODELS, REPO

    script = f"""
import json, os, threading
from hayakoe_pi.synthesis.engine import Engine
from hayakoe_pi.synthesis.ahead import synthesize_ahead
eng = Engine({str(FIXTURE_MODELS)!r}, voice="tiny-voice")
seen = {{}}
def watch():  # the synthesis thread's own priority, while it runs
    seen["synthesis"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
ahead = synthesize_ahead(eng, "こんにちは。", progress=watch)
ahead.join()
me = threading.get_native_id()
others = [int(open(f"/proc/self/task/{{t}}/stat").read().rsplit(")", 1)[1].split()[16])
          for t in os.listdir("/proc/self/task") if int(t) != me]
print(json.dumps([os.getpriority(os.PRIO_PROCESS, me), seen["synthesis"], sorted(set(others))]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=REPO, check=True).stdout
    main, synthesis, others = json.loads(out)
    assert main == 0 and synthesis == 5
    assert 5 in others, "ONNX Runtime's compute threads run at the player's priority"


def test_the_first_text_after_a_start_is_planned_by_the_speed_prepare_measured(store, monkeypatch):
    from hayakoe_pi.synthesis import ahead
    from hayakoe_pi.synthesis.engine import Engine

    engine = Engine(store.dir, voice="tiny-voice", store=store)
    seconds, frames = engine.voice.tuned_speed  # prepare timed the decoder on this CPU
    monkeypatch.setattr(ahead, "_speeds", {})  # as in a daemon just started
    monkeypatch.setattr(ahead, "SynthesisAhead", lambda pieces, rate, speed, progress=None: speed)
    speed = ahead.synthesize_ahead(engine, "こんにちは。")
    assert speed.seconds_per_frame == pytest.approx(seconds / frames)
