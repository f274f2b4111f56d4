"""Clients not ours are judged too: plain python-qpid-proton clients (BlockingConnection, no
settlement log of their own) fan messages out over line3, and the reconciliation judges every
(message, subscription) pair from the routers' logs alone.

    A (sub sA) --- B (sub sB) --- C (sub sC)        publisher at A, N messages, each ACCEPTED

Issue 17: before the router view, `oncemesh reconcile` over such a run judged 0 pairs and said
"pass". Now the router view judges 3 x N pairs, and a run whose evidence is partial (a router's log
missing) says so with exit status 3 instead of passing.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection
from pyspark.sql import SparkSession

from oncemesh.spark.job import reconcile_paths

pytestmark = pytest.mark.spark

N = 40
TIMEOUT = 30.0  # seconds per step (an attach, each send, each receive): a bound on no progress, not on the run


def fan_out(urls: dict[str, str], topic: str, n: int) -> dict[str, list[str]]:
    """One plain Proton receiver per router (attached before anything is sent: in force), one
    plain Proton sender at A; returns the bodies each receiver got."""
    got: dict[str, list[str]] = {rid: [] for rid in urls}
    ready = threading.Barrier(len(urls) + 1, timeout=TIMEOUT)
    errors: list[BaseException] = []

    def receive(rid: str) -> None:
        try:
            conn = BlockingConnection(urls[rid], timeout=TIMEOUT)
            try:
                rcv = conn.create_receiver(topic, name=f"plain-{rid}", credit=10)
                ready.wait()
                while len(got[rid]) < n:
                    msg = rcv.receive(timeout=TIMEOUT)
                    got[rid].append(str(msg.body))
                    rcv.accept()
            finally:
                conn.close()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=receive, args=(rid,), daemon=True) for rid in urls]
    for t in threads:
        t.start()
    ready.wait()
    conn = BlockingConnection(urls["A"], timeout=TIMEOUT)
    try:
        snd = conn.create_sender(topic, name="plain-pub")
        for i in range(n):
            snd.send(Message(body=f"m{i}"))  # blocks until the router settles it: ACCEPTED
    finally:
        conn.close()
    for t in threads:
        t.join(TIMEOUT * 2)
    assert not errors, errors
    return got


def test_plain_proton_clients_are_judged_by_the_router_view(spark: SparkSession, mesh_of: Any,
                                                            tmp_path: Path) -> None:
    mesh = mesh_of("line3")
    urls = {s.id: str(s.url) for s in mesh.status()}
    got = fan_out(urls, "plain", N)
    assert all(sorted(v) == sorted(f"m{i}" for i in range(N)) for v in got.values())
    mesh.down(timeout=20)
    logs = Path(mesh.log_dir)

    s = reconcile_paths([logs], spark=spark, chart=False)
    rv = s.router_view
    assert (rv.pairs, rv.judged, rv.count("ok"), rv.failures) == (3 * N, 3 * N, 3 * N, 0), s.to_dict()
    assert s.pairs == 0  # no client log: the client view has nothing, and says so
    assert s.judged_pairs == 3 * N and s.unjudged_pairs == 0 and s.exit_status == 0 and s.verdict == "pass"
    per = {r.node: r for r in rv.per_router}
    assert (per["A"].origin_messages, per["A"].origin_pairs) == (N, 3 * N)
    assert all(per[x].home_pairs == per[x].judged_pairs == N for x in "ABC")

    # a router that took part without its log: its subscription's pairs cannot be judged, and the
    # run is partial (exit 3), not a pass -- unless the operator accepts partial evidence. One
    # reconciliation for both verdicts: `accept_partial` is passed down to the summary and read only by
    # its verdict (Summary.exit_status), so the same summary without it is the operator's default
    cut = tmp_path / "without-C"
    shutil.copytree(logs, cut, ignore=lambda d, names: [x for x in names if x.startswith("C.settlement.")])
    accepted = reconcile_paths([cut], spark=spark, chart=False, accept_partial=True)
    s = replace(accepted, accept_partial=False)
    assert s.router_view.missing_routers == ("C",)
    assert dict(s.router_view.reasons)["missing_log"] == N and s.router_view.judged == 2 * N
    assert s.unjudged_pairs == N and s.exit_status == 3 and s.verdict == "partial"
    assert accepted.accept_partial and accepted.exit_status == 0 and accepted.judged_pairs == 2 * N
