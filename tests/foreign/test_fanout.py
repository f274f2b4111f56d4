"""Foreign clients fan out over line3 while routers are SIGKILLed mid-stream (issue 17 item 5).

    A --- B --- C     publisher on A (failover list A, B)
                      subscribers (durable, timeout 600 s) on A (A, B), B (B, C), C (C, B)

At a quarter of the outcomes B is killed and restarted: C's subscriber keeps its connection while
the mesh splits and heals; B's fails over to C and resumes its subscription there. At half, A is
killed and restarted: the publisher fails over to B and sends what is in doubt again under the same
tags; A's subscriber fails over to B. Judged from the clients' own reports (tests/foreign/verdict.py),
then, by the last test of the module, from the routers' logs alone (`oncemesh reconcile` once over
every run: one Spark job, the router-side verdict).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oncemesh.harness.procs import Proc
from tests.foreign.clients import Family, read_report, wait_progress
from tests.foreign.verdict import (
    assert_router_verdict,
    client_verdict,
    failure_evidence,
    gid_for,
    reconcile,
)

pytestmark = pytest.mark.foreign

N = 400  # messages
RATE = 150  # new messages per second at most: ~3 s of stream, so that the kills land mid-stream
RUNS: list[tuple[Path, int]] = []  # (the routers' log folder, pairs owed) of each run that passed

JMS_REUSES_TAGS = (
    "router: Qpid JMS starts its delivery tags again on every connection; B, restarted since, held no "
    "copy of its messages when the publisher fails over to it, so it cannot tell a new message under a "
    "tag C holds final from a resend before C refuses the copy: those messages wait for an outcome "
    "(docs/clients.md, known issue 1)")

CASES = [
    pytest.param("cpp", "cpp", id="cpp"),
    pytest.param("rhea", "rhea", id="rhea"),
    pytest.param("proton_py", "proton_py", id="proton-python"),
    pytest.param("proton_py", "jms", id="jms-subscribers"),
    pytest.param("jms", "jms", id="jms", marks=pytest.mark.xfail(strict=True, reason=JMS_REUSES_TAGS)),
]


@pytest.mark.parametrize(("pub_family", "sub_family"), CASES)
def test_fanout_over_line3_with_routers_killed_mid_stream(pub_family: str, sub_family: str, mesh_of: Any,
                                                          procs: Any, tmp_path: Path,
                                                          request: pytest.FixtureRequest) -> None:
    pubf: Family = request.getfixturevalue(pub_family)
    subf: Family = request.getfixturevalue(sub_family)
    mesh = mesh_of("line3")
    url = {r: mesh.url(r) for r in "ABC"}
    topic = f"foreign.{sub_family}"
    failover = {"A": "B", "B": "C", "C": "B"}
    reports = {r: tmp_path / f"sub-{r}.jsonl" for r in "ABC"}
    for r in "ABC":
        procs.add(Proc(subf.command("subscriber", url=f"{url[r]},{url[failover[r]]}", topic=topic,
                                    container=f"{sub_family}-sub-{r}", link=f"sub-{r}", expiry=600,
                                    report=reports[r]), tmp_path / f"sub-{r}.out"))
    for r in "ABC":
        wait_progress(lambda r=r: int(any(e["ev"] == "attached" for e in read_report(reports[r]))), 1,
                      f"subscriber on {r} attached")
    pub_report = tmp_path / "pub.jsonl"
    pub = procs.add(Proc(pubf.command("publisher", url=f"{url['A']},{url['B']}", topic=topic,
                                      container=f"{pub_family}-pub-{sub_family}", link="pub", count=N, window=20,
                                      rate=RATE, report=pub_report), tmp_path / "pub.out"))

    def outcomes() -> int:
        return sum(e["ev"] == "outcome" for e in read_report(pub_report))

    at_kill = {}
    for router, share in (("B", 4), ("A", 2)):
        wait_progress(outcomes, N // share, f"outcomes before {router} is killed")
        at_kill[router] = outcomes()
        mesh.kill_router(router)  # SIGKILL, by PID
        mesh.start_router(router, wait=30)
    assert all(n < N for n in at_kill.values()), f"a kill came after the stream: {at_kill}"
    wait_progress(lambda: outcomes() + any(e["ev"] == "done" for e in read_report(pub_report)), N + 1,
                  "the publisher's outcomes")
    assert pub.wait(30) == 0, pub.tail()
    accepted = {f"pub:{e['k']}" for e in read_report(pub_report)
                if e["ev"] == "outcome" and e["outcome"] == "ACCEPTED"}
    for r in "ABC":
        wait_progress(lambda r=r: len(accepted & {e["key"] for e in read_report(reports[r]) if e["ev"] == "msg"}),
                      len(accepted), f"the subscriber on {r}")
    for p in procs.others:
        p.stop(10)

    subs = {r: read_report(reports[r]) for r in "ABC"}
    verdict = client_verdict("pub", read_report(pub_report), subs,
                             gid_for(f"{pub_family}-pub-{sub_family}", "pub") if pubf.tags else None, by_tag=subf.tags)
    print(f"{pubf.name} {pubf.version} -> {subf.name} {subf.version}: kills at {at_kill} outcomes; "
          f"{verdict.summary()}")
    assert verdict.problems() == [], verdict.summary()
    assert len(verdict.accepted) == N
    # the reattaches happened: B's and A's subscribers lost their connections, C's kept it
    dropped = {r: sum(e["ev"] == "disconnected" for e in subs[r]) for r in "ABC"}
    assert dropped["A"] >= 1 and dropped["B"] >= 1 and dropped["C"] == 0, dropped
    RUNS.append((mesh.log_dir, 3 * N))


def test_the_routers_logs_alone_judge_every_pair(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """docs/promises.md, promise 9: the routers' own logs suffice to judge every (message, subscription)
    pair of the runs above; none of these clients writes a log of its own."""
    if not RUNS:
        pytest.skip("no fan-out run passed in this session (run the whole module)")
    request.getfixturevalue("spark")
    dirs = [d for d, _ in RUNS]
    summary = reconcile(dirs, tmp_path / "reconcile")
    assert_router_verdict(summary, pairs=sum(n for _, n in RUNS), routers=["A", "B", "C"],
                          evidence=lambda: failure_evidence(tmp_path / "reconcile", dirs))
