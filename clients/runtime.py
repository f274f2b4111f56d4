"""The client runtime: one container-id, one AMQP connection at a time, failover across router URLs.

Publishers and subscribers are *link owners*: whenever a connection comes up (first connect or
failover) the runtime asks every owner to attach its link again, under the same link name, so
that the routers can match it to what they hold (resends merge by global id, subscriptions resume).
A frozen router is noticed by the idle timeout (heartbeats), a dead one by the TCP connection; both
lead to the next URL in the list, with exponential back-off between full rounds (tenacity). A router
that drains closes the connection with `amqp:connection:redirect` (or refuses a link with
`amqp:link:redirect`): we move at once, to the URL of our list it names if it names one, else to the
next one.

Runs on the same engine I/O layer as the router (`router.engine.amqp`), so that one client process
can drive well over 100k messages per second and benchmarks measure the router, not the client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    stop_after_delay,
    stop_never,
    wait_exponential,
)

from ..common.engine import AmqpConnection, Engine, Link, connect
from ..common.errors import AuthenticationFailed, NoRouterAvailable, Redirect, TlsFailed
from ..common.sasl import SaslClient
from ..common.settlement_log import SettlementLog
from ..common.tls import TlsFiles, make_context
from ..common.urls import parse_url_tls, redirect_address
from .publisher import Publisher
from .state import ClientState
from .subscriber import Subscriber

log = logging.getLogger("oncemesh.client")


def parse_url(url: str) -> tuple[str, int]:
    host, port, _ = parse_url_tls(url)
    return host, port


def split_urls(urls: str | Sequence[str]) -> list[str]:
    if isinstance(urls, str):
        urls = [urls]
    out = [u.strip() for item in urls for u in item.split(",") if u.strip()]
    if not out:
        raise ValueError("no router URL given")
    for u in out:
        parse_url(u)
    return out


class LinkOwner(Protocol):
    def attach(self, conn: AmqpConnection, session: Any) -> None: ...

    def connection_lost(self) -> None: ...

    def on_link_open(self, link: Link) -> None: ...

    def on_credit(self, link: Link) -> None: ...

    def on_message(self, link: Link, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None: ...

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None: ...

    def on_link_closed(self, link: Link, closed: bool, condition: tuple[str, str] | None) -> None: ...


class Client:
    """Async client. Create publishers and subscribers from it; `await start()` first."""

    def __init__(self, urls: str | Sequence[str], *, state_dir: Path | str | None = None,
                 idle_timeout: float = 2.0, reconnect_timeout: float | None = 60.0,
                 connect_timeout: float = 3.0, log_dir: Path | str | None = None,
                 dedup_retention: float = 3600.0, container_id: str | None = None,
                 tls: TlsFiles | None = None, check_hostname: bool = True,
                 user: str | None = None, password: str | None = None) -> None:
        """`tls`: for amqps:// URLs, the CAs to trust (`ca`; default the system's) and a client
        certificate (`cert`, `key`) if the router asks for one; the router's certificate must name
        the URL's host unless `check_hostname` is False. `user`/`password`: log in with SCRAM-SHA-256
        (or PLAIN over TLS); with a client certificate and no password, SASL EXTERNAL. Wrong
        credentials raise `AuthenticationFailed` at once (no retries)."""
        self.user = user
        self.password = password
        self._certificate = tls is not None and tls.cert is not None
        self.urls = split_urls(urls)
        self._tls = make_context(tls or TlsFiles(), server=False, check_hostname=check_hostname) \
            if tls is not None or any(parse_url_tls(u)[2] for u in self.urls) else None
        self.state = ClientState(state_dir, retention=dedup_retention)
        self.container_id = container_id or self.state.container_id
        self.idle_timeout = idle_timeout
        self.reconnect_timeout = reconnect_timeout
        self.connect_timeout = connect_timeout
        self.run_id = f"{os.getpid()}-{time.time_ns() // 1000}"
        self._log_dir = Path(log_dir) if log_dir else None
        self._logs: dict[str, SettlementLog] = {}
        self.engine: Engine | None = None
        self.conn: AmqpConnection | None = None
        self.session: Any = None
        self.router_url: str | None = None
        self.router_id: str | None = None
        self.owners: list[LinkOwner] = []
        self._url_index = 0
        self._opened: asyncio.Future[None] | None = None
        self._connected = asyncio.Event()
        self._closing = False
        self._reconnect_task: asyncio.Task[None] | None = None
        self.failovers = 0
        self.redirects = 0  # times a draining router sent us elsewhere
        self.last_error: BaseException | None = None
        self._flush_handle: asyncio.TimerHandle | None = None
        self._handshake_cut: dict[str, int] = {}  # TLS handshakes a router cut off in a row, per URL

    # ------------------------------------------------------------------ settlement logs
    def settlement_log(self, role: str) -> SettlementLog:
        """What this client's publishers or subscribers (`role`) write for the reconciliation."""
        slog = self._logs.get(role)
        if slog is None:
            path = self._log_dir / f"{self.container_id}.{role}.jsonl" if self._log_dir else None
            slog = self._logs[role] = SettlementLog(path, src=role, node=self.container_id, inc=self.run_id)
        return slog

    def flush_logs(self) -> None:
        """Write out the settlement-log lines buffered so far."""
        for slog in self._logs.values():
            slog.flush()

    # ------------------------------------------------------------------ lifecycle
    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def start(self) -> Client:
        """Connect to the first router that answers (trying the URLs in turn); returns self."""
        self.engine = Engine(asyncio.get_running_loop())
        await self._connect_with_failover()
        return self

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until a router connection is up (after a failover, the next one)."""
        await asyncio.wait_for(self._connected.wait(), timeout)

    async def close(self) -> None:
        """Detach every link (subscriptions stay, suspended, until they expire) and disconnect."""
        self._closing = True
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
        conn = self.conn
        if conn is not None and not conn.closed:
            conn.close()
            assert self.engine is not None
            self.engine._flush_all()
            for _ in range(50):  # give the close frame a moment to go out
                if conn.closed:
                    break
                await asyncio.sleep(0.01)
            if not conn.closed and conn.sock is not None:
                conn.sock.close()
        self.flush_logs()
        for slog in self._logs.values():
            slog.close()
        self.state.close()

    def publisher(self, topic: str, name: str | None = None, **kw: Any) -> Publisher:
        """A publisher on `topic`. Give a stable `name` when using a durable outbox."""
        return Publisher(self, topic, name, **kw)

    def subscriber(self, topic: str, name: str, **kw: Any) -> Subscriber:
        """A durable subscription named `name` (the link name) on `topic`."""
        return Subscriber(self, topic, name, **kw)

    def causal_past(self, limit: int = 1000) -> list[list[str]]:
        """`oncemesh.causal-past`, presented when a publisher attaches: [gid, topic] of the latest
        message of each publisher link this client was handed, and of each of its own links it
        published on. A router keeps a client's past for causal order only for what it handed it
        itself; this tells a router the client moved to (docs/ordering.md, "Causal order")."""
        out: list[list[str]] = []
        for o in self.owners:
            entries = getattr(o, "causal_entries", None)
            if entries is not None:
                out.extend(entries())
        return out[-limit:]

    def add_owner(self, owner: LinkOwner) -> None:
        """Register a link owner (publisher or subscriber): it attaches on every connection."""
        self.owners.append(owner)
        if self.conn is not None and self.connected:
            owner.attach(self.conn, self.session)

    def remove_owner(self, owner: LinkOwner) -> None:
        """Forget a link owner (it closed)."""
        if owner in self.owners:
            self.owners.remove(owner)

    async def _connect_once(self) -> None:
        engine = self.engine
        assert engine is not None
        url = self.urls[self._url_index % len(self.urls)]
        self._url_index += 1
        host, port, secure = parse_url_tls(url)
        loop = asyncio.get_running_loop()
        self._opened = loop.create_future()
        # (our SASL layer even without credentials, ANONYMOUS: a router that takes no anonymous client
        # then says so in the exchange, where Proton's own would only drop the connection)
        sasl = lambda c: SaslClient(self.user, self.password, c.encrypted,  # noqa: E731
                                    self._certificate and c.encrypted)
        def make() -> AmqpConnection:
            # (ours from the start: the router may refuse our login before `connect` returns)
            self.conn = AmqpConnection(engine, self, server=False,
                                       container_id=self.container_id, idle_timeout=self.idle_timeout,
                                       hostname=host, sasl=sasl)
            return self.conn

        try:
            conn = await connect(engine, make, host, port, timeout=self.connect_timeout,
                                 tls=self._tls if secure else None)
        except BaseException as exc:
            self.conn = None
            refused = self._opened.exception() if self._opened.done() and not self._opened.cancelled() else None
            if isinstance(refused, AuthenticationFailed):
                raise refused from None
            final = tls_failure(url, exc) if isinstance(exc, ssl.SSLError) else None
            if final is None and secure and isinstance(exc, ConnectionResetError | ssl.SSLEOFError):
                # a router that cuts our TLS handshake off again is one that does not speak TLS there
                # (a plain listener reads our ClientHello as a bad AMQP header and closes)
                self._handshake_cut[url] = cut = self._handshake_cut.get(url, 0) + 1
                if cut >= 2:
                    final = TlsFailed(f"{url}: the router closed the connection during the TLS handshake "
                                      f"({cut} times: {exc or type(exc).__name__}): is it a plain listener? "
                                      f"then use amqp:// for it")
            if final is None:
                raise
            raise final from None
        self._handshake_cut.pop(url, None)
        self.conn = conn
        try:
            await asyncio.wait_for(asyncio.shield(self._opened), self.connect_timeout)
        except BaseException:
            conn.abort()
            raise
        if conn.closed or self.conn is not conn:  # opened and closed at once (e.g. a connection limit)
            raise ConnectionError(f"{url}: the router closed the connection as it opened it")
        self.router_url = url
        self.router_id = str(conn.remote_properties.get("oncemesh.router", "")) or None
        self.session = conn.open_session()
        self._connected.set()
        log.info("client.connected url=%s router=%s container=%s", url, self.router_id, self.container_id)
        for owner in list(self.owners):
            owner.attach(conn, self.session)

    async def _connect_with_failover(self) -> None:
        stop = stop_after_delay(self.reconnect_timeout) if self.reconnect_timeout else stop_never
        n = len(self.urls)
        attempt = 0
        try:
            async for att in AsyncRetrying(
                    stop=stop, reraise=False,
                    wait=lambda rs: 0.0 if rs.attempt_number % n else wait_exponential(
                        multiplier=0.05, max=1.0)(rs),
                    retry=retry_if_exception_type((OSError, asyncio.TimeoutError, ConnectionError))):
                with att:
                    attempt += 1
                    if self._closing:
                        return
                    await self._connect_once()
        except RetryError as exc:
            self.last_error = exc.last_attempt.exception()
            raise NoRouterAvailable(
                f"no router reachable at {', '.join(self.urls)} within {self.reconnect_timeout}s "
                f"({attempt} attempts; last error: {describe(self.last_error, self.connect_timeout)})") from None

    def _schedule_reconnect(self) -> None:
        if self._closing or (self._reconnect_task is not None and not self._reconnect_task.done()):
            return

        async def run() -> None:
            try:
                await self._connect_with_failover()
                self.failovers += 1
            except (NoRouterAvailable, AuthenticationFailed, TlsFailed) as exc:
                self.last_error = exc
                log.error("client.gave_up %s", exc)
                for owner in self.owners:
                    fail = getattr(owner, "fail", None)
                    if fail is not None:
                        fail(exc)

        self._reconnect_task = asyncio.get_running_loop().create_task(run())

    def drop_connection(self) -> None:
        """Drop the current TCP connection (tests, chaos): failover follows."""
        if self.conn is not None:
            self.conn.abort()

    def move(self, info: dict[Any, Any]) -> None:
        """A router redirected one of our links (`amqp:link:redirect`): the whole connection moves,
        every owner attaches again at the new router."""
        self._redirected(info)
        if self.conn is not None and not self.conn.closed:
            self.conn.close()

    def _redirected(self, info: dict[Any, Any]) -> None:
        """The next connection goes where the redirect points, when that is one of our URLs (else to
        the next URL of the list: a router we were not given is not one we trust)."""
        addr = redirect_address(info)
        self.redirects += 1
        if addr is not None:
            for i, url in enumerate(self.urls):
                if parse_url_tls(url)[:2] == addr:
                    self._url_index = i
                    log.info("client.redirected from=%s to=%s", self.router_url, url)
                    return
        log.info("client.redirected from=%s to=%s (not one of our URLs: the next one instead)", self.router_url,
                 f"{addr[0]}:{addr[1]}" if addr else None)

    # ------------------------------------------------------------------ engine events
    def on_connection_open(self, conn: AmqpConnection) -> None:
        if self._opened is not None and not self._opened.done():
            self._opened.set_result(None)

    def on_link_open(self, link: Link) -> None:
        if link.ctx is not None:
            link.ctx.on_link_open(link)

    def on_credit(self, link: Link) -> None:
        if link.ctx is not None:
            link.ctx.on_credit(link)

    def on_message(self, link: Link, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None:
        if link.ctx is not None:
            link.ctx.on_message(link, delivery, tag, payload, settled)

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None:
        if link.ctx is not None:
            link.ctx.on_delivery_update(link, delivery, state, settled)

    def on_link_closed(self, link: Link, closed: bool, condition: tuple[str, str] | None) -> None:
        if link.ctx is not None:
            link.ctx.on_link_closed(link, closed, condition)

    def on_connection_closed(self, conn: AmqpConnection, condition: tuple[str, str] | None) -> None:
        if conn is not self.conn:
            return
        if condition is not None and condition[0] == Redirect.condition:
            self._redirected(conn.remote_condition_info())
        if self._opened is not None and not self._opened.done():
            url = self.urls[(self._url_index - 1) % len(self.urls)]
            if conn.auth_error is not None and self.user is None and not self._certificate:
                self._opened.set_exception(AuthenticationFailed(
                    f"{url}: authentication required: the router takes no anonymous client; log in with "
                    f"--user (password from $ONCEMESH_PASSWORD) or a client certificate (--cert/--key) "
                    f"({conn.auth_error})"))
            elif conn.auth_error is not None:  # (not worth retrying: the same credentials fail again)
                self._opened.set_exception(AuthenticationFailed(f"{url}: {conn.auth_error}"))
            else:
                self._opened.set_exception(ConnectionError(f"connection closed: {condition}"))
        was_connected = self._connected.is_set()
        self._connected.clear()
        self.conn = None
        self.session = None
        if was_connected:
            if self._closing:  # (ours: close() ended it; nothing was lost)
                log.debug("client.closed url=%s", self.router_url)
            else:
                log.warning("client.connection_lost url=%s condition=%s", self.router_url, condition)
            for owner in list(self.owners):
                owner.connection_lost()
            self._schedule_reconnect()


def describe(exc: BaseException | None, connect_timeout: float) -> str:
    """An error for a message: its text, or its kind when it has none (a timeout)."""
    if exc is None:
        return "none"
    if isinstance(exc, TimeoutError | asyncio.TimeoutError) and not str(exc):
        return f"no answer within {connect_timeout:g}s"
    return str(exc) or type(exc).__name__


# OpenSSL's reasons when the other end does not speak TLS (it answered with AMQP's header)
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNKNOWN_PROTOCOL",
                      "HTTP_REQUEST", "WRONG_SSL_VERSION", "UNSUPPORTED_PROTOCOL"})


def tls_failure(url: str, exc: ssl.SSLError) -> TlsFailed | None:
    """The final error a failed TLS handshake stands for (None: one worth retrying, e.g. cut short)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TlsFailed(f"{url}: TLS: the router's certificate is not trusted ({exc.reason}: {exc.verify_message}); "
                         f"name the "
                         f"CA that signed it with --ca (or tls=TlsFiles(ca=...)), and a URL host the "
                         f"certificate names")
    if exc.reason in _NOT_TLS:
        return TlsFailed(f"{url}: TLS handshake failed ({exc.reason}): the port does not speak TLS (a plain "
                         f"listener?): use amqp:// for it")
    return None
