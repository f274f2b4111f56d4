"""The order in which a router takes its input within one loop pass (common/engine.py,
`defer_input`): a mesh link's input is read at once but processed at the end of the pass, after the
input of every client connection read in the same pass.

Why: a router that stalled (SIGSTOP, a starved CPU) wakes up to a peer's messages and a client's
goodbye both waiting in its socket buffers. Taken in the order the kernel reports them, the peer's
messages can be handed into the link of a client that has already left, failed over and accepted
them at another router: no one receives that hand-over, yet the router's log shows a second
delivery after the acceptance, and the router view of the reconciliation rightly calls it a
duplicate (the short chaos run's failure of stops 24 and 26, docs/testing.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from oncemesh.common.engine import AmqpConnection, Engine


class Sock:
    """Enough of an asyncio transport for input to be taken."""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        pass


class Recorder:
    def __init__(self, order: list[str]) -> None:
        self.order = order

    def on_connection_closed(self, conn: AmqpConnection, condition: Any) -> None:
        self.order.append("closed")


def _conn(eng: Engine, name: str, order: list[str], defer: bool) -> AmqpConnection:
    conn = AmqpConnection(eng, Recorder(order), server=True, container_id=name)  # type: ignore[arg-type]
    conn.sock = Sock()  # type: ignore[assignment]
    conn.defer_input = defer
    conn._push = lambda data: order.append(f"{name}:{data.decode()}")  # type: ignore[method-assign]
    return conn


Pass = Callable[[asyncio.AbstractEventLoop, Engine, AmqpConnection, AmqpConnection], None]


def _order_of(one_pass: Pass) -> list[str]:
    """What a mesh connection and a client connection of one engine processed, in order, when
    `one_pass(loop, engine, mesh, client)` ran as one loop pass (and the passes it led to)."""
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        eng = Engine(loop, pass_end=True)
        mesh = _conn(eng, "mesh", order, defer=True)
        client = _conn(eng, "client", order, defer=False)
        loop.call_soon(one_pass, loop, eng, mesh, client)
        await asyncio.sleep(0.02)

    asyncio.run(main())
    return order


def test_a_peers_input_waits_for_the_clients_input_of_the_same_pass() -> None:
    def one_pass(loop: Any, eng: Engine, mesh: AmqpConnection, client: AmqpConnection) -> None:
        # the kernel reported the mesh socket first
        mesh.data_received(b"m1")
        client.data_received(b"bye")
        mesh.data_received(b"m2")  # (a second read of the same pass: after the first, joined)
        client._push(b"end of the reads")  # type: ignore[call-arg]

    assert _order_of(one_pass) == ["client:bye", "client:end of the reads", "mesh:m1m2"]


def test_input_held_across_a_stall_waits_for_one_more_poll() -> None:
    """Frozen between the read and the end of its pass, a router finds its clients' input of the
    freeze not yet read: the held mesh input waits for one more poll (and its reads)."""
    def one_pass(loop: Any, eng: Engine, mesh: AmqpConnection, client: AmqpConnection) -> None:
        mesh.data_received(b"m")
        mesh._hold.since -= 4.0  # (SIGSTOP for 4 s, here)
        loop.call_soon(client.data_received, b"bye")  # read in the next pass

    assert _order_of(one_pass) == ["client:bye", "mesh:m"]


def test_without_deferral_input_is_taken_as_it_comes() -> None:
    """(The client library and the router's client connections: nothing waits.)"""
    order: list[str] = []

    async def main() -> None:
        eng = Engine(asyncio.get_running_loop(), pass_end=True)
        a, b = _conn(eng, "a", order, defer=False), _conn(eng, "b", order, defer=False)
        a.data_received(b"1")
        b.data_received(b"2")
        order.append("end of the reads")

    asyncio.run(main())
    assert order == ["a:1", "b:2", "end of the reads"]


def test_an_eof_waits_behind_the_input_it_follows() -> None:
    """An EOF read after held input is held behind it: a peer's last messages and its goodbye
    both wait for the clients' input of the pass (and the EOF is not taken before the messages)."""
    def one_pass(loop: Any, eng: Engine, mesh: AmqpConnection, client: AmqpConnection) -> None:
        mesh.data_received(b"last words")
        assert mesh.eof_received() is False
        client.data_received(b"bye")

    assert _order_of(one_pass) == ["client:bye", "mesh:last words", "closed"]


def test_held_input_comes_before_the_loss_of_its_connection() -> None:
    order: list[str] = []

    async def main() -> None:
        eng = Engine(asyncio.get_running_loop(), pass_end=True)
        mesh = _conn(eng, "mesh", order, defer=True)
        mesh.data_received(b"last words")
        mesh.connection_lost(ConnectionResetError())
        await asyncio.sleep(0.01)  # (the end of the pass finds nothing left to process)

    asyncio.run(main())
    assert order == ["mesh:last words", "closed"]


def test_the_idle_timer_takes_held_input_first_unless_a_stall_made_it_stale() -> None:
    """The connection's idle check must not miss input it holds (a peer declared silent while
    its frames wait); but input held across a stall waits for the poll, not for the timer."""
    order: list[str] = []

    async def main() -> None:
        eng = Engine(asyncio.get_running_loop(), pass_end=True)
        mesh = _conn(eng, "mesh", order, defer=True)
        mesh.data_received(b"fresh")
        mesh._on_timer()
        assert order == ["mesh:fresh"]
        mesh.data_received(b"stale")
        mesh._hold.since -= 4.0
        mesh._on_timer()
        assert order == ["mesh:fresh"]
        await asyncio.sleep(0.02)  # (two passes: the re-poll, then the pass end takes it)
        assert order == ["mesh:fresh", "mesh:stale"]

    asyncio.run(main())


def test_a_pass_stalled_before_the_read_also_waits_for_one_more_poll() -> None:
    """Frozen in the middle of a pass whose poll came before the freeze: the mesh socket's read,
    due from that poll, brings all the freeze left waiting; the clients' sockets were not in that
    poll. The pass's own start tells the stall, not the read's time."""
    def one_pass(loop: Any, eng: Engine, mesh: AmqpConnection, client: AmqpConnection) -> None:
        assert eng._pass_end is not None
        eng._pass_end.clock.polled_at -= 4.0  # (the poll was 4 s ago: SIGSTOP since)
        mesh.data_received(b"m")  # read just now
        loop.call_soon(client.data_received, b"bye")  # in the next poll

    assert _order_of(one_pass) == ["client:bye", "mesh:m"]


def test_held_input_waits_for_one_more_poll_at_most() -> None:
    """A loop whose every pass is slow (overload, not a freeze) does not starve the mesh: held
    input waits for one more poll once, then is taken."""
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        eng = Engine(loop, pass_end=True)
        mesh = _conn(eng, "mesh", order, defer=True)
        mesh._held_input_stale = lambda: True  # type: ignore[method-assign]
        loop.call_soon(mesh.data_received, b"m")
        await asyncio.sleep(0.02)
        assert order == ["mesh:m"]

    asyncio.run(main())


def test_a_poll_that_overran_its_timeout_dates_from_before_it() -> None:
    """SIGSTOP while the loop waits in its poll: the poll returns, on SIGCONT, the events of the
    moment the process was stopped; having taken longer than its timeout allowed, it dates from
    before it (so held input from it waits for one more poll), not from after."""
    import selectors
    import time

    from oncemesh.common.engine import _PassEnd
    from oncemesh.common.passrules import STALL_GAP

    class Inner(selectors.DefaultSelector):
        def __init__(self, pause: float) -> None:
            super().__init__()
            self.pause = pause

        def select(self, timeout: float | None = None) -> list[Any]:
            time.sleep(self.pause)  # (stopped in here)
            return []

    for pause, late in ((0.0, False), (STALL_GAP + 0.05, True)):
        hook = _PassEnd(object(), Inner(pause))
        before = time.monotonic()
        hook.select(0)
        after = time.monotonic()
        assert before <= hook.clock.polled_at <= after
        assert (after - hook.clock.polled_at >= STALL_GAP) is late
    hook = _PassEnd(object(), Inner(STALL_GAP + 0.05))
    hook.select(1.0)  # (within its timeout: an idle wait, no stall)
    assert time.monotonic() - hook.clock.polled_at < STALL_GAP


def test_the_engine_tells_a_stall_once_per_pass() -> None:
    """`Engine.on_stall`: a pass after a long one (stopped before its poll), a poll that overran
    its timeout (stopped in it), or input taken long after its pass polled (stopped after it)."""
    import selectors
    import time

    from oncemesh.common.engine import _PassEnd
    from oncemesh.common.passrules import HOLD_GAP

    told: list[str] = []
    hook = _PassEnd(object(), selectors.DefaultSelector())
    hook.stall_hooks.append(lambda: told.append("stall"))
    hook.select(0)
    hook.select(0)
    assert told == []  # (quick passes)
    hook.clock.returned = time.monotonic() - HOLD_GAP - 0.1  # the pass before took long
    hook.select(0)
    assert told == ["stall"]
    hook.note_stall()  # (told once per pass)
    assert told == ["stall"]
    hook.select(0)
    assert told == ["stall"]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        eng = Engine(loop, pass_end=True)
        eng.on_stall(lambda: told.append("input late"))
        order: list[str] = []
        client = _conn(eng, "client", order, defer=False)
        client._push = AmqpConnection._push.__get__(client)  # (the real one: it looks at the clock)
        await asyncio.sleep(0)
        assert eng._pass_end is not None
        eng._pass_end.clock.polled_at -= HOLD_GAP + 0.1
        client.data_received(b"AMQP\x00\x01\x00\x00")

    asyncio.run(main())
    assert told == ["stall", "input late"]


def test_input_read_into_the_shared_buffer_is_kept_whole() -> None:
    """Every connection of an engine reads into one buffer (asyncio's BufferedProtocol: no new
    object per read); what a connection holds for later is its own copy: a peer's input held to the
    pass end is intact after a client's read has gone through the same buffer."""
    order: list[str] = []

    def read(conn: AmqpConnection, data: bytes) -> None:  # (what asyncio does: recv_into, then tell)
        buf = conn.get_buffer(-1)
        buf[:len(data)] = data
        conn.buffer_updated(len(data))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        eng = Engine(loop, pass_end=True)
        mesh, client = _conn(eng, "mesh", order, defer=True), _conn(eng, "client", order, defer=False)
        for c, name in ((mesh, "mesh"), (client, "client")):
            c._push = lambda data, name=name: order.append(f"{name}:{bytes(data).decode()}")  # type: ignore[method-assign]
        assert mesh.get_buffer(-1) is client.get_buffer(-1)  # (one buffer)
        loop.call_soon(lambda: (read(mesh, b"copy-1"), read(client, b"accept"), read(mesh, b"copy-2")))
        await asyncio.sleep(0.02)

    asyncio.run(main())
    assert order == ["client:accept", "mesh:copy-1copy-2"]
