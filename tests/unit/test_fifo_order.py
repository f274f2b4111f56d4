"""FIFO per publisher: whose order is it? Our clients declare their sequence at attach (their tags'
counter is their publish order); any other client's order is the order its origin received its
messages in, whatever its tags look like (docs/ordering.md, "FIFO per publisher"; docs/clients.md,
"Fixed"). One rule per test on one core, then cores of a mesh wired together through the wire codec
(copies held and released out of order), then a property over whole runs of such a mesh."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from oncemesh.common.ids import counter_seq, global_id, publisher_link_id, subscription_id
from oncemesh.common.vocab import Outcome
from oncemesh.interrouter import codec
from oncemesh.router.actions import Deliver, Forward, SendAck, SendFinal, SendOutcome, SendQuery
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.state import S_SENT
from oncemesh.router.subscriptions import SubscriptionTable

PL = publisher_link_id("jms", "producer")
SCRAMBLED = [b"9", b"3", b"z", b"10", b"1", b"a0", b"07", b"x-1", b"\x00\x07", b"2"]  # counter-like or not


def ended(core: DeliveryCore) -> list[tuple[Any, ...]]:
    return [e for e in core.log if e[0] == "ended"]


class Mesh:
    """Cores of a few routers; one subscription `s` of topic `t` homed at `home`, in every router's
    table (as gossip would have made it). Copies go through the wire codec and wait in `wire` until
    `release` (in any order); everything else is carried at once."""

    def __init__(self, routers: str, home: str, **cfg: Any) -> None:
        self.cores = {r: DeliveryCore(r, SubscriptionTable(), CoreConfig(**cfg)) for r in routers}
        self.now = 0.0
        self.sid = subscription_id("c", "s", "t")
        self.home = home
        for r, core in self.cores.items():
            core.incarnation = "1"
            core.reachable = {x: "1" for x in routers}
            core.mesh_size = len(routers)
            if r == home:
                core.attach_subscriber(object(), self.sid, "t", "c", "s", 60.0, False, None, self.now)
                core.subscriber_credit(self.sid, 1000)
            else:
                core.table.attach(self.sid, "t", "c", "s", 60.0, home, self.now)
        self.wire: list[tuple[str, bytes]] = []  # (destination router, data frame) not delivered yet
        self.delivered: list[tuple[str, bytes]] = []  # (gid, body) handed to `s`, in order
        self.outcomes: dict[object, Outcome] = {}  # publisher delivery -> its outcome
        self.links: dict[str, object] = {}
        self.pump()

    def pump(self) -> None:
        busy = True
        while busy:
            busy = False
            for r, core in self.cores.items():
                out, core.out = core.out, []
                busy = busy or bool(out)
                for a in out:
                    if isinstance(a, Deliver):
                        self.delivered.append((a.gid, a.payload))
                    elif isinstance(a, SendOutcome):
                        assert a.pub not in self.outcomes, "two outcomes"
                        self.outcomes[a.pub] = a.outcome
                    elif isinstance(a, Forward):
                        for dst, sids in a.dests.items():
                            frame = codec.encode_copy_header(r, "1", a.gid, a.topic, {dst: sids}, a.preds, a.deps,
                                                             a.by_arrival) + a.payload
                            self.wire.append((dst, frame))
                    elif isinstance(a, SendAck):
                        self.cores[a.to].handle_ack(a.gid, a.sid, a.state, a.error, self.now)
                    elif isinstance(a, SendFinal):
                        self.cores[a.to].handle_final(a.gid, self.now)
                    elif isinstance(a, SendQuery):
                        self.cores[a.to].handle_query(a.gid, r, self.now)

    def release(self, i: int = 0) -> None:
        """Deliver the copy waiting at index `i` of the wire."""
        dst, frame = self.wire.pop(i)
        c = codec.decode_copy(frame)
        for sid in c.dests[dst]:
            assert sid == self.sid
        self.cores[dst].receive_copy(c.origin, c.inc, c.gid, c.topic, c.dests[dst], c.payload, self.now, c.preds,
                                     c.deps, c.by_arrival)
        self.pump()

    def tick(self, times: int = 1) -> None:
        """(A pass hands a parked copy once the one before it went: copies that came in reverse take
        a tick each, as they do for ours.)"""
        for _ in range(times):
            for core in self.cores.values():
                core.tick(self.now)
            self.pump()

    def attach(self, at: str, second: bool = True) -> None:
        link = self.links[at] = object()
        self.cores[at].attach_publisher(link, PL, "t", second, None, self.now)
        self.pump()

    def detach(self, at: str) -> None:
        self.cores[at].detach_publisher(self.links.pop(at))
        self.pump()

    def publish(self, at: str, tag: bytes, body: bytes) -> object:
        tok = object()
        self.cores[at].publish(self.links[at], tok, tag, body, self.now)
        self.pump()
        return tok

    def accept(self, gid: str) -> None:
        self.cores[self.home].subscriber_outcome(self.sid, gid, Outcome.ACCEPTED, False, None, False, self.now)
        self.pump()

    def settle(self, at: str, tok: object) -> None:
        self.cores[at].publisher_settled(tok, self.now)
        self.pump()


class One:
    """One core, one subscription `s` of topic `t`, one publisher link."""

    def __init__(self, **cfg: Any) -> None:
        self.core = DeliveryCore("R", SubscriptionTable(), CoreConfig(**cfg))
        self.core.incarnation = "1"
        self.now = 0.0
        self.sid = subscription_id("c", "s", "t")
        self.core.attach_subscriber(object(), self.sid, "t", "c", "s", 60.0, False, None, self.now)
        self.core.subscriber_credit(self.sid, 1000)
        self.link: object = None
        self.take()

    def take(self) -> list[object]:
        out, self.core.out = self.core.out, []
        return out

    def attach(self, second: bool = True, in_doubt: list[bytes] | None = None) -> None:
        if self.link is not None:
            self.core.detach_publisher(self.link)
        self.link = object()
        self.core.attach_publisher(self.link, PL, "t", second, in_doubt, self.now)
        self.take()

    def send(self, tag: bytes, body: bytes) -> tuple[object, str, list[object]]:
        tok = object()
        gid = self.core.publish(self.link, tok, tag, body, self.now)
        return tok, gid, self.take()

    def accept(self, gid: str) -> list[object]:
        self.core.subscriber_outcome(self.sid, gid, Outcome.ACCEPTED, False, None, False, self.now)
        return self.take()


def handed(acts: list[object]) -> list[bytes]:
    return [a.payload for a in acts if isinstance(a, Deliver)]


def told(acts: list[object]) -> dict[object, Outcome]:
    return {a.pub: a.outcome for a in acts if isinstance(a, SendOutcome)}


# ------------------------------------------------------------------ one router


def test_a_client_not_ours_is_handed_in_arrival_order_whatever_its_tags() -> None:
    """Tags going down, up, counter-like or not: handed in the order they came, each ACCEPTED only
    once the subscriber accepted it, nothing ended."""
    r = One()
    r.core.subscriber_credit(r.sid, 0)  # queued first, then handed as credit comes
    r.attach(second=True)
    bodies = [b"m%d" % i for i in range(len(SCRAMBLED))]
    sent = [r.send(tag, body) for tag, body in zip(SCRAMBLED, bodies, strict=True)]
    assert all(not handed(acts) and not told(acts) for _, _, acts in sent)
    got: list[bytes] = []
    for _ in bodies:  # one credit at a time
        r.core.subscriber_credit(r.sid, 1)
        got += handed(r.take())
    assert got == bodies
    for tok, gid, _ in reversed(sent):  # accepted in any order: each told when accepted, not before
        assert r.core.records[gid].owed[r.sid] is S_SENT
        assert told(r.accept(gid)) == {tok: Outcome.ACCEPTED}
    assert not ended(r.core)


def test_tags_started_again_after_the_router_forgot_them_are_handed() -> None:
    """A client not ours starts its tags again on a new connection (Qpid JMS, a restarted process
    with the same container id) once the router forgot the old ones: its "1" after a handed "9" is
    a new message under its plain gid, and it is handed (before: ended, ACCEPTED without it)."""
    r = One(final_memory=10.0, final_memory_young=1.0)
    r.attach(second=True)
    for n in range(1, 10):
        tok, gid, _ = r.send(b"%d" % n, b"old%d" % n)
        r.accept(gid)
        r.core.publisher_settled(tok, r.now)
    r.take()
    r.now += 30.0
    r.core.tick(r.now)
    r.attach(second=True)
    for n in (1, 2, 3):
        tok, gid, acts = r.send(b"%d" % n, b"new%d" % n)
        assert counter_seq(gid) == n, "its plain gid (the router forgot the old one)"
        assert handed(acts) == [b"new%d" % n] and not told(acts)
        assert told(r.accept(gid)) == {tok: Outcome.ACCEPTED}
    assert not ended(r.core)


def test_ours_keep_their_order_by_tag() -> None:
    """Our clients declared their order (a publisher link with `oncemesh.in-doubt`): exactly as
    before, an earlier message that comes after a later one was handed was not owed to the
    subscription then, and ends for it (docs/ordering.md, "Late messages")."""
    r = One()
    r.attach(second=True, in_doubt=[])
    _, g5, acts = r.send(b"5", b"five")
    assert handed(acts) == [b"five"] and r.core.records[g5].seq == 5
    tok, g3, acts = r.send(b"3", b"three")
    assert handed(acts) == [] and told(acts) == {tok: Outcome.ACCEPTED}
    assert [(e[1], e[4]) for e in ended(r.core)] == [(g3, "fifo: a later message was handed first")]


# ------------------------------------------------------------------ across a mesh


def test_a_copy_header_says_when_the_order_is_the_arrival_order() -> None:
    """The flag travels as an optional eighth element of the copy header, only for a publisher that
    declared no order: copies of ours are byte for byte what they were."""
    dests = {"B": ("s1",)}
    g = global_id(PL, b"5")
    ours = codec.encode_copy_header("A", "1", g, "t", dests, (global_id(PL, b"4"),))
    assert ours == codec.encode_copy_header("A", "1", g, "t", dests, (global_id(PL, b"4"),), (), False)
    assert not codec.decode_copy(ours + b"x").by_arrival
    for preds in ((), (global_id(PL, b"4"),)):
        c = codec.decode_copy(codec.encode_copy_header("A", "1", g, "t", dests, preds, (), True) + b"x")
        assert c.by_arrival and c.preds == preds and c.deps == () and c.payload == b"x"
    bare = codec.decode_copy(codec.encode_copy_header("A", "1", g, "t", dests) + b"x")
    assert not bare.by_arrival and bare.preds == ()


def test_a_remote_subscription_is_handed_a_client_not_ours_in_arrival_order() -> None:
    """The publisher is at A, the subscription at B; the copies reach B in the reverse order. B
    holds each behind the one before it at A (the chain's predecessors) and never reads the tags as
    an order: all handed in arrival order at A, each ACCEPTED once accepted."""
    m = Mesh("AB", home="B")
    m.attach("A")
    bodies = [b"m%d" % i for i in range(len(SCRAMBLED))]
    toks = [m.publish("A", tag, body) for tag, body in zip(SCRAMBLED, bodies, strict=True)]
    assert len(m.wire) == len(bodies) and not m.delivered
    while m.wire:
        m.release(len(m.wire) - 1)  # the latest first
    m.tick(len(bodies))
    assert [b for _, b in m.delivered] == bodies
    assert not m.outcomes
    for gid, _ in m.delivered:
        m.accept(gid)
    assert m.outcomes == {t: Outcome.ACCEPTED for t in toks}
    assert not ended(m.cores["B"]) and not ended(m.cores["A"])


def test_tags_started_again_at_another_router_are_handed_at_the_remote_subscription() -> None:
    """Three routers: the publisher's first connection (at A) sent 1..9, all handed at B and final;
    later (the mesh forgot them) its new connection at C starts its tags again. C's copies say the
    order is the arrival order: B hands them (before: B read "1" as earlier than the "9" it had
    handed and ended them, C told the publisher ACCEPTED)."""
    m = Mesh("ABC", home="B", final_memory=10.0, final_memory_young=1.0)
    m.attach("A")
    for n in range(1, 10):
        tok = m.publish("A", b"%d" % n, b"old%d" % n)
        m.release()
        m.accept(m.delivered[-1][0])
        m.settle("A", tok)
    m.detach("A")
    m.now += 30.0
    m.tick()
    m.attach("C")
    toks = [m.publish("C", b"%d" % n, b"new%d" % n) for n in (1, 2, 3)]
    while m.wire:
        m.release(len(m.wire) - 1)
    m.tick(3)
    assert [b for _, b in m.delivered[9:]] == [b"new1", b"new2", b"new3"]
    assert [counter_seq(g) for g, _ in m.delivered[9:]] == [1, 2, 3]  # their plain gids
    for gid, _ in m.delivered[9:]:
        m.accept(gid)
    assert m.outcomes.keys() >= set(toks) and all(m.outcomes[t] is Outcome.ACCEPTED for t in toks)
    assert not ended(m.cores["B"])


def test_a_backlog_is_handed_after_failover_while_the_publisher_has_not_settled() -> None:
    """Issue 31, item 14. A --- B --- C; the publisher at A never settles (a library bug: it sees
    the outcomes but settles nothing), so nothing it published becomes final. The subscription, homed
    at B, accepted m0..m3 there; B dies with the copies of m4..m6 and the subscription resumes at C.
    A re-routes m4..m6 to C. m4's predecessor m3 is not known at C, and asking the mesh whether it is
    final gets no answer (it never will be): C held the whole backlog, credit and all, for
    `final_memory`. The origin knows m3 is resolved for the subscription (accepted at B), so its
    copies do not make C wait for it: C hands the backlog, in order, at once."""
    m = Mesh("ABC", home="B")
    m.attach("A", second=True)
    for i in range(4):
        m.publish("A", b"%d" % i, b"m%d" % i)
        m.release()
        m.accept(m.delivered[-1][0])
    assert len(m.outcomes) == 4  # decided at A, told to the publisher, which never settles
    later = [m.publish("A", b"%d" % i, b"m%d" % i) for i in (4, 5, 6)]
    assert len(m.wire) == 3
    m.wire.clear()  # lost with B
    a, c = m.cores["A"], m.cores["C"]
    for core in (a, c):
        core.set_reachable({"A": "1", "C": "1"}, m.now)
    m.pump()
    m.wire.clear()  # (B is unreachable: nothing is routed there)
    m.now += 5.0
    assert c.attach_subscriber(object(), m.sid, "t", "c", "s", 60.0, False, None, m.now)
    c.subscriber_credit(m.sid, 100)
    old = a.table.merge(c.table.get(m.sid))  # (the announcement of its move, as gossip carries it)
    assert old is not None
    a.subscription_changed(old, m.now)
    m.home = "C"
    m.pump()
    while m.wire:
        m.release()
    for _ in range(3):
        m.now += 1.0
        m.tick()
    assert [b for _, b in m.delivered[4:]] == [b"m4", b"m5", b"m6"], "the backlog at C was not handed"
    for gid, _ in m.delivered[4:]:
        m.accept(gid)
    assert all(m.outcomes[t] is Outcome.ACCEPTED for t in later)
    assert not ended(c) and not ended(a)


# ------------------------------------------------------------------ the property


@settings(max_examples=200, deadline=None)
@given(tags=st.lists(st.text(alphabet="0123456789abz-", min_size=1, max_size=3), min_size=1, max_size=12,
                     unique=True),
       steps=st.lists(st.tuples(st.sampled_from(["publish", "release", "accept", "tick"]), st.integers(0, 64)),
                      max_size=60))
def test_a_client_not_ours_is_handed_everything_in_arrival_order_across_a_mesh(
        tags: list[str], steps: list[tuple[str, int]]) -> None:
    """Whatever its tags (distinct, in any order), whatever order its copies reach the subscription's
    router in, and whenever the subscriber accepts: every message is handed exactly once, in the
    order the origin received them, none ends, and each is ACCEPTED only after it was accepted."""
    m = Mesh("AB", home="B")
    m.attach("A")
    toks: list[object] = []
    body_of: dict[object, bytes] = {}
    accepted: set[bytes] = set()

    def publish() -> None:
        tok = m.publish("A", tags[len(toks)].encode(), b"m%d" % len(toks))
        toks.append(tok)
        body_of[tok] = b"m%d" % (len(toks) - 1)

    def accept(i: int) -> None:
        rt = m.cores["B"].subs[m.sid]
        on_link = sorted(g for g in rt.on_link if g in rt.owed)  # handed, not accepted yet
        if on_link:
            gid = on_link[i % len(on_link)]
            accepted.add(m.cores["B"].records[gid].payload)
            m.accept(gid)

    def check() -> None:
        for tok, outcome in m.outcomes.items():
            assert outcome is Outcome.ACCEPTED and body_of[tok] in accepted, "told before it was accepted"

    for op, arg in steps:
        if op == "publish" and len(toks) < len(tags):
            publish()
        elif op == "release" and m.wire:
            m.release(arg % len(m.wire))
        elif op == "accept":
            accept(arg)
        elif op == "tick":
            m.now += 0.1
            m.tick()
        check()
    while len(toks) < len(tags):
        publish()
    while m.wire:  # the faults heal: every copy arrives, the subscriber accepts everything
        m.release(0)
    for _ in range(2 * len(toks) + 2):
        accept(0)
        m.now += 0.1
        m.tick()
        check()
    assert [b for _, b in m.delivered] == [body_of[t] for t in toks], "not in arrival order, or not once"
    assert m.outcomes == {t: Outcome.ACCEPTED for t in toks}
    assert not ended(m.cores["B"]) and not ended(m.cores["A"])
