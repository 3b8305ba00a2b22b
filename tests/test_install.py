"""install.sh and systemd/hayakoe-pi.service: lint, sandbox, and real installs into a temporary root.

The installs use install.sh's test hooks (HAYAKOE_ROOT: every system path under
a temporary folder; HAYAKOE_SKIP_SYSTEM=1: no apt-get, user, mosquitto or
systemctl). They still create a virtualenv and pip-install this checkout into
it, from PyPI as configured on the machine: two fresh installs (one copying the
fixture models, one downloading them from a local stand-in for Hugging Face),
then quicker re-runs.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from conftest import FIXTURE_MODELS, REPO
from slow_kinds import PREPARES_MODELS, slow

INSTALL = REPO / "install.sh"
UNIT = REPO / "systemd" / "hayakoe-pi.service"
SYSTEM_UNITS = next((p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))
                     if (p / "sysinit.target").exists()), None)
SHARED = ["onnx/bert/q8/bert_q8.onnx", "bert/tokenizer/vocab.txt",
          "bert/tokenizer/tokenizer_config.json", "bert/tokenizer/special_tokens_map.json"]
VOICE_FILES = ["synthesizer.onnx", "config.json", "style_vectors.npy"]
LFS_SUFFIXES = (".onnx", ".npy")  # served like Hugging Face's LFS files: redirect + X-Linked-*

needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                           reason="systemd-analyze not installed")


def voice_files(voice: str, durations: bool = True) -> list[str]:
    names = VOICE_FILES + (["duration_predictor.onnx"] if durations else [])
    return SHARED + [f"onnx/speakers/{voice}/{n}" for n in names]


def run_install(root: Path, *args: str, env: dict | None = None, check: bool = True, script: Path = INSTALL):
    e = dict(os.environ, HAYAKOE_ROOT=str(root), HAYAKOE_SKIP_SYSTEM="1")
    e.update(env or {})
    p = subprocess.run(["bash", str(script), *args], env=e, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=900)
    if check:
        assert p.returncode == 0, f"install.sh {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"
    return p


def unit_settings(path: Path = UNIT) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- static checks ------------------------------------------------------------------------

def test_shell_scripts_are_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (./tools/run-tests installs it as root)")
    scripts = [INSTALL, *(REPO / "tools" / name for name in ("run-tests", "arm64-check", "install-check", "ha-check",
                                                            "debian-root.sh", "arm64-root.sh", "trained-decoders",
                                                            "int8-check")),
               REPO / "bench" / "qemu_count" / "qemu-count", REPO / ".ci" / "run"]
    p = subprocess.run(["shellcheck", "--shell=bash", *map(str, scripts)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_install_sh_parses_and_explains_itself():
    subprocess.run(["bash", "-n", str(INSTALL)], check=True)
    help_text = subprocess.run(["bash", str(INSTALL), "--help"], capture_output=True, text=True,
                               check=True).stdout
    for option in ("--voice", "--models-from", "--uninstall", "--purge", "--no-start"):
        assert option in help_text
    bad = subprocess.run(["bash", str(INSTALL), "--frobnicate"], capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown option: --frobnicate" in bad.stderr
    purge = subprocess.run(["bash", str(INSTALL), "--purge"], capture_output=True, text=True)
    assert purge.returncode != 0 and "--uninstall" in purge.stderr


def test_unit_has_the_service_contract():
    s = unit_settings()
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["ExecStart"] == ["/opt/hayakoe-pi/venv/bin/hayakoe-pi run --config /etc/hayakoe-pi/config.yaml"]
    assert s["User"] == ["hayakoe-pi"] and s["Group"] == ["hayakoe-pi"]
    assert s["SupplementaryGroups"] == ["audio"]
    # The daemon stops feeding the watchdog after 90 s without progress.
    assert int(s["WatchdogSec"][0]) > 90
    assert s["Restart"] == ["on-failure"] and s["RestartSec"] == ["5"]
    assert "StartLimitBurst" in s and "StartLimitIntervalSec" in s
    assert s["StateDirectory"] == ["hayakoe-pi"] and s["CacheDirectory"] == ["hayakoe-pi"]
    assert s["UMask"] == ["0077"] and s["TimeoutStopSec"] == ["10"]
    assert s["LimitNOFILE"] == ["1024"]  # explicit: Wyoming's 16 clients and a refused burst fit well inside
    # The sound card must stay reachable: no PrivateDevices/PrivateUsers, ALSA allowed.
    assert s.get("PrivateDevices", ["no"]) == ["no"]
    assert s.get("PrivateUsers", ["no"]) == ["no"]
    assert s["DevicePolicy"] == ["closed"] and s["DeviceAllow"] == ["char-alsa rw"]
    families = " ".join(s["RestrictAddressFamilies"]).split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)


@needs_systemd_analyze
def test_unit_verifies_clean(tmp_path):
    """`systemd-analyze verify` in a root where the Exec* commands exist (stubs) and the system units too."""
    if SYSTEM_UNITS is None:
        pytest.skip("no systemd unit directory with sysinit.target on this machine")
    root = tmp_path / "root"
    for key, values in unit_settings().items():
        if key.startswith("Exec"):
            exe = root / values[0].split()[0].lstrip("/")
            exe.parent.mkdir(parents=True, exist_ok=True)
            exe.write_text("#!/bin/sh\n")
            exe.chmod(0o755)
    (root / "etc/systemd/system").mkdir(parents=True)
    shutil.copy(UNIT, root / "etc/systemd/system" / UNIT.name)
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    p = subprocess.run(["systemd-analyze", "verify", f"--root={root}", UNIT.name],
                       capture_output=True, text=True, env=dict(os.environ, SYSTEMD_COLORS="0"))
    ours = [line for line in (p.stdout + p.stderr).splitlines() if "hayakoe-pi" in line]
    assert p.returncode == 0 and not ours, p.stdout + p.stderr


@needs_systemd_analyze
def test_unit_sandbox_exposure_is_at_most_2():
    p = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(UNIT)],
                       capture_output=True, text=True, env=dict(os.environ, SYSTEMD_COLORS="0"))
    m = re.search(r"Overall exposure level for hayakoe-pi\.service: (\d+(?:\.\d+)?)", p.stdout)
    assert m, p.stdout + p.stderr
    print(f"exposure {m.group(1)}")
    assert float(m.group(1)) <= 2.0, p.stdout


# --- install from a local models folder ---------------------------------------------------

MACHINE_ID = "5f3c0a9e7d2b4c1e8f6a0b3d2c1e4f5a"


def device_id(name_slug: str, machine_id: str = MACHINE_ID) -> str:
    """What install.sh makes device.id of: the name, and 6 hex digits of the OS's machine id."""
    return f"{name_slug}-{hashlib.sha256(f'hayakoe-pi {machine_id}'.encode()).hexdigest()[:6]}"


@pytest.fixture(scope="module")
@slow(PREPARES_MODELS)  # install.sh prepares the voice
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    (root / "etc").mkdir()
    (root / "etc/machine-id").write_text(MACHINE_ID + "\n")
    p = run_install(root, "--models-from", str(FIXTURE_MODELS), "--voice", "tiny-voice", "--name", "Kitchen Pi",
                    "--area", "台所", "--no-start")
    return root, p


def test_install_lays_everything_out(installed):
    root, p = installed
    venv = root / "opt/hayakoe-pi/venv"
    assert (venv / "bin/python").exists()
    exe = root / unit_settings()["ExecStart"][0].split()[0].lstrip("/")
    assert os.access(exe, os.X_OK), "the unit's ExecStart is not what install.sh installs"
    assert os.readlink(root / "usr/local/bin/hayakoe-pi") == "/opt/hayakoe-pi/venv/bin/hayakoe-pi"

    config = root / "etc/hayakoe-pi/config.yaml"
    assert mode(config) == 0o640
    settings = yaml.safe_load(config.read_text())
    assert settings["voice"]["name"] == "tiny-voice"  # the untouched default took --voice
    assert settings["device"] == {"id": device_id("kitchen-pi"), "name": "Kitchen Pi", "area": "台所"}
    assert settings["engine"]["decoder"] == "fp32"  # not on a Pi (uname -m: x86_64 here)
    assert not (root / "etc/hayakoe-pi/config.yaml.new").exists()

    models = root / "var/lib/hayakoe-pi/models"
    for rel in voice_files("tiny-voice"):
        assert filecmp.cmp(models / rel, FIXTURE_MODELS / rel, shallow=False), rel
    assert not (models / "onnx/speakers/tiny-voice-nodur").exists()  # only the chosen voice
    assert not list(models.rglob("*.part"))
    assert mode(root / "var/lib/hayakoe-pi") == 0o700
    assert mode(root / "var/cache/hayakoe-pi") == 0o700

    assert (root / "etc/systemd/system/hayakoe-pi.service").read_bytes() == UNIT.read_bytes()
    last = p.stdout.strip().splitlines()[-1]
    # --no-start: nothing runs, so no "Done": how to check it, and what to send once it runs
    assert last.startswith("Installed, not running.") and "hayakoe-pi check --config" in last
    assert "mosquitto_pub -h localhost -p 1883 -q 1 -t hayakoe/say" in last and "Done." not in p.stdout
    assert "systemctl skipped" in p.stdout


def test_installed_command_works(installed, tmp_path):
    root, _ = installed
    exe = root / "opt/hayakoe-pi/venv/bin/hayakoe-pi"
    models = root / "var/lib/hayakoe-pi/models"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path))
    env.pop("PYTHONPATH", None)  # the venv's own copy, not the checkout
    p = subprocess.run([str(exe), "frontend", "--models", str(models), "こんにちは"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["phones"]

    # `check` on the installed config, its paths moved into the test root.
    config = yaml.safe_load((root / "etc/hayakoe-pi/config.yaml").read_text())
    config["models"]["dir"] = str(models)
    config["state"]["file"] = str(tmp_path / "state.json")
    config["cache"]["dir"] = str(tmp_path / "cache")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    p = subprocess.run([str(exe), "check", "--config", str(tmp_path / "c.yaml")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert re.search(r"^ok +models: .*voice tiny-voice", p.stdout, re.M), p.stdout + p.stderr


@pytest.fixture(scope="module")
def one_voice_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one-voice") / "models"
    shutil.copytree(FIXTURE_MODELS, folder, ignore=shutil.ignore_patterns("tiny-voice-nodur"))
    return folder


def test_a_rerun_keeps_the_device_id_and_takes_a_new_name(installed):
    root, _ = installed
    config = root / "etc/hayakoe-pi/config.yaml"
    (root / "etc/machine-id").write_text("another-os\n")  # never read again: the id is the first install's
    try:
        p = run_install(root, "--models-from", str(FIXTURE_MODELS), "--voice", "tiny-voice", "--name", "寝室",
                        "--area", "Bedroom", "--no-start")
        assert yaml.safe_load(config.read_text())["device"] == {"id": device_id("kitchen-pi"), "name": "寝室",
                                                              "area": "Bedroom"}
        assert "set device.name: 寝室" in p.stdout
    finally:
        (root / "etc/machine-id").write_text(MACHINE_ID + "\n")
        run_install(root, "--models-from", str(FIXTURE_MODELS), "--voice", "tiny-voice", "--name", "Kitchen Pi",
                    "--area", "台所", "--no-start")
    assert yaml.safe_load(config.read_text())["device"]["name"] == "Kitchen Pi"
    # every Pi's id differs: another OS, another id, whatever its name
    assert device_id("kitchen-pi", "another-os") != device_id("kitchen-pi")


def test_rerun_is_idempotent_and_keeps_user_edits(installed, one_voice_models):
    root, _ = installed
    config = root / "etc/hayakoe-pi/config.yaml"
    new = root / "etc/hayakoe-pi/config.yaml.new"
    models = root / "var/lib/hayakoe-pi/models"
    before = config.read_bytes()

    # on a Pi too, the config there is kept as it is: engine.decoder fp32
    p = run_install(root, "--models-from", str(FIXTURE_MODELS), "--voice", "tiny-voice", "--no-start",
                    env={"HAYAKOE_MACHINE": "aarch64"})
    assert config.read_bytes() == before and not new.exists()
    assert "kept" in p.stdout and "(the default settings)" in p.stdout
    assert "bert_q8.onnx: complete" in p.stdout and "copied" not in p.stdout

    # The user edits the config: a re-run keeps it and puts the new default beside it.
    edited = before.replace(b"level: INFO", b"level: DEBUG")
    assert edited != before
    config.write_bytes(edited)
    p = run_install(root, "--models-from", str(one_voice_models), "--no-start")
    assert "voice: tiny-voice (the only one in" in p.stdout
    assert config.read_bytes() == edited
    assert mode(config) == 0o640
    # this version's defaults, naming the installed voice
    default = (REPO / "config.yaml").read_text()
    assert "name: jvnv-F1-jp" in default
    ours = default.replace("name: jvnv-F1-jp", "name: tiny-voice", 1).replace(
        "  id: null", f"  id: {device_id('kitchen-pi')}", 1).replace(
        "  name: null", '  name: "Kitchen Pi"', 1).replace("  area: null", '  area: "台所"', 1)
    assert new.read_text() == ours and mode(new) == 0o640  # and this Pi's identity
    assert "config.yaml.new" in p.stdout

    # Another voice: installed, but an edited config is not changed, only pointed out.
    p = run_install(root, "--models-from", str(FIXTURE_MODELS), "--voice", "tiny-voice-nodur", "--no-start")
    assert config.read_bytes() == edited
    assert "set voice.name: tiny-voice-nodur" in p.stderr
    for rel in voice_files("tiny-voice-nodur", durations=False):
        assert filecmp.cmp(models / rel, FIXTURE_MODELS / rel, shallow=False), rel


def test_a_new_config_on_a_pi_takes_the_8_bit_decoder_and_prepares_it(tmp_path):
    """uname -m aarch64 (HAYAKOE_MACHINE): a new config has engine.decoder auto, and the install
    prepares the 8-bit decoder too; a rerun finds the config untouched and keeps auto."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/machine-id").write_text(MACHINE_ID + "\n")
    pi = {"HAYAKOE_MACHINE": "aarch64"}
    p = run_install(root, "--models-from", str(FIXTURE_MODELS), "--voice", "tiny-voice", "--no-start", env=pi)
    config = root / "etc/hayakoe-pi/config.yaml"
    assert yaml.safe_load(config.read_text())["engine"]["decoder"] == "auto"
    default = (REPO / "config.yaml").read_text()
    assert config.read_text().count("\n") == default.count("\n")  # the template's comments and all
    assert "engine.decoder auto" in p.stdout
    assert "preparing voice tiny-voice 3/3: 8-bit decoder: quantize, gate, timings" in p.stdout
    assert re.search(r"voice tiny-voice: prepared in .*; decoder (int8|FP32 kept)", p.stdout), p.stdout
    p = run_install(root, "--models-from", str(FIXTURE_MODELS), "--voice", "tiny-voice", "--no-start",
                    "--name", "Pi 2", env=pi)
    assert "(the default settings)" in p.stdout and "set device.name: Pi 2" in p.stdout
    assert yaml.safe_load(config.read_text())["engine"]["decoder"] == "auto"
    assert not re.search(r"preparing .* \d/\d: ", p.stdout) and "voice tiny-voice: up to date" in p.stdout


def venv_version(root: Path, package: str) -> str | None:
    p = subprocess.run([str(root / "opt/hayakoe-pi/venv/bin/python"), "-c",
                        f"from importlib.metadata import version; print(version({package!r}))"],
                       capture_output=True, text=True, timeout=60, cwd=root)  # not a checkout's *.egg-info
    return p.stdout.strip() if p.returncode == 0 else None


def locked_version(package: str) -> str:
    return re.search(rf"^{re.escape(package)}==([^ ;]+)", (REPO / "locks/runtime.txt").read_text(), re.M).group(1)


def test_the_install_is_exactly_the_lock_and_an_upgrade_says_what_changes(installed, one_voice_models):
    """Before: pip resolved pyproject.toml's ranges afresh on the Pi, on the day it ran; a rerun said
    nothing of what it changed."""
    root, p = installed
    for package in ("onnxruntime", "numpy", "onnx", "paho-mqtt"):
        assert venv_version(root, package) == locked_version(package), package
    assert re.search(r"^  installed \d+ packages \(locks/runtime.txt\)$", p.stdout, re.M), p.stdout

    # the Pi has another paho-mqtt (an older install): the upgrade puts the locked one back and says so
    old = "2.1.0"
    assert old != locked_version("paho-mqtt")
    subprocess.run([str(root / "opt/hayakoe-pi/venv/bin/python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", "--no-deps", f"paho-mqtt=={old}"], check=True, timeout=300)
    p = run_install(root, "--models-from", str(one_voice_models), "--no-start")
    assert f"  paho-mqtt {old} -> {locked_version('paho-mqtt')}\n" in p.stdout
    assert venv_version(root, "paho-mqtt") == locked_version("paho-mqtt")
    p = run_install(root, "--models-from", str(one_voice_models), "--no-start")
    assert "  no package changed\n" in p.stdout


def checkout_copy(folder: Path) -> Path:
    """This checkout's committed files, as `git clone` gives them, to change one of them."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if (REPO / rel).is_file():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, folder / rel)
    return folder


def test_a_package_whose_hash_is_not_in_the_lock_is_refused(tmp_path):
    """A file that is not the one tested (another build, a tampered mirror) is never installed."""
    checkout = checkout_copy(tmp_path / "checkout")
    lock = checkout / "locks/runtime.txt"
    # cffi (the first package pip fetches): its hashes all replaced by one no file of it has
    text, n = re.subn(r"(?m)^(cffi==\S+ \\\n)(    --hash=sha256:[0-9a-f]{64} \\\n)*    --hash=sha256:[0-9a-f]{64}",
                      lambda m: m.group(1) + "    --hash=sha256:" + "0" * 64, lock.read_text())
    assert n == 1
    lock.write_text(text)
    root = tmp_path / "root"
    root.mkdir()
    p = run_install(root, "--models-from", str(FIXTURE_MODELS), "--voice", "tiny-voice", "--no-start",
                    check=False, script=checkout / "install.sh")
    assert p.returncode != 0
    assert "DO NOT MATCH THE HASHES" in p.stderr and "cffi" in p.stderr, p.stderr
    assert "a file other than the one tested); nothing was installed" in p.stderr
    assert venv_version(root, "cffi") is None and venv_version(root, "hayakoe-pi") is None
    assert not (root / "etc/systemd/system/hayakoe-pi.service").exists()


def test_an_upgrade_that_cannot_be_installed_leaves_the_program_as_it_was(installed, one_voice_models, tmp_path):
    """`git pull && sudo ./install.sh` with a lock naming a package that cannot be installed: the
    installed program is left whole (nothing upgraded, nothing restarted), and the error says so."""
    root, _ = installed
    python = root / "opt/hayakoe-pi/venv/bin/python"
    freeze = [str(python), "-m", "pip", "list", "--disable-pip-version-check", "--format=freeze"]
    before = subprocess.run(freeze, capture_output=True, text=True, check=True).stdout
    unit = (root / "etc/systemd/system/hayakoe-pi.service").stat().st_mtime_ns
    checkout = checkout_copy(tmp_path / "checkout")
    lock = checkout / "locks/runtime.txt"
    # a numpy release that does not exist
    text = re.sub(r"(?m)^numpy==\S+", "numpy==0.0.1", lock.read_text(), count=1)
    assert text != lock.read_text()
    lock.write_text(text)
    p = run_install(root, "--models-from", str(one_voice_models), "--no-start", check=False,
                    script=checkout / "install.sh")
    assert p.returncode != 0
    assert "nothing was installed or restarted: the program as it was keeps running" in p.stderr, p.stderr
    assert subprocess.run(freeze, capture_output=True, text=True, check=True).stdout == before
    assert (root / "etc/systemd/system/hayakoe-pi.service").stat().st_mtime_ns == unit
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path))
    env.pop("PYTHONPATH", None)
    p = subprocess.run([str(root / "opt/hayakoe-pi/venv/bin/hayakoe-pi"), "frontend", "--models",
                        str(root / "var/lib/hayakoe-pi/models"), "こんにちは"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout)["phones"], p.stderr


def test_an_install_from_before_device_id_keeps_its_ids(installed, one_voice_models):
    """A config of the single-Pi version (client id hayakoe-pi, no device section) is the user's:
    kept as it is, so Home Assistant keeps notify.hayakoe_pi_say and the rest; the upgrade says why."""
    root, _ = installed
    config = root / "etc/hayakoe-pi/config.yaml"
    before = config.read_bytes()
    old = re.sub(r"(?ms)^device:.*?\n\n", "", before.decode()).replace(
        "  client_id: null", "  client_id: hayakoe-pi", 1)
    assert "\ndevice:" not in old and "client_id: hayakoe-pi" in old
    config.write_text(old)
    try:
        p = run_install(root, "--models-from", str(one_voice_models), "--no-start")
        assert config.read_text() == old
        assert "no device.id" in p.stdout and "notify.hayakoe_pi_say" in p.stdout
    finally:
        config.write_bytes(before)


def test_links_planted_in_the_models_folder_are_never_written_through(installed, tmp_path):
    """A compromised service account plants links where root writes the models (the file, a folder,
    the old temporary name): the upgrade replaces them with real files, their targets untouched."""
    root, _ = installed
    models = root / "var/lib/hayakoe-pi/models"
    target = tmp_path / "etc-shadow"
    target.write_text("keep\n")
    voice = models / "onnx/speakers/tiny-voice"
    (voice / "config.json").unlink()
    (voice / "config.json").symlink_to(target)
    (models / "onnx/bert/q8/bert_q8.onnx.part").symlink_to(target)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (voice / "style_vectors.npy").unlink()
    shutil.move(str(models / "bert/tokenizer"), str(elsewhere / "tokenizer"))
    (models / "bert/tokenizer").symlink_to(elsewhere / "tokenizer")
    run_install(root, "--models-from", str(FIXTURE_MODELS), "--voice", "tiny-voice", "--no-start")
    assert target.read_text() == "keep\n"
    assert not [p for p in models.rglob("*") if p.is_symlink()]
    for rel in voice_files("tiny-voice"):
        assert filecmp.cmp(models / rel, FIXTURE_MODELS / rel, shallow=False), rel
    assert all(mode(p) & 0o022 == 0 for p in models.rglob("*"))  # read-only for the service


@pytest.mark.parametrize("models_dir", ["/var/lib", "/etc/hayakoe", "/var/lib/../../etc", "relative/models"])
def test_a_models_dir_outside_var_lib_is_refused_before_any_change(installed, one_voice_models, models_dir):
    root, _ = installed
    config = root / "etc/hayakoe-pi/config.yaml"
    before = config.read_bytes()
    config.write_bytes(before.replace(b"dir: /var/lib/hayakoe-pi/models", f"dir: {models_dir}".encode(), 1))
    try:
        p = run_install(root, "--models-from", str(one_voice_models), "--no-start", check=False)
        assert p.returncode != 0 and "models.dir" in p.stderr, p.stderr
        assert not (root / "etc/hayakoe").exists()
    finally:
        config.write_bytes(before)


def test_a_config_the_service_would_refuse_stops_the_upgrade(installed, one_voice_models):
    root, _ = installed
    config = root / "etc/hayakoe-pi/config.yaml"
    before = config.read_bytes()
    config.write_bytes(before.replace(b"port: 1883", b"port: '1883'", 1))
    try:
        p = run_install(root, "--models-from", str(one_voice_models), "--no-start", check=False)
        assert p.returncode != 0
        assert "mqtt.port must be an integer, got '1883'" in p.stderr and "fix it and run me again" in p.stderr
    finally:
        config.write_bytes(before)


def test_a_desktop_sound_server_is_pointed_out_with_the_fix(installed, one_voice_models, tmp_path):
    from test_audio import PIPEWIRE_DEFAULT

    root, _ = installed
    config = root / "etc/hayakoe-pi/config.yaml"
    before = config.read_bytes()
    (tmp_path / "99-pipewire-default.conf").write_text(PIPEWIRE_DEFAULT)
    p = run_install(root, "--models-from", str(one_voice_models), "--no-start",
                    env={"HAYAKOE_ALSA_CONFIG": str(tmp_path)})
    assert f"Sound card: ALSA's default goes through PipeWire ({tmp_path}/99-pipewire-default.conf)" in p.stdout
    # no card on this machine: the fix, and the config left alone
    assert "no sound card found: connect one, then set audio.device in" in p.stderr
    assert config.read_bytes() == before


@pytest.mark.parametrize("args, complaint", [
    (["--voice", "no-such-voice"], "has no onnx/speakers/no-such-voice/synthesizer.onnx; "
                                   "its voices: tiny-voice tiny-voice-nodur"),
    ([], "has the voices tiny-voice tiny-voice-nodur: choose one with --voice NAME"),
])
def test_models_from_without_the_voice_fails_before_changing_anything(tmp_path, args, complaint):
    root = tmp_path / "root"
    root.mkdir()
    p = run_install(root, "--models-from", str(FIXTURE_MODELS), *args, "--no-start", check=False)
    assert p.returncode != 0
    assert complaint in p.stderr
    assert list(root.iterdir()) == [], "something was installed before the check"


def layout_files(voice: str) -> list[str]:
    from hayakoe_pi.layout import required_files

    return required_files(voice)


@pytest.mark.parametrize("lacking", layout_files("tiny-voice"))
def test_models_from_a_folder_lacking_any_file_of_the_layout_fails_before_changing_anything(tmp_path, lacking):
    """Before: a folder without bert/tokenizer/ was found out only after apt, pip and the virtualenv."""
    models = tmp_path / "models"
    shutil.copytree(FIXTURE_MODELS, models, ignore=shutil.ignore_patterns("tiny-voice-nodur"))
    (models / lacking).unlink()
    root = tmp_path / "root"
    root.mkdir()
    p = run_install(root, "--models-from", str(models), "--no-start", check=False)
    assert p.returncode != 0
    if lacking.endswith("synthesizer.onnx"):  # no voice at all
        assert "has no voice (onnx/speakers/<voice>/synthesizer.onnx)" in p.stderr, p.stderr
    elif lacking.endswith("bert_q8.onnx"):
        assert "has no onnx/bert/q8/bert_q8.onnx" in p.stderr, p.stderr
    else:
        assert f"lacks {lacking} (a HayaKoe-layout models folder" in p.stderr, p.stderr
    assert list(root.iterdir()) == [] and "apt-get" not in p.stdout, "something was done before the check"


def test_mosquitto_clients_are_installed_whichever_broker_the_config_names():
    """Before: with a broker elsewhere (Home Assistant's) configured before the install, mosquitto_pub,
    which the README's first test of the service needs, was never installed."""
    packages = re.search(r"^APT_PACKAGES=\((.*)\)$", INSTALL.read_text(), re.M).group(1).split()
    assert "mosquitto-clients" in packages


def installed_broker_settings() -> dict[str, str]:
    """The drop-in install.sh writes (mosquitto/make-conf): option -> value."""
    conf = subprocess.run([str(REPO / "mosquitto/make-conf"), "1883", "127.0.0.1"], capture_output=True,
                          text=True, check=True).stdout
    return dict(line.split(None, 1) for line in conf.splitlines() if line.strip() and not line.startswith("#"))


def test_the_installed_broker_bounds_what_it_keeps_for_a_client_away():
    """Before: max_queued_messages was mosquitto's default and max_queued_bytes unbounded, so a
    client away could hold a thousand packets of 64 KiB (max_packet_size) in a Pi's memory. Now
    both are set: every queued message may be the largest the daemon publishes or takes, and the
    whole is far under a thousand packets at the broker's limit."""
    from hayakoe_pi.bounds import MAX_PUBLISH_BYTES
    from hayakoe_pi.broker.payloads import max_payload_bytes
    from hayakoe_pi.settings.config import QueueConfig

    settings = installed_broker_settings()
    messages, queued_bytes = int(settings["max_queued_messages"]), int(settings["max_queued_bytes"])
    assert messages >= 1000  # hours of says at a household's pace
    largest_say = max_payload_bytes(QueueConfig().max_text_chars)
    assert queued_bytes >= messages * max(MAX_PUBLISH_BYTES, largest_say)
    assert queued_bytes <= messages * int(settings["max_packet_size"]) // 4


def test_the_installed_broker_keeps_16_mb_for_a_client_away(tmp_path):
    """mosquitto as installed takes the bound (per_listener_settings does not make it a listener's):
    a persistent session away is kept 16 MB of 60 KB messages, the rest is dropped."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    from harness import Mosquitto, wait_for

    # its store rewritten at each of 400 messages of 60 KB: gigabytes on the disk, for nothing here
    broker = Mosquitto(tmp_path / "broker", as_installed=True, extra_conf="persistence false\n").start()
    got = []

    def session() -> paho.Client:
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id="away", clean_session=False)
        c.on_message = lambda client, userdata, m: got.append(len(m.payload))
        c.connect("127.0.0.1", broker.port)
        c.loop_start()
        return c

    try:
        away = session()
        away.subscribe("q/#", qos=1)
        time.sleep(0.5)
        away.disconnect()
        away.loop_stop()
        sender = paho.Client(CallbackAPIVersion.VERSION2, client_id="sender")
        sender.connect("127.0.0.1", broker.port)
        sender.loop_start()
        for i in range(400):  # 24 MB
            sender.publish(f"q/{i}", b"x" * 60000, qos=1).wait_for_publish(5)
        sender.disconnect()
        sender.loop_stop()
        back = session()
        wait_for(lambda: len(got) >= 250, 30, what="the queued messages handed over")
        time.sleep(2)
        back.disconnect()
        back.loop_stop()
        kept = sum(got)
        assert 16384000 - 60000 * 21 <= kept <= 16384000 + 60000 * 21, (len(got), kept)  # ± the in-flight window
    finally:
        broker.stop()


def test_models_from_a_folder_that_is_no_models_folder(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    p = run_install(root, "--models-from", str(tmp_path), "--no-start", check=False)
    assert p.returncode != 0 and "has no onnx/bert/q8/bert_q8.onnx" in p.stderr
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("machine", ["armv7l", "armv6l"])
def test_32_bit_arm_is_refused_in_one_line_before_changing_anything(tmp_path, machine):
    root = tmp_path / "root"
    root.mkdir()
    p = run_install(root, "--models-from", str(FIXTURE_MODELS), "--voice", "tiny-voice", check=False,
                    env={"HAYAKOE_MACHINE": machine})
    assert p.returncode != 0
    assert p.stderr.strip().count("\n") == 0 and "32-bit" in p.stderr and "64-bit" in p.stderr
    assert p.stdout == "" and list(root.iterdir()) == []


# --- download from a stand-in for Hugging Face -------------------------------------------

class FakeHub(BaseHTTPRequestHandler):
    """Serves FIXTURE_MODELS like huggingface.co/<repo>/resolve/main/<path>.

    LFS files (.onnx, .npy) answer with a redirect carrying X-Linked-Size and
    X-Linked-ETag (the sha256) to a "CDN" path whose own ETag is no checksum;
    other files answer directly with a git-blob-like ETag (size check only).
    The CDN honours Range requests, so downloads can resume.
    """

    protocol_version = "HTTP/1.1"
    requests: list[tuple[str, str, str | None]] = []
    lies: set[str] = set()  # paths whose published sha256 is wrong

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)

    def _answer(self, body: bool):
        FakeHub.requests.append((self.command, self.path, self.headers.get("Range")))
        for prefix, cdn in (("/resolve/main/", False), ("/cdn/", True)):
            if self.path.startswith(prefix):
                rel = self.path[len(prefix):]
                break
        else:
            return self._empty(404)
        path = FIXTURE_MODELS / rel
        if ".." in rel or not path.is_file():
            return self._empty(404)
        data = path.read_bytes()
        if rel.endswith(LFS_SUFFIXES) and not cdn:
            sha = hashlib.sha256(b"lie" if rel in FakeHub.lies else data).hexdigest()
            return self._empty(302, {"Location": f"/cdn/{rel}", "X-Linked-Size": str(len(data)),
                                     "X-Linked-ETag": f'"{sha}"', "ETag": f'"{hashlib.sha1(data).hexdigest()}"'})
        etag = "cdn-etag-not-a-checksum" if cdn else hashlib.sha1(data).hexdigest()
        status, start = 200, 0
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if m and cdn:
            start = int(m.group(1))
            if start >= len(data):
                return self._empty(416, {"Content-Range": f"bytes */{len(data)}"})
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("ETag", f'"{etag}"')
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if body:
            self.wfile.write(data[start:])

    def _empty(self, status: int, headers: dict | None = None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture(scope="module")
def hub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/resolve/main"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
@slow(PREPARES_MODELS)
def downloaded(tmp_path_factory, hub):
    root = tmp_path_factory.mktemp("dlroot")
    FakeHub.requests.clear()
    p = run_install(root, "--voice", "tiny-voice", "--no-start", env={"HAYAKOE_HF_BASE": hub})
    return root, p


def download_again(root: Path, hub: str, *args: str, check: bool = True):
    FakeHub.requests.clear()
    return run_install(root, "--no-start", *args, env={"HAYAKOE_HF_BASE": hub}, check=check)


def test_fresh_download(downloaded):
    root, p = downloaded
    models = root / "var/lib/hayakoe-pi/models"
    for rel in voice_files("tiny-voice"):
        assert filecmp.cmp(models / rel, FIXTURE_MODELS / rel, shallow=False), rel
    assert not list(models.rglob("*.part"))
    heads = {path for method, path, _ in FakeHub.requests if method == "HEAD"}
    assert "/resolve/main/onnx/speakers/tiny-voice/duration_predictor.onnx" in heads


def test_complete_files_are_not_downloaded_again(downloaded, hub):
    root, _ = downloaded
    p = download_again(root, hub, "--voice", "tiny-voice")
    assert not [r for r in FakeHub.requests if r[0] == "GET"], FakeHub.requests
    assert p.stdout.count(": complete") == len(voice_files("tiny-voice"))


def test_partial_download_is_resumed(downloaded, hub):
    root, _ = downloaded
    rel = "onnx/speakers/tiny-voice/synthesizer.onnx"
    final = root / "var/lib/hayakoe-pi/models" / rel
    part = root / "var/tmp/hayakoe-pi-models" / f"{rel}.part"  # root's own staging folder
    data = (FIXTURE_MODELS / rel).read_bytes()
    final.unlink()
    part.parent.mkdir(parents=True)
    part.parent.parent.parent.parent.chmod(0o700)
    part.write_bytes(data[:len(data) // 2])
    download_again(root, hub, "--voice", "tiny-voice")
    assert final.read_bytes() == data
    assert not part.exists()
    gets = [(path, rng) for method, path, rng in FakeHub.requests if method == "GET"]
    assert gets and all(rel in path for path, _ in gets), gets  # nothing else fetched
    assert (f"/cdn/{rel}", f"bytes={len(data) // 2}-") in gets


def test_corrupted_download_fails_and_leaves_nothing(downloaded, hub):
    root, _ = downloaded
    rel = "onnx/speakers/tiny-voice/style_vectors.npy"
    final = root / "var/lib/hayakoe-pi/models" / rel
    final.unlink()
    FakeHub.lies.add(rel)
    try:
        p = download_again(root, hub, "--voice", "tiny-voice", check=False)
    finally:
        FakeHub.lies.discard(rel)
    assert p.returncode != 0
    assert rel in p.stderr and "sha256" in p.stderr, p.stderr
    print(p.stderr)
    assert not final.exists() and not list(root.rglob("style_vectors.npy.part"))
    # A re-run against an honest server repairs it.
    download_again(root, hub, "--voice", "tiny-voice")
    assert final.read_bytes() == (FIXTURE_MODELS / rel).read_bytes()


def test_voice_without_duration_predictor_and_unknown_voice(downloaded, hub):
    root, _ = downloaded
    config = root / "etc/hayakoe-pi/config.yaml"
    p = download_again(root, hub, "--voice", "tiny-voice-nodur")
    assert "duration_predictor.onnx: not published (optional), skipped" in p.stdout
    models = root / "var/lib/hayakoe-pi/models"
    for rel in voice_files("tiny-voice-nodur", durations=False):
        assert filecmp.cmp(models / rel, FIXTURE_MODELS / rel, shallow=False), rel
    # The config was still the installer's default, so it follows --voice.
    assert yaml.safe_load(config.read_text())["voice"]["name"] == "tiny-voice-nodur"

    p = download_again(root, hub, "--voice", "no-such-voice", check=False)
    assert p.returncode != 0
    assert "onnx/speakers/no-such-voice/synthesizer.onnx not found" in p.stderr


# --- uninstall ----------------------------------------------------------------------------

def test_uninstall_keeps_data_and_purge_removes_it(tmp_path):
    root = tmp_path / "root"
    unit = root / "etc/systemd/system/hayakoe-pi.service"
    venv_python = root / "opt/hayakoe-pi/venv/bin/python"
    link = root / "usr/local/bin/hayakoe-pi"
    config = root / "etc/hayakoe-pi/config.yaml"
    model = root / "var/lib/hayakoe-pi/models/onnx/bert/q8/bert_q8.onnx"
    cache = root / "var/cache/hayakoe-pi/x.wav"
    for f in (unit, venv_python, config, model, cache):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    link.parent.mkdir(parents=True)
    link.symlink_to("/opt/hayakoe-pi/venv/bin/hayakoe-pi")

    # what `sudo hayakoe-pi ...` of older versions left in root's home (onnxruntime's telemetry id),
    # and an interrupted install's downloads
    ort = root / "root/.cache/Microsoft/DeveloperTools/.onnxruntime/deviceid"
    staged = root / "var/tmp/hayakoe-pi-models/onnx/bert/q8/bert_q8.onnx.part"
    other = root / "root/.cache/other/keep"
    for f in (ort, staged, other):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")

    p = run_install(root, "--uninstall")
    assert not unit.exists() and not (root / "opt/hayakoe-pi").exists() and not link.is_symlink()
    assert config.exists() and model.exists() and cache.exists()
    assert "--purge" in p.stdout

    run_install(root, "--uninstall")  # again: nothing left to do, no error
    run_install(root, "--uninstall", "--purge")
    for d in ("etc/hayakoe-pi", "var/lib/hayakoe-pi", "var/cache/hayakoe-pi", "var/tmp/hayakoe-pi-models",
              "root/.cache/Microsoft"):
        assert not (root / d).exists(), d
    assert other.read_text() == "x"  # what is not ours stays
