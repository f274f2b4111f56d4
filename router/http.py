"""The router's HTTP listener (`http_listen`): `/metrics` (Prometheus text, by prometheus_client),
`/healthz` and `/readyz` (docs/operations.md, "Metrics and health").

Off the per-message path: nothing is counted for it per message but the settlement-log events the
router writes anyway (`Router.event_counts`, one C-level Counter.update per loop pass); everything
else is read from the router's state when scraped. It runs on the router's event loop (a scrape
reads the same state the loop changes, so it must not run in another thread), serves one request
per connection, and bounds what it reads: a slow or abusive HTTP client cannot stall the router.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .server import Router

log = logging.getLogger("oncemesh.http")
MAX_REQUEST = 8192
READ_TIMEOUT = 5.0

# settlement-log events counted as messages moved (a counter each, label `event`)
MESSAGE_EVENTS = ("received", "forwarded", "forward_received", "delivered", "accepted", "rejected", "released",
                  "modified", "ended", "outcome", "settled")
SECURITY_COUNTERS = ("logins", "login_failures", "tls_handshake_failures", "unauthorized_attaches",
                     "limited_attaches", "limited_connections")


class RouterCollector(Collector):
    """The router's metrics, read at scrape time."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def collect(self) -> Iterator[Metric]:
        r = self.router
        info = r.ready_info()
        stats: dict[str, Any] = info.get("stats", {})
        ev = CounterMetricFamily("oncemesh_events", "settlement-log events written by this router, by event "
                                 "(received, forwarded, delivered, accepted, rejected, released, outcome, ...)",
                                 labels=["event"])
        for name in sorted(set(MESSAGE_EVENTS) | set(r.event_counts)):
            ev.add_metric([name], r.event_counts.get(name, 0))
        yield ev
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
                                "publisher links waiting for credit (back-pressure)", value=len(r.core._blocked))
        for name, key, doc in (
                ("oncemesh_loop_lag_max_seconds", "loop_lag_max_ms", "event-loop lag, max of the last window"),
                ("oncemesh_loop_lag_p99_seconds", "loop_lag_p99_ms", "event-loop lag, p99 of the last window"),
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
        yield GaugeMetricFamily("oncemesh_ready", "1 when ready (see /readyz)", value=1 if readiness(r)[0] else 0)
        if r.mesh is not None:
            peers = GaugeMetricFamily("oncemesh_peer_up", "1 when the router is reachable through the mesh",
                                      labels=["peer"])
            up = set(info.get("peers", ()))
            for peer in sorted(set(info.get("mesh", {}).get("reachable", {})) | up):
                if peer != r.id:
                    peers.add_metric([peer], 1 if peer in up else 0)
            yield peers
            mesh = info.get("mesh", {})
            yield GaugeMetricFamily("oncemesh_gossip_pending_attaches", "subscriber attaches waiting for the "
                                    "other routers' acknowledgement", value=mesh.get("pending_attaches", 0))
            order = GaugeMetricFamily("oncemesh_order_numbered", "messages numbered in each total-order stream",
                                      labels=["topic", "algorithm"])
            for topic, st in sorted(info.get("order", {}).items()):
                order.add_metric([topic, str(st.get("algorithm"))], st.get("numbered", 0))
            yield order


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


def readiness(r: Router) -> tuple[bool, dict[str, Any]]:
    """Ready to take traffic: the subscription table is loaded and (in a mesh) synced with what is
    reachable, publishers get credit (not held by a full disk). A router recovering says why not,
    with 503: a load balancer sends no new clients meanwhile; /healthz stays 200 (no restart loop)."""
    why: dict[str, Any] = {"table_ready": bool(r.core.ready), "log_writable": bool(r.core.log_writable)}
    if r.mesh is not None:
        info = r.mesh.ready_info()
        why["mesh_converged"] = bool(info.get("converged", False))
        why["peers"] = info.get("peers", [])
    return all(v for k, v in why.items() if k != "peers"), why


class HttpEndpoint:
    def __init__(self, router: Router, host: str, port: int) -> None:
        self.router = router
        self.host, self.port = host, port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RouterCollector(router))
        self.server: asyncio.Server | None = None
        self.bound: tuple[str, int] | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_REQUEST)
        sock = self.server.sockets[0].getsockname()
        self.bound = (sock[0], sock[1])
        log.info("http.started listen=%s:%d paths=/metrics,/healthz,/readyz", *self.bound)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                raise ValueError("not an HTTP/1.x request line")
            status, ctype, body = self._route(parts[0], parts[1].split("?", 1)[0])
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            status, ctype, body = 400, "text/plain", b"bad request\n"
        except Exception:  # supervision point: a failing scrape must not take anything else down
            log.exception("http.failed")
            status, ctype, body = 500, "text/plain", b"internal error\n"
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server "
                  "Error", 503: "Service Unavailable"}[status]
        try:
            writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + body)
            await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"GET only\n"
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", generate_latest(self.registry)
        if path == "/healthz":
            return 200, "application/json", b'{"alive": true}\n'
        if path == "/readyz":
            ok, why = readiness(self.router)
            return (200 if ok else 503), "application/json", (json.dumps({"ready": ok, **why}) + "\n").encode()
        return 404, "text/plain", b"not found: /metrics, /healthz, /readyz\n"
