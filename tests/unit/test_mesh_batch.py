"""The core's mesh actions reach the mesh layer in one batch per drain (router/server.py `_perform`,
interrouter/mesh.py `perform_all`), in the order the core decided them, and the mesh layer hands the
node's frames and outputs on once per batch; within a frame's input, once after the router's drain."""

from __future__ import annotations

from typing import Any

import pytest

from oncemesh.interrouter.mesh import Mesh
from oncemesh.router.actions import Announce, Forward, MeshAction, SendAck, SendFinal, SettleDelivery
from oncemesh.router.server import Router


class Recorder:
    """A mesh layer that records what it was given."""

    def __init__(self) -> None:
        self.batches: list[list[MeshAction]] = []

    def perform_all(self, acts: list[MeshAction]) -> None:
        self.batches.append(list(acts))


def _router(mesh: Recorder | None) -> Router:
    r = Router.__new__(Router)  # (only what `_perform` reads)
    r.sub_links = {}
    r.pub_deliveries = {}
    r.mesh = mesh  # type: ignore[assignment]
    r.mqtt = None
    return r


def test_the_mesh_actions_of_a_batch_go_in_one_call_in_order() -> None:
    rec = Recorder()
    r = _router(rec)
    acts: list[Any] = [SendAck("A", "g1", "s1", 1, None), SendFinal("C", "g0"),
                       Forward("g2", "t", b"x", {"C": ("s2",)}), Announce("s3")]
    r._perform(acts)
    assert rec.batches == [acts]
    r._perform([])
    assert len(rec.batches) == 1  # (no call for a batch without mesh actions)


def test_a_standalone_router_tells_nobody_of_changes_and_refuses_copies() -> None:
    r = _router(None)
    r._perform([Announce("s1"), SettleDelivery("s1", "g1")])  # (a link it does not hold: nothing to do)
    with pytest.raises(TypeError, match="standalone"):
        r._perform([Announce("s1"), SendFinal("B", "g1")])


class Node:
    def __init__(self) -> None:
        self.performed: list[MeshAction] = []

    def perform(self, act: MeshAction, now: float) -> None:
        self.performed.append(act)


def _mesh(drains: list[str]) -> tuple[Mesh, Node]:
    m = Mesh.__new__(Mesh)  # (only what perform_all and _after_input use)
    node = Node()
    m.node = node  # type: ignore[assignment]
    m._inputting = False
    m._drain_node = lambda: drains.append("node")  # type: ignore[method-assign]
    return m, node


def test_the_node_is_drained_once_per_batch_and_once_per_input() -> None:
    drains: list[str] = []
    m, node = _mesh(drains)
    m.perform_all([SendAck("A", "g1", "s1", 1, None), SendFinal("A", "g1")])
    assert len(node.performed) == 2 and drains == ["node"]

    drains.clear()

    class RouterStub:
        def drain(self, decided: float | None = None) -> None:
            drains.append("router")
            m.perform_all([SendAck("A", "g2", "s1", 1, None)])  # (the frame's actions)
            m.perform_all([SendFinal("A", "g2")])

    m.router = RouterStub()  # type: ignore[assignment]
    m._after_input(1.0)
    assert drains == ["router", "node"]  # (not once per batch inside the router's drain)
    assert not m._inputting
    m.perform_all([SendFinal("A", "g3")])
    assert drains == ["router", "node", "node"]
