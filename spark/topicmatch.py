"""The topic tree's matching rule in Spark (common/topics.py is the reference): which subscription
lives a message's topic reaches, when a subscription's topic may be a wildcard filter.

Both views of the judge pair each message with the subscriptions whose lives were in force when it
was published (reconcile.owed_pairs, routerview.in_force). A subscription's `topic` is its filter;
most filters are names. Both kinds pair in one equi-join on the first level (`join_by_filter` says
how), whose condition is equality for names and, for filters with `+` or `#`, the rule itself as one
SQL expression (split into levels, compare level by level, '#' for the rest, the '$' rule). No Python
UDF: the expression runs in the JVM.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def matches_sql(filt: str, topic: str) -> str:
    """SQL text: does the filter in column `filt` match the name in column `topic` (MQTT's rules,
    as common/topics.matches)."""
    f = f"split({filt}, '/', -1)"
    t = f"split({topic}, '/', -1)"
    rest = f"(element_at({f}, -1) = '#')"
    n = f"(size({f}) - if({rest}, 1, 0))"
    levels = (f"forall(zip_with(slice({f}, 1, {n}), slice({t}, 1, {n}), (a, b) -> a = '+' OR a = b), "
              f"x -> x)")
    length = f"if({rest}, size({t}) >= {n}, size({t}) = {n})"
    dollar = f"NOT (substr({topic}, 1, 1) = '$' AND element_at({f}, 1) IN ('+', '#'))"
    return f"({length} AND {dollar} AND {levels})"


_ANY = "\\u0000"  # (SQL text) the join key of filters whose first level is a wildcard: no level is it


def _first_level(col: str) -> str:
    return f"split({col}, '/', 2)[0]"


def join_by_filter(msgs: DataFrame, lives: DataFrame) -> DataFrame:
    """`msgs` (a `topic` column: a name) joined with `lives` (a `topic` column: a filter) where the
    filter matches the name: the columns of both, `topic` the message's.

    One equi-join, on the first level: a filter whose first level is a name can only match names
    with that first level; one whose first level is a wildcard (`+`, `#`) gets the key no name has,
    and every message is offered under that key too (two rows each). The join's condition is then
    equality for a filter without wildcards (a name: what the join on topics was) and the tree's rule
    for the others. (Not a broadcast nested-loop join: a broadcast is a Spark job of its own, and a
    short run plans at most ten.)"""
    m = msgs.withColumn("_k", F.explode(F.array(F.expr(_first_level("topic")), F.expr(f"'{_ANY}'"))))
    key = (f"CASE WHEN {_first_level('_filter')} IN ('+', '#') THEN '{_ANY}' "
           f"ELSE {_first_level('_filter')} END")
    lv = lives.withColumnRenamed("topic", "_filter").withColumn("_k", F.expr(key))
    wild = "(instr(_filter, '+') > 0 OR instr(_filter, '#') > 0)"
    cond = f"CASE WHEN {wild} THEN {matches_sql('_filter', 'topic')} ELSE _filter = topic END"
    return m.join(lv, "_k").where(F.expr(cond)).drop("_k", "_filter")
