"""The reconciliation on hand-built logs: one pair of every class, each found once, nothing else.

The run, on router A (restarted once: incarnations a1, a2) and router B; one topic per anomaly so
that every anomaly is exactly one pair:

    topic    subscription(s)          message   what happens                              class
    t-ok     s-ok, s-late, s-gone     m-ok      handed to s-ok; outcome from a 2nd run      ok
                                                s-late attached after the send, handed      ok (not owed)
                                                s-gone ended before, new life after it      (no pair)
                                      m-ok2     handed to s-ok and s-gone (via A -> B)      ok, ok
             s-foreign (router only)            never judged: no subscriber log             -
    t-lost   s-lost                   m-lost    ACCEPTED, never handed                      lost
    t-dup    s-dup                    m-dup     handed twice (two subscriber runs)          duplicated
    t-unexp  s-unexp                  m-unexp   handed, never published                     unexpected
    t-doubt  s-doubt                  m-doubt   no outcome, not handed; A dies holding it   in_doubt
    t-recov  s-recov                  m-recov   no outcome, handed once                     recovered
    t-ended  s-ended                  m-ended   s-ended unsubscribes, then ACCEPTED         ended_before_delivery
    t-false  s-false                  m-false   ACCEPTED at 117.1, handed at 117.5          false_accept
    t-rej    s-rej, s-rej2            m-rej     REJECTED by s-rej, handed to s-rej2         ok, ok
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from oncemesh.spark import reconcile as R
from oncemesh.spark.synth import LogBook

pytestmark = pytest.mark.spark

EXPECTED: dict[tuple[str, str], tuple[str, bool]] = {  # (gid, sub) -> (class, owed)
    ("m-ok", "s-ok"): ("ok", True),
    ("m-ok", "s-late"): ("ok", False),
    ("m-ok2", "s-ok"): ("ok", True),
    ("m-ok2", "s-gone"): ("ok", True),
    ("m-lost", "s-lost"): ("lost", True),
    ("m-dup", "s-dup"): ("duplicated", True),
    ("m-unexp", "s-unexp"): ("unexpected", False),
    ("m-doubt", "s-doubt"): ("in_doubt", True),
    ("m-recov", "s-recov"): ("recovered", True),
    ("m-ended", "s-ended"): ("ended_before_delivery", True),
    ("m-false", "s-false"): ("false_accept", True),
    ("m-rej", "s-rej"): ("ok", True),
    ("m-rej", "s-rej2"): ("ok", True),
}


class Run:
    """Shorthands over a LogBook for the scenario above."""

    def __init__(self, book: LogBook) -> None:
        self.b = book

    def router(self, ev: str, ts: float, node: str = "A", inc: str = "a1", **kw: Any) -> None:
        self.b.write("router", node, ev, ts, inc=inc, **kw)

    def life(self, ev: str, sid: str, topic: str, ts: float, node: str = "A", inc: str = "a1",
             router: bool = True) -> None:
        """A lifecycle event as the router logs it and, 10 ms later, the subscriber."""
        if router:
            self.router(ev, ts, node, inc, topic=topic, sub=sid, container=f"c-{sid}", link=sid)
        self.b.write("subscriber", f"c-{sid}", ev, ts + 0.01, inc="s1", topic=topic, sub=sid,
                     container=f"c-{sid}", link=sid)

    def published(self, gid: str, topic: str, ts: float, run: str = "r1") -> None:
        self.b.write("publisher", "P", "published", ts, inc=run, gid=gid, topic=topic, pub="p", link="l",
                     seq=int(ts * 100), size=3)

    def outcome(self, gid: str, topic: str, ts: float, outcome: str = "ACCEPTED", run: str = "r1",
                error: str | None = None) -> None:
        self.b.write("publisher", "P", "outcome", ts, inc=run, gid=gid, topic=topic, pub="p", link="l",
                     seq=int(ts * 100), outcome=outcome, error=error)

    def handed(self, gid: str, sid: str, topic: str, ts: float, inc: str = "s1") -> None:
        self.b.write("subscriber", f"c-{sid}", "handed", ts, inc=inc, gid=gid, topic=topic, sub=sid, link=sid)


def build_scenario(out: Path) -> None:
    with LogBook(out) as book:
        r = Run(book)
        r.router("router_started", 99.0)
        r.router("router_started", 99.0, node="B", inc="b1")
        for sid, topic in [("s-ok", "t-ok"), ("s-gone", "t-ok"), ("s-lost", "t-lost"), ("s-dup", "t-dup"),
                           ("s-unexp", "t-unexp"), ("s-doubt", "t-doubt"), ("s-recov", "t-recov"),
                           ("s-ended", "t-ended"), ("s-false", "t-false"), ("s-rej", "t-rej"),
                           ("s-rej2", "t-rej")]:
            node, inc = ("B", "b1") if sid == "s-gone" else ("A", "a1")
            r.life("subscribed", sid, topic, 100.0, node, inc)
        r.router("subscribed", 100.0, topic="t-ok", sub="s-foreign", container="x", link="x")
        # s-gone: ends, and a new life starts after m-ok's first send
        r.router("suspended", 100.2, node="B", inc="b1", topic="t-ok", sub="s-gone")
        r.life("unsubscribed", "s-gone", "t-ok", 100.5, "B", "b1")
        r.life("subscribed", "s-gone", "t-ok", 101.5, "B", "b1")

        # m-ok: sent by run r1, in doubt for it; run r2 resends and gets the outcome
        r.published("m-ok", "t-ok", 101.0)
        r.router("received", 101.01, gid="m-ok", topic="t-ok", size=3, count=2)
        r.router("delivered", 101.05, gid="m-ok", topic="t-ok", sub="s-ok")
        r.handed("m-ok", "s-ok", "t-ok", 101.1)
        r.router("accepted", 101.15, gid="m-ok", topic="t-ok", sub="s-ok")
        r.router("outcome", 101.2, gid="m-ok", topic="t-ok", outcome="ACCEPTED", count=1)
        r.published("m-ok", "t-ok", 103.0, run="r2")
        r.router("received", 103.01, gid="m-ok", topic="t-ok", size=3, info="merged")
        r.outcome("m-ok", "t-ok", 103.1, run="r2")
        r.router("settled", 103.41, gid="m-ok", topic="t-ok")
        r.life("subscribed", "s-late", "t-ok", 105.0)
        r.handed("m-ok", "s-late", "t-ok", 106.0)

        # m-ok2: to s-ok on A and s-gone (second life) on B, forwarded A -> B
        r.published("m-ok2", "t-ok", 102.0)
        r.router("received", 102.01, gid="m-ok2", topic="t-ok", size=3, count=2)
        r.router("forwarded", 102.02, gid="m-ok2", topic="t-ok", peer="B")
        r.router("forward_received", 102.05, node="B", inc="b1", gid="m-ok2", topic="t-ok", peer="A")
        r.router("delivered", 102.06, node="B", inc="b1", gid="m-ok2", topic="t-ok", sub="s-gone")
        r.handed("m-ok2", "s-ok", "t-ok", 102.1)
        r.handed("m-ok2", "s-gone", "t-ok", 102.16)
        r.outcome("m-ok2", "t-ok", 102.3)
        r.router("settled", 102.41, gid="m-ok2", topic="t-ok")

        r.published("m-lost", "t-lost", 110.0)
        r.outcome("m-lost", "t-lost", 110.3)

        r.published("m-dup", "t-dup", 111.0)
        r.handed("m-dup", "s-dup", "t-dup", 111.1)
        r.handed("m-dup", "s-dup", "t-dup", 111.2, inc="s2")
        r.outcome("m-dup", "t-dup", 111.3)

        r.handed("m-unexp", "s-unexp", "t-unexp", 112.1)

        r.published("m-doubt", "t-doubt", 113.0)
        r.router("received", 113.01, gid="m-doubt", topic="t-doubt", size=3, count=1)
        r.router("router_started", 114.0, inc="a2")  # A crashed holding m-doubt

        r.published("m-recov", "t-recov", 115.0)
        r.router("received", 115.01, inc="a2", gid="m-recov", topic="t-recov", size=3, count=1)
        r.handed("m-recov", "s-recov", "t-recov", 115.1)

        r.published("m-ended", "t-ended", 116.0)
        r.life("unsubscribed", "s-ended", "t-ended", 116.2, inc="a2")
        r.router("ended", 116.21, inc="a2", gid="m-ended", topic="t-ended", sub="s-ended", info="unsubscribed")
        r.outcome("m-ended", "t-ended", 116.3)

        r.published("m-false", "t-false", 117.0)
        r.outcome("m-false", "t-false", 117.1)
        r.handed("m-false", "s-false", "t-false", 117.5)

        r.published("m-rej", "t-rej", 118.0)
        r.router("rejected", 118.05, inc="a2", gid="m-rej", topic="t-rej", sub="s-rej", error="amqp:x: no")
        r.handed("m-rej", "s-rej2", "t-rej", 118.1)
        r.outcome("m-rej", "t-rej", 118.3, outcome="REJECTED",
                  error="oncemesh:subscriber-rejected: rejected by subscription(s) s-rej: amqp:x: no")


def reconcile(spark: SparkSession, files: list[str], since: float | None = None
              ) -> tuple[R.Summary, dict[tuple[str, str], tuple[str, bool]], R.Reconciliation]:
    rec = R.reconcile(R.parse(spark.read.text(files)), since=since, persist=True)
    pairs = {(row["gid"], row["sub"]): (row["class"], row["owed"])
             for row in rec.pairs.select("gid", "sub", "class", "owed").collect()}
    return R.summarize(rec), pairs, rec


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("one-of-each")
    build_scenario(out)
    return out


@pytest.fixture(scope="module")
def full(spark: SparkSession, scenario: Path
         ) -> tuple[R.Summary, dict[tuple[str, str], tuple[str, bool]], R.Reconciliation]:
    return reconcile(spark, sorted(str(p) for p in scenario.glob("*.jsonl")))


def test_every_pair_gets_its_class_and_nothing_else_is_flagged(full: Any) -> None:
    _, pairs, _ = full
    assert pairs == EXPECTED


def test_each_anomaly_is_counted_once(full: Any) -> None:
    summary, _, _ = full
    assert summary.class_counts() == {"ok": 6, "lost": 1, "duplicated": 1, "unexpected": 1, "in_doubt": 1,
                                      "recovered": 1, "ended_before_delivery": 1, "false_accept": 1}
    assert summary.failures == 4 and not summary.passed
    assert (summary.messages, summary.messages_in_doubt, summary.pairs, summary.owed_pairs) == (9, 2, 13, 11)
    assert (summary.subscriptions, summary.unobserved_subscriptions) == (12, 1)
    per_sub = {s.sub: {k: v for k, v in s.counts if v} for s in summary.per_subscription}
    assert per_sub["s-ok"] == {"ok": 2}
    assert per_sub["s-false"] == {"false_accept": 1}
    assert "s-foreign" not in per_sub


def test_summary_dict_names_the_counts(full: Any) -> None:
    d = full[0].to_dict()
    for key in ("ok", "lost", "duplicated", "unexpected", "in_doubt", "recovered", "ended_before_delivery",
                "false_accept", "messages", "pairs", "log_lines", "malformed_lines", "newer_version_lines",
                "per_subscription"):
        assert key in d
    assert d["verdict"] == "fail"
    assert d["log_lines"] == d["valid_lines"] == full[0].log_lines > 0


def test_a_new_subscribe_after_an_end_starts_a_new_life(spark: SparkSession, full: Any) -> None:
    rec: R.Reconciliation = full[2]
    got = rec.lives.where("sub = 's-gone'").select("sub", "life", "start", "end", "end_ev")
    assertDataFrameEqual(got, spark.createDataFrame(
        [("s-gone", 1, 100.0, 100.5, "unsubscribed"), ("s-gone", 2, 101.5, None, None)],
        "sub string, life long, start double, end double, end_ev string"))


def test_unsettled_records_split_by_live_and_dead_incarnation(full: Any) -> None:
    summary: R.Summary = full[0]
    routers = {r.node: r for r in summary.routers}
    a = routers["A"]
    assert (a.incarnations, a.records, a.settled, a.unsettled_live, a.unsettled_dead) == (2, 4, 2, 1, 1)
    assert (summary.unsettled_live, summary.unsettled_dead) == (1, 1)
    assert a.settle.n == 2 and a.settle.max == pytest.approx(2.4)  # m-ok: 101.01 -> 103.41


def test_hop_latencies_are_measured_per_hop(full: Any) -> None:
    lat = {(q.kind, q.name): q for q in full[0].latencies}
    assert lat[("mesh", "A->B")].n == 1
    assert lat[("mesh", "A->B")].p50 == pytest.approx(0.03)
    assert lat[("deliver", "B->subscriber")].p50 == pytest.approx(0.1)
    assert lat[("publish", "publisher->A")].n == 4  # m-ok, m-ok2, m-doubt, m-recov
    e2e = lat[("end_to_end", "publisher->subscriber")]
    assert e2e.n == 8  # every pair handed at least once, except the unexpected one (never published)
    assert e2e.max == pytest.approx(5.0)  # m-ok to s-late


def test_verdict_comes_from_client_logs_alone(spark: SparkSession, scenario: Path) -> None:
    """Router logs may lose lines (SIGKILL): without any of them the pairs are judged the same."""
    clients = sorted(str(p) for p in scenario.glob("*.jsonl") if ".router." not in p.name)
    summary, pairs, _ = reconcile(spark, clients)
    assert pairs == EXPECTED
    assert summary.unobserved_subscriptions == 0 and summary.routers == ()


def test_since_judges_only_messages_first_seen_after_it(spark: SparkSession, scenario: Path) -> None:
    """m-ok straddles T (sent at 101, handed to s-late at 106): it is left out entirely, not judged
    `unexpected` for lack of its first send."""
    summary, pairs, rec = reconcile(spark, sorted(str(p) for p in scenario.glob("*.jsonl")), since=103.05)
    R.unpersist(rec)
    assert pairs == {k: v for k, v in EXPECTED.items() if k[0] not in ("m-ok", "m-ok2")}
    assert summary.ignored_lines > 0


def _pair(**kw: Any) -> dict[str, Any]:
    base = {"handed": 0, "owed": True, "t_pub": 10.0, "outcome": "ACCEPTED", "t_accepted": 11.0,
            "t_handed": None, "life_end": None, "rejected_here": False}
    return {**base, **kw}


PRECEDENCE = [
    # (pair, class): each row names what makes it that class despite the rest
    (_pair(handed=2, t_pub=None, outcome=None), "unexpected"),  # unexpected beats duplicated
    (_pair(handed=2, t_handed=12.0), "duplicated"),  # duplicated beats false_accept
    (_pair(handed=1, t_handed=11.5), "false_accept"),
    (_pair(handed=0, life_end=12.0), "false_accept"),  # ended only after ACCEPTED was told
    (_pair(handed=0, life_end=11.0), "ended_before_delivery"),  # ended at t_acc: fine
    (_pair(handed=1, t_handed=11.5, owed=False), "ok"),  # not owed: the outcome need not wait
    (_pair(handed=1, t_handed=10.5), "ok"),
    (_pair(handed=1, t_handed=10.5, outcome=None, t_accepted=None), "recovered"),
    (_pair(handed=1, t_handed=10.5, outcome="REJECTED", t_accepted=None), "ok"),
    (_pair(handed=0, outcome="REJECTED", t_accepted=None, rejected_here=True), "ok"),
    (_pair(handed=0, outcome="REJECTED", t_accepted=None), "lost"),  # rejected by another: still owed
    (_pair(handed=0, outcome=None, t_accepted=None), "in_doubt"),
    (_pair(handed=0, outcome=None, t_accepted=None, life_end=10.5), "ended_before_delivery"),
    (_pair(handed=0), "lost"),
]


def test_classify_precedence(spark: SparkSession) -> None:
    schema = ("id int, handed long, owed boolean, t_pub double, outcome string, t_accepted double, "
              "t_handed double, life_end double, rejected_here boolean")
    rows = [Row(id=i, **p) for i, (p, _) in enumerate(PRECEDENCE)]
    df = spark.createDataFrame(rows, schema)
    got = df.select("id", R.classify().alias("class"))
    assertDataFrameEqual(got, spark.createDataFrame(
        [(i, c) for i, (_, c) in enumerate(PRECEDENCE)], "id int, class string"))


def test_skew_tolerates_clock_difference(spark: SparkSession) -> None:
    df = spark.createDataFrame([Row(**_pair(handed=1, t_handed=11.2))],
                               "handed long, owed boolean, t_pub double, outcome string, t_accepted double, "
                               "t_handed double, life_end double, rejected_here boolean")
    row0 = df.select(R.classify(0.0).alias("c")).first()
    row1 = df.select(R.classify(0.5).alias("c")).first()
    assert row0 is not None and row1 is not None
    assert (row0["c"], row1["c"]) == ("false_accept", "ok")
