"""Write docs/commands.md, the command reference, from the definitions themselves: every
hayakoe-pi command and flag from hayakoe_pi/cli/args.py's parser, and install.sh's options from
its --help. tests/test_docs.py fails when docs/commands.md is not what this prints.

    python tools/command_reference.py > docs/commands.md
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hayakoe_pi.cli.args import build_parser  # noqa: E402

HEADER = """# Command reference

Every `hayakoe-pi` command and flag, and every option of `install.sh`. This file is made from
their definitions (`hayakoe_pi/cli/args.py`, `install.sh --help`) by
`python tools/command_reference.py > docs/commands.md`, and `tests/test_docs.py` fails when it
differs from them. `--config FILE` goes before or after the command's name, for every command;
without it a command reads the file `$HAYAKOE_PI_CONFIG` names, else
`/etc/hayakoe-pi/config.yaml` when it exists and you are root (`sudo hayakoe-pi ...` works as
the service does), else the built-in defaults (`run`, `check`, `dict`, `forget` and `prepare`
without `--models` need a config: theirs is `/etc/hayakoe-pi/config.yaml`). Numbers out of
their range are refused. The MQTT topics and payloads are in [mqtt.md](mqtt.md).
"""


def _wide(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
    return parser


def _argument(action: argparse.Action) -> str:
    if action.option_strings:
        flags = ", ".join(action.option_strings)
        if action.nargs == 0:
            return f"`{flags}`"
        metavar = action.metavar or (action.dest.upper() if not action.choices else
                                     "{" + ",".join(map(str, action.choices)) + "}")
        return f"`{flags} {metavar}`"
    many = {"*": " ...", "+": " ..."}.get(action.nargs, "")
    return f"`{action.metavar or action.dest}{many}`"


def _meaning(action: argparse.Action) -> str:
    text = action.help or ""
    if action.option_strings and action.required:
        text += " (required)"
    if action.nargs == "+":
        text += " (one or more)"
    return text.replace("|", "\\|")


def _section(parser: argparse.ArgumentParser, title: str, level: int) -> list[str]:
    _wide(parser)
    lines = [f"{'#' * level} {title}", ""]
    if parser.description:
        lines += [parser.description, ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    rows = [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    if rows:
        lines += ["| argument | meaning |", "|---|---|"]
        lines += [f"| {_argument(a)} | {_meaning(a)} |" for a in rows]
        lines.append("")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                lines += _section(sub, f"{title} {name}", level + 1)
    return lines


def hayakoe_pi() -> list[str]:
    parser = _wide(build_parser())
    lines = ["## hayakoe-pi", "", parser.description, "", "```text", parser.format_usage().strip(), "```", "",
             "| argument | meaning |", "|---|---|"]
    lines += [f"| {_argument(a)} | {_meaning(a)} |" for a in parser._actions
              if a.option_strings and not isinstance(a, argparse._HelpAction)]
    lines.append("")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                lines += _section(sub, f"hayakoe-pi {name}", 3)
    return lines


def install_sh() -> list[str]:
    help_text = subprocess.run(["bash", "./install.sh", "--help"], cwd=REPO, capture_output=True, text=True,
                               check=True).stdout.rstrip()
    return ["## install.sh", "", "Install, upgrade or remove hayakoe-pi (as root).", "", "```text", help_text, "```"]


def reference() -> str:
    return "\n".join([HEADER, *hayakoe_pi(), *install_sh()]) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference())
