"""The import contract: one name (`oncemesh`), arrows one way, no cycles.

The repository's folders are packages of `oncemesh` (pyproject's package-dir). Inside them:
- imports of our own code are relative (a bare `import router` would load a second copy of the module
  under another name when the checkout is on sys.path; the hot path compares enum members by identity);
- no two files import each other, directly or through others (imports under `if TYPE_CHECKING:`
  execute nothing and are not arrows at run time; but a reader, and `farm-studio look`, sees them, so
  they may not close a circle either: a file that needs another's type for its annotations names a
  `Protocol` declared below both);
- packages import only the layers below them (LAYERS).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"]
BARE = {d.split("/")[0] for d in PACKAGE_DIRS.values()}

# package -> the packages it may import (besides itself). The top composes; the bottom imports nothing.
LAYERS: dict[str, set[str]] = {
    "oncemesh.common": set(),
    "oncemesh.router": {"oncemesh.common"},
    "oncemesh.topology": {"oncemesh.common", "oncemesh.router"},
    "oncemesh.interrouter": {"oncemesh.common", "oncemesh.router", "oncemesh.topology"},
    "oncemesh.clients": {"oncemesh.common"},
    "oncemesh.spark": {"oncemesh.common"},
    "oncemesh.harness": {"oncemesh.common", "oncemesh.router", "oncemesh.topology", "oncemesh.interrouter",
                         "oncemesh.clients", "oncemesh.spark"},
    "oncemesh": {"oncemesh.common", "oncemesh.router", "oncemesh.topology", "oncemesh.interrouter",
                 "oncemesh.clients", "oncemesh.spark", "oncemesh.harness"},
}


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    out: dict[str, Path] = {}
    for pkg, folder in PACKAGE_DIRS.items():
        base = ROOT / folder
        for f in base.rglob("*.py"):
            rel = f.relative_to(base)
            parts = [*rel.parts[:-1]] + ([] if f.name == "__init__.py" else [f.stem])
            out[".".join([pkg, *parts])] = f
    return out


MODULES = modules()


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(name: str, path: Path, types: bool = False) -> list[tuple[int, str, bool]]:
    """(line, imported module, written bare) for each runtime import of our own code in a module
    (`types`: those under `if TYPE_CHECKING:` too)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip: set[int] = set()
    for node in ast.walk(tree):
        if not types and isinstance(node, ast.If) and _type_checking(node):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    out: list[tuple[int, str, bool]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top in BARE or top == "oncemesh":
                    out.append((node.lineno, a.name, top in BARE))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
                top = mod.split(".")[0]
                if top not in BARE and top != "oncemesh":
                    continue
                if top in BARE:
                    out.append((node.lineno, mod, True))
                    continue
            for a in node.names:  # `from . import x` imports the module x when there is one
                sub = f"{mod}.{a.name}"
                out.append((node.lineno, sub if sub in MODULES else mod, False))
    return out


def graph(types: bool = False) -> nx.DiGraph:
    g = nx.DiGraph()
    for name, path in MODULES.items():
        g.add_node(name)
        for _, target, bare in imports(name, path, types):
            if not bare and target in MODULES and target != name:
                g.add_edge(name, target)
    return g


def package_of(module: str) -> str:
    return max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)


def test_the_package_has_every_folder_and_the_facade() -> None:
    assert "oncemesh" in MODULES and "oncemesh.router.core" in MODULES and "oncemesh.common.engine" in MODULES
    assert set(PACKAGE_DIRS) <= set(LAYERS), "a package without a layer: add it to LAYERS"


def test_no_bare_folder_names_inside_the_package() -> None:
    bad = [f"{MODULES[n].relative_to(ROOT)}:{line}: {target}" for n in MODULES
           for line, target, bare in imports(n, MODULES[n]) if bare]
    assert not bad, "import these relatively (or as oncemesh.*):\n" + "\n".join(bad)


def test_no_import_cycles_between_files() -> None:
    cycles = list(nx.simple_cycles(graph()))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join([*c, c[0]]) for c in cycles)


def test_no_circles_between_files_even_through_imports_for_types() -> None:
    circles = [sorted(c) for c in nx.strongly_connected_components(graph(types=True))
               if len(c) > 1]
    assert not circles, "files that import each other (counting imports under TYPE_CHECKING): declare what " \
        "the lower one needs as a Protocol below both:\n" + "\n".join(", ".join(c) for c in circles)


def test_packages_import_only_the_layers_below() -> None:
    bad = sorted({f"{a} -> {b}" for a, b in graph().edges
                  if package_of(a) != package_of(b) and package_of(b) not in LAYERS[package_of(a)]})
    assert not bad, "arrows against the layers:\n" + "\n".join(bad)


def test_the_checker_sees_a_bare_import_and_a_cycle(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("import router.core\nfrom clients import runtime\nfrom ..router import core\n")
    got = imports("oncemesh.interrouter.m", f)
    assert [(t, b) for _, t, b in got] == [("router.core", True), ("clients", True),
                                            ("oncemesh.router.core", False)]
    g = tmp_path / "g.py"
    g.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..router import core\n")
    assert imports("oncemesh.interrouter.g", g) == []
    assert imports("oncemesh.interrouter.g", g, types=True) == [(3, "oncemesh.router.core", False)]


@pytest.mark.parametrize("module", ["oncemesh.router.core", "oncemesh.interrouter.node"])
def test_relative_imports_resolve_to_real_modules(module: str) -> None:
    targets = {t for _, t, _ in imports(module, MODULES[module])}
    assert targets and all(t in MODULES or t in PACKAGE_DIRS for t in targets), targets
