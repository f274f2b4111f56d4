"""The topic tree (common/topics.py): MQTT's rules for names, filters and matching, by example; the
index against the reference rule under random subscribe/unsubscribe churn; no node left behind."""

from __future__ import annotations

import itertools
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from oncemesh.common.topics import MAX_TOPIC_BYTES, TopicIndex, check_filter, check_name, covers, matches

# ------------------------------------------------------------------ names and filters


@pytest.mark.parametrize("name", ["a", "a/b/c", "a//b", "/a", "a/", "/", "//", "$SYS/x", "sport tennis",
                                  "ünï/cödé", "a" * MAX_TOPIC_BYTES, "é" * (MAX_TOPIC_BYTES // 2)])
def test_names_a_message_may_be_published_to(name: str) -> None:
    assert check_name(name) is None


@pytest.mark.parametrize("name, why", [
    ("", "at least one"),
    ("a/+", "wildcard"), ("+", "wildcard"), ("a/#", "wildcard"), ("#", "wildcard"),
    ("a+b", "wildcard"), ("a#", "wildcard"),
    ("a\0b", "NUL"),
    ("a" * (MAX_TOPIC_BYTES + 1), "65535 bytes"),
    ("é" * (MAX_TOPIC_BYTES // 2 + 1), "65535 bytes"),  # counted in UTF-8 bytes, not characters
    ("a\ud800", "UTF-8"),
])
def test_names_refused_say_why(name: str, why: str) -> None:
    reason = check_name(name)
    assert reason is not None and why in reason


@pytest.mark.parametrize("f", ["a", "a/b", "#", "+", "+/+", "a/#", "a/+/b", "+/#", "a/+/#", "/#", "+/",
                               "a//+", "$SYS/#", "a" * MAX_TOPIC_BYTES])
def test_valid_filters(f: str) -> None:
    assert check_filter(f) is None


@pytest.mark.parametrize("f, why", [
    ("", "at least one"),
    ("a#", "whole level"), ("#a", "whole level"), ("a/b#", "whole level"), ("##", "whole level"),
    ("a/#/b", "last level"), ("#/a", "last level"), ("#/#", "last level"), ("a/#/", "last level"),
    ("a+/b", "whole level"), ("+a", "whole level"), ("a/+b/c", "whole level"), ("++", "whole level"),
    ("a\0", "NUL"),
    ("a" * (MAX_TOPIC_BYTES + 1), "bytes"),
])
def test_invalid_filters_say_why(f: str, why: str) -> None:
    reason = check_filter(f)
    assert reason is not None and why in reason


def test_an_invalid_filter_is_refused_by_the_index() -> None:
    idx: TopicIndex[str] = TopicIndex()
    for bad in ("a/#/b", "a+", ""):
        with pytest.raises(ValueError, match="invalid topic filter"):
            idx.add(bad, "k")
    assert len(idx) == 0


# ------------------------------------------------------------------ matching, by example

MATCHES = [
    # (filter, topic, matches)
    ("a/b", "a/b", True), ("a/b", "a/c", False), ("a/b", "a/b/c", False), ("a/b", "a", False),
    ("A/b", "a/b", False),                                   # levels compare exactly
    # '#': the parent level and any number below it (MQTT 4.7.1.2)
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True), ("sport/#", "sport/", True), ("sport/#", "sports", False),
    ("sport/#", "other/sport", False),
    ("#", "a", True), ("#", "a/b/c", True), ("#", "/", True), ("#", "/a", True),
    ("/#", "/a", True), ("/#", "a", False),
    # '+': exactly one level, an empty one included (MQTT 4.7.1.3)
    ("sport/tennis/+", "sport/tennis/player1", True), ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False), ("sport/+", "sport/", True),
    ("+", "a", True), ("+", "/a", False), ("+/+", "/a", True), ("/+", "/a", True), ("+", "", True),
    ("a/+/c", "a//c", True), ("a/+/c", "a/c", False), ("+/+/+", "//", True),
    ("+/tennis/#", "sport/tennis", True), ("+/tennis/#", "sport/tennis/x/y", True),
    ("+/#", "a", True), ("a/+/#", "a", False), ("a/+/#", "a/b", True),
    # '$' names: a wildcard at the first level does not reach them (MQTT 4.7.2)
    ("#", "$SYS/monitor/Clients", False), ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("+", "$x", False), ("+/#", "$x/y", False),
    ("$SYS/#", "$SYS/monitor/Clients", True), ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True), ("$SYS", "$SYS", True),
    ("a/+", "a/$x", True), ("a/#", "a/$x", True),            # only the name's first character counts
    ("+/$x", "a/$x", True),
]


@pytest.mark.parametrize("f, topic, want", MATCHES)
def test_matches_follows_mqtt(f: str, topic: str, want: bool) -> None:
    assert check_filter(f) is None and (topic == "" or check_name(topic) is None)
    assert matches(f, topic) is want


@pytest.mark.parametrize("f, topic, want", [m for m in MATCHES if m[1]])
def test_the_index_matches_each_example_like_the_rule(f: str, topic: str, want: bool) -> None:
    idx: TopicIndex[str] = TopicIndex()
    idx.add(f, "k")
    idx.add("unrelated/x", "other")
    assert idx.match(topic) == ({"k"} if want else set())


def test_a_key_under_several_matching_filters_is_reached_once_and_entries_count_pairs() -> None:
    idx: TopicIndex[str] = TopicIndex()
    for f in ("a/b", "a/+", "#", "a/#", "+/b"):
        idx.add(f, "s1")
    idx.add("a/b", "s1")          # the same pair again: one entry
    idx.add("a/b", "s2")
    assert len(idx) == 6
    assert idx.match("a/b") == {"s1", "s2"}
    assert dict(idx.filters()) == {"a/b": frozenset({"s1", "s2"}), "a/+": frozenset({"s1"}),
                                   "#": frozenset({"s1"}), "a/#": frozenset({"s1"}), "+/b": frozenset({"s1"})}
    idx.discard("a/b", "s1")
    assert idx.match("a/b") == {"s1", "s2"}  # still reached through its wildcards
    for f in ("a/+", "#", "a/#", "+/b", "nothing/here", "a/#/b"):
        idx.discard(f, "s1")
    idx.discard("a/b", "s3")      # absent: nothing happens
    assert idx.match("a/b") == {"s2"} and len(idx) == 1


def test_the_returned_set_is_the_callers() -> None:
    idx: TopicIndex[str] = TopicIndex()
    idx.add("a", "k")
    idx.add("+", "w")
    idx.match("a").clear()
    assert idx.match("a") == {"k", "w"}


# ------------------------------------------------------------------ matching, against references

LEVELS = ["a", "b", "", "$x"]
TOPICS = ["/".join(p) for n in range(1, 5) for p in itertools.product(LEVELS, repeat=n)]


def regex_reference(f: str, topic: str) -> bool:
    """The rule said another way: a filter as a regular expression over the whole name."""
    parts = f.split("/")
    if topic.startswith("$") and parts[0] in ("+", "#"):
        return False
    if parts[-1] == "#":
        body = "/".join("[^/]*" if p == "+" else re.escape(p) for p in parts[:-1])
        pattern = ".*" if len(parts) == 1 else body + "(/.*)?"
    else:
        pattern = "/".join("[^/]*" if p == "+" else re.escape(p) for p in parts)
    return re.fullmatch(pattern, topic, re.DOTALL) is not None


FILTERS = st.builds(
    lambda levels, rest: "/".join(levels + (["#"] if rest else [])),
    st.lists(st.sampled_from([*LEVELS, "+"]), min_size=0, max_size=4),
    st.booleans(),
).filter(lambda f: f != "")
NAMES = st.sampled_from(TOPICS)


@given(FILTERS, NAMES)
def test_matches_agrees_with_a_regular_expression_reference(f: str, topic: str) -> None:
    assert check_filter(f) is None
    assert matches(f, topic) == regex_reference(f, topic)


# ------------------------------------------------------------------ one filter covering another

SHORT_FILTERS = st.builds(
    lambda levels, rest: "/".join(levels + (["#"] if rest else [])),
    st.lists(st.sampled_from([*LEVELS, "+"]), min_size=0, max_size=3),
    st.booleans(),
).filter(lambda f: f != "")
# every name a filter of at most 4 levels can tell apart: its levels, a level none of them names
# ('z', what a wildcard stands for), and one level more than the longest filter
WITNESSES = ["/".join(p) for n in range(1, 6) for p in itertools.product([*LEVELS, "z"], repeat=n)]


@given(SHORT_FILTERS, SHORT_FILTERS)
@settings(max_examples=150, deadline=None)
def test_covers_is_exactly_inclusion_of_the_names_matched(outer: str, inner: str) -> None:
    """`covers(outer, inner)` holds exactly when no name is matched by `inner` and not by `outer`."""
    escape = next((t for t in WITNESSES if matches(inner, t) and not matches(outer, t)), None)
    assert covers(outer, inner) == (escape is None), escape


@pytest.mark.parametrize("outer, inner, want", [
    ("#", "a/+/b", True), ("a/#", "a", True), ("a/#", "a/b/#", True), ("a/+", "a/b", True),
    ("a/+", "a/#", False), ("a/+", "a/+/b", False), ("a/b", "a/+", False), ("+", "#", False),
    ("#", "$SYS/#", False), ("+/#", "$SYS/x", False), ("$SYS/#", "$SYS/+", True), ("a", "a", True),
    ("a/b/#", "a/#", False), ("+/+", "a/b", True), ("a/+/c", "a/+/c", True), ("a/+/c", "a/+/d", False),
])
def test_covers_by_example(outer: str, inner: str, want: bool) -> None:
    assert covers(outer, inner) is want


class IndexAgainstScan(RuleBasedStateMachine):
    """Random subscribe/unsubscribe over a small alphabet of levels (so that matches are frequent):
    after every step the index gives, for every name, what a scan of its entries with `matches` gives."""

    def __init__(self) -> None:
        super().__init__()
        self.idx: TopicIndex[int] = TopicIndex()
        self.entries: set[tuple[str, int]] = set()

    @rule(f=FILTERS, key=st.integers(0, 5))
    def add(self, f: str, key: int) -> None:
        self.idx.add(f, key)
        self.entries.add((f, key))

    @rule(f=FILTERS, key=st.integers(0, 5))
    def discard_any(self, f: str, key: int) -> None:
        self.idx.discard(f, key)
        self.entries.discard((f, key))

    @rule(data=st.data())
    def discard_held(self, data: st.DataObject) -> None:
        if self.entries:
            f, key = data.draw(st.sampled_from(sorted(self.entries)))
            self.idx.discard(f, key)
            self.entries.discard((f, key))

    @invariant()
    def matches_the_scan(self) -> None:
        assert len(self.idx) == len(self.entries)
        for topic in TOPICS:
            assert self.idx.match(topic) == {k for (f, k) in self.entries if matches(f, topic)}, topic

    @invariant()
    def filters_are_the_entries(self) -> None:
        assert {(f, k) for f, keys in self.idx.filters() for k in keys} == self.entries

    def teardown(self) -> None:
        for f, key in sorted(self.entries):
            self.idx.discard(f, key)
        assert len(self.idx) == 0
        assert self.idx.node_count() == 0
        assert list(self.idx.filters()) == []
        assert all(self.idx.match(t) == set() for t in TOPICS)


TestIndexAgainstScan = IndexAgainstScan.TestCase
TestIndexAgainstScan.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)


@given(st.lists(st.tuples(FILTERS, st.integers(0, 3)), max_size=25), st.randoms(use_true_random=False))
@settings(deadline=None)
def test_discarding_everything_in_any_order_leaves_no_node(pairs: list[tuple[str, int]],
                                                               rnd: random.Random) -> None:
    idx: TopicIndex[int] = TopicIndex()
    for f, k in pairs:
        idx.add(f, k)
    held = sorted(set(pairs))
    rnd.shuffle(held)
    for f, k in held:
        idx.discard(f, k)
    assert len(idx) == 0 and idx.node_count() == 0


def test_node_count_counts_the_wildcard_trie() -> None:
    idx: TopicIndex[str] = TopicIndex()
    idx.add("a/b", "literal")       # literal filters are not in the trie
    assert idx.node_count() == 0
    idx.add("a/+/c", "k")           # a -> + -> c
    idx.add("a/#", "k")             # ends at a
    assert idx.node_count() == 3
    idx.discard("a/+/c", "k")
    assert idx.node_count() == 1    # a still holds a/#
    idx.discard("a/#", "k")
    assert idx.node_count() == 0
