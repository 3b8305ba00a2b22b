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


def architecture_tables() -> tuple[list[tuple[str, set[str]]], dict[str, list[tuple[str, set[str]]]]]:
    """ARCHITECTURE.md's table of packages (top to bottom: each package and the packages it
    imports), and the table of each package, under its heading "### `name/`": its modules,
    top to bottom, each with the packages it imports."""
    text = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")

    def rows(section: str, cell: str) -> list[tuple[str, set[str]]]:
        return [(name, set(re.findall(r"`(\w+)/`", imports)))
                for name, imports in re.findall(rf"^\| `({cell})` \|.*\| ([^|]*) \|$", section, re.M)]

    packages = rows(re.search(r"^## Packages\n(.*?)(?=^#)", text, re.M | re.S).group(1), r"\w+/")
    tables = {name: rows(section, r"\w+\.py")
              for name, section in re.findall(r"^### `(\w+)/`[^\n]*\n(.*?)(?=^#)", text, re.M | re.S)}
    return [(name.rstrip("/"), imports) for name, imports in packages], tables


def package_of(name: str, known: dict[str, Path]) -> str | None:
    """The package holding the module `name` (hayakoe_pi.door.daemon → door), None for one of
    the root's modules."""
    parts = name.split(".")
    folder = ".".join(parts[:2])
    return parts[1] if len(parts) > 1 and folder in known and known[folder].name == "__init__.py" else None


def wrong_way(known: dict[str, Path], order: list[str]) -> dict[str, list[str]]:
    """Each module's imports that run the wrong way. A package's module may import its own
    package, the packages below it in `order` and the root's shared modules; those import no
    package. The top package itself (its __init__.py: `__version__`, the API's `Engine`) is
    above them all: a module may read the version from it."""
    found = {}
    for name, path in known.items():
        top = name.split(".")[0]
        if name == top:
            continue
        own = package_of(name, known)
        allowed = set(order[order.index(own):]) if own else set()
        wrong = sorted(other for other in imported(name, path, known) - {top}
                       if package_of(other, known) not in allowed | {None})
        if wrong:
            found[name] = wrong
    return found


def test_imports_run_down_the_table_of_packages():
    known = modules(REPO / "hayakoe_pi", "hayakoe_pi")
    packages, _ = architecture_tables()
    order = [name for name, _ in packages]
    assert sorted(order) == sorted(path.parent.name for path in (REPO / "hayakoe_pi").glob("*/__init__.py"))
    assert wrong_way(known, order) == {}
    # its column of imports: what the package's modules import of the other packages
    imports = {name: {package_of(other, known) for module in known if package_of(module, known) == name
                      for other in imported(module, known[module], known)} - {name, None}
               for name in order}
    assert {name: sorted(listed) for name, listed in packages} == {name: sorted(imports[name]) for name in order}


def test_an_import_up_the_table_or_from_the_root_to_a_package_runs_the_wrong_way(tmp_path):
    package = tmp_path / "pkg"
    for folder in ("high", "low"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from .high import a\n")
    (package / "shared.py").write_text("")
    (package / "high" / "a.py").write_text("from ..low import b\nfrom .. import shared, __version__\n")
    (package / "low" / "b.py").write_text("def f():\n    from ..high import a\n")
    (package / "low" / "c.py").write_text("from . import b\nfrom .. import shared\n")
    (package / "helper.py").write_text("from .low import c\n")
    known = modules(package, "pkg")
    assert wrong_way(known, ["high", "low"]) == {"pkg.low.b": ["pkg.high.a"], "pkg.helper": ["pkg.low.c"]}
    assert wrong_way(known, ["low", "high"]) == {"pkg.high.a": ["pkg.low.b"], "pkg.helper": ["pkg.low.c"]}


def test_each_package_table_lists_its_modules_each_above_those_it_imports():
    """ARCHITECTURE.md's table of each package is an order a reader can follow: every module
    there, each importing only modules of its package listed below it, and naming the
    other packages it imports."""
    known = modules(REPO / "hayakoe_pi", "hayakoe_pi")
    packages, tables = architecture_tables()
    assert sorted(tables) == sorted(name for name, _ in packages)
    for package, rows in tables.items():
        order = [f"hayakoe_pi.{package}.{name.removesuffix('.py')}" for name, _ in rows]
        assert sorted(order) == sorted(name for name in known if name.startswith(f"hayakoe_pi.{package}.")), package
        above = {name: set(order[:i]) for i, name in enumerate(order)}
        assert {name: sorted(imported(name, known[name], known) & above[name]) for name in order
                if imported(name, known[name], known) & above[name]} == {}, package
        listed = {name: sorted(packages_named) for name, (_, packages_named) in zip(order, rows)}
        assert listed == {name: sorted({package_of(other, known) for other in imported(name, known[name], known)}
                                       - {package, None}) for name in order}, package
