"""The seam between the mesh layer (interrouter/) and the router.

- The mesh reaches the delivery core only through the core's inputs and its queries (CORE_CALLS:
  most are its mesh side's, `router.meshside.MeshSide`, which the core offers as they are): it
  reads no attribute of the core and writes none.
- `interrouter.mesh.Mesh` reaches its router only through `interrouter.routerport.RouterPort`:
  nothing of the router's insides (`router.core.<...>`, `router.slog.<...>`).

Found by reading the source (AST), so that a new reach into the core fails here, not in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

from oncemesh.router.core import DeliveryCore

ROOT = Path(__file__).resolve().parents[2]
INTERROUTER = ROOT / "interrouter"

# What interrouter/ may call on the core: its inputs, and the queries made for the mesh side.
CORE_CALLS = frozenset({
    # inputs
    "receive_copy", "handle_ack", "handle_final", "handle_probe", "handle_query", "handle_hold",
    "publisher_declared_elsewhere", "presented_elsewhere", "subscription_changed", "set_reachable",
    "set_ready", "set_mesh", "ordered", "pump_topic", "total_floor", "total_compact", "total_restore",
    "tick",
    # ... and a subscriber link's, for a member another router relays here (interrouter/members.py)
    "attach_subscriber", "subscriber_credit", "subscriber_outcome", "detach_subscriber",
    # queries (router/meshside.py, and the end of router/core.py: "for the mesh layer")
    "notes_on", "reachable_routers", "has_record", "has_final_notes", "subscriptions_reclaimed",
    "in_total_order", "total_base", "total_checkpoint", "total_start_of",
})


def _is_core(node: ast.expr) -> bool:
    """`core`, `self.core`, `router.core` or `self.router.core` (not `cfg.core`: the core's config)."""
    if isinstance(node, ast.Name):
        return node.id == "core"
    if isinstance(node, ast.Attribute) and node.attr == "core":
        owner = node.value
        return (isinstance(owner, ast.Name) and owner.id in ("self", "router")) or (
            isinstance(owner, ast.Attribute) and owner.attr == "router"
            and isinstance(owner.value, ast.Name) and owner.value.id == "self")
    return False


def core_reaches(source: str) -> list[tuple[int, str]]:
    """(line, what) for each use of the core in `source` other than a call of a CORE_CALLS method."""
    tree = ast.parse(source)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and _is_core(n.value):
            if not isinstance(n.ctx, ast.Load):
                out.append((n.lineno, f"writes core.{n.attr}"))
            elif n.attr not in CORE_CALLS:
                out.append((n.lineno, f"reads core.{n.attr}"))
            elif id(n) not in called:
                out.append((n.lineno, f"takes core.{n.attr} without calling it"))
    return sorted(out)


def router_insides(source: str) -> list[tuple[int, str]]:
    """(line, what) for each `router.<x>.<y>` / `self.router.<x>.<y>` with x the core or the
    settlement log: the router's insides, which RouterPort does not offer."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr in ("core", "slog"):
            owner = n.value.value
            if (isinstance(owner, ast.Name) and owner.id == "router") or (
                    isinstance(owner, ast.Attribute) and owner.attr == "router"):
                out.append((n.lineno, f"router.{n.value.attr}.{n.attr}"))
    return sorted(out)


def test_the_scanners_see_a_reach_into_the_core() -> None:
    src = (
        "core = self.core\n"
        "core.handle_ack(g, s, 2, None, now)\n"          # an input: fine
        "x = self.core.table.get(sid)\n"                  # an attribute read
        "core.mesh_size = 3\n"                            # a write
        "f = self.core.tick\n"                            # a method taken, not called
        "n = self.router.cfg.core.total_topics\n"         # the core's config: not the core
        "self.router.core.set_ready(True)\n"              # through the router's insides
        "self.router.slog.write('peer_up', now)\n"
    )
    assert core_reaches(src) == [(3, "reads core.table"), (4, "writes core.mesh_size"),
                                 (5, "takes core.tick without calling it")]
    assert router_insides(src) == [(7, "router.core.set_ready"), (8, "router.slog.write")]


def test_the_allowed_calls_are_public_methods_of_the_core() -> None:
    core = DeliveryCore("R")  # (the mesh side's inputs are its part's methods, offered by each core)
    for name in sorted(CORE_CALLS):
        assert not name.startswith("_") and callable(getattr(core, name, None)), name


def test_interrouter_uses_the_core_only_through_its_inputs_and_queries() -> None:
    found = [f"{p.name}:{line}: {what}" for p in sorted(INTERROUTER.glob("*.py"))
             for line, what in core_reaches(p.read_text())]
    assert not found, "interrouter/ reaches into the delivery core:\n" + "\n".join(found)


def test_the_mesh_reaches_its_router_only_through_routerport() -> None:
    source = (INTERROUTER / "mesh.py").read_text()
    assert router_insides(source) == []
    # and every router member it uses is one RouterPort declares
    port = next(n for n in ast.walk(ast.parse((INTERROUTER / "routerport.py").read_text()))
                if isinstance(n, ast.ClassDef) and n.name == "RouterPort")
    offered = {f.name for f in port.body if isinstance(f, ast.FunctionDef)}
    used = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Attribute) and (
                (isinstance(n.value, ast.Name) and n.value.id == "router")
                or (isinstance(n.value, ast.Attribute) and n.value.attr == "router"
                    and isinstance(n.value.value, ast.Name) and n.value.value.id == "self")):
            used.add(n.attr)
    assert used and used <= offered, f"mesh.py uses {sorted(used - offered)} of the router, not in RouterPort"
