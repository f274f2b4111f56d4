"""The settlement-log schema (v1 and v2) as Spark types, and the event names the reconciliation reads.

`router/settlement_log.py` is the writer and owns the schema (`FIELDS`); this module spells the same
schema out again as a `StructType` on purpose, so that a change on one side without the other fails
`tests/spark/test_schema.py` instead of silently reading nulls. docs/settlement-log.md describes it.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    DataType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

SCHEMA_VERSION = 2  # the newest version read (routers write it; clients still write 1)
READ_VERSIONS = (1, 2)

# One column per field of a line, in the writers' order (common.settlement_log.FIELDS, then the
# subscriber's own: clients.subscriber.SETTLEMENT_FIELDS). JSON int -> LongType, float -> DoubleType.
LOG_SCHEMA = StructType([
    StructField("v", LongType()),
    StructField("ts", DoubleType()),
    StructField("src", StringType()),
    StructField("node", StringType()),
    StructField("inc", StringType()),
    StructField("ev", StringType()),
    StructField("gid", StringType()),
    StructField("topic", StringType()),
    StructField("sub", StringType()),
    StructField("pub", StringType()),
    StructField("container", StringType()),
    StructField("link", StringType()),
    StructField("peer", StringType()),
    StructField("outcome", StringType()),
    StructField("error", StringType()),
    StructField("size", LongType()),
    StructField("count", LongType()),
    StructField("seq", LongType()),
    StructField("info", StringType()),
    # v2 (routers): the owed set of a received/owed line (home router -> space-separated sids), and
    # the segment number of segment_opened/segment_closed
    StructField("owed", MapType(StringType(), StringType())),
    StructField("seg", LongType()),
    # written by the subscriber only (clients.subscriber.SETTLEMENT_FIELDS); optional: older logs
    # do not have it
    StructField("n", LongType()),
])

# JSON type name (as in FIELDS) -> Spark type.
JSON_TYPES: dict[str, DataType] = {"int": LongType(), "float": DoubleType(), "string": StringType(),
                                   "map": MapType(StringType(), StringType())}

# Fields every line carries; a line without one of them is malformed.
REQUIRED = ("v", "ts", "src", "node", "inc", "ev")

# Where from_json puts the text of a line it could not parse (fully) with LOG_SCHEMA.
CORRUPT = "_corrupt"
# The keys of a v2 line (common.settlement_log: short keys, times after the segment header's t0,
# grouped ids) and of its header line; `reconcile.with_status` turns them into LOG_SCHEMA columns.
V2_FIELDS = [
    StructField("t", LongType()),  # microseconds after the header's t0
    StructField("e", StringType()),  # event
    StructField("g", ArrayType(StringType())),  # grouped global ids (common.settlement_log.expand_gids)
    StructField("p", StringType()),  # topic
    StructField("s", StringType()),  # subscription id
    StructField("i", StringType()),  # info
    StructField("o", MapType(StringType(), StringType())),  # owed set
    StructField("h", StringType()),  # a header line: "segment"
    StructField("t0", LongType()),  # header: the segment's time base (unix microseconds)
]
PARSE_SCHEMA = StructType([*LOG_SCHEMA.fields, *V2_FIELDS, StructField(CORRUPT, StringType())])
# A v2 group's ids after the first are written without the first one's leading characters:
GID_PREFIX = 13  # (common.settlement_log.GID_PREFIX)

# Sources.
ROUTER = "router"
PUBLISHER = "publisher"
SUBSCRIBER = "subscriber"

# Every event a writer emits, by source (the same sets as common.settlement_log.*_EVENTS: a test keeps
# them in step). A valid line whose event is not here for its source is counted and ignored.
EVENTS_BY_SOURCE: dict[str, frozenset[str]] = {
    "router": frozenset({
        "router_started", "router_stopped",
        "received", "delivered", "accepted", "rejected", "released", "modified", "ended", "outcome",
        "settled", "placeholder", "placeholder_final", "orphan_final",
        "attach_requested", "subscribed", "resumed", "suspended", "unsubscribed", "expired",
        "forwarded", "forward_received", "remote_ack", "peer_up", "peer_down",
        "owed", "segment_opened", "segment_closed", "claim_refused",
    }),
    "publisher": frozenset({"published", "outcome"}),
    "subscriber": frozenset({"subscribed", "resumed", "unsubscribed", "handed", "duplicate"}),
}

# The events the reconciliation interprets, by source. tests/spark/test_schema.py checks that every
# one of them is an event its writer can emit (common.settlement_log.*_EVENTS).
PUBLISHER_READ = frozenset({"published", "outcome"})
SUBSCRIBER_READ = frozenset({"subscribed", "resumed", "unsubscribed", "handed", "duplicate"})
ROUTER_READ = frozenset({
    "router_started", "router_stopped",
    "subscribed", "resumed", "suspended", "unsubscribed", "expired",
    "received", "delivered", "rejected", "settled",
    "forwarded", "forward_received",
})
# Subscription lifecycle: a start opens a life when none is open, an end closes it.
LIFE_STARTS = frozenset({"subscribed", "resumed"})
LIFE_ENDS = frozenset({"unsubscribed", "expired"})
# Lines kept whatever --since says: they define what was in force and which router runs were alive.
STATE_EVENTS = LIFE_STARTS | LIFE_ENDS | {"suspended", "router_started", "router_stopped",
                                          "peer_up", "peer_down", "segment_opened", "segment_closed"}

# Publisher outcomes that are final. Anything else (RELEASED, MODIFIED, IN_DOUBT, ...) leaves the
# message in doubt.
FINAL_OUTCOMES = ("ACCEPTED", "REJECTED")

# The classes of a (message, subscription) pair (exactly one each; precedence: reconcile.classify).
CLASSES = ("ok", "lost", "duplicated", "unexpected", "in_doubt", "recovered", "ended_before_delivery",
           "false_accept")
# Classes that fail a run (exit code 1).
FAILURES = ("lost", "duplicated", "unexpected", "false_accept")
