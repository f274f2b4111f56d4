"""The authorization policy (router/policy.py): patterns against a reference matcher, how rules
combine, and errors a person can act on."""

from __future__ import annotations

import re

import pytest

from oncemesh.router.policy import PolicyError, check_pattern, parse_policy


@pytest.mark.parametrize("bad, hint", [("", "at least one"), ("a/#/b", "last level"), ("ord*", "'ord+'"),
                                       ("orders.#", "'orders/#'"), ("orders.*", "'orders/+'"), ("a+", "whole level")])
def test_malformed_patterns_are_refused_saying_what_to_write(bad: str, hint: str) -> None:
    with pytest.raises(ValueError, match=re.escape(hint)):
        check_pattern(bad)


POLICY = """
[defaults]
subscribe = ["public/#"]
max_connections = 10

[groups.ops]
publish = ["orders/+"]
max_connections = 50
max_message_size = 1000

[groups.audit]
subscribe = ["#"]
max_connections = 20

[users.alice]
publish = ["alice/#"]
max_message_size = 100

[anonymous]
subscribe = ["news"]
"""


def test_rules_combine_user_groups_and_defaults() -> None:
    p = parse_policy(POLICY)
    alice = p.grants("alice", ["ops"])
    assert alice.may_publish("alice/x/y") and alice.may_publish("orders/eu") and not alice.may_publish("orders")
    assert alice.may_publish("alice") and not alice.may_publish("orders/eu/x")
    assert alice.may_subscribe("public/a") and not alice.may_subscribe("orders/eu")
    # a filter is allowed where one pattern matches every topic it can match
    assert alice.may_subscribe("public/+/x") and alice.may_subscribe("public/#") and alice.may_subscribe("public")
    assert not alice.may_subscribe("#") and not alice.may_subscribe("+/a") and not alice.may_subscribe("publi")
    assert alice.limit("max_message_size") == 100  # her own
    assert alice.limit("max_connections") == 50  # the largest of her groups'
    carol = p.grants("carol", ["ops", "audit"])
    assert carol.may_subscribe("orders/eu") and carol.may_subscribe("#") and carol.limit("max_connections") == 50
    assert carol.limit("max_subscriptions") is None  # set nowhere: none
    nobody = p.grants("dave", [])
    assert not nobody.may_publish("anything") and nobody.limit("max_connections") == 10
    anon = p.grants("anonymous")
    assert anon.may_subscribe("news") and anon.may_subscribe("public/x") and not anon.may_publish("news")
    assert not anon.may_subscribe("news/#") and not anon.may_subscribe("+")


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
    assert "groups.ops.publish: pattern 'ord*': patterns are topic filters" in text
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
