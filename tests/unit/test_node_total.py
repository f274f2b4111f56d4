"""The mesh layer's part in total order: it runs one sequencer member per topic, routes its
messages, and refuses (without crashing) what does not fit its group."""

from __future__ import annotations

from oncemesh.interrouter import codec
from oncemesh.interrouter.messages import Order
from oncemesh.interrouter.node import MeshNode
from oncemesh.router.actions import SubmitOrder
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.order.sequencer import NO_BALLOT, Nack, Request, Wire
from oncemesh.router.subscriptions import SubscriptionTable


def node(me: str = "A") -> MeshNode:
    core = DeliveryCore(me, SubscriptionTable(), CoreConfig(total_topics=frozenset({"t"})))
    n = MeshNode(me, "2000", core, {"A", "B", "C"}, {"B": 1.0}, 1.0, 3.0, 0.0, sequenced=("t",))
    n.peer_up("B", "1000", 0.0)
    return n


def test_two_routers_number_a_submission_alike_over_routed_order_messages() -> None:
    nodes = {r: MeshNode(r, "1", DeliveryCore(r, SubscriptionTable(), CoreConfig(total_topics=frozenset({"t"}))),
                         {"A", "B"}, {"B" if r == "A" else "A": 1.0}, 1.0, 3.0, 0.0, sequenced=("t",))
             for r in "AB"}
    now = 0.0

    def exchange(rounds: int = 50) -> None:
        nonlocal now
        for _ in range(rounds):
            now += 0.05
            for r, n in nodes.items():
                n.tick(now)
                n.flush()
                sends, n.sends = n.sends, []
                for to, frame in sends:
                    nodes[to].frame(r, frame, now)

    nodes["A"].peer_up("B", "1", now)
    nodes["B"].peer_up("A", "1", now)
    exchange()
    nodes["A"].perform(SubmitOrder("t", "abcdefghijkl:1"), now)
    exchange()
    assert all(n.core.total["t"].num == {"abcdefghijkl:1": 1} for n in nodes.values())
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
