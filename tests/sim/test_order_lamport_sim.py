"""Seeded simulation of `router.order.lamport`: 3-5 routers, FIFO channels, faults, publishers.

Each seed draws the number of routers, the publishers and a fault schedule: crashes with amnesia
(the router restarts empty, as a new incarnation), also part-way through a batch of output (what it
wrote before dying still arrives, nothing after), clean partitions (two groups, every link across
cut) and their healing, random delays. A link that goes down loses what is in flight (a TCP
connection); the failure detector tells both ends after a short delay, and tells the up-again ends
when it heals. Publishers are clients: each resends what its router has not delivered yet every
0.4 s (and at once when a router reports its gid orphaned), moves to another router when its own
is down, and now and then reconnects elsewhere anyway (so two routers may stamp the same gid).
Fault model (the module's stated assumption): a crash is only injected when ceil(n/2) of the n
members of the latest view, of the view it replaced and of any decision under way keep their state.
With `disk=True` a crash may also be a restart with disk: the router restarts from what it wrote
(`LamportNode.snapshot`, taken before each batch of output leaves, as the mesh adapter does) and
keeps its votes; then "keep their state" means keep their votes (on disk counts, even while down),
and one member of each such set must not have restarted at all (it holds what was delivered).

Compaction is on: every router reports its floor every `FLOOR_EVERY` seconds (`note_floor`: what
the delivery core would say; here the number before the first gid a publisher still waits for,
which a publisher may still resend, and never above what the router delivered) and compacts what
every router's floor passed (`safe_floor`, `compact`); a restarted router is sent the checkpoint
and the history after it (`Restore`). Some seeds report floors rarely, or not at all.

Checked: every number is the same gid at every router incarnation (the dead ones' too) and no gid
has two numbers; each incarnation delivers consecutive numbers, from 1 or from the checkpoint it was
restored from; no incarnation delivers a gid twice; after the faults stop and everything heals,
every live router delivered the same numbers, 1 .. M, which hold every published gid, and every
publisher got its answer; in runs without view changes the cost is exactly R-1 data frames and
(R-1)^2 ACKs per message.

Default: 300 seeds (150 with disk). More: ONCEMESH_ORDER_SEEDS=5000. Replay one (a failure prints the command):
ONCEMESH_ORDER_SEED=N pytest tests/sim/test_order_lamport_sim.py -k replay -s
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest

from oncemesh.router.order.lamport import (
    Action,
    Deliver,
    Duplicate,
    LamportNode,
    Orphaned,
    Restore,
    Send,
    Snapshot,
    ViewInstalled,
)
from oncemesh.router.order.total import Checkpoint
from tests.sim.kernel import Network, Scheduler, Violation, env_seed, env_seeds, judged

FD_DELAY = 0.02
RESEND = 0.4
TICK = 0.1
SETTLE = 40.0


@dataclass
class Publisher:
    name: str
    router: str
    gids: list[str] = field(default_factory=list)
    answered: set[str] = field(default_factory=set)


class LamportSim:
    def __init__(self, seed: int, faults: bool = True, duration: float = 8.0, disk: bool = False) -> None:
        self.seed = seed
        self.k = Scheduler(seed)
        self.rng = rng = self.k.rng
        self.net = Network(self.k, per_link=True)  # a link that changes state loses what is in flight
        self.faults = faults
        self.fault_run = faults
        self.duration = duration
        self.ids = list("ABCDE"[: rng.choice((3, 4, 5))])
        self.nodes = {r: LamportNode(r, self.ids, 0) for r in self.ids}
        self.inc = {r: 0 for r in self.ids}
        self.disk_faults = disk
        self.disk: dict[str, Snapshot | None] = {}  # what each router last wrote
        self.carries: dict[str, set[int]] = {r: {0} for r in self.ids}  # lives whose votes it keeps
        self.restores = 0
        self.alive = {r: True for r in self.ids}
        self.dying: set[str] = set()
        self.group = {r: 0 for r in self.ids}
        self.seqs: dict[tuple[str, int], list[str]] = {(r, 0): [] for r in self.ids}
        self.seen: dict[tuple[str, int], set[str]] = {(r, 0): set() for r in self.ids}
        self.last_n: dict[tuple[str, int], int] = {(r, 0): 0 for r in self.ids}
        self.numbers: dict[int, str] = {}  # number -> gid, as every router delivers it
        self.number_of: dict[str, int] = {}
        self.restores_from_checkpoint = 0
        self.compactions = 0
        # how often routers report their floors (0: never, compaction off)
        self.floor_every = rng.choice((0.0, 0.2, 0.5, 2.0)) if faults else rng.choice((0.0, 0.3))
        self.latest: tuple[Any, dict[str, int]] = ((0, ""), {r: 0 for r in self.ids})
        self.views: dict[Any, tuple[dict[str, int], Any]] = {(0, ""): ({r: 0 for r in self.ids}, None)}
        self.view_changes = 0
        self.trace: deque[str] = deque(maxlen=60)
        self.pubs = [Publisher(f"p{i}", rng.choice(self.ids)) for i in range(rng.randint(2, 4))]
        self.published = 0
        self.restarts = 0
        self.partitions = 0

    # -- scheduling -------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.k.now

    def at(self, t: float, kind: str, *args: Any) -> None:
        self.k.at(t, getattr(self, f"_ev_{kind}"), *args)

    def connected(self, a: str, b: str) -> bool:
        return self.alive[a] and self.alive[b] and self.group[a] == self.group[b]

    def link_changes(self, change: Any) -> None:
        """Apply a fault (a callable) and tell both ends of every link whose state it changed."""
        before = {(a, b): self.connected(a, b) for a in self.ids for b in self.ids if a < b}
        change()
        for (a, b), was in before.items():
            now_up = self.connected(a, b)
            if was == now_up:
                continue
            self.net.reset(a, b)
            for x, y in ((a, b), (b, a)):
                if self.alive[x]:
                    self.at(self.now + FD_DELAY, "fd", x, self.inc[x], y, self.inc[y] if now_up else None)

    def schedule(self) -> None:
        rng = self.rng
        for r in self.ids:
            self.at(rng.uniform(0, TICK), "tick", r)
            if self.floor_every:
                self.at(rng.uniform(0, self.floor_every), "floor", r)
        for p in self.pubs:
            t = 0.0
            for i in range(rng.randint(10, 40)):
                t += rng.expovariate(5.0)
                self.at(t, "publish", p, f"{p.name}:{i}")
            self.at(RESEND, "resend", p)
        if self.faults:
            t = rng.uniform(0.1, 0.6)
            while t < self.duration:
                kinds = ("crash", "disk", "disk", "partition") if self.disk_faults else ("crash", "crash", "partition")
                self.at(t, "fault", rng.choice(kinds))
                t += rng.expovariate(1.5)
        self.at(self.duration, "heal")

    # -- faults -----------------------------------------------------------------------------------
    def protected(self) -> list[dict[str, int]]:
        """Member sets whose read quorum must survive: the latest view, the view it replaced, and
        every decision under way (accepted somewhere or being proposed) with its base."""
        latest = self.latest[0]
        decisions = [d for node in self.live_nodes() for d in (
            node.accepted[1] if node.accepted else None,
            node.round.decision if node.round else None) if d is not None]
        # (and what a router that is down accepted, on its disk: its restored life promises it)
        decisions += [snap.accepted[1] for r, snap in self.disk.items()
                      if not self.alive[r] and self.carries[r] and snap is not None and snap.accepted]
        sets = [self.views[latest][0]]
        bases = {self.views[latest][1]} | {d.base for d in decisions}
        sets += [dict(d.members) for d in decisions if d.view > latest]
        sets += [self.views[b][0] for b in bases if b in self.views]
        return sets

    def may_crash(self, r: str, disk: bool = False) -> bool:
        for members in self.protected():
            # votes kept: alive with them, or down with them on disk (every crashed router restarts)
            keep = sum(1 for m, i in members.items()
                       if (m != r or (disk and self.disk.get(r) is not None)) and m not in self.dying
                       and i in self.carries[m])
            intact = sum(1 for m, i in members.items()
                         if m != r and self.alive[m] and m not in self.dying and self.inc[m] == i)
            if keep < len(members) - len(members) // 2 or intact < 1:
                return False
        return True

    def fault(self, kind: str) -> None:
        rng = self.rng
        if kind in ("crash", "disk"):
            r = rng.choice(self.ids)
            if self.alive[r] and self.may_crash(r, kind == "disk"):
                self.crash(r, "(with disk)" if kind == "disk" else "", disk=kind == "disk")
        elif kind == "partition" and len(set(self.group.values())) == 1:
            side = set(rng.sample(self.ids, rng.randint(1, len(self.ids) - 1)))
            self.partitions += 1
            self.log(f"partition {sorted(side)} | {sorted(set(self.ids) - side)}")
            self.link_changes(lambda: self.group.update({r: (1 if r in side else 0) for r in self.ids}))
            self.at(self.now + rng.uniform(0.3, 2.0), "unpartition")

    def crash(self, r: str, how: str, disk: bool = False) -> None:
        self.log(f"crash {r} {how}")
        if not disk or self.disk.get(r) is None:  # (nothing on disk before the first view change)
            self.carries[r] = set()
        self.link_changes(lambda: self.alive.__setitem__(r, False))
        self.at(self.now + self.rng.uniform(0.2, 1.5), "restart", r, disk)

    def restart(self, r: str, disk: bool = False) -> None:
        if self.alive[r]:
            return
        self.inc[r] += 1
        self.restarts += 1
        key = (r, self.inc[r])
        self.seqs[key], self.seen[key], self.last_n[key] = [], set(), 0
        snap = self.disk.get(r) if disk else None
        self.nodes[r] = LamportNode.restore(snap, r, self.ids, self.inc[r])
        if snap is None:
            self.carries[r] = set()
        self.carries[r].add(self.inc[r])
        self.restores += snap is not None
        self.log(f"restart {r}#{self.inc[r]}{' from disk' if snap else ''}")
        self.link_changes(lambda: self.alive.__setitem__(r, True))

    # -- running ----------------------------------------------------------------------------------
    def live_nodes(self) -> list[LamportNode]:
        return [self.nodes[r] for r in self.ids if self.alive[r]]

    def log(self, text: str) -> None:
        self.trace.append(f"{self.now:8.3f} {text}")

    def perform(self, r: str, actions: list[Action]) -> None:
        if r in self.dying:
            return  # dead already: whatever it computed never leaves it
        self.disk[r] = self.nodes[r].snapshot()  # written before its output leaves
        key = (r, self.inc[r])
        dies = (self.faults and sum(isinstance(a, Send) for a in actions) > 1 and self.rng.random() < 0.01
                and self.may_crash(r))
        if dies:  # the router dies part-way through this batch: only a prefix is performed
            actions = actions[: self.rng.randrange(len(actions))]
        for a in actions:
            if isinstance(a, Send):
                if self.connected(r, a.to):
                    self.net.send(r, a.to, self.rng.uniform(0.001, 0.03), self._arrived, r, a.to, a.msg)
            elif isinstance(a, Deliver):
                if a.gid in self.seen[key]:
                    raise Violation(f"{r}#{key[1]} delivered {a.gid} twice")
                if a.n != self.last_n[key] + 1:
                    raise Violation(f"{r}#{key[1]} delivered number {a.n} after {self.last_n[key]}")
                if self.numbers.setdefault(a.n, a.gid) != a.gid:
                    raise Violation(f"number {a.n} is {self.numbers[a.n]} elsewhere, {a.gid} at {r}#{key[1]}")
                if self.number_of.setdefault(a.gid, a.n) != a.n:
                    raise Violation(f"{a.gid} numbered {self.number_of[a.gid]} and {a.n} ({r}#{key[1]})")
                self.last_n[key] = a.n
                self.seen[key].add(a.gid)
                self.seqs[key].append(a.gid)
                for p in self.pubs:
                    if p.router == r and a.gid in p.gids:
                        p.answered.add(a.gid)
            elif isinstance(a, Duplicate):
                for p in self.pubs:
                    if p.router == r and a.gid in p.gids:
                        p.answered.add(a.gid)
            elif isinstance(a, Orphaned):
                self.log(f"{r} orphaned {list(a.gids)}")
                for p in self.pubs:
                    if set(a.gids) & set(p.gids) - p.answered:
                        self.at(self.now, "resend", p, False)
            elif isinstance(a, Restore):
                if a.cp.number < self.last_n[key]:
                    raise Violation(f"{r}#{key[1]} restored to {a.cp.number} after delivering {self.last_n[key]}")
                self.last_n[key] = a.cp.number
                self.restores_from_checkpoint += 1
                self.log(f"{r} goes on from checkpoint {a.cp.number}")
            elif isinstance(a, ViewInstalled):
                self.view_changes += 1
                self.log(f"{r} installed {a.view} {list(a.members)}")
                node = self.nodes[r]
                assert node.commit is not None
                self.views[a.view] = (dict(node.members), node.commit.decision.base)
                if a.view > self.latest[0]:
                    self.latest = (a.view, dict(node.members))
        if dies:  # what it already wrote still arrives; then its connections close
            self.dying.add(r)
            self.log(f"{r} dies mid-batch")
            self.at(self.now + 0.031, "die", r)

    def resend(self, p: Publisher) -> None:
        if p.router in self.dying or not self.alive[p.router] or (self.faults and self.rng.random() < 0.1):
            p.router = self.rng.choice([r for r in self.ids if self.alive[r]] or [p.router])  # fail over
        if self.alive[p.router] and p.router not in self.dying:
            for gid in p.gids:
                if gid not in p.answered:
                    self.perform(p.router, self.nodes[p.router].publish(gid, gid.encode(), self.now))

    # -- events (a dying process handles nothing: what it computed never leaves it) -----------------
    def _arrived(self, a: str, b: str, msg: Any) -> None:
        if b not in self.dying and self.connected(a, b):
            self.perform(b, self.nodes[b].handle(a, msg, self.now))

    def _ev_die(self, r: str) -> None:
        self.dying.discard(r)
        self.crash(r, "(after its last frames)")

    def _ev_fd(self, r: str, inc: int, peer: str, peer_inc: int | None) -> None:
        if r not in self.dying and self.alive[r] and self.inc[r] == inc:
            node = self.nodes[r]
            self.perform(r, node.member_down(peer, self.now) if peer_inc is None
                         else node.member_up(peer, peer_inc, self.now))

    def _ev_tick(self, r: str) -> None:
        if r not in self.dying and self.alive[r]:
            self.perform(r, self.nodes[r].tick(self.now))
        self.at(self.now + TICK, "tick", r)

    def horizon(self) -> int:
        """The number before the first gid a publisher waits for (it may resend it anywhere: the
        delivery core keeps such a number; `DeliveryCore.total_floor`)."""
        waiting = [self.number_of[g] for p in self.pubs for g in p.gids if g not in p.answered and g in self.number_of]
        return min(waiting, default=max(self.numbers, default=0) + 1) - 1

    def _ev_floor(self, r: str) -> None:
        if r not in self.dying and self.alive[r]:
            node = self.nodes[r]
            self.perform(r, node.note_floor(min(node.count, self.horizon()), self.now))
            safe = node.safe_floor()
            if safe > node.hbase:
                before = node.hbase
                self.perform(r, node.compact(Checkpoint(safe, (), ()), self.now))
                self.compactions += node.hbase > before
        self.at(self.now + self.floor_every, "floor", r)

    def _ev_publish(self, p: Publisher, gid: str) -> None:
        p.gids.append(gid)
        self.published += 1
        self.resend(p)

    def _ev_resend(self, p: Publisher, again: bool = True) -> None:
        self.resend(p)
        if again:
            self.at(self.now + RESEND, "resend", p)

    def _ev_fault(self, kind: str) -> None:
        self.fault(kind)

    def _ev_restart(self, r: str, disk: bool = False) -> None:
        self.restart(r, disk)

    def _ev_unpartition(self) -> None:
        self.log("heal partition")
        self.link_changes(lambda: self.group.update({r: 0 for r in self.ids}))

    def _ev_heal(self) -> None:
        self.faults = False
        self.log("faults stop")
        self.link_changes(lambda: self.group.update({r: 0 for r in self.ids}))
        for r in self.ids:
            if not self.alive[r]:
                self.at(self.now, "restart", r, bool(self.carries[r]))

    def settled(self) -> bool:
        if self.now < self.duration or any(not a for a in self.alive.values()):
            return False
        if any(len(p.answered) < len(p.gids) for p in self.pubs):
            return False
        nodes = self.live_nodes()
        first = nodes[0]
        return all(n.installed == first.installed and not n.frozen and not n.queue
                   and n.count == first.count for n in nodes)

    def run(self) -> None:
        self.schedule()
        while self.k.pending() and self.now < self.duration + SETTLE:
            self.k.step()
            if self.now >= self.duration and self.settled():
                break
        self.check()

    # -- the properties -------------------------------------------------------------------------
    def check(self) -> None:
        m = len(self.numbers)
        if sorted(self.numbers) != list(range(1, m + 1)):
            raise Violation(f"numbers delivered are not 1..{m}")
        ref = [self.numbers[n] for n in range(1, m + 1)]
        pos = {gid: i for i, gid in enumerate(ref)}
        if len(pos) != len(ref):
            raise Violation("the reference order holds a gid twice")
        for r in self.ids:
            node = self.nodes[r]
            hist = [e.gid for e in node.history]
            if node.count != m or hist != ref[node.hbase:]:
                raise Violation(f"live router {r} ends at {node.count} ({len(hist)} kept), reference {m}")
        missing = [g for p in self.pubs for g in p.gids if g not in pos]
        if missing:
            raise Violation(f"published but never delivered: {missing[:5]} ({len(missing)})")
        unanswered = [g for p in self.pubs for g in p.gids if g not in p.answered]
        if unanswered:
            raise Violation(f"publishers never answered for {unanswered[:5]}")
        if not self.fault_run:
            n, r = self.published, len(self.ids)
            data = sum(nd.stats.data_sent for nd in self.nodes.values())
            acks = sum(nd.stats.acks_sent for nd in self.nodes.values())
            if (data, acks) != (n * (r - 1), n * (r - 1) ** 2):
                raise Violation(f"cost: {data} data, {acks} acks for {n} messages on {r} routers")

    def describe(self) -> str:
        lines = [f"routers {self.ids}, publishers {[(p.name, len(p.gids)) for p in self.pubs]}, "
                 f"floors every {self.floor_every}s, {self.compactions} compactions, "
                 f"{self.restores_from_checkpoint} restores from a checkpoint"]
        for r in self.ids:
            n = self.nodes[r]
            lines.append(f"  {r}#{self.inc[r]} alive={self.alive[r]} view={n.installed} promised={n.promised} "
                         f"frozen={n.frozen} queue={len(n.queue)} "
                         f"pending={len(n.pending)} delivered={n.count} compacted={n.hbase} floors={n.floors}")
        return "\n".join(lines + list(self.trace))


def replay_command(seed: int, faults: bool, disk: bool = False) -> str:
    return (f"ONCEMESH_ORDER_SEED={seed} ONCEMESH_ORDER_FAULTS={int(faults)} ONCEMESH_ORDER_DISK={int(disk)} "
            ".venv/bin/python -m pytest tests/sim/test_order_lamport_sim.py -k replay -s")


def simulate(seed: int, faults: bool = True, disk: bool = False) -> LamportSim:
    sim = LamportSim(seed, faults=faults, disk=disk)
    judged(sim.run, what=f"seed {seed} (faults={faults}, disk={disk})", replay=replay_command(seed, faults, disk),
           describe=sim.describe)
    return sim


def test_total_order_without_faults_costs_r_times_r_minus_1() -> None:
    """No faults: every router delivers the same sequence, at exactly R(R-1) frames per message."""
    for seed in env_seeds(40):
        sim = simulate(100_000 + seed, faults=False)
        assert sim.view_changes == 0 and sim.published > 0


def test_total_order_under_crashes_and_partitions() -> None:
    """Crashes with amnesia, restarts, partitions: one order, no duplicate, everything delivered."""
    restarts = partitions = changes = 0
    for seed in env_seeds(300):
        sim = simulate(seed)
        restarts, partitions, changes = restarts + sim.restarts, partitions + sim.partitions, changes + sim.view_changes
    assert restarts and partitions and changes  # the faults did happen and force view changes


def test_total_order_under_restarts_with_disk() -> None:
    """Restarts with disk next to amnesic ones: more routers may restart within one view (their votes
    stand), one order, no duplicate, everything delivered, and the run quiesces."""
    restores = changes = 0
    for seed in env_seeds(150):
        sim = simulate(200_000 + seed, disk=True)
        restores, changes = restores + sim.restores, changes + sim.view_changes
    assert restores and changes  # restarts from disk did happen


def test_replay() -> None:
    seed = env_seed()
    if seed is None:
        pytest.skip("set ONCEMESH_ORDER_SEED=N to replay one simulation")
    sim = simulate(seed, faults=os.environ.get("ONCEMESH_ORDER_FAULTS", "1") != "0",
                   disk=os.environ.get("ONCEMESH_ORDER_DISK", "0") != "0")
    print(sim.describe())
