"""The router view: every (message, subscription) pair judged from the routers' logs alone, for any
client. Pure DataFrame -> DataFrame functions, no I/O; `reconcile` (batch) and `audit` (streaming)
both use these, and no other copy of the rules exists.

Theory of operation. A router writes its log lines before anyone learns of what they say
(write-ahead, docs/settlement-log.md), so its log is complete up to the last thing it told
anyone, even after a SIGKILL. The judge builds:

1. `owed_set`: the origins' owed sets (v2 `received` / `owed` lines name every subscription a
   record was owed to, with its home router then). `message_facts`: per message, when an origin
   first received it, whether an owed set exists, and the earliest final outcome an origin decided
   (ACCEPTED at `t_told`, or REJECTED).
2. `pair_evidence`: per (message, subscription), from the home routers' lines: dispositions
   (`accepted` without info: a disposition on a link), the first acceptance (a disposition, or the
   client presenting it on resume: `resume`, `placeholder`), rejections, ends, every `delivered`
   time; and the origins' echoes (`info = remote`: the origin heard the home's acknowledgement).
3. `in_force`: subscriptions the routers' lifecycle lines show in force when the message first came
   in (a `subscribed` line is written when the ATTACH is answered, after every router had the
   subscription in its table: an origin that received the message later owed it).
4. `evidence_state`: routers named (owed homes, peers) without a line of their own, and incarnations
   whose log is cut short (a segment missing, a closed segment without its trailer).
5. `router_pairs`: the union of owed, in-force and delivered-to pairs with their evidence, and
   `classify` (the rules below, first match wins; `unjudged` says why a pair cannot be judged).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from . import schema as S
from .topicmatch import join_by_filter

# The router view's classes, in summary order; those that fail a run; why a pair is not judged.
CLASSES = ("ok", "lost", "duplicated", "false_accept", "unexpected", "unresolved", "ended", "redelivered")
FAILURES = ("lost", "duplicated", "false_accept", "unexpected")
UNJUDGED = "unjudged"
REASONS = ("no_owed_set", "missing_log", "partial_log", "evidence_gap")
RESOLVING = ("accepted", "rejected", "ended")
REMOTE = "remote"  # info of an origin's echo of a home router's resolution
MEMBER = "member="  # info of a shared subscription's member's disposition (router/groups.py): one too

PAIR_COLUMNS = ("gid", "sub", "topic", "class", "reason", "owed", "in_force", "home", "origin", "t_recv",
                "t_told", "outcome", "t_acc", "t_rej", "t_end", "dispositions", "deliveries",
                "delivered_after", "echoes", "delivered_by")


def _c(name: str) -> Column:
    return F.col(name)


def _router(events: DataFrame) -> DataFrame:
    return events.where(_c("src") == S.ROUTER)


def _not_echo() -> Column:
    return _c("info").isNull() | (_c("info") != REMOTE)


# ================================================================ 1. messages and owed sets
def owed_set(events: DataFrame) -> DataFrame:
    """(gid, sub, home, origin, t_owed): one row per subscription named in an origin's owed set
    (home null when the origin did not know it yet)."""
    lines = _router(events).where(_c("ev").isin("received", "owed") & _c("owed").isNotNull()
                                  & _c("gid").isNotNull())
    per_home = lines.select("gid", _c("node").alias("origin"), _c("ts").alias("t_owed"),
                            F.explode("owed").alias("home", "sids"))
    return (per_home.select("gid", F.explode(F.split("sids", " ")).alias("sub"),
                            F.when(_c("home") != "", _c("home")).alias("home"), "origin", "t_owed")
            .where(_c("sub") != ""))


def message_facts(events: DataFrame) -> DataFrame:
    """One row per message a router logged: gid, topic, t_recv (the first record an origin made
    of it), origins (routers that made one), origin (the first), has_owed (some origin logged whom
    it was owed to), t_told (the first ACCEPTED an origin decided), t_rejected (the first REJECTED),
    outcome (ACCEPTED if any origin decided so, else REJECTED, else null)."""
    ev = _c("ev")
    new = (ev == "received") & (_c("info").isNull() | (_c("info") != "merged"))
    acc = (ev == "outcome") & (_c("outcome") == "ACCEPTED")
    rej = (ev == "outcome") & (_c("outcome") == "REJECTED")
    agg = (_router(events).where(_c("gid").isNotNull() & ev.isin("received", "owed", "outcome"))
           .groupBy("gid")
           .agg(F.first(F.when(ev == "received", _c("topic")), ignorenulls=True).alias("topic"),
                F.min(F.when(new, _c("ts"))).alias("t_recv"),
                F.array_sort(F.collect_set(F.when(new, _c("node")))).alias("origins"),
                F.min_by(F.when(new, _c("node")), F.when(new, _c("ts"))).alias("origin"),
                F.max(_c("owed").isNotNull() & ev.isin("received", "owed")).alias("has_owed"),
                F.min(F.when(acc, _c("ts"))).alias("t_told"),
                F.min(F.when(rej, _c("ts"))).alias("t_rejected")))
    return agg.withColumn("outcome", F.when(_c("t_told").isNotNull(), "ACCEPTED")
                          .when(_c("t_rejected").isNotNull(), "REJECTED"))


# ================================================================ 2. what the homes say
def pair_evidence(events: DataFrame) -> DataFrame:
    """Per (gid, sub) a router logged something for: dispositions (`accepted` without info, or a
    shared subscription member's, `member=...`),
    t_acc (the first acceptance: a disposition, or presented on resume), t_rej, t_end (the first
    rejection, end), dl (every `delivered` time; dls with the node and incarnation that delivered),
    acc_at (the node and incarnation of the first acceptance), delivered_by (the first router that delivered),
    echoes (the origins' `remote` echoes of a resolution), echo_ts (their times)."""
    ev = _c("ev")
    own = _not_echo()
    lines = _router(events).where(_c("gid").isNotNull() & _c("sub").isNotNull()
                                  & ev.isin("delivered", *RESOLVING))
    is_dl = ev == "delivered"
    return (lines.groupBy("gid", "sub")
            .agg(F.sum(((ev == "accepted") & (_c("info").isNull() | _c("info").startswith(MEMBER))).cast("long"))
                 .alias("dispositions"),
                 F.min(F.when((ev == "accepted") & own, _c("ts"))).alias("t_acc"),
                 F.min(F.when((ev == "rejected") & own, _c("ts"))).alias("t_rej"),
                 F.min(F.when((ev == "ended") & own, _c("ts"))).alias("t_end"),
                 F.collect_list(F.when(is_dl, F.struct(_c("ts").alias("ts"), _c("node").alias("node"),
                                                       _c("inc").alias("inc")))).alias("dls"),
                 F.min_by(F.when((ev == "accepted") & own, F.struct(_c("node").alias("node"), _c("inc").alias("inc"))),
                          F.when((ev == "accepted") & own, _c("ts"))).alias("acc_at"),
                 F.min_by(F.when(is_dl, _c("node")), F.when(is_dl, _c("ts"))).alias("delivered_by"),
                 F.collect_list(F.when(ev.isin(*RESOLVING) & ~own, _c("ts"))).alias("echo_ts"),
                 F.first(F.when(ev.isin(*RESOLVING) & own, _c("node")), ignorenulls=True).alias("resolved_at"))
            .withColumn("dl", F.transform("dls", lambda d: d["ts"]))
            .withColumn("echoes", F.size("echo_ts").cast("long")))


def in_force(msgs: DataFrame, router_lives: DataFrame, skew: float = 0.0) -> DataFrame:
    """(gid, sub): subscriptions whose life (from the routers' lifecycle lines: `lives` of the
    router lines; its filter matching the message's topic, spark/topicmatch.py; not one with a
    selector, whose pairs are the owed sets') had begun before the message first came to an origin (by more than `skew`) and
    had not ended by then."""
    lv = router_lives.where(~_c("selective")).select("sub", "topic", _c("start").alias("life_start"),
                                                     _c("end").alias("life_end"))
    return (join_by_filter(msgs.where(_c("t_recv").isNotNull()).select("gid", "topic", "t_recv"), lv)
            .where((_c("life_start") + F.lit(skew) < _c("t_recv"))
                   & (_c("life_end").isNull() | (_c("life_end") > _c("t_recv"))))
            .select("gid", "sub").distinct())


# ================================================================ 4. is the evidence whole?
def incarnation_facts(events: DataFrame) -> DataFrame:
    """node, inc, first_ts, last_ts, stopped (1 if it logged `router_stopped`: a clean stop, else
    0), started (its `router_started` time): one row per router incarnation."""
    ev = _c("ev")
    return (_router(events).groupBy("node", "inc")
            .agg(F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts"),
                 F.max((ev == "router_stopped").cast("int")).alias("stopped"),
                 F.min(F.when(ev == "router_started", _c("ts"))).alias("started")))


def incarnation_gaps(events: DataFrame) -> DataFrame:
    """Incarnations whose log is cut short: node, inc, reason. A segment number missing (deleted
    or lost), a closed segment without its trailer (cut), or the last one without it although the
    incarnation stopped cleanly. The last segment of a killed incarnation has no trailer: that is
    not a gap (write-ahead: it says everything the router told anyone)."""
    ev = _c("ev")
    per = (_router(events).where(ev.isin("segment_opened", "segment_closed", "router_stopped"))
           .groupBy("node", "inc")
           .agg(F.array_sort(F.collect_set(F.when(ev == "segment_opened", _c("seg")))).alias("opened"),
                F.collect_set(F.when(ev == "segment_closed", _c("seg"))).alias("closed"),
                F.max(ev == "router_stopped").alias("stopped"))
           .where(F.size("opened") > 0))
    top = F.array_max("opened")
    missing = F.array_except(F.sequence(F.lit(1).cast("long"), top), _c("opened"))
    unclosed = F.array_except(_c("opened"), _c("closed"))
    cut = F.when(_c("stopped"), unclosed).otherwise(F.array_remove(unclosed, top))
    gaps = per.select("node", "inc", missing.alias("missing"), cut.alias("cut"))
    return (gaps.select("node", "inc", F.explode(F.concat(
        F.transform("missing", lambda n: F.concat(F.lit("segment "), n.cast("string"), F.lit(" missing"))),
        F.transform("cut", lambda n: F.concat(F.lit("segment "), n.cast("string"), F.lit(" not closed")))))
        .alias("reason")))


def named_routers(events: DataFrame) -> DataFrame:
    """node: every router a router's line names (owed homes, forwarding peers, mesh peers)."""
    r = _router(events)
    homes = r.where(_c("owed").isNotNull()).select(F.explode(F.map_keys("owed")).alias("node"))
    peers = (r.where(_c("peer").isNotNull())
             .select(F.explode(F.split("peer", ",")).alias("node")))
    return homes.unionByName(peers).where(_c("node").isNotNull() & (_c("node") != "")).distinct()


def missing_routers(events: DataFrame) -> DataFrame:
    """node: routers named by another router's lines that left no line of their own."""
    present = _router(events).select("node").distinct()
    return named_routers(events).join(present, "node", "left_anti")


# ================================================================ 5. pairs and their classes
def router_pairs(events: DataFrame, router_lives: DataFrame, skew: float = 0.0,
                 msgs: DataFrame | None = None) -> DataFrame:
    """Every pair of the router view with its evidence and class (PAIR_COLUMNS). Pairs: owed by
    an origin, in force by the lifecycle lines, or delivered/resolved by a router."""
    msgs = message_facts(events) if msgs is None else msgs
    owed = (owed_set(events).groupBy("gid", "sub")
            .agg(F.first("home", ignorenulls=True).alias("owed_home"), F.min_by("origin", "t_owed").alias("owed_by"))
            .withColumn("owed", F.lit(True)))
    forced = in_force(msgs, router_lives, skew).withColumn("in_force", F.lit(True))
    ev = pair_evidence(events)
    keys = (owed.select("gid", "sub").unionByName(forced.select("gid", "sub"))
            .unionByName(ev.select("gid", "sub")).distinct())
    p = (keys.join(owed, ["gid", "sub"], "left").join(forced, ["gid", "sub"], "left")
         .join(ev, ["gid", "sub"], "left").join(msgs, "gid", "left"))
    gone = missing_routers(events).select(_c("node").alias("home"), F.lit(True).alias("home_missing"))
    cut_nodes = incarnation_gaps(events).select("node").distinct()
    home = F.coalesce(_c("owed_home"), _c("resolved_at"), _c("delivered_by"))
    p = (p.withColumn("home", home).withColumn("origin", F.coalesce(_c("owed_by"), _c("origin")))
         .join(gone, "home", "left")
         .join(cut_nodes.select(_c("node").alias("home"), F.lit(True).alias("home_cut")), "home", "left")
         .join(cut_nodes.select(_c("node").alias("origin"), F.lit(True).alias("origin_cut")),
               "origin", "left"))
    t_acc = _c("t_acc")
    after = F.size(F.filter("dl", lambda t: t > t_acc + F.lit(skew)))
    p = p.withColumn("delivered_after", F.when(t_acc.isNotNull(), after).otherwise(F.lit(0)))
    # a hand-over again after the acceptance, by another router or a later life only, once the life
    # that took the acceptance had crashed (no clean stop) with no other router told of it: the
    # acceptance died with that router, as if lost on the wire (promise 1: redelivered under the
    # same id to a client that reattaches, which deduplicates by it)
    lives = incarnation_facts(events).select(_c("node").alias("acc_node"), _c("inc").alias("acc_inc"),
                                             _c("last_ts").alias("life_end"), _c("stopped").alias("life_stopped"))
    p = p.join(lives,
               (_c("acc_at.node") == _c("acc_node")) & (_c("acc_at.inc") == _c("acc_inc")), "left")
    later = F.filter("dls", lambda d: d["ts"] > t_acc + F.lit(skew))
    elsewhere = F.forall(later, lambda d: (d["node"] != _c("acc_at.node")) | (d["inc"] != _c("acc_at.inc")))
    first_later = F.array_min(F.transform(later, lambda d: d["ts"]))
    # an origin's echo before the hand-over again: some router was told of the first acceptance (an
    # echo after it is of the acceptance that followed the hand-over again)
    told_before = F.filter(F.coalesce(_c("echo_ts"), F.array()), lambda t: t <= first_later + F.lit(skew))
    p = p.withColumn("in_doubt_again", F.coalesce(
        (_c("delivered_after") > 0) & elsewhere & (_c("life_stopped") == 0)
        & (_c("life_end") <= first_later + F.lit(skew)) & (F.size(told_before) == 0)
        & (F.coalesce(_c("dispositions"), F.lit(0)) <= 1 + _c("delivered_after")), F.lit(False)))
    cls = classify(skew)
    return p.select(
        "gid", "sub", "topic", cls.alias("class"), unjudged_reason().alias("reason"),
        F.coalesce(_c("owed"), F.lit(False)).alias("owed"), F.coalesce(_c("in_force"), F.lit(False)).alias("in_force"),
        "home", "origin", "t_recv", "t_told", "outcome", "t_acc", "t_rej", "t_end",
        F.coalesce(_c("dispositions"), F.lit(0)).alias("dispositions"),
        F.coalesce(F.size("dl"), F.lit(0)).alias("deliveries"), "delivered_after",
        F.coalesce(_c("echoes"), F.lit(0)).alias("echoes"), "delivered_by")


def unjudged_reason() -> Column:
    """Why a pair cannot be judged (null: it can), first match wins: the message has no owed set;
    its home router left no log; the home's or the origin's log is cut short; an origin echoed a
    resolution that no home's log shows."""
    resolved_here = _c("t_acc").isNotNull() | _c("t_rej").isNotNull() | _c("t_end").isNotNull()
    return (F.when(~F.coalesce(_c("has_owed"), F.lit(False)), "no_owed_set")
            .when(F.coalesce(_c("home_missing"), F.lit(False)), "missing_log")
            .when(F.coalesce(_c("home_cut"), F.lit(False)) | F.coalesce(_c("origin_cut"), F.lit(False)), "partial_log")
            .when((F.coalesce(_c("echoes"), F.lit(0)) > 0) & ~resolved_here, "evidence_gap"))


def classify(skew: float = 0.0) -> Column:
    """The class of a pair, first match wins (docs/reconcile.md, "Router-view classes"):

    0. unjudged      see `unjudged_reason`
    1. unexpected    delivered, accepted on a link or rejected, yet neither owed by an origin
                     nor in force
    2. redelivered   delivered again after it was accepted, but only by another router or a later
                     life, after the life that took the acceptance crashed before telling anyone:
                     in doubt (promise 1), the client deduplicates by id; not a failure
       duplicated    two dispositions, or delivered again after it was accepted
    3. false_accept  an origin decided ACCEPTED at t_told; the pair resolved only after it
    4. ok            accepted, or rejected by this subscription
    5. ended         its subscription ended before it resolved (and before the outcome)
    6. unresolved    not resolved, no final outcome decided
    7. lost          not resolved, not ended, a final outcome decided
    """
    owed = F.coalesce(_c("owed"), F.lit(False)) | F.coalesce(_c("in_force"), F.lit(False))
    acc, rej, end = _c("t_acc").isNotNull(), _c("t_rej").isNotNull(), _c("t_end").isNotNull()
    # handed (or answered) by a router: a client presenting an id on resume is no hand-over
    touched = (F.coalesce(F.size("dl"), F.lit(0)) > 0) | (F.coalesce(_c("dispositions"), F.lit(0)) > 0) | rej
    t_res = F.least(_c("t_acc"), _c("t_rej"), _c("t_end"))
    false_accept = F.coalesce(_c("t_told").isNotNull() & t_res.isNotNull() & (t_res > _c("t_told") + F.lit(skew)),
                              F.lit(False))
    return (F.when(unjudged_reason().isNotNull(), UNJUDGED)
            .when(~owed & touched, "unexpected")
            .when(_c("in_doubt_again") & ~false_accept, "redelivered")
            .when(~_c("in_doubt_again")
                  & ((F.coalesce(_c("dispositions"), F.lit(0)) > 1) | (_c("delivered_after") > 0)), "duplicated")
            .when(false_accept, "false_accept")
            .when(acc | rej, "ok")
            .when(end, "ended")
            .when(_c("outcome").isNull(), "unresolved")
            .otherwise("lost"))


# ================================================================ per router, agreement
def per_router(events: DataFrame, pairs: DataFrame, msgs: DataFrame) -> DataFrame:
    """One row per router seen or named: node, incarnations, events, origin_messages, origin_pairs,
    home_pairs, judged_pairs, unjudged_pairs (of its home pairs), reasons (array)."""
    r = _router(events)
    seen = r.groupBy("node").agg(F.countDistinct("inc").alias("incarnations"),
                                 F.count(F.lit(1)).alias("events"))
    nodes = seen.select("node").unionByName(named_routers(events)).distinct()
    origin_msgs = (msgs.select(F.explode("origins").alias("node"), "gid").groupBy("node")
                   .agg(F.countDistinct("gid").alias("origin_messages")))
    origin_pairs = pairs.where(_c("origin").isNotNull()).groupBy(_c("origin").alias("node")).agg(
        F.count(F.lit(1)).alias("origin_pairs"))
    judged = _c("class") != UNJUDGED
    home = pairs.where(_c("home").isNotNull()).groupBy(_c("home").alias("node")).agg(
        F.count(F.lit(1)).alias("home_pairs"), F.sum(judged.cast("long")).alias("judged_pairs"),
        F.sum((~judged).cast("long")).alias("unjudged_pairs"),
        F.collect_set(_c("reason")).alias("pair_reasons"))
    gaps = incarnation_gaps(events).groupBy("node").agg(
        F.collect_list(F.concat(F.lit("partial_log: incarnation "), _c("inc"), F.lit(": "), _c("reason"))).alias("gaps"))
    gone = missing_routers(events).select("node", F.lit(True).alias("missing"))
    out = (nodes.join(seen, "node", "left").join(origin_msgs, "node", "left").join(origin_pairs, "node", "left")
           .join(home, "node", "left").join(gaps, "node", "left").join(gone, "node", "left"))
    reasons = F.concat(
        F.when(_c("missing"), F.array(F.lit("missing_log"))).otherwise(F.array().cast("array<string>")),
        F.coalesce(_c("gaps"), F.array().cast("array<string>")),
        F.when(F.array_contains(F.coalesce(_c("pair_reasons"), F.array().cast("array<string>")), "evidence_gap"),
               F.array(F.lit("evidence_gap"))).otherwise(F.array().cast("array<string>")))
    return out.select("node", *[F.coalesce(_c(c), F.lit(0)).alias(c) for c in (
        "incarnations", "events", "origin_messages", "origin_pairs", "home_pairs", "judged_pairs",
        "unjudged_pairs")], reasons.alias("reasons"))


def disagreements(router: DataFrame, client: DataFrame) -> DataFrame:
    """Pairs both views judged, and whether they disagree: gid, sub, router_class, client_class,
    why (null: they agree). They disagree when a router logged an acceptance the application was
    never handed (our subscriber logs `handed` before it accepts), or the application was handed a
    message the router view calls lost."""
    c = client.select("gid", "sub", _c("class").alias("client_class"), _c("handed").alias("c_handed"))
    r = router.where(_c("class") != UNJUDGED).select("gid", "sub", _c("class").alias("router_class"), "t_acc")
    why = (F.when(_c("t_acc").isNotNull() & (_c("c_handed") == 0), "accepted at a router, never handed to the application")
           .when((_c("c_handed") > 0) & (_c("router_class") == "lost"), "handed to the application, lost in the router view"))
    return r.join(c, ["gid", "sub"]).select("gid", "sub", "router_class", "client_class", why.alias("why"))
