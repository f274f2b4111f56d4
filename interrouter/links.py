"""Inter-router connections: one AMQP connection per live neighbour, on the engine I/O layer.

Each side opens one sender link (`mesh:A->B`, target `$mesh`) and accepts the other's: frames travel
as pre-settled transfers, in order. Reliability is end to end (the origin re-sends copies and the
destinations re-acknowledge after any fault), so a frame lost with a connection is never a lost
message. The lexically smaller router id dials; the other listens on its inter-router address.

The open frame names the router and the protocol version it speaks (`oncemesh.version`, absent from
routers of version 1); neighbours more than one version apart are refused with amqp:not-implemented,
the others speak the lower version (`messages.negotiate_version`, docs/wire-protocol.md "Versions").
It also carries where the router's clients connect (`oncemesh.client-url`): a draining router sends
its clients to a neighbour's.

The mesh is closed (docs/security.md): connections are mutual TLS with the mesh CA, and the router id
a peer claims in its open properties must be a name in its certificate (common name, DNS name, or
the URI `urn:oncemesh:router:<id>`), else the connection is refused with amqp:unauthorized-access.
"""

from __future__ import annotations

import logging
import ssl
from collections import deque
from collections.abc import Callable
from typing import Any

from ..common import errors
from ..common import ffi as F
from ..common.engine import AmqpConnection, Engine, Link, connect
from ..common.symbols import PROP_CLIENT_URL, PROP_INCARNATION, PROP_MESH, PROP_ROUTER, PROP_VERSION
from ..common.tls import router_uri
from .messages import PROTOCOL_VERSION, UNVERSIONED, negotiate_version

log = logging.getLogger("oncemesh.interrouter")

MESH_ADDRESS = "$mesh"
# frames a neighbour may send before we grant more (topped up at half): a link carries at most about
# CREDIT_WINDOW / 2 frames per round trip, 25,000 frames/s at 100 ms; the router setting
# `mesh_link_credit` raises it for longer links (docs/performance.md, "WAN links")
CREDIT_WINDOW = 5000


class Peer:
    """Our side of the connection to one neighbour."""

    def __init__(self, conn: AmqpConnection, peer_id: str, peer_inc: str, version: int = PROTOCOL_VERSION,
                 client_url: str | None = None) -> None:
        self.conn = conn
        self.id = peer_id
        self.inc = peer_inc
        self.version = version  # the protocol version spoken on this connection (the lower of the two)
        self.client_url = client_url  # where its clients connect (None: it did not say)
        self.sender: Link | None = None
        self.receiver: Link | None = None
        self.queue: deque[bytes] = deque()
        self.seq = 0
        self.open = False

    def send(self, frame: bytes) -> None:
        if self.queue or self.sender is None or self.sender.credit <= 0 or not self.open:
            self.queue.append(frame)
            return
        self._send_now(frame)

    def _send_now(self, frame: bytes) -> None:
        assert self.sender is not None
        self.seq += 1
        self.sender.send(self.seq.to_bytes(4, "big"), frame, settled=True)

    def pump(self) -> None:
        s = self.sender
        if s is None or not self.open:
            return
        while self.queue and s.credit > 0:
            self._send_now(self.queue.popleft())

    @property
    def backlog(self) -> int:
        return len(self.queue)


class PeerHandler:
    """The engine handler of inter-router connections (both dialed and accepted)."""

    def __init__(self, me: str, inc: str, allowed: set[str],
                 on_up: Callable[[Peer], None], on_frame: Callable[[Peer, bytes], None],
                 on_down: Callable[[Peer | None, AmqpConnection], None], verify_identity: bool = True,
                 version: int = PROTOCOL_VERSION, credit_window: int = CREDIT_WINDOW) -> None:
        self.me = me
        self.credit_window = credit_window
        self.inc = inc
        self.allowed = allowed
        self.version = version
        self.client_url: str | None = None  # ours, told to neighbours (the mesh layer sets it once bound)
        # the router id a peer claims must be a name its (verified) certificate carries; off only
        # for a mesh run with --insecure-mesh
        self.verify_identity = verify_identity
        self.on_up = on_up
        self.on_frame = on_frame
        self.on_down = on_down

    def make_connection(self, engine: Engine, server: bool, idle_timeout: float) -> AmqpConnection:
        props: dict[Any, Any] = {PROP_ROUTER: self.me, PROP_INCARNATION: self.inc, PROP_MESH: 1,
                                 PROP_VERSION: self.version}
        if self.client_url:
            props[PROP_CLIENT_URL] = self.client_url
        conn = AmqpConnection(engine, self, server=server, container_id=f"oncemesh-router-{self.me}",
                              idle_timeout=idle_timeout, properties=props)
        # a peer's input after the clients' input of the same pass (common/engine.py, `defer_input`)
        conn.defer_input = True
        return conn

    # -- engine events ---------------------------------------------------------------------------
    def on_connection_open(self, conn: AmqpConnection) -> None:
        props = conn.remote_properties
        peer_id = props.get(PROP_ROUTER)
        peer_inc = props.get(PROP_INCARNATION)
        if not props.get(PROP_MESH) or not isinstance(peer_id, str) or peer_id not in self.allowed:
            log.warning("mesh.peer_refused peer=%s claimed=%r", conn.peer, peer_id)
            conn.close(errors.UnauthorizedAccess.condition,
                       f"router {self.me} has no inter-router link to {peer_id!r} in its topology")
            return
        if self.verify_identity and not (names := conn.peer_names) & {peer_id, router_uri(peer_id)}:
            log.warning("mesh.peer_refused peer=%s claimed=%r reason=identity certificate_names=%s", conn.peer,
                        peer_id, ",".join(sorted(names)) or "(none)")
            conn.close(errors.UnauthorizedAccess.condition,
                       f"the certificate presented names {sorted(names)}, not router {peer_id!r}")
            return
        theirs = props.get(PROP_VERSION, UNVERSIONED)
        try:
            version = negotiate_version(self.version, theirs)
        except errors.RemoteProtocolError as exc:
            log.warning("mesh.peer_refused peer=%s claimed=%r reason=version ours=%d theirs=%r", conn.peer, peer_id,
                        self.version, theirs)
            conn.close(exc.condition, f"router {self.me}: {exc}")
            return
        url = props.get(PROP_CLIENT_URL)
        if url is not None and not (isinstance(url, str) and 0 < len(url) <= 256 and "://" in url):
            log.warning("mesh.peer_client_url_ignored peer=%s url=%r", peer_id, url)
            url = None
        peer = Peer(conn, peer_id, str(peer_inc), version, url)
        conn.ctx = peer
        ssn = conn.open_session()
        s = conn.sender(ssn, f"mesh:{self.me}->{peer_id}")
        s.ctx = peer
        s.set_target(MESH_ADDRESS)
        s.set_source(MESH_ADDRESS)
        s.set_settle_modes(F.SND_SETTLED, F.RCV_FIRST)
        s.open()
        peer.sender = s

    def on_link_open(self, link: Link) -> None:
        peer = link.conn.ctx
        if not isinstance(peer, Peer):
            link.close(errors.UnauthorizedAccess.condition, "not an identified oncemesh router")
            return
        link.ctx = peer
        if link.local_uninit:
            if link.is_sender or link.remote_target_address != MESH_ADDRESS:
                link.close(errors.NotFound.condition, f"inter-router connections carry only {MESH_ADDRESS}")
                return
            link.set_target(MESH_ADDRESS)
            link.set_source(MESH_ADDRESS)
            link.set_settle_modes(F.SND_SETTLED, F.RCV_FIRST)
            link.open()
            link.flow(self.credit_window)
            peer.receiver = link
        if peer.sender is not None and peer.receiver is not None and peer.sender.active and not peer.open:
            peer.open = True
            self.on_up(peer)
            peer.pump()

    def on_credit(self, link: Link) -> None:
        peer = link.ctx
        if isinstance(peer, Peer):
            if not peer.open and peer.sender is not None and peer.receiver is not None and peer.sender.active:
                peer.open = True
                self.on_up(peer)
            peer.pump()

    def on_message(self, link: Link, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None:
        peer = link.ctx
        if not isinstance(peer, Peer):
            return
        window = self.credit_window
        if link.credit < window // 2:
            link.flow(window - link.credit)
        self.on_frame(peer, payload)

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None:
        if settled:
            F.lib.pn_delivery_settle(delivery)

    def on_link_closed(self, link: Link, closed: bool, condition: tuple[str, str] | None) -> None:
        peer = link.ctx
        if isinstance(peer, Peer) and link.conn is not None:
            link.conn.close(errors.ConnectionForced.condition, "inter-router link closed")

    def on_connection_closed(self, conn: AmqpConnection, condition: tuple[str, str] | None) -> None:
        peer = conn.ctx if isinstance(conn.ctx, Peer) else None
        if peer is not None:
            peer.open = False
        self.on_down(peer, conn)


async def dial(engine: Engine, handler: PeerHandler, host: str, port: int, idle_timeout: float,
               timeout: float = 3.0, tls: ssl.SSLContext | None = None) -> AmqpConnection:
    return await connect(engine, lambda: handler.make_connection(engine, False, idle_timeout), host, port,
                         timeout, tls=tls)
