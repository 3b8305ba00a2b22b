"""The command line's words: every command, its arguments and their ranges (docs/commands.md is
made from this, by tools/command_reference.py), and which config a command reads."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from .. import __version__
from ..settings.config import VoiceConfig
from ..models.quantize import DECODER_CHOICES
from ..text.dictionary import KINDS

DEFAULT_CONFIG = "/etc/hayakoe-pi/config.yaml"
# Commands that cannot work without a config: without --config they name the service's, so a
# missing one is said as such (say, synth, frontend and prepare --models run on the defaults).
NEED_CONFIG = ("run", "check", "forget", "dict")


def default_config() -> str:
    """The config a command reads when not given --config: $HAYAKOE_PI_CONFIG if set, else the service's."""
    return os.environ.get("HAYAKOE_PI_CONFIG") or DEFAULT_CONFIG


def config_path(args: argparse.Namespace) -> str | None:
    """The config this command reads: --config (before or after the command), else the
    service's when it exists and this is root (`sudo hayakoe-pi ...` speaks as the service
    does), else the service's for the commands that need one, else none (the defaults)."""
    if args.config:
        return args.config
    default = default_config()
    if (os.environ.get("HAYAKOE_PI_CONFIG") or os.geteuid() == 0) and Path(default).is_file():
        return default
    if args.command in NEED_CONFIG or (args.command == "prepare" and not args.models):
        return default
    return None


def _ranged(name: str, low: float, high: float):
    """An argparse type: a number from `low` to `high`, else an error naming the range."""
    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not low <= value <= high:  # NaN too
            raise argparse.ArgumentTypeError(f"{name} must be a number from {low:g} to {high:g}, got {text}")
        return value

    number.__name__ = name  # argparse names the type in its own messages
    return number


def _voice_range(key: str) -> tuple[float, float]:
    """The range config.yaml allows for voice.<key>: one range for the config and the CLI."""
    return next(f.metadata["range"] for f in dataclasses.fields(VoiceConfig) if f.name == key)


SPEED = _ranged("speed", *_voice_range("speed"))
STYLE_WEIGHT = _ranged("style weight", *_voice_range("style_weight"))


def _whole(name: str, low: int, high: int | None = None):
    def number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            what = f"from {low} to {high}" if high is not None else f"of {low} or more"
            raise argparse.ArgumentTypeError(f"{name} must be a whole number {what}, got {text}")
        return value

    number.__name__ = name
    return number


class _Parser(argparse.ArgumentParser):
    """Every command and subcommand accepts --config, before or after its own name."""

    def add_config(self, default: str) -> None:
        # SUPPRESS: given after the command it is set; not given, the one before (or none) stays
        self.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                          help=f"the config file (default: {DEFAULT_CONFIG}{default})")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hayakoe-pi", description="Offline Japanese text to speech for Home Assistant.")
    p.add_argument("--version", action="version", version=f"hayakoe-pi {__version__}")
    p.add_argument("--config", metavar="FILE", default=None,
                   help=f"the config file, for any command (default: {DEFAULT_CONFIG} when it exists "
                        "and you are root)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    def command(name: str, text: str) -> _Parser:
        c = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        c.add_config("" if name in NEED_CONFIG else ", with --models only when it exists and you are root"
                     if name == "prepare" else " when it exists and you are root, else the built-in defaults")
        return c

    command("run", "run the daemon: MQTT in, speech out (what the systemd service runs)")
    command("check", "check the config, the models, the broker and the sound card without starting; "
                     "show each setting in effect and where it comes from; models not prepared yet: "
                     "which steps are done and which are left (it never prepares them)")

    sa = command("say", "speak text on the sound card now, without MQTT")
    sa.add_argument("--models", metavar="DIR", help="models folder (HayaKoe layout) instead of the config's")
    sa.add_argument("--voice", help="voice instead of the config's voice.name, e.g. jvnv-F1-jp")
    sa.add_argument("--style", help="style of the voice instead of voice.style, e.g. Happy")
    sa.add_argument("--speed", type=SPEED, help="speaking speed, 0.25 to 4 (default: voice.speed)")
    sa.add_argument("--device", help="sound card name or index instead of audio.device (see devices)")
    sa.add_argument("text", nargs="+", help="what to say")

    dc = command("dict", "the user dictionary: words read the way the household says them")
    dsub = dc.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)

    def action(name: str, text: str) -> _Parser:
        a = dsub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        a.add_config("")
        return a

    da = action("add", "add a word, or replace it: SURFACE READING ACCENT")
    da.add_argument("surface", help="the word as written, e.g. 晴翔")
    da.add_argument("reading", help="its reading in katakana, e.g. ハルト")
    da.add_argument("accent", type=_whole("accent", 0),
                    help="0: flat; n: the pitch drops after the n-th mora (at most the reading's moras)")
    da.add_argument("--kind", choices=tuple(KINDS), help="what the word is (default: proper)")
    da.add_argument("--priority", type=_whole("priority", 0, 10),
                    help="0 to 10 (default 5): how strongly it wins over OpenJTalk's own words")
    dr = action("remove", "remove a word")
    dr.add_argument("surface", help="the word as written")
    action("list", "list the words, one a line: surface, reading, accent, kind, priority")
    dt = action("test", "show how texts are read with the words (as frontend does)")
    dt.add_argument("--models", metavar="DIR", help="models folder (default: the config's)")
    dt.add_argument("text", nargs="*", help="texts; lines of standard input when none")

    dv = command("devices", "list the sound cards, the one the service would use marked *")
    dv.add_argument("--suggest", action="store_true",
                    help="print only the device to set as audio.device (exit 1 when there is none)")

    command("forget", "remove this Pi from Home Assistant and clear its retained MQTT topics "
                      "(stop the service first; install.sh --uninstall runs it)")

    pr = command("prepare", "make the files derived from the models (split, optimized copies), once, "
                            "one model at a time, each step named as it starts and ends (install.sh runs it)")
    pr.add_argument("--models", metavar="DIR", help="models folder instead of the config's (derived files in "
                                                    "~/.cache/hayakoe-pi, or as root the service's)")
    pr.add_argument("--cache", metavar="DIR", help="cache folder instead of the config's cache.dir "
                                                   "(the daemon looks in DIR/models)")
    pr.add_argument("--voice", action="append", help="only this voice (repeatable; default: every installed one)")
    pr.add_argument("--decoder", choices=DECODER_CHOICES,
                    help="int8 or auto: each voice's 8-bit decoder too (default: the config's engine.decoder)")

    fe = command("frontend", "show how text is read: one JSON object per text")
    fe.add_argument("--models", metavar="DIR", help="models folder (HayaKoe layout); default: the config's")
    fe.add_argument("text", nargs="*", help="texts; lines of standard input when none")

    sy = command("synth", "speak text into a 16-bit WAV file")
    sy.add_argument("--models", metavar="DIR", required=True, help="models folder (HayaKoe layout)")
    sy.add_argument("--voice", required=True, help="voice, e.g. jvnv-F1-jp")
    sy.add_argument("--speaker", help="speaker within the voice (default: its first)")
    sy.add_argument("--style", default="Neutral", help="style of the voice (default: Neutral)")
    sy.add_argument("--style-weight", type=STYLE_WEIGHT, default=1.0, help="0 to 20 (default: 1)")
    sy.add_argument("--speed", type=SPEED, default=1.0, help="0.25 to 4 (default: 1)")
    sy.add_argument("-o", "--output", metavar="FILE", required=True, help="the WAV file to write")
    sy.add_argument("text", nargs="+", help="what to say")
    return p
