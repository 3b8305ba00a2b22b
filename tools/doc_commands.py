"""The commands and payloads the owner's documents show, as tests run them.

    python3 tools/doc_commands.py has COMMAND DOC...       # exit 0 if COMMAND is a shell command of a DOC
    python3 tools/doc_commands.py commands DOC...          # their shell commands, one a line
    python tools/doc_commands.py payloads DOC              # its mqtt.publish payloads, rendered: JSON lines
    python tools/doc_commands.py payload DOC N             # the N-th: topic, qos, payload, each ended by NUL
    python tools/doc_commands.py config DOC CONFIG         # CONFIG with the DOC's `mqtt:` block applied

A shell command is a line of a ```sh block (a line ending in a backslash goes on on the next),
without its comment. A payload is the `payload` of an `mqtt.publish` action in a ```yaml block
(or the `message` of a `notify.send_message`), its Home Assistant template rendered as Home
Assistant would (`now()`, `as_timestamp`, `states()`, `trigger`, the filters `round` and `int`).
The standard library is enough for the commands (tools/install-check runs this in a clean
root with the system's python3); payloads and configs need PyYAML.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

FENCE = re.compile(r"^```(\w*)\s*$")
TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.S)
STATES = {"sensor.living_temperature": "21"}  # what states() gives in the tests
TRIGGER = SimpleNamespace(entity_id="binary_sensor.kitchen_smoke")


def blocks(text: str) -> list[tuple[str, str, int]]:
    """The fenced blocks of a Markdown text: (language, body, line number of the fence)."""
    found, lang, body, start = [], None, [], 0
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if lang is None and m:
            lang, body, start = m.group(1), [], number
        elif lang is not None and line.startswith("```"):
            found.append((lang, "\n".join(body) + "\n", start))
            lang = None
        elif lang is not None:
            body.append(line)
    return found


def without_comment(line: str) -> str:
    """A shell line without its comment (a # outside quotes, at the start or after a space)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands(text: str) -> list[str]:
    """The shell commands of a Markdown text's ```sh blocks, in order."""
    found = []
    for lang, body, _ in blocks(text):
        if lang != "sh":
            continue
        pending = ""
        for line in body.splitlines():
            line = without_comment(line)
            if line.endswith("\\"):
                pending += line[:-1].rstrip() + " "
                continue
            line = (pending + line.strip()).strip()
            pending = ""
            if line:
                found.append(line)
    return found


def _expression(expr: str) -> str:
    """A Jinja expression as Python: `x | round(2)` → round(x, 2), `x | int` → int(x)."""
    parts, depth, quote, current = [], 0, None, ""
    for c in expr:
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += c
    parts.append(current)
    python = parts[0].strip()
    for f in parts[1:]:
        m = re.fullmatch(r"\s*(\w+)\s*(?:\((.*)\))?\s*", f)
        if not m:
            raise ValueError(f"cannot render the filter {f!r}")
        python = f"{m.group(1)}({python}{', ' + m.group(2) if m.group(2) else ''})"
    return python


def render(template: str, now: float | None = None) -> str:
    """A Home Assistant template, rendered with the functions the documents use."""
    now = time.time() if now is None else now
    names = {"now": lambda: now, "as_timestamp": float, "states": lambda e: STATES.get(e, "unknown"),
             "trigger": TRIGGER, "round": round, "int": int, "float": float}
    return TEMPLATE.sub(lambda m: str(eval(f"({_expression(m.group(1))})", {"__builtins__": {}}, names)), template)


def actions(text: str) -> list[dict]:
    """Every Home Assistant action in a text's ```yaml blocks (also those inside automations)."""
    import yaml

    found = []

    def walk(node) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            if "action" in node and isinstance(node.get("data"), dict):
                found.append(node)
            for value in node.values():
                walk(value)

    for lang, body, _ in blocks(text):
        if lang == "yaml":
            walk(yaml.safe_load(body))
    return found


def payloads(text: str, now: float | None = None) -> list[dict]:
    """Each mqtt.publish of the text: topic, qos and the payload rendered."""
    return [{"topic": a["data"]["topic"], "qos": a["data"].get("qos", 0),
             "payload": render(str(a["data"]["payload"]), now)}
            for a in actions(text) if a["action"] == "mqtt.publish"]


def config_blocks(text: str) -> list[dict]:
    """The ```yaml blocks that are config.yaml snippets (a mapping of config sections)."""
    import yaml

    from hayakoe_pi.settings.config import defaults

    sections = set(defaults())
    found = []
    for lang, body, _ in blocks(text):
        if lang == "yaml":
            data = yaml.safe_load(body)
            if isinstance(data, dict) and set(data) <= sections:
                found.append(data)
    return found


def apply_config(text: str, path: Path) -> None:
    """Edit the config file at `path` as the README's `mqtt:` block says (the owner's edit)."""
    import yaml

    mqtt = next(block["mqtt"] for block in config_blocks(text) if "mqtt" in block)
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["mqtt"].update(mqtt)
    path.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")


def main(argv: list[str]) -> int:
    what, *rest = argv
    if what == "has":
        return 0 if any(rest[0] in commands(Path(doc).read_text(encoding="utf-8")) for doc in rest[1:]) else 1
    if what == "commands":
        print("\n".join(c for doc in rest for c in commands(Path(doc).read_text(encoding="utf-8"))))
        return 0
    text = Path(rest[0]).read_text(encoding="utf-8")
    if what == "payloads":
        for p in payloads(text):
            print(json.dumps(p, ensure_ascii=False))
    elif what == "payload":
        p = payloads(text)[int(rest[1])]
        sys.stdout.write(f"{p['topic']}\0{p['qos']}\0{p['payload']}\0")
    elif what == "config":
        apply_config(text, Path(rest[1]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
