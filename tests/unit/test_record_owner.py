"""One owner for the delivery records' state (router/records.py): no module of the product but the
owner writes a record's per-subscription states (`<x>.owed[...]`), `pending`, the fields the core's
counts follow from (`origin`, `outcome`, `payload`), the record dict, or the counts themselves
(`undecided`, `inflight_bytes`, `destination_records`). Read from the source (AST), so that a write
by hand anywhere fails here, not in a simulation run by chance.

A subscription's own index of what it is owed (`SubRuntime.owed`, gid -> record) is the
subscription side's, written through a name `rt` by convention: those writes are not the records'."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("router", "interrouter", "common")
OWNER = Path("router/records.py")

COUNTS = {"undecided", "inflight_bytes", "destination_records"}  # written by nobody but the owner, even on `self`
RECORD_FIELDS = {"pending", "origin", "outcome", "payload"}  # a record's, written through a name other than `self`
RECORD_DICTS = {"records", "by_gid"}  # the records held, by gid
SUB_INDEX_NAMES = {"rt"}  # `rt.owed`: a subscription's index (SubRuntime.owed), not a record's states
MUTATORS = {"pop", "popitem", "clear", "update", "setdefault", "__setitem__", "__delitem__"}


def _owned_container(node: ast.expr) -> str | None:
    """`node` is `<x>.owed` of a record, or a records dict: what it is, else None."""
    if not isinstance(node, ast.Attribute):
        return None
    if node.attr == "owed":
        base = node.value
        if isinstance(base, ast.Name) and base.id in SUB_INDEX_NAMES:
            return None
        return "owed"
    if node.attr in RECORD_DICTS:
        return node.attr
    return None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        raw = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        raw = [node.target]
    elif isinstance(node, ast.Delete):
        raw = list(node.targets)
    else:
        return []
    out: list[ast.expr] = []
    while raw:
        t = raw.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            raw.extend(t.elts)
        elif isinstance(t, ast.Starred):
            raw.append(t.value)
        else:
            out.append(t)
    return out


def writes_outside_owner(source: str, name: str) -> list[str]:
    """Where `source` writes state that only the record book may write: "file:line what"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for t in _targets(node):
            if isinstance(t, ast.Attribute):
                on_self = isinstance(t.value, ast.Name) and t.value.id == "self"
                if t.attr in COUNTS or (t.attr in RECORD_FIELDS and not on_self):
                    found.append(f"{name}:{t.lineno} writes .{t.attr}")
            elif isinstance(t, ast.Subscript) and (what := _owned_container(t.value)) is not None:
                found.append(f"{name}:{t.lineno} writes .{what}[...]")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                and (what := _owned_container(node.func.value)) is not None:
            found.append(f"{name}:{node.lineno} calls .{what}.{node.func.attr}()")
    return found


def _product_files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py") if p.relative_to(ROOT) != OWNER)


def test_only_the_record_book_writes_the_records_state_and_counts() -> None:
    files = _product_files()
    assert any(p.name == "core.py" for p in files) and len(files) > 20  # (it scans the product)
    found = [w for p in files for w in writes_outside_owner(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == []


@pytest.mark.parametrize("write", [
    "rec.owed[sid] = S_SENT",
    "del rec.owed[sid]",
    "rec.owed.pop(sid)",
    "rec.pending += 1",
    "rec.pending = 0",
    "self.undecided += 1",
    "core.inflight_bytes -= 3",
    "self.destination_records = 0",
    "rec.payload = b''",
    "rec.outcome, rec.error = O_ACCEPTED, None",
    "rec.origin = None",
    "self.records[gid] = rec",
    "del self.records[gid]",
    "self.records.pop(gid)",
])
def test_the_scan_finds_a_write_by_hand(write: str) -> None:
    assert writes_outside_owner(f"def f():\n    {write}\n", "x.py") != []


@pytest.mark.parametrize("fine", [
    "rt.owed[gid] = rec",  # a subscription's index of what it is owed
    "del rt.owed[gid]",
    "self.outcome = outcome",  # an object's own field of that name (an exception's, a record's __init__)
    "x = rec.owed.get(sid)",
    "n = rec.pending",
])
def test_the_scan_leaves_reads_and_other_state_alone(fine: str) -> None:
    assert writes_outside_owner(f"def f():\n    {fine}\n", "x.py") == []
