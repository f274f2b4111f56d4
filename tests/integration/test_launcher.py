"""The local launcher with real router processes on 127.0.0.1 (ports chosen by the kernel).

Each test has its own state directory under tmp_path; the `meshes` fixture stops whatever a test
started, also when it fails, and prints the routers' output (pytest shows it for failures only).
Every wait is against a deadline.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncemesh.topology.launcher import (
    Mesh,
    MeshError,
    RouterStartError,
    RouterState,
    StopOutcome,
    _proc,
)
from oncemesh.topology.load import example_path

EXAMPLES = example_path()
SINGLE = EXAMPLES / "single.toml"
TIMEOUT = 30.0


def _router_accepts_peers_dir() -> bool:
    from oncemesh.cli import build_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args(["router", "--id", "A", "--peers-dir", "x"])
    except SystemExit:
        return False
    return True


needs_router = pytest.mark.skipif(not _router_accepts_peers_dir(),
                                  reason="`oncemesh router` has no --peers-dir yet (the launcher passes it)")


def oncemesh(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncemesh", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def hostport(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("amqp://").rpartition(":")
    return host, int(port)


@pytest.fixture
def meshes(tmp_path: Path) -> Iterator[Callable[..., Mesh]]:
    """`meshes(topology_file, name="mesh", **kw)` -> a Mesh in tmp_path/name; all are stopped afterwards
    (and their link proxies, if any)."""
    dirs: list[Path] = []
    made: list[Mesh] = []

    def make(topology_file: Path = SINGLE, name: str = "mesh", **kw: Any) -> Mesh:
        dirs.append(tmp_path / name)
        made.append(Mesh(topology_file, tmp_path / name, **kw))
        return made[-1]

    try:
        yield make
    finally:
        for d in dict.fromkeys(dirs):
            if not (d / "mesh.json").exists():
                continue
            mesh = Mesh.open(d)
            for s in mesh.status():
                print(f"--- router {s.id} ({s.state.value}), {mesh.out_file(s.id)}:\n{mesh.tail(s.id)}")
            mesh.down(timeout=5)
        for m in made:
            if m.proxies is not None:
                m.proxies.close()


# ---------------------------------------------------------------------- one router
@needs_router
def test_up_starts_the_router_and_its_url_accepts_connections(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes()
    (a,) = mesh.up(timeout=TIMEOUT)
    assert (a.id, a.state, a.alive, a.converged, a.peers) == ("A", RouterState.RUNNING, True, True, ())
    assert a.url is not None and a.url.startswith("amqp://127.0.0.1:")
    host, port = hostport(a.url)
    assert port != 0
    assert mesh.url("A") == a.url and mesh.urls() == [a.url]
    socket.create_connection((host, port), timeout=5).close()
    ready = json.loads(mesh.ready_file("A").read_text())
    assert ready["pid"] == a.pid and ready["url"] == a.url


@needs_router
def test_up_on_a_running_mesh_is_a_no_op(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes()
    (first,) = mesh.up(timeout=TIMEOUT)
    (again,) = mesh.up(timeout=TIMEOUT)
    assert (again.pid, again.incarnation, again.state) == (first.pid, first.incarnation, RouterState.RUNNING)


@needs_router
def test_killed_router_shows_dead_and_up_restarts_it_as_a_new_incarnation(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes()
    (before,) = mesh.up(timeout=TIMEOUT)
    mesh.kill_router("A")
    (dead,) = mesh.status()
    assert (dead.state, dead.alive, dead.pid, dead.url) == (RouterState.DEAD, False, before.pid, None)
    with pytest.raises(MeshError, match="router A is dead: it has no URL"):
        mesh.url("A")

    (after,) = mesh.up(timeout=TIMEOUT)
    assert after.state is RouterState.RUNNING
    assert after.pid != before.pid and after.incarnation != before.incarnation
    assert after.url == before.url  # same port again, so that clients holding the URL find it

    assert mesh.down(timeout=TIMEOUT) == {"A": StopOutcome.STOPPED}
    (stopped,) = mesh.status()
    assert (stopped.state, stopped.pid) == (RouterState.STOPPED, None)
    assert after.pid is not None and _proc(after.pid) is None  # gone and reaped
    assert not mesh.ready_file("A").exists()


@needs_router
def test_stop_router_then_start_router(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes()
    (a,) = mesh.up(timeout=TIMEOUT)
    assert mesh.stop_router("A") is StopOutcome.STOPPED
    assert mesh.router_status("A").state is RouterState.STOPPED
    assert mesh.stop_router("A") is StopOutcome.NOT_RUNNING
    mesh.start_router("A")
    with pytest.raises(MeshError, match="router A is already running"):
        mesh.start_router("A")
    (b,) = mesh.wait_converged(TIMEOUT)
    assert b.state is RouterState.RUNNING and b.pid != a.pid and b.url == a.url


@needs_router
def test_freeze_and_thaw(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes()
    (a,) = mesh.up(timeout=TIMEOUT)
    mesh.freeze("A")
    frozen = mesh.router_status("A")
    assert (frozen.state, frozen.alive, frozen.pid) == (RouterState.FROZEN, True, a.pid)
    assert mesh.up(wait=False)[0].pid == a.pid  # frozen is alive: up does not restart it
    mesh.thaw("A")
    assert mesh.router_status("A").state is RouterState.RUNNING


@needs_router
def test_put_and_get_through_a_launched_router(meshes: Callable[..., Mesh], tmp_path: Path) -> None:
    mesh = meshes()
    mesh.up(timeout=TIMEOUT)
    url = mesh.url("A")
    sub = ["--url", url, "--state-dir", str(tmp_path / "subscriber")]
    pub = ["--url", url, "--state-dir", str(tmp_path / "publisher")]
    r = oncemesh("subscribe", "news", "--subscription", "s1", *sub)
    assert r.returncode == 0, r.stderr
    r = oncemesh("put", "news", "hello", "--no-wait", *pub)
    assert r.returncode == 0, r.stderr
    r = oncemesh("get", "news", "--subscription", "s1", "--count", "1", "--timeout", str(TIMEOUT), *sub)
    assert (r.returncode, r.stdout) == (0, "hello\n"), r.stderr


@needs_router
def test_router_that_dies_at_start_shows_its_output(meshes: Callable[..., Mesh], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        topo = tmp_path / "busy.toml"
        topo.write_text(f'[routers.A]\nlisten = "127.0.0.1:{port}"\n')
        mesh = meshes(topo)
        with pytest.raises(RouterStartError, match=r"router A exited while starting \(exit code 1\)") as info:
            mesh.up(timeout=TIMEOUT)
    assert info.value.router_id == "A"
    assert f"cannot listen on 127.0.0.1:{port}" in info.value.tail
    assert mesh.router_status("A").state is RouterState.DEAD


@needs_router
def test_a_state_dir_runs_one_mesh_at_a_time(meshes: Callable[..., Mesh], tmp_path: Path) -> None:
    meshes().up(timeout=TIMEOUT)
    with pytest.raises(MeshError, match="holds a running mesh started from .*single.toml"):
        Mesh(EXAMPLES / "line3.toml", tmp_path / "mesh")


@needs_router
def test_a_state_dir_can_be_reused_for_another_topology_once_stopped(meshes: Callable[..., Mesh],
                                                                     tmp_path: Path) -> None:
    first = meshes(SINGLE)
    first.up(timeout=TIMEOUT)
    first.down()
    other = tmp_path / "other.toml"
    other.write_text('[routers.Z]\nlisten = "127.0.0.1:0"\n')
    (z,) = meshes(other).up(timeout=TIMEOUT)  # A, of the first topology, is no longer listed
    assert (z.id, z.state) == ("Z", RouterState.RUNNING)


# ---------------------------------------------------------------------- the CLI
@needs_router
def test_cli_up_status_down(meshes: Callable[..., Mesh], tmp_path: Path) -> None:
    state = tmp_path / "mesh"
    meshes(SINGLE)  # registers the state dir for cleanup
    r = oncemesh("up", str(SINGLE), "--state-dir", str(state))
    assert r.returncode == 0, r.stderr
    assert "started A" in r.stdout and "amqp://127.0.0.1:" in r.stdout

    r = oncemesh("status", "--state-dir", str(state), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    (a,) = info["routers"]
    assert (info["mesh"], a["id"], a["state"], a["alive"]) == ("single", "A", "running", True)
    assert oncemesh("status", "--state-dir", str(state), "--urls").stdout.strip() == a["url"]

    r = oncemesh("up", "--state-dir", str(state))  # the recorded topology; nothing to start
    assert r.returncode == 0 and "all routers were already running" in r.stdout, r.stderr

    r = oncemesh("down", "--state-dir", str(state))
    assert (r.returncode, r.stdout) == (0, "stopped: A\n"), r.stderr
    r = oncemesh("status", "--state-dir", str(state))
    assert r.returncode == 1 and "no (stopped)" in r.stdout


def test_cli_up_with_a_bad_topology_exits_2_and_says_where(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[routers.A]\nlisten = "127.0.0.1:0"\ninter_router = "127.0.0.1:0"\n\n'
                   '[[links]]\nbetween = ["A", "X"]\n')
    r = oncemesh("up", str(bad), "--state-dir", str(tmp_path / "mesh"))
    assert r.returncode == 2
    assert f"{bad}:6: link A–X: unknown router 'X' (routers: A)" in r.stderr
    assert not (tmp_path / "mesh").exists()
    r = oncemesh("up", str(bad), "--check")
    assert r.returncode == 2 and "unknown router 'X'" in r.stderr


def test_cli_up_check_describes_a_valid_topology_and_starts_nothing(tmp_path: Path) -> None:
    r = oncemesh("up", str(EXAMPLES / "mesh4.toml"), "--check", "--state-dir", str(tmp_path / "mesh"))
    assert r.returncode == 0, r.stderr
    assert "mesh 'mesh4': 4 router(s), 6 link(s), connected" in r.stdout
    assert "link A–D: cost 5, A dials" in r.stdout and "topic orders: order total (sequencer)" in r.stdout
    assert "topic orders: order total (sequencer)\n" in r.stdout + "\n"  # enforced
    assert "topic inventory: order causal (shop)\n" in r.stdout  # enforced (a group of topics)
    assert not (tmp_path / "mesh").exists()


def test_cli_status_and_down_without_a_mesh(tmp_path: Path) -> None:
    r = oncemesh("status", "--state-dir", str(tmp_path / "none"))
    assert r.returncode == 2 and "no mesh in" in r.stderr
    r = oncemesh("down", "--state-dir", str(tmp_path / "none"))
    assert r.returncode == 0 and "nothing to stop" in r.stderr


# ---------------------------------------------------------------------- safety and helpers
def test_a_recorded_pid_is_never_signalled_unless_it_is_the_router_we_started(tmp_path: Path) -> None:
    """mesh.json may be stale and pids are reused: a stranger, even one whose command line looks
    like our router's, must survive status, kill and down."""
    mesh = Mesh(SINGLE, tmp_path / "mesh")
    lookalike = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()",
                                  "--id", "A", "--ready-file", str(mesh.ready_file("A"))])
    try:
        info = _proc(lookalike.pid)
        assert info is not None
        for pid, start in ((lookalike.pid, info.start + 1), (os.getpid(), _proc(os.getpid()).start)):  # type: ignore[union-attr]
            mesh.state_dir.mkdir(exist_ok=True)
            (mesh.state_dir / "mesh.json").write_text(json.dumps(
                {"topology": str(SINGLE), "routers": {"A": {"pid": pid, "proc_start": start}}}))
            assert mesh.router_status("A").state is RouterState.DEAD
            with pytest.raises(MeshError, match="router A is not running"):
                mesh.kill_router("A", signal.SIGTERM)
            assert mesh.down(timeout=1) == {"A": StopOutcome.NOT_RUNNING}
        assert lookalike.poll() is None
        # the same look-alike with its true start time is taken for ours: the check is not vacuous
        (mesh.state_dir / "mesh.json").write_text(json.dumps(
            {"topology": str(SINGLE), "routers": {"A": {"pid": lookalike.pid, "proc_start": info.start}}}))
        assert mesh.router_status("A").state is RouterState.STARTING
    finally:
        lookalike.kill()
        lookalike.wait(TIMEOUT)


def test_expected_peers_follow_the_graph_of_running_routers(tmp_path: Path) -> None:
    line3 = Mesh(EXAMPLES / "line3.toml", tmp_path / "line3")
    assert line3.expected_peers("A") == ("B", "C")
    assert line3.expected_peers("A", up=["A", "C"]) == ()  # B down splits the line
    hubs = Mesh(EXAMPLES / "hubs.toml", tmp_path / "hubs")
    assert hubs.expected_peers("S11", up=["S11", "S12", "H1", "S21"]) == ("H1", "S12")
    assert line3.convergence_problems() == ["A: stopped", "B: stopped", "C: stopped"]


def test_router_command_is_the_documented_one(tmp_path: Path) -> None:
    mesh = Mesh(EXAMPLES / "line3.toml", tmp_path / "m")
    d = mesh.state_dir
    assert mesh.router_command("B") == [
        sys.executable, "-m", "oncemesh", "router", "--topology", str((EXAMPLES / "line3.toml").resolve()),
        "--id", "B", "--state-dir", f"{d}/routers/B", "--log-dir", f"{d}/logs",
        "--ready-file", f"{d}/status/B.json", "--peers-dir", f"{d}/status", "--allow-anonymous",
        "--mesh-tls-dir", f"{d}/tls"]


# ---------------------------------------------------------------------- a real mesh
@needs_router
@pytest.mark.parametrize("name", ["line3", "triangle"])
def test_mesh_converges_and_a_killed_router_rejoins(meshes: Callable[..., Mesh], name: str) -> None:
    mesh = meshes(EXAMPLES / f"{name}.toml")
    statuses = mesh.up(timeout=60)
    ids = {"A", "B", "C"}
    for s in statuses:
        assert s.state is RouterState.RUNNING and s.converged
        assert set(s.peers) == ids - {s.id}
        assert s.inter_router is not None and not s.inter_router.endswith(":0")
    pids = {s.id: s.pid for s in statuses}

    mesh.kill_router("B")
    survivors = mesh.wait_converged(60, up=["A", "C"])
    by_id = {s.id: s for s in survivors}
    expect_ac = () if name == "line3" else ("C",)
    assert by_id["A"].peers == expect_ac and by_id["B"].state is RouterState.DEAD

    restarted = {s.id: s for s in mesh.up(timeout=60)}
    assert restarted["A"].pid == pids["A"] and restarted["C"].pid == pids["C"]
    assert restarted["B"].pid != pids["B"]
    assert all(set(s.peers) == ids - {s.id} for s in restarted.values())


# ---------------------------------------------------------------------- links through proxies
@needs_router
def test_proxied_links_go_through_the_proxies_and_survive_a_listener_restart(meshes: Callable[..., Mesh]) -> None:
    """line3 with proxies: A dials B and B dials C through them; each dialer's own peers dir names
    the proxy and the listener's pid; a restarted listener (new inter-router port) is found again."""
    mesh = meshes(EXAMPLES / "line3.toml", proxies=True)
    statuses = {s.id: s for s in mesh.up(timeout=60)}
    d = mesh.state_dir
    assert mesh.router_command("A")[-5:-3] == ["--peers-dir", f"{d}/peers/A"]
    assert mesh.proxies is not None and mesh.proxies.names() == ["A-B", "B-C"]
    for dialer, listener in (("A", "B"), ("B", "C")):
        peer = json.loads((d / "peers" / dialer / f"{listener}.json").read_text())
        assert peer["inter_router"] == mesh.proxies.address(f"{dialer}-{listener}")
        assert peer["pid"] == statuses[listener].pid
        assert peer["inter_router"] != statuses[listener].inter_router
        st = mesh.link_stats(dialer, listener)
        assert st.open == 1 and st.bytes_up > 0 and st.bytes_down > 0  # the link runs through it
    assert not (d / "peers" / "B" / "A.json").exists() and not (d / "peers" / "C").exists()

    mesh.kill_router("B")
    mesh.wait_converged(30, up=["A", "C"])
    assert mesh.link_stats("A", "B").open == 0
    restarted = {s.id: s for s in mesh.up(timeout=60)}
    assert restarted["B"].inter_router != statuses["B"].inter_router  # a new port, found via the proxy
    assert json.loads((d / "peers" / "A" / "B.json").read_text())["pid"] == restarted["B"].pid
    assert all(set(s.peers) == {"A", "B", "C"} - {s.id} for s in restarted.values())
    assert mesh.link_stats("A", "B").open == 1


@needs_router
def test_only_the_owner_of_the_proxies_starts_routers_of_a_proxied_mesh(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes(EXAMPLES / "line3.toml", proxies=True)
    mesh.up(timeout=60)
    mesh.kill_router("C")
    other = Mesh.open(mesh.state_dir)
    assert [s.id for s in other.status() if s.alive] == ["A", "B"]  # status works from anywhere
    with pytest.raises(MeshError, match="through proxies owned by the process that started it"):
        other.up(timeout=5)
    with pytest.raises(MeshError, match="through proxies owned by"):
        Mesh(EXAMPLES / "line3.toml", mesh.state_dir, proxies=True).start_router("C")
    assert mesh.router_status("C").state is RouterState.DEAD  # nothing was started
    mesh.start_router("C", wait=30)
    mesh.wait_converged(30)


def test_proxies_need_inter_router_ports_0(tmp_path: Path) -> None:
    fixed = tmp_path / "fixed.toml"
    fixed.write_text((EXAMPLES / "line3.toml").read_text().replace(
        'inter_router = "127.0.0.1:0"', 'inter_router = "127.0.0.1:1"', 1))
    with pytest.raises(MeshError, match="inter-router ports 0"):
        Mesh(fixed, tmp_path / "m", proxies=True)
    with pytest.raises(MeshError, match="no link proxies running"):
        Mesh(EXAMPLES / "line3.toml", tmp_path / "n").cut_link("A", "B")
    with pytest.raises(MeshError, match="no link A–C"):
        Mesh(EXAMPLES / "line3.toml", tmp_path / "n").link_name("A", "C")


def test_convergence_tool_measures_a_death_and_a_join(tmp_path: Path) -> None:
    from oncemesh.harness.convergence import measure

    rounds = measure("line3", "C", fault="kill", repeat=1, state_dir=tmp_path / "m")
    assert len(rounds) == 1
    r = rounds[0]
    # a SIGKILL resets B's link to C at once: no need to wait for dead_after (3 s) of heartbeats
    assert 0 < r.death < 3.0, r
    assert 0 < r.join < 30 and r.start > 0, r
