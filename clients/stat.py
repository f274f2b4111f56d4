"""`oncemesh stat`: a router's views over AMQP management requests (like qdstat / skstat).

`Management` is a link owner of the client runtime (clients/runtime.py), so it connects the way
put/get do: TLS, SASL (a password or a client certificate), failover across the URLs given. On
every connection it attaches a sender to `$management` and a receiver from `$management/stat-N`
(a reply address of its own, scoped to the connection); the protocol is in common/mgmtwire.py.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import sys
from typing import Any

from proton import Message

from ..common import ffi as F
from ..common import mgmtwire as W
from ..common.engine import AmqpConnection, Link
from ..common.errors import ClientError, LinkRefused
from .options import client_credentials, security_arguments
from .runtime import Client


class ManagementError(ClientError):
    """The router answered a request with an error status (`status`: 400, 403, 404, ...)."""

    def __init__(self, status: int, description: str) -> None:
        super().__init__(f"{status}: {description}")
        self.status = status


class Management:
    """Requests to the `$management` address of the router a `Client` is connected to."""

    _instances = itertools.count(1)  # (link names are unique per connection)

    def __init__(self, client: Client) -> None:
        self.client = client
        self.n = next(Management._instances)
        self.reply_to = f"{W.MANAGEMENT_ADDRESS}/stat-{self.n}"  # (its own: several may share a connection)
        self.sender: Link | None = None
        self.receiver: Link | None = None
        self._open: set[Link] = set()
        self._ready = asyncio.Event()
        self._failed: BaseException | None = None
        self._waiting: dict[str, asyncio.Future[Message]] = {}
        self._ids = itertools.count(1)
        self._tags = itertools.count(1)
        client.add_owner(self)

    # ------------------------------------------------------------------ LinkOwner
    def attach(self, conn: AmqpConnection, session: Any) -> None:
        self._ready.clear()
        self._open.clear()
        self.receiver = conn.receiver(session, f"oncemesh-stat-replies-{self.n}")
        self.receiver.ctx = self
        self.receiver.set_source(self.reply_to)
        self.receiver.set_settle_modes(F.SND_SETTLED, F.RCV_FIRST)
        self.receiver.open()
        self.receiver.flow(64)
        self.sender = conn.sender(session, f"oncemesh-stat-requests-{self.n}")
        self.sender.ctx = self
        self.sender.set_target(W.MANAGEMENT_ADDRESS)
        self.sender.set_settle_modes(F.SND_SETTLED, F.RCV_FIRST)
        self.sender.open()

    def connection_lost(self) -> None:
        self._ready.clear()
        self._fail_waiting(ConnectionError("the connection to the router was lost"))

    def on_link_open(self, link: Link) -> None:
        self._open.add(link)
        if self.sender in self._open and self.receiver in self._open:
            self._ready.set()

    def on_credit(self, link: Link) -> None:
        pass

    def on_message(self, link: Link, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None:
        msg = Message()
        msg.decode(payload)
        fut = self._waiting.pop(str(msg.correlation_id), None)
        if fut is not None and not fut.done():
            fut.set_result(msg)
        link.flow(1)

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None:
        pass

    def on_link_closed(self, link: Link, closed: bool, condition: tuple[str, str] | None) -> None:
        self._open.discard(link)
        exc = LinkRefused(*condition) if condition else ConnectionError("the router closed the management link")
        self._failed = exc
        self._ready.set()  # (wakes `request`, which raises)
        self._fail_waiting(exc)

    def _fail_waiting(self, exc: BaseException) -> None:
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(exc)
        self._waiting.clear()

    # ------------------------------------------------------------------ requests
    async def view(self, view: str, limit: int = W.DEFAULT_LIMIT, include_ended: bool = False,
                   timeout: float = 10.0, page_size: int = W.PAGE_MAX) -> dict[str, Any]:
        """Up to `limit` rows of a view, asked for `page_size` at a time (an answer holds at most
        W.PAGE_MAX rows), as {router, type, columns, rows, total, truncated}."""
        out = await self.request(view, min(limit, page_size), include_ended, timeout)
        while out["truncated"] and len(out["rows"]) < limit:
            page = await self.request(view, min(limit - len(out["rows"]), page_size), include_ended, timeout,
                                      offset=len(out["rows"]))
            if not page["rows"]:
                break  # (the view shrank meanwhile)
            out["rows"] += page["rows"]
            out["total"] = page["total"]
            out["truncated"] = page["truncated"]
        out["truncated"] = len(out["rows"]) < out["total"]
        return out

    async def request(self, view: str, limit: int = W.DEFAULT_LIMIT, include_ended: bool = False,
                      timeout: float = 10.0, offset: int = 0) -> dict[str, Any]:
        """One answer: {router, type, columns, rows, total, offset, truncated}. Raises ManagementError
        for an error status, LinkRefused when the router refuses the links (e.g. no `manage`
        permission)."""
        await asyncio.wait_for(self._ready.wait(), timeout)
        if self._failed is not None:
            raise self._failed
        assert self.sender is not None
        cid = f"stat-{next(self._ids)}"
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[cid] = fut
        body: dict[str, Any] = {"limit": limit}
        if offset:
            body["offset"] = offset
        if include_ended:
            body["all"] = True
        msg = Message(address=W.MANAGEMENT_ADDRESS, reply_to=self.reply_to, correlation_id=cid,
                      properties={W.OPERATION: W.QUERY, W.TYPE: view}, body=body)
        self.sender.send(f"r{next(self._tags)}".encode(), msg.encode(), settled=True)
        try:
            reply = await asyncio.wait_for(fut, timeout)
        finally:
            self._waiting.pop(cid, None)
        props: dict[Any, Any] = reply.properties or {}
        status = int(props.get(W.STATUS_CODE, 500))
        if status != W.OK:
            raise ManagementError(status, str(props.get(W.STATUS_DESCRIPTION, "")))
        if not isinstance(reply.body, dict):
            raise ManagementError(status, f"the answer's body is not a map: {type(reply.body).__name__}")
        return reply.body


# ---------------------------------------------------------------------- command line
def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    views = "\n".join(f"  {name:14} {what}" for name, what in W.VIEWS.items())
    p = sub.add_parser(
        "stat", help="show a router's connections, links, topics, subscriptions, peers, ... (management)",
        description="Ask a router for its management views over AMQP (the reserved address $management),\n"
                    "like qdstat/skstat. Any router of a mesh answers for itself; peers and subscriptions\n"
                    "show what it knows of the others.\n\nViews:\n" + views + "\n  all            every view\n\n"
                    "The user needs the manage permission (docs/security.md, 'Authorization').\n\n"
                    "Examples:\n"
                    "  oncemesh stat --url amqp://127.0.0.1:5672\n"
                    "  oncemesh stat subscriptions peers --url amqps://r1:5671 --ca ca.pem --user ops\n"
                    "  oncemesh stat inflight --limit 20 --json --url ...",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("views", nargs="*", metavar="VIEW", default=["router"],
                   help=f"views to show (default: router): {', '.join(W.VIEWS)}, all")
    p.add_argument("--url", required=True, help="the router to ask: amqp://HOST:PORT or amqps://HOST:PORT "
                                                 "(comma-separated: the first that answers)")
    p.add_argument("--json", action="store_true", help="print one JSON object: view -> {router, columns, "
                                                      "rows (as objects), total, truncated}")
    p.add_argument("--limit", type=int, default=W.DEFAULT_LIMIT,
                   help=f"rows per view at most (default {W.DEFAULT_LIMIT}, up to {W.MAX_ROWS}; asked for "
                        f"{W.PAGE_MAX} at a time); a cut view says so")
    p.add_argument("--all", action="store_true", help="subscriptions: ended ones too (kept until forgotten)")
    p.add_argument("--connect-timeout", "--timeout", dest="timeout", type=float, default=10.0,
                   help="seconds to wait for the router (default 10)")
    security_arguments(p)
    p.add_argument("-v", "--verbose", action="store_true", help="log the connection's progress on stderr")
    p.set_defaults(func=cmd_stat)


def cmd_stat(args: argparse.Namespace) -> int:
    views = list(W.VIEWS) if "all" in args.views else args.views
    unknown = [v for v in views if v not in W.VIEWS]
    if unknown:
        print(f"oncemesh stat: no view {', '.join(unknown)}; views: {', '.join(W.VIEWS)}, all", file=sys.stderr)
        return 2
    if not 1 <= args.limit <= W.MAX_ROWS:
        print(f"oncemesh stat: --limit must be from 1 to {W.MAX_ROWS}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, stream=sys.stderr,
                        format="%(message)s")
    try:
        tls, user, password = client_credentials(args)
        client = Client(args.url, reconnect_timeout=args.timeout, connect_timeout=min(args.timeout, 5.0), tls=tls,
                        user=user, password=password, container_id=f"oncemesh-stat-{os.getpid()}")
    except ValueError as exc:
        print(f"oncemesh stat: {exc}", file=sys.stderr)
        return 2
    try:
        results = asyncio.run(_stat(client, views, args))
    except ManagementError as exc:
        print(f"oncemesh stat: the router answered {exc}", file=sys.stderr)
        return 1
    except (ClientError, ConnectionError, TimeoutError) as exc:
        print(f"oncemesh stat: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if args.json:
        print(json.dumps({v: as_objects(r) for v, r in results.items()}, indent=1, default=str))
    else:
        first = True
        for view, res in results.items():
            if not first:
                print()
            first = False
            print(render(view, res))
    return 0


async def _stat(client: Client, views: list[str], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    await client.start()
    try:
        mgmt = Management(client)
        return {v: await mgmt.view(v, args.limit, args.all, args.timeout) for v in views}
    finally:
        await client.close()


def as_objects(res: dict[str, Any]) -> dict[str, Any]:
    cols = res.get("columns", [])
    return {**{k: v for k, v in res.items() if k not in ("columns", "rows")},
            "rows": [dict(zip(cols, row, strict=False)) for row in res.get("rows", [])]}


def _cell(v: Any) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def render(view: str, res: dict[str, Any]) -> str:
    """A view as text: a table, or for a single-row view one `name  value` line per column."""
    cols: list[str] = list(res.get("columns", []))
    rows: list[list[Any]] = list(res.get("rows", []))
    head = f"{view} (router {res.get('router')})"
    if res.get("truncated"):
        head += f": {len(rows)} of {res.get('total')} rows (--limit)"
    if view == "router" and len(rows) == 1:
        width = max(len(c) for c in cols)
        return "\n".join([head] + [f"  {c:<{width}}  {_cell(v)}" for c, v in zip(cols, rows[0], strict=False)])
    if not rows:
        return f"{head}\n  (none)"
    table = [[c.upper() for c in cols]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(cols))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)).rstrip() for r in table]
    return "\n".join([head, *lines])
