"""Failover time is the detection time (`python -m oncemesh.harness.failover`; figures in operations.md).

Timing assertions belong to quiet machines, so these run with `-m bench` (and are `slow`):

    .venv/bin/python -m pytest -q -m bench tests/chaos -s
"""

from __future__ import annotations

import statistics

import pytest

from oncemesh.harness.failover import measure

pytestmark = [pytest.mark.slow, pytest.mark.bench]


def test_publishers_router_killed_traffic_flows_again_within_a_second() -> None:
    outages = measure("triangle", "kill", repeat=3)
    print([o.to_json() for o in outages])
    assert statistics.median(o.resume for o in outages) < 1.0


def test_publishers_router_frozen_traffic_flows_again_after_the_idle_timeout() -> None:
    outages = measure("triangle", "freeze", repeat=3)
    print([o.to_json() for o in outages])
    assert all(1.5 <= o.resume <= 5.0 for o in outages)  # idle_timeout 2 s, not dead_after nor longer


def test_transit_router_frozen_traffic_is_rerouted_after_dead_after() -> None:
    outages = measure("mesh4", "freeze", repeat=2, publisher="A", subscriber="C", victim="B")
    print([o.to_json() for o in outages])
    assert all(2.5 <= o.resume <= 6.0 for o in outages)  # dead_after 3 s
