"""How the default run is split between pytest-xdist workers (`-n auto`, pyproject.toml).

One unit of work per test module, so a module's fixtures are set up once; the tests that need the
JVM are two units, handed out first because they are the longest: tests/spark (its session-wide
Spark session set up once) and tests/foreign (the foreign clients' builds and a Spark session of
their own). Each runs on one worker from its start while the workers that finish theirs take the
modules that need no JVM. Two integration modules that reconcile in-process (SHARE_FOREIGN_JVM)
join the foreign unit, after its tests, so that they use its Spark session, already started and
warm, instead of starting a JVM of their own. A long module without module-wide fixtures
(SPLIT_BY_FUNCTION) is one unit per test function, so that it no longer ends the run on one worker.
Figures, and what was not settled (one JVM unit or two): docs/testing.md.
pytest-xdist's own `--dist loadgroup` cannot group them: it rewrites a node's `_nodeid`, and
pytest 9 reads `_id`.

Set-up figures that a worker gathers (the foreign clients' versions and set-up times) travel to
the controller through `workeroutput`, so the summary prints them with or without workers.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

# the units that need the JVM, longest first: (folder, unit name)
JVM_UNITS = (("tests/spark/", "spark"), ("tests/foreign/", "foreign"))
# modules elsewhere whose Spark reconciliation runs in the test process (`local_spark`,
# `reconcile_paths`: both take the active session when there is one): in the foreign unit they come
# after its tests (collection order) and find its session running; on their own each started a cold
# JVM for one reconciliation (a minute or more of the two cores each)
SHARE_FOREIGN_JVM = ("tests/integration/test_msgid_failover.py", "tests/integration/test_drain.py")
# modules with no fixture wider than a test whose tests are long: one unit per test function (all
# its parameters), handed out right after the JVM units. As one unit, tests/sim/test_sim.py (15
# worker-minutes in stop 42's full run, 280 s its longest function) came last in collection order
# and ran alone on one worker at the end while the other had nothing left
SPLIT_BY_FUNCTION = ("tests/sim/test_sim.py",)

# client family -> (version, set-up seconds); filled by tests/foreign/conftest.py
FOREIGN_SETUP = pytest.StashKey[dict[str, tuple[str, float]]]()


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: "spark", "foreign", its function (SPLIT_BY_FUNCTION) or
    its module's path."""
    path = nodeid.split("::", 1)[0]
    if path in SHARE_FOREIGN_JVM:
        return "foreign"
    if path in SPLIT_BY_FUNCTION:
        return nodeid.split("[", 1)[0]
    return next((unit for folder, unit in JVM_UNITS if path.startswith(folder)), path)


# where a unit goes in the order tests are handed out: the JVM units first, in JVM_UNITS' order
_RANK = {unit: i for i, (_, unit) in enumerate(JVM_UNITS)}


class ModuleScheduling(LoadScopeScheduling):
    """`--dist loadscope` with our units: a module, or a folder of tests that need the JVM."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


def _rank(nodeid: str) -> int:
    unit = unit_of(nodeid)
    if unit in _RANK:
        return _RANK[unit]
    return len(JVM_UNITS) + (0 if nodeid.split("::", 1)[0] in SPLIT_BY_FUNCTION else 1)


def jvm_first(items: list[pytest.Item]) -> None:
    """Put the JVM units first, longest first, then the split modules' units (a stable sort: every
    worker collects the same order; units are handed out in that order), so the longest units
    start at once and the short ones fill the end."""
    items.sort(key=lambda item: _rank(item.nodeid))


def hand_over(session: pytest.Session) -> None:
    """On a worker: pass the gathered set-up figures to the controller."""
    out: dict[str, Any] | None = getattr(session.config, "workeroutput", None)
    setup = session.config.stash.get(FOREIGN_SETUP, None)
    if out is not None and setup:
        out["foreign_setup"] = setup


def take_over(config: pytest.Config, node: Any) -> None:
    """On the controller: merge what a finished worker handed over."""
    setup = getattr(node, "workeroutput", {}).get("foreign_setup")
    if setup:
        config.stash.setdefault(FOREIGN_SETUP, {}).update(
            {name: (str(v), float(s)) for name, (v, s) in setup.items()})


def summary_line(config: pytest.Config) -> str | None:
    setup = config.stash.get(FOREIGN_SETUP, None)
    if not setup:
        return None
    return "foreign clients: " + "; ".join(
        f"{n} {v} (set-up {s:.1f} s)" for n, (v, s) in sorted(setup.items()))
