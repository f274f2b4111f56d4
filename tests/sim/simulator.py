"""A deterministic simulation of a whole oncemesh mesh in one process.

Every router runs the real `DeliveryCore` and `MeshNode`; the network between them, the clients
and the faults are simulated from one seed, so a failing run replays exactly:

    pytest tests/sim -k replay --sim-seed N [--sim-faults kill,freeze,partition,loss]

The network (the kernel's, tests/sim/kernel.py): per directed link a FIFO with random delay; a
connection has a number, and frames of a connection that broke are never delivered on the next one
(TCP). Faults: router crash and restart
(only the subscription table survives), freeze (no processing; peers time it out), link cuts
(partitions), connection resets (what is in flight is lost), drain (the router's real `Drain`
decides when each client moves and when it may leave; then it says goodbye, stops and restarts
later, as `oncemesh roll` does), stop (SIGSTOP: the process runs nothing while its clock runs, input
piles up in its sockets, its peers and clients time it out and fail over; then it goes on and takes
the pile) and starve (passes that take long, late polls). A stopped or starved router's loop runs in
passes under the edge's rules (common/passrules.py, driven by passes.py as the engine drives them);
the older "freeze" keeps its own model (no input piles up: frames to it wait in the kernel and die
with their connection, its clients' goodbyes are taken first when it thaws).

Clients behave as our client library does: publishers resend everything in doubt under the same
tags after a reconnect and declare their in-doubt tags; subscribers keep a dedup store, present
what they accepted but did not see settled, and fail over to another router when theirs is gone.

Checked all along (the promises of docs/promises.md):
- a router never hands a subscription a gid its client already holds, and no client hands a gid
  to its application twice;
- no router hands a subscription a gid after its acceptance was taken (at any router whose life
  still runs), even into the link of a client that has left: the router view's "delivered again
  after the acceptance", stamped as the log stamps it (the pass's input time);
- ACCEPTED only when every subscription in force for the message (its ATTACH answered before the
  publish) has handed it over or ended;
and at the end, once faults heal and every client is back: every message owed to a live
subscription was handed over exactly once, every publisher has all its outcomes, and no router
holds a record.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from oncemesh.common.errors import LinkRedirect, RelayMember
from oncemesh.common.ids import (
    PLID_LEN,
    counter_seq,
    counter_tag,
    global_id,
    identity_scope,
    msgid_gid,
    publisher_link_id,
    shared_subscription_id,
    subscription_id,
)
from oncemesh.common.topics import matches
from oncemesh.common.vocab import Outcome
from oncemesh.interrouter.codec import FrameError
from oncemesh.interrouter.members import RemoteLink, join_of
from oncemesh.interrouter.messages import COMPACT_VERSION, PROTOCOL_VERSION
from oncemesh.interrouter.node import MeshNode
from oncemesh.router.actions import (
    Deliver,
    DetachLink,
    DrainCredit,
    GrantCredit,
    NotifyFinal,
    SendOutcome,
    SettleDelivery,
    SettlePublisher,
)
from oncemesh.router.core import CoreConfig, DeliveryCore, SubscriberAttach
from oncemesh.router.drain import ConnView, Dependents, Drain, core_dependents
from oncemesh.router.subscriptions import SubscriptionTable
from tests.sim.kernel import Network as KernelNetwork
from tests.sim.kernel import Scheduler, Violation
from tests.sim.mqtt_sim import EdgeSim, MqttSim, amqp_data
from tests.sim.passes import STOP_MODES, Input, SimLoop, Source

TOPIC = "t"
# a run with wildcards: the topics published to, and the subscriptions' filters (subscriber i has
# filter i mod 4): one topic by name, one level of a subtree, everything, another subtree
WILD_TOPICS = ("t/a", "t/b", "u/x")
WILD_FILTERS = ("t/a", "t/+", "#", "u/#")
# a run with selectors: subscriber i has selector i mod 4 ("" none); each message carries the
# application property `parity` of its tag (`parity_of`)
SELECTORS = ("", "parity = 'even'", "parity <> 'even' AND parity IS NOT NULL", "missing = 1")


def parity_of(tag: bytes) -> str:
    return "even" if tag[-1] % 2 == 0 else "odd"


def owed_by_selector(selector: str, tag: bytes) -> bool:
    """The simulator's own reading of `SELECTORS` (not common/selector.py: the reference it checks)."""
    return {"": True, SELECTORS[1]: parity_of(tag) == "even", SELECTORS[2]: parity_of(tag) == "odd",
            SELECTORS[3]: False}[selector]


def amqp_with_parity(tag: bytes) -> bytes:
    """An AMQP message: application-properties {"parity": ...}, then a data section with the tag."""
    value = parity_of(tag).encode()
    body = b"\xa1\x06parity" + bytes((0xA1, len(value))) + value
    props = b"\x00\x53\x74\xc1" + bytes((len(body) + 1, 2)) + body
    return props + b"\x00\x53\x75\xa0" + bytes((len(tag),)) + tag
HELLO = 0.5
DEAD_AFTER = 1.5
DRAIN_TIMEOUT, DRAIN_GRACE, DRAIN_CHECK = 4.0, 0.4, 0.05


_serials = itertools.count()  # (numbered anew by each Simulation: the same in any process)


@dataclass(eq=False)
class Token:
    """A link or a delivery, as the core sees it: equal only to itself; hashed by its number, not
    by its address (which differs from process to process), so that a seed replays anywhere."""

    label: str
    serial: int = field(default_factory=lambda: next(_serials))

    def __hash__(self) -> int:
        return self.serial


# ---------------------------------------------------------------------- clients
@dataclass
class SimSubscriber:
    name: str
    sid: str
    urls: list[str]
    router: str | None = None
    link: Token | None = None
    open: bool = False
    in_force_since: float | None = None  # attach answered (first life)
    credit: int = 0
    arrived: list[str] = field(default_factory=list)
    on_link: set[str] = field(default_factory=set)
    accepted: set[str] = field(default_factory=set)  # store: handed, not seen settled
    settled: set[str] = field(default_factory=set)
    ended_at: float | None = None
    wants: bool = True  # wants to be connected
    epoch: int | None = None  # the subscription's epoch at its last completed attach
    filter: str = TOPIC  # its topic filter (a name, or with '+'/'#' in a run with wildcards)
    selector: str = ""  # its JMS selector (a run with selectors: `SELECTORS`)
    # a run with shared subscriptions: the shared subscription (its table id) it is a member of, its
    # name and the member's link name (`sid` is then the member's own id: its link's with the core)
    group: str = ""
    group_name: str = ""
    link_name: str = ""

    @property
    def acct(self) -> str:
        """What the mesh owes messages to: its subscription (a member: the shared one)."""
        return self.group or self.sid


@dataclass
class SimPublisher:
    name: str
    plid: str
    urls: list[str]
    router: str | None = None
    link: Token | None = None
    credit: int = 0
    seq: int = 0
    in_doubt: dict[str, bytes] = field(default_factory=dict)  # gid -> tag, sent, no outcome
    token_of: dict[Token, str] = field(default_factory=dict)
    to_publish: int = 0
    # a client library that picks every tag itself (a resend goes under a fresh one) and asks to be
    # identified by the message-id (router/identity.py): `transfers` numbers its tags
    by_id: bool = False
    transfers: int = 0
    topic: str = TOPIC  # the topic it publishes to
    with_props: bool = False  # its messages are AMQP messages with a `parity` property (`parity_of`)
    named: bool = False  # its messages are AMQP data sections naming their gid (a run with MQTT clients)

    def message(self, gid: str, tag: bytes) -> tuple[bytes, bytes]:
        """(the tag, the bytes) of the transfer of `gid` now: ours resend under the same tag; one
        identified by message-id takes the next tag and carries the id (an AMQP properties section)."""
        if self.with_props:
            return tag, amqp_with_parity(tag)
        if self.named:
            return tag, amqp_data(gid)
        if not self.by_id:
            return tag, b"payload:" + tag
        fresh = counter_tag(self.transfers)
        self.transfers += 1
        mid = f"{self.name}-{tag.decode()}".encode()
        props = b"\xa1" + bytes([len(mid)]) + mid
        return fresh, (b"\x00\x53\x73\xc0" + bytes([len(props) + 1, 1]) + props
                       + b"\x00\x53\x75\xa0" + bytes([len(tag)]) + tag)

    def gid(self, tag: bytes) -> str:
        """The gid of its message numbered `tag` (by tag, or by its message-id)."""
        if not self.by_id:
            return global_id(self.plid, tag)
        return msgid_gid(identity_scope(self.topic, self.name), b"s" + f"{self.name}-{tag.decode()}".encode())


# ---------------------------------------------------------------------- routers
class SimRouter:
    def __init__(self, sim: Simulation, rid: str, neighbours: dict[str, float]) -> None:
        self.sim = sim
        self.id = rid
        self.neighbours = neighbours
        self.snapshot: dict[str, Any] | None = None
        self.saved: tuple[SubscriptionTable, int] | None = None  # the table and version of `snapshot`
        self.alive = False
        self.frozen = False
        self.incarnation = 0
        self.core: DeliveryCore
        self.node: MeshNode
        self.sub_links: dict[str, tuple[Token, SimSubscriber]] = {}
        self.pub_tokens: dict[Token, SimPublisher] = {}
        self.pub_links: dict[Token, SimPublisher] = {}
        self.awaiting: dict[str, tuple[Token, SimSubscriber, SubscriberAttach]] = {}
        self.relayed: set[str] = set()  # members relayed to their shared subscription's home elsewhere
        self.late: list[Callable[[], None]] = []  # client disconnects it will notice when it thaws
        self.started_before = False  # a restart recovers its part of the sequencer group
        self.drain: Drain | None = None  # draining: it takes no new clients and leaves when done
        self.drain_waits: dict[Token, set[Token]] = {}  # publisher link -> its deliveries open when it began
        # its loop in passes, when input piles up (stopped, starved): the edge's rules (passes.py)
        self.loop = SimLoop(self, sim.hold_after_stall)
        self.mqtt: EdgeSim | None = None  # its MQTT listener, in runs with MQTT clients (mqtt_sim.py)
        # the inter-router protocol version it speaks (a rolling upgrade: one behind until restarted)
        self.version = PROTOCOL_VERSION

    def start(self) -> None:
        sim = self.sim
        self.incarnation = max(self.incarnation + 1, int(sim.now * 1e6))
        table = SubscriptionTable()
        if self.snapshot is not None:
            table.restore(self.snapshot, sim.now)
        self.core = DeliveryCore(self.id, table, sim.core_cfg)
        self.node = MeshNode(self.id, str(self.incarnation), self.core, table, set(sim.routers), self.neighbours,
                             HELLO, DEAD_AFTER, sim.now, sequenced=(TOPIC,) if sim.total == "sequencer" else (),
                             bootstrap=not self.started_before,
                             lamport_topics=(TOPIC,) if sim.total == "lamport" else ())
        self.started_before = True
        self.alive = True
        self.frozen = False
        self.sub_links.clear()
        self.pub_tokens.clear()
        self.pub_links.clear()
        self.awaiting.clear()
        self.relayed.clear()
        self.late.clear()
        self.drain = None
        self.drain_waits.clear()
        self.loop.reset()
        if sim.mqtt is not None:
            self.mqtt = sim.mqtt.edge_for(self)
        self.persist()
        inc = self.incarnation
        sim.schedule(0.0, lambda: self.tick(inc))

    def persist(self) -> None:
        # the real router fsyncs the table before it answers an ATTACH and after every pass, when
        # its version moved since the last write (router/server.py, `_saved_version`): so here too
        # (a snapshot of an unchanged table, after every step, was a sixth of the simulations' time)
        table = self.core.table
        if self.saved is not None and self.saved[0] is table and self.saved[1] == table.version:
            return
        self.snapshot = table.snapshot()
        self.saved = (table, table.version)

    def tick(self, inc: int) -> None:
        if not self.alive or inc != self.incarnation:
            return  # a tick chain of an earlier incarnation
        self.loop.next_tick = self.sim.now + 0.25
        if self.loop.busy():
            self.loop.timer()  # (in a pass of its loop: after that pass's reads)
        elif not self.frozen:
            self.node.tick(self.sim.now)
            self.process()
            core = self.core  # (the status counts these as they come and go, never scanning)
            assert core.destination_records == sum(1 for r in core.records.values() if r.origin is not None)
        self.sim.schedule(0.25, lambda: self.tick(inc))

    def take(self, key: Any, fn: Callable[[], object], *, eof: bool = False) -> bool:
        """A client's input for this router: False when it is to be taken at once (the caller does,
        as before passes existed); True when it went into the loop's pile (taken in a pass)."""
        if not self.loop.busy():
            return False
        self.loop.arrive(Input(key, Source.CLIENT, fn, eof))
        return True

    # -- processing: actions out of the core and the node -------------------------------------
    def process(self) -> None:
        sim = self.sim
        for _ in range(1000):
            acts, self.core.out = self.core.out, []
            for a in acts:
                self.perform(a)
            for e in self.core.log:
                if e[0] == "accepted":
                    sim.took_acceptance(self, e[3], e[1])
            if sim.watch is not None:
                for e in self.core.log:
                    if e[1] in sim.watch or e[3] in sim.watch:
                        sim.note(f"{self.id}: {e}")
            self.core.log.clear()
            if self.node.attach_done:
                done, self.node.attach_done = self.node.attach_done, []
                for sid, refused in done:
                    self.attach_done(sid, refused)
            self._relay_outputs()
            if self.mqtt is not None and self.mqtt.step():
                continue
            if not self.core.out and not self.node.attach_done:
                break
        self.persist()
        self.node.flush()
        for to, frame in self.node.sends:
            sim.net.send(self.id, to, frame)
        self.node.sends.clear()
        for p in self.node.close:
            sim.net.reset(self.id, p)
        self.node.close.clear()
        self.node.events.clear()

    def perform(self, a: Any, relayed: bool = False) -> None:
        """One action of the core (`relayed`: of the relay, for a member whose home is elsewhere)."""
        sim = self.sim
        if self.mqtt is not None and not relayed and self.mqtt.perform(a):
            return
        t = type(a)
        if t is Deliver:
            if not relayed:
                sim.check_handover(self, self.core.member_sid.get(a.sid, a.sid), a.gid)
            entry = self.sub_links.get(a.sid)
            if sim.causal:
                sim.delivered_by[(a.sid, a.gid)] = (self.id, self.incarnation)
            if entry is not None:
                link, sub = entry
                sim.client_event(lambda: sim.sub_receive(sub, link, a.gid, self.id), link)
            elif not relayed:
                self.node.perform_member(a, sim.now)  # (a member another router relays here?)
        elif t is SettleDelivery:
            entry = self.sub_links.get(a.sid)
            if entry is None and not relayed:
                self.node.perform_member(a, sim.now)
            if entry is not None:
                link, sub = entry
                sim.client_event(lambda: sim.sub_final(sub, link, [a.gid], settle=True), link)
        elif t is DrainCredit:
            pass  # (simulated subscribers never drain)
        elif t is NotifyFinal:
            entry = self.sub_links.get(a.sid)
            if entry is None and not relayed:
                self.node.perform_member(a, sim.now)
            if entry is not None:
                link, sub = entry
                sim.client_event(lambda: sim.sub_final(sub, link, list(a.gids), settle=False), link)
        elif t is SendOutcome:
            pub = self.pub_tokens.get(a.pub)
            if pub is not None:
                if a.settle:
                    del self.pub_tokens[a.pub]
                sim.client_event(lambda: sim.pub_outcome(pub, a.pub, a.outcome, self.id))
        elif t is SettlePublisher:
            self.pub_tokens.pop(a.pub, None)
        elif t is GrantCredit:
            pub = self.pub_links.get(a.link)
            if pub is not None:
                sim.client_event(lambda: sim.pub_credit(pub, a.link, a.credit))
        elif t is DetachLink:
            if type(a.link) is RemoteLink:
                self.node.perform_member(a, sim.now)
                return
            entry = self.sub_links.get(a.sid)
            if entry is not None and entry[0] is a.link:
                del self.sub_links[a.sid]
                if relayed:
                    self.relayed.discard(a.sid)
                sim.client_event(lambda: sim.sub_lost(entry[1], entry[0]))
        else:
            self.node.perform(a, sim.now)

    def _relay_outputs(self) -> None:
        """What the relay decided for the members it relays (interrouter/members.py)."""
        relay = self.node.relay
        sim = self.sim
        while relay.out or relay.answered:
            out, answered = relay.out, relay.answered
            relay.out, relay.answered = [], []
            for a in out:
                self.perform(a, relayed=True)
            for mid in answered:
                entry = self.sub_links.get(mid)
                if entry is not None and mid in self.relayed:
                    link, sub = entry
                    sim.client_event(lambda sub=sub, link=link: sim.sub_opened(sub, link, self.id, None), link)

    def sub_credit(self, sid: str, credit: int) -> None:
        if sid in self.relayed:
            self.node.relay.credit(sid, credit, False, self.sim.now)
        else:
            self.core.subscriber_credit(sid, credit)

    def sub_outcome(self, sid: str, gid: str) -> None:
        if sid in self.relayed:
            self.node.relay.disposition(sid, gid, Outcome.ACCEPTED, False, None, False, self.sim.now)
        else:
            self.core.subscriber_outcome(sid, gid, Outcome.ACCEPTED, False, None, False, self.sim.now)

    def sub_outcomes(self, sid: str, gids: list[str]) -> None:
        """ACCEPTEDs of one link that came together: one call of the core (`subscriber_outcomes`)."""
        if sid in self.relayed:
            for gid in gids:
                self.node.relay.disposition(sid, gid, Outcome.ACCEPTED, False, None, False, self.sim.now)
        else:
            self.core.subscriber_outcomes(sid, gids, self.sim.now)

    def sub_detach(self, link: Token, sid: str, clean: bool = False) -> None:
        if sid in self.relayed:
            self.node.relay.detach(link, sid, False, clean, self.sim.now)
            if not self.node.relay.relays(sid):
                self.relayed.discard(sid)
        else:
            self.core.detach_subscriber(link, sid, False, self.sim.now, clean=clean)

    def attach_done(self, sid: str, refused: str | None) -> None:
        """The mesh acknowledged (or refused) subscription `sid`'s announcement: the ATTACHes that
        waited for it (several: members of a shared one, keyed by their own ids) are answered."""
        if self.mqtt is not None:
            self.mqtt.attach_done(sid, refused)
        for key in [k for k, e in self.awaiting.items() if e[2].sid == sid]:
            entry = self.awaiting.pop(key, None)
            if entry is not None:
                self._attach_done(key, entry, refused)

    def _attach_done(self, key: str, entry: tuple[Token, SimSubscriber, SubscriberAttach],
                     refused: str | None) -> None:
        link, sub, att = entry
        sid = att.sid
        if self.sub_links.get(key, (None,))[0] is not link:
            return
        if refused is not None:
            if not self.core.resume_refused(link, att, self.sim.now, refused):
                return  # refused: another identity's life holds it (the core detached the link)
            self.awaiting[key] = entry
            if not self.node.attach_pending(sid):
                self.attach_done(sid, None)
            return
        self.persist()
        table_entry = self.core.table.get(sid)
        epoch = table_entry.epoch if table_entry is not None else None  # the ATTACH answer carries it
        self.sim.client_event(lambda: self.sim.sub_opened(sub, link, self.id, epoch))

    # -- client-facing inputs -----------------------------------------------------------------
    def subscriber_attach(self, link: Token, s: SimSubscriber, att: SubscriberAttach) -> None:
        """The ATTACH of `s` reaches this router; answered at once when the mesh need not acknowledge it."""
        if self.take(link, lambda: self.subscriber_attach_now(link, s, att)):
            return
        self.subscriber_attach_now(link, s, att)

    def subscriber_attach_now(self, link: Token, s: SimSubscriber, att: SubscriberAttach) -> None:
        if self.sub_links.get(s.sid, (None,))[0] is not link:
            return  # (gone before it was read)
        try:
            self.core.attach(link, att, self.sim.now)
        except RelayMember as exc:  # a member whose shared subscription's home is elsewhere: relayed
            self.relayed.add(s.sid)
            self.node.relay.attach(link, join_of(att), exc.home, self.sim.now)
            self.process()
            return
        except LinkRedirect:  # a member, and its shared subscription has its members elsewhere
            del self.sub_links[s.sid]
            home = self.core.table.get(att.sid)
            self.process()
            self.sim.client_event(lambda: self.sim.sub_redirected(s, link, home.home if home else None), link)
            return
        self.awaiting[s.sid] = (link, s, att)
        self.process()
        if s.sid in self.awaiting and not self.node.attach_pending(att.sid):
            self.attach_done(att.sid, None)
            self.process()

    def on_link(self, sid: str, link: Token) -> bool:
        """Is `link` the subscription's link here (what a connection says is about its own link)?"""
        if sid in self.relayed:
            rec = self.node.relay.members.get(sid)
            return rec is not None and rec.link is link
        rt = self.core.subs.get(sid)
        if rt is None and sid in self.core.member_sid:  # a member of a shared subscription
            m, _ = self.core._member(sid)
            return m is not None and m.link is link
        return rt is not None and rt.link is link

    def usable(self) -> bool:
        return self.alive and not self.frozen and not self.loop.stopped

    def reached(self) -> bool:
        """Do its connected clients still send to it? (Stopped, it reads nothing, but they do not
        know it before their idle timeout.)"""
        return self.usable() or (self.alive and self.loop.stopped)

    def accepting(self) -> bool:
        """Takes new clients: a draining router redirects them."""
        return self.usable() and self.drain is None


# ---------------------------------------------------------------------- network
class Network:
    """The links of the topology over the kernel's network: a link is up or not (cut: it stays down),
    frames go only over an up link, and a reset loses what was in flight on it."""

    def __init__(self, sim: Simulation, graph: nx.Graph) -> None:
        self.sim = sim
        self.graph = graph
        self.cut: set[frozenset[str]] = set()
        self.up: dict[frozenset[str], bool] = {}
        self.wire = KernelNetwork(sim.k, per_link=True)
        self.loss = 0.0
        self.kinds: Counter[bytes] = Counter()  # frames sent, by kind (D/d data, C/c control)

    @property
    def frames(self) -> int:
        return self.wire.frames

    def key(self, a: str, b: str) -> frozenset[str]:
        return frozenset((a, b))

    def send(self, frm: str, to: str, frame: bytes) -> None:
        if not self.up.get(self.key(frm, to)):
            return
        if self.sim.routers[to].version < COMPACT_VERSION and frame[:1] in (b"d", b"c"):
            raise Violation(f"{frm} sent a compact {frame[:1]!r} frame to {to}, which speaks version "
                            f"{self.sim.routers[to].version} and cannot read it")
        self.kinds[frame[:1]] += 1
        at = self.wire.send(frm, to, self.sim.rng.uniform(0.0005, 0.004), self.deliver, frm, to, frame)
        if self.loss and self.sim.rng.random() < self.loss:
            self.sim.schedule_at(at, lambda: self.reset(frm, to))  # a reset: this frame and the rest lost

    def deliver(self, frm: str, to: str, frame: bytes) -> bool:
        if not self.up.get(self.key(frm, to)):
            return True
        r = self.sim.routers[to]
        if not r.alive:
            return True
        if r.frozen:  # the kernel buffers it; delivered when it thaws (unless the connection dies)
            return False
        if r.loop.busy():  # (in its socket: read in a pass, even after the connection broke)
            def take() -> None:
                try:
                    r.node.frame(frm, frame, self.sim.now)
                except FrameError as exc:
                    raise Violation(f"router {to} could not read a frame from {frm}: {exc}") from None

            r.loop.arrive(Input(("mesh", frm, self.wire.connection(frm, to)), Source.MESH, take))
            return True
        try:
            r.node.frame(frm, frame, self.sim.now)
        except FrameError as exc:
            raise Violation(f"router {to} could not read a frame from {frm}: {exc}") from None
        r.process()
        return True

    def reset(self, a: str, b: str) -> None:
        """The connection a-b breaks (both ends notice at once, as with a TCP reset)."""
        k = self.key(a, b)
        if not self.up.get(k):
            return
        self.up[k] = False
        conn = self.wire.connection(a, b)
        self.wire.reset(a, b)
        for x, y in ((a, b), (b, a)):
            r = self.sim.routers[x]
            if r.alive and not r.frozen and r.loop.busy():  # (the end, read after what came before it)
                r.loop.arrive(Input(("mesh", y, conn), Source.MESH,
                                    lambda r=r, y=y: r.node.peer_down(y, self.sim.now), eof=True))
            elif r.alive and not r.frozen:
                r.node.peer_down(y, self.sim.now)
                r.process()
        self.sim.schedule(self.sim.rng.uniform(0.05, 0.3), lambda: self.try_connect(a, b))

    def try_connect(self, a: str, b: str) -> None:
        k = self.key(a, b)
        ra, rb = self.sim.routers[a], self.sim.routers[b]
        if self.up.get(k) or k in self.cut or not (ra.usable() and rb.usable()):
            if not self.up.get(k):
                self.sim.schedule(0.2, lambda: self.try_connect(a, b))
            return
        self.up[k] = True
        if ra.loop.busy() or rb.loop.busy():
            conn = self.wire.connection(a, b)
            for x, y in ((ra, rb), (rb, ra)):
                def up(x: SimRouter = x, y: str = y.id, inc: str = str(y.incarnation),
                       v: int = min(ra.version, rb.version)) -> None:
                    x.node.peer_up(y, inc, self.sim.now, v)

                if x.loop.busy():
                    x.loop.arrive(Input(("mesh", y.id, conn), Source.MESH, up))
                else:
                    up()
                    x.process()
            return
        v = min(ra.version, rb.version)  # (what the two agree on: messages.negotiate_version)
        ra.node.peer_up(b, str(rb.incarnation), self.sim.now, v)
        rb.node.peer_up(a, str(ra.incarnation), self.sim.now, v)
        ra.process()
        rb.process()

    def router_died(self, rid: str) -> None:
        for n in self.graph.neighbors(rid):
            self.reset(rid, n)

    def silence(self, rid: str) -> None:
        """A frozen router: its neighbours time it out (dead_after) and drop their connections."""


# ---------------------------------------------------------------------- the simulation
@dataclass
class Faults:
    kill: bool = False
    freeze: bool = False
    partition: bool = False
    loss: float = 0.0
    drain: bool = False
    stop: bool = False  # SIGSTOP: the process runs nothing, input piles up; clients fail over
    starve: bool = False  # passes that take long (late polls)

    @classmethod
    def parse(cls, text: str) -> Faults:
        f = cls()
        for name in filter(None, (x.strip() for x in text.split(","))):
            if name == "kill":
                f.kill = True
            elif name == "freeze":
                f.freeze = True
            elif name == "partition":
                f.partition = True
            elif name == "loss":
                f.loss = 0.002
            elif name == "drain":
                f.drain = True
            elif name == "stop":
                f.stop = True
            elif name == "starve":
                f.starve = True
            elif name != "none":
                raise ValueError(f"unknown fault {name!r} (kill, freeze, partition, loss, drain, stop, starve)")
        return f


class Simulation:
    def __init__(self, seed: int, graph: nx.Graph, n_subs: int = 4, n_pubs: int = 3, messages: int = 60,
                 faults: Faults | None = None, duration: float = 20.0, total: bool | str = False,
                 causal: bool = False, hold_after_stall: bool = True, by_id: bool = False,
                 wildcards: bool = False, selectors: bool = False, shared: bool = False,
                 mqtt: tuple[int, int] | None = None, upgrade: bool = False) -> None:
        global _serials
        _serials = itertools.count()
        self.seed = seed
        self.hold_after_stall = hold_after_stall  # (False: the edge's hold taken out, tests/sim/test_edge_sim.py)
        # (sid, gid) -> the router life that took the subscriber's ACCEPTED, and when
        self.accepted_by: dict[tuple[str, str], tuple[str, int, float]] = {}
        self.k = Scheduler(seed, start=1000.0)
        self.rng = self.k.rng
        self.faults = faults or Faults()
        self.duration = duration
        # the topic in total order ("sequencer" or "lamport"; True: "sequencer") instead of FIFO ("")
        self.total = "sequencer" if total is True else (total or "")
        self.core_cfg = CoreConfig(max_inflight_messages=200, link_credit=20, probe_after=1.0,
                                   # (a client not ours declares nothing at its next attach: a record it
                                   # resent elsewhere and settled there is freed here by the orphan sweep,
                                   # as in the product, where ours are settled by their declaration)
                                   placeholder_horizon=1e9, orphan_horizon=30.0 if by_id else 1e9,
                                   total_topics=frozenset({TOPIC}) if total else frozenset(),
                                   causal_groups={TOPIC: "topic t"} if causal else {})
        # causal order: subscriber i and publisher i are one client (`c{i}`); what the routers can
        # know of its causal past: per (client, router, router life), what that life handed it
        # (and what those depended on) and what it published there
        self.causal = causal
        self.cpast: dict[tuple[str, str, int], set[str]] = {}
        self.deps: dict[str, set[str]] = {}  # gid -> what its publisher depended on (every router it used)
        self.delivered_by: dict[tuple[str, str], tuple[str, int]] = {}  # (sid, gid) -> (router, life)
        self.sequence: dict[str, list[str]] = {}  # sid -> gids in the order handed to its application
        self.routers: dict[str, SimRouter] = {}
        for r in sorted(graph.nodes):
            self.routers[r] = SimRouter(self, r, {n: float(graph[r][n].get("cost", 1)) for n in graph.neighbors(r)})
        self.net = Network(self, graph)
        self.net.loss = self.faults.loss
        # a rolling upgrade: every router starts one protocol version behind (the JSON frames) and
        # comes back at the current one when it is restarted; the mesh mixes both meanwhile
        self.upgrade = upgrade
        if upgrade:
            for r in self.routers.values():
                r.version = COMPACT_VERSION - 1
        names = sorted(self.routers)
        # a run with wildcards: publishers on several topics of a tree, subscriptions with filters
        # that match one, some or all of them (`WILD_TOPICS`, `WILD_FILTERS`)
        assert not (wildcards and (total or causal)), "wildcard filters match FIFO topics only"
        filters = WILD_FILTERS if wildcards else (TOPIC,)
        topics = WILD_TOPICS if wildcards else (TOPIC,)
        self.subs = [SimSubscriber(f"s{i}", subscription_id("c-sub", f"s{i}", filters[i % len(filters)]),
                                   self.rng.sample(names, len(names)), filter=filters[i % len(filters)],
                                   selector=SELECTORS[i % len(SELECTORS)] if selectors else "")
                     for i in range(n_subs)]
        self.pubs = [SimPublisher(f"p{i}", publisher_link_id("c-pub", f"p{i}"),
                                  self.rng.sample(names, len(names)), topic=topics[i % len(topics)])
                     for i in range(n_pubs)]
        # a run with shared subscriptions: the subscribers are members of two shared subscriptions
        # (the first half of "ga", the rest of "gb"), each member a client of its own
        assert not (shared and (total or causal or wildcards)), "shared subscriptions: FIFO topic t"
        self.shared = shared
        if shared:
            for i, sub in enumerate(self.subs):
                sub.group_name = "ga" if i < max(1, n_subs // 2) else "gb"
                sub.link_name = f"{sub.group_name}|global{i}"
                sub.sid = subscription_id(f"c-{sub.name}", sub.link_name, TOPIC)
                sub.group = shared_subscription_id("", sub.group_name, TOPIC)
        if causal:  # a client's two links try the routers in the same order (they meet more often)
            for s, p in zip(self.subs, self.pubs, strict=False):
                p.urls = list(s.urls)
        assert not (selectors and (total or causal or by_id)), "selectors: FIFO topics, publishers named by tag"
        for p in self.pubs:
            p.with_props = selectors
            p.to_publish = messages
            p.by_id = by_id  # (tags picked by the library, identity by message-id)
        self.handed: dict[tuple[str, str], int] = {}
        self.last_seq: dict[tuple[str, str], int] = {}  # (sid, plid) -> the latest seq handed (FIFO)
        self._link_clock: dict[object, float] = {}  # link -> when its latest event reaches the client
        self.owed: dict[str, set[str]] = {}  # gid -> sids in force at publish
        self.published_at: dict[str, float] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.log: list[str] = []
        self.heal_at = self.now + duration
        self.healed = False
        self.watch: set[str] | None = None  # ids whose core events go into the log (debugging)
        # a run with MQTT clients (tests/sim/mqtt_sim.py): `mqtt` = (publishers, subscribers), QoS 2,
        # topic t; the AMQP publishers' messages are then AMQP data sections naming their gid
        self.mqtt: MqttSim | None = None
        if mqtt is not None:
            assert not (total or causal or wildcards or selectors or shared or by_id), "MQTT: FIFO topic t"
            assert not (self.faults.freeze or self.faults.partition or self.faults.loss or self.faults.drain
                        or self.faults.stop or self.faults.starve), "MQTT runs: kill/restart faults only"
            self.mqtt = MqttSim(self, mqtt[0], mqtt[1], messages)
            for p in self.pubs:
                p.named = True

    # -- scheduling -------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.k.now

    def schedule(self, delay: float, fn: Callable[[], None]) -> None:
        self.k.after(delay, fn)

    def schedule_at(self, at: float, fn: Callable[[], None]) -> None:
        self.k.at(at, fn)

    def client_event(self, fn: Callable[[], None], link: object = None) -> None:
        """Something reaches a client after a random delay; on one link (a TCP connection) in the
        order it was sent."""
        at = self.now + self.rng.uniform(0.0002, 0.002)
        if link is not None:
            at = max(at, self._link_clock.get(link, 0.0) + 1e-6)
            self._link_clock[link] = at
        self.schedule_at(at, fn)

    def note(self, text: str) -> None:
        self.log.append(f"{self.now - 1000:9.4f} {text}")
        if len(self.log) > 4000:
            del self.log[:1000]

    # -- run --------------------------------------------------------------------------------
    def run(self, max_events: int = 2_000_000) -> None:
        for r in self.routers.values():
            r.start()
        for a, b in self.net.graph.edges:
            self.schedule(0.01, lambda a=a, b=b: self.net.try_connect(a, b))
        for s in self.subs:
            self.schedule(self.rng.uniform(0.5, 3.0), lambda s=s: self.sub_connect(s))
        for p in self.pubs:
            self.schedule(self.rng.uniform(0.5, 2.0), lambda p=p: self.pub_connect(p))
        self.schedule(0.1, self.chaos)
        if self.mqtt is not None:
            self.mqtt.start()
        self.k.run(max_steps=max_events, stop=lambda: self.healed and self.now > self.heal_at + 5 and self.quiet())
        self.final_checks()

    def quiet(self) -> bool:
        if any(p.in_doubt or p.to_publish for p in self.pubs):
            return False
        if any(r.alive and r.core.records for r in self.routers.values()):
            return False
        if self.mqtt is not None and not self.mqtt.quiet():
            return False
        return all(not s.accepted or not s.wants for s in self.subs)

    # -- faults and client behaviour -----------------------------------------------------------
    def chaos(self) -> None:
        rng = self.rng
        if self.now >= self.heal_at:
            self.heal()
            return
        r = rng.random()
        names = sorted(self.routers)
        if self.faults.kill and r < 0.04:
            victim = self.routers[rng.choice(names)]
            if victim.alive and self.may_kill(victim):
                self.note(f"kill {victim.id}")
                self.kill(victim)
                self.schedule(rng.uniform(0.3, 3.0), lambda v=victim: self.restart(v))
        elif self.faults.freeze and r < 0.07:
            victim = self.routers[rng.choice(names)]
            if victim.alive and not victim.frozen and not victim.loop.stopped:
                self.note(f"freeze {victim.id}")
                victim.frozen = True
                self.schedule(rng.uniform(0.2, 3.0), lambda v=victim: self.thaw(v))
                self.schedule(DEAD_AFTER, lambda v=victim: self.frozen_timeout(v))
        elif self.faults.drain and r < 0.085:
            victim = self.routers[rng.choice(names)]
            if victim.accepting() and self.may_kill(victim):
                self.drain_router(victim)
        elif self.faults.partition and r < 0.10 and self.net.graph.number_of_edges():
            a, b = rng.choice(sorted(self.net.graph.edges))
            k = self.net.key(a, b)
            if k not in self.net.cut:
                self.note(f"cut {a}-{b}")
                self.net.cut.add(k)
                self.net.reset(a, b)
                self.schedule(rng.uniform(0.3, 4.0), lambda k=k, a=a, b=b: self.mend(k, a, b))
        elif self.faults.stop and r < 0.16:
            victim = self.routers[rng.choice(names)]
            if victim.usable() and not victim.loop.busy():
                mode = rng.choice(STOP_MODES)
                self.note(f"stop {victim.id} ({mode})")
                victim.loop.stop(mode, rng.uniform(1.0, 4.0), lambda v=victim: self.stopped(v))
        elif self.faults.starve and r < 0.18:
            victim = self.routers[rng.choice(names)]
            if victim.usable() and not victim.loop.busy():
                self.note(f"starve {victim.id}")
                victim.loop.starve(self.now + rng.uniform(0.5, 3.0))
        elif r < 0.25:
            s = rng.choice(self.subs)
            if s.router is not None and s.open and rng.random() < 0.5:
                self.note(f"{s.name} moves")
                self.sub_disconnect(s)
                self.schedule(rng.uniform(0.01, 0.5), lambda s=s: self.sub_connect(s))
        elif r < 0.30:
            p = rng.choice(self.pubs)
            if p.router is not None:
                self.note(f"{p.name} reconnects")
                self.pub_disconnect(p)
                self.schedule(rng.uniform(0.01, 0.5), lambda p=p: self.pub_connect(p))
        self.schedule(rng.uniform(0.05, 0.3), self.chaos)

    def heal(self) -> None:
        self.healed = True
        self.note("heal")
        for k in list(self.net.cut):
            self.net.cut.discard(k)
        self.net.loss = 0.0
        for r in self.routers.values():
            if not r.alive:
                self.restart(r)
            elif r.frozen:
                self.thaw(r)
            elif r.loop.stopped:
                r.loop.thaw()
        for s in self.subs:
            s.wants = True
            if s.router is None:
                self.sub_connect(s)
        for p in self.pubs:
            if p.router is None:
                self.pub_connect(p)
        if self.mqtt is not None:
            self.mqtt.heal()

    def may_kill(self, victim: SimRouter) -> bool:
        """The sequencer (total order) assumes at most N - (N//2 + 1) routers crashed or recovering
        at once: more would lose numbers a majority committed (it has no disk), and it stops rather
        than guess (router/order/sequencer.py, "Amnesia"). Crashes in total-order runs respect that.
        MQTT runs: one crash at a time (mqtt_sim.py, `MqttSim.may_kill`)."""
        if self.mqtt is not None and not self.mqtt.may_kill(victim):
            return False
        if not self.total:
            return True
        if self.total == "lamport":
            return self._lamport_may_kill(victim)
        n = len(self.routers)
        down = sum(1 for r in self.routers.values()
                   if not r.alive or r.drain is not None  # (a draining router is about to leave)
                   or any(q.status.name != "NORMAL" for q in r.node.seqs.values())
                   or any(lam.installed is None for lam in r.node.lamports.values()))
        return down + 1 <= n - (n // 2 + 1)

    def _lamport_may_kill(self, victim: SimRouter) -> bool:
        """The Lamport stream assumes at least ceil(n/2) of the n members of its latest view keep
        their state until the next view forms (router/order/lamport.py, "What waits"): views shrink
        with partitions, so this bounds kills by the latest view, not by the topology."""
        alive = {r.id: r for r in self.routers.values() if r.alive}
        views = [(lam.installed, lam.members) for r in alive.values() for lam in r.node.lamports.values()
                 if lam.installed is not None]
        if not views:
            return False
        _, members = max(views, key=lambda v: v[0])
        n = len(members)
        keep = sum(1 for m, inc in members.items()
                   if m != victim.id and m in alive and alive[m].drain is None  # (draining: about to leave)
                   and (inc == 0 or alive[m].incarnation == inc))
        return keep >= n - n // 2

    def kill(self, r: SimRouter) -> None:
        r.alive = False
        self.net.router_died(r.id)
        for _sid, (link, sub) in list(r.sub_links.items()):
            self.client_event(lambda sub=sub, link=link: self.sub_lost(sub, link))
        for tok, pub in list(r.pub_links.items()):
            self.client_event(lambda pub=pub, tok=tok: self.pub_lost(pub, tok))
        if self.mqtt is not None:
            self.mqtt.router_died(r)

    def drain_router(self, r: SimRouter) -> None:
        """SIGUSR1: the router takes no new work and moves its clients as `Drain` says, then leaves."""
        self.note(f"drain {r.id}")
        r.drain = Drain(self.now, DRAIN_TIMEOUT, DRAIN_GRACE)
        r.core.set_draining()
        r.drain_waits = {link: {t for t, q in r.pub_tokens.items() if q is p} for link, p in r.pub_links.items()}
        self.drain_step(r, r.incarnation)

    def drain_step(self, r: SimRouter, inc: int) -> None:
        if not r.alive or r.incarnation != inc or r.drain is None:
            return
        if r.frozen or r.loop.stopped:  # (frozen while draining: it goes on when it thaws)
            self.schedule(DRAIN_CHECK, lambda: self.drain_step(r, inc))
            return
        conns: dict[Token, ConnView] = {link: ConnView(0, True) for link, _ in r.sub_links.values()}
        for link in r.pub_links:
            conns[link] = ConnView(len(r.drain_waits.get(link, set()) & r.pub_tokens.keys()), False)
        open_pubs = sum(len(p.token_of.keys() & r.pub_tokens.keys()) for link, p in r.pub_links.items()
                        if p.link is link)  # (deliveries of its attached publisher links, as the adapter counts)
        deps = Dependents(connections=len(conns), publisher_deliveries=open_pubs, **core_dependents(r.core),
                          announcements=r.node.gossip.unacknowledged())
        step = r.drain.step(self.now, conns, deps)
        for link in step.close:  # redirected: the router lets go of the link, the client moves at once
            pub = r.pub_links.pop(link, None)
            if pub is not None:
                r.core.detach_publisher(link)
                self.client_event(lambda pub=pub, link=link: self.pub_lost(pub, link))
                continue
            sid, sub = next((sid, sub) for sid, (lk, sub) in r.sub_links.items() if lk is link)
            del r.sub_links[sid]
            r.awaiting.pop(sid, None)
            r.sub_detach(link, sid)
            self.client_event(lambda sub=sub, link=link: self.sub_lost(sub, link), link)
        r.process()
        if not step.done:
            self.schedule(DRAIN_CHECK, lambda: self.drain_step(r, inc))
            return
        assert r.drain.report is not None
        self.note(f"{r.id} {r.drain.report.outcome} in {r.drain.report.seconds:.2f}s, left: {r.drain.report.remaining}")
        r.node.leaving()
        r.process()
        self.kill(r)  # (it exits: only its subscription table survives, as after a crash)
        self.schedule(self.rng.uniform(0.3, 3.0), lambda: self.restart(r))

    def restart(self, r: SimRouter) -> None:
        if r.alive:
            return
        self.note(f"restart {r.id}")
        if self.upgrade:
            r.version = PROTOCOL_VERSION
        r.start()
        if self.mqtt is not None:
            self.mqtt.restarted()
        for n in self.net.graph.neighbors(r.id):
            self.schedule(0.02, lambda n=n: self.net.try_connect(r.id, n))

    def thaw(self, r: SimRouter) -> None:
        if r.alive and r.frozen:
            self.note(f"thaw {r.id}")
            r.frozen = False
            # what the kernel buffered while it was stopped (client connections that closed) is read
            # before its timers fire: asyncio runs socket events ahead of due timers in a loop pass
            late, r.late = r.late, []
            for fn in late:
                fn()
            r.tick(r.incarnation)

    def frozen_timeout(self, r: SimRouter) -> None:
        """Peers stop hearing a frozen router: after dead_after they drop their connections, and
        clients (idle timeout) fail over."""
        if not (r.alive and r.frozen):
            return
        for n in self.net.graph.neighbors(r.id):
            self.net.reset(r.id, n)
        for sid, (link, sub) in list(r.sub_links.items()):
            del r.sub_links[sid]
            # the router notices the client's connection drop only when it thaws
            self.schedule(0.0, lambda r=r, link=link, sid=sid: self._late_detach(r, link, sid))
            self.client_event(lambda sub=sub, link=link: self.sub_lost(sub, link))
        for tok, pub in list(r.pub_links.items()):
            self.schedule(0.0, lambda r=r, tok=tok: self._late_pub_detach(r, tok))
            self.client_event(lambda pub=pub, tok=tok: self.pub_lost(pub, tok))

    def stopped(self, r: SimRouter) -> None:
        """A router's process stopped (SIGSTOP): unless it goes on before, its peers and clients
        time it out after dead_after."""
        stop, inc = r.loop.stops, r.incarnation
        self.schedule(DEAD_AFTER, lambda: self.stop_timeout(r, stop, inc))

    def stop_timeout(self, r: SimRouter, stop: int, inc: int) -> None:
        """Peers stop hearing a stopped router and drop their connections; its clients (idle
        timeout) say goodbye and fail over. What they said before, and their goodbyes, wait in its
        sockets: it reads them when it goes on, in the passes the edge's rules decide."""
        if not (r.alive and r.loop.stopped and r.loop.stops == stop and r.incarnation == inc):
            return
        self.note(f"{r.id} timed out by its peers and clients")
        for n in self.net.graph.neighbors(r.id):
            self.net.reset(r.id, n)
        for sid, (link, sub) in list(r.sub_links.items()):
            del r.sub_links[sid]
            r.awaiting.pop(sid, None)
            r.take(link, lambda link=link, sid=sid: r.sub_detach(link, sid), eof=True)
            self.client_event(lambda sub=sub, link=link: self.sub_lost(sub, link))
        for tok, pub in list(r.pub_links.items()):
            r.take(tok, lambda tok=tok: self._pub_detach_now(r, tok), eof=True)
            self.client_event(lambda pub=pub, tok=tok: self.pub_lost(pub, tok))

    def _pub_detach_now(self, r: SimRouter, tok: Token) -> None:
        r.pub_links.pop(tok, None)
        r.core.detach_publisher(tok)

    def check_handover(self, r: SimRouter, sid: str, gid: str) -> None:
        """The router view's rule (spark/routerview.py): no hand-over of a message to a subscription
        after the subscription's acceptance of it was taken (at any router), unless the life that
        took the acceptance has ended since (a crash loses it, as if lost on the wire). A hand-over
        into the link of a client that has left is no less one: the log shows it, and a client
        other than ours cannot be told apart from one that received it."""
        acc = self.accepted_by.get((sid, gid))
        decided = r.loop.input_time()  # (the log's stamp: docs/settlement-log.md, "Times")
        if acc is None or decided <= acc[2]:
            return
        rid, inc, at = acc
        life = self.routers[rid]
        if life.alive and life.incarnation == inc:
            raise Violation(f"router {r.id} delivered {gid} to {sid} again after the acceptance "
                            f"(taken by {rid} at {at - 1000:.4f})")

    def took_acceptance(self, r: SimRouter, sid: str, gid: str) -> None:
        """`r` logged an acceptance (a subscriber's ACCEPTED, or presented on resume): the first one
        of a life still running counts."""
        acc = self.accepted_by.get((sid, gid))
        if acc is not None and self.routers[acc[0]].alive and self.routers[acc[0]].incarnation == acc[1]:
            return
        self.accepted_by[(sid, gid)] = (r.id, r.incarnation, r.loop.input_time())

    def _late_detach(self, r: SimRouter, link: Token, sid: str) -> None:
        if r.alive and not r.frozen:
            r.sub_detach(link, sid)
            r.process()
        elif r.alive:
            r.late.append(lambda: self._late_detach(r, link, sid))

    def _late_pub_detach(self, r: SimRouter, tok: Token) -> None:
        if r.alive and not r.frozen:
            r.pub_links.pop(tok, None)
            r.core.detach_publisher(tok)
            r.process()
        elif r.alive:
            r.late.append(lambda: self._late_pub_detach(r, tok))

    def mend(self, k: frozenset[str], a: str, b: str) -> None:
        if k in self.net.cut:
            self.note(f"mend {a}-{b}")
            self.net.cut.discard(k)
            self.net.try_connect(a, b)

    # -- causal order ------------------------------------------------------------------------------
    def client_of(self, name: str) -> str:
        """The AMQP container id of a client link: s{i} and p{i} are one client in causal runs."""
        if not self.causal:
            return "c-sub" if name.startswith("s") else ""
        return f"c{name[1:]}"

    def _client_sub(self, p: SimPublisher) -> SimSubscriber | None:
        return next((s for s in self.subs if s.name[1:] == p.name[1:]), None)

    def _presented_past(self, p: SimPublisher) -> list[tuple[str, str]]:
        """`oncemesh.causal-past` of publisher p's client: per publisher link the latest message its
        subscriber was handed, and the latest p published."""
        s = self._client_sub(p)
        out = [(global_id(plid, counter_tag(seq)), TOPIC) for (sid, plid), seq in sorted(self.last_seq.items())
               if s is not None and sid == s.sid and seq >= 0]
        sent = [g for g in self.published_at if g[:PLID_LEN] == p.plid]
        if sent:
            out.append((max(sent, key=lambda g: counter_seq(g) or 0), TOPIC))
        return out

    def _client_history(self, p: SimPublisher) -> set[str]:
        """What the router learns from that presentation, in the checker's terms: everything its
        subscriber was handed and everything it published (not what those depended on)."""
        s = self._client_sub(p)
        handed = set(self.sequence.get(s.sid, [])) if s is not None else set()
        return handed | {g for g in self.published_at if g[:PLID_LEN] == p.plid}

    def check_causal_order(self) -> None:
        """No subscription was handed a message before one its publisher depended on (as far as
        the routers it published through could know) when it got both."""
        for sid, seq in self.sequence.items():
            pos = {g: k for k, g in enumerate(seq)}
            for k, b in enumerate(seq):
                for a in self.deps.get(b, ()):
                    if pos.get(a, -1) > k:
                        raise Violation(f"causal order: {sid} was handed {b} before {a}, which its publisher "
                                        "had been handed (or had published) before publishing it")

    # -- subscribers ---------------------------------------------------------------------------
    def sub_connect(self, s: SimSubscriber) -> None:
        if s.router is not None or not s.wants:
            return
        for url in s.urls:
            r = self.routers[url]
            if r.accepting():
                s.urls = s.urls[1:] + s.urls[:1]
                break
        else:
            self.schedule(0.3, lambda: self.sub_connect(s))
            return
        link = Token(f"{s.name}@{r.id}")
        s.router, s.link, s.open = r.id, link, False
        s.arrived.clear()
        s.on_link.clear()
        old = r.sub_links.get(s.sid)
        r.sub_links[s.sid] = (link, s)
        if old is not None and old[0] is not link:
            pass
        # our client presents the latest message of each publisher it was handed (FIFO)
        last = [global_id(plid, counter_tag(seq)) for (sid, plid), seq in sorted(self.last_seq.items())
                if sid == s.sid and seq >= 0]
        if self.sequence.get(s.sid):  # and the latest handed of all (total order)
            last.append(self.sequence[s.sid][-1])
        if s.group:  # a member: of shared subscription s.group, named s.group_name, global
            att = SubscriberAttach(s.group, s.filter, "", s.group_name, float("inf"), True, sorted(s.accepted),
                                   s.epoch, tuple(last), member=s.sid, member_name=s.link_name)
        else:
            att = SubscriberAttach(s.sid, s.filter, self.client_of(s.name), s.name, float("inf"), True,
                                   sorted(s.accepted), s.epoch, tuple(last), selector=s.selector)
        r.subscriber_attach(link, s, att)

    def sub_redirected(self, s: SimSubscriber, link: Token, home: str | None) -> None:
        """A member's attach was refused with amqp:link:redirect: it tries the home it names next
        (as our client does when it knows that address), a moment later."""
        if s.link is not link:
            return
        s.router, s.link, s.open = None, None, False
        if home is not None and home in s.urls:
            s.urls.remove(home)
            s.urls.insert(0, home)
        self.schedule(self.rng.uniform(0.01, 0.2), lambda: self.sub_connect(s))

    def sub_opened(self, s: SimSubscriber, link: Token, rid: str, epoch: int | None = None) -> None:
        if s.link is not link:
            return
        s.open = True
        if epoch is not None:
            s.epoch = epoch
        if s.in_force_since is None:
            s.in_force_since = self.now
        r = self.routers[rid]
        if not r.alive or r.sub_links.get(s.sid, (None,))[0] is not link:
            return
        s.credit = self.rng.randint(1, 30)

        def grant() -> None:
            if r.sub_links.get(s.sid, (None,))[0] is link:
                r.sub_credit(s.sid, s.credit)
                r.process()

        if r.frozen:
            r.late.append(grant)  # the flow frame waits in the socket until the router runs again
        elif not r.take(link, grant):
            grant()
        self.schedule(self.rng.uniform(0.001, 0.05), lambda: self.sub_work(s, link))

    def sub_receive(self, s: SimSubscriber, link: Token, gid: str, rid: str) -> None:
        if s.link is not link:
            return
        if gid in s.accepted or gid in s.settled:
            raise Violation(f"router {rid} handed {gid} again to {s.name}, whose client holds it")
        if gid in s.on_link:
            raise Violation(f"{gid} delivered twice on one link to {s.name}")
        s.credit -= 1
        s.on_link.add(gid)
        s.arrived.append(gid)

    def sub_work(self, s: SimSubscriber, link: Token) -> None:
        if s.link is not link or not s.open:
            return
        r = self.routers[s.router] if s.router else None
        if r is None or not r.reached():
            self.schedule(0.05, lambda: self.sub_work(s, link))
            return
        rng = self.rng
        if s.group and rng.random() < 0.02:  # a member leaves (an AMQP detach), and comes back later
            self.note(f"{s.name} detaches, {len(s.arrived)} not handed over")
            self.sub_disconnect(s, clean=True)
            self.schedule(rng.uniform(0.05, 0.5), lambda: self.sub_connect(s))
            return
        n = rng.randint(0, len(s.arrived))
        batch = s.arrived[:n]  # handed in arrival order (as our client does), accepted in any order
        del s.arrived[:n]
        for gid in batch:
            key = (s.acct, gid)
            self.handed[key] = self.handed.get(key, 0) + 1
            if self.handed[key] > 1:
                raise Violation(f"{gid} handed twice to {s.name}" if not s.group else
                                f"{gid} handed to two members of shared subscription {s.group_name} ({s.name} second)")
            self.sequence.setdefault(s.sid, []).append(gid)
            if self.causal and (s.sid, gid) in self.delivered_by:
                rid, life = self.delivered_by[(s.sid, gid)]
                self.cpast.setdefault((self.client_of(s.name), rid, life), set()).update(
                    {gid} | self.deps.get(gid, set()))
            seq = counter_seq(gid)
            last = self.last_seq.get((s.sid, gid[:PLID_LEN]), -1)
            if seq is not None and seq < last and not self.total and not s.group and (
                    self.mqtt is None or not self.mqtt.unordered(gid)):  # (an MQTT client's: as they come)
                raise Violation(f"FIFO: {gid} (seq {seq}) handed to {s.name} after seq {last} of its publisher")
            self.last_seq[(s.sid, gid[:PLID_LEN])] = max(last, seq if seq is not None else -1)
        rng.shuffle(batch)
        if r.sub_links.get(s.sid, (None,))[0] is not link:
            # the router closed this link (a drain) and the client does not know yet: it hands over
            # and accepts, the ACCEPTED is lost with the connection (it presents them where it resumes)
            s.accepted.update(batch)
            return
        now: list[str] = []  # ACCEPTEDs taken at once: one core call for them, as the router's engine does
        for i, gid in enumerate(batch):
            s.accepted.add(gid)
            if rng.random() < 0.03:  # the ACCEPTED is lost with the connection
                self.note(f"{s.name} loses its connection after handing {gid}")
                s.accepted.update(batch[i + 1:])  # handed: the store holds them all
                if now:
                    r.sub_outcomes(s.sid, now)
                self.sub_disconnect(s)
                self.schedule(rng.uniform(0.01, 0.3), lambda: self.sub_connect(s))
                return
            if not r.take(link, lambda gid=gid: r.on_link(s.sid, link) and r.sub_outcome(s.sid, gid)):
                now.append(gid)
        if now:
            r.sub_outcomes(s.sid, now)
        more = rng.randint(0, 10)
        s.credit += more
        if not r.take(link, lambda c=s.credit: r.on_link(s.sid, link) and r.sub_credit(s.sid, c)):
            r.sub_credit(s.sid, s.credit)
            r.process()
        self.schedule(rng.uniform(0.001, 0.08), lambda: self.sub_work(s, link))

    def sub_final(self, s: SimSubscriber, link: Token, gids: list[str], settle: bool) -> None:
        if s.link is not link:
            return
        if not settle:
            s.credit -= 1
        for g in gids:
            s.on_link.discard(g)
            if settle and g in s.arrived:  # settled before we took it: withdrawn, never handed
                s.arrived.remove(g)
            if g in s.accepted:
                s.accepted.discard(g)
                s.settled.add(g)

    def sub_disconnect(self, s: SimSubscriber, clean: bool = False) -> None:
        """Its connection drops (`clean`: it detaches its link, after every disposition it sent)."""
        r = self.routers[s.router] if s.router else None
        link = s.link
        s.router, s.link, s.open = None, None, False
        s.arrived.clear()
        s.on_link.clear()
        if r is not None and r.alive and link is not None and r.sub_links.get(s.sid, (None,))[0] is link:
            del r.sub_links[s.sid]
            r.awaiting.pop(s.sid, None)
            if r.frozen:
                self.schedule(0.0, lambda: self._late_detach(r, link, s.sid))
            elif not r.take(link, lambda: r.sub_detach(link, s.sid, clean=clean), eof=True):
                r.sub_detach(link, s.sid, clean=clean)
                r.process()

    def sub_lost(self, s: SimSubscriber, link: Token) -> None:
        if s.link is not link:
            return
        s.router, s.link, s.open = None, None, False
        s.arrived.clear()
        s.on_link.clear()
        self.schedule(self.rng.uniform(0.01, 0.3), lambda: self.sub_connect(s))

    # -- publishers ----------------------------------------------------------------------------
    def pub_connect(self, p: SimPublisher) -> None:
        if p.router is not None:
            return
        for url in p.urls:
            r = self.routers[url]
            if r.accepting():
                p.urls = p.urls[1:] + p.urls[:1]
                break
        else:
            self.schedule(0.3, lambda: self.pub_connect(p))
            return
        link = Token(f"{p.name}@{r.id}")
        p.router, p.link, p.credit = r.id, link, 0
        p.token_of.clear()
        r.pub_links[link] = p
        past: list[tuple[str, str]] = []
        if self.causal:  # as our client library does: what its subscriber was handed, what it published
            past = self._presented_past(p)
            key = (self.client_of(p.name), r.id, r.incarnation)
            self.cpast.setdefault(key, set()).update(self._client_history(p))
        in_doubt: list[bytes] | None = list(p.in_doubt.values())
        seq: int | None = p.seq
        if p.by_id:  # a client not ours: it declares nothing
            in_doubt = seq = None
        if not r.take(link, lambda: r.core.attach_publisher(link, p.plid, p.topic, True, in_doubt, self.now, seq,
                                                            client=self.client_of(p.name), past=past,
                                                            by_id=p.by_id, user=p.name)):
            r.core.attach_publisher(link, p.plid, p.topic, True, in_doubt, self.now, seq,
                                    client=self.client_of(p.name), past=past, by_id=p.by_id, user=p.name)
            r.process()
        self.schedule(0.001, lambda: self.pub_work(p, link))

    def pub_credit(self, p: SimPublisher, link: Token, n: int) -> None:
        if p.link is link:
            p.credit += n

    def pub_work(self, p: SimPublisher, link: Token) -> None:
        if p.link is not link:
            return
        r = self.routers[p.router] if p.router else None
        if r is None or not r.reached():
            self.schedule(0.05, lambda: self.pub_work(p, link))
            return
        if link not in r.pub_links:
            return  # the router closed this link (a drain): what it would send is lost with it; it moves
        resend = [g for g in p.in_doubt if g not in p.token_of.values()]
        for gid in resend:  # everything in doubt first, same tags
            if p.credit <= 0:
                break
            self._send(p, r, link, gid, p.in_doubt[gid])
        burst = self.rng.randint(0, 5)
        while p.credit > 0 and p.to_publish > 0 and burst > 0:
            tag = counter_tag(p.seq)
            p.seq += 1
            p.to_publish -= 1
            burst -= 1
            gid = p.gid(tag)
            self.owed[gid] = {s.acct for s in self.subs if s.in_force_since is not None and s.ended_at is None
                              and (s.filter == p.topic or matches(s.filter, p.topic))
                              and (not s.selector or owed_by_selector(s.selector, tag))}
            self.published_at[gid] = self.now
            if self.mqtt is not None:
                self.mqtt.amqp_published(gid)
            p.in_doubt[gid] = tag
            self._send(p, r, link, gid, tag)
        if not r.loop.busy():
            r.process()
        self.schedule(self.rng.uniform(0.002, 0.05), lambda: self.pub_work(p, link))

    def _send(self, p: SimPublisher, r: SimRouter, link: Token, gid: str, tag: bytes) -> None:
        tok = Token(f"d-{gid}")
        p.token_of[tok] = gid
        p.credit -= 1
        r.pub_tokens[tok] = p
        if self.causal:
            key = (self.client_of(p.name), r.id, r.incarnation)
            past = {g for g in self.cpast.get(key, ()) if g[:PLID_LEN] != p.plid}
            if gid not in self.deps:
                self.deps[gid] = past
            elif gid not in r.core.records:
                # a resend (declared in doubt) through a router without its record: it gets no
                # dependencies there, and its copies from there may reach a subscription first
                self.deps[gid] = set()
            self.cpast.setdefault(key, set()).add(gid)
        tag, payload = p.message(gid, tag)
        if not r.take(link, lambda: r.core.publish(link, tok, tag, payload, self.now)):
            r.core.publish(link, tok, tag, payload, self.now)

    def pub_outcome(self, p: SimPublisher, tok: Token, outcome: Outcome, rid: str) -> None:
        gid = p.token_of.pop(tok, None)
        if gid is None:
            return
        if outcome is Outcome.ACCEPTED:
            for sid in self.owed.get(gid, ()):
                sub = next(s for s in self.subs if s.acct == sid)
                if self.handed.get((sid, gid), 0) != 1 and sub.ended_at is None:
                    raise Violation(f"false ACCEPTED for {gid} at {rid}: {sub.name} in force, not handed")
            if self.mqtt is not None:
                self.mqtt.check_taken(gid, f"false ACCEPTED at {rid}")
        self.outcomes[gid] = outcome
        p.in_doubt.pop(gid, None)
        r = self.routers.get(rid)
        if r is not None and r.alive and p.link is not None and p.router == rid:
            def settle() -> None:
                r.core.publisher_settled(tok, self.now)
                r.process()

            if r.frozen:
                r.late.append(settle)  # TCP holds the settlement until the router runs again
            elif not r.take(p.link, settle):
                settle()

    def pub_disconnect(self, p: SimPublisher) -> None:
        r = self.routers[p.router] if p.router else None
        link = p.link
        p.router, p.link = None, None
        p.token_of.clear()
        if r is not None and r.alive and link is not None:
            if r.frozen:
                self.schedule(0.0, lambda: self._late_pub_detach(r, link))
            elif r.take(link, lambda: self._pub_detach_now(r, link), eof=True):
                pass
            else:
                r.pub_links.pop(link, None)
                r.core.detach_publisher(link)
                r.process()

    def pub_lost(self, p: SimPublisher, link: Token | None) -> None:
        if p.link is not link:
            return
        p.router, p.link = None, None
        p.token_of.clear()
        self.schedule(self.rng.uniform(0.01, 0.3), lambda: self.pub_connect(p))

    # -- the end -------------------------------------------------------------------------------
    def final_checks(self) -> None:
        if not self.healed:
            raise Violation("the simulation ran out of events before the faults healed")
        stuck = [p.name for p in self.pubs if p.in_doubt or p.to_publish]
        if stuck:
            raise Violation(f"publishers still in doubt after healing: {stuck} "
                            f"({sum(len(p.in_doubt) for p in self.pubs)} messages)")
        for r in self.routers.values():
            if r.core.records:
                raise Violation(f"router {r.id} still holds {len(r.core.records)} records, e.g. "
                                f"{sorted(r.core.records)[:3]}")
        for gid, sids in self.owed.items():
            for sid in sids:
                n = self.handed.get((sid, gid), 0)
                if n != 1:
                    raise Violation(f"{gid} handed {n} times to {sid}")
        for s in self.subs:
            if s.accepted:
                raise Violation(f"{s.name} never saw {sorted(s.accepted)[:3]} settled")
        if self.total:
            self.check_total_order()
        if self.causal:
            self.check_causal_order()
        if self.mqtt is not None:
            self.mqtt.final_checks()

    def check_total_order(self) -> None:
        """Every two subscriptions were handed the messages they both got in the same order."""
        subs = sorted(self.sequence)
        for i, a in enumerate(subs):
            pos = {g: k for k, g in enumerate(self.sequence[a])}
            for b in subs[i + 1:]:
                common = [g for g in self.sequence[b] if g in pos]
                for x, y in zip(common, common[1:], strict=False):
                    if pos[x] > pos[y]:
                        raise Violation(f"total order: {b} was handed {x} before {y}, {a} the other way")

    def describe(self) -> str:
        return "\n".join(self.log[-60:])
