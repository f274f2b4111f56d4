"""Per-publisher FIFO for a publisher not ours: its tags are not its order (tests/foreign, the line3
fan-out with python-qpid-proton: a message ACCEPTED that no subscription was handed).

python-qpid-proton's sender kept the old link's credit while its connection was down: the
publisher went on sending (tags 381..397), Proton held those transfers and sent them first on the
new link at B, then the publisher resent what was in doubt (378..380, tags lower). B (origin) and C
(destination) read the tags as the publisher's sequence numbers, took 378..380 for late messages
("fifo: a later message was handed first") and ended them for every subscription, all in force:
ACCEPTED, never handed. For a client not ours the order is the order its transfers came in at the
origin (docs/ordering.md, "FIFO per publisher"): a tag lower than one handed is no evidence of anything.
"""

from __future__ import annotations

from oncemesh.common.ids import global_id, publisher_link_id, subscription_id
from oncemesh.common.vocab import Outcome
from oncemesh.interrouter.node import MeshNode
from oncemesh.router.actions import ClientAction, Deliver, SendOutcome
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.subscriptions import SubscriptionTable

PL = publisher_link_id("proton_py-pub", "pub")
LATE_FIRST = [b"381", b"382", b"383", b"378", b"379", b"380"]  # what B received, in that order


class Line:
    """Real cores and mesh nodes of A - B - C, frames carried through the real codec (B is a
    transit router for copies between A and C); subscriptions `sa` homed at A and `sc` at C."""

    def __init__(self) -> None:
        self.now = 0.0
        nbrs = {"A": {"B": 1.0}, "B": {"A": 1.0, "C": 1.0}, "C": {"B": 1.0}}
        tables = {r: SubscriptionTable() for r in nbrs}
        self.nodes = {r: MeshNode(r, "1", DeliveryCore(r, tables[r], CoreConfig()), tables[r], set(nbrs), nbrs[r],
                                  1.0, 3.0, 0.0) for r in nbrs}
        self.sids = {r: subscription_id(f"c{r}", f"s{r}", "t") for r in "AC"}
        self.delivered: dict[str, list[str]] = {sid: [] for sid in self.sids.values()}
        self.outcomes: list[SendOutcome] = []
        for r, n in self.nodes.items():
            n.core.incarnation = "1"
            for home, sid in self.sids.items():
                if r == home:
                    n.core.attach_subscriber(object(), sid, "t", f"c{home}", f"s{home}", 60.0, False, None,
                                             self.now)
                    n.core.subscriber_credit(sid, 1000)
                else:
                    n.core.table.attach(sid, "t", f"c{home}", f"s{home}", 60.0, home, self.now)
        for a, b in (("A", "B"), ("B", "C")):
            self.nodes[a].peer_up(b, "1", self.now)
            self.nodes[b].peer_up(a, "1", self.now)
        self.run()
        assert all(set(n.core.reachable) == set(nbrs) for n in self.nodes.values())

    def run(self, rounds: int = 40) -> None:
        for _ in range(rounds):
            self.now += 0.05
            for r, n in self.nodes.items():
                n.tick(self.now)
                out, n.core.out = n.core.out, []
                for a in out:
                    if isinstance(a, Deliver):
                        self.delivered[a.sid].append(a.gid)
                    elif isinstance(a, SendOutcome):
                        self.outcomes.append(a)
                    elif not isinstance(a, ClientAction):
                        n.perform(a, self.now)
                n.flush()
                sends, n.sends = n.sends, []
                for to, frame in sends:
                    self.nodes[to].frame(r, frame, self.now)

    def accept_all(self) -> None:
        for home, sid in self.sids.items():
            core = self.nodes[home].core
            for g in list(core.subs[sid].on_link):
                core.subscriber_outcome(sid, g, Outcome.ACCEPTED, True, None, False, self.now)
        self.run()


def test_transfers_of_a_client_not_ours_out_of_tag_order_are_handed_at_origin_and_destination() -> None:
    m = Line()
    a = m.nodes["A"].core
    link = object()
    a.attach_publisher(link, PL, "t", False, None, m.now)  # no declaration: not ours
    toks = {}
    for tag in LATE_FIRST:
        toks[tag] = object()
        a.publish(link, toks[tag], tag, b"m" + tag, m.now)
        m.run(2)
    m.run()
    want = [global_id(PL, t) for t in LATE_FIRST]
    for sid, got in m.delivered.items():
        assert sorted(got) == sorted(want), f"{sid}: never handed {sorted(set(want) - set(got))}"
        assert got == want  # in the order they came in at the origin
    assert m.outcomes == [], "an outcome before the subscriptions accepted"
    m.accept_all()
    assert {id(o.pub) for o in m.outcomes} == {id(t) for t in toks.values()} and len(m.outcomes) == len(toks)
    assert {o.outcome for o in m.outcomes} == {Outcome.ACCEPTED}
    assert not any(n.core.records for n in m.nodes.values())

