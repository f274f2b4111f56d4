"""The mesh layer of a router: neighbours, link state, routing of copies and control messages,
subscription gossip, readiness. It turns the delivery core's mesh actions into frames and frames
into core calls; the decisions stay in the core (records) and in `gossip` / `linkstate` / `hello`.

Routing: a copy carries a map destination router -> subscriptions; at every hop the map is split by
next hop (shortest paths by cost over the live graph, `linkstate.Routes`), so one copy crosses each
link however many destinations lie behind it. Routed control messages (acks, finals, probes, gossip)
go hop by hop to their destination. Everything queued during one loop pass leaves as one control
frame per neighbour.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interrouter import codec
from interrouter.gossip import Gossip
from interrouter.hello import HelloMonitor
from interrouter.links import Peer, PeerHandler, dial
from interrouter.linkstate import LinkStateDb
from interrouter.messages import (
    Acks,
    Bye,
    Control,
    Finals,
    Hello,
    LinkState,
    Probes,
    Routed,
    SubAck,
    SubUpdate,
    TableSync,
)
from router.actions import Announce, Forward, SendAck, SendFinal, SendProbe
from router.engine.amqp import AmqpConnection, Engine
from router.subscriptions import SubState

if TYPE_CHECKING:
    from router.config import RouterConfig
    from router.server import Router

log = logging.getLogger("oncemesh.mesh")


class Mesh:
    def __init__(self, router: Router, cfg: RouterConfig, peers_dir: Path | None) -> None:
        topo = cfg.topology
        self.router = router
        self.topo = topo
        self.me = router.id
        self.inc = router.incarnation
        self.peers_dir = peers_dir
        spec = topo.routers[self.me]
        self.listen_addr = (spec.inter_host, spec.inter_port)
        nbrs = {n: float(topo.link(self.me, n).cost) for n in topo.neighbours(self.me)}
        self.hello = HelloMonitor(nbrs, topo.hello_interval, topo.dead_after)
        self.lsdb = LinkStateDb(self.me, self.inc)
        self.gossip = Gossip(self.me, self.inc, router.table, set(topo.routers))
        self.handler = PeerHandler(self.me, self.inc, set(nbrs), self._peer_up, self._on_frame, self._peer_down)
        self.peers: dict[str, Peer] = {}
        self.engine: Engine | None = None
        self.server: asyncio.Server | None = None
        self.bound: tuple[str, int] | None = None
        self.started = time.time()
        self.ready = len(topo.routers) == 1
        self._control: dict[str, list[Control]] = {}  # next hop -> messages this pass
        self._acks: dict[str, list[tuple[str, str, int, tuple[str, str] | None]]] = {}
        self._finals: dict[str, list[str]] = {}
        self._probes: dict[str, list[str]] = {}
        self._flush_scheduled = False
        self._dialers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.awaiting: dict[int, str] = {}  # gossip request -> sid whose ATTACH waits for it
        self.stats = {"copies_out": 0, "copies_in": 0, "transit": 0, "dropped_unreachable": 0}

    # ------------------------------------------------------------------ lifecycle
    async def start(self, router: Router) -> None:
        assert router.engine is not None
        self.engine = router.engine
        router.core.set_ready(self.ready)
        host, port = self.listen_addr
        self.server = await self.engine.loop.create_server(
            lambda: self.handler.make_connection(self.engine, True, self.topo.dead_after),  # type: ignore[arg-type]
            host, port, reuse_address=True, backlog=128)
        sock = self.server.sockets[0].getsockname()
        self.bound = (sock[0], sock[1])
        self.lsdb.set_neighbours({})
        for n in sorted(self.hello.costs):
            if self.topo.dialer(self.me, n) == self.me:
                self._dialers.append(self.engine.loop.create_task(self._dial_loop(n)))
        log.info("mesh.started inter_router=%s:%d neighbours=%s", *self.bound, ",".join(sorted(self.hello.costs)))

    async def stop(self) -> None:
        self._stopping = True
        for peer in list(self.peers.values()):
            self._send_direct(peer, [Bye(self.me, self.inc)])
        for t in self._dialers:
            t.cancel()
        if self.server is not None:
            self.server.close()
        for peer in list(self.peers.values()):
            peer.conn.close("amqp:connection:forced", "router shutting down")

    def ready_info(self) -> dict[str, Any]:
        routes = self.lsdb.routes()
        peers = sorted(r for r in routes.reachable if r != self.me)
        return {
            "inter_router": f"{self.bound[0]}:{self.bound[1]}" if self.bound else None,
            "peers": peers,
            "neighbours": sorted(self.hello.live()),
            # converged: our view is complete for what we can reach (tables synced with all of it)
            "converged": self.ready and self.gossip.synced_with_reachable(),
            "all_reachable": set(routes.reachable) >= set(self.topo.routers),
            "ready": self.ready,
            "mesh": {**self.stats, "pending_attaches": len(self.gossip.pending),
                     "synced": dict(self.gossip.synced), "reachable": dict(routes.reachable)},
        }

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
                    await dial(self.engine, self.handler, addr[0], addr[1], self.topo.dead_after)
                    delay = 0.05
                    # wait for the link pair (or the connection's failure) before trying again
                    for _ in range(40):
                        if peer in self.peers or self._stopping:
                            break
                        await asyncio.sleep(0.05)
                    continue
                except (TimeoutError, OSError):
                    pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    # ------------------------------------------------------------------ peers
    def _peer_up(self, peer: Peer) -> None:
        old = self.peers.get(peer.id)
        if old is not None and old is not peer:
            old.conn.close("amqp:connection:forced", "replaced by a newer connection")
        self.peers[peer.id] = peer
        now = time.time()
        self.hello.heard(peer.id, peer.inc, now)
        self.router.slog.write("peer_up", now, peer=peer.id, info=f"incarnation={peer.inc}")
        log.info("mesh.peer_up peer=%s incarnation=%s", peer.id, peer.inc)
        # what a new neighbour needs: our hello, every advertisement we know (its view may be empty)
        self._send_direct(peer, [Hello(self.me, self.inc), *self.lsdb.known()])
        self._neighbours_changed()

    def _peer_down(self, peer: Peer | None, conn: AmqpConnection) -> None:
        if peer is None or self.peers.get(peer.id) is not peer:
            return
        del self.peers[peer.id]
        self.hello.lost(peer.id)
        self.router.slog.write("peer_down", time.time(), peer=peer.id)
        log.info("mesh.peer_down peer=%s", peer.id)
        self._neighbours_changed()

    def _neighbours_changed(self) -> None:
        ad = self.lsdb.set_neighbours(self.hello.live())
        if ad is not None:
            self._flood(ad, exclude=None)
        self._routes_changed()

    def _flood(self, ad: LinkState, exclude: str | None) -> None:
        for pid, peer in self.peers.items():
            if pid != exclude and peer.open:
                self._control.setdefault(pid, []).append(ad)
        self._schedule_flush()

    def _routes_changed(self) -> None:
        routes = self.lsdb.routes()
        reach = dict(routes.reachable)
        core = self.router.core
        if reach != core.reachable:
            fresh = self.gossip.reachable_changed(reach)
            for r in fresh:
                self._route_control(self.gossip.sync_message(r, reach[r]))
            core.set_reachable(reach, time.time())
            self._pump_gossip()
            self._check_ready()
            self.router.drain()
            self.router.write_ready_file()

    # ------------------------------------------------------------------ frames in
    def _on_frame(self, peer: Peer, frame: bytes) -> None:
        now = time.time()
        self.hello.touch(peer.id, now)
        kind = frame[:1]
        try:
            if kind == b"D":
                self._on_copy(codec.decode_copy(frame))
            elif kind == b"C":
                for msg in codec.decode_control(frame):
                    self._on_control(peer, msg, now)
            else:
                raise codec.FrameError(f"unknown frame kind {kind!r}")
        except codec.FrameError as exc:
            log.error("mesh.bad_frame peer=%s error=%s", peer.id, exc)
            peer.conn.close("amqp:decode-error", str(exc))
            return
        self.router.drain()

    def _on_control(self, peer: Peer, msg: Control, now: float) -> None:
        t = type(msg)
        if t is Hello:
            if self.hello.heard(peer.id, msg.inc, now):  # type: ignore[union-attr]
                self._neighbours_changed()
            return
        if t is LinkState:
            if self.lsdb.update(msg):  # type: ignore[arg-type]
                self._flood(msg, exclude=peer.id)  # type: ignore[arg-type]
                self._routes_changed()
            return
        if t is Bye:
            if self.hello.lost(peer.id):
                self._neighbours_changed()
            return
        dst = msg.dst  # type: ignore[union-attr]
        if dst != self.me:
            self._route_control(msg)  # type: ignore[arg-type]
            return
        core = self.router.core
        if t is Acks:
            for gid, sid, state, err in msg.items:  # type: ignore[union-attr]
                core.handle_ack(gid, sid, state, err, now)
        elif t is Finals:
            for gid in msg.gids:  # type: ignore[union-attr]
                core.handle_final(gid, now)
        elif t is Probes:
            for gid in msg.gids:  # type: ignore[union-attr]
                core.handle_probe(gid, msg.src)  # type: ignore[union-attr]
        elif t is SubUpdate:
            old = self.gossip.handle_update(msg)  # type: ignore[arg-type]
            if old is not None:
                core.subscription_changed(old, now)
            self._pump_gossip()
        elif t is SubAck:
            self.gossip.handle_ack(msg)  # type: ignore[arg-type]
            self._pump_gossip()
        elif t is TableSync:
            for old in self.gossip.handle_sync(msg):  # type: ignore[arg-type]
                core.subscription_changed(old, now)
            self._pump_gossip()
            self._check_ready()

    def _on_copy(self, c: codec.Copy) -> None:
        self.stats["copies_in"] += 1
        self._route_copy(c.origin, c.inc, c.gid, c.topic, c.dests, c.payload)

    # ------------------------------------------------------------------ routing out
    def _route_copy(self, origin: str, inc: str, gid: str, topic: str, dests: dict[str, tuple[str, ...]],
                    payload: bytes) -> None:
        hops = self.lsdb.routes().next_hop
        by_hop: dict[str, dict[str, tuple[str, ...]]] = {}
        for router, sids in dests.items():
            if router == self.me:
                self.router.core.receive_copy(origin, inc, gid, topic, sids, payload, time.time())
                continue
            hop = hops.get(router)
            if hop is None or hop not in self.peers:
                self.stats["dropped_unreachable"] += 1  # the origin re-sends when the graph changes
                continue
            by_hop.setdefault(hop, {})[router] = sids
        for hop, d in by_hop.items():
            if origin != self.me:
                self.stats["transit"] += 1
            self.stats["copies_out"] += 1
            self.peers[hop].send(codec.encode_copy_header(origin, inc, gid, topic, d) + payload)

    def _route_control(self, msg: Routed) -> None:
        if msg.dst == self.me:
            return
        hop = self.lsdb.routes().next_hop.get(msg.dst)
        if hop is None or hop not in self.peers:
            return  # unreachable: every routed message is re-sent or re-derived after the graph heals
        self._control.setdefault(hop, []).append(msg)
        self._schedule_flush()

    def _send_direct(self, peer: Peer, msgs: list[Control]) -> None:
        peer.send(codec.encode_control(msgs))

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self.engine is not None:
            self._flush_scheduled = True
            self.engine.call_after_pass(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        for dst, items in self._acks.items():
            self._route_control(Acks(self.me, dst, items))
        for dst, gids in self._finals.items():
            self._route_control(Finals(self.me, dst, gids))
        for dst, gids in self._probes.items():
            self._route_control(Probes(self.me, dst, gids))
        self._acks, self._finals, self._probes = {}, {}, {}
        self._flush_scheduled = False
        control, self._control = self._control, {}
        for hop, msgs in control.items():
            peer = self.peers.get(hop)
            if peer is not None:
                for i in range(0, len(msgs), 2000):
                    peer.send(codec.encode_control(msgs[i:i + 2000]))

    # ------------------------------------------------------------------ core actions
    def perform(self, act: Any) -> None:
        t = type(act)
        if t is Forward:
            self._route_copy(self.me, self.inc, act.gid, act.topic, act.dests, act.payload)
        elif t is SendAck:
            self._acks.setdefault(act.to, []).append((act.gid, act.sid, act.state, act.error))
            self._schedule_flush()
        elif t is SendFinal:
            self._finals.setdefault(act.to, []).append(act.gid)
            self._schedule_flush()
        elif t is SendProbe:
            self._probes.setdefault(act.to, []).append(act.gid)
            self._schedule_flush()
        elif t is Announce:
            self._announce(act.sid)

    def _announce(self, sid: str) -> None:
        sub = self.router.table.get(sid)
        if sub is None:
            return
        if sub.state is SubState.ACTIVE and sub.home == self.me:
            self.gossip.cancel(sid)
            req = self.gossip.announce(sid, wait=True, new_life=sub.created == sub.since)
            if req is not None:
                self.awaiting[req] = sid
        else:
            self.gossip.cancel(sid)
            self.gossip.announce(sid, wait=False, new_life=False)
        self._pump_gossip()

    def attach_pending(self, sid: str) -> bool:
        """Does the ATTACH of `sid` still wait for acknowledgements?"""
        return sid in self.awaiting.values()

    def _pump_gossip(self) -> None:
        for msg in self.gossip.out:
            self._route_control(msg)
        self.gossip.out.clear()
        for p in self.gossip.completed():
            sid = self.awaiting.pop(p.req, None)
            if sid is not None:
                self.router.mesh_attach_done(sid, p.refused)

    def _check_ready(self) -> None:
        if self.ready:
            return
        grace = time.time() - self.started > self.topo.dead_after * 1.5
        if self.gossip.synced_with_reachable() and (self.gossip.all_reachable() or grace):
            self.ready = True
            self.router.core.set_ready(True)
            log.info("mesh.ready synced_with=%s", ",".join(sorted(self.gossip.synced)))
            self.router.write_ready_file()

    def may_expire(self) -> bool:
        return self.gossip.all_reachable()

    # ------------------------------------------------------------------ time
    def tick(self, now: float) -> None:
        if self.hello.hello_due(now):
            for peer in self.peers.values():
                if peer.open:
                    self._control.setdefault(peer.id, []).append(Hello(self.me, self.inc))
            self._schedule_flush()
        dead = self.hello.tick(now)
        for p in dead:
            gone = self.peers.pop(p, None)
            log.warning("mesh.peer_dead peer=%s silent_for=%.1fs", p, self.topo.dead_after)
            self.router.slog.write("peer_down", now, peer=p, info="silent")
            if gone is not None:
                with contextlib.suppress(Exception):
                    gone.conn.close("amqp:resource-limit-exceeded", "no HELLO within dead_after")
                    gone.conn.abort()
        if dead:
            self._neighbours_changed()
        self._check_ready()
