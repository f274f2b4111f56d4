"""The router view's and the agreement's part of a summary: small frozen records, and the actions
that collect them from the frames of `routerview` (the step that brings data to the driver)."""

from __future__ import annotations

from dataclasses import dataclass
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


def collect_router_view(events: DataFrame, pairs: DataFrame, msgs: DataFrame) -> RouterView:
    """Run the actions that summarize the router view (small results: one row per class, reason,
    router, gap)."""
    by_class = {r["class"]: int(r["n"]) for r in pairs.groupBy("class").agg(F.count(F.lit(1)).alias("n")).collect()}
    by_reason = {r["reason"]: int(r["n"]) for r in pairs.where(F.col("reason").isNotNull())
                 .groupBy("reason").agg(F.count(F.lit(1)).alias("n")).collect()}
    m = msgs.agg(F.count(F.lit(1)).alias("n"),
                 F.sum(F.coalesce(F.col("has_owed"), F.lit(False)).cast("long")).alias("owed")).first()
    nodes = tuple(
        RouterNode(r["node"], int(r["incarnations"]), int(r["events"]), int(r["origin_messages"]),
                   int(r["origin_pairs"]), int(r["home_pairs"]), int(r["judged_pairs"]), int(r["unjudged_pairs"]),
                   tuple(r["reasons"] or ()))
        for r in sorted(RV.per_router(events, pairs, msgs).collect(), key=lambda x: x["node"] or ""))
    gone = tuple(sorted(r["node"] for r in RV.missing_routers(events).collect()))
    gaps = tuple(sorted((r["node"], r["inc"], r["reason"]) for r in RV.incarnation_gaps(events).collect()))
    return RouterView(counts=tuple((c, by_class.get(c, 0)) for c in RV.CLASSES), pairs=sum(by_class.values()),
                      unjudged=by_class.get(RV.UNJUDGED, 0),
                      reasons=tuple((r, by_reason.get(r, 0)) for r in RV.REASONS),
                      messages=int(m["n"] if m else 0), messages_with_owed_set=int((m["owed"] or 0) if m else 0),
                      per_router=nodes, missing_routers=gone, partial_incarnations=gaps)


def collect_agreement(disagreements: DataFrame) -> Agreement:
    row = disagreements.agg(F.count(F.lit(1)).alias("n"),
                            F.sum(F.col("why").isNotNull().cast("long")).alias("bad")).first()
    examples = tuple(r.asDict() for r in disagreements.where(F.col("why").isNotNull())
                     .orderBy("gid", "sub").limit(EXAMPLES).collect())
    return Agreement(int(row["n"] if row else 0), int((row["bad"] or 0) if row else 0), examples)


def evidence_counts(router_pairs: DataFrame, client_pairs: DataFrame) -> tuple[int, int]:
    """(pairs judged by at least one view, pairs judged by neither)."""
    judged_r = router_pairs.where(F.col("class") != RV.UNJUDGED).select("gid", "sub")
    unjudged_r = router_pairs.where(F.col("class") == RV.UNJUDGED).select("gid", "sub")
    c = client_pairs.select("gid", "sub")
    judged = judged_r.unionByName(c).distinct().count()
    neither = unjudged_r.join(c, ["gid", "sub"], "left_anti").count()
    return int(judged), int(neither)
