"""Failover with real router processes: routers killed (SIGKILL) or frozen (SIGSTOP) mid-stream.

    line3:     A --- B --- C
    triangle:  A --- B, B --- C, A --- C

The first test is the scenario Qpid Dispatch Router 1.19 fails (docs/promises.md, "Why these
promises are rare"): subscribers on A and C, the middle router killed mid-stream and back after
4 s. Verdicts come from the client settlement logs: every message handed exactly once to every
subscription, every outcome ACCEPTED.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oncemesh.harness.procs import Proc, python_cmd, wait_for
from tests.helpers import OrderSummary, deliveries_after_acceptance


def consumer(tmp: Path, logs: Path, urls: list[str], name: str, count: int) -> Proc:
    return Proc(python_cmd("-m", "oncemesh.harness.worker", "consume", "--url", ",".join(urls), "--topic", "t",
                           "--name", name, "--state-dir", str(tmp / name), "--log-dir", str(logs),
                           "--count", str(count), "--reconnect-timeout", "60"), tmp / f"{name}.out")


def publisher(tmp: Path, logs: Path, urls: list[str], name: str, count: int, rate: float) -> Proc:
    return Proc(python_cmd("-m", "oncemesh.harness.worker", "publish", "--url", ",".join(urls), "--topic", "t",
                           "--name", name, "--state-dir", str(tmp / name), "--log-dir", str(logs),
                           "--count", str(count), "--rate", str(rate), "--reconnect-timeout", "60"),
                tmp / f"{name}.out")


def handed(logs: Path) -> int:
    return sum(1 for f in logs.glob("*.subscriber.jsonl") for line in open(f) if '"ev":"handed"' in line)


def subscribed(logs: Path) -> int:
    return sum(1 for f in logs.glob("*.subscriber.jsonl") for line in open(f) if '"ev":"subscribed"' in line)


def verdict(logs: Path, n_subs: int, n_msgs: int) -> None:
    s = OrderSummary(logs)
    assert len(s.published) == n_msgs
    assert len(s.outcome) == n_msgs and set(s.outcome.values()) == {"ACCEPTED"}
    subs = s.subs()
    assert len(subs) == n_subs
    problems = s.check_exactly_once(subs)
    assert not problems, problems
    fifo = s.check_fifo(subs)  # per publisher FIFO across the failover (the default order)
    assert not fifo, fifo


def run_all(procs: list[Proc], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        rc = p.wait(max(1.0, deadline - time.monotonic()))
        assert rc == 0, f"{p.cmd[3]} exited {rc}:\n{p.tail()}"


def test_middle_router_killed_mid_stream_loses_and_duplicates_nothing(mesh_of: Callable[..., Any],
                                                                      tmp_path: Path) -> None:
    mesh = mesh_of("line3")
    logs = tmp_path / "logs"
    n = 300
    subs = [consumer(tmp_path, logs, [mesh.url(r)], f"sub-{r}", n) for r in "AC"]
    try:
        wait_for(lambda: subscribed(logs) >= 2, 30, "both subscriptions in force")
        pub = publisher(tmp_path, logs, [mesh.url("A")], "pub", n, 100)
        wait_for(lambda: handed(logs) >= 2 * n // 3, 60, "a third of the stream on both")
        mesh.kill_router("B")
        time.sleep(4.0)  # the outage: B stays dead for 4 s, as in the Qpid measurement
        mesh.up(timeout=60)
        run_all([pub, *subs], 120)
    finally:
        for p in subs:
            p.stop(5)
    verdict(logs, 2, n)


def test_publisher_fails_over_when_its_router_is_killed(mesh_of: Callable[..., Any], tmp_path: Path) -> None:
    mesh = mesh_of("triangle")
    logs = tmp_path / "logs"
    n = 400
    subs = [consumer(tmp_path, logs, [mesh.url(r)], f"sub-{r}", n) for r in "BC"]
    try:
        wait_for(lambda: subscribed(logs) >= 2, 30, "subscriptions in force")
        pub = publisher(tmp_path, logs, [mesh.url("A"), mesh.url("B")], "pub", n, 150)
        wait_for(lambda: handed(logs) >= n // 2, 60, "half of the stream")
        mesh.kill_router("A")  # the publisher's router: it resends what is in doubt through B
        run_all([pub, *subs], 120)
    finally:
        for p in subs:
            p.stop(5)
    out = pub.tail()
    assert '"failovers": 1' in out or '"failovers": 2' in out, out
    verdict(logs, 2, n)


def test_subscriber_fails_over_when_its_router_is_killed(mesh_of: Callable[..., Any], tmp_path: Path) -> None:
    mesh = mesh_of("triangle")
    logs = tmp_path / "logs"
    n = 400
    moving = consumer(tmp_path, logs, [mesh.url("C"), mesh.url("B")], "mover", n)
    steady = consumer(tmp_path, logs, [mesh.url("B")], "steady", n)
    try:
        wait_for(lambda: subscribed(logs) >= 2, 30, "subscriptions in force")
        pub = publisher(tmp_path, logs, [mesh.url("A")], "pub", n, 150)
        wait_for(lambda: handed(logs) >= n // 2, 60, "half of the stream")
        mesh.kill_router("C")  # the mover resumes at B; the origin re-routes what C held for it
        run_all([pub, moving, steady], 120)
    finally:
        moving.stop(5)
        steady.stop(5)
    verdict(logs, 2, n)


def test_frozen_router_is_left_by_its_clients_and_rejoins(mesh_of: Callable[..., Any], tmp_path: Path) -> None:
    """SIGSTOP: nothing closes; clients notice by heartbeat (idle timeout) and fail over, the other
    routers by missing HELLOs. On SIGCONT the router rejoins; nothing is lost or duplicated."""
    mesh = mesh_of("triangle")
    logs = tmp_path / "logs"
    n = 300
    sub = consumer(tmp_path, logs, [mesh.url("B"), mesh.url("C")], "sub", n)
    try:
        wait_for(lambda: subscribed(logs) >= 1, 30, "subscription in force")
        pub = publisher(tmp_path, logs, [mesh.url("A"), mesh.url("C")], "pub", n, 100)
        wait_for(lambda: handed(logs) >= n // 3, 60, "a third of the stream")
        mesh.freeze("B")
        wait_for(lambda: handed(logs) >= 2 * n // 3, 60, "traffic flowing again without B")
        mesh.thaw("B")
        run_all([pub, sub], 120)
    finally:
        sub.stop(5)
        mesh.thaw("B")
    verdict(logs, 1, n)
    # and by the routers' own logs: B, thawed, found messages from its peers and its old client's
    # goodbye both waiting; it must take the goodbye first, or it hands those messages into a link
    # no one reads after they were accepted at C (common/engine.py, `defer_input`)
    late = deliveries_after_acceptance(mesh.log_dir)
    assert not late, f"{len(late)} hand-overs after the acceptance, e.g. {late[:3]}"



PROTON_PUBLISHER = Path(__file__).resolve().parents[1] / "foreign" / "proton_py" / "publisher.py"


def test_a_backlog_is_handed_after_failover_while_the_publisher_never_settles(mesh_of: Callable[..., Any],
                                                                             tmp_path: Path) -> None:
    """Issue 31, item 14: a python-qpid-proton publisher at A that sees every outcome and settles
    nothing (receiver-settle-mode second), so nothing it published becomes final. The subscriber at
    B fails over to C when B is killed; B comes back so that A reaches C again. C must hand the
    backlog A re-routes to it (before: active, credit 100, backlog queued, nothing handed for
    `final_memory`, 300 s, waiting for predecessors to become final)."""
    mesh = mesh_of("line3")
    logs = tmp_path / "logs"
    n = 150
    sub = consumer(tmp_path, logs, [mesh.url("B"), mesh.url("C")], "mover", n)
    pub = None
    try:
        wait_for(lambda: subscribed(logs) >= 1, 30, "the subscription in force at B")
        pub = Proc([sys.executable, str(PROTON_PUBLISHER), "--url", mesh.url("A"), "--topic", "t",
                    "--container", "nosettle", "--link", "p", "--report", str(tmp_path / "pub.jsonl"),
                    "--second", "--never-settle", "--count", str(n), "--rate", "30"], tmp_path / "pub.out")
        wait_for(lambda: handed(logs) >= n // 3, 60, "a third of the stream at B")
        mesh.kill_router("B")
        wait_for(lambda: resumed_at(logs, "C"), 30, "the subscription resumed at C")
        mesh.up(timeout=60)  # (A reaches C through B only)
        run_all([sub], 60)
    finally:
        sub.stop(5)
        if pub is not None:
            pub.stop(5)
    gids = [json.loads(line)["gid"] for f in logs.glob("*.subscriber.jsonl") for line in f.read_text().splitlines()
            if '"ev":"handed"' in line]
    assert [int(g.rsplit(":", 1)[1]) for g in gids] == list(range(n)), "each message once, in publish order"
    outcomes = [json.loads(line) for line in (tmp_path / "pub.jsonl").read_text().splitlines()
                if '"ev": "outcome"' in line]
    assert len(outcomes) == n and {o["outcome"] for o in outcomes} == {"ACCEPTED"}


def resumed_at(logs: Path, router: str) -> bool:
    return any('"ev":"resumed"' in line and f"router={router}" in line
               for f in logs.glob("*.subscriber.jsonl") for line in open(f))
