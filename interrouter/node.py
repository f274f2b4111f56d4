"""The mesh logic of one router, sans-IO: neighbours, link state, routing of copies and control
messages, subscription gossip, readiness. Frames in, frames out; time is a parameter.

The real router drives it from asyncio (`interrouter.mesh`), the simulator from a seeded fake
network (`tests/sim`): both run exactly this code and the same `DeliveryCore`.

Routing: a copy carries a map destination router -> subscriptions; at every hop the map is split by
next hop (shortest paths by cost over the live graph, `linkstate.Routes`), so one copy crosses each
link however many destinations lie behind it. Routed control messages (acks, finals, probes, gossip)
go hop by hop to their destination; everything queued in one pass leaves in one control frame per
neighbour (`flush`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, assert_never

from ..common.errors import RemoteProtocolError
from ..router.actions import (
    Announce,
    DeclarePublisher,
    Deliver,
    DetachLink,
    DrainCredit,
    Forward,
    MeshAction,
    NotifyFinal,
    SendAck,
    SendFinal,
    SendHold,
    SendProbe,
    SendQuery,
    SettleDelivery,
    SubmitOrder,
)
from ..router.core import DeliveryCore
from ..router.order import lamport
from ..router.order.lamport import LamportNode
from ..router.order.sequencer import Delivered, Journal, Restore, SendTo, SeqState, SequencerNode, Unresolved
from ..router.order.total import Checkpoint, parse_start
from ..router.subscriptions import Subscription, SubscriptionTable, SubState, foreign
from . import codec
from .channel import Sessions
from .gossip import Gossip
from .hello import HelloMonitor
from .keeper import KEEP_KINDS, Keeper
from .linkstate import LinkStateDb
from .members import TO_HOME, MemberHome, MemberMsg, Relay
from .messages import (
    COMPACT_VERSION,
    KEEPER_VERSION,
    MEMBERS_VERSION,
    ORDER_VERSION,
    PROTOCOL_VERSION,
    Acks,
    Bye,
    Control,
    Finals,
    Hello,
    Holds,
    LamportOrder,
    LinkState,
    MemberFrame,
    Order,
    Probes,
    PubDeclare,
    Queries,
    Routed,
    SubAck,
    SubUpdate,
    TableSync,
)

# Bytes of one control frame (one Proton delivery on the inter-router link), and gids per message
# of the list-carrying kinds (Acks, Finals, Probes, Holds, Queries). Proton keeps a connection's
# delivery objects in a pool with their byte buffers at the largest size each ever held (pn_delivery
# reuses them; pn_buffer_clear keeps the capacity), so one large frame leaves a large buffer behind
# for the life of the connection: under saturation, frames of 100+ KB made a router's RSS climb by
# ~100 MB/min (heaptrack: pn_buffer_append from pn_do_transfer and pn_link_send). Small frames keep
# that pool at (deliveries alive at once) x (a few KB). docs/operations.md, "What can grow".
MAX_CONTROL_FRAME = 8192
MAX_CONTROL_ITEMS = 64
FLOOR_INTERVAL = 1.0  # seconds between two reports of the total-order floors (and compactions)


def _runs(items: list[Any]) -> list[list[Any]]:
    """`items` in runs of at most MAX_CONTROL_ITEMS (one run, the list itself, when it fits)."""
    n = MAX_CONTROL_ITEMS
    return [items] if len(items) <= n else [items[i:i + n] for i in range(0, len(items), n)]


def control_frames(msgs: list[Any], limit: int = MAX_CONTROL_FRAME, compact: bool = False) -> list[bytes]:
    """`msgs` in control frames of at most `limit` bytes each, in order (a single message larger than
    that goes alone). Encoded once when they fit (nearly always below saturation); else split into
    as many runs as the size asks for, and any run still too large split again. `compact`: the
    version-6 form (a neighbour speaking `COMPACT_VERSION`)."""
    frame = (codec.encode_control_compact if compact else codec.encode_control)(msgs)
    if len(frame) <= limit or len(msgs) == 1:
        return [frame]
    parts = min(len(msgs), -(-len(frame) // limit) + 1)
    step = -(-len(msgs) // parts)
    out: list[bytes] = []
    for i in range(0, len(msgs), step):
        out.extend(control_frames(msgs[i:i + step], limit, compact))
    return out


def _changes(old: Mapping[str, str], alive: Mapping[str, str]) -> list[tuple[str, str | None, str | None]]:
    """The routers that went, came, or came back as a new life, in id order: (router, its
    incarnation before or None, its incarnation now or None)."""
    return [(r, old.get(r), alive.get(r)) for r in sorted(set(old) | set(alive)) if old.get(r) != alive.get(r)]


def lamport_incarnation(inc: str) -> int:
    """A router's incarnation as the Lamport stream counts it (an int; ours are microsecond times)."""
    return int(inc) if inc.isdigit() else int.from_bytes(inc.encode()[:8].ljust(8, b"\0"), "big")

log = logging.getLogger("oncemesh.mesh")


class MeshNode:
    def __init__(self, me: str, inc: str, core: DeliveryCore, table: SubscriptionTable, routers: set[str],
                 neighbours: dict[str, float], hello_interval: float, dead_after: float, now: float,
                 sequenced: Iterable[str] = (), bootstrap: bool = True, lamport_topics: Iterable[str] = (),
                 lamport_restore: Mapping[str, lamport.Snapshot] | None = None,
                 persist: Callable[[str, lamport.Snapshot], None] | None = None,
                 seq_restore: Mapping[str, SeqState] | None = None,
                 persist_seq: Callable[[str, SeqState | list[Journal]], None] | None = None) -> None:
        """`sequenced`: topics in total order by the sequencer (one numbering group per topic, every
        router of the topology a member); `lamport_topics`: topics in total order by Lamport clocks
        (every router a member); `bootstrap`: this is the groups' first life here (a router
        restarted with its state directory recovers its part from the others); `lamport_restore`:
        what an earlier life wrote (`persist`: where a stream's durable part goes when it changed,
        once per pass, before that pass's frames leave: `flush`); `seq_restore`, `persist_seq`: the
        same for the sequencers' votes (a journal, `SequencerNode.take_journal`).

        `core`: this router's delivery core, which the node reaches only through its inputs and the
        queries at the end of `router.core.DeliveryCore`; `table`: the subscription table the core
        reads, which the node's gossip keeps in step with the other routers' (the same object)."""
        self.me = me
        self.inc = inc
        self.core = core
        self.table = table
        self.routers = set(routers)
        self.hello = HelloMonitor(neighbours, hello_interval, dead_after)
        self.lsdb = LinkStateDb(me, inc)
        self.gossip = Gossip(me, inc, table, self.routers)
        self.connected: dict[str, str] = {}  # neighbour -> incarnation, while a connection is up
        self.versions: dict[str, int] = {}  # neighbour -> the protocol version spoken with it
        self.started = now
        self._now = now  # the time of the latest input (for what is decided at a pass's end: `flush`)
        self.dead_after = dead_after
        self.ready = len(self.routers) == 1
        core.set_ready(self.ready)
        core.set_mesh(len(self.routers), inc)
        # outputs, drained by the adapter
        self.sends: list[tuple[str, bytes]] = []  # (neighbour, frame)
        self.attach_done: list[tuple[str, str | None]] = []  # (sid, refusal reason or None)
        self.events: list[tuple[str, str, str]] = []  # (event, peer, info) for the settlement log
        self.view_changed = False
        self.close: list[str] = []  # neighbours whose connection the adapter must drop
        # per pass
        self._control: dict[str, list[Control]] = {}
        self._acks: dict[str, list[tuple[str, str, int, tuple[str, str] | None]]] = {}
        self._finals: dict[str, list[str]] = {}
        self._probes: dict[tuple[str, str], list[str]] = {}
        self._holds: dict[str, list[str]] = {}
        self._queries: dict[str, list[str]] = {}
        self.awaiting: dict[int, str] = {}  # gossip request -> sid whose ATTACH waits for it
        self.stats = {"copies_out": 0, "copies_in": 0, "transit": 0, "dropped_unreachable": 0, "stale_probes": 0,
                      "control_out": 0, "order_out": 0, "order_version_dropped": 0}  # control_out: control messages sent, per hop
        self.lsdb.set_neighbours({})
        seq_restore = seq_restore or {}
        self.seqs = {t: SequencerNode(me, sorted(self.routers), inc, now, bootstrap=bootstrap) if bootstrap
                     else SequencerNode.restore(seq_restore.get(t), me, sorted(self.routers), inc, now)
                     for t in sorted(sequenced)}
        self._persist_seq = persist_seq
        for seq in self.seqs.values():
            seq.journaling = persist_seq is not None
        self._seq_alive: set[str] = set()
        # topics in total order by Lamport clocks: one stream per topic over reliable sessions
        # (`interrouter.channel`); its deliveries are numbered 1, 2, 3, ... here, alike on every router
        lam_inc = lamport_incarnation(inc)
        restore = lamport_restore or {}
        self.lamports = {t: LamportNode.restore(restore.get(t), me, sorted(self.routers), lam_inc)
                         if not bootstrap else LamportNode(me, sorted(self.routers), lam_inc)
                         for t in sorted(lamport_topics)}
        self._persist = persist
        self._lam_saved: dict[str, int] = {t: lam.durable for t, lam in self.lamports.items()}
        self._lam_sessions: dict[str, Sessions[lamport.Wire]] = {t: Sessions() for t in self.lamports}
        self._lam_alive: dict[str, str] = {}  # members reachable -> their incarnation
        self._floors_due = now + FLOOR_INTERVAL
        self._full_seen: dict[str, int] = {}  # topic -> its stream's "history full" count last seen
        self._lam_submitted: dict[str, set[str]] = {t: set() for t in self.lamports}
        for t, lam in self.lamports.items():
            for r in sorted(self.routers - {me}):  # nobody is reachable yet
                self._lamport_do(t, lam.member_down(r, now), now)
        # subscriptions (homed here) of total-order topics whose ATTACH waits for their start's
        # number: in force only from there (a message published after the answer is numbered after it)
        self._await_start: set[str] = set()
        # relayed members of shared subscriptions (interrouter/members.py): one reliable session per
        # router, for the members we relay to their homes and those relayed to us
        self.member_ses: Sessions[MemberMsg] = Sessions()
        self.relay = Relay(me, self.member_ses)
        self.member_home = MemberHome(core, self.member_ses)
        self.keeper = Keeper(me, self.member_ses)  # MQTT sessions' copies (interrouter/keeper.py)
        self.keeper.ready = self.ready  # (a fetch ends only once the peers are known: `_check_ready`)
        self.keeper.others = frozenset(self.routers - {me})
        self._member_alive: dict[str, str] = {}

    # ------------------------------------------------------------------ connections
    def peer_up(self, peer: str, inc: str, now: float, version: int = PROTOCOL_VERSION) -> None:
        """`version`: the protocol version agreed with it (below ORDER_VERSION, no order message
        passes either way: its order codecs have the older layout)."""
        self._now = now
        self.connected[peer] = inc
        self.versions[peer] = version
        self.hello.heard(peer, inc, now)
        self.events.append(("peer_up", peer, f"incarnation={inc}"))
        # what a new neighbour needs: our hello and every advertisement we know
        self.sends.append((peer, codec.encode_control([Hello(self.me, self.inc), *self.lsdb.known()])))
        self._neighbours_changed(now)

    def peer_down(self, peer: str, now: float) -> None:
        self._now = now
        if self.connected.pop(peer, None) is None:
            return
        self.hello.lost(peer)
        self.events.append(("peer_down", peer, ""))
        self._neighbours_changed(now)

    def _neighbours_changed(self, now: float) -> None:
        ad = self.lsdb.set_neighbours(self.hello.live())
        if ad is not None:
            self._flood(ad, exclude=None)
        self._routes_changed(now)
        self._keepers_changed(now)  # (a neighbour may come or go with nobody's reachability changing)

    def _flood(self, ad: LinkState, exclude: str | None) -> None:
        for pid in self.connected:
            if pid != exclude:
                self._control.setdefault(pid, []).append(ad)

    def _routes_changed(self, now: float) -> None:
        reach = dict(self.lsdb.routes().reachable)
        if reach == self.core.reachable_routers():
            return
        fresh = self.gossip.reachable_changed(reach)
        for r in fresh:
            self._route_control(self.gossip.sync_message(r, reach[r]))
        self.core.set_reachable(reach, now)
        if self.seqs:  # the sequencer's failure detector: who we can reach
            alive = set(reach) - {self.me}
            for seq in self.seqs.values():
                for r in sorted(alive - self._seq_alive):
                    seq.peer_up(r, now)
                for r in sorted(self._seq_alive - alive):
                    seq.peer_down(r, now)
            self._seq_alive = alive
            self._drain_order(now)
        others = {r: i for r, i in reach.items() if r != self.me}
        if self.lamports:
            self._lamport_members(others, now)
        self._member_peers(others, now)
        self._keepers_changed(now)
        self._pump_gossip()
        self._check_ready(now)
        self.view_changed = True

    # ------------------------------------------------------------------ frames in
    def frame(self, peer: str, data: bytes, now: float) -> None:
        """A frame from neighbour `peer`. Raises codec.FrameError for garbage."""
        self._now = now
        self.hello.touch(peer, now)
        kind = data[:1]
        if kind == b"d" or kind == b"D":
            origin, inc, gid, topic, dests, payload, preds, deps, by_arrival = codec.decode_copy_fields(data)
            self.stats["copies_in"] += 1
            self._route_copy(origin, inc, gid, topic, dests, payload, now, preds, deps, by_arrival)
        elif kind == b"c" or kind == b"C":
            for msg in codec.decode_control(data, self.versions.get(peer, PROTOCOL_VERSION) >= ORDER_VERSION):
                self._on_control(peer, msg, now)
        else:
            raise codec.FrameError(f"unknown frame kind {kind!r}")

    def _on_control(self, peer: str, msg: Control, now: float) -> None:
        # As `perform` (below): final classes, `type(msg) is C` (mypy narrows it), assert_never at the
        # end; after the neighbour-only kinds, the ones most frequent under load come first.
        if type(msg) is Hello:
            if self.hello.heard(peer, msg.inc, now):
                self._neighbours_changed(now)
            return
        if type(msg) is LinkState:
            if self.lsdb.update(msg):
                self._flood(msg, exclude=peer)
                self._routes_changed(now)
            return
        if type(msg) is Bye:
            if self.hello.lost(peer):
                self._neighbours_changed(now)
            return
        if msg.dst != self.me:
            self._route_control(msg)
            return
        core = self.core
        if type(msg) is Acks:
            for gid, sid, state, err in msg.items:
                core.handle_ack(gid, sid, state, err, now)
        elif type(msg) is Finals:
            notes = {n[0]: n for n in msg.notes} if msg.notes else None
            for gid in msg.gids:
                if not core.handle_final(gid, now, notes.get(gid) if notes else None):  # (stats: finals_ignored)
                    log.warning("mesh.final_ignored from=%s gid=%s: its publisher's delivery is open here",
                                msg.src, gid)
        elif type(msg) is LamportOrder:
            self._lamport_in(msg, now)
        elif type(msg) is MemberFrame:
            self._member_in(msg, now)
        elif type(msg) is Order:
            seq = self.seqs.get(msg.topic)
            if seq is None:
                self.stats["order_unknown_topic"] = self.stats.get("order_unknown_topic", 0) + 1
                log.warning("mesh.order_unknown_topic from=%s topic=%s: not in total order here (topology "
                            "files differ?)", msg.src, msg.topic)
                return
            try:
                seq.handle(msg.src, msg.wire, now)
            except RemoteProtocolError as exc:
                self.stats["order_refused"] = self.stats.get("order_refused", 0) + 1
                log.error("mesh.order_refused from=%s topic=%s error=%s", msg.src, msg.topic, exc)
            self._drain_order(now)
        elif type(msg) is Probes:
            if msg.inc != self.inc:
                # asked of an earlier life of ours: we cannot know; the asker learns our new
                # incarnation from the link state and asks everybody instead
                self.stats["stale_probes"] += 1
                return
            for gid in msg.gids:
                core.handle_probe(gid, msg.src, now)
        elif type(msg) is Holds:
            for gid in msg.gids:
                core.handle_hold(gid, msg.src, now)
        elif type(msg) is Queries:
            for gid in msg.gids:
                core.handle_query(gid, msg.src, now)
        elif type(msg) is PubDeclare:
            core.publisher_declared_elsewhere(msg.plid, set(msg.gids), msg.src, now, msg.mark)
        elif type(msg) is SubUpdate:
            old = self.gossip.handle_update(msg)
            if msg.presented and self._holds_claim(msg.entry):
                # what its client holds counts as accepted before anything is re-routed to it
                core.presented_elsewhere(msg.entry["sid"], msg.presented, msg.src, now)
            if old is not None:
                self._subscription_changed(old, now)
            self._pump_gossip()
        elif type(msg) is SubAck:
            self.gossip.handle_ack(msg)
            self._pump_gossip()
        elif type(msg) is TableSync:
            for old in self.gossip.handle_sync(msg):
                self._subscription_changed(old, now)
            self._pump_gossip()
            self._check_ready(now)
        else:
            assert_never(msg)

    # ------------------------------------------------------------------ routing out
    def _route_copy(self, origin: str, inc: str, gid: str, topic: str, dests: dict[str, tuple[str, ...]],
                    payload: bytes, now: float, preds: tuple[str, ...] = (),
                    deps: tuple[tuple[str, str], ...] = (), by_arrival: bool = False) -> None:
        hops = self.lsdb.routes().next_hop
        by_hop: dict[str, dict[str, tuple[str, ...]]] = {}
        for router, sids in dests.items():
            if router == self.me:
                self.core.receive_copy(origin, inc, gid, topic, sids, payload, now, preds, deps, by_arrival)
                continue
            hop = hops.get(router)
            if hop is None or hop not in self.connected:
                self.stats["dropped_unreachable"] += 1  # the origin re-sends when the graph changes
                continue
            by_hop.setdefault(hop, {})[router] = sids
        for hop, d in by_hop.items():
            if origin != self.me:
                self.stats["transit"] += 1
            self.stats["copies_out"] += 1
            enc = codec.encode_copy_header_compact if self._compact(hop) else codec.encode_copy_header
            self.sends.append((hop, enc(origin, inc, gid, topic, d, preds, deps, by_arrival) + payload))

    def _compact(self, hop: str) -> bool:
        """Does neighbour `hop` read the compact frames (it speaks `COMPACT_VERSION`)?"""
        return self.versions.get(hop, PROTOCOL_VERSION) >= COMPACT_VERSION

    def _route_control(self, msg: Routed) -> None:
        if msg.dst == self.me:
            return
        hop = self.lsdb.routes().next_hop.get(msg.dst)
        if hop is None or hop not in self.connected:
            return  # unreachable: re-sent or re-derived after the graph heals
        if self.versions.get(hop, PROTOCOL_VERSION) < ORDER_VERSION and type(msg) in (Order, LamportOrder):
            # an older router reads them in another layout and would close the connection: the order
            # streams count the routers behind it as cut off (a rolling upgrade: until it is upgraded)
            self.stats["order_version_dropped"] += 1
            return
        if type(msg) is MemberFrame and self.versions.get(hop, PROTOCOL_VERSION) < MEMBERS_VERSION:
            self.stats["members_version_dropped"] = self.stats.get("members_version_dropped", 0) + 1
            return  # (its relay gives the Join up after members.JOIN_TIMEOUT: a redirect to the home)
        if (type(msg) is MemberFrame and isinstance(msg.msg, KEEP_KINDS)
                and self.versions.get(hop, PROTOCOL_VERSION) < KEEPER_VERSION):
            # (a fetch passing through on its way to a router behind an older one, whose strict
            # decoder would close the connection: the fetch ends at its timeout without that answer)
            self.stats["keeper_version_dropped"] = self.stats.get("keeper_version_dropped", 0) + 1
            return
        self._control.setdefault(hop, []).append(msg)

    def flush(self) -> None:
        """End of a pass: batch what was queued into one control frame per neighbour."""
        self._persist_order()
        for topic, ses in self._lam_sessions.items():
            ses.flush_acks()
            self._lamport_frames(topic, ses)
        self.member_home.answer(self.attach_pending, self._now)
        self.member_ses.flush_acks()
        self._member_frames()
        for dst, items in self._acks.items():
            for part in _runs(items):
                self._route_control(Acks(self.me, dst, part))
        notes = self.core.has_final_notes()
        for dst, gids in self._finals.items():
            # (what a resend of a message the router settled in mode first is answered with: identity.py)
            for part in _runs(gids):
                self._route_control(Finals(self.me, dst, part, self.core.notes_on(part) if notes else ()))
        for (dst, inc), gids in self._probes.items():
            for part in _runs(gids):
                self._route_control(Probes(self.me, dst, part, inc))
        for dst, gids in self._holds.items():
            for part in _runs(gids):
                self._route_control(Holds(self.me, dst, part))
        for dst, gids in self._queries.items():
            for part in _runs(gids):
                self._route_control(Queries(self.me, dst, part))
        self._acks, self._finals, self._probes, self._holds, self._queries = {}, {}, {}, {}, {}
        control, self._control = self._control, {}
        for hop, msgs in control.items():
            if hop in self.connected:
                self.stats["control_out"] += len(msgs)
                for frame in control_frames(msgs, compact=self._compact(hop)):
                    self.sends.append((hop, frame))

    def owes_router(self) -> bool:
        """Outputs for the router other than frames to send: an ATTACH's answer, events, neighbours
        to drop, a new view, the relay's and the keepers' outputs (the adapter's `Mesh._drain_node`
        takes each; a frame that made any of them is drained at once: `Mesh._on_frame`). An output
        added to the node is added here too."""
        relay, keeper = self.relay, self.keeper
        return bool(self.attach_done or self.events or self.close or self.view_changed or relay.out
                    or relay.answered or keeper.kept or keeper.fetched or keeper.lonely or keeper.orphaned)

    @property
    def has_pending(self) -> bool:
        return bool(self._control or self._acks or self._finals or self._probes or self._holds
                    or self._queries or self.member_ses.out)

    # ------------------------------------------------------------------ core actions
    def perform(self, act: MeshAction, now: float) -> None:
        # Not a `match`: a class pattern that fails costs an isinstance miss (~700 instructions), and
        # an origin's two or three actions per message (Forward, SendFinal per holder; SendAck at a
        # destination) missed up to twice each (router/server.py, `_perform`, measured there).
        # The classes are final: mypy narrows `type(act) is C` and assert_never checks the cases.
        self._now = now
        if type(act) is Forward:
            self._route_copy(self.me, self.inc, act.gid, act.topic, act.dests, act.payload, now, act.preds,
                             act.deps, act.by_arrival)
        elif type(act) is SendAck:
            self._acks.setdefault(act.to, []).append((act.gid, act.sid, act.state, act.error))
        elif type(act) is SendFinal:
            self._finals.setdefault(act.to, []).append(act.gid)
        elif type(act) is SendProbe:
            self._probes.setdefault((act.to, act.inc), []).append(act.gid)
        elif type(act) is SendHold:
            self._holds.setdefault(act.to, []).append(act.gid)
        elif type(act) is SendQuery:
            self._queries.setdefault(act.to, []).append(act.gid)
        elif type(act) is DeclarePublisher:
            for r in sorted(self.core.reachable_routers()):
                if r != self.me:
                    self._route_control(PubDeclare(self.me, r, act.plid, list(act.in_doubt), act.mark))
        elif type(act) is Announce:
            self._announce(act.sid, act.presented)
        elif type(act) is SubmitOrder:
            lam = self.lamports.get(act.topic)
            if lam is not None:
                life = parse_start(act.key)
                if life is not None:
                    self._await_start.add(life[0])
                self._lam_submitted[act.topic].add(act.key)
                self._lamport_do(act.topic, lam.publish(act.key, b"", now), now)
                return
            seq = self.seqs.get(act.topic)
            if seq is not None:
                life = parse_start(act.key)
                if life is not None:
                    self._await_start.add(life[0])
                seq.submit(act.key, now)
                self._drain_order(now)
        else:
            assert_never(act)

    def _started(self, sid: str, topic: str) -> None:
        """A start was numbered: the ATTACH that waits for it may be answered, if it is this life's."""
        sub = self.table.get(sid)
        if sub is None or not sub.live or self.core.total_start_of(topic, sid, sub.created) is None:
            return  # an earlier life's start
        self._await_start.discard(sid)
        if sid not in self.awaiting.values():
            self.attach_done.append((sid, None))
            self.member_home.attach_done(sid, None, self._now)

    def _restored(self, topic: str, cp: Checkpoint, now: float) -> None:
        """The stream of `topic` goes on from `cp` here (this router restarted): the delivery core
        too, and an ATTACH waiting for a start the checkpoint holds is answered."""
        self.core.total_restore(topic, cp, now)
        submitted = self._lam_submitted.get(topic)
        if submitted:
            submitted.difference_update(k for k, _ in cp.starts)
        for sid in sorted(self._await_start):
            self._started(sid, topic)

    def _start_awaited(self, topic: str, key: str) -> bool:
        """Is `key` the start of a subscription life whose ATTACH still waits for it here?"""
        life = parse_start(key)
        return life is not None and life[0] in self._await_start

    def _drain_order(self, now: float) -> None:
        """The sequencers' outputs: messages to other routers, numbers for the delivery core."""
        for topic, seq in self.seqs.items():
            delivered = False
            while seq.out:
                out, seq.out = seq.out, []
                for a in out:
                    if type(a) is SendTo:
                        self._route_control(Order(a.to, self.me, topic, a.msg))
                        self.stats["order_out"] += 1
                    elif type(a) is Delivered:
                        self.core.ordered(topic, a.n, a.gid, now, pump=False)  # (pumped once, below)
                        delivered = True
                        life = parse_start(a.gid) if self._await_start else None
                        if life is not None and life[0] in self._await_start:
                            self._started(life[0], topic)
                    elif type(a) is Unresolved and (self.core.has_record(a.gid) or self._start_awaited(topic, a.gid)):
                        seq.submit(a.gid, now)  # it restarted past compacted history: ask again
                    elif type(a) is Restore:
                        self._restored(topic, a.cp, now)
                        delivered = True
                        log.info("mesh.order_restored topic=%s number=%d starts=%d: went on from the others' "
                                 "checkpoint", topic, a.cp.number, len(a.cp.starts))
            if delivered:
                self.core.pump_topic(topic)

    # ------------------------------------------------------------------ Lamport total order
    def _lamport_members(self, alive: dict[str, str], now: float) -> None:
        """The streams' failure detector: who we can reach, and in which incarnation. A member that
        went or came back as a new life ends our sessions with it (messages may have been lost)."""
        for r, was, inc in _changes(self._lam_alive, alive):
            for t, lam in self.lamports.items():
                self._lam_sessions[t].reset(r)
                if was is not None:
                    self._lamport_do(t, lam.member_down(r, now), now)
                if inc is not None:
                    self._lamport_do(t, lam.member_up(r, lamport_incarnation(inc), now), now)
        self._lam_alive = dict(alive)

    def _lamport_in(self, m: LamportOrder, now: float) -> None:
        lam = self.lamports.get(m.topic)
        if lam is None or m.src not in self.routers:
            self.stats["order_unknown_topic"] = self.stats.get("order_unknown_topic", 0) + 1
            log.warning("mesh.order_unknown_topic from=%s topic=%s: not in total order by Lamport clocks here, "
                        "or not a member (topology files differ?)", m.src, m.topic)
            return
        ready, broken = self._lam_sessions[m.topic].receive(m.src, m.epoch, m.seq, m.ack_epoch, m.ack, m.msg, now)
        if broken:  # its earlier session may have lost messages: a break of the channel
            self.stats["order_sessions_broken"] = self.stats.get("order_sessions_broken", 0) + 1
            self._lamport_do(m.topic, lam.member_down(m.src, now), now)
            inc = self._lam_alive.get(m.src)
            if inc is not None:
                self._lamport_do(m.topic, lam.member_up(m.src, lamport_incarnation(inc), now), now)
        for w in ready:
            self._lamport_do(m.topic, lam.handle(m.src, w, now), now)

    def _lamport_do(self, topic: str, actions: list[lamport.Action], now: float) -> None:
        ses = self._lam_sessions[topic]
        lam = self.lamports[topic]
        again: list[str] = []
        overflow: list[str] = []
        delivered = False
        for a in actions:
            if type(a) is lamport.Send:
                to = a.to
                if to not in overflow and not ses.send(to, a.msg, now):
                    overflow.append(to)
            elif type(a) is lamport.Deliver:
                gid = a.gid
                self._lam_submitted[topic].discard(gid)
                self.core.ordered(topic, a.n, gid, now, pump=False)  # (pumped once, below)
                delivered = True
                life = parse_start(gid) if self._await_start else None
                if life is not None and life[0] in self._await_start:
                    self._started(life[0], topic)
            elif type(a) is lamport.Orphaned:
                # stamped, then dropped by a view change before anybody delivered them: ours go again,
                # after the messages of this batch (a stamp sent before them would break FIFO)
                again += [g for g in a.gids if g in self._lam_submitted[topic]]
            elif type(a) is lamport.ViewInstalled:
                self.events.append(("order_view", topic, f"view={a.view} members={','.join(a.members)}"))
                log.info("mesh.order_view topic=%s view=%s members=%s", topic, a.view, ",".join(a.members))
            elif type(a) is lamport.Restore:
                cp = a.cp
                self._restored(topic, cp, now)
                delivered = True
                log.info("mesh.order_restored topic=%s number=%d starts=%d: went on from the others' checkpoint",
                         topic, cp.number, len(cp.starts))
        if delivered:
            self.core.pump_topic(topic)
        self._lamport_frames(topic, ses)
        for g in again:
            self._lamport_do(topic, lam.publish(g, b"", now), now)
        for r in overflow:  # a peer that acknowledges nothing: a break of the channel, a view change
            self.stats["order_sessions_overflowed"] = self.stats.get("order_sessions_overflowed", 0) + 1
            log.error("mesh.order_session_overflow topic=%s peer=%s unacked=%d: the peer acknowledges nothing; "
                      "the stream changes its view without it until it catches up", topic, r, ses.max_unacked)
            self._lamport_do(topic, lam.member_down(r, now), now)
            inc = self._lam_alive.get(r)
            if inc is not None:
                self._lamport_do(topic, lam.member_up(r, lamport_incarnation(inc), now), now)

    # ------------------------------------------------------------------ relayed members
    def _member_peers(self, alive: dict[str, str], now: float) -> None:
        """A router that went, or came back as a new life: our member session with it is over
        (messages may have been lost): the members it relayed here count as dropped, and ours
        relayed there join again."""
        for r, was, _ in _changes(self._member_alive, alive):
            if was is not None:
                self._member_session_broken(r, now)
        self._member_alive = dict(alive)

    def _keepers_changed(self, now: float) -> None:
        """The routers that may keep our MQTT sessions: reachable neighbours that speak KEEPER_VERSION;
        and those a fetch may ask: every reachable router whose next hop speaks it (a router
        further on that does not drops what it cannot pass on: `_route_control`)."""
        reach = self.core.reachable_routers()
        speaks = {p for p in self.connected if self.versions.get(p, PROTOCOL_VERSION) >= KEEPER_VERSION}
        next_hop = self.lsdb.routes().next_hop
        # (the lives of the neighbours as their connections' HELLOs said: the link-state database may
        # still name a restarted neighbour's earlier life, which the keeper would take for the same
        # life back and drop the copies that are all that is left of its sessions)
        self.keeper.set_reachable((p for p in speaks if p in reach and p != self.me), now,
                                  {p: inc for p, inc in self.connected.items() if p != self.me},
                                  fetchable=(r for r in reach if r != self.me and next_hop.get(r) in speaks))

    def _member_session_broken(self, peer: str, now: float, reset: bool = True) -> None:
        """`reset`: our own session towards `peer` ends too (it went, or came back as a new life:
        what we sent may be lost with it). Not when only the peer opened a new session towards us:
        ours is whole, and ending it would make the peer see a new session in turn, and so on
        back and forth at every message (found by the MQTT simulator, tests/sim/test_mqtt_sim.py:
        8,201 breaks in one run of line3 after one restart)."""
        self.member_home.relay_lost(peer, now, reset)
        self.relay.session_broken(peer, now, reset)
        self.keeper.session_broken(peer, now)

    def _member_in(self, m: MemberFrame, now: float) -> None:
        ready, broken = self.member_ses.receive(m.src, m.epoch, m.seq, m.ack_epoch, m.ack, m.msg, now)
        if broken:  # its earlier session may have lost messages
            self.stats["member_sessions_broken"] = self.stats.get("member_sessions_broken", 0) + 1
            self._member_session_broken(m.src, now, reset=False)
        for msg in ready:
            if isinstance(msg, KEEP_KINDS):
                self.keeper.receive(m.src, msg, now)
            elif type(msg) in TO_HOME:
                self.member_home.receive(m.src, msg, now)
            else:
                self.relay.receive(m.src, msg, now)

    def _member_frames(self) -> None:
        ses = self.member_ses
        if ses.out:
            out, ses.out = ses.out, []
            for f in out:
                self._route_control(MemberFrame(f.dst, self.me, f.epoch, f.seq, f.ack_epoch, f.ack, f.msg))

    def perform_member(self, act: Deliver | SettleDelivery | NotifyFinal | DrainCredit | DetachLink,
                       now: float) -> bool:
        """One of the core's actions for a member relayed here by another router (False: not one)."""
        if act.sid not in self.member_home.remote:
            return False
        self.member_home.perform(act, now)
        return True

    def _persist_order(self) -> None:
        """The streams' durable parts that changed this pass go to disk before its frames leave."""
        if self._persist_seq is not None:
            for t, seq in self.seqs.items():
                if seq.journal_pending:
                    self._persist_seq(t, seq.take_journal())
                    self.stats["order_persisted"] = self.stats.get("order_persisted", 0) + 1
        if self._persist is None:
            return
        for t, lam in self.lamports.items():
            if lam.durable != self._lam_saved[t]:
                snap = lam.snapshot()
                if snap is not None:
                    self._persist(t, snap)
                    self.stats["order_persisted"] = self.stats.get("order_persisted", 0) + 1
                self._lam_saved[t] = lam.durable

    def _lamport_frames(self, topic: str, ses: Sessions[lamport.Wire]) -> None:
        if ses.out:
            out, ses.out = ses.out, []
            for f in out:
                self._route_control(LamportOrder(f.dst, self.me, topic, f.epoch, f.seq, f.ack_epoch, f.ack, f.msg))
            self.stats["order_out"] += len(out)

    def _announce(self, sid: str, presented: tuple[str, ...] = ()) -> None:
        sub = self.table.get(sid)
        if sub is None:
            return
        for old in [r for r, s in self.awaiting.items() if s == sid]:
            del self.awaiting[old]
        if sub.state is SubState.ACTIVE and sub.home == self.me:
            # a life no router has confirmed yet waits for the whole topology, even when it
            # resumes somewhere else (its first attach may never have completed)
            req = self.gossip.announce(sid, wait=True, new_life=not sub.confirmed, presented=presented)
            if req is not None:
                self.awaiting[req] = sid
        else:
            self.gossip.announce(sid, wait=False, new_life=False)
        self._pump_gossip()

    def _holds_claim(self, entry: dict[str, Any]) -> bool:
        """Is the life of this announced entry the one our table holds? (A claim of another identity
        that another's life beat presents nothing: its ids never count as accepted by that one.)"""
        held = self.table.get(str(entry["sid"]))
        return held is None or not foreign(held, Subscription.from_json(entry))

    def _subscription_changed(self, old: Subscription, now: float) -> None:
        won = self.table.get(old.sid)
        theirs = (won.home, won.epoch, won.state.value) if won is not None else None
        reclaimed = self.core.subscriptions_reclaimed()
        self.core.subscription_changed(old, now)
        if self.relay.members:
            now_sub = self.table.get(old.sid)
            self.relay.home_changed(old.sid, now_sub.home if now_sub is not None and now_sub.live else None, now)
        if self.core.subscriptions_reclaimed() != reclaimed:
            now_entry = self.table.get(old.sid)
            log.info("subscription.reclaimed sid=%s epoch=%s over=%s: its link is live here and that claim "
                     "has none", old.sid, now_entry.epoch if now_entry is not None else None, theirs)

    def attach_pending(self, sid: str) -> bool:
        """Does the ATTACH of `sid` still wait for acknowledgements (or for its start's number)?"""
        return sid in self.awaiting.values() or sid in self._await_start

    def _pump_gossip(self) -> None:
        for msg in self.gossip.out:
            self._route_control(msg)
        self.gossip.out.clear()
        for p in self.gossip.completed():
            sid = self.awaiting.pop(p.req, None)
            if p.new_life and p.refused is None and self.table.confirm(p.sid):
                self.gossip.announce(p.sid, wait=False, new_life=False)  # tell everyone it is confirmed
                for msg in self.gossip.out:
                    self._route_control(msg)
                self.gossip.out.clear()
            if sid is not None and (p.refused is not None or sid not in self._await_start):
                self._await_start.discard(sid)
                self.attach_done.append((sid, p.refused))
                self.member_home.attach_done(sid, p.refused, self._now)

    def _check_ready(self, now: float) -> None:
        if self.ready:
            return
        grace = now - self.started > self.dead_after * 1.5
        if self.gossip.synced_with_reachable() and (self.gossip.all_reachable() or grace):
            self.ready = True
            self.core.set_ready(True)
            self.keeper.set_ready(now)
            self.view_changed = True

    def may_expire(self) -> bool:
        return self.gossip.all_reachable()

    def leaving(self) -> None:
        """A clean shutdown: say goodbye to every neighbour."""
        for peer in self.connected:
            self.sends.append((peer, codec.encode_control([Bye(self.me, self.inc)])))

    def _order_floors(self, now: float) -> None:
        """Each total-order stream: tell the others how far this router needs no history (the
        delivery core's floor), and compact what no router needs (docs/ordering.md, "What is
        bounded")."""
        core = self.core
        for t, lam in self.lamports.items():
            if not core.in_total_order(t):
                continue
            self._lamport_do(t, lam.note_floor(core.total_floor(t, now), now), now)
            cp = self._checkpoint(t, lam.safe_floor())
            if cp.number > lam.hbase:
                self._lamport_do(t, lam.compact(cp, now), now)
            self._history_full(t, lam.stats.history_full, lam.count - lam.hbase,
                               {r: f for r, (_, f) in lam.floors.items()} | {self.me: lam.own_floor})
        for t, seq in self.seqs.items():
            if not core.in_total_order(t):
                continue
            seq.note_floor(core.total_floor(t, now), now)
            cp = self._checkpoint(t, seq.safe_floor())
            if cp.number >= seq.base_num:  # (it compacts what the leader says every member delivered)
                seq.compact(cp)
            self._history_full(t, seq.held_back, seq.next_num - seq.base_num,
                               {r: f for r, (_, f) in seq.floors.items()} | {self.me: seq.own_floor})
        if self.seqs:
            self._drain_order(now)

    def _checkpoint(self, topic: str, safe: int) -> Checkpoint:
        """The delivery core's checkpoint of `topic`, compacted up to `safe` first if it is behind."""
        if safe > self.core.total_base(topic):
            return self.core.total_compact(topic, safe)
        return self.core.total_checkpoint(topic)

    def _history_full(self, topic: str, waits: int, kept: int, floors: dict[str, int]) -> None:
        """Say so (once per FLOOR_INTERVAL while it lasts) when a stream stopped numbering because its
        history is full, and which router's floor holds it back."""
        seen = self._full_seen.get(topic, 0)
        self._full_seen[topic] = waits
        if waits > seen:
            low = min(sorted(self.routers), key=lambda r: floors.get(r, 0))
            log.error("mesh.order_history_full topic=%s kept=%d floor=%d held_back_by=%s: numbering waits "
                      "(publishers get no credit) until every router's floor passes what is kept; a router "
                      "that is down holds it until it is back", topic, kept, floors.get(low, 0), low)

    # ------------------------------------------------------------------ time
    def tick(self, now: float) -> None:
        self._now = now
        if self.hello.hello_due(now):
            for peer in self.connected:
                self._control.setdefault(peer, []).append(Hello(self.me, self.inc))
            # a frame lost with a connection that broke without changing who is reachable:
            # what gossip still waits for is sent again
            self.gossip.resend()
            self.gossip.resync()
            self._pump_gossip()
        dead = self.hello.tick(now)
        for p in dead:
            if self.connected.pop(p, None) is not None:
                self.close.append(p)
            self.events.append(("peer_down", p, "silent"))
        if dead:
            self._neighbours_changed(now)
        self._check_ready(now)
        for seq in self.seqs.values():
            seq.tick(now)
        if self.seqs:
            self._drain_order(now)
        for topic, lam in self.lamports.items():
            self._lam_sessions[topic].tick(now)
            self._lamport_do(topic, lam.tick(now), now)
        if now >= self._floors_due:
            self._floors_due = now + FLOOR_INTERVAL
            self._order_floors(now)
        self.member_ses.tick(now)
        self.relay.tick(now)
        self.keeper.tick(now)
        self.core.tick(now, may_expire=self.may_expire())

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        routes = self.lsdb.routes()
        return {
            "peers": sorted(r for r in routes.reachable if r != self.me),
            "neighbours": sorted(self.hello.live()),
            # converged: our view is complete for what we can reach (tables synced with all of it)
            "converged": self.ready and self.gossip.synced_with_reachable(),
            "all_reachable": set(routes.reachable) >= self.routers,
            "ready": self.ready,
            "mesh": {**self.stats, "pending_attaches": len(self.gossip.pending),
                     "synced": dict(self.gossip.synced), "reachable": dict(routes.reachable)},
            "order": {t: {"algorithm": "sequencer", "sequencer": seq.coordinator, "leading": seq.leading,
                          "state": seq.status.name.lower(), "numbered": seq.next_num - 1,
                          "compacted": seq.base_num - 1, "history": seq.next_num - seq.base_num,
                          "floor": seq.safe_floor(), "held_back": seq.held_back,
                          "restored_from": seq.restored_from}
                      for t, seq in self.seqs.items()}
            | {t: {"algorithm": "lamport", "view": list(lam.installed) if lam.installed else None,
                   "members": sorted(lam.members), "state": "frozen" if lam.frozen else "normal",
                   "numbered": lam.count, "compacted": lam.hbase, "history": len(lam.history),
                   "floor": lam.safe_floor(), "queued": len(lam.queue),
                   "unacked": self._lam_sessions[t].unacked(), **dataclasses.asdict(lam.stats)}
               for t, lam in self.lamports.items()},
        }
