"""tools/arm64_probe.py compare: what tools/arm64-check fails on (the check itself runs in .ci/run)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

spec = importlib.util.spec_from_file_location(
    "arm64_probe", Path(__file__).resolve().parent.parent / "tools" / "arm64_probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


GUESSES = {"version": "0.1.1", "readings": {"doorbell": "ドアベル"}, "listed": {"checked": 24, "differ": {}}}


SPEECH = np.sin(np.linspace(0, 60, 4000)).astype(np.float32)  # the 8-bit decoder's audio on x86
GATE = {"use": True, "reason": "passed", "snr_db": {"worst": 30.0}, "mel_db": {"worst": 0.2}}


def _result(folder: Path, frontend: str, audio: dict, machine: str, kanalizer: dict = GUESSES,
            int8_audio: np.ndarray = SPEECH, int8_used: bool = True) -> Path:
    folder.mkdir()
    (folder / "frontend.jsonl").write_text(frontend, encoding="utf-8")
    np.savez(folder / "audio.npz", **audio)
    np.savez(folder / "int8.npz", **{"v/0": int8_audio})
    (folder / "run.json").write_text(json.dumps({
        "machine": machine, "python": "3.11", "onnxruntime": "1", "numpy": "2",
        "prepared": ["bert"], "decoder_form": {"v": "1d"}, "kanalizer": kanalizer,
        "int8": GATE if int8_used else {**GATE, "use": False, "reason": "too far"}, "int8_used": int8_used}))
    return folder


@pytest.fixture
def x86(tmp_path):
    return _result(tmp_path / "x86", '{"text": "鍵"}\n{"text": "窓"}\n',
                   {"v/0": np.linspace(-1, 1, 100, dtype=np.float32)}, "x86_64")


def test_equal_results_pass(tmp_path, x86, capsys):
    audio = {"v/0": np.linspace(-1, 1, 100, dtype=np.float32) + np.float32(5e-5)}
    arm64 = _result(tmp_path / "arm64", '{"text": "鍵"}\n{"text": "窓"}\n', audio, "aarch64")
    assert probe.compare(x86, arm64) == 0
    assert "byte-identical" in capsys.readouterr().out


@pytest.mark.parametrize("frontend, audio, complaint", [
    ('{"text": "鍵"}\n{"text": "まど"}\n', np.linspace(-1, 1, 100, dtype=np.float32), "frontend line 2 differs"),
    ('{"text": "鍵"}\n{"text": "窓"}\n', np.linspace(-1, 1, 100, dtype=np.float32) + np.float32(2e-4),
     "audio v/0: differs by 2.0"),
    ('{"text": "鍵"}\n{"text": "窓"}\n', np.zeros(99, np.float32), "100 samples on x86, 99 on arm64"),
])
def test_any_difference_fails(tmp_path, x86, capsys, frontend, audio, complaint):
    arm64 = _result(tmp_path / "arm64", frontend, {"v/0": audio}, "aarch64")
    assert probe.compare(x86, arm64) == 1
    assert complaint in capsys.readouterr().err


@pytest.mark.parametrize("kanalizer", [
    {"error": "ImportError: no module named kanalizer._rust"},  # the aarch64 wheel did not load
    {"version": "0.1.1", "readings": {"doorbell": "ドアーベル"}},  # or reads otherwise
])
def test_kanalizer_must_load_and_read_alike_on_arm64(tmp_path, x86, capsys, kanalizer):
    arm64 = _result(tmp_path / "arm64", '{"text": "鍵"}\n{"text": "窓"}\n',
                    {"v/0": np.linspace(-1, 1, 100, dtype=np.float32)}, "aarch64", kanalizer)
    assert probe.compare(x86, arm64) == 1
    assert "kanalizer on arm64" in capsys.readouterr().err


@pytest.mark.parametrize("listed", [
    {"checked": 24, "differ": {"aaa": ["アーア", "ア"]}},  # the list says otherwise than kanalizer on arm64
    None,  # or was not compared with it
])
def test_arm64s_kanalizer_must_read_the_list_made_ahead_as_the_list_does(tmp_path, capsys, listed):
    """Even when x86 agrees with arm64 (a list out of date: test_english_list fails on x86 then)."""
    guesses = {"version": "0.1.1", "readings": {"doorbell": "ドアベル"}} | ({"listed": listed} if listed else {})
    frontend, audio = '{"text": "鍵"}\n', {"v/0": np.zeros(10, np.float32)}
    x86 = _result(tmp_path / "x86", frontend, audio, "x86_64", guesses)
    arm64 = _result(tmp_path / "arm64", frontend, audio, "aarch64", guesses)
    assert probe.compare(x86, arm64) == 1
    assert "words of the list made ahead" in capsys.readouterr().err


def test_the_list_made_ahead_is_read_alike_by_this_machines_kanalizer(tmp_path, monkeypatch):
    """What `run` records: a sample of the shipped list, read by the installed kanalizer, none otherwise;
    a list that says otherwise is caught."""
    kanalizer = pytest.importorskip("kanalizer")
    listed = probe.listed_alike(kanalizer)
    assert listed["checked"] >= 20 and listed["differ"] == {}
    from hayakoe_pi.text import english_list

    wrong = tmp_path / "list.txt"
    wrong.write_text("# kanalizer 0.1.1: test\nfront\tフロンテ\n", encoding="utf-8")
    monkeypatch.setattr(english_list, "LIST_PATH", wrong)
    assert probe.listed_alike(kanalizer) == {"checked": 1, "differ": {"front": ["フロンテ", "フロント"]}}


@pytest.mark.parametrize("int8_audio, int8_used, complaint", [
    (SPEECH * 0.5, True, "int8 audio differs from x86's: 6.0 dB SNR"),  # a kernel computing otherwise
    (SPEECH[:-1], True, "int8 audio v/0: missing or of another length"),
    (SPEECH, False, "the 8-bit decoder is not used on arm64: too far"),
])
def test_the_8_bit_decoder_must_be_used_and_sound_alike_on_arm64(tmp_path, x86, capsys, int8_audio, int8_used,
                                                                 complaint):
    arm64 = _result(tmp_path / "arm64", '{"text": "鍵"}\n{"text": "窓"}\n',
                    {"v/0": np.linspace(-1, 1, 100, dtype=np.float32)}, "aarch64",
                    int8_audio=int8_audio, int8_used=int8_used)
    assert probe.compare(x86, arm64) == 1
    assert complaint in capsys.readouterr().err


def test_8_bit_audio_within_its_tolerance_passes(tmp_path, x86):
    noise = np.random.default_rng(0).standard_normal(SPEECH.size).astype(np.float32) * 0.03  # ~27 dB under
    arm64 = _result(tmp_path / "arm64", '{"text": "鍵"}\n{"text": "窓"}\n',
                    {"v/0": np.linspace(-1, 1, 100, dtype=np.float32)}, "aarch64", int8_audio=SPEECH + noise)
    assert probe.compare(x86, arm64) == 0
