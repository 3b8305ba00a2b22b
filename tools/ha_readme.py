"""The README's (and docs/'s) Home Assistant automations and scripts, as written, in the real
Home Assistant: tools/ha_check.py loads them into automations.yaml / scripts.yaml before Home
Assistant starts, then triggers each and waits for what it must make the daemons do.

A ```yaml block that is a list of automations (`triggers`) goes to automations.yaml as it is;
a list of actions becomes a script (`readme_<n>`). An automation is triggered through its
state triggers (each entity set to something else, then to `to`), a script by running it.
Each `mqtt.publish` to a say topic and each `notify.send_message` must be spoken (`finished`)
by the rooms it names; a `dictionary/add` taken (`dictionary`, `added`) by every room.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from doc_commands import blocks

DOCS = ("README.md", "docs/mqtt.md", "docs/reading.md", "docs/commands.md")
STATES = re.compile(r"states\(\s*'([a-z_]+\.[a-z0-9_]+)'\s*\)")


def readme_blocks(repo: Path) -> list[tuple[str, int, list]]:
    """(document, line, block) of every automation or action list in the documents."""
    found = []
    for doc in DOCS:
        for lang, body, line in blocks((repo / doc).read_text(encoding="utf-8")):
            data = yaml.safe_load(body) if lang == "yaml" else None
            if isinstance(data, list) and data and all(isinstance(i, dict) and ("triggers" in i or "action" in i)
                                                       for i in data):
                found.append((doc, line, data))
    return found


def write_into(config: Path, found: list[tuple[str, int, list]]) -> dict[str, tuple[str, int, list]]:
    """automations.yaml and scripts.yaml made of the blocks; script id → its block."""
    automations, scripts, named = [], {}, {}
    for n, (doc, line, data) in enumerate(found):
        if "triggers" in data[0]:
            automations += [{"id": f"readme_{n}_{i}", **a} for i, a in enumerate(data)]
        else:
            scripts[f"readme_{n}"] = {"alias": f"{doc} line {line}", "sequence": data}
            named[f"readme_{n}"] = (doc, line, data)
    dump = {"allow_unicode": True, "sort_keys": False}
    (config / "automations.yaml").write_text(yaml.safe_dump(automations, **dump) if automations else "[]\n")
    (config / "scripts.yaml").write_text(yaml.safe_dump(scripts, **dump) if scripts else "{}\n")
    return named


def expected(action: dict, rooms, prefix: str) -> list[tuple[object, dict]]:
    """(room, event fields) for what one action must make happen."""
    data = action.get("data", {})
    if action["action"] == "notify.send_message":
        target = action["target"]["entity_id"]
        return [(r, {"event": "finished"}) for r in rooms if r.entity("say") == target]
    topic = data["topic"]
    if topic == f"{prefix}/say":
        return [(r, {"event": "finished"}) for r in rooms]
    if topic == f"{prefix}/dictionary/add":
        return [(r, {"event": "dictionary", "action": "added"}) for r in rooms]
    return [(r, {"event": "finished"}) for r in rooms if topic == f"{prefix}/{r.id}/say"]


def actions_of(data: list) -> list[dict]:
    return [a for item in data for a in (item.get("actions", []) if "triggers" in item else [item])]


def awaited(rooms, actions: list[dict], prefix: str, where: str) -> None:
    wanted = [pair for a in actions for pair in expected(a, rooms, prefix)]
    assert wanted, f"{where}: nothing to wait for"
    for room in rooms:
        matches = [m for r, m in wanted if r is room]
        if matches:
            try:
                room.probe.expect(*matches, timeout=120)
            except AssertionError as e:
                raise AssertionError(f"{where}: {room.id}: {e}") from None


def set_states(ha, found) -> None:
    """Every entity a template reads (states('…')) gets a state, as a real house would have."""
    for _, _, data in found:
        for entity_id in STATES.findall(yaml.safe_dump(data, allow_unicode=True)):
            ha.ok("POST", f"/api/states/{entity_id}", {"state": "21"})


def loaded(ha, found, scripts: dict) -> None:
    """Each automation on and each script there: one Home Assistant found invalid (a broken
    template) is unavailable or missing, with the reason in its log."""
    states = ha.ok("GET", "/api/states")
    automations = {s["attributes"].get("id"): s for s in states if s["entity_id"].startswith("automation.")}
    for n, (doc, line, data) in enumerate(found):
        if "triggers" in data[0]:
            for i, automation in enumerate(data):
                state = automations.get(f"readme_{n}_{i}", {}).get("state")
                assert state == "on", f"{doc} line {line}: automation {automation['alias']!r} is {state}"
    for name, (doc, line, _) in scripts.items():
        state = (ha.state(f"script.{name}") or {}).get("state")
        assert state == "off", f"{doc} line {line}: the script is {state} (not ready to run)"


def check_readme(ha, rooms, found, scripts: dict, prefix: str, step) -> None:
    set_states(ha, found)
    for doc, line, data in found:
        for room in rooms:
            room.probe.drain()
        if "triggers" in data[0]:
            for automation in data:
                for trigger in automation["triggers"]:
                    ids = trigger["entity_id"] if isinstance(trigger["entity_id"], list) else [trigger["entity_id"]]
                    for entity_id in ids:
                        ha.ok("POST", f"/api/states/{entity_id}", {"state": "idle"})
                        ha.ok("POST", f"/api/states/{entity_id}", {"state": trigger["to"]})
                        awaited(rooms, automation["actions"], prefix,
                                f"{doc} line {line}, {automation['alias']!r} by {entity_id}")
                        for room in rooms:
                            room.probe.drain()
        else:
            name = next(n for n, block in scripts.items() if block[:2] == (doc, line))
            ha.service("script", name, {})
            awaited(rooms, data, prefix, f"{doc} line {line}, as a script")
        step(f"{doc} line {line}: {len(actions_of(data))} actions, done by the daemons")
