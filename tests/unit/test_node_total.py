"""The mesh layer's part in total order: it runs one sequencer member per topic, routes its
messages, and refuses (without crashing) what does not fit its group."""

from __future__ import annotations

import json

import pytest

from oncemesh.interrouter import codec
from oncemesh.interrouter.messages import ORDER_VERSION, LinkState, Order, Queries
from oncemesh.interrouter.node import MeshNode
from oncemesh.router.actions import SubmitOrder
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.order.sequencer import NO_BALLOT, Nack, Request, Wire
from oncemesh.router.subscriptions import SubscriptionTable


def node(me: str = "A") -> MeshNode:
    table = SubscriptionTable()
    core = DeliveryCore(me, table, CoreConfig(total_topics=frozenset({"t"})))
    n = MeshNode(me, "2000", core, table, {"A", "B", "C"}, {"B": 1.0}, 1.0, 3.0, 0.0, sequenced=("t",))
    n.peer_up("B", "1000", 0.0)
    return n


def pair(**kw: tuple[str, ...]) -> dict[str, MeshNode]:
    """Routers A and B, neighbours, with topic "t" in total order (`kw`: sequenced or lamport_topics)."""
    tables = {r: SubscriptionTable() for r in "AB"}
    return {r: MeshNode(r, "1", DeliveryCore(r, tables[r], CoreConfig(total_topics=frozenset({"t"}))), tables[r],
                        {"A", "B"}, {"B" if r == "A" else "A": 1.0}, 1.0, 3.0, 0.0, **kw)
            for r in "AB"}


def run(nodes: dict[str, MeshNode], now: float, seconds: float) -> float:
    """Every router ticks and flushes every 50 ms and its frames reach the other at once; returns
    the time at the end."""
    end = now + seconds
    while now < end - 1e-9:
        now += 0.05
        for r, n in nodes.items():
            n.tick(now)
            n.flush()
            sends, n.sends = n.sends, []
            for to, frame in sends:
                nodes[to].frame(r, frame, now)
    return now


def test_two_routers_number_a_submission_alike_over_routed_order_messages() -> None:
    nodes = pair(sequenced=("t",))
    now = 0.0

    def exchange(rounds: int = 50) -> None:
        nonlocal now
        now = run(nodes, now, rounds * 0.05)

    nodes["A"].peer_up("B", "1", now)
    nodes["B"].peer_up("A", "1", now)
    exchange()
    nodes["A"].perform(SubmitOrder("t", "abcdefghijkl:1"), now)
    exchange()
    for n in nodes.values():  # (numbered 1, or already compacted: every router passed it)
        ts = n.core.total["t"]
        assert ts.num == {"abcdefghijkl:1": 1} or (ts.base == 1 and ts.marks == {"abcdefghijkl": 1})
    assert all(n.stats["order_out"] > 0 for n in nodes.values())
    assert nodes["B"].status()["order"]["t"]["sequencer"] == "B"  # bully: the highest id


def test_an_order_message_that_does_not_fit_the_group_is_refused_not_a_crash() -> None:
    n = node()
    bad_cv = Order("A", "B", "t", Wire(0, (0, 0, 0, 0, 0), Request("x:1", 1)))  # 5 members, not 3
    bad_ballot = Order("A", "B", "t", Wire(0, (0, 0, 0), Nack((1, 7, 0), NO_BALLOT)))  # member 7 of 3
    for msg in (bad_cv, bad_ballot):
        n.frame("B", codec.encode_control([msg]), 0.2)
    assert n.stats["order_refused"] == 2


def test_an_order_message_for_a_topic_not_in_total_order_here_is_counted_and_dropped() -> None:
    n = node()
    n.frame("B", codec.encode_control([Order("A", "B", "other", Wire(0, (0, 0, 0), Request("x:1", 1)))]), 0.2)
    assert n.stats["order_unknown_topic"] == 1


@pytest.mark.parametrize("algorithm", ["sequencer", "lamport"])
def test_what_every_router_passed_is_compacted_and_a_full_history_is_said_and_waits(
        algorithm: str, caplog: pytest.LogCaptureFixture) -> None:
    """Both total orders: the mesh layer reports the delivery core's floor every second and compacts
    what every router's floor passed; a stream whose history is full numbers nothing more (its
    submissions wait) and the router logs which router holds it back."""
    kw = {"sequenced": ("t",)} if algorithm == "sequencer" else {"lamport_topics": ("t",)}
    nodes = pair(**kw)
    now = 0.0

    def exchange(seconds: float) -> None:
        nonlocal now
        now = run(nodes, now, seconds)

    nodes["A"].peer_up("B", "1", now)
    nodes["B"].peer_up("A", "1", now)
    exchange(2.5)
    for k in range(3):
        nodes["A"].perform(SubmitOrder("t", f"abcdefghijkl:{k}"), now)
    exchange(5.0)  # (the sequencer compacts what the leader says every member delivered: heartbeats)
    for n in nodes.values():
        st = n.status()["order"]["t"]
        assert n.core.total["t"].base == 3 and st["compacted"] == 3 and st["numbered"] == 3, st
    for n in nodes.values():  # room for one more number only
        if algorithm == "lamport":
            n.lamports["t"].max_history = 1
        else:
            n.seqs["t"].max_history = 1
    for n in nodes.values():  # (no more floors: nothing compacts)
        n._floors_due = float("inf")
    with caplog.at_level("ERROR", logger="oncemesh.mesh"):
        for k in range(3, 5):
            nodes["A"].perform(SubmitOrder("t", f"abcdefghijkl:{k}"), now)
        exchange(2.0)
        for n in nodes.values():
            n._floors_due = 0.0
            n.tick(now)  # (the router that stopped numbering says so: the sequencer's leader, or A)
    assert all(n.core.total["t"].top == 4 for n in nodes.values())  # one more, then it waits
    assert any("mesh.order_history_full topic=t" in r.getMessage() for r in caplog.records)


def test_no_order_message_passes_to_or_from_a_neighbour_of_an_older_protocol_version() -> None:
    """Protocol version 3 changed the order messages' layout (compaction): a version-2 neighbour's
    strict decoder would refuse ours (and close the connection), ours refuses its. Both ways they are
    left out and counted; every other message flows."""
    n = node()
    n.peer_up("B", "1000", 0.0, ORDER_VERSION - 1)
    n.frame("B", codec.encode_control([LinkState("B", "1000", 1, {"A": 1.0})]), 0.05)  # a route to B
    old = ["O", "B", "A", "t", [0, [0, 0, 0], ["RR", 1]]]  # an older layout: would not decode
    frame = b"C" + json.dumps([old, ["Q", "B", "A", ["x:1"]]]).encode()
    with pytest.raises(codec.FrameError):
        codec.decode_control(frame)
    n.frame("B", frame, 0.1)  # no FrameError: the O is skipped, the Q is read
    assert n.stats.get("order_refused", 0) == 0
    n.sends.clear()
    n._route_control(Order("B", "A", "t", Wire(0, (0, 0, 0), Request("x:1", 1))))
    n._route_control(Queries("A", "B", ["y:1"]))
    n.flush()
    sent = [m for _, f in n.sends for m in codec.decode_control(f)]
    assert [type(m) for m in sent if type(m) in (Order, Queries)] == [Queries]
    assert n.stats["order_version_dropped"] >= 1  # (ours, and what its sequencer member sent B)
    n.peer_up("B", "1000", 0.2, ORDER_VERSION)  # upgraded: they pass again
    n._route_control(Order("B", "A", "t", Wire(0, (0, 0, 0), Request("x:2", 1))))
    n.flush()
    assert any(type(m) is Order for _, f in n.sends for m in codec.decode_control(f))
