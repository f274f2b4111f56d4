"""The MQTT listener of a router (`mqtt_listen`): bytes <-> packets <-> the delivery core.

Theory of operation
-------------------
Each TCP (or TLS) connection is an `MqttPeer`: it decodes the client's packets (codec.py), hands them
to its sans-IO `MqttConnection` (session.py), performs what that asks of the router by calling the
delivery core as the AMQP adapter does (router/server.py), with the decisions about sessions (fetch
first or not, which session wins, what the core is declared and presented) taken by resume.py, the
rules the mesh simulator runs too (tests/sim/mqtt_sim.py), and writes the packets it answers with
once per loop pass, after the settlement log's lines of the pass (the engine's dirty set: the same
write-ahead rule as for AMQP connections). The core's actions for an MQTT client come here through
the server (`perform`): a Deliver to a subscription of an MQTT session, an outcome for an MQTT
PUBLISH.

What the core sees of an MQTT client is what it sees of one of our AMQP clients:
- publisher links `mqtt:CLIENT` / `qos1:NONCE` (outcome settles) and `qos2:NONCE` (the client
  settles: PUBREL), both anonymous relays (each message names its topic), declaring in doubt the
  tags of the session's PUBLISHes not answered yet when they attach again;
- one subscription per filter, sid = subscription_id(CLIENT, FILTER, FILTER) (a `$share/G/F` one:
  member of the global shared subscription G on F), presenting at attach what the client accepted
  and was not told final; capable (it takes FINAL notifications: QoS 2 PUBREL).
Sessions live in this router's memory (`sessions`) for their expiry after the connection ends.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, final

from ...common import errors
from ...common.amqpmsg import read_to
from ...common.engine import MAX_PASSWORD_CHECKS, Accepted
from ...common.ids import publisher_link_id
from ...common.tls import peer_common_name
from ...common.topics import check_filter, check_name, is_wildcard
from ...common.vocab import Outcome
from ..actions import Deliver, DetachLink, DrainCredit, NotifyFinal, SendOutcome, SettleDelivery
from ..admission import passwords_in_clear
from ..core import SubscriberAttach
from . import resume
from .codec import Decoder, MqttError, encode
from .mapping import Decoded, NotAMessage, to_amqp
from .packets import Connect, Publish, Reason
from .session import (
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
    content_of,
)

Router = Any  # router/server.py's Router (not imported: the server imports this module)

log = logging.getLogger("oncemesh.mqtt")

_REASON_OF_CONDITION = {
    errors.UnauthorizedAccess.condition: Reason.NOT_AUTHORIZED,
    errors.InvalidAddress.condition: Reason.TOPIC_NAME_INVALID,
    errors.MessageTooLarge.condition: Reason.PACKET_TOO_LARGE,
    errors.ResourceLimitExceeded.condition: Reason.QUOTA_EXCEEDED,
    errors.NotImplementedMode.condition: Reason.IMPLEMENTATION_SPECIFIC_ERROR,
}


@final
class PubLink:
    """A session's publisher link with the core (the token the core keys it by). `ctx` and
    `local_active` and `flow` are what the server's GrantCredit path reads of a link."""

    __slots__ = ("peer", "qos", "credit", "ctx")

    def __init__(self, peer: MqttPeer, qos: int) -> None:
        self.peer = peer
        self.qos = qos
        self.credit = 0
        self.ctx: object | None = self

    @property
    def local_active(self) -> bool:
        return self.ctx is not None

    def flow(self, n: int) -> None:
        self.credit += n
        self.peer.credit_came()


@final
class Pub:
    """One MQTT PUBLISH with the core (a publisher delivery's token)."""

    __slots__ = ("peer", "pid", "qos", "tag")

    def __init__(self, peer: MqttPeer, pid: int, qos: int, tag: bytes) -> None:
        self.peer = peer
        self.pid = pid
        self.qos = qos
        self.tag = tag


@final
class SubLink:
    """One filter of a connected session with the core (its link token)."""

    __slots__ = ("peer", "sub", "att", "table_sid", "resumed", "answered", "relayed")

    def __init__(self, peer: MqttPeer, sub: SubState, att: SubscriberAttach, table_sid: str) -> None:
        self.peer = peer
        self.sub = sub
        self.att = att
        self.table_sid = table_sid
        self.resumed = False
        self.answered = False
        self.relayed = False  # a member of a shared subscription homed at another router, relayed there


@final
class _PendingSubscribe:
    """A SUBSCRIBE being answered: each filter's code once its attach is in force."""

    __slots__ = ("pid", "subs", "codes", "waiting")

    def __init__(self, pid: int, subs: tuple[SubState, ...]) -> None:
        self.pid = pid
        self.subs = subs
        self.codes: list[int] = [0] * len(subs)
        self.waiting: set[int] = set()


class MqttEdge:
    """The router's MQTT side: its listener, its sessions, and the core's actions for them."""

    def __init__(self, router: Router) -> None:
        self.router = router
        cfg = router.cfg
        self.limits = Limits(receive_maximum=cfg.mqtt_receive_maximum,
                             maximum_packet_size=cfg.max_message_size + 1024,
                             session_expiry_max=cfg.max_expiry)
        self.sessions: dict[str, SessionState] = {}
        self.peers: dict[str, MqttPeer] = {}  # client id -> its connection
        self.subs: dict[str, SubLink] = {}  # sid with the core -> the connected filter
        self.awaiting: dict[str, list[SubLink]] = {}  # table sid -> attaches waiting for the mesh
        self.server: asyncio.Server | None = None
        self.bound: tuple[str, int] | None = None
        self.connections: set[MqttPeer] = set()
        self.counters = {"mqtt_connections": 0, "mqtt_refused": 0, "mqtt_protocol_errors": 0,
                         "mqtt_sessions_restored": 0, "mqtt_sessions_unkept": 0}
        self.fetching: dict[str, list[MqttPeer]] = {}  # client id -> connections waiting for its session
        self.wills: dict[str, tuple[float, MqttPeer]] = {}  # client id -> (when, the ended connection): delayed wills
        self.to_put: set[MqttPeer] = set()  # sessions changed this pass: their image goes to the keeper
        self._put_scheduled = False
        self.decoded = Decoded()  # (what an MQTT subscriber is sent, read once per message here)

    # ------------------------------------------------------------ keepers (interrouter/keeper.py)
    def want_put(self, peer: MqttPeer) -> None:
        self.to_put.add(peer)
        if not self._put_scheduled:
            self._put_scheduled = True
            engine = self.router.engine
            assert engine is not None
            engine.call_after_pass(self._put)

    def _put(self) -> None:
        """Once per pass: each session that changed goes to its keeper (one image, the newest)."""
        self._put_scheduled = False
        mesh = self.router.mesh
        peers, self.to_put = self.to_put, set()
        now = time.time()
        for peer in sorted(peers, key=lambda p: p.client_id):
            st = peer.conn.session
            if st is None or mesh is None or not peer.conn.dirty:
                continue
            peer.conn.dirty = False
            mesh.keep_session(st.client_id, st.seq, st.image(), now)

    def keeper_outputs(self, kept: list[tuple[str, int]], fetched: list[tuple[str, dict[str, Any] | None]],
                       lonely: list[str]) -> None:
        for cid, seq in kept:
            st = self.sessions.get(cid)
            resume.kept_seq(st, seq)
            peer = self.peers.get(cid)
            if peer is not None and peer.conn.session is st:
                if not peer.conn.replicate:
                    peer.conn.replicate = True  # (a keeper again: changes wait for it again)
                    peer.lonely = False
                peer.conn.kept(seq)
                peer.after()
        for cid in lonely:
            peer = self.peers.get(cid)
            if peer is not None and peer.conn.replicate:
                peer.conn.unreplicated()
                if not peer.lonely:
                    peer.lonely = True
                    self.counters["mqtt_sessions_unkept"] += 1
                    log.warning("mqtt.session_unkept client=%s: no other router can keep a copy of its session "
                                "(none reachable that speaks it): it goes on, and a crash of this router now "
                                "loses its QoS 2 state (docs/mqtt.md)", cid)
                peer.after()
        for cid, image in fetched:
            if image is not None:
                self.counters["mqtt_sessions_restored"] += 1
            for peer, answer in resume.fetch_answers(image, self.fetching.pop(cid, [])):
                peer.fetched(answer)
                peer.after()

    async def start(self, host: str, port: int) -> None:
        from ...common import engine as amqp
        engine = self.router.engine
        assert engine is not None
        self.server = await amqp.listen(engine, lambda: MqttPeer(self), host, port,
                                        tls=self.router.client_tls)
        sock = self.server.sockets[0].getsockname()
        self.bound = (sock[0], sock[1])
        log.info("mqtt.started listen=%s:%d tls=%s", sock[0], sock[1], self.router.client_tls is not None)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for peer in list(self.connections):
            peer.abort()

    # ------------------------------------------------------------ the core's actions
    def perform(self, act: Any) -> bool:
        """An action of the core for something not the AMQP side's: True when it was ours."""
        if type(act) is Deliver:
            s = self.subs.get(act.sid)
            if s is None:
                return False
            s.peer.deliver(s, act.gid, act.payload, act.redelivery)
            return True
        if type(act) is SendOutcome:
            pub = act.pub
            if type(pub) is not Pub:
                return False
            pub.peer.outcome(pub, act.outcome, act.error)
            return True
        if type(act) is SettleDelivery:
            s = self.subs.get(act.sid)
            if s is None:
                return False
            s.peer.conn.final(act.sid, act.gid)
            s.peer.touch()
            return True
        if type(act) is NotifyFinal:
            s = self.subs.get(act.sid)
            if s is None:
                return False
            s.peer.conn.notified(act.sid, act.gids)
            s.peer.touch()
            s.peer.carry_out()  # (inside the router's drain)
            return True
        if type(act) is DrainCredit:
            return act.sid in self.subs
        if type(act) is DetachLink:
            s = act.link
            if type(s) is not SubLink:
                return False
            s.peer.detached(s, act.condition, act.description)
            return True
        return False

    def relay_answered(self, mids: list[str]) -> None:
        """Relayed members whose home took them (interrouter/members.py): their SUBACK may go."""
        for mid in mids:
            tok = self.subs.get(mid)
            if tok is not None and tok.relayed and not tok.answered:
                tok.peer._answer(tok)
                tok.peer._suback_ready()

    def attach_done(self, table_sid: str, refused: str | None) -> None:
        """The mesh acknowledged (or refused) the announcement of a subscription's attach."""
        for s in self.awaiting.pop(table_sid, []):
            if self.subs.get(s.att.member or s.att.sid) is s and not s.answered:
                s.peer.mesh_answered(s, refused)

    def tick(self, now: float) -> None:
        for peer in list(self.connections):
            peer.conn.tick(now)
            if peer.conn.asks or peer.conn.out:
                peer.after()
        for cid, (due, gone) in sorted(self.wills.items()):
            if now >= due:
                del self.wills[cid]
                gone._will(now)
        for cid, st in list(self.sessions.items()):
            if st.ended_at is not None and now - st.ended_at > st.expiry:
                del self.sessions[cid]
                self.dropped(cid, now)
                log.info("mqtt.session_expired client=%s", cid)

    def dropped(self, cid: str, now: float) -> None:
        """A session ended here: its keeper forgets it."""
        if self.router.mesh is not None:
            self.router.mesh.drop_session(cid, now)

    def stats(self) -> dict[str, int]:
        return {**self.counters, "mqtt_sessions": len(self.sessions), "mqtt_connected": len(self.peers)}


class MqttPeer(Accepted):
    """One MQTT client connection."""

    def __init__(self, edge: MqttEdge) -> None:
        self.edge = edge
        self.router = edge.router
        self.core = edge.router.core
        now = time.time()
        self.conn = MqttConnection(edge.limits, now)
        self.decoder = Decoder(max_packet_size=edge.limits.maximum_packet_size)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.dirty = False
        self.closing = False
        self.user = ""
        self.links: dict[int, PubLink] = {}  # QoS 1 and 2 publisher links
        self.pubs: dict[bytes, Pub] = {}  # tag -> the QoS 2 PUBLISH awaiting PUBREL, on this connection
        self.backlog: list[PublishMsg] = []  # PUBLISHes waiting for the core's credit
        self.mine: list[SubLink] = []
        self.pending: dict[int, _PendingSubscribe] = {}
        self.client_id = ""
        self.fetch: tuple[str, str | None] | None = None  # (user, assigned id) while its session is fetched
        self.counted: tuple[str, str] | None = None  # (user, host) counted against the connection limits
        self.lonely = False  # its session has no keeper (logged once)

    # ------------------------------------------------------------ asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.edge.connections.add(self)
        self.edge.counters["mqtt_connections"] += 1
        r = self.router
        if len(self.edge.connections) + len(r.connections) > r.cfg.max_connections:
            # (the router's connections, AMQP and MQTT: max_connections)
            log.warning("mqtt.connection_refused peer=%s reason=max_connections limit=%d", self.peer,
                        r.cfg.max_connections)
            self.edge.counters["mqtt_refused"] += 1
            self.closing = True
            transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        now = time.time()
        try:
            packets = self.decoder.feed(data)
        except MqttError as exc:
            self.edge.counters["mqtt_protocol_errors"] += 1
            log.warning("mqtt.bad_packet peer=%s client=%s reason=0x%02x error=%s", self.peer, self.client_id,
                        exc.reason, exc)
            self.conn.failed(exc)
            self.after()
            return
        for pkt in packets:
            self.conn.received(pkt, now)
        # (what the packets of one read asked, carried out in order and drained once: a drain per
        # packet cost ~4 drains per message, measured)
        if packets:
            self.after()

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.lost()
        self.after()
        self.edge.connections.discard(self)

    def abandon(self) -> None:
        self.edge.connections.discard(self)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # ------------------------------------------------------------ output
    def touch(self) -> None:
        if self.conn.dirty and self.conn.replicate:
            self.edge.want_put(self)
        if not self.dirty and self.conn.out:
            self.dirty = True
            engine = self.router.engine
            assert engine is not None
            engine.mark_dirty(self)

    def flush(self) -> None:
        out, self.conn.out = self.conn.out, []
        if self.transport is None or self.transport.is_closing() or not out:
            return
        level = self.conn.level
        self.transport.write(b"".join([encode(p, level) for p in out]))
        if self.closing:
            self.transport.close()

    # ------------------------------------------------------------ what the session asks
    def after(self) -> None:
        """Carry out what the session asked, then let the router perform the core's actions."""
        self.carry_out()
        self.router.drain()
        self.touch()

    def carry_out(self) -> None:
        """Carry out what the session asked (inside the router's drain: its loop performs what the
        core decides of it)."""
        while self.conn.asks:
            self._carry_out()

    def _carry_out(self) -> None:
        asks, self.conn.asks = self.conn.asks, []
        for a in asks:
            if type(a) is PublishMsg:
                self._publish(a)
            elif type(a) is Settled:
                self._sub_outcome(a.sid, a.gid, Outcome.ACCEPTED if a.accepted else Outcome.REJECTED, a.settled, None)
            elif type(a) is Credit:
                tok = self.edge.subs.get(a.sid)
                if tok is not None and tok.relayed and self.router.mesh is not None:
                    self.router.mesh.relay_credit(a.sid, a.n, False, time.time())
                else:
                    self.core.subscriber_credit(a.sid, a.n)
            elif type(a) is Release:
                self._release(a.tag)
            elif type(a) is SubscribeTo:
                self._subscribe(a)
            elif type(a) is UnsubscribeFrom:
                self._unsubscribe(a)
            elif type(a) is Login:
                self._login(a)
            elif type(a) is Close:
                self._close(a)

    # ------------------------------------------------------------ CONNECT
    def _login(self, a: Login) -> None:
        c = a.connect
        r = self.router
        if r.users is not None and c.username is not None:
            # the password is checked off the loop (a salted hash: milliseconds of CPU), at most
            # MAX_PASSWORD_CHECKS at once as for AMQP's PLAIN; a failed login is throttled
            engine = r.engine
            assert engine is not None
            source = self.peer.rsplit(":", 1)[0]
            encrypted = self.transport is not None and self.transport.get_extra_info("ssl_object") is not None
            if not encrypted and not passwords_in_clear(r.cfg.passwords_without_tls, source):
                # (as for AMQP: a password in clear only where passwords_without_tls allows it)
                self.edge.counters["mqtt_refused"] += 1
                log.warning("mqtt.login_refused peer=%s user=%s reason=password_without_tls setting=%s", self.peer,
                            c.username, r.cfg.passwords_without_tls)
                self.conn.refused(Reason.NOT_AUTHORIZED, "a password in clear is refused here: connect over TLS")
                return
            if len(engine.checks) >= MAX_PASSWORD_CHECKS or r.throttle.wait(source, c.username, time.monotonic()) > 0:
                self.edge.counters["mqtt_refused"] += 1
                log.warning("mqtt.login_refused peer=%s user=%s reason=busy_or_throttled", self.peer, c.username)
                self.conn.refused(Reason.SERVER_BUSY, "too many logins now; try again later")
                return
            task = engine.loop.create_task(self._check_password(c.username, c.password or b"", source))
            engine.checks.add(task)
            task.add_done_callback(engine.checks.discard)
            return
        certified = self._certificate_name()
        if certified is not None:
            # a client certificate the TLS listener verified (tls_verify_clients) names the client,
            # as SASL EXTERNAL does for AMQP; a user name beside it must be the same
            if c.username is not None and c.username != certified:
                self.edge.counters["mqtt_refused"] += 1
                log.warning("mqtt.login_refused peer=%s user=%s certificate=%s", self.peer, c.username, certified)
                self.conn.refused(Reason.NOT_AUTHORIZED, "the user name is not the certificate's")
                return
            self._admit(c, certified)
            return
        if r.client_auth and not r.cfg.allow_anonymous:
            self.edge.counters["mqtt_refused"] += 1
            log.warning("mqtt.login_refused peer=%s reason=no_credentials", self.peer)
            self.conn.refused(Reason.NOT_AUTHORIZED, "this router wants a user name and password")
            return
        self._admit(c, "")

    def _within_connection_limits(self) -> bool:
        """The policy's connection limits, counted with the user's AMQP connections
        (`Router.count_connection`); False: refused (CONNACK 0x97)."""
        user, host = self.user or "anonymous", self.peer.rsplit(":", 1)[0]
        why = self.router.count_connection(user, host)
        if why is not None:
            self.edge.counters["mqtt_refused"] += 1
            self.conn.refused(Reason.QUOTA_EXCEEDED, why)
            return False
        self.counted = (user, host)
        return True

    def _uncount(self) -> None:
        if self.counted is not None:
            self.router.uncount_connection(*self.counted)
            self.counted = None

    def _certificate_name(self) -> str | None:
        """The common name of the client certificate the TLS listener verified (None: none)."""
        if self.transport is None or not self.router.cfg.tls_verify_clients:
            return None
        ssl_object = self.transport.get_extra_info("ssl_object")
        return peer_common_name(ssl_object.getpeercert()) if ssl_object is not None else None

    async def _check_password(self, user: str, password: bytes, source: str) -> None:
        r = self.router
        assert r.users is not None and r.engine is not None
        secret = r.users.secret(user)
        check = secret if secret is not None else r.users.decoy(user)  # (the same time for an unknown user)
        ok = await r.engine.loop.run_in_executor(None, check.check_password, password.decode("utf-8", "replace"))
        if self.closing:
            return
        if not ok or secret is None:
            r.throttle.failed(source, user, time.monotonic())
            self.edge.counters["mqtt_refused"] += 1
            log.warning("mqtt.login_failed peer=%s user=%s", self.peer, user)
            self.conn.refused(Reason.BAD_USER_NAME_OR_PASSWORD, "bad user name or password")
        else:
            r.throttle.succeeded(user)
            assert self.conn.connect is not None
            self._admit(self.conn.connect, user)
        self.after()

    def _admit(self, c: Connect, user: str) -> None:
        """The client is `user` ("" anonymous): find or make its session."""
        r = self.router
        self.user = user
        if self.counted is None and not self._within_connection_limits():
            return
        assigned = None
        cid = c.client_id
        if not cid:
            cid = assigned = f"auto-{r.id}-{time.time_ns():x}"
        old_peer = self.edge.peers.get(cid)
        pending_will = self.edge.wills.pop(cid, None)
        if pending_will is not None and c.clean_start:
            pending_will[1]._will(time.time())  # (its session ends now: the will goes now)
        elif pending_will is not None:
            log.info("mqtt.will_cancelled client=%s (back within its will delay)", cid)
        st = self.edge.sessions.get(cid)
        if st is not None and st.owner != user:
            self.edge.counters["mqtt_refused"] += 1
            log.warning("mqtt.takeover_refused peer=%s client=%s user=%s", self.peer, cid, user)
            self.conn.refused(Reason.NOT_AUTHORIZED, f"client id {cid!r} belongs to another identity")
            return
        if old_peer is not None and old_peer is not self:
            log.info("mqtt.session_taken_over client=%s old_peer=%s new_peer=%s", cid, old_peer.peer, self.peer)
            old_peer.taken_over()
            st = self.edge.sessions.get(cid)  # (gone if it ended with that connection)
        if resume.needs_fetch(c.clean_start, r.mesh is not None, self.fetch is not None, st is not None,
                              self.edge.peers.get(cid) is not None):
            # a session this router does not hold, or holds from a connection that ended: its keeper
            # may hold a newer one (its client went on at another router, which is gone now, or
            # not); CONNACK once the routers answered (interrouter/keeper.py, FETCH_TIMEOUT at most)
            self.fetch = (user, assigned)
            self.edge.fetching.setdefault(cid, []).append(self)
            self.client_id = cid
            r.mesh.fetch_session(cid, time.time(), resume.patient_fetch(st is not None))
            return
        self.client_id = cid
        expiry = self.conn.session_expiry()
        present, ends = resume.admit(st, c.clean_start)
        if st is not None and ends:
            self._end_session(st)
            st = None
        if st is None:
            # (its version starts at the time in microseconds, not 0: resume.new_session)
            st = resume.new_session(cid, user, expiry, time.time_ns())
            self.edge.sessions[cid] = st
        else:
            st.expiry = expiry
        self.edge.peers[cid] = self
        self.conn.replicate = r.mesh is not None
        self.conn.accepted(st, present, assigned)
        if st.restored:
            st.restored = False
            log.info("mqtt.session_restored client=%s seq=%d in=%d out=%d subs=%d", cid, st.seq, len(st.inbound),
                     len(st.outbound), len(st.subs))
        now = time.time()
        for d in resume.publisher_links(st):
            link = self.links[d.qos] = PubLink(self, d.qos)
            # (ordered=False: an MQTT client resends what it holds in doubt in its own order, e.g.
            # after a newer message; its messages are ordered as they come, never ended as late)
            self.core.attach_publisher(link, d.plid, "", d.second, d.in_doubt, now, mark=d.mark,
                                       client=f"mqtt:{cid}", user=user, ordered=d.ordered)
        resubs = resume.resubscriptions(st, present)
        if resubs:
            self._attach(0, resubs, tuple(False for _ in resubs))
        log.info("mqtt.connected peer=%s client=%s user=%s level=%d present=%s expiry=%s", self.peer, cid,
                 user or "-", c.level, present, "never" if math.isinf(st.expiry) else st.expiry)

    def fetched(self, image: dict[str, Any] | None) -> None:
        """The routers answered the fetch of this client's session: restore it, or begin a new one."""
        if self.fetch is None or self.closing:
            return
        user, assigned = self.fetch
        c = self.conn.connect
        assert c is not None
        local = self.edge.sessions.get(self.client_id)
        try:
            st = resume.fetched_session(self.client_id, image, local, self.edge.peers.get(self.client_id) is not None,
                                        time.time())
        except (KeyError, TypeError, ValueError) as exc:
            log.error("mqtt.session_image_unreadable client=%s error=%s", self.client_id, exc)
        else:
            if st is not None:
                if local is not None:  # (what this router held is older: the client went on elsewhere)
                    log.info("mqtt.session_newer_elsewhere client=%s here=%d there=%d", self.client_id, local.seq,
                             st.seq)
                self.edge.sessions[self.client_id] = st
        self._admit(c, user)

    def _end_session(self, st: SessionState) -> None:
        """A session that ends (clean start over it): its subscriptions end."""
        now = time.time()
        for sub in st.subs.values():
            s = self.edge.subs.get(sub.sid)
            if s is not None:
                del self.edge.subs[sub.sid]
                s.peer._sub_detach(s, True, True, now)
            else:
                self._end_unattached(sub, st, now)
        if self.edge.sessions.pop(st.client_id, None) is not None:
            self.edge.dropped(st.client_id, now)

    def _end_unattached(self, sub: SubState, st: SessionState, now: float) -> None:
        """End a subscription of a session that is not connected: attach it and detach it closed."""
        att = self._attach_args(sub, (), st)
        tok = SubLink(self, sub, att, att.sid)
        try:
            self.core.attach(tok, att, now)
        except errors.OncemeshError:
            return
        self.core.detach_subscriber(tok, sub.sid, True, now, clean=True)

    def taken_over(self) -> None:
        """Another connection took this client id over (MQTT 3.1.4-3)."""
        self.conn._close(Reason.SESSION_TAKEN_OVER, "another connection took the session over", will=False)
        self.after()

    # ------------------------------------------------------------ PUBLISH
    def _publish(self, a: PublishMsg) -> None:
        why = check_name(a.topic)
        reason = 0
        if why is not None:
            reason = Reason.TOPIC_NAME_INVALID
        elif a.topic[0] in "$_":
            why, reason = "topics starting with $ or _ are the routers'", Reason.TOPIC_NAME_INVALID
        else:
            grants = self._grants()
            limit = grants.limit("max_message_size") if grants is not None else None
            if grants is not None and not grants.may_publish(a.topic):
                why, reason = f"user {self.user!r} may not publish to {a.topic!r}", Reason.NOT_AUTHORIZED
            elif limit is not None and len(a.content.payload) > limit:
                why, reason = f"{len(a.content.payload)} bytes > max_message_size {limit}", Reason.QUOTA_EXCEEDED
        if why is not None:
            log.warning("mqtt.publish_refused client=%s topic=%r reason=%s", self.client_id, a.topic[:80], why)
            if a.qos:
                self.conn.outcome(a.pid, reason)
            return
        link = self.links[1 if a.qos < 2 else 2]
        if link.credit <= 0 or self.backlog:
            self.backlog.append(a)
            if self.transport is not None:
                self.transport.pause_reading()
            return
        self._submit(link, a)

    def _submit(self, link: PubLink, a: PublishMsg) -> None:
        now = time.time()
        payload = to_amqp(a.topic, a.content, int(now * 1000))
        self.edge.decoded.remember(payload, a.content)
        pub = Pub(self, a.pid, a.qos, a.tag)
        link.credit -= 1
        if a.qos == 2:
            self.pubs[a.tag] = pub
        try:
            self.core.publish(link, pub, a.tag, payload, now, topic=a.topic)
        except errors.RemoteProtocolError as exc:
            self.pubs.pop(a.tag, None)
            log.warning("mqtt.publish_failed client=%s condition=%s reason=%s", self.client_id, exc.condition, exc)
            if a.qos:
                self.conn.outcome(a.pid, Reason.IMPLEMENTATION_SPECIFIC_ERROR)
            return
        if a.qos == 0:
            self.core.publisher_settled(pub, now)

    def credit_came(self) -> None:
        while self.backlog:
            a = self.backlog[0]
            link = self.links[1 if a.qos < 2 else 2]
            if link.credit <= 0:
                return
            self.backlog.pop(0)
            self._submit(link, a)
        if self.transport is not None and not self.closing:
            self.transport.resume_reading()

    def outcome(self, pub: Pub, outcome: Outcome, error: tuple[str, str] | None) -> None:
        if outcome is Outcome.ACCEPTED:
            reason = 0
        else:
            reason = _REASON_OF_CONDITION.get(error[0], Reason.UNSPECIFIED_ERROR) if error else Reason.UNSPECIFIED_ERROR
            log.info("mqtt.publish_outcome client=%s pid=%d outcome=%s error=%s", self.client_id, pub.pid,
                     outcome.name, error)
        if pub.qos == 2 and reason >= 0x80:
            self.pubs.pop(pub.tag, None)
            self.core.publisher_settled(pub, time.time())
        self.conn.outcome(pub.pid, reason)
        self.touch()

    def _release(self, tag: bytes) -> None:
        pub = self.pubs.pop(tag, None)
        if pub is not None:
            self.core.publisher_settled(pub, time.time())
        else:  # (answered by a router that is gone, declared in doubt here: the client settled it)
            self.core.publisher_released(self.links.get(2), tag, time.time())

    # ------------------------------------------------------------ SUBSCRIBE
    def _grants(self) -> Any:
        return self.router.grants_for(self.user or "anonymous")

    def _attach_args(self, sub: SubState, presented: tuple[str, ...], st: SessionState) -> SubscriberAttach:
        return resume.attach_args(self.client_id, self.user, sub, st, presented)

    def _sub_outcome(self, sid: str, gid: str, outcome: Outcome, settled: bool, error: tuple[str, str] | None) -> None:
        """The client's disposition of a delivery: to the core, or to the relayed member's home."""
        tok = self.edge.subs.get(sid)
        if tok is not None and tok.relayed and self.router.mesh is not None:
            self.router.mesh.relay_disposition(sid, gid, outcome, settled, error, False, time.time())
        else:
            self.core.subscriber_outcome(sid, gid, outcome, settled, error, False, time.time())

    def _sub_detach(self, tok: SubLink, closed: bool, clean: bool, now: float) -> None:
        """A filter's link goes: the core's, or the relayed member's home's."""
        if tok.relayed and self.router.mesh is not None:
            self.router.mesh.relay_detach(tok, tok.sub.sid, closed, clean, now)
        else:
            self.core.detach_subscriber(tok, tok.sub.sid, closed, now, clean=clean)

    def _subscriptions_full(self, grants: Any, sub: SubState) -> bool:
        """The policy's max_subscriptions (per user, AMQP ones counted): a new one would pass it."""
        limit = grants.limit("max_subscriptions")
        if limit is None:
            return False
        st = self.conn.session
        assert st is not None
        known = self.router.table.get(self._attach_args(sub, (), st).sid)
        if known is not None and known.live:
            return False  # (attached again: no new subscription)
        owner = self.user or "anonymous"
        return sum(1 for s in self.router.table.live() if (s.owner or "anonymous") == owner) >= limit

    def _subscribe(self, a: SubscribeTo) -> None:
        self._attach(a.pid, a.subs, a.fresh)

    def _attach(self, pid: int, subs: tuple[SubState, ...], fresh: tuple[bool, ...]) -> None:
        """Attach each filter to the core; answer the SUBACK (`pid` 0: a resumed session's filters,
        no SUBACK) once each is in force."""
        st = self.conn.session
        assert st is not None
        pending = _PendingSubscribe(pid, subs)
        now = time.time()
        grants = self._grants()
        for i, sub in enumerate(subs):
            why = check_filter(sub.match) if sub.match else "not $share/GROUP/FILTER"
            code = 0
            if why is not None:
                code = Reason.TOPIC_FILTER_INVALID
            elif grants is not None and not grants.may_subscribe(sub.match):
                why, code = f"user {self.user!r} may not subscribe to {sub.match!r}", Reason.NOT_AUTHORIZED
            elif grants is not None and self._subscriptions_full(grants, sub):
                why, code = (f"user {self.user or 'anonymous'!r} holds its maximum of "
                             f"{grants.limit('max_subscriptions')} subscriptions"), Reason.QUOTA_EXCEEDED
            if code:
                log.warning("mqtt.subscribe_refused client=%s filter=%r reason=%s", self.client_id,
                            sub.topic_filter[:80], why)
                pending.codes[i] = code
                continue
            presented = resume.presented(st, sub)
            att = self._attach_args(sub, presented, st)
            lid = att.member or att.sid
            sub.sid = lid
            old = self.edge.subs.get(lid)
            if old is not None and old in old.peer.mine:
                old.peer.mine.remove(old)  # (a SUBSCRIBE repeated: the new attach takes its place)
            tok = SubLink(self, sub, att, att.sid)
            try:
                tok.resumed = self.core.attach(tok, att, now)
            except errors.RelayMember as exc:
                mesh = self.router.mesh
                if mesh is None:
                    why, code = f"shared subscription {sub.group!r} is homed at router {exc.home}", Reason.USE_ANOTHER_SERVER
                else:
                    # a member whose group lives at another router: relayed there (interrouter/members.py),
                    # answered once the home took it (`MqttEdge.relay_answered`)
                    tok.relayed = True
                    self.edge.subs[lid] = tok
                    self.mine.append(tok)
                    pending.codes[i] = sub.qos
                    pending.waiting.add(i)
                    mesh.relay_attach(tok, att, exc.home, now)
                    log.info("mqtt.relayed client=%s filter=%r home=%s", self.client_id, sub.topic_filter[:80],
                             exc.home)
                    continue
            except errors.OncemeshError as exc:
                why = str(exc)
                code = _REASON_OF_CONDITION.get(exc.condition, Reason.UNSPECIFIED_ERROR)
            if code:
                log.warning("mqtt.subscribe_refused client=%s filter=%r reason=%s", self.client_id,
                            sub.topic_filter[:80], why)
                pending.codes[i] = code
                continue
            self.edge.subs[lid] = tok
            self.mine.append(tok)
            pending.codes[i] = sub.qos
            pending.waiting.add(i)
        self.pending[id(pending)] = pending
        engine = self.router.engine
        assert engine is not None
        self.router.drain()
        engine.call_after_pass(lambda: self._after_attach(pending))

    def _after_attach(self, pending: _PendingSubscribe) -> None:
        self.router.save_table()
        mesh = self.router.mesh
        for i in sorted(pending.waiting):
            sub = pending.subs[i]
            tok = self.edge.subs.get(sub.sid)
            if tok is None or tok.peer is not self or tok.relayed:
                continue  # (a relayed member is answered when its home took it: `MqttEdge.relay_answered`)
            if mesh is not None and mesh.attach_pending(tok.table_sid):
                self.edge.awaiting.setdefault(tok.table_sid, []).append(tok)
                continue
            self._answer(tok)
        self._maybe_suback(pending)

    def mesh_answered(self, tok: SubLink, refused: str | None) -> None:
        if refused is not None:
            if not self.core.resume_refused(tok, tok.att, time.time(), refused):
                tok.answered = True
                for p in self.pending.values():
                    for i, sub in enumerate(p.subs):
                        if sub.sid == tok.sub.sid and i in p.waiting:
                            p.codes[i] = Reason.NOT_AUTHORIZED
                            p.waiting.discard(i)
                self.router.drain()
                self._suback_ready()
                return
            tok.resumed = False
        self._answer(tok)
        self.router.drain()
        self._suback_ready()

    def _answer(self, tok: SubLink) -> None:
        """The subscription is in force: log it; its SUBACK may go."""
        tok.answered = True
        r = self.router
        sub = r.table.get(tok.table_sid)
        r.slog.write("resumed" if tok.resumed else "subscribed", time.time(), None, tok.att.topic, tok.table_sid,
                     container=tok.att.container, link=tok.att.member_name or tok.att.link_name,
                     count=sub.epoch if sub is not None else 0, info="mqtt")
        self.conn.in_force(tok.sub.sid)
        for p in self.pending.values():
            for i, s in enumerate(p.subs):
                if s.sid == tok.sub.sid:
                    p.waiting.discard(i)

    def _suback_ready(self) -> None:
        for p in list(self.pending.values()):
            self._maybe_suback(p)

    def _maybe_suback(self, p: _PendingSubscribe) -> None:
        if p.waiting or id(p) not in self.pending:
            return
        del self.pending[id(p)]
        if p.pid:
            self.conn.subscribed(p.pid, p.subs, tuple(p.codes))
        else:
            st = self.conn.session
            for sub, code in zip(p.subs, p.codes, strict=True):
                if code >= 0x80 and st is not None:
                    st.subs.pop(sub.topic_filter, None)
        self.after()

    def _unsubscribe(self, a: UnsubscribeFrom) -> None:
        now = time.time()
        for sub in a.subs:
            if sub is None:
                continue
            tok = self.edge.subs.pop(sub.sid, None)
            if tok is not None:
                if tok in self.mine:
                    self.mine.remove(tok)
                self._sub_detach(tok, True, True, now)

    def detached(self, tok: SubLink, condition: str, description: str) -> None:
        """The core let a subscription's link go (another identity, the subscription moved)."""
        if self.edge.subs.get(tok.sub.sid) is tok:
            del self.edge.subs[tok.sub.sid]
        if tok in self.mine:
            self.mine.remove(tok)
        log.warning("mqtt.subscription_detached client=%s filter=%r condition=%s reason=%s", self.client_id,
                    tok.sub.topic_filter[:80], condition, description)
        if self.conn.session is not None:
            self.conn.session.subs.pop(tok.sub.topic_filter, None)
        self.conn._close(Reason.ADMINISTRATIVE_ACTION if condition != errors.UnauthorizedAccess.condition
                         else Reason.NOT_AUTHORIZED, f"subscription {tok.sub.topic_filter!r}: {description}",
                         will=True)
        self.carry_out()  # (inside the router's drain)
        self.touch()

    # ------------------------------------------------------------ deliveries
    def deliver(self, tok: SubLink, gid: str, payload: bytes, redelivery: bool) -> None:
        topic = tok.sub.match
        if is_wildcard(topic):
            topic = read_to(payload) or topic
        try:
            content = self.edge.decoded.content(payload, int(time.time() * 1000))
        except NotAMessage as exc:
            log.warning("mqtt.undeliverable client=%s gid=%s reason=%s", self.client_id, gid, exc)
            self._sub_outcome(tok.sub.sid, gid, Outcome.REJECTED, True, (errors.DecodeError.condition, str(exc)))
            return
        self.conn.deliver(tok.sub.sid, gid, topic, content, redelivery)
        self.touch()
        self.carry_out()

    # ------------------------------------------------------------ the end
    def _close(self, a: Close) -> None:
        if self.closing:
            return
        self.closing = True
        self._uncount()
        now = time.time()
        st = self.conn.session
        if a.reason >= 0x80 or a.will:
            log.info("mqtt.closed peer=%s client=%s reason=0x%02x why=%s", self.peer, self.client_id, a.reason, a.why)
        if st is not None and self.edge.peers.get(st.client_id) is self:
            del self.edge.peers[st.client_id]
        clean = a.why == "the client disconnected"
        for tok in self.mine:
            if self.edge.subs.get(tok.sub.sid) is tok:
                del self.edge.subs[tok.sub.sid]
                ended = st is None or st.expiry == 0
                self._sub_detach(tok, ended, clean or ended, now)
        self.mine.clear()
        for link in self.links.values():
            link.ctx = None
            self.core.detach_publisher(link)
        self.pubs.clear()
        self.backlog.clear()
        if a.will and self.conn.connect is not None and self.conn.connect.will is not None:
            delay = float(self.conn.connect.will.properties.will_delay_interval or 0)
            if st is not None and delay > 0:
                # MQTT 5 3.1.3.2.2: published after the delay (or when the session ends, if sooner),
                # unless the client is back first
                self.edge.wills[st.client_id] = (now + min(delay, st.expiry), self)
            else:
                self._will(now)
        if st is not None:
            if st.expiry == 0:
                if self.edge.sessions.get(st.client_id) is st:
                    del self.edge.sessions[st.client_id]
                    self.edge.dropped(st.client_id, now)
            else:
                st.ended_at = now
                if self.conn.dirty and self.router.mesh is not None:  # (its last changes, kept too)
                    self.conn.dirty = False
                    self.router.mesh.keep_session(st.client_id, st.seq, st.image(), now)
        if self.transport is not None:
            if self.conn.out:
                self.touch()
            else:
                self.transport.close()

    def _will(self, now: float) -> None:
        """Publish the will message (at most once: it has no publisher to resend it)."""
        c = self.conn.connect
        assert c is not None and c.will is not None
        w = c.will
        if check_name(w.topic) is not None or w.topic[0] in "$_":
            return
        grants = self._grants()
        if grants is not None and not grants.may_publish(w.topic):
            log.warning("mqtt.will_refused client=%s topic=%r", self.client_id, w.topic[:80])
            return
        st = self.conn.session
        tag = st.tag() if st is not None else b"will"
        link = PubLink(self, 0)
        self.core.attach_publisher(link, publisher_link_id(f"mqtt:{self.client_id}",
                                                           f"will:{st.nonce if st else ''}"), "", False, [], now,
                                   client=f"mqtt:{self.client_id}", user=self.user)
        content = content_of(Publish(w.topic, w.payload, w.qos, False, False, None, w.properties))
        pub = Pub(self, 0, 0, tag)
        self.core.publish(link, pub, tag, to_amqp(w.topic, content, int(now * 1000)), now, topic=w.topic)
        self.core.publisher_settled(pub, now)
        self.core.detach_publisher(link)
        log.info("mqtt.will_published client=%s topic=%r", self.client_id, w.topic[:80])
