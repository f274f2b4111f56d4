"""What the delivery core shows those who only look: the status file, `/metrics`, `/readyz`, the
management views and the console. They read a `CoreSnapshot`, made by `DeliveryCore.snapshot(now,
parts)`, never the core's attributes: the core may change how it keeps its state without them
noticing.

Theory of operation
-------------------
A snapshot is values, made when a reader asks (a status write, a scrape, a management request), and
never on the per-message path. Some parts cost a scan of every subscription or every record (100,000
subscriptions: tens of milliseconds, a pause of every message in flight), so a reader names the
parts it needs (`Parts`) and gets only those; a part not asked for is `None` (or empty, for the
parts asked by key). The fields that cost nothing (`ready`, `log_writable`, ...) are always there.
Pages are cut by the core (`Page`): a view of 1,000 rows out of 100,000 makes 1,000 rows.

The functions at the end build the parts from the collections the core hands them; only
`DeliveryCore.snapshot` calls them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ..common.vocab import Outcome
from .subscriptions import SUB_ACTIVE, SubState

if TYPE_CHECKING:
    from .state import PubLink, Record, SubRuntime
    from .subscriptions import Subscription, SubscriptionTable


@dataclass(frozen=True, slots=True)
class Page:
    """Rows `offset` to `offset + limit` of a view sorted the view's way."""

    offset: int = 0
    limit: int = 1000
    include_ended: bool = False  # (subscriptions: ended ones too, kept until forgotten)


@dataclass(frozen=True, slots=True)
class Parts:
    """The parts of a snapshot a reader needs beyond the free fields (each costs what it says)."""

    counts: bool = False  # CoreCounts: scans the live subscriptions
    topics: bool = False  # TopicRow per topic: scans subscriptions, publisher links and records
    publishers: Collection[Any] = ()  # PublisherRow for these link tokens (those attached here)
    subscribers: Collection[str] = ()  # the backlog of these subscriptions (those homed here)
    subscriptions: Page | None = None  # a page of the subscription table, by topic then sid
    records: Page | None = None  # a page of the records, oldest first
    unnumbered: Collection[str] = ()  # records without their number, for these total-order topics


@dataclass(frozen=True, slots=True)
class CoreCounts:
    """The core's statistics (the status file's `stats`, with the router's own added to them)."""

    records: int
    undecided: int
    inflight_bytes: int
    destination_records: int
    reserved_credit: int
    subscriptions: int
    local_subscriptions: int
    active_subscriptions: int
    placeholders: int
    publisher_links: int
    fifo_holds: int
    fifo_awaited: int
    causal_deps: int
    causal_clients: int
    causal_cycles: int
    finals_ignored: int
    subscriptions_reclaimed: int
    new_identities: int
    finals_answered: int
    final_notes: int
    final_gids: int
    final_entries: int
    total_holds: int
    total_late: int

    def as_dict(self) -> dict[str, int]:
        """The counts by name, in the order of the fields (the status file's order)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class TopicOrder(StrEnum):
    TOTAL = "total"
    CAUSAL = "causal"
    FIFO = "fifo"


@dataclass(frozen=True, slots=True)
class TopicRow:
    topic: str
    order: TopicOrder
    subscriptions: int  # live ones
    active: int
    homed_here: int
    publishers_here: int  # publisher links attached here
    records: int
    undecided: int  # records of this origin without an outcome yet
    backlog: int  # messages owed to its subscriptions homed here, not resolved yet


@dataclass(frozen=True, slots=True)
class PublisherRow:
    topic: str
    outstanding: int  # credit granted, not used yet
    blocked: bool  # waiting for credit (room in the budget)


@dataclass(frozen=True, slots=True)
class SubscriptionRow:
    sid: str
    topic: str
    container: str
    link: str
    state: SubState
    home: str
    owner: str  # "" without client authentication
    epoch: int
    expiry_s: float | None  # None: never expires
    since_s: float  # seconds in this state
    backlog: int  # homed here: owed, not resolved; elsewhere: this origin's records pending for it
    queued: int | None  # waiting for credit (homed here only)
    on_link: int | None  # sent and unsettled (homed here only)
    end_reason: str | None
    # a shared subscription (router/groups.py): its members as the table lists them, and those of
    # them with a link attached here (its home only); None: not shared
    members: tuple[str, ...] | None = None
    attached: int | None = None


@dataclass(frozen=True, slots=True)
class RecordRow:
    gid: str
    topic: str
    origin: str | None  # None: this router is its origin
    age_s: float
    outcome: Outcome | None
    pending: int  # subscriptions still QUEUED or SENT
    parts: int  # subscriptions it is owed to
    publisher: bool  # its publisher's delivery is open here
    number: int | None  # its number in a total order


R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class RowPage(Generic[R]):
    rows: tuple[R, ...]
    total: int  # rows in the whole view


@dataclass(frozen=True, slots=True)
class CoreSnapshot:
    """The core as of `at`: the first four fields always, the others as asked for in `Parts` (a
    part not asked for: None; a part asked by key: only the keys asked for that exist)."""

    at: float
    ready: bool  # the subscription table is loaded (and, in a mesh, synced): publishers may get credit
    log_writable: bool  # the settlement log can be written (else no publisher credit)
    blocked_publishers: int  # publisher links waiting for credit (room in the budget)
    counts: CoreCounts | None
    topics: tuple[TopicRow, ...] | None  # by topic
    publishers: Mapping[Any, PublisherRow]  # by link token
    backlogs: Mapping[str, int]  # by sid: messages owed to a subscription homed here, not resolved yet
    subscriptions: RowPage[SubscriptionRow] | None
    records: RowPage[RecordRow] | None
    unnumbered: Mapping[str, int]  # by topic (a topic with none: absent)


class SnapshotSource(Protocol):
    """What a reader needs of the core (`DeliveryCore` is one)."""

    def snapshot(self, now: float, parts: Parts = ...) -> CoreSnapshot: ...


NOTHING = Parts()


# ---------------------------------------------------------------------------- built by the core


def topic_rows(table: SubscriptionTable, subs: Mapping[str, SubRuntime], router_id: str,
               pub_links: Iterable[PubLink], records: Iterable[Record], total: Collection[str],
               causal: Collection[str]) -> tuple[TopicRow, ...]:
    agg: dict[str, list[int]] = {}

    def entry(topic: str) -> list[int]:
        return agg.setdefault(topic, [0, 0, 0, 0, 0, 0, 0])

    for sub in table.live():
        e = entry(sub.topic)
        e[0] += 1
        e[1] += sub.state is SUB_ACTIVE
        if sub.home == router_id:
            e[2] += 1
            rt = subs.get(sub.sid)
            e[6] += len(rt.owed) if rt is not None else 0
    for pl in pub_links:
        entry(pl.topic)[3] += 1
    for rec in records:
        e = entry(rec.topic)
        e[4] += 1
        e[5] += rec.origin is None and rec.outcome is None
    return tuple(TopicRow(t, TopicOrder.TOTAL if t in total else TopicOrder.CAUSAL if t in causal else TopicOrder.FIFO,
                          *v) for t, v in sorted(agg.items()))


def publisher_rows(pub_links: Mapping[Any, PubLink], blocked: Iterable[PubLink],
                   tokens: Iterable[Any]) -> dict[Any, PublisherRow]:
    waiting = {id(pl) for pl in blocked}
    return {t: PublisherRow(pl.topic, pl.outstanding, id(pl) in waiting)
            for t in tokens if (pl := pub_links.get(t)) is not None}


def _by_topic(sub: Subscription) -> str:
    return f"{sub.topic}\x00{sub.sid}"


def subscription_page(table: SubscriptionTable, subs: Mapping[str, SubRuntime],
                      remote_pending: Mapping[str, Mapping[str, Record]], router_id: str, page: Page,
                      now: float) -> RowPage[SubscriptionRow]:
    every = list(table if page.include_ended else table.live())
    # (the page only: a table of 100,000 is not sorted whole for a page of 1,000)
    rows = []
    for sub in heapq.nsmallest(page.offset + page.limit, every, key=_by_topic)[page.offset:]:
        rt = subs.get(sub.sid) if sub.home == router_id else None
        rows.append(SubscriptionRow(
            sub.sid, sub.topic, sub.container, sub.link, sub.state, sub.home, sub.owner, sub.epoch,
            None if math.isinf(sub.expiry) else sub.expiry, now - sub.since,
            len(rt.owed) if rt is not None else len(remote_pending.get(sub.sid, ())),
            len(rt.queue) if rt is not None else None, len(rt.on_link) if rt is not None else None,
            sub.end_reason, sub.members or None,
            len(rt.group.attached()) if rt is not None and rt.group is not None else None))
    return RowPage(tuple(rows), len(every))


def _created(rec: Record) -> float:
    return rec.created


def record_page(records: Mapping[str, Record], page: Page, now: float) -> RowPage[RecordRow]:
    recs = heapq.nsmallest(page.offset + page.limit, records.values(), key=_created)[page.offset:]
    return RowPage(tuple(RecordRow(r.gid, r.topic, r.origin, now - r.created, r.outcome, r.pending, len(r.owed),
                                   bool(r.pubs), r.tnum) for r in recs), len(records))


def unnumbered(records: Iterable[Record], topics: Collection[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    if topics:
        wanted = frozenset(topics)
        for rec in records:
            if rec.tnum is None and rec.topic in wanted:
                out[rec.topic] = out.get(rec.topic, 0) + 1
    return out
