"""Links cut through the proxies, with real routers and real client processes.

    triangle:   A ------ B          line3:   A --- B --- C
                 \\      /
                  \\    /
                    C

The clients write settlement logs; `ClientLogs` follows them while the faults are on, and the
tests check the promises from them at the end: every message handed exactly once to every
subscription in force, ACCEPTED only after every subscription had it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from oncemesh.harness.procs import Proc, wait_for
from oncemesh.harness.progress import ClientLogs, Subscription
from oncemesh.topology.launcher import Mesh
from oncemesh.topology.proxy import Mode
from tests.conftest import Procs
from tests.helpers import worker

SIZE = 200  # message bytes: far more than a HELLO, so that proxy byte counts show where messages went


def until(watch: ClientLogs, pred: Callable[[], object], timeout: float, what: str) -> None:
    def check() -> object:
        watch.poll()
        return pred()
    wait_for(check, timeout, what)


def subscriber(procs: Procs, tmp: Path, name: str, url: str) -> Proc:
    return procs.add(worker("consume", "--url", url, "--topic", "t", "--name", name,
                            "--state-dir", str(tmp / "clients" / name), "--log-dir", str(tmp / "clientlogs"),
                            workdir=tmp, name=name))


def publisher(procs: Procs, tmp: Path, name: str, url: str, count: int, rate: float) -> Proc:
    return procs.add(worker("publish", "--url", url, "--topic", "t", "--name", name, "--count", str(count),
                            "--rate", str(rate), "--size", str(SIZE),
                            "--state-dir", str(tmp / "clients" / name), "--log-dir", str(tmp / "clientlogs"),
                            workdir=tmp, name=name))


def in_force(watch: ClientLogs, name: str) -> Subscription:
    until(watch, lambda: (s := watch.by_link(name)) is not None and s.started is not None, 30,
          f"subscription {name} in force")
    s = watch.by_link(name)
    assert s is not None
    return s


def sent_after(watch: ClientLogs, s: Subscription, t: float) -> int:
    """Messages first sent after `t` that `s` has had."""
    return sum(1 for g in s.handed if watch.published.get(g, 0.0) > t)


def check_exactly_once(watch: ClientLogs, subs: list[Subscription], count: int) -> None:
    assert len(watch.published) == count
    assert set(watch.outcome.values()) == {"ACCEPTED"} and len(watch.outcome) == count
    for s in subs:
        assert not watch.missing(s), f"{s.link}: {len(watch.missing(s))} never handed"
        assert set(s.handed) == set(watch.published)
    assert watch.violations() == []  # nothing handed twice, no ACCEPTED before a hand-over


def test_cut_link_reroutes_through_the_third_router_exactly_once(proxied: Callable[..., Mesh], procs: Procs,
                                                                tmp_path: Path) -> None:
    """Publisher on A, subscriber on B; cut A-B mid-stream: traffic goes A-C-B, nothing twice."""
    mesh = proxied("triangle")
    watch = ClientLogs(tmp_path / "clientlogs")
    subscriber(procs, tmp_path, "sub-B", mesh.url("B"))  # one URL each: the clients cannot fail over
    sub = in_force(watch, "sub-B")
    count = 600
    pub = publisher(procs, tmp_path, "pub-A", mesh.url("A"), count, rate=150)
    until(watch, lambda: len(sub.handed) >= 100, 30, "traffic from A to B")

    via_c = {link: mesh.link_stats(*link) for link in (("A", "C"), ("B", "C"))}
    mesh.cut_link("A", "B")
    t_cut = time.time()
    assert mesh.link_mode("A", "B") is Mode.CUT and mesh.link_stats("A", "B").open == 0
    until(watch, lambda: sent_after(watch, sub, t_cut) >= 150, 30, "traffic sent after the cut to reach B")
    assert mesh.link_stats("A", "B").open == 0  # nothing got through the cut link meanwhile
    # A dials C (A->C is upstream on A-C), B dials C (C->B is downstream on B-C)
    assert mesh.link_stats("A", "C").bytes_up - via_c[("A", "C")].bytes_up >= 150 * SIZE
    assert mesh.link_stats("B", "C").bytes_down - via_c[("B", "C")].bytes_down >= 150 * SIZE

    mesh.restore_link("A", "B")
    until(watch, lambda: mesh.link_stats("A", "B").open == 1, 20, "the A-B link to come back")
    assert pub.wait(60) == 0
    until(watch, lambda: not watch.missing(sub), 30, "B to have every message")
    check_exactly_once(watch, [sub], count)


def test_partition_holds_what_crosses_and_heals_exactly_once(proxied: Callable[..., Mesh], procs: Procs,
                                                             tmp_path: Path) -> None:
    """Line A-B-C, publisher on A, subscribers on B and C; cut B-C: B keeps receiving, C waits,
    and no message owed to C is ACCEPTED; heal: everything reaches its outcome exactly once."""
    mesh = proxied("line3")
    watch = ClientLogs(tmp_path / "clientlogs")
    subscriber(procs, tmp_path, "sub-B", mesh.url("B"))
    subscriber(procs, tmp_path, "sub-C", mesh.url("C"))
    sub_b, sub_c = in_force(watch, "sub-B"), in_force(watch, "sub-C")
    count = 500
    pub = publisher(procs, tmp_path, "pub-A", mesh.url("A"), count, rate=150)
    until(watch, lambda: len(sub_c.handed) >= 50, 30, "traffic from A to C")

    mesh.partition(["C"])
    t_cut = time.time()
    mesh.wait_converged(20)  # A and B see each other only; C sees nobody
    assert {s.id: s.peers for s in mesh.status()} == {"A": ("B",), "B": ("A",), "C": ()}
    until(watch, lambda: sent_after(watch, sub_b, t_cut) >= 150, 30, "B to keep receiving")
    watch.poll()
    crossing = {g for g, t in watch.published.items() if t > t_cut}
    assert sent_after(watch, sub_c, t_cut) == 0  # what crosses waits ...
    decided = {g for g in crossing if g in watch.outcome}
    assert not decided, f"{len(decided)} messages owed to C got an outcome during the partition"
    assert pub.alive()  # ... and so does the publisher, for their outcomes

    mesh.heal()
    mesh.wait_converged(30)
    assert pub.wait(60) == 0
    until(watch, lambda: not watch.missing(sub_b) and not watch.missing(sub_c), 30, "B and C to have everything")
    check_exactly_once(watch, [sub_b, sub_c], count)


def test_silent_link_is_noticed_by_heartbeats_and_recovers(proxied: Callable[..., Mesh]) -> None:
    """A blackholed link is not reset: the routers notice it only after dead_after, then reconnect
    when it is restored."""
    mesh = proxied("line3")
    t0 = time.monotonic()
    mesh.blackhole_link("A", "B")
    mesh.wait_converged(mesh.topology.dead_after + 10)
    assert time.monotonic() - t0 >= mesh.topology.dead_after * 0.8  # not noticed before the heartbeats
    assert {s.id: s.peers for s in mesh.status()}["A"] == ()
    mesh.restore_link("A", "B")
    mesh.wait_converged(30)
    assert {s.id: s.peers for s in mesh.status()}["A"] == ("B", "C")
