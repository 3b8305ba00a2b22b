"""The real Home Assistant Core against a mosquitto and two daemons: what tools/ha-check runs.

    .venv/bin/python tools/ha_check.py --root ROOT --work DIR

ROOT is the Debian root tools/ha-check made (Home Assistant in /opt/ha), with /proc, /sys and
/dev mounted and DIR bound at ROOT/work. The broker and the daemons run here, with the repo's
.venv and the test harness (tests/harness.py: the test voice, an ALSA file sink per room);
Home Assistant runs in the chroot, which shares the loopback with them. Every check goes
through Home Assistant's own API (REST, WebSocket) and the daemons' events and retained
topics; the first that fails ends the run with its reason.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import wave
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tools"), str(REPO)]

from ha_api import HomeAssistant  # noqa: E402
from ha_wyoming import add_wyoming, check_assist, check_tts, discovered  # noqa: E402
from ha_readme import check_readme, loaded as readme_loaded, readme_blocks, write_into  # noqa: E402
from harness import ENTITIES, AlsaSink, DaemonProcess, Mosquitto, Probe, free_port, wait_for, write_config  # noqa: E402

PREFIX = "hayakoe"  # the README's topics: its automations publish to hayakoe/say

def rooms_config(work: Path) -> dict[str, dict]:
    """Two rooms, as the documents name them (device.id → config sections): the kitchen
    (notify.kitchen_3fa2c1_say), with Wyoming, and a Pi installed before device.id existed
    (notify.hayakoe_pi_say: client id hayakoe-pi), with a chime file of its own (its select
    has the option `file`)."""
    return {
        "kitchen-3fa2c1": {"device": {"id": "kitchen-3fa2c1", "name": "Kitchen", "area": "Kitchen"},
                           "mqtt": {"client_id": "hayakoe-pi-kitchen-3fa2c1"},
                           "audio": {"quiet_hours": {"from": "22:00", "to": "07:00", "volume": 30}},
                           "wyoming": {"enabled": True, "port": free_port(), "zeroconf": True,
                                       "host": "127.0.0.1"}},
        "hayakoe-pi": {"device": {"id": None, "name": "Living room", "area": "Study"},
                       "mqtt": {"client_id": "hayakoe-pi"},
                       "audio": {"quiet_hours": {"from": "23:00", "to": "06:00", "volume": 20},
                                 "chime": str(chime_wav(work / "chime.wav"))}},
    }
CHROOT_ENV = ["/usr/bin/env", "-i", "PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
              "LANG=C.UTF-8", "TZ=UTC"]


def step(text: str) -> None:
    print(f"ha-check: {text}", flush=True)


def chime_wav(path: Path) -> Path:
    """A short 16-bit WAV for audio.chime: a file chime."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(22050)
        w.writeframes(b"\x00\x10" * 2205)
    return path


class Room:
    """A daemon on the broker with its own sink and probe (its events, its retained topics)."""

    def __init__(self, work: Path, port: int, node: str, sections: dict):
        self.id = node
        self.work = work
        self.port = port
        work.mkdir(parents=True, exist_ok=True)
        self.sink = AlsaSink(work, paced=False)
        self.probe = Probe(port, PREFIX, device=self.id)
        self.config = write_config(work / "config.yaml", port, PREFIX, work, **sections,
                                   dictionary={"file": str(work / "dictionary.yaml")})  # not the host's
        self.daemon = None
        self.start()

    def start(self) -> None:
        self.daemon = DaemonProcess(self.config, self.sink.home, self.work / "daemon.log")
        wait_for(lambda: self.retained("status") == "online" or self.daemon.proc.poll() is not None, 120,
                 what=f"{self.id} online")
        assert self.daemon.proc.poll() is None, self.daemon.output()

    def retained(self, subtopic: str) -> str | None:
        payload = self.probe.last(f"{self.id}/{subtopic}")  # hayakoe/<device.id>/<subtopic>
        return None if payload is None else payload.decode()

    def discovery(self) -> list[dict]:
        """The discovery configs this Pi sent (the last of each topic; an empty one clears)."""
        configs = {}
        for topic, payload, _ in self.probe.messages:
            if topic.startswith("homeassistant/") and f"/{self.id}/" in topic:
                configs[topic] = json.loads(payload) if payload else None
        return [c for c in configs.values() if c]

    def configs(self) -> dict[str, dict]:
        """The discovery configs by key (unique_id <device.id>_<key>: say, volume, chime ...)."""
        return {c["unique_id"][len(self.id) + 1:]: c for c in self.discovery()}

    def entity(self, key: str) -> str:
        return self.configs()[key]["default_entity_id"]

    def stop(self) -> None:
        if self.daemon:
            self.daemon.stop()
        self.probe.close()
        self.sink.stop()


def start_home_assistant(root: Path, work: Path, ha: HomeAssistant) -> subprocess.Popen:
    """Home Assistant in the chroot on `work`/config (its log there too), once it answers."""
    config = work / "config"
    (config / "configuration.yaml").write_text(f"""\
homeassistant:
  name: ha-check
  time_zone: UTC
  country: JP
  language: ja
  unit_system: metric
  latitude: 35.68
  longitude: 139.69
  elevation: 0
http:
  server_host: 127.0.0.1
  server_port: {ha.port}
api:
config:
onboarding:
assist_pipeline:
conversation:
zeroconf:
automation: !include automations.yaml
script: !include scripts.yaml
logger:
  default: info
""")
    out = work / "hass.out"
    proc = subprocess.Popen(["chroot", str(root), *CHROOT_ENV, "/opt/ha/bin/hass", "--skip-pip", "-c", "/work/config"],
                            stdout=open(out, "ab"), stderr=subprocess.STDOUT)
    wait_for(lambda: ha.up() or proc.poll() is not None, 180, interval=0.5, what="Home Assistant to answer")
    assert proc.poll() is None, out.read_text()[-3000:]
    return proc


def stop_home_assistant(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def add_mqtt(ha: HomeAssistant, broker_port: int) -> None:
    """The MQTT integration on the test broker, as an owner adds it (Add integration → MQTT)."""
    answer = ha.config_flow("mqtt", {"broker": "127.0.0.1", "port": broker_port, "protocol": "5",
                                     "other_settings": {"set_client_cert": False, "set_ca_cert": "off",
                                                        "transport": "tcp"}})
    assert answer["type"] == "create_entry", answer


def check_discovery(ha: HomeAssistant, rooms: list[Room]) -> None:
    """Each Pi a device in its area, its entities named by the default_entity_id it sent, available."""
    ws = ha.ws()
    try:
        def registered():
            entities = {e["entity_id"]: e for e in ws.call("config/entity_registry/list") if e["platform"] == "mqtt"}
            return entities if len(entities) >= sum(len(r.discovery()) for r in rooms) else None

        entities = wait_for(registered, 60, what="every discovered entity in Home Assistant's registry")
        devices = {d["id"]: d for d in ws.call("config/device_registry/list")}
        areas = {a["area_id"]: a["name"] for a in ws.call("config/area_registry/list")}
    finally:
        ws.close()
    for room in rooms:
        sent = room.discovery()
        assert len(sent) == ENTITIES, f"{room.id}: {len(sent)} discovery configs, not {ENTITIES}"
        for config in sent:
            entity_id = config["default_entity_id"]
            entry = entities.get(entity_id)
            assert entry, f"{entity_id} (default_entity_id) is not in Home Assistant: " \
                          f"{sorted(e for e, v in entities.items() if v['unique_id'] == config['unique_id'])}"
            assert entry["unique_id"] == config["unique_id"], entry
            device = devices[entry["device_id"]]
            assert ["mqtt", room.id] in device["identifiers"], device
            assert device["name"] == config["device"]["name"], device
            assert areas.get(device["area_id"]) == config["device"]["suggested_area"], (device, areas)
            wait_for(lambda: (ha.state(entity_id) or {}).get("state") not in (None, "unavailable"), 30,
                     what=f"{entity_id} available")
        step(f"discovery: {room.id}: a device in {config['device']['suggested_area']}, "
             f"{len(sent)} entities as named, available")


def spoken(room: Room, text: str, timeout: float = 60) -> dict:
    return room.probe.next_event(timeout, event="finished", text=text)


def check_notify(ha: HomeAssistant, rooms: list[Room]) -> None:
    """notify.send_message on one room's entity: that room speaks, the other does not."""
    kitchen, living = rooms
    for room in rooms:
        room.probe.drain()
    before = living.sink.raw.stat().st_size
    ha.service("notify", "send_message", {"entity_id": kitchen.entity("say"), "message": "お鍋が煮えました。"})
    assert spoken(kitchen, "お鍋が煮えました。")["seconds"] > 0
    time.sleep(2)  # the other room would have queued it by now
    heard = [e for e in list(living.probe.events.queue) if e.get("text") == "お鍋が煮えました。"]
    assert not heard and living.sink.raw.stat().st_size == before, f"the other room spoke it too: {heard}"
    step("notify.send_message: spoken in its room only")


def shown(ha: HomeAssistant, entity_id: str) -> str | None:
    return (ha.state(entity_id) or {}).get("state")


def agree(ha: HomeAssistant, room: Room, key: str, daemon_value: str, ha_value: str, how: str) -> None:
    """The daemon holds `daemon_value` (its retained topic) and Home Assistant shows `ha_value`."""
    entity_id = room.entity(key)
    wait_for(lambda: room.retained(key) == daemon_value, 20,
             what=f"{room.id} {key} {daemon_value!r} after {how} (holds {room.retained(key)!r})")
    try:
        wait_for(lambda: shown(ha, entity_id) == ha_value, 20, what="")
    except AssertionError:
        raise AssertionError(f"{entity_id}: Home Assistant shows {shown(ha, entity_id)!r}, the daemon holds "
                             f"{daemon_value!r} (after {how}; expected {ha_value!r})") from None


def check_entities(ha: HomeAssistant, room: Room) -> None:
    """Each select, number, switch and button set from Home Assistant reaches the daemon, and
    Home Assistant then shows what the daemon holds."""
    configs = room.configs()
    for volume in (40, 100, 0, 70):
        ha.service("number", "set_value", {"entity_id": room.entity("volume"), "value": volume})
        agree(ha, room, "volume", str(volume), str(volume), f"number.set_value {volume}")
    for key in ("voice", "style", "chime"):
        options = configs[key]["options"]
        for option in options[1:] + options[:1]:  # each option, the first last: a change every time
            ha.service("select", "select_option", {"entity_id": room.entity(key), "option": option})
            agree(ha, room, key, option, option, f"select.select_option {option}")
        step(f"{room.id}: {key}: every option from Home Assistant ({', '.join(options)})")
    for on in (True, False, True, False):
        ha.service("switch", "turn_on" if on else "turn_off", {"entity_id": room.entity("quiet_hours")})
        agree(ha, room, "quiet_hours", "ON" if on else "OFF", "on" if on else "off",
              f"switch.turn_{'on' if on else 'off'}")
    room.probe.drain()
    long_text = "今日は良い天気です。" * 12
    room.probe.publish(f"{room.id}/say", long_text)
    room.probe.next_event(60, event="started")
    ha.service("button", "press", {"entity_id": room.entity("stop")})
    cut = room.probe.next_event(30, event="finished")
    assert cut.get("interrupted") is True, f"the stop button did not cut the speech: {cut}"
    wait_for(lambda: shown(ha, room.entity("state")) == "idle", 20, what=f"{room.entity('state')} idle")
    step(f"{room.id}: volume, quiet hours and the stop button from Home Assistant reach the daemon")


def check_outside(ha: HomeAssistant, room: Room) -> None:
    """A setting changed over MQTT, outside Home Assistant, is shown by Home Assistant."""
    configs = room.configs()
    room.probe.publish(f"{room.id}/volume/set", "55")
    agree(ha, room, "volume", "55", "55", "volume/set 55 over MQTT")
    for key in ("chime", "style"):
        for option in configs[key]["options"]:
            room.probe.publish(f"{room.id}/{key}/set", option)
            agree(ha, room, key, option, option, f"{key}/set {option} over MQTT")
    for value in ("ON", "OFF"):
        room.probe.publish(f"{room.id}/quiet_hours/set", value)
        agree(ha, room, "quiet_hours", value, value.lower(), f"quiet_hours/set {value} over MQTT")
    step(f"{room.id}: volume, chime, style and quiet hours set over MQTT: Home Assistant shows them")


def check_disk_sensors(ha: HomeAssistant, room: Room) -> None:
    """The diagnostic sensors show what the daemon measured: free MB, and no problem."""
    free, low = room.entity("disk_free"), room.entity("disk_low")
    wait_for(lambda: room.retained("disk_free") and room.retained("disk_low"), 20, what=f"{room.id} disk topics")

    def as_number(value: str | None) -> float | None:
        try:
            return float(value)
        except (TypeError, ValueError):
            return None

    held = float(room.retained("disk_free"))
    try:
        wait_for(lambda: as_number(shown(ha, free)) == held and shown(ha, low) == room.retained("disk_low").lower(),
                 20, what="")
    except AssertionError:
        raise AssertionError(f"{free} / {low}: Home Assistant shows {shown(ha, free)!r} / {shown(ha, low)!r}, the "
                             f"daemon holds {held} / {room.retained('disk_low')!r}") from None
    step(f"{room.id}: disk space as Home Assistant shows it: {shown(ha, free)} MB free, low {shown(ha, low)}")


def all_available(ha: HomeAssistant, rooms: list[Room], timeout: float) -> None:
    for room in rooms:
        for config in room.discovery():
            entity_id = config["default_entity_id"]
            wait_for(lambda: shown(ha, entity_id) not in (None, "unavailable"), timeout,
                     what=f"{entity_id} available (shows {shown(ha, entity_id)!r})")


def check_daemon_restart(ha: HomeAssistant, room: Room) -> None:
    """A daemon stopped shows as unavailable (its Last Will, or its own offline), then available."""
    room.daemon.stop()
    for config in room.discovery():
        entity_id = config["default_entity_id"]
        wait_for(lambda: shown(ha, entity_id) == "unavailable", 30, what=f"{entity_id} unavailable")
    room.start()
    all_available(ha, [room], 60)
    step(f"{room.id} restarted: its entities unavailable, then available again")


def check_forget(ha: HomeAssistant, room: Room) -> None:
    """`hayakoe-pi forget`, as install.sh --uninstall runs it (the service stopped), takes the
    device out of Home Assistant."""
    room.daemon.stop()
    done = subprocess.run([sys.executable, "-m", "hayakoe_pi.cli", "forget", "--config", str(room.config)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr

    def gone():
        ws = ha.ws()
        try:
            devices = ws.call("config/device_registry/list")
            entities = [e["entity_id"] for e in ws.call("config/entity_registry/list")
                        if e["unique_id"].startswith(f"{room.id}_") and e["platform"] == "mqtt"]
        finally:
            ws.close()
        return not entities and not any(["mqtt", room.id] in d["identifiers"] for d in devices)

    wait_for(gone, 30, interval=0.5, what=f"{room.id}'s device and entities gone from Home Assistant")
    step(f"hayakoe-pi forget: {room.id}'s device and entities gone from Home Assistant")


def complaints(log: Path) -> list[str]:
    """Home Assistant's warnings and errors but the one --skip-pip always gives."""
    expected = ("Skipping pip installation of required modules",)
    if not log.exists():
        return []
    return [line for line in log.read_text(errors="replace").splitlines()
            if (" WARNING " in line or " ERROR " in line or " CRITICAL " in line)
            and not any(e in line for e in expected)]


def check_log(log: Path, rooms: list[Room]) -> None:
    bad = complaints(log)
    assert not bad, "Home Assistant's log:\n" + "\n".join(bad[:20])
    for room in rooms:  # and the daemons said nothing of a problem either (their last run)
        bad = [line for line in room.daemon.output().splitlines()
               if line.startswith(("WARNING ", "ERROR ", "CRITICAL ", "Traceback"))]
        assert not bad, f"{room.id}'s log:\n" + "\n".join(bad[:20])
    step("Home Assistant's log and the daemons': no warning, no error")


def check_repairs(ha: HomeAssistant) -> None:
    ws = ha.ws()
    try:
        issues = ws.call("repairs/list_issues")["issues"]
    finally:
        ws.close()
    ours = [i for i in issues if i["domain"] in ("mqtt", "wyoming") and not i.get("dismissed_version")]
    assert not ours, f"repair issues: {ours}"
    step(f"repairs: none about MQTT or Wyoming ({len(issues)} in all)")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args(argv)
    work = args.work
    broker = Mosquitto(work / "broker").start()
    rooms: list[Room] = []
    ha_proc = None
    ha_log = work / "config" / "home-assistant.log"
    try:
        configs = rooms_config(work)
        for node, sections in configs.items():
            rooms.append(Room(work / node, broker.port, node, sections))
        wyoming = configs["kitchen-3fa2c1"]["wyoming"]
        (work / "config").mkdir()
        found = readme_blocks(REPO)
        scripts = write_into(work / "config", found)
        step(f"mosquitto on port {broker.port}, daemons {', '.join(r.id for r in rooms)} online")
        ha = HomeAssistant(free_port())
        ha_proc = start_home_assistant(args.root, work, ha)
        ha.onboard()
        version = ha.ok("GET", "/api/config")["version"]
        step(f"Home Assistant {version} on port {ha.port}, onboarded")
        add_mqtt(ha, broker.port)
        readme_loaded(ha, found, scripts)
        check_discovery(ha, rooms)
        check_notify(ha, rooms)
        for room in rooms:
            check_entities(ha, room)
            check_outside(ha, room)
            check_disk_sensors(ha, room)
        check_readme(ha, rooms, found, scripts, PREFIX, step)
        step(f"Wyoming: Home Assistant discovered {discovered(ha)!r} (zeroconf)")
        engine = add_wyoming(ha, wyoming["port"])
        step(f"Wyoming: the config flow found the engine at 127.0.0.1:{wyoming['port']}: {engine}")
        check_tts(ha, engine, wyoming["port"], step)
        check_assist(ha, engine, step)
        stop_home_assistant(ha_proc)
        ha_proc = start_home_assistant(args.root, work, ha)
        ha.login_again()
        all_available(ha, rooms, 60)
        step("Home Assistant restarted: every entity available again")
        check_notify(ha, rooms[::-1])
        check_daemon_restart(ha, rooms[0])
        check_repairs(ha)
        for room in rooms:
            check_forget(ha, room)
        check_log(ha_log, rooms)
    except AssertionError as e:
        print(f"ha-check: FAILED: {e}", file=sys.stderr, flush=True)
        for line in complaints(ha_log)[:20]:
            print(f"  Home Assistant: {line[:600]}", file=sys.stderr)
        return 1
    finally:
        if ha_proc:
            stop_home_assistant(ha_proc)
        for room in rooms:
            room.stop()
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
