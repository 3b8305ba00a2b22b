"""The quick loop (`pytest --quick`): a test that plays into the real-time card, restarts the broker or
prepares models is left out, found by what it uses (tests/slow_kinds.py) or marked by hand; the rest
run. pytest collects in a child, as `tools/run-tests --quick` would."""

import os
import subprocess
import sys

import pytest

from conftest import REPO

TESTS = REPO / "tests"

# One test of each way to reach a slow thing, and tests that reach none.
EXAMPLES = '''
import pytest

from harness import AlsaSink, appliance, prepare_with_two_lanes, settle
from slow_kinds import PREPARES_MODELS, slow


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with appliance(tmp_path_factory.mktemp("app")) as app:
        yield app


@pytest.fixture
def on_app(app):
    return app


@pytest.fixture
@slow(PREPARES_MODELS)
def installed(tmp_path):
    return tmp_path


def speak(work):
    with appliance(work) as app:
        settle(app)


class Room:
    def __init__(self, work):
        self.sink = AlsaSink(work)


def test_plain():
    assert settle


def test_unpaced_card(tmp_path):
    with appliance(tmp_path, sink_kwargs={"paced": False}):
        AlsaSink(tmp_path / "second", paced=False)


def test_through_a_fixture(app):
    pass


def test_through_a_fixture_of_a_fixture(on_app):
    pass


def test_in_its_body(tmp_path):
    AlsaSink(tmp_path)


def test_through_a_function(tmp_path):
    speak(tmp_path)


def test_through_a_class(tmp_path):
    Room(tmp_path)


def test_imported_inside(tmp_path):
    from harness import AlsaSink as Card

    Card(tmp_path)


def test_in_a_nested_function(tmp_path):
    def card():
        return AlsaSink(tmp_path)

    card()


def test_two_lanes(tmp_path):
    prepare_with_two_lanes(tmp_path)


def test_installed(installed):
    pass


@pytest.mark.broker_restart
def test_marked_by_hand():
    pass
'''

CARD = {"test_through_a_fixture", "test_through_a_fixture_of_a_fixture", "test_in_its_body",
        "test_through_a_function", "test_through_a_class", "test_imported_inside", "test_in_a_nested_function"}
PREPARES = {"test_two_lanes", "test_installed"}
QUICK = {"test_plain", "test_unpaced_card"}

# Says which tests --quick kept and which it left out, with their markers.
REPORT = """
def pytest_deselected(items):
    for item in items:
        print("LEFT", item.nodeid, *sorted(mark.name for mark in item.iter_markers()))


def pytest_collection_finish(session):
    for item in session.items:
        print("KEPT", item.nodeid, *sorted(mark.name for mark in item.iter_markers()))
"""


def quick(tmp_path, *args) -> dict[str, tuple[bool, set[str]]]:
    """{node id: (kept by --quick, its markers)} of the tests pytest collects with `args`."""
    (tmp_path / "report_quick.py").write_text(REPORT)
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-s", "-p", "no:cacheprovider",
                        "-p", "report_quick", "--quick", *args],
                       capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, "PYTHONPATH": f"{tmp_path}:{TESTS}"})
    assert r.returncode == 0, r.stdout + r.stderr
    found = {}
    for line in r.stdout.splitlines():
        if line.startswith(("KEPT ", "LEFT ")):
            verdict, nodeid, *marks = line.split(" ")
            found[nodeid] = (verdict == "KEPT", set(marks))
    return found


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    folder = tmp_path_factory.mktemp("examples")
    (folder / "test_examples.py").write_text(EXAMPLES)
    # the tests' conftest loaded as a plugin (the examples lie outside tests/), the markers as registered
    found = quick(folder, "-p", "conftest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(folder),
                  str(folder / "test_examples.py"))
    return {nodeid.split("::")[-1]: verdict for nodeid, verdict in found.items()}


def test_the_quick_loop_leaves_out_what_reaches_a_slow_helper_or_fixture(examples):
    assert set(examples) == QUICK | CARD | PREPARES | {"test_marked_by_hand"}
    assert {name for name, (kept, _) in examples.items() if kept} == QUICK


def test_each_kind_is_its_marker(examples):
    def marked(kind):
        return {name for name, (_, marks) in examples.items() if kind in marks}

    assert marked("realtime_card") == CARD
    assert marked("prepares_models") == PREPARES
    assert marked("broker_restart") == {"test_marked_by_hand"}


def test_the_suites_slow_tests_are_left_out_and_its_unit_tests_kept(tmp_path):
    found = quick(tmp_path, "tests/test_daemon.py", "tests/test_broker_faults.py", "tests/test_prepare.py",
                  "tests/test_cache.py")
    assert found["tests/test_daemon.py::test_missing_config_file"] == (True, set())
    assert found["tests/test_cache.py::test_round_trip_and_private_files"] == (True, set())
    assert found["tests/test_daemon.py::test_speaks_a_plain_text_message"] == (False, {"realtime_card"})  # `app`
    for by_hand in ("tests/test_broker_faults.py", "tests/test_prepare.py"):
        tests = [verdict for nodeid, verdict in found.items() if nodeid.startswith(by_hand)]
        assert tests and not any(kept for kept, _ in tests), by_hand
