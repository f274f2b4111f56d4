"""Lean benchmark clients: one publisher, subscriber or connection holder per process.

    python -m oncemesh.harness.benchclients pub  --url HOST:PORT --address T --ready F --result F [...]
    python -m oncemesh.harness.benchclients sub  (--url HOST:PORT | --listen 127.0.0.1:0) --address T [...]
    python -m oncemesh.harness.benchclients hold --url HOST:PORT --connections N --ready F

Why not the client library: `clients.publisher` / `clients.subscriber` keep a deduplication store,
an outbox and settlement logs, and pay for them per message; a benchmark of the router must not be
bounded by them. These clients drive `common.engine` (the router's own I/O layer) directly
and do only what the wire protocol requires, so the same clients can be pointed at a router, at
each other (the direct-link baseline), at the naive Container relay and at RabbitMQ:

- exactly-once: sender unsettled, receiver-settle-mode second. The publisher settles a message
  after its outcome arrives; the subscriber accepts, then settles only when the sender settled.
- at-least-once: receiver-settle-mode first (the receiver settles with its outcome).
- presettled: the sender settles at once (at-most-once; the router refuses such links).

Each message is a valid AMQP message (one data section) whose body starts with a small header:
a magic, the publisher's CLOCK_MONOTONIC send time (system-wide on Linux, so a subscriber in
another process computes publish -> hand-over latency), a sequence number, the publisher's index
and flags (last message, warm-up). The subscriber searches for the magic, so brokers that add
sections in front (RabbitMQ adds a header and properties) are fine.

Processes coordinate through files and one signal: each writes a JSON ready file once its link
is attached (a router answers a subscriber's ATTACH only once the subscription is in force), a
publisher waits for SIGUSR1 before its first message, and each writes a JSON result file at the
end. Waits are bounded by `--timeout`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import signal
import struct
import sys
import time
from array import array
from pathlib import Path
from typing import Any

from ..common import engine as amqp
from ..common import ffi as F
from ..common.engine import AmqpConnection, Engine, Link
from ..common.tls import TlsFiles, make_context

MAGIC = b"\xfeOMB"
HEADER = struct.Struct(">4sqQIB")  # magic, send time (monotonic ns), seq, publisher index, flags
FLAG_LAST = 1  # the publisher's last message: seq + 1 is its total
FLAG_WARMUP = 2  # sent during the warm-up: counted, but not in latency and rate figures
MODES = ("exactly-once", "at-least-once", "presettled")
_OUTCOME_STATES = frozenset({F.ACCEPTED, F.REJECTED, F.RELEASED, F.MODIFIED})
_DATA_SECTION = b"\x00\x53\x75"  # described type amqp:data:binary
MIN_SIZE = len(_DATA_SECTION) + 2 + HEADER.size
ATTACH_TIMEOUT = 20.0  # a peer that ends the session instead of answering (RabbitMQ on mode second)


def message_template(size: int) -> tuple[bytearray, int]:
    """An encoded AMQP message of exactly `size` bytes, and the offset of our header in it.

    The body is rewritten in place for every message (Proton copies it on send), so a publisher
    allocates nothing per message."""
    if size < MIN_SIZE:
        raise ValueError(f"message size must be at least {MIN_SIZE} bytes (AMQP framing + bench header)")
    if size - len(_DATA_SECTION) - 2 <= 255:
        body = size - len(_DATA_SECTION) - 2
        head = _DATA_SECTION + bytes([0xA0, body])
    else:
        body = size - len(_DATA_SECTION) - 5
        head = _DATA_SECTION + b"\xb0" + struct.pack(">I", body)
    buf = bytearray(head + b"x" * body)
    return buf, len(head)


def settle_modes(mode: str) -> tuple[int, int]:
    if mode == "exactly-once":
        return F.SND_UNSETTLED, F.RCV_SECOND
    if mode == "at-least-once":
        return F.SND_UNSETTLED, F.RCV_FIRST
    if mode == "presettled":
        return F.SND_SETTLED, F.RCV_FIRST
    raise ValueError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")


def parse_hostport(text: str) -> tuple[str, int]:
    text = text.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def cpu_now() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: the coordinator polls these files and must never read half of one."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def percentiles(samples: array[int]) -> dict[str, float | int | None]:
    """p50/p99/p999/max in milliseconds (nearest rank), from nanosecond samples."""
    n = len(samples)
    if not n:
        return {"n": 0, "p50": None, "p99": None, "p999": None, "max": None, "mean": None}
    s = sorted(samples)

    def rank(q: float) -> float:
        return round(s[min(n - 1, max(0, math.ceil(q * n) - 1))] / 1e6, 4)

    return {"n": n, "p50": rank(0.5), "p99": rank(0.99), "p999": rank(0.999), "max": round(s[-1] / 1e6, 4),
            "mean": round(sum(s) / n / 1e6, 4)}


class _Base:
    """What every bench client shares: the engine handler no-ops, the loop, the finish latch."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.loop = asyncio.get_running_loop()
        self.engine = Engine(self.loop)
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.conn: AmqpConnection | None = None
        self.link: Link | None = None
        self.remote_rcv_mode: int | None = None
        self.error: str | None = None

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def on_connection_open(self, conn: AmqpConnection) -> None:
        pass

    def on_link_open(self, link: Link) -> None:
        pass

    def on_credit(self, link: Link) -> None:
        pass

    def on_message(self, link: Link, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None:
        pass

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None:
        pass

    def on_link_closed(self, link: Link, closed: bool, condition: tuple[str, str] | None) -> None:
        if condition is not None and self.error is None:
            self.error = f"link closed: {condition[0]}: {condition[1]}"
            self.finish()

    def on_connection_closed(self, conn: AmqpConnection, condition: tuple[str, str] | None) -> None:
        if not self.done.done() and self.error is None:
            self.error = f"connection closed: {condition}"
        self.finish()

    def factory(self, server: bool) -> AmqpConnection:
        return AmqpConnection(self.engine, self, server=server,
                              container_id=f"bench-{self.args.kind}-{os.getpid()}",
                              idle_timeout=getattr(self.args, "idle_timeout", amqp.DEFAULT_IDLE_TIMEOUT))

    async def close(self) -> None:
        """Close the connection and give the CLOSE frame a bounded moment to go out."""
        conn = self.conn
        if conn is None or conn.closed:
            return
        conn.close()
        self.engine._flush_all()
        deadline = self.loop.time() + 2.0
        while not conn.closed and self.loop.time() < deadline:
            await asyncio.sleep(0.005)
        if conn.sock is not None and not conn.closed:
            conn.sock.close()


class BenchPublisher(_Base):
    """Sends as fast as credit and `--window` allow, or at `--rate` messages per second."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.snd_mode, self.rcv_mode = settle_modes(args.mode)
        self.presettled = args.mode == "presettled"
        self.buf, self.off = message_template(args.size)
        self.attached = self.loop.create_future()
        self.going = False
        self.stopped = False  # no more new messages
        self.seq = 0
        self.inflight = 0
        self.outcomes = 0
        self.accepted = 0
        self.t_go = 0
        self.t_end = 0
        self.t_warm = 0
        self.t_last_send = 0
        self.t_last_outcome = 0
        self.cpu_go = 0.0
        self._tick: asyncio.TimerHandle | None = None
        self.all_sent = self.loop.create_future()

    def on_connection_open(self, conn: AmqpConnection) -> None:
        ssn = conn.open_session()
        link = conn.sender(ssn, f"bench-pub-{self.args.index}")
        link.set_target(self.args.address)
        link.set_source(self.args.address)
        link.set_settle_modes(self.snd_mode, self.rcv_mode)
        link.open()
        self.link = link

    def on_link_open(self, link: Link) -> None:
        self.remote_rcv_mode = link.remote_rcv_settle_mode
        if not self.attached.done():
            self.attached.set_result(None)

    def on_link_closed(self, link: Link, closed: bool, condition: tuple[str, str] | None) -> None:
        super().on_link_closed(link, closed, condition)
        if not self.attached.done():
            self.attached.set_exception(RuntimeError(self.error or "link refused"))

    def on_connection_closed(self, conn: AmqpConnection, condition: tuple[str, str] | None) -> None:
        super().on_connection_closed(conn, condition)
        if not self.attached.done():
            self.attached.set_exception(RuntimeError(self.error or "connection closed"))

    def go(self) -> None:
        if self.going:
            return
        self.going = True
        self.cpu_go = cpu_now()
        now = time.monotonic_ns()
        self.t_go = now
        self.t_warm = now + int(self.args.warmup * 1e9)
        self.t_end = now + int(self.args.duration * 1e9) if self.args.duration else 0
        self.pump()

    def on_credit(self, link: Link) -> None:
        if self.going:
            self.pump()

    def pump(self) -> None:
        link = self.link
        if link is None or self.stopped:
            return
        args = self.args
        count = args.count
        limit = args.window
        rate = args.rate
        buf, off, index, pack = self.buf, self.off, args.index, HEADER.pack_into
        due = 1 << 62
        if rate:
            due = int((time.monotonic_ns() - self.t_go) * rate / 1e9) + 1
        presettled = self.presettled
        clock = time.monotonic_ns
        while link.credit > 0 and self.inflight < limit and self.seq < due:
            now = clock()
            seq = self.seq
            last = (count and seq + 1 >= count) or (self.t_end and now >= self.t_end)
            warm = now < self.t_warm and (not count or seq * 10 < count)  # at most 10% of a --count
            flags = (FLAG_LAST if last else 0) | (FLAG_WARMUP if warm else 0)
            pack(buf, off, MAGIC, now, seq, index, flags)
            link.send(b"%x" % seq, buf, settled=presettled)
            self.seq = seq + 1
            self.t_last_send = now
            if presettled:
                self.outcomes += 1
            else:
                self.inflight += 1
            if last:
                self.stopped = True
                break
        if self.stopped:
            if self._tick is not None:
                self._tick.cancel()
            if not self.all_sent.done():
                self.all_sent.set_result(None)
            if presettled or self.inflight == 0:
                self.t_last_outcome = clock()
                self.finish()
        elif rate and self._tick is None:
            self._tick = self.loop.call_later(0.001, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        self.pump()

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None:
        if state not in _OUTCOME_STATES:
            return  # RECEIVED, or a bare settle: not an outcome
        amqp.settle(delivery)  # after the outcome: exactly-once (mode second) lets the router free it
        link.conn.touch()
        self.inflight -= 1
        self.outcomes += 1
        if state == F.ACCEPTED:
            self.accepted += 1
        if self.stopped:
            if self.inflight == 0:
                self.t_last_outcome = time.monotonic_ns()
                self.finish()
        else:
            self.pump()

    def result(self) -> dict[str, Any]:
        # (no last outcome: it did not finish; the rate is over the time it ran)
        span = max(1, (self.t_last_outcome or time.monotonic_ns()) - self.t_go) / 1e9
        return {"kind": "pub", "index": self.args.index, "sent": self.seq, "outcomes": self.outcomes,
                "accepted": self.accepted, "seconds": round(span, 4),
                "msg_s": round(self.outcomes / span, 1), "cpu_s": round(cpu_now() - self.cpu_go, 4),
                "remote_rcv_settle_mode": self.remote_rcv_mode, "error": self.error}


class BenchSubscriber(_Base):
    """Receives, accepts and (exactly-once) waits for the sender's settle; measures latency."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.snd_mode, self.rcv_mode = settle_modes(args.mode)
        self.second = args.mode == "exactly-once"
        self.attached = self.loop.create_future()
        self.received = 0
        self.unsettled = 0  # accepted, waiting for the sender's settle (exactly-once)
        self.totals: dict[int, int] = {}  # publisher index -> its message count (from FLAG_LAST)
        self.next_seq: dict[int, int] = {}
        self.out_of_order = 0
        self.foreign = 0
        self.lat = array("q")
        self.sent_at = array("q")  # send times of the measured messages (--trace)
        self.measured = 0
        self.t_first = 0  # first message after the warm-up
        self.t_last = 0
        self.cpu_first: float | None = None
        self.used_credit = 0
        self.credit = args.credit
        self.listen_port: int | None = None
        self.told_to_end = False  # a shared subscription's member: the coordinator said every outcome is in

    # -- client side: attach a receiver from the address (router, relay, broker)
    def on_connection_open(self, conn: AmqpConnection) -> None:
        if conn.server:
            return
        ssn = conn.open_session()
        shared = self.args.shared
        # a member of a shared subscription: the Qpid JMS form of a global shared one (docs/clients.md)
        link = conn.receiver(ssn, f"{shared}|global" if shared else f"bench-sub-{self.args.index}")
        if shared:
            link.set_source_capabilities(("shared", "global"))
        if self.args.expiry or shared:
            link.set_source(self.args.address, int(self.args.expiry or 60), F.EXPIRE_NEVER)
        else:
            link.set_source(self.args.address, 0, F.EXPIRE_WITH_LINK)
        link.set_target(None)
        link.set_settle_modes(self.snd_mode, self.rcv_mode)
        link.open()
        link.flow(self.credit)
        self.link = link

    # -- server side (direct link): take the publisher's attach as it is
    def on_link_open(self, link: Link) -> None:
        if link.local_uninit:
            self.conn = link.conn
            link.set_target(link.remote_target_address)
            link.set_source(link.remote_source_address)
            link.set_settle_modes(link.remote_snd_settle_mode, link.remote_rcv_settle_mode)
            link.open()
            link.flow(self.credit)
            self.link = link
            self.second = link.remote_rcv_settle_mode == F.RCV_SECOND
        self.remote_rcv_mode = link.remote_rcv_settle_mode
        if not self.attached.done():
            self.attached.set_result(None)

    def on_link_closed(self, link: Link, closed: bool, condition: tuple[str, str] | None) -> None:
        super().on_link_closed(link, closed, condition)
        if not self.attached.done():
            self.attached.set_exception(RuntimeError(self.error or "link refused"))

    def on_connection_closed(self, conn: AmqpConnection, condition: tuple[str, str] | None) -> None:
        if conn.server and self.link is None:
            return  # a probe of the listener, not our publisher
        super().on_connection_closed(conn, condition)
        if not self.attached.done():
            self.attached.set_exception(RuntimeError(self.error or "connection closed"))

    def on_message(self, link: Link, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None:
        now = time.monotonic_ns()
        self.received += 1
        i = payload.find(MAGIC)
        if i < 0:
            self.foreign += 1
        else:
            _, t_send, seq, pub, flags = HEADER.unpack_from(payload, i)
            if not flags & FLAG_WARMUP:
                if not self.measured:
                    self.t_first = now
                    self.cpu_first = cpu_now()
                self.measured += 1
                self.lat.append(now - t_send)
                self.sent_at.append(t_send)
            if seq != self.next_seq.get(pub, 0) and not self.args.shared:  # (a member gets a share)
                self.out_of_order += 1
            self.next_seq[pub] = seq + 1
            if flags & FLAG_LAST:
                self.totals[pub] = seq + 1
        self.t_last = now
        if not settled:
            amqp.update(delivery, F.ACCEPTED)
            if self.second:
                self.unsettled += 1  # settled when the sender settles (on_delivery_update)
            else:
                amqp.settle(delivery)
        self.used_credit += 1
        if self.used_credit * 2 >= self.credit:
            link.flow(self.used_credit)
            self.used_credit = 0
        link.conn.touch()
        self._check_done()

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None:
        if settled:
            amqp.settle(delivery)
            self.unsettled -= 1
            self._check_done()

    def end_member(self) -> None:
        """A member of a shared subscription cannot tell the end from its share: the coordinator
        tells it once the publishers have every outcome (each message accepted by some member)."""
        self.told_to_end = True
        self._check_done()

    def _check_done(self) -> None:
        if self.args.shared:
            if self.told_to_end and self.unsettled <= 0:
                self.finish()
            return
        if (len(self.totals) >= self.args.publishers and self.unsettled <= 0
                and self.received >= sum(self.totals.values())):
            self.finish()

    def result(self) -> dict[str, Any]:
        span = max(1, self.t_last - self.t_first) / 1e9
        cpu = (cpu_now() - self.cpu_first) if self.cpu_first is not None else 0.0
        expected = sum(self.totals.values())
        complete = self.told_to_end if self.args.shared else (len(self.totals) >= self.args.publishers
                                                                and self.received >= expected)
        return {"kind": "sub", "index": self.args.index, "received": self.received, "expected": expected,
                "complete": complete, "shared": bool(self.args.shared),
                "unsettled": self.unsettled, "measured": self.measured, "seconds": round(span, 4),
                "msg_s": round(max(0, self.measured - 1) / span, 1) if self.measured > 1 else 0.0,
                "cpu_s": round(cpu, 4), "latency_ms": percentiles(self.lat), "out_of_order": self.out_of_order,
                "foreign": self.foreign, "remote_rcv_settle_mode": self.remote_rcv_mode, "error": self.error}


def write_trace(path: Path, sub: BenchSubscriber) -> None:
    """Every measured message as `send_ns latency_ns` (CLOCK_MONOTONIC), one line each: to line a
    latency spike up with what the routers did at that moment (their loop traces use the same clock)."""
    with open(path, "w") as f:
        f.writelines(f"{t} {d}\n" for t, d in zip(sub.sent_at, sub.lat, strict=True))


async def _connect(client: _Base, url: str, ca: Path | None = None) -> AmqpConnection:
    host, port = parse_hostport(url)
    tls = make_context(TlsFiles(ca=ca), server=False) if ca is not None else None  # (TLS: amqps)
    conn = await amqp.connect(client.engine, lambda: client.factory(False), host, port, timeout=10.0, tls=tls)
    client.conn = conn
    return conn


async def _attached(client: BenchPublisher | BenchSubscriber, args: argparse.Namespace) -> None:
    """Wait for the peer's ATTACH; a peer that ends the session instead is only noticed by time."""
    try:
        await asyncio.wait_for(client.attached, min(args.timeout, ATTACH_TIMEOUT))
    except TimeoutError:
        raise SystemExit(f"{args.kind}: no ATTACH from the peer within {min(args.timeout, ATTACH_TIMEOUT)}s "
                         f"(refused? mode {args.mode})") from None


async def run_pub(args: argparse.Namespace) -> int:
    pub = BenchPublisher(args)
    go = asyncio.Event()
    pub.loop.add_signal_handler(signal.SIGUSR1, go.set)
    await _connect(pub, args.url, args.ca)
    await _attached(pub, args)
    write_json(args.ready, {"pid": os.getpid(), "remote_rcv_settle_mode": pub.remote_rcv_mode})
    await asyncio.wait_for(go.wait(), args.timeout)
    pub.go()
    try:
        await asyncio.wait_for(asyncio.shield(pub.all_sent if args.hold else pub.done), args.timeout)
    except TimeoutError:
        pub.error = pub.error or f"timed out after {args.timeout}s ({pub.inflight} without outcome)"
    write_json(args.result, pub.result())
    if args.hold:  # keep the link (and what it has in doubt) until the coordinator ends us
        stop = asyncio.Event()
        pub.loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
    await pub.close()
    return 0 if pub.error is None else 1


async def run_sub(args: argparse.Namespace) -> int:
    sub = BenchSubscriber(args)
    if args.listen:
        host, port = parse_hostport(args.listen)
        server = await amqp.listen(sub.engine, lambda: sub.factory(True), host, port)
        sub.listen_port = server.sockets[0].getsockname()[1]
        write_json(args.ready, {"pid": os.getpid(), "port": sub.listen_port})
        await asyncio.wait_for(sub.attached, args.timeout)
    else:
        await _connect(sub, args.url, args.ca)
        await _attached(sub, args)
        if args.suspend:  # leave without detaching: a durable subscription is now suspended
            write_json(args.ready, {"pid": os.getpid(), "remote_rcv_settle_mode": sub.remote_rcv_mode})
            assert sub.conn is not None
            sub.conn.abort()
            return 0
        write_json(args.ready, {"pid": os.getpid(), "remote_rcv_settle_mode": sub.remote_rcv_mode})
    if args.shared:
        sub.loop.add_signal_handler(signal.SIGUSR2, sub.end_member)
    try:
        await asyncio.wait_for(asyncio.shield(sub.done), args.timeout)
    except TimeoutError:
        sub.error = sub.error or f"timed out after {args.timeout}s"
    write_json(args.result, sub.result())
    if args.trace is not None:
        write_trace(args.trace, sub)
    await sub.close()
    return 0 if sub.error is None else 1


async def run_hold(args: argparse.Namespace) -> int:
    """Open `--connections` AMQP connections (OPEN answered, one session each) and hold them idle."""
    limit = raise_fd_limit()
    holder = _Base(args)
    opened: dict[AmqpConnection, asyncio.Future[None]] = {}

    class Handler(_Base):
        def on_connection_open(self, conn: AmqpConnection) -> None:
            conn.open_session()
            fut = opened.get(conn)
            if fut is not None and not fut.done():
                fut.set_result(None)

        def on_connection_closed(self, conn: AmqpConnection, condition: tuple[str, str] | None) -> None:
            fut = opened.get(conn)
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionError(str(condition)))

    handler = Handler(args)
    handler.engine = holder.engine
    host, port = parse_hostport(args.url)
    sem = asyncio.Semaphore(128)
    conns: list[AmqpConnection] = []
    failed: list[str] = []

    async def one() -> None:
        async with sem:
            fut: asyncio.Future[None] = holder.loop.create_future()
            try:
                conn = await amqp.connect(holder.engine, lambda: AmqpConnection(
                    holder.engine, handler, server=False, container_id=f"bench-hold-{os.getpid()}"),
                    host, port, timeout=30.0)
                opened[conn] = fut
                await asyncio.wait_for(fut, 30.0)
                conns.append(conn)
            except (OSError, TimeoutError, ConnectionError) as exc:
                failed.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(one() for _ in range(args.connections)))
    write_json(args.ready, {"pid": os.getpid(), "connections": len(conns), "failed": len(failed),
                            "errors": failed[:3], "fd_limit": limit})
    stop = asyncio.Event()
    holder.loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for c in conns:
        c.abort()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oncemesh.harness.benchclients", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="kind", required=True)
    for kind in ("pub", "sub", "hold"):
        q = sub.add_parser(kind)
        q.add_argument("--url", default=None, help="HOST:PORT to connect to")
        q.add_argument("--ready", type=Path, required=True, help="JSON written once attached")
        q.add_argument("--result", type=Path, default=None, help="JSON written at the end")
        q.add_argument("--timeout", type=float, default=120.0)
        q.add_argument("--address", default="bench")
        q.add_argument("--mode", choices=MODES, default="exactly-once")
        q.add_argument("--index", type=int, default=0)
        q.add_argument("--ca", type=Path, default=None, help="connect with TLS, trusting this CA (PEM)")
        q.add_argument("--idle-timeout", type=float, default=amqp.DEFAULT_IDLE_TIMEOUT,
                       help="seconds of silence from the peer before the connection is closed (a router "
                            "under valgrind stalls for seconds: the bench's instruction count raises it)")
    pp = sub.choices["pub"]
    pp.add_argument("--size", type=int, default=100, help="encoded message size in bytes")
    pp.add_argument("--count", type=int, default=0, help="messages to send (0: use --duration)")
    pp.add_argument("--duration", type=float, default=0.0, help="seconds to send for")
    pp.add_argument("--rate", type=float, default=0.0, help="messages per second (0: unbounded)")
    pp.add_argument("--window", type=int, default=1000, help="max messages without an outcome")
    pp.add_argument("--warmup", type=float, default=0.5, help="seconds excluded from latency and rates")
    pp.add_argument("--hold", action="store_true", help="after sending, keep the link until SIGTERM")
    sp = sub.choices["sub"]
    sp.add_argument("--listen", default=None, help="accept the publisher's link here (direct baseline)")
    sp.add_argument("--publishers", type=int, default=1, help="publishers whose last message ends the run")
    sp.add_argument("--credit", type=int, default=1000)
    sp.add_argument("--expiry", type=float, default=0.0, help="durable subscription timeout (seconds)")
    sp.add_argument("--suspend", action="store_true", help="drop the connection once attached")
    sp.add_argument("--shared", default=None, metavar="NAME",
                    help="attach as a member of the shared subscription NAME (durable, global); the run "
                         "ends for it at SIGUSR2 (every outcome is in) once its deliveries are settled")
    sp.add_argument("--trace", type=Path, default=None,
                    help="write each measured message's send time and latency (ns, CLOCK_MONOTONIC) here")
    hp = sub.choices["hold"]
    hp.add_argument("--connections", type=int, default=1000)
    args = p.parse_args(argv)
    if args.kind == "pub" and not (args.count or args.duration):
        p.error("pub needs --count or --duration")
    if args.kind != "sub" and not args.url or args.kind == "sub" and not (args.url or args.listen):
        p.error(f"{args.kind} needs --url" + (" or --listen" if args.kind == "sub" else ""))
    runner = {"pub": run_pub, "sub": run_sub, "hold": run_hold}[args.kind]
    return asyncio.run(runner(args))


if __name__ == "__main__":
    sys.exit(main())
