"""Command line: `hayakoe-pi run|check|say|dict|devices|forget|prepare|frontend|synth ...`.

The arguments are args.py's; the config and whose files a command works on, context.py's;
`check` is check.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .args import DEFAULT_CONFIG, build_parser, config_path
from .check import check
from .context import become_owner_of, command_config, derived_dir, engine
from ..settings.config import Config
from ..models.errors import ModelError
from ..models.store import VOCAB_PATH


def _frontend(args: argparse.Namespace) -> int:
    from ..text import FrontEnd, TextError, VocabError

    models = args.models
    if config_path(args):  # its models and its user dictionary
        config = command_config(args)
        models = models or config.models.dir
        _use_dictionary(config)
    if not models:
        raise ModelError("give --models DIR (a HayaKoe-layout folder) or --config FILE")
    vocab = Path(models).expanduser() / VOCAB_PATH
    try:
        frontend = FrontEnd(vocab)
    except VocabError as e:
        raise ModelError(str(e)) from None
    texts = args.text if args.text else (line.rstrip("\r\n") for line in sys.stdin)
    status = 0
    for text in texts:
        try:
            out = frontend.analyze(text).as_dict()
        except TextError as e:
            out, status = {"text": text, "error": str(e)}, 1
        print(json.dumps(out, ensure_ascii=False), flush=True)
    return status


def _synth(args: argparse.Namespace) -> int:
    from ..sound.player import write_wav

    folder = Path(args.output).expanduser().absolute().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise OSError(f"cannot write {args.output}: {folder} is not a folder this user may write to")
    output = open(args.output, "wb")  # by whoever ran it: as root, before engine() becomes the service user
    voice = engine(args, command_config(args), args.models, args.voice, args.speaker)
    audio = voice.synthesize(" ".join(args.text), style=args.style, speed=args.speed,
                             style_weight=args.style_weight)
    write_wav(output, audio, voice.sample_rate)
    print(f"wrote {args.output}: {len(audio) / voice.sample_rate:.2f} s at {voice.sample_rate} Hz",
          file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> int:
    from ..door.daemon import run

    return run(command_config(args), config_path(args))


def _prepare(args: argparse.Namespace) -> int:
    """Make the derived model files ahead of the first start (install.sh runs it)."""
    from ..settings.config import CacheConfig, Config
    from ..models.prepare import prepare

    if args.models:
        config, models = Config(), args.models
        derived = CacheConfig(args.cache).models_dir if args.cache else derived_dir(config, config_given=False)
    else:
        config = command_config(args)
        models = config.models.dir
        derived = CacheConfig(args.cache).models_dir if args.cache else config.cache.models_dir
    become_owner_of(derived.parent)
    # every byte of what is there checked (not only sizes and samples, as at each start): run by
    # hand or by the installer, it may take the seconds a Pi needs to read them
    prepare(models, derived, args.voice or None, report=lambda step: print(step.line(), flush=True),
            decoder=args.decoder or config.engine.decoder,
            progress=lambda stage, seconds: print(stage.line(seconds), flush=True), full_check=True)
    return 0


def _say(args: argparse.Namespace) -> int:
    from ..synthesis.ahead import synthesize_ahead
    from ..sound.player import Player, check_device

    config = command_config(args)
    models = args.models or config.models.dir
    if not Path(models).expanduser().is_dir():
        given = config_path(args)
        source = "given with --models" if args.models else f"models.dir in {given}" if given \
            else "the default: no --config given"
        raise ModelError(f"models directory not found: {models} ({source}); give --models DIR "
                         f"(a HayaKoe-layout folder) or --config FILE (the service's: {DEFAULT_CONFIG})")
    device = args.device or config.audio.device
    check_device(device)  # before synthesis: the same message as `hayakoe-pi check`
    voice = engine(args, config, models, args.voice or config.voice.name)
    style = args.style or config.voice.style
    speed = config.voice.speed if args.speed is None else args.speed
    ahead = synthesize_ahead(voice, " ".join(args.text), style=style, speed=speed,
                             style_weight=config.voice.style_weight)
    # no keep_open_s: the command ends with its sound
    Player(device, lead_in_ms=config.audio.lead_in_ms).play(ahead, voice.sample_rate, config.audio.volume)
    return 0


def _use_dictionary(config: Config, entries=None) -> None:
    """Make OpenJTalk use the config's user dictionary (or `entries`), compiled in a scratch folder."""
    import tempfile

    from ..text.dictionary import UserDictionary, activate

    if entries is None:
        words = UserDictionary(Path(config.dictionary.file), config.dictionary.max_entries)
        for problem in words.load():
            print(f"warning: {problem}", file=sys.stderr)
        entries = list(words.entries.values())
    with tempfile.TemporaryDirectory(prefix="hayakoe-pi-dict-") as scratch:
        activate(entries, Path(scratch))


def _dict(args: argparse.Namespace) -> int:
    """The user dictionary of a config: add, remove, list, test."""
    from ..text.dictionary import UserDictionary

    config = command_config(args)
    become_owner_of(Path(config.dictionary.file).parent)
    words = UserDictionary(Path(config.dictionary.file), config.dictionary.max_entries)
    for problem in words.load():
        print(f"warning: {problem}", file=sys.stderr)
    reload_hint = "the service uses it after: sudo systemctl reload hayakoe-pi"
    if args.action == "add":
        data = {"surface": args.surface, "reading": args.reading, "accent": args.accent}
        data.update({k: v for k, v in (("kind", args.kind), ("priority", args.priority)) if v is not None})
        entry = words.add(data, use=lambda entries: _use_dictionary(config, entries))  # compiles, or changes nothing
        print(f"added {entry.surface} → {entry.reading} (accent {entry.accent}, {entry.kind}, priority "
              f"{entry.priority}) to {words.path}; {reload_hint}")
    elif args.action == "remove":
        entry = words.remove(args.surface)
        print(f"removed {entry.surface} from {words.path}; {reload_hint}")
    elif args.action == "list":
        for e in sorted(words.entries.values(), key=lambda e: e.surface):
            print(f"{e.surface}\t{e.reading}\t{e.accent}\t{e.kind}\t{e.priority}")
    else:  # test: as `frontend --config` reads it
        args.models = args.models or None
        return _frontend(args)
    return 0


def _forget(args: argparse.Namespace) -> int:
    """Remove the device from Home Assistant (install.sh --uninstall runs it, the service stopped)."""
    from ..broker.link import forget_device

    ok, detail = forget_device(command_config(args))
    print(detail, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def _devices(args: argparse.Namespace) -> int:
    from ..sound.player import desktop_sound_server, output_devices, suggested_device

    devices = output_devices()
    server = desktop_sound_server()
    suggestion = suggested_device(devices, server)
    reason = (f"ALSA's default goes through {server[0]} ({server[1]}), which a system service cannot reach"
              if server else "")
    if args.suggest:  # for install.sh: what audio.device should be (exit 1: no card), and why
        if reason:
            print(reason, file=sys.stderr)
        if suggestion:
            print(suggestion)
        return 0 if suggestion else 1
    for d in devices:
        mark = "*" if suggestion and (d["name"] == suggestion or
                                      d["name"].lower().startswith(suggestion.lower() + ":")) else " "
        print(f"{mark}{d['index']:3d}  {d['name']}  ({d['max_output_channels']} ch, "
              f"{d['default_samplerate']:.0f} Hz)")
    if server:
        print(f"{reason}: " + (f'use audio.device: "{suggestion}" (marked *)' if suggestion
                               else "connect a sound card and use its name for audio.device"))
    elif suggestion:
        print('* = what the service uses with audio.device: "default"')
    if not devices:
        print("no output devices found (is the sound card connected? is libportaudio2 installed?)",
              file=sys.stderr)
        return 1
    return 0


COMMANDS = {"run": _run, "check": check, "say": _say, "dict": _dict, "devices": _devices, "forget": _forget,
            "prepare": _prepare, "frontend": _frontend, "synth": _synth}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..text import TextError

    from ..sound.player import AudioError
    from ..settings.config import ConfigError

    try:
        return COMMANDS[args.command](args)
    except (ConfigError, ModelError, TextError, AudioError, ValueError, OSError) as e:
        print(f"hayakoe-pi: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
