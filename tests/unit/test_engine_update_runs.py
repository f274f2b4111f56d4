"""The engine hands a sending link's delivery updates that come one after the other to a handler
that has `on_delivery_updates` in one call (common/engine.py, `_dispatch_events`): a subscriber's
dispositions of a pass, one core call for them (router/server.py). What the handler learns, and in
what order, is what a handler without it learns an update at a time."""

from __future__ import annotations

import asyncio
from typing import Any

from oncemesh.common import engine as amqp
from oncemesh.common import ffi as F
from oncemesh.common.engine import AmqpConnection, Engine, Link

N = 12


class Sender:
    """The server side: sends N messages on the link its peer attaches, notes each update."""

    def __init__(self) -> None:
        self.tags: dict[Any, bytes] = {}
        self.seen: list[tuple[bytes, int, bool]] = []
        self.calls: list[int] = []  # updates per handler call
        self.sent = 0

    def on_connection_open(self, conn: AmqpConnection) -> None:
        pass

    def on_link_open(self, link: Link) -> None:
        if link.local_uninit:
            link.set_source(link.remote_source_address)
            link.set_target(None)
            link.set_settle_modes(link.remote_snd_settle_mode, link.remote_rcv_settle_mode)
            link.open()

    def on_credit(self, link: Link) -> None:
        while self.sent < N and link.credit > 0:
            tag = b"%d" % self.sent
            self.tags[link.send(tag, b"body")] = tag
            self.sent += 1

    def on_message(self, *a: Any) -> None:
        pass

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None:
        self.calls.append(1)
        self.seen.append((self.tags[delivery], state, settled))

    def on_link_closed(self, *a: Any) -> None:
        pass

    def on_connection_closed(self, *a: Any) -> None:
        pass


class RunSender(Sender):
    def on_delivery_updates(self, link: Link, updates: list[tuple[Any, int, bool]]) -> None:
        self.calls.append(len(updates))
        for d, state, settled in updates:
            self.seen.append((self.tags[d], state, settled))


class Receiver:
    """The client: once all N arrived, a disposition for each in one go (a mix of outcomes)."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    def on_connection_open(self, conn: AmqpConnection) -> None:
        if conn.server:
            return
        link = conn.receiver(conn.open_session(), "r")
        link.set_source("t", 0, F.EXPIRE_WITH_LINK)
        link.set_target(None)
        link.set_settle_modes(0, F.RCV_SECOND)
        link.open()
        link.flow(N)

    def on_message(self, link: Link, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None:
        self.got.append(delivery)
        if len(self.got) < N:
            return
        for i, d in enumerate(self.got):
            if i == 3:
                amqp.update(d, F.REJECTED, ("app:bad", "no"))
            elif i == 5:
                amqp.update(d, F.RELEASED)
                amqp.settle(d)
            elif i == 7:
                amqp.settle(d)  # settled without an outcome
            else:
                amqp.update(d, F.ACCEPTED)
        link.conn.touch()

    def on_link_open(self, link: Link) -> None:
        pass

    def on_credit(self, link: Link) -> None:
        pass

    def on_delivery_update(self, *a: Any) -> None:
        pass

    def on_link_closed(self, *a: Any) -> None:
        pass

    def on_connection_closed(self, *a: Any) -> None:
        pass


def _run(sender: Sender) -> Sender:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        eng = Engine(loop)
        server = await amqp.listen(eng, lambda: AmqpConnection(eng, sender, server=True, container_id="s"),
                                   "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        receiver = Receiver()
        conn = await amqp.connect(eng, lambda: AmqpConnection(eng, receiver, server=False, container_id="c"),
                                  "127.0.0.1", port)
        for _ in range(500):
            if len(sender.seen) >= N:
                break
            await asyncio.sleep(0.01)
        conn.close()
        server.close()

    asyncio.run(main())
    return sender


def test_a_run_of_updates_comes_in_one_call_in_order_as_one_by_one() -> None:
    one = _run(Sender())
    runs = _run(RunSender())
    expect = [(b"%d" % i, F.REJECTED if i == 3 else F.RELEASED if i == 5 else 0 if i == 7 else F.ACCEPTED,
               i in (5, 7)) for i in range(N)]
    assert sorted(one.seen) == sorted(expect)  # (in the order Proton posts them: not the tags')
    assert runs.seen == one.seen
    assert set(one.calls) == {1}
    assert sum(runs.calls) == N and max(runs.calls) > 1, runs.calls  # (one read of them: one run)
