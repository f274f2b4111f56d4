"""The whole mesh in one process under a seeded simulator (see simulator.py for what is checked).

Default run (`SEEDS`, first column): 200 seeds without faults, 120 per fault case, 40 per case of
each ordering mode and per drain case, 40 with stopped routers and 20 with starved ones, 40 per case
of a rolling protocol upgrade (1,740 simulations over the example topologies, ~4 minutes on 2 cores). `pytest
tests/sim -m slow` runs the seeds after those up to the second column (3,800 in all, as the default
run did before it had to fit CI's time), plus 5,000 longer runs with every fault at once. Or
`pytest tests/sim --sim-seeds N` for seeds 1..N of every case. Replay one: `pytest tests/sim -k replay --sim-seed N
--sim-topology mesh4 --sim-faults kill,partition`. A failing seed prints that command.
"""

from __future__ import annotations

from typing import Any

import networkx as nx
import pytest

from tests.sim.kernel import judged
from tests.sim.simulator import Faults, SimRouter, Simulation

TOPOLOGIES: dict[str, list[tuple[str, str, float]]] = {
    "line3": [("A", "B", 1), ("B", "C", 1)],
    "triangle": [("A", "B", 1), ("B", "C", 1), ("A", "C", 1)],
    "mesh4": [("A", "B", 1), ("B", "C", 1), ("C", "D", 1), ("A", "D", 5)],
    "hubs": [("H1", "H2", 1), ("H1", "S1", 1), ("H1", "S2", 1), ("H2", "S3", 1), ("H2", "S4", 1)],
}


def graph(name: str) -> nx.Graph:
    g = nx.Graph()
    for a, b, c in TOPOLOGIES[name]:
        g.add_edge(a, b, cost=c)
    return g


def simulate(seed: int, topology: str, faults: str, duration: float = 8.0, messages: int = 30,
             total: bool | str = False, causal: bool = False, hold_after_stall: bool = True,
             by_id: bool = False, wildcards: bool = False, selectors: bool = False,
             shared: bool = False, upgrade: bool = False) -> Simulation:
    sim = Simulation(seed, graph(topology), faults=Faults.parse(faults), duration=duration, messages=messages,
                     total=total, causal=causal, hold_after_stall=hold_after_stall, by_id=by_id,
                     wildcards=wildcards, selectors=selectors, shared=shared, upgrade=upgrade)
    cmd = (f"pytest tests/sim -k replay --sim-seed {seed} --sim-topology {topology} "
           f"--sim-faults {faults or 'none'} --sim-duration {duration:g} --sim-messages {messages}"
           + (" --sim-lamport" if total == "lamport" else " --sim-total" if total else "")
           + (" --sim-causal" if causal else "") + ("" if hold_after_stall else " --sim-no-hold")
           + (" --sim-by-id" if by_id else "") + (" --sim-wildcards" if wildcards else "")
           + (" --sim-selectors" if selectors else "") + (" --sim-shared" if shared else "")
           + (" --sim-upgrade" if upgrade else ""))
    judged(sim.run, what=f"seed {seed} on {topology} with faults [{faults}]", replay=cmd,
           describe=lambda: "last events:\n" + sim.describe())
    return sim


# seeds per case: (default run, with -m slow)
SEEDS = {"mesh": (200, 500), "faults": (120, 300), "total": (40, 100), "lamport": (40, 100), "causal": (40, 100),
         "drain": (40, 300), "stop": (40, 300), "starve": (20, 300), "by_id": (40, 200),
         "wildcards": (40, 200), "selectors": (30, 200), "shared": (40, 200), "upgrade": (40, 300)}


def seeds(config: pytest.Config, case: str, full: bool = False) -> range:
    """Seeds of a case: 1..default, or with `full` the rest up to the slow run's count."""
    n = config.getoption("--sim-seeds")
    if n:
        return range(1, n + 1) if not full else range(0)
    default, more = SEEDS[case]
    return range(default + 1, more + 1) if full else range(1, default + 1)


def test_mesh_without_faults(pytestconfig: pytest.Config, full: bool = False) -> None:
    """Random publish / attach / detach / move schedules: exactly once, truthful outcomes."""
    for seed in seeds(pytestconfig, "mesh", full):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        sim = simulate(seed, topology, "", duration=6.0, messages=30)
        assert sum(len(v) for v in sim.owed.values()) > 0 or seed > 3


@pytest.mark.parametrize("faults", ["", "kill,freeze,partition", "drain,kill"])
def test_a_router_writes_its_table_whenever_it_changed(monkeypatch: pytest.MonkeyPatch, faults: str) -> None:
    """A simulated router writes its table's snapshot only when the table's version moved (as the real
    router does): at the end of every pass what it wrote (what a restart reads) is the table as it
    stands. Fails when a change of the table leaves its version as it was, or the write is skipped
    wrongly."""
    passes = []
    process = SimRouter.process

    def checked(self: SimRouter) -> None:
        process(self)
        assert self.snapshot == self.core.table.snapshot(), f"{self.id}: a stale snapshot at {self.sim.now}"
        passes.append(self.id)

    monkeypatch.setattr(SimRouter, "process", checked)
    for seed in range(1, 5):
        simulate(seed, sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)], faults, duration=4.0, messages=15)
    assert len(passes) > 100


def test_replay(pytestconfig: pytest.Config) -> None:
    seed = pytestconfig.getoption("--sim-seed")
    if seed is None:
        pytest.skip("give --sim-seed N to replay one simulation")
    sim = simulate(int(seed), pytestconfig.getoption("--sim-topology"), pytestconfig.getoption("--sim-faults"),
                   pytestconfig.getoption("--sim-duration"), pytestconfig.getoption("--sim-messages"),
                   "lamport" if pytestconfig.getoption("--sim-lamport") else pytestconfig.getoption("--sim-total"),
                   pytestconfig.getoption("--sim-causal"), not pytestconfig.getoption("--sim-no-hold"),
                   pytestconfig.getoption("--sim-by-id"), pytestconfig.getoption("--sim-wildcards"),
                   pytestconfig.getoption("--sim-selectors"), pytestconfig.getoption("--sim-shared"),
                   pytestconfig.getoption("--sim-upgrade"))
    print(sim.describe())


@pytest.mark.parametrize("faults", ["kill", "freeze", "partition", "loss", "kill,freeze,partition,loss"])
def test_mesh_with_faults(pytestconfig: pytest.Config, faults: str, full: bool = False) -> None:
    """Crashes and restarts, freezes, partitions and connection resets, at random: no duplicate,
    no false ACCEPTED ever; once faults heal, every message reaches its outcome."""
    for seed in seeds(pytestconfig, "faults", full):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        simulate(seed, topology, faults, duration=8.0, messages=30)


@pytest.mark.parametrize("faults", ["kill", "kill,partition,loss"])
def test_rolling_upgrade_with_faults(pytestconfig: pytest.Config, faults: str, full: bool = False) -> None:
    """A rolling upgrade of the inter-router protocol under faults: every router starts one version
    behind (JSON frames) and speaks the current one (compact frames) from its restart on, so the
    mesh mixes both. Exactly once throughout, and no router is ever sent a frame its version cannot
    read (the simulator's network checks every frame)."""
    mixed = 0
    for seed in seeds(pytestconfig, "upgrade", full):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        sim = simulate(seed, topology, faults, duration=8.0, messages=30, upgrade=True)
        kinds = sim.net.kinds
        mixed += bool(kinds[b"D"] and kinds[b"d"] and kinds[b"C"] and kinds[b"c"])
    assert mixed or full, "no run carried both versions' frames: the upgrade was not exercised"


@pytest.mark.parametrize("faults", ["kill", "kill,freeze,partition,loss"])
def test_publishers_identified_by_message_id_resend_under_fresh_tags(pytestconfig: pytest.Config, faults: str,
                                                                      full: bool = False) -> None:
    """Publishers whose library picks every tag itself (a resend after a failover goes under a fresh
    tag, on a new link) and ask to be identified by message-id (router/identity.py): no duplicate, no
    false ACCEPTED; once faults heal, every message reaches its outcome, and the resends happened."""
    resends = 0
    for seed in seeds(pytestconfig, "by_id", full):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        sim = simulate(seed, topology, faults, duration=8.0, messages=30, by_id=True)
        resends += sum(p.transfers - p.seq for p in sim.pubs)  # transfers beyond one per message
    assert resends > 0 or not seeds(pytestconfig, "by_id", full)


def owed_counts(pytestconfig: pytest.Config, case: str, faults: str, full: bool, **kw: Any) -> dict[str, int] | None:
    """Run a case's seeds (each must end with every message's outcome) and count, per subscriber
    name, the messages the simulator's own reading of the run owed it; None when no seed ran."""
    owed: dict[str, int] = {}
    sim = None
    for seed in seeds(pytestconfig, case, full):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        sim = simulate(seed, topology, faults, duration=8.0, messages=30, **kw)
        for sids in sim.owed.values():
            for sid in sids:
                owed[sid] = owed.get(sid, 0) + 1
        assert all(not p.in_doubt for p in sim.pubs)
    if sim is None:
        return None
    by_name = {sub.sid: sub.name for sub in sim.subs}
    return {by_name[sid]: n for sid, n in owed.items() if sid in by_name}


@pytest.mark.parametrize("faults", ["", "kill", "kill,freeze,partition,loss"])
def test_wildcard_subscriptions_with_faults(pytestconfig: pytest.Config, faults: str, full: bool = False) -> None:
    """Publishers on three topics of a tree, subscriptions with filters matching one, some or all of
    them (common/topics.py; `WILD_FILTERS`): each message is owed to exactly the subscriptions in
    force whose filter matches its topic, wherever they are homed; no duplicate, no false ACCEPTED,
    FIFO per publisher; once faults heal, every message reaches its outcome."""
    count = owed_counts(pytestconfig, "wildcards", faults, full, wildcards=True)
    # the filters did select: '#' (s2) is owed every message, 't/a' (s0) only one topic's
    if count is not None:
        assert count.get("s2", 0) > count.get("s1", 0) > count.get("s0", 0) > 0, count


@pytest.mark.parametrize("faults", ["", "kill,freeze,partition,loss"])
def test_selector_subscriptions_with_faults(pytestconfig: pytest.Config, faults: str, full: bool = False) -> None:
    """Messages with a `parity` property, subscriptions with JMS selectors over it (`SELECTORS`: none,
    the even ones, the odd ones, none at all): each message is owed to exactly the subscriptions in
    force whose selector selects it (the origin decides, common/selector.py); no duplicate, no false
    ACCEPTED; once faults heal, every message reaches its outcome."""
    count = owed_counts(pytestconfig, "selectors", faults, full, selectors=True)
    if count is not None:
        # no selector, even, odd: each owed some; 'missing = 1' (no message has it): nothing
        assert count.get("s0", 0) > 0 and count.get("s1", 0) > 0 and count.get("s2", 0) > 0 and "s3" not in count, count


@pytest.mark.parametrize("faults", ["", "kill", "kill,freeze,partition,loss"])
def test_shared_subscriptions_with_faults(pytestconfig: pytest.Config, faults: str, full: bool = False) -> None:
    """The subscribers are members of two shared subscriptions (router/groups.py), each member a client
    of its own: members drop their connections, detach and come back, and are refused with a redirect
    when they try a router other than their subscription's home. Each message is handed to one member
    of each shared subscription in force, exactly once; no false ACCEPTED; once faults heal, every
    message reaches its outcome, and every member saw what it accepted settled."""
    members: dict[str, set[str]] = {}
    for seed in seeds(pytestconfig, "shared", full):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        sim = simulate(seed, topology, faults, duration=8.0, messages=30, shared=True)
        assert all(not p.in_doubt for p in sim.pubs)
        for sub in sim.subs:
            if sim.sequence.get(sub.sid):  # (handed over to this member's application)
                members.setdefault(sub.group_name, set()).add(sub.name)
        assert len({s.acct for s in sim.subs}) == 2
    if seeds(pytestconfig, "shared", full):
        # both members of each shared subscription had a share of its messages
        assert {g: len(v) for g, v in members.items()} == {"ga": 2, "gb": 2}, members


@pytest.mark.parametrize("seed,topology,faults", [(64, "hubs", "partition"), (79, "triangle", "kill,loss"),
                                                  (100, "hubs", "freeze")])
def test_shared_subscriptions_are_not_split_by_a_partition(seed: int, topology: str, faults: str) -> None:
    """Seeds where the simulator found a shared subscription split in two before the lease (a member
    took it to a router cut off from its home, which handed on: a message went to a member on each
    side): a home cut off from the majority stops handing within `shared_lease`, and another router
    takes the subscription over only after twice that."""
    simulate(seed, topology, faults, duration=8.0, messages=30, shared=True)


@pytest.mark.parametrize("faults", ["drain", "drain,kill,freeze,partition,loss"])
def test_mesh_with_drains(pytestconfig: pytest.Config, faults: str, full: bool = False) -> None:
    """Routers drained at random (as `oncemesh roll` does, also while other faults strike): the
    router's own `Drain` moves its clients and decides when it leaves; it restarts later. No
    duplicate, no false ACCEPTED; every drain ends, and every message reaches its outcome."""
    runs = drained = 0
    for seed in seeds(pytestconfig, "drain", full):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        sim = simulate(seed, topology, faults, duration=8.0, messages=30)
        runs += 1
        drained += sum(1 for line in sim.log if " drained in " in line)
    assert drained or not runs  # (drains did happen, and ended)


@pytest.mark.parametrize("faults", ["stop", "starve"])
def test_mesh_with_stalls(pytestconfig: pytest.Config, faults: str, full: bool = False) -> None:
    """Routers stopped (SIGSTOP: their clock runs, they process nothing, input piles up; their
    peers and clients time them out and fail over, then they go on and take the pile) or starved
    (passes that take long, late polls). Their loops run in passes under the edge's rules
    (common/passrules.py, tests/sim/passes.py): no duplicate (none handed again after its
    acceptance, even into the link of a client that has left), no false ACCEPTED; every message
    reaches its outcome. (Without the hold: tests/sim/test_edge_sim.py.)"""
    stalled = 0
    for seed in seeds(pytestconfig, faults, full):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        sim = simulate(seed, topology, faults, duration=8.0, messages=30)
        stalled += sum(1 for line in sim.log if " stalled: " in line)
    assert stalled  # (stalls did happen, and held hand-overs)


@pytest.mark.parametrize("faults", ["", "kill", "freeze", "partition", "loss", "kill,freeze,partition,loss"])
def test_total_order_with_faults(pytestconfig: pytest.Config, faults: str, full: bool = False) -> None:
    """A topic in total order (sequencer): on top of every promise above, every two subscriptions
    are handed the messages they both get in the same order, while the sequencer's router dies,
    freezes or is cut off."""
    for seed in seeds(pytestconfig, "total", full):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        sim = simulate(seed, topology, faults, duration=8.0, messages=30, total=True)
        assert sum(len(v) for v in sim.sequence.values()) > 0 or seed > 3


@pytest.mark.parametrize("faults", ["", "kill", "freeze", "partition", "loss", "kill,freeze,partition,loss"])
def test_lamport_order_with_faults(pytestconfig: pytest.Config, faults: str, full: bool = False) -> None:
    """A topic in total order by Lamport clocks: the same promises as with the sequencer, while
    routers die (restarting without their part of the stream), freeze or are cut off, and
    connections reset (frames lost on the way between two routers that stay reachable)."""
    for seed in seeds(pytestconfig, "lamport", full):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        sim = simulate(seed, topology, faults, duration=8.0, messages=30, total="lamport")
        assert sum(len(v) for v in sim.sequence.values()) > 0 or seed > 3


@pytest.mark.slow
@pytest.mark.parametrize("faults", ["kill,freeze,partition,loss"])
def test_mesh_with_faults_long(pytestconfig: pytest.Config, faults: str) -> None:
    """Behind `-m slow`: 5000 seeds (or --sim-seeds) of every fault at once, longer schedules."""
    n = pytestconfig.getoption("--sim-seeds") or 5000
    for seed in range(10_001, 10_001 + n):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        simulate(seed, topology, faults, duration=15.0, messages=60)


# seeds that once found a bug, kept in the default run: (seed, topology, faults, duration, messages)
REGRESSIONS = [
    # a restarted origin answered a stale-incarnation PROBE with FINAL: false ACCEPTED
    (12397, "line3", "kill,freeze,partition,loss", 15.0, 60),
    # a held copy's ACCEPTED ack lost on a reset that left everyone reachable: stuck in doubt
    (14826, "mesh4", "kill,freeze,partition,loss", 15.0, 60),
]


@pytest.mark.parametrize("seed,topology,faults,duration,messages", REGRESSIONS)
def test_regressions(seed: int, topology: str, faults: str, duration: float, messages: int) -> None:
    sim = simulate(seed, topology, faults, duration, messages)  # raises on any violation
    assert all(not p.in_doubt for p in sim.pubs)  # and every message reached its outcome


# total-order seeds that once found a bug: (seed, topology, faults)
TOTAL_REGRESSIONS = [
    # a resend withheld (its publisher had left the origin) let later numbers be sent again first
    (709, "line3", "kill,freeze,partition,loss"),
    # found by a 1,000-seed sweep of the first wiring (handed out of order after a freeze)
    (287, "triangle", "freeze"),
    # an origin whose publisher had left sent copies for parts its number added: a duplicate
    (884, "hubs", "partition"),
    # a moved subscription went on after the highest number of its publishers' latest messages, not
    # of the latest it was handed (total order is not FIFO): it waited for FINALs nobody remembered
    (1545, "line3", "kill,freeze,partition,loss"),
]


@pytest.mark.parametrize("faults", ["", "kill", "freeze", "partition", "loss", "kill,freeze,partition,loss"])
def test_causal_order_with_faults(pytestconfig: pytest.Config, faults: str, full: bool = False) -> None:
    """A topic in causal order: subscriber i and publisher i are one client; a message its client
    had been handed (through the router it publishes through) before publishing is never handed
    after it, on top of exactly-once, truthful outcomes and FIFO."""
    deps = 0
    for seed in seeds(pytestconfig, "causal", full):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        sim = simulate(seed, topology, faults, duration=8.0, messages=30, causal=True)
        deps += sum(len(d) for d in sim.deps.values())
    assert deps > 0  # clients did publish after being handed messages


# causal seeds that once found a bug: (seed, topology, faults)
CAUSAL_REGRESSIONS = [
    # a dependency final at the publishing router was dropped from the past; its publisher resent it
    # for a subscription that came in force later, which got it after what depended on it
    (247, "triangle", "partition"),
    # a dependency settled by its publisher attached at the waiting router itself: nobody answered
    (194, "mesh4", "kill"),
    # a resend through another router picked up dependencies published after it: a cycle of waits
    (16, "hubs", "loss"),
]


@pytest.mark.parametrize("seed,topology,faults", CAUSAL_REGRESSIONS)
def test_causal_order_regressions(seed: int, topology: str, faults: str) -> None:
    sim = simulate(seed, topology, faults, duration=8.0, messages=30, causal=True)  # raises on any violation
    assert all(not p.in_doubt for p in sim.pubs)


# Lamport seeds that once found a bug: (seed, topology, faults)
LAMPORT_REGRESSIONS = [
    # an orphan stamped again inside the adapter's loop over a commit's actions went out before
    # the stamps of that commit: a later key overtook earlier ones on the session (FIFO broken)
    (49, "line3", "loss"),
    (95, "triangle", "partition"),
]


@pytest.mark.parametrize("seed,topology,faults", LAMPORT_REGRESSIONS)
def test_lamport_order_regressions(seed: int, topology: str, faults: str) -> None:
    sim = simulate(seed, topology, faults, duration=8.0, messages=30, total="lamport")  # raises on any violation
    assert all(not p.in_doubt for p in sim.pubs)


@pytest.mark.parametrize("seed,topology,faults", TOTAL_REGRESSIONS)
def test_total_order_regressions(seed: int, topology: str, faults: str) -> None:
    sim = simulate(seed, topology, faults, duration=8.0, messages=30, total=True)  # raises on any violation
    assert all(not p.in_doubt for p in sim.pubs)


FULL_CASES = [("mesh", "")] + [(case, f) for case in ("faults",) for f in
                                ["kill", "freeze", "partition", "loss", "kill,freeze,partition,loss"]] + \
    [(case, f) for case in ("total", "lamport", "causal")
     for f in ["", "kill", "freeze", "partition", "loss", "kill,freeze,partition,loss"]] + \
    [("drain", f) for f in ["drain", "drain,kill,freeze,partition,loss"]] + [("stop", "stop"), ("starve", "starve")] + \
    [("by_id", f) for f in ["kill", "kill,freeze,partition,loss"]] + \
    [("wildcards", f) for f in ["", "kill", "kill,freeze,partition,loss"]] + \
    [("selectors", f) for f in ["", "kill,freeze,partition,loss"]] + \
    [("shared", f) for f in ["", "kill", "kill,freeze,partition,loss"]] + \
    [("upgrade", f) for f in ["kill", "kill,partition,loss"]]


@pytest.mark.slow
@pytest.mark.parametrize("case,faults", FULL_CASES)
def test_more_seeds(pytestconfig: pytest.Config, case: str, faults: str) -> None:
    """Behind `-m slow`: every case above with the seeds after the default run's, up to `SEEDS`'s
    second column."""
    run = {"mesh": lambda: test_mesh_without_faults(pytestconfig, full=True),
           "faults": lambda: test_mesh_with_faults(pytestconfig, faults, full=True),
           "total": lambda: test_total_order_with_faults(pytestconfig, faults, full=True),
           "lamport": lambda: test_lamport_order_with_faults(pytestconfig, faults, full=True),
           "causal": lambda: test_causal_order_with_faults(pytestconfig, faults, full=True),
           "drain": lambda: test_mesh_with_drains(pytestconfig, faults, full=True),
           "stop": lambda: test_mesh_with_stalls(pytestconfig, faults, full=True),
           "starve": lambda: test_mesh_with_stalls(pytestconfig, faults, full=True),
           "by_id": lambda: test_publishers_identified_by_message_id_resend_under_fresh_tags(pytestconfig, faults,
                                                                                             full=True),
           "wildcards": lambda: test_wildcard_subscriptions_with_faults(pytestconfig, faults, full=True),
           "selectors": lambda: test_selector_subscriptions_with_faults(pytestconfig, faults, full=True),
           "shared": lambda: test_shared_subscriptions_with_faults(pytestconfig, faults, full=True),
           "upgrade": lambda: test_rolling_upgrade_with_faults(pytestconfig, faults, full=True)}
    run[case]()
