"""The kinds of test the quick loop (`pytest --quick`) leaves out, and how a test is found to be one.

A harness helper or a fixture that starts such a thing is tagged with `slow(kind)`; a test is
of that kind when it reaches a tagged one: through its fixtures, or calling it, from its body
or from a function or class of the tests it calls (read from their source, as test_imports
reads imports). So a new test that plays into the real-time card is marked without anyone
remembering. A test that does the slow thing another way carries the marker itself
(`@pytest.mark.broker_restart`), as do the soak tests. The markers are registered, with what
each means, in pyproject.toml."""

from __future__ import annotations

import ast
import inspect
import sys
import types
from pathlib import Path

REALTIME_CARD = "realtime_card"
BROKER_RESTART = "broker_restart"
PREPARES_MODELS = "prepares_models"
SOAK = "soak"  # marked by hand only
KINDS = (REALTIME_CARD, BROKER_RESTART, PREPARES_MODELS, SOAK)

TESTS = Path(__file__).resolve().parent


def slow(kind: str):
    """Tag a harness helper or a fixture (under @pytest.fixture): a test that reaches it is of `kind`."""
    assert kind in KINDS, kind

    def tag(helper):
        helper.slow_kind = kind
        return helper

    return tag


def _is_false(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _unpaced(call: ast.Call) -> bool:
    """`AlsaSink(paced=False)`, `appliance(sink_kwargs={"paced": False})`: the card takes the audio
    as fast as it comes, so the test waits on no real-time schedule."""
    for keyword in call.keywords:
        if keyword.arg == "paced" and _is_false(keyword.value):
            return True
        if isinstance(keyword.value, ast.Dict):
            for key, value in zip(keyword.value.keys, keyword.value.values):
                if isinstance(key, ast.Constant) and key.value == "paced" and _is_false(value):
                    return True
    return False


def _definitions(tree: ast.Module) -> dict[str, ast.AST]:
    """A module's functions and classes, and the methods of its classes, by qualified name."""
    found = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[prefix + child.name] = child
                if isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return found


def _local_import(node: ast.ImportFrom) -> dict:
    """What an import inside a function names (`from harness import AlsaSink`), from a module loaded."""
    module = sys.modules.get(node.module) if node.level == 0 else None
    return {alias.asname or alias.name: getattr(module, alias.name, None) for alias in node.names} if module else {}


def _callee(func: ast.expr, names: dict):
    if isinstance(func, ast.Name):
        return names.get(func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        module = names.get(func.value.id)
        if isinstance(module, types.ModuleType):
            return getattr(module, func.attr, None)
    return None


class Finder:
    """What kinds each function or class of the tests reaches, each read once. The tests are
    what is defined in the folders of the test files collected, and in tests/ (the harness)."""

    def __init__(self, items):
        self._folders = {TESTS} | {folder.resolve() for folder in {item.path.parent for item in items}}
        self._kinds: dict[object, frozenset[str]] = {}
        self._files: dict[str, dict[str, ast.AST]] = {}  # each file parsed once

    def _source_of(self, thing) -> tuple[ast.AST, dict] | None:
        """The syntax tree of a function or class of the tests, and the names its module holds."""
        thing = inspect.unwrap(thing)
        thing = getattr(getattr(thing, "hypothesis", None), "inner_test", None) or thing  # @given's test
        module = sys.modules.get(getattr(thing, "__module__", None))
        file = getattr(getattr(thing, "__code__", None), "co_filename", None) or getattr(module, "__file__", None)
        if not file:
            return None
        if file not in self._files:  # nothing read outside the tests' folders
            of_tests = Path(file).resolve().parent in self._folders
            self._files[file] = _definitions(ast.parse(Path(file).read_text(), file)) if of_tests else {}
        node = self._files[file].get(getattr(thing, "__qualname__", ""))
        return (node, vars(module) if module else {}) if node else None

    def kinds(self, thing) -> frozenset[str]:
        if getattr(thing, "slow_kind", None):
            return frozenset({thing.slow_kind})
        try:
            if thing in self._kinds:
                return self._kinds[thing]
        except TypeError:  # unhashable: nothing of the tests
            return frozenset()
        self._kinds[thing] = frozenset()  # a function calling itself, or two each other
        found = set()
        source = self._source_of(thing)
        if source:
            tree, names = source
            calls = []
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    names = {**names, **_local_import(node)}
                elif isinstance(node, ast.Call):
                    calls.append(node)
            for node in calls:
                callee = _callee(node.func, names)
                if callee is None or not (inspect.isfunction(callee) or inspect.isclass(callee)):
                    continue
                kinds = self.kinds(callee)
                if REALTIME_CARD in kinds and getattr(callee, "slow_kind", None) and _unpaced(node):
                    kinds = kinds - {REALTIME_CARD}
                found |= kinds
        self._kinds[thing] = frozenset(found)
        return self._kinds[thing]

    def kinds_of_test(self, item) -> set[str]:
        """The kinds a collected test is of: its markers, and what it and its fixtures reach."""
        found = {mark.name for mark in item.iter_markers() if mark.name in KINDS}
        found |= self.kinds(item.obj)
        for name in item.fixturenames:
            for fixture in item._fixtureinfo.name2fixturedefs.get(name, ()):
                found |= self.kinds(fixture.func)
        return found
