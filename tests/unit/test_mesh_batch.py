"""The core's mesh actions reach the mesh layer in one batch per drain (router/server.py `_perform`,
interrouter/mesh.py `perform_all`), in the order the core decided them, and the mesh layer hands the
node's frames and outputs on once per batch; within an input's drain, once after the router's drain.
The frames a loop pass takes go into the node at once and are drained once at the pass's end: one
router drain and one node drain for all of them, their decisions dated by their reads."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from oncemesh.interrouter.mesh import Mesh
from oncemesh.interrouter.node import MeshNode
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
    m._drain_due = False
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
    m._after_input()
    assert drains == ["router", "node"]  # (not once per batch inside the router's drain)
    assert not m._drain_due
    m.perform_all([SendFinal("A", "g3")])
    assert drains == ["router", "node", "node"]


class PassEngine:
    """The engine as far as a pass's input and its end go: `read(t)` takes a read at wall time `t`,
    `end_pass()` runs the after-pass work in rounds, as `Engine._flush_all` does."""

    def __init__(self) -> None:
        self.after: list[Callable[[], None]] = []
        self.taken: float | None = None

    def input_time(self) -> float | None:
        return self.taken

    def call_after_pass(self, fn: Callable[[], None]) -> None:
        self.after.append(fn)

    def end_pass(self) -> None:
        while self.after:
            fns, self.after = self.after, []
            for fn in fns:
                fn()
        self.taken = None


class CountingRouter(Router):
    def drain(self, decided: float | None = None) -> None:
        self.drains.append(len(self.core.out))  # type: ignore[attr-defined]
        super().drain(decided)


class FrameNode(Node):
    """A node whose frames each make the core decide a hand-over and an acknowledgement."""

    owes_router = MeshNode.owes_router  # (the real node's rule, on this node's outputs)

    def __init__(self, core: Any, seen: list[Any]) -> None:
        super().__init__()
        self.core = core
        self.seen = seen
        self.has_pending = False  # (acknowledgements queued for the pass's control frame)
        self.sends: list[tuple[str, bytes]] = []
        self.attach_done: list[tuple[str, str | None]] = []
        self.events: list[Any] = []
        self.close: list[str] = []
        self.view_changed = False
        self.relay = SimpleNamespace(out=[], answered=[])
        self.keeper = SimpleNamespace(kept=[], fetched=[], lonely=[], orphaned=[])

    def frame(self, peer: str, data: bytes, now: float) -> None:
        gid = data.decode()
        self.core.log.append(("delivered", gid, "t", "s1", None))
        self.core.out.append(SendAck(peer, gid, "s1", 1, None))
        self.sends.append((peer, b"held " + data))
        self.has_pending = True
        if gid == "attach":
            self.attach_done.append(("s9", None))

    def flush(self) -> None:
        self.seen.append("flush")
        self.has_pending = False

    def peer_down(self, peer: str, now: float) -> None:
        self.seen.append(("peer_down", peer))
        self.core.out.append(SendFinal("B", "after " + peer))  # (what the end makes the core decide)


def _pass_mesh() -> tuple[Mesh, CountingRouter, FrameNode, PassEngine, list[Any]]:
    engine = PassEngine()
    seen: list[Any] = []  # ("log", stamp, gids) / ("mesh", gids) / "node", in the order they happened
    r = CountingRouter.__new__(CountingRouter)
    r.drains = []  # type: ignore[attr-defined]
    r.core = SimpleNamespace(log=[], out=[])  # type: ignore[assignment]
    r.engine = engine  # type: ignore[assignment]
    r._decided = None
    r._drain_scheduled = False
    r._pending_opens = []
    r.table = SimpleNamespace(version=1)  # type: ignore[assignment]
    r._saved_version = 1
    r._write_core_log = lambda stamp, entries: seen.append(  # type: ignore[method-assign]
        ("log", stamp, [e[1] for e in entries]))

    m = Mesh.__new__(Mesh)
    node = FrameNode(r.core, seen)
    m.node = node  # type: ignore[assignment]
    m.router = r
    m.engine = engine  # type: ignore[assignment]
    m._drain_due = False
    m._flush_scheduled = False
    m.peers = {"A": SimpleNamespace(id="A"), "C": SimpleNamespace(id="C")}  # type: ignore[dict-item]
    m._drain_node = lambda: seen.append("node")  # type: ignore[method-assign]

    def perform(acts: list[Any]) -> None:
        seen.append(("mesh", [a.gid for a in acts]))
        Mesh.perform_all(m, acts)

    r._perform = perform  # type: ignore[method-assign]
    return m, r, node, engine, seen


def test_the_frames_of_a_pass_are_drained_once_at_its_end() -> None:
    """Line3's B and C: three copies in a pass, two in one read of A's connection, one in a read of
    C's taken 3.8 s later (the process stopped between the two reads). Nothing is performed while
    the frames are taken; at the pass's end one router drain performs the three frames' actions in
    one batch and the node is drained once, after it. The first read's decisions are dated by that
    read, not by the later one (docs/settlement-log.md, "Times")."""
    m, r, node, engine, seen = _pass_mesh()
    engine.taken = 1000.0
    m._on_frame(m.peers["A"], b"g1")  # type: ignore[arg-type]
    m._on_frame(m.peers["A"], b"g2")  # type: ignore[arg-type]
    assert seen == [] and r.drains == []  # type: ignore[attr-defined]
    engine.taken = 1003.8
    m._on_frame(m.peers["C"], b"g3")  # type: ignore[arg-type]
    assert seen == [("log", 1000.0, ["g1", "g2"])]  # (written, not performed: the first read's time)
    assert r.drains == []  # type: ignore[attr-defined]
    engine.end_pass()
    assert r.drains == [3]  # type: ignore[attr-defined]  # one drain, with the three frames' actions
    assert seen == [("log", 1000.0, ["g1", "g2"]), ("log", 1003.8, ["g3"]), ("mesh", ["g1", "g2", "g3"]),
                    "flush", "node"]  # (the pass's acknowledgements batched in the same drain)
    assert r._decided is None and not m._drain_due and not r._drain_scheduled
    # the next pass starts afresh: its frame is dated by its own read, drained at its own end
    seen.clear()
    engine.taken = 1004.0
    m._on_frame(m.peers["A"], b"g4")  # type: ignore[arg-type]
    engine.end_pass()
    assert r.drains == [3, 1] and seen == [("log", 1004.0, ["g4"]), ("mesh", ["g4"]), "flush", "node"]  # type: ignore[attr-defined]


def test_a_frame_with_more_than_frames_to_send_is_drained_at_once() -> None:
    """An attach's answer (or an event, a peer's end, the relay's or keepers' outputs) is drained with
    the frame, as before: the router's after-pass work asks the node about it. What earlier frames
    of the pass decided goes with it, in order."""
    m, r, node, engine, seen = _pass_mesh()
    engine.taken = 1000.0
    m._on_frame(m.peers["A"], b"g1")  # type: ignore[arg-type]
    m._on_frame(m.peers["A"], b"attach")  # type: ignore[arg-type]
    assert r.drains == [2]  # type: ignore[attr-defined]
    assert seen == [("log", 1000.0, ["g1", "attach"]), ("mesh", ["g1", "attach"]), "node"]
    engine.end_pass()  # (what was scheduled finds nothing more to do)
    assert r.drains[1:] == [0] and seen[3:] == ["flush", "node"]  # type: ignore[attr-defined]


def test_a_peers_end_comes_after_what_its_frames_made_the_core_decide() -> None:
    """The frames a peer sent before its connection ended wait for the pass's drain; its end
    drains them first (their actions, to the connections they were decided for), then tells the
    node, then drains what the end decided."""
    m, r, node, engine, seen = _pass_mesh()
    engine.taken = 1000.0
    m._on_frame(m.peers["C"], b"g1")  # type: ignore[arg-type]
    m._peer_down(m.peers["C"], None)  # type: ignore[arg-type]
    assert seen == [("log", 1000.0, ["g1"]), ("mesh", ["g1"]), "node", ("peer_down", "C"),
                    ("mesh", ["after C"]), "node"]
    assert "C" not in m.peers
