"""Causal order on hand-built logs: a message b is late at a subscription when it was handed there
before a message a that b's sender (a client: one container id, its publisher and subscriber logs)
had been handed before it sent b. One topic per case; `P` is a plain publisher, `c-*` a client that
is handed something and then publishes, `s-*` the subscription checked (its own client):

    topic     client c-* (ts)                               s-* handed (one batch)   counted
    t-ok      handed ok-a 10.2, sends ok-b 10.4             s-ok: ok-a, ok-b         checked 1, nothing
    t-rev     handed rev-a 10.2, sends rev-b 10.4           s-rev: rev-b, rev-a      1 violation
    t-before  sends bef-b 10.1, handed bef-a 10.2           s-bef: bef-b, bef-a      nothing (no dependency)
    t-tie     handed tie-a 10.2, sends tie-b 10.2           s-tie: tie-b, tie-a      nothing (equal ts: none)
              (and tie-later on t-tie2 at 11.0)
    t-runs    run 1 handed run-a 10.2; run 2 sends run-b    s-runs: run-b, run-a     1 violation (one client
              10.4                                                                   across its runs)
    t-u/t-x   handed u-a (topic t-u) 10.2, sends x-b        s-x: x-b                 x-b dependent, nothing
              (topic t-x) 10.4                                                       checked
    t-one     handed one-a 10.2, sends one-b 10.4           s-one1: one-b;           nothing checked
                                                            s-one2: one-a

In the first five cases the client's own subscription (`s-c-<case>`) is handed a, then its own b at
10.6 (checked too where b depends on a); in the last two it is handed a only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from oncemesh.cli import main as oncemesh
from oncemesh.spark import chart
from oncemesh.spark import reconcile as R
from oncemesh.spark.job import format_summary
from oncemesh.spark.synth import LogBook

pytestmark = pytest.mark.spark


class Run:
    def __init__(self, book: LogBook) -> None:
        self.b = book

    def subscribe(self, node: str, sid: str, topic: str) -> None:
        self.b.write("subscriber", node, "subscribed", 1.0, topic=topic, sub=sid, container=node, link=sid)

    def publish(self, node: str, gid: str, topic: str, ts: float, inc: str = "1", seq: int = 1) -> None:
        for ev, t, extra in (("published", ts, {}), ("outcome", ts + 2.0, {"outcome": "ACCEPTED"})):
            self.b.write("publisher", node, ev, t, inc=inc, gid=gid, topic=topic, pub=f"p-{node}-{topic}",
                         link="l", seq=seq, **extra)

    def handed(self, node: str, sid: str, topic: str, batch: list[str], ts: float, inc: str = "1") -> None:
        for i, gid in enumerate(batch):
            self.b.write("subscriber", node, "handed", ts, inc=inc, gid=gid, topic=topic, sub=sid, link=sid,
                         n=i + 1)


def case(r: Run, name: str, a_at: float, b_at: float, order: list[str], *, a_inc: str = "1",
         b_inc: str = "1") -> None:
    """P sends `<name>-a`; client c-<name> is handed it at a_at (run a_inc) and sends `<name>-b` at b_at
    (run b_inc), both on t-<name>; subscription s-<name> is handed them in `order` ("a", "b")."""
    topic, client = f"t-{name}", f"c-{name}"
    a, b = f"{name}-a", f"{name}-b"
    r.subscribe(client, f"s-c-{name}", topic)
    r.subscribe(f"n-{name}", f"s-{name}", topic)
    r.publish("P", a, topic, 10.0)
    r.handed(client, f"s-c-{name}", topic, [a], a_at, inc=a_inc)
    r.publish(client, b, topic, b_at, inc=b_inc)
    r.handed(client, f"s-c-{name}", topic, [b], 10.6, inc=b_inc)
    r.handed(f"n-{name}", f"s-{name}", topic, [{"a": a, "b": b}[x] for x in order], 10.5)


def build(out: Path) -> None:
    with LogBook(out) as book:
        r = Run(book)
        case(r, "ok", 10.2, 10.4, ["a", "b"])
        case(r, "rev", 10.2, 10.4, ["b", "a"])
        case(r, "bef", 10.2, 10.1, ["b", "a"])
        case(r, "tie", 10.2, 10.2, ["b", "a"])
        r.publish("c-tie", "tie-later", "t-tie2", 11.0)  # so that tie-a is not after the client's last send
        case(r, "runs", 10.2, 10.4, ["b", "a"], a_inc="1", b_inc="2")
        # through another topic: the client gets u-a on t-u, then sends x-b on t-x
        r.subscribe("c-u", "s-c-u", "t-u")
        r.subscribe("n-x", "s-x", "t-x")
        r.publish("P", "u-a", "t-u", 10.0)
        r.handed("c-u", "s-c-u", "t-u", ["u-a"], 10.2)
        r.publish("c-u", "x-b", "t-x", 10.4)
        r.handed("n-x", "s-x", "t-x", ["x-b"], 10.5)
        # each subscription gets only one of the two
        r.subscribe("c-one", "s-c-one", "t-one")
        r.subscribe("n-one1", "s-one1", "t-one")
        r.subscribe("n-one2", "s-one2", "t-one")
        r.publish("P", "one-a", "t-one", 10.0)
        r.handed("c-one", "s-c-one", "t-one", ["one-a"], 10.2)
        r.publish("c-one", "one-b", "t-one", 10.4)
        r.handed("n-one1", "s-one1", "t-one", ["one-b"], 10.5)
        r.handed("n-one2", "s-one2", "t-one", ["one-a"], 10.5)


@pytest.fixture(scope="module")
def rec(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[R.Summary, R.Reconciliation]:
    out = tmp_path_factory.mktemp("causal")
    build(out)
    r = R.reconcile(R.parse(spark.read.text(sorted(str(p) for p in out.glob("*.jsonl")))), persist=True)
    return R.summarize(r), r


def rows(r: R.Reconciliation) -> dict[str, tuple[int, int]]:
    """sub -> (checked, causal_violations)."""
    return {row["sub"]: (row["checked"], row["causal_violations"]) for row in r.causal.collect()}


def per_topic(s: R.Summary) -> dict[str | None, tuple[int, int, int]]:
    return {t.topic: (t.dependent, t.checked, t.violations) for t in s.causal_per_topic}


def test_a_then_b_counts_nothing(rec: Any) -> None:
    summary, r = rec
    assert rows(r)["s-ok"] == (1, 0)
    assert rows(r)["s-c-ok"] == (1, 0)
    assert per_topic(summary)["t-ok"] == (1, 2, 0)


def test_b_before_a_is_one_violation(rec: Any) -> None:
    summary, r = rec
    assert rows(r)["s-rev"] == (1, 1)
    (row,) = R.causal_anomalies(r.causal).where("sub = 's-rev'").collect()
    assert row["violated"] == ["rev-b"] and row["example"] == ["rev-a", "rev-b"]
    assert rows(r)["s-c-rev"] == (1, 0)
    assert per_topic(summary)["t-rev"] == (1, 2, 1)


def test_sent_before_being_handed_is_no_dependency(rec: Any) -> None:
    summary, r = rec
    assert rows(r)["s-bef"] == (0, 0)
    assert rows(r)["s-tie"] == (0, 0) and rows(r)["s-c-bef"] == (0, 0)  # equal ts: the order of two files cannot be told
    assert "t-bef" not in per_topic(summary) and "t-tie" not in per_topic(summary)


def test_a_client_is_its_container_across_runs(rec: Any) -> None:
    assert rows(rec[1])["s-runs"] == (1, 1)


def test_dependency_through_a_different_topic(rec: Any) -> None:
    """x-b depends on u-a (another topic); no subscription gets both (one topic each): nothing checked."""
    summary, r = rec
    assert per_topic(summary)["t-x"] == (1, 0, 0)
    assert rows(r)["s-x"] == (0, 0)
    assert "t-u" not in per_topic(summary)  # u-a was sent by P, which was handed nothing


def test_a_subscription_with_only_one_of_the_two_counts_nothing(rec: Any) -> None:
    summary, r = rec
    got = rows(r)
    assert (got["s-one1"], got["s-one2"]) == ((0, 0), (0, 0))
    assert per_topic(summary)["t-one"] == (1, 0, 0)


def test_the_totals_and_the_table(rec: Any) -> None:
    summary, _ = rec
    assert summary.causal_violations == 2  # t-rev, t-runs
    assert summary.to_dict()["causal_violations"] == 2
    assert summary.fifo_reversals == 0
    # rev, bef, tie, runs: s-c-* got a, b and s-* b, a; total order disagrees, causal only where b depends on a
    assert summary.total_order_disagreements == 4
    text = format_summary(summary)
    assert [ln.split()[:2] for ln in text.splitlines() if ln.strip().startswith("causal_")] == [
        ["causal_violations", "2"]]
    assert "topic t-rev: 1 of 2 checked hand-over(s)" in text


def test_causal_violations_are_reported_not_judged(spark: SparkSession, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """One violation, nothing lost: exit 0; the count in --json and causal_violations.parquet."""
    with LogBook(tmp_path / "logs") as book:
        case(Run(book), "rev", 10.2, 10.4, ["b", "a"])
    monkeypatch.setattr(chart, "available", lambda: False)
    out = tmp_path / "out"
    assert oncemesh(["reconcile", str(tmp_path / "logs"), "--json", "--out", str(out)]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    assert got["causal_violations"] == 1 and got["verdict"] == "pass" and got["ok"] == 4
    assert got["causal_per_topic"] == [{"topic": "t-rev", "dependent": 1, "checked": 2, "causal_violations": 1}]
    v = spark.read.parquet(str(out / "causal_violations.parquet")).collect()
    assert [(x["sub"], x["causal_violations"], x["example"]) for x in v] == [("s-rev", 1, ["rev-a", "rev-b"])]
