"""Order checks on hand-built logs: per-publisher reversals and gaps, and pairs of subscriptions of a
topic handed messages in opposite orders. One topic per case, so that each case is one row:

    topic     subscription(s)   publisher  what happens                                   counted
    t-in      s-in              p-in       seq 1, 2 in one batch (n 1, 2); a restarted     nothing
                                           process (n from 1 again, later ts) gets 3
    t-old     s-old             p-old      seq 2 and 1 in one batch, lines without n        nothing (ties:
                                           (an older log), 2 written first                  publish order)
    t-rev     s-rev             p-rev      seq 1, 3, 2 in one batch (n 1, 2, 3)             1 reversal
    t-gap     s-gap             p-gap      seq 1, 3 handed; 2 and 4 ACCEPTED, never         1 gap (2; 4: no
                                           handed (lost)                                    later one handed)
    t-end     s-end             p-end      seq 1 owed, the life ends first; a new life      nothing
                                           gets seq 2
    t-two     s-2a, s-2b        p-x, p-y   x, y to s-2a; y, x to s-2b                       1 disagreeing pair
    t-three   s-3a, s-3b, s-3c  p-x, p-y   x, y to s-3a and s-3c; y, x to s-3b              2 disagreeing pairs:
                                                                                            (3a, 3b), (3b, 3c)
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

    def subscribe(self, sid: str, topic: str, ts: float = 1.0, ev: str = "subscribed") -> None:
        self.b.write("subscriber", f"c-{sid}", ev, ts, inc="s1", topic=topic, sub=sid, container=f"c-{sid}",
                     link=sid)

    def publish(self, gid: str, topic: str, pub: str, seq: int, ts: float, outcome_at: float | None = None
                ) -> None:
        self.b.write("publisher", f"P-{pub}", "published", ts, inc="r1", gid=gid, topic=topic, pub=pub,
                     link="l", seq=seq, size=1)
        if outcome_at is not None:
            self.b.write("publisher", f"P-{pub}", "outcome", outcome_at, inc="r1", gid=gid, topic=topic,
                         pub=pub, link="l", seq=seq, outcome="ACCEPTED")

    def handed(self, sid: str, topic: str, batch: list[str], ts: float, inc: str = "s1", n0: int | None = 1
               ) -> None:
        """One batch: every line stamped `ts`, `n` counting from n0 (None: lines without n)."""
        for i, gid in enumerate(batch):
            extra = {} if n0 is None else {"n": n0 + i}
            self.b.write("subscriber", f"c-{sid}", "handed", ts, inc=inc, gid=gid, topic=topic, sub=sid,
                         link=sid, **extra)


def build(out: Path) -> None:
    with LogBook(out) as book:
        r = Run(book)
        for sid, topic in [("s-in", "t-in"), ("s-old", "t-old"), ("s-rev", "t-rev"), ("s-gap", "t-gap"),
                           ("s-end", "t-end"), ("s-2a", "t-two"), ("s-2b", "t-two"), ("s-3a", "t-three"),
                           ("s-3b", "t-three"), ("s-3c", "t-three")]:
            r.subscribe(sid, topic)

        for seq in (1, 2, 3):
            r.publish(f"in{seq}", "t-in", "p-in", seq, 10.0 + seq / 10, 12.0)
        r.handed("s-in", "t-in", ["in1", "in2"], 10.5)
        r.handed("s-in", "t-in", ["in3"], 11.0, inc="s2")  # a new process: n starts again

        for seq in (1, 2):
            r.publish(f"old{seq}", "t-old", "p-old", seq, 10.0 + seq / 10, 12.0)
        r.handed("s-old", "t-old", ["old2", "old1"], 10.5, n0=None)

        for seq in (1, 2, 3):
            r.publish(f"rev{seq}", "t-rev", "p-rev", seq, 10.0 + seq / 10, 12.0)
        r.handed("s-rev", "t-rev", ["rev1", "rev3", "rev2"], 10.5)

        for seq in (1, 2, 3, 4):
            r.publish(f"gap{seq}", "t-gap", "p-gap", seq, 10.0 + seq / 10, 12.0)
        r.handed("s-gap", "t-gap", ["gap1", "gap3"], 10.5)

        r.publish("end1", "t-end", "p-end", 1, 10.1, 12.0)
        r.subscribe("s-end", "t-end", 10.2, "unsubscribed")
        r.subscribe("s-end", "t-end", 10.3)
        r.publish("end2", "t-end", "p-end", 2, 10.4, 12.0)
        r.handed("s-end", "t-end", ["end2"], 10.5)

        for topic, subs in (("t-two", ("s-2a", "s-2b")), ("t-three", ("s-3a", "s-3b", "s-3c"))):
            x, y = f"{topic}-x", f"{topic}-y"
            r.publish(x, topic, "p-x", 1, 10.1, 12.0)
            r.publish(y, topic, "p-y", 1, 10.2, 12.0)
            for sid in subs:
                r.handed(sid, topic, [y, x] if sid in ("s-2b", "s-3b") else [x, y], 10.5)


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("order")
    build(out)
    return out


@pytest.fixture(scope="module")
def rec(spark: SparkSession, logs: Path) -> tuple[R.Summary, R.Reconciliation]:
    r = R.reconcile(R.parse(spark.read.text(sorted(str(p) for p in logs.glob("*.jsonl")))), persist=True)
    return R.summarize(r), r


def fifo_rows(r: R.Reconciliation) -> dict[tuple[str, str], tuple[int, int, int]]:
    return {(row["sub"], row["pub"]): (row["handed"], row["fifo_reversals"], row["fifo_gaps"])
            for row in r.order.collect()}


def test_in_order_across_restarts_and_batches_counts_nothing(rec: Any) -> None:
    rows = fifo_rows(rec[1])
    assert rows[("s-in", "p-in")] == (3, 0, 0)
    assert rows[("s-old", "p-old")] == (2, 0, 0)  # no n: a batch's ties are taken in publish order
    assert rows[("s-end", "p-end")] == (1, 0, 0)  # seq 1 ended before delivery: no gap


def test_one_reversal_is_counted_once_and_nothing_else(rec: Any) -> None:
    summary, r = rec
    rows = fifo_rows(r)
    assert rows[("s-rev", "p-rev")] == (3, 1, 0)
    assert summary.fifo_reversals == 1
    (row,) = R.order_anomalies(r.order).where("sub = 's-rev'").collect()
    assert row["reversed_seqs"] == [2] and row["gap_seqs"] == []


def test_one_gap_is_counted_once(rec: Any) -> None:
    summary, r = rec
    rows = fifo_rows(r)
    assert rows[("s-gap", "p-gap")] == (2, 0, 1)  # seq 2; seq 4 is lost too, but nothing later came
    assert summary.fifo_gaps == 1
    (row,) = R.order_anomalies(r.order).where("sub = 's-gap'").collect()
    assert row["gap_seqs"] == [2] and row["reversed_seqs"] == []
    assert summary.lost == 2  # the classes are unchanged by the order checks


def test_subscription_pairs_in_opposite_orders(rec: Any) -> None:
    summary, r = rec
    pairs = {(row["sub_a"], row["sub_b"]): (row["common"], row["disagree"]) for row in r.sub_pairs.collect()}
    assert pairs == {("s-2a", "s-2b"): (2, True),
                     ("s-3a", "s-3b"): (2, True), ("s-3a", "s-3c"): (2, False), ("s-3b", "s-3c"): (2, True)}
    per_topic = {t.topic: (t.compared, t.disagreements) for t in summary.order_per_topic}
    assert per_topic == {"t-two": (1, 1), "t-three": (3, 2)}
    assert summary.total_order_disagreements == 3
    ex = r.sub_pairs.where("sub_a = 's-2a'").first()
    assert ex is not None and ex["example"] == ["t-two-x", "t-two-y"]


def test_the_table_has_an_order_section(rec: Any) -> None:
    text = format_summary(rec[0])
    assert "order (reported, not part of the verdict):" in text
    assert [ln.split()[:2] for ln in text.splitlines() if ln.strip().startswith(("fifo_", "total_order"))] == [
        ["fifo_reversals", "1"], ["fifo_gaps", "1"], ["total_order_disagreements", "3"]]
    assert "topic t-three: 2 of 3 subscription pair(s)" in text


def test_order_is_reported_not_judged(spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with a reversal and opposite orders, nothing lost: exit 0; the counts in --json, the table
    and the order Parquet files."""
    with LogBook(tmp_path / "logs") as book:
        r = Run(book)
        for sid in ("s1", "s2"):
            r.subscribe(sid, "t")
        for seq in (1, 2):
            r.publish(f"g{seq}", "t", "p", seq, 10.0 + seq / 10, 12.0)
        r.handed("s1", "t", ["g2", "g1"], 10.5)
        r.handed("s2", "t", ["g1", "g2"], 10.6)
    monkeypatch.setattr(chart, "available", lambda: False)
    out = tmp_path / "out"
    assert oncemesh(["reconcile", str(tmp_path / "logs"), "--json", "--out", str(out)]) == 0
    cap = capsys.readouterr()
    got = json.loads(cap.out.strip().splitlines()[0])
    assert (got["fifo_reversals"], got["fifo_gaps"], got["total_order_disagreements"]) == (1, 0, 1)
    assert got["verdict"] == "pass" and got["ok"] == 4
    assert got["order_per_topic"] == [{"topic": "t", "compared": 1, "total_order_disagreements": 1}]
    rows = spark.read.parquet(str(out / "order_anomalies.parquet")).collect()
    assert [(x["sub"], x["pub"], x["fifo_reversals"], x["reversed_seqs"]) for x in rows] == [("s1", "p", 1, [1])]
    d = spark.read.parquet(str(out / "order_disagreements.parquet")).collect()
    assert [(x["sub_a"], x["sub_b"], x["example"]) for x in d] == [("s1", "s2", ["g2", "g1"])]
    s = spark.read.parquet(str(out / "summary.parquet")).first()
    assert s is not None and s["fifo_reversals"] == 1
