"""The broker install.sh sets up, opened to the LAN as `install.sh --lan-broker` does it, for real:
mosquitto with the drop-in made from the repository's files (mosquitto/make-conf), in a network
namespace of its own with a LAN interface (one end of a veth pair, 192.0.2.10), and clients in it."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import FIXTURE_MODELS, REPO
from harness import MOSQUITTO, AlsaSink, free_port, wait_for

LAN = "192.0.2.10"  # TEST-NET-1: in the namespace only
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                                reason="needs root and iproute2 (a network namespace)")


@pytest.fixture
def lan(tmp_path):
    name = f"hk-lan-{os.getpid()}-{free_port()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        # a veth pair, both ends inside: lan0 stands for the Pi's Ethernet
        for cmd in (["link", "set", "lo", "up"], ["link", "add", "lan0", "type", "veth", "peer", "name", "lan1"],
                    ["addr", "add", f"{LAN}/24", "dev", "lan0"], ["link", "set", "lan0", "up"],
                    ["link", "set", "lan1", "up"]):
            subprocess.run(["ip", "-n", name, *cmd], check=True)
        passwords = tmp_path / "passwd"
        subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwords), "homeassistant", "ha-secret"], check=True)
        subprocess.run(["mosquitto_passwd", "-b", str(passwords), "hayakoe-pi", "svc-secret"], check=True)
        port = 1883  # the namespace's own
        conf = subprocess.run([str(REPO / "mosquitto/make-conf"), str(port), "127.0.0.1", str(passwords), "lan0"],
                              check=True, capture_output=True, text=True).stdout
        (tmp_path / "mosquitto.conf").write_text(conf + f"persistence_location {tmp_path}/\nuser root\n")
        broker = subprocess.Popen(["ip", "netns", "exec", name, MOSQUITTO, "-c", str(tmp_path / "mosquitto.conf")],
                                  stdout=subprocess.DEVNULL, stderr=open(tmp_path / "mosquitto.log", "wb"))
        try:
            wait_for(lambda: connect(name, "127.0.0.1", port) == "accepted", 10, what="the broker")
            yield name, port, tmp_path
        finally:
            broker.terminate()
            broker.wait(10)
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def connect(ns: str, host: str, port: int, user: str | None = None, password: str | None = None) -> str:
    """Connect once from inside the namespace: 'accepted', or the broker's refusal."""
    script = textwrap.dedent(f"""
        import sys, paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id="lan-test", protocol=paho.MQTTv311)
        if {user!r} is not None:
            c.username_pw_set({user!r}, {password!r})
        result = []
        c.on_connect = lambda client, u, flags, rc, props: result.append(rc)
        try:
            c.connect({host!r}, {port}, keepalive=5)
        except OSError as e:
            print("unreachable", e); sys.exit()
        c.loop_start()
        import time
        for _ in range(50):
            if result: break
            time.sleep(0.1)
        c.loop_stop()
        print("accepted" if result and not result[0].is_failure else f"refused {{result[0] if result else 'no answer'}}")
    """)
    r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=30)
    return r.stdout.strip() or r.stderr.strip()[-200:]


def test_the_lan_listener_wants_the_password_and_loopback_stays_open(lan):
    ns, port, _ = lan
    assert connect(ns, LAN, port).startswith("refused"), "anonymous on the LAN"
    assert connect(ns, LAN, port, "homeassistant", "wrong").startswith("refused")
    assert connect(ns, LAN, port, "homeassistant", "ha-secret") == "accepted"
    assert connect(ns, LAN, port, "hayakoe-pi", "svc-secret") == "accepted"
    assert connect(ns, "127.0.0.1", port) == "accepted"  # this machine's own tools, anonymous


def test_the_daemon_connects_with_its_own_user(lan, tmp_path):
    ns, port, work = lan
    sink = AlsaSink(tmp_path / "card")
    config = tmp_path / "config.yaml"
    config.write_text(textwrap.dedent(f"""
        device: {{id: lan-pi}}
        mqtt: {{host: 127.0.0.1, port: {port}, username: hayakoe-pi, password: svc-secret, keepalive: 5}}
        models: {{dir: {FIXTURE_MODELS}}}
        voice: {{name: tiny-voice}}
        cache: {{dir: {tmp_path / 'cache'}}}
        state: {{file: {tmp_path / 'state' / 'state.json'}}}
    """))
    env = dict(os.environ, HOME=str(sink.home), PYTHONPATH=str(REPO))
    daemon = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "hayakoe_pi.cli", "run", "--config",
                               str(config)], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=open(tmp_path / "daemon.log", "wb"))
    try:
        seen = subprocess.run(["ip", "netns", "exec", ns, "mosquitto_sub", "-h", LAN, "-p", str(port), "-u",
                               "homeassistant", "-P", "ha-secret", "-t", "hayakoe/lan-pi/status", "-C", "1",
                               "-W", "60"], capture_output=True, text=True, timeout=90)
        assert seen.stdout.strip() == "online", (seen.stderr, (tmp_path / "daemon.log").read_text()[-2000:])
    finally:
        daemon.terminate()
        daemon.wait(15)
        sink.stop()
