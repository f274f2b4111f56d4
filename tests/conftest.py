"""Shared fixtures: real router processes on 127.0.0.1 port 0, each test in its own directory.

Router and client outputs are printed when a test fails. Every process started here is stopped
(or killed) by PID at the end of the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from oncemesh.harness.procs import Proc, RouterProcess
from oncemesh.topology.load import example_path
from tests import workers

# Hypothesis' per-example deadline times examples by the wall clock; on a shared 2-core machine a
# loaded moment fails a correct test (seen: test_lamportcodec under load). Property tests assert
# properties; speed is measured by benchmarks.
settings.register_profile("oncemesh", deadline=None)
settings.load_profile("oncemesh")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> workers.ModuleScheduling:
    return workers.ModuleScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers.jvm_first(items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workers.hand_over(session)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    workers.take_over(node.config, node)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    line = workers.summary_line(config)
    if line:
        terminalreporter.write_line(line)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


class Procs:
    """Registry of processes a test started; all are ended at teardown."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.routers: list[RouterProcess] = []
        self.others: list[Proc] = []

    def router(self, router_id: str = "A", **kw: Any) -> RouterProcess:
        r = RouterProcess(router_id, self.workdir / f"router-{router_id}", **kw)
        self.routers.append(r)
        return r.start()

    def add(self, proc: Proc) -> Proc:
        self.others.append(proc)
        return proc

    def cleanup(self) -> None:
        for p in self.others:
            try:
                p.stop(5)
            except Exception:
                p.signal(9)
        for r in self.routers:
            try:
                r.thaw()
                r.stop(10)
            except Exception:
                r.kill()

    def dump(self) -> str:
        parts = []
        for r in self.routers:
            parts.append(f"--- router {r.id} (pid {r.proc.pid if r.proc else '-'}) ---\n{r.tail(60)}")
        for p in self.others:
            parts.append(f"--- {' '.join(p.cmd[2:5])} (pid {p.pid}) ---\n{p.tail(30)}")
        return "\n".join(parts)


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Procs]:
    reg = Procs(tmp_path)
    try:
        yield reg
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(reg.dump())
        reg.cleanup()


@pytest.fixture
def router(procs: Procs) -> RouterProcess:
    return procs.router("A")


@pytest.fixture
def make_router(procs: Procs) -> Callable[..., RouterProcess]:
    return procs.router


EXAMPLES = example_path()


@pytest.fixture
def mesh_of(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """Start a mesh from a topology (a name in topology/examples or a path); stopped at teardown."""
    from oncemesh.topology.launcher import Mesh

    started: list[Mesh] = []

    def make(topology: str | Path, timeout: float = 60.0) -> Mesh:
        path = EXAMPLES / f"{topology}.toml" if isinstance(topology, str) and "/" not in topology else Path(topology)
        m = Mesh(path, tmp_path / f"mesh{len(started)}")
        started.append(m)
        m.up(timeout=timeout)
        return m

    try:
        yield make
    finally:
        rep = getattr(request.node, "rep_call", None)
        for m in started:
            if rep is not None and rep.failed:
                for s in m.status():
                    print(f"--- router {s.id} ({s.state}) ---\n{m.tail(s.id, 40)}")
            m.down(timeout=10)


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("oncemesh simulator")
    g.addoption("--sim-seeds", type=int, default=None, help="number of seeds per simulation case")
    g.addoption("--sim-seed", type=int, default=None, help="replay one seed (test_replay)")
    g.addoption("--sim-topology", default="mesh4", help="topology for --sim-seed")
    g.addoption("--sim-faults", default="", help="faults for --sim-seed: kill,freeze,partition,loss")
    g.addoption("--sim-duration", type=float, default=8.0, help="schedule length for --sim-seed (seconds)")
    g.addoption("--sim-messages", type=int, default=30, help="messages per publisher for --sim-seed")
    g.addoption("--sim-total", action="store_true", help="the topic in total order (sequencer) for --sim-seed")
    g.addoption("--sim-lamport", action="store_true", help="the topic in total order (Lamport) for --sim-seed")
    g.addoption("--sim-causal", action="store_true", help="the topic in causal order for --sim-seed")
    g.addoption("--sim-no-hold", action="store_true", help="without the hand-over hold after a stall, for --sim-seed")
    g.addoption("--sim-by-id", action="store_true",
                help="publishers that pick their tags, identified by message-id, for --sim-seed")
    g.addoption("--sim-wildcards", action="store_true",
                help="publishers on several topics, subscriptions with wildcard filters, for --sim-seed")
    g.addoption("--sim-shared", action="store_true",
                help="subscribers as members of two shared subscriptions, for --sim-seed")
    g.addoption("--sim-upgrade", action="store_true",
                help="a rolling upgrade: routers one protocol version behind until restarted, for --sim-seed")
    g.addoption("--sim-selectors", action="store_true",
                help="messages with properties, subscriptions with JMS selectors, for --sim-seed")
