"""A seeded simulation of `router.order.sequencer` on N = 3..5 routers, everything drawn from one seed.

Network: per ordered pair a FIFO channel with random delays; a cut or the receiver's crash resets the
channel (what is in flight to it is lost), but what a crashed router sent before dying still arrives,
sometimes late (old-life messages must be harmless). Faults while the workload runs:
- crash (amnesia) and restart as a new incarnation -- often the current leader, mid-stream, or a router
  right after it voted -- within the core's assumption: at most N - Q crashed or recovering at once;
- freeze: the router processes nothing (messages, detector news and submissions wait in order) and
  resumes with stale beliefs; peers' detectors take it for dead meanwhile;
- partitions: a majority/minority split or arbitrary cut pairs, overlapping, healed later;
- a failure detector that reports after a random delay, and sometimes suspects a live router.
Each seed draws a profile: N, network speed and delay spikes, fault rate, quick restarts, false
suspicions, crashes after votes, compaction. Clients submit gids at random routers; a client whose
router crashed, or that heard nothing for a while, resends elsewhere; some resend anyway.

Compaction (some seeds): every router reports its floor now and then (`note_floor`: here the
number before the first gid a client still waits for, which it may resend; what the delivery core
would say) and compacts what every member's floor passed (`safe_floor`, `compact` with a checkpoint);
a router that restarts behind the base goes on from the checkpoint (`Restore`).

Restarts with disk (some seeds): every router keeps its votes as the mesh node does (a journal
taken before each batch of its messages leaves, through the JSON of its file), and a crash may
restart it from them (the same life, voting at once). Those crashes do not count toward the N - Q
routers crashed or recovering at once (only amnesic ones do): with disk, all of them may be down
together, and some seeds restart every router at once.

Checked at every action: one gid per number, one number per gid, each incarnation delivers
consecutive numbers (from 1, or after the checkpoint it went on from; numbers at or below that
checkpoint it may be told again and ignores) agreeing with every other, `Numbered` agrees.
At the end, after healing every fault (and calming the network) and running on: numbers are exactly
1..M, every gid has one and every client was told it, every router delivered all M, all take the
highest router for coordinator and it leads.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from oncemesh.interrouter.ordercodec import journal_to_json, seqstate_from_json, seqstate_to_json
from oncemesh.router.order.sequencer import (
    Accepted,
    Delivered,
    Numbered,
    Promise,
    RecoverReply,
    Restore,
    SendTo,
    SeqState,
    SequencerNode,
    Status,
    Unresolved,
    Wire,
)
from oncemesh.router.order.total import Checkpoint
from tests.sim.kernel import Network, Scheduler, Violation

TICK = 0.05


@dataclass
class Client:
    gid: str
    at: str | None = None  # router and incarnation it last submitted to
    inc: str | None = None
    number: int | None = None
    resend_at: float | None = None


@dataclass
class Router:
    rid: str
    node: SequencerNode | None
    inc: str
    frozen_until: float | None = None
    inbox: deque[tuple[Any, ...]] = field(default_factory=deque)
    belief: dict[str, bool] = field(default_factory=dict)
    last: int | None = None  # last number this incarnation delivered
    restored: int = 0  # the checkpoint it went on from
    disk: list[Any] = field(default_factory=list)  # its journal file: JSON lines (with disk)
    amnesic: bool = False  # down without its votes (counts toward N - Q)


class OrderSim:
    def __init__(self, seed: int, *, duration: float = 20.0, settle: float = 10.0, gids: int | None = None) -> None:
        self.seed = seed
        self.k = Scheduler(seed)
        self.rng = rng = self.k.rng
        self.net = Network(self.k, per_link=False)
        self.n = rng.choice([3, 3, 4, 5, 5])
        self.ids = [chr(ord("A") + i) for i in range(self.n)]
        self.quorum = self.n // 2 + 1
        self.duration, self.settle = duration, settle
        self.compacting = rng.random() < 0.3
        # a profile per seed: network speed and spikes, how fast crashed routers return, how often
        # the detector suspects a live router (wrong beliefs: more elections, competing leaders)
        self.slow = rng.choice([0.02, 0.04, 0.1, 0.3])
        self.spike = rng.choice([0.02, 0.05, 0.15])
        self.quick_restart = rng.random() < 0.5
        self.suspicion = rng.choice([0.0, 0.0, 0.3, 1.0])  # false suspicions per second per router
        self.vote_crash = rng.choice([0.0, 0.01, 0.03])  # chance a router dies right after it votes
        self.with_disk = rng.random() < 0.4  # routers keep their votes on disk; crashes restore them
        self.profile = (f"N={self.n} compacting={self.compacting} slow={self.slow} spike={self.spike} "
                        f"quick_restart={self.quick_restart} suspicion={self.suspicion} vote_crash={self.vote_crash} "
                        f"disk={self.with_disk}")
        self.trace: deque[str] = deque(maxlen=80)
        self.routers = {r: Router(r, SequencerNode(r, self.ids, f"{r}.0", 0.0, bootstrap=True), f"{r}.0")
                        for r in self.ids}
        for r in self.routers.values():
            assert r.node is not None
            r.node.journaling = self.with_disk
        self.restarts = dict.fromkeys(self.ids, 0)
        self.cuts: dict[frozenset[str], int] = {}
        self.num2gid: dict[int, str] = {}
        self.gid2num: dict[str, int] = {}
        self.clients: dict[str, Client] = {}
        self.stats = {"crash": 0, "leader_crash": 0, "freeze": 0, "partition": 0, "msgs": 0, "resend": 0,
                      "unresolved": 0, "compactions": 0, "restores": 0, "disk_restarts": 0, "all_down": 0}
        count = gids if gids is not None else rng.randint(40, 240)
        for k in range(count):
            self._at(rng.uniform(0.0, duration), "submit", f"g{k}", None)
        t = rng.uniform(0.2, 1.0)
        rate = self.rate = rng.choice([0.15, 0.4, 0.8, 1.5])  # mean time between faults
        while t < duration:
            self._at(t, "fault", rng.choice(["crash", "crash", "freeze", "partition", "partition"]))
            t += rng.expovariate(1 / rate)
        t = 0.0
        while self.suspicion and (t := t + rng.expovariate(self.suspicion * self.n)) < duration:
            self._at(t, "suspect", rng.choice(self.ids), rng.choice(self.ids))
        self._at(duration, "heal")
        self._at(TICK, "tick")
        for r in self.ids:
            self._drain(self.routers[r])
        self._detect_all(0.0)

    # ------------------------------------------------------------------ plumbing
    @property
    def now(self) -> float:
        return self.k.now

    def _at(self, t: float, kind: str, *args: Any) -> None:
        self.k.at(t, getattr(self, f"_ev_{kind}"), *args)

    def _log(self, text: str) -> None:
        self.trace.append(f"{self.now:7.3f} {text}")

    def fail(self, text: str) -> None:
        raise Violation(text)

    def up(self, r: str) -> bool:
        return self.routers[r].node is not None

    def reachable(self, a: str, b: str) -> bool:
        rb = self.routers[b]
        return self.up(a) and self.up(b) and rb.frozen_until is None and not self.cuts.get(frozenset((a, b)))

    def _detect_all(self, now: float) -> None:
        for a in self.ids:
            for b in self.ids:
                if a != b:
                    self._at(now + self.rng.uniform(0.05, 0.6), "detect", a, b)

    def _send(self, src: str, dst: str, wire: Wire) -> None:
        if self.cuts.get(frozenset((src, dst))) or not self.up(dst):
            return
        self.stats["msgs"] += 1
        spike = self.rng.random() < self.spike
        delay = self.rng.uniform(0.2, 1.5) if spike else self.rng.uniform(0.001, self.slow)
        self.net.send(src, dst, delay, self._arrived, src, dst, wire)

    def _drain(self, r: Router) -> None:
        node = r.node
        assert node is not None
        if self.with_disk and node.journal_pending:  # (on disk before its messages leave)
            j = node.take_journal()
            if isinstance(j, SeqState):
                r.disk = [json.loads(json.dumps(seqstate_to_json(j)))]
            else:
                r.disk += [json.loads(json.dumps(journal_to_json(x))) for x in j]
        out, node.out = node.out, []
        voted = False
        for a in out:
            if isinstance(a, SendTo):
                self._send(r.rid, a.to, a.msg)
                voted = voted or isinstance(a.msg.body, Accepted | Promise | RecoverReply)
            elif isinstance(a, Delivered):
                self._delivered(r, a.n, a.gid)
            elif isinstance(a, Numbered):
                self._numbered(r, a.gid, a.n)
            elif isinstance(a, Restore):
                if r.last is not None and r.last > a.cp.number:
                    self.fail(f"{r.inc} restored to {a.cp.number} after delivering {r.last}")
                r.last = r.restored = a.cp.number
                self.stats["restores"] += 1
            elif isinstance(a, Unresolved):
                self.stats["unresolved"] += 1
                c = self.clients[a.gid]
                if c.number is None:  # still in doubt: the client resends, soon
                    c.resend_at = min(c.resend_at or 1e9, self.now + self.rng.uniform(0.01, 0.3))
        if voted and self.now < self.duration and self.rng.random() < self.vote_crash:
            self._at(self.now, "fault", "crash", r.rid)  # its vote is on the way; its memory is not

    # ------------------------------------------------------------------ checks
    def _commit(self, n: int, gid: str, who: str) -> None:
        if self.num2gid.setdefault(n, gid) != gid:
            self.fail(f"number {n} committed for {self.num2gid[n]} and {gid} ({who})")
        if self.gid2num.setdefault(gid, n) != n:
            self.fail(f"gid {gid} committed as {self.gid2num[gid]} and {n} ({who})")

    def _delivered(self, r: Router, n: int, gid: str) -> None:
        self._commit(n, gid, f"{r.inc} delivered")
        if n <= r.restored:
            return  # at or below the checkpoint it went on from: known already (the core ignores it)
        if r.last is None:
            if n != 1:
                self.fail(f"{r.inc} started delivering at {n}, not 1 (and went on from no checkpoint)")
        elif n != r.last + 1:
            self.fail(f"{r.inc} delivered {n} after {r.last}: a gap or a repeat")
        r.last = n

    def _numbered(self, r: Router, gid: str, n: int) -> None:
        self._commit(n, gid, f"{r.inc} numbered")
        c = self.clients[gid]
        if c.number is not None and c.number != n:
            self.fail(f"client of {gid} told {c.number} then {n}")
        c.number, c.resend_at = n, None

    def check_end(self) -> None:
        m = len(self.num2gid)
        if sorted(self.num2gid) != list(range(1, m + 1)):
            self.fail(f"numbers in use are not 1..{m}: gaps {sorted(set(range(1, m + 1)) - set(self.num2gid))}")
        missing = sorted(set(self.clients) - set(self.gid2num))
        if missing:
            self.fail(f"never numbered after healing: {missing}")
        top = max(self.ids)
        for r in self.routers.values():
            node = r.node
            if node is None or node.status is not Status.NORMAL:
                self.fail(f"{r.inc} did not recover after healing")
            assert node is not None
            if node.next_num - 1 != m:
                self.fail(f"{r.inc} delivered up to {node.next_num - 1} of {m}")
            if node.coordinator != top:
                self.fail(f"{r.inc} takes {node.coordinator} for coordinator, not {top}")
            for s, e in node.chosen.items():
                for k, g in enumerate(e.gids):
                    if self.gid2num.get(g) != e.first + k:
                        self.fail(f"{r.inc} holds slot {s} numbering {g} as {e.first + k}")
        leader = self.routers[top].node
        assert leader is not None
        if not leader.leading:
            self.fail(f"coordinator {top} is not leading after healing")
        for c in self.clients.values():
            if c.number is None:
                self.fail(f"client of {c.gid} never told its number")

    # ------------------------------------------------------------------ run
    def run(self) -> OrderSim:
        self.k.run(until=self.duration + self.settle, max_steps=400_000, runaway=True)
        self.check_end()
        return self

    def _input(self, r: Router, item: tuple[Any, ...]) -> None:
        if r.node is None:
            return
        if r.frozen_until is not None:
            r.inbox.append(item)
            return
        self._apply(r, item)

    def _apply(self, r: Router, item: tuple[Any, ...]) -> None:
        node = r.node
        assert node is not None
        kind = item[0]
        if kind == "msg":
            node.handle(item[1], item[2], self.now)
        elif kind == "detect":
            b = item[1]
            truth = self.reachable(r.rid, b) if len(item) == 2 else item[2]
            if r.belief.get(b, False) != truth:
                r.belief[b] = truth
                self._log(f"{r.rid} believes {b} {'up' if truth else 'down'}")
                (node.peer_up if truth else node.peer_down)(b, self.now)
        elif kind == "submit":
            node.submit(item[1], self.now)
        self._drain(r)

    def _arrived(self, src: str, dst: str, wire: Wire) -> None:
        self._log(f"{src}->{dst} {type(wire.body).__name__} life={wire.life}")
        self._input(self.routers[dst], ("msg", src, wire))

    def _ev_detect(self, a: str, b: str) -> None:
        self._input(self.routers[a], ("detect", b))

    def _ev_tick(self) -> None:
        for r in self.routers.values():
            if r.node is not None and r.frozen_until is None:
                r.node.tick(self.now)
                self._drain(r)
        for c in self.clients.values():
            if c.resend_at is not None and self.now >= c.resend_at:
                self._submit(c, exclude=c.at)
        self._at(self.now + TICK, "tick")
        if self.compacting and self.rng.random() < 0.1:
            self._compact()

    def _compact(self) -> None:
        doubt = [self.gid2num.get(c.gid, 1 << 30) for c in self.clients.values() if c.number is None]
        horizon = min(doubt, default=1 << 30) - 1
        for r in self.routers.values():
            node = r.node
            if node is not None and r.frozen_until is None:
                node.note_floor(horizon, self.now)
                safe = node.safe_floor()
                if safe > node.base_num - 1:
                    before = node.base
                    node.compact(Checkpoint(safe, (), ()))
                    self.stats["compactions"] += node.base > before
                self._drain(r)

    def _submit(self, c: Client, exclude: str | None = None) -> None:
        live = [r for r in self.ids if self.up(r) and r != exclude] or [r for r in self.ids if self.up(r)]
        if not live:
            c.resend_at = self.now + 0.5
            return
        r = self.routers[self.rng.choice(live)]
        c.at, c.inc = r.rid, r.inc
        if c.number is None:
            c.resend_at = self.now + self.rng.uniform(2.0, 4.0)  # the client's own timeout
        self._log(f"submit {c.gid} at {r.rid}")
        self._input(r, ("submit", c.gid))

    def _ev_submit(self, gid: str, _: None) -> None:
        c = self.clients.setdefault(gid, Client(gid))
        if c.at is not None:
            if self.compacting and c.number is not None:
                return  # compaction assumes no resend once the client knows its number
            self.stats["resend"] += 1
        self._submit(c)
        if self.rng.random() < 0.15:  # a duplicate resend, whatever happens
            self._at(self.now + self.rng.uniform(0.0, 3.0), "submit", gid, None)

    def _ev_fault(self, kind: str, target: str | None = None) -> None:
        rng = self.rng
        live = [r for r in self.ids if self.up(r)]
        if not live:
            return
        if kind == "crash":
            # (only routers without their votes count: down amnesic, or recovering)
            weak = sum(1 for r in self.routers.values()
                       if (r.node is None and r.amnesic) or (r.node is not None and r.node.status is not Status.NORMAL))
            if (weak >= self.n - self.quorum and not self.with_disk) or (target is not None and not self.up(target)):
                return
            if self.with_disk and rng.random() < 0.05 and target is None:
                self.stats["all_down"] += 1  # every router at once, restarted from disk
                leaders = [r for r in live if self.routers[r].node.leading]  # type: ignore[union-attr]
                for v in live:
                    node = self.routers[v].node
                    self.routers[v].amnesic = node is not None and node.status is not Status.NORMAL
                    self._crash(v, leaders)
                    self._at(self.now + rng.uniform(0.05, 1.0), "restart", v)
                return
            leaders = [r for r in live if self.routers[r].node.leading]  # type: ignore[union-attr]
            victim = target or (rng.choice(leaders) if leaders and rng.random() < 0.5 else rng.choice(live))
            # with disk, now and then one loses it anyway (within N - Q, as an amnesic crash)
            vr = self.routers[victim]
            recovering = vr.node is not None and vr.node.status is not Status.NORMAL  # (counted in weak)
            vr.amnesic = not self.with_disk or recovering or (weak < self.n - self.quorum and rng.random() < 0.2)
            if weak >= self.n - self.quorum and vr.amnesic and not recovering:
                return
            self._crash(victim, leaders)
            back = rng.uniform(0.005, 0.15) if self.quick_restart and rng.random() < 0.7 else rng.uniform(0.3, 2.0)
            self._at(self.now + back, "restart", victim)
        elif kind == "freeze":
            victim = rng.choice(live)
            r = self.routers[victim]
            if r.frozen_until is None:
                self.stats["freeze"] += 1
                r.frozen_until = self.now + rng.uniform(0.3, 2.5)
                self._log(f"freeze {victim} until {r.frozen_until:.3f}")
                self._at(r.frozen_until, "thaw", victim, r.inc)
                self._detect_all(self.now)
        else:
            self.stats["partition"] += 1
            if rng.random() < 0.6:
                side = sorted(rng.sample(self.ids, rng.randint(1, self.n // 2)))
                pairs = [frozenset((a, b)) for a in side for b in self.ids if b not in side]
            else:
                every = [frozenset((a, b)) for a in self.ids for b in self.ids if a < b]
                pairs = rng.sample(every, rng.randint(1, len(every)))
            self._log(f"cut {sorted(tuple(sorted(p)) for p in pairs)}")
            for p in pairs:
                self.cuts[p] = self.cuts.get(p, 0) + 1
                a, b = tuple(p)
                self.net.reset(a, b)
                self.net.reset(b, a)
            self._at(self.now + rng.uniform(0.2, 1.0) * (3 if self.rate > 0.3 else 1), "heal_cut", pairs)
            self._detect_all(self.now)

    def _crash(self, victim: str, leaders: list[str]) -> None:
        r = self.routers[victim]
        self.stats["crash"] += 1
        self.stats["leader_crash"] += victim in leaders
        self._log(f"crash {r.inc}{' (leader)' if victim in leaders else ''}")
        r.node, r.frozen_until, r.last, r.restored = None, None, None, 0
        r.inbox.clear()
        for o in self.ids:
            self.net.reset(o, victim)
        if self.rng.random() < 0.5:  # what it sent before dying crawls in late (order kept per channel)
            lag = {o: self.rng.uniform(0.1, 1.0) for o in self.ids}
            self.net.delay_sent(victim, lag)
        self._detect_all(self.now)

    def _ev_restart(self, victim: str) -> None:
        r = self.routers[victim]
        if r.node is not None:
            return
        self.restarts[victim] += 1
        r.inc = f"{victim}.{self.restarts[victim]}"
        r.belief = {}
        if self.with_disk and not r.amnesic and r.disk:
            r.node = SequencerNode.restore(seqstate_from_json(r.disk), victim, self.ids, r.inc, self.now)
            self.stats["disk_restarts"] += r.node.restored
        else:
            r.node = SequencerNode(victim, self.ids, r.inc, self.now)
            r.node.journaling = self.with_disk
        r.amnesic = False
        self._log(f"restart {r.inc}{' from disk' if r.node.restored else ''}")
        self._drain(r)
        self._detect_all(self.now)
        for c in self.clients.values():  # clients of the dead incarnation fail over
            if c.number is None and c.at == victim and c.inc != r.inc:
                c.resend_at = self.now + self.rng.uniform(0.05, 1.0)

    def _ev_thaw(self, victim: str, inc: str) -> None:
        r = self.routers[victim]
        if r.inc != inc or r.frozen_until is None:
            return
        self._log(f"thaw {victim} ({len(r.inbox)} inputs waiting)")
        r.frozen_until = None
        while r.inbox and r.node is not None:
            self._apply(r, r.inbox.popleft())
        self._detect_all(self.now)

    def _ev_suspect(self, a: str, b: str) -> None:
        """The detector of `a` wrongly takes live `b` for dead; it finds out after a while."""
        if a != b and self.reachable(a, b):
            self._input(self.routers[a], ("detect", b, False))
            self._at(self.now + self.rng.uniform(0.1, 1.0), "detect", a, b)

    def _ev_heal_cut(self, pairs: list[frozenset[str]]) -> None:
        for p in pairs:
            self.cuts[p] = max(0, self.cuts.get(p, 0) - 1)
        self._log("heal a cut")
        self._detect_all(self.now)

    def _ev_heal(self) -> None:
        self._log("heal everything")
        self.cuts.clear()
        self.slow, self.spike, self.suspicion = 0.02, 0.0, 0.0  # and the network calms down
        for r in self.routers.values():
            if r.node is None:
                self._ev_restart(r.rid)
            elif r.frozen_until is not None:
                self._ev_thaw(r.rid, r.inc)
        self._detect_all(self.now)

    def describe(self) -> str:
        lines = [f"seed {self.seed}: {self.profile} fault_every={self.rate}s stats={self.stats}"]
        for r in self.routers.values():
            node = r.node
            if node is None:
                lines.append(f"  {r.inc}: down")
            else:
                lines.append(f"  {r.inc}: {node.status.name} life={node.life} coord={node.coordinator} "
                             f"lead={node.lead.name} ballot={node.ballot} promised={node.promised} "
                             f"next={node.next_slot}/{node.next_num} pending={sorted(node.pending)}")
        return "\n".join(lines + ["  last events:"] + [f"    {t}" for t in self.trace])
