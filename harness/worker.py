"""Long-running client processes for tests, chaos runs and benchmarks.

    python -m oncemesh.harness.worker publish --url URLS --topic T --count N [--rate R] [--state-dir D]
    python -m oncemesh.harness.worker consume --url URLS --topic T --name SUB [--state-dir D] [--count N]
        [--bodies F]
    python -m oncemesh.harness.worker relay --url URLS --topic T --name SUB --count N [--to-topic U]

A relay is one client (one container id, one connection) that consumes T and publishes one message
on U (default T) for the first N messages it is handed (not its own relays): in causal order, what it
publishes depends on what it was handed.

Both write settlement logs (--log-dir) and survive being killed and restarted with the same state
directory: a publisher resumes its outbox and continues its numbering, a subscriber resumes its
subscription. They print one JSON line of progress when they finish.

A consumer with `--bodies F` appends to F, for each message it is handed, in hand-over order, one
JSON line `{"g": GID, "p": PUBLISHER, "n": N}`: the publisher and number its payload names
(`NAME:N:...`, the shape of every chaos publisher's payload, AMQP's or MQTT's). That is how `oncemesh
chaos --mqtt` names the gid the router gave an MQTT publisher's message (`BodyReader`): the MQTT
client never learns it, and no settlement log pairs it with the message's number.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import functools
import json
import math
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clients.runtime import Client
from ..clients.subscriber import Delivered, Subscriber
from .mqttworker import key_of
from .progress import read_new_lines

NOTE_EVERY = 0.05  # with --bodies: seconds a consumer holds what it was handed before noting it


def _waited(waits: list[float], sent: float, _fut: asyncio.Future[Any]) -> None:
    waits.append(time.monotonic() - sent)


async def publish(args: argparse.Namespace) -> int:
    client = Client(args.url, state_dir=args.state_dir, log_dir=args.log_dir,
                    reconnect_timeout=args.reconnect_timeout, idle_timeout=args.idle_timeout)
    await client.start()
    name = args.name or f"load-{args.topic}"
    pub = client.publisher(args.topic, name, window=args.window)
    resent = len(pub.resend_outbox()) if client.state.durable else 0
    key = f"worker:{name}:next"
    start = int(client.state.get_meta(key) or 0) if client.state.durable else 0
    body_pad = "x" * max(0, args.size - 16)
    t0 = time.monotonic()
    futs = []
    waits: list[float] = []  # seconds from send() to the outcome, per message (what the application waits)
    for i in range(start, args.count):
        if args.rate:
            delay = t0 + (i - start) / args.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        sent = time.monotonic()
        fut = await pub.send(f"{name}:{i}:{body_pad}")
        fut.add_done_callback(functools.partial(_waited, waits, sent))
        futs.append(fut)
        pub.meta_updates[key] = str(i + 1)  # persisted in the same transaction as message i
    results = await pub.flush(args.timeout)
    bad = [r for r in results if not r.accepted]
    waits.sort()
    print(json.dumps({"published": args.count - start, "resent": resent, "not_accepted": len(bad),
                      "failovers": client.failovers, "redirects": client.redirects,
                      "seconds": round(time.monotonic() - t0, 3),
                      "max_wait_s": round(waits[-1], 4) if waits else None,
                      "p99_wait_s": round(waits[int(len(waits) * 0.99)], 4) if waits else None}))
    await client.close()
    return 0 if not bad else 1


async def _subscribed(args: argparse.Namespace) -> tuple[Client, Subscriber]:
    """A started client with its subscription attached (consume and relay)."""
    client = Client(args.url, state_dir=args.state_dir, log_dir=args.log_dir,
                    reconnect_timeout=args.reconnect_timeout, idle_timeout=args.idle_timeout)
    await client.start()
    sub = client.subscriber(args.topic, args.name, expiry=args.expiry, credit=args.credit,
                            shared=True if getattr(args, "shared", False) else None)
    await sub.wait_attached(args.reconnect_timeout)
    return client, sub


def payload_key(body: object) -> tuple[str, int] | None:
    """(publisher, number) of a chaos payload `NAME:N:...` (an AMQP publisher's string body, an MQTT
    publisher's payload as one data section: bytes), None for any other body."""
    if isinstance(body, str):
        body = body.encode()
    if not isinstance(body, bytes | bytearray | memoryview):
        return None
    return key_of(bytes(body[:80]))  # (a name and a number fit: no copy of the padding)


def _note_bodies(f: Any, batch: list[Delivered]) -> None:
    """One `--bodies` line per message of a hand-over, written to the kernel at once. A SIGKILL after
    the hand-over's commit and before this loses those lines (while `get_many` waits for more: at most
    `NOTE_EVERY` with `--bodies`); the chaos judge takes what was handed from the settlement log and
    only the names from the notes, any subscriber's: a gid names the same message everywhere."""
    lines = []
    for d in batch:
        key = payload_key(d.body)
        lines.append(json.dumps({"g": d.gid, "p": key[0] if key else None, "n": key[1] if key else None}) + "\n")
    f.write("".join(lines))
    f.flush()


async def consume(args: argparse.Namespace) -> int:
    client, sub = await _subscribed(args)
    bodies = open(args.bodies, "a") if args.bodies is not None else None  # noqa: SIM115 (the process's life)
    got = 0
    t0 = time.monotonic()
    while args.count is None or got < args.count:
        want = args.credit if args.count is None else min(args.credit, args.count - got)
        wait = args.idle_exit if args.idle_exit is not None else NOTE_EVERY if bodies is not None else 1.0
        batch = await sub.get_many(want, timeout=wait)
        if not batch:
            if args.idle_exit is not None:
                break
            continue  # keep waiting (for --count, or forever)
        got += len(batch)
        if bodies is not None:
            _note_bodies(bodies, batch)
        if args.delay:
            await asyncio.sleep(args.delay * len(batch))
    if bodies is not None:
        bodies.close()
    print(json.dumps({"handed": got, "duplicates": sub.duplicates, "failovers": client.failovers,
                      "redirects": client.redirects, "seconds": round(time.monotonic() - t0, 3)}))
    if args.unsubscribe:
        await sub.unsubscribe()
    else:
        await sub.detach()
    await client.close()
    return 0


async def relay(args: argparse.Namespace) -> int:
    client, sub = await _subscribed(args)
    pub = client.publisher(args.to_topic or args.topic, f"{args.name}-relay", window=args.window)
    got = relayed = echoes = 0
    t0 = time.monotonic()
    # until it relayed --count messages and, on the same topic, was handed its own relays back
    while relayed < args.count or (echoes < relayed and not args.to_topic):
        batch = await sub.get_many(1, timeout=1.0)  # at once: what it publishes answers what it got
        for d in batch:
            if d.gid.startswith(pub.plid):
                echoes += 1
            elif relayed < args.count:
                await pub.send(f"relay of {d.gid}")
                relayed += 1
        got += len(batch)
    results = await pub.flush(args.timeout)
    bad = [r for r in results if not r.accepted]
    print(json.dumps({"handed": got, "relayed": len(results), "not_accepted": len(bad),
                      "failovers": client.failovers, "seconds": round(time.monotonic() - t0, 3)}))
    await sub.detach()
    await client.close()
    return 0 if not bad else 1


@dataclass(slots=True)
class BodyReader:
    """Incremental reader of a consumer's `--bodies` file (complete lines only): the messages it was
    handed, in hand-over order, as (gid, publisher, number); None for a payload of another shape."""

    path: Path
    offset: int = 0
    handed: list[tuple[str, str | None, int | None]] = field(default_factory=list)
    names: dict[str, tuple[str | None, int | None]] = field(default_factory=dict)  # gid -> (publisher, number)
    malformed: int = 0

    def poll(self) -> int:
        self.offset, events, malformed = read_new_lines(self.path, self.offset)
        self.malformed += malformed
        for e in events:
            g, p, n = e.get("g"), e.get("p"), e.get("n")
            if not isinstance(g, str):
                self.malformed += 1
                continue
            key = (p if isinstance(p, str) else None, n if isinstance(n, int) else None)
            self.handed.append((g, *key))
            self.names.setdefault(g, key)
        return len(events)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oncemesh.harness.worker")
    sub = p.add_subparsers(dest="kind", required=True)
    for kind in ("publish", "consume", "relay"):
        q = sub.add_parser(kind)
        q.add_argument("--url", required=True)
        q.add_argument("--topic", required=True)
        q.add_argument("--state-dir", type=Path, default=None)
        q.add_argument("--log-dir", type=Path, default=None)
        q.add_argument("--reconnect-timeout", type=float, default=120.0)
        q.add_argument("--idle-timeout", type=float, default=2.0)
        q.add_argument("--name", default=None)
        q.add_argument("--count", type=int, default=None)
    pp = sub.choices["publish"]
    pp.add_argument("--rate", type=float, default=0.0, help="messages per second (0: as fast as credit allows)")
    pp.add_argument("--size", type=int, default=32)
    pp.add_argument("--window", type=int, default=1000)
    pp.add_argument("--timeout", type=float, default=None)
    for kind in ("consume", "relay"):
        cp = sub.choices[kind]
        cp.add_argument("--expiry", type=float, default=math.inf)
        cp.add_argument("--credit", type=int, default=200)
    rp = sub.choices["relay"]
    rp.add_argument("--to-topic", default=None, help="publish the relayed messages here (default: --topic)")
    rp.add_argument("--window", type=int, default=1000)
    rp.add_argument("--timeout", type=float, default=None)
    cp = sub.choices["consume"]
    cp.add_argument("--idle-exit", type=float, default=None, help="exit after S seconds without a message")
    cp.add_argument("--delay", type=float, default=0.0, help="seconds of 'work' per message")
    cp.add_argument("--unsubscribe", action="store_true")
    cp.add_argument("--shared", action="store_true", help="a member of the shared subscription --name")
    cp.add_argument("--bodies", type=Path, default=None,
                    help="append a line {g: gid, p: publisher, n: number} per message handed (its payload's "
                         "NAME:N:), in hand-over order")
    args = p.parse_args(argv)
    if args.kind == "publish" and args.count is None:
        p.error("publish needs --count")
    if args.kind in ("consume", "relay") and not args.name:
        p.error(f"{args.kind} needs --name")
    if args.kind == "relay" and args.count is None:
        p.error("relay needs --count")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    faulthandler.enable()  # a crash in C code (SIGSEGV) leaves every thread's stack in our output
    return asyncio.run(publish(args) if args.kind == "publish" else relay(args) if args.kind == "relay"
                       else consume(args))


if __name__ == "__main__":
    sys.exit(main())
