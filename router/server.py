"""The router process: the client listener and the adapter between the engine and the delivery core.

The adapter owns everything keyed by Proton objects (links, delivery pointers) and nothing else;
what happens to a message is decided by `DeliveryCore`. After each batch of engine events it drains
the core's actions and settlement-log events. Bad input from a peer becomes an AMQP error condition
on that link or connection and a log line; the router and all other traffic carry on.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import logging
import logging.handlers
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, assert_never

from proton import Message

from ..common import engine as amqp
from ..common import errors, topics
from ..common import ffi as F
from ..common.amqpmsg import read_to
from ..common.engine import AmqpConnection, Engine, Link
from ..common.ids import publisher_link_id, shared_subscription_id, subscription_id
from ..common.passrules import HandoverHold, PassBudget
from ..common.sasl import PLAIN, SCRAM, SaslServer, ScramSecret, ServerPolicy
from ..common.settlement_log import Segments, SettlementLog
from ..common.symbols import (
    PROP_CAUSAL_PAST,
    PROP_CLIENT,
    PROP_EPOCH,
    PROP_HANDED_LAST,
    PROP_IDENTITY,
    PROP_IN_DOUBT,
    PROP_NEXT_SEQ,
    PROP_RECEIVED,
    PROP_RESUME,
    PROP_RESUMED,
    PROP_ROUTER,
    ROUTER_CAPABILITIES,
    SELECTOR_FILTER,
    SELECTOR_FILTER_CODE,
)
from ..common.tls import TlsFiles, TlsProvider
from ..common.urls import redirect_info
from ..common.vocab import (
    FINAL_SUBJECT,
    FINAL_TAG_PREFIX,
    IDENTITIES,
    MESSAGE_ID,
    O_ACCEPTED,
    O_MODIFIED,
    O_REJECTED,
    O_RELEASED,
    SELECTIVE,
    Outcome,
)
from . import admission
from .actions import (
    Action,
    Announce,
    Deliver,
    DetachLink,
    DrainCredit,
    GrantCredit,
    MeshAction,
    NotifyFinal,
    SendOutcome,
    SettleDelivery,
    SettlePublisher,
)
from .admission import LoginThrottle, PreAuth, PreAuthLimits, ThrottleLimits
from .config import RouterConfig, client_url_of, parse_hostport
from .core import DeliveryCore, OutcomeItem, SubscriberAttach
from .drain import ConnView, Dependents, Drain, DrainPhase, core_dependents
from .groups import GLOBAL, NAME_DELIMITER, SHARED, group_key
from .heapprobe import HeapProbe, interval_from_env
from .http import HttpEndpoint
from .looplag import LagSummary, LoopLag
from .meshport import MeshPort
from .mgmtlink import ManagementLinks, MgmtCtx
from .policy import Grants, PolicyError, load_policy
from .snapshot import CoreSnapshot, Parts
from .statusfile import StatusFile
from .subscriptions import Subscription, SubscriptionStore, SubscriptionTable
from .users import Users

if TYPE_CHECKING:
    from .mqtt.edge import MqttEdge

log = logging.getLogger("oncemesh.router")

MAX_CAUSAL_PAST = 10_000  # ids a publisher may present as its causal past
# seconds between two looks at the status (the ready file): rewritten then if it changed. It was
# twice a second, and under any traffic its counts change: ~150,000 instructions of JSON and ~180,000
# in its writer thread each time (docs/performance.md, "A quiet router (item 2)")
STATUS_INTERVAL = 1.0

_ACCEPTED = F.ACCEPTED
_OUTCOME_OF_STATE = {F.ACCEPTED: O_ACCEPTED, F.REJECTED: O_REJECTED,
                     F.RELEASED: O_RELEASED, F.MODIFIED: O_MODIFIED}
_STATE_OF_OUTCOME = {v: k for k, v in _OUTCOME_OF_STATE.items()}


def validate_address(address: str | None, what: str) -> str:
    if address is None or address == "":
        raise errors.InvalidAddress(f"{what} address is missing: attach with a topic "
                                    f"{'name' if what == 'target' else 'filter'} as the {what} address "
                                    f"(dynamic {what}s are not supported)")
    if address[0] in "$_":
        raise errors.ReservedAddress(f"address {address!r} is reserved for the routers "
                                     f"(addresses starting with '$' or '_')")
    if len(address) > 1024 or any(ord(c) < 0x20 for c in address):
        raise errors.InvalidAddress(f"address {address[:64]!r}... is invalid: at most 1024 printable "
                                    f"characters")
    if what == "target":
        why = topics.check_name(address)
        if why is not None:
            raise errors.InvalidAddress(f"target address {address!r} is not a topic name: {why}")
    else:
        why = topics.check_filter(address)
        if why is not None:
            raise errors.InvalidAddress(f"source address {address!r} is not a topic filter: {why}")
    return address


def source_selector(filters: Any) -> tuple[str, dict[Any, Any] | None]:
    """(the JMS selector, "" none; the filter map to echo) of a receiver's source filter map. A filter
    the router does not apply is refused (amqp:not-implemented), a selector that is not a string is
    an invalid field; an empty selector selects everything."""
    if not filters:
        return "", None
    if not isinstance(filters, dict):
        raise errors.InvalidAddress("a source's filter is a map of filters")
    selector = ""
    for key, value in filters.items():
        desc = getattr(value, "descriptor", None)
        if desc in (SELECTOR_FILTER, SELECTOR_FILTER_CODE):
            text = getattr(value, "value", None)
            if not isinstance(text, str):
                raise errors.InvalidAddress(f"the selector filter {key!r} holds no string")
            selector = text.strip()
        else:
            raise errors.NotImplementedMode(f"source filter {key!r} ({desc!r}) is not one this router applies: it "
                                            f"applies JMS selectors ({SELECTOR_FILTER}) only")
    return selector, filters


class SubLinkCtx:
    __slots__ = ("sid", "table_sid", "topic", "deliveries", "gid_of", "final_seq", "attach_args", "resumed",
                 "relayed")

    def __init__(self, sid: str, topic: str, table_sid: str = "") -> None:
        self.sid = sid  # the link's id with the core (a shared subscription's member: the member's)
        self.table_sid = table_sid or sid  # its subscription's id in the table
        self.topic = topic
        self.attach_args: SubscriberAttach | None = None
        self.resumed = False
        self.deliveries: dict[str, Any] = {}  # gid -> unsettled delivery pointer
        self.gid_of: dict[Any, str] = {}  # delivery pointer -> gid
        self.final_seq = 0
        self.relayed = False  # a member relayed to its shared subscription's home (interrouter/members.py)


class PubLinkCtx:
    __slots__ = ("topic", "plid", "deliveries", "want_received", "max_size")

    def __init__(self, topic: str, plid: str, want_received: bool, max_size: int) -> None:
        self.topic = topic
        self.plid = plid
        self.want_received = want_received
        self.max_size = max_size  # the router's max_message_size, or the user's limit if lower
        self.deliveries: set[Any] = set()  # unsettled publisher deliveries on this link


class ConnCtx:
    __slots__ = ("container", "peer_kind", "counted", "refused", "opened", "links_refused")

    def __init__(self) -> None:
        self.container: str | None = None
        self.peer_kind = "client"
        self.counted: tuple[str, str] | None = None  # (user, host) counted against connection limits
        self.refused = False  # closed as it came (a connection limit): nothing of it is carried out
        self.opened = False  # its AMQP open came (after its login, if any)
        self.links_refused = 0  # attaches refused for max_links_per_connection (logged once)


class ClientConnection(AmqpConnection):
    """A connection of the client listener: the router hears of it as soon as its transport is up,
    before a byte of it is read (admission: router/admission.py)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        handler = self.handler
        assert isinstance(handler, Router)
        handler.on_transport_up(self)



def in_doubt_tags(value: list[Any] | tuple[Any, ...]) -> list[bytes]:
    """The delivery tags a publisher declares in doubt (`oncemesh.in-doubt`), as bytes. Proton
    decodes AMQP binary as memoryview: anything else but bytes-like or text is refused, since a tag
    mis-read here would make the router take the publisher's real in-doubt messages for settled."""
    out: list[bytes] = []
    for t in value:
        if isinstance(t, bytes | bytearray | memoryview):
            out.append(bytes(t))
        elif isinstance(t, str):
            out.append(t.encode("utf-8"))
        else:
            raise errors.RemoteProtocolError(
                f"link property {PROP_IN_DOUBT} must list delivery tags (binary), not {type(t).__name__}")
    return out

class Router:
    """One router. It loads its subscription table at construction (it must know whom messages are
    owed to before anyone can publish); `start()` binds; `stop()` shuts down cleanly.

    `mesh`: makes the mesh layer for this router (in a mesh), called once, when the core exists."""

    def __init__(self, cfg: RouterConfig, mesh: Callable[[Router], MeshPort] | None = None) -> None:
        self.cfg = cfg
        self.id = cfg.id
        self.incarnation = str(time.time_ns() // 1000)
        self.table = SubscriptionTable()
        self.store = SubscriptionStore(cfg.state_dir / f"{cfg.id}.subscriptions.json") if cfg.state_dir else None
        snap = self.store.load() if self.store is not None else None
        if snap is not None:
            self.table.restore(snap, time.time())
            log.info("router.table_loaded subscriptions=%d", sum(1 for _ in self.table.live()))
        self.core = DeliveryCore(cfg.id, self.table, cfg.core)
        self.core.incarnation = self.incarnation  # (new identities it gives are unique to it)
        if cfg.log_compress not in ("gzip", "none"):
            raise ValueError(f"log_compress: {cfg.log_compress!r} is neither 'gzip' nor 'none'")
        self.slog = SettlementLog(
            (cfg.log_dir / f"{cfg.id}.settlement.jsonl") if cfg.log_dir else None,
            src="router", node=cfg.id, inc=self.incarnation, flush_interval=cfg.log_flush_interval,
            segments=Segments(cfg.log_segment_bytes, cfg.log_segment_seconds, cfg.log_retention_bytes,
                              cfg.log_retention_seconds, cfg.log_compress == "gzip",
                              cfg.log_free_floor_bytes),
            hold=True, on_writable=self._on_log_writable)
        # the client listener's TLS (amqps), None for plain AMQP; raises TlsConfigError at once
        self.client_tls = TlsProvider(TlsFiles(Path(cfg.tls_cert), Path(cfg.tls_key) if cfg.tls_key else None,
                                               Path(cfg.tls_ca) if cfg.tls_ca else None, cfg.tls_verify_clients),
                                      server=True, what="client-listener") if cfg.tls_cert else None
        # who may connect: the users file (passwords) and verified client certificates (EXTERNAL)
        self.users = Users(Path(cfg.users_file)) if cfg.users_file else None
        self.client_auth = self.users is not None or cfg.tls_verify_clients
        self.policy = load_policy(Path(cfg.policy_file)) if cfg.policy_file else None  # PolicyError at once
        if not self.client_auth and not cfg.allow_anonymous:
            raise ValueError("no way for clients to log in: set users_file (passwords) and/or tls_verify_clients "
                             "(certificates), or allow_anonymous = true (--allow-anonymous) for an open router "
                             "where anyone who reaches the port may publish and subscribe")
        self._conns_by_user: dict[str, int] = {}
        # connections not yet logged in and open, and failed password logins (router/admission.py)
        self.preauth: PreAuth[AmqpConnection] = PreAuth(PreAuthLimits(
            cfg.auth_timeout, cfg.max_preauth_per_source, cfg.max_preauth_connections))
        self.throttle = LoginThrottle(ThrottleLimits(cfg.login_failures_free, cfg.login_backoff,
                                                     cfg.login_backoff_max))
        if cfg.passwords_without_tls not in ("loopback", "allow", "refuse"):
            raise ValueError(f"passwords_without_tls: {cfg.passwords_without_tls!r} is none of 'loopback', "
                             f"'allow', 'refuse'")
        self.event_counts: Counter[str] = Counter()  # settlement-log events of the core, by name (/metrics)
        self.outcomes_sent = [0] * (max(Outcome) + 1)  # outcomes told publishers, indexed by Outcome (/metrics)
        self.accepted_sent = 0  # (ACCEPTED ones: counted apart, see _perform)
        self.http: HttpEndpoint | None = None
        self.management = ManagementLinks(self)  # $management links (router/mgmtlink.py)
        self.stats_refusals = {"unauthorized_attaches": 0, "limited_attaches": 0, "limited_connections": 0,
                               "limited_links": 0, "preauth_refused": 0, "auth_timeouts": 0,
                               "logins_throttled": 0}
        self._conns_by_host: dict[tuple[str, str], int] = {}
        self.engine: Engine | None = None
        self.server: asyncio.Server | None = None
        self.connections: set[AmqpConnection] = set()
        self.sub_links: dict[str, Link] = {}
        self.pub_deliveries: dict[Any, Link] = {}  # unsettled publisher delivery pointer -> its link
        self.bound: tuple[str, int] | None = None
        self._saved_version = -1
        self._drain_scheduled = False
        # when the input whose decisions wait for the pass's drain was taken (a mesh frame's read:
        # `taking`); None: none waits, the drain stamps with the pass's latest input
        self._decided: float | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._tick_due = 0.0  # loop time the tick was asked for: how late it runs is the loop's lag
        self.lag = LoopLag(cfg.loop_lag_window, cfg.loop_stall)
        self.handover_hold = HandoverHold()  # after a stall of the process (`_on_stall`)
        self._gc_started = 0.0
        self._pools_trimmed = time.monotonic()  # (the first trim one interval after the start)
        self._stopped = asyncio.Event()
        self._pending_opens: list[Link] = []
        self._status_checked = -math.inf  # (monotonic) when the status was last looked at
        self.status_file = StatusFile(cfg.ready_file) if cfg.ready_file is not None else None
        self._log_blocked_at: float | None = None
        self._last_stats: dict[str, Any] = {}
        self._awaiting_mesh: dict[str, list[Link]] = {}  # subscriber ATTACHes waiting for gossip acks
        self._drain: Drain | None = None  # set once the router drains (SIGUSR1): router/drain.py
        self._drain_waits: dict[AmqpConnection, set[Any]] = {}  # publisher deliveries open when it began
        self._drain_told: set[AmqpConnection] = set()  # connections told to move
        self._drain_logged = 0.0
        self.mesh: MeshPort | None = mesh(self) if mesh is not None else None
        self.mqtt: MqttEdge | None = None  # MQTT clients (router/mqtt/), loaded only with an MQTT listener
        if cfg.mqtt_listen:
            from .mqtt.edge import MqttEdge
            self.mqtt = MqttEdge(self)
        # ONCEMESH_PASS_BUDGET=0: no per-pass budget of a client connection's work (measurements only)
        self._pass_budget = os.environ.get("ONCEMESH_PASS_BUDGET", "1") != "0"
        probe_every = interval_from_env()  # ONCEMESH_HEAP_PROBE (diagnosis only: router/heapprobe.py)
        self.heap_probe = HeapProbe(cfg.log_dir / f"{cfg.id}.heap.jsonl", probe_every, lambda: {"router": self}) \
            if probe_every is not None and cfg.log_dir is not None else None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.engine = Engine(loop)
        # write-ahead evidence: the log lines of a pass are written (one write) before its output
        # leaves, so a SIGKILL can never leave a peer knowing what the log does not say
        self.engine.before_output.append(self.slog.flush)
        self.engine.on_stall(self._on_stall)
        now = time.time()
        self._saved_version = self.table.version
        host, port = self.cfg.listen
        engine = self.engine
        self.server = await amqp.listen(engine, self._make_connection, host, port, tls=self.client_tls)
        sock = self.server.sockets[0].getsockname()
        self.bound = (sock[0], sock[1])
        self.slog.write("router_started", now, info=f"listen={sock[0]}:{sock[1]} pid={os.getpid()}")
        if self.mesh is not None:
            await self.mesh.start(engine)
        if self.cfg.http_listen:
            self.http = HttpEndpoint(self, *parse_hostport(self.cfg.http_listen))
            await self.http.start()
        if self.mqtt is not None:
            await self.mqtt.start(*parse_hostport(self.cfg.mqtt_listen))
        self._schedule_tick()
        gc.callbacks.append(self._on_gc)
        self.write_ready_file()
        log.info("router.started id=%s incarnation=%s listen=%s:%d", self.id, self.incarnation, *self.bound)
        if not self.client_auth:
            log.warning("router.open_access listen=%s:%d: any client that reaches this port may connect, publish "
                        "and subscribe without credentials (allow_anonymous; set users_file and/or "
                        "tls_verify_clients to require them)", *self.bound)

    def ready_info(self, snap: CoreSnapshot | None = None) -> dict[str, Any]:
        """The status (the ready file's content); `snap`: the core's with its counts, if the caller
        has one."""
        assert self.bound is not None
        if snap is None:
            snap = self.core.snapshot(time.time(), Parts(counts=True))
        assert snap.counts is not None
        info: dict[str, Any] = {"id": self.id, "pid": os.getpid(), "incarnation": self.incarnation,
                                "listen": f"{self.bound[0]}:{self.bound[1]}",
                                "url": f"{'amqps' if self.client_tls else 'amqp'}://{self.bound[0]}:{self.bound[1]}",
                                "peers": [], "converged": True, "updated": time.time(),
                                "client_auth": ("sasl" + ("+anonymous" if self.cfg.allow_anonymous else ""))
                                if self.client_auth else "anonymous",
                                "stats": {**snap.counts.as_dict(), "connections": len(self.connections),
                                          "rss_kb": _rss_kb(), **self._lag_fields(), **self.stats_refusals,
                                          **(self.engine.counters if self.engine is not None else {}),
                                          **self.slog.stats()}}
        if self.mesh is not None:
            info.update(self.mesh.ready_info())
        if self.http is not None and self.http.bound is not None:
            info["http"] = f"{self.http.bound[0]}:{self.http.bound[1]}"
        if self.mqtt is not None and self.mqtt.bound is not None:
            info["mqtt"] = f"{self.mqtt.bound[0]}:{self.mqtt.bound[1]}"
            info["stats"].update(self.mqtt.stats())
        if self._drain is not None:
            report = self._drain_report_path()
            info["draining"] = {**self._drain.status(time.time()), "report": str(report) if report else None}
        return info

    def client_url(self) -> str | None:
        """Where clients reach this router (told to neighbours: where a draining one sends its clients)."""
        assert self.bound is not None
        return client_url_of(self.bound[0], self.bound[1], self.client_tls is not None, self.cfg.client_url)

    def _on_log_writable(self, writable: bool) -> None:
        """The settlement log could not be written (a full disk) or can again: publishers get no
        credit meanwhile (evidence first), and the log and the status say so."""
        self.core.set_log_writable(writable)
        if writable:
            log.warning("router.log_resumed id=%s held_s=%.1f", self.id,
                        time.time() - (self._log_blocked_at or time.time()))
            self._log_blocked_at = None
            if self.engine is not None:
                self._drain_later()  # the credit granted again
        else:
            self._log_blocked_at = time.time()
            log.error("router.log_blocked id=%s reason=%s held_bytes=%d (no publisher credit until the "
                      "settlement log can be written; free space under %s)", self.id,
                      self.slog.block_reason, self.slog.pending_bytes, self.cfg.log_dir)
        if self.bound is not None:
            try:
                self._maybe_write_status(force=True)
            except OSError as exc:  # the status file may live on the same full disk
                log.warning("router.status_not_written error=%s", exc)

    def _lag_fields(self) -> dict[str, float]:
        """Loop lag for the status: the last complete minute (the minute so far before the first),
        and the worst since start."""
        return {**(self.lag.last or self.lag.current()).fields(), "loop_lag_worst_ms": round(self.lag.worst_ms, 1)}

    def _status_due(self, now: float) -> bool:
        """Is the status due for a look (`now`: monotonic)? Once a second (`STATUS_INTERVAL`): the
        tick that comes a second after the last look, give or take half a tick's drift."""
        return now - self._status_checked >= STATUS_INTERVAL - self.cfg.tick_interval / 2

    def _maybe_write_status(self, force: bool = False, now: float | None = None) -> None:
        """Refresh the ready/status file (with delivery statistics) once a second, if it changed
        (`force`: now, and whether it changed or not). What the file promises its readers: a change
        is in it within `STATUS_INTERVAL` and a tick (docs/operations.md, "The state directory"). `now`:
        monotonic."""
        if now is None:
            now = time.monotonic()
        if not force and not self._status_due(now):
            return
        self._status_checked = now
        info = self.ready_info()
        # compared without what alone changes all the time
        same = {k: v for k, v in info.items() if k != "updated"}
        same["stats"] = {k: v for k, v in info.get("stats", {}).items() if k not in _VOLATILE_STATS}
        if same != self._last_stats or force:
            self._last_stats = same
            self.write_ready_file(info)

    def write_ready_file(self, info: dict[str, Any] | None = None) -> None:
        """Write the ready/status file (`info`, or the current one): encoded here, written by a
        thread (router/statusfile.py: the rename took milliseconds of the loop's time)."""
        if self.status_file is None:
            return
        self.status_file.write(json.dumps(info if info is not None else self.ready_info()))

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        if not self._stopped.is_set():
            asyncio.get_running_loop().create_task(self.stop())

    async def stop(self) -> None:
        if self._stopped.is_set():
            return
        log.info("router.stopping id=%s", self.id)
        if self.mesh is not None:
            await self.mesh.stop()
        if self.server is not None:
            self.server.close()
        if self.mqtt is not None:
            self.mqtt.close()
        if self.http is not None:
            await self.http.stop()
        for conn in list(self.connections):
            conn.close(errors.ConnectionForced.condition, "router shutting down")
        if self.engine is not None:
            self.engine._flush_all()
        await asyncio.sleep(0)  # let the close frames go out
        for conn in list(self.connections):
            if conn.sock is not None:
                conn.sock.close()
        if self._tick_handle:
            self._tick_handle.cancel()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._save_table(force=True)
        self.slog.write("router_stopped", time.time())
        self.slog.close()
        if self.status_file is not None:
            self.status_file.close()  # (nothing is written after this)
            self.status_file.path.unlink(missing_ok=True)
        self._stopped.set()

    def _sasl_for(self, conn: AmqpConnection) -> SaslServer:
        users = self.users
        source = _host_of(conn.peer)
        encrypted = conn.encrypted
        passwords = users is not None and (encrypted or admission.passwords_in_clear(
            self.cfg.passwords_without_tls, source))
        return SaslServer(ServerPolicy(users.secret if users is not None else _no_secret, encrypted,
                                       conn.peer_common_name, self.cfg.allow_anonymous,
                                       passwords=passwords,
                                       decoy=users.decoy if users is not None else None,
                                       throttle=lambda user: self.throttle.wait(source, user, time.monotonic())))

    def reload(self) -> None:
        """SIGHUP: re-read the client listener's TLS files and the users file (for new logins)."""
        if self.client_tls is not None:
            self.client_tls.reload()
        if self.users is not None:
            self.users.reload()
        if self.policy is not None:
            try:
                self.policy = load_policy(Path(self.cfg.policy_file))
                log.info("policy.reloaded file=%s", self.cfg.policy_file)
            except PolicyError as exc:
                log.error("policy.reload_failed error=%s (the previous policy stays in force)", exc)

    def _make_connection(self) -> AmqpConnection:
        assert self.engine is not None
        conn = ClientConnection(self.engine, self, server=True, container_id=f"oncemesh-router-{self.id}",
                              idle_timeout=self.cfg.idle_timeout, max_frame=self.cfg.max_frame,
                              properties={PROP_ROUTER: self.id}, offered_capabilities=ROUTER_CAPABILITIES,
                              sasl=self._sasl_for if self.client_auth else None)
        conn.ctx = ConnCtx()
        if self._pass_budget:  # one connection's work per loop pass is bounded (common/passrules.py, rule 5)
            conn.budget = PassBudget()
        # (connections not yet logged in and open have their own limits: they never fill this one)
        if len(self.connections) - len(self.preauth) >= self.cfg.max_connections:
            log.warning("connection.refused reason=max_connections limit=%d", self.cfg.max_connections)
            conn.ctx.refused = True
            conn.close(errors.ResourceLimitExceeded.condition,
                       f"router {self.id} holds its maximum of {self.cfg.max_connections} connections")
        self.connections.add(conn)
        return conn

    LINKS_CLOSE_GRACE = 1.0  # seconds a connection closed for its links has for the close to go out

    # ------------------------------------------------------------------ drain
    DRAIN_CHECK = 0.05  # seconds between looks while draining

    @property
    def draining(self) -> bool:
        """Draining (SIGUSR1): it takes no new clients and exits soon."""
        return self._drain is not None

    def begin_drain(self) -> None:
        """SIGUSR1 (`oncemesh drain`): stop taking new work, move every client to another router, wait
        until nothing depends on this router (or `drain_timeout`), then stop (router/drain.py)."""
        if self._drain is not None or self._stopped.is_set() or self.engine is None:
            log.info("router.drain_ignored id=%s reason=%s", self.id,
                     "already draining" if self._drain is not None else "not running")
            return
        now = time.time()
        self._drain = Drain(now, self.cfg.drain_timeout, self.cfg.drain_grace)
        self.core.set_draining()
        for d, link in self.pub_deliveries.items():
            self._drain_waits.setdefault(link.conn, set()).add(d)
        targets = self.mesh.redirect_targets() if self.mesh is not None else []
        log.warning("router.drain_started id=%s timeout_s=%g grace_s=%g connections=%d publisher_deliveries=%d "
                    "redirect_to=%s", self.id, self.cfg.drain_timeout, self.cfg.drain_grace, len(self.connections),
                    len(self.pub_deliveries), ",".join(f"{r}={u}" for r, u in targets) or "(no neighbour known)")
        self._drain_check()

    def _redirect_to(self) -> tuple[str, dict[Any, Any] | None]:
        """The description and info fields of a redirect: to the best live neighbour whose client
        address is known, else to no address in particular."""
        targets = self.mesh.redirect_targets() if self.mesh is not None else []
        for rid, url in targets:
            try:
                return (f"router {self.id} is draining (a restart or an upgrade): connect to router {rid} at "
                        f"{url}", redirect_info(url, rid))
            except ValueError:
                continue
        return f"router {self.id} is draining (a restart or an upgrade): connect to another router", None

    def _redirect(self, conn: AmqpConnection, why: str) -> None:
        description, info = self._redirect_to()
        log.info("connection.redirected peer=%s container=%s reason=%s", conn.peer,
                 conn.ctx.container if isinstance(conn.ctx, ConnCtx) else None, why)
        conn.close(errors.Redirect.condition, description, info)

    def _drain_dependents(self, connections: int) -> Dependents:
        mesh = self.mesh.drain_facts() if self.mesh is not None else {}
        return Dependents(connections=connections, publisher_deliveries=len(self.pub_deliveries),
                          **core_dependents(self.core), **mesh)

    def _drain_check(self) -> None:
        drain = self._drain
        if drain is None or self._stopped.is_set():
            return
        now = time.time()
        try:
            self.drain()  # what the core decided so far goes out first
            open_pubs = self.pub_deliveries
            conns = {c: ConnView(sum(1 for d in self._drain_waits.get(c, ()) if d in open_pubs),
                                 any(isinstance(lk.ctx, SubLinkCtx) for lk in c.links.values()))
                     for c in self.connections if c not in self._drain_told and not c.closed}
            phase = drain.phase
            step = drain.step(now, conns, self._drain_dependents(len(conns)))
            for conn in step.close:
                assert isinstance(conn, AmqpConnection)
                self._drain_told.add(conn)
                self._drain_waits.pop(conn, None)
                self._redirect(conn, "draining")
            if step.close:
                self.drain()
            if now - self._drain_logged >= 1.0 or step.done or phase is not drain.phase:
                self._drain_logged = now
                st = drain.status(now)
                log.info("router.draining id=%s phase=%s seconds=%.1f redirected=%d waiting_for=%s", self.id,
                         st["phase"], now - drain.started, drain.redirected,
                         ",".join(f"{k}:{v}" for k, v in drain.waiting_for(now).items()) or "-")
                self._maybe_write_status(force=True)
        except Exception:  # supervision point: a failed look must not leave the router half drained
            log.exception("router.drain_check_failed id=%s", self.id)
            if now >= drain.deadline:  # (and a look that keeps failing must not keep it for ever)
                self.request_stop()
                return
            step = None
        if step is not None and step.done:
            self._drain_finished()
            return
        assert self.engine is not None
        self.engine.loop.call_later(self.DRAIN_CHECK, self._drain_check)

    def _drain_report_path(self) -> Path | None:
        """Where the drain's report goes (named in the status file while it drains)."""
        where = self.cfg.state_dir or self.cfg.log_dir
        return where / f"{self.id}.drain.json" if where is not None else None

    def _drain_finished(self) -> None:
        drain = self._drain
        assert drain is not None and drain.report is not None
        rep = drain.report
        if drain.phase is DrainPhase.DRAINED:
            log.warning("router.drained id=%s seconds=%.2f redirected=%d dependents_left=%s", self.id, rep.seconds,
                        rep.redirected, ",".join(f"{k}:{v}" for k, v in rep.dependents.items()) or "-")
        else:
            log.error("router.drain_timeout id=%s seconds=%.2f redirected=%d still_depending=%s (it stops all the "
                      "same: what it held is repaired as after a crash, see docs/operations.md)", self.id,
                      rep.seconds, rep.redirected, ",".join(f"{k}:{v}" for k, v in rep.remaining.items()))
        path = self._drain_report_path()
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".json.tmp")
                tmp.write_text(json.dumps({"id": self.id, "incarnation": self.incarnation, "pid": os.getpid(),
                                           "started": drain.started, "finished": time.time(),
                                           **asdict(rep)}) + "\n")
                os.replace(tmp, path)
            except OSError as exc:
                log.error("router.drain_report_not_written error=%s", exc)
        self.request_stop()

    # ------------------------------------------------------------------ time
    def _schedule_tick(self) -> None:
        loop = asyncio.get_running_loop()
        self._tick_due = loop.time() + self.cfg.tick_interval
        self._tick_handle = loop.call_later(self.cfg.tick_interval, self._on_tick)

    def _maybe_trim_pools(self, now: float) -> None:
        every = self.cfg.delivery_pool_trim_interval
        if every <= 0 or self.engine is None or now < self._pools_trimmed + every:
            return
        self._pools_trimmed = now
        freed = self.engine.trim_delivery_pools(self.cfg.delivery_pool_keep)
        if freed:
            log.debug("router.delivery_pools_trimmed freed=%d", freed)

    def _measure_lag(self) -> bool:
        """How late this tick runs. Returns True when a minute's summary was completed."""
        lag = asyncio.get_running_loop().time() - self._tick_due
        done, stall = self.lag.sample(lag, time.monotonic())
        if stall:
            log.warning("router.loop_stall lag_ms=%.0f (the event loop ran nothing else meanwhile; past "
                        "idle_timeout=%gs connections close)", lag * 1000, self.cfg.idle_timeout)
        if done is not None:
            self._log_lag(done)
        return done is not None

    def _log_lag(self, s: LagSummary) -> None:
        log.info("router.loop_lag window_s=%g samples=%d max_ms=%.1f p99_ms=%.1f gc_pause_max_ms=%.1f",
                 self.lag.window, s.samples, s.max_ms, s.p99_ms, s.gc_max_ms)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """gc.callbacks: time every collection (a long one is a stall no code path explains)."""
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        pause = time.perf_counter() - self._gc_started
        done = self.lag.gc_pause(pause, time.monotonic())
        if pause >= self.lag.stall:
            log.warning("router.gc_pause ms=%.0f generation=%s collected=%s", pause * 1000,
                        info.get("generation"), info.get("collected"))
        if done is not None:
            self._log_lag(done)

    def _on_tick(self) -> None:
        try:
            window_done = self._measure_lag()
            now = time.time()
            if self.mesh is not None:
                self.mesh.tick(now)  # ticks the core too (expiry only while the mesh is whole)
            else:
                self.core.tick(now)
            if self.mqtt is not None:
                self.mqtt.tick(now)
            self.drain()
            self._expire_preauth(time.monotonic())
            if self.heap_probe is not None:
                self.heap_probe.maybe_sample(time.monotonic())
            mono = time.monotonic()
            self._maybe_trim_pools(mono)
            # The log's flush and the status go in passes of their own, one after the other: what
            # the network brought meanwhile is handled in between, a message waits for one of the
            # three parts, not for all of them (each took 1-3 ms at 1,000 msg/s: a tail of the
            # latency; docs/performance.md, "Latency"). Only when they have something to do: a
            # pass costs a poll and the loop's bookkeeping, and most ticks have neither a line
            # buffered nor a status due (docs/performance.md, "A quiet router (item 2)")
            if self.slog.flush_due(mono):
                asyncio.get_running_loop().call_soon(self._tick_flush, window_done)
            elif window_done or self._status_due(mono):
                asyncio.get_running_loop().call_soon(self._tick_status, window_done)
        except Exception:  # supervision point for timers
            log.exception("router.tick_failed")
        self._schedule_tick()

    def _tick_flush(self, window_done: bool) -> None:
        try:
            self.slog.flush()
        except Exception:  # supervision point for timers
            log.exception("router.tick_failed")
        if window_done or self._status_due(time.monotonic()):
            asyncio.get_running_loop().call_soon(self._tick_status, window_done)

    def _tick_status(self, force: bool) -> None:
        try:
            self._maybe_write_status(force=force)
        except Exception:  # supervision point for timers
            log.exception("router.tick_failed")

    # ------------------------------------------------------------------ admission
    def on_transport_up(self, conn: AmqpConnection) -> None:
        """A client's TCP (and TLS) connection is up: it holds a pre-authentication slot until its
        AMQP open, at most `auth_timeout` (router/admission.py)."""
        ctx = conn.ctx
        if ctx.opened or conn.closed:
            return
        why = self.preauth.arrive(conn, _host_of(conn.peer), time.monotonic())
        if why is not None:
            self.stats_refusals["preauth_refused"] += 1
            limit = self.cfg.max_preauth_per_source if why == "preauth_per_source" else self.cfg.max_preauth_connections
            log.warning("connection.refused peer=%s reason=%s limit=%d (connections not yet logged in and open)",
                        conn.peer, why, limit)
            ctx.refused = True
            conn.abort()

    def _expire_preauth(self, now: float) -> None:
        """Close the connections that have not logged in and opened within `auth_timeout`."""
        for conn in self.preauth.expired(now):
            self.preauth.leave(conn)
            self.stats_refusals["auth_timeouts"] += 1
            sasl = conn.sasl
            stage = ("sasl" if isinstance(sasl, SaslServer) and not sasl.done else "open")
            log.warning("connection.auth_timeout peer=%s stage=%s timeout_s=%g (no %s within auth_timeout: "
                        "closed)", conn.peer, stage, self.cfg.auth_timeout,
                        "login" if stage == "sasl" else "AMQP open")
            conn.ctx.refused = True
            conn.abort()

    def _record_login(self, conn: AmqpConnection) -> None:
        """A connection that ends: a password login that failed counts for the throttle."""
        sasl = conn.sasl
        if not isinstance(sasl, SaslServer) or sasl.login is None or sasl.throttled:
            return
        if sasl.done and sasl.user is None and sasl.mechanism in (SCRAM, PLAIN):
            self.throttle.failed(_host_of(conn.peer), sasl.login, time.monotonic())

    # ------------------------------------------------------------------ engine events
    def on_connection_open(self, conn: AmqpConnection) -> None:
        conn.ctx.container = conn.remote_container
        conn.ctx.opened = True
        self.preauth.leave(conn)
        if conn.ctx.refused:  # (closed as it came: its open is answered with the close, nothing else)
            return
        sasl = conn.sasl
        if isinstance(sasl, SaslServer) and sasl.user is not None and sasl.login is not None:
            self.throttle.succeeded(sasl.login)
        if self._drain is not None:
            self._redirect(conn, "new connection")
            return
        if self.policy is None:
            return
        user, host = self._user(conn), conn.peer.rsplit(":", 1)[0]
        why = self.count_connection(user, host)
        if why is not None:
            conn.ctx.refused = True
            conn.close(errors.ResourceLimitExceeded.condition, why)
            return
        conn.ctx.counted = (user, host)

    def count_connection(self, user: str, host: str) -> str | None:
        """Count a connection of `user` from `host` against the policy's max_connections and
        max_connections_per_host (AMQP and MQTT alike); the refusal's text when one is full (then
        nothing is counted, the refusal logged). `uncount_connection` when it ends."""
        grants = self.grants_for(user)
        for what, count, limit in (() if grants is None else (
                ("user", self._conns_by_user.get(user, 0), grants.limit("max_connections")),
                ("host", self._conns_by_host.get((user, host), 0), grants.limit("max_connections_per_host")))):
            if limit is not None and count >= limit:
                self.stats_refusals["limited_connections"] += 1
                log.warning("connection.refused reason=max_connections_per_%s user=%s host=%s limit=%d", what, user,
                            host, limit)
                return f"user {user!r} holds its maximum of {limit} connections" + (
                    f" from {host}" if what == "host" else "")
        self._conns_by_user[user] = self._conns_by_user.get(user, 0) + 1
        self._conns_by_host[(user, host)] = self._conns_by_host.get((user, host), 0) + 1
        return None

    def uncount_connection(self, user: str, host: str) -> None:
        self._conns_by_user[user] -= 1
        self._conns_by_host[(user, host)] -= 1

    # ------------------------------------------------------------------ authorization
    def _user(self, conn: AmqpConnection) -> str:
        return conn.user or "anonymous"

    def grants(self, conn: AmqpConnection) -> Grants | None:
        """What the connection's user may do (None: no policy, everything)."""
        return self.grants_for(self._user(conn))

    def grants_for(self, user: str) -> Grants | None:
        """What `user` ("anonymous" without credentials) may do (None: no policy, everything)."""
        if self.policy is None:
            return None
        return self.policy.grants(user, self.users.groups(user) if self.users is not None else ())

    def _authorize_subscriber(self, conn: AmqpConnection, topic: str, sid: str, known: Subscription | None) -> None:
        # only its owner attaches to a live subscription: the core's rule (an unauthenticated
        # connection, on an open router of a mixed mesh, is no identity: it never matches an owner
        # that logged in elsewhere)
        self.core.refuse_owner(sid, conn.user or "")
        grants = self.grants(conn)
        if grants is None:
            return
        if not grants.may_subscribe(topic):
            raise errors.UnauthorizedAccess(f"user {self._user(conn)!r} may not subscribe to {topic!r} "
                                            f"(policy {self.policy.source if self.policy else ''})")
        limit = grants.limit("max_subscriptions")
        if limit is not None and (known is None or not known.live):
            owned = sum(1 for s in self.core.table.live() if s.owner == self._user(conn))
            if owned >= limit:
                raise errors.ResourceLimitExceeded(f"user {self._user(conn)!r} holds its maximum of {limit} "
                                                   f"subscriptions")

    def on_link_open(self, link: Link) -> None:
        if not link.local_uninit:
            return
        ctx = link.conn.ctx
        if ctx.refused:  # a refused connection does nothing (its attaches came right behind its open)
            return
        if self._too_many_links(link):
            return
        if self._drain is not None:  # nothing new attaches to a router that is leaving
            description, info = self._redirect_to()
            log.info("link.redirected peer=%s container=%s link=%s", link.conn.peer, link.conn.ctx.container,
                     link.name)
            link.close(errors.LinkRedirect.condition, description, info=info)
            return
        self.drain()
        try:
            if self.management.claims(link):  # $management: requests and replies (router/mgmtlink.py)
                pass
            elif link.is_sender:
                self._open_subscriber(link)
            else:
                self._open_publisher(link)
        except (errors.RemoteProtocolError, errors.ResourceLimitExceeded, errors.LinkRedirect) as exc:
            if exc.condition == errors.UnauthorizedAccess.condition:
                self.stats_refusals["unauthorized_attaches"] += 1
            elif isinstance(exc, errors.ResourceLimitExceeded):
                self.stats_refusals["limited_attaches"] += 1
            log.warning("link.refused peer=%s container=%s link=%s condition=%s reason=%s", link.conn.peer,
                        link.conn.ctx.container, link.name, exc.condition, exc)
            link.close(exc.condition, str(exc), info=self._home_info(link) if isinstance(exc, errors.LinkRedirect)
                       else None)
        self.drain()

    def _home_info(self, link: Link) -> dict[Any, Any] | None:
        """The info of a redirect to the router where the subscription `link` asked to join has its
        members (a shared one: router/groups.py), when its client address is known."""
        att = link.ctx.attach_args if isinstance(link.ctx, SubLinkCtx) else None
        sub = self.core.table.get(att.sid) if att is not None else None
        url = self.mesh.client_url(sub.home) if sub is not None and self.mesh is not None else None
        if sub is None or not url:
            return None
        try:
            return redirect_info(url, sub.home)
        except ValueError:
            return None

    def _too_many_links(self, link: Link) -> bool:
        """Refuse an attach beyond the connection's link limit (`max_links_per_connection`, or the
        user's in the policy if lower): logged once per connection, counted every time."""
        conn = link.conn
        limit = self.cfg.max_links_per_connection
        grants = self.grants(conn)
        own = grants.limit("max_links_per_connection") if grants is not None else None
        if own is not None:
            limit = min(limit, own)
        held = len(conn.links)  # (the links Proton holds for it, this one and refused ones not yet detached)
        if held <= limit:
            return False
        ctx = conn.ctx
        ctx.links_refused += 1
        self.stats_refusals["limited_links"] += 1
        if ctx.links_refused == 1:
            log.warning("link.refused peer=%s container=%s link=%s condition=%s reason=max_links_per_connection "
                        "limit=%d (further refusals on this connection are counted, not logged)", conn.peer,
                        ctx.container, link.name, errors.ResourceLimitExceeded.condition, limit)
        link.close(errors.ResourceLimitExceeded.condition,
                   f"this connection holds its maximum of {limit} links (max_links_per_connection): detach some "
                   f"or open another connection")
        if held > 2 * limit and not ctx.refused:
            # A peer that keeps attaching past its refusals: Proton's work per attach grows with the
            # links a session holds (refused ones too, until the peer detaches them), so the
            # connection goes, and nothing more of it is read.
            ctx.refused = True
            log.warning("connection.closed_for_links peer=%s container=%s links=%d limit=%d (it kept attaching "
                        "past its refusals)", conn.peer, ctx.container, held, limit)
            conn.close(errors.ResourceLimitExceeded.condition,
                       f"{held} links attached, twice the maximum of {limit} (max_links_per_connection)")
            if conn.sock is not None:
                conn.sock.pause_reading()
                assert self.engine is not None
                self.engine.loop.call_later(self.LINKS_CLOSE_GRACE, conn.abort)  # (if the peer never answers)
        return True

    def _open_subscriber(self, link: Link) -> None:
        container = link.conn.ctx.container or ""
        shared: tuple[str, str] | None = None  # a shared subscription's (scope, name): router/groups.py
        caps: tuple[str, ...] = ()
        if link.remote_source_null:
            found = self._lookup(link, container)
            topic, expiry = found.topic, found.expiry
            if found.sid == shared_subscription_id(found.container, found.link, found.topic):
                shared = (found.container, found.link)
                caps = (SHARED,) if found.container else (SHARED, GLOBAL)
        else:
            caps = link.remote_source_capabilities
            shared = group_key(link.name, caps, container)
            topic = validate_address(link.remote_source_address, "source")
            policy = link.remote_source_expiry_policy
            timeout = float(link.remote_source_timeout)
            expiry = math.inf if policy == F.EXPIRE_NEVER else min(timeout, self.cfg.max_expiry)
        if link.remote_snd_settle_mode == F.SND_SETTLED:
            raise errors.NotImplementedMode(
                "pre-settled delivery (snd-settle-mode settled) is at-most-once; oncemesh delivers "
                "unsettled so that every message is acknowledged exactly once")
        if link.remote_source_dynamic:
            raise errors.NotImplementedMode("dynamic sources are not supported; name a topic")
        props = link.remote_properties
        capable = bool(props.get(PROP_CLIENT))
        presented = props.get(PROP_RESUME)
        if presented is not None and not isinstance(presented, list | tuple):
            raise errors.RemoteProtocolError(f"link property {PROP_RESUME} must be a list of ids")
        if presented and len(presented) > self.cfg.max_presented:
            raise errors.ResourceLimitExceeded(
                f"{len(presented)} ids presented in {PROP_RESUME}; at most {self.cfg.max_presented} per attach")
        if presented and len(self.core.placeholders) + len(presented) > self.cfg.max_placeholders:
            raise errors.ResourceLimitExceeded(
                f"this router holds {len(self.core.placeholders)} presented ids that no message matched yet "
                f"(max_placeholders {self.cfg.max_placeholders}); attach again later")
        handed_last = props.get(PROP_HANDED_LAST)
        if handed_last is not None and not isinstance(handed_last, list | tuple):
            raise errors.RemoteProtocolError(f"link property {PROP_HANDED_LAST} must be a list of ids")
        last = tuple(str(g) for g in handed_last) if handed_last else ()
        selector, filters = source_selector(link.remote_source_filter)
        self.core.refuse_filter(topic, selector)
        sid = subscription_id(container, link.name, topic)
        member = ""
        if shared is not None:
            member, sid = sid, shared_subscription_id(shared[0], shared[1], topic)
        known = self.core.table.get(sid)
        self._authorize_subscriber(link.conn, topic, sid, known)
        if (known is None or not known.live) and len(self.core.table) >= self.cfg.max_subscriptions:
            raise errors.ResourceLimitExceeded(
                f"the subscription table holds {len(self.core.table)} subscriptions (max_subscriptions "
                f"{self.cfg.max_subscriptions}); end some, or raise the limit")
        lid = member or sid  # (the link's id with the core, and in sub_links)
        old = self.sub_links.get(lid)
        if old is not None and old is not link:
            log.info("link.stolen sid=%s old_peer=%s new_peer=%s", lid, old.conn.peer, link.conn.peer)
            self._forget_sub_link(old)
            old.close(errors.LinkStolen.condition, "the same subscription attached on another link")
        link.ctx = SubLinkCtx(lid, topic, sid)
        self.sub_links[lid] = link
        ids = [str(g) for g in presented] if presented else None
        epoch = props.get(PROP_EPOCH)
        epoch = int(epoch) if isinstance(epoch, int) and epoch > 0 else None
        if shared is not None:
            att = SubscriberAttach(sid, topic, shared[0], shared[1], expiry, capable, ids, epoch, last,
                                   link.conn.user or "", selector, member, link.name)
        else:
            att = SubscriberAttach(sid, topic, container, link.name, expiry, capable, ids, epoch, last,
                                   link.conn.user or "", selector)
        link.ctx.attach_args = att
        try:
            link.ctx.resumed = self.core.attach(link, att, time.time())
        except errors.RelayMember as exc:
            if self.mesh is None:
                self._forget_sub_link(link)
                raise
            # a member of a shared subscription homed at a reachable router: relayed there; its
            # ATTACH is answered once the home took it (`relay_outputs`)
            link.ctx.relayed = True
            self.mesh.relay_attach(link, att, exc.home, time.time())
            log.info("link.relayed sid=%s member=%s home=%s", sid, member, exc.home)
        except errors.OncemeshError:
            self._forget_sub_link(link)
            raise
        link.set_source(topic, 0 if math.isinf(expiry) else int(expiry),
                        F.EXPIRE_NEVER if math.isinf(expiry) else F.EXPIRE_WITH_LINK)
        if filters:
            link.set_source_filter(filters)  # (the filters applied, as the peer sent them)
        if shared is not None:
            link.set_source_capabilities(tuple(c for c in caps if c in (SHARED, GLOBAL)))
        link.set_target(link.remote_target_address)
        link.set_settle_modes(F.SND_UNSETTLED, link.remote_rcv_settle_mode)
        # the attach is answered once the table holding the subscription is on disk (and, in a
        # mesh, once the other routers acknowledged it): see _answer_subscriber
        if not link.ctx.relayed:
            self._pending_opens.append(link)

    def _lookup(self, link: Link, container: str) -> Subscription:
        """A receiver attach with no source looks up the subscription its container holds under the
        link's name (AMQP's way to find a terminus by link name; Qpid JMS unsubscribes so: it
        attaches, reads the source we answer with, and closes the link, which ends it). The attach
        is then that subscription's, with its topic and expiry. None or several: refused with a
        null source (nothing is created)."""
        name = link.name.split(NAME_DELIMITER, 1)[0]  # (a shared subscription's: router/groups.py)
        found = [s for s in self.core.table.live() if (s.container == container and s.link == link.name) or (
            s.link == name and s.container in (container, "")
            and s.sid == shared_subscription_id(s.container, s.link, s.topic))]
        log.info("subscription.lookup container=%s link=%s found=%s", container, link.name,
                 ",".join(s.sid for s in found) or "none")
        if len(found) == 1:
            return found[0]
        link.set_no_source()
        if not found:
            raise errors.NotFound(f"no subscription named {link.name!r} for container {container!r} (an attach with "
                                  f"no source looks one up; to subscribe, name the topic as the source address)")
        raise errors.InvalidAddress(f"container {container!r} holds {len(found)} subscriptions named {link.name!r} "
                                    f"(topics {', '.join(sorted(s.topic for s in found))}): name the topic as the "
                                    f"source address")

    def _open_publisher(self, link: Link) -> None:
        # a target without an address is the anonymous relay: each message names its topic in `to`
        relay = not link.remote_target_address and not link.remote_target_dynamic
        topic = "" if relay else validate_address(link.remote_target_address, "target")
        if link.remote_snd_settle_mode == F.SND_SETTLED:
            raise errors.NotImplementedMode(
                "pre-settled publishing (snd-settle-mode settled) gives no outcome; publish unsettled "
                "(receiver-settle-mode second for exactly-once)")
        if link.remote_target_dynamic:
            raise errors.NotImplementedMode("dynamic targets are not supported; name a topic")
        container = link.conn.ctx.container or ""
        plid = publisher_link_id(container, link.name)
        props = link.remote_properties
        in_doubt = props.get(PROP_IN_DOUBT)
        if in_doubt is not None and not isinstance(in_doubt, list | tuple):
            raise errors.RemoteProtocolError(f"link property {PROP_IN_DOUBT} must be a list of tags")
        mark = props.get(PROP_NEXT_SEQ)
        if mark is not None and (isinstance(mark, bool) or not isinstance(mark, int) or mark < 0):
            raise errors.RemoteProtocolError(f"link property {PROP_NEXT_SEQ} must be a non-negative integer")
        past = props.get(PROP_CAUSAL_PAST)
        if past is not None and not (isinstance(past, list | tuple) and len(past) <= MAX_CAUSAL_PAST and all(
                isinstance(e, list | tuple) and len(e) == 2 and all(isinstance(x, str) for x in e) for e in past)):
            raise errors.RemoteProtocolError(f"link property {PROP_CAUSAL_PAST} must be a list of at most "
                                             f"{MAX_CAUSAL_PAST} [gid, topic] pairs of strings")
        identity = props.get(PROP_IDENTITY)
        if identity is not None and identity not in IDENTITIES:
            raise errors.RemoteProtocolError(f"link property {PROP_IDENTITY} must be one of "
                                             f"{', '.join(map(repr, IDENTITIES))}, got {identity!r}")
        by_id = identity == MESSAGE_ID
        if by_id and in_doubt is not None:
            raise errors.RemoteProtocolError(f"link property {PROP_IN_DOUBT} names tags: a link identified by "
                                             f"message-id ({PROP_IDENTITY}) declares none")
        second = link.remote_rcv_settle_mode == F.RCV_SECOND
        grants = self.grants(link.conn)
        max_size = self.cfg.max_message_size
        if grants is not None:
            if not relay and not grants.may_publish(topic):
                raise errors.UnauthorizedAccess(f"user {self._user(link.conn)!r} may not publish to {topic!r} "
                                                f"(policy {self.policy.source if self.policy else ''})")
            max_size = min(max_size, grants.limit("max_message_size") or max_size)
        link.ctx = PubLinkCtx(topic, plid, bool(props.get(PROP_RECEIVED)), max_size)
        link.set_target(topic or None)
        link.set_source(link.remote_source_address)
        link.set_settle_modes(F.SND_UNSETTLED, F.RCV_SECOND if second else F.RCV_FIRST)
        link.set_max_message_size(max_size)
        link.set_properties({PROP_ROUTER: self.id})
        link.open()
        tags = in_doubt_tags(in_doubt) if in_doubt is not None else None
        self.core.attach_publisher(link, plid, topic, second, tags, time.time(),
                                   int(mark) if mark is not None and tags is not None else None, client=container,
                                   past=[(str(g), str(t)) for g, t in past or ()], by_id=by_id,
                                   user=self._user(link.conn))

    def on_credit(self, link: Link) -> None:
        ctx = link.ctx
        if self.core.out:
            # Deliver actions not yet performed are not in Proton's count yet: perform them before
            # the core's credit is set from it, or it would send them twice over (found by a fast
            # publisher against a slow durable subscriber: the link's credit went negative)
            self.drain()
        credit = link.credit  # Proton's: the peer's grant less what we sent, counting transfers not yet written
        if credit < -link.queued:
            # Proton keeps credit in a signed 32-bit int: a grant past 2**31-1 wraps negative and the
            # link would stall silently. Refuse it with a condition the peer can act on. (A grant
            # the peer lowered below what is already queued for it is legal: at most -queued.)
            log.warning("link.abusive_credit peer=%s link=%s credit=%d", link.conn.peer, link.name, credit)
            if isinstance(ctx, SubLinkCtx) and self.sub_links.get(ctx.sid) is link:
                self._forget_sub_link(link)
                self._sub_detach(link, ctx, False, time.time(), clean=False)
            link.close(errors.RemoteProtocolError.condition, "link-credit beyond 2147483647 is not supported")
            self.drain()
            return
        if isinstance(ctx, SubLinkCtx) and self.sub_links.get(ctx.sid) is link and not link.local_uninit:
            # (a drain is answered by the core whenever nothing more can be sent: `DrainCredit`)
            self._sub_credit(ctx, max(credit, 0), link.draining)
            # what the credit let go is performed at the end of the pass, with the rest of the
            # pass's actions (a drain of its own here was one more per credit frame; a later
            # credit frame of this pass performs them first, above)
            if not self._drain_scheduled:
                self._drain_later()

    def on_message(self, link: Link, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None:
        ctx = link.ctx
        if not isinstance(ctx, PubLinkCtx):
            if isinstance(ctx, MgmtCtx):
                self.management.on_request(link, delivery, payload, settled)
                return
            if not settled:
                amqp.update(delivery, F.REJECTED, (errors.NotAllowed.condition, "this link does not accept transfers"))
                amqp.settle(delivery)
            return
        if not payload:
            # No message (a bare message has a body section): Proton sends such a transfer for a
            # delivery its application settled after a reconnect (docs/clients.md). Taken for one,
            # it was handed to subscribers as nothing and ACCEPTED, or merged as the publisher's
            # settlement of a message in flight.
            log.warning("link.empty_transfer peer=%s link=%s settled=%s", link.conn.peer, link.name, settled)
            if not settled:
                amqp.update(delivery, F.REJECTED, (errors.DecodeError.condition, "an empty transfer is no message"))
                amqp.settle(delivery)
            link.close(errors.DecodeError.condition, "an empty transfer carries no message")
            return
        if len(payload) > ctx.max_size:
            log.warning("link.message_too_large peer=%s link=%s size=%d", link.conn.peer, link.name, len(payload))
            amqp.update(delivery, F.REJECTED, (errors.MessageTooLarge.condition,
                                                f"{len(payload)} bytes > max {ctx.max_size}"))
            amqp.settle(delivery)
            link.close(errors.MessageTooLarge.condition,
                       f"message of {len(payload)} bytes exceeds max-message-size {ctx.max_size}")
            return
        try:
            if not ctx.topic:
                self._relay(link, ctx, delivery, tag, payload, settled)
            elif settled:
                # pre-settled on a mixed link: the publisher wants no outcome; deliver it all the same
                token = object()
                self.core.publish(link, token, tag, payload, time.time())
                self.core.publisher_settled(token, time.time())
            else:
                self.pub_deliveries[delivery] = link
                ctx.deliveries.add(delivery)
                self.core.publish(link, delivery, tag, payload, time.time())
                if ctx.want_received:
                    amqp.update(delivery, F.RECEIVED)
        except errors.RemoteProtocolError as exc:
            log.warning("link.closed_on_error peer=%s link=%s condition=%s reason=%s", link.conn.peer,
                        link.name, exc.condition, exc)
            self.pub_deliveries.pop(delivery, None)
            ctx.deliveries.discard(delivery)
            if not settled:
                amqp.update(delivery, F.RELEASED)
                amqp.settle(delivery)
            self._close_publisher(link, exc.condition, str(exc))
        if not self._drain_scheduled:  # (checked here: three times per message)
            self._drain_later()

    def _relay(self, link: Link, ctx: PubLinkCtx, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None:
        """A message on an anonymous relay link: published to the topic its `to` names, as on a link
        attached to that topic, or REJECTED (the core says what a relay may not carry; the policy
        is asked here, per message, as it is per link at attach)."""
        topic = read_to(payload) or ""
        now = time.time()
        token = object() if settled else delivery
        if not settled:
            self.pub_deliveries[delivery] = link
            ctx.deliveries.add(delivery)
        grants = self.grants(link.conn)
        if grants is not None and topic and not grants.may_publish(topic):
            log.info("link.relay_refused peer=%s link=%s topic=%r reason=policy", link.conn.peer, link.name, topic[:64])
            self.core.refuse_transfer(link, token, (errors.UnauthorizedAccess.condition,
                                                    f"user {self._user(link.conn)!r} may not publish to {topic!r} "
                                                    f"(policy {self.policy.source if self.policy else ''})"))
            return
        gid = self.core.publish(link, token, tag, payload, now, topic=topic)
        if not gid:
            log.info("link.relay_refused peer=%s link=%s topic=%r", link.conn.peer, link.name, topic[:64])
        elif settled:
            self.core.publisher_settled(token, now)
        elif ctx.want_received:
            amqp.update(delivery, F.RECEIVED)

    def on_delivery_updates(self, link: Link, updates: list[tuple[Any, int, bool]]) -> None:
        """Consecutive updates of deliveries on one link, `(delivery, state, settled)` in the order
        they came (the engine's run of them: common/engine.py): those of a subscriber's current link
        go to the core in one call, the rest as `on_delivery_update` takes them one by one. The
        usual disposition (ACCEPTED, not settled) is read inline; any other by `_read_outcome`, as
        `on_delivery_update` reads it."""
        ctx = link.ctx
        if not isinstance(ctx, SubLinkCtx) or ctx.relayed or self.sub_links.get(ctx.sid) is not link:
            for d, state, settled in updates:
                self.on_delivery_update(link, d, state, settled)
            return
        gid_of = ctx.gid_of
        items: list[str | OutcomeItem] = []
        for d, state, settled in updates:
            gid = gid_of.get(d)
            if gid is None:
                if settled:
                    amqp.settle(d)
                continue
            if state == _ACCEPTED and not settled:  # (the usual: accepted, waiting for our settle)
                items.append(gid)
                continue
            item = _read_outcome(ctx, d, gid, state, settled)
            if item is not None:
                items.append(item)
        if items:
            self.core.subscriber_outcomes(ctx.sid, items, time.time())
            if not self._drain_scheduled:
                self._drain_later()

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None:
        ctx = link.ctx
        if isinstance(ctx, SubLinkCtx):
            gid = ctx.gid_of.get(delivery)
            if gid is None:
                if settled:
                    amqp.settle(delivery)
                return
            item: OutcomeItem | None
            if state == _ACCEPTED and not settled:  # (the usual: accepted, waiting for our settle)
                item = (gid, O_ACCEPTED, False, None, False)
            else:
                item = _read_outcome(ctx, delivery, gid, state, settled)
                if item is None:
                    return
            if self.sub_links.get(ctx.sid) is link:
                if ctx.relayed and self.mesh is not None:
                    self.mesh.relay_disposition(ctx.sid, *item, time.time())
                else:
                    self.core.subscriber_outcome(ctx.sid, *item, time.time())
                if not self._drain_scheduled:  # (checked here: three times per message)
                    self._drain_later()
        elif isinstance(ctx, PubLinkCtx) and settled and delivery in self.pub_deliveries:
            self.core.publisher_settled(delivery, time.time())  # -> SettlePublisher
            if not self._drain_scheduled:  # (checked here: three times per message)
                self._drain_later()

    def on_link_closed(self, link: Link, closed: bool, condition: tuple[str, str] | None) -> None:
        self.drain()  # what the core decided while the link was still there goes out first
        ctx = link.ctx
        if isinstance(ctx, SubLinkCtx):
            if condition:
                log.info("link.detached sid=%s closed=%s condition=%s", ctx.sid, closed, condition)
            if self.sub_links.get(ctx.sid) is link:
                self._forget_sub_link(link)
                self._sub_detach(link, ctx, closed, time.time(), clean=True)
        elif isinstance(ctx, PubLinkCtx):
            self._close_publisher(link, None, None)
        self.drain()

    def on_connection_closed(self, conn: AmqpConnection, condition: tuple[str, str] | None) -> None:
        self.drain()
        self.connections.discard(conn)
        if isinstance(conn.ctx, ConnCtx) and not conn.ctx.opened:
            self._closed_before_open(conn, condition)
        counted = conn.ctx.counted if isinstance(conn.ctx, ConnCtx) else None
        if counted is not None:
            conn.ctx.counted = None
            self.uncount_connection(*counted)
        now = time.time()
        for link in list(conn.links.values()):
            ctx = link.ctx
            if isinstance(ctx, SubLinkCtx):
                if self.sub_links.get(ctx.sid) is link:
                    self._forget_sub_link(link)
                    self._sub_detach(link, ctx, False, now, clean=False)
            elif isinstance(ctx, PubLinkCtx):
                self._close_publisher(link, None, None)
        if condition and condition[0] != errors.ConnectionForced.condition:
            log.info("connection.closed peer=%s container=%s condition=%s", conn.peer,
                     conn.ctx.container if conn.ctx else None, condition)
        self.drain()

    def _closed_before_open(self, conn: AmqpConnection, condition: tuple[str, str] | None) -> None:
        """A connection that ends before its AMQP open: every one is logged (an idle timeout, a
        failed login, a peer that left), once, with why."""
        was_pending = self.preauth.leave(conn)
        self._record_login(conn)
        if conn.ctx.refused and not was_pending:
            return  # (logged when refused or timed out)
        sasl = conn.sasl
        if isinstance(sasl, SaslServer) and sasl.done and sasl.user is None:
            if sasl.throttled:
                self.stats_refusals["logins_throttled"] += 1
            return  # (logged by the engine: connection.auth_failed)
        log.info("connection.closed_before_open peer=%s stage=%s condition=%s", conn.peer,
                 "sasl" if isinstance(sasl, SaslServer) and not sasl.done else "open", condition)

    def _forget_sub_link(self, link: Link) -> None:
        ctx = link.ctx
        if self.sub_links.get(ctx.sid) is link:
            del self.sub_links[ctx.sid]
        waiting = self._awaiting_mesh.get(ctx.table_sid)
        if waiting is not None and link in waiting:
            waiting.remove(link)
            if not waiting:
                del self._awaiting_mesh[ctx.table_sid]
        ctx.deliveries.clear()
        ctx.gid_of.clear()

    def _close_publisher(self, link: Link, condition: str | None, description: str | None) -> None:
        if link.ctx is None:
            return
        self.core.detach_publisher(link)
        # deliveries of a dead link cannot be answered: forget them (the publisher resends)
        for d in link.ctx.deliveries:
            self.pub_deliveries.pop(d, None)
        link.ctx = None
        if condition:
            link.close(condition, description)

    # ------------------------------------------------------------------ actions
    def _drain_later(self) -> None:
        """The hot handlers (transfers, dispositions, credit) leave the core's actions for one drain
        at the end of the loop pass: actions and log lines of every connection's input batch are
        performed together. Every other handler drains first, so actions keep their order."""
        if not self._drain_scheduled:
            self._drain_scheduled = True
            assert self.engine is not None
            self.engine.call_after_pass(self._deferred_drain)

    def _deferred_drain(self) -> None:
        self._drain_scheduled = False
        self.drain()

    def taking(self, taken: float) -> None:
        """Input taken at `taken` (a mesh frame's read) is about to make the core decide; its
        actions are performed and its log written by one drain at the end of the pass, with the
        rest of the pass's input (as a client's: `_drain_later`). What the core decided from input
        taken at another time is written first, stamped with that time: a router frozen between
        two reads must not date the first one's decisions after the freeze (docs/settlement-log.md,
        "Times"). (Frames of one read share its time: one comparison per frame.)"""
        if taken != self._decided:
            core = self.core
            if core.log and self._decided is not None:
                entries, core.log = core.log, []
                self._write_core_log(self._decided, entries)
            self._decided = taken
        if not self._drain_scheduled and self.engine is not None:
            self._drain_later()

    def drain(self, decided: float | None = None) -> None:
        """Perform the core's actions and write its log events.

        The events the core had decided when the drain began are written first, stamped with the
        time the input that made them was taken: `decided`, else the read of the mesh frames that
        wait for this drain (`taking`), else this pass's latest input (or the drain's start when
        the pass took none; the log never dates a line before the one it follows), not after their
        actions were performed: a router frozen (SIGSTOP) in between must not date a hand-over it
        decided before the freeze to after it, when its subscriber, gone meanwhile, may have
        accepted the message at another router (docs/settlement-log.md, "Times"). Events the
        actions made are stamped after them."""
        core = self.core
        if core.log:
            entries, core.log = core.log, []
            if decided is None:
                decided = self._decided
                if decided is None and self.engine is not None:
                    decided = self.engine.input_time()
            self._write_core_log(decided if decided is not None else time.time(), entries)
        self._decided = None
        while core.out:  # (a mesh action can make more: a number from a one-router sequencer group)
            out, core.out = core.out, []
            self._perform(out)
        if core.log:
            entries, core.log = core.log, []
            self._write_core_log(time.time(), entries)
        if self._pending_opens or self.table.version != self._saved_version:
            assert self.engine is not None
            self.engine.call_after_pass(self._after_pass)

    def _on_stall(self) -> None:
        """The process stalled (frozen, starved). What it reads now may be a peer's or a publisher's
        messages for a subscriber whose goodbye waits, unread, in a later read, or even in the next
        poll: that subscriber has failed over and may have accepted them at another router. Hand
        nothing over until the pass the edge's rules say (common/passrules.py, `HandoverHold`)."""
        assert self.engine is not None and self.engine.pass_clock is not None
        due = self.handover_hold.stalled(self.engine.pass_clock)
        if due is None:
            return
        self.core.hold_handovers()
        # (asked at the start of each pass, ahead of its reads, until the release is due; then the
        # release runs at that pass's end, after them)
        asyncio.get_running_loop().call_soon(self._arm_release, due)

    def _arm_release(self, due: int) -> None:
        assert self.engine is not None and self.engine.pass_clock is not None
        if not HandoverHold.release_due(due, self.engine.pass_clock):
            asyncio.get_running_loop().call_soon(self._arm_release, due)
            return
        self.engine.call_after_pass(self._release_handovers)

    def _release_handovers(self) -> None:
        # (always, even if a newer stall held them again meanwhile: a loop whose every pass is a
        # stall must not starve its subscribers; it then waits one pass, not one poll more)
        self.core.release_handovers()
        self.drain()

    def _write_core_log(self, stamp: float, entries: list[Any]) -> None:
        # the metrics' event counters, by Counter.update's C helper itself (update's own frame and
        # its isinstance test of an abstract Mapping cost about as much as the count, per pass)
        _count_elements(self.event_counts, map(_first, entries))
        self.slog.write_core_events(stamp, entries)  # flushes subscription lifecycle lines at once

    def _after_pass(self) -> None:
        self._save_table()
        opens, self._pending_opens = self._pending_opens, []
        for link in opens:
            if link.local_uninit and self.sub_links.get(link.ctx.sid) is link:
                if self.mesh is not None and self.mesh.attach_pending(link.ctx.table_sid):
                    # answered once the mesh acknowledged (several: a shared subscription's members)
                    self._awaiting_mesh.setdefault(link.ctx.table_sid, []).append(link)
                    continue
                self._answer_subscriber(link)
        if opens:
            self.drain()

    def _answer_subscriber(self, link: Link) -> None:
        """Answer a subscriber's ATTACH: from now on the subscription is in force."""
        ctx = link.ctx
        sub = self.table.get(ctx.table_sid)
        epoch = sub.epoch if sub is not None else 0
        link.set_properties({PROP_RESUMED: ctx.resumed, PROP_ROUTER: self.id, PROP_EPOCH: epoch})
        link.open()
        selective = ctx.attach_args is not None and bool(ctx.attach_args.selector)
        self.slog.write("resumed" if ctx.resumed else "subscribed", time.time(), None, ctx.topic, ctx.table_sid,
                        container=link.conn.ctx.container, link=link.name, count=epoch,
                        **({"info": SELECTIVE} if selective else {}))
        # (no flush here: this runs after the pass, and the engine's before_output hook writes the
        # log before the answer leaves; a flush per subscriber was a write per attach)
        self._sub_credit(ctx, link.credit, link.draining)

    def _sub_credit(self, ctx: SubLinkCtx, credit: int, drain: bool) -> None:
        if ctx.relayed and self.mesh is not None:
            self.mesh.relay_credit(ctx.sid, credit, drain, time.time())
        else:
            self.core.subscriber_credit(ctx.sid, credit, drain)

    def _sub_detach(self, link: Link, ctx: SubLinkCtx, closed: bool, now: float, clean: bool) -> None:
        if ctx.relayed and self.mesh is not None:
            self.mesh.relay_detach(link, ctx.sid, closed, clean, now)
        else:
            self.core.detach_subscriber(link, ctx.sid, closed, now, clean=clean)

    def _elsewhere(self, act: Deliver | SettleDelivery | DrainCredit | NotifyFinal | DetachLink) -> None:
        """A core action for a link that is not an AMQP one here: an MQTT session's (router/mqtt/), or
        a member another router relays to this one (interrouter/members.py), handed to the mesh."""
        if self.mqtt is not None and self.mqtt.perform(act):
            return
        if self.mesh is not None:
            self.mesh.perform_member(act)

    def relay_outputs(self, actions: list[Any], answered: list[str]) -> None:
        """What the relay of shared subscriptions' members decided (interrouter/members.py)."""
        self._perform(actions)
        if self.mqtt is not None and answered:
            self.mqtt.relay_answered(answered)
        for mid in answered:
            waiting = self.sub_links.get(mid)
            if waiting is not None and waiting.local_uninit:
                self._answer_subscriber(waiting)
        self.drain()

    def keeper_outputs(self, kept: list[tuple[str, int]], fetched: list[tuple[str, dict[str, Any] | None]],
                       lonely: list[str], orphaned: list[tuple[str, dict[str, Any]]]) -> None:
        """What the MQTT sessions' keepers answered (interrouter/keeper.py). A session kept here
        whose router is gone: this router declares for its publisher links what its client would
        (whether or not this router has an MQTT listener itself)."""
        if self.mqtt is not None and (kept or fetched or lonely):
            self.mqtt.keeper_outputs(kept, fetched, lonely)
        if orphaned:
            from .mqtt.resume import orphan_declarations  # (MQTT's modules load only where MQTT is used)
            now = time.time()
            for cid, image in orphaned:
                try:
                    decl = orphan_declarations(cid, image)
                except (KeyError, TypeError, ValueError) as exc:
                    log.error("mqtt.session_image_unreadable client=%s error=%s", cid, exc)
                    continue
                for d in decl:
                    self.core.publisher_gone(d.plid, d.in_doubt, d.mark, now)
                log.info("mqtt.session_orphaned client=%s: its router is out of reach; declared for its "
                         "publisher links what its client holds in doubt", cid)
            self.drain()

    def mesh_attach_done(self, sid: str, refused: str | None) -> None:
        """The mesh acknowledged (or refused) the announcement of a subscriber's attach."""
        if self.mqtt is not None:
            self.mqtt.attach_done(sid, refused)
        for link in self._awaiting_mesh.pop(sid, []):
            if self.sub_links.get(link.ctx.sid) is link and link.local_uninit:
                self._mesh_attach_done(link, refused)

    def _mesh_attach_done(self, link: Link, refused: str | None) -> None:
        sid = link.ctx.table_sid
        if refused is not None:
            # the old home ended this life meanwhile: it becomes a new subscription (a new life);
            # or another identity's life holds it: refused (the core detaches the link)
            assert link.ctx.attach_args is not None
            if not self.core.resume_refused(link, link.ctx.attach_args, time.time(), refused):
                self.drain()
                return
            log.info("subscription.resume_refused sid=%s reason=%s", sid, refused)
            link.ctx.resumed = False
            self._pending_opens.append(link)
            self.drain()
            return
        self._pending_opens.append(link)
        self.drain()

    def mesh_event(self, event: str, now: float, peer: str, info: str | None) -> None:
        """An event of the mesh layer for the settlement log: a neighbour up or down, a total-order
        stream's new view (interrouter.routerport.RouterPort)."""
        self.slog.write(event, now, peer=peer, info=info)

    def _settle_publisher_delivery(self, d: Any) -> None:
        link = self.pub_deliveries.pop(d)
        if isinstance(link.ctx, PubLinkCtx):
            link.ctx.deliveries.discard(d)
        amqp.settle(d)
        link.conn.touch()

    def save_table(self) -> None:
        """Write the subscription table if it changed (before a subscription is answered as in force)."""
        self._save_table()

    def _save_table(self, force: bool = False) -> None:
        if self.store is None or (self.table.version == self._saved_version and not force):
            return
        self.store.save(self.table.snapshot())
        self._saved_version = self.table.version

    def _perform(self, actions: list[Action]) -> None:
        """Perform a batch of the core's actions (one call per batch, not per action: four actions per
        message, and the calls cost ~1,400 instructions per message, measured)."""
        sub_links = self.sub_links
        pub_deliveries = self.pub_deliveries
        set_state = amqp.set_state
        settle = amqp.settle
        mesh_acts: list[MeshAction] | None = None
        # a fan-out's deliveries of one message come one after the other: its tag is encoded once
        tag_of = ""
        tag = b""
        for act in actions:
            # The commonest first. Not a `match`: a class pattern that fails costs an isinstance miss
            # (~700 instructions), and three of the four actions per message would miss at least once:
            # +4,300 instructions per message (2.5%) measured with `oncemesh bench --instructions`. The
            # classes are final, so mypy narrows `type(act) is C` and assert_never checks that every
            # action is handled.
            if type(act) is Deliver:
                link = sub_links.get(act.sid)
                if link is None:
                    self._elsewhere(act)
                    continue
                gid = act.gid
                if gid is not tag_of:
                    tag_of = gid
                    tag = gid.encode("ascii")
                d = link.send(tag, act.payload)
                ctx = link.ctx
                ctx.deliveries[gid] = d
                ctx.gid_of[d] = gid
            elif type(act) is SendOutcome:
                d = act.pub
                plink = pub_deliveries.get(d)
                if plink is None:
                    if self.mqtt is not None:
                        self.mqtt.perform(act)  # (an MQTT client's PUBLISH?)
                    continue
                if act.error is None:
                    set_state(d, _STATE_OF_OUTCOME[act.outcome])
                else:
                    amqp.update(d, _STATE_OF_OUTCOME[act.outcome], act.error)
                if act.outcome is O_ACCEPTED:  # (the common case: an attribute, ~440 instructions; an IntEnum
                    self.accepted_sent += 1     # list index costs ~670, measured under callgrind)
                else:
                    self.outcomes_sent[act.outcome] += 1
                conn = plink.conn
                if not conn.dirty:
                    conn.touch()
                if act.settle:
                    self._settle_publisher_delivery(d)
            elif type(act) is SettleDelivery:
                link = sub_links.get(act.sid)
                if link is None:
                    self._elsewhere(act)
                    continue
                ctx = link.ctx
                d = ctx.deliveries.pop(act.gid, None)
                if d is not None:
                    del ctx.gid_of[d]
                    settle(d)
                    conn = link.conn
                    if not conn.dirty:
                        conn.touch()
            elif type(act) is SettlePublisher:  # (_settle_publisher_delivery, inlined)
                d = act.pub
                plink = pub_deliveries.pop(d, None)
                if plink is not None:
                    if isinstance(plink.ctx, PubLinkCtx):
                        plink.ctx.deliveries.discard(d)
                    settle(d)
                    conn = plink.conn
                    if not conn.dirty:
                        conn.touch()
            elif type(act) is GrantCredit:
                link = act.link
                if link.ctx is not None and link.local_active:
                    link.flow(act.credit)
            elif type(act) is DrainCredit:
                link = self.sub_links.get(act.sid)
                if link is not None:
                    link.drained()
                else:
                    self._elsewhere(act)
            elif type(act) is NotifyFinal:
                link = self.sub_links.get(act.sid)
                if link is None:
                    self._elsewhere(act)
                    continue
                ctx = link.ctx
                ctx.final_seq += 1
                body = Message(subject=FINAL_SUBJECT, body=list(act.gids)).encode()
                link.send(f"{FINAL_TAG_PREFIX}{ctx.final_seq}".encode(), body, settled=True)
            elif type(act) is DetachLink:
                dlink: Link = act.link
                if not isinstance(dlink, Link):
                    self._elsewhere(act)
                    continue
                if self.sub_links.get(act.sid) is dlink:
                    self._forget_sub_link(dlink)
                if act.condition == errors.UnauthorizedAccess.condition:  # another identity's life holds it
                    self.stats_refusals["unauthorized_attaches"] += 1
                    log.warning("link.refused peer=%s container=%s link=%s condition=%s reason=%s", dlink.conn.peer,
                                dlink.conn.ctx.container, dlink.name, act.condition, act.description)
                dlink.close(act.condition, act.description,
                            info=self._home_info(dlink) if act.condition == errors.LinkRedirect.condition else None)
            elif isinstance(act, MeshAction):  # (the union made once, in actions.py: not per action)
                if mesh_acts is None:
                    mesh_acts = [act]
                else:
                    mesh_acts.append(act)
            else:
                assert_never(act)
        if mesh_acts is not None:
            # one call for the batch: the mesh performs them in order and hands its frames and
            # outputs on once (it did so per action, two to three per message: issue 32)
            if self.mesh is not None:
                self.mesh.perform_all(mesh_acts)
            else:
                for act in mesh_acts:
                    if type(act) is not Announce:  # a standalone router has nobody to tell of changes
                        raise TypeError(f"a standalone router cannot perform {act!r}")


_VOLATILE_STATS = ("rss_kb", "loop_lag_max_ms", "loop_lag_p99_ms", "gc_pause_max_ms", "loop_lag_samples",
                   "loop_lag_worst_ms")
_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
_first = itemgetter(0)
# Counter.update's C helper: counts an iterable into a mapping
_count_elements: Callable[[Any, Any], None] = collections._count_elements  # type: ignore[attr-defined]  # typeshed lacks this private helper


def _read_outcome(ctx: SubLinkCtx, delivery: Any, gid: str, state: int, settled: bool) -> OutcomeItem | None:
    """A subscriber's disposition other than the usual one (ACCEPTED, not settled), as the core takes
    it: `(gid, outcome, settled, error, undeliverable)`; None when it is no outcome yet (RECEIVED, or
    no state). A delivery the subscriber settled, released or modified is settled here and the link
    forgets it (it is no longer on the link)."""
    outcome = _OUTCOME_OF_STATE.get(state)
    if outcome is None:
        if not settled:
            return None  # RECEIVED or no state yet: not an outcome
        outcome = O_RELEASED  # settled without an outcome: try again
    error = amqp.remote_condition(delivery) if outcome is O_REJECTED else None
    undeliverable = outcome is O_MODIFIED and amqp.remote_undeliverable(delivery)
    if settled or outcome in (O_RELEASED, O_MODIFIED):
        del ctx.gid_of[delivery]
        ctx.deliveries.pop(gid, None)
        amqp.settle(delivery)
        settled = True
    return (gid, outcome, settled, error, undeliverable)


def _no_secret(user: str) -> ScramSecret | None:
    return None  # (no users file: no password logins)


def _host_of(peer: str) -> str:
    """The address of a peer "HOST:PORT" (IPv6 hosts as they come, without the port)."""
    return peer.rsplit(":", 1)[0]


def _rss_kb() -> int:
    """Resident set size in KB, from /proc/self/statm (one short line: reading /proc/self/status
    line by line twice a second showed up in the router's profile under load)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_KB
    except (OSError, ValueError, IndexError):
        return 0


def configure_logging(log_dir: Path | None, router_id: str, level: str = "INFO", max_bytes: int = 0,
                      backups: int = 0, stderr_level: str | None = None) -> None:
    """Operational log: one JSON object per line (stderr, and router.log in the log directory).
    `max_bytes` > 0: the file is rotated at that size (router.log.1, .2, ... up to `backups`, the
    oldest dropped), so that the operational log, like the settlement log, has a bound on disk.
    `stderr_level`: the least level that also goes to stderr (None: every line logged), so that a
    stderr kept in a file that does not rotate (`oncemesh up`'s ID.out) is not a second copy."""

    class JsonFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            d = {"ts": round(record.created, 6), "level": record.levelname, "router": router_id,
                 "event": record.getMessage()}
            if record.exc_info:
                d["exc"] = self.formatException(record.exc_info)
            return json.dumps(d)

    root = logging.getLogger()
    root.setLevel(level)
    for h in list(root.handlers):
        root.removeHandler(h)
    sh = logging.StreamHandler()
    sh.setFormatter(JsonFormatter())
    if stderr_level is not None:
        sh.setLevel(stderr_level)
    root.addHandler(sh)
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / f"{router_id}.router.log"
        fh: logging.Handler = (logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=max(backups, 1))
                               if max_bytes > 0 else logging.FileHandler(path))
        fh.setFormatter(JsonFormatter())
        root.addHandler(fh)
