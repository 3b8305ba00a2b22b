"""The owner's documents say what is true: the README and docs/ (the command reference, MQTT,
reading), tested against the code that they describe.

- Every fenced shell command is run as written by tools/install-check (the README's owner path
  in a clean Debian root), or by CI, or listed below as not runnable here, with the reason.
- Every payload (an `mqtt.publish` or `notify.send_message` of a ```yaml block) is sent, rendered
  as Home Assistant would, to a daemon on the test models, and spoken (or, for the dictionary,
  taken); every `mqtt.publish` uses QoS 1; every config snippet loads.
- The command reference is what tools/command_reference.py makes of the definitions.
- A README figure of speed, memory or disk links to the benchmark that measured it, and every
  link of the documents leads to a file and a heading that exist.
"""

import importlib.util
import json
import re
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from harness import appliance
from hayakoe_pi.settings.config import ConfigError, load_config

README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
INSTALL_CHECK = REPO / "tools" / "install-check"


def tool(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


doc_commands = tool("doc_commands")

# Shell commands of the documents that no test runs as written, and why.
NOT_RUNNABLE = {
    "sudo ./install.sh": "downloads 0.7 GB from Hugging Face; install-check runs the same install from a models "
                         "folder (--models-from), and tests/test_install.py downloads from a local stand-in",
    "git clone <this repository> hayakoe-pi && cd hayakoe-pi": "the repository's address is the reader's; "
                                                                 "install-check copies the checkout instead",
    "sudo ./install.sh --voice jvnv-M1-jp": "downloads a published voice; tests/test_install.py installs with "
                                            "--voice from a local stand-in for Hugging Face",
    "sudo nano /etc/hayakoe-pi/config.yaml": "an editor: install-check makes the README's edit, its mqtt: block "
                                             "(tools/doc_commands.py config)",
    "sudo systemctl restart hayakoe-pi": "no systemd in install-check's chroot: it starts the service by hand, "
                                         "as install.sh says to",
    "sudo systemctl reload hayakoe-pi": "no systemd in install-check's chroot: it sends the service SIGHUP, "
                                        "which is the unit's reload",
    "sudo ./install.sh --lan-broker": "listens on the host's interfaces; install-check runs it with "
                                      "--lan-interface lan0, the interface of its private network",
    "sudo hayakoe-pi say --device \"bcm2835 Headphones\" 'テストです'": "names a Raspberry Pi's card; "
                                                                      "tests/test_cli.py runs say --device on the "
                                                                      "test card",
    "sudo ./install.sh --name Kitchen --area Kitchen": "downloads the models; tests/test_install.py installs with "
                                                       "--name and --area from a models folder",
}
RUN_BY_CI = {"./tools/run-tests"}  # .ci/run runs it: the suite itself


def doc_commands_of(path: Path) -> list[str]:
    return doc_commands.commands(path.read_text(encoding="utf-8"))


def run_by_install_check() -> set[str]:
    """The commands tools/install-check runs with `readme` / `readme_bg` (its quoting undone)."""
    found = set()
    for m in re.finditer(r"\breadme(?:_bg)? (\"(?:[^\"\\]|\\.)*\")", INSTALL_CHECK.read_text(encoding="utf-8")):
        text = m.group(1)[1:-1].replace("'\\''", "'").replace('\\"', '"')
        found.add(text)
    return found


def test_the_readme_is_for_owners_and_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, len(lines)
    # its first lines still give the two commands for a fresh machine: the appliance, and the tests
    assert doc_commands_of(README)[:2] == ["sudo ./install.sh", "./tools/run-tests"]
    assert "./tools/run-tests" in (REPO / ".ci" / "run").read_text()
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[:5] == ["## What you need", "## Install", "## Connect to Home Assistant", "## Make it speak",
                            "## Automations"]
    assert headings[-3:] == ["## Troubleshooting", "## Uninstall", "## More"]


def test_every_shell_command_is_run_as_written_or_said_why_not():
    run = run_by_install_check()
    assert len(run) >= 14, run
    for doc in DOCS:
        for command in doc_commands_of(doc):
            assert command in run or command in RUN_BY_CI or command in NOT_RUNNABLE, \
                f"{doc.name}: `{command}` is neither run by tools/install-check nor listed in NOT_RUNNABLE"
    every = {c for doc in DOCS for c in doc_commands_of(doc)}
    assert run - every == set(), "install-check runs commands no document has"
    assert set(NOT_RUNNABLE) - every == set(), "NOT_RUNNABLE names commands no document has"
    assert set(NOT_RUNNABLE) & run == set()


def test_the_command_reference_is_made_from_the_definitions():
    made = tool("command_reference").reference()
    assert (REPO / "docs" / "commands.md").read_text(encoding="utf-8") == made, \
        "docs/commands.md is out of date: python tools/command_reference.py > docs/commands.md"
    for command in ("hayakoe-pi forget", "hayakoe-pi dict add", "hayakoe-pi check", "--version", "--purge",
                    "--models-from", "--lan-broker"):
        assert command in made


def test_every_config_snippet_loads(tmp_path):
    snippets = [s for doc in DOCS for s in doc_commands.config_blocks(doc.read_text(encoding="utf-8"))]
    assert {"mqtt", "wyoming", "device", "audio"} <= {key for s in snippets for key in s}
    for snippet in snippets:
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(snippet, allow_unicode=True))
        try:
            load_config(path)
        except ConfigError as e:
            pytest.fail(f"{snippet}: {e}")


def test_the_payloads_of_the_documents_are_sent_with_qos_1_and_spoken(tmp_path):
    actions = [(doc.name, a) for doc in DOCS for a in doc_commands.actions(doc.read_text(encoding="utf-8"))]
    publishes = [(name, a["data"]) for name, a in actions if a["action"] == "mqtt.publish"]
    notifies = [(name, a["data"]["message"]) for name, a in actions if a["action"] == "notify.send_message"]
    assert len(publishes) >= 5 and len(notifies) >= 3
    for name, data in publishes:
        assert data.get("qos") == 1, f"{name}: mqtt.publish to {data['topic']} without qos: 1"
        # an id in a payload is made anew each run (a fixed one would be taken for a repeat)
        first, later = (doc_commands.render(str(data["payload"]), now) for now in (1e9, 1e9 + 60))
        if '"id"' in first:
            assert json.loads(first)["id"] != json.loads(later)["id"], data["payload"]
    with appliance(tmp_path, sink_kwargs={"paced": False}, audio={"chime": "default"}) as app:
        probe = app.probe
        for name, data in publishes:
            topic = data["topic"]
            assert topic.startswith("hayakoe/"), topic
            subtopic = topic.removeprefix("hayakoe/")
            payload = doc_commands.render(str(data["payload"]), time.time())
            if subtopic.startswith("dictionary/"):
                probe.drain()
                probe.publish(subtopic, payload)
                answer = probe.next_event(event="dictionary", timeout=30)
            else:
                answer = probe.reply(subtopic, payload)
            assert answer["event"] in ("finished", "dictionary"), (name, payload, answer)
        for name, message in notifies:  # what the notify entity sends: the text, to one Pi's say
            answer = probe.reply("pi/say", doc_commands.render(str(message)))
            assert answer["event"] == "finished", (name, message, answer)


def test_the_readmes_settings_line_is_the_daemons(tmp_path):
    from hayakoe_pi.speech.service import SavedSelection

    line = re.search(r"^INFO hayakoe_pi: settings: (.*), \.\.\.$", README.read_text(encoding="utf-8"), re.M).group(1)
    s = SavedSelection(tmp_path / "state.json", 0.7, "jvnv-F1-jp", "Neutral")
    s.volume = 0.4
    assert s.describe().startswith(line), s.describe()


# --- figures and links ----------------------------------------------------------------------

FIGURE = re.compile(r"\d[\d.,–-]*\s*(MB|GB|×|x real time|s\b)")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lstrip("#").strip()).lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return {slug(line) for line in text.splitlines() if line.startswith("#")}


def test_a_readme_figure_of_speed_memory_or_disk_links_to_its_benchmark():
    """Each README paragraph (or table row, or list item) that gives such a figure links to the
    bench/README.md section that measured it."""
    text = re.sub(r"^```.*?^```", "", README.read_text(encoding="utf-8"), flags=re.M | re.S)
    pieces = re.split(r"\n\s*\n|\n(?=\||- )", text)
    claims = [p for p in pieces if FIGURE.search(p) and re.search(r"MB|GB|real time|×|speed|takes|prepare", p)]
    assert len(claims) >= 4, claims
    for piece in claims:
        links = re.findall(r"\]\((bench/README\.md#[^)]+)\)", piece)
        assert links, f"a figure without its benchmark: {piece.strip()[:120]}"


def test_every_link_leads_to_a_file_and_heading_that_exist():
    for doc in [*DOCS, REPO / "ARCHITECTURE.md", REPO / "CONTRIBUTING.md", REPO / "bench" / "README.md"]:
        text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"https?:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            assert path.exists(), f"{doc.name}: {target}: no such file"
            if anchor:
                assert anchor in anchors(path), f"{doc.name}: {target}: no such heading in {path.name}"
