import os
import shutil
from pathlib import Path

import tempfile

import pytest

from slow_kinds import KINDS, PREPARES_MODELS, Finder, slow

# Split and optimized model copies go to a scratch cache, not the user's ~/.cache,
# removed when the run ends.
if "XDG_CACHE_HOME" not in os.environ:
    os.environ["XDG_CACHE_HOME"] = SCRATCH_CACHE = tempfile.mkdtemp(prefix="hayakoe-pi-test-cache-")
else:
    SCRATCH_CACHE = None


# The host's own ALSA setup (a desktop's PipeWire) must not change what the
# tests see; tests of that detection point HAYAKOE_ALSA_CONFIG at their files.
os.environ["HAYAKOE_ALSA_CONFIG"] = ""
# Nor the machine's own service config: without --config, commands run as root would read
# /etc/hayakoe-pi/config.yaml where hayakoe-pi is installed; they find none here.
os.environ["HAYAKOE_PI_CONFIG"] = "/nonexistent/hayakoe-pi-tests/config.yaml"


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true",
                     help="leave out the slow kinds of test (tests/slow_kinds.py: " + ", ".join(KINDS) + ")")


@pytest.hookimpl(tryfirst=True)  # marked before -m selects
def pytest_collection_modifyitems(config, items):
    finder = Finder(items)
    slow = []
    for item in items:
        kinds = finder.kinds_of_test(item)
        for kind in sorted(kinds):
            item.add_marker(kind)
        if kinds:
            slow.append(item)
    if config.getoption("quick") and slow:
        config.hook.pytest_deselected(items=slow)
        left_out = set(map(id, slow))
        items[:] = [item for item in items if id(item) not in left_out]


def pytest_sessionfinish(session, exitstatus):
    if SCRATCH_CACHE:
        shutil.rmtree(SCRATCH_CACHE, ignore_errors=True)


REPO = Path(__file__).resolve().parents[1]
FIXTURE_MODELS = REPO / "tests" / "fixtures" / "models" / "tiny"
# HayaKoe's own outputs on its reference models; present beside the repo on
# the team's machines, absent in a fresh clone (those tests then skip).
SHARED = Path(os.environ.get("HAYAKOE_PI_SHARED", REPO.parent / "shared"))
REF_MODELS = SHARED / "models" / "ref-tiny"
GOLDEN = SHARED / "golden"

needs_shared = pytest.mark.skipif(not GOLDEN.is_dir(), reason="../shared (HayaKoe reference outputs) not present")


@pytest.fixture(scope="session")
def store():
    from hayakoe_pi.models.store import ModelStore

    return ModelStore(FIXTURE_MODELS)


@pytest.fixture
@slow(PREPARES_MODELS)  # derived files are kept by the model's path: a copy is prepared anew
def models_copy(tmp_path):
    """A private copy of the fixture models that a test may damage."""
    dst = tmp_path / "models"
    shutil.copytree(FIXTURE_MODELS, dst)
    return dst
