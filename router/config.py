"""Router settings: defaults a demanding user would expect, all overridable from the command line
or (for a mesh) the topology file's per-router settings."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .core import CoreConfig
from .management import MeshView


def parse_hostport(text: str) -> tuple[str, int]:
    """'HOST:PORT' (or ':PORT', or 'PORT') -> (host, port). Raises ValueError with a clear message."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"bad address {text!r}: port {port!r} is not a number") from None
    if not 0 <= p <= 65535:
        raise ValueError(f"bad address {text!r}: port {p} out of range 0..65535")
    return host, p


WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def client_url_of(host: str, port: int, tls: bool, configured: str = "") -> str | None:
    """Where clients reach a router: `configured` (the `client_url` setting) when set, else its
    listener's address, unless that is a wildcard or port 0 (None: not known from here)."""
    if configured:
        return configured
    if port == 0 or host in WILDCARD_HOSTS:
        return None
    return f"{'amqps' if tls else 'amqp'}://{f'[{host}]' if ':' in host else host}:{port}"


def _bool(v: Any, key: str) -> bool:
    """A yes/no setting from TOML (a bool) or --set (a string): bool("false") would be True."""
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise ValueError(f"setting {key} must be true or false, got {v!r}")


_NOT_SETTINGS = {"id", "core", "peers_dir", "mesh_view"}  # fields of RouterConfig that no --set may change


@dataclass(slots=True)
class RouterConfig:
    id: str
    listen: tuple[str, int] = ("127.0.0.1", 5672)
    state_dir: Path | None = None
    log_dir: Path | None = None
    ready_file: Path | None = None
    idle_timeout: float = 2.0  # seconds; heartbeats at half of it
    max_message_size: int = 16 * 1024 * 1024
    max_frame: int = 1024 * 1024
    max_expiry: float = 7 * 24 * 3600.0  # cap on a subscription's requested timeout
    max_connections: int = 20_000
    # ids a subscriber presents as accepted (resume): per attach, and held as placeholders in all;
    # beyond either the attach is refused with amqp:resource-limit-exceeded (docs/operations.md)
    max_presented: int = 100_000
    max_placeholders: int = 1_000_000
    max_subscriptions: int = 100_000  # entries in the (mesh-wide) subscription table; a new one beyond is refused
    # TLS (docs/security.md): PEM file paths, relative ones read from the topology file's directory.
    # Inter-router connections are mutual TLS with the mesh CA, and a peer's certificate must name
    # the router id it claims; a mesh without these refuses to start unless `insecure_mesh`.
    mesh_tls_cert: str = ""
    mesh_tls_key: str = ""
    mesh_tls_ca: str = ""
    insecure_mesh: bool = False
    # frames each neighbour may send on its link before this router grants more: a link carries at most
    # ~mesh_link_credit / 2 frames per round trip; raise it for long links (docs/performance.md, "WAN links")
    mesh_link_credit: int = 5000
    # the inter-router protocol version this router speaks (0: its newest, interrouter/messages.py); one
    # lower makes it talk as a router of that version would, to every neighbour (docs/wire-protocol.md)
    mesh_protocol_version: int = 0
    # the client listener speaks TLS only (amqps) when tls_cert is set; with tls_verify_clients,
    # clients must present a certificate signed by a CA in tls_ca
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_verify_clients: bool = False
    # client authentication (docs/security.md): SASL with the users file (SCRAM-SHA-256, PLAIN over
    # TLS) and EXTERNAL from verified client certificates; anonymous clients only if allowed. With
    # neither users_file nor tls_verify_clients the router is open (and says so in log and status)
    users_file: str = ""
    # anonymous clients: allowed only when said (with neither users_file nor tls_verify_clients a
    # router refuses to start without it: an open router must be a decision, not an accident)
    allow_anonymous: bool = False
    # authorization (docs/security.md): topics per user/group and per-user limits; none: all allowed
    policy_file: str = ""
    # before a client is anyone (router/admission.py; docs/operations.md, "Bad input"): a connection
    # that has not logged in and sent its AMQP open this long after the accept is closed; at most
    # max_preauth_per_source such connections from one address and max_preauth_connections in all
    auth_timeout: float = 10.0
    max_preauth_per_source: int = 64
    max_preauth_connections: int = 1024
    # links one connection may hold (a policy may lower it per user); beyond it an attach is refused
    max_links_per_connection: int = 1000
    # failed password logins per source address and per user: login_failures_free cost nothing, then
    # each login waits login_backoff seconds doubled per further failure, at most login_backoff_max
    login_failures_free: int = 5
    login_backoff: float = 1.0
    login_backoff_max: float = 60.0
    # password logins (SCRAM) on a listener without TLS: "loopback" (only from a loopback address),
    # "allow" (from anywhere: a captured exchange can be attacked offline, docs/security.md) or "refuse"
    passwords_without_tls: str = "loopback"
    # MQTT 3.1.1 and 5 clients (docs/mqtt.md), e.g. "127.0.0.1:1883"; off if empty. It speaks TLS when the
    # client listener does (tls_cert: the same certificate, settings and users)
    mqtt_listen: str = ""
    # QoS 1/2 PUBLISHes an MQTT 5 client may have unanswered (CONNACK's Receive Maximum); more: disconnected
    mqtt_receive_maximum: int = 100
    # HTTP listener for /metrics, /healthz, /readyz (docs/operations.md), e.g. "127.0.0.1:9090"; off if empty
    http_listen: str = ""
    # the read-only web console on the HTTP listener (/console): the mesh, rates, topics, subscriptions;
    # it shows topic and subscription names to whoever reaches the port (docs/operations.md)
    http_console: bool = False
    # the audit's status file (`oncemesh audit` writes one): its verdict and violations in the console
    audit_status_file: str = ""
    # where clients reach this router (e.g. "amqps://a.example.net:5671"), told to its neighbours so that
    # one that drains can send its clients here; default: the client listener's address unless a wildcard
    client_url: str = ""
    # drain (docs/operations.md, "Rolling restart and upgrade"): at most this long from SIGUSR1 to the exit;
    # a client connection whose publisher still waits for outcomes here is kept at most drain_grace
    drain_timeout: float = 30.0
    drain_grace: float = 1.0
    log_flush_interval: float = 0.2
    # settlement-log segments (docs/settlement-log.md, "Files"): a new segment at this size or age,
    # closed ones gzipped in a worker thread ("gzip" or "none"); retention 0 keeps every segment
    log_segment_bytes: int = 64 * 1024 * 1024
    log_segment_seconds: float = 3600.0
    log_retention_bytes: int = 0
    log_retention_seconds: float = 0.0
    log_compress: str = "gzip"
    log_free_floor_bytes: int = 0  # below this free space the log is held as on a full disk
    # the operational log (ID.router.log) is rotated at this size into ID.router.log.1 .. .N (N =
    # router_log_backups, at least 1; the oldest dropped); router_log_bytes 0: one file that grows for ever
    router_log_bytes: int = 64 * 1024 * 1024
    router_log_backups: int = 4
    tick_interval: float = 0.5
    # every this many seconds each connection's pool of freed Proton deliveries is cut to its newest
    # delivery_pool_keep (each keeps a buffer as large as the largest message it carried: what a burst
    # left behind would otherwise stay for the connection's life; common/ffi.py); 0 turns it off
    delivery_pool_trim_interval: float = 60.0
    delivery_pool_keep: int = 64
    # glibc's mmap threshold, fixed at start (common/cmalloc.py): blocks this large or larger get pages
    # of their own and go back to the system when freed; 0 leaves glibc's threshold, which rises with
    # every large block freed and lets the heap fragment (docs/operations.md, "What can grow")
    malloc_mmap_threshold: int = 128 * 1024
    loop_lag_window: float = 60.0  # seconds summarised per loop-lag report (status, log)
    loop_stall: float = 0.5  # a loop lag or GC pause this long is logged at once
    core: CoreConfig = field(default_factory=CoreConfig)
    peers_dir: Path | None = None  # where port-0 peers publish their bound inter-router address
    # the mesh as the topology describes it (routers, links, their HTTP listeners): management views
    # and the console; set by the composition root from the topology, not a setting
    mesh_view: MeshView | None = None

    def apply(self, settings: dict[str, Any]) -> None:
        """Apply a mapping of setting names (router or core) to values; unknown names raise."""
        router_names = {f.name for f in fields(RouterConfig)}
        core_names = {f.name for f in fields(CoreConfig)}
        for k, v in settings.items():
            key = k.replace("-", "_")
            if key in core_names:
                setattr(self.core, key, type(getattr(self.core, key))(v))
            elif key in router_names and key not in _NOT_SETTINGS:
                cur = getattr(self, key)
                if isinstance(cur, bool):
                    setattr(self, key, _bool(v, key))
                else:
                    setattr(self, key, type(cur)(v) if cur is not None and not isinstance(cur, tuple) else v)
            else:
                raise ValueError(f"unknown router setting {k!r}; known: "
                                 f"{', '.join(sorted((router_names | core_names) - _NOT_SETTINGS))}")
