"""How the default run is split between pytest-xdist workers (`-n auto`, pyproject.toml).

One unit of work per test module, so a module's fixtures are set up once; the tests that need the
JVM are two units, handed out first because they are the longest: tests/spark (its session-wide
Spark session set up once) and tests/foreign (the foreign clients' builds and a Spark session of
their own). Each runs on one worker from its start while the workers that finish theirs take the
modules that need no JVM. Figures, and what was not settled (one JVM unit or two): docs/testing.md.
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

# client family -> (version, set-up seconds); filled by tests/foreign/conftest.py
FOREIGN_SETUP = pytest.StashKey[dict[str, tuple[str, float]]]()


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: "spark", "foreign", or its module's path."""
    path = nodeid.split("::", 1)[0]
    return next((unit for folder, unit in JVM_UNITS if path.startswith(folder)), path)


# where a unit goes in the order tests are handed out: the JVM units first, in JVM_UNITS' order
_RANK = {unit: i for i, (_, unit) in enumerate(JVM_UNITS)}


class ModuleScheduling(LoadScopeScheduling):
    """`--dist loadscope` with our units: a module, or a folder of tests that need the JVM."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


def jvm_first(items: list[pytest.Item]) -> None:
    """Put the JVM units first, longest first (a stable sort: every worker collects the same
    order; units are handed out in that order), so the longest units start at once."""
    items.sort(key=lambda item: _RANK.get(unit_of(item.nodeid), len(JVM_UNITS)))


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
