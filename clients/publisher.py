"""Publisher: exactly-once publishing (receiver-settle-mode second) with resend after failover.

Each message gets a sequence number on its link and the delivery tag `counter_tag(seq)`; the
routers derive the global id from (container-id, link name, tag), so a resend after a failover is
recognised as the same message anywhere in the mesh. A message stays *in doubt* from its first send
until the router's outcome arrives; then we settle it (which lets the routers free it everywhere).
On reconnect the link is re-attached under the same name, declares its in-doubt tags
(`oncemesh.in-doubt`) and resends them in order, before anything new.

With a state directory the publisher keeps a durable outbox: every message is in the outbox (SQLite)
before its first send and leaves it with its outcome, so a publisher process that was killed resends
what was in doubt when it comes back (`resend_outbox`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any

from proton import Message, ulong

from ..common import engine as amqp
from ..common import errors
from ..common import ffi as F
from ..common.engine import AmqpConnection, Link
from ..common.errors import ClientError, LinkRefused
from ..common.ids import counter_tag, global_id, publisher_link_id
from ..common.symbols import PROP_CAUSAL_PAST, PROP_CLIENT, PROP_IN_DOUBT, PROP_NEXT_SEQ, PROP_RECEIVED
from ..common.vocab import Outcome

if TYPE_CHECKING:
    from .runtime import Client

log = logging.getLogger("oncemesh.publisher")

_OUTCOMES = {F.ACCEPTED: Outcome.ACCEPTED, F.REJECTED: Outcome.REJECTED, F.RELEASED: Outcome.RELEASED,
             F.MODIFIED: Outcome.MODIFIED}
SEQ_BLOCK = 1024
# a router refusing the link with one of these will refuse it again: fail what waits, do not retry
_PERMANENT = frozenset({errors.UnauthorizedAccess.condition, errors.InvalidAddress.condition,
                        errors.NotImplementedMode.condition, errors.MessageTooLarge.condition})


class Result:
    """The outcome of one message, once known."""

    __slots__ = ("gid", "seq", "outcome", "condition")

    def __init__(self, gid: str, seq: int, outcome: Outcome, condition: tuple[str, str] | None) -> None:
        self.gid = gid
        self.seq = seq
        self.outcome = outcome
        self.condition = condition

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.ACCEPTED

    def __repr__(self) -> str:
        return f"<Result {self.gid} {self.outcome.name}>"


class Pending:
    __slots__ = ("seq", "tag", "gid", "payload", "future", "received", "sends")

    def __init__(self, seq: int, tag: bytes, gid: str, payload: bytes,
                 future: asyncio.Future[Result] | None) -> None:
        self.seq = seq
        self.tag = tag
        self.gid = gid
        self.payload = payload
        self.future = future
        self.received: asyncio.Future[None] | None = None
        self.sends = 0


# What Proton writes for Message(body=x): an empty header, empty properties, then the body as an
# amqp-value section. Bytes and str bodies (nearly every message) are encoded here directly, byte for
# byte the same (tests/unit/test_clients.py checks it against Proton), at a fifth of the cost.
_VALUE_PREFIX = bytes.fromhex("0053704500537345005377")


def encode_body(body: Any) -> bytes:
    t = type(body)
    if t is bytes or t is str:
        if t is str:
            data = body.encode("utf-8")
            short, long = 0xA1, 0xB1  # str8-utf8, str32-utf8
        else:
            data = body
            short, long = 0xA0, 0xB0  # vbin8, vbin32
        n = len(data)
        if n < 256:
            return b"".join((_VALUE_PREFIX, bytes((short, n)), data))
        return b"".join((_VALUE_PREFIX, bytes((long,)), n.to_bytes(4, "big"), data))
    if isinstance(body, Message):
        return bytes(body.encode())
    return bytes(Message(body=body).encode())


class Publisher:
    """Publishes to one topic over one link. Create with `Client.publisher(topic)`."""

    def __init__(self, client: Client, topic: str, name: str | None = None, *,
                 settle_mode: str = "second", window: int = 10_000, want_received: bool = False) -> None:
        if settle_mode not in ("first", "second"):
            raise ValueError("settle_mode must be 'first' (at-least-once) or 'second' (exactly-once)")
        self.client = client
        self.topic = topic
        self.name = name or f"pub-{topic}-{uuid.uuid4().hex[:8]}"
        self.plid = publisher_link_id(client.container_id, self.name)
        self.second = settle_mode == "second"
        self.window = window  # max messages in doubt at once (send() waits beyond it)
        self.want_received = want_received
        self.link: Link | None = None
        self.inflight: OrderedDict[int, Pending] = OrderedDict()  # seq order, until the outcome
        self.unsent: deque[Pending] = deque()
        self.by_delivery: dict[Any, Pending] = {}
        self._seq_next = 0
        self._latest_sent: tuple[int, str] = (-1, "")  # causal order: the latest message it sent
        self._seq_limit = 0
        self._room = asyncio.Event()
        self._room.set()
        self._attached = asyncio.Event()
        self._refused: LinkRefused | None = None
        self._persist: list[Pending] = []
        self.meta_updates: dict[str, str] = {}  # written with the next outbox batch (same transaction)
        self._outcomes_done: list[int] = []
        self._flush_scheduled = False
        self._slog = client.settlement_log("publisher")
        self.sent_count = 0
        self.resends = 0
        self.closed = False
        self._failed: BaseException | None = None
        self._load_outbox()  # before the first attach: its in-doubt declaration must name them
        client.add_owner(self)

    # ------------------------------------------------------------------ public API
    @property
    def durable(self) -> bool:
        return self.client.state.durable

    async def wait_attached(self, timeout: float | None = None) -> None:
        """Wait until the router answered the link's attach (raises `LinkRefused` if it refused)."""
        await asyncio.wait_for(self._attached.wait(), timeout)
        if self._refused is not None:
            raise self._refused

    async def send(self, body: Any, *, raw: bool = False) -> asyncio.Future[Result]:
        """Queue one message; returns a future for its Result. Waits while `window` are in doubt."""
        if self._failed is not None:
            raise self._failed
        if self._refused is not None:
            raise self._refused
        while len(self.inflight) >= self.window:
            self._room.clear()
            await self._room.wait()
        payload = body if raw else encode_body(body)
        fut: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._enqueue(payload, fut)
        return fut

    async def put(self, body: Any, *, raw: bool = False, timeout: float | None = None) -> Result:
        """Send one message and wait for its outcome."""
        fut = await self.send(body, raw=raw)
        return await asyncio.wait_for(asyncio.shield(fut), timeout)

    async def put_received(self, body: Any, *, raw: bool = False, timeout: float | None = None) -> Pending:
        """Send and return once a router holds the message (RECEIVED), leaving it in doubt."""
        if not self.want_received:
            raise ClientError("create the publisher with want_received=True to use put_received()")
        fut = await self.send(body, raw=raw)
        p = self.inflight.get(self._seq_next - 1)
        assert p is not None
        p.received = asyncio.get_running_loop().create_future()
        waiters: set[asyncio.Future[Any]] = {p.received, fut}
        done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            raise TimeoutError(f"no router confirmed holding message {p.gid} within {timeout}s")
        return p

    async def flush(self, timeout: float | None = None) -> list[Result]:
        """Wait for the outcome of everything in doubt."""
        futs = [p.future for p in self.inflight.values() if p.future is not None]
        if not futs:
            return []
        return list(await asyncio.wait_for(asyncio.gather(*futs), timeout))

    def in_doubt(self) -> int:
        """Messages sent whose outcome is not known yet (resent after a failover)."""
        return len(self.inflight)

    def _load_outbox(self) -> None:
        """A restarted publisher's outbox is in doubt from the start: it is declared in the first
        attach (`oncemesh.in-doubt`) and resent first. Were it declared later, the routers would
        take the messages they still hold of this link for settled (found by a test: a restarted
        publisher was told ACCEPTED before its subscriber had the message)."""
        if not self.client.state.durable:
            return
        for _link, seq, tag, _topic, payload in self.client.state.outbox(self.name):
            p = Pending(seq, tag, global_id(self.plid, tag), payload, None)
            self.inflight[seq] = p
            self.unsent.append(p)
            self._seq_next = max(self._seq_next, seq + 1)
        # past everything an earlier run may have published (our declaration's mark covers it all;
        # the next message reserves a fresh block)
        self._seq_next = max(self._seq_next, self.client.state.seqs_reserved(self.name))
        self._seq_limit = self._seq_next

    def resend_outbox(self) -> list[asyncio.Future[Result]]:
        """Take over what the outbox holds for this link (a restarted publisher): resend it all.
        Returns the futures of their outcomes."""
        rows = self.client.state.outbox(self.name)
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[Result]] = []
        for p in self.inflight.values():  # loaded at start: give them futures
            if p.future is None:
                p.future = loop.create_future()
                futs.append(p.future)
        for _link, seq, tag, _topic, payload in rows:
            if seq in self.inflight:
                continue
            fut: asyncio.Future[Result] = loop.create_future()
            p = Pending(seq, tag, global_id(self.plid, tag), payload, fut)
            self.inflight[seq] = p
            self.unsent.append(p)
            self._seq_next = max(self._seq_next, seq + 1)
            futs.append(fut)
        if rows:
            self.inflight = OrderedDict(sorted(self.inflight.items()))
            self.unsent = deque(sorted(self.unsent, key=lambda p: p.seq))
            self._pump()
        return futs

    async def close(self) -> None:
        """Detach (our in-doubt messages stay in the outbox when durable)."""
        self.closed = True
        if self.link is not None and self.link.local_active:
            self.link.close()
        self.client.remove_owner(self)

    def fail(self, exc: BaseException) -> None:
        """Give up: every waiting send fails with `exc` (what is in the outbox stays there)."""
        self._failed = exc
        for p in list(self.inflight.values()):
            if p.future is not None and not p.future.done():
                p.future.set_exception(exc)

    # ------------------------------------------------------------------ internals
    def _enqueue(self, payload: bytes, fut: asyncio.Future[Result] | None) -> Pending:
        if self._seq_next >= self._seq_limit:
            if self.durable:
                self._seq_next = max(self._seq_next, self.client.state.reserve_seqs(self.name, SEQ_BLOCK))
                self._seq_limit = self._seq_next + SEQ_BLOCK
            else:
                self._seq_limit = self._seq_next + SEQ_BLOCK
        seq = self._seq_next
        self._seq_next += 1
        tag = counter_tag(seq)
        p = Pending(seq, tag, global_id(self.plid, tag), payload, fut)
        self.inflight[seq] = p
        if self.durable:
            self._persist.append(p)
        else:
            self.unsent.append(p)
        self._schedule_flush()
        return p

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self.client.engine is not None:
            self._flush_scheduled = True
            self.client.engine.call_after_pass(self._after_pass)

    def _after_pass(self) -> None:
        self._flush_scheduled = False
        state = self.client.state
        if self._persist:
            batch, self._persist = self._persist, []
            meta, self.meta_updates = self.meta_updates, {}
            state.outbox_add([(self.name, p.seq, p.tag, self.topic, p.payload) for p in batch], meta)
            self.unsent.extend(batch)
        if self._outcomes_done:
            done, self._outcomes_done = self._outcomes_done, []
            if self.durable:
                self._slog.flush()  # their outcome lines are on record before the outbox forgets them
                state.outbox_remove(self.name, done)
        self._pump()
        self._slog.flush()

    def _pump(self) -> None:
        link = self.link
        if link is None or not link.active:
            return
        slog = self._slog
        while self.unsent and link.credit > 0:
            p = self.unsent.popleft()
            if p.seq not in self.inflight:
                continue
            d = link.send(p.tag, p.payload)
            self.by_delivery[d] = p
            p.sends += 1
            if p.sends == 1:
                self.sent_count += 1
                if p.seq > self._latest_sent[0]:
                    self._latest_sent = (p.seq, p.gid)
                slog.write("published", self._now(), p.gid, self.topic, None, pub=self.plid,
                           link=self.name, seq=p.seq, size=len(p.payload))
            else:
                self.resends += 1

    def causal_entries(self) -> list[list[str]]:
        """Its part of the client's causal past: the latest message it sent, with its topic."""
        return [[self._latest_sent[1], self.topic]] if self._latest_sent[0] >= 0 else []

    _now = staticmethod(time.time)

    # ------------------------------------------------------------------ link owner
    def attach(self, conn: AmqpConnection, session: Any) -> None:
        """Attach the link on a new connection, declaring what is in doubt (the client calls it)."""
        if self.closed:
            return
        self._attached.clear()
        link = conn.sender(session, self.name)
        link.ctx = self
        link.set_target(self.topic)
        link.set_settle_modes(F.SND_UNSETTLED, F.RCV_SECOND if self.second else F.RCV_FIRST)
        props: dict[Any, Any] = {PROP_CLIENT: 1}
        declared = [p for p in self.inflight.values() if p.sends > 0 or self.durable]
        props[PROP_IN_DOUBT] = [p.tag for p in declared]
        # what we published by now and do not list is settled; nothing is said of later messages
        # (the first one not on the wire yet and every one after it)
        unsent = [p.seq for p in self.inflight.values() if not (p.sends > 0 or self.durable)]
        props[PROP_NEXT_SEQ] = ulong(min(unsent, default=self._seq_next))
        if self.want_received:
            props[PROP_RECEIVED] = True
        past = self.client.causal_past()
        if past:  # causal order: what this client was handed and published, for a router it moved to
            props[PROP_CAUSAL_PAST] = past
        link.set_properties(props)
        link.open()
        self.link = link
        # everything in doubt goes first, in order, once the router answers and grants credit
        persisting = {p.seq for p in self._persist}
        self.unsent = deque(p for p in self.inflight.values() if p.seq not in persisting)

    def connection_lost(self) -> None:
        """The connection went: what was sent is in doubt until resent (the client calls it)."""
        self.link = None
        self.by_delivery.clear()
        self._attached.clear()

    def on_link_open(self, link: Link) -> None:
        if link is not self.link:
            return
        self._refused = None
        self._attached.set()
        self._pump()

    def on_credit(self, link: Link) -> None:
        if link is self.link:
            self._pump()

    def on_message(self, link: Link, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None:
        pass

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None:
        p = self.by_delivery.get(delivery)
        if p is None:
            if settled:
                amqp.settle(delivery)
            return
        if state == F.RECEIVED:
            if p.received is not None and not p.received.done():
                p.received.set_result(None)
            return
        outcome = _OUTCOMES.get(state)
        if outcome is None:
            return
        cond = amqp.remote_condition(delivery) if outcome is Outcome.REJECTED else None
        del self.by_delivery[delivery]
        amqp.settle(delivery)  # mode second: we settle after the outcome; the routers free it
        link.conn.touch()
        if outcome in (Outcome.RELEASED, Outcome.MODIFIED):
            self.unsent.appendleft(p)  # the router asks us to try again
            self._pump()
            return
        self.inflight.pop(p.seq, None)
        self._outcomes_done.append(p.seq)
        self._slog.write("outcome", self._now(), p.gid, self.topic, None, pub=self.plid, link=self.name,
                         seq=p.seq, outcome=outcome.name,
                         error=f"{cond[0]}: {cond[1]}" if cond else None)
        if p.future is not None and not p.future.done():
            p.future.set_result(Result(p.gid, p.seq, outcome, cond))
        if p.received is not None and not p.received.done():
            p.received.set_result(None)
        if len(self.inflight) < self.window:
            self._room.set()
        self._schedule_flush()

    def on_link_closed(self, link: Link, closed: bool, condition: tuple[str, str] | None) -> None:
        if link is not self.link:
            return
        self.link = None
        self.by_delivery.clear()
        if condition is not None and condition[0] == errors.LinkRedirect.condition:
            # the router drains: what is in doubt is resent (and declared) at the next router
            log.info("publisher.redirected topic=%s link=%s", self.topic, self.name)
            self.client.move(link.remote_condition_info())
            return
        if condition is not None:
            self._refused = LinkRefused(*condition)
            log.warning("publisher.link_closed topic=%s link=%s condition=%s", self.topic, self.name,
                        condition)
            self._attached.set()  # wake waiters; they see the refusal
            if condition[0] in _PERMANENT:
                self.fail(self._refused)
