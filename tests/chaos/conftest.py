"""Fixtures for fault tests: meshes whose links run through the fault-injecting proxies.

Every mesh a test starts is stopped at teardown (routers by PID, proxies with it), also when the
test fails; then the routers' output is printed (pytest shows it for failures only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from oncemesh.topology.launcher import Mesh
from oncemesh.topology.load import example_path

EXAMPLES = example_path()


@pytest.fixture
def proxied(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Mesh]]:
    """`proxied("triangle")` -> a running Mesh with a proxy on every link, in tmp_path/mesh."""
    started: list[Mesh] = []

    def make(topology: str | Path, timeout: float = 60.0) -> Mesh:
        path = EXAMPLES / f"{topology}.toml" if isinstance(topology, str) and "/" not in topology else Path(topology)
        m = Mesh(path, tmp_path / f"mesh{len(started)}", proxies=True)
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
                    print(f"--- router {s.id} ({s.state.value}) ---\n{m.tail(s.id, 40)}")
            m.down(timeout=10)
