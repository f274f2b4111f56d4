"""The router view's and the agreement's part of a summary: small frozen records, the frames that
summarize them, and `collect_pieces`, the one action that brings every small result of a
summary to the driver at once (the step that brings data to the driver)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from . import routerview as RV

EXAMPLES = 20  # disagreements kept as examples


@dataclass(frozen=True, slots=True)
class RouterNode:
    """What the router view judged of one router (docs/reconcile.md, `router_view.per_router`)."""

    node: str
    incarnations: int = 0
    events: int = 0
    origin_messages: int = 0
    origin_pairs: int = 0
    home_pairs: int = 0
    judged_pairs: int = 0
    unjudged_pairs: int = 0
    reasons: tuple[str, ...] = ()

    @property
    def partial(self) -> bool:
        return bool(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "incarnations": self.incarnations, "events": self.events,
                "origin_messages": self.origin_messages, "origin_pairs": self.origin_pairs,
                "home_pairs": self.home_pairs, "judged_pairs": self.judged_pairs,
                "unjudged_pairs": self.unjudged_pairs, "partial": self.partial, "reasons": list(self.reasons)}


@dataclass(frozen=True, slots=True)
class RouterView:
    """The verdict from the routers' logs alone."""

    counts: tuple[tuple[str, int], ...] = tuple((c, 0) for c in RV.CLASSES)
    pairs: int = 0
    unjudged: int = 0
    reasons: tuple[tuple[str, int], ...] = tuple((r, 0) for r in RV.REASONS)
    messages: int = 0  # messages a router logged
    messages_with_owed_set: int = 0
    per_router: tuple[RouterNode, ...] = ()
    missing_routers: tuple[str, ...] = ()
    partial_incarnations: tuple[tuple[str, str, str], ...] = ()  # (node, inc, reason)

    @property
    def judged(self) -> int:
        return self.pairs - self.unjudged

    @property
    def failures(self) -> int:
        c = dict(self.counts)
        return sum(c[k] for k in RV.FAILURES)

    def count(self, cls: str) -> int:
        return dict(self.counts)[cls]

    def to_dict(self) -> dict[str, Any]:
        return {"pairs": self.pairs, "judged": self.judged, "unjudged": self.unjudged, **dict(self.counts),
                "failures": self.failures, "unjudged_reasons": dict(self.reasons), "messages": self.messages,
                "messages_with_owed_set": self.messages_with_owed_set,
                "per_router": [n.to_dict() for n in self.per_router],
                "missing_routers": list(self.missing_routers),
                "partial_incarnations": [{"node": n, "inc": i, "reason": r} for n, i, r in self.partial_incarnations]}


@dataclass(frozen=True, slots=True)
class Agreement:
    """Where both views judged a pair: how many, how many disagree, a few examples."""

    compared: int = 0
    disagreements: int = 0
    examples: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"compared": self.compared, "disagreements": self.disagreements, "examples": list(self.examples)}


# ================================================================ one action for every small result
Pieces = list[tuple[str, DataFrame]]
Rows = dict[str, list[dict[str, Any]]]


def collect_pieces(pieces: Sequence[tuple[str, DataFrame]]) -> Rows:
    """Every small result of a summary in one action: each frame's rows become (kind, JSON text)
    rows, the frames one union, and that union is collected once (one Spark job, where one action
    per result made dozens). Returns kind -> its rows as dicts (nulls kept as None)."""
    frames = [df.select(F.lit(kind).alias("kind"),
                        F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns]),
                                  {"ignoreNullFields": "false"}).alias("row"))
              for kind, df in pieces]
    out: Rows = {kind: [] for kind, _ in pieces}
    if not frames:
        return out
    union = reduce(DataFrame.unionByName, frames)
    if one_partition(union):
        # one task for all the pieces: a union's task deserializes the whole stage (every piece's
        # plan), so one task per piece paid that once per piece (the demo's logs: 20 tasks, 6 s)
        union = union.coalesce(1)
    for r in union.collect():
        out[r["kind"]].append(json.loads(r["row"]))
    return out


def one_partition(df: DataFrame) -> bool:
    """The session plans one shuffle partition (a short run, `job.SHORT_RUN`): every kept frame is
    one partition (`reconcile.keep`), and a small result is best computed in one task."""
    return df.sparkSession.conf.get("spark.sql.shuffle.partitions") == "1"


def one(rows: Rows, kind: str) -> dict[str, Any]:
    """The single row of a global aggregate (an empty dict when there is none)."""
    got = rows.get(kind) or [{}]
    return got[0]


def router_view_pieces(events: DataFrame, pairs: DataFrame, msgs: DataFrame) -> Pieces:
    """The frames that summarize the router view (small: one row per class, reason, router, gap)."""
    return [
        ("rv_class", pairs.groupBy("class").agg(F.count(F.lit(1)).alias("n"))),
        ("rv_reason", pairs.where(F.col("reason").isNotNull()).groupBy("reason").agg(F.count(F.lit(1)).alias("n"))),
        ("rv_msgs", msgs.agg(F.count(F.lit(1)).alias("n"),
                             F.sum(F.coalesce(F.col("has_owed"), F.lit(False)).cast("long")).alias("owed"))),
        ("rv_router", RV.per_router(events, pairs, msgs)),
        ("rv_missing", RV.missing_routers(events)),
        ("rv_gap", RV.incarnation_gaps(events)),
    ]


def router_view_from(rows: Rows) -> RouterView:
    by_class = {r["class"]: int(r["n"]) for r in rows["rv_class"]}
    by_reason = {r["reason"]: int(r["n"]) for r in rows["rv_reason"]}
    m = one(rows, "rv_msgs")
    nodes = tuple(
        RouterNode(r["node"], int(r["incarnations"]), int(r["events"]), int(r["origin_messages"]),
                   int(r["origin_pairs"]), int(r["home_pairs"]), int(r["judged_pairs"]), int(r["unjudged_pairs"]),
                   tuple(r["reasons"] or ()))
        for r in sorted(rows["rv_router"], key=lambda x: x["node"] or ""))
    gone = tuple(sorted(r["node"] for r in rows["rv_missing"]))
    gaps = tuple(sorted((r["node"], r["inc"], r["reason"]) for r in rows["rv_gap"]))
    return RouterView(counts=tuple((c, by_class.get(c, 0)) for c in RV.CLASSES), pairs=sum(by_class.values()),
                      unjudged=by_class.get(RV.UNJUDGED, 0),
                      reasons=tuple((r, by_reason.get(r, 0)) for r in RV.REASONS),
                      messages=int(m.get("n") or 0), messages_with_owed_set=int(m.get("owed") or 0),
                      per_router=nodes, missing_routers=gone, partial_incarnations=gaps)


def collect_router_view(events: DataFrame, pairs: DataFrame, msgs: DataFrame) -> RouterView:
    """The router view's summary, in one action (`collect_pieces`)."""
    return router_view_from(collect_pieces(router_view_pieces(events, pairs, msgs)))


def agreement_pieces(disagreements: DataFrame) -> Pieces:
    return [("agree", disagreements.agg(F.count(F.lit(1)).alias("n"),
                                        F.sum(F.col("why").isNotNull().cast("long")).alias("bad"))),
            ("agree_examples", disagreements.where(F.col("why").isNotNull()).orderBy("gid", "sub").limit(EXAMPLES))]


def agreement_from(rows: Rows) -> Agreement:
    row = one(rows, "agree")
    examples = tuple(sorted(rows["agree_examples"], key=lambda r: (r["gid"], r["sub"])))
    return Agreement(int(row.get("n") or 0), int(row.get("bad") or 0), examples)


def collect_agreement(disagreements: DataFrame) -> Agreement:
    return agreement_from(collect_pieces(agreement_pieces(disagreements)))


def evidence_pieces(router_pairs: DataFrame, client_pairs: DataFrame) -> Pieces:
    """(pairs judged by at least one view, pairs judged by neither), as one row."""
    judged_r = router_pairs.where(F.col("class") != RV.UNJUDGED).select("gid", "sub")
    unjudged_r = router_pairs.where(F.col("class") == RV.UNJUDGED).select("gid", "sub")
    c = client_pairs.select("gid", "sub")
    judged = judged_r.unionByName(c).distinct().agg(F.count(F.lit(1)).alias("n"))
    neither = unjudged_r.join(c, ["gid", "sub"], "left_anti").agg(F.count(F.lit(1)).alias("n"))
    return [("evidence_judged", judged), ("evidence_neither", neither)]


def evidence_from(rows: Rows) -> tuple[int, int]:
    return int(one(rows, "evidence_judged").get("n") or 0), int(one(rows, "evidence_neither").get("n") or 0)


def evidence_counts(router_pairs: DataFrame, client_pairs: DataFrame) -> tuple[int, int]:
    """(pairs judged by at least one view, pairs judged by neither)."""
    return evidence_from(collect_pieces(evidence_pieces(router_pairs, client_pairs)))
