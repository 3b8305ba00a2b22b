"""`hayakoe-pi check`: the daemon's start-up checks, the broker and the sound card, without starting."""

from __future__ import annotations

import argparse
from pathlib import Path

from .args import config_path
from .context import become_owner_of, command_config
from ..settings.config import Config
from ..door.diskspace import service_folders, space_of


def check(args: argparse.Namespace) -> int:
    from ..sound.player import AudioError, check_device
    from ..settings.config import check_models
    from ..models.prepare import damaged, describe_bert, describe_int8, describe_tuning, stages
    from ..models.checksums import damage
    from ..models.store import ModelStore
    from ..broker.link import probe_broker

    config = command_config(args)
    problems = 0

    def report(ok: bool, what: str, detail: str) -> None:
        nonlocal problems
        problems += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {detail}")

    report(True, "config", str(config_path(args)))
    me = config.identity()
    report(True, "device", f"{me.id} ({me.name}{', area ' + me.area if me.area else ''}): topics "
                           f"{config.mqtt.topic_prefix}/{me.id}/..., MQTT client id {me.client_id}"
                           + (" (as before device.id: set device.id to give this Pi its own)" if me.legacy else ""))
    try:
        check_models(config)
        models, name = Path(config.models.dir), config.voice.name
        derived = config.cache.models_dir  # where the service keeps its copies
        become_owner_of(derived.parent)
        decoder = config.engine.decoder
        # every byte (the quick check of each start would miss a block garbled in place)
        harm = [(copy, why) for what in ("bert", name) for copy, why in damaged(models, derived, what, full=True)]
        plan = [stage for what in ("bert", name) for stage in stages(models, derived, what, decoder)]
        for copy, why in harm:  # never made again here: the service may be using it
            fix = ("the service makes it again at its next start, or now: hayakoe-pi prepare" if damage(copy)
                   else "hayakoe-pi prepare makes it again (the service's quick check at each start does not "
                        "see this), then restart the service")
            report(False, "models", f"prepared file {why}; {fix} (as the service's user)")
        if not harm and not all(stage.done for stage in plan):  # never prepared here: the service may be at it
            report(True, "models", f"{models}, voice {name}: not prepared yet in {derived}; the service "
                                   "prepares it when it starts, each step in its journal (or: hayakoe-pi "
                                   "prepare, as the service's user)")
            for stage in plan:
                report(True, "prepare", f"{'done' if stage.done else 'to do'}: {stage.name()}")
        elif not harm:
            store = ModelStore(models, derived_dir=derived, decoder=decoder, repair=False)
            voice = store.voice(name)
            report(True, "models", f"{store.dir}, voice {voice.name} ({voice.sample_rate} Hz), "
                                   f"installed: {', '.join(store.voices())}")
            if store.derived:
                report(True, "bert", describe_bert(store.bert.unsigned_int8))
            if voice.tuning:
                report(True, "decoder", f"{describe_tuning(voice.tuning)}, chosen on this CPU")
            if voice.int8:  # engine.decoder int8 or auto: what the gate decided, and its figures
                report(True, "decoder", f"engine.decoder {decoder}: {describe_int8(voice.int8)}")
    except Exception as e:  # ConfigError, ModelError
        report(False, "models", str(e))
    for line in settings_in_effect(config, config_path(args)):
        report(True, "setting", line)
    for folder in service_folders(config.cache.dir, config.state.file):
        try:
            space = space_of(folder)
        except OSError as e:
            report(False, "disk", f"{folder}: {e.strerror or e}")
            continue
        # low is a warning, not a failure: the service runs, its phrase cache stops storing once full
        print(f"{'warn' if space.low else 'ok  '} disk: {space.line()}")
    ok, detail = probe_broker(config)
    report(ok, "mqtt", detail)
    try:
        report(True, "audio", check_device(config.audio.device))
    except AudioError as e:
        report(False, "audio", str(e))
    return 1 if problems else 0


def settings_in_effect(config: Config, config_file: str | None) -> list[str]:
    """Each setting Home Assistant can change, as the daemon would start with it, and where it
    comes from (runtime.py's rule); the state files are read, never written."""
    from ..settings.announcements import AnnouncementSettings
    from ..settings.config import voice_styles
    from ..models.voices import installed_voices
    from ..settings.runtime import config_changed_at
    from ..speech.service import SavedSelection, settle_selection

    state, changed_at = Path(config.state.file), config_changed_at(config_file)
    become_owner_of(state.parent)  # the service's folder (0700)
    voice = config.voice
    selection = SavedSelection(state, config.audio.volume, voice.name, voice.style, changed_at, read_only=True)
    models = Path(config.models.dir).expanduser()
    settle_selection(selection, installed_voices(models), lambda name: voice_styles(models, name), voice.name,
                     voice.style)
    announcements = AnnouncementSettings(state.with_name("announcements.json"), config.audio.chime,
                                         config.audio.quiet(), changed_at, read_only=True)
    return [setting.line(owner.changes.shown(setting.name))
            for owner in (selection, announcements) for setting in owner.settings()]
