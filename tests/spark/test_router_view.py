"""The checker checks itself: forged router logs (tests/spark/forge.py), consistent histories written by
the real writer, each with one mutation (a line removed, duplicated or moved, a log cut short), and
the router view must report exactly the anomaly the mutation makes -- no more, no less.

Many histories are judged in one reconciliation (their routers, topics and ids are kept apart by a
prefix), so the Spark job runs once per test."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from oncemesh.common.settlement_log import log_files, read_lines
from oncemesh.spark import reconcile as R
from oncemesh.spark import routerview as RV
from tests.spark import forge

pytestmark = pytest.mark.spark


def judge(spark: SparkSession, directory: Path) -> tuple[dict[tuple[str, str], tuple[str, str | None]], set[str]]:
    """(gid, sub) -> (class, reason) of the router view over every log under `directory`, and the
    routers with an incarnation cut short."""
    rows = [(line, str(f)) for f in log_files(directory) for line in read_lines(f)]
    parsed = R.parse(spark.createDataFrame(rows, "value string, file string"))
    ev = R.valid_events(parsed).cache()
    try:
        pairs = RV.router_pairs(ev, R.lives(ev.where("src = 'router'")))
        got = {(r["gid"], r["sub"]): (r["class"], r["reason"]) for r in pairs.collect()}
        cut = {r["node"] for r in RV.incarnation_gaps(ev).collect()}
        assert {r["status"] for r in parsed.select("status").distinct().collect()} <= {R.OK, R.MALFORMED}
    finally:
        ev.unpersist()
    return got, cut


def check(histories: list[forge.History], got: dict[tuple[str, str], tuple[str, str | None]],
          cut: set[str]) -> None:
    for h in histories:
        mine = {k: v[0] for k, v in got.items() if k[1].startswith(h.prefix)}
        expected = h.expected
        if h.mutation == "drop_segment":  # a pair whose every line was in that segment left no trace
            expected = {k: v for k, v in expected.items() if k in mine}  # its router is cut (below)
        assert mine == expected, (h.mutation, {k: (v, h.expected.get(k)) for k, v in mine.items()
                                                 if h.expected.get(k) != v})
        assert {r for r in cut if r.startswith(h.prefix)} == h.partial_routers, h.mutation


def test_every_mutation_gets_exactly_its_anomaly(spark: SparkSession, tmp_path: Path) -> None:
    histories = forge.forge(forge.MUTATIONS, tmp_path)
    got, cut = judge(spark, tmp_path)
    check(histories, got, cut)
    reasons = {h.mutation: {got[k][1] for k, c in h.expected.items() if c == RV.UNJUDGED} for h in histories}
    assert reasons["drop_accept_remote"] == {"evidence_gap"}
    assert reasons["drop_received"] == {"no_owed_set"}
    assert reasons["truncate"] <= {"partial_log", "no_owed_set"} and "partial_log" in reasons["truncate"]
    # and the forged histories without a mutation are what a real router writes: every pair ok
    assert all(c == "ok" for (g, s), (c, _) in got.items() if s.startswith(histories[0].prefix))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(st.tuples(st.sampled_from(forge.MUTATIONS), st.integers(0, 10**6)), min_size=1, max_size=8))
def test_a_random_consistent_history_with_one_mutation_gets_its_verdict(
        spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, cases: list[tuple[str, int]]) -> None:
    """Property: for any consistent history (random homes, origins, sizes) and any one mutation,
    the router view reports that mutation's anomaly on that pair (or router) and `ok` elsewhere."""
    d = tmp_path_factory.mktemp("forged")
    histories = []
    for i, (kind, seed) in enumerate(cases):
        rng = random.Random(seed)
        while True:
            h = forge.history(f"p{i}_", rng, subs=rng.randint(1, 4), messages=rng.randint(1, 5))
            if forge.mutate(h, kind, rng):
                break
        forge.write(h, d / h.prefix)
        histories.append(h)
    got, cut = judge(spark, d)
    check(histories, got, cut)

