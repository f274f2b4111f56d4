"""Management requests (`$management`, `oncemesh stat`): parse a request, answer it from the router's
state. Sans-IO: the adapter (router/mgmtlink.py) decodes AMQP, checks who may ask, gathers what
only it knows (connections and links, as plain `ConnInfo`/`LinkInfo`) and sends the `Answer`;
everything here is a function of those values, the delivery core's snapshot (router/snapshot.py:
each view asks for the parts it shows) and the time given.

The wire format is in common/mgmtwire.py. Views are tables (`columns`, `rows`) so that a client
prints any view without knowing it; each is bounded by the request's `limit` (a table of 100,000
subscriptions must not become one 10 MB message unless asked for).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..common import mgmtwire as W
from ..common.errors import OncemeshError
from .snapshot import Page, Parts, RowPage, SnapshotSource, SubscriptionRow, TopicOrder, TopicRow


class ManagementError(OncemeshError):
    """A request the router cannot answer as asked: `status` is its statusCode."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


@dataclass(frozen=True, slots=True)
class Request:
    operation: str
    view: str
    limit: int = W.DEFAULT_LIMIT  # rows in this answer, at most W.PAGE_MAX
    include_ended: bool = False  # the subscriptions view: ended ones too (kept until forgotten)
    offset: int = 0  # rows skipped (the next page starts where this one ended)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    description: str
    body: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """One link of a client connection, as the adapter sees it. `token`: the core's key for a
    publisher link (its outstanding credit is the core's)."""

    name: str
    role: str  # publisher | subscriber | management | attaching
    topic: str | None
    sid: str | None
    credit: int
    unsettled: int
    token: Any = None


@dataclass(frozen=True, slots=True)
class ConnInfo:
    peer: str
    container: str | None
    user: str | None
    tls: bool
    links: tuple[LinkInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class MeshView:
    """What the topology says of the mesh, for views and the console: every router, every link,
    and each router's HTTP listener where the topology names one (port 0: learned at run time)."""

    routers: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    http: Mapping[str, str] = field(default_factory=dict)


class RouterState(Protocol):
    """What management reads from a router besides its delivery core's snapshot (the adapter's part)."""

    @property
    def id(self) -> str: ...

    @property
    def incarnation(self) -> str: ...

    def management_connections(self) -> list[ConnInfo]: ...

    def management_status(self) -> dict[str, Any]:
        """The router's status (its ready file's content) and its readiness (`ready`, `why`)."""
        ...


def parse_request(properties: Mapping[Any, Any] | None, body: Any) -> Request:
    """A request from its application properties and body; raises ManagementError (400/404)."""
    props = {str(k): v for k, v in (properties or {}).items()}
    op = props.get(W.OPERATION)
    if op != W.QUERY:
        raise ManagementError(W.BAD_REQUEST, f"operation {op!r} is not supported: only {W.QUERY!r} "
                                             f"(the views are read-only)")
    view = props.get(W.TYPE)
    if not isinstance(view, str) or view not in W.VIEWS:
        raise ManagementError(W.NOT_FOUND, f"no view {view!r}; views: {', '.join(W.VIEWS)}")
    opts: Mapping[Any, Any] = body if isinstance(body, Mapping) else {}
    if body is not None and not isinstance(body, Mapping):
        raise ManagementError(W.BAD_REQUEST, "the request body must be a map of options (or empty)")
    limit = opts.get("limit", W.DEFAULT_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= W.PAGE_MAX:
        raise ManagementError(W.BAD_REQUEST, f"limit must be a whole number from 1 to {W.PAGE_MAX} (rows in one "
                                             f"answer; ask for the next page with offset), got {limit!r}")
    offset = opts.get("offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ManagementError(W.BAD_REQUEST, f"offset must be a whole number >= 0, got {offset!r}")
    unknown = sorted(str(k) for k in opts if str(k) not in ("limit", "all", "offset"))
    if unknown:
        raise ManagementError(W.BAD_REQUEST, f"unknown option(s) {', '.join(unknown)}; known: limit, offset, all")
    return Request(W.QUERY, view, int(limit), bool(opts.get("all", False)), int(offset))


def answer(req: Request, core: SnapshotSource, state: RouterState, mesh: MeshView | None, now: float) -> Answer:
    columns, rows, total = _VIEWS[req.view](core, state, mesh, now, req)
    if total is None:  # (a small view: every row made, the page cut here)
        total = len(rows)
        rows = rows[req.offset:req.offset + req.limit]
    body = {"router": state.id, "type": req.view, "columns": list(columns), "rows": rows, "total": total,
            "offset": req.offset, "truncated": req.offset + len(rows) < total}
    return Answer(W.OK, "OK", body)


def error_answer(exc: ManagementError) -> Answer:
    return Answer(exc.status, str(exc))


# (columns, rows, how many rows there are): a view that can be large makes only the rows of the
# requested page and says how many there are in all; a small one makes them all (None: cut here)
Rows = tuple[tuple[str, ...], list[list[Any]], int | None]


def _all(columns: tuple[str, ...], rows: list[list[Any]]) -> Rows:
    return columns, rows, None


def _router(core: SnapshotSource, state: RouterState, mesh: MeshView | None, now: float, req: Request) -> Rows:
    st = state.management_status()
    stats: dict[str, Any] = st.get("stats", {})
    cols = ("id", "incarnation", "uptime_s", "url", "client_auth", "mesh_security", "ready", "not_ready",
            "connections", "subscriptions", "records", "undecided", "inflight_bytes", "peers")
    why: dict[str, Any] = st.get("why", {})
    not_ready = ",".join(not_ready_reasons(why))
    started = int(state.incarnation) / 1e6 if state.incarnation.isdigit() else now
    row = [state.id, state.incarnation, round(now - started, 1), st.get("url"), st.get("client_auth"),
           st.get("mesh_security", "standalone"), bool(st.get("ready")), not_ready,
           stats.get("connections", 0), stats.get("subscriptions", 0), stats.get("records", 0),
           stats.get("undecided", 0), stats.get("inflight_bytes", 0), ",".join(st.get("peers", []))]
    return _all(cols, [row])


def not_ready_reasons(why: dict[str, Any]) -> list[str]:
    """What keeps a router from ready (router/readiness.py `readiness`), the same ones that make `ready`
    false: empty exactly when it is ready. (`draining` is true when it blocks; `mesh_converged` is
    reported, not required.)"""
    out = [k for k in ("table_synced", "log_writable", "peers_known") if why.get(k) is False]
    return out + (["draining"] if why.get("draining") else [])


def _connections(core: SnapshotSource, state: RouterState, mesh: MeshView | None, now: float, req: Request) -> Rows:
    cols = ("peer", "container", "user", "tls", "links", "publishers", "subscribers")
    rows = []
    for c in sorted(state.management_connections(), key=lambda c: c.peer):
        roles = [link.role for link in c.links]
        rows.append([c.peer, c.container, c.user, c.tls, len(c.links), roles.count("publisher"),
                     roles.count("subscriber")])
    return _all(cols, rows)


def _links(core: SnapshotSource, state: RouterState, mesh: MeshView | None, now: float, req: Request) -> Rows:
    """Per link: `credit` is what the peer granted us (subscriber) or we granted it (publisher);
    `unsettled` deliveries on the link; `backlog` messages held here for its subscription."""
    cols = ("peer", "container", "name", "role", "topic", "credit", "unsettled", "backlog", "blocked")
    conns = sorted(state.management_connections(), key=lambda c: c.peer)
    links = [link for c in conns for link in c.links]
    tokens = [li.token for li in links if li.role == "publisher"]
    sids = [li.sid for li in links if li.role == "subscriber" and li.sid is not None]
    snap = core.snapshot(now, Parts(publishers=tokens, subscribers=sids))
    rows = []
    for c in conns:
        for link in sorted(c.links, key=lambda li: li.name):
            credit, backlog, is_blocked = link.credit, None, None
            if link.role == "publisher":
                pl = snap.publishers.get(link.token)
                credit = pl.outstanding if pl is not None else 0
                is_blocked = pl is not None and pl.blocked
            elif link.role == "subscriber" and link.sid is not None:
                backlog = snap.backlogs.get(link.sid, 0)
            rows.append([c.peer, c.container, link.name, link.role, link.topic, credit, link.unsettled, backlog,
                         is_blocked])
    return _all(cols, rows)


def topic_orders(status: dict[str, Any]) -> Callable[[TopicRow], str]:
    """The order of a topic as this router enforces it: total (sequencer|lamport), causal, fifo."""
    streams: dict[str, Any] = status.get("order", {})

    def order(row: TopicRow) -> str:
        if row.order is TopicOrder.TOTAL:
            return f"total ({streams.get(row.topic, {}).get('algorithm', 'sequencer')})"
        return row.order.value

    return order


def _topics(core: SnapshotSource, state: RouterState, mesh: MeshView | None, now: float, req: Request) -> Rows:
    cols = ("topic", "order", "subscriptions", "active", "homed_here", "publishers_here", "records", "undecided",
            "backlog")
    topics = core.snapshot(now, Parts(topics=True)).topics
    assert topics is not None
    order = topic_orders(state.management_status())
    return _all(cols, [[t.topic, order(t), t.subscriptions, t.active, t.homed_here, t.publishers_here, t.records,
                        t.undecided, t.backlog] for t in topics])


def subscription_rows(page: RowPage[SubscriptionRow]) -> list[list[Any]]:
    """One row per subscription of the page: `backlog` is what this router holds for it (its home:
    messages owed and not yet resolved; elsewhere: messages of this origin still pending for it),
    `on_link` what is sent and unsettled, `queued` what waits for credit (its home only); a shared
    subscription's `members` (listed mesh-wide: attached, in doubt, or holding what is not final yet)
    and how many of them are `attached` (its home only)."""
    return [[r.sid, r.topic, r.container, r.link, r.state.value, r.home, r.owner or None, r.epoch, r.expiry_s,
             round(r.since_s, 1), r.backlog, r.queued, r.on_link, r.end_reason,
             len(r.members) if r.members is not None else None, r.attached] for r in page.rows]


SUBSCRIPTION_COLUMNS = ("sid", "topic", "container", "link", "state", "home", "owner", "epoch", "expiry_s",
                        "since_s", "backlog", "queued", "on_link", "end_reason", "members", "attached")


def _subscriptions(core: SnapshotSource, state: RouterState, mesh: MeshView | None, now: float,
                   req: Request) -> Rows:
    page = core.snapshot(now, Parts(subscriptions=Page(req.offset, req.limit, req.include_ended))).subscriptions
    assert page is not None
    return SUBSCRIPTION_COLUMNS, subscription_rows(page), page.total


def peer_rows(me: str, status: dict[str, Any], mesh: MeshView | None) -> list[list[Any]]:
    """One row per other router of the topology (or, without one, every router heard of)."""
    m: dict[str, Any] = status.get("mesh", {})
    reachable: dict[str, str] = m.get("reachable", {})
    synced: dict[str, str] = m.get("synced", {})
    neighbours = set(status.get("neighbours", ()))
    linked = {b for a, b in mesh.links if a == me} | {a for a, b in mesh.links if b == me} if mesh else set()
    routers = set(mesh.routers) if mesh else set(reachable) | set(synced)
    rows = []
    for r in sorted(routers - {me}):
        inc = reachable.get(r)
        rows.append([r, inc is not None, (r in neighbours) if r in linked or not mesh else None, inc,
                     inc is not None and synced.get(r) == inc])
    return rows


PEER_COLUMNS = ("router", "reachable", "link_up", "incarnation", "synced")


def _peers(core: SnapshotSource, state: RouterState, mesh: MeshView | None, now: float, req: Request) -> Rows:
    return _all(PEER_COLUMNS, peer_rows(state.id, state.management_status(), mesh))


def _inflight(core: SnapshotSource, state: RouterState, mesh: MeshView | None, now: float, req: Request) -> Rows:
    """Records oldest first: `origin` is `here` or the router that sent the copy; `pending`
    subscriptions still QUEUED or SENT; `publisher` whether its publisher's delivery is open here."""
    cols = ("gid", "topic", "origin", "age_s", "outcome", "pending", "parts", "publisher", "number")
    page = core.snapshot(now, Parts(records=Page(req.offset, req.limit))).records
    assert page is not None
    rows = [[r.gid, r.topic, r.origin or "here", round(r.age_s, 3),
             r.outcome.name.lower() if r.outcome is not None else None, r.pending, r.parts, r.publisher,
             r.number] for r in page.rows]
    return cols, rows, page.total


def _orders(core: SnapshotSource, state: RouterState, mesh: MeshView | None, now: float, req: Request) -> Rows:
    cols = ("topic", "algorithm", "state", "sequencer", "view", "numbered", "waiting_here", "queued", "unacked")
    streams: dict[str, dict[str, Any]] = state.management_status().get("order", {})
    # (records of these total-order topics held here without their number yet: order-stream lag)
    waiting = core.snapshot(now, Parts(unnumbered=frozenset(streams))).unnumbered
    rows = []
    for topic, st in sorted(streams.items()):
        view = st.get("view")
        rows.append([topic, st.get("algorithm"), st.get("state"), st.get("sequencer"),
                     ",".join(map(str, view)) if isinstance(view, list) else None, st.get("numbered", 0),
                     waiting.get(topic, 0), st.get("queued"), st.get("unacked")])
    return _all(cols, rows)


_VIEWS: dict[str, Callable[[SnapshotSource, RouterState, MeshView | None, float, Request], Rows]] = {
    "router": _router, "connections": _connections, "links": _links, "topics": _topics,
    "subscriptions": _subscriptions, "peers": _peers, "inflight": _inflight, "orders": _orders,
}
assert set(_VIEWS) == set(W.VIEWS)
