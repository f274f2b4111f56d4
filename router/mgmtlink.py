"""The I/O edge of management: the links to `$management` on client connections (common/mgmtwire.py
has the protocol, router/management.py the answers).

A client attaches a sender to `$management` (requests) and a receiver for replies: from
`$management`, from an address of its own under `$management/` (unique on its connection), or
from a dynamic source (the router names it `$management/reply/N`). Both are checked against the policy at attach time: the management views
show every topic, subscription and connection, so they need the `manage` permission (router/policy.py;
without a policy file, every authenticated identity, and anonymous clients only on an open router).
Requests are answered at once, on the loop, from the router's state: they are rare and bounded
(`limit`), and reading the state from another thread would race with the loop.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

from proton import Message

from ..common import engine as amqp
from ..common import errors
from ..common import ffi as F
from ..common import mgmtwire as W
from ..common.engine import AmqpConnection, Link
from .http import readiness
from .management import ConnInfo, LinkInfo, ManagementError, answer, error_answer, parse_request
from .snapshot import Parts

if TYPE_CHECKING:
    from .server import Router

log = logging.getLogger("oncemesh.management")
REQUEST_CREDIT = 16  # requests a client may have in flight on one link


class MgmtCtx:
    """The context of a management link: requests in (`reply` False) or replies out, from `address`."""

    __slots__ = ("reply", "address", "user")

    def __init__(self, reply: bool, address: str, user: str) -> None:
        self.reply = reply
        self.address = address
        self.user = user


class ManagementLinks:
    """Claims `$management` links for the router and answers their requests. Also the router's
    `RouterState` for router/management.py."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self._names = itertools.count(1)
        self._tags = itertools.count(1)
        self.requests = 0
        self.refused = 0

    # ------------------------------------------------------------------ RouterState
    @property
    def id(self) -> str:
        return self.router.id

    @property
    def incarnation(self) -> str:
        return self.router.incarnation

    def management_status(self) -> dict[str, Any]:
        snap = self.router.core.snapshot(time.time(), Parts(counts=True))
        info = self.router.ready_info(snap)
        info["ready"], info["why"] = readiness(self.router, snap)
        return info

    def management_connections(self) -> list[ConnInfo]:
        out = []
        for conn in self.router.connections:
            if conn.closed:
                continue
            ctx = conn.ctx
            links = tuple(_link_info(link) for link in conn.links.values() if not link.freed)
            out.append(ConnInfo(conn.peer, getattr(ctx, "container", None), conn.user, conn.encrypted, links))
        return out

    # ------------------------------------------------------------------ links
    def may_manage(self, conn: AmqpConnection) -> bool:
        """The `manage` permission of the policy; without a policy, every authenticated identity,
        and anonymous clients only where the router is open (no client authentication at all)."""
        r = self.router
        grants = r._grants(conn)
        if grants is not None:
            return grants.manage
        return conn.user is not None or not r.client_auth

    def claims(self, link: Link) -> bool:
        """A remote attach: is it a management link? Then it is set up (or refused by raising
        UnauthorizedAccess) here; else the router treats it as a publisher or subscriber."""
        if link.is_sender:
            source = link.remote_source_address
            dynamic = link.remote_source_dynamic
            if not (dynamic or source == W.MANAGEMENT_ADDRESS or (source or "").startswith(W.MANAGEMENT_ADDRESS + "/")):
                return False
        elif link.remote_target_address != W.MANAGEMENT_ADDRESS:
            return False
        conn = link.conn
        user = conn.user or "anonymous"
        if not self.may_manage(conn):
            self.refused += 1
            policy = self.router.policy
            raise errors.UnauthorizedAccess(
                f"user {user!r} may not use {W.MANAGEMENT_ADDRESS} (the management views): "
                + (f"the policy {policy.source} grants it with manage = true" if policy is not None else
                   "log in (anonymous clients may manage only an open router)"))
        if link.is_sender:  # replies go out on it, to the address it names (unique on its connection)
            in_use = {li.ctx.address for li in conn.links.values() if isinstance(li.ctx, MgmtCtx) and li.ctx.reply
                      and not li.freed}
            address = source or W.MANAGEMENT_ADDRESS
            if dynamic:
                while address in in_use or not address.startswith(W.REPLY_PREFIX):
                    address = f"{W.REPLY_PREFIX}{next(self._names)}"
            elif address in in_use:
                raise errors.InvalidAddress(f"reply address {address!r} is in use by another link on this "
                                            f"connection: name another ({W.MANAGEMENT_ADDRESS}/SOMETHING) or "
                                            f"ask for a dynamic source")
            link.ctx = MgmtCtx(True, address, user)
            link.set_source(link.ctx.address)
            link.set_target(link.remote_target_address)
            link.set_settle_modes(F.SND_SETTLED, F.RCV_FIRST)
            link.open()
        else:
            link.ctx = MgmtCtx(False, W.MANAGEMENT_ADDRESS, user)
            link.set_target(W.MANAGEMENT_ADDRESS)
            link.set_source(link.remote_source_address)
            link.set_settle_modes(F.SND_UNSETTLED, F.RCV_FIRST)
            link.open()
            link.flow(REQUEST_CREDIT)
        log.info("management.attached peer=%s user=%s link=%s role=%s", conn.peer, user, link.name,
                 "replies" if link.ctx.reply else "requests")
        return True

    def on_request(self, link: Link, delivery: Any, payload: bytes, settled: bool) -> None:
        """A request arrived: answer it on the connection's reply link, then accept it."""
        ctx: MgmtCtx = link.ctx
        if ctx.reply:  # (the client sent on a link we send on: nothing to do with it)
            self._dispose(delivery, settled, F.REJECTED, (errors.NotAllowed.condition, "a reply link takes no requests"))
            return
        link.flow(1)
        msg = Message()
        try:
            msg.decode(payload)
        except Exception as exc:  # (proton raises its own types for any malformed encoding)
            self._dispose(delivery, settled, F.REJECTED, (errors.DecodeError.condition, f"not an AMQP message: {exc}"))
            return
        reply = self._reply_link(link.conn, msg.reply_to)
        if reply is None:
            self._dispose(delivery, settled, F.REJECTED, (errors.NotFound.condition,
                          f"reply-to {msg.reply_to!r} names no reply link on this connection: attach a receiver "
                          f"from {W.MANAGEMENT_ADDRESS!r} (or a dynamic one) and name its source address"))
            return
        try:
            ans = answer(parse_request(msg.properties, msg.body), self.router.core, self, self.router.cfg.mesh_view,
                         time.time())
        except ManagementError as exc:
            ans = error_answer(exc)
        self.requests += 1
        props: dict[Any, Any] = msg.properties or {}
        view = props.get(W.TYPE)
        log.info("management.request peer=%s user=%s view=%s status=%d", link.conn.peer, ctx.user, view, ans.status)
        out = Message(address=reply.ctx.address, body=ans.body,
                      correlation_id=msg.correlation_id if msg.correlation_id is not None else msg.id,
                      properties={W.STATUS_CODE: ans.status, W.STATUS_DESCRIPTION: ans.description})
        reply.send(f"m{next(self._tags)}".encode(), out.encode(), settled=True)
        self._dispose(delivery, settled, F.ACCEPTED, None)

    def _reply_link(self, conn: AmqpConnection, reply_to: str | None) -> Link | None:
        replies = [link for link in conn.links.values()
                   if isinstance(link.ctx, MgmtCtx) and link.ctx.reply and not link.freed and link.local_active]
        if reply_to is None:
            return replies[0] if len(replies) == 1 else None
        return next((link for link in replies if link.ctx.address == reply_to), None)

    @staticmethod
    def _dispose(delivery: Any, settled: bool, state: int, condition: tuple[str, str] | None) -> None:
        if not settled:
            amqp.update(delivery, state, condition)
            amqp.settle(delivery)


def _link_info(link: Link) -> LinkInfo:
    """What management shows of a link (the router's link contexts, told apart by what they hold)."""
    ctx = link.ctx
    if isinstance(ctx, MgmtCtx):
        return LinkInfo(link.name, "management", ctx.address, None, link.credit, link.unsettled)
    sid = getattr(ctx, "sid", None)
    if sid is not None:  # a subscriber's link (server.SubLinkCtx)
        return LinkInfo(link.name, "subscriber", ctx.topic, sid, link.credit, len(ctx.deliveries))
    if getattr(ctx, "plid", None) is not None:  # a publisher's link (server.PubLinkCtx)
        return LinkInfo(link.name, "publisher", ctx.topic, None, link.credit, len(ctx.deliveries), token=link)
    return LinkInfo(link.name, "attaching" if link.local_uninit else "closing", None, None, link.credit,
                    link.unsettled)
