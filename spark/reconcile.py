"""Network-wide reconciliation of settlement logs: pure DataFrame -> DataFrame functions, no I/O.

Theory of operation. The verdict comes from the client logs, which are exact: publishers say what they
sent first (`published`) and what they were told (`outcome`), subscribers what they handed to the
application (`handed`). Router logs may lose their last lines on SIGKILL, so they only add
subscription lifecycle (which can only make a life start earlier or end, never invent one), explicit
rejections, per-hop latency and records left unsettled.

1. `parse` (text lines) or `with_status` (lines the JSON reader parsed) give typed columns plus a
   `status` (ok, malformed, newer, unknown_event, blank); only `ok` lines are used, the others are
   counted.
2. `lives` rebuilds each subscription's lives from its lifecycle lines (router and subscriber).
3. `messages` folds the publisher lines per global id (first send, final outcome, first ACCEPTED).
   Each aggregation is one pass over the lines of one key (gid; gid and sub; router, incarnation and
   gid) with conditional aggregates, rather than one pass per event and joins.
4. `pairs` builds every (message, subscription) pair that was owed (the subscription's life had
   begun at or before the first send and had not ended) or handed, and `classify` gives each pair
   exactly one class (precedence in `classify`; docs/settlement-log.md says why).
   `handed_order`, `fifo_order`, `subscription_pair_order` and `causal_order` check order
   (reported, not judged): per-publisher reversals and gaps, pairs of subscriptions handed messages
   in opposite orders, and messages handed before a message their publisher had been handed.
5. `router_records`, `router_stats`, `hop_latencies`, `latency_quantiles` measure the routers.
6. `summarize` collects the counts into a `Summary` (the step that brings data to the driver; also
   `anomaly_span`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from ..common.vocab import SELECTIVE
from . import routerview as RV
from . import schema as S
from . import verdict as V
from .topicmatch import join_by_filter
from .verdict import Agreement, RouterView

# Line statuses.
OK, MALFORMED, NEWER, UNKNOWN_EVENT, BLANK = "ok", "malformed", "newer", "unknown_event", "blank"

QUANTILES = (0.5, 0.99, 0.999)
# Quantiles kept per hop to draw its distribution (a CDF): dense enough to show the tail.
CURVE: tuple[float, ...] = tuple([i / 100 for i in range(1, 100)] + [0.995, 0.999, 0.9999])
PERCENTILE_ACCURACY = 10_000


def _c(name: str) -> Column:
    return F.col(name)


# ================================================================ 1. lines
def parse(text: DataFrame) -> DataFrame:
    """Lines (a `value` string column, as from `spark.read.text`, and optionally `file`, the file
    each came from: v2 lines take their writer from their file's header; without `file` all lines
    are one file) -> one row per event (a v2 line with grouped ids is one event per id), one column
    per schema field and `status` (see `with_status`). Blank lines get status `blank`."""
    if "file" not in text.columns:
        text = text.withColumn("file", F.lit(""))
    j = F.from_json(_c("value"), S.PARSE_SCHEMA,
                    {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": S.CORRUPT})
    # through a generator, so that the optimizer cannot inline from_json into every field reference
    # (which would parse each line once per column)
    rows = text.select(F.inline(F.array(F.struct(_c("file"), (F.trim(_c("value")) == "").alias("blank"),
                                                 j.alias("j")))))
    return with_status(rows.select("file", "blank", "j.*"), headers(text))


def headers(text: DataFrame) -> DataFrame:
    """The v2 header lines of `text` (`value`, `file`), one row per file: file, h_n (headers in
    it: more than one makes its v2 lines unreadable), h_v, h_t0, h_src, h_node, h_inc. Only lines
    that can be headers are parsed (a text filter first: cheap next to parsing every line)."""
    if "file" not in text.columns:
        text = text.withColumn("file", F.lit(""))
    j = F.from_json(_c("value"), S.PARSE_SCHEMA, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": S.CORRUPT})
    h = (text.where(_c("value").contains('"h":'))
         .select("file", F.inline(F.array(F.struct(j.alias("j")))))
         .where(_c("j.h").isNotNull() & _c(f"j.{S.CORRUPT}").isNull()))
    return h.groupBy("file").agg(F.count(F.lit(1)).alias("h_n"), F.first("j.v").alias("h_v"),
                                 F.first("j.t0").alias("h_t0"), F.first("j.src").alias("h_src"),
                                 F.first("j.node").alias("h_node"), F.first("j.inc").alias("h_inc"))


def _expand_run(run: Column) -> Column:
    """One string of a v2 `g` array -> its ids: the first whole, each next one the first's
    leading GID_PREFIX characters followed by its token (common.settlement_log.expand_gids)."""
    toks = F.split(run, " ")
    first = F.element_at(toks, 1)
    rest = F.slice(toks, 2, F.size(toks) - 1)
    return F.concat(F.array(first), F.transform(rest, lambda t: F.concat(F.substring(first, 1, S.GID_PREFIX), t)))


def with_status(fields: DataFrame, hdrs: DataFrame | None = None) -> DataFrame:
    """Columns of `schema.PARSE_SCHEMA` (as the JSON reader yields them in PERMISSIVE mode with
    `columnNameOfCorruptRecord`; optionally `blank` and `file`) and the files' v2 headers
    (`headers`) -> one row per event: the LOG_SCHEMA columns and `status`.

    A v1 line is one event as it is. A v2 line takes v, src, node and inc from its file's header,
    ts from the header's t0 plus its `t`, the short keys become the full columns, and a line whose
    `g` groups several ids is one event per id. A header is the event `segment_opened`. Statuses:
    ok, newer (a higher schema version: even if its fields no longer fit the types), malformed
    (not a JSON object, a field of the wrong type, a common field missing, a v2 line without
    exactly one header in its file, an unknown version), unknown_event (an event its source does
    not write), blank. Unknown extra fields are ignored."""
    if "file" not in fields.columns:
        fields = fields.withColumn("file", F.lit(""))
    if hdrs is None:
        hdrs = fields.sparkSession.createDataFrame(
            [], "file string, h_n long, h_v long, h_t0 long, h_src string, h_node string, h_inc string")
    f = fields.join(F.broadcast(hdrs), "file", "left")
    is_hdr = _c("h").isNotNull()
    v2 = _c("v").isNull() & _c("e").isNotNull() & ~is_hdr
    one_header = F.coalesce(_c("h_n") == 1, F.lit(False))

    def from_header(own: str, hdr: str) -> Column:
        return F.when(v2, F.when(one_header, _c(hdr))).otherwise(_c(own))

    ts = (F.when(is_hdr, _c("t0") / 1e6)
          .when(v2, F.when(one_header, (_c("h_t0") + _c("t")) / 1e6))
          .otherwise(_c("ts")))
    gids = F.when(_c("g").isNotNull() & ~is_hdr, F.flatten(F.transform(_c("g"), _expand_run))) \
        .otherwise(F.array(_c("gid")))
    canon = f.select(
        from_header("v", "h_v").alias("v"), ts.alias("ts"), from_header("src", "h_src").alias("src"),
        from_header("node", "h_node").alias("node"), from_header("inc", "h_inc").alias("inc"),
        F.when(is_hdr, F.lit("segment_opened")).otherwise(F.coalesce(_c("ev"), _c("e"))).alias("ev"),
        F.explode_outer(gids).alias("gid"),
        F.coalesce(_c("topic"), _c("p")).alias("topic"), F.coalesce(_c("sub"), _c("s")).alias("sub"),
        *[_c(n) for n in ("pub", "container", "link", "peer", "outcome", "error", "size", "count", "seq")],
        F.coalesce(_c("info"), _c("i")).alias("info"), F.coalesce(_c("owed"), _c("o")).alias("owed"),
        "seg", "n", S.CORRUPT, (_c("blank") if "blank" in fields.columns else F.lit(False)).alias("blank"))
    missing = F.lit(False)
    for name in S.REQUIRED:
        missing = missing | _c(name).isNull()
    known = F.lit(False)
    for src, evs in S.EVENTS_BY_SOURCE.items():
        known = known | ((_c("src") == src) & _c("ev").isin(*sorted(evs)))
    status = (F.when(_c("blank"), BLANK)
              .when(_c("v") > S.SCHEMA_VERSION, NEWER)
              .when(_c(S.CORRUPT).isNotNull() | missing | ~_c("v").isin(*S.READ_VERSIONS), MALFORMED)
              .when(~known, UNKNOWN_EVENT)
              .otherwise(OK))
    return canon.select(*S.LOG_SCHEMA.fieldNames(), status.alias("status"))


def line_counts(parsed: DataFrame) -> DataFrame:
    """One row per status: status, n."""
    return parsed.groupBy("status").agg(F.count(F.lit(1)).alias("n"))


# The columns the reconciliation reads (a job may keep only these, plus `status`, in memory).
USED = ("ts", "src", "node", "inc", "ev", "gid", "topic", "sub", "pub", "peer", "outcome", "error", "info",
        "seq", "n", "owed", "seg")


def valid_events(parsed: DataFrame) -> DataFrame:
    """The `ok` lines, the USED columns."""
    return parsed.where(_c("status") == OK).select(*USED)


def restrict_since(events: DataFrame, since: float) -> DataFrame:
    """Judge only messages first seen at or after `since`: drop every line of a message that has a
    line older than `since`, and other lines older than `since`. Subscription lifecycle and router
    start/stop lines are kept whatever their age: they say what was in force."""
    state = events.where(_c("ev").isin(*sorted(S.STATE_EVENTS)))
    rest = events.where(~_c("ev").isin(*sorted(S.STATE_EVENTS)))
    old = rest.where((_c("ts") < since) & _c("gid").isNotNull()).select("gid").distinct()
    kept = rest.where(_c("ts") >= since).join(old, "gid", "left_anti")
    return state.unionByName(kept)


# ================================================================ 2. subscriptions
def lives(events: DataFrame) -> DataFrame:
    """Each life of each subscription: sub, life (1, 2, ...), topic, start, end (null while it lives),
    end_ev, selective (a start said its subscription has a selector: `vocab.SELECTIVE`). A `subscribed`
    or `resumed` (router or subscriber) opens a life when none is open; later
    starts belong to the same life; `unsubscribed` or `expired` closes it; an end with no life open
    is ignored. At equal timestamps starts sort before ends."""
    lc = (events
          .where(_c("sub").isNotNull() & _c("src").isin(S.ROUTER, S.SUBSCRIBER)
                 & _c("ev").isin(*sorted(S.LIFE_STARTS | S.LIFE_ENDS)))
          .select("sub", "topic", "ts", "ev", _c("ev").isin(*sorted(S.LIFE_STARTS)).alias("is_start"),
                  _c("info").startswith(SELECTIVE).alias("sel")))
    w = Window.partitionBy("sub").orderBy(_c("ts"), _c("is_start").desc())
    prev = F.lag("is_start").over(w)
    opens = _c("is_start") & (prev.isNull() | ~prev)
    numbered = lc.withColumn("life", F.sum(opens.cast("int")).over(
        w.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
    end_ts = F.when(~_c("is_start"), _c("ts"))
    return (numbered.where(_c("life") > 0)
            .groupBy("sub", "life")
            .agg(F.first("topic", ignorenulls=True).alias("topic"),
                 F.min(F.when(_c("is_start"), _c("ts"))).alias("start"),
                 F.min(end_ts).alias("end"),
                 F.min_by(F.when(~_c("is_start"), _c("ev")), end_ts).alias("end_ev"),
                 F.coalesce(F.max("sel"), F.lit(False)).alias("selective")))


def observed_subscriptions(events: DataFrame) -> DataFrame:
    """Subscriptions with at least one subscriber-side line (sub): only these are judged."""
    return events.where((_c("src") == S.SUBSCRIBER) & _c("sub").isNotNull()).select("sub").distinct()


# ================================================================ 3. messages
def _first_received(ev: Column) -> Column:
    """A router's `received` that created a record (not a resend merged into one)."""
    return (_c("src") == S.ROUTER) & (ev == "received") & (_c("info").isNull() | (_c("info") != "merged"))


def messages(events: DataFrame) -> DataFrame:
    """One row per published global id: gid, topic, pub, seq (of the first send), t_pub (first send,
    any run), sends,
    outcome (the last final outcome line, any run; null when none or not final), t_outcome (its ts),
    t_accepted (the first ACCEPTED told), error, received (array of (ts, node): every record routers
    created for it, for the publish-hop latency). One pass over publisher and router lines."""
    ev = _c("ev")
    is_pub = (_c("src") == S.PUBLISHER) & (ev == "published")
    is_out = (_c("src") == S.PUBLISHER) & (ev == "outcome")
    is_recv = _first_received(ev)
    t_pub, t_out = F.when(is_pub, _c("ts")), F.when(is_out, _c("ts"))
    agg = (events.where(_c("gid").isNotNull() & (is_pub | is_out | is_recv))
           .groupBy("gid")
           .agg(F.min(t_pub).alias("t_pub"),
                F.min_by(F.when(is_pub, _c("topic")), t_pub).alias("topic"),
                F.min_by(F.when(is_pub, _c("pub")), t_pub).alias("pub"),
                F.min_by(F.when(is_pub, _c("seq")), t_pub).alias("seq"),
                F.sum(is_pub.cast("long")).alias("sends"),
                F.max_by(F.when(is_out, _c("outcome")), t_out).alias("last_outcome"),
                F.max(t_out).alias("t_last"),
                F.min(F.when(is_out & (_c("outcome") == "ACCEPTED"), _c("ts"))).alias("t_accepted"),
                F.max_by(F.when(is_out, _c("error")), t_out).alias("error"),
                F.collect_list(F.when(is_recv, F.struct(_c("ts"), _c("node")))).alias("received")))
    final = F.when(_c("last_outcome").isin(*S.FINAL_OUTCOMES), _c("last_outcome"))
    return (agg.where(_c("t_pub").isNotNull())
            .select("gid", "topic", "pub", "seq", "t_pub", "sends", final.alias("outcome"),
                    F.when(final.isNotNull(), _c("t_last")).alias("t_outcome"),
                    "t_accepted", "error", "received"))


# ================================================================ 4. pairs
def owed_pairs(msgs: DataFrame, subs_lives: DataFrame) -> DataFrame:
    """(gid, sub) for each message and each life whose filter matches its topic (spark/topicmatch.py)
    that had begun at or before the first send and had not ended by then, but for lives with a selector
    (what they are owed depends on each message's fields, which no log holds: their pairs are the ones
    handed, and the router view judges them by the origins' owed sets): gid, sub, life, life_start, life_end, life_end_ev."""
    lv = subs_lives.where(~_c("selective")).select("sub", "topic", "life", _c("start").alias("life_start"),
                                                   _c("end").alias("life_end"), _c("end_ev").alias("life_end_ev"))
    return (join_by_filter(msgs.select("gid", "topic", "t_pub"), lv)
            .where((_c("life_start") <= _c("t_pub"))
                   & (_c("life_end").isNull() | (_c("life_end") > _c("t_pub"))))
            .select("gid", "sub", "life", "life_start", "life_end", "life_end_ev"))


def hand_overs(events: DataFrame) -> DataFrame:
    """Per (gid, sub) a subscriber or a router saw: handed (count of `handed`), t_handed (first),
    suppressed (count of `duplicate`), h_topic, and from router `delivered` lines: deliveries
    (count), t_delivered / delivered_by (the last delivery at or before the first hand-over, or the
    last one when never handed)."""
    ev = _c("ev")
    sub_side = _c("src") == S.SUBSCRIBER
    is_hand = sub_side & (ev == "handed")
    is_dup = sub_side & (ev == "duplicate")
    is_dl = (_c("src") == S.ROUTER) & (ev == "delivered")
    agg = (events
           .where((is_hand | is_dup | is_dl) & _c("gid").isNotNull() & _c("sub").isNotNull())
           .groupBy("gid", "sub")
           .agg(F.sum(is_hand.cast("long")).alias("handed"),
                F.min(F.when(is_hand, _c("ts"))).alias("t_handed"),
                F.sum(is_dup.cast("long")).alias("suppressed"),
                F.first(F.when(sub_side, _c("topic")), ignorenulls=True).alias("h_topic"),
                F.collect_list(F.when(is_dl, F.struct(_c("ts"), _c("node")))).alias("dl")))
    before = F.filter("dl", lambda d: d["ts"] <= _c("t_handed"))
    last = F.when(_c("t_handed").isNull(), F.array_max("dl")).otherwise(F.array_max(before))
    return agg.select("gid", "sub", "handed", "t_handed", "suppressed", "h_topic",
                      F.size("dl").alias("deliveries"), last.alias("last_dl")).select(
        "gid", "sub", "handed", "t_handed", "suppressed", "h_topic", "deliveries",
        _c("last_dl.ts").alias("t_delivered"), _c("last_dl.node").alias("delivered_by"))


def router_rejections(events: DataFrame) -> DataFrame:
    """(gid, sub) a router logged as rejected by that subscription."""
    return (events.where((_c("src") == S.ROUTER) & (_c("ev") == "rejected")
                         & _c("gid").isNotNull() & _c("sub").isNotNull())
            .select("gid", "sub").distinct().withColumn("rejected_at_router", F.lit(True)))


def classify(skew: float = 0.0) -> Column:
    """The class of a pair, first match wins:

    1. unexpected    handed, and no `published` line anywhere for the gid
    2. duplicated    handed more than once
    3. false_accept  owed, publisher told ACCEPTED (first time t_acc), and either handed once after
                     t_acc, or never handed and the life ended after t_acc (it was alive and had not
                     accepted when the publisher was told)
    4. recovered     handed once, the publisher has no final outcome (in doubt, yet delivered)
    5. ok            handed once (owed or not; not owed = attached after the first send), or
                     outcome REJECTED and this subscription rejected it
    6. ended_before_delivery  never handed, the life ended (at or before t_acc if ACCEPTED)
    7. in_doubt      never handed, the life goes on, the publisher has no final outcome
    8. lost          never handed, the life goes on, the publisher has a final outcome (ACCEPTED, or
                     REJECTED because of another subscription)

    Reads the columns of the joined pair (see `pairs`), including `rejected_here`: the outcome is
    REJECTED and this subscription rejected it (a router `rejected` line for the pair, or the sub id
    named in the publisher's error). `skew` (seconds) is the clock difference tolerated between the
    subscriber's or router's clock and the publisher's in the comparisons with t_acc.
    """
    handed = F.coalesce(_c("handed"), F.lit(0))
    owed = F.coalesce(_c("owed"), F.lit(False))
    accepted = F.coalesce(_c("outcome") == "ACCEPTED", F.lit(False))
    limit = _c("t_accepted") + F.lit(skew)
    return (F.when((handed > 0) & _c("t_pub").isNull(), "unexpected")
            .when(handed > 1, "duplicated")
            .when(owed & accepted & (handed == 1) & (_c("t_handed") > limit), "false_accept")
            .when(owed & accepted & (handed == 0) & (_c("life_end") > limit), "false_accept")
            .when((handed == 1) & _c("outcome").isNull(), "recovered")
            .when(handed == 1, "ok")
            .when(_c("rejected_here"), "ok")
            .when(_c("life_end").isNotNull(), "ended_before_delivery")
            .when(_c("outcome").isNull(), "in_doubt")
            .otherwise("lost"))


PAIR_COLUMNS = ("gid", "sub", "topic", "class", "owed", "handed", "suppressed", "pub", "seq", "t_pub",
                "t_handed", "latency", "outcome", "t_outcome", "t_accepted", "rejected_here",
                "deliveries", "t_delivered", "delivered_by", "life", "life_start", "life_end",
                "life_end_ev", "error")


def pairs(events: DataFrame, msgs: DataFrame, subs_lives: DataFrame, skew: float = 0.0) -> DataFrame:
    """Every judged (message, subscription) pair with its class (see `classify`). Pairs are those owed
    to an observed subscription, and those handed to any subscription. Columns: PAIR_COLUMNS."""
    observed = observed_subscriptions(events)
    judged_lives = subs_lives.join(observed, "sub", "left_semi")
    owed = owed_pairs(msgs, judged_lives).withColumn("owed", F.lit(True))
    hs = hand_overs(events)
    joined = (owed.join(hs, ["gid", "sub"], "full")
              .where(_c("owed").isNotNull() | (_c("handed") > 0))
              .join(msgs.drop("received"), "gid", "left")
              .join(router_rejections(events), ["gid", "sub"], "left"))
    rejected_here = F.coalesce(
        (_c("outcome") == "REJECTED") & (F.coalesce(_c("rejected_at_router"), F.lit(False))
                                         | F.coalesce(F.instr(_c("error"), _c("sub")) > 0, F.lit(False))),
        F.lit(False))
    return joined.withColumn("rejected_here", rejected_here).select(
        "gid", "sub", F.coalesce(_c("topic"), _c("h_topic")).alias("topic"),
        classify(skew).alias("class"),
        F.coalesce(_c("owed"), F.lit(False)).alias("owed"),
        F.coalesce(_c("handed"), F.lit(0)).alias("handed"),
        F.coalesce(_c("suppressed"), F.lit(0)).alias("suppressed"),
        "pub", "seq", "t_pub", "t_handed", (_c("t_handed") - _c("t_pub")).alias("latency"),
        "outcome", "t_outcome", "t_accepted", "rejected_here",
        F.coalesce(_c("deliveries"), F.lit(0)).alias("deliveries"), "t_delivered", "delivered_by",
        "life", "life_start", "life_end", "life_end_ev", "error")


def anomalies(classified: DataFrame) -> DataFrame:
    """The pairs that are not `ok`."""
    return classified.where(_c("class") != "ok")


def subscription_counts(classified: DataFrame) -> DataFrame:
    """One row per subscription: sub, topic, pairs, owed, and one count column per class."""
    return (classified.groupBy("sub")
            .agg(F.first("topic", ignorenulls=True).alias("topic"),
                 F.count(F.lit(1)).alias("pairs"),
                 F.sum(_c("owed").cast("long")).alias("owed"),
                 *[F.sum((_c("class") == c).cast("long")).alias(c) for c in S.CLASSES]))


def anomaly_times(classified: DataFrame) -> DataFrame:
    """class, t: when each anomalous pair happened (its first send, or its hand-over when the
    message was never published)."""
    t = F.coalesce(_c("t_pub"), _c("t_handed"))
    return anomalies(classified).where(t.isNotNull()).select("class", t.alias("t"))


def anomaly_span(classified: DataFrame) -> float:
    """Seconds between the first and the last anomaly (0 when fewer than two). An action."""
    row = anomaly_times(classified).agg(F.min("t").alias("a"), F.max("t").alias("b")).first()
    if row is None or row["a"] is None:
        return 0.0
    return float(row["b"] - row["a"])


def anomaly_timeline(classified: DataFrame, bucket: float = 1.0) -> DataFrame:
    """Anomalous pairs per class and time bucket (of the first send, or of the hand-over when the
    message was never published): class, t (bucket start), n."""
    return (anomaly_times(classified)
            .groupBy("class", (F.floor(_c("t") / bucket) * bucket).alias("t"))
            .agg(F.count(F.lit(1)).alias("n")))


# ================================================================ 4b. order
# Owed pairs never handed that count as a gap in a publisher's sequence (when a later message of the
# same publisher link was handed): not `ended_before_delivery` (the subscription ended first), not
# `ok` (the subscription rejected it: it did get it).
GAP_CLASSES = ("lost", "in_doubt", "false_accept")
# A subscription's hand-over order: its first hand-over's (ts, inc, n), then, for lines without `n`
# (logs older than the field), the publisher link, seq and gid: the lines of a batch share their ts,
# and this tie-break puts them in publish order, so an inversion inside one batch of such a log is
# not seen.
HAND_ORDER = ("h_ts", "h_inc", "h_n", "pub", "seq", "gid")
# How many seqs / examples an order row keeps as evidence.
ORDER_EXAMPLES = 20


def handed_order(events: DataFrame, msgs: DataFrame) -> DataFrame:
    """One row per (subscription, message) handed at least once: sub, gid, topic, pub, seq (null when
    never published), h_ts, h_inc, h_n: the first hand-over by (ts, inc, n); a duplicate hand-over
    does not move a message. Sorted by HAND_ORDER within a subscription: its hand-over order."""
    is_hand = ((_c("src") == S.SUBSCRIBER) & (_c("ev") == "handed")
               & _c("gid").isNotNull() & _c("sub").isNotNull())
    first = (events.where(is_hand).groupBy("sub", "gid")
             .agg(F.min(F.struct(_c("ts"), _c("inc"), _c("n"))).alias("h"),
                  F.first("topic", ignorenulls=True).alias("topic")))
    return (first.join(msgs.select("gid", "pub", "seq"), "gid", "left")
            .select("sub", "gid", "topic", "pub", "seq", _c("h.ts").alias("h_ts"),
                    _c("h.inc").alias("h_inc"), _c("h.n").alias("h_n")))


def fifo_order(handed: DataFrame, classified: DataFrame) -> DataFrame:
    """Per-publisher (FIFO) order, one row per (subscription, publisher link) with a hand-over of a
    published message: sub, topic, pub, handed (messages), fifo_reversals (messages handed after a
    message of the same link with a higher seq: positions where seq < the maximum seq handed
    before), fifo_gaps (owed pairs of the link never handed, of class GAP_CLASSES, with a seq below
    the highest seq handed), reversed_seqs, gap_seqs (the lowest ORDER_EXAMPLES of each)."""
    w = (Window.partitionBy("sub", "pub").orderBy(*HAND_ORDER)
         .rowsBetween(Window.unboundedPreceding, -1))
    marked = (handed.where(_c("pub").isNotNull() & _c("seq").isNotNull())
              .withColumn("reversed", F.coalesce(_c("seq") < F.max("seq").over(w), F.lit(False))))
    per = (marked.groupBy("sub", "pub")
           .agg(F.first("topic", ignorenulls=True).alias("topic"),
                F.count(F.lit(1)).alias("handed"),
                F.sum(_c("reversed").cast("long")).alias("fifo_reversals"),
                F.max("seq").alias("max_seq"),
                F.slice(F.sort_array(F.collect_list(F.when(_c("reversed"), _c("seq")))), 1,
                        ORDER_EXAMPLES).alias("reversed_seqs")))
    missing = classified.where(_c("owed") & (_c("handed") == 0) & _c("class").isin(*GAP_CLASSES)
                               & _c("pub").isNotNull() & _c("seq").isNotNull()).select("sub", "pub", "seq")
    gaps = (missing.join(per.select("sub", "pub", "max_seq"), ["sub", "pub"])
            .where(_c("seq") < _c("max_seq"))
            .groupBy("sub", "pub")
            .agg(F.count(F.lit(1)).alias("fifo_gaps"),
                 F.slice(F.sort_array(F.collect_list("seq")), 1, ORDER_EXAMPLES).alias("gap_seqs")))
    return (per.join(gaps, ["sub", "pub"], "left")
            .select("sub", "topic", "pub", "handed", "fifo_reversals",
                    F.coalesce(_c("fifo_gaps"), F.lit(0)).alias("fifo_gaps"), "max_seq",
                    "reversed_seqs", F.coalesce(_c("gap_seqs"), F.array().cast("array<long>")).alias("gap_seqs")))


def order_anomalies(fifo: DataFrame) -> DataFrame:
    """The (subscription, publisher link) rows of `fifo_order` with a reversal or a gap."""
    return fifo.where((_c("fifo_reversals") > 0) | (_c("fifo_gaps") > 0))


def subscription_pair_order(handed: DataFrame) -> DataFrame:
    """Total order: one row per pair of subscriptions of one topic with messages in common: topic,
    sub_a, sub_b (sub_a < sub_b), common (messages both were handed), disagree (some two of them
    were handed in opposite orders), example (two such messages, in sub_a's order). The common
    messages in sub_a's hand-over order must be in sub_b's order too; they disagree iff one of them
    comes, in sub_b's order, before the message sub_a had just before it. Quadratic in the
    subscriptions of a topic: every pair is joined on every message both got."""
    key = F.struct(*HAND_ORDER)
    a = handed.select("topic", "gid", _c("sub").alias("sub_a"), key.alias("key_a"))
    b = handed.select("topic", "gid", _c("sub").alias("sub_b"), key.alias("key_b"))
    w = Window.partitionBy("topic", "sub_a", "sub_b").orderBy("key_a")
    j = (a.join(b, ["topic", "gid"]).where(_c("sub_a") < _c("sub_b"))
         .withColumn("prev_b", F.lag("key_b").over(w))
         .withColumn("prev_gid", F.lag("gid").over(w)))
    inv = F.coalesce(_c("key_b") < _c("prev_b"), F.lit(False))
    return (j.groupBy("topic", "sub_a", "sub_b")
            .agg(F.count(F.lit(1)).alias("common"),
                 F.max(inv).alias("disagree"),
                 F.first(F.when(inv, F.array(_c("prev_gid"), _c("gid"))), ignorenulls=True).alias("example")))


def topic_order(sub_pairs: DataFrame) -> DataFrame:
    """Per topic: topic, compared (subscription pairs with messages in common),
    total_order_disagreements (of which disagree)."""
    return (sub_pairs.groupBy("topic")
            .agg(F.count(F.lit(1)).alias("compared"),
                 F.sum(_c("disagree").cast("long")).alias("total_order_disagreements")))


def _first_sends(events: DataFrame) -> DataFrame:
    """One row per published gid: gid, topic, node (the client that sent it first), t (its first
    `published`, any run)."""
    is_pub = (_c("src") == S.PUBLISHER) & (_c("ev") == "published") & _c("gid").isNotNull()
    return (events.where(is_pub).groupBy("gid")
            .agg(F.min("ts").alias("t"), F.min_by("node", _c("ts")).alias("node"),
                 F.min_by("topic", _c("ts")).alias("topic")))


def _client_hand_overs(events: DataFrame) -> DataFrame:
    """node, gid, t: when a client (container) was first handed a message, on any subscription."""
    is_hand = ((_c("src") == S.SUBSCRIBER) & (_c("ev") == "handed")
               & _c("gid").isNotNull() & _c("node").isNotNull())
    return events.where(is_hand).groupBy("node", "gid").agg(F.min("ts").alias("t"))


def causal_order(events: DataFrame, handed: DataFrame) -> DataFrame:
    """Causal order, direct dependencies only, one row per subscription handed a published message:
    sub, topic, checked, causal_violations, violated (the lowest ORDER_EXAMPLES gids), example.

    The rule. A client is a container id (`node`): its publisher and subscriber files, every run.
    Message a -> b when the client that sent b first (the earliest `published` of b, any run) had
    been handed a (its earliest `handed` of a, on any of its subscriptions, any topic) strictly
    before: t_handed(a) < t_published(b), both on that client's clock. The two lines are in
    different files with no common sequence, so only `ts` orders them; at equal `ts` there is no
    dependency (not a false violation). Not covered: a -> c -> b through another client (only direct
    edges), and a link's own earlier messages (that is FIFO: `fifo_order`).

    The check. A subscription handed b is `checked` for b when it was also handed some a with
    a -> b; b is a violation when it was handed (HAND_ORDER, as `fifo_order`) before one of those a:
    a violation is one (subscription, b) pair, however many of b's dependencies came late. Example:
    [a, b] for the violated b first in the subscription's order, a its latest-handed dependency.

    Cost: no edge list. The subscription's hand-overs are joined once on gid with each message's
    role for a client (handed to it: a, or sent first by it: b); within (subscription, client),
    in the client's time order, a b is late when the highest hand-over position of the a rows
    before it is above its own (a running max, like FIFO's reversals). Only clients that publish
    contribute a rows, and only hand-overs before their last send."""
    sends = _first_sends(events)
    last_send = sends.groupBy("node").agg(F.max("t").alias("t_last"))
    deps = (_client_hand_overs(events).join(last_send, "node")
            .where(_c("t") < _c("t_last"))
            .select("node", "gid", "t", F.lit(True).alias("is_a")))
    roles = deps.unionByName(sends.select("node", "gid", "t", F.lit(False).alias("is_a")))
    key = F.struct(*HAND_ORDER)
    w = (Window.partitionBy("sub", "node").orderBy("t", "is_a")  # at equal t: b before a
         .rowsBetween(Window.unboundedPreceding, -1))
    marked = (handed.select("sub", "gid", "topic", key.alias("key")).join(roles, "gid")
              .withColumn("dep", F.max(F.when(_c("is_a"), _c("key"))).over(w))
              .where(~_c("is_a")))
    late = F.coalesce(_c("dep") > _c("key"), F.lit(False))
    return (marked.groupBy("sub")
            .agg(F.first("topic", ignorenulls=True).alias("topic"),
                 F.count("dep").alias("checked"),
                 F.sum(late.cast("long")).alias("causal_violations"),
                 F.slice(F.sort_array(F.collect_list(F.when(late, _c("gid")))), 1,
                         ORDER_EXAMPLES).alias("violated"),
                 F.min_by(F.array(_c("dep.gid"), _c("gid")), F.when(late, _c("key"))).alias("example")))


def causal_anomalies(causal: DataFrame) -> DataFrame:
    """The subscriptions of `causal_order` with a violation."""
    return causal.where(_c("causal_violations") > 0)


def causal_dependents(events: DataFrame) -> DataFrame:
    """Per topic: topic, dependent (messages whose first sender had been handed some message, on any
    topic, strictly before: each has at least one direct dependency, by the rule of `causal_order`).
    Only topics with one."""
    first_hand = _client_hand_overs(events).groupBy("node").agg(F.min("t").alias("t_first"))
    return (_first_sends(events).join(first_hand, "node")
            .where(_c("t_first") < _c("t"))
            .groupBy("topic").agg(F.count(F.lit(1)).alias("dependent")))


def topic_causal(causal: DataFrame, dependents: DataFrame) -> DataFrame:
    """Per topic with a dependent message or a checked hand-over: topic, dependent, checked,
    causal_violations."""
    per = causal.groupBy("topic").agg(F.sum("checked").alias("checked"),
                                      F.sum("causal_violations").alias("causal_violations"))
    return (per.join(dependents, "topic", "full")
            .select("topic", *[F.coalesce(_c(c), F.lit(0)).alias(c)
                               for c in ("dependent", "checked", "causal_violations")])
            .where((_c("dependent") > 0) | (_c("checked") > 0)))


# ================================================================ 5. routers and hops
def incarnations(events: DataFrame) -> DataFrame:
    """node, inc, first_ts, last_ts, state: `live` unless a later incarnation of the same router
    started or this one logged `router_stopped` (then `dead`: what it held is gone)."""
    inc = RV.incarnation_facts(events)
    w = Window.partitionBy("node").orderBy(F.coalesce(_c("started"), _c("first_ts")), _c("inc"))
    later = F.lead("inc").over(w).isNotNull()
    return inc.select("node", "inc", "first_ts", "last_ts",
                      F.when(later | (_c("stopped") == 1), "dead").otherwise("live").alias("state"))


def router_records(events: DataFrame) -> DataFrame:
    """One row per delivery record (router, incarnation, gid): t_received (first non-merged
    `received`), t_settled (null when unsettled at the end), state of the incarnation, settle_latency."""
    is_recv = _first_received(_c("ev"))
    is_settled = (_c("src") == S.ROUTER) & (_c("ev") == "settled")
    recs = (events.where(_c("gid").isNotNull() & (is_recv | is_settled))
            .groupBy("node", "inc", "gid")
            .agg(F.min(F.when(is_recv, _c("ts"))).alias("t_received"),
                 F.min(F.when(is_settled, _c("ts"))).alias("t_settled"))
            .where(_c("t_received").isNotNull()))
    return (recs.join(incarnations(events).select("node", "inc", "state"), ["node", "inc"], "left")
            .withColumn("settle_latency", _c("t_settled") - _c("t_received")))


def router_stats(records: DataFrame, incs: DataFrame) -> DataFrame:
    """One row per router: node, incarnations, records, settled, unsettled_live, unsettled_dead,
    settle_q (array of p50, p99, p999), settle_max."""
    unsettled = _c("t_settled").isNull()
    per = (records.groupBy("node")
           .agg(F.count(F.lit(1)).alias("records"),
                F.count("t_settled").alias("settled"),
                F.sum((unsettled & (_c("state") == "live")).cast("long")).alias("unsettled_live"),
                F.sum((unsettled & (_c("state") != "live")).cast("long")).alias("unsettled_dead"),
                F.percentile_approx("settle_latency", list(QUANTILES), PERCENTILE_ACCURACY).alias("settle_q"),
                F.max("settle_latency").alias("settle_max")))
    n_inc = incs.groupBy("node").agg(F.count(F.lit(1)).alias("incarnations"))
    return n_inc.join(per, "node", "left").na.fill(0, ["records", "settled", "unsettled_live",
                                                       "unsettled_dead"])


def hop_latencies(events: DataFrame, msgs: DataFrame, classified: DataFrame) -> DataFrame:
    """Latency samples: kind, hop, latency (seconds). Kinds: `end_to_end` (publisher -> subscriber,
    first send to first hand-over), `publish` (publisher -> router X: first send to each record X
    created for the message), `mesh` (X -> Y: first `forwarded` on X to first `forward_received`
    on Y, both naming the other as peer), `deliver` (router X -> subscriber: X's last `delivered` at
    or before the first hand-over, to the hand-over). Clocks of different machines are compared:
    these are as good as their synchronisation."""
    e2e = classified.where(_c("t_handed").isNotNull() & _c("t_pub").isNotNull()).select(
        F.lit("end_to_end").alias("kind"), F.lit("publisher->subscriber").alias("hop"), _c("latency"))
    publish = (msgs.select("t_pub", F.explode("received").alias("r"))
               .select(F.lit("publish").alias("kind"), F.concat(F.lit("publisher->"), _c("r.node")).alias("hop"),
                       (_c("r.ts") - _c("t_pub")).alias("latency")))
    is_fw = _c("ev") == "forwarded"
    mesh = (events.where((_c("src") == S.ROUTER) & _c("ev").isin("forwarded", "forward_received")
                         & _c("gid").isNotNull() & _c("peer").isNotNull())
            .groupBy("gid", F.when(is_fw, _c("node")).otherwise(_c("peer")).alias("x"),
                     F.when(is_fw, _c("peer")).otherwise(_c("node")).alias("y"))
            .agg(F.min(F.when(is_fw, _c("ts"))).alias("t_fw"), F.min(F.when(~is_fw, _c("ts"))).alias("t_fr"))
            .where(_c("t_fw").isNotNull() & _c("t_fr").isNotNull())
            .select(F.lit("mesh").alias("kind"), F.concat(_c("x"), F.lit("->"), _c("y")).alias("hop"),
                    (_c("t_fr") - _c("t_fw")).alias("latency")))
    deliver = (classified.where(_c("t_handed").isNotNull() & _c("t_delivered").isNotNull())
               .select(F.lit("deliver").alias("kind"),
                       F.concat(_c("delivered_by"), F.lit("->subscriber")).alias("hop"),
                       (_c("t_handed") - _c("t_delivered")).alias("latency")))
    return e2e.unionByName(publish).unionByName(mesh).unionByName(deliver)


def latency_quantiles(samples: DataFrame, quantiles: Iterable[float] = QUANTILES + CURVE) -> DataFrame:
    """kind, hop, n, q (array, one per quantile), max."""
    return (samples.groupBy("kind", "hop")
            .agg(F.count(F.lit(1)).alias("n"),
                 F.percentile_approx("latency", list(quantiles), PERCENTILE_ACCURACY).alias("q"),
                 F.max("latency").alias("max")))


# ================================================================ all of it
@dataclass(frozen=True, slots=True)
class Reconciliation:
    """The lazy frames of one reconciliation (nothing is computed until an action runs)."""

    parsed: DataFrame
    events: DataFrame
    lives: DataFrame
    messages: DataFrame
    pairs: DataFrame
    records: DataFrame
    incarnations: DataFrame
    hops: DataFrame
    order: DataFrame  # fifo_order: per (subscription, publisher link)
    sub_pairs: DataFrame  # subscription_pair_order: per pair of subscriptions of a topic
    causal: DataFrame  # causal_order: per subscription
    router_msgs: DataFrame  # routerview.message_facts
    router_pairs: DataFrame  # routerview.router_pairs: the router view, per pair
    agreement: DataFrame  # routerview.disagreements: pairs both views judged
    since: float | None = None
    skew: float = 0.0


def keep(df: DataFrame) -> DataFrame:
    """`df` kept for the results that reuse it, and cut from its lineage: a local checkpoint, made
    when the first action computes it (no job of its own) and read back as a plan of one leaf. The
    frames built on it are analysed over that leaf, not over the whole plan below it: on a small
    run, analysing the plans is where the time goes (docs/reconcile.md, "What a run costs"; the
    demo's logs took 88 s of the JVM's CPU with `persist`, 54 s so). When the session plans one
    shuffle partition (a short run: `job.SHORT_RUN`), the leaf is read as one partition, which the
    planner knows (a checkpoint alone does not say how it is partitioned): the frames built on it
    need no exchange."""
    kept = df.localCheckpoint(eager=False)
    if V.one_partition(df):
        return kept.coalesce(1)
    return kept


def keep_all(*frames: DataFrame) -> list[DataFrame]:
    """`keep` of each frame, side by side: a keep plans its frame on the driver (analysis,
    optimization, physical planning: most of a second each in a short run's cold JVM), on one core,
    and frames that do not read each other need not wait for each other's."""
    if len(frames) < 2:
        return [keep(df) for df in frames]
    with ThreadPoolExecutor(len(frames), thread_name_prefix="oncemesh-keep") as pool:
        return list(pool.map(keep, frames))


def reconcile(parsed: DataFrame, since: float | None = None, skew: float = 0.0,
              persist: bool = False) -> Reconciliation:
    """Build every frame from parsed lines (`parse`, or a projection of it on USED + status).
    `persist` keeps the frames several results reuse (lives, messages, pairs; with `since`, the
    restricted events) in memory/disk: worth it when the summary, the anomalies and the chart are
    all computed (`unpersist` frees them). Persisting `parsed` is the caller's choice."""
    ev = valid_events(parsed)
    if since is not None:
        ev = restrict_since(ev, since)
        if persist:
            ev = ev.transform(keep)
    lv = lives(ev)
    msgs = messages(ev)
    # the router view: the same events, the routers' lines only (routerview: the one set of rules)
    r_msgs = RV.message_facts(ev)
    if persist:
        lv, msgs, r_msgs = keep_all(lv, msgs, r_msgs)
    classified = pairs(ev, msgs, lv, skew)
    incs = incarnations(ev)
    handed = handed_order(ev, msgs)
    sub_pairs = subscription_pair_order(handed)
    causal = causal_order(ev, handed)
    r_pairs = RV.router_pairs(ev, lives(ev.where(_c("src") == S.ROUTER)), skew, r_msgs)
    if persist:
        classified, sub_pairs, causal, r_pairs = keep_all(classified, sub_pairs, causal, r_pairs)
    fifo = fifo_order(handed, classified)
    if persist:
        fifo = fifo.transform(keep)
    return Reconciliation(parsed=parsed, events=ev, lives=lv, messages=msgs, pairs=classified,
                          records=router_records(ev), incarnations=incs,
                          hops=hop_latencies(ev, msgs, classified), order=fifo, sub_pairs=sub_pairs,
                          causal=causal, router_msgs=r_msgs, router_pairs=r_pairs,
                          agreement=RV.disagreements(r_pairs, classified), since=since, skew=skew)


def release(df: DataFrame) -> None:
    """Free the blocks of a frame `keep` made (its checkpoint's RDD; a frame that is no checkpoint:
    its cache, if any)."""
    plan = df._jdf.queryExecution().logical()
    while plan.nodeName() == "Repartition":  # keep's coalesce(1)
        plan = plan.child()
    if plan.nodeName() == "LogicalRDD":
        plan.rdd().unpersist(False)
    else:
        df.unpersist()


def unpersist(r: Reconciliation) -> None:
    """Free what `reconcile(..., persist=True)` kept (the caller's `parsed` stays)."""
    for df in (r.events, r.lives, r.messages, r.pairs, r.order, r.sub_pairs, r.causal, r.router_msgs,
               r.router_pairs):
        release(df)


# ================================================================ 6. summary
@dataclass(frozen=True, slots=True)
class Quantiles:
    kind: str
    name: str
    n: int
    p50: float | None
    p99: float | None
    p999: float | None
    max: float | None
    curve: tuple[tuple[float, float], ...] = ()  # (quantile, seconds) for a chart; not in to_dict

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "n": self.n, "p50": self.p50, "p99": self.p99,
                "p999": self.p999, "max": self.max}


@dataclass(frozen=True, slots=True)
class RouterStats:
    node: str
    incarnations: int
    records: int
    settled: int
    unsettled_live: int
    unsettled_dead: int
    settle: Quantiles

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "incarnations": self.incarnations, "records": self.records,
                "settled": self.settled, "unsettled_live": self.unsettled_live,
                "unsettled_dead": self.unsettled_dead, "settle_latency": self.settle.to_dict()}


@dataclass(frozen=True, slots=True)
class SubscriptionCounts:
    sub: str
    topic: str | None
    pairs: int
    owed: int
    counts: tuple[tuple[str, int], ...]  # (class, n) in S.CLASSES order

    def to_dict(self) -> dict[str, Any]:
        return {"sub": self.sub, "topic": self.topic, "pairs": self.pairs, "owed": self.owed,
                **dict(self.counts)}


@dataclass(frozen=True, slots=True)
class TopicOrder:
    topic: str | None
    compared: int  # pairs of subscriptions with messages in common
    disagreements: int  # of which were handed two messages in opposite orders

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "compared": self.compared,
                "total_order_disagreements": self.disagreements}


@dataclass(frozen=True, slots=True)
class TopicCausal:
    topic: str | None
    dependent: int  # messages sent after their client had been handed some message
    checked: int  # (subscription, message) hand-overs with a dependency handed to the same subscription
    violations: int  # of which handed before one of those dependencies

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "dependent": self.dependent, "checked": self.checked,
                "causal_violations": self.violations}


@dataclass(frozen=True, slots=True)
class Summary:
    """The verdict of one reconciliation. The class counts are named as in docs/settlement-log.md."""

    ok: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    in_doubt: int = 0
    recovered: int = 0
    ended_before_delivery: int = 0
    false_accept: int = 0
    messages: int = 0  # distinct published global ids
    messages_in_doubt: int = 0  # published, no final outcome told to the publisher
    pairs: int = 0
    owed_pairs: int = 0
    subscriptions: int = 0  # judged subscriptions: those with a subscriber-side line
    unobserved_subscriptions: int = 0  # known only from router lines: not judged
    log_lines: int = 0  # every non-blank line read
    valid_lines: int = 0
    client_lines: int = 0  # valid lines our clients wrote (publisher, subscriber)
    malformed_lines: int = 0
    newer_version_lines: int = 0
    unknown_event_lines: int = 0
    ignored_lines: int = 0  # valid lines left out by --since
    unsettled_live: int = 0
    unsettled_dead: int = 0
    # order: reported, not part of the verdict (docs/reconcile.md, "Order")
    fifo_reversals: int = 0  # messages handed after a higher seq of the same publisher link
    fifo_gaps: int = 0  # owed messages skipped: a later one of the same link was handed, not this one
    total_order_disagreements: int = 0  # pairs of subscriptions of a topic handed messages in opposite orders
    causal_violations: int = 0  # (subscription, message b) handed before a message b's sender had been handed
    order_per_topic: tuple[TopicOrder, ...] = ()
    causal_per_topic: tuple[TopicCausal, ...] = ()
    per_subscription: tuple[SubscriptionCounts, ...] = ()
    routers: tuple[RouterStats, ...] = ()
    latencies: tuple[Quantiles, ...] = ()
    since: float | None = None
    # the router view, the agreement of the two views, and what neither could judge
    router_view: RouterView = field(default_factory=RouterView)
    agreement: Agreement = field(default_factory=Agreement)
    judged_pairs: int = 0  # by at least one view
    unjudged_pairs: int = 0  # by neither
    accept_partial: bool = False  # the operator accepts partial evidence (--accept-partial)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def client_judged(self) -> bool:
        """The client view judged something: a subscription with a subscriber log, or a pair."""
        return self.subscriptions > 0 or self.pairs > 0

    @property
    def client_note(self) -> str | None:
        """Why the client view judged nothing (None when it judged)."""
        if self.client_judged:
            return None
        return "no client logs: not judged" if self.client_lines == 0 else "no subscriber logs: not judged"

    @property
    def router_judged(self) -> bool:
        return self.router_view.pairs > 0

    @property
    def client_failures(self) -> int:
        return sum(getattr(self, c) for c in S.FAILURES)

    @property
    def failures(self) -> int:
        """Failures of either view, and pairs on which they disagree."""
        return self.client_failures + self.router_view.failures + self.agreement.disagreements

    @property
    def partial(self) -> bool:
        """Some pair could be judged by neither view, or nothing at all was judged."""
        return self.unjudged_pairs > 0 or self.judged_pairs == 0

    @property
    def exit_status(self) -> int:
        """0 pass, 1 a failure or a disagreement, 3 partial evidence (not accepted)."""
        if self.failures:
            return 1
        return 3 if self.partial and not self.accept_partial else 0

    @property
    def verdict(self) -> str:
        return {0: "pass", 1: "fail", 3: "partial"}[self.exit_status]

    @property
    def passed(self) -> bool:
        return self.exit_status == 0

    def class_counts(self) -> dict[str, int]:
        return {c: getattr(self, c) for c in S.CLASSES}

    def views(self) -> dict[str, Any]:
        """The verdict of each view in a few keys (the top of `--json`): which view, whether it
        judged anything, and if so its verdict and its counts; if not, why."""
        rv = self.router_view
        router: dict[str, Any] = {"source": "the routers' settlement logs alone", "judged": self.router_judged}
        if self.router_judged:
            router |= {"verdict": "fail" if rv.failures else ("partial" if rv.unjudged else "pass"),
                       "pairs": rv.pairs, "judged_pairs": rv.judged, "unjudged_pairs": rv.unjudged,
                       **{c: n for c, n in rv.counts if n or c == "ok"}, "failures": rv.failures}
        else:
            router["note"] = "no router pairs: not judged"
        client: dict[str, Any] = {"source": "our clients' settlement logs",
                                  "judged": self.client_judged}
        if self.client_judged:
            client |= {"verdict": "fail" if self.client_failures else "pass", "pairs": self.pairs,
                       **{c: n for c, n in self.class_counts().items() if n or c == "ok"},
                       "failures": self.client_failures}
        else:
            client["note"] = self.client_note
        return {"router": router, "client": client}

    def headline(self) -> str:
        """The whole verdict in one line: the run's, then each view's, named."""
        return f"{self.verdict.upper()}: " + "; ".join(f"{name} view: {view_text(v)}"
                                                         for name, v in self.views().items())

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON (docs/reconcile.md). The top-level class counts, `pairs`,
        `owed_pairs` and `subscriptions` are the client view's, as they always were; null when the
        client view judged nothing (no client logs), never a 0 that reads like a verdict."""
        judged = self.client_judged
        d: dict[str, Any] = {"verdict": self.verdict, "exit_status": self.exit_status, "headline": self.headline(),
                             "views": self.views()}
        d |= {c: (n if judged else None) for c, n in self.class_counts().items()}
        for name in ("messages", "messages_in_doubt", "pairs", "owed_pairs", "subscriptions",
                     "unobserved_subscriptions", "log_lines", "valid_lines", "client_lines", "malformed_lines",
                     "newer_version_lines", "unknown_event_lines", "ignored_lines", "unsettled_live",
                     "unsettled_dead", "fifo_reversals", "fifo_gaps", "total_order_disagreements",
                     "causal_violations", "since"):
            d[name] = getattr(self, name)
        if not judged:
            d |= {"pairs": None, "owed_pairs": None, "subscriptions": None}
        d["failures"] = self.failures
        d["per_subscription"] = [s.to_dict() for s in self.per_subscription]
        d["routers"] = [r.to_dict() for r in self.routers]
        d["latency"] = [q.to_dict() for q in self.latencies]
        d["order_per_topic"] = [t.to_dict() for t in self.order_per_topic]
        d["causal_per_topic"] = [t.to_dict() for t in self.causal_per_topic]
        d["router_view"] = self.router_view.to_dict()
        counts = {"pairs": self.pairs, "owed_pairs": self.owed_pairs, "subscriptions": self.subscriptions,
                  **self.class_counts(), "failures": self.client_failures}
        d["client_view"] = {"judged": judged, "note": self.client_note, "client_lines": self.client_lines,
                            "unobserved_subscriptions": self.unobserved_subscriptions,
                            **{k: (v if judged else None) for k, v in counts.items()}}
        d["agreement"] = self.agreement.to_dict()
        d["evidence"] = {"judged_pairs": self.judged_pairs, "unjudged_pairs": self.unjudged_pairs,
                         "partial": self.partial, "accepted_partial": self.accept_partial}
        d.update(self.extra)
        return d


def view_text(v: Mapping[str, Any]) -> str:
    """One view of `Summary.views` in words: `PASS: 4 pair(s): ok 4`, `PARTIAL: 4 pair(s), 4 not
    judged: ok 0`, or why it judged nothing."""
    if not v["judged"]:
        return str(v["note"])
    shown = ("source", "judged", "verdict", "pairs", "judged_pairs", "unjudged_pairs", "failures")
    counts = ", ".join(f"{c} {n}" for c, n in v.items() if c not in shown)
    unjudged = f", {v['unjudged_pairs']} not judged" if v.get("unjudged_pairs") else ""
    return f"{str(v['verdict']).upper()}: {v['pairs']} pair(s){unjudged}: {counts}"


def _quantiles(kind: str, name: str, n: int, q: list[float] | None, mx: float | None) -> Quantiles:
    """`q`: values at QUANTILES, then (optionally) at CURVE."""
    qs: list[float | None] = list(q) if q else [None] * len(QUANTILES)
    head, tail = qs[:len(QUANTILES)], qs[len(QUANTILES):]
    curve = tuple((c, float(v)) for c, v in zip(CURVE, tail, strict=False) if v is not None)
    return Quantiles(kind, name, int(n), head[0], head[1], head[2], mx, curve)


def summary_pieces(r: Reconciliation) -> V.Pieces:
    """Every small result a `Summary` is made of, as frames for `verdict.collect_pieces` (one
    action for all of them)."""
    ok_src = F.when(_c("status") == OK, _c("src"))
    known = r.lives.select("sub").distinct().join(
        observed_subscriptions(r.events).withColumn("observed", F.lit(True)), "sub", "full")
    pieces: V.Pieces = [
        ("status", r.parsed.groupBy("status", ok_src.alias("src")).agg(F.count(F.lit(1)).alias("n"))),
        ("subs", subscription_counts(r.pairs)),
        ("msgs", r.messages.agg(F.count(F.lit(1)).alias("n"),
                                F.sum(_c("outcome").isNull().cast("long")).alias("in_doubt"))),
        ("known", known.agg(F.count("observed").alias("obs"),
                            F.sum(_c("observed").isNull().cast("long")).alias("unobs"))),
        ("routers", router_stats(r.records, r.incarnations)),
        ("latency", latency_quantiles(r.hops)),
        ("fifo", r.order.agg(F.sum("fifo_reversals").alias("rev"), F.sum("fifo_gaps").alias("gaps"))),
        ("topic_order", topic_order(r.sub_pairs)),
        ("topic_causal", topic_causal(r.causal, causal_dependents(r.events))),
        *V.evidence_pieces(r.router_pairs, r.pairs),
        *V.router_view_pieces(r.events, r.router_pairs, r.router_msgs),
        *V.agreement_pieces(r.agreement),
    ]
    if r.since is not None:
        pieces.append(("used", r.events.agg(F.count(F.lit(1)).alias("n"))))
    return pieces


def summarize(r: Reconciliation, accept_partial: bool = False) -> Summary:
    """Collect the verdict (small results only: one row per status, subscription, router and hop),
    in one action. `accept_partial`: the operator accepts a verdict on partial evidence."""
    return summary_from(r, V.collect_pieces(summary_pieces(r)), accept_partial)


def summary_from(r: Reconciliation, rows: V.Rows, accept_partial: bool = False) -> Summary:
    """The `Summary` of the rows `collect_pieces` brought back for `summary_pieces(r)`."""
    status: dict[str, int] = {}
    client_lines = 0
    for row in rows["status"]:
        status[row["status"]] = status.get(row["status"], 0) + int(row["n"])
        if row["src"] in (S.PUBLISHER, S.SUBSCRIBER):
            client_lines += int(row["n"])
    valid = status.get(OK, 0)
    used = int(V.one(rows, "used").get("n") or 0) if r.since is not None else valid
    per_sub = tuple(
        SubscriptionCounts(row["sub"], row["topic"], int(row["pairs"]), int(row["owed"] or 0),
                           tuple((c, int(row[c] or 0)) for c in S.CLASSES))
        for row in sorted(rows["subs"], key=lambda row: row["sub"]))
    totals = {c: sum(dict(s.counts)[c] for s in per_sub) for c in S.CLASSES}
    m, srow, fifo = V.one(rows, "msgs"), V.one(rows, "known"), V.one(rows, "fifo")
    routers = tuple(
        RouterStats(row["node"], int(row["incarnations"]), int(row["records"]), int(row["settled"]),
                    int(row["unsettled_live"]), int(row["unsettled_dead"]),
                    _quantiles("settle", row["node"], int(row["settled"]), row["settle_q"],
                               row["settle_max"]))
        for row in sorted(rows["routers"], key=lambda x: x["node"]))
    order = {"end_to_end": 0, "publish": 1, "mesh": 2, "deliver": 3}
    lat = tuple(
        _quantiles(row["kind"], row["hop"], row["n"], row["q"], row["max"])
        for row in sorted(rows["latency"], key=lambda x: (order.get(x["kind"], 9), x["hop"])))
    judged, neither = V.evidence_from(rows)
    topics = tuple(TopicOrder(row["topic"], int(row["compared"]), int(row["total_order_disagreements"] or 0))
                   for row in sorted(rows["topic_order"], key=lambda x: x["topic"] or ""))
    causal = tuple(TopicCausal(row["topic"], int(row["dependent"]), int(row["checked"]),
                               int(row["causal_violations"]))
                   for row in sorted(rows["topic_causal"], key=lambda x: x["topic"] or ""))
    return Summary(
        ok=totals["ok"], lost=totals["lost"], duplicated=totals["duplicated"],
        unexpected=totals["unexpected"], in_doubt=totals["in_doubt"], recovered=totals["recovered"],
        ended_before_delivery=totals["ended_before_delivery"], false_accept=totals["false_accept"],
        messages=int(m.get("n") or 0),
        messages_in_doubt=int(m.get("in_doubt") or 0),
        pairs=sum(s.pairs for s in per_sub),
        owed_pairs=sum(s.owed for s in per_sub),
        subscriptions=int(srow.get("obs") or 0),
        unobserved_subscriptions=int(srow.get("unobs") or 0),
        log_lines=sum(n for s, n in status.items() if s != BLANK),
        valid_lines=valid,
        client_lines=client_lines,
        malformed_lines=status.get(MALFORMED, 0),
        newer_version_lines=status.get(NEWER, 0),
        unknown_event_lines=status.get(UNKNOWN_EVENT, 0),
        ignored_lines=valid - used,
        unsettled_live=sum(x.unsettled_live for x in routers),
        unsettled_dead=sum(x.unsettled_dead for x in routers),
        fifo_reversals=int(fifo.get("rev") or 0),
        fifo_gaps=int(fifo.get("gaps") or 0),
        total_order_disagreements=sum(t.disagreements for t in topics),
        causal_violations=sum(t.violations for t in causal),
        order_per_topic=topics,
        causal_per_topic=causal,
        per_subscription=per_sub,
        routers=routers,
        latencies=lat,
        since=r.since,
        router_view=V.router_view_from(rows),
        agreement=V.agreement_from(rows),
        judged_pairs=judged,
        unjudged_pairs=neither,
        accept_partial=accept_partial,
    )
