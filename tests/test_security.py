"""Security: TLS and passwords against a broker configured here, no secrets in logs,
no paths or shell from payloads, private files.

All against a real mosquitto (TLS listener with a CA and server certificate
made here by openssl, a password file made by mosquitto_passwd, an ACL) and
the real daemon process.
"""

import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import FIXTURE_MODELS, REPO
from harness import AlsaSink, DaemonProcess, Mosquitto, SessionProbe, free_port, running_daemon, wait_for, write_config

PASSWORD = "Kumo7-zq!hayakoe-SECRET-4711"  # distinctive: searched for in every log
WRONG_PASSWORD = "Tori3-xv!NOT-the-password-0815"
PROBE_PASSWORD = "probe-pass-2a9f"
USER = "hayakoe"
PROBE_USER = "probe"


def run(*args, **kwargs):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, check=True, **kwargs)


def make_pki(folder: Path) -> SimpleNamespace:
    """A self-signed CA and a server certificate for 127.0.0.1 / localhost signed by it."""
    folder.mkdir(parents=True)
    ca_key, ca_crt = folder / "ca.key", folder / "ca.crt"
    key, csr, crt, ext = folder / "server.key", folder / "server.csr", folder / "server.crt", folder / "san.cnf"
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
        "/CN=hayakoe-pi test CA", "-keyout", str(ca_key), "-out", str(ca_crt))
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", str(key), "-out", str(csr))
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(crt))
    return SimpleNamespace(ca=ca_crt, cert=crt, key=key)


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """A TLS-only broker that wants a user name and password and applies an ACL."""
    for tool in ("openssl", "mosquitto_passwd"):
        assert shutil.which(tool), f"{tool} is not installed"
    work = tmp_path_factory.mktemp("secure")
    pki = make_pki(work / "pki")
    port = free_port()
    prefix = f"sec{port}"
    passwd, acl = work / "passwd", work / "acl"
    run("mosquitto_passwd", "-b", "-c", str(passwd), USER, PASSWORD)
    run("mosquitto_passwd", "-b", str(passwd), PROBE_USER, PROBE_PASSWORD)
    acl.write_text("".join(f"user {u}\ntopic readwrite {prefix}/#\ntopic readwrite homeassistant/#\n\n"
                           for u in (USER, PROBE_USER)))
    broker = Mosquitto(work / "broker", port=port, extra_conf=(
        f"cafile {pki.ca}\ncertfile {pki.cert}\nkeyfile {pki.key}\n"
        f"allow_anonymous false\npassword_file {passwd}\nacl_file {acl}\n"
    )).start()
    try:
        yield SimpleNamespace(work=work, pki=pki, broker=broker, port=port, prefix=prefix)
    finally:
        broker.stop()


def tls_mqtt(secure, password=PASSWORD, **more) -> dict:
    return {"tls": {"enabled": True, "ca_file": str(secure.pki.ca)}, "username": USER,
            "password": password, **more}


@pytest.fixture(scope="module")
def app(secure):
    """The daemon, logged in over TLS, with DEBUG logging."""
    work = secure.work / "app"
    work.mkdir()
    probe = SessionProbe(secure.port, secure.prefix, clean_session=True, username=PROBE_USER,
                         password=PROBE_PASSWORD, ca_file=secure.pki.ca)
    try:
        with running_daemon(work, secure.port, secure.prefix, probe, mqtt=tls_mqtt(secure),
                            log={"level": "DEBUG"}, queue={"max_length": 50, "max_text_chars": 300}) as app:
            app.secure = secure
            yield app
    finally:
        probe.close()


def cli(*args, home=None):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if home:
        env["HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "hayakoe_pi.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120)


# --- TLS and passwords -------------------------------------------------------------------

def test_tls_with_password_connects_and_speaks(app):
    assert "connected to MQTT broker" in app.daemon.output()
    app.probe.publish("say", {"text": "暗号化された接続です。", "id": "tls-1"})
    app.probe.next_event(event="started", id="tls-1")
    assert app.probe.next_event(event="finished", id="tls-1")["cached"] is False


def test_the_broker_really_wants_tls_and_a_password(secure):
    """So the test above proves something: plain MQTT and a wrong password are refused."""
    plain = SessionProbe(secure.port, secure.prefix, clean_session=True, username=PROBE_USER,
                         password=PROBE_PASSWORD, wait=0)
    try:
        time.sleep(2)
        assert not plain.connected.is_set()
    finally:
        plain.close()
    with pytest.raises(AssertionError, match="refused"):
        SessionProbe(secure.port, secure.prefix, clean_session=True, username=PROBE_USER,
                     password="nope", ca_file=secure.pki.ca).close()


@pytest.mark.soak  # watches the backoff for 12 s
def test_wrong_password_logs_clearly_and_backs_off(secure):
    work = secure.work / "wrong"
    work.mkdir()
    client_id = f"hayakoe-wrong-{secure.port}"
    config = write_config(work / "config.yaml", secure.port, secure.prefix, work,
                          mqtt=tls_mqtt(secure, WRONG_PASSWORD, client_id=client_id),
                          log={"level": "DEBUG"})
    def broker_log():
        return (secure.broker.workdir / "mosquitto.log").read_text(errors="replace")

    refused_before = broker_log().count("not authorised")
    daemon = DaemonProcess(config, work, work / "daemon.log")
    try:
        wait_for(lambda: "refused the connection" in daemon.output() or daemon.proc.poll() is not None,
                 90, what="the first refused connection")
        first = time.monotonic()
        assert daemon.proc.poll() is None, daemon.output()
        time.sleep(12)
        assert daemon.proc.poll() is None, "the daemon gave up: " + daemon.output()[-2000:]
        refused = [line for line in daemon.output().splitlines() if "refused the connection" in line]
        # backoff 1, 2, 4, 8 s: attempts at 0, 1, 3, 7 (and 15) s
        assert 2 <= len(refused) <= 6, refused
        assert "mqtt.username and mqtt.password" in refused[0], refused[0]
        assert "ERROR" in refused[0]
        # the broker saw as few (nobody else logs in wrongly meanwhile)
        tries = broker_log().count("not authorised") - refused_before
        assert len(refused) <= tries <= len(refused) + 1, tries
        assert time.monotonic() - first < 20
    finally:
        assert daemon.stop() == 0
    log = daemon.output()
    assert WRONG_PASSWORD not in log and PASSWORD not in log


def test_broker_not_running_at_start(tmp_path):
    port = free_port()
    prefix = f"late{port}"
    sink = AlsaSink(tmp_path)
    config = write_config(tmp_path / "config.yaml", port, prefix, tmp_path)
    daemon = DaemonProcess(config, sink.home, tmp_path / "daemon.log")
    broker = Mosquitto(tmp_path / "broker", port=port)
    probe = None
    try:
        wait_for(lambda: "cannot reach MQTT broker" in daemon.output() or daemon.proc.poll() is not None,
                 90, what="the daemon to say it cannot reach the broker")
        time.sleep(3)  # a few retries
        assert daemon.proc.poll() is None, daemon.output()
        assert "connected to MQTT broker" not in daemon.output()
        assert f"127.0.0.1:{port}" in daemon.output()
        broker.start()
        probe = SessionProbe(port, prefix, clean_session=True)
        wait_for(lambda: probe.last("status") == b"online", 30, what="the daemon to connect")
        probe.publish("say", {"text": "やっと繋がりました。", "id": "late-1"})
        probe.next_event(event="finished", id="late-1")
    finally:
        assert daemon.stop() == 0
        if probe:
            probe.close()
        broker.stop()
        sink.stop()


# --- nothing from a payload becomes a path or a command ------------------------------------

def snapshot(*roots: Path) -> dict:
    """Every file and folder under the roots with size and mtime."""
    out = {}
    for root in roots:
        for p in [root, *root.rglob("*")]:
            st = p.lstat()
            out[str(p)] = (st.st_size, st.st_mtime_ns, stat.S_IFMT(st.st_mode))
    return out


@pytest.fixture(scope="module")
def bait(app):
    """A complete, valid voice outside the models folder, and a file a shell would create."""
    evil = app.work / "evil" / "voice"
    shutil.copytree(FIXTURE_MODELS / "onnx" / "speakers" / "tiny-voice", evil)
    speakers = FIXTURE_MODELS / "onnx" / "speakers"
    canary = app.work / "pwned"
    values = [
        "../../../../etc", "/etc/passwd", "..", ".", "tiny-voice/../tiny-voice", "tiny-voice/",
        os.path.relpath(evil, speakers), str(evil),  # would load the bait voice if used as a path
        f"tiny-voice; touch {canary}", f"$(touch {canary})", f"`touch {canary}`",
        f"tiny-voice && touch {canary}", "tiny-voice\0x",
    ]
    return SimpleNamespace(evil=evil, canary=canary, values=values)


def watched(app):
    return snapshot(FIXTURE_MODELS, app.work / "cache", app.work / "evil") | {
        str(p): None for p in app.work.iterdir() if p.name not in ("played.raw", "daemon.log", "strace.txt")}


def strace(pid: int, out: Path) -> subprocess.Popen:
    """Trace the daemon's file opens and program starts; a visible skip where strace cannot."""
    if not shutil.which("strace"):
        pytest.skip("strace is not installed (tools/run-tests installs it)")
    proc = subprocess.Popen(["strace", "-f", "-qq", "-p", str(pid), "-e", "trace=open,openat,execve,execveat",
                             "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def attached():
        if proc.poll() is not None:
            return True
        tracers = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                status = (task / "status").read_text()
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
            tracers.append(re.search(r"^TracerPid:\s*(\d+)", status, re.M).group(1))
        return all(t == str(proc.pid) for t in tracers)

    wait_for(attached, 10, what="strace to attach to every thread")
    if proc.poll() is not None:  # ptrace not allowed here (a container without CAP_SYS_PTRACE)
        pytest.skip(f"strace cannot attach here: {proc.stderr.read().decode(errors='replace').strip()[:200]}")
    return proc


def _refuse_every_bait(app, bait, tag: str, ok_text: str) -> None:
    """Each bait value as a say's voice, and a path as its style: refused; then a text is spoken."""
    for i, voice in enumerate(bait.values):
        app.probe.publish("say", {"text": "こんにちは。", "voice": voice, "id": f"{tag}-{i}"})
        error = app.probe.next_event(event="error", id=f"{tag}-{i}", timeout=10)
        assert "unknown voice" in error["error"], (voice, error)
    app.probe.publish("say", {"text": "x", "style": "../../../../etc/passwd", "id": f"{tag}-style"})
    assert "unknown style" in app.probe.next_event(event="error", id=f"{tag}-style", timeout=10)["error"]
    app.probe.publish("say", {"text": ok_text, "id": f"{tag}-ok"})
    app.probe.next_event(event="finished", id=f"{tag}-ok")


def test_say_voice_from_payload_is_never_a_path_or_command(app, bait):
    before = watched(app)
    _refuse_every_bait(app, bait, "path", "まだ元気です。")
    assert not bait.canary.exists()
    assert _only_new_cache_entry(before, watched(app))


def test_say_voice_from_payload_is_never_opened_or_run(app, bait):
    """The same under strace: no program started, neither the bait voice nor /etc/passwd opened."""
    trace = strace(app.daemon.proc.pid, app.work / "strace.txt")
    try:
        _refuse_every_bait(app, bait, "traced", "今日も元気です。")
    finally:
        trace.terminate()
        trace.wait(10)
    assert not bait.canary.exists()
    traced = (app.work / "strace.txt").read_text(errors="replace")
    assert "openat(" in traced, traced[-2000:]  # the trace saw the daemon at work (it spoke)
    assert "execve" not in traced, traced[-2000:]
    assert str(bait.evil) not in traced and "/etc/passwd" not in traced, traced[-2000:]


def _only_new_cache_entry(before: dict, after: dict) -> bool:
    """`path-ok` was spoken: a new *.f32 in the cache (and the folder's mtime), nothing else."""
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    return all(k.endswith(".f32") or k.endswith("/cache") for k in changed)


def test_voice_set_from_payload_is_never_a_path_or_command(app, bait):
    state_file = app.work / "state" / "state.json"
    state_before = state_file.read_bytes() if state_file.exists() else None
    before = watched(app)
    for voice in bait.values:
        mark = len(app.probe.messages)
        error = app.probe.reply("voice/set", voice, timeout=10)
        assert error["event"] == "error", (voice, error)
        assert "voice not changed" in error["error"] and "unknown voice" in error["error"], (voice, error)
        # the real value is published again
        wait_for(lambda: any(t == app.probe.topic("voice") for t, _, _ in app.probe.messages[mark:]), 10,
                 what="the voice state")
        assert app.probe.last("voice") == b"tiny-voice"
    assert not bait.canary.exists()
    assert watched(app) == before
    assert (state_file.read_bytes() if state_file.exists() else None) == state_before


# --- files ----------------------------------------------------------------------------------

def test_files_the_daemon_writes_are_private(app):
    app.probe.publish("say", {"text": "秘密の言葉です。", "id": "mode-1"})
    app.probe.next_event(event="finished", id="mode-1")
    app.probe.publish("volume/set", "42")
    wait_for(lambda: app.probe.last("volume") == b"42", 10, what="volume state")
    cache, state = app.work / "cache", app.work / "state" / "state.json"
    wait_for(state.exists, 5, what="state.json")
    entries = list(cache.glob("*.f32"))
    assert entries
    modes = {str(p.relative_to(app.work)): oct(stat.S_IMODE(p.stat().st_mode))
             for p in [*entries, state]}
    assert set(modes.values()) == {"0o600"}, modes
    folders = {str(p.relative_to(app.work)): oct(stat.S_IMODE(p.stat().st_mode))
               for p in (cache, state.parent)}
    assert set(folders.values()) == {"0o700"}, folders
    # and everything else under cache.dir (the split model parts)
    others = {str(p.relative_to(app.work)): oct(stat.S_IMODE(p.stat().st_mode))
              for p in cache.rglob("*")}
    assert all(m == ("0o700" if (app.work / p).is_dir() else "0o600") for p, m in others.items()), others


# --- secrets --------------------------------------------------------------------------------

def test_password_never_logged(app, secure):
    log = app.daemon.output()  # written at log.level DEBUG
    assert PASSWORD not in log and PROBE_PASSWORD not in log
    good = app.config
    r = cli("check", "--config", str(good), home=app.sink.home)
    assert "ok   mqtt" in r.stdout, r.stdout + r.stderr
    assert PASSWORD not in r.stdout + r.stderr
    bad = write_config(app.work / "bad.yaml", secure.port, secure.prefix, app.work / "bad",
                       mqtt=tls_mqtt(secure, WRONG_PASSWORD, client_id="hayakoe-check-wrong"),
                       log={"level": "DEBUG"})
    r = cli("check", "--config", str(bad), home=app.sink.home)
    assert r.returncode == 1
    assert "FAIL mqtt" in r.stdout and "username/password" in r.stdout, r.stdout
    assert WRONG_PASSWORD not in r.stdout + r.stderr and PASSWORD not in r.stdout + r.stderr
