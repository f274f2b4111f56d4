"""A durable subscription claimed by two identities at two routers at once (issue 31, hole 1).

Two routers A - B under the seeded simulator (real delivery cores, real gossip and codec), two
authenticated identities: alice makes the subscription at A, bob attaches with the same container-id
and link name at B, `d` seconds after her (negative: before). Swept over `d` and the network's
delays, the runs take every interleaving of the two attaches and the two announcements:

    a A's attach, b B's attach, a>B A's announcement reaching B, b>A B's reaching A
    1 a a>B b            (bob refused at once: B knows alice's)   4 b b>A a      (alice refused at once)
    2 a b a>B b>A        3 a b b>A a>B                             5 b a b>A a>B  6 b a a>B b>A
    and the two attaches at the same instant

What must hold in every one: the first to attach holds the subscription (at the same instant: the
smaller identity, the rule's tie-break), at both routers; its attach is answered and its link never
closed; the other's attach is never answered and is refused with amqp:unauthorized-access (at once, or
when the first life's announcement comes), never with amqp:link:stolen. The same identity attaching at
both keeps today's rule (the other link is stolen, never refused).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import networkx as nx
import pytest

from oncemesh.common import errors
from oncemesh.common.ids import subscription_id
from oncemesh.interrouter.messages import SubUpdate
from oncemesh.router.actions import DetachLink
from oncemesh.router.core import SubscriberAttach
from oncemesh.router.subscriptions import Subscription, SubState
from tests.sim.simulator import TOPIC, SimRouter, SimSubscriber, Simulation, Token

CONTAINER, LINK = "c-shared", "durable-1"
SID = subscription_id(CONTAINER, LINK, TOPIC)
DELAYS = [i / 2000 for i in range(-16, 17)]  # -8 ms .. +8 ms by 0.5 ms (network delays: 0.5 .. 4 ms)


@dataclass
class Run:
    sim: Simulation
    owners: tuple[str, str]  # who attaches at A, who at B
    subs: dict[str, SimSubscriber] = field(default_factory=dict)  # by router
    links: dict[str, Token] = field(default_factory=dict)  # by router
    refused_at_attach: set[str] = field(default_factory=set)  # routers
    detached: list[tuple[str, str]] = field(default_factory=list)  # (router of the link, condition)
    opened: set[str] = field(default_factory=set)  # routers whose attach was answered
    events: list[str] = field(default_factory=list)  # "a", "b", "a>B", "b>A" as they happened

    def interleaving(self) -> str:
        return " ".join(self.events) + (" (refused at once)" if self.refused_at_attach else "")


def _mesh(seed: int) -> Simulation:
    g = nx.Graph()
    g.add_edge("A", "B")
    sim = Simulation(seed, g, n_subs=0, n_pubs=0)
    for r in sim.routers.values():
        r.start()
    sim.net.try_connect("A", "B")
    sim.k.run(until=sim.now + 3.0)
    return sim


def _watch(run: Run, r: SimRouter) -> None:
    """Record what router `r` does to the claims' links, and when the other's claim reaches it."""
    perform, handle_update = r.perform, r.node.gossip.handle_update
    router_of = {link: rid for rid, link in run.links.items()}
    arrival = {"A": "b>A", "B": "a>B"}[r.id]

    def perform_watched(a: object) -> None:
        if type(a) is DetachLink and a.link in router_of:
            run.detached.append((router_of[a.link], a.condition))
        perform(a)

    def handle_update_watched(msg: SubUpdate) -> Subscription | None:
        if msg.entry.get("sid") == SID and arrival not in run.events:
            run.events.append(arrival)
        return handle_update(msg)

    r.perform = perform_watched  # type: ignore[method-assign]
    r.node.gossip.handle_update = handle_update_watched  # type: ignore[method-assign]


def _attach(run: Run, r: SimRouter, owner: str) -> None:
    """`owner` attaches at `r` now, through the core's owner rule as the router's adapter does."""
    s, link = run.subs[r.id], run.links[r.id]
    run.events.append(r.id.lower())
    try:
        r.core.refuse_owner(SID, owner)
    except errors.UnauthorizedAccess:
        run.refused_at_attach.add(r.id)
        return
    s.router, s.link, s.open = r.id, link, False
    r.sub_links[SID] = (link, s)
    r.subscriber_attach(link, s, SubscriberAttach(SID, TOPIC, CONTAINER, LINK, math.inf, True, None, None, (),
                                                  owner))


def race(seed: int, d: float, owners: tuple[str, str] = ("alice", "bob")) -> Run:
    """`owners[0]` attaches at A, `owners[1]` at B `d` seconds later (negative: earlier)."""
    sim = _mesh(seed)
    run = Run(sim, owners)
    for rid, owner in zip("AB", owners, strict=True):
        run.subs[rid] = SimSubscriber(f"{owner}@{rid}", SID, [], wants=False)  # (a closed link stays closed)
        run.links[rid] = Token(f"{owner}@{rid}")
    for r in sim.routers.values():
        _watch(run, r)
    opened = sim.sub_opened

    def opened_watched(s: SimSubscriber, link: Token, rid: str, epoch: int | None = None) -> None:
        if s.link is link:
            run.opened.add(rid)
        opened(s, link, rid, epoch)

    sim.sub_opened = opened_watched  # type: ignore[method-assign]
    t0 = sim.now + 0.1
    a, b = sim.routers["A"], sim.routers["B"]
    sim.schedule_at(t0 + max(0.0, -d), lambda: _attach(run, a, owners[0]))
    sim.schedule_at(t0 + max(0.0, d), lambda: _attach(run, b, owners[1]))
    sim.k.run(until=t0 + 3.0)
    return run


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_first_identity_to_attach_holds_it_in_every_interleaving(seed: int) -> None:
    seen: set[str] = set()
    for d in DELAYS:
        run = race(seed, d)
        first, other = ("A", "B") if d >= 0 else ("B", "A")  # (at the same instant: the smaller identity)
        owner = {"A": "alice", "B": "bob"}[first]
        where = f"seed {seed}, bob {d * 1000:+.1f} ms after alice: {run.interleaving()}"
        seen.add(run.interleaving())
        for rid, r in run.sim.routers.items():
            e = r.core.table.get(SID)
            assert e is not None and e.owner == owner, f"{where}: router {rid} gives it to {e and e.owner}"
            assert (e.home, e.state, e.confirmed) == (first, SubState.ACTIVE, True), f"{where}: router {rid}: {e}"
        assert first in run.opened, f"{where}: the first attach was never answered"
        s = run.subs[first]
        assert s.link is run.links[first] and s.open, f"{where}: the first link was closed"
        assert run.sim.routers[first].sub_links[SID][0] is run.links[first], where
        assert not [c for rid, c in run.detached if rid == first], f"{where}: {run.detached}"
        assert other not in run.opened, f"{where}: the other identity's attach was answered"
        assert other in run.refused_at_attach or (other, errors.UnauthorizedAccess.condition) in run.detached, \
            f"{where}: the other identity's claim was not refused: {run.detached}"
        assert errors.LinkStolen.condition not in [c for _, c in run.detached], f"{where}: {run.detached}"
    # every interleaving came (refused at once: the other's announcement came before the attach)
    assert {"a a>B b (refused at once)", "a b a>B b>A", "a b b>A a>B", "b a b>A a>B", "b a a>B b>A",
            "b b>A a (refused at once)"} <= seen, sorted(seen)


def test_the_same_identity_at_two_routers_keeps_todays_rule() -> None:
    """Alice at A and alice again at B, in every interleaving: neither is refused as another
    identity; one link holds it (a link that loses is stolen), and the routers agree."""
    for seed in (1, 2):
        for d in DELAYS:
            run = race(seed, d, owners=("alice", "alice"))
            where = f"seed {seed}, {d * 1000:+.1f} ms: {run.interleaving()}"
            assert not run.refused_at_attach, where
            assert {c for _, c in run.detached} <= {errors.LinkStolen.condition}, f"{where}: {run.detached}"
            entries = {rid: r.core.table.get(SID) for rid, r in run.sim.routers.items()}
            assert len({(e.home, e.epoch, e.state) for e in entries.values() if e is not None}) == 1, \
                f"{where}: {entries}"
            home = entries["A"].home  # type: ignore[union-attr]
            assert run.sim.routers[home].sub_links.get(SID, (None,))[0] is run.links[home], \
                f"{where}: no live link at {home}"
