"""The subscription table: who is subscribed to what, where, and until when.

Theory of operation
-------------------
A subscription is identified by (container-id, link name, topic), hashed into a `sid`. It is ACTIVE
while its link is attached to some router (`home`), SUSPENDED when the link detached without close
or its connection dropped, ENDED when the link was closed (unsubscribe) or it stayed suspended
longer than its expiry (the source terminus timeout; 0 = not durable, ends at once).

Every attach or resume bumps the subscription's `epoch`; in a mesh, the update with the higher
epoch wins (ties: the lexically larger home router), and ENDED is final for its epoch. A new
subscription with the identity of an ended one starts a new life at a higher epoch.

That order is a join (every router ends with the same table, whatever order updates come in), but
it cannot see which claim the client is using: two claims of one epoch can be concurrent (made by
routers that had not heard of each other: a restart, a partition), and the one that wins may be
the stale one, suspended at a router the client left. The router whose claim lost while it holds
the subscription's live link therefore claims again (`reclaim`, above the winner) instead of closing
the link, when the winner is not backed by a link: suspended, or active in an earlier incarnation
of its home (`inc`), or active at a router it cannot reach at the same epoch as its own
(router/core.py, `subscription_changed`). A claim again is an ordinary claim: the merge stays
the same join.

A subscription belongs to the identity that made it (`owner`, docs/security.md): a router refuses
an attach by another identity to a live subscription it knows. A claim can still be made by another
identity at a router that has not heard of the subscription yet (made elsewhere a few milliseconds
before, its announcement still on its way). Two lives of one subscription made by different
identities are therefore never ordered by epoch (an epoch is the client's to raise) but by their
lives' places in its history (`life_key`, which only routers write): a life made after a confirmed
life ended is of a later generation; a life made after an unconfirmed one ended (never in force:
refused, or given up before every router acknowledged it) continues its line; else the first made
holds it (`created`, the making routers' clocks; then the identity's name), at every router and in
any order of arrival. The other life's versions never win a merge (`ForeignClaim`): its attach is
refused (the announcement's acknowledgement says why) and its link closed with
amqp:unauthorized-access (router/core.py); the answered attach of the life that holds it is
never closed for it.

This table is what a router persists (never messages): it is written, fsynced, whenever it changes
in a way that matters after a restart (a subscription begins or ends). A restarted router loads it
and treats every subscription as suspended from the moment it started, so that it knows whom each
message is owed to before it grants publishers credit.

Pure: no I/O here except `SubscriptionStore`, which only serialises.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ..common.durable import write_durably
from ..common.topics import TopicIndex, is_wildcard

SCHEMA = 1


class SubState(Enum):
    ACTIVE = "active"
    SUSPENDED = "suspended"
    ENDED = "ended"


# (module constants for per-message code: see router.core.S_QUEUED)
SUB_ACTIVE, SUB_ENDED = SubState.ACTIVE, SubState.ENDED


@dataclass(slots=True)
class Subscription:
    sid: str
    topic: str
    container: str
    link: str
    expiry: float  # seconds a suspension may last; math.inf = never expires
    state: SubState
    home: str  # router where it is (or was last) attached
    epoch: int
    since: float  # time of the last state change (router clock)
    created: float
    end_reason: str | None = None
    # in a mesh: every router of the topology acknowledged this life (its first attach completed)
    confirmed: bool = False
    # the authenticated identity that made it ("" for a router without client authentication): only
    # that identity may attach to it again (docs/security.md)
    owner: str = ""
    # the incarnation of `home` that made this claim ("" unknown: an entry from an older router):
    # an ACTIVE claim of an earlier incarnation is stale (a restarted router has no links)
    inc: str = ""
    # its life's place in the subscription's history (`life_key`; written by routers, never asked of
    # a client): the generation (confirmed lives ended before it), the `created` of the first life of
    # its line (None: its own) and how many unconfirmed lives ended before it in that line
    gen: int = 0
    root: float | None = None
    depth: int = 0
    # its JMS message selector (common/selector.py; "" none): only messages it selects are owed to it
    # (a life's: another selector is another life)
    selector: str = ""
    # a shared subscription's members at its home (router/groups.py): their ids, attached or in
    # doubt; a new home (or a restarted one) waits for them before it hands anything
    members: tuple[str, ...] = ()
    # soft state, not persisted: the router-local link binding is kept by the delivery core
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.state is not SUB_ENDED

    def to_json(self) -> dict[str, Any]:
        return {
            "sid": self.sid, "topic": self.topic, "container": self.container, "link": self.link,
            "expiry": None if math.isinf(self.expiry) else self.expiry, "state": self.state.value,
            "home": self.home, "epoch": self.epoch, "since": self.since, "created": self.created,
            "end_reason": self.end_reason, "confirmed": self.confirmed, "owner": self.owner, "inc": self.inc,
        } | self._history_json()

    def _history_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {}  # (only what differs from a first life: the entries of older routers)
        if self.gen:
            d["gen"] = self.gen
        if self.root is not None:
            d["root"] = self.root
        if self.depth:
            d["depth"] = self.depth
        if self.selector:
            d["selector"] = self.selector
        if self.members:
            d["members"] = list(self.members)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Subscription:
        exp = d.get("expiry")
        return cls(sid=d["sid"], topic=d["topic"], container=d["container"], link=d["link"],
                   expiry=math.inf if exp is None else float(exp), state=SubState(d["state"]),
                   home=d["home"], epoch=int(d["epoch"]), since=float(d["since"]),
                   created=float(d["created"]), end_reason=d.get("end_reason"),
                   confirmed=bool(d.get("confirmed", False)), owner=str(d.get("owner") or ""),
                   inc=str(d.get("inc") or ""), gen=int(d.get("gen") or 0),
                   root=None if d.get("root") is None else float(d["root"]), depth=int(d.get("depth") or 0),
                   selector=str(d.get("selector") or ""),
                   members=tuple(str(m) for m in d.get("members") or ()))


_STATE_RANK = {SubState.ACTIVE: 0, SubState.SUSPENDED: 1, SubState.ENDED: 2}
_FIELDS = ("sid", "topic", "container", "link", "expiry", "state", "home", "epoch", "since", "created",
           "end_reason", "confirmed", "owner", "inc", "gen", "root", "depth", "selector", "members")


def order_key(s: Subscription) -> tuple[int, str, int, bool]:
    """Total order of versions of one subscription: a higher epoch wins; within an epoch (one home)
    ACTIVE -> SUSPENDED -> ENDED only moves forward, and a life once confirmed stays confirmed;
    equal epochs from two homes: the larger id."""
    return (s.epoch, s.home, _STATE_RANK[s.state], s.confirmed)


def owned_by_another(sub: Subscription | None, owner: str) -> bool:
    """Is `sub` a live subscription that another identity made? Then `owner` may not attach to it
    ("" is no identity: it never matches one; an ownerless subscription is anyone's)."""
    return sub is not None and sub.live and bool(sub.owner) and sub.owner != owner


def foreign(a: Subscription, b: Subscription) -> bool:
    """Are `a` and `b` versions of two lives of one subscription made by different identities? (An
    ownerless life that an identity resumed, and so took, keeps its `created`: the same life.)"""
    if a.owner == b.owner:
        return False
    return a.created != b.created or bool(a.owner and b.owner)


def life_key(s: Subscription) -> tuple[int, float, int]:
    """The place of the life of `s` in the history of its subscription (a larger key: later in it):
    its generation, then the first made line (its root's `created`), then its depth in that line."""
    return (s.gen, -(s.created if s.root is None else s.root), s.depth)


def holding_life(a: Subscription, b: Subscription) -> Subscription:
    """Of versions `a` and `b` of two lives made by different identities (`foreign`), the one whose
    life holds the subscription, whatever their states and epochs: the same answer at every router,
    and a total order of lives (`life_key`; equal keys: the smaller identity's)."""
    ka, kb = life_key(a), life_key(b)
    if ka != kb:
        return a if ka > kb else b
    return a if a.owner <= b.owner else b


def next_life(ended: Subscription | None) -> dict[str, Any]:
    """The history fields of a life made over `ended` (the ended entry the router knows, if
    any): after a confirmed life, the next generation; after an unconfirmed one, the same line."""
    if ended is None:
        return {}
    if ended.confirmed:
        return {"gen": ended.gen + 1}
    return {"gen": ended.gen, "root": ended.created if ended.root is None else ended.root, "depth": ended.depth + 1}


FOREIGN_CLAIM = "another identity holds it: "  # how the refusal of a `ForeignClaim` begins (SubAck reason)


def refused_as_foreign(reason: str | None) -> bool:
    """Does an announcement's refusal say that the subscription belongs to another identity?"""
    return reason is not None and reason.startswith(FOREIGN_CLAIM)


class LifeEnded(Exception):
    """A resume of a subscription life that has ended."""


class ForeignClaim(Exception):
    """A version of a life of a subscription made by another identity than the life that holds it
    here (`holding_life`): it never wins a merge."""


class SubscriptionTable:
    """Every subscription this router knows, live or ended (tombstones until `forget_ended`).

    Live subscriptions are also indexed by their topic filter: a literal filter (a topic name, the
    common case) in `_by_topic`, a wildcard filter (common/topics.py: '+', '#') in `_wild`, a
    `TopicIndex` trie. `live_for_topic(name)` is what a message of that name is owed to."""

    def __init__(self) -> None:
        self._subs: dict[str, Subscription] = {}
        self._by_topic: dict[str, dict[str, Subscription]] = {}
        self._wild: TopicIndex[str] = TopicIndex()  # live wildcard subscriptions' sids by filter
        self._n_wild = 0  # how many (an attribute: the per-message check costs no call)
        self.selective = 0  # live subscriptions with a selector (0: no message needs its fields read)
        self._matched: dict[str, tuple[Subscription, ...]] = {}  # name -> live_for_topic, while _wild holds any
        self.version = 0  # bumped on every change that must be persisted

    # -- queries ---------------------------------------------------------------------------------
    def get(self, sid: str) -> Subscription | None:
        return self._subs.get(sid)

    def live_for_topic(self, topic: str) -> Iterable[Subscription]:
        """The live subscriptions whose filter matches the topic name `topic`: those of that literal
        name (in the order they were indexed), then the wildcard ones (by sid: the same order at
        every router and in every replay, whatever the order they came in)."""
        d = self._by_topic.get(topic)
        if not self._n_wild:
            return d.values() if d else ()
        hit = self._matched.get(topic)
        if hit is None:
            subs = self._subs
            wild = [subs[sid] for sid in sorted(self._wild.match(topic))]
            hit = (*d.values(), *wild) if d else tuple(wild)
            if len(self._matched) > 10_000:
                self._matched.clear()
            self._matched[topic] = hit
        return hit

    def wildcard_filters(self) -> Iterator[str]:
        """The wildcard filters of live subscriptions (each once)."""
        return (f for f, _ in self._wild.filters())

    def _index(self, sub: Subscription) -> None:
        if sub.selector:
            self.selective += 1
        if is_wildcard(sub.topic):
            self._wild.add(sub.topic, sub.sid)
            self._n_wild = len(self._wild)
            self._matched.clear()
        else:
            self._by_topic.setdefault(sub.topic, {})[sub.sid] = sub
            if self._matched:
                self._matched.pop(sub.topic, None)

    def _unindex(self, sub: Subscription) -> None:
        if sub.selector:
            self.selective -= 1
        if is_wildcard(sub.topic):
            self._wild.discard(sub.topic, sub.sid)
            self._n_wild = len(self._wild)
            self._matched.clear()
            return
        topic_subs = self._by_topic.get(sub.topic)
        if topic_subs is not None:
            topic_subs.pop(sub.sid, None)
            if not topic_subs:
                del self._by_topic[sub.topic]
        if self._matched:
            self._matched.pop(sub.topic, None)

    def __iter__(self) -> Iterator[Subscription]:
        return iter(self._subs.values())

    def __len__(self) -> int:
        return len(self._subs)

    def live(self) -> Iterator[Subscription]:
        return (s for s in self._subs.values() if s.live)

    # -- changes ---------------------------------------------------------------------------------
    def attach(self, sid: str, topic: str, container: str, link: str, expiry: float, home: str,
               now: float, min_epoch: int = 0, owner: str = "", inc: str = "",
               selector: str = "") -> tuple[Subscription, bool]:
        """Attach or resume. Returns (subscription, resumed) where resumed means it existed.
        `min_epoch`: the client knew a later epoch than we do; the new one must beat it. `owner`: the
        authenticated identity attaching (kept by a new life; the router checked a resume's). `inc`:
        the attaching router's incarnation. A new life made over an ended one takes its place in the
        history after it (`next_life`). `selector`: a new life's (a resume keeps its life's: the caller
        ends a life whose selector the attach changes)."""
        sub = self._subs.get(sid)
        if sub is not None and sub.live:
            if owner and not sub.owner:
                sub.owner = owner
            sub.state = SubState.ACTIVE
            sub.home = home
            sub.epoch = max(sub.epoch, min_epoch) + 1
            sub.since = now
            sub.expiry = expiry
            sub.inc = inc
            self.version += 1
            return sub, True
        epoch = max(sub.epoch if sub is not None else 0, min_epoch) + 1
        sub = Subscription(sid=sid, topic=topic, container=container, link=link, expiry=expiry,
                           state=SubState.ACTIVE, home=home, epoch=epoch, since=now, created=now, owner=owner,
                           inc=inc, selector=selector, **next_life(sub))
        self._subs[sid] = sub
        self._index(sub)
        self.version += 1
        return sub, False

    def reclaim(self, mine: Subscription, home: str, inc: str, now: float) -> Subscription:
        """Claim a subscription again for the link `home` holds, above the entry that just won the
        merge (the same life: the caller checked). `mine`: our entry before that merge, whose expiry
        (the attached link's) and confirmation are kept."""
        sub = self._subs[mine.sid]
        assert sub.live and sub.created == mine.created
        sub.state = SubState.ACTIVE
        sub.home = home
        sub.inc = inc
        sub.epoch = max(sub.epoch, mine.epoch) + 1
        sub.since = now
        sub.expiry = mine.expiry
        sub.confirmed = sub.confirmed or mine.confirmed
        sub.end_reason = None
        self.version += 1
        return sub

    def set_members(self, sid: str, members: tuple[str, ...]) -> bool:
        """A shared subscription homed here has these members now (a new version when they
        changed: the epoch moves on, so that every router takes it). True when it changed."""
        sub = self._subs.get(sid)
        if sub is None or not sub.live or sub.members == members:
            return False
        sub.members = members
        sub.epoch += 1
        self.version += 1
        return True

    def confirm(self, sid: str) -> bool:
        """Every router acknowledged this life's first attach. True when that changed the entry."""
        sub = self._subs.get(sid)
        if sub is None or not sub.live or sub.confirmed:
            return False
        sub.confirmed = True
        self.version += 1
        return True

    def suspend(self, sid: str, now: float) -> Subscription | None:
        sub = self._subs.get(sid)
        if sub is None or sub.state is not SubState.ACTIVE:
            return None
        sub.state = SubState.SUSPENDED
        sub.since = now
        self.version += 1
        return sub

    def end(self, sid: str, now: float, reason: str) -> Subscription | None:
        sub = self._subs.get(sid)
        if sub is None or not sub.live:
            return None
        sub.state = SubState.ENDED
        sub.since = now
        sub.end_reason = reason
        self._unindex(sub)
        self.version += 1
        return sub

    def merge(self, remote: Subscription) -> Subscription | None:
        """Apply another router's view of a subscription when it is newer. Returns a copy of the
        previous entry (or a placeholder ENDED entry when it was unknown) when the table changed.
        Raises `LifeEnded` for an attempt to revive a life that ended here (END is final for a life;
        lives are told apart by their `created` time), and `ForeignClaim` for a version of a life of
        another identity than the one that holds it here (`holding_life`)."""
        cur = self._subs.get(remote.sid)
        if cur is not None:
            if foreign(cur, remote):
                if holding_life(cur, remote) is cur:
                    raise ForeignClaim(f"{FOREIGN_CLAIM}subscription {remote.sid} was made first by another "
                                       f"identity (at router {cur.home})")
            else:
                if cur.created == remote.created and cur.state is SubState.ENDED and remote.live:
                    raise LifeEnded(f"subscription {remote.sid} ended here ({cur.end_reason})")
                if order_key(cur) >= order_key(remote):
                    return None
        old = Subscription(**{f: getattr(cur, f) for f in _FIELDS}) if cur is not None else None
        if cur is not None and cur.live:
            self._unindex(cur)
        new = Subscription(**{f: getattr(remote, f) for f in _FIELDS})
        self._subs[new.sid] = new
        if new.live:
            self._index(new)
        self.version += 1
        return old if old is not None else Subscription(
            sid=new.sid, topic=new.topic, container=new.container, link=new.link, expiry=new.expiry,
            state=SubState.ENDED, home="", epoch=0, since=0.0, created=0.0, end_reason="unknown")

    def expired(self, now: float, home: str | None = None) -> list[Subscription]:
        return [s for s in self._subs.values()
                if s.state is SubState.SUSPENDED and now - s.since >= s.expiry
                and (home is None or s.home == home)]

    def forget_ended(self, before: float) -> int:
        """Drop tombstones of subscriptions that ended before `before`."""
        old = [sid for sid, s in self._subs.items() if s.state is SubState.ENDED and s.since < before]
        for sid in old:
            del self._subs[sid]
        if old:
            self.version += 1
        return len(old)

    # -- persistence -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "subscriptions": [s.to_json() for s in self._subs.values()]}

    def restore(self, snap: dict[str, Any], now: float) -> None:
        """Load a snapshot after a restart: every live subscription is suspended as of `now`."""
        if snap.get("schema") != SCHEMA:
            raise ValueError(f"subscription table schema {snap.get('schema')!r}, expected {SCHEMA}")
        self._subs.clear()
        self._by_topic.clear()
        self._wild = TopicIndex()
        self._n_wild = 0
        self.selective = 0
        self._matched.clear()
        for d in snap.get("subscriptions", []):
            sub = Subscription.from_json(d)
            if sub.live:
                # nobody could resume while we were down: the suspension clock restarts now
                sub.state = SubState.SUSPENDED
                sub.since = now
            self._subs[sub.sid] = sub
            if sub.live:
                self._index(sub)
        self.version += 1


class SubscriptionStore:
    """Atomic, fsynced JSON file holding a table snapshot."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                data: dict[str, Any] = json.load(f)
                return data
        except FileNotFoundError:
            return None

    def save(self, snap: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # (json.dumps, not json.dump: dump encodes in Python, chunk by chunk; dumps in C, ~3x faster.
        # The loop waits for this once per pass that changed the table)
        write_durably(self.path, json.dumps(snap, separators=(",", ":")))
