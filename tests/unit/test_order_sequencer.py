"""Unit and property tests of `router.order.sequencer` on a network the test moves by hand.

`Net` holds one FIFO channel per ordered pair; nothing moves unless the test delivers it, so a test
can hold a message back, lose it, or let a router die with its vote still on the way. Every delivery
and every `Numbered` is checked against one global number -> gid map as it happens.
"""

from __future__ import annotations

import json
import typing
from collections import defaultdict, deque
from dataclasses import asdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from oncemesh.common.errors import RemoteProtocolError
from oncemesh.interrouter.ordercodec import journal_to_json, seqstate_from_json, seqstate_to_json
from oncemesh.router.order.sequencer import (
    Accept,
    Accepted,
    Body,
    CvQuery,
    Delivered,
    Entry,
    Floor,
    Nack,
    Numbered,
    Prepare,
    Promise,
    Request,
    Restore,
    SendTo,
    SeqState,
    SequencerNode,
    Status,
    Sync,
    UnknownMember,
    Unresolved,
    Wire,
)
from oncemesh.router.order.total import Checkpoint


class Net:
    def __init__(self, ids: str) -> None:
        self.ids = list(ids)
        self.nodes: dict[str, SequencerNode | None] = {
            r: SequencerNode(r, self.ids, f"{r}.0", 0.0, bootstrap=True) for r in ids}
        self.lives = dict.fromkeys(ids, 0)
        self.chan: dict[tuple[str, str], deque[Wire]] = defaultdict(deque)
        self.committed: dict[int, str] = {}
        self.numbers: dict[str, int] = {}
        self.delivered: dict[str, list[tuple[int, str]]] = defaultdict(list)  # by incarnation
        self.told: dict[str, int] = {}
        self.bodies: set[type] = set()
        self.unresolved: list[tuple[str, str]] = []
        self.restored: dict[str, Checkpoint] = {}  # incarnation -> the checkpoint it went on from
        self.disk: dict[str, list[object]] = {}  # router -> its journal file's lines (with `journaling`)
        self.collect()

    def floors(self, routers: str, now: float, upto: int | None = None) -> None:
        """Each router reports its floor (everything it delivered, or `upto`) to the others, the
        reports are delivered, and each compacts what every member's floor passed."""
        for r in routers:
            node = self.node(r)
            node.note_floor(node.next_num - 1 if upto is None else upto, now)
        self.collect()
        for a in routers:
            for b in routers:
                q = self.chan[(a, b)]
                while q and type(q[0].body) is Floor:
                    self.step(a, b, now)
        for r in routers:
            node = self.node(r)
            node.compact(Checkpoint(node.safe_floor(), (), ()))
        self.collect()

    def node(self, r: str) -> SequencerNode:
        n = self.nodes[r]
        assert n is not None, f"{r} is down"
        return n

    def inc(self, r: str) -> str:
        return f"{r}.{self.lives[r]}"

    def _commit(self, n: int, gid: str) -> None:
        assert self.committed.setdefault(n, gid) == gid, f"number {n}: {self.committed[n]} and {gid}"
        assert self.numbers.setdefault(gid, n) == n, f"gid {gid}: {self.numbers[gid]} and {n}"

    def collect(self) -> None:
        for r, node in self.nodes.items():
            if node is None:
                continue
            if node.journaling and node.journal_pending:  # on disk before its messages leave
                j = node.take_journal()
                self.disk[r] = [seqstate_to_json(j)] if isinstance(j, SeqState) else \
                    self.disk.get(r, []) + [journal_to_json(x) for x in j]
            out, node.out = node.out, []
            for a in out:
                if isinstance(a, SendTo):
                    json.dumps(asdict(a.msg))  # plain data all the way down
                    self.bodies.add(type(a.msg.body))
                    self.chan[(r, a.to)].append(a.msg)
                elif isinstance(a, Delivered):
                    self._commit(a.n, a.gid)
                    cp = self.restored.get(self.inc(r))
                    if cp is not None and a.n <= cp.number:
                        continue  # known from its checkpoint (the delivery core ignores it)
                    seq = self.delivered[self.inc(r)]
                    assert not seq or a.n == seq[-1][0] + 1, f"{self.inc(r)} delivered {a.n} after {seq[-1]}"
                    assert seq or a.n == (cp.number + 1 if cp else 1), f"{self.inc(r)} started at {a.n}"
                    seq.append((a.n, a.gid))
                elif isinstance(a, Numbered):
                    self._commit(a.n, a.gid)
                    self.told[a.gid] = a.n
                elif isinstance(a, Unresolved):
                    self.unresolved.append((self.inc(r), a.gid))
                elif isinstance(a, Restore):
                    assert not self.delivered[self.inc(r)], f"{self.inc(r)} restored after delivering"
                    self.restored[self.inc(r)] = a.cp

    def step(self, src: str, dst: str, now: float = 1.0) -> type:
        """Deliver the head of the channel src -> dst; return the type of its body."""
        wire = self.chan[(src, dst)].popleft()
        self.node(dst).handle(src, wire, now)
        self.collect()
        return type(wire.body)

    def drop(self, src: str | None = None, dst: str | None = None) -> None:
        for (a, b), q in self.chan.items():
            if src in (None, a) and dst in (None, b):
                q.clear()

    def tick(self, r: str, now: float) -> None:
        self.node(r).tick(now)
        self.collect()

    def submit(self, r: str, gid: str, now: float = 1.0) -> None:
        self.node(r).submit(gid, now)
        self.collect()

    def crash(self, r: str) -> None:
        self.nodes[r] = None
        self.drop(dst=r)  # what was on the way to it is lost; what it sent still arrives

    def restart(self, r: str, now: float, disk: bool = False) -> None:
        """A new incarnation: amnesic (it recovers), or `disk`: restored from its journal."""
        self.lives[r] += 1
        if disk:
            state = seqstate_from_json(json.loads(json.dumps(self.disk[r])))
            self.nodes[r] = SequencerNode.restore(state, r, self.ids, self.inc(r), now)
        else:
            self.nodes[r] = SequencerNode(r, self.ids, self.inc(r), now)
        self.collect()

    def view(self, *groups: str, now: float = 1.0) -> None:
        """Each router believes exactly the routers of its own group alive."""
        for g in groups:
            for a in g:
                for b in self.ids:
                    if a != b and self.nodes[a] is not None:
                        (self.node(a).peer_up if b in g else self.node(a).peer_down)(b, now)
        self.collect()

    def flush(self, among: str, now: float, hold: bool = False) -> None:
        """Deliver everything between routers of `among`; what crosses out is lost, or held."""
        moved = True
        while moved:
            moved = False
            for (a, b), q in list(self.chan.items()):
                if not q:
                    continue
                if a in among and b in among and self.nodes[b] is not None:
                    self.step(a, b, now)
                    moved = True
                elif not hold:
                    q.clear()

    def run(self, among: str, t0: float, t1: float, dt: float = 0.05, hold: bool = False) -> float:
        t = t0
        while t < t1:
            for r in among:
                if self.nodes[r] is not None:
                    self.node(r).tick(t)
            self.collect()
            self.flush(among, t, hold)
            t += dt
        return t


def settled(ids: str = "ABC") -> tuple[Net, float]:
    net = Net(ids)
    net.view(ids)
    return net, net.run(ids, 0.0, 3.0)


# ---------------------------------------------------------------------- plain data, happy path
def test_every_message_is_plain_data() -> None:
    net, t = settled("ABCDE")
    for k, r in enumerate("ABCDE"):
        net.submit(r, f"g{k}", t)
    net.node("A").handle("B", Wire(0, (0,) * 5, Accept((0, 1, 0), Entry(1, (0, 1, 0), 1, ("x",)))), t)
    net.collect()  # a Nack
    net.crash("C")
    net.restart("C", t)
    net.view("ABCDE")
    t = net.run("ABCDE", t, t + 3.0)
    net.floors("ABCDE", t)
    assert set(typing.get_args(Body)) == net.bodies  # every kind went through json.dumps


def test_bully_elects_the_highest_live_router_and_again_when_it_dies() -> None:
    net, t = settled("ABCD")
    assert {net.node(r).coordinator for r in "ABCD"} == {"D"} and net.node("D").leading
    net.crash("D")
    net.view("ABC", now=t)
    net.run("ABC", t, t + 3.0)
    assert {net.node(r).coordinator for r in "ABC"} == {"C"} and net.node("C").leading


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ABC"), st.integers(0, 7)), min_size=1, max_size=20))
def test_numbers_run_1_2_3_everywhere_and_a_resent_gid_keeps_its_number(subs: list[tuple[str, int]]) -> None:
    net, t = settled()
    for r, g in subs:
        net.submit(r, f"g{g}", t)
        t = net.run("ABC", t, t + 0.1)
    t = net.run("ABC", t, t + 2.0)
    gids = {f"g{g}" for _, g in subs}
    assert sorted(net.committed) == list(range(1, len(gids) + 1))
    assert set(net.committed.values()) == gids
    for r in "ABC":
        assert [n for n, _ in net.delivered[net.inc(r)]] == list(range(1, len(gids) + 1))
    assert net.told.keys() == gids  # every submitter learned its number (one number per gid: _commit)


def test_unknown_sender_is_refused() -> None:
    node = SequencerNode("A", "ABC", "A.0", 0.0, bootstrap=True)
    with pytest.raises(UnknownMember):
        node.handle("Z", Wire(0, (0, 0, 0), Request("g", 1)), 0.0)


# ---------------------------------------------------------------------- acceptor rules
ballots = st.tuples(st.integers(1, 4), st.integers(1, 2), st.just(0))
ops = st.lists(st.one_of(
    st.tuples(st.just("prepare"), ballots, st.integers(1, 3)),
    st.tuples(st.just("accept"), ballots, st.integers(1, 3))), max_size=25)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_acceptor_promises_only_upward_and_reports_what_it_accepted(steps: list[tuple[str, tuple[int, int, int], int]]) -> None:
    # five members: an acceptor's vote and the leader's are not a quorum (Q = 3), so it only votes
    # (in a group of three it also learns: test_an_acceptor_of_three_learns_from_the_accept)
    node = SequencerNode("A", "ABCDE", "A.0", 0.0, bootstrap=True)
    promised = node.promised
    accepted: dict[int, Entry] = {}
    for kind, ballot, slot in steps:
        node.out.clear()
        frm = "ABC"[ballot[1]]
        entry = Entry(slot, ballot, slot, (f"{ballot}{slot}",))
        body: Body = Prepare(ballot, slot) if kind == "prepare" else Accept(ballot, entry)
        node.handle(frm, Wire(0, (0,) * 5, body), 1.0)
        (reply,) = [a.msg.body for a in node.out if isinstance(a, SendTo) and a.to == frm]
        if ballot < promised:
            assert reply == Nack(ballot, promised)
            continue
        promised = ballot
        if isinstance(body, Prepare):
            assert isinstance(reply, Promise) and reply.ballot == ballot
            assert reply.accepted == tuple(accepted[s] for s in sorted(accepted) if s >= slot)
        else:
            assert reply == Accepted(ballot, slot, 1)
            accepted[slot] = entry
        assert node.promised == promised


def test_an_acceptor_of_three_learns_from_the_accept() -> None:
    """N = 3: the leader's vote and the acceptor's are a quorum (Q = 2), so an acceptor learns the
    entry when it accepts it (one hop after the proposal, not three); the leader sends no SYNC to
    a member whose ACCEPTED says it delivered the slot. N = 5 (Q = 3): it only votes."""
    net, t = settled("ABC")
    assert net.node("C").coordinator == "C"
    net.flush("ABC", t)
    net.submit("A", "g1", t)
    assert net.step("A", "C", t) is Request
    assert [type(w.body) for w in net.chan[("C", "A")]] == [Accept]
    assert net.step("C", "A", t) is Accept  # A accepts: committed, A learns and delivers at once
    assert net.delivered[net.inc("A")][-1][1] == "g1" and net.told["g1"] == net.delivered[net.inc("A")][-1][0]
    assert [type(w.body) for w in net.chan[("A", "C")]] == [Accepted]
    assert net.step("A", "C", t) is Accepted  # the leader commits; A reported frontier past it: no SYNC
    assert [type(w.body) for w in net.chan[("C", "A")]] == []
    assert net.delivered[net.inc("C")][-1][1] == "g1"
    assert [type(w.body) for w in net.chan[("C", "B")]] == [Accept, Sync]  # B has not answered yet
    net.step("C", "B", t)
    assert net.delivered[net.inc("B")][-1][1] == "g1"
    net.flush("ABC", t)
    assert {r: [g for _, g in net.delivered[net.inc(r)]][-1] for r in "ABC"} == dict.fromkeys("ABC", "g1")

    net5, t = settled("ABCDE")
    net5.flush("ABCDE", t)
    net5.submit("E", "h1", t)
    assert net5.step("E", "A", t) is Accept
    assert "h1" not in [g for _, g in net5.delivered[net5.inc("A")]]  # own vote and E's: 2 of Q = 3
    net5.flush("ABCDE", t)
    assert [g for _, g in net5.delivered[net5.inc("A")]][-1] == "h1"


def test_an_accept_not_from_its_ballots_owner_is_not_learned() -> None:
    """Learning from an ACCEPT counts the sender's vote as the ballot owner's: only its owner, in the
    ballot's life, voted for it (an ACCEPT of another member's ballot, or of an older life, is a vote
    of ours only)."""
    node = SequencerNode("A", "ABC", "A.0", 0.0, bootstrap=True)
    e = Entry(1, (1, 2, 0), 1, ("g",))
    node.handle("B", Wire(0, (0, 0, 0), Accept((1, 2, 0), e)), 1.0)  # B sends C's ballot
    assert not any(isinstance(a, Delivered) for a in node.out) and node.acc[1] == e
    node.out.clear()
    node.handle("C", Wire(1, (0, 0, 1), Accept((1, 2, 0), e)), 1.0)  # C's life 1 sends its life 0's ballot
    assert not any(isinstance(a, Delivered) for a in node.out)
    node.out.clear()
    e2 = Entry(1, (2, 2, 1), 1, ("g",))
    node.handle("C", Wire(1, (0, 0, 1), Accept((2, 2, 1), e2)), 1.0)
    assert [a for a in node.out if isinstance(a, Delivered)] == [Delivered(1, "g")]


# ---------------------------------------------------------------------- amnesia
def test_a_restarted_router_votes_only_after_k_others_answered() -> None:
    net, t = settled("ABCDE")
    net.crash("A")
    net.restart("A", t)
    a = net.node("A")
    for o in "BCDE":
        a.peer_up(o, t)  # recovered, it will ask for an election rather than lead at once
    net.chan[("E", "A")].append(Wire(0, (0,) * 5, Prepare((9, 4, 0), 1)))
    assert net.step("E", "A") is Prepare
    assert [type(w.body) for w in net.chan[("A", "E")]] == [CvQuery]  # it did not answer the PREPARE
    for r in "BC":
        net.step("A", r)
        net.step(r, "A")
    assert a.status is Status.LEARN_LIFE  # two of the four others: K = 3 for N = 5
    net.step("A", "D")
    net.step("D", "A")
    assert a.status is Status.RECOVER and a.life == 1
    for r in "BCD":
        net.step("A", r)
    promised = max(net.node(r).promised for r in "BCD")
    for r in "BC":
        net.step(r, "A")
    assert a.status is Status.RECOVER
    net.step("D", "A")
    assert a.status is Status.NORMAL and a.promised == promised
    old = Wire(0, (0,) * 5, Prepare((20, 0, 0), 1))  # from A's previous life, late
    net.node("B").handle("A", old, t)
    assert not net.node("B").out and net.node("B").promised < (20, 0, 0)


def _leader_e_with_a_and_d(net: Net) -> None:
    net.drop()
    net.tick("E", 1.0)  # E asks again for ballot (1, E, 0)
    net.drop("E", "B")
    net.drop("E", "C")
    for r in "AD":
        assert net.step("E", r) is Prepare and net.step(r, "E") is Promise
    assert net.node("E").leading
    net.submit("E", "v")
    net.drop("E", "B")
    net.drop("E", "C")


def _recover_from(net: Net, r: str, others: str, now: float) -> None:
    net.restart(r, now)
    for o in others:
        net.node(r).peer_up(o, now)  # so that, recovered, it asks for an election instead of leading
    for _ in range(2):  # CvQuery, then Recover
        for o in others:
            net.step(r, o, now)
        for o in others:
            net.step(o, r, now)
    assert net.node(r).status is Status.NORMAL


def test_an_old_lifes_vote_no_longer_counts_once_its_new_life_is_known() -> None:
    """N = 5. A(old) accepted v for leader E and died, its ACCEPTED still on the way. A(new) recovered
    from B, C, D before D saw v; D's ACCEPTED then carries A's new life. E must not commit v with
    {E, D, A(old)}: B, C and A(new) know nothing of v and may commit w in slot 1.

        E --Accept v--> A(old), D        A(old) --Accepted--> E (late)
        A(new) <--recovers from-- B, C, D          D --Accepted (knows A.1)--> E
    """
    net = Net("ABCDE")
    _leader_e_with_a_and_d(net)
    assert net.step("E", "A") is Accept
    net.crash("A")
    _recover_from(net, "A", "BCD", 2.0)
    assert net.step("E", "D", 2.0) is Accept
    assert net.step("A", "E", 2.0) is Accepted  # A's old vote arrives first ...
    assert net.step("D", "E", 2.0) is Accepted  # ... then D's, which tells E of A's new life
    assert 1 not in net.committed
    net.view("ABC", now=2.0)
    net.submit("C", "w", 2.0)
    net.run("ABC", 2.0, 6.0)
    assert net.committed == {1: "w"}


def test_a_restarted_router_keeps_the_promise_its_old_life_made() -> None:
    """N = 3, B and C cut apart. C led at ballot 1, B then won A's promise at ballot 2 and A accepted
    w from B. A restarts: it must promise ballot 2 again, or C's late ACCEPT of v at ballot 1 gets A's
    vote (v committed) and B's ACCEPT of w too (w committed in the same slot)."""
    net = Net("ABC")
    net.drop()
    net.tick("C", 1.0)
    assert net.step("C", "A") is Prepare and net.step("A", "C") is Promise and net.node("C").leading
    net.tick("B", 1.0)
    assert net.step("B", "A") is Prepare and net.step("A", "B") is Nack
    net.tick("B", 1.4)  # ballot (2, B, 0)
    assert net.step("B", "A") is Prepare and net.step("A", "B") is Promise and net.node("B").leading
    net.submit("B", "w", 1.5)
    assert net.step("B", "A") is Accept
    net.submit("C", "v", 1.5)
    net.drop("A")
    net.drop("B", "C")
    net.drop("C")
    net.crash("A")
    _recover_from(net, "A", "BC", 2.0)
    assert net.node("A").promised == net.node("B").ballot
    net.drop("A")
    net.tick("C", 2.0)  # C resends ACCEPT v at ballot 1 to A
    net.drop("C", "B")
    net.step("C", "A", 2.0)
    net.step("A", "C", 2.0)
    net.tick("B", 2.0)  # B resends ACCEPT w at ballot 2 to A
    net.drop("B", "C")
    net.step("B", "A", 2.0)
    net.step("A", "B", 2.0)
    assert net.committed == {1: "w"}


def test_a_restarted_router_takes_over_what_its_peers_accepted() -> None:
    """N = 5. E committed v with {E, D, A(old)}; A(new) recovered from B, C, D (D had accepted v).
    Then D and E are cut off: the new leader C, with A(new) and B, must learn v from A(new)."""
    net = Net("ABCDE")
    _leader_e_with_a_and_d(net)
    assert net.step("E", "A") is Accept and net.step("E", "D") is Accept
    net.crash("A")
    _recover_from(net, "A", "BCD", 2.0)
    assert net.step("A", "E", 2.0) is Accepted and net.step("D", "E", 2.0) is Accepted
    assert net.committed == {1: "v"}  # counted before anyone knew of A's new life: legitimately
    net.view("ABC", now=2.0)
    net.submit("C", "w", 2.0)
    net.run("ABC", 2.0, 6.0)
    assert net.committed == {1: "v", 2: "w"}


# ---------------------------------------------------------------------- partitions, compaction
def test_the_minority_side_commits_nothing_and_catches_up_after_healing() -> None:
    net, t = settled("ABCDE")
    net.view("ABC", "DE", now=t)
    net.submit("A", "majority", t)
    net.submit("D", "minority", t)
    t = net.run("ABC", t, t + 3.0)
    t = net.run("DE", t, t + 3.0)
    assert net.committed == {1: "majority"} and net.node("E").coordinator == "E"
    assert not net.delivered[net.inc("D")] and not net.delivered[net.inc("E")]
    net.view("ABCDE", now=t)
    net.run("ABCDE", t, t + 3.0)
    assert net.committed == {1: "majority", 2: "minority"}
    for r in "ABCDE":
        assert net.delivered[net.inc(r)] == [(1, "majority"), (2, "minority")]


def test_a_member_far_behind_catches_up_in_syncs_of_bounded_size() -> None:
    """A SYNC is one control message: it carries at most `sync_gids` gids (or one entry), so a
    member that missed many batches is caught up in many small messages, not one of ~160 KB."""
    net, t = settled("ABCDE")
    net.view("BCDE", "A", now=t)
    for i in range(700):
        net.submit("B", f"g{i}", t)
    t = net.run("BCDE", t, t + 4.0)
    assert len(net.committed) == 700 and not net.delivered[net.inc("A")]
    seen: list[tuple[int, int]] = []  # (gids, entries) of each SYNC with entries to A
    step = net.step

    def watching(src: str, dst: str, now: float = 1.0) -> type:
        body = net.chan[(src, dst)][0].body
        if dst == "A" and isinstance(body, Sync) and body.entries:
            seen.append((sum(len(e.gids) for e in body.entries), len(body.entries)))
        return step(src, dst, now)

    net.step = watching  # type: ignore[method-assign]
    net.view("ABCDE", now=t)
    net.run("ABCDE", t, t + 6.0)
    assert [g for _, g in net.delivered[net.inc("A")]] == [net.committed[n] for n in range(1, 701)]
    cap = net.node("E").t.sync_gids
    assert len(seen) > 1 and all(gids <= cap or entries == 1 for gids, entries in seen), seen


def test_compaction_drops_what_everyone_delivered_and_late_requests_from_behind_it() -> None:
    net, t = settled()
    for k in range(6):
        net.submit("ABC"[k % 3], f"g{k}", t)
        t = net.run("ABC", t, t + 0.2)
    t = net.run("ABC", t, t + 1.5)  # heartbeats spread the stable mark
    c = net.node("C")
    assert c.leading and c.stable == c.next_slot
    net.floors("ABC", t, upto=4)
    assert c.base > 1 and "g0" not in c.numbers and "g5" in c.numbers and c.cp == Checkpoint(4, (), ())
    assert all(e.first + len(e.gids) - 1 > 4 for e in c.chosen.values())
    net.submit("A", "g5", t)  # still retained: the same number
    assert net.told["g5"] == net.numbers["g5"]
    late = Wire(0, (0, 0, 0), Request("g0", 1))  # sent before A learned g0's number, delayed
    c.handle("A", late, t)
    net.run("ABC", t, t + 1.0)
    assert net.numbers["g0"] == 1 and len(net.committed) == 6


def test_a_router_restarted_past_compacted_history_hands_back_what_it_held() -> None:
    """A's new life takes g0 (already numbered, then compacted everywhere: its publisher had been
    told) and g9 (new) while recovering; peers answer from a compacted base, so A cannot tell whether
    either was numbered in the history it skipped. It hands both back instead of numbering g0 twice;
    resubmitted (g9's publisher still in doubt), g9 gets a number."""
    net, t = settled()
    for k in range(4):
        net.submit("C", f"g{k}", t)
        t = net.run("ABC", t, t + 0.3)
    t = net.run("ABC", t, t + 1.5)
    net.floors("ABC", t, upto=3)
    net.crash("A")
    net.restart("A", t)
    net.submit("A", "g0", t)
    net.submit("A", "g9", t)
    t = net.run("ABC", t, t + 1.0)
    assert net.node("A").status is Status.NORMAL and net.node("A").base > 1
    assert net.unresolved == [("A.1", "g0"), ("A.1", "g9")] and "g9" not in net.numbers
    net.submit("A", "g9", t)
    net.run("ABC", t, t + 1.0)
    assert net.numbers == {"g0": 1, "g1": 2, "g2": 3, "g3": 4, "g9": 5} and net.told["g9"] == 5
    assert net.restored["A.1"] == Checkpoint(3, (), ())  # it went on from the others' checkpoint
    assert net.delivered["A.1"] == [(4, "g3"), (5, "g9")]


def test_nothing_is_compacted_past_a_member_that_never_reported_or_whose_new_life_has_not() -> None:
    net, t = settled()
    for k in range(3):
        net.submit("C", f"g{k}", t)
        t = net.run("ABC", t, t + 0.3)
    t = net.run("ABC", t, t + 1.5)
    net.floors("BC", t)  # A has not reported: it counts as 0
    assert all(net.node(r).base == 1 for r in "ABC") and net.node("C").safe_floor() == 0
    net.floors("ABC", t)
    assert all(net.node(r).base > 1 for r in "ABC") and net.node("C").safe_floor() == 3
    net.crash("A")
    net.restart("A", t)
    t = net.run("ABC", t, t + 1.0)  # its new life is known (crash vectors): its old report is void
    assert net.node("C").safe_floor() == 0
    net.floors("ABC", t)
    assert net.node("C").safe_floor() == 3


def test_past_max_history_the_leader_numbers_nothing_until_it_can_compact() -> None:
    net = Net("ABC")
    for r in "ABC":
        net.nodes[r] = SequencerNode(r, net.ids, f"{r}.0", 0.0, bootstrap=True, max_history=2)
    net.collect()
    net.view("ABC")
    t = net.run("ABC", 0.0, 2.0)
    for k in range(3):
        net.submit("A", f"g{k}", t)
        t = net.run("ABC", t, t + 0.3)
    t = net.run("ABC", t, t + 1.0)
    assert sorted(net.numbers) == ["g0", "g1"] and net.node("C").held_back > 0
    net.floors("ABC", t)
    t = net.run("ABC", t, t + 1.0)
    assert net.numbers["g2"] == 3


def test_a_promise_or_recover_reply_with_a_base_and_no_checkpoint_is_refused() -> None:
    net, t = settled()
    bad = Wire(0, (0, 0, 0), Promise((9, 0, 0), 5, 3, 7, (), (), None))
    with pytest.raises(RemoteProtocolError, match="checkpoint"):
        net.node("B").handle("A", bad, t)


def test_every_member_restarting_with_its_votes_at_once_goes_on_numbering_in_one_order() -> None:
    """Without disk a restart of every member stops numbering for good (none can recover: nobody
    holds state); with their votes journaled each restarted life is the same one, voting at once:
    what was committed keeps its number, what was accepted and not committed is committed as it was,
    and numbering goes on from the checkpoint they compacted to."""
    net = Net("ABC")
    for r in "ABC":
        net.node(r).journaling = True
    net.view("ABC")
    t = net.run("ABC", 0.0, 2.0)
    for k in range(4):
        net.submit("ABC"[k % 3], f"g{k}", t)
        t = net.run("ABC", t, t + 0.3)
    t = net.run("ABC", t, t + 1.0)
    net.floors("ABC", t, upto=2)
    assert net.node("C").leading
    net.submit("C", "g4", t)  # the leader proposes it; its Accept reaches A and B (their votes are
    for b in "AB":            # journaled), then every member dies before anyone learns it committed
        while net.chan[("C", b)] and net.step("C", b, t) is not Accept:
            pass
    for r in "ABC":
        net.crash(r)
    for r in "ABC":
        net.restart(r, t, disk=True)
        assert net.node(r).status is Status.NORMAL and net.node(r).restored
    net.view("ABC", now=t)
    t = net.run("ABC", t, t + 3.0)
    net.submit("B", "g5", t)
    t = net.run("ABC", t, t + 2.0)
    assert [net.committed[n] for n in sorted(net.committed)][:4] == ["g0", "g1", "g2", "g3"]
    assert set(net.committed.values()) >= {"g4", "g5"} and len(net.committed) == 6
    for r in "ABC":
        assert net.restored[net.inc(r)] == Checkpoint(2, (), ())
        assert net.delivered[net.inc(r)] == [(n, net.committed[n]) for n in range(3, 7)]


def test_a_journal_of_a_recovering_life_restores_nothing() -> None:
    net, t = settled()
    for r in "ABC":
        net.node(r).journaling = True
    net.collect()
    net.crash("A")
    net.restart("A", t)  # amnesic: recovering, its journal says so
    net.node("A").journaling = True
    net.collect()
    net.crash("A")
    net.restart("A", t, disk=True)
    assert net.node("A").status is Status.LEARN_LIFE and not net.node("A").restored


# ---------------------------------------------------------------------- random schedules
class RandomSchedules(RuleBasedStateMachine):
    """N = 3..5 routers; any interleaving of single deliveries, losses, ticks, submissions, wrong
    beliefs, crashes (within the assumption) and stretches where only some routers run together
    (a partition): never two numbers for a gid or two gids for a number, never a gap, committed
    entries agree everywhere; once everything heals and runs, all is numbered and delivered."""

    @initialize(n=st.integers(3, 5))
    def start(self, n: int) -> None:
        self.ids = "ABCDE"[:n]
        self.net = Net(self.ids)
        self.net.view(self.ids)
        self.t = 0.0
        self.gids: set[str] = set()

    def _id(self, k: int) -> str:
        return self.ids[k % len(self.ids)]

    @rule(src=st.integers(0, 4), dst=st.integers(0, 4), n=st.integers(1, 4))
    def deliver(self, src: int, dst: int, n: int) -> None:
        a, b = self._id(src), self._id(dst)
        for _ in range(n):
            if a != b and self.net.chan[(a, b)] and self.net.nodes[b] is not None:
                self.net.step(a, b, self.t)

    @rule(src=st.integers(0, 4), dst=st.integers(0, 4))
    def lose(self, src: int, dst: int) -> None:
        self.net.drop(self._id(src), self._id(dst))

    @rule(r=st.integers(0, 4), dt=st.floats(0.01, 0.6))
    def tick(self, r: int, dt: float) -> None:
        self.t += dt
        if self.net.nodes[self._id(r)] is not None:
            self.net.tick(self._id(r), self.t)

    @rule(mask=st.integers(1, 31), dt=st.floats(0.1, 1.5))
    def run_together(self, mask: int, dt: float) -> None:
        group = "".join(r for i, r in enumerate(self.ids) if mask >> i & 1 and self.net.nodes[r] is not None)
        if group:
            self.net.view(group, now=self.t)
            self.t = self.net.run(group, self.t, self.t + dt, hold=True)  # the rest may arrive late

    @rule(r=st.integers(0, 4), gs=st.lists(st.integers(0, 30), min_size=1, max_size=6))
    def submit(self, r: int, gs: list[int]) -> None:
        for g in gs:
            if self.net.nodes[self._id(r)] is not None:
                self.gids.add(f"g{g}")
                self.net.submit(self._id(r), f"g{g}", self.t)

    @rule(a=st.integers(0, 4), b=st.integers(0, 4), up=st.booleans())
    def believe(self, a: int, b: int, up: bool) -> None:
        node = self.net.nodes[self._id(a)]
        if self._id(a) != self._id(b) and node is not None:
            (node.peer_up if up else node.peer_down)(self._id(b), self.t)
            self.net.collect()

    @precondition(lambda self: sum(n is None or n.status is not Status.NORMAL for n in self.net.nodes.values())
                  < len(self.ids) - (len(self.ids) // 2 + 1))
    @rule(r=st.integers(0, 4))
    def crash_and_restart(self, r: int) -> None:
        self.net.crash(self._id(r))
        self.net.restart(self._id(r), self.t)

    @invariant()
    def committed_slots_agree(self) -> None:
        """Stronger than the deliveries (which Net checks as they happen): every committed entry
        any router holds, delivered or not, agrees with every other router's and with the numbers."""
        seen: dict[int, tuple[int, tuple[str, ...]]] = {}
        for node in self.net.nodes.values():
            for slot, e in (node.chosen.items() if node is not None else ()):
                assert seen.setdefault(slot, (e.first, e.gids)) == (e.first, e.gids), f"slot {slot}"
                for k, g in enumerate(e.gids):
                    assert self.net.committed.get(e.first + k, g) == g

    def teardown(self) -> None:
        net = getattr(self, "net", None)
        if net is None:
            return
        net.view(self.ids, now=self.t)
        for k, g in enumerate(sorted(self.gids)):  # clients resend what they were not told
            if g not in net.told:
                net.submit(self._id(k), g, self.t)
        net.run(self.ids, self.t, self.t + 6.0)
        assert set(net.committed.values()) == self.gids
        assert sorted(net.committed) == list(range(1, len(self.gids) + 1))
        for r in self.ids:
            node = net.node(r)
            assert node.status is Status.NORMAL and node.next_num == len(self.gids) + 1
            assert node.coordinator == max(self.ids)


TestRandomSchedules = RandomSchedules.TestCase
TestRandomSchedules.settings = settings(max_examples=100, stateful_step_count=80, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])
