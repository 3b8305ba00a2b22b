import os
import shutil
from pathlib import Path

import tempfile

import pytest

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
def models_copy(tmp_path):
    """A private copy of the fixture models that a test may damage."""
    dst = tmp_path / "models"
    shutil.copytree(FIXTURE_MODELS, dst)
    return dst
