"""The delivery core's parts own their state (docs/architecture.md, "Who owns what in the delivery
core"): what a part alone keeps is written in its module only, and no part imports the core's module
(each sees the core through a Protocol of its own). Read from the source (AST), like
test_record_owner.py does for the records, so that a write by hand elsewhere fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.test_record_owner import _targets  # (what an assignment or `del` writes)

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("router", "interrouter", "common")

# module -> the attributes only it writes (its part's state)
OWNED = {
    "router/handing.py": {"chain", "arrivals", "awaited"},
    "router/meshside.py": {"held_for", "driven_elsewhere", "stats_final_ignored"},
    "router/sweeps.py": {"orphans_swept", "ph_queried"},
}
# the parts, the order policies and the drain: none imports router/core.py, not even to type-check
NOT_IMPORTING_CORE = ("router/handing.py", "router/meshside.py", "router/sweeps.py", "router/identity.py",
                      "router/records.py", "router/drain.py", "router/order")
MUTATORS = {"pop", "popitem", "clear", "update", "setdefault", "append", "extend", "remove", "discard", "add",
            "__setitem__", "__delitem__"}


def writes_of(source: str, attrs: set[str]) -> list[tuple[int, str]]:
    """(line, attribute) of each write of `<x>.<attr>`, of an item of it, or a mutating call on it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for t in _targets(node):
            if isinstance(t, ast.Subscript):
                t = t.value  # (the container written)
            if isinstance(t, ast.Attribute) and t.attr in attrs:
                found.append((t.lineno, t.attr))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr in attrs:
            found.append((node.lineno, node.func.value.attr))
    return sorted(found)


def _files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py"))


def test_a_parts_state_is_written_in_its_module_only() -> None:
    found = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        others = set().union(*(attrs for owner, attrs in OWNED.items() if owner != rel))
        found += [f"{rel}:{line} writes .{attr}" for line, attr in writes_of(path.read_text(), others)]
    assert found == [], "a part's state written outside its module (ask the part):\n" + "\n".join(found)


def test_no_part_imports_the_core() -> None:
    found = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(NOT_IMPORTING_CORE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module is not None \
                    and node.module.split(".")[-1] == "core" and node.level > 0:
                found.append(f"{rel}:{node.lineno}")
    assert found == [], f"parts that import router/core.py (declare a Protocol instead): {found}"


@pytest.mark.parametrize("write", [
    "self.held_for[gid] = {}", "del core.awaited[gid]", "self.chain.pop(plid)", "core.arrivals += 1",
    "self.meshside.driven_elsewhere.clear()", "self.ph_queried.setdefault(g, 0.0)", "x.orphans_swept = 1.0",
])
def test_the_scan_finds_a_write(write: str) -> None:
    assert writes_of(f"def f():\n    {write}\n", set().union(*OWNED.values())) != []


@pytest.mark.parametrize("fine", ["n = len(self.awaited)", "x = self.held_for.get(g)", "if g in self.chain: pass"])
def test_the_scan_leaves_reads_alone(fine: str) -> None:
    assert writes_of(f"def f():\n    {fine}\n", set().union(*OWNED.values())) == []
