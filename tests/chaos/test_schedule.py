"""The fault schedule: a pure function of its seed, within its limits (no processes, milliseconds).

    line3:  A --- B --- C        mesh4:  A-B, B-C, C-D, A-D, A-C, B-D
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncemesh.harness.faults import ALL_FAULTS, Fault, FaultKind, Limits, make_schedule, parse_faults
from oncemesh.topology.load import example_path, load_topology

EXAMPLES = example_path()
TOPOLOGIES = {name: load_topology(EXAMPLES / f"{name}.toml") for name in ("line3", "triangle", "mesh4", "hubs")}
CLIENTS = ["sub-0", "sub-1", "sub-2", "pub-0", "pub-1"]
ROUTER_FAULTS = (FaultKind.KILL, FaultKind.FREEZE)


def overlap(a: Fault, b: Fault, margin: float) -> bool:
    return a.at < b.until + margin and b.at < a.until + margin


def test_same_seed_same_schedule_and_seeds_differ() -> None:
    topo = TOPOLOGIES["mesh4"]
    one = make_schedule(topo, CLIENTS, 120, seed=7)
    assert one == make_schedule(topo, CLIENTS, 120, seed=7)
    assert one != make_schedule(topo, CLIENTS, 120, seed=8)
    assert {f.kind for f in one} == set(FaultKind)  # two minutes are enough for every kind


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(TOPOLOGIES)), seed=st.integers(0, 2**31), duration=st.floats(1, 900),
       kinds=st.sets(st.sampled_from(list(FaultKind))))
def test_schedules_keep_to_their_limits(name: str, seed: int, duration: float, kinds: set[FaultKind]) -> None:
    topo, limits = TOPOLOGIES[name], Limits()
    faults = make_schedule(topo, CLIENTS, duration, seed, kinds, limits)
    links = {(x.a, x.b) for x in topo.links}
    assert faults == sorted(faults, key=lambda f: f.at)
    for i, f in enumerate(faults):
        assert f.kind in kinds
        assert limits.warmup <= f.at and f.until <= duration  # healed by the end of traffic
        if f.kind is FaultKind.KILL:
            assert f.target in topo.routers and limits.kill_down[0] <= f.duration <= limits.kill_down[1]
        elif f.kind is FaultKind.FREEZE:
            assert f.target in topo.routers and limits.freeze_for[0] <= f.duration <= limits.freeze_for[1]
        elif f.kind is FaultKind.CLIENT_KILL:
            assert f.target in CLIENTS and limits.client_down[0] <= f.duration <= limits.client_down[1]
        else:
            assert f.links and set(f.links) <= links
            assert limits.partition_for[0] <= f.duration <= limits.partition_for[1]
        others = faults[:i] + faults[i + 1:]
        if f.kind in ROUTER_FAULTS:  # one router down at a time, and time to come back in between
            assert not any(g.kind in ROUTER_FAULTS and overlap(f, g, limits.recovery) for g in others)
        if f.kind is FaultKind.PARTITION:
            assert not any(g.kind is FaultKind.PARTITION and overlap(f, g, 0) for g in others)
        if f.kind is FaultKind.CLIENT_KILL:  # at any moment (the most at some start), at most 2 down
            down = [g for g in faults if g.kind is FaultKind.CLIENT_KILL and g.at <= f.at < g.until]
            assert len(down) <= limits.max_clients_down
            assert not any(g.kind is FaultKind.CLIENT_KILL and g.target == f.target and overlap(f, g, 0)
                           for g in others)


def test_partitions_cut_the_links_between_the_sides() -> None:
    topo = TOPOLOGIES["mesh4"]
    parts = [f for f in make_schedule(topo, [], 3000, 3, [FaultKind.PARTITION])]
    assert len(parts) > 100 and all(f.kind is FaultKind.PARTITION for f in parts)
    assert any(f.silent for f in parts) and any(not f.silent for f in parts)
    for f in parts:
        if f.target.startswith("{"):
            side = set(f.target[1:f.target.index("}")].split(","))
            crossing = {(x.a, x.b) for x in topo.links if (x.a in side) != (x.b in side)}
            assert set(f.links) == crossing
        else:
            assert len(f.links) == 1


def test_no_clients_no_client_kills_and_density_follows_the_mean_gap() -> None:
    topo = TOPOLOGIES["line3"]
    faults = make_schedule(topo, [], 600, 1, ALL_FAULTS)
    assert faults and FaultKind.CLIENT_KILL not in {f.kind for f in faults}
    dense = make_schedule(topo, CLIENTS, 600, 1, ALL_FAULTS, Limits(mean_gap=1.0))
    sparse = make_schedule(topo, CLIENTS, 600, 1, ALL_FAULTS, Limits(mean_gap=20.0))
    assert len(dense) > 2 * len(sparse)


def test_parse_faults() -> None:
    assert parse_faults("all") == ALL_FAULTS
    assert parse_faults("kill, partition,kill") == (FaultKind.KILL, FaultKind.PARTITION)
    assert parse_faults("none") == () == parse_faults("")
    assert parse_faults("client-kill") == (FaultKind.CLIENT_KILL,)
    with pytest.raises(ValueError, match="unknown fault 'reboot'"):
        parse_faults("kill,reboot")


def test_describe_says_what_and_when() -> None:
    f = Fault(3.5, FaultKind.PARTITION, "{C} | rest", 2.0, (("B", "C"),), silent=True)
    assert f.describe() == "t=   3.50s  partition   blackhole B-C ({C} | rest), restore after 2.0s"
    assert f.to_json()["links"] == [["B", "C"]]
