"""MQTT clients in the mesh simulator: the real session state machine and the real resume rules.

Each simulated router (simulator.py's `SimRouter`) gets an `EdgeSim` per life: the glue of
router/mqtt/edge.py without bytes. Packets are the objects of router/mqtt/packets.py; each client
connection is the real `MqttConnection` (router/mqtt/session.py); what it asks is carried out on
the router's real `DeliveryCore` as edge.py does (publisher links, publish, settle, attach,
dispositions, credit); its sessions go to the node's real keeper (`node.keeper.put/fetch/drop`,
its outputs read after every step as interrouter/mesh.py does); which session a connection gets and
what the core is declared and presented are router/mqtt/resume.py's decisions. A router that dies
loses its sessions; its clients resume at another router from the keeper's copy.

The clients (`MqttPub`, `MqttSub`) behave as a correct MQTT 5 client with a persistent session
(clean start 0, session expiry one hour): a QoS 2 publisher that after every reconnect resends each
PUBLISH not PUBREC'd (DUP, same packet id) and PUBREL for each PUBREC'd and not PUBCOMP'd, in the
order it first sent them, and reuses a packet id once its exchange ended; a QoS 2 subscriber that
answers PUBREC and then PUBCOMP, and hands a message to its application once (MQTT 5 4.3.3: a
PUBLISH under a packet id it holds un-PUBREL'd is not handed again). Each names its messages in the
payload (`name`), as an application would see them.

Checked (a `Violation`): no message handed twice to an MQTT subscriber's application; a PUBREC (or
an AMQP publisher's ACCEPTED) only when every subscription in force when the message was first sent
(MQTT or AMQP) has taken it; a client whose session the mesh should hold is never told "session
present 0"; at the end: every PUBLISH got PUBREC and PUBCOMP, every message owed to each
subscription handed exactly once (MQTT publishers' messages to AMQP subscribers too, under one gid);
and, once healed, no client whose session is held nowhere. Besides the simulator's random kills, the
router of a busy MQTT client is killed at random (`MqttSim.chaos`): its exchanges in the middle.

Not simulated: QoS 0 and 1, wills, shared subscriptions, authentication and policy limits, keep
alive, unsubscribes; faults other than kill/restart (freeze, stop, starve, partitions and resets
are refused for MQTT runs). Known limits of docs/mqtt.md ("Sessions across routers") are avoided by
the faults and the clients' choices, not checked: one router down at a time, with time for the
keepers to settle after a restart (`SETTLE`); a client fails over to the next live router of its own
list that can reach a router holding its session or a copy (`MqttSim.choose`: in line3 with B down,
A and C cannot reach each other, and a session kept at A is not found from C). The MQTT
publishers' messages are not checked for FIFO (an MQTT client's are taken as they come).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import networkx as nx

from oncemesh.common import errors
from oncemesh.common.amqpmsg import read_to
from oncemesh.common.topics import check_filter, check_name, is_wildcard
from oncemesh.common.vocab import Outcome
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
from oncemesh.router.core import SubscriberAttach
from oncemesh.router.mqtt import resume
from oncemesh.router.mqtt.mapping import Decoded, NotAMessage, to_amqp
from oncemesh.router.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Properties,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Reason,
    Suback,
    SubOptions,
    Subscribe,
)
from oncemesh.router.mqtt.session import (
    Close,
    Credit,
    Limits,
    Login,
    MqttConnection,
    PublishMsg,
    Release,
    SessionState,
    Settled,
    SubscribeTo,
    SubState,
    UnsubscribeFrom,
)
from tests.sim.kernel import Violation

if TYPE_CHECKING:
    from tests.sim.simulator import SimRouter, Simulation

EXPIRY = 3600  # the clients' session expiry (s): sessions outlive every fault of a run
SETTLE = 2.5  # seconds after a restart before another kill (the keepers choose again and put)
DATA = b"\x00\x53\x75\xa0"  # an AMQP data section (vbin8): the AMQP publishers' messages in MQTT runs


def amqp_data(name: str) -> bytes:
    b = name.encode()
    return DATA + bytes((len(b),)) + b


# ---------------------------------------------------------------------- the router side
class Conn:
    """One client connection, both ends: the client's (`client`) and the router's (`conn`, the real
    session state machine, and what edge.py's `MqttPeer` keeps of it)."""

    def __init__(self, sim: Simulation, client: MqttClient, edge: EdgeSim) -> None:
        from tests.sim.simulator import Token

        self.client = client
        self.edge = edge
        self.up = Token(f"{client.cid}@{edge.r.id}>")  # (FIFO keys: one per direction)
        self.down = Token(f"{client.cid}@{edge.r.id}<")
        self.conn = MqttConnection(edge.limits, sim.now)
        self.links: dict[int, PubLink] = {}
        self.pubs: dict[bytes, PubTok] = {}
        self.backlog: list[PublishMsg] = []
        self.mine: list[SubTok] = []
        self.pending: list[tuple[int, tuple[SubState, ...], list[int], set[int]]] = []
        self.fetch = False
        self.closing = False
        self.client_id = ""
        self.client_open = True  # the client's end (False: it dropped the connection)


class PubLink:
    __slots__ = ("conn", "qos", "credit", "plid")

    def __init__(self, conn: Conn, qos: int, plid: str) -> None:
        self.conn, self.qos, self.credit, self.plid = conn, qos, 0, plid


class PubTok:
    __slots__ = ("conn", "pid", "qos", "tag")

    def __init__(self, conn: Conn, pid: int, qos: int, tag: bytes) -> None:
        self.conn, self.pid, self.qos, self.tag = conn, pid, qos, tag


class SubTok:
    __slots__ = ("conn", "sub", "att", "resumed", "answered")

    def __init__(self, conn: Conn, sub: SubState, att: SubscriberAttach) -> None:
        self.conn, self.sub, self.att = conn, sub, att
        self.resumed = self.answered = False


class EdgeSim:
    """One router life's MQTT listener (router/mqtt/edge.py's `MqttEdge` and `MqttPeer`, no bytes)."""

    def __init__(self, m: MqttSim, r: SimRouter) -> None:
        self.m = m
        self.sim = m.sim
        self.r = r
        self.inc = r.incarnation
        self.limits = Limits()
        self.sessions: dict[str, SessionState] = {}
        self.peers: dict[str, Conn] = {}
        self.conns: list[Conn] = []
        self.subs: dict[str, SubTok] = {}
        self.awaiting: dict[str, list[SubTok]] = {}
        self.fetching: dict[str, list[Conn]] = {}
        self.decoded = Decoded()

    def live(self) -> bool:
        return self.r.alive and self.r.incarnation == self.inc and self.r.mqtt is self

    # -- input from a client ---------------------------------------------------------------------
    def received(self, c: Conn, pkt: Any) -> None:
        if not self.live() or c not in self.conns:
            return
        c.conn.received(pkt, self.sim.now)
        self.r.process()

    def lost(self, c: Conn) -> None:
        if not self.live() or c not in self.conns:
            return
        c.conn.lost()
        self.r.process()

    # -- once per step of the router's processing --------------------------------------------------
    def step(self) -> bool:
        """Keeper outputs in, asks carried out, sessions put, packets out. True when it did something
        that may have given the core work."""
        keeper = self.r.node.keeper
        did = False
        if keeper.kept or keeper.fetched or keeper.lonely or keeper.orphaned:
            kept, fetched, lonely, orphaned = keeper.kept, keeper.fetched, keeper.lonely, keeper.orphaned
            keeper.kept, keeper.fetched, keeper.lonely, keeper.orphaned = [], [], [], []
            self.keeper_outputs(kept, fetched, lonely, orphaned)
            did = True
        for c in list(self.conns):
            while c.conn.asks:
                did = True
                self.carry_out(c)
        now = self.sim.now
        for c in sorted(self.conns, key=lambda c: c.client_id):
            st = c.conn.session
            if st is not None and c.conn.dirty and c.conn.replicate:
                c.conn.dirty = False
                keeper.put(st.client_id, st.seq, st.image(), now)
                did = True
        for c in list(self.conns):
            self.flush(c)
        return did

    def flush(self, c: Conn) -> None:
        out, c.conn.out = c.conn.out, []
        for pkt in out:
            self.sim.client_event(partial(c.client.receive, c, pkt), c.down)
        if c.closing:
            self.conns.remove(c)
            self.sim.client_event(lambda: c.client.lost(c), c.down)

    def keeper_outputs(self, kept: list[tuple[str, int]], fetched: list[tuple[str, dict[str, Any] | None]],
                       lonely: list[str], orphaned: list[tuple[str, dict[str, Any]]]) -> None:
        for cid, seq in kept:
            st = self.sessions.get(cid)
            resume.kept_seq(st, seq)
            c = self.peers.get(cid)
            if c is not None and c.conn.session is st:
                c.conn.replicate = True
                c.conn.kept(seq)
        for cid in lonely:
            c = self.peers.get(cid)
            if c is not None and c.conn.replicate:
                c.conn.unreplicated()
        for cid, image in fetched:
            for c, answer in resume.fetch_answers(image, self.fetching.pop(cid, [])):
                self.fetched(c, answer)
        for cid, image in orphaned:  # (router/server.py `keeper_outputs`)
            for d in resume.orphan_declarations(cid, image):
                self.r.core.publisher_gone(d.plid, d.in_doubt, d.mark, self.sim.now)

    def carry_out(self, c: Conn) -> None:
        asks, c.conn.asks = c.conn.asks, []
        now = self.sim.now
        core = self.r.core
        for a in asks:
            t = type(a)
            if t is PublishMsg:
                self.publish(c, a)
            elif t is Settled:
                core.subscriber_outcome(a.sid, a.gid, Outcome.ACCEPTED if a.accepted else Outcome.REJECTED,
                                        a.settled, None, False, now)
            elif t is Credit:
                core.subscriber_credit(a.sid, a.n)
            elif t is Release:
                pub = c.pubs.pop(a.tag, None)
                if pub is not None:
                    core.publisher_settled(pub, now)
                else:
                    core.publisher_released(c.links.get(2), a.tag, now)
            elif t is SubscribeTo:
                self.attach(c, a.pid, a.subs)
            elif t is UnsubscribeFrom:
                raise AssertionError("the simulated clients never unsubscribe")
            elif t is Login:
                self.admit(c, a.connect)
            elif t is Close:
                self.close(c, a)

    # -- CONNECT (edge.py `_admit`, `fetched`) -------------------------------------------------------
    def admit(self, c: Conn, connect: Connect) -> None:
        cid = connect.client_id
        old = self.peers.get(cid)
        st = self.sessions.get(cid)
        if old is not None and old is not c:  # (taken over: MQTT 3.1.4-3)
            old.conn._close(Reason.SESSION_TAKEN_OVER, "another connection took the session over", will=False)
            self.carry_out(old)
            st = self.sessions.get(cid)
        if resume.needs_fetch(connect.clean_start, True, c.fetch, st is not None, self.peers.get(cid) is not None):
            c.fetch = True
            c.client_id = cid
            self.fetching.setdefault(cid, []).append(c)
            self.r.node.keeper.fetch(cid, self.sim.now, resume.patient_fetch(st is not None))
            return
        c.client_id = cid
        expiry = c.conn.session_expiry()
        present, ends = resume.admit(st, connect.clean_start)
        if st is not None and ends:
            raise AssertionError("the simulated clients never start clean")
        if st is None:
            st = resume.new_session(cid, "", expiry, int(self.sim.now * 1e9))
            self.sessions[cid] = st
        else:
            st.expiry = expiry
        self.peers[cid] = c
        c.conn.replicate = True
        c.conn.accepted(st, present, None)
        st.restored = False
        self.m.note(f"{self.r.id}: {cid} connected, present={present} seq={st.seq}")
        now = self.sim.now
        for d in resume.publisher_links(st):
            link = c.links[d.qos] = PubLink(c, d.qos, d.plid)
            self.r.core.attach_publisher(link, d.plid, "", d.second, d.in_doubt, now, mark=d.mark,
                                         client=f"mqtt:{cid}", ordered=d.ordered)
        resubs = resume.resubscriptions(st, present)
        if resubs:
            self.attach(c, 0, resubs)

    def fetched(self, c: Conn, image: dict[str, Any] | None) -> None:
        if not c.fetch or c.closing or c not in self.conns:
            return
        local = self.sessions.get(c.client_id)
        st = resume.fetched_session(c.client_id, image, local, self.peers.get(c.client_id) is not None,
                                    self.sim.now)
        if st is not None:
            self.sessions[c.client_id] = st
        assert c.conn.connect is not None
        self.admit(c, c.conn.connect)

    # -- PUBLISH (edge.py `_publish`, `_submit`, `outcome`) ---------------------------------------------
    def publish(self, c: Conn, a: PublishMsg) -> None:
        if check_name(a.topic) is not None:
            c.conn.outcome(a.pid, Reason.TOPIC_NAME_INVALID)
            return
        link = c.links[1 if a.qos < 2 else 2]
        if link.credit <= 0 or c.backlog:
            c.backlog.append(a)
            return
        self.submit(c, link, a)

    def submit(self, c: Conn, link: PubLink, a: PublishMsg) -> None:
        now = self.sim.now
        payload = to_amqp(a.topic, a.content, int(now * 1000))
        self.decoded.remember(payload, a.content)
        pub = PubTok(c, a.pid, a.qos, a.tag)
        link.credit -= 1
        if a.qos == 2:
            c.pubs[a.tag] = pub
        gid = self.r.core.publish(link, pub, a.tag, payload, now, topic=a.topic)
        if gid:
            self.m.named(gid, a.content.payload.decode())

    def credit_came(self, c: Conn) -> None:
        while c.backlog:
            a = c.backlog[0]
            link = c.links[1 if a.qos < 2 else 2]
            if link.credit <= 0:
                return
            c.backlog.pop(0)
            self.submit(c, link, a)

    # -- SUBSCRIBE (edge.py `_attach`, `_after_attach`, `mesh_answered`, `_answer`) ------------------------
    def attach(self, c: Conn, pid: int, subs: tuple[SubState, ...]) -> None:
        st = c.conn.session
        assert st is not None
        codes = [0] * len(subs)
        waiting: set[int] = set()
        now = self.sim.now
        for i, sub in enumerate(subs):
            if check_filter(sub.match) is not None:
                codes[i] = Reason.TOPIC_FILTER_INVALID
                continue
            att = resume.attach_args(c.client_id, "", sub, st, resume.presented(st, sub))
            sub.sid = att.member or att.sid
            old = self.subs.get(sub.sid)
            if old is not None and old in old.conn.mine:
                old.conn.mine.remove(old)
            tok = SubTok(c, sub, att)
            try:
                tok.resumed = self.r.core.attach(tok, att, now)
            except errors.OncemeshError as exc:
                self.m.note(f"{self.r.id}: {c.client_id} attach refused: {exc}")
                codes[i] = Reason.UNSPECIFIED_ERROR
                continue
            self.subs[sub.sid] = tok
            c.mine.append(tok)
            codes[i] = sub.qos
            waiting.add(i)
        entry = (pid, subs, codes, waiting)
        c.pending.append(entry)
        self.r.process()
        for i in sorted(waiting):
            tok2 = self.subs.get(subs[i].sid)
            if tok2 is None or tok2.conn is not c:
                continue
            if self.r.node.attach_pending(tok2.att.sid):
                self.awaiting.setdefault(tok2.att.sid, []).append(tok2)
                continue
            self.answer(tok2)
        self.maybe_suback(c)
        self.r.process()

    def attach_done(self, sid: str, refused: str | None) -> None:
        for tok in self.awaiting.pop(sid, []):
            if self.subs.get(tok.sub.sid) is not tok or tok.answered:
                continue
            if refused is not None:
                if not self.r.core.resume_refused(tok, tok.att, self.sim.now, refused):
                    tok.answered = True
                    for _pid, subs, codes, waiting in tok.conn.pending:
                        for i, s in enumerate(subs):
                            if s.sid == tok.sub.sid and i in waiting:
                                codes[i] = Reason.NOT_AUTHORIZED
                                waiting.discard(i)
                    self.maybe_suback(tok.conn)
                    continue
                tok.resumed = False
            self.answer(tok)
            self.maybe_suback(tok.conn)

    def answer(self, tok: SubTok) -> None:
        tok.answered = True
        tok.conn.conn.in_force(tok.sub.sid)
        for _pid, subs, _codes, waiting in tok.conn.pending:
            for i, s in enumerate(subs):
                if s.sid == tok.sub.sid:
                    waiting.discard(i)

    def maybe_suback(self, c: Conn) -> None:
        for p in list(c.pending):
            pid, subs, codes, waiting = p
            if waiting:
                continue
            c.pending.remove(p)
            if pid:
                c.conn.subscribed(pid, subs, tuple(codes))
            elif c.conn.session is not None:
                for sub, code in zip(subs, codes, strict=True):
                    if code >= 0x80:
                        c.conn.session.subs.pop(sub.topic_filter, None)

    # -- the core's actions (edge.py `MqttEdge.perform`) ---------------------------------------------
    def perform(self, act: Any) -> bool:
        t = type(act)
        if t is Deliver:
            s = self.subs.get(act.sid)
            if s is None:
                return False
            self.sim.check_handover(self.r, self.r.core.member_sid.get(act.sid, act.sid), act.gid)
            topic = s.sub.match
            if is_wildcard(topic):
                topic = read_to(act.payload) or topic
            try:
                content = self.decoded.content(act.payload, int(self.sim.now * 1000))
            except NotAMessage as exc:
                raise Violation(f"{act.gid} to {act.sid}: not a message ({exc})") from None
            s.conn.conn.deliver(act.sid, act.gid, topic, content, act.redelivery)
            return True
        if t is SendOutcome:
            pub = act.pub
            if type(pub) is not PubTok:
                return False
            reason = 0 if act.outcome is Outcome.ACCEPTED else Reason.UNSPECIFIED_ERROR
            if pub.qos == 2 and reason >= 0x80:
                pub.conn.pubs.pop(pub.tag, None)
                self.r.core.publisher_settled(pub, self.sim.now)
            pub.conn.conn.outcome(pub.pid, reason)
            return True
        if t is SettlePublisher:
            return type(act.pub) is PubTok
        if t is GrantCredit:
            link = act.link
            if type(link) is not PubLink:
                return False
            link.credit += act.credit
            self.credit_came(link.conn)
            return True
        if t is SettleDelivery:
            s = self.subs.get(act.sid)
            if s is None:
                return False
            s.conn.conn.final(act.sid, act.gid)
            return True
        if t is NotifyFinal:
            s = self.subs.get(act.sid)
            if s is None:
                return False
            s.conn.conn.notified(act.sid, act.gids)
            return True
        if t is DrainCredit:
            return act.sid in self.subs
        if t is DetachLink:
            s = act.link
            if type(s) is not SubTok:
                return False
            if self.subs.get(s.sub.sid) is s:
                del self.subs[s.sub.sid]
            if s in s.conn.mine:
                s.conn.mine.remove(s)
            self.m.note(f"{self.r.id}: {s.conn.client_id} subscription detached: {act.description}")
            if s.conn.conn.session is not None:
                s.conn.conn.session.subs.pop(s.sub.topic_filter, None)
            s.conn.conn._close(Reason.ADMINISTRATIVE_ACTION, f"subscription detached: {act.description}", will=True)
            return True
        return False

    # -- the end (edge.py `_close`) ----------------------------------------------------------------
    def close(self, c: Conn, a: Close) -> None:
        if c.closing:
            return
        c.closing = True
        now = self.sim.now
        st = c.conn.session
        self.m.note(f"{self.r.id}: {c.client_id or '?'} closed: {a.why}")
        if st is not None and self.peers.get(st.client_id) is c:
            del self.peers[st.client_id]
        clean = a.why == "the client disconnected"
        for tok in c.mine:
            if self.subs.get(tok.sub.sid) is tok:
                del self.subs[tok.sub.sid]
                ended = st is None or st.expiry == 0
                self.r.core.detach_subscriber(tok, tok.sub.sid, ended, now, clean=clean or ended)
        c.mine.clear()
        for link in c.links.values():
            self.r.core.detach_publisher(link)
        c.pubs.clear()
        c.backlog.clear()
        if st is not None:
            st.ended_at = now
            if c.conn.dirty:  # (its last changes, kept too)
                c.conn.dirty = False
                self.r.node.keeper.put(st.client_id, st.seq, st.image(), now)


# ---------------------------------------------------------------------- the clients
class MqttClient:
    """A client with a persistent session that fails over to another live router."""

    def __init__(self, m: MqttSim, cid: str, urls: list[str]) -> None:
        self.m = m
        self.sim = m.sim
        self.cid = cid
        self.urls = urls
        self.c: Conn | None = None
        self.open = False
        self.has_session = False  # a router took our CONNACK: a session of ours lives somewhere
        # the mesh acknowledged something of it (a SUBACK, a PUBREC, a PUBLISH to us: each goes out
        # only once the keeper holds what it depends on): "session present 0" now would lose it.
        # Before, it loses nothing: the client begins again (what it sent was never published, as
        # its name was never kept, unless its router had no keeper: then `choose` kept it near)
        self.acked = False
        self.connects = 0

    def connect(self) -> None:
        sim = self.sim
        if self.c is not None:
            return
        r = self.m.choose(self)
        if r is None:
            sim.schedule(0.3, self.connect)
            return
        edge = r.mqtt
        assert edge is not None
        c = Conn(sim, self, edge)
        edge.conns.append(c)
        self.c, self.open = c, False
        self.connects += 1
        self.m.note(f"{self.cid} connects to {r.id}")
        self.send(Connect(level=5, clean_start=False, keep_alive=0, client_id=self.cid,
                          properties=Properties(session_expiry_interval=EXPIRY)))

    def send(self, pkt: Any) -> None:
        c = self.c
        assert c is not None
        edge = c.edge
        self.sim.client_event(lambda: edge.received(c, pkt), c.up)

    def drop(self) -> None:
        """The connection drops (the client's side first: the router reads the end after what it sent)."""
        c = self.c
        if c is None:
            return
        self.m.note(f"{self.cid} drops its connection")
        self.c, self.open = None, False
        c.client_open = False
        edge = c.edge
        self.sim.client_event(lambda: edge.lost(c), c.up)
        self.sim.schedule(self.sim.rng.uniform(0.01, 0.4), self.connect)

    def lost(self, c: Conn) -> None:
        if self.c is not c:
            return
        self.m.note(f"{self.cid} lost its connection to {c.edge.r.id}")
        self.c, self.open = None, False
        self.sim.schedule(self.sim.rng.uniform(0.01, 0.3), self.connect)

    def receive(self, c: Conn, pkt: Any) -> None:
        if self.c is not c:
            return
        if type(pkt) is Connack:
            if pkt.reason_code >= 0x80:
                raise Violation(f"{self.cid} refused at {c.edge.r.id}: 0x{pkt.reason_code:02x}")
            if self.acked and not pkt.session_present:
                raise Violation(f"{self.cid}: session present 0 at {c.edge.r.id}: the mesh lost its session")
            self.has_session = True
            self.open = True
            self.connected(pkt.session_present)
        elif type(pkt) is Disconnect:
            self.m.note(f"{self.cid} told DISCONNECT 0x{pkt.reason_code:02x} by {c.edge.r.id}")
        else:
            self.acked = True
            self.packet(pkt)

    def connected(self, present: bool) -> None:
        raise NotImplementedError

    def packet(self, pkt: Any) -> None:
        raise NotImplementedError


class MqttPub(MqttClient):
    """A QoS 2 publisher of `to_publish` messages, named `CID:N`, at most `window` in flight."""

    def __init__(self, m: MqttSim, cid: str, urls: list[str], to_publish: int) -> None:
        super().__init__(m, cid, urls)
        self.to_publish = to_publish
        self.n = 0
        self.window = m.sim.rng.randint(1, 8)
        self.inflight: dict[int, list[Any]] = {}  # pid -> [name, stage "sent" | "rec"] (in send order)
        self.recd: set[str] = set()
        self.comp: set[str] = set()

    def connected(self, present: bool) -> None:
        for pid, (name, stage) in list(self.inflight.items()):
            if stage == "sent":
                self.send(Publish("t", name.encode(), 2, dup=present, packet_id=pid))
            else:
                self.send(Pubrel(pid))
        self.sim.schedule(self.sim.rng.uniform(0.001, 0.03), partial(self.work, self.c))

    def work(self, c: Conn | None) -> None:
        if c is None or self.c is not c or not self.open:
            return
        burst = self.sim.rng.randint(0, 3)
        while burst and self.to_publish and len(self.inflight) < self.window:
            burst -= 1
            self.to_publish -= 1
            name = f"{self.cid}:{self.n}"
            self.n += 1
            pid = 1
            while pid in self.inflight:
                pid += 1
            self.inflight[pid] = [name, "sent"]
            self.m.first_sent(name)
            self.send(Publish("t", name.encode(), 2, packet_id=pid))
        self.sim.schedule(self.sim.rng.uniform(0.002, 0.05), lambda: self.work(c))

    def packet(self, pkt: Any) -> None:
        t = type(pkt)
        if t is Pubrec:
            e = self.inflight.get(pkt.packet_id)
            if e is None:
                return
            if pkt.reason_code >= 0x80:
                raise Violation(f"{self.cid}: PUBREC {pkt.packet_id} ({e[0]}) refused 0x{pkt.reason_code:02x}")
            if e[1] == "sent":
                self.m.pubrec(e[0], self.c)
                self.recd.add(e[0])
                e[1] = "rec"
            self.send(Pubrel(pkt.packet_id))
        elif t is Pubcomp:
            e = self.inflight.get(pkt.packet_id)
            if e is None or e[1] != "rec":
                return
            if pkt.reason_code not in (Reason.SUCCESS, Reason.PACKET_IDENTIFIER_NOT_FOUND):
                raise Violation(f"{self.cid}: PUBCOMP {pkt.packet_id} ({e[0]}) 0x{pkt.reason_code:02x}")
            # (0x92: the exchange ended at the router before, its PUBCOMP lost with the connection)
            del self.inflight[pkt.packet_id]
            self.comp.add(e[0])


class MqttSub(MqttClient):
    """A QoS 2 subscriber to `t`."""

    def __init__(self, m: MqttSim, cid: str, urls: list[str]) -> None:
        super().__init__(m, cid, urls)
        self.subscribed = False
        self.in_force_since: float | None = None
        self.held: set[int] = set()  # packet ids received, not PUBREL'd (MQTT 5 4.3.3)
        self.sid = ""

    def connected(self, present: bool) -> None:
        if not present:
            self.subscribed = False  # (a SUBSCRIBE not answered yet: sent again)
        if not self.subscribed:
            self.send(Subscribe(1, (("t", SubOptions(qos=2)),)))

    def packet(self, pkt: Any) -> None:
        t = type(pkt)
        if t is Suback:
            if pkt.reason_codes != (2,):
                raise Violation(f"{self.cid}: SUBACK {pkt.reason_codes}")
            if not self.subscribed:
                self.subscribed = True
                self.in_force_since = self.sim.now
                c = self.c
                assert c is not None
                st = c.edge.sessions.get(self.cid)
                self.sid = st.subs["t"].sid if st is not None else ""
        elif t is Publish:
            pid = pkt.packet_id
            if pkt.qos != 2 or pid is None:
                raise Violation(f"{self.cid}: a QoS {pkt.qos} PUBLISH on a QoS 2 subscription")
            if pid not in self.held:
                self.held.add(pid)
                self.m.handed(self, pkt.payload.decode())
            elif not pkt.dup:
                self.m.note(f"{self.cid}: PUBLISH {pid} again without DUP")
            if self.sim.rng.random() < 0.02:
                self.drop()  # (the PUBREC lost with the connection)
                return
            self.send(Pubrec(pid))
        elif t is Pubrel:
            self.held.discard(pkt.packet_id)
            self.send(Pubcomp(pkt.packet_id))


# ---------------------------------------------------------------------- the run's MQTT side
class MqttSim:
    """The MQTT clients of a simulation, their routers' listeners, and the checks."""

    def __init__(self, sim: Simulation, n_pubs: int, n_subs: int, messages: int) -> None:
        self.sim = sim
        names = sorted(sim.routers)
        rng = sim.rng
        self.pubs = [MqttPub(self, f"mp{i}", rng.sample(names, len(names)), messages) for i in range(n_pubs)]
        self.subs = [MqttSub(self, f"ms{i}", rng.sample(names, len(names))) for i in range(n_subs)]
        self.owed: dict[str, set[str]] = {}  # message name -> subscriptions owed it (MQTT cid / AMQP acct)
        self.handed_n: dict[tuple[str, str], int] = {}  # (MQTT client id, name) -> times handed
        self.gids: dict[str, set[str]] = {}  # MQTT publishers' message name -> its gids with the cores
        self.mqtt_gids: set[str] = set()
        self.cids = {cl.cid for cl in [*self.pubs, *self.subs]}
        self.last_restart = -1e9
        self.kills = 0

    def note(self, text: str) -> None:
        self.sim.note(text)

    def edge_for(self, r: SimRouter) -> EdgeSim:
        return EdgeSim(self, r)

    def start(self) -> None:
        for cl in [*self.subs, *self.pubs]:
            self.sim.schedule(self.sim.rng.uniform(0.3, 1.5) if cl in self.subs else self.sim.rng.uniform(1.0, 2.5),
                              cl.connect)
        self.sim.schedule(0.2, self.chaos)

    def chaos(self) -> None:
        sim = self.sim
        if sim.healed:
            return
        cl: MqttClient = sim.rng.choice([*self.pubs, *self.subs])
        r = sim.rng.random()
        if cl.c is not None and cl.open and r < 0.15:
            cl.drop()
        elif cl.c is not None and sim.faults.kill and r < 0.35:
            # the router of a busy client dies (its exchanges in the middle): what the keeper holds
            # of its session is all that is left
            victim = cl.c.edge.r
            if victim.alive and sim.may_kill(victim):
                sim.note(f"kill {victim.id} (the router of {cl.cid})")
                sim.kill(victim)
                sim.schedule(sim.rng.uniform(0.3, 2.0), lambda: sim.restart(victim))
        sim.schedule(sim.rng.uniform(0.1, 0.5), self.chaos)

    # -- faults ------------------------------------------------------------------------------------
    def may_kill(self, victim: SimRouter) -> bool:
        """One router down at a time, and none within `SETTLE` of a restart (docs/mqtt.md: "One crash
        at a time": a session's router and its keeper dying together loses it)."""
        return (all(r.alive for r in self.sim.routers.values())
                and self.sim.now - self.last_restart > SETTLE)

    def restarted(self) -> None:
        self.last_restart = self.sim.now

    def router_died(self, r: SimRouter) -> None:
        self.kills += 1
        edge = r.mqtt
        if edge is None:
            return
        for c in list(edge.conns):
            if c.client_open:
                self.sim.client_event(partial(c.client.lost, c), c.down)

    def heal(self) -> None:
        for cl in [*self.pubs, *self.subs]:
            if cl.c is None:
                cl.connect()

    def choose(self, cl: MqttClient) -> SimRouter | None:
        """The router a client connects to: the next live one of its list that can reach a router
        holding its session or a copy of it (docs/mqtt.md, "Where it stops": a router that cannot
        reach the keeper starts a new session; in line3 with B down, A and C cannot reach each other)."""
        sim = self.sim
        able: set[str] | None = None
        if cl.has_session:
            live = sim.net.graph.subgraph([r.id for r in sim.routers.values() if r.alive])
            able = set()
            for r in sim.routers.values():
                if r.alive and r.mqtt is not None and (cl.cid in r.mqtt.sessions or cl.cid in r.node.keeper.kept_here):
                    able |= nx.node_connected_component(live, r.id)
            if not able and cl.acked and sim.healed and all(r.alive for r in sim.routers.values()):
                raise Violation(f"{cl.cid}: no router holds its session or a copy of it (lost after "
                                f"{self.kills} kills, one at a time)")
        for i, name in enumerate(cl.urls):
            r = sim.routers[name]
            if r.accepting() and r.mqtt is not None and (able is None or name in able):
                cl.urls = cl.urls[i + 1:] + cl.urls[:i + 1]
                return r
        return None

    # -- accounting and checks -----------------------------------------------------------------------
    def in_force(self) -> set[str]:
        """The subscriptions (MQTT client ids, AMQP accts) in force on topic t now."""
        out = {s.cid for s in self.subs if s.in_force_since is not None}
        out.update(s.acct for s in self.sim.subs if s.in_force_since is not None and s.ended_at is None
                   and s.filter == "t")
        return out

    def first_sent(self, name: str) -> None:
        self.owed[name] = self.in_force()

    def amqp_published(self, gid: str) -> None:
        """An AMQP publisher's message (named by its gid) is first sent: what MQTT subscribers it owes."""
        self.owed[gid] = {s.cid for s in self.subs if s.in_force_since is not None}

    def named(self, gid: str, name: str) -> None:
        if name in self.owed and gid != name:
            self.gids.setdefault(name, set()).add(gid)
            self.mqtt_gids.add(gid)

    def unordered(self, gid: str) -> bool:
        """A gid of an MQTT publisher's message (taken in the order it comes, never FIFO)."""
        return gid in self.mqtt_gids

    def handed(self, s: MqttSub, name: str) -> None:
        key = (s.cid, name)
        n = self.handed_n[key] = self.handed_n.get(key, 0) + 1
        if n > 1:
            raise Violation(f"{name} handed twice to MQTT subscriber {s.cid}")

    def taken(self, sub: str, name: str) -> int:
        """Times subscription `sub` (MQTT client id or AMQP acct) was handed message `name`."""
        if sub in self.cids:
            return self.handed_n.get((sub, name), 0)
        gids = self.gids.get(name, {name})
        return sum(self.sim.handed.get((sub, g), 0) for g in gids)

    def check_taken(self, name: str, what: str) -> None:
        for sub in sorted(self.owed.get(name, ())):
            amqp = next((s for s in self.sim.subs if s.acct == sub), None)
            if amqp is not None and amqp.ended_at is not None:
                continue
            if self.taken(sub, name) != 1:
                raise Violation(f"{what} for {name}: subscription {sub} in force, handed "
                                f"{self.taken(sub, name)} times")

    def pubrec(self, name: str, c: Conn | None) -> None:
        self.check_taken(name, f"PUBREC (from {c.edge.r.id if c else '?'})")

    def quiet(self) -> bool:
        if any(p.inflight or p.to_publish or p.c is None or not p.open for p in self.pubs):
            return False
        return all(not s.held and s.c is not None and s.open for s in self.subs)

    def final_checks(self) -> None:
        for p in self.pubs:
            if p.inflight or p.to_publish:
                raise Violation(f"{p.cid}: {len(p.inflight)} PUBLISHes in flight, {p.to_publish} unsent at the end")
            for i in range(p.n):
                name = f"{p.cid}:{i}"
                if name not in p.recd or name not in p.comp:
                    raise Violation(f"{name}: PUBREC {name in p.recd}, PUBCOMP {name in p.comp} at the end")
        for name in sorted(self.owed):
            self.check_taken(name, "at the end")
            if len(self.gids.get(name, ())) > 1:
                raise Violation(f"{name} was published under {len(self.gids[name])} gids: {sorted(self.gids[name])}")

