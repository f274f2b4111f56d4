"""The operations of seeds 000/001 on the command line: put, get, subscribe, unsubscribe.

Client identity (container-id) and state (outbox, deduplication store) live in --state-dir; the
same state directory means the same client. Exit codes: 0 success; 1 a message was not accepted
(or no router reachable, or no outcome within put --timeout); 2 usage (and get from a subscription
the state does not hold); 3 get --count N timed out with fewer than N.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from ..common.errors import ClientError, NoRouterAvailable
from .options import client_credentials, security_arguments
from .publisher import Publisher, Result
from .runtime import Client
from .stat import Management
from .state import ClientState, default_state_dir

DEFAULT_EXPIRY = 86400.0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="router URL(s): amqp://HOST:PORT or amqps://HOST:PORT (TLS), "
                                                 "comma-separated for failover")
    p.add_argument("--state-dir", type=Path, default=None,
                   help=f"client identity and state (default {default_state_dir()})")
    p.add_argument("--log-dir", type=Path, default=None, help="write the client settlement log here")
    p.add_argument("--connect-timeout", type=float, default=30.0,
                   help="give up when no router is reachable for this long (seconds, default 30)")
    security_arguments(p)
    p.add_argument("-v", "--verbose", action="store_true", help="log the connection's progress on stderr")


def _expiry(text: str) -> float:
    if text.lower() in ("never", "inf", "infinite"):
        return math.inf
    v = float(text)
    if v < 0:
        raise argparse.ArgumentTypeError("expiry must be >= 0 seconds or 'never'")
    return v


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("put", help="publish messages (waits for the outcome)",
                       description="Publish each MESSAGE (a string body) to TOPIC, exactly once. Waits "
                                   "until every message has its outcome; exit 0 only if all were "
                                   "ACCEPTED. A message is ACCEPTED once every subscription of TOPIC "
                                   "took it: one nobody reads (suspended, after `subscribe`) holds put "
                                   "until `get` reads it; put says what it waits for every few seconds "
                                   "(--progress), --timeout bounds the wait, --no-wait returns at once. "
                                   "What an earlier put left in doubt (--no-wait, --timeout, or a crash) "
                                   "is resent first, from the outbox in --state-dir.")
    p.add_argument("topic", help="the topic to publish to")
    p.add_argument("messages", nargs="*", metavar="MESSAGE", help="a message body (a string); several: "
                                                                  "published in this order")
    _common(p)
    p.add_argument("--no-wait", action="store_true",
                   help="return once a router holds each message; it stays in the outbox, in doubt, "
                        "until a later put (or put --flush) gets its outcome")
    p.add_argument("--flush", action="store_true", help="only resend what the outbox holds, and wait")
    p.add_argument("--timeout", type=float, default=None,
                   help="give up waiting for the outcomes after S seconds (exit 1; what has none stays in "
                        "doubt in the outbox, resent by the next put)")
    p.add_argument("--progress", type=float, default=3.0, metavar="S",
                   help="while waiting, say every S seconds on stderr what for (default 3)")
    p.add_argument("--link", default=None, help="publisher link name (default put:TOPIC)")
    p.set_defaults(func=cmd_put)

    p = sub.add_parser("subscribe", help="create (or resume) a durable subscription",
                       description="Create a durable subscription NAME on TOPIC and leave it suspended: "
                                   "messages published from now on are held for it until `get` "
                                   "collects them or it expires.")
    p.add_argument("topic", help="the topic to subscribe to: a name, or a filter with '+' (one level) and "
                                 "'#' (the rest), e.g. 'orders/+/eu' (quote it for the shell)")
    p.add_argument("--subscription", required=True, metavar="NAME", help="subscription name (the link name)")
    p.add_argument("--selector", default=None, metavar="SQL",
                   help="a JMS message selector, e.g. \"region = 'eu' AND qty > 10\": only what it selects is owed "
                        "to the subscription (get reads it with the same one; another one makes a new "
                        "subscription)")
    p.add_argument("--shared", action="store_true",
                   help="join the shared subscription NAME as one of its members: every client that subscribes "
                        "to NAME with --shared splits its messages with the others (each message goes to one "
                        "member); get and unsubscribe with this --state-dir use it as a member too")
    p.add_argument("--expiry", type=_expiry, default=DEFAULT_EXPIRY,
                   help=f"seconds it may stay detached before it ends (default {DEFAULT_EXPIRY:.0f}; 'never')")
    _common(p)
    p.set_defaults(func=cmd_subscribe)

    p = sub.add_parser("get", help="receive messages from a subscription",
                       description="Attach to subscription NAME on TOPIC, print one message body per "
                                   "line on stdout, then detach (the subscription stays). Each message is "
                                   "printed exactly once across calls. The subscription must be one this "
                                   "--state-dir made (`oncemesh subscribe`): get creates none (exit 2).")
    p.add_argument("topic", help="the topic the subscription is on")
    p.add_argument("--subscription", required=True, metavar="NAME",
                   help="the subscription to read (made by `oncemesh subscribe` with the same --state-dir)")
    p.add_argument("--count", type=int, default=None, help="stop after N messages (exit 3 if fewer by --timeout)")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop after S seconds (default: 2 without --count, none with it)")
    p.add_argument("--expiry", type=_expiry, default=DEFAULT_EXPIRY,
                   help=argparse.SUPPRESS)  # (kept for old scripts: get creates no subscription now)
    p.add_argument("--json", action="store_true", help="print one JSON object per message (gid, body)")
    _common(p)
    p.set_defaults(func=cmd_get)

    p = sub.add_parser("unsubscribe", help="end a subscription",
                       description="End subscription NAME on TOPIC at the routers (messages still held "
                                   "for it are released to their publishers as ended) and forget it here.")
    p.add_argument("topic", help="the topic the subscription is on")
    p.add_argument("--subscription", required=True, metavar="NAME", help="the subscription to end")
    _common(p)
    p.set_defaults(func=cmd_unsubscribe)


def _client(args: argparse.Namespace) -> Client:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, stream=sys.stderr,
                        format="%(message)s")
    tls, user, password = client_credentials(args)
    return Client(args.url, state_dir=args.state_dir or default_state_dir(), log_dir=args.log_dir,
                  reconnect_timeout=args.connect_timeout, tls=tls, user=user, password=password)


def _run(main: Any) -> int:
    try:
        rc: int = asyncio.run(main)
        return rc
    except NoRouterAvailable as exc:
        print(f"oncemesh: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # (TlsConfigError: a certificate, key or CA file that cannot be used)
        print(f"oncemesh: {exc}", file=sys.stderr)
        return 2
    except ClientError as exc:
        print(f"oncemesh: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def cmd_put(args: argparse.Namespace) -> int:
    if not args.messages and not args.flush:
        print("oncemesh put: give at least one MESSAGE (or --flush)", file=sys.stderr)
        return 2
    return _run(_put(args))


async def _put(args: argparse.Namespace) -> int:
    client = _client(args)
    await client.start()
    try:
        pubs: dict[str, Publisher] = {}
        resent_futs: list[asyncio.Future[Result]] = []
        for link, topic in client.state.outbox_links():
            pub = client.publisher(topic, link, want_received=True)
            pubs[link] = pub
            resent_futs += pub.resend_outbox()
        resent = len(resent_futs)
        name = args.link or f"put:{args.topic}"
        pub = pubs.get(name) or client.publisher(args.topic, name, want_received=True)
        pubs[name] = pub
        for p in pubs.values():
            await p.wait_attached(args.connect_timeout)
        if resent:
            print(f"oncemesh put: resending {resent} message(s) left in doubt", file=sys.stderr)
        if args.no_wait:
            for m in args.messages:
                await pub.put_received(m, timeout=args.timeout)
            await asyncio.sleep(0)
            print(f"oncemesh put: {len(args.messages)} message(s) held by router {client.router_id}; "
                  f"in doubt in the outbox until a later put", file=sys.stderr)
            return 0
        futs = resent_futs + [await pub.send(m) for m in args.messages]
        if not futs:
            print("oncemesh put: nothing in doubt in the outbox; nothing to send", file=sys.stderr)
            return 0
        results = await _outcomes(client, args.topic, futs, args.timeout, args.progress)
        if results is None:
            left = sum(not f.done() for f in futs)
            where = args.state_dir or default_state_dir()
            print(f"oncemesh put: no outcome within {args.timeout:g}s for {left} of {len(futs)} message(s); "
                  f"they stay in doubt in the outbox of {where}: the next put with this --state-dir (or "
                  f"put --flush) resends them first, and no subscription gets any of them twice",
                  file=sys.stderr)
            return 1
        bad = [r for r in results if not r.accepted]
        for r in bad:
            cond = f" ({r.condition[0]}: {r.condition[1]})" if r.condition else ""
            print(f"oncemesh put: message {r.gid} {r.outcome.name}{cond}", file=sys.stderr)
        print(f"oncemesh put: {len(results) - len(bad)} of {len(results)} message(s) ACCEPTED", file=sys.stderr)
        return 0 if not bad else 1
    finally:
        await client.close()


async def _outcomes(client: Client, topic: str, futs: list[asyncio.Future[Result]], timeout: float | None,
                    every: float) -> list[Result] | None:
    """The outcomes of `futs`, saying on stderr every `every` seconds what they wait for; None if
    `timeout` passes first."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    started = loop.time()
    probe = _WaitProbe(client, topic)
    try:
        while True:
            left = None if deadline is None else deadline - loop.time()
            step = every if left is None else min(every, left)
            _, pending = await asyncio.wait(futs, timeout=max(step, 0.0))
            if not pending:
                return [f.result() for f in futs]
            if deadline is not None and loop.time() >= deadline:
                return None
            print(f"oncemesh put: {len(pending)} of {len(futs)} message(s) without an outcome after "
                  f"{loop.time() - started:.0f}s; {await probe.what()}", file=sys.stderr, flush=True)
    finally:
        probe.close()


class _WaitProbe:
    """What a put waits for, from the router's management view of the subscriptions: those of the
    topic that still hold messages from this router (the message is ACCEPTED once every one took
    it). Without the `manage` permission (or an answer), a sentence that says so."""

    def __init__(self, client: Client, topic: str) -> None:
        self.client = client
        self.topic = topic
        self.mgmt: Any = None
        self.unavailable: str | None = None

    async def what(self) -> str:
        generic = f"waiting for every subscription of {self.topic!r} to accept"
        if self.unavailable is not None:
            return generic
        try:
            if self.mgmt is None:
                self.mgmt = Management(self.client)
            res = await self.mgmt.view("subscriptions", timeout=2.0)
        except (ClientError, ConnectionError, TimeoutError) as exc:
            self.unavailable = str(exc)
            self.close()
            return f"{generic} (the router's subscription view: {exc or type(exc).__name__})"
        rows = [dict(zip(res["columns"], r, strict=False)) for r in res["rows"]]
        owed = [r for r in rows if r.get("topic") == self.topic and r.get("state") != "ended"
                and (r.get("backlog") or 0) > 0]
        if not owed:
            return f"{generic} (the router holds nothing for one now: outcomes on their way)"
        names = ", ".join(f"{r.get('link')} ({r.get('state')}, home {r.get('home')}"
                          f"{', holds ' + str(r['backlog']) if r.get('backlog') else ''})" for r in owed[:10])
        more = f" and {len(owed) - 10} more" if len(owed) > 10 else ""
        hint = " (a suspended subscription takes messages when `oncemesh get` reads it)" \
            if any(r.get("state") == "suspended" for r in owed) else ""
        return f"waiting for {len(owed)} subscription(s) to accept: {names}{more}{hint}"

    def close(self) -> None:
        if self.mgmt is not None:
            self.client.remove_owner(self.mgmt)
            for link in (self.mgmt.sender, self.mgmt.receiver):
                if link is not None and link.local_active:
                    link.close()
            self.mgmt = None


def cmd_subscribe(args: argparse.Namespace) -> int:
    return _run(_subscribe(args))


async def _subscribe(args: argparse.Namespace) -> int:
    client = _client(args)
    await client.start()
    try:
        sub = client.subscriber(args.topic, args.subscription, expiry=args.expiry, credit=0, selector=args.selector,
                                shared=True if args.shared else None)
        await sub.wait_attached(args.connect_timeout)
        await sub.detach()
        exp = "never" if math.isinf(args.expiry) else f"{args.expiry:g}s"
        print(f"oncemesh subscribe: {'resumed' if sub.resumed else 'created'} "
              f"{'shared subscription (as a member) ' if sub.shared else 'subscription '}"
              f"{args.subscription!r} on {args.topic!r} (id {sub.sid}, expiry {exp}, router {client.router_id})",
              file=sys.stderr)
        return 0
    finally:
        await client.close()


def _format_body(body: Any) -> str:
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body).decode("utf-8", "replace")
    if isinstance(body, str):
        return body
    try:
        return json.dumps(body, default=str)
    except TypeError:
        return str(body)


def cmd_get(args: argparse.Namespace) -> int:
    return _run(_get(args))


def known_subscription(args: argparse.Namespace) -> str | None:
    """None if the state in --state-dir holds subscription --subscription on TOPIC; else what to
    say. (A subscription belongs to the client identity of the state that made it: another state
    dir is another client, and attaching would make it a new, empty subscription.)"""
    state_dir = args.state_dir or default_state_dir()
    subs: list[tuple[str, str, str, float | None]] = []
    if (state_dir / "client.sqlite").exists():  # (else nothing to read: and none is made by asking)
        state = ClientState(state_dir)
        try:
            subs = state.subscriptions()
        finally:
            state.close()
    if any(link == args.subscription and topic == args.topic for _sid, topic, link, _exp in subs):
        return None
    on_other = sorted(topic for _sid, topic, link, _exp in subs if link == args.subscription)
    mine = ", ".join(f"{link} on {topic!r}" for _sid, topic, link, _exp in subs) or "none"
    other = f" (it has {args.subscription!r} on {', '.join(map(repr, on_other))})" if on_other else ""
    return (f"the state in {state_dir} has no subscription {args.subscription!r} on {args.topic!r}{other}; "
            f"its subscriptions: {mine}. A subscription belongs to the --state-dir that made it: give that "
            f"one to resume it, or create it first with `oncemesh subscribe {args.topic} --subscription "
            f"{args.subscription} --url ...` (it then holds what is published from that moment)")


async def _get(args: argparse.Namespace) -> int:
    unknown = known_subscription(args)
    if unknown is not None:
        print(f"oncemesh get: {unknown}", file=sys.stderr)
        return 2
    client = _client(args)
    await client.start()
    try:
        credit = min(args.count, 1000) if args.count else 1000
        sub = client.subscriber(args.topic, args.subscription, expiry=args.expiry, credit=credit)
        await sub.wait_attached(args.connect_timeout)
        timeout = args.timeout if args.timeout is not None else (None if args.count else 2.0)
        want = args.count if args.count else 1 << 62
        got = await sub.get_many(want, timeout)
        out = sys.stdout
        for m in got:
            if args.json:
                out.write(json.dumps({"gid": m.gid, "body": _format_body(m.body)}) + "\n")
            else:
                out.write(_format_body(m.body) + "\n")
        out.flush()
        await sub.detach()
        if args.count and len(got) < args.count:
            print(f"oncemesh get: {len(got)} of {args.count} message(s) within {timeout}s", file=sys.stderr)
            return 3
        return 0
    finally:
        await client.close()


def cmd_unsubscribe(args: argparse.Namespace) -> int:
    return _run(_unsubscribe(args))


async def _unsubscribe(args: argparse.Namespace) -> int:
    client = _client(args)
    await client.start()
    try:
        sub = client.subscriber(args.topic, args.subscription, credit=0)
        await sub.unsubscribe(args.connect_timeout)
        print(f"oncemesh unsubscribe: ended subscription {args.subscription!r} on {args.topic!r}",
              file=sys.stderr)
        return 0
    finally:
        await client.close()
