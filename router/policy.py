"""The authorization policy: who may publish and subscribe to which topics, and per-user limits
(docs/security.md, "Authorization"). Pure: parsed and validated here, enforced by the router.

A TOML file; rules per user (`[users.NAME]`), per group (`[groups.NAME]`, groups come from the users
file), for anonymous clients (`[anonymous]`) and for everybody (`[defaults]`):

    [defaults]
    max_connections = 100            # per user
    [groups.ops]
    publish = ["orders/#", "audit"]  # topic patterns
    subscribe = ["#"]
    [users.alice]
    max_message_size = 65536
    max_links_per_connection = 50    # links on one connection (the router's own limit still applies)
    manage = true                    # may read the management views (oncemesh stat)

A pattern is a topic filter of the topic tree (common/topics.py): levels separated by `/`, `+` for
exactly one level, `#` (last) for any number of them, zero included (`orders/#` is `orders` and
everything below it). A user may publish to a topic when any pattern of its own entry, its groups'
entries or `[defaults]` matches it; it may subscribe to a filter when one pattern covers it, i.e.
matches every topic the filter can match (`topics.covers`: `orders/#` allows `orders/+/eu`, `+/eu`
is not allowed by it); no such pattern is a refusal. A limit is the user's own if set, else the
largest of its groups', else the default, else none. Without a policy file everything is allowed.

`manage` (true/false) grants the management views (`$management`, `oncemesh stat`), which show
every topic, subscription and connection of the router: like a limit, a user's own setting, else
its groups' (true if any of them says true), else `[defaults]`, else false. Anonymous clients get it only from `[anonymous]` (never
from `[defaults]`): reading the management views without credentials must be asked for by name.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from ..common import topics

LIMITS = ("max_connections", "max_connections_per_host", "max_subscriptions", "max_message_size",
          "max_links_per_connection")
RULE_KEYS = ("publish", "subscribe", "manage", *LIMITS)
TOP_KEYS = ("defaults", "groups", "users", "anonymous")


class PolicyError(ValueError):
    """A policy file that cannot be used: every problem, each with where and what to do."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(problems))
        self.problems = problems


def check_pattern(pattern: str) -> str:
    """A topic pattern, checked: it is a topic filter (common/topics.py); raises ValueError saying why
    not (and, for a pattern of the dot-separated form of earlier versions, what to write instead)."""
    bad = topics.check_filter(pattern)
    if bad is None and "*" not in pattern:
        return pattern
    if "*" in pattern or ("." in pattern and "#" in pattern):
        hint = pattern.replace(".", "/").replace("*", "+")
        raise ValueError(f"pattern {pattern!r}: patterns are topic filters, with levels separated by '/', '+' "
                         f"for one level and '#' for the rest (did you mean {hint!r}?); '*' is no wildcard "
                         f"and not allowed in a pattern")
    raise ValueError(f"pattern {pattern!r}: {bad}")


@dataclass(frozen=True, slots=True)
class Rules:
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    limits: dict[str, int] = field(default_factory=dict)
    manage: bool | None = None  # None: not said here


@dataclass(frozen=True, slots=True)
class Grants:
    """What one user may do."""

    publish: tuple[str, ...]  # topic filters (`check_pattern`)
    subscribe: tuple[str, ...]
    limits: dict[str, int]
    manage: bool = False  # may read the management views

    def may_publish(self, topic: str) -> bool:
        """May the user publish to topic name `topic`?"""
        return any(topics.matches(p, topic) for p in self.publish)

    def may_subscribe(self, topic_filter: str) -> bool:
        """May the user subscribe to `topic_filter`: does one pattern match every topic it can match?"""
        return any(topics.covers(p, topic_filter) for p in self.subscribe)

    def limit(self, name: str) -> int | None:
        return self.limits.get(name)


@dataclass(frozen=True, slots=True)
class Policy:
    defaults: Rules
    groups: dict[str, Rules]
    users: dict[str, Rules]
    anonymous: Rules
    source: str = "<policy>"

    def grants(self, user: str, groups: Iterable[str] = ()) -> Grants:
        if user == "anonymous":
            entries = [self.anonymous, self.defaults]
            own = self.anonymous
            group_rules: list[Rules] = []
        else:
            own = self.users.get(user, Rules())
            group_rules = [self.groups[g] for g in groups if g in self.groups]
            entries = [own, *group_rules, self.defaults]
        publish = tuple(p for e in entries for p in e.publish)
        subscribe = tuple(p for e in entries for p in e.subscribe)
        limits = {}
        for name in LIMITS:
            if name in own.limits:
                limits[name] = own.limits[name]
            elif any(name in g.limits for g in group_rules):
                limits[name] = max(g.limits[name] for g in group_rules if name in g.limits)
            elif name in self.defaults.limits:
                limits[name] = self.defaults.limits[name]
        if user == "anonymous":
            manage = bool(self.anonymous.manage)
        elif own.manage is not None:
            manage = own.manage
        elif any(g.manage is not None for g in group_rules):
            manage = any(g.manage for g in group_rules)
        else:
            manage = bool(self.defaults.manage)
        return Grants(publish, subscribe, limits, manage)


def _suggest(word: str, valid: Iterable[str]) -> str:
    close = get_close_matches(word, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _rules(value: Any, where: str, problems: list[str]) -> Rules:
    if not isinstance(value, dict):
        problems.append(f"{where} must be a table, got {type(value).__name__}")
        return Rules()
    pats: dict[str, tuple[str, ...]] = {}
    limits: dict[str, int] = {}
    manage: bool | None = None
    for k, v in value.items():
        if k in ("publish", "subscribe"):
            if not isinstance(v, list) or not all(isinstance(p, str) for p in v):
                problems.append(f"{where}.{k} must be a list of topic patterns, e.g. [\"orders/+\"]")
                continue
            for p in v:
                try:
                    check_pattern(p)
                except ValueError as exc:
                    problems.append(f"{where}.{k}: {exc}")
            pats[k] = tuple(v)
        elif k in LIMITS:
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                problems.append(f"{where}.{k} must be a whole number >= 0, got {v!r}")
                continue
            limits[k] = v
        elif k == "manage":
            if not isinstance(v, bool):
                problems.append(f"{where}.manage must be true or false, got {v!r}")
                continue
            manage = v
        else:
            problems.append(f"unknown key {where}.{k}{_suggest(k, RULE_KEYS)}; known: {', '.join(RULE_KEYS)}")
    return Rules(pats.get("publish", ()), pats.get("subscribe", ()), limits, manage)


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(source, [f"not valid TOML: {exc}"]) from None
    problems: list[str] = []
    for k in doc:
        if k not in TOP_KEYS:
            problems.append(f"unknown table [{k}]{_suggest(k, TOP_KEYS)}; known: {', '.join(TOP_KEYS)}")
    defaults = _rules(doc.get("defaults", {}), "defaults", problems)
    anonymous = _rules(doc.get("anonymous", {}), "anonymous", problems)
    named: dict[str, dict[str, Rules]] = {}
    for kind in ("groups", "users"):
        table = doc.get(kind, {})
        if not isinstance(table, dict):
            problems.append(f"[{kind}] must hold tables, e.g. [{kind}.NAME]")
            table = {}
        named[kind] = {name: _rules(v, f"{kind}.{name}", problems) for name, v in table.items()}
    if problems:
        raise PolicyError(source, problems)
    return Policy(defaults, named["groups"], named["users"], anonymous, source)


def load_policy(path: Path) -> Policy:
    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyError(str(path), [f"cannot read it: {exc.strerror or exc}"]) from None
    return parse_policy(text, str(path))
