"""The fault schedule of a chaos run: pregenerated from a seed, printed, then played.

Why pregenerate: a schedule that exists before the run can be printed, saved with the run, read by
a person, and replayed from its seed (the processes' timing still varies, the faults do not).

Why limits: faults so dense that nothing can make progress test nothing. By default at most one
router is down (killed or frozen) at a time, and the next router fault waits until the previous
victim has had time to come back; a frozen router is thawed within seconds; a partition heals within
seconds; at most one partition at a time. Clients may be killed while routers are down: a
client's own crash is independent of the mesh's.

Pure: no clock, no processes. `make_schedule` is a function of its arguments.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from ..topology.model import Topology


class FaultKind(StrEnum):
    KILL = "kill"  # SIGKILL a router, restart it (new incarnation) after `duration`
    FREEZE = "freeze"  # SIGSTOP a router, SIGCONT after `duration`
    PARTITION = "partition"  # cut (RST) or blackhole (silence) some links, restore after `duration`
    CLIENT_KILL = "client-kill"  # SIGKILL a client process, restart it with its state dir after `duration`


ALL_FAULTS: tuple[FaultKind, ...] = tuple(FaultKind)


def parse_faults(text: str) -> tuple[FaultKind, ...]:
    """`kill,freeze,partition,client-kill` (any subset, any order; `all`; `none` or empty)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return ALL_FAULTS
    if names in ([], ["none"]):
        return ()
    out = []
    for n in names:
        try:
            out.append(FaultKind(n))
        except ValueError:
            raise ValueError(f"unknown fault {n!r} (choose from {', '.join(k.value for k in FaultKind)}, "
                             f"or all)") from None
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True, slots=True)
class Limits:
    """How dense and how long faults are (seconds)."""

    mean_gap: float = 3.0  # mean time between the starts of two faults (exponential)
    warmup: float = 2.0  # no fault before this (traffic first)
    kill_down: tuple[float, float] = (0.5, 4.0)  # how long a killed router stays dead
    freeze_for: tuple[float, float] = (1.0, 5.0)  # straddles dead_after: some freezes are noticed, some not
    partition_for: tuple[float, float] = (1.0, 6.0)
    client_down: tuple[float, float] = (0.2, 3.0)
    recovery: float = 3.0  # after a router comes back, before the next router fault
    max_routers_down: int = 1
    max_clients_down: int = 2


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: what, to whom, when (seconds from the start of traffic), for how long."""

    at: float
    kind: FaultKind
    target: str  # router id, client name, or for a partition a readable name of the cut
    duration: float
    links: tuple[tuple[str, str], ...] = ()  # partitions: the links cut (or silenced)
    silent: bool = False  # partitions: blackhole instead of cut

    @property
    def until(self) -> float:
        return self.at + self.duration

    def what(self) -> str:
        """The fault without its time: `kill        SIGKILL router B, restart after 2.0s`."""
        return {FaultKind.KILL: f"SIGKILL router {self.target}, restart after {self.duration:.1f}s",
                FaultKind.FREEZE: f"SIGSTOP router {self.target}, SIGCONT after {self.duration:.1f}s",
                FaultKind.CLIENT_KILL: f"SIGKILL client {self.target}, restart after {self.duration:.1f}s",
                FaultKind.PARTITION: (f"{'blackhole' if self.silent else 'cut'} "
                                      f"{', '.join(f'{a}-{b}' for a, b in self.links)} ({self.target}), "
                                      f"restore after {self.duration:.1f}s")}[self.kind]

    def describe(self) -> str:
        return f"t={self.at:7.2f}s  {self.kind.value:<11} {self.what()}"

    def to_json(self) -> dict[str, object]:
        return {"at": round(self.at, 3), "kind": self.kind.value, "target": self.target,
                "duration": round(self.duration, 3), "links": [list(x) for x in self.links],
                "silent": self.silent}


def _partition(topo: Topology, rng: random.Random) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """A cut of the mesh: one link, one router isolated, or the routers split in two."""
    links = [(x.a, x.b) for x in topo.links]
    if not links:
        return None
    routers = sorted(topo.routers)
    shape = rng.choice(("link", "isolate", "split"))
    if shape == "link":
        a, b = rng.choice(links)
        return f"link {a}-{b}", ((a, b),)
    if shape == "isolate" or len(routers) < 4:
        side = {rng.choice(routers)}
    else:
        side = set(rng.sample(routers, rng.randint(2, len(routers) // 2)))
    crossing = tuple((a, b) for a, b in links if (a in side) != (b in side))
    if not crossing:
        return None
    return f"{{{','.join(sorted(side))}}} | rest", crossing


def make_schedule(topo: Topology, clients: Sequence[str], duration: float, seed: int,
                  kinds: Iterable[FaultKind] = ALL_FAULTS, limits: Limits = Limits()) -> list[Fault]:
    """Faults between `limits.warmup` and `duration` (every fault has healed by `duration`)."""
    kinds = [k for k in FaultKind if k in set(kinds)]
    if not clients:
        kinds = [k for k in kinds if k is not FaultKind.CLIENT_KILL]
    if not topo.links:
        kinds = [k for k in kinds if k is not FaultKind.PARTITION]
    rng = random.Random(seed)
    routers = sorted(topo.routers)
    out: list[Fault] = []
    t = limits.warmup + rng.expovariate(1.0 / limits.mean_gap)
    while kinds and t < duration:
        kind = rng.choice(kinds)
        fault = _one(kind, t, topo, routers, clients, rng, limits)
        if fault is not None and fault.until <= duration and _fits(fault, out, limits):
            out.append(fault)
        t += rng.expovariate(1.0 / limits.mean_gap)
    return out


def _one(kind: FaultKind, t: float, topo: Topology, routers: list[str], clients: Sequence[str],
         rng: random.Random, limits: Limits) -> Fault | None:
    if kind is FaultKind.KILL:
        return Fault(t, kind, rng.choice(routers), rng.uniform(*limits.kill_down))
    if kind is FaultKind.FREEZE:
        return Fault(t, kind, rng.choice(routers), rng.uniform(*limits.freeze_for))
    if kind is FaultKind.CLIENT_KILL:
        return Fault(t, kind, rng.choice(list(clients)), rng.uniform(*limits.client_down))
    cut = _partition(topo, rng)
    if cut is None:
        return None
    name, links = cut
    return Fault(t, kind, name, rng.uniform(*limits.partition_for), links, silent=rng.random() < 0.3)


def _overlaps(a: Fault, b: Fault, margin: float = 0.0) -> bool:
    return a.at < b.until + margin and b.at < a.until + margin


def _fits(new: Fault, placed: list[Fault], limits: Limits) -> bool:
    router_kinds = (FaultKind.KILL, FaultKind.FREEZE)
    if new.kind in router_kinds:
        busy = [f for f in placed if f.kind in router_kinds and _overlaps(new, f, limits.recovery)]
        return len(busy) < limits.max_routers_down and all(f.target != new.target for f in busy)
    if new.kind is FaultKind.PARTITION:
        return not any(f.kind is FaultKind.PARTITION and _overlaps(new, f, 0.5) for f in placed)
    busy = [f for f in placed if f.kind is FaultKind.CLIENT_KILL and _overlaps(new, f, 0.5)]
    return len(busy) < limits.max_clients_down and all(f.target != new.target for f in busy)
