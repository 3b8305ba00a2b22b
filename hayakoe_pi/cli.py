"""Command line: `hayakoe-pi run|check|prepare|say|devices|frontend|synth ...`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from .config import Config
from .models.errors import ModelError
from .models.quantize import DECODER_CHOICES
from .models.store import VOCAB_PATH

DEFAULT_CONFIG = "/etc/hayakoe-pi/config.yaml"


def _frontend(args: argparse.Namespace) -> int:
    from .text import FrontEnd, TextError, VocabError

    models = args.models
    if args.config:  # its models and its user dictionary
        config = _load_config(args)
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
    from .audio import write_wav

    folder = Path(args.output).expanduser().absolute().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise OSError(f"cannot write {args.output}: {folder} is not a folder this user may write to")
    output = open(args.output, "wb")  # by whoever ran it: as root, before _engine becomes the service user
    engine = _engine(args, _load_config(args), args.models, args.voice, args.speaker)
    audio = engine.synthesize(" ".join(args.text), style=args.style, speed=args.speed,
                              style_weight=args.style_weight)
    write_wav(output, audio, engine.sample_rate)
    print(f"wrote {args.output}: {len(audio) / engine.sample_rate:.2f} s at {engine.sample_rate} Hz",
          file=sys.stderr)
    return 0


def _load_config(args: argparse.Namespace) -> Config:
    from .config import load_config

    config = load_config(args.config)
    logging.basicConfig(level=config.log.level.upper(),
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return config


def _as_service() -> bool:
    """Root without a cache of its own chosen (sudo clears XDG_CACHE_HOME): `sudo hayakoe-pi ...`
    works on the service's files and leaves nothing in /root/.cache."""
    return os.geteuid() == 0 and "XDG_CACHE_HOME" not in os.environ


def _derived_dir(config: Config, config_given: bool) -> Path:
    """Where the CLI finds (and makes) the derived model files: the service's
    (`cache.dir`/models) when given --config or run as root (_as_service), else the
    user's ~/.cache/hayakoe-pi/models."""
    from .models.store import default_derived_dir

    if config_given or _as_service():
        return config.cache.models_dir
    return default_derived_dir()


def _become_owner_of(folder: Path) -> None:
    """As root on the service's files (`sudo hayakoe-pi dict|prepare|say|check`): become the
    folder's owner (the service user, with its groups: audio) before touching anything in it.
    Root then never writes through a link or a name that user controls, and what is made is
    the service's. Nothing changes for another user, or for a folder root owns or none has yet."""
    import pwd

    if os.geteuid() != 0:
        return
    try:
        st = os.lstat(folder)  # a link planted in the folder's place is the user's too
    except FileNotFoundError:
        return
    if st.st_uid == 0:
        return
    try:
        os.initgroups(pwd.getpwuid(st.st_uid).pw_name, st.st_gid)
    except KeyError:  # no such user: no supplementary groups
        os.setgroups([])
    os.setgid(st.st_gid)
    os.setuid(st.st_uid)


def _engine(args: argparse.Namespace, config: Config, models: str | Path, voice: str, speaker=None):
    from .engine import Engine
    from .models.store import ModelStore
    derived = _derived_dir(config, bool(args.config))
    _become_owner_of(derived.parent)
    return Engine(models, voice=voice, speaker=speaker,
                  store=ModelStore(models, derived_dir=derived, decoder=config.engine.decoder))


def _run(args: argparse.Namespace) -> int:
    from .daemon import run

    return run(_load_config(args))


def _check(args: argparse.Namespace) -> int:
    """The daemon's start-up checks plus broker and sound card, without starting."""
    from .audio import AudioError, check_device
    from .config import check_models
    from .models.prepare import describe_bert, describe_int8, describe_tuning, missing
    from .models.store import ModelStore
    from .mqtt import probe_broker

    config = _load_config(args)
    problems = 0

    def report(ok: bool, what: str, detail: str) -> None:
        nonlocal problems
        problems += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {detail}")

    report(True, "config", str(args.config))
    me = config.identity()
    report(True, "device", f"{me.id} ({me.name}{', area ' + me.area if me.area else ''}): topics "
                           f"{config.mqtt.topic_prefix}/{me.id}/..., MQTT client id {me.client_id}"
                           + (" (as before device.id: set device.id to give this Pi its own)" if me.legacy else ""))
    try:
        check_models(config)
        models, name = Path(config.models.dir), config.voice.name
        derived = config.cache.models_dir  # where the service keeps its copies
        _become_owner_of(derived.parent)
        decoder = config.engine.decoder
        if any(missing(models, derived, what, decoder) for what in ("bert", name)) and not _writable(derived):
            report(True, "models", f"{models}, voice {name}: not prepared yet in {derived}; the service "
                                   "prepares it when it starts (or: hayakoe-pi prepare, as the service's user)")
        else:
            store = ModelStore(models, derived_dir=derived, decoder=decoder)
            voice = store.voice(name)
            report(True, "models", f"{store.dir}, voice {voice.name} ({voice.sample_rate} Hz), "
                                   f"installed: {', '.join(store.voices())}")
            if store.derived:
                report(True, "bert", describe_bert(store.bert.unsigned_int8))
            if voice.tuning:
                report(True, "decoder", f"{describe_tuning(voice.tuning)}, chosen on this CPU"
                       + (f"; engine.decoder {decoder}: {describe_int8(voice.int8)}" if voice.int8 else ""))
    except Exception as e:  # ConfigError, ModelError
        report(False, "models", str(e))
    ok, detail = probe_broker(config)
    report(ok, "mqtt", detail)
    try:
        report(True, "audio", check_device(config.audio.device))
    except AudioError as e:
        report(False, "audio", str(e))
    return 1 if problems else 0


def _writable(folder: Path) -> bool:
    """Whether this user may make files in `folder` (or in the folder it would be made in)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return os.access(folder, os.W_OK | os.X_OK)


def _prepare(args: argparse.Namespace) -> int:
    """Make the derived model files ahead of the first start (install.sh runs it)."""
    from .config import CacheConfig, Config
    from .models.prepare import prepare

    if args.models:
        config, models = Config(), args.models
        derived = CacheConfig(args.cache).models_dir if args.cache else _derived_dir(config, config_given=False)
    else:
        config = _load_config(args)
        models = config.models.dir
        derived = CacheConfig(args.cache).models_dir if args.cache else config.cache.models_dir
    _become_owner_of(derived.parent)
    prepare(models, derived, args.voice or None, report=lambda step: print(step.line(), flush=True),
            decoder=args.decoder or config.engine.decoder)
    return 0


def _say(args: argparse.Namespace) -> int:
    from .ahead import synthesize_ahead
    from .audio import Player, check_device

    config = _load_config(args)
    models = args.models or config.models.dir
    if not Path(models).expanduser().is_dir():
        source = "given with --models" if args.models else f"models.dir in {args.config}" if args.config \
            else "the default: no --config given"
        raise ModelError(f"models directory not found: {models} ({source}); give --models DIR "
                         f"(a HayaKoe-layout folder) or --config FILE (the service's: {DEFAULT_CONFIG})")
    device = args.device or config.audio.device
    check_device(device)  # before synthesis: the same message as `hayakoe-pi check`
    engine = _engine(args, config, models, args.voice or config.voice.name)
    style = args.style or config.voice.style
    speed = args.speed or config.voice.speed
    ahead = synthesize_ahead(engine, " ".join(args.text), style=style, speed=speed,
                             style_weight=config.voice.style_weight)
    # no keep_open_s: the command ends with its sound
    Player(device, lead_in_ms=config.audio.lead_in_ms).play(ahead, engine.sample_rate, config.audio.volume)
    return 0


def _use_dictionary(config: Config, entries=None) -> None:
    """Make OpenJTalk use the config's user dictionary (or `entries`), compiled in a scratch folder."""
    import tempfile

    from .text.dictionary import UserDictionary, activate

    if entries is None:
        words = UserDictionary(Path(config.dictionary.file), config.dictionary.max_entries)
        for problem in words.load():
            print(f"warning: {problem}", file=sys.stderr)
        entries = list(words.entries.values())
    with tempfile.TemporaryDirectory(prefix="hayakoe-pi-dict-") as scratch:
        activate(entries, Path(scratch))


def _dict(args: argparse.Namespace) -> int:
    """The user dictionary of a config: add, remove, list, test."""
    from .text.dictionary import UserDictionary

    config = _load_config(args)
    _become_owner_of(Path(config.dictionary.file).parent)
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
    from .mqtt import forget_device

    ok, detail = forget_device(_load_config(args))
    print(detail, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def _devices(args: argparse.Namespace) -> int:
    from .audio import desktop_sound_server, output_devices, suggested_device

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hayakoe-pi", description="Offline Japanese text to speech.")
    sub = p.add_subparsers(dest="command", required=True)

    fe = sub.add_parser("frontend", help="show how text is read: one JSON object per line")
    fe.add_argument("--models", help="models directory (HayaKoe layout); default: the config's")
    fe.add_argument("--config", help="also read with this config's user dictionary")
    fe.add_argument("text", nargs="*", help="texts; read lines from standard input when none")
    fe.set_defaults(run=_frontend)

    sy = sub.add_parser("synth", help="speak text into a 16-bit WAV file")
    sy.add_argument("--models", required=True, help="models directory (HayaKoe layout)")
    sy.add_argument("--voice", required=True, help="voice folder name, e.g. jvnv-F1-jp")
    sy.add_argument("--speaker", default=None, help="speaker name within the voice")
    sy.add_argument("--style", default="Neutral")
    sy.add_argument("--style-weight", type=float, default=1.0)
    sy.add_argument("--speed", type=float, default=1.0)
    sy.add_argument("-o", "--output", required=True, help="WAV file to write")
    sy.add_argument("--config", default=None, help="config whose cache.dir keeps the derived model files "
                                                    "(as root: the service's)")
    sy.add_argument("text", nargs="+")
    sy.set_defaults(run=_synth)

    for name, func, text in (
        ("run", _run, "run the MQTT daemon"),
        ("check", _check, "check config, models, broker and sound card without starting"),
        ("forget", _forget, "remove the device from Home Assistant and clear its retained MQTT topics "
                            "(after stopping the service)"),
    ):
        c = sub.add_parser(name, help=text)
        c.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
        c.set_defaults(run=func)

    pr = sub.add_parser("prepare", help="make the derived model files (split, optimized copies) "
                                        "once, one model at a time")
    pr.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    pr.add_argument("--models", help="models directory instead of the config's "
                                     "(cache in ~/.cache; as root the service's)")
    pr.add_argument("--cache", help="cache folder (the config's cache.dir; the daemon looks in CACHE/models)")
    pr.add_argument("--voice", action="append", help="only this voice (repeatable; default: all installed)")
    pr.add_argument("--decoder", choices=DECODER_CHOICES, help="int8/auto: the 8-bit decoder too (engine.decoder)")
    pr.set_defaults(run=_prepare)

    sa = sub.add_parser("say", help="speak text on the sound card now, without MQTT")
    sa.add_argument("--config", default=None, help="config file for models, voice and audio settings")
    sa.add_argument("--models", help="models directory (overrides the config)")
    sa.add_argument("--voice")
    sa.add_argument("--style")
    sa.add_argument("--speed", type=float)
    sa.add_argument("--device", help="output device name or index")
    sa.add_argument("text", nargs="+")
    sa.set_defaults(run=_say)

    dc = sub.add_parser("dict", help="the user dictionary: words read the way the household says them")
    dc.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    dsub = dc.add_subparsers(dest="action", required=True)
    da = dsub.add_parser("add", help="add or replace a word: SURFACE READING ACCENT")
    da.add_argument("surface", help="as written, e.g. 晴翔")
    da.add_argument("reading", help="in katakana, e.g. ハルト")
    da.add_argument("accent", type=int, help="0: flat; n: the pitch drops after the n-th mora")
    da.add_argument("--kind", help="proper (default), person, place, organization, noun")
    da.add_argument("--priority", type=int, help="0-10 (default 5): how strongly it wins over OpenJTalk's words")
    dr = dsub.add_parser("remove", help="remove a word")
    dr.add_argument("surface")
    dsub.add_parser("list", help="the words, one per line: surface, reading, accent, kind, priority")
    dt = dsub.add_parser("test", help="show how texts are read with the dictionary (as frontend does)")
    dt.add_argument("--models", help="models directory (default: the config's)")
    dt.add_argument("text", nargs="*")
    dc.set_defaults(run=_dict)

    dv = sub.add_parser("devices", help="list audio output devices, the one to use marked *")
    dv.add_argument("--suggest", action="store_true",
                    help="print only the device to set as audio.device (none: exit 1)")
    dv.set_defaults(run=_devices)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .text import TextError

    from .audio import AudioError
    from .config import ConfigError

    try:
        return args.run(args)
    except (ConfigError, ModelError, TextError, AudioError, ValueError, OSError) as e:
        print(f"hayakoe-pi: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
