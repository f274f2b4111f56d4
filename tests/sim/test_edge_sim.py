"""The edge's exactly-once rules under simulation: the proof that the hand-over hold after a stall
(common/passrules.py, `HandoverHold`) is needed, and is enough, for the stopped-router duplicate.

A router stopped (SIGSTOP) wakes to find, piled in its sockets, its clients' last frames (a
subscriber's credit, a publisher's transfers) and, behind them, their goodbyes: they timed it out,
failed over to another router and accepted the messages there. Without the hold it takes the
frames, hands the messages into the links of subscribers that have left (a second delivery after
the acceptance: the router view's duplicate, spark/routerview.py), and only then reads the
goodbyes. The default run's stop seeds (tests/sim/test_sim.py `test_mesh_with_stalls[stop]`) pass
with the hold; here the same seeds, with the hold taken out, must find that duplicate.
"""

from __future__ import annotations

import pytest

from tests.sim.kernel import Violation, replay_line
from tests.sim.simulator import Faults, Simulation
from tests.sim.test_sim import TOPOLOGIES, graph, seeds


def test_without_the_hold_a_stopped_router_hands_over_after_the_acceptance(pytestconfig: pytest.Config) -> None:
    others: list[str] = []
    for seed in seeds(pytestconfig, "stop"):
        topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
        sim = Simulation(seed, graph(topology), faults=Faults.parse("stop"), duration=8.0, messages=30,
                         hold_after_stall=False)
        try:
            sim.run()
        except Violation as exc:
            if "again after the acceptance" in str(exc):
                print(f"found by seed {seed} on {topology}: {exc}\nreplay: " + replay_line(
                    f"pytest tests/sim -k replay --sim-seed {seed} --sim-topology {topology} "
                    "--sim-faults stop --sim-no-hold"))
                return
            others.append(f"seed {seed}: {exc}")
    pytest.fail("no seed of the default run found the stopped-router duplicate without the hold"
                + (f" (other violations: {others})" if others else ""))
