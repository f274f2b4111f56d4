"""The topic tree: topic names, topic filters, and an index of filters that matches a name (sans-IO).

Theory of operation
-------------------
A topic name is a string of levels separated by ``/``; a subscription names a topic *filter*, the same
shape where a level may be a wildcard. The rules are MQTT's (3.1.1 section 4.7, 5.0 section 4.7),
restated here in our words:

- Levels (MQTT 4.7.1.1). ``/`` separates levels; a level may be empty, so ``a//b`` has three levels,
  ``/a`` and ``a/`` two each. Levels compare as exact strings (case and spaces count).
- ``#``, the multi-level wildcard (MQTT 4.7.1.2), stands for the parent level and any number of levels
  below it: it occupies a whole level and is the last level of the filter. ``sport/#`` matches
  ``sport``, ``sport/`` and ``sport/tennis/player1``; ``#`` alone matches every name (but see ``$``).
- ``+``, the single-level wildcard (MQTT 4.7.1.3), stands for exactly one level, an empty one
  included: it occupies a whole level and may appear at any level, several times. ``sport/+`` matches
  ``sport/`` but neither ``sport`` nor ``sport/tennis/x``; ``+/+`` matches ``/x``.
- ``$`` names (MQTT 4.7.2). A filter whose *first* level is a wildcard does not match a name that starts
  with ``$`` (such names are the server's own, e.g. ``$SYS/...``); ``$SYS/#`` and ``$SYS/+/x`` do.
- Names and filters (MQTT 4.7.3, and 1.5.3 for strings) are at least one character, contain no NUL
  (U+0000), encode as well-formed UTF-8 and are at most ``MAX_TOPIC_BYTES`` (65,535) bytes in UTF-8,
  MQTT's cap. A name a message is *published* to contains no wildcard character at all: publishing to
  a filter is refused (MQTT 3.3.2.1: a PUBLISH's topic name has no wildcards).

``check_name``/``check_filter`` say why a string is refused (``None`` when it is fine); ``matches`` is
the reference rule, one pair at a time; ``TopicIndex`` answers "which subscriptions does this name
reach" without scanning them.

Why the index is built this way
-------------------------------
- Literal filters (no wildcard) are the common case, and a literal filter matches exactly one name: they
  live in a dict from the name to its keys, one lookup per message whatever their number.
- Wildcard filters live in a trie keyed by level. A node has its literal children (a dict by level), a
  ``+`` child (kept apart from the dict, so that no topic level can ever be taken for a wildcard),
  the keys of filters that end at it, and the keys of filters that end with ``#`` below it. A match
  walks the name's levels once, following at each level the literal child and the ``+`` child of every
  node reached so far, and collects ``#`` keys on the way: its cost grows with the name's depth and the
  number of wildcard branches the name meets, never with the number of subscriptions. With no wildcard
  filter at all, the trie is empty and a match is the dict lookup alone.
- Nodes are removed as soon as they hold nothing (no child, no key), so a subscribe/unsubscribe churn
  leaves the trie as it found it; ``node_count`` lets tests check that.
- A key may be under several filters; ``match`` returns a set, so it is reached once. The set is a new
  one each call (the caller may keep or change it); a caller that iterates it where order matters (the
  simulator's replay) sorts it, since a set's order follows the hash seed.

The index trusts its callers on names: ``match`` does not check the name (the publishing path checks it
once with ``check_name``); ``add`` refuses an invalid filter with ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

MAX_TOPIC_BYTES = 65_535
"""The longest name or filter, in UTF-8 bytes: MQTT's cap (a two-byte length prefix)."""

SEP = "/"
ONE = "+"
REST = "#"

K = TypeVar("K", bound=Hashable)


def _check_string(s: str, what: str) -> str | None:
    if not s:
        return f"a {what} is at least one character"
    if "\0" in s:
        return f"a {what} contains no NUL character"
    try:
        n = len(s.encode("utf-8"))
    except UnicodeEncodeError:
        return f"a {what} is well-formed UTF-8 (no lone surrogates)"
    if n > MAX_TOPIC_BYTES:
        return f"a {what} is at most {MAX_TOPIC_BYTES} bytes in UTF-8 (this one is {n})"
    return None


def check_name(topic: str) -> str | None:
    """Why `topic` is not a name a message may be published to, or None when it is one."""
    if ONE in topic or REST in topic:
        return "a topic published to has no wildcard ('+' or '#'); those belong in subscriptions' filters"
    return _check_string(topic, "topic name")


def check_filter(topic_filter: str) -> str | None:
    """Why `topic_filter` is not a valid filter, or None when it is one (MQTT 4.7.1)."""
    bad = _check_string(topic_filter, "topic filter")
    if bad is not None:
        return bad
    if ONE not in topic_filter and REST not in topic_filter:
        return None
    levels = topic_filter.split(SEP)
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if REST in level:
            if level != REST:
                return f"'#' takes a whole level (level {i + 1} is {level!r})"
            if i != last:
                return "'#' is the last level of a filter"
        if ONE in level and level != ONE:
            return f"'+' takes a whole level (level {i + 1} is {level!r})"
    return None


def is_wildcard(topic_filter: str) -> bool:
    """Whether a (valid) filter has a wildcard, i.e. may match more than the name it spells."""
    return ONE in topic_filter or REST in topic_filter


def matches(topic_filter: str, topic: str) -> bool:
    """Whether `topic_filter` matches the name `topic` (both valid): the reference rule, pair by pair."""
    f = topic_filter.split(SEP)
    t = topic.split(SEP)
    if topic.startswith("$") and f[0] in (ONE, REST):
        return False
    for i, level in enumerate(f):
        if level == REST:
            return True  # the rest of the name, none included ('a/#' matches 'a')
        if i >= len(t):
            return False
        if level != ONE and level != t[i]:
            return False
    return len(f) == len(t)


def covers(outer: str, inner: str) -> bool:
    """Whether every name that filter `inner` matches is matched by filter `outer` (both valid): the
    rule by which an authorization pattern allows a subscription's filter (router/policy.py). A
    literal `inner` is a name, and then this is `matches(outer, inner)`."""
    o = outer.split(SEP)
    n = inner.split(SEP)
    if o[0] in (ONE, REST) and n[0] not in (ONE, REST) and n[0].startswith("$"):
        return False  # inner matches '$' names, which a first-level wildcard never does
    for i, level in enumerate(o):
        if level == REST:
            return True  # every rest of a name, none included
        if i >= len(n):
            return False  # inner's names end here, outer's go on
        x = n[i]
        if x == REST:
            # inner also matches every longer name and the one that ends before this level (but at
            # the first level there is none: a name has a level), which only '#' here, or '+/#' at
            # the first level, matches too
            return i == 0 and level == ONE and o[1:] == [REST]
        if level == ONE:
            continue
        if x == ONE or x != level:
            return False
    return len(n) == len(o)


class _Node(Generic[K]):
    """A trie node: what hangs below one level of a wildcard filter."""

    __slots__ = ("children", "plus", "here", "rest")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K]] = {}
        self.plus: _Node[K] | None = None
        self.here: set[K] | None = None  # keys of the filters that end at this node
        self.rest: set[K] | None = None  # keys of the filters that end with '#' just below it

    def empty(self) -> bool:
        return not self.children and self.plus is None and not self.here and not self.rest


class TopicIndex(Generic[K]):
    """Filters and their keys (e.g. subscription ids); `match(name)` gives every key whose filter matches.

    Literal filters are in a dict by name, wildcard filters in a trie by level (the module's docstring
    says why). Entries are (filter, key) pairs: adding one twice keeps one, discarding one absent is a
    no-op.
    """

    __slots__ = ("_exact", "_root", "_wild", "_entries")

    def __init__(self) -> None:
        self._exact: dict[str, set[K]] = {}
        self._root: _Node[K] = _Node()
        self._wild: dict[str, set[K]] = {}  # wildcard filter -> its keys (for filters() and len)
        self._entries = 0

    def __len__(self) -> int:
        """The number of (filter, key) entries."""
        return self._entries

    def filters(self) -> Iterator[tuple[str, frozenset[K]]]:
        """Every filter in the index with its keys (literal filters first; in no promised order)."""
        for f, keys in self._exact.items():
            yield f, frozenset(keys)
        for f, keys in self._wild.items():
            yield f, frozenset(keys)

    def node_count(self) -> int:
        """Nodes of the wildcard trie below its root (0 when no wildcard filter is held)."""
        count = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            below = list(node.children.values())
            if node.plus is not None:
                below.append(node.plus)
            count += len(below)
            stack.extend(below)
        return count

    def add(self, topic_filter: str, key: K) -> None:
        """Hold `key` under `topic_filter`; ValueError if the filter is not valid."""
        bad = check_filter(topic_filter)
        if bad is not None:
            raise ValueError(f"invalid topic filter {topic_filter!r}: {bad}")
        if not is_wildcard(topic_filter):
            keys = self._exact.get(topic_filter)
            if keys is None:
                keys = self._exact[topic_filter] = set()
        else:
            keys = self._wild.get(topic_filter)
            if keys is None:
                keys = self._wild[topic_filter] = self._slot(topic_filter)
        if key not in keys:
            keys.add(key)
            self._entries += 1

    def _slot(self, topic_filter: str) -> set[K]:
        """The trie's set for a wildcard filter, its nodes made on the way (the same set `_wild` holds)."""
        levels = topic_filter.split(SEP)
        node = self._root
        for level in levels[:-1] if levels[-1] == REST else levels:
            if level == ONE:
                if node.plus is None:
                    node.plus = _Node()
                node = node.plus
            else:
                child = node.children.get(level)
                if child is None:
                    child = node.children[level] = _Node()
                node = child
        if levels[-1] == REST:
            if node.rest is None:
                node.rest = set()
            return node.rest
        if node.here is None:
            node.here = set()
        return node.here

    def discard(self, topic_filter: str, key: K) -> None:
        """Stop holding `key` under `topic_filter` (nothing happens if it was not held)."""
        exact = self._exact.get(topic_filter)
        if exact is not None:
            if key in exact:
                exact.discard(key)
                self._entries -= 1
                if not exact:
                    del self._exact[topic_filter]
            return
        keys = self._wild.get(topic_filter)
        if keys is None or key not in keys:
            return
        keys.discard(key)
        self._entries -= 1
        if keys:
            return
        del self._wild[topic_filter]
        self._prune(topic_filter)

    def _prune(self, topic_filter: str) -> None:
        """Drop the emptied set of a wildcard filter, then every node left holding nothing, bottom up."""
        levels = topic_filter.split(SEP)
        rest = levels[-1] == REST
        path: list[tuple[_Node[K], str]] = []  # (parent, level taken from it)
        node = self._root
        for level in levels[:-1] if rest else levels:
            path.append((node, level))
            nxt = node.plus if level == ONE else node.children.get(level)
            assert nxt is not None, topic_filter  # the filter was held: its path exists
            node = nxt
        if rest:
            node.rest = None
        else:
            node.here = None
        for parent, level in reversed(path):
            if not node.empty():
                break
            if level == ONE:
                parent.plus = None
            else:
                del parent.children[level]
            node = parent

    def match(self, topic: str) -> set[K]:
        """Every key whose filter matches the (valid) name `topic`; a new set."""
        exact = self._exact.get(topic)
        out: set[K] = set(exact) if exact else set()
        root = self._root
        if not root.children and root.plus is None and not root.rest:
            return out  # no wildcard filter: the lookup was all
        levels = topic.split(SEP)
        # A wildcard in a filter's first level does not match a '$' name (MQTT 4.7.2).
        if topic.startswith("$"):
            first = root.children.get(levels[0])
            if first is None:
                return out
            frontier = [first]
            levels = levels[1:]
        else:
            frontier = [root]
        for level in levels:
            nxt: list[_Node[K]] = []
            for node in frontier:
                if node.rest:
                    out |= node.rest
                child = node.children.get(level)
                if child is not None:
                    nxt.append(child)
                if node.plus is not None:
                    nxt.append(node.plus)
            if not nxt:
                return out
            frontier = nxt
        for node in frontier:
            if node.here:
                out |= node.here
            if node.rest:  # '#' also stands for no level at all: 'a/#' matches 'a'
                out |= node.rest
        return out
