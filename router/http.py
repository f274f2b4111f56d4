"""The router's HTTP listener (`http_listen`): `/metrics` (Prometheus text, by prometheus_client),
`/healthz` and `/readyz` (docs/operations.md, "Metrics and health").

Off the per-message path: nothing is counted for it per message but the settlement-log events the
router writes anyway (`Router.event_counts`, one C-level Counter.update per loop pass); everything
else is read from the router's state when scraped (the delivery core's through its snapshot,
router/snapshot.py). It runs on the router's event loop (a scrape reads the same state the loop
changes, so it must not run in another thread), serves one request per connection, and bounds what
it reads: a slow or abusive HTTP client cannot stall the router.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from ..common.vocab import Outcome
from .console import console_json
from .snapshot import CoreSnapshot, Parts

if TYPE_CHECKING:
    from .server import Router

log = logging.getLogger("oncemesh.http")
MAX_REQUEST = 8192
READ_TIMEOUT = 5.0
CONSOLE_CACHE_SECONDS = 0.5  # (the page polls once a second)

# settlement-log events counted as messages moved (a counter each, label `event`)
MESSAGE_EVENTS = ("received", "forwarded", "forward_received", "delivered", "accepted", "rejected", "released",
                  "modified", "ended", "outcome", "settled")
SECURITY_COUNTERS = ("logins", "login_failures", "tls_handshake_failures", "unauthorized_attaches",
                     "limited_attaches", "limited_connections")


class RouterCollector(Collector):
    """The router's metrics, read at scrape time."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.neighbours_seen: set[str] = set()  # (kept between scrapes: a neighbour lost shows 0)

    def collect(self) -> Iterator[Metric]:
        r = self.router
        snap = r.core.snapshot(time.time(), Parts(counts=True))
        info = r.ready_info(snap)
        stats: dict[str, Any] = info.get("stats", {})
        yield from _router_info(r, info)
        ev = CounterMetricFamily("oncemesh_events", "settlement-log events written by this router, by event "
                                 "(received, forwarded, delivered, accepted, rejected, released, outcome, ...)",
                                 labels=["event"])
        for name in sorted(set(MESSAGE_EVENTS) | set(r.event_counts)):
            ev.add_metric([name], r.event_counts.get(name, 0))
        yield ev
        sent = CounterMetricFamily("oncemesh_outcomes_sent", "outcomes sent to publishers, by outcome (a resend "
                                   "of a decided message is told again)", labels=["outcome"])
        for outcome in Outcome:
            sent.add_metric([outcome.name.lower()],
                            r.accepted_sent if outcome is Outcome.ACCEPTED else r.outcomes_sent[outcome])
        yield sent
        yield GaugeMetricFamily("oncemesh_connections", "client connections open", value=len(r.connections))
        links = GaugeMetricFamily("oncemesh_links", "client links attached, by role", labels=["role"])
        links.add_metric(["publisher"], stats.get("publisher_links", 0))
        links.add_metric(["subscriber"], len(r.sub_links))
        yield links
        subs = GaugeMetricFamily("oncemesh_subscriptions", "subscriptions in the table, by state and where",
                                 labels=["state"])
        total, active, local = stats.get("subscriptions", 0), stats.get("active_subscriptions", 0), \
            stats.get("local_subscriptions", 0)
        subs.add_metric(["live"], total)
        subs.add_metric(["active"], active)
        subs.add_metric(["suspended"], total - active)
        subs.add_metric(["homed_here"], local)
        yield subs
        for name, key, doc in (
                ("oncemesh_inflight_records", "records", "delivery records held (undecided and decided)"),
                ("oncemesh_undecided_messages", "undecided", "messages without an outcome yet"),
                ("oncemesh_inflight_bytes", "inflight_bytes", "payload bytes held"),
                ("oncemesh_reserved_credit", "reserved_credit", "credit granted to publishers, not used yet"),
                ("oncemesh_placeholders", "placeholders", "presented ids no message matched yet"),
                ("oncemesh_final_memory_entries", "final_entries", "entries of the final-gid memory"),
                ("oncemesh_rss_bytes", "rss_kb", "resident set size (bytes)")):
            v = stats.get(key, 0)
            yield GaugeMetricFamily(name, doc, value=v * 1024 if key == "rss_kb" else v)
        yield GaugeMetricFamily("oncemesh_publisher_links_without_credit",
                                "publisher links waiting for credit (back-pressure: credit withheld)",
                                value=snap.blocked_publishers)
        holds = CounterMetricFamily("oncemesh_holds", "times a delivery was held back behind an earlier message "
                                    "(fifo: of its publisher; total: of its topic's order)", labels=["order"])
        holds.add_metric(["fifo"], stats.get("fifo_holds", 0))
        holds.add_metric(["total"], stats.get("total_holds", 0))
        yield holds
        for name, key, doc in (
                ("oncemesh_loop_lag_max_seconds", "loop_lag_max_ms", "event-loop lag, max of the last window"),
                ("oncemesh_loop_lag_p99_seconds", "loop_lag_p99_ms", "event-loop lag, p99 of the last window"),
                ("oncemesh_loop_lag_worst_seconds", "loop_lag_worst_ms", "event-loop lag, worst since start"),
                ("oncemesh_gc_pause_max_seconds", "gc_pause_max_ms", "longest GC pause of the last window")):
            yield GaugeMetricFamily(name, doc, value=float(stats.get(key, 0.0)) / 1000.0)
        yield GaugeMetricFamily("oncemesh_log_writable", "1 while the settlement log can be written (else no "
                                "publisher credit)", value=1 if stats.get("log_writable", True) else 0)
        yield GaugeMetricFamily("oncemesh_log_bytes", "bytes of this router's settlement-log segments on disk",
                                value=_log_bytes(r))
        sec = CounterMetricFamily("oncemesh_security_events", "logins, refusals and failed TLS handshakes",
                                  labels=["event"])
        for name in SECURITY_COUNTERS:
            sec.add_metric([name], stats.get(name, 0))
        yield sec
        yield GaugeMetricFamily("oncemesh_ready", "1 when ready (see /readyz)", value=1 if readiness(r, snap)[0] else 0)
        if r.mesh is not None:
            yield from _mesh_metrics(r, info, self.neighbours_seen)


def _router_info(r: Router, info: dict[str, Any]) -> Iterator[Metric]:
    ri = InfoMetricFamily("oncemesh_router", "this router: id, incarnation (a new one at every start), "
                          "client authentication, mesh security")
    ri.add_metric([], {"id": r.id, "incarnation": r.incarnation, "client_auth": str(info.get("client_auth", "")),
                       "mesh_security": str(info.get("mesh_security", "standalone"))})
    yield ri
    yield GaugeMetricFamily("oncemesh_start_time_seconds", "when this incarnation started (Unix time)",
                            value=int(r.incarnation) / 1e6)


def _mesh_metrics(r: Router, info: dict[str, Any], seen: set[str]) -> Iterator[Metric]:
    """Peers and their state, gossip lag and order-stream lag (a router in a mesh)."""
    mesh = info.get("mesh", {})
    reachable: dict[str, str] = mesh.get("reachable", {})
    up = set(info.get("peers", ()))
    peers = GaugeMetricFamily("oncemesh_peer_up", "1 when the router is reachable through the mesh",
                              labels=["peer"])
    for peer in sorted(set(reachable) | up | set(mesh.get("synced", {}))):
        if peer != r.id:
            peers.add_metric([peer], 1 if peer in up else 0)
    yield peers
    nb = GaugeMetricFamily("oncemesh_neighbour_up", "1 while the direct inter-router link to this neighbour is "
                           "up (neighbours seen since start)", labels=["peer"])
    live = set(info.get("neighbours", ()))
    seen |= live
    for peer in sorted(seen):
        nb.add_metric([peer], 1 if peer in live else 0)
    yield nb
    yield GaugeMetricFamily("oncemesh_mesh_converged", "1 when the subscription table is synced with every "
                            "reachable router", value=1 if info.get("converged") else 0)
    synced: dict[str, str] = mesh.get("synced", {})
    yield GaugeMetricFamily("oncemesh_gossip_unsynced_peers", "reachable routers whose current incarnation's "
                            "subscription table is not merged yet (gossip lag)",
                            value=sum(1 for p, inc in reachable.items() if p != r.id and synced.get(p) != inc))
    yield GaugeMetricFamily("oncemesh_gossip_pending_attaches", "subscriber attaches waiting for the "
                            "other routers' acknowledgement", value=mesh.get("pending_attaches", 0))
    moved = CounterMetricFamily("oncemesh_mesh_messages", "inter-router traffic by kind (copies out and in, "
                                "transit hops, control messages, total-order stream messages)", labels=["kind"])
    for kind in ("copies_out", "copies_in", "transit", "control_out", "order_out", "dropped_unreachable"):
        moved.add_metric([kind], mesh.get(kind, 0))
    yield moved
    order = GaugeMetricFamily("oncemesh_order_numbered", "messages numbered in each total-order stream",
                              labels=["topic", "algorithm"])
    waiting = GaugeMetricFamily("oncemesh_order_waiting", "messages of a total-order topic held here without "
                                "their number yet (order-stream lag)", labels=["topic"])
    queued = GaugeMetricFamily("oncemesh_order_queued", "Lamport stream entries waiting for acknowledgements",
                               labels=["topic"])
    ostreams: dict[str, dict[str, Any]] = info.get("order", {})
    waits = r.core.snapshot(time.time(), Parts(unnumbered=frozenset(ostreams))).unnumbered
    for topic, st in sorted(ostreams.items()):
        order.add_metric([topic, str(st.get("algorithm"))], st.get("numbered", 0))
        waiting.add_metric([topic], waits.get(topic, 0))
        if "queued" in st:
            queued.add_metric([topic], st["queued"])
    yield order
    yield waiting
    yield queued


def _log_bytes(r: Router) -> int:
    d = r.cfg.log_dir
    if d is None:
        return 0
    total = 0
    try:
        with os.scandir(d) as it:
            for e in it:
                if e.name.startswith(f"{r.id}.settlement.") and e.is_file():
                    total += e.stat().st_size
    except OSError:
        return 0
    return total


def readiness(r: Router, snap: CoreSnapshot | None = None) -> tuple[bool, dict[str, Any]]:
    """Ready to take traffic (see `ready_from`); `snap`: the core's, if the caller has one."""
    seen = snap if snap is not None else r.core.snapshot(time.time())
    return ready_from(seen.ready, seen.log_writable, r.mesh.ready_info() if r.mesh is not None else None,
                      r.draining)


def ready_from(table_synced: bool, log_writable: bool, mesh: dict[str, Any] | None,
               draining: bool = False) -> tuple[bool, dict[str, Any]]:
    """Ready: the subscription table is loaded and (in a mesh) was synced with every router it could
    reach, the peers are known (every router of the topology heard from, or `dead_after` passed
    since start: the rest is down), and publishers get credit (the settlement log can be written).
    A router recovering says why not, with 503: a load balancer sends it no new clients meanwhile;
    /healthz stays 200 (no restart loop).

    `mesh_converged` (every reachable router's current table merged) is reported, not required:
    it turns false at every router for a moment whenever any router (re)joins, and a router that
    was synced once keeps serving correctly meanwhile (new subscriptions wait for the
    acknowledgements anyway). Gating on it would take the whole mesh out of a load balancer at
    every restart of one router.

    A draining router (SIGUSR1, before a restart) is not ready: it sends its clients elsewhere."""
    why: dict[str, Any] = {"table_synced": bool(table_synced), "log_writable": bool(log_writable),
                           "accepting_publishers": bool(table_synced and log_writable and not draining),
                           "draining": bool(draining)}
    if mesh is not None:
        why["peers_known"] = bool(mesh.get("ready", table_synced))
        why["mesh_converged"] = bool(mesh.get("converged", False))
        why["peers"] = list(mesh.get("peers", []))
    ok = why["table_synced"] and why["log_writable"] and why.get("peers_known", True) and not draining
    return ok, why


class HttpEndpoint:
    def __init__(self, router: Router, host: str, port: int) -> None:
        self.router = router
        # the console's page (package data, read once), None while the console is off
        self.page = resources.files(__package__ or "oncemesh.router").joinpath("console", "index.html").read_bytes() \
            if router.cfg.http_console else None
        self._console_cache: tuple[float, bytes] | None = None
        self.host, self.port = host, port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RouterCollector(router))
        self.server: asyncio.Server | None = None
        self.bound: tuple[str, int] | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_REQUEST)
        sock = self.server.sockets[0].getsockname()
        self.bound = (sock[0], sock[1])
        log.info("http.started listen=%s:%d paths=/metrics,/healthz,/readyz%s", *self.bound,
                 ",/console" if self.page is not None else "")

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                raise ValueError("not an HTTP/1.x request line")
            method = parts[0]
            status, ctype, body, extra = self._route(method, parts[1].split("?", 1)[0])
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            method, status, ctype, body, extra = "GET", 400, "text/plain", b"bad request\n", ""
        except Exception:  # supervision point: a failing scrape must not take anything else down
            log.exception("http.failed")
            method, status, ctype, body, extra = "GET", 500, "text/plain", b"internal error\n", ""
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server "
                  "Error", 503: "Service Unavailable"}[status]
        try:
            writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         f"{extra}Connection: close\r\n\r\n".encode() + (body if method != "HEAD" else b""))
            await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    def _route(self, method: str, path: str) -> tuple[int, str, bytes, str]:
        """(status, content type, body, extra header lines)."""
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"GET only\n", ""
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", generate_latest(self.registry), ""
        if path == "/healthz":
            return 200, "application/json", b'{"alive": true}\n', ""
        if path == "/readyz":
            ok, why = readiness(self.router)
            return (200 if ok else 503), "application/json", (json.dumps({"ready": ok, **why}) + "\n").encode(), ""
        if path in ("/console", "/console/", "/console.json"):
            if self.page is None:
                return 404, "text/plain", b"the console is off (router setting http_console = true)\n", ""
            if path == "/console.json":
                # read by the consoles other routers serve (CORS): read-only, no credentials
                return 200, "application/json", self._console_json(), "Access-Control-Allow-Origin: *\r\n" \
                    "Cache-Control: no-store\r\n"
            return 200, "text/html; charset=utf-8", self.page, "Cache-Control: no-cache\r\n"
        return 404, "text/plain", b"not found: /metrics, /healthz, /readyz, /console\n", ""

    def _console_json(self) -> bytes:
        """Made at most once a second whatever the number of consoles polling (the subscriptions'
        page and the topics scan the tables: ~0.2 s with 100,000 subscriptions)."""
        now = time.monotonic()
        if self._console_cache is not None and now - self._console_cache[0] < CONSOLE_CACHE_SECONDS:
            return self._console_cache[1]
        r = self.router
        http_self = f"{self.bound[0]}:{self.bound[1]}" if self.bound is not None and self.bound[0] not in (
            "0.0.0.0", "::") else None
        doc = console_json(r.core, r.management, r.cfg.mesh_view, r.event_counts, http_self, r.cfg.peers_dir,
                           Path(r.cfg.audit_status_file) if r.cfg.audit_status_file else None, time.time())
        body = json.dumps(doc, default=str).encode()
        self._console_cache = (now, body)
        return body
