"""The code's layout: no import circles in hayakoe_pi/ or bench/, and no module in
hayakoe_pi/ over 400 lines. Imports are read from the source (ast), also those made
inside functions: a late import hides a circle from Python, not from a reader."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_LINES = 400


def modules(root: Path, package: str | None) -> dict[str, Path]:
    """Module name → file, for every .py under `root`: `package`'s modules, or (None)
    scripts that import each other by file name, as bench/'s do."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(([package] if package else []) + parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that the module `name` (its file `path`) imports."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()

    def add(module: str) -> None:
        while module and module not in known:  # `import a.b.c` reads a.b.c, or the package holding it
            module = module.rpartition(".")[0]
        if module:
            found.add(module)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:  # `from . import forms` imports the module forms
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    found.discard(name)
    return found


def circles(known: dict[str, Path]) -> list[list[str]]:
    """Each import circle among `known`, as the path round it (a module's first
    import that leads back to it)."""
    graph = {name: sorted(imported(name, path, known)) for name, path in known.items()}
    found, done = [], set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            found.append(trail[trail.index(name):] + [name])
            return
        if name in done:
            return
        for other in graph[name]:
            visit(other, trail + [name])
        done.add(name)

    for name in graph:
        visit(name, [])
    return found


def test_no_import_circles_in_the_package_or_the_benchmarks():
    known = {**modules(REPO / "hayakoe_pi", "hayakoe_pi"), **modules(REPO / "bench", None)}
    assert "hayakoe_pi.models.store" in known and "run" in known
    assert "hayakoe_pi.models.prepare" in imported("hayakoe_pi.models.store", known["hayakoe_pi.models.store"], known)
    assert circles(known) == []


def test_no_module_in_the_package_is_over_400_lines():
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines())
               for name, path in modules(REPO / "hayakoe_pi", "hayakoe_pi").items()}
    assert len(lengths) > 20
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def test_a_circle_is_found_through_a_late_or_relative_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "top.py").write_text("from .sub import low\n")
    (package / "sub" / "low.py").write_text("def f():\n    from .. import top\n")  # inside a function
    (package / "alone.py").write_text("import pkg.sub.low\n")
    known = modules(package, "pkg")
    assert imported("pkg.alone", known["pkg.alone"], known) == {"pkg.sub.low"}
    assert circles(known) == [["pkg.sub.low", "pkg.top", "pkg.sub.low"]]


def test_the_model_side_table_lists_each_module_above_those_it_imports():
    """ARCHITECTURE.md's table of models/ is an order a reader can follow: every module
    there, each importing only modules listed below it."""
    known = modules(REPO / "hayakoe_pi", "hayakoe_pi")
    table = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8").split("## The model side")[1].split("\n\n")[2]
    order = [f"hayakoe_pi.models.{name}" for name in re.findall(r"^\| `(\w+)\.py` \|", table, re.M)]
    assert sorted(order) == sorted(name for name in known if name.startswith("hayakoe_pi.models."))
    above = {name: set(order[:i]) for i, name in enumerate(order)}
    assert {name: sorted(imported(name, known[name], known) & above[name]) for name in order
            if imported(name, known[name], known) & above[name]} == {}
