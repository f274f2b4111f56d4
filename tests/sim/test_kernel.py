"""The simulators' kernel (kernel.py): ordering, FIFO channels, connections, replay."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.kernel import Network, Scheduler, Violation, judged, replay_line
from tests.sim.simulator import Faults, Simulation
from tests.sim.test_sim import graph


def test_events_run_in_time_then_scheduling_order() -> None:
    k = Scheduler(1)
    seen: list[str] = []
    k.at(2.0, seen.append, "late")
    k.at(1.0, seen.append, "first")
    k.at(1.0, seen.append, "second")  # same time: in the order scheduled
    k.after(0.5, seen.append, "earliest")
    k.run()
    assert seen == ["earliest", "first", "second", "late"] and k.now == 2.0 and k.steps == 4


def test_run_stops_at_until_and_at_a_runaway() -> None:
    k = Scheduler(1)

    def again() -> None:
        k.after(1.0, again)

    k.at(0.0, again)
    k.run(until=10.0)
    assert k.now == 10.0 and k.next_at() == 11.0
    with pytest.raises(Violation, match="runaway"):
        k.run(max_steps=20, runaway=True)


def test_a_channel_is_fifo_and_a_reset_loses_what_was_in_flight() -> None:
    k = Scheduler(1)
    net = Network(k, per_link=True)
    got: list[str] = []
    net.send("a", "b", 0.5, got.append, "slow")
    net.send("a", "b", 0.1, got.append, "fast")  # never overtakes the earlier frame
    net.send("b", "a", 0.1, got.append, "other way")
    k.run()
    assert got == ["other way", "slow", "fast"]
    net.send("a", "b", 0.1, got.append, "lost")
    net.reset("b", "a")  # per link: either end's reset ends the connection
    net.send("a", "b", 0.1, got.append, "new connection")
    k.run()
    assert got[3:] == ["new connection"]


def test_a_receiver_that_cannot_take_a_frame_gets_it_again_unless_the_connection_died() -> None:
    k = Scheduler(1)
    net = Network(k, per_link=False, retry=0.05)
    frozen = {"b": True}
    got: list[tuple[float, str]] = []

    def deliver(x: str) -> bool:
        if frozen["b"]:
            return False
        got.append((k.now, x))
        return True

    net.send("a", "b", 0.1, deliver, "kept")
    k.at(0.32, frozen.update, {"b": False})
    k.run()
    assert [x for _, x in got] == ["kept"] and got[0][0] > 0.32
    frozen["b"] = True
    net.send("a", "b", 0.1, deliver, "dropped")
    k.after(0.2, net.reset, "a", "b")
    k.after(0.3, frozen.update, {"b": False})
    k.run(until=k.now + 1.0)
    assert [x for _, x in got] == ["kept"]


def test_frames_a_dead_process_sent_can_be_delayed_in_order() -> None:
    k = Scheduler(1)
    net = Network(k, per_link=False)
    got: list[tuple[float, str]] = []
    net.send("a", "b", 0.1, lambda x: got.append((k.now, x)), "1")
    net.send("a", "b", 0.2, lambda x: got.append((k.now, x)), "2")
    net.delay_sent("a", {"b": 1.0})
    net.send("a", "b", 0.1, lambda x: got.append((k.now, x)), "3")  # still after the delayed ones
    k.run()
    assert [x for _, x in got] == ["1", "2", "3"]
    assert got[0][0] == pytest.approx(1.1) and got[2][0] >= got[1][0]


def test_a_seed_replays_exactly_in_one_interpreter() -> None:
    def trace() -> tuple[str, float, int]:
        sim = Simulation(7, graph("mesh4"), faults=Faults.parse("kill,freeze,partition,loss"), duration=4.0,
                         messages=10)
        sim.run()
        return "\n".join(sim.log), sim.now, sim.net.frames

    assert trace() == trace()


def test_a_seed_replays_exactly_in_any_process() -> None:
    """Two interpreters with different hash seeds (the order of a set of strings) and objects at
    other addresses run the same seeds to the same trace hashes (tests/sim/trace_hashes.py: every
    step, every hand-over, every outcome), the stall faults' cases among them."""
    cmd = [sys.executable, "-m", "tests.sim.trace_hashes", "--seeds", "2",
           "--cases", "causal,stop,stalls"]
    root = Path(__file__).resolve().parents[2]
    runs = [subprocess.Popen(cmd, cwd=root, env={**os.environ, "PYTHONHASHSEED": h}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for h in ("1", "2")]
    outs = [p.communicate(timeout=600) for p in runs]
    assert [p.returncode for p in runs] == [0, 0], [err for _, err in outs]
    one, two = (out.splitlines() for out, _ in outs)
    assert len(one) == 6 and all(" steps=" in line for line in one)
    assert one == two, "\n".join(f"{a}  vs  {b}" for a, b in zip(one, two, strict=True) if a != b)


def test_a_violation_fails_with_the_replay_command_and_the_trace() -> None:
    def broken() -> None:
        raise Violation("two numbers for one gid")

    with pytest.raises(AssertionError) as info:
        judged(broken, what="seed 5", replay="pytest -k replay", describe=lambda: "the trace")
    text = str(info.value)
    assert "seed 5: two numbers for one gid" in text and "replay: " in text and "pytest -k replay" in text
    assert text.endswith("the trace")
    assert replay_line("x") == "x"  # (a seed replays in any process: no hash seed to give)
    with pytest.raises(KeyError):  # a crash of the code under test is not a violation unless asked
        judged(lambda: {}["x"], what="seed 5", replay="r", describe=str)
    with pytest.raises(AssertionError, match="seed 5: KeyError"):
        judged(lambda: {}["x"], what="seed 5", replay="r", describe=str, crashes=True)
