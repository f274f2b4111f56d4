"""The judge and the topic tree (spark/topicmatch.py): the matching rule in Spark SQL against the
reference (common/topics.py), and the logs of a real run with subscriptions to wildcard filters
judged by both views: each subscription owed exactly the messages its filter matches."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from oncemesh.common.topics import matches
from oncemesh.spark.job import reconcile_paths
from oncemesh.spark.schema import CLASSES
from oncemesh.spark.topicmatch import join_by_filter, matches_sql
from tests.spark.test_real_run import STEP_TIMEOUT, client, router  # noqa: F401  (router: a fixture)

pytestmark = pytest.mark.spark

LEVELS = ["a", "b", "", "$x"]


def test_the_sql_rule_is_the_reference_rule(spark: SparkSession) -> None:
    rng = random.Random(7)
    names = ["/".join(p) for n in range(1, 4) for p in itertools.product(LEVELS, repeat=n)]
    filters = set()
    while len(filters) < 150:
        levels = [rng.choice([*LEVELS, "+"]) for _ in range(rng.randint(0, 3))]
        f = "/".join(levels + (["#"] if rng.random() < 0.4 or not levels else []))
        filters.add(f)
    pairs = [(f, t) for f in sorted(filters) for t in rng.sample(names, 25)]
    df = spark.createDataFrame(pairs, "f string, t string")
    got = {(r.f, r.t): r.m for r in df.selectExpr("f", "t", f"{matches_sql('f', 't')} AS m").collect()}
    wrong = [(f, t, got[(f, t)]) for f, t in pairs if got[(f, t)] != matches(f, t)]
    assert not wrong, wrong[:10]
    assert any(got.values()) and not all(got.values())


def test_join_by_filter_pairs_names_by_equality_and_filters_by_the_rule(spark: SparkSession) -> None:
    msgs = spark.createDataFrame([("g1", "o/eu"), ("g2", "o/us"), ("g3", "x")], "gid string, topic string")
    lives = spark.createDataFrame([("s-eu", "o/eu"), ("s-o", "o/+"), ("s-all", "#"), ("s-none", "y/#")],
                                  "sub string, topic string")
    got = sorted((r.gid, r.sub, r.topic) for r in join_by_filter(msgs, lives).collect())
    assert got == [("g1", "s-all", "o/eu"), ("g1", "s-eu", "o/eu"), ("g1", "s-o", "o/eu"),
                   ("g2", "s-all", "o/us"), ("g2", "s-o", "o/us"), ("g3", "s-all", "x")]


def test_a_real_run_with_wildcard_subscriptions_is_judged_ok(spark: SparkSession, tmp_path: Path,
                                                             router: tuple[str, subprocess.Popen[bytes], Path]) -> None:  # noqa: F811
    url, proc, logs = router
    sub_state, pub_state = tmp_path / "sub", tmp_path / "pub"

    def run(args: list[str], state: Path) -> list[str]:
        p = subprocess.run(client(args, url, state, logs), capture_output=True, text=True, timeout=STEP_TIMEOUT)
        assert p.returncode == 0, f"{' '.join(args)}: rc {p.returncode}\n{p.stderr}"
        return p.stdout.split()

    subs = {"s-eu": "orders/eu", "s-orders": "orders/+", "s-all": "#"}
    for name, f in subs.items():
        run(["subscribe", f, "--subscription", name], sub_state)
    sent = {"orders/eu": ["e1", "e2"], "orders/us": ["u1"], "audit": ["a1", "a2"]}
    for topic, bodies in sent.items():
        run(["put", topic, *bodies, "--no-wait"], pub_state)
    for name, f in subs.items():
        want = sorted(b for t, bodies in sent.items() if matches(f, t) for b in bodies)
        got = run(["get", f, "--subscription", name, "--count", str(len(want)), "--timeout", "30"], sub_state)
        assert sorted(got) == want, name
    for topic in sent:  # the outcomes of what was sent without waiting: every message ACCEPTED
        run(["put", topic, "--flush"], pub_state)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(STEP_TIMEOUT) == 0

    summary = reconcile_paths([logs], spark=spark, out=tmp_path / "out")
    owed = 2 + 3 + 5  # s-eu: orders/eu; s-orders: orders/eu and orders/us; s-all: everything
    assert summary.class_counts() == {c: (owed if c == "ok" else 0) for c in CLASSES}
    assert (summary.messages, summary.pairs, summary.owed_pairs, summary.subscriptions) == (5, owed, owed, 3)
    rv = summary.router_view
    assert rv is not None and rv.count("ok") == owed and rv.failures == 0 and rv.unjudged == 0
    assert summary.passed


def test_a_real_run_with_a_selector_is_judged_by_the_owed_sets(spark: SparkSession, tmp_path: Path,
                                                              router: tuple[str, subprocess.Popen[bytes], Path]) -> None:  # noqa: F811
    """A subscription with a JMS selector is owed only what it selects, which no log can recompute
    (the messages' fields are not in it): both views pair its life by what the origin's owed sets and
    the hand-overs say, not by its filter (vocab.SELECTIVE); the messages it did not select are no
    pairs of it, and every pair is ok."""
    import asyncio

    from proton import Message

    from oncemesh.clients.runtime import Client
    from tests.integration.test_mesh import drain
    from tests.integration.test_single_router import run as run_async

    url, proc, logs = router

    async def main() -> None:
        c = await Client(url, state_dir=tmp_path / "c", log_dir=logs).start()
        sel = c.subscriber("sel/t", "sel", selector="qty > 1")
        every = c.subscriber("sel/t", "every")
        for s in (sel, every):
            await s.wait_attached(20)
        p = c.publisher("sel/t", "p")
        futs = [await p.send(Message(body=f"m{q}", properties={"qty": q})) for q in (1, 2, 3, 0)]
        (got_sel,), (got_all,) = await asyncio.gather(drain([sel], 2), drain([every], 4))
        assert sorted(m.body for m in got_sel) == ["m2", "m3"] and len(got_all) == 4
        assert all(r.accepted for r in await asyncio.gather(*futs))
        await c.close()

    run_async(main(), timeout=90)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(STEP_TIMEOUT) == 0
    summary = reconcile_paths([logs], spark=spark, out=tmp_path / "out")
    assert summary.class_counts() == {c: (6 if c == "ok" else 0) for c in CLASSES}
    rv = summary.router_view
    assert rv is not None and rv.count("ok") == 6 and rv.failures == 0 and rv.unjudged == 0
    assert summary.passed
