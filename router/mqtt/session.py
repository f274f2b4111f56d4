"""One MQTT client's session and connection, as a protocol state machine (sans-IO).

Theory of operation
-------------------
The router never takes ownership of a message: an MQTT publisher hears PUBACK (QoS 1) or PUBREC
(QoS 2) only when the mesh decided the message's outcome, i.e. when every subscription owed it has
taken it (docs/promises.md). To get there the edge plays, for each MQTT client, the part one of our
own AMQP clients plays (docs/clients.md): it names each message by a tag it never uses twice, it
declares the tags it holds in doubt when it comes back, and it presents the messages it accepted as
a subscriber. What MQTT keeps in its packet identifiers (16 bits, reused as soon as an exchange
ends) the session maps to those names:

- **Inbound** (the client publishes). A QoS 1 or 2 PUBLISH gets the next tag of the session
  (`SessionState.next_tag`, never reused in the session's life; `nonce` tells lives apart) and is
  published on one of the session's two publisher links: QoS 1 on a link whose outcome settles it
  (AMQP receiver-settle-mode first: PUBACK ends the exchange), QoS 2 on a link the client settles
  (mode second: PUBREC is the outcome, PUBREL the settlement, PUBCOMP our answer). Until the
  exchange ends, `inbound` keeps packet id -> tag: a PUBLISH that comes again under that id (DUP,
  after a reconnect, or a client that resends on its own) is the same message (same tag: the core
  merges it, or answers it with its outcome), never a second one (MQTT 5 4.3.3: the receiver must
  not deliver it twice). QoS 0 is published and settled at once (at most once).
- **Outbound** (the client subscribed). Each filter of the session is a subscription of the mesh
  (`SubState.sid`; durable for as long as the session lives). A message for it goes out at the
  subscription's QoS under a free packet id; `outbound` keeps the exchange. QoS 2: PUBREC is the
  subscription's acceptance, and PUBREL follows at once (the client's Receive Maximum counts the
  exchange until PUBCOMP: waiting for the message to be final, i.e. for the other subscriptions'
  acceptances, let two subscribers' windows fill with messages each waited for the other to
  take). Until the message is *final* (the mesh knows every acceptance and the publisher's
  settlement) the session remembers it (`released`, kept by the keeper before the PUBREL goes):
  presented when the subscription attaches again, and answered as taken, never sent, if the mesh
  hands it again, so the packet id it had may name the next message. QoS 1: PUBACK is acceptance and settlement (a resend after a lost PUBACK may reach
  the client twice: at least once, as MQTT says). QoS 0: taken as accepted when sent.
- **A session outlives its connection** (clean start 0 / a session expiry): on reconnect the edge
  attaches the subscriptions again presenting what the client accepted and the mesh has not
  said final, declares the QoS 2 tags in doubt, resends PUBREL for those already final and PUBLISH
  (DUP, same packet id) for what the core hands again.

The state machine here decides every packet's answer and every request to the router; the edge
(router/mqtt/edge.py) only moves bytes and calls the delivery core. Time is given, never read.
"""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, final

from ...common.ids import counter_tag, publisher_link_id
from .codec import MqttError, UnsupportedProtocolVersion
from .mapping import MqttContent
from .packets import (
    EMPTY,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Reason,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)

SHARE_PREFIX = "$share/"
MAX_EARLY_PACKETS = 1000  # packets a client may send between its CONNECT and our CONNACK


# ---------------------------------------------------------------- what a session keeps

@final
@dataclass(slots=True)
class SubState:
    """One filter of a session: a subscription of the mesh."""

    topic_filter: str  # the filter as the client wrote it ($share/G/F included)
    match: str  # the filter that matches topics (F of $share/G/F)
    qos: int  # the QoS granted
    sid: str  # the subscription's id with the core (a shared one's member: the member's id)
    group: str = ""  # $share/GROUP/...: the group, "" when not shared
    no_local: bool = False
    sub_id: int | None = None  # MQTT 5 subscription identifier


class Stage(Enum):
    SENT = "sent"  # PUBLISH out, no PUBACK/PUBREC yet
    RECEIVED = "received"  # QoS 2: PUBREC came (accepted); PUBREL waits for the message's final
    RELEASED = "released"  # QoS 2: PUBREL out, no PUBCOMP yet


@final
@dataclass(slots=True)
class Outbound:
    """A message handed to the client at QoS 1 or 2 whose exchange has not ended."""

    pid: int
    sid: str
    gid: str
    qos: int
    stage: Stage
    final: bool = False  # the core said the message is final (QoS 2: PUBREL due once RECEIVED)


@final
@dataclass(slots=True)
class Inbound:
    """A PUBLISH of the client at QoS 1 or 2 whose exchange has not ended."""

    pid: int
    tag: bytes
    qos: int
    answered: bool = False  # QoS 2: PUBREC sent (the outcome came)
    reason: int = 0  # the outcome as a reason code (PUBREC sent again with it)
    submitted: bool = False  # published on this connection's link (not only remembered)
    nonce: str = ""  # the life of the session whose publisher link named it (its tag's link)
    restored: bool = False  # from a keeper's image (the router that held it is gone): see `_publish`
    digest: int = 0  # CRC-32 of the PUBLISH's topic and payload (0: not known, an older router's image)


@final
@dataclass(slots=True)
class SessionState:
    """What outlives a connection (MQTT 5 4.1): kept by the router while the session lives."""

    client_id: str
    owner: str  # the identity that made it ("" without authentication): only it may take it over
    nonce: str  # tells this life's tags from an earlier life's of the same client id
    expiry: float  # seconds it lives after its connection ends (inf: never ends by itself)
    subs: dict[str, SubState] = field(default_factory=dict)  # by filter as written
    inbound: dict[int, Inbound] = field(default_factory=dict)
    outbound: dict[int, Outbound] = field(default_factory=dict)
    next_tag: int = 0
    ended_at: float | None = None  # when its last connection ended (None: connected)
    # its version: every change that a keeper must hold counts one (interrouter/keeper.py); a new
    # session starts at the time in microseconds, so that a later session of the client id is newer
    seq: int = 0
    restored: bool = False  # made from a keeper's image, its router gone: not yet attached here
    kept: int = 0  # the newest `seq` its keeper holds (not in the image)
    out_index: dict[tuple[str, str], Outbound] = field(default_factory=dict)  # (sid, gid) -> outbound (an index)
    # QoS 2 messages the client accepted whose PUBREL went before they were final: (sid, gid). The
    # client is done with them (PUBCOMP frees the packet id); the session remembers them until the
    # mesh says they are final: presented when the subscription attaches again, and never sent again
    released: dict[tuple[str, str], None] = field(default_factory=dict)

    def add_out(self, ob: Outbound) -> None:
        self.outbound[ob.pid] = ob
        self.out_index[(ob.sid, ob.gid)] = ob

    def pop_out(self, pid: int) -> Outbound | None:
        ob = self.outbound.pop(pid, None)
        if ob is not None and self.out_index.get((ob.sid, ob.gid)) is ob:
            del self.out_index[(ob.sid, ob.gid)]
        return ob

    def tag(self) -> bytes:
        self.next_tag += 1
        return counter_tag(self.next_tag)

    def image(self) -> dict[str, Any]:
        """What a keeper holds of it (JSON): every field that says which message a packet is."""
        return {"owner": self.owner, "nonce": self.nonce, "expiry": None if self.expiry == float("inf") else self.expiry,
                "next_tag": self.next_tag, "seq": self.seq,
                "subs": [[x.topic_filter, x.match, x.qos, x.sid, x.group, x.no_local, x.sub_id]
                         for x in self.subs.values()],
                "in": [[i.pid, i.tag.decode("ascii"), i.qos, i.nonce or self.nonce, i.answered, i.reason]
                       for i in self.inbound.values()],
                # (the digests apart: an older router reads "in" entries of six fields)
                "ind": [[i.pid, i.digest] for i in self.inbound.values() if i.digest],
                "out": [[o.pid, o.sid, o.gid, o.qos, o.stage.value, o.final] for o in self.outbound.values()],
                "rel": [[sid, gid] for sid, gid in self.released]}

    @classmethod
    def from_image(cls, client_id: str, d: dict[str, Any]) -> SessionState:
        """The session a keeper held (`image`), restored at a router that never held it."""
        st = cls(client_id, str(d["owner"]), str(d["nonce"]),
                 float("inf") if d["expiry"] is None else float(d["expiry"]), next_tag=int(d["next_tag"]),
                 seq=int(d["seq"]), restored=True)
        for f, match, qos, sid, group, no_local, sub_id in d["subs"]:
            st.subs[f] = SubState(f, match, int(qos), sid, group, bool(no_local), sub_id)
        digests = {int(pid): int(dg) for pid, dg in d.get("ind", ())}  # (absent from older routers' images)
        for pid, tag, qos, nonce, answered, reason in d["in"]:
            st.inbound[int(pid)] = Inbound(int(pid), str(tag).encode("ascii"), int(qos), bool(answered), int(reason),
                                           nonce=str(nonce), restored=True, digest=digests.get(int(pid), 0))
        for pid, sid, gid, qos, stage, fin in d["out"]:
            st.add_out(Outbound(int(pid), str(sid), str(gid), int(qos), Stage(stage), bool(fin)))
        for sid, gid in d.get("rel", ()):  # (absent from the images of routers before it)
            st.released[(str(sid), str(gid))] = None
        return st

    def held_for(self, sid: str) -> list[str]:
        """What the client holds of subscription `sid` (accepted, not seen final): what it presents."""
        out = [ob.gid for ob in self.outbound.values() if ob.stage is not Stage.SENT and ob.sid in ("", sid)]
        out.extend(gid for s, gid in self.released if s == sid)
        return out

    def declarations(self) -> list[tuple[int, str, list[bytes], int]]:
        """What the session's two publisher links declare, as our clients do when they attach
        (docs/clients.md): per QoS (1, 2) its link id, the tags it holds in doubt (a PUBLISH named
        and not answered: the client may send it again), and the mark (the next tag's number: the
        declaration says nothing of what it names later). Every other tag of this life below the
        mark is settled on the client's side: its exchange ended (PUBACK, or PUBREL) or was answered
        (PUBREC: the client sends PUBREL, never that PUBLISH again). Said when the client attaches,
        and by a keeper for a session whose router is gone (`Keeper.orphaned`)."""
        out: list[tuple[int, str, list[bytes], int]] = []
        for qos in (1, 2):
            tags = [i.tag for i in self.inbound.values()
                    if i.qos == qos and not i.answered and (i.nonce or self.nonce) == self.nonce]
            out.append((qos, publisher_link_id(f"mqtt:{self.client_id}", f"qos{qos}:{self.nonce}"), tags,
                        self.next_tag + 1))
        return out

    def sub_of_sid(self, sid: str) -> SubState | None:
        for s in self.subs.values():
            if s.sid == sid:
                return s
        return None


# ---------------------------------------------------------------- what a session asks of the router

@final
@dataclass(slots=True)
class Login:
    """Authenticate and find the session: answer with `MqttConnection.accepted` or `refused`."""

    connect: Connect


@final
@dataclass(slots=True)
class PublishMsg:
    """Publish `content` to `topic`; `qos` 0 settles at once, 1 is settled by the outcome, 2 by the
    client's PUBREL. Answer with `MqttConnection.outcome(pid, reason)` (not for QoS 0). `nonce`: the
    session life whose publisher link names it ("" this one's)."""

    pid: int  # 0 for QoS 0
    qos: int
    tag: bytes
    topic: str
    content: MqttContent
    retain: bool
    nonce: str = ""


@final
@dataclass(slots=True)
class Release:
    """The client released (PUBREL) QoS 2 message `tag`: the publisher settled it."""

    tag: bytes


@final
@dataclass(slots=True)
class SubscribeTo:
    """Attach the subscriptions: answer with `MqttConnection.subscribed(pid, codes)`."""

    pid: int
    subs: tuple[SubState, ...]
    fresh: tuple[bool, ...]  # per sub: a new one (not in the session before)


@final
@dataclass(slots=True)
class UnsubscribeFrom:
    pid: int
    subs: tuple[SubState | None, ...]  # None: the session had no such filter


@final
@dataclass(slots=True)
class Settled:
    """The client took message `gid` of subscription `sid` (`accepted`; False: it refused it) and,
    when `settled`, ended the exchange."""

    sid: str
    gid: str
    accepted: bool
    settled: bool


@final
@dataclass(slots=True)
class Credit:
    """Subscription `sid` may be handed `n` messages now (its credit, absolute, as an AMQP link's:
    the core counts it down as it hands)."""

    sid: str
    n: int


@final
@dataclass(slots=True)
class Close:
    """End the connection (after sending what is queued). `will`: publish the will message."""

    reason: int
    why: str
    will: bool


Ask = Login | PublishMsg | Release | SubscribeTo | UnsubscribeFrom | Settled | Credit | Close
ASK_TYPES = frozenset((Login, PublishMsg, Release, SubscribeTo, UnsubscribeFrom, Settled, Credit, Close))


# ---------------------------------------------------------------- the connection

@final
@dataclass(slots=True)
class Limits:
    receive_maximum: int = 100  # QoS 1/2 PUBLISHes a client may have unanswered (MQTT 5 CONNACK)
    maximum_packet_size: int = 1 << 20
    sub_credit: int = 64  # messages granted to each subscription ahead of the client's acks
    keep_alive_max: int = 0  # 0: the client's choice; else the most a client may ask (MQTT 5 server keep alive)
    session_expiry_max: float = 7 * 86400.0  # the longest session expiry granted (3.1.1 clean session 0: this)
    max_qos: int = 2


class State(Enum):
    CONNECTING = "connecting"  # no CONNECT yet
    LOGGING_IN = "logging-in"  # CONNECT taken, the router is deciding
    OPEN = "open"
    CLOSED = "closed"


class MqttConnection:
    """One client connection. Packets in (`received`), packets out (`out`), requests to the router
    (`asks`); the router's answers come in through the methods below."""

    def __init__(self, limits: Limits, now: float) -> None:
        self.limits = limits
        self.level = 4
        self.state = State.CONNECTING
        self.out: list[Any] = []  # packets to send
        self.asks: list[Ask] = []
        self.session: SessionState | None = None
        self.connect: Connect | None = None
        self.keep_alive = 0
        self.last_heard = now
        self.client_receive_max = 65535  # what the client takes unanswered (its CONNECT)
        self.client_max_packet = 0  # 0: no limit said
        self.waiting: deque[tuple[str, str, str, MqttContent, bool]] = deque()  # (sid, gid, topic, content, redelivery)
        self.granted: dict[str, int] = {}  # credit granted to each subscription and not used yet
        # replication (router/mqtt/keeping.py): with a keeper, what depends on a change of the
        # session waits until the keeper holds that change (`kept`); `dirty`: changed since the image
        # last given to the keeper
        self.replicate = False
        self.held: deque[tuple[int, Any]] = deque()  # (the session's seq it waits for, an Ask or a packet)
        self.dirty = False
        self.early: list[Any] = []  # packets that came after CONNECT, before the router took it
        self.stale_entries = 0  # resends under a packet id whose entry named another message (`_publish`)

    # ------------------------------------------------------------ replication
    def _changed(self) -> None:
        """A change a keeper must hold before what depends on it goes out."""
        s = self.session
        assert s is not None
        s.seq += 1
        self.dirty = True

    def _emit(self, item: Any) -> None:
        """A packet or an ask that depends on the session's state as it is now: out at once, or, with
        a keeper, once the keeper holds that state (in order with what waits already)."""
        s = self.session
        if not self.replicate or s is None or (not self.held and s.seq <= s.kept):
            self._out(item)
        else:
            self.held.append((s.seq, item))

    def _out(self, item: Any) -> None:
        if type(item) in ASK_TYPES:  # (the per-message path: one set lookup, not eight isinstance)
            self.asks.append(item)
        elif self.state is State.OPEN:
            self.out.append(item)

    def kept(self, seq: int) -> None:
        """The keeper holds the session up to `seq`: what waited for it goes out."""
        s = self.session
        if s is None:
            return
        if seq > s.kept:
            s.kept = seq
        while self.held and self.held[0][0] <= s.kept:
            self._out(self.held.popleft()[1])

    def unreplicated(self) -> None:
        """No keeper can be had (no other router reachable): what waits goes out; the session runs
        without a copy elsewhere until one can be had."""
        self.replicate = False
        while self.held:
            self._out(self.held.popleft()[1])

    # ------------------------------------------------------------ from the client
    def received(self, pkt: Any, now: float) -> None:
        """A packet decoded from the client."""
        self.last_heard = now
        if self.state is State.CLOSED:
            return
        if self.state is State.CONNECTING:
            if type(pkt) is not Connect:
                self._close(Reason.PROTOCOL_ERROR, "the first packet must be CONNECT", will=False)
                return
            self._connect(pkt)
            return
        if self.state is State.LOGGING_IN and type(pkt) is not Connect:
            # a client may send packets right after CONNECT, without waiting for CONNACK (MQTT
            # 3.1.4): kept until the router took the CONNECT (`accepted`), then handled in order
            if len(self.early) >= MAX_EARLY_PACKETS:
                self._close(Reason.QUOTA_EXCEEDED, f"more than {MAX_EARLY_PACKETS} packets before CONNACK", will=False)
                return
            self.early.append(pkt)
            return
        t = type(pkt)
        if t is Connect:
            self._close(Reason.PROTOCOL_ERROR, "a second CONNECT on one connection", will=True)
        elif self.state is not State.OPEN:
            self._close(Reason.PROTOCOL_ERROR, f"{t.__name__} before CONNACK", will=False)
        elif t is Publish:
            self._publish(pkt)
        elif t is Puback:
            self._puback(pkt)
        elif t is Pubrec:
            self._pubrec(pkt)
        elif t is Pubrel:
            self._pubrel(pkt)
        elif t is Pubcomp:
            self._pubcomp(pkt)
        elif t is Subscribe:
            self._subscribe(pkt)
        elif t is Unsubscribe:
            self._unsubscribe(pkt)
        elif t is Pingreq:
            self.out.append(Pingresp())
        elif t is Disconnect:
            self._disconnect(pkt)
        else:
            self._close(Reason.PROTOCOL_ERROR, f"{t.__name__} is not for a server", will=True)

    def failed(self, exc: MqttError) -> None:
        """The client's bytes did not decode."""
        if isinstance(exc, UnsupportedProtocolVersion) and self.state is State.CONNECTING:
            # answered in the client's own version where we can: 3.1.1's code 1 for MQTT 3.1 and
            # older, MQTT 5's 0x84 for a level above 5 (MQTT 5 3.1.2.2)
            self.level = 5 if exc.level > 5 else 4
            self._refuse(Reason.UNSUPPORTED_PROTOCOL_VERSION, str(exc))
            return
        self._close(exc.reason, str(exc), will=True)

    def lost(self) -> None:
        """The connection dropped without DISCONNECT."""
        if self.state is not State.CLOSED:
            self.state = State.CLOSED
            self.asks.append(Close(Reason.UNSPECIFIED_ERROR, "connection lost", will=True))

    def tick(self, now: float) -> None:
        """Keep alive: a client silent for 1.5 times its keep alive is gone (MQTT 3.1.2.10)."""
        if self.state is State.OPEN and self.keep_alive and now - self.last_heard > 1.5 * self.keep_alive:
            self._close(Reason.KEEP_ALIVE_TIMEOUT, f"nothing heard for {now - self.last_heard:.1f} s "
                                                  f"(keep alive {self.keep_alive} s)", will=True)

    # ------------------------------------------------------------ CONNECT
    def _connect(self, c: Connect) -> None:
        self.level = c.level
        self.connect = c
        p = c.properties
        if p.receive_maximum is not None:
            self.client_receive_max = p.receive_maximum
        if p.maximum_packet_size is not None:
            self.client_max_packet = p.maximum_packet_size
        ka = c.keep_alive
        if self.limits.keep_alive_max and (ka == 0 or ka > self.limits.keep_alive_max) and c.level == 5:
            ka = self.limits.keep_alive_max
        self.keep_alive = ka
        if not c.client_id and c.level == 4 and not c.clean_start:
            self._refuse(Reason.CLIENT_IDENTIFIER_NOT_VALID,
                         "an empty client id needs a clean session (MQTT 3.1.1 3.1.3.1)")
            return
        if c.will is not None and c.will.qos > self.limits.max_qos:
            self._refuse(Reason.QOS_NOT_SUPPORTED, f"will QoS {c.will.qos}")
            return
        if p.authentication_method is not None:
            self._refuse(Reason.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not offered: log in with a "
                                                           "user name and password (docs/mqtt.md)")
            return
        if c.will is not None and c.will.retain:
            self._refuse(Reason.RETAIN_NOT_SUPPORTED, "retained messages are not available (docs/mqtt.md)")
            return
        self.state = State.LOGGING_IN
        self.asks.append(Login(c))

    def session_expiry(self) -> float:
        """The expiry the client asked for, within the router's limit (3.1.1: none when clean,
        else the limit)."""
        c = self.connect
        assert c is not None
        if c.level == 4:
            return 0.0 if c.clean_start else self.limits.session_expiry_max
        asked = c.properties.session_expiry_interval or 0
        return float(min(asked, self.limits.session_expiry_max)) if asked != 0xFFFFFFFF else \
            self.limits.session_expiry_max

    def accepted(self, session: SessionState, present: bool, assigned_id: str | None = None) -> None:
        """The router took the CONNECT: `session` (new, or the one it resumes: `present`)."""
        if self.state is not State.LOGGING_IN:
            return
        self.session = session
        session.ended_at = None
        self.state = State.OPEN
        # (its image goes to this router's keeper now, changed or not: a session restored here from
        # a keeper's image, e.g. at that keeper itself, has no other copy until it is put again;
        # found by the MQTT simulator, triangle seed 13: lost at the next crash, one at a time)
        self.dirty = True
        props = EMPTY
        if self.level == 5:
            props = Properties(receive_maximum=self.limits.receive_maximum,
                               maximum_packet_size=self.limits.maximum_packet_size,
                               retain_available=0, maximum_qos=None if self.limits.max_qos == 2 else self.limits.max_qos,
                               topic_alias_maximum=None,
                               session_expiry_interval=None if self.connect is None or self.connect.properties.
                               session_expiry_interval is None else int(min(session.expiry, 0xFFFFFFFF)),
                               assigned_client_identifier=assigned_id,
                               server_keep_alive=self.keep_alive if self.connect is not None and
                               self.keep_alive != self.connect.keep_alive else None)
        self.out.append(Connack(session_present=present, reason_code=Reason.SUCCESS, properties=props))
        for pid, ob in sorted(session.outbound.items()):
            if ob.stage is Stage.RELEASED or (ob.stage is Stage.RECEIVED and ob.final):
                ob.stage = Stage.RELEASED
                self.out.append(Pubrel(pid))
        early, self.early = self.early, []
        for pkt in early:
            self.received(pkt, self.last_heard)
        for inb in session.inbound.values():
            inb.submitted = False

    def in_force(self, sid: str) -> None:
        """Subscription `sid` is attached (again: a SUBSCRIBE repeated, a session resumed) on this
        connection: the core starts its link with no credit; it gets its whole window."""
        self.granted[sid] = self.limits.sub_credit
        self.asks.append(Credit(sid, self.limits.sub_credit))

    def refused(self, reason: int, why: str) -> None:
        """The router refused the CONNECT."""
        if self.state is State.LOGGING_IN:
            self._refuse(reason, why)

    def _refuse(self, reason: int, why: str) -> None:
        props = Properties(reason_string=why[:200]) if self.level == 5 else EMPTY
        self.out.append(Connack(session_present=False, reason_code=reason, properties=props))
        self.state = State.CLOSED
        self.asks.append(Close(reason, why, will=False))

    # ------------------------------------------------------------ PUBLISH from the client
    def _publish(self, p: Publish) -> None:
        s = self.session
        assert s is not None
        if p.retain and self.level == 5:
            # retained messages are not kept (docs/mqtt.md); MQTT 5 says so in CONNACK (Retain Available
            # 0), and a client that sets RETAIN anyway is disconnected with the reason (MQTT 5 3.3.1.3);
            # 3.1.1 has no way to say it: the message is published as any other, not retained
            self._close(Reason.RETAIN_NOT_SUPPORTED, "retained messages are not available (Retain Available 0)",
                        will=True)
            return
        if p.properties.topic_alias is not None:
            self._close(Reason.TOPIC_ALIAS_INVALID, "topic aliases are not offered (Topic Alias Maximum 0)", will=True)
            return
        if p.qos > self.limits.max_qos:
            self._close(Reason.QOS_NOT_SUPPORTED, f"QoS {p.qos} above the maximum {self.limits.max_qos}", will=True)
            return
        content = content_of(p)
        if p.qos == 0:
            self.asks.append(PublishMsg(0, 0, s.tag(), p.topic, content, p.retain))
            return
        pid = p.packet_id
        assert pid is not None
        inb = s.inbound.get(pid)
        digest = zlib.crc32(p.payload, zlib.crc32(p.topic.encode()))
        if inb is not None and inb.digest and inb.digest != digest:
            # (not the message this packet id named: the entry is stale, from a copy of the session
            # older than what the client went on with (a keeper's copy cut off from a newer one);
            # taking the resend for the old message would answer it with that one's outcome, and
            # the new message would never be published: it is a new message)
            self.stale_entries += 1
            del s.inbound[pid]
            inb = None
        # (the same packet id before its exchange ended is the same message, DUP or not: MQTT 5 4.3.3;
        # paho-mqtt resends without DUP after a reconnect. An exchange ends (PUBACK, PUBCOMP) only
        # once the keeper knows it ended, so an entry restored from a keeper is never a stale one)
        if inb is not None and inb.qos == p.qos:
            if inb.answered:
                self.out.append(Pubrec(pid, inb.reason) if inb.qos == 2 else Puback(pid, inb.reason))
            elif not inb.submitted:
                inb.submitted = True
                self._emit(PublishMsg(pid, p.qos, inb.tag, p.topic, content, p.retain, inb.nonce))
            return  # (in flight on this connection: its outcome answers both)
        if inb is not None:
            self._close(Reason.PACKET_IDENTIFIER_IN_USE, f"packet id {pid} is in use by a QoS {inb.qos} PUBLISH",
                        will=True)
            return
        # (more unanswered than the Receive Maximum of CONNACK: MQTT 5 would have us disconnect with
        # 0x93, but paho-mqtt sends every message it queued at once after a reconnect, whatever the
        # maximum, and would be disconnected again at each: such a client is read more slowly (the
        # core's credit), not refused; the session's map is bounded by the 65,535 packet ids)
        inb = s.inbound[pid] = Inbound(pid, s.tag(), p.qos, submitted=True, nonce=s.nonce, digest=digest)
        self._changed()  # (its name must be kept elsewhere before the message exists)
        self._emit(PublishMsg(pid, p.qos, inb.tag, p.topic, content, p.retain, inb.nonce))

    def outcome(self, pid: int, reason: int) -> None:
        """The mesh decided the outcome of the client's PUBLISH `pid` (`reason`: SUCCESS, or why
        it was refused)."""
        s = self.session
        if s is None:
            return
        inb = s.inbound.get(pid)
        if inb is None or inb.answered:
            return
        if self.level == 4 and reason >= 0x80:
            reason = 0  # (3.1.1 acks carry no reason: the refusal is in the router's log)
        self._changed()
        if inb.qos == 1:
            del s.inbound[pid]
            self._emit(Puback(pid, reason))  # (ends the exchange: once the keeper knows, see _publish)
            return
        inb.answered = True
        inb.reason = reason
        if reason >= 0x80:
            del s.inbound[pid]  # (MQTT 5 4.3.3: a PUBREC with a failure reason ends the exchange)
            self._emit(Pubrec(pid, reason))
        elif self.state is State.OPEN:
            self.out.append(Pubrec(pid, reason))  # (the keeper may learn of it later: the client's
            # PUBREL after it ends the exchange wherever it comes, `_pubrel`)

    def _pubrel(self, p: Pubrel) -> None:
        s = self.session
        assert s is not None
        inb = s.inbound.get(p.packet_id)
        if inb is None or inb.qos != 2:
            self.out.append(Pubcomp(p.packet_id, Reason.PACKET_IDENTIFIER_NOT_FOUND if self.level == 5 else 0))
            return
        if not inb.answered and not inb.restored:
            self._close(Reason.PROTOCOL_ERROR, f"PUBREL {p.packet_id} before its PUBREC", will=True)
            return
        # (restored and not answered here: the router that is gone sent PUBREC, the outcome was decided)
        del s.inbound[p.packet_id]
        self._changed()
        self.asks.append(Release(inb.tag))
        self._emit(Pubcomp(p.packet_id))  # (ends the exchange: once the keeper knows, see _publish)

    # ------------------------------------------------------------ SUBSCRIBE / UNSUBSCRIBE
    def _subscribe(self, p: Subscribe) -> None:
        s = self.session
        assert s is not None
        subs: list[SubState] = []
        fresh: list[bool] = []
        sub_id = p.properties.subscription_identifiers[0] if p.properties.subscription_identifiers else None
        for topic_filter, opts in p.subscriptions:
            group, match = split_share(topic_filter)
            old = s.subs.get(topic_filter)
            qos = min(opts.qos, self.limits.max_qos)
            subs.append(SubState(topic_filter, match, qos, old.sid if old is not None else "", group,
                                 opts.no_local, sub_id))
            fresh.append(old is None)
        self.asks.append(SubscribeTo(p.packet_id, tuple(subs), tuple(fresh)))

    def subscribed(self, pid: int, subs: tuple[SubState, ...], codes: tuple[int, ...]) -> None:
        """The router attached (code < 0x80: the QoS granted) or refused (code >= 0x80) each."""
        s = self.session
        if s is None:
            return
        for sub, code in zip(subs, codes, strict=True):
            if code < 0x80:
                s.subs[sub.topic_filter] = sub  # (its credit came when the router attached it: `in_force`)
        if self.level == 4:
            codes = tuple(c if c < 0x80 else 0x80 for c in codes)
        self._changed()
        self._emit(Suback(pid, codes))

    def _unsubscribe(self, p: Unsubscribe) -> None:
        s = self.session
        assert s is not None
        gone = tuple(s.subs.pop(f, None) for f in p.filters)
        for sub in gone:
            if sub is not None:
                self.granted.pop(sub.sid, None)
        self.asks.append(UnsubscribeFrom(p.packet_id, gone))
        codes = tuple(Reason.SUCCESS if g is not None else Reason.NO_SUBSCRIPTION_EXISTED for g in gone)
        self._changed()
        self._emit(Unsuback(p.packet_id, codes if self.level == 5 else ()))

    # ------------------------------------------------------------ messages to the client
    def deliver(self, sid: str, gid: str, topic: str, content: MqttContent, redelivery: bool) -> None:
        """The core hands message `gid` of subscription `sid` (tag = gid)."""
        s = self.session
        if s is None or self.state is not State.OPEN:
            return
        left = self.granted.get(sid)
        if left is not None:
            self.granted[sid] = left - 1
        ob0 = s.out_index.get((sid, gid))  # (a redelivery: under the packet id it had, DUP)
        if ob0 is not None:
            if ob0.stage is Stage.SENT:
                self._send(ob0, topic, content, dup=True)
            return
        if (sid, gid) in s.released:  # the client took it (PUBREL went early): taken, never sent again
            self._emit(Settled(sid, gid, True, False))
            self._regrant(sid)
            return
        sub = s.sub_of_sid(sid)
        if sub is None:
            return  # (unsubscribed meanwhile: the core ends the subscription)
        if content.message_expiry == 0:
            # expired on the way: not sent (MQTT 5 3.3.2.3.3); the subscription is done with it
            self.asks.append(Settled(sid, gid, True, True))
            self._regrant(sid)
            return
        if sub.qos == 0:
            self._send_qos0(sub, topic, content)
            self.asks.append(Settled(sid, gid, True, True))
            self._regrant(sid)
            return
        if self._inflight() >= self.client_receive_max:
            self.waiting.append((sid, gid, topic, content, redelivery))
            return
        ob = Outbound(self._free_pid(), sid, gid, sub.qos, Stage.SENT)
        s.add_out(ob)
        self._changed()  # (its packet id must be kept elsewhere before the client can hold it)
        self._send(ob, topic, content, dup=False)

    def _inflight(self) -> int:
        s = self.session
        assert s is not None
        return len(s.outbound)

    def _free_pid(self) -> int:
        s = self.session
        assert s is not None
        used = s.outbound
        pid = (max(used) % 65535) + 1 if used else 1
        while pid in used:
            pid = pid % 65535 + 1
        return pid

    def _props_out(self, sub: SubState | None, c: MqttContent) -> Properties:
        if self.level != 5:
            return EMPTY
        return Properties(payload_format_indicator=c.payload_format, message_expiry_interval=c.message_expiry,
                          content_type=c.content_type, response_topic=c.response_topic,
                          correlation_data=c.correlation_data, user_properties=c.user_properties,
                          subscription_identifiers=(sub.sub_id,) if sub is not None and sub.sub_id else ())

    def _send_qos0(self, sub: SubState, topic: str, c: MqttContent) -> None:
        self.out.append(Publish(topic=topic, payload=c.payload, qos=0, retain=False, dup=False, packet_id=None,
                                properties=self._props_out(sub, c)))

    def _send(self, ob: Outbound, topic: str, c: MqttContent, dup: bool) -> None:
        s = self.session
        assert s is not None
        sub = s.sub_of_sid(ob.sid)
        self._emit(Publish(topic=topic, payload=c.payload, qos=ob.qos, retain=False, dup=dup, packet_id=ob.pid,
                                properties=self._props_out(sub, c)))

    def final(self, sid: str, gid: str) -> None:
        """The message is final (the mesh will never hand it again): QoS 2 PUBREL may go."""
        s = self.session
        if s is None:
            return
        ob = s.out_index.get((sid, gid))
        if ob is not None:
            ob.final = True
            if ob.stage is Stage.RECEIVED and self.state is State.OPEN:
                ob.stage = Stage.RELEASED
                self._changed()
                self._emit(Pubrel(ob.pid))
        if s.released and (sid, gid) in s.released:
            del s.released[(sid, gid)]
            self._changed()  # (the keeper may learn it later: a copy that still has it presents a final id)

    def notified(self, sid: str, gids: tuple[str, ...]) -> None:
        """The core's FINAL notification (ids this subscription accepted, final since): QoS 2
        PUBREL for those still here. The core counts the notification against the subscription's
        credit, as a transfer on an AMQP link: so does the session (QoS 1 gets one per batch of
        messages it took; without this count its credit ran out after ~100 messages)."""
        for gid in gids:
            self.final(sid, gid)
        left = self.granted.get(sid)
        if left is not None:
            self.granted[sid] = left - 1
            self._regrant(sid)

    def _puback(self, p: Puback) -> None:
        s = self.session
        assert s is not None
        ob = s.outbound.get(p.packet_id)
        if ob is None or ob.qos != 1:
            return  # (MQTT: an unknown id is ignored; a late PUBACK after a resend)
        s.pop_out(p.packet_id)
        self._changed()  # (the acceptance reaches the mesh only once the keeper knows it)
        self._emit(Settled(ob.sid, ob.gid, p.reason_code < 0x80, True))
        self._regrant(ob.sid)
        self._next_waiting()

    def _pubrec(self, p: Pubrec) -> None:
        s = self.session
        assert s is not None
        ob = s.outbound.get(p.packet_id)
        if ob is None or ob.qos != 2:
            if self.level == 5:
                self.out.append(Pubrel(p.packet_id, Reason.PACKET_IDENTIFIER_NOT_FOUND))
            return
        if ob.stage is not Stage.SENT:
            if ob.stage is Stage.RELEASED:
                self._emit(Pubrel(ob.pid))  # (behind the first, if that one still waits for the keeper)
            return
        self._changed()  # (the acceptance reaches the mesh only once the keeper knows it: the new home
        # presents what the keeper says was accepted, and a PUBREL follows its final)
        if p.reason_code >= 0x80:
            s.pop_out(p.packet_id)
            self._emit(Settled(ob.sid, ob.gid, False, True))
            self._regrant(ob.sid)
            self._next_waiting()
            return
        ob.stage = Stage.RECEIVED
        self._emit(Settled(ob.sid, ob.gid, True, False))
        self._regrant(ob.sid)
        if not ob.final:
            # PUBREL now, not once the message is final: the client's Receive Maximum counts an
            # exchange until PUBCOMP, and holding it for the other subscriptions' acceptances let two
            # subscribers' windows fill with messages each waited for the other to take (a chaos
            # run's deadlock). The session remembers the message instead (`released`, kept before
            # the PUBREL goes, as the stage is): presented on resume, never sent to the client again
            s.released[(ob.sid, ob.gid)] = None
        ob.stage = Stage.RELEASED
        self._emit(Pubrel(ob.pid))

    def _pubcomp(self, p: Pubcomp) -> None:
        s = self.session
        assert s is not None
        ob = s.outbound.get(p.packet_id)
        if ob is None or ob.qos != 2 or ob.stage is not Stage.RELEASED:
            return
        s.pop_out(p.packet_id)
        self._changed()
        self._next_waiting()

    def _regrant(self, sid: str) -> None:
        left = self.granted.get(sid)
        if left is None:
            return
        if left <= self.limits.sub_credit // 2:
            self.granted[sid] = self.limits.sub_credit
            self.asks.append(Credit(sid, self.limits.sub_credit))

    def _next_waiting(self) -> None:
        while self.waiting and self._inflight() < self.client_receive_max:
            sid, gid, topic, content, redelivery = self.waiting.popleft()
            self.granted[sid] = self.granted.get(sid, 0) + 1  # (deliver counts it again)
            self.deliver(sid, gid, topic, content, redelivery)

    # ------------------------------------------------------------ the end
    def _disconnect(self, p: Disconnect) -> None:
        s = self.session
        assert s is not None
        asked = p.properties.session_expiry_interval
        if asked is not None:
            if s.expiry == 0 and asked != 0:
                self._close(Reason.PROTOCOL_ERROR, "session expiry set on DISCONNECT after 0 at CONNECT", will=True)
                return
            s.expiry = float(min(asked, self.limits.session_expiry_max))
        self.state = State.CLOSED
        self.asks.append(Close(p.reason_code, "the client disconnected", will=p.reason_code == 0x04))

    def _close(self, reason: int, why: str, will: bool) -> None:
        if self.state is State.CLOSED:
            return
        if self.level == 5 and self.state is State.OPEN:
            self.out.append(Disconnect(reason, Properties(reason_string=why[:200])))
        elif self.state in (State.CONNECTING, State.LOGGING_IN) and self.level == 5 and reason >= 0x80:
            self.out.append(Connack(session_present=False, reason_code=reason,
                                    properties=Properties(reason_string=why[:200])))
        self.state = State.CLOSED
        self.asks.append(Close(reason, why, will=will and self.session is not None))


def split_share(topic_filter: str) -> tuple[str, str]:
    """($share/GROUP/FILTER) -> (GROUP, FILTER); a filter not shared -> ("", filter); a malformed
    $share filter -> ("", ""): no filter (the router answers TOPIC_FILTER_INVALID, MQTT 5 4.8.2)."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return "", topic_filter
    rest = topic_filter[len(SHARE_PREFIX):]
    group, sep, match = rest.partition("/")
    if not sep or not group or not match or "+" in group or "#" in group:
        return "", ""
    return group, match


def content_of(p: Publish) -> MqttContent:
    """What of a PUBLISH goes into the message (mapping.py carries it as AMQP)."""
    pr = p.properties
    return MqttContent(payload=p.payload, content_type=pr.content_type, response_topic=pr.response_topic,
                       correlation_data=pr.correlation_data, user_properties=pr.user_properties,
                       message_expiry=pr.message_expiry_interval, payload_format=pr.payload_format_indicator)
