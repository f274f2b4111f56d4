"""The operations of seeds 000/001 on the command line: put, get, subscribe, unsubscribe.

Client identity (container-id) and state (outbox, deduplication store) live in --state-dir; the
same state directory means the same client. Exit codes: 0 success; 1 a message was not accepted
(or no router reachable); 2 usage; 3 get --count N timed out with fewer than N.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

from ..common.errors import ClientError, NoRouterAvailable
from ..common.tls import TlsFiles
from .publisher import Publisher, Result
from .runtime import Client
from .state import default_state_dir

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
    p.add_argument("-v", "--verbose", action="store_true")


def security_arguments(p: argparse.ArgumentParser) -> None:
    """--user, --password-env, --ca, --cert, --key (put/get/subscribe/unsubscribe and stat)."""
    sec = p.add_argument_group("security (docs/security.md)")
    sec.add_argument("--user", default=None, help="log in as USER (SCRAM-SHA-256, or PLAIN over TLS); the "
                                                  "password from $ONCEMESH_PASSWORD (--password-env) or a prompt")
    sec.add_argument("--password-env", default="ONCEMESH_PASSWORD", metavar="VAR",
                     help="environment variable holding the password (default ONCEMESH_PASSWORD; "
                          "never on the command line, where other users could read it)")
    sec.add_argument("--ca", type=Path, default=None,
                     help="CA file (PEM) to trust for amqps:// routers (default: the system's)")
    sec.add_argument("--cert", type=Path, default=None,
                     help="client certificate (PEM), for routers that ask for one (SASL EXTERNAL without --user)")
    sec.add_argument("--key", type=Path, default=None, help="the client certificate's key (PEM)")


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
                                   "ACCEPTED. What an earlier put left in doubt (--no-wait, or a crash) "
                                   "is resent first, from the outbox in --state-dir.")
    p.add_argument("topic")
    p.add_argument("messages", nargs="*", metavar="MESSAGE")
    _common(p)
    p.add_argument("--no-wait", action="store_true",
                   help="return once a router holds each message; it stays in the outbox, in doubt, "
                        "until a later put (or put --flush) gets its outcome")
    p.add_argument("--flush", action="store_true", help="only resend what the outbox holds, and wait")
    p.add_argument("--timeout", type=float, default=None, help="give up waiting after S seconds (exit 1)")
    p.add_argument("--link", default=None, help="publisher link name (default put:TOPIC)")
    p.set_defaults(func=cmd_put)

    p = sub.add_parser("subscribe", help="create (or resume) a durable subscription",
                       description="Create a durable subscription NAME on TOPIC and leave it suspended: "
                                   "messages published from now on are held for it until `get` "
                                   "collects them or it expires.")
    p.add_argument("topic")
    p.add_argument("--subscription", required=True, help="subscription name (the link name)")
    p.add_argument("--expiry", type=_expiry, default=DEFAULT_EXPIRY,
                   help=f"seconds it may stay detached before it ends (default {DEFAULT_EXPIRY:.0f}; 'never')")
    _common(p)
    p.set_defaults(func=cmd_subscribe)

    p = sub.add_parser("get", help="receive messages from a subscription",
                       description="Attach to subscription NAME on TOPIC (creating it if needed), print "
                                   "one message body per line on stdout, then detach (the subscription "
                                   "stays). Each message is printed exactly once across calls.")
    p.add_argument("topic")
    p.add_argument("--subscription", required=True)
    p.add_argument("--count", type=int, default=None, help="stop after N messages (exit 3 if fewer by --timeout)")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop after S seconds (default: 2 without --count, none with it)")
    p.add_argument("--expiry", type=_expiry, default=DEFAULT_EXPIRY, help="expiry if the subscription is created")
    p.add_argument("--json", action="store_true", help="print one JSON object per message (gid, body)")
    _common(p)
    p.set_defaults(func=cmd_get)

    p = sub.add_parser("unsubscribe", help="end a subscription",
                       description="End subscription NAME on TOPIC at the routers (messages still held "
                                   "for it are released to their publishers as ended) and forget it here.")
    p.add_argument("topic")
    p.add_argument("--subscription", required=True)
    _common(p)
    p.set_defaults(func=cmd_unsubscribe)


def _client(args: argparse.Namespace) -> Client:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, stream=sys.stderr,
                        format="%(message)s")
    tls, user, password = client_credentials(args)
    return Client(args.url, state_dir=args.state_dir or default_state_dir(), log_dir=args.log_dir,
                  reconnect_timeout=args.connect_timeout, tls=tls, user=user, password=password)


def client_credentials(args: argparse.Namespace) -> tuple[TlsFiles | None, str | None, str | None]:
    """(TLS files, user, password) from `security_arguments`: the password from the environment
    variable or, failing that, a prompt (never a command-line argument)."""
    password = None
    if args.user is not None:
        password = os.environ.get(args.password_env)
        if password is None:
            password = getpass.getpass(f"password for {args.user}: ")
    tls = TlsFiles(args.cert, args.key, args.ca) if (args.ca or args.cert or args.key) else None
    return tls, args.user, password


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
        results: list[Result] = list(await asyncio.wait_for(asyncio.gather(*futs), args.timeout))
        bad = [r for r in results if not r.accepted]
        for r in bad:
            cond = f" ({r.condition[0]}: {r.condition[1]})" if r.condition else ""
            print(f"oncemesh put: message {r.gid} {r.outcome.name}{cond}", file=sys.stderr)
        print(f"oncemesh put: {len(results) - len(bad)} of {len(results)} message(s) ACCEPTED", file=sys.stderr)
        return 0 if not bad else 1
    except TimeoutError:
        print(f"oncemesh put: no outcome within {args.timeout}s; the messages stay in doubt in the outbox",
              file=sys.stderr)
        return 1
    finally:
        await client.close()


def cmd_subscribe(args: argparse.Namespace) -> int:
    return _run(_subscribe(args))


async def _subscribe(args: argparse.Namespace) -> int:
    client = _client(args)
    await client.start()
    try:
        sub = client.subscriber(args.topic, args.subscription, expiry=args.expiry, credit=0)
        await sub.wait_attached(args.connect_timeout)
        await sub.detach()
        exp = "never" if math.isinf(args.expiry) else f"{args.expiry:g}s"
        print(f"oncemesh subscribe: {'resumed' if sub.resumed else 'created'} subscription "
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


async def _get(args: argparse.Namespace) -> int:
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
