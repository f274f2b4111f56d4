"""The topic tree's matching rule in Spark (common/topics.py is the reference): which subscription
lives a message's topic reaches, when a subscription's topic may be a wildcard filter.

Both views of the judge pair each message with the subscriptions whose lives were in force when it
was published (reconcile.owed_pairs, routerview.in_force). A subscription's `topic` is its filter;
most filters are names, and those pair by an equi-join on the topic, as they always did. Filters with
`+` or `#` are few (a subscription each, against messages by the million): they pair in a second,
broadcast join whose condition is the rule itself as one SQL expression (split into levels, compare
level by level, '#' for the rest, the '$' rule), and the two are united. No Python UDF: the
expression runs in the JVM.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
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


def is_wildcard(filt: str = "topic") -> Column:
    """Whether the filter in column `filt` has a wildcard."""
    return F.expr(f"instr({filt}, '+') > 0 OR instr({filt}, '#') > 0")


def join_by_filter(msgs: DataFrame, lives: DataFrame) -> DataFrame:
    """`msgs` (a `topic` column: a name) joined with `lives` (a `topic` column: a filter) where the
    filter matches the name: the columns of both, `topic` the message's."""
    wild = is_wildcard()
    by_name = msgs.join(lives.where(~wild), "topic")
    filters = lives.where(wild).withColumnRenamed("topic", "_filter")
    by_filter = msgs.join(F.broadcast(filters), F.expr(matches_sql("_filter", "topic"))).drop("_filter")
    return by_name.unionByName(by_filter)
