"""A fault-injecting TCP proxy for inter-router links (tests, chaos runs, failover figures).

Why it exists: the fault model (docs/promises.md, "The faults the promises survive") has links
that reset, go silent, or are slow, and partitions that heal. Killing a router produces none of
these: its peers see a clean FIN from the kernel at once. Firewall rules need root. So the
launcher can put one of these proxies on every inter-router link: the dialing router connects to
the proxy, which forwards the bytes to the listening router, until told otherwise.

Theory of operation (one `LinkProxy` per link, all of them on one asyncio loop):

- The proxy listens on 127.0.0.1, port 0 (the kernel picks; `port` reports it). It never closes its
  listener before `close()`: a port given back to the kernel during a cut could be taken by anyone
  (client connections get ephemeral ports from the same range) before the restore.
- The target is resolved at every accept by a callable (the launcher reads the listening router's
  ready file), so a listener that restarted on a new port is found by the next connection.
- WAN emulation (`set_wan`): each chunk is held `delay` seconds, plus a jitter drawn uniformly in
  [-jitter, +jitter], never ahead of the chunk before it (TCP delivers in order: jitter delays, it
  does not reorder); `loss` is the share of TCP segments (1,448 bytes) lost, emulated the way TCP
  shows it to the application: a chunk that held a lost segment waits, with everything behind it
  (TCP delivers in order), for its retransmission. Linux recovers a loss on a busy connection by
  fast retransmit / RACK after about 1.25 round trips; a loss with nothing sent after it (a tail) by
  a probe after two round trips (at least 10 ms), then the retransmission: 3 round trips. The
  retransmission timeout (200 ms at least) only comes when that is lost too, which is not emulated.
  `rate` caps the bytes per second each way (a chunk leaves once the link had time to carry it). Kernel
  emulation (netem in network namespaces) would be closer to a real network, but the kernels this
  project runs on may not have it (sch_netem): the proxy needs nothing.
- Modes: FORWARDING (bytes move, each chunk held `delay` seconds first, order kept), CUT (every
  connection is aborted at once with an RST — SO_LINGER 0 — and new ones are accepted and reset at
  once, which the dialer sees as a refusal), BLACKHOLE (connections stay open, new ones are
  accepted, but no byte moves either way: the peers notice only when their heartbeats time out).
  `restore()` returns to FORWARDING; connections held through a blackhole carry on where they
  stopped (their bytes waited in the proxy and in the kernel's buffers), like a network that
  recovered before TCP gave up. Any mode can follow any other.
- Back-pressure: each direction holds at most QUEUE_BYTES; when that is reached (a slow or frozen
  reader), the proxy stops reading from the writer's side, so it never buffers without bound.

`ProxyHub` runs the loop in a background thread and gives a blocking, thread-safe API to the
launcher and to tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

log = logging.getLogger("oncemesh.proxy")

HOST = "127.0.0.1"
CHUNK = 65536
SEGMENT = 1448  # TCP payload per segment on a 1500-byte MTU: what `loss` counts
TLP_MIN = 0.01  # Linux's minimum tail loss probe timeout
# per direction: at most this many bytes held before we stop reading (a slow or frozen reader, or
# a delay: like the largest TCP window Linux autotunes to, 6 MiB by default; a bound in chunks instead
# capped a delayed link at 64 chunks per delay, whatever their size: 1,100 msg/s at 20 ms)
QUEUE_BYTES = 4 * 1024 * 1024
CONNECT_TIMEOUT = 2.0

Resolver = Callable[[], "tuple[str, int] | None"]
T = TypeVar("T")


class Mode(StrEnum):
    FORWARDING = "forwarding"
    CUT = "cut"
    BLACKHOLE = "blackhole"


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """Counters of one proxy since it started (for tests and reports)."""

    name: str
    port: int
    mode: Mode
    delay: float
    accepted: int  # connections accepted
    forwarded: int  # connections that reached the target
    reset: int  # connections we reset (cut, or no target)
    open: int  # connections open now
    bytes_up: int  # dialer -> listener
    bytes_down: int  # listener -> dialer
    jitter: float = 0.0
    loss: float = 0.0
    rate: float = 0.0
    chunks: int = 0  # chunks passed on (both ways)
    lost: int = 0  # chunks held for a retransmission (WAN loss)


def _reset(writer: asyncio.StreamWriter | None) -> None:
    """Close with an RST (SO_LINGER 0), the way a crashed middlebox or a cut cable looks to TCP."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    """One accepted connection and, once made, its connection to the target."""

    def __init__(self, proxy: LinkProxy, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.down_r = down_r
        self.down_w = down_w
        self.up_w: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.done = False

    async def run(self) -> None:
        p = self.proxy
        try:
            await p.flowing.wait()  # a blackhole holds new connections too (accepted, not answered)
            if self.done:
                return
            target = p.resolve()
            if target is None:
                self.reset()
                return
            try:
                up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*target), CONNECT_TIMEOUT)
            except (OSError, TimeoutError):
                self.reset()
                return
            self.up_w = up_w
            if self.done:  # cut while we were connecting
                self.reset()
                return
            p.forwarded += 1
            self.tasks = [asyncio.ensure_future(self._pipe(self.down_r, up_w, up=True)),
                          asyncio.ensure_future(self._pipe(up_r, self.down_w, up=False))]
            await asyncio.gather(*self.tasks, return_exceptions=True)
        finally:
            self.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool) -> None:
        """Copy one direction through a bounded queue (the delay is applied on the way out)."""
        p = self.proxy
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        held = 0  # bytes in the queue and being written
        room = asyncio.Event()  # set while fewer than QUEUE_BYTES are held
        room.set()

        async def pump_out() -> None:
            nonlocal held
            try:
                while True:
                    due, data = await queue.get()
                    if not data:  # the sender closed its side: pass the half-close on
                        if writer.can_write_eof():
                            writer.write_eof()
                        return
                    wait = due - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    await p.flowing.wait()
                    writer.write(data)
                    await writer.drain()
                    held -= len(data)
                    if held < QUEUE_BYTES:
                        room.set()
                    if up:
                        p.bytes_up += len(data)
                    else:
                        p.bytes_down += len(data)
            except OSError:
                self.close()  # the receiving side is gone: so is the connection

        out = asyncio.ensure_future(pump_out())
        last_due = 0.0  # (a chunk never leaves before the one ahead of it)
        try:
            while True:
                await p.flowing.wait()
                await room.wait()
                data = await reader.read(CHUNK)
                last_due = max(last_due, p.due(time.monotonic(), len(data), up))
                held += len(data)
                if held >= QUEUE_BYTES:
                    room.clear()
                queue.put_nowait((last_due, data))
                if not data:
                    break
            await out
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            out.cancel()
            self.close()  # one side gone: the other goes too

    def reset(self) -> None:
        """Abort both sides with an RST."""
        if not self.done:
            self.proxy.reset_count += 1
        self.done = True
        _reset(self.down_w)
        _reset(self.up_w)
        self._stop_tasks()

    def close(self) -> None:
        if self.done:
            return
        self.done = True
        for w in (self.down_w, self.up_w):
            if w is not None:
                w.close()
        self._stop_tasks()

    def _stop_tasks(self) -> None:
        me = asyncio.current_task()
        for t in self.tasks:
            if t is not me:
                t.cancel()
        self.proxy.conns.discard(self)


class LinkProxy:
    """The proxy of one link. Use it on its loop (see `ProxyHub` for the threaded API)."""

    def __init__(self, name: str, resolve: Resolver, host: str = HOST) -> None:
        if host != HOST:
            raise ValueError(f"proxies listen on {HOST} only (got {host})")
        self.name = name
        self.resolve = resolve
        self.host = host
        self.port = 0
        self.mode = Mode.FORWARDING
        self.delay = 0.0
        self.jitter = 0.0
        self.loss = 0.0
        self.rate = 0.0  # bytes per second each way (0: no limit)
        self._free_at = {True: 0.0, False: 0.0}  # (rate) when each direction has carried what it took
        self._last = {True: -math.inf, False: -math.inf}  # (loss) when each direction last passed a chunk
        self.random = random.Random()
        self.chunks = self.lost = 0
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.conns: set[_Connection] = set()
        self.server: asyncio.Server | None = None
        self.accepted = self.forwarded = self.reset_count = self.bytes_up = self.bytes_down = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, self.host, 0, backlog=64)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        conn = _Connection(self, reader, writer)
        if self.mode is Mode.CUT:
            conn.reset()
            return
        self.conns.add(conn)
        await conn.run()

    def cut(self) -> None:
        """Drop every connection at once (RST) and reset new ones until `restore()`."""
        self.mode = Mode.CUT
        self.flowing.set()  # let held connections see that they are done
        for conn in list(self.conns):
            conn.reset()

    def blackhole(self) -> None:
        """Move no byte either way, keep every connection open, accept new ones and hold them."""
        self.mode = Mode.BLACKHOLE
        self.flowing.clear()

    def restore(self) -> None:
        self.mode = Mode.FORWARDING
        self.flowing.set()

    def set_delay(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        self.delay = seconds

    def set_wan(self, delay: float, jitter: float = 0.0, loss: float = 0.0, rate: float = 0.0,
                seed: int | None = None) -> None:
        """Behave like a WAN link (see the module's docstring): one-way `delay` and `jitter` in
        seconds, `loss` a share of segments (0.001 is 0.1 %), `rate` bytes per second each way."""
        if delay < 0 or jitter < 0 or rate < 0 or not 0 <= loss < 1:
            raise ValueError("delay, jitter and rate must be >= 0 and loss in [0, 1)")
        self.delay, self.jitter, self.loss, self.rate = delay, jitter, loss, rate
        if seed is not None:
            self.random.seed(seed)

    def due(self, now: float, size: int, up: bool = True) -> float:
        """When a chunk of `size` bytes read `now` may leave (before the order constraint)."""
        t = now + self.delay
        if self.jitter:
            t += self.random.uniform(-self.jitter, self.jitter)
        if self.rate and size:
            free = max(self._free_at[up], now) + size / self.rate
            self._free_at[up] = free
            t = max(t, free + self.delay)
        if self.loss and size:
            # P(a lost segment among n) = 1 - (1 - loss)^n
            n = math.ceil(size / SEGMENT)
            rtt = 2 * self.delay
            busy = now - self._last[up] < rtt  # (data follows it: dupacks / RACK see the loss)
            if self.random.random() < 1.0 - (1.0 - self.loss) ** n:
                self.lost += 1
                t += 1.25 * rtt if busy else max(2 * rtt, TLP_MIN) + rtt
        self._last[up] = now
        self.chunks += 1
        return max(t, now)

    def stats(self) -> ProxyStats:
        return ProxyStats(self.name, self.port, self.mode, self.delay, self.accepted, self.forwarded,
                          self.reset_count, len(self.conns), self.bytes_up, self.bytes_down, self.jitter,
                          self.loss, self.rate, self.chunks, self.lost)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for conn in list(self.conns):
            conn.reset()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 1.0)


class ProxyError(Exception):
    """The proxy hub cannot do what was asked (unknown link, not running)."""


class ProxyHub:
    """Link proxies on an asyncio loop in a daemon thread, with a blocking thread-safe API.

    The thread is a daemon so that a test or a chaos run that dies does not hang on it; the
    proxies die with the process that owns them (routers then see their links as cut).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._proxies: dict[str, LinkProxy] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> ProxyHub:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        with self._lock:
            if self.running:
                return
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def main() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()
                loop.close()

            self._loop = loop
            self._thread = threading.Thread(target=main, name="oncemesh-proxies", daemon=True)
            self._thread.start()
            started.wait(10)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        if self._loop is None or not self.running:
            coro.close()
            raise ProxyError("the proxy hub is not running (start() it first)")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _get(self, name: str) -> LinkProxy:
        try:
            return self._proxies[name]
        except KeyError:
            raise ProxyError(f"no proxy named {name!r} (have: {', '.join(sorted(self._proxies)) or 'none'})") from None

    def add(self, name: str, resolve: Resolver) -> int:
        """A new proxy forwarding to `resolve()` (called on the hub's thread at every accept; it
        must not block for long). Returns its port on 127.0.0.1."""
        if name in self._proxies:
            raise ProxyError(f"a proxy named {name!r} exists already")

        async def make() -> LinkProxy:
            p = LinkProxy(name, resolve)
            await p.start()
            return p

        proxy = self._call(make())
        self._proxies[name] = proxy
        log.info("proxy.started name=%s port=%d", name, proxy.port)
        return proxy.port

    def names(self) -> list[str]:
        return sorted(self._proxies)

    def port(self, name: str) -> int:
        return self._get(name).port

    def address(self, name: str) -> str:
        return f"{HOST}:{self.port(name)}"

    def _do(self, name: str, fn: Callable[[LinkProxy], None]) -> None:
        proxy = self._get(name)

        async def apply() -> None:
            fn(proxy)

        self._call(apply())

    def cut(self, name: str) -> None:
        self._do(name, LinkProxy.cut)

    def blackhole(self, name: str) -> None:
        self._do(name, LinkProxy.blackhole)

    def restore(self, name: str) -> None:
        self._do(name, LinkProxy.restore)

    def set_delay(self, name: str, seconds: float) -> None:
        self._do(name, lambda p: p.set_delay(seconds))

    def set_wan(self, name: str, delay: float, jitter: float = 0.0, loss: float = 0.0, rate: float = 0.0,
                seed: int | None = None) -> None:
        """See `LinkProxy.set_wan` (0, 0, 0, 0: a plain link again)."""
        self._do(name, lambda p: p.set_wan(delay, jitter, loss, rate, seed))

    def mode(self, name: str) -> Mode:
        return self._get(name).mode

    def stats(self, name: str) -> ProxyStats:
        proxy = self._get(name)

        async def read() -> ProxyStats:
            return proxy.stats()

        return self._call(read())

    def close(self) -> None:
        """Stop every proxy (open connections are reset) and the thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None or not thread.is_alive():
                return

            async def stop_all() -> None:
                for p in list(self._proxies.values()):
                    await p.close()

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(stop_all(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            self._proxies.clear()
            self._thread = None
            self._loop = None
