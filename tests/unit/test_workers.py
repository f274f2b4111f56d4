"""The split of the default run between pytest-xdist workers (tests/workers.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import workers


@pytest.mark.parametrize(("nodeid", "unit"), [
    ("tests/spark/test_job.py::test_verdict[a::b]", "spark"),
    ("tests/foreign/test_fanout.py::TestFan::test_one", "foreign"),
    ("tests/unit/test_core.py::TestPurge::test_flat", "tests/unit/test_core.py"),
    ("tests/integration/test_mesh.py::test_line3", "tests/integration/test_mesh.py"),
    ("tests/sparkle/test_x.py::test_y", "tests/sparkle/test_x.py"),
    # the modules that reconcile in-process share the foreign unit's Spark session
    ("tests/integration/test_drain.py::test_a_rolling_restart", "foreign"),
    ("tests/integration/test_msgid_failover.py::test_the_router_view", "foreign"),
    # the simulations: one unit per test function, its parameters together
    ("tests/sim/test_sim.py::test_mesh_with_faults[kill,freeze]", "tests/sim/test_sim.py::test_mesh_with_faults"),
    ("tests/sim/test_sim.py::test_replay", "tests/sim/test_sim.py::test_replay"),
    ("tests/sim/test_kernel.py::test_x[1]", "tests/sim/test_kernel.py"),
])
def test_unit_of(nodeid: str, unit: str) -> None:
    assert workers.unit_of(nodeid) == unit


def test_jvm_units_first_longest_first_and_order_kept_otherwise() -> None:
    ids = ["tests/unit/a.py::t1", "tests/spark/s.py::t1", "tests/unit/a.py::t2",
           "tests/foreign/f.py::t1", "tests/chaos/c.py::t1", "tests/spark/s.py::t2"]
    items: list[Any] = [SimpleNamespace(nodeid=i) for i in ids]
    workers.jvm_first(items)
    assert [i.nodeid for i in items] == [
        "tests/spark/s.py::t1", "tests/spark/s.py::t2", "tests/foreign/f.py::t1",
        "tests/unit/a.py::t1", "tests/unit/a.py::t2", "tests/chaos/c.py::t1"]


def test_scheduler_groups_by_our_units() -> None:
    sched = workers.ModuleScheduling.__new__(workers.ModuleScheduling)
    assert sched._split_scope("tests/foreign/test_features.py::test_x") == "foreign"
    assert sched._split_scope("tests/unit/test_core.py::TestA::test_b") == "tests/unit/test_core.py"


def test_the_modules_sharing_the_foreign_jvm_follow_its_tests() -> None:
    """Collected in folder order, sorted by unit: the foreign tests start the session, the
    integration modules that share it come after them on the same worker."""
    ids = ["tests/foreign/f.py::t1", "tests/integration/test_drain.py::t1", "tests/integration/test_mesh.py::t1",
           "tests/integration/test_msgid_failover.py::t1", "tests/spark/s.py::t1"]
    items: list[Any] = [SimpleNamespace(nodeid=i) for i in ids]
    workers.jvm_first(items)
    assert [i.nodeid for i in items] == [
        "tests/spark/s.py::t1", "tests/foreign/f.py::t1", "tests/integration/test_drain.py::t1",
        "tests/integration/test_msgid_failover.py::t1", "tests/integration/test_mesh.py::t1"]
    root = Path(__file__).resolve().parents[2]
    assert all((root / m).is_file() for m in (*workers.SHARE_FOREIGN_JVM, *workers.SPLIT_BY_FUNCTION))


def test_the_split_modules_follow_the_jvm_units() -> None:
    ids = ["tests/chaos/c.py::t1", "tests/sim/test_kernel.py::t1", "tests/sim/test_sim.py::test_a[x]",
           "tests/sim/test_sim.py::test_b", "tests/foreign/f.py::t1", "tests/sim/test_sim.py::test_a[y]"]
    items: list[Any] = [SimpleNamespace(nodeid=i) for i in ids]
    workers.jvm_first(items)
    assert [i.nodeid for i in items] == [
        "tests/foreign/f.py::t1", "tests/sim/test_sim.py::test_a[x]", "tests/sim/test_sim.py::test_b",
        "tests/sim/test_sim.py::test_a[y]", "tests/chaos/c.py::t1", "tests/sim/test_kernel.py::t1"]
    assert len({workers.unit_of(i.nodeid) for i in items[1:4]}) == 2  # test_a's two parameters: one unit


class _Config:
    def __init__(self, workeroutput: dict[str, Any] | None = None) -> None:
        self.stash = pytest.Stash()
        if workeroutput is not None:
            self.workeroutput = workeroutput


def test_foreign_setup_travels_from_worker_to_summary() -> None:
    worker = _Config(workeroutput={})
    worker.stash[workers.FOREIGN_SETUP] = {"rhea": ("3.0.2", 12.5), "cpp": ("0.40.0", 3.04)}
    workers.hand_over(SimpleNamespace(config=worker))  # type: ignore[arg-type]
    controller = _Config()
    assert workers.summary_line(controller) is None  # type: ignore[arg-type]
    workers.take_over(controller, SimpleNamespace(workeroutput=worker.workeroutput))  # type: ignore[arg-type]
    assert workers.summary_line(controller) == (  # type: ignore[arg-type]
        "foreign clients: cpp 0.40.0 (set-up 3.0 s); rhea 3.0.2 (set-up 12.5 s)")


def test_nothing_handed_over_without_workers_or_figures() -> None:
    alone = _Config()  # no workeroutput: one process, the summary reads its own stash
    alone.stash[workers.FOREIGN_SETUP] = {"jms": ("2.7.0", 1.0)}
    workers.hand_over(SimpleNamespace(config=alone))  # type: ignore[arg-type]
    assert not hasattr(alone, "workeroutput")
    empty = _Config(workeroutput={})
    workers.hand_over(SimpleNamespace(config=empty))  # type: ignore[arg-type]
    assert empty.workeroutput == {}
