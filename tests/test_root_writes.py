"""Root never writes through files the service owns: `sudo hayakoe-pi dict|prepare` become the
owner of the service's folder first, and the daemon's files get temporary names of their own.

Runs as root (the CI does): a folder owned by `nobody` stands for the service's state and cache,
with links planted where a compromised service account would put them.
"""

import os
import pwd
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from conftest import FIXTURE_MODELS, REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to be root, and to make a folder nobody's)")


@pytest.fixture
def service_tree():
    """A folder nobody can enter (not /tmp/pytest-of-root, which is root's 0700), with the
    service's state and cache folders owned by nobody, and root's files to aim links at."""
    nobody = pwd.getpwnam("nobody")
    top = Path(tempfile.mkdtemp(prefix="hayakoe-root-writes-", dir="/tmp"))
    top.chmod(0o711)
    state, cache = top / "state", top / "cache"
    for folder in (state, cache):
        folder.mkdir(mode=0o700)
        os.chown(folder, nobody.pw_uid, nobody.pw_gid)
    secret = top / "root-secret"  # stands for /etc/shadow
    secret.write_text("root:keep\n")
    secret.chmod(0o600)
    config = top / "config.yaml"
    config.write_text(yaml.safe_dump({
        "models": {"dir": str(FIXTURE_MODELS)}, "voice": {"name": "tiny-voice"},
        "cache": {"dir": str(cache)}, "state": {"file": str(state / "state.json")},
        "dictionary": {"file": str(state / "dictionary.yaml")}}))
    try:
        yield top, state, cache, secret, config, nobody
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=False)


# The CLI runs under the system's Python, as installed (a venv of /usr/bin/python3): the test's
# own interpreter may live where the service user cannot reach it (pyenv under /root).
SYSTEM_PYTHON = Path("/usr/bin/python3")


def cli(*args: str, home: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI as after sudo; with `home`, root's home there (its ~/.cache looked at by the test)."""
    import site

    probe = [str(SYSTEM_PYTHON), "-c", "import sys; print(sys.version_info[:2])"]
    if not SYSTEM_PYTHON.exists() or subprocess.run(probe, capture_output=True, text=True).stdout.strip() != \
            str(tuple(sys.version_info[:2])):
        pytest.skip(f"needs {SYSTEM_PYTHON} of Python {sys.version_info[0]}.{sys.version_info[1]}")
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}  # as after sudo
    if home is not None:
        env["HOME"] = str(home)
    path = os.pathsep.join([str(REPO), *site.getsitepackages()])
    return subprocess.run([str(SYSTEM_PYTHON), "-m", "hayakoe_pi.cli", *args], capture_output=True, text=True,
                          env=dict(env, PYTHONPATH=path), cwd="/", timeout=300)


def untouched(secret: Path) -> bool:
    st = secret.stat()
    return secret.read_text() == "root:keep\n" and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600


def test_dict_as_root_writes_as_the_service_user_and_never_through_a_planted_link(service_tree):
    top, state, _, secret, config, nobody = service_tree
    for name in ("dictionary.tmp", "dictionary.yaml.tmp", ".dictionary.yaml.tmp"):
        (state / name).symlink_to(secret)
        os.lchown(state / name, nobody.pw_uid, nobody.pw_gid)
    r = cli("dict", "--config", str(config), "add", "晴翔", "ハルト", "1")
    assert r.returncode == 0, r.stderr
    assert untouched(secret)
    words = state / "dictionary.yaml"
    assert words.stat().st_uid == nobody.pw_uid and not words.is_symlink()
    assert yaml.safe_load(words.read_text())[0]["surface"] == "晴翔"


def test_dict_as_root_through_a_dictionary_file_that_is_a_link(service_tree):
    """The file itself replaced with a link to root's file: the service user cannot write there."""
    _, state, _, secret, config, nobody = service_tree
    (state / "dictionary.yaml").symlink_to(secret)
    os.lchown(state / "dictionary.yaml", nobody.pw_uid, nobody.pw_gid)
    cli("dict", "--config", str(config), "add", "晴翔", "ハルト", "1")
    assert untouched(secret)


@pytest.mark.prepares_models
def test_prepare_as_root_makes_the_services_files_and_follows_no_planted_folder(service_tree):
    top, _, cache, secret, config, nobody = service_tree
    r = cli("prepare", "--config", str(config), "--voice", "tiny-voice")
    assert r.returncode == 0, r.stderr
    made = list((cache / "models").rglob("*"))
    assert made and all(p.lstat().st_uid == nobody.pw_uid for p in made)  # made by the service user
    # a compromised service user points its models folder at one of root's
    rootdir = top / "root-dir"
    rootdir.mkdir(mode=0o755)
    subprocess.run(["rm", "-rf", str(cache / "models")], check=True)
    (cache / "models").symlink_to(rootdir)
    os.lchown(cache / "models", nobody.pw_uid, nobody.pw_gid)
    cli("prepare", "--config", str(config), "--voice", "tiny-voice")
    assert list(rootdir.iterdir()) == []


@pytest.mark.prepares_models  # in the service's cache
def test_synth_as_root_makes_the_services_cache_files_and_writes_the_wav_where_asked(service_tree):
    """`sudo hayakoe-pi synth --config ...` works on the service's cache (not /root/.cache) as the
    service user, and the WAV still lands where root asked for it."""
    top, _, cache, _, config, nobody = service_tree
    out = top / "root-only"
    out.mkdir(mode=0o700)  # a folder the service user cannot write to
    home = top / "root-home"  # not /root: a benchmark on this machine may have filled its cache
    home.mkdir(mode=0o700)
    r = cli("synth", "--config", str(config), "--models", str(FIXTURE_MODELS), "--voice", "tiny-voice",
            "-o", str(out / "x.wav"), "はい。", home=home)
    assert r.returncode == 0, r.stderr
    assert (out / "x.wav").stat().st_size > 1000
    made = list((cache / "models").rglob("*"))
    assert any(p.suffix == ".onnx" for p in made)
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in made} == {(nobody.pw_uid, nobody.pw_gid)}
    assert not list(home.rglob("*"))  # root's own cache untouched
