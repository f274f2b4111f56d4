"""The delivery core against a model of its clients, under random schedules (Hypothesis).

The machine plays publishers and subscribers exactly as our client library does (a subscriber keeps
a deduplication store of handed-over ids and presents the unsettled ones when it resumes; a publisher
resends everything in doubt after a reconnect and declares its in-doubt tags), and interleaves
attaches, detaches, unsubscribes, lost acknowledgements, link drops, expiry and router restarts
(the core is rebuilt from its persisted subscription table). It checks the promises of docs/promises.md
as invariants:

- never a duplicate: the core never hands a gid to a subscription whose client already has it in
  its store (a router-side guarantee, independent of the client's dedup), and nothing is handed to
  an application twice;
- truthful outcomes: when a publisher is told ACCEPTED, every subscription in force for the message
  has handed it over or has ended;
- settled means final: after the core settles (or reports final) a gid to a subscription, it never
  delivers it to that subscription again;
- liveness and bounded memory: once faults stop and everyone reconnects and acknowledges, every
  message owed to a live subscription was handed over exactly once, every publisher got its outcome,
  and the core holds no records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from oncemesh.common.ids import counter_tag, global_id, publisher_link_id, subscription_id
from oncemesh.common.vocab import Outcome
from oncemesh.router.actions import (
    Announce,
    Deliver,
    GrantCredit,
    NotifyFinal,
    SendOutcome,
    SettleDelivery,
    SettlePublisher,
)
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.subscriptions import SubscriptionTable

TOPIC = "t"
N_SUBS = 3
N_PUBS = 2


@dataclass
class SubClient:
    name: str
    sid: str
    expiry: float
    link: object | None = None
    credit: int = 0
    life: int = 0  # the model's idea of which life of the subscription this is
    arrived: list[str] = field(default_factory=list)  # delivered on the current link, not acknowledged
    on_link: set[str] = field(default_factory=set)  # unsettled deliveries on the current link
    accepted: set[str] = field(default_factory=set)  # store: handed over, not seen settled
    settled: set[str] = field(default_factory=set)  # store: handed over and settled
    final_seen: set[str] = field(default_factory=set)  # gids the router declared final to us


@dataclass
class PubClient:
    name: str
    plid: str
    link: object | None = None
    credit: int = 0
    seq: int = 0
    in_doubt: dict[str, bytes] = field(default_factory=dict)  # gid -> tag, sent, no outcome yet
    token_of: dict[object, str] = field(default_factory=dict)  # live delivery token -> gid
    to_settle: list[object] = field(default_factory=list)  # outcome received, not yet settled


class Token:
    """A publisher delivery or link handle (identity-hashed, like Proton pointers)."""

    __slots__ = ("label",)

    def __init__(self, label: str) -> None:
        self.label = label

    def __repr__(self) -> str:
        return self.label


class CoreMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.now = 1000.0
        self.cfg = CoreConfig(max_inflight_messages=12, link_credit=4, max_redeliveries=2,
                              placeholder_horizon=1e9, orphan_horizon=1e9)
        self.core = DeliveryCore("R", SubscriptionTable(), self.cfg)
        self.subs = [SubClient(f"s{i}", subscription_id("c-sub", f"s{i}", TOPIC), expiry=[30.0, 0.0, math.inf][i])
                     for i in range(N_SUBS)]
        self.pubs = [PubClient(f"p{i}", publisher_link_id("c-pub", f"p{i}")) for i in range(N_PUBS)]
        self.sub_of = {s.sid: s for s in self.subs}
        self.handed: dict[tuple[str, int, str], int] = {}  # (sid, life, gid) -> hand-overs
        self.owed: dict[str, set[tuple[str, int]]] = {}  # gid -> {(sid, life)} in force at publish
        self.ended_lives: set[tuple[str, int]] = set()
        self.outcomes: dict[str, Outcome] = {}
        self.n = 0
        self.restarts = 0

    # ------------------------------------------------------------------ helpers
    def _token(self, label: str) -> Token:
        self.n += 1
        return Token(f"{label}#{self.n}")

    def _live(self, s: SubClient) -> bool:
        sub = self.core.table.get(s.sid)
        return sub is not None and sub.live

    def _sync_lives(self) -> None:
        """Subscriptions the core ended (expiry, not-durable detach) start a new life next time."""
        for s in self.subs:
            if (s.sid, s.life) not in self.ended_lives and s.life > 0 and not self._live(s):
                self.ended_lives.add((s.sid, s.life))

    def _process(self) -> None:
        self._sync_lives()  # the core may have ended subscriptions in the call that produced these
        while self.core.out:
            acts, self.core.out = self.core.out, []
            for a in acts:
                self._act(a)
        self.core.log.clear()
        self._sync_lives()

    def _act(self, a: object) -> None:
        if isinstance(a, Deliver):
            s = self.sub_of[a.sid]
            assert s.link is not None, "delivered to a subscription without a link"
            assert a.gid not in s.on_link, f"{a.gid} delivered twice on one link"
            assert a.gid not in s.accepted and a.gid not in s.settled, \
                f"router handed {a.gid} again to {s.name}, whose client already has it"
            assert a.gid not in s.final_seen, f"{a.gid} delivered to {s.name} after it was declared final"
            assert s.credit > 0, "delivered without credit"
            s.credit -= 1
            s.on_link.add(a.gid)
            s.arrived.append(a.gid)
        elif isinstance(a, SettleDelivery):
            s = self.sub_of[a.sid]
            assert a.gid in s.on_link, f"settled {a.gid} that is not on {s.name}'s link"
            s.on_link.discard(a.gid)
            if a.gid in s.arrived:
                s.arrived.remove(a.gid)
            self._final(s, a.gid)
        elif isinstance(a, NotifyFinal):
            s = self.sub_of[a.sid]
            assert s.credit > 0
            s.credit -= 1
            for g in a.gids:
                self._final(s, g)
        elif isinstance(a, SendOutcome):
            pub, gid = self._pub_of_token(a.pub)
            if a.outcome is Outcome.ACCEPTED:
                for sid, life in self.owed.get(gid, ()):
                    s = self.sub_of[sid]
                    ok = self.handed.get((sid, life, gid), 0) == 1 or (sid, life) in self.ended_lives
                    assert ok, f"false ACCEPTED: {gid} not handed to {s.name} (life {life}), which is in force"
            self.outcomes[gid] = a.outcome
            pub.in_doubt.pop(gid, None)
            if a.settle:
                pub.token_of.pop(a.pub, None)
            else:
                pub.to_settle.append(a.pub)
        elif isinstance(a, SettlePublisher | Announce):
            pass
        elif isinstance(a, GrantCredit):
            pub = next(p for p in self.pubs if p.link is a.link)
            pub.credit += a.credit
        else:
            raise AssertionError(f"unexpected action {a!r}")

    def _final(self, s: SubClient, gid: str) -> None:
        s.final_seen.add(gid)
        if gid in s.accepted:
            s.accepted.discard(gid)
            s.settled.add(gid)

    def _pub_of_token(self, tok: object) -> tuple[PubClient, str]:
        for p in self.pubs:
            if tok in p.token_of:
                return p, p.token_of[tok]
        raise AssertionError(f"outcome for unknown publisher delivery {tok!r}")

    # ------------------------------------------------------------------ subscribers
    @rule(i=st.integers(0, N_SUBS - 1), credit=st.integers(0, 6))
    def sub_attach(self, i: int, credit: int) -> None:
        s = self.subs[i]
        if s.link is not None:
            return
        was_live = self._live(s)
        s.link = self._token(f"sublink-{s.name}")
        s.credit = 0
        s.arrived.clear()
        s.on_link.clear()
        s.final_seen.clear()
        resumed = self.core.attach_subscriber(s.link, s.sid, TOPIC, "c-sub", s.name, s.expiry, True,
                                              sorted(s.accepted), self.now)
        assert resumed == was_live
        if not resumed:
            s.life += 1
        s.credit = credit
        self.core.subscriber_credit(s.sid, credit)
        self._process()

    @rule(i=st.integers(0, N_SUBS - 1), closed=st.booleans())
    def sub_detach(self, i: int, closed: bool) -> None:
        s = self.subs[i]
        if s.link is None:
            return
        self.core.detach_subscriber(s.link, s.sid, closed, self.now)
        s.link = None
        s.arrived.clear()
        s.on_link.clear()
        if closed:  # unsubscribe: the client forgets its store
            self.ended_lives.add((s.sid, s.life))
            s.accepted.clear()
            s.settled.clear()
        self._process()

    @rule(i=st.integers(0, N_SUBS - 1), more=st.integers(1, 5))
    def sub_credit(self, i: int, more: int) -> None:
        s = self.subs[i]
        if s.link is None:
            return
        s.credit += more
        self.core.subscriber_credit(s.sid, s.credit)
        self._process()

    @rule(i=st.integers(0, N_SUBS - 1), k=st.integers(0, 5),
          what=st.sampled_from(["accept", "accept", "accept", "reject", "release", "modified", "lost-ack"]))
    def sub_acknowledge(self, i: int, k: int, what: str) -> None:
        s = self.subs[i]
        if s.link is None or not s.arrived:
            return
        gid = s.arrived.pop(k % len(s.arrived))
        if what in ("accept", "lost-ack"):
            key = (s.sid, s.life, gid)
            self.handed[key] = self.handed.get(key, 0) + 1
            s.accepted.add(gid)
            if what == "lost-ack":  # handed over, then the connection dropped before ACCEPTED left
                self.core.detach_subscriber(s.link, s.sid, False, self.now)
                s.link = None
                s.arrived.clear()
                s.on_link.clear()
            else:
                self.core.subscriber_outcome(s.sid, gid, Outcome.ACCEPTED, False, None, False, self.now)
        elif what == "reject":
            self.core.subscriber_outcome(s.sid, gid, Outcome.REJECTED, False, ("app:bad", "no"), False, self.now)
        else:
            s.on_link.discard(gid)  # the adapter settles released/modified deliveries at once
            outcome = Outcome.RELEASED if what == "release" else Outcome.MODIFIED
            self.core.subscriber_outcome(s.sid, gid, outcome, True, None, False, self.now)
        self._process()

    # ------------------------------------------------------------------ publishers
    @rule(j=st.integers(0, N_PUBS - 1))
    def pub_attach(self, j: int) -> None:
        p = self.pubs[j]
        if p.link is not None:
            return
        p.link = self._token(f"publink-{p.name}")
        p.credit = 0
        p.token_of.clear()
        p.to_settle.clear()
        second = j == 0  # p0 runs receiver-settle-mode second (exactly-once), p1 mode first
        self.core.attach_publisher(p.link, p.plid, TOPIC, second, list(p.in_doubt.values()), self.now)
        self._process()
        for gid, tag in list(p.in_doubt.items()):  # resend everything in doubt, same tags
            if p.credit <= 0:
                break
            self._send(p, gid, tag)

    def _send(self, p: PubClient, gid: str, tag: bytes) -> None:
        tok = self._token(f"pub-{gid}")
        p.token_of[tok] = gid
        p.credit -= 1
        self.core.publish(p.link, tok, tag, b"payload-" + tag, self.now)
        self._process()

    @rule(j=st.integers(0, N_PUBS - 1))
    def publish(self, j: int) -> None:
        p = self.pubs[j]
        if p.link is None or p.credit <= 0:
            return
        tag = counter_tag(p.seq)
        p.seq += 1
        gid = global_id(p.plid, tag)
        assert gid not in self.owed
        self.owed[gid] = {(s.sid, s.life) for s in self.subs if self._live(s)}
        p.in_doubt[gid] = tag
        self._send(p, gid, tag)

    @rule(j=st.integers(0, N_PUBS - 1))
    def pub_settle(self, j: int) -> None:
        p = self.pubs[j]
        toks, p.to_settle = p.to_settle, []
        for tok in toks:
            p.token_of.pop(tok, None)
            self.core.publisher_settled(tok, self.now)
        self._process()

    @rule(j=st.integers(0, N_PUBS - 1))
    def pub_drop(self, j: int) -> None:
        p = self.pubs[j]
        if p.link is None:
            return
        self.core.detach_publisher(p.link)
        p.link = None
        p.token_of.clear()
        p.to_settle.clear()  # never settled: still "in doubt"? no: outcome known, but unsettled
        self._process()

    # ------------------------------------------------------------------ time and crashes
    @rule(dt=st.sampled_from([0.5, 5.0, 40.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.core.tick(self.now)
        self._process()

    @precondition(lambda self: self.restarts < 3)
    @rule()
    def router_restart(self) -> None:
        """SIGKILL: only the persisted subscription table survives; every link drops."""
        self.restarts += 1
        snap = self.core.table.snapshot()
        table = SubscriptionTable()
        table.restore(snap, self.now)
        self.core = DeliveryCore("R", table, self.cfg)
        for s in self.subs:
            s.link = None
            s.arrived.clear()
            s.on_link.clear()
        for p in self.pubs:
            p.link = None
            p.token_of.clear()
            p.to_settle.clear()
        self._sync_lives()

    # ------------------------------------------------------------------ invariants
    @invariant()
    def never_handed_twice(self) -> None:
        for key, n in self.handed.items():
            assert n <= 1, f"handed {n} times: {key}"

    @invariant()
    def budget_respected(self) -> None:
        assert self.core.undecided <= self.cfg.max_inflight_messages
        assert self.core.inflight_bytes == sum(len(r.payload) for r in self.core.records.values())
        assert self.core.reserved_credit >= 0

    def teardown(self) -> None:
        """Faults stop; everyone reconnects, acknowledges and settles until quiet."""
        if not hasattr(self, "core"):
            return
        for _ in range(200):
            for s in self.subs:
                if s.link is None and self._live(s):
                    self.sub_attach(self.subs.index(s), 0)
                if s.link is not None:
                    s.credit += 10
                    self.core.subscriber_credit(s.sid, s.credit)
                    self._process()
                    while s.arrived:
                        self.sub_acknowledge(self.subs.index(s), 0, "accept")
            for j, p in enumerate(self.pubs):
                if p.link is None:
                    self.pub_attach(j)
                for gid, tag in list(p.in_doubt.items()):
                    if gid not in p.token_of.values() and p.credit > 0:
                        self._send(p, gid, tag)
                self.pub_settle(j)
            if (not self.core.records and all(not p.in_doubt for p in self.pubs)
                    and all(not s.accepted for s in self.subs if s.link is not None)):
                break  # (a FINAL for a presented id waits for credit: keep granting until it came)
        assert not self.core.records, f"records left: {list(self.core.records)[:5]}"
        for p in self.pubs:
            assert not p.in_doubt, f"{p.name} still in doubt: {list(p.in_doubt)[:5]}"
        for gid, owed in self.owed.items():
            for sid, life in owed:
                if (sid, life) in self.ended_lives:
                    continue
                n = self.handed.get((sid, life, gid), 0)
                rejected = self.outcomes.get(gid) is Outcome.REJECTED
                assert n == 1 or (rejected and n == 0), f"{gid} handed {n} times to {sid} life {life}"
        assert self.core.reserved_credit == sum(p.credit for p in self.pubs if p.link is not None)
        for s in self.subs:  # settlement reached every attached subscriber: its store can forget
            if s.link is not None:
                assert not s.accepted, f"{s.name} never saw {sorted(s.accepted)[:3]} settled"
                assert not s.on_link, f"{s.name} has unsettled deliveries {sorted(s.on_link)[:3]}"


TestCore = CoreMachine.TestCase
TestCore.settings = settings(max_examples=600, stateful_step_count=60, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])


def test_final_for_a_presented_id_waits_for_credit_then_comes() -> None:
    """Found by a long run of the machine (its teardown stopped granting credit too early): s0
    accepts, suspends before the publisher settles, resumes presenting the id while it has no credit
    left; the FINAL is owed, held until credit comes, then sent."""
    m = CoreMachine()
    m.setup()
    m.pub_attach(j=0)
    m.sub_attach(credit=0, i=0)
    for _ in range(10):
        m.publish(j=0)
    m.sub_credit(i=0, more=1)
    m.sub_acknowledge(i=0, k=0, what="accept")
    m.sub_detach(closed=False, i=0)
    s = m.subs[0]
    assert s.accepted
    m.sub_attach(credit=9, i=0)  # resumes presenting the accepted id; the 9 others use the credit
    m.pub_settle(j=0)
    assert s.accepted and s.credit == 0  # FINAL owed, no credit to carry it
    s.credit += 1
    m.core.subscriber_credit(s.sid, s.credit)
    m._process()
    assert not s.accepted
    m.teardown()
