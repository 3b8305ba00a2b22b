"""What a command works with: its config, and whose files (`sudo hayakoe-pi ...` works on the
service's files as the service's user, never as root)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .args import config_path
from ..settings.config import Config, load_config


def command_config(args: argparse.Namespace) -> Config:
    """The command's config (args.config_path), read and checked; logging set to its level."""
    config = load_config(config_path(args))
    logging.basicConfig(level=config.log.level.upper(),
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return config


def as_service() -> bool:
    """Root without a cache of its own chosen (sudo clears XDG_CACHE_HOME): `sudo hayakoe-pi ...`
    works on the service's files and leaves nothing in /root/.cache."""
    return os.geteuid() == 0 and "XDG_CACHE_HOME" not in os.environ


def derived_dir(config: Config, config_given: bool) -> Path:
    """Where the CLI finds (and makes) the derived model files: the service's
    (`cache.dir`/models) when it reads a config file or runs as root (as_service), else the
    user's ~/.cache/hayakoe-pi/models."""
    from ..models.store import default_derived_dir

    if config_given or as_service():
        return config.cache.models_dir
    return default_derived_dir()


def become_owner_of(folder: Path) -> None:
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


def engine(args: argparse.Namespace, config: Config, models: str | Path, voice: str, speaker=None):
    """An engine on `models`, its derived files where the service keeps them (as that service's user)."""
    from ..synthesis.engine import Engine
    from ..models.store import ModelStore

    derived = derived_dir(config, config_path(args) is not None)
    become_owner_of(derived.parent)
    store = ModelStore(models, derived_dir=derived, decoder=config.engine.decoder)
    return Engine(models, voice=voice, speaker=speaker, store=store)
