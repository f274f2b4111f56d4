"""The Lamport streams' votes on disk (`interrouter.orderstate`) and the mesh node that writes them:
once per pass when they changed, before the pass's frames leave; a later life restores them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oncemesh.interrouter.lamportcodec import decisions_to_json
from oncemesh.interrouter.node import MeshNode
from oncemesh.interrouter.orderstate import OrderStateError, OrderStore
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.order.lamport import GENESIS, Snapshot
from oncemesh.router.subscriptions import SubscriptionTable

T = "a/b topic"  # not a file name as it is


def mesh(me: str, store: OrderStore | None, first: bool = True) -> MeshNode:
    table = SubscriptionTable()
    core = DeliveryCore(me, table, CoreConfig(total_topics=frozenset({T})))
    others = {r: 1.0 for r in "AB" if r != me}
    return MeshNode(me, "1000" if first else "2000", core, table, {"A", "B"}, others, 1.0, 3.0, 0.0,
                    lamport_topics=(T,), bootstrap=first,
                    lamport_restore=store.lamport_restore([T]) if store and not first else None,
                    persist=store.persist_lamport if store else None)


def exchange(nodes: dict[str, MeshNode], now: float, rounds: int = 60,
             before_send: dict[str, list[Snapshot | None]] | None = None) -> float:
    for _ in range(rounds):
        now += 0.05
        for r, n in nodes.items():
            n.tick(now)
            n.flush()
            sends, n.sends = n.sends, []
            for to, frame in sends:
                if to in nodes:
                    nodes[to].frame(r, frame, now)
    return now


def test_a_view_change_is_written_before_its_frames_leave_and_a_restart_restores_it(tmp_path: Path) -> None:
    stores = {r: OrderStore(tmp_path / r, r) for r in "AB"}
    nodes = {r: mesh(r, stores[r]) for r in "AB"}
    written: list[int] = []
    real = stores["B"].save

    def save(topic: str, doc: dict[str, object], part: str = "") -> None:
        written.append(len(nodes["B"].sends))  # nothing of this pass has left yet
        real(topic, doc, part)

    stores["B"].save = save  # type: ignore[method-assign]
    now = 0.0
    nodes["A"].peer_up("B", "1000", now)
    nodes["B"].peer_up("A", "1000", now)
    now = exchange(nodes, now)  # both started alone: the view with both is a view change
    lam = nodes["B"].lamports[T]
    assert lam.installed != GENESIS and not lam.frozen
    assert written and set(written) == {0}
    assert stores["B"].stats["writes"] == len(written) >= nodes["B"].stats["order_persisted"] > 0
    assert stores["B"].stats["write_ms_max"] > 0
    n = len(written)
    now = exchange(nodes, now)
    assert len(written) == n  # nothing changed: nothing written (never per message or per tick)
    doc = json.loads(stores["B"].path(T).read_text())
    assert doc["version"] == 2 and doc["lamport"][4] is None and doc["lamport"][5] is None  # votes only
    big = json.loads(stores["B"].path(T, ".decisions").read_text())
    assert big["commit"] is not None  # the commit that installed the view
    # B restarts with its state directory: its new life remembers its votes and view, frozen
    again = mesh("B", stores["B"], first=False)
    b = again.lamports[T]
    assert b.restored and b.frozen and b.installed == lam.installed and b.promised >= lam.promised
    assert mesh("B", None, first=False).lamports[T].installed is None  # without it: amnesic


def test_an_unreadable_state_file_stops_the_start_with_a_clear_error(tmp_path: Path) -> None:
    store = OrderStore(tmp_path, "B")
    tmp_path.mkdir(exist_ok=True)
    store.path(T).write_text("{not json")
    with pytest.raises(OrderStateError, match="unreadable"):
        store.lamport_restore([T])
    store.path(T).write_text(json.dumps({"version": 9}))
    with pytest.raises(OrderStateError, match="version"):
        store.lamport_restore([T])


def test_decisions_written_before_the_votes_and_a_crash_between_restore_consistently(tmp_path: Path) -> None:
    """The decisions file goes first: a crash before the votes file follows leaves it newer; the
    restored life promises at least what it accepted and takes the view its commit installed."""
    from oncemesh.router.order.lamport import Commit, Decision, LamportNode

    store = OrderStore(tmp_path, "B")
    v1, v2 = (3, "A"), (5, "A")
    members = (("A", 1), ("B", 1))
    old = Snapshot(v1, v1, v1, members, None, None, (1,))
    store.persist_lamport(T, old)
    d = Decision(v2, v1, members, ((-1, ""), 0, ""), (), (), None)
    newer = Snapshot((5, "A"), (5, "A"), v2, members, None, Commit((5, "A"), d), (1,))
    store.save(T, decisions_to_json(newer.accepted, newer.commit), ".decisions")  # then the crash
    snap = store.lamport_restore([T])[T]
    node = LamportNode.restore(snap, "B", "AB", 2)
    assert node.installed == v2 and node.promised >= (5, "A") and node.restored


def seq_mesh(me: str, store: OrderStore, first: bool) -> MeshNode:
    table = SubscriptionTable()
    core = DeliveryCore(me, table, CoreConfig(total_topics=frozenset({T})))
    others = {r: 1.0 for r in "AB" if r != me}
    return MeshNode(me, "1000" if first else "2000", core, table, {"A", "B"}, others, 1.0, 3.0, 0.0,
                    sequenced=(T,), bootstrap=first,
                    seq_restore=store.sequencer_restore([T]) if not first else None,
                    persist_seq=store.persist_sequencer)


def test_the_sequencers_votes_are_journaled_before_their_frames_leave_and_a_restart_is_the_same_life(
        tmp_path: Path) -> None:
    from oncemesh.router.actions import SubmitOrder

    stores = {r: OrderStore(tmp_path / r, r) for r in "AB"}
    nodes = {r: seq_mesh(r, stores[r], first=True) for r in "AB"}
    sent_before: list[int] = []
    real = stores["B"].persist_sequencer

    def persist(topic: str, item: object) -> None:
        sent_before.append(len(nodes["B"].sends))  # nothing of this pass has left yet
        real(topic, item)  # type: ignore[arg-type]

    stores["B"].persist_sequencer = persist  # type: ignore[method-assign]
    nodes["B"]._persist_seq = persist
    nodes["A"].peer_up("B", "1000", 0.0)
    nodes["B"].peer_up("A", "1000", 0.0)
    now = exchange(nodes, 0.0)
    sent_before.clear()  # (peer_up's own hello went before the first pass: not a vote)
    for k in range(3):
        nodes["A"].perform(SubmitOrder(T, f"abcdefghijkl:{k}"), now)
        now = exchange(nodes, now, rounds=4)
    f = stores["B"].path(T, ".seq").with_suffix(".jsonl")
    lines = f.read_text().splitlines()
    assert json.loads(lines[0])["version"] == 2 and any("voted" in json.loads(x) for x in lines[1:])
    assert sent_before and not any(sent_before)
    life = nodes["B"].seqs[T].life
    with open(f, "a") as out:
        out.write('{"voted": [[9, [1, 0')  # a torn last line: its frames never left
    nodes["B"] = seq_mesh("B", stores["B"], first=False)
    seq = nodes["B"].seqs[T]
    assert seq.restored and seq.life == life and seq.status.name == "NORMAL"
    assert {g for e in seq.acc.values() for g in e.gids} >= {"abcdefghijkl:0", "abcdefghijkl:2"}
    nodes["B"].peer_up("A", "1000", now)
    nodes["A"].peer_up("B", "2000", now)
    now = exchange(nodes, now)
    nodes["A"].perform(SubmitOrder(T, "abcdefghijkl:3"), now)
    now = exchange(nodes, now)
    assert nodes["B"].core.total[T].top == 4 == nodes["A"].core.total[T].top


def test_a_sequencer_journal_that_does_not_parse_stops_the_start(tmp_path: Path) -> None:
    store = OrderStore(tmp_path, "B")
    f = store.path(T, ".seq").with_suffix(".jsonl")
    f.write_text('{"version": 2, "sequencer": [0, [0, 0], [1, 0, 0], 1, 1, null, []]}\n{"voted": 7}\n{}\n')
    with pytest.raises(OrderStateError, match="voted"):
        store.sequencer_restore([T])
    f.write_text('{"version": 1, "sequencer": []}\n')
    with pytest.raises(OrderStateError, match="version"):
        store.sequencer_restore([T])


def test_a_routine_state_write_is_not_logged_at_info_and_a_slow_one_is_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream's state is written once a second per ordered topic: at INFO it alone filled the
    operational log by ~25 MB a day. Routine writes are DEBUG; one slower than SLOW_WRITE_MS warns."""
    import logging

    from oncemesh.interrouter import orderstate

    store = OrderStore(tmp_path, "B")
    caplog.set_level(logging.DEBUG, logger="oncemesh.router")
    store.save(T, {"n": 1})
    [routine] = [r for r in caplog.records if "order.state_written" in r.getMessage()]
    assert routine.levelno == logging.DEBUG
    caplog.clear()
    monkeypatch.setattr(orderstate, "SLOW_WRITE_MS", 0.0)  # (every write is "slow" now)
    store.save(T, {"n": 2})
    [slow] = [r for r in caplog.records if "order.state_written" in r.getMessage()]
    assert slow.levelno == logging.WARNING and store.load(T) == {"n": 2}
