"""Subscriber: durable subscriptions, resume after failover, exactly-once hand-over to the application.

A message is *handed over* when its global id is committed to the deduplication store (and the
`handed` line is in the settlement log); only then is it accepted at the router and returned to the
application. A process killed before the commit gets it again (it was never handed over); one
killed after the commit presents the id when it resumes (`oncemesh.resume`), so the routers count
it as accepted and never redeliver it. The one window in between (committed, killed before the
`handed` lines were written) is closed on restart: ids of the last hand-over that the log does not
show are forgotten and redelivered (`_repair_last_hand_over`). Anything that arrives again anyway (a resend racing a
failover, a foreign router) is found in the store and accepted without being handed over twice.

An id leaves the "accepted, not settled" set when the router settles the delivery or reports it
final (`$final` control transfers, for ids accepted on an earlier link).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from proton import Described, Message

from ..common import engine as amqp
from ..common import errors
from ..common import ffi as F
from ..common.engine import AmqpConnection, Link
from ..common.errors import ClientError, LinkRefused
from ..common.ids import (
    GLOBAL,
    NAME_DELIMITER,
    PLID_LEN,
    SHARED,
    counter_seq,
    is_control_tag,
    shared_subscription_id,
    subscription_id,
)
from ..common.symbols import (
    PROP_CLIENT,
    PROP_EPOCH,
    PROP_HANDED_LAST,
    PROP_RESUME,
    PROP_RESUMED,
    SELECTOR_FILTER,
    SELECTOR_KEY,
)
from ..common.topics import is_wildcard
from ..common.vocab import FINAL_SUBJECT, SELECTIVE
from .host import ClientHost

log = logging.getLogger("oncemesh.subscriber")

STOLEN_RETRY = 1.0  # seconds before attaching again after our link was taken (doubling, up to 30 s)

# Settlement-log fields this writer adds to router.settlement_log.FIELDS (name -> JSON type), in line
# order; spark/schema.py reads them too (tests/spark/test_schema.py keeps the two in step).
#   n: the position of a `handed` line's hand-over in this process for this subscription (1, 2, ...):
#      the lines of one batch share their ts, n keeps their order.
SETTLEMENT_FIELDS: dict[str, str] = {"n": "int"}


class Delivered:
    """One message handed to the application."""

    __slots__ = ("gid", "payload", "_topic", "_message")

    def __init__(self, gid: str, payload: bytes, topic: str | None) -> None:
        self.gid = gid
        self.payload = payload
        self._topic = topic  # None: read from the message (a wildcard subscription's)
        self._message: Message | None = None

    @property
    def topic(self) -> str:
        """The topic the message was published to: the subscription's, or for a subscription to a
        wildcard filter, the message's `to` (which the router sets when its publisher did not)."""
        if self._topic is None:
            self._topic = str(self.message.address or "")
        return self._topic

    @property
    def message(self) -> Message:
        if self._message is None:
            m = Message()
            m.decode(self.payload)
            self._message = m
        return self._message

    @property
    def body(self) -> Any:
        return self.message.body

    def __repr__(self) -> str:
        return f"<Delivered {self.gid}>"


class Subscriber:
    """A durable subscription to one topic. Create with `Client.subscriber(topic, name)`."""

    def __init__(self, client: ClientHost, topic: str, name: str, *, expiry: float = 3600.0,
                 credit: int = 1000, on_message: Callable[[Delivered], Any] | None = None,
                 selector: str | None = None, shared: bool | None = None) -> None:
        """`selector`: a JMS message selector (docs/clients.md, "Selectors"): the subscription is owed
        only the messages it selects. Attaching again with another one ends the subscription and
        begins a new one (what the old one held is not handed). None: the one this state directory
        last attached it with (none at first). `shared`: be one member of the global shared
        subscription `name` (docs/clients.md, "Shared subscriptions"), which other clients may
        consume too; None: as this state directory last made it (not shared at first)."""
        self.client = client
        self.topic = topic
        self.name = name
        self.expiry = expiry
        self.window = credit
        get_meta = getattr(client.state, "get_meta", None)
        key = f"shared:{topic} {name}"
        if shared is None:
            shared = bool(get_meta(key)) if get_meta is not None else False
        elif get_meta is not None:
            client.state.set_meta(key, "1" if shared else "")
        self.shared = shared
        # a member's link name: the subscription's name, then what Qpid JMS puts after it
        self.link_name = f"{name}{NAME_DELIMITER}{GLOBAL}" if shared else name
        self.sid = shared_subscription_id("", name, topic) if shared else subscription_id(client.container_id, name,
                                                                                           topic)
        self._selector_given = selector  # (None: read from the state directory at attach)
        self.selector = selector or ""
        self.on_message_cb = on_message
        self.link: Link | None = None
        self.resumed: bool | None = None
        self._incoming: list[tuple[str, Any, bytes]] = []
        self._buffer: deque[tuple[str, Any, bytes]] = deque()
        self._settled: list[str] = []
        self._deliveries: dict[Any, str] = {}  # accepted, unsettled delivery -> gid
        self._buffered: set[Any] = set()  # deliveries received, not yet handed over
        self._withdrawn: set[Any] = set()  # buffered deliveries the router settled: never handed
        self._scheduled = False
        self._arrived = asyncio.Event()
        self._attached = asyncio.Event()
        self._detached = asyncio.Event()
        self._refused: LinkRefused | None = None
        self._closing = False
        self._steals = 0  # our current link taken in a row (see on_link_closed)
        self._slog = client.settlement_log("subscriber")
        self._repair_last_hand_over()
        # FIFO: per publisher link, the latest message handed over (seq, id): presented on attach,
        # so that a router never hands an earlier one that comes only now after it
        self._handed_last: dict[str, tuple[int, str]] = {}
        # total order: the latest message handed over, whatever its publisher (presented with them,
        # so that a router goes on after its number)
        self._latest_handed: str | None = None
        self._note_handed(client.state.handed(self.sid))
        self.handed_count = 0
        self._hand_n = 0  # position of the last hand-over in this process: `n` of the `handed` line
        self.duplicates = 0
        self._failed: BaseException | None = None
        client.state.remember_subscription(self.sid, topic, name, None if math.isinf(expiry) else expiry)
        client.add_owner(self)

    # ------------------------------------------------------------------ public API
    async def wait_attached(self, timeout: float | None = None) -> None:
        """Wait until the subscription is in force (the router answered the attach)."""
        await asyncio.wait_for(self._attached.wait(), timeout)
        if self._refused is not None:
            raise self._refused

    async def get(self, timeout: float | None = None) -> Delivered | None:
        """The next message, or None after `timeout` seconds (None: wait for ever)."""
        got = await self.get_many(1, timeout)
        return got[0] if got else None

    async def get_many(self, n: int, timeout: float | None = None) -> list[Delivered]:
        """Up to n messages, waiting at most `timeout` seconds (None: until n arrived)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        out: list[Delivered] = []
        while len(out) < n:
            if self._failed is not None and not out:
                raise self._failed
            if self._buffer:
                out.extend(self._hand_over(n - len(out)))
                continue
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                break
        return out

    def __aiter__(self) -> Subscriber:
        return self

    async def __anext__(self) -> Delivered:
        m = await self.get()
        assert m is not None
        return m

    async def run(self, handler: Callable[[Delivered], Awaitable[Any] | Any]) -> None:
        """Hand every message to `handler` until cancelled."""
        while True:
            for m in await self.get_many(self.window, timeout=None if not self._buffer else 0):
                r = handler(m)
                if asyncio.iscoroutine(r):
                    await r

    async def detach(self) -> None:
        """Leave without ending the subscription (it stays durable until its expiry)."""
        await self._leave(closed=False)

    async def unsubscribe(self, timeout: float = 10.0) -> None:
        """End the subscription at the routers (UNSUBSCRIBE) and forget its state here."""
        if self.link is None or not self.link.active:
            await self.wait_attached(timeout)
        await self._leave(closed=True, timeout=timeout)
        self.client.state.forget_subscription(self.sid)
        self._slog.write("unsubscribed", time.time(), None, self.topic, self.sid,
                         container=self.client.container_id, link=self.name)
        self._slog.flush()

    def fail(self, exc: BaseException) -> None:
        """Give up: waiting getters fail with `exc`."""
        self._failed = exc
        self._arrived.set()

    # ------------------------------------------------------------------ internals
    async def _leave(self, closed: bool, timeout: float = 5.0) -> None:
        self._closing = True
        self._flush_now()
        link = self.link
        if link is not None and link.local_active:
            self._detached.clear()
            link.close(detach=not closed)
            try:
                await asyncio.wait_for(self._detached.wait(), timeout)
            except TimeoutError:
                if closed:
                    raise ClientError(f"router did not confirm the unsubscribe of {self.topic!r} "
                                      f"within {timeout}s") from None
        self.client.remove_owner(self)

    def _repair_last_hand_over(self) -> None:
        """A process killed between the state's COMMIT of a hand-over and its `handed` log lines
        never gave those messages to the application (the lines are written, and flushed, before
        anything is returned or accepted). Ids of that last hand-over that the log does not show
        are forgotten, so they are not presented as accepted and the routers redeliver them.
        Without a settlement log there is nothing to check against and the store is trusted."""
        path = self._slog.path
        if path is None or not self.client.state.durable:
            return
        last = self.client.state.last_hand_over(self.sid)
        if last is None:
            return
        t, gids = last
        logged = handed_in_log(path, self.sid, set(gids), since=t - 1.0)
        if logged is None:  # an empty log (a new log directory): no evidence either way
            return
        lost = [g for g in gids if g not in logged]
        if lost:
            log.warning("subscriber.unfinished_hand_over sub=%s ids=%d: the process died between the "
                        "state's commit and the hand-over; they will be redelivered", self.sid, len(lost))
            self.client.state.forget_hand_over(self.sid, lost)

    def _note_handed(self, gids: list[str]) -> None:
        if gids:
            self._latest_handed = gids[-1]
        last = self._handed_last
        for g in gids:
            seq = counter_seq(g)
            if seq is not None:
                cur = last.get(g[:PLID_LEN])
                if cur is None or cur[0] < seq:
                    last[g[:PLID_LEN]] = (seq, g)

    def causal_entries(self) -> list[list[str]]:
        """Its part of the client's causal past: per publisher link the latest message handed over,
        with its topic."""
        return [[g, self.topic] for _, g in self._handed_last.values()]

    def _presented_handed(self) -> list[str]:
        """`oncemesh.handed-last`: per publisher link the latest message handed over (FIFO), and the
        latest of all (total order); each was handed over."""
        ids = [g for _, g in self._handed_last.values()]
        if self._latest_handed is not None and self._latest_handed not in ids:
            ids.append(self._latest_handed)
        return ids

    def _hand_over(self, n: int) -> list[Delivered]:
        batch = [self._buffer.popleft() for _ in range(min(n, len(self._buffer)))]
        if self._withdrawn:
            # settled by the router before we took them (final elsewhere): not ours to hand over
            for _, d, _ in batch:
                if d in self._withdrawn:
                    self._withdrawn.discard(d)
                    self._buffered.discard(d)
                    amqp.settle(d)
            batch = [b for b in batch if b[1] in self._buffered]
        if not batch:
            return []
        self._buffered.difference_update(d for _, d, _ in batch)
        gids = [g for g, _, _ in batch]
        self.client.state.hand_over(self.sid, gids)  # durable from here on: handed over
        self._note_handed(gids)
        now = time.time()
        slog = self._slog
        n = self._hand_n
        for g in gids:  # one ts for the batch; `n` keeps the order within it
            n += 1
            slog.write("handed", now, g, self.topic, self.sid, link=self.name, n=n)
        self._hand_n = n
        slog.flush()
        link = self.link
        for g, d, _ in batch:
            amqp.update(d, F.ACCEPTED)
            self._deliveries[d] = g
        if link is not None:
            link.flow(len(batch))
            link.conn.touch()
        self.handed_count += len(batch)
        topic = None if is_wildcard(self.topic) else self.topic
        return [Delivered(g, p, topic) for g, _, p in batch]

    def _schedule(self) -> None:
        if not self._scheduled and self.client.engine is not None:
            self._scheduled = True
            self.client.engine.call_after_pass(self._after_pass)

    def _after_pass(self) -> None:
        self._scheduled = False
        self._flush_now()

    def _flush_now(self) -> None:
        state = self.client.state
        if self._settled:
            done, self._settled = self._settled, []
            state.mark_settled(self.sid, done)
        if not self._incoming:
            return
        batch, self._incoming = self._incoming, []
        seen = state.seen(self.sid, [g for g, _, _ in batch])
        fresh = []
        dups = 0
        now = time.time()
        in_buffer = {g for g, _, _ in self._buffer} if seen or len(batch) > 1 else set()
        for g, d, p in batch:
            if g in seen or g in in_buffer:
                dups += 1
                amqp.update(d, F.ACCEPTED)  # already handed over: accept, never hand twice
                self._deliveries[d] = g
                self._slog.write("duplicate", now, g, self.topic, self.sid, link=self.name)
            else:
                in_buffer.add(g)
                fresh.append((g, d, p))
        if dups:
            self.duplicates += dups
            if self.link is not None:
                self.link.flow(dups)
                self.link.conn.touch()
            self._slog.flush()
        if fresh:
            self._buffer.extend(fresh)
            self._buffered.update(d for _, d, _ in fresh)
            self._arrived.set()
            if self.on_message_cb is not None:
                for m in self._hand_over(len(self._buffer)):
                    try:
                        self.on_message_cb(m)
                    except Exception:
                        log.exception("subscriber.callback_failed gid=%s", m.gid)

    # ------------------------------------------------------------------ link owner
    def attach(self, conn: AmqpConnection, session: Any) -> None:
        """Attach (or resume) the link on a new connection, presenting what it accepted (the client calls it)."""
        if self._closing:
            return
        self._attached.clear()
        link = conn.receiver(session, self.link_name)
        link.ctx = self
        if math.isinf(self.expiry):
            link.set_source(self.topic, 0, F.EXPIRE_NEVER)
        else:
            link.set_source(self.topic, int(self.expiry), F.EXPIRE_WITH_LINK)
        if self._selector_given is None:
            self.selector = self.client.state.get_meta(f"selector:{self.sid}") or ""
        else:
            self.client.state.set_meta(f"selector:{self.sid}", self._selector_given)
        if self.selector:
            link.set_source_filter({SELECTOR_KEY: Described(SELECTOR_FILTER, self.selector)})
        if self.shared:
            link.set_source_capabilities((SHARED, GLOBAL))
        link.set_target(None)
        link.set_settle_modes(F.SND_UNSETTLED, F.RCV_SECOND)
        presented = self.client.state.unsettled(self.sid)
        props: dict[Any, Any] = {PROP_CLIENT: 1, PROP_RESUME: presented,
                                 PROP_HANDED_LAST: self._presented_handed()}
        epoch = self.client.state.get_meta(f"epoch:{self.sid}")
        if epoch:  # where it last attached: a router with an older view distrusts what it held
            props[PROP_EPOCH] = int(epoch)
        link.set_properties(props)
        link.open()
        link.flow(self.window)
        self.link = link

    def connection_lost(self) -> None:
        """The connection went: resume on the next one (the client calls it)."""
        self._flush_now()
        self.link = None
        self._buffer.clear()  # not handed over: the routers redeliver them after resume
        self._buffered.clear()
        self._withdrawn.clear()
        self._deliveries.clear()
        self._attached.clear()

    def on_link_open(self, link: Link) -> None:
        if link is not self.link or link.remote_source_null:
            return  # (no source: a refusal, whose detach follows; not in force)
        props = link.remote_properties
        self.resumed = bool(props.get(PROP_RESUMED, False))
        epoch = props.get(PROP_EPOCH)
        if isinstance(epoch, int) and epoch > 0:
            self.client.state.set_meta(f"epoch:{self.sid}", str(epoch))
        self._refused = None
        self._steals = 0
        self._slog.write("resumed" if self.resumed else "subscribed", time.time(), None, self.topic, self.sid,
                         container=self.client.container_id, link=self.name,
                         info=(f"{SELECTIVE} " if self.selector else "") + f"router={self.client.router_id}")
        self._slog.flush()
        self._attached.set()

    def on_credit(self, link: Link) -> None:
        pass

    def on_message(self, link: Link, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None:
        if link is not self.link:
            return
        if is_control_tag(tag):
            m = Message()
            m.decode(payload)
            if m.subject == FINAL_SUBJECT and isinstance(m.body, list):
                self._settled.extend(str(g) for g in m.body)
            link.flow(1)
            self._schedule()
            return
        self._incoming.append((tag.decode("ascii", "replace"), delivery, payload))
        self._schedule()

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None:
        if not settled:
            return
        if delivery in self._buffered:  # withdrawn before it was handed over; freed when dequeued
            self._withdrawn.add(delivery)
            return
        gid = self._deliveries.pop(delivery, None)
        if gid is not None:
            self._settled.append(gid)
            self._schedule()
        amqp.settle(delivery)

    def on_link_closed(self, link: Link, closed: bool, condition: tuple[str, str] | None) -> None:
        if link is not self.link:
            return
        self._flush_now()
        self.link = None
        self._buffer.clear()
        self._buffered.clear()
        self._withdrawn.clear()
        self._deliveries.clear()
        self._detached.set()
        if condition is None:
            return
        if condition[0] == errors.LinkRedirect.condition and not self._closing:
            # the router drains: resume at the next router (presenting what we accepted)
            log.info("subscriber.redirected topic=%s link=%s", self.topic, self.name)
            self.client.move(link.remote_condition_info())
            return
        log.warning("subscriber.link_closed topic=%s link=%s condition=%s", self.topic, self.name, condition)
        if condition[0] == errors.LinkStolen.condition:
            if not self._closing:
                # our current link was taken by an attach of this subscription at another router that
                # the router heard of only now: an earlier, killed process of ours whose resume was
                # announced late (a router frozen meanwhile: test_single_router.py::
                # test_a_subscriber_whose_link_was_taken_attaches_again_and_goes_on), or a second live
                # client with our container id and link name. We are alive: attach again (the newest
                # attach wins), after a pause that doubles while it keeps happening
                self._steals += 1
                delay = min(STOLEN_RETRY * 2 ** (self._steals - 1), 30.0)
                asyncio.get_running_loop().call_later(delay, self._attach_again)
            return
        self._refused = LinkRefused(*condition)
        self._attached.set()
        self.fail(self._refused)

    def _attach_again(self) -> None:
        """After a stolen link: attach on the current connection (a reconnect attaches by itself)."""
        conn, session = self.client.conn, self.client.session
        if self._closing or self.link is not None or conn is None or session is None or not self.client.connected:
            return
        self.attach(conn, session)


def handed_in_log(path: Any, sid: str, gids: set[str], since: float, chunk: int = 1 << 20) -> set[str] | None:
    """Which of `gids` a subscriber settlement log shows as `handed` to subscription `sid`, reading
    backwards from the end until every one is found or the lines are older than `since`. None when
    the log is empty."""
    import json
    import os

    found: set[str] = set()
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return None
        pos, carry = end, b""
        while pos > 0 and len(found) < len(gids):
            step = min(chunk, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + carry
            lines = data.split(b"\n")
            carry = lines.pop(0) if pos > 0 else b""  # maybe cut: completed by the next read
            oldest = math.inf
            for line in reversed(lines):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by the kill
                ts = rec.get("ts")
                if isinstance(ts, int | float):
                    oldest = min(oldest, ts)
                if rec.get("ev") == "handed" and rec.get("sub") == sid and rec.get("gid") in gids:
                    found.add(rec["gid"])
            if oldest < since:
                break
    return found
