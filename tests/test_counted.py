"""bench/counted.py's arithmetic on counted instructions: one run is the program with it less the
program without, and bench/pi_cores.py's pipeline bound per Pi core (the counting itself is a
benchmark: bench/README.md, "The Pi's CPUs, counted")."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "bench"
sys.path.insert(0, str(BENCH))  # counted.py imports its neighbours
spec = importlib.util.spec_from_file_location("bench_counted", BENCH / "counted.py")
counted = importlib.util.module_from_spec(spec)
spec.loader.exec_module(counted)
import pi_cores as cores  # noqa: E402


def _counts(**given) -> dict:
    return {k: float(given.get(k, 0)) for k in counted.CLASSES}


# 16 multiply-adds as MLAS computes them: FP32, four Q-form fmla; 8-bit without dot
# product, smull + smlal2 (8 each) and one sadalp; with it, one sdot (4 lanes of 4).
FP32_16 = _counts(fp_mul=4)
INT8_16 = _counts(int_mul_long=2, pairwise_add_long=1)
DOT_16 = _counts(dot=1)


def test_an_a72_runs_8_bit_products_twice_as_fast_as_fp32_not_three_times():
    # a Q-form fmla takes both FP pipes (1 a cycle); smull and smlal both go to F0 alone
    fp32, bound = cores.bound_cycles(FP32_16, "cortex-a72")
    assert (fp32, bound) == (pytest.approx(4.0), "FP/ASIMD pipes")
    int8, bound = cores.bound_cycles(INT8_16, "cortex-a72")
    assert (int8, bound) == (pytest.approx(2.0), "multiply-long pipe")


def test_an_a72_multiplies_long_on_the_pipe_a_q_form_fmla_also_takes():
    mixed = _counts(int_mul_long=2, pairwise_add_long=1, fp_mul=1)
    assert cores.bound_cycles(mixed, "cortex-a72") == (pytest.approx(3.0), "multiply-long pipe")
    assert cores.bound_cycles(mixed, "cortex-a76")[0] == pytest.approx(2.0)  # an A76's fmla goes to V1


def test_an_a76_runs_fp32_on_both_pipes_and_dot_products_four_times_as_fast():
    assert cores.bound_cycles(FP32_16, "cortex-a76")[0] == pytest.approx(2.0)
    assert cores.bound_cycles(DOT_16, "cortex-a76")[0] == pytest.approx(0.5)


def test_dispatch_bounds_code_that_no_single_pipe_does():
    # 3 decoded a cycle on an A72: 600 integer and 300 load instructions take 300 cycles
    assert cores.bound_cycles(_counts(other=600, load_store=300), "cortex-a72") == (pytest.approx(300.0), "decode")


def test_seconds_are_the_bound_at_the_clock_within_the_stated_share():
    fastest, slowest = cores.seconds(_counts(fp_mul=1.8e9), "cortex-a72", 1.8)  # 3.6e9 pipe slots over 2 pipes
    low, high = cores.BOUND_SHARE
    assert fastest == pytest.approx(1.0 / high)
    assert slowest == pytest.approx(1.0 / low)


def test_one_run_is_the_program_with_it_less_the_program_without_per_unit():
    without = _counts(fp_mul=10, other=1000)
    once = _counts(fp_mul=610, other=1300)
    per = counted.per_unit(without, once, 3)
    assert per["fp_mul"] == pytest.approx(200.0)
    assert per["other"] == pytest.approx(100.0)
    assert per["dot"] == 0


def test_speech_time_adds_bert_per_character_the_rest_per_frame_and_decoder_windows():
    clock = 1.0
    fps = counted.FRAMES_PER_SECOND
    # a text of 2 s of speech (its frames) and 20 characters; integer work, 3 a cycle on an A76
    results = {"front": {"size": {"frames": 2 * fps, "tokens": 20}, "per_unit": _counts(other=3 * 4e3)},
               "bert": {"size": {"tokens": 22}, "per_unit": _counts(other=3 * 4e6)},
               "fp32": {"size": {"frames": 284, "kept": 256}, "per_unit": _counts(other=3 * 4e8)},
               "int8": {"size": {"frames": 284, "kept": 256}, "per_unit": _counts(other=3 * 4e8 / 2)}}
    e = counted.estimate(results, "cortex-a76", clock)
    low, high = cores.BOUND_SHARE
    # cycles a second of speech: 10 tokens, fps frames, fps / 256 windows
    cycles = 10 * 4e6 + fps * 4e3 + fps / 256 * 4e8
    assert e["fp32"] == (pytest.approx(cycles / high / 1e9), pytest.approx(cycles / low / 1e9))
    int8_cycles = 10 * 4e6 + fps * 4e3 + fps / 256 * 2e8
    assert e["int8"][0] == pytest.approx(int8_cycles / high / 1e9)
