"""The authorization policy (router/policy.py): patterns against a reference matcher, how rules
combine, and errors a person can act on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncemesh.router.policy import PolicyError, compile_pattern, parse_policy, topic_matches


def reference(pattern: list[str], topic: list[str]) -> bool:
    """Segment by segment: '*' one segment, '#' any number."""
    if not pattern:
        return not topic
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(reference(rest, topic[i:]) for i in range(len(topic) + 1))
    return bool(topic) and (head == "*" or head == topic[0]) and reference(rest, topic[1:])


SEG = st.sampled_from(["a", "b", "orders", "eu"])


@given(st.lists(st.one_of(SEG, st.just("*"), st.just("#")), min_size=1, max_size=5),
       st.lists(SEG, min_size=1, max_size=5))
def test_patterns_match_like_the_reference(pattern: list[str], topic: list[str]) -> None:
    assert topic_matches(compile_pattern(".".join(pattern)), ".".join(topic)) == reference(pattern, topic)


@pytest.mark.parametrize("bad", ["", ".a", "a.", "a..b", "ord*", "a.b#"])
def test_malformed_patterns_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        compile_pattern(bad)


POLICY = """
[defaults]
subscribe = ["public.#"]
max_connections = 10

[groups.ops]
publish = ["orders.*"]
max_connections = 50
max_message_size = 1000

[groups.audit]
subscribe = ["#"]
max_connections = 20

[users.alice]
publish = ["alice.#"]
max_message_size = 100

[anonymous]
subscribe = ["news"]
"""


def test_rules_combine_user_groups_and_defaults() -> None:
    p = parse_policy(POLICY)
    alice = p.grants("alice", ["ops"])
    assert alice.may_publish("alice.x.y") and alice.may_publish("orders.eu") and not alice.may_publish("orders")
    assert alice.may_subscribe("public.a") and not alice.may_subscribe("orders.eu")
    assert alice.limit("max_message_size") == 100  # her own
    assert alice.limit("max_connections") == 50  # the largest of her groups'
    carol = p.grants("carol", ["ops", "audit"])
    assert carol.may_subscribe("orders.eu") and carol.limit("max_connections") == 50
    assert carol.limit("max_subscriptions") is None  # set nowhere: none
    nobody = p.grants("dave", [])
    assert not nobody.may_publish("anything") and nobody.limit("max_connections") == 10
    anon = p.grants("anonymous")
    assert anon.may_subscribe("news") and anon.may_subscribe("public.x") and not anon.may_publish("news")


def test_every_problem_is_reported_with_where_and_what_to_do() -> None:
    with pytest.raises(PolicyError) as ei:
        parse_policy("""
[defualts]
[users.alice]
publsh = ["a"]
subscribe = "b"
max_connections = -1
[groups.ops]
publish = ["ord*"]
""", "p.toml")
    text = str(ei.value)
    assert text.startswith("p.toml: ") and len(ei.value.problems) == 5
    assert "unknown table [defualts] (did you mean 'defaults'?)" in text
    assert "unknown key users.alice.publsh (did you mean 'publish'?)" in text
    assert "users.alice.subscribe must be a list of topic patterns" in text
    assert "users.alice.max_connections must be a whole number >= 0" in text
    assert "groups.ops.publish: pattern 'ord*'" in text
    with pytest.raises(PolicyError, match="not valid TOML"):
        parse_policy("[users", "q.toml")


def test_manage_is_granted_by_name_and_to_anonymous_only_from_its_own_table() -> None:
    p = parse_policy("""
[defaults]
manage = true
[groups.ops]
manage = false
[groups.audit]
subscribe = ["#"]
[groups.admins]
manage = true
[users.eve]
manage = false
[users.root]
manage = true
""")
    assert p.grants("alice").manage  # [defaults]
    assert not p.grants("alice", ["ops"]).manage  # her group's word, before the default's
    assert p.grants("alice", ["ops", "audit"]).manage is False  # (audit says nothing)
    assert not p.grants("eve").manage and p.grants("root", ["ops"]).manage  # one's own word wins
    assert p.grants("carol", ["ops", "admins"]).manage  # any of her groups
    assert not p.grants("anonymous").manage  # never from [defaults]
    assert parse_policy("[anonymous]\nmanage = true\n").grants("anonymous").manage
    assert not parse_policy("").grants("alice").manage  # a policy that says nothing grants nothing
    with pytest.raises(PolicyError, match="users.bob.manage must be true or false"):
        parse_policy('[users.bob]\nmanage = "yes"\n')
