"""`router.order.causal`: version vectors, the publishing side, the hold-back per subscription.

The random histories (Hypothesis) play clients that publish on 2-3 topics, each on one link per
topic, and receive through subscriptions on one or two topics; the network delays, reorders and
duplicates; subscriptions start late, with a start per link that need not be a consistent cut. The
ground truth is each message's exact causal past as a set of message ids, computed without version
vectors. Checked at every delivery: no message twice, and every message of the causal past that
the subscription is owed was delivered before. At the end: everything owed was delivered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from oncemesh.router.order.causal import (
    CausalBuffer,
    CausalDeliver,
    CausalTracker,
    HoldBackFull,
    VersionVector,
)

VV = VersionVector.of


# -- version vectors ----------------------------------------------------------------------------

vvs = st.dictionaries(st.sampled_from("pqrs"), st.integers(0, 6)).map(VV)


@given(vvs, vvs, vvs)
def test_merge_is_a_join(a: VersionVector, b: VersionVector, c: VersionVector) -> None:
    assert a.merge(b) == b.merge(a)
    assert a.merge(b).merge(c) == a.merge(b.merge(c))
    assert a.merge(a) == a
    assert a.merge(b).dominates(a) and a.merge(b).dominates(b)
    assert a.dominates(b) == (a.merge(b) == a)


@given(vvs, vvs)
def test_reduce_drops_exactly_the_implied_entries(a: VersionVector, floor: VersionVector) -> None:
    r = a.reduce(floor)
    assert all(s > floor.get(p) for p, s in r)
    assert r.merge(floor).dominates(a)  # nothing a needs is lost once floor is known resolved
    assert a.reduce(a) == VersionVector()


def test_vectors_are_reduced_to_the_publishers_they_name() -> None:
    v = VV({"p": 3, "q": 0})
    assert v.entries == (("p", 3),) and v.get("q") == 0 and len(v) == 1
    assert v.with_entry("q", 2).as_dict() == {"p": 3, "q": 2}
    assert v.with_entry("p", 1) == v and v.without("p") == VersionVector()


# -- publishing side -----------------------------------------------------------------------------

def test_tracker_numbers_each_link_and_leaves_out_its_own_entry() -> None:
    t = CausalTracker()
    assert t.next_message("x") == (1, VersionVector())
    assert t.next_message("x") == (2, VersionVector())  # x:1 is implied by seq 2
    assert t.next_message("y") == (1, VV({"x": 2}))  # the client's other link is a dependency


def test_tracker_closes_over_what_handed_messages_depended_on() -> None:
    """a (p) -> c (q, handed a) -> b: the client that only got c still depends on a."""
    t = CausalTracker()
    t.handed("q", 4, VV({"p": 7}))
    seq, deps = t.next_message("me")
    assert deps == VV({"p": 7, "q": 4})
    t.handed("p", 2, VersionVector())  # older news changes nothing
    assert t.next_message("me")[1] == VV({"p": 7, "q": 4})


def test_tracker_forgets_entries_declared_stable() -> None:
    t = CausalTracker()
    t.handed("q", 4, VV({"p": 7}))
    t.stable(VV({"p": 9, "q": 2}))
    assert t.next_message("me")[1] == VV({"q": 4})


# -- the hold-back -------------------------------------------------------------------------------

def ids(out: list[CausalDeliver]) -> list[str]:
    return [d.msg_id for d in out]


def test_a_publishers_messages_come_out_in_seq_order() -> None:
    b = CausalBuffer()
    assert ids(b.offer("p3", "p", 3, VersionVector(), 0.0)) == []
    assert ids(b.offer("p2", "p", 2, VersionVector(), 0.0)) == []
    assert ids(b.offer("p1", "p", 1, VersionVector(), 0.0)) == ["p1", "p2", "p3"]
    assert b.pending == 0 and b.frontier("p") == 3


def test_a_message_waits_for_its_dependencies_on_other_publishers() -> None:
    b = CausalBuffer()
    assert ids(b.offer("b", "q", 1, VV({"p": 2}), 0.0)) == []
    assert ids(b.offer("p1", "p", 1, VersionVector(), 0.0)) == ["p1"]
    assert b.waiting_on() == {"p": 2}  # the next one it needs from p
    assert ids(b.offer("p2", "p", 2, VersionVector(), 0.0)) == ["p2", "b"]


def test_a_message_offered_twice_is_delivered_once() -> None:
    b = CausalBuffer()
    b.offer("b", "q", 1, VV({"p": 1}), 0.0)
    assert b.offer("b", "q", 1, VV({"p": 1}), 0.0) == []  # held: ignored
    assert ids(b.offer("a", "p", 1, VersionVector(), 0.0)) == ["a", "b"]
    assert b.offer("a", "p", 1, VersionVector(), 0.0) == []  # delivered: ignored
    assert b.duplicates == 2 and b.delivered == 2


def test_a_dependency_on_a_topic_not_subscribed_is_resolved_by_declaring_it_not_owed() -> None:
    """a' (x1, topic X) -> a (y1, topic Y) -> b (x2, topic X); the subscription gets X only.
    b's vector names both y1:1 and x1:1 (the closure): b still waits for a' after y1 is cleared."""
    b = CausalBuffer()
    assert ids(b.offer("b", "x2", 1, VV({"y1": 1, "x1": 1}), 0.0)) == []
    assert ids(b.not_owed("y1")) == []
    assert b.waiting_on() == {"x1": 1}
    assert ids(b.offer("a'", "x1", 1, VersionVector(), 0.0)) == ["a'", "b"]
    assert b.offer("y", "y1", 5, VersionVector(), 0.0) == []  # not owed: never delivered


def test_messages_published_before_the_subscription_are_not_waited_for() -> None:
    b = CausalBuffer()
    b.not_owed("p", 4)
    assert ids(b.offer("q1", "q", 1, VV({"p": 3}), 0.0)) == ["q1"]
    assert ids(b.offer("p5", "p", 5, VersionVector(), 0.0)) == ["p5"]
    assert b.offer("p4", "p", 4, VersionVector(), 0.0) == []  # it did show up after all: dropped


def test_a_lost_message_is_skipped_and_later_ones_flow() -> None:
    b = CausalBuffer()
    b.offer("p1", "p", 1, VersionVector(), 0.0)
    assert ids(b.offer("p3", "p", 3, VersionVector(), 0.0)) == []
    assert ids(b.known_lost("p", 4)) == []  # a hole above the frontier is remembered
    assert ids(b.offer("p5", "p", 5, VersionVector(), 0.0)) == []
    assert ids(b.known_lost("p", 2)) == ["p3", "p5"]
    assert b.frontier("p") == 5 and b._holes == {}


def test_waiting_on_reports_what_blocked_for_long() -> None:
    b = CausalBuffer()
    b.offer("b", "q", 1, VV({"p": 2}), now=10.0)
    b.offer("c", "r", 1, VV({"s": 1}), now=14.0)
    assert b.waiting_on(now=15.0, older_than=3.0) == {"p": 1}
    assert b.waiting_on(now=15.0) == {"p": 1, "s": 1}


def test_the_hold_back_is_bounded() -> None:
    b = CausalBuffer(max_pending=2)
    b.offer("a", "p", 5, VersionVector(), 0.0)
    b.offer("b", "p", 6, VersionVector(), 0.0)
    with pytest.raises(HoldBackFull) as exc:
        b.offer("c", "p", 7, VersionVector(), 0.0)
    assert exc.value.condition == "amqp:resource-limit-exceeded"
    assert b.pending == 2
    assert ids(b.offer("d", "p", 1, VersionVector(), 0.0)) == ["d"]  # deliverable at once: taken even when full
    with pytest.raises(HoldBackFull):
        b.offer("e", "p", 4, VersionVector(), 0.0)  # ... unless it must be held
    assert ids(b.offer("f", "p", 2, VersionVector(), 0.0)) == ["f"]
    assert ids(b.known_lost("p", 3)) == []
    assert ids(b.offer("e", "p", 4, VersionVector(), 0.0)) == ["e", "a", "b"]


# -- random causal histories ---------------------------------------------------------------------

@dataclass
class Msg:
    link: str
    seq: int
    topic: str
    deps: VersionVector
    past: frozenset[str]


@dataclass
class Sub:
    owner: int
    topics: frozenset[str]
    start: dict[str, int]
    buf: CausalBuffer = field(default_factory=CausalBuffer)
    got: list[str] = field(default_factory=list)
    owed: set[str] = field(default_factory=set)


class World:
    def __init__(self, n_clients: int, topics: str) -> None:
        self.topics = topics
        self.trackers = [CausalTracker() for _ in range(n_clients)]
        self.past: list[set[str]] = [set() for _ in range(n_clients)]
        self.msgs: dict[str, Msg] = {}
        self.seq: dict[str, int] = {}
        self.subs: list[Sub] = []
        self.net: list[tuple[Sub, str]] = []  # in flight, any order

    def owed(self, sub: Sub, m: Msg) -> bool:
        return m.topic in sub.topics and m.seq > sub.start.get(m.link, 0)

    def subscribe(self, owner: int, topics: frozenset[str], late: list[int]) -> None:
        start = {link: n + late[i % len(late)] for i, (link, n) in enumerate(sorted(self.seq.items()))
                 if self.msgs[f"{link}#1"].topic in topics}
        sub = Sub(owner, topics, start)
        for link, upto in start.items():
            if upto:
                self.apply(sub, sub.buf.not_owed(link, upto))
        self.subs.append(sub)

    def publish(self, c: int, topic: str) -> None:
        link = f"c{c}{topic}"
        seq, deps = self.trackers[c].next_message(link)
        mid = f"{link}#{seq}"
        m = Msg(link, seq, topic, deps, frozenset(self.past[c]))
        self.msgs[mid] = m
        self.seq[link] = seq
        self.past[c].add(mid)
        for sub in self.subs:
            if self.owed(sub, m):
                sub.owed.add(mid)
                self.net.append((sub, mid))

    def arrive(self, i: int, dup: bool) -> None:
        sub, mid = self.net[i] if dup else self.net.pop(i)
        m = self.msgs[mid]
        self.apply(sub, sub.buf.offer(mid, m.link, m.seq, m.deps, 0.0))

    def resolve(self) -> None:
        """The caller's part: links of topics a subscription does not get are declared not owed."""
        for sub in self.subs:
            while foreign := [p for p in sub.buf.waiting_on() if self.msgs[f"{p}#1"].topic not in sub.topics]:
                for link in foreign:
                    self.apply(sub, sub.buf.not_owed(link))

    def apply(self, sub: Sub, out: list[CausalDeliver]) -> None:
        for d in out:
            m = self.msgs[d.msg_id]
            assert (d.publisher, d.seq) == (m.link, m.seq)
            assert d.msg_id not in sub.got, f"{d.msg_id} delivered twice"
            missing = sorted(a for a in m.past if self.owed(sub, self.msgs[a]) and a not in sub.got)
            assert not missing, f"{d.msg_id} delivered before its causal past {missing}"
            sub.got.append(d.msg_id)
            self.trackers[sub.owner].handed(m.link, m.seq, m.deps)
            self.past[sub.owner] |= m.past | {d.msg_id}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n_clients=st.integers(2, 4), topics=st.sampled_from(["XY", "XYZ"]))
def test_random_histories_deliver_in_causal_order_once_and_completely(data: st.DataObject, n_clients: int,
                                                                      topics: str) -> None:
    w = World(n_clients, topics)
    topic_sets = st.frozensets(st.sampled_from(topics), min_size=1, max_size=2)
    for c in range(n_clients):
        if data.draw(st.booleans()):
            w.subscribe(c, data.draw(topic_sets), [0])
    for _ in range(data.draw(st.integers(5, 60))):
        step = data.draw(st.sampled_from(["publish", "publish", "arrive", "arrive", "arrive", "dup",
                                          "subscribe", "resolve"]))
        if step == "publish":
            w.publish(data.draw(st.integers(0, n_clients - 1)), data.draw(st.sampled_from(topics)))
        elif step in ("arrive", "dup") and w.net:
            w.arrive(data.draw(st.integers(0, len(w.net) - 1)), step == "dup")
        elif step == "subscribe":
            w.subscribe(data.draw(st.integers(0, n_clients - 1)), data.draw(topic_sets),
                        data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=3)))
        elif step == "resolve":
            w.resolve()
    while w.net:  # heal: everything in flight arrives, in an order of Hypothesis's choosing
        w.arrive(data.draw(st.integers(0, len(w.net) - 1)), False)
    w.resolve()
    for sub in w.subs:
        assert set(sub.got) == sub.owed, f"owed but never delivered: {sorted(sub.owed - set(sub.got))}"
        assert sub.buf.pending == 0
