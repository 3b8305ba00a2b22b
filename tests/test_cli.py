import json
import os
import re
import subprocess
import sys
import wave

import numpy as np
import pytest

from conftest import FIXTURE_MODELS, REPO


def run_cli(*args, stdin=None, **env_vars):
    env = dict(os.environ, PYTHONPATH=str(REPO), **env_vars)
    return subprocess.run([sys.executable, "-m", "hayakoe_pi.cli", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=120)


def test_frontend_prints_one_json_object_per_text():
    r = run_cli("frontend", "--models", str(FIXTURE_MODELS), "こんにちは、世界！", "はい。")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["text"] for row in rows] == ["こんにちは、世界！", "はい。"]
    assert list(rows[0]) == ["text", "norm", "phones", "tones", "language", "word2ph", "input_ids"]
    assert rows[0]["norm"] == "こんにちは,世界!"
    assert sum(rows[0]["word2ph"]) == len(rows[0]["phones"])


def test_frontend_reads_stdin_line_by_line():
    r = run_cli("frontend", "--models", str(FIXTURE_MODELS), stdin="一行目。\n二行目。\n")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["text"] for line in r.stdout.splitlines()] == ["一行目。", "二行目。"]


def test_frontend_with_wrong_models_dir_says_which_file(tmp_path):
    r = run_cli("frontend", "--models", str(tmp_path), "はい")
    assert r.returncode == 2
    assert "vocab.txt" in r.stderr and "Traceback" not in r.stderr


def test_synth_writes_16_bit_wav(tmp_path):
    out = tmp_path / "out.wav"
    r = run_cli("synth", "--models", str(FIXTURE_MODELS), "--voice", "tiny-voice", "--style", "Happy",
                "--speed", "1.2", "-o", str(out), "お風呂が沸きました。")
    assert r.returncode == 0, r.stderr
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 44100)
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    assert pcm.size > 4410 and np.abs(pcm).max() > 0


def test_synth_with_unknown_voice_is_a_clear_error(tmp_path):
    r = run_cli("synth", "--models", str(FIXTURE_MODELS), "--voice", "jvnv-F1-jp", "-o",
                str(tmp_path / "x.wav"), "はい")
    assert r.returncode == 2
    assert "jvnv-F1-jp" in r.stderr and "installed voices" in r.stderr


def test_say_speaks_on_the_sound_card_and_devices_lists_it(tmp_path):
    from harness import AlsaSink

    sink = AlsaSink(tmp_path)
    env = dict(os.environ, HOME=str(sink.home), PYTHONPATH=str(REPO))
    try:
        r = subprocess.run([sys.executable, "-m", "hayakoe_pi.cli", "devices"], env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "default" in r.stdout
        r = subprocess.run([sys.executable, "-m", "hayakoe_pi.cli", "say", "--models", str(FIXTURE_MODELS),
                            "--voice", "tiny-voice", "タイマーが終了しました。"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        sink.stop()
    pcm = np.fromfile(sink.raw, dtype="<f4")
    assert pcm.size > 0.3 * 44100 and np.abs(pcm).max() > 0.001


def test_synth_into_a_missing_folder_fails_before_synthesis_without_a_traceback(tmp_path):
    r = run_cli("synth", "--models", str(FIXTURE_MODELS), "--voice", "tiny-voice", "-o",
                str(tmp_path / "missing" / "x.wav"), "はい")
    assert r.returncode == 2
    assert "cannot write" in r.stderr and str(tmp_path / "missing") in r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr


@pytest.mark.parametrize("args, complaint", [
    (["synth", "--models", str(FIXTURE_MODELS), "--voice", "tiny-voice", "--speed", "5", "-o", "x.wav", "はい"],
     "argument --speed: speed must be a number from 0.25 to 4, got 5"),
    (["say", "--speed", "0", "はい"], "argument --speed: speed must be a number from 0.25 to 4, got 0"),
    (["say", "--speed", "nan", "はい"], "speed must be a number from 0.25 to 4, got nan"),
    (["synth", "--models", "m", "--voice", "v", "--style-weight", "21", "-o", "x.wav", "はい"],
     "argument --style-weight: style weight must be a number from 0 to 20, got 21"),
    (["dict", "add", "晴翔", "ハルト", "1", "--priority", "11"],
     "argument --priority: priority must be a whole number from 0 to 10, got 11"),
    (["dict", "add", "晴翔", "ハルト", "-1"], "argument accent: accent must be a whole number of 0 or more"),
    (["dict", "add", "晴翔", "ハルト", "1", "--kind", "pet"], "argument --kind: invalid choice: 'pet'"),
])
def test_values_out_of_range_are_refused_with_the_range_as_in_the_config(tmp_path, args, complaint):
    """Before: `say --speed 0` spoke at the default speed (0 counted as not given)."""
    r = run_cli(*args)
    assert r.returncode == 2 and complaint in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_say_without_models_says_how_to_give_them(tmp_path):
    r = run_cli("say", "はい")
    assert r.returncode == 2
    assert "models directory not found" in r.stderr and "--models DIR" in r.stderr and "--config" in r.stderr


def test_say_to_a_missing_sound_card_says_what_exists(tmp_path):
    r = run_cli("say", "--models", str(FIXTURE_MODELS), "--voice", "tiny-voice", "--device", "no such card", "はい")
    assert r.returncode == 2
    assert "audio device 'no such card' not available" in r.stderr and "output devices:" in r.stderr
    assert "Traceback" not in r.stderr and "terminate called" not in r.stderr


@pytest.mark.prepares_models
def test_first_synth_prints_nothing_but_its_result(tmp_path):
    """Preparing and loading the models, on a fresh cache, says nothing on stderr (the
    journal): no onnxruntime warning, no progress noise; only what was written."""
    out = tmp_path / "x.wav"
    r = run_cli("synth", "--models", str(FIXTURE_MODELS), "--voice", "tiny-voice", "-o", str(out),
                "はい。", XDG_CACHE_HOME=str(tmp_path / "cache"), HOME=str(tmp_path / "home"))
    assert r.returncode == 0, r.stderr
    assert any((tmp_path / "cache").rglob("*.onnx")), "nothing was prepared: the test proves nothing"
    # and onnxruntime wrote no telemetry id (Microsoft/DeveloperTools/.onnxruntime/deviceid) anywhere
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["hayakoe-pi"]
    assert not (tmp_path / "home").exists()
    assert r.stderr.splitlines() == [l for l in r.stderr.splitlines() if l.startswith(f"wrote {out}")] != []


def test_a_desktop_sound_servers_default_is_named_with_the_fix(tmp_path):
    """Desktop Pi OS: ALSA's default goes to PipeWire, which a system service cannot reach."""
    from harness import AlsaSink
    from test_audio import PIPEWIRE_DEFAULT

    conf = tmp_path / "conf.d"
    conf.mkdir()
    (conf / "99-pipewire-default.conf").write_text(PIPEWIRE_DEFAULT)
    sink = AlsaSink(tmp_path)
    env = dict(HOME=str(sink.home), HAYAKOE_ALSA_CONFIG=str(conf))
    try:
        r = run_cli("devices", **env)
        assert r.returncode == 0, r.stderr
        assert f"ALSA's default goes through PipeWire ({conf}/99-pipewire-default.conf)" in r.stdout
        assert "connect a sound card" in r.stdout  # none here
        r = run_cli("devices", "--suggest", **env)
        assert r.returncode == 1 and r.stdout == "" and "PipeWire" in r.stderr
        r = run_cli("say", "--models", str(FIXTURE_MODELS), "--voice", "tiny-voice", "はい", **env)
        assert r.returncode == 2
        assert "goes through PipeWire" in r.stderr and "set audio.device to it" in r.stderr
        assert sink.raw.stat().st_size == 0
        # a device named in the config is used as it is
        sink.set_named_device("speaker")
        r = run_cli("say", "--models", str(FIXTURE_MODELS), "--voice", "tiny-voice", "--device", "speaker",
                    "はい", **env)
        assert r.returncode == 0, r.stderr
        r = run_cli("devices", **dict(env, HAYAKOE_ALSA_CONFIG=""))
        assert r.returncode == 0 and "PipeWire" not in r.stdout
        assert re.search(r"^\* +\d+  default ", r.stdout, re.M), r.stdout
    finally:
        sink.stop()
    assert sink.raw.stat().st_size > 0


def test_version():
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout == f"hayakoe-pi {version}\n", r.stdout + r.stderr


def subcommands(parser, prefix=()):
    """Every command line of the parser that runs something: ("run",), ("dict", "add"), ..."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from subcommands(sub, prefix + (name,))
            return
    yield prefix


def test_config_is_taken_before_or_after_the_command_everywhere():
    """Before: `dict list --config X` failed (unrecognized arguments), only `dict --config X list` worked."""
    from hayakoe_pi.cli.args import build_parser

    required = {("synth",): ["--models", "m", "--voice", "v", "-o", "x.wav", "t"], ("say",): ["t"],
                ("dict", "add"): ["晴翔", "ハルト", "1"], ("dict", "remove"): ["晴翔"]}
    commands = list(subcommands(build_parser()))
    assert len(commands) == 12 and ("forget",) in commands and ("dict", "test") in commands
    for command in commands:
        rest = required.get(command, [])
        for where in range(len(command) + 1):  # before the command, between its words, after it
            argv = [*command[:where], "--config", "X.yaml", *command[where:], *rest]
            assert build_parser().parse_args(argv).config == "X.yaml", argv
        assert build_parser().parse_args([*command, *rest]).config is None


def test_dict_reads_the_config_given_after_the_action(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"dictionary: {{file: {tmp_path / 'words.yaml'}}}\n")
    (tmp_path / "words.yaml").write_text("- {surface: 晴翔, reading: ハルト, accent: 1}\n")
    for argv in (["dict", "list", "--config", str(config)], ["dict", "--config", str(config), "list"],
                 ["--config", str(config), "dict", "list"]):
        r = run_cli(*argv)
        assert r.returncode == 0 and r.stdout == "晴翔\tハルト\t1\tproper\t5\n", (argv, r.stdout, r.stderr)


@pytest.mark.parametrize("root, exists", [(True, True), (True, False), (False, True)])
def test_every_command_reads_the_services_config_when_it_exists_and_you_are_root(monkeypatch, tmp_path,
                                                                                 root, exists):
    """As `run` always did: before, plain `sudo hayakoe-pi say TEXT` ignored /etc/hayakoe-pi/config.yaml
    (its voice, its sound card) and spoke with the defaults."""
    from hayakoe_pi.cli import args as cli_args

    service = tmp_path / "config.yaml"
    if exists:
        service.write_text("{}\n")
    monkeypatch.setattr(cli_args, "DEFAULT_CONFIG", str(service))
    monkeypatch.delenv("HAYAKOE_PI_CONFIG", raising=False)
    monkeypatch.setattr(cli_args.os, "geteuid", lambda: 0 if root else 1000)
    parse = cli_args.build_parser().parse_args
    for argv in (["say", "t"], ["frontend", "t"], ["synth", "--models", "m", "--voice", "v", "-o", "o", "t"],
                 ["prepare", "--models", "m"], ["devices"]):
        assert cli_args.config_path(parse(argv)) == (str(service) if root and exists else None), argv
    for argv in (["run"], ["check"], ["forget"], ["dict", "list"], ["prepare"]):  # they need one: the service's
        assert cli_args.config_path(parse(argv)) == str(service), argv
    assert cli_args.config_path(parse(["say", "--config", "mine.yaml", "t"])) == "mine.yaml"


def test_say_without_config_speaks_with_the_services_config(tmp_path):
    """The default config (here named by HAYAKOE_PI_CONFIG) gives `say` its models, voice and card."""
    config = tmp_path / "service.yaml"
    config.write_text(f"models: {{dir: {FIXTURE_MODELS}}}\nvoice: {{name: tiny-voice}}\n"
                      f"cache: {{dir: {tmp_path / 'cache'}}}\naudio: {{device: the services card}}\n")
    r = run_cli("say", "はい", HAYAKOE_PI_CONFIG=str(config))
    assert r.returncode == 2 and "audio device 'the services card' not available" in r.stderr, r.stderr


# Runs OpenJTalk cannot take whole: an unknown word of 344 kana or more (1,032 bytes) killed the
# process (SIGSEGV, or a hang), and so did any text over 8 KiB as OpenJTalk reads it (2,734 characters)
LONG_RUNS = ["ア" * 400, "ヴァ" * 200, "ゔぁ" * 200, "あ" * 400, "漢" * 400, "a" * 400, "A" * 400, "ａ" * 400,
             "1" * 400, "ー" * 400, "α" * 400, "アア。" + "ャ" * 1000 + "です"]
TOO_LONG = ["ア" * 3000, "あ" * 3000, "q" * 3000, "1" * 3000]


def phonemes_of(row) -> str:
    from hayakoe_pi.text.phonemes import SYMBOLS

    return " ".join(SYMBOLS[i] for i in row["phones"][1::2][1:-1])  # between the blanks, inside the "_"s


def check_long_runs(r):
    assert r.returncode in (0, 1), (r.returncode, r.stderr[-500:])  # not -11 (SIGSEGV)
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["text"] for row in rows] == LONG_RUNS + TOO_LONG
    for row in rows[:len(LONG_RUNS)]:  # read, every character of them
        assert "error" not in row, row["error"]
        assert len(row["word2ph"]) >= len(row["text"]) // 2
    assert phonemes_of(rows[0]).count("a") == 400
    for row in rows[len(LONG_RUNS):]:  # too long for OpenJTalk at once: a clean error, the text named
        assert "too long" in row["error"], row


def test_frontend_reads_long_runs_of_any_script_or_says_why_not(tmp_path):
    r = run_cli("frontend", "--models", str(FIXTURE_MODELS), stdin="".join(t + "\n" for t in LONG_RUNS + TOO_LONG))
    check_long_runs(r)
    assert r.returncode == 1  # one of the texts was not read


def test_dict_test_reads_long_runs_too(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"models: {{dir: {FIXTURE_MODELS}}}\ndictionary: {{file: {tmp_path / 'words.yaml'}}}\n")
    (tmp_path / "words.yaml").write_text("- {surface: 晴翔, reading: ハルト, accent: 1}\n")
    check_long_runs(run_cli("dict", "test", "--config", str(config),
                            stdin="".join(t + "\n" for t in LONG_RUNS + TOO_LONG)))


# User words with digits and marks: the punctuation clean-up after the readings dropped the digit,
# and the word's reading with it (PS5 read ピーエス); `-` and `'` reached MeCab as − and ’, which
# no user word matched (written ＝ and ＇)
MARKED_WORDS = [("PS5", "プレステファイブ", "PS5を起動しました"), ("Wi-Fi6", "ワイファイシックス", "Wi-Fi6に繋ぎます"),
                ("x2", "バイツー", "x2で再生"), ("R&D", "アールアンドデー", "R&D部門です"),
                ("Disney+", "ディズニープラス", "Disney+で観る"), ("v1.2", "バージョンイチニ", "v1.2にしました"),
                ("It's", "イッツ", "It'sショータイム")]


def test_words_with_digits_and_marks_are_read_with_the_users_reading(tmp_path):
    from hayakoe_pi.text.phonemes import katakana_to_phonemes

    config = tmp_path / "c.yaml"
    config.write_text(f"models: {{dir: {FIXTURE_MODELS}}}\ndictionary: {{file: {tmp_path / 'words.yaml'}}}\n")
    before = [json.loads(line) for line in run_cli("dict", "test", "--config", str(config),
                                                   *[t for _, _, t in MARKED_WORDS]).stdout.splitlines()]
    for surface, reading, _ in MARKED_WORDS:
        r = run_cli("dict", "add", surface, reading, "0", "--config", str(config))
        assert r.returncode == 0, (surface, r.stderr)
    r = run_cli("dict", "test", "--config", str(config), *[t for _, _, t in MARKED_WORDS])
    assert r.returncode == 0, r.stderr
    for (surface, reading, text), row, old in zip(MARKED_WORDS, map(json.loads, r.stdout.splitlines()), before):
        assert row["norm"].startswith(surface), row["norm"]  # kept as written, for OpenJTalk to find
        assert phonemes_of(row).startswith(" ".join(katakana_to_phonemes(reading))), (text, phonemes_of(row))
        assert row["phones"] != old["phones"]
    # the text around them is read as it was
    assert phonemes_of(row).endswith("sh o o t a i m u")
