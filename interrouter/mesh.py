"""The mesh layer's I/O shell: the inter-router listener, dialing neighbours, and moving frames
between the peer connections and the sans-IO `MeshNode` (where every decision is made).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..common import errors
from ..common.engine import AmqpConnection, Engine, listen
from ..common.tls import TlsFiles, TlsProvider
from ..common.vocab import Outcome
from ..router.actions import MeshAction
from ..router.config import client_url_of
from ..router.core import SubscriberAttach
from ..topology.model import Topology, TotalOrder
from .codec import FrameError
from .links import Peer, PeerHandler, dial
from .members import join_of
from .messages import speaks_version
from .node import MeshNode
from .orderstate import OrderStore
from .routerport import RouterPort

log = logging.getLogger("oncemesh.mesh")


def _first_life(state_dir: Path | None, me: str) -> bool:
    """Is this the first life of this router's part in the total-order groups? Only a router
    without a state directory, or whose state directory has never seen it start, bootstraps; any
    later start recovers its part from the other routers (router.order.sequencer, "Amnesia";
    router.order.lamport: a restarted member)."""
    if state_dir is None:
        return True
    marker = state_dir / f"{me}.order-member"
    if marker.exists():
        return False
    state_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text("a member of the total-order groups of this topology since its first start\n")
    return True


class MeshTls:
    """The TLS of one router's inter-router connections: one set of files (its certificate and key,
    the mesh CA) for both sides, each peer's certificate required and verified."""

    def __init__(self, cert: Path, key: Path, ca: Path) -> None:
        files = TlsFiles(cert, key, ca, verify_peer=True)
        self.server = TlsProvider(files, server=True, what="inter-router-listener")
        self.client = TlsProvider(files, server=False, what="inter-router-dialer")

    def reload(self) -> bool:
        return self.server.reload() & self.client.reload()


def total_topics(topo: Topology) -> frozenset[str]:
    """The topics in total order, by either algorithm (the mesh numbers their messages)."""
    return frozenset(topo.total_topics(TotalOrder.SEQUENCER) + topo.total_topics(TotalOrder.LAMPORT))


class Mesh:
    """The mesh layer of one router (it satisfies `router.meshport.MeshPort`, and reaches its router
    only through `interrouter.routerport.RouterPort`). The router's core must be told the total-order
    topics and causal groups of `topo` before the router is built (the composition root does:
    `oncemesh.cli`)."""

    def __init__(self, router: RouterPort, topo: Topology, state_dir: Path | None, peers_dir: Path | None,
                 tls: MeshTls | None = None) -> None:
        self.router = router
        self.tls = tls  # None: an insecure mesh (--insecure-mesh)
        self.topo = topo
        self.me = router.id
        self.peers_dir = peers_dir
        spec = topo.routers[self.me]
        self.listen_addr = (spec.inter_host, spec.inter_port)
        if router.cfg.mesh_link_credit < 2:
            raise ValueError(f"mesh_link_credit is {router.cfg.mesh_link_credit}: at least 2 frames (default 5000)")
        nbrs = {n: float(link.cost) for n in topo.neighbours(self.me)
                if (link := topo.link(self.me, n)) is not None}  # a neighbour has a link
        total = router.cfg.core.total_topics
        lamport = [t for t in topo.total_topics(TotalOrder.LAMPORT) if t in total]
        sequenced = sorted(t for t in total if t not in lamport)
        first = _first_life(state_dir, self.me) if total else True
        # the total-order streams' votes on disk: a restart is not amnesic (interrouter.orderstate)
        self.order_store = OrderStore(state_dir, self.me) if state_dir is not None and total else None
        store = self.order_store
        self.node = MeshNode(self.me, router.incarnation, router.core, router.table, set(topo.routers), nbrs,
                             topo.hello_interval, topo.dead_after, time.time(), sequenced=sequenced,
                             bootstrap=first, lamport_topics=lamport,
                             lamport_restore=store.lamport_restore(lamport) if store and not first else None,
                             persist=store.persist_lamport if store else None,
                             seq_restore=store.sequencer_restore(sequenced) if store and not first else None,
                             persist_seq=store.persist_sequencer if store else None)
        self.handler = PeerHandler(self.me, router.incarnation, set(nbrs), self._peer_up, self._on_frame,
                                   self._peer_down, verify_identity=tls is not None,
                                   credit_window=router.cfg.mesh_link_credit,
                                   version=speaks_version(router.cfg.mesh_protocol_version))
        self.peers: dict[str, Peer] = {}
        self.client_urls: dict[str, str] = {}  # router id -> where its clients connect, as it last said
        self.engine: Engine | None = None
        self.server: asyncio.Server | None = None
        self.bound: tuple[str, int] | None = None
        self._flush_scheduled = False
        # the node's outputs wait for a drain to come (`_pass_end_drain` at the end of a pass that
        # took frames, or `_after_input`'s after the router's drain): `perform_all` leaves them to it
        self._drain_due = False
        self._dialers: list[asyncio.Task[None]] = []
        self._stopping = False

    # ------------------------------------------------------------------ lifecycle
    async def start(self, engine: Engine) -> None:
        self.engine = engine
        self.handler.client_url = self.router.client_url()  # (bound by now) told to every neighbour
        host, port = self.listen_addr
        self.server = await listen(
            engine, lambda: self.handler.make_connection(engine, True, self.topo.dead_after),
            host, port, backlog=128, tls=self.tls.server if self.tls is not None else None)
        if self.tls is None:
            log.warning("mesh.INSECURE inter_router=%s:%d: any process that reaches this port can join the mesh "
                        "as a router (started with --insecure-mesh)", *self.server.sockets[0].getsockname()[:2])
        sock = self.server.sockets[0].getsockname()
        self.bound = (sock[0], sock[1])
        for n in sorted(self.node.hello.costs):
            if self.topo.dialer(self.me, n) == self.me:
                self._dialers.append(self.engine.loop.create_task(self._dial_loop(n)))
        log.info("mesh.started inter_router=%s:%d neighbours=%s", *self.bound,
                 ",".join(sorted(self.node.hello.costs)))
        core_cfg = self.router.cfg.core
        for name, t in sorted(self.topo.topics.items()):
            if name in core_cfg.total_topics:
                log.info("topic.total_order topic=%s algorithm=%s", name, t.total.value if t.total else None)
            elif name in core_cfg.causal_groups:
                log.info("topic.causal_order topic=%s group=%s", name, core_cfg.causal_groups[name])

    async def stop(self) -> None:
        self._stopping = True
        self.node.flush()  # acknowledgements and gossip of this pass go before the goodbye
        self._drain_node()
        self.node.leaving()
        self._drain_node()
        for t in self._dialers:
            t.cancel()
        if self.server is not None:
            self.server.close()
        for peer in list(self.peers.values()):
            peer.conn.close(errors.ConnectionForced.condition, "router shutting down")

    def ready_info(self) -> dict[str, Any]:
        info = self.node.status()
        info["mesh_security"] = "mutual-tls" if self.tls is not None else "INSECURE"
        info["inter_router"] = f"{self.bound[0]}:{self.bound[1]}" if self.bound else None
        if self.order_store is not None:
            info["order_state"] = dict(self.order_store.stats)
        info["protocol"] = {"version": self.handler.version,
                            "peers": {p.id: p.version for p in sorted(self.peers.values(), key=lambda p: p.id)}}
        return info

    def client_url(self, router_id: str) -> str | None:
        """Where the clients of router `router_id` connect: what it last said (a neighbour, its
        link up now or before: a redirect to a home this router cannot reach at the moment still
        names it), else the topology's fixed address; None unknown."""
        said = self.client_urls.get(router_id)
        if said:
            return said
        spec = self.topo.routers.get(router_id)
        if spec is None:
            return None
        settings = self.topo.router_settings(router_id)
        return client_url_of(spec.host, spec.port, bool(settings.get("tls_cert")), str(settings.get("client_url", "")))

    def redirect_targets(self) -> list[tuple[str, str]]:
        """Live neighbours and where their clients connect (what they said, else the topology's
        fixed address), the cheapest link first."""
        out = []
        for pid in self.peers:
            url = self.client_url(pid)
            if url:
                out.append((self.node.hello.costs.get(pid, 1.0), pid, url))
        return [(pid, url) for _, pid, url in sorted(out)]

    def drain_facts(self) -> dict[str, int]:
        """What of the mesh side a draining router still waits for: its subscription announcements
        that a reachable router has not acknowledged, and frames not yet handed to a connection."""
        return {"announcements": self.node.gossip.unacknowledged(),
                "frames_queued": sum(p.backlog for p in self.peers.values()) + int(self.node.has_pending)}

    # ------------------------------------------------------------------ dialing
    def _peer_address(self, peer: str) -> tuple[str, int] | None:
        spec = self.topo.routers[peer]
        if spec.inter_port:
            return spec.inter_host, spec.inter_port
        if self.peers_dir is None:
            return None
        try:
            info = json.loads((self.peers_dir / f"{peer}.json").read_text())
            host, _, port = str(info["inter_router"]).rpartition(":")
            pid = int(info.get("pid", 0))
            if pid:
                os.kill(pid, 0)  # a stale file of a dead router is useless
            return host, int(port)
        except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError):
            return None

    async def _dial_loop(self, peer: str) -> None:
        assert self.engine is not None
        delay = 0.05
        while not self._stopping:
            if peer in self.peers:
                await asyncio.sleep(self.topo.hello_interval / 2)
                continue
            addr = self._peer_address(peer)
            if addr is not None:
                try:
                    await dial(self.engine, self.handler, addr[0], addr[1], self.topo.dead_after,
                               tls=self.tls.client.context() if self.tls is not None else None)
                    delay = 0.05
                    for _ in range(40):  # the link pair, or the connection's failure, before retrying
                        if peer in self.peers or self._stopping:
                            break
                        await asyncio.sleep(0.05)
                    continue
                except (TimeoutError, OSError):
                    pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    # ------------------------------------------------------------------ peers and frames
    def _peer_up(self, peer: Peer) -> None:
        # what earlier frames of the pass made the core decide goes first, to the connections it
        # was decided for (as when each frame was drained at once)
        self._after_input()
        old = self.peers.get(peer.id)
        if old is not None and old is not peer:
            old.conn.close(errors.ConnectionForced.condition, "replaced by a newer connection")
        self.peers[peer.id] = peer
        if peer.client_url:
            self.client_urls[peer.id] = str(peer.client_url)
        self.node.peer_up(peer.id, peer.inc, time.time(), peer.version)
        log.info("mesh.peer_up peer=%s incarnation=%s", peer.id, peer.inc)
        self._after_input()

    def _peer_down(self, peer: Peer | None, conn: AmqpConnection) -> None:
        if peer is None or self.peers.get(peer.id) is not peer:
            return
        self._after_input()  # (what the frames before its end made the core decide goes first)
        del self.peers[peer.id]
        self.node.peer_down(peer.id, time.time())
        log.info("mesh.peer_down peer=%s", peer.id)
        self._after_input()

    def _on_frame(self, peer: Peer, frame: bytes) -> None:
        """A frame goes into the node at once; what it made the core decide is performed, and the
        node's frames sent, once at the end of the loop pass, with the rest of the pass's input (a
        transit or destination router pays a drain per pass, not per copy). Its decisions are dated
        when its read was taken, not at the drain: a router frozen while it works through its reads
        decides the rest of them after the freeze, yet from input it had before (`Router.taking`).
        A frame whose node outputs are more than frames to send (an attach's answer, a peer's end,
        an event, the relay's or the keepers' outputs, a new view) is drained at once, as every
        frame was before: the router's after-pass work (answering a subscriber's ATTACH) asks the
        node about what such a frame decided and must find its outputs performed."""
        if self.peers.get(peer.id) is not peer:
            return  # a replaced connection's leftovers
        engine = self.engine
        taken = engine.input_time() if engine is not None else None
        now = taken if taken is not None else time.time()
        self.router.taking(now)
        node = self.node
        try:
            node.frame(peer.id, frame, now)
        except FrameError as exc:
            log.error("mesh.bad_frame peer=%s error=%s", peer.id, exc)
            peer.conn.close(errors.DecodeError.condition, str(exc))
            self._after_input()
            return
        if engine is None or node.owes_router():
            self._after_input()
        elif not self._drain_due:
            self._drain_due = True  # (after the router's drain, which `taking` asked for first)
            engine.call_after_pass(self._pass_end_drain)

    def _pass_end_drain(self) -> None:
        # (after the router's drain; the pass's frames are all taken by now, the held input of
        # every mesh connection ahead of this: the acknowledgements they made are batched here,
        # not in a round of their own, `_flush`, unless one is on its way already)
        self._drain_due = False
        node = self.node
        if not self._flush_scheduled and node.has_pending:
            node.flush()
        self._drain_node()

    def _after_input(self) -> None:
        # performs the core's actions (mesh ones come back through perform_all(), which leaves the
        # node's outputs to the one drain here)
        due = self._drain_due
        self._drain_due = True
        try:
            self.router.drain()
        finally:
            self._drain_due = due
        self._drain_node()

    def _drain_node(self) -> None:
        node = self.node
        if node.has_pending and not self._flush_scheduled and self.engine is not None:
            self._flush_scheduled = True
            self.engine.call_after_pass(self._flush)
        if node.sends:
            sends, node.sends = node.sends, []
            for pid, frame in sends:
                peer = self.peers.get(pid)
                if peer is not None:
                    peer.send(frame)
        if node.attach_done:
            done, node.attach_done = node.attach_done, []
            for sid, refused in done:
                self.router.mesh_attach_done(sid, refused)
        if node.events:
            events, node.events = node.events, []
            now = time.time()
            for ev, peer_id, info in events:
                self.router.mesh_event(ev, now, peer_id, info or None)
        if node.close:
            gone, node.close = node.close, []
            for pid in gone:
                peer = self.peers.pop(pid, None)
                log.warning("mesh.peer_dead peer=%s silent_for=%.1fs", pid, self.topo.dead_after)
                if peer is not None:
                    peer.conn.close(errors.ResourceLimitExceeded.condition, "no HELLO within dead_after")
                    peer.conn.abort()
        relay = node.relay
        if relay.out or relay.answered:
            out, answered = relay.out, relay.answered
            relay.out, relay.answered = [], []
            self.router.relay_outputs(out, answered)
        keeper = node.keeper
        if keeper.kept or keeper.fetched or keeper.lonely or keeper.orphaned:
            kept, fetched, lonely, orphaned = keeper.kept, keeper.fetched, keeper.lonely, keeper.orphaned
            keeper.kept, keeper.fetched, keeper.lonely, keeper.orphaned = [], [], [], []
            self.router.keeper_outputs(kept, fetched, lonely, orphaned)
        if node.view_changed:
            node.view_changed = False
            self.router.write_ready_file()

    def _flush(self) -> None:
        self._flush_scheduled = False
        self.node.flush()
        self._drain_node()

    # ------------------------------------------------------------------ router hooks
    def perform_all(self, acts: list[MeshAction]) -> None:
        node = self.node
        now = time.time()
        for act in acts:
            node.perform(act, now)
        if not self._drain_due:
            self._drain_node()

    def attach_pending(self, sid: str) -> bool:
        return self.node.attach_pending(sid)

    # relayed members of shared subscriptions (interrouter/members.py)
    def relay_attach(self, link: Any, att: SubscriberAttach, home: str, now: float) -> None:
        self.node.relay.attach(link, join_of(att), home, now)
        self._drain_node()

    def relay_credit(self, mid: str, credit: int, drain: bool, now: float) -> None:
        self.node.relay.credit(mid, credit, drain, now)
        self._drain_node()

    def relay_disposition(self, mid: str, gid: str, outcome: Outcome, settled: bool, error: tuple[str, str] | None,
                          undeliverable: bool, now: float) -> None:
        self.node.relay.disposition(mid, gid, outcome, settled, error, undeliverable, now)
        self._drain_node()

    def relay_detach(self, link: Any, mid: str, closed: bool, clean: bool, now: float) -> None:
        self.node.relay.detach(link, mid, closed, clean, now)
        self._drain_node()

    # MQTT sessions' keepers (interrouter/keeper.py)
    def keep_session(self, cid: str, seq: int, image: dict[str, Any], now: float) -> None:
        self.node.keeper.put(cid, seq, image, now)
        self._drain_node()

    def drop_session(self, cid: str, now: float) -> None:
        self.node.keeper.drop(cid, now)
        self._drain_node()

    def fetch_session(self, cid: str, now: float, patient: bool = False) -> None:
        self.node.keeper.fetch(cid, now, patient)
        self._drain_node()

    def perform_member(self, act: Any) -> bool:
        done = self.node.perform_member(act, time.time())
        if done:
            self._drain_node()
        return done

    def tick(self, now: float) -> None:
        self.node.tick(now)
        self.router.drain()
        self._drain_node()
