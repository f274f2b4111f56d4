"""The delivery core: delivery records, outcome aggregation, resume, back-pressure, mesh forwarding.
Sans-IO: time is a parameter, actions are appended to `self.out`, log events to `self.log`.

Theory of operation
-------------------
A *record* exists per message (global id, `gid`) from its first arrival until it is *final*.

At its *origin* (the router the publisher is attached to; `rec.origin is None`) the record is
authoritative: at creation the message is owed to every live (active or suspended) subscription of
its topic in the replicated table, wherever it is homed: `rec.owed[sid]` starts QUEUED. Local
subscriptions go QUEUED -> SENT (handed to the link) -> ACCEPTED | REJECTED; RELEASED / MODIFIED
send them back to QUEUED (redelivered, up to `max_redeliveries`). Remote ones are resolved by
acknowledgements from their home router. Ending a subscription turns what it still owed into ENDED.
When nothing is QUEUED or SENT the record is *decided*: ACCEPTED unless someone rejected it (then
REJECTED naming who). Only then is the publisher told (promise 2); the payload is freed and the
record leaves the in-flight budget.

A record is *final* when it is decided and its publisher settled it (receiver-settle-mode second:
the publisher will never resend it). Then every subscriber delivery of it is settled, ids accepted on
earlier links are reported final (NotifyFinal), the routers holding copies get FINAL, and it is freed.
Settling a subscriber delivery is our promise that the gid will never be handed to that
subscription again.

For remote subscriptions the origin sends copies (Forward) toward their home routers, each copy
naming the subscriptions its destination is to deliver to. A *destination record*
(`rec.origin` set) holds the payload for local delivery, resolves its local subscriptions exactly like
the origin does, and acknowledges each resolution to the origin (SendAck). It is freed on FINAL.
Copies are merged by gid, so a copy that arrives twice (a re-send after a fault, or from a second
origin after a publisher failover) never hands anything twice: resolved subscriptions are simply
acknowledged again. The origin keeps the payload until the record is decided and re-sends pending
copies whenever the live graph changes or a subscription moves (`reroute`).

Resume. A subscriber that re-attaches presents the ids it accepted but has not seen settled; they
are marked ACCEPTED (or kept as *placeholders* until a copy or resend brings the message) and
everything else still owed to it is redelivered under the same tag. A publisher re-attaches with the
same link name, declares its in-doubt tags, and resends them; resends merge by gid.

Back-pressure: publishers get credit only while undecided records of this origin, plus credit
already granted, stay within the budget (messages and bytes). Nothing is ever dropped.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from ..common import errors
from ..common.ids import PLID_LEN, counter_seq, global_id, plid_of
from ..common.settlement_log import AcceptedBy, SizeCount
from ..common.vocab import O_ACCEPTED, O_MODIFIED, O_REJECTED, O_RELEASED, Outcome
from .actions import (
    Action,
    Announce,
    DeclarePublisher,
    Deliver,
    DetachLink,
    Forward,
    GrantCredit,
    NotifyFinal,
    SendAck,
    SendFinal,
    SendHold,
    SendOutcome,
    SendProbe,
    SendQuery,
    SettleDelivery,
    SettlePublisher,
    SubmitOrder,
)
from .order.total import TotalStream, parse_start, start_key
from .subscriptions import SUB_ACTIVE, Subscription, SubscriptionTable


class S(IntEnum):
    """State of one message for one subscription."""

    QUEUED = 0
    SENT = 1
    ACCEPTED = 2
    REJECTED = 3
    ENDED = 4


# The members as module constants for the per-message code: in Python 3.11 `S.QUEUED` goes through
# EnumType.__getattr__, which keeps the interpreter from caching the lookup (~0.1 µs each, a dozen
# per message). The same for Outcome (router.actions) and SubState (router.subscriptions).
S_QUEUED, S_SENT, S_ACCEPTED, S_REJECTED, S_ENDED = S.QUEUED, S.SENT, S.ACCEPTED, S.REJECTED, S.ENDED
RESOLVED = (S_ACCEPTED, S_REJECTED, S_ENDED)
_EVENT_OF = {st: st.name.lower() for st in S}  # settlement-log event of a resolution (no enum lookups per message)
HELD = 5  # acknowledgement state: the copy arrived at the subscription's home (not resolved yet)


@dataclass(slots=True)
class CoreConfig:
    max_inflight_messages: int = 20_000
    max_inflight_bytes: int = 256 * 1024 * 1024
    link_credit: int = 500  # credit window per publisher link
    max_redeliveries: int = 10  # RELEASED/MODIFIED beyond this turns into a rejection
    placeholder_horizon: float = 3600.0  # seconds an unmatched presented id is kept
    orphan_horizon: float = 3600.0  # seconds a decided record waits for a vanished publisher/origin
    max_decided_records: int = 200_000  # decided records awaiting settlement (small, no payload)
    probe_after: float = 5.0  # a resolved destination record asks its origin after this long
    copy_retry: float = 2.0  # an origin re-sends a copy its destination has not confirmed after this long
    stale_wait: float = 0.5  # a record whose publisher left asks the mesh this long before handing it over
    final_memory: float = 300.0  # seconds a router remembers a final gid (late copies and presenters)
    final_notify_batch: int = 256
    # topics in total order by the sequencer (the mesh layer numbers what SubmitOrder asks for and
    # reports numbers back through `DeliveryCore.ordered`); empty for a standalone router
    total_topics: frozenset[str] = frozenset()
    # topics in causal order -> their causal group (a topic without a group is a group of its own)
    causal_groups: dict[str, str] = field(default_factory=dict)


class Record:
    __slots__ = ("gid", "topic", "payload", "plid", "pubs", "owed", "pending", "outcome", "error",
                 "pub_settled", "created", "decided", "redeliveries", "rejected_by", "origin", "origins",
                 "fwd", "holders", "probed", "held", "sent_at", "asked_at", "listed", "preds", "seq", "tnum",
                 "deps")

    def __init__(self, gid: str, topic: str, payload: bytes, now: float) -> None:
        self.gid = gid
        self.topic = topic
        self.payload = payload
        self.plid = gid[:PLID_LEN]  # (ids.plid_of, inlined: one per message)
        self.pubs: list[Any] = []  # live publisher delivery tokens awaiting an outcome / settlement
        self.owed: dict[str, S] = {}
        self.pending = 0  # subscriptions still QUEUED or SENT
        self.outcome: Outcome | None = None
        self.error: tuple[str, str] | None = None
        self.pub_settled = False
        self.created = now
        self.decided = 0.0
        self.redeliveries: dict[str, int] | None = None
        self.rejected_by: list[tuple[str, tuple[str, str] | None]] | None = None
        self.origin: str | None = None  # None: we are its origin; else the origin router's id
        self.origins: dict[str, str] | None = None  # destination: origin router -> its incarnation
        self.fwd: dict[str, str] | None = None  # origin: remote sid -> router its copy went to
        self.holders: set[str] | None = None  # origin: routers that got a copy (FINAL goes there)
        self.probed = 0.0
        self.held: set[str] | None = None  # origin: remote sids whose home confirmed the copy
        self.sent_at = 0.0  # origin: when copies were last sent
        self.asked_at = 0.0  # origin without its publisher: when we last asked the mesh about it
        self.listed: dict[str, float] | None = None  # origin: local sid -> when another origin listed it
        # FIFO: the earlier messages of its publisher not yet final at an origin when this one came
        # there (the latest of them, one per origin): no subscription is handed it before them
        self.preds: tuple[str, ...] = ()
        self.seq = counter_seq(gid)  # its place in its publisher's order (None: not a counter tag)
        self.tnum: int | None = None  # total order: its number in its topic, once learned here
        # causal order: its publishing client's causal past when it published it, (gid, topic) per
        # publisher link of the causal group (those of its own topic are also in `preds`)
        self.deps: tuple[tuple[str, str], ...] = ()


class SubRuntime:
    """Delivery-side state of one subscription homed here."""

    __slots__ = ("sid", "link", "credit", "queue", "owed", "on_link", "capable", "final_unnotified",
                 "notify", "arrived_at", "fifo_hi", "resend", "tnext", "thanded", "thanded_ids", "client",
                 "cpassed")

    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.link: Any = None  # adapter token of the attached link, None while suspended
        self.credit = 0
        self.queue: deque[str] = deque()  # gids QUEUED, in the order to send
        self.owed: dict[str, Record] = {}  # gids QUEUED or SENT for this subscription, arrival order
        self.on_link: set[str] = set()  # gids with an unsettled delivery on the current link
        self.capable = False  # speaks our resume protocol (presents ids, understands NotifyFinal)
        self.final_unnotified: set[str] = set()  # accepted on an earlier link, final since
        self.notify: list[str] = []  # final ids to report on the current link
        self.arrived_at = 0.0  # when it came (back) here from elsewhere (0: it never left)
        # FIFO: per publisher link, the latest seq sent to it here (or handed, as its client says):
        # an earlier message sent for the first time only now would be handed after it
        self.fifo_hi: dict[str, int] = {}
        # sent on an earlier link and not accepted there: sent again whatever was sent after it (it
        # was first sent in order; a client may accept out of order)
        self.resend: set[str] = set()
        # total order: the next number of its topic to hand it (None: from its start), and the
        # highest number its client says it was handed (our clients present `handed-last`)
        self.tnext: int | None = None
        self.thanded = 0
        self.thanded_ids: tuple[str, ...] = ()  # presented handed-last ids whose numbers we must learn first
        self.client = ""  # causal order: its client (AMQP container id), whose causal past grows with it
        # causal order: dependencies of messages handed to it that it was not handed itself (not owed
        # when they came, or final): one that comes only now would be handed after what depends on it
        self.cpassed: set[str] | None = None


class PubLink:
    __slots__ = ("token", "plid", "topic", "second", "outstanding", "pubs", "blocked", "declared", "mark",
                 "client")

    def __init__(self, token: Any, plid: str, topic: str, second: bool, client: str = "") -> None:
        self.token = token
        self.client = client  # its AMQP container id (causal order: whose causal past it publishes in)
        self.plid = plid
        self.topic = topic
        self.second = second  # receiver-settle-mode second
        self.outstanding = 0  # credit granted and not yet used
        self.pubs: dict[Any, str] = {}  # publisher delivery token -> gid
        self.blocked = False  # waiting in DeliveryCore._blocked for room in the budget
        self.declared: set[str] | None = None  # gids it held in doubt when it attached (our clients)
        # the next sequence number (counter tags) it would use when it attached: what it declared
        # says nothing of messages it published later (None: a client without counter tags)
        self.mark: int | None = None


def declared_settled(in_doubt: set[str], mark: int | None, gid: str) -> bool:
    """Does a publisher's declaration (what it held in doubt when it attached, and the next
    sequence number it would use then) say it settled `gid`? Only what it had published by then
    and no longer holds in doubt: a message published after the declaration is not in it either
    (a frozen router that comes back holds an old attach: chaos mesh4, the known limit of stop 9)."""
    if gid in in_doubt:
        return False
    if mark is None:
        return True
    seq = counter_seq(gid)
    return seq is not None and seq < mark


ASK_AHEAD = 512  # total order: numbers past the one the walk waits at whose questions go out with it


def _tnum_key(rec: Record | None) -> float:
    return rec.tnum if rec is not None and rec.tnum is not None else math.inf


class DeliveryCore:
    def __init__(self, router_id: str, table: SubscriptionTable | None = None,
                 config: CoreConfig | None = None) -> None:
        self.router_id = router_id
        self.table = table if table is not None else SubscriptionTable()  # (an empty table is falsy)
        self.cfg = config if config is not None else CoreConfig()
        self.records: dict[str, Record] = {}
        self.subs: dict[str, SubRuntime] = {}  # subscriptions homed here
        self.remote_pending: dict[str, dict[str, Record]] = {}  # remote sid -> origin records owing it
        self.pub_links: dict[Any, PubLink] = {}
        self.pub_of: dict[Any, tuple[PubLink, str]] = {}  # publisher delivery token -> (link, gid)
        self.placeholders: dict[str, dict[str, float]] = {}  # gid -> {sid: since}
        self.recent_final: dict[str, float] = {}  # gid -> when it became final here (in order)
        self.held_for: dict[str, dict[str, float]] = {}  # gid -> routers that asked for its FINAL
        self._ph_queried: dict[str, float] = {}  # placeholder gid -> last time we asked the mesh
        self.reachable: dict[str, str] = {router_id: ""}  # router -> incarnation (mesh layer sets it)
        self.inflight_bytes = 0
        self.undecided = 0  # records of this origin still waiting: what the budget counts
        self.stats_final_ignored = 0  # FINALs refused: the publisher's delivery is open here
        self.newest_link: dict[str, PubLink] = {}  # plid -> its most recent attach here
        # FIFO: per publisher link, our records of it not final yet, in publish order: gid -> seq
        self.chain: dict[str, dict[str, int]] = {}
        self._arrivals = 0  # the order of messages without counter tags (any AMQP client)
        self.awaited: dict[str, list[float]] = {}  # predecessors unknown here -> [first wanted, last asked]
        self.stats_fifo_held = 0  # times a delivery was held back behind an earlier message of its publisher
        self.reserved_credit = 0
        self.ready = True  # grant publishers credit only when ready (table loaded / synced)
        self._blocked: deque[PubLink] = deque()
        self.out: list[Action] = []
        self.log: list[tuple[Any, ...]] = []  # settlement-log events: (ev, gid, topic, sid, info)
        self._now = 0.0  # the latest time we were given (stamps copies sent from untimed calls)
        self.mesh_size = 1  # routers in the topology (the mesh layer sets it): 1 = standalone
        # total order: per topic, the numbering learned so far
        self.total: dict[str, TotalStream] = {t: TotalStream() for t in self.cfg.total_topics}
        self.stats_total_held = 0  # times a delivery waited for an earlier number of its topic
        self.stats_total_late = 0  # handed after a later number (it came only after that was handed)
        # causal order: per (client, causal group), the client's causal past as this router knows it:
        # publisher link -> (seq or -1, gid, topic, when noted) of the latest message of that link in it
        self.causal = self.cfg.causal_groups
        self.pasts: dict[tuple[str, str], dict[str, tuple[int, str, str, float]]] = {}
        self.stats_causal_deps = 0  # dependencies attached to messages published here
        self.stats_causal_cycles = 0  # two messages found waiting for each other (one went first)
        for sub in self.table.live():
            if sub.home == router_id:
                self.subs.setdefault(sub.sid, SubRuntime(sub.sid))

    def _local(self, sub: Subscription | None) -> bool:
        return sub is not None and sub.live and sub.home == self.router_id

    # ================================================================ publishers
    def attach_publisher(self, token: Any, plid: str, topic: str, second: bool,
                         in_doubt: Iterable[bytes] | None, now: float, mark: int | None = None,
                         client: str = "", past: Iterable[tuple[str, str]] = ()) -> None:
        """`past`: causal order, what its client says it was handed and published (our clients
        present it: a router it moved to learns what the one before knew)."""
        self._now = now
        pl = PubLink(token, plid, topic, second, client)
        group = self.causal.get(topic) if self.causal and client else None
        if group is not None:
            for g, t in past:
                if self.causal.get(t) == group:
                    self._causal_note(client, group, g, t, ())
        self.pub_links[token] = pl
        # the newest attach of a link name supersedes older ones still open here (their connections
        # not yet noticed dead, e.g. after a freeze): only its declaration is evidence (chaos mesh4
        # seed 21: an older declaration, made before a message existed, took it for settled)
        self.newest_link[plid] = pl
        if in_doubt is not None:
            gids = {global_id(plid, t) for t in in_doubt}
            pl.declared = gids
            pl.mark = mark
            self._publisher_declared(plid, gids, mark, now)
            if len(self.reachable) > 1:
                self.out.append(DeclarePublisher(plid, tuple(sorted(gids)), mark))
        self._grant(pl)

    def detach_publisher(self, token: Any) -> None:
        pl = self.pub_links.pop(token, None)
        if pl is None:
            return
        if self.newest_link.get(pl.plid) is pl:
            del self.newest_link[pl.plid]
        self.reserved_credit -= pl.outstanding
        pl.outstanding = 0
        for pub, gid in pl.pubs.items():
            self.pub_of.pop(pub, None)
            rec = self.records.get(gid)
            if rec is not None and pub in rec.pubs:
                rec.pubs.remove(pub)
        pl.pubs.clear()
        self._unblock()

    def publish(self, link_token: Any, pub: Any, tag: bytes, payload: bytes, now: float) -> str:
        """A transfer arrived on a publisher link. Returns the gid."""
        self._now = now
        pl = self.pub_links[link_token]
        if pl.outstanding <= 0:
            raise errors.TransferLimitExceeded("transfer sent without link credit")
        pl.outstanding -= 1
        self.reserved_credit -= 1
        gid = global_id(pl.plid, tag)
        rec = self.records.get(gid)
        if rec is None:
            group = self.causal.get(pl.topic) if self.causal else None
            # (a resend its client declared in doubt gets none here: what the client was handed
            # since it first sent it is no dependency of it, and could close a cycle of waits)
            deps = self._causal_deps(pl, group) if group is not None and not (
                pl.declared and gid in pl.declared) else ()
            self._new_record(gid, pl.topic, payload, now, deps, pub, pl)
            if group is not None and pl.client:
                self._causal_note(pl.client, group, gid, pl.topic, ())  # what it published is in its past
        else:
            self._merge(rec, pub, pl, payload, now)
        if pl.outstanding <= self.cfg.link_credit // 2:
            self._grant(pl)
        return gid

    def _merge(self, rec: Record, pub: Any, pl: PubLink, payload: bytes, now: float) -> None:
        """A resend of a message we hold (as its origin or as a destination of a copy)."""
        gid = rec.gid
        self.log.append(("received", gid, rec.topic, None, {"size": len(payload), "info": "merged"}))
        if rec.origin is not None:
            self._adopt(rec, payload, now)
        elif rec.outcome is None and not rec.pubs:
            rec.pubs.append(pub)  # its publisher is back: we drive its delivery again
            self._route(rec, force=True)
            rec.pubs.remove(pub)
        rec.pubs.append(pub)
        pl.pubs[pub] = gid
        self.pub_of[pub] = (pl, gid)
        if rec.outcome is not None:
            self._tell_publisher(rec, pub, pl)
            self._maybe_final(rec, now)

    def publisher_settled(self, pub: Any, now: float) -> None:
        entry = self.pub_of.pop(pub, None)
        self.out.append(SettlePublisher(pub))
        if entry is None:
            return
        pl, gid = entry
        pl.pubs.pop(pub, None)
        rec = self.records.get(gid)
        if rec is None:
            return
        if pub in rec.pubs:
            rec.pubs.remove(pub)
        rec.pub_settled = True
        if rec.outcome is not None:  # (_maybe_final, inlined)
            self._finalize(rec, now)

    def _new_record(self, gid: str, topic: str, payload: bytes, now: float,
                    deps: tuple[tuple[str, str], ...], pub: Any, pl: PubLink) -> Record:
        """A new message from publisher delivery `pub` on `pl`. The delivery is registered before
        the record is routed or handed: a record without a live publisher delivery is one whose
        publisher left, which is withheld until the mesh was asked about it (every fresh message
        in a mesh was, until the next one came)."""
        rec = Record(gid, topic, payload, now)
        self.records[gid] = rec
        rec.pubs.append(pub)
        pl.pubs[pub] = gid
        self.pub_of[pub] = (pl, gid)
        self.inflight_bytes += len(payload)
        self.undecided += 1
        self._chain(rec)
        if deps:
            self._add_deps(rec, deps)
        asked = self.held_for.pop(gid, None)
        if asked:
            rec.holders = set(asked)
        held = self.placeholders.pop(gid, None)
        me = self.router_id
        remote = False
        for sub in self.table.live_for_topic(topic):
            sid = sub.sid
            if held is not None and sid in held and sub.home == me:
                rec.owed[sid] = S_ACCEPTED
                self.log.append(("accepted", gid, topic, sid, "placeholder"))
                continue
            rec.owed[sid] = S_QUEUED
            rec.pending += 1
            if sub.home == me:
                rt = self.subs[sid]
                rt.owed[gid] = rec
                if rt.link is not None:
                    rt.queue.append(gid)
            else:
                self.remote_pending.setdefault(sid, {})[gid] = rec
                remote = True
        self.log.append(("received", gid, topic, None, SizeCount((len(payload), len(rec.owed)))))
        if self.total and topic in self.total:
            self._number(rec, now)  # may add or end parts, and decide it
            if rec.outcome is not None:
                return rec
        if rec.pending == 0:
            self._decide(rec, now)  # (a total-order record waits for its number)
            return rec
        if remote:
            self._route(rec, force=False)
        for sid in rec.owed:
            local = self.subs.get(sid)
            if local is not None and local.link is not None and local.credit > 0:
                self._pump(local)
        return rec

    def _adopt(self, rec: Record, payload: bytes, now: float) -> None:
        """A publisher resent here a message we only held as a destination (its origin died or the
        publisher failed over to us): we become an origin for it, owing what our table says."""
        rec.origin = None
        if not rec.payload:
            rec.payload = payload
            self.inflight_bytes += len(payload)
        self.undecided += 1  # counted until decided, like any record of ours
        self._chain(rec)
        self._absorb_placeholders(rec)
        for sub in self.table.live_for_topic(rec.topic):
            if sub.sid not in rec.owed:
                rt = self._owe(rec, sub.sid, sub.home)
                if rt is not None:
                    self._pump(rt)
        if self.total and rec.topic in self.total:
            self._number(rec, now)
            if rec.outcome is not None:
                return
        if rec.pending == 0:
            self._decide(rec, now)
        else:
            self._route(rec, force=True)

    def _owe(self, rec: Record, sid: str, home: str | None) -> SubRuntime | None:
        """A new QUEUED part of `rec` (not on the hot path of `_new_record`) for `sid`, homed at
        `home` (None: not in our table yet). Returns the local subscription when it has a link
        (the caller pumps it)."""
        rec.owed[sid] = S_QUEUED
        rec.pending += 1
        if home != self.router_id:
            self.remote_pending.setdefault(sid, {})[rec.gid] = rec
            return None
        rt = self.subs.get(sid)
        if rt is None:
            rt = self.subs[sid] = SubRuntime(sid)
        rt.owed[rec.gid] = rec
        if rt.link is None:
            return None
        rt.queue.append(rec.gid)
        return rt

    # ================================================================ outcomes
    def _decide(self, rec: Record, now: float) -> None:
        if rec.tnum is None and rec.origin is None and self.total and rec.topic in self.total:
            return  # its number may make it owed to more subscriptions: decided once numbered
        if rec.origin is not None:  # a destination record: our local subscriptions are done
            rec.decided = now
            self.inflight_bytes -= len(rec.payload)
            rec.payload = b""
            if not rec.owed and rec.gid not in self.placeholders:
                del self.records[rec.gid]  # no subscription here has a part in it any more
            return
        if rec.rejected_by:
            rec.outcome = O_REJECTED
            names = ", ".join(sid for sid, _ in rec.rejected_by)
            first = rec.rejected_by[0][1]
            # the first subscriber's condition travels on; the description names every rejecter
            detail = f": {first[1]}" if first and first[1] else ""
            rec.error = (first[0] if first else errors.SUBSCRIBER_REJECTED,
                         f"rejected by subscription(s) {names}{detail}")
        else:
            rec.outcome = O_ACCEPTED
        rec.decided = now
        # every subscription is done with it: only its outcome and settlement remain to be told, so
        # the payload is freed now and the record stops counting against the in-flight budget
        self.undecided -= 1
        self.inflight_bytes -= len(rec.payload)
        rec.payload = b""
        if self._blocked:
            self._unblock()
        if rec.outcome is O_ACCEPTED and rec.error is None:
            self.log.append(("outcome", rec.gid, rec.topic, None, AcceptedBy(len(rec.owed))))
        else:
            self.log.append(("outcome", rec.gid, rec.topic, None, {
                "outcome": rec.outcome.name, "count": len(rec.owed),
                "error": f"{rec.error[0]}: {rec.error[1]}" if rec.error else None}))
        for pub in list(rec.pubs):
            entry = self.pub_of.get(pub)
            if entry is not None:
                self._tell_publisher(rec, pub, entry[0])
        self._maybe_final(rec, now)

    def _tell_publisher(self, rec: Record, pub: Any, pl: PubLink) -> None:
        assert rec.outcome is not None
        settle = not pl.second
        self.out.append(SendOutcome(pub, rec.outcome, rec.error, settle))
        if settle:  # receiver-settle-mode first: we settle first; the publisher is done with it
            rec.pub_settled = True
            rec.pubs.remove(pub)
            pl.pubs.pop(pub, None)
            self.pub_of.pop(pub, None)

    def _maybe_final(self, rec: Record, now: float) -> None:
        if rec.outcome is None or not rec.pub_settled:
            return
        self._finalize(rec, now)

    def _finalize(self, rec: Record, now: float) -> None:
        gid = rec.gid
        del self.records[gid]
        chain = self.chain.get(rec.plid)
        if chain is not None and chain.pop(gid, None) is not None and not chain:
            del self.chain[rec.plid]
        if rec.payload:
            self.inflight_bytes -= len(rec.payload)
            rec.payload = b""
        for pub in rec.pubs:  # other legs (a resend on a second link): settle them too
            entry = self.pub_of.pop(pub, None)
            if entry is not None:
                entry[0].pubs.pop(pub, None)
                if rec.outcome is not None:
                    self.out.append(SendOutcome(pub, rec.outcome, rec.error, True))
        me = self.router_id
        tell: set[str] | None = set(rec.holders) if rec.holders else None
        subs = self.subs
        for sid, st in rec.owed.items():
            rt = subs.get(sid)
            if rt is None:
                if rec.origin is None:
                    sub = self.table.get(sid)
                    if sub is not None and sub.live and sub.home != me:
                        if tell is None:
                            tell = set()
                        tell.add(sub.home)  # its new home may hold a placeholder for it
                    pend = self.remote_pending.get(sid)
                    if pend is not None:
                        pend.pop(gid, None)
                continue
            if st is S_QUEUED or st is S_SENT:  # final elsewhere before it got here: withdrawn
                rt.owed.pop(gid, None)
                rt.resend.discard(gid)
            if gid in rt.on_link:
                rt.on_link.discard(gid)
                self.out.append(SettleDelivery(sid, gid))
            elif st is S_ACCEPTED:
                if rt.link is not None and rt.capable:
                    rt.notify.append(gid)
                    self._pump(rt)
                elif rt.capable:
                    rt.final_unnotified.add(gid)
        if rec.origin is None and tell:
            tell.discard(me)
            for router in sorted(tell):
                self.out.append(SendFinal(router, gid))
        self.recent_final[gid] = now  # late copies and late presenters learn it is final
        if gid in self.placeholders:  # other subscriptions here that hold it without a part in it
            self._placeholder_final(gid)
        self.log.append(("settled", gid, rec.topic, None, None))
        if self._blocked:
            self._unblock()

    # ================================================================ subscriptions (local links)
    def attach_subscriber(self, link: Any, sid: str, topic: str, container: str, link_name: str,
                          expiry: float, capable: bool, presented: Iterable[str] | None,
                          now: float, epoch: int | None = None, handed_last: Iterable[str] = ()) -> bool:
        """A subscriber link attached here (new or resuming). Returns True when it resumed.
        `epoch`: the subscription's epoch its client last attached with (our clients present it).
        `handed_last`: per publisher link, the latest message its client was handed (FIFO: an
        earlier one that comes only now is not handed after it)."""
        self._now = now
        old_rt = self.subs.get(sid)
        if old_rt is not None and old_rt.link is not None:
            self._unbind(old_rt)  # the same identity attached again: the new link wins (adapter steals)
        before = self.table.get(sid)
        was_remote = before is not None and before.live and before.home != self.router_id
        # the client attached somewhere after the last change we know of: we missed its travels, and
        # what we still hold for it may have been dealt with elsewhere meanwhile
        stale_view = before is not None and before.live and epoch is not None and before.epoch < epoch
        sub, resumed = self.table.attach(sid, topic, container, link_name, expiry, self.router_id, now,
                                         min_epoch=epoch or 0)
        rt = self.subs.get(sid)
        fresh = rt is None
        if rt is None:
            rt = self.subs[sid] = SubRuntime(sid)
        if was_remote:
            self._moved_here(sid)
        if stale_view:
            self._distrust(rt, now)
        rt.link = link
        rt.capable = capable
        rt.client = container
        rt.credit = 0
        presented_set = set(presented or ())
        self.log.append(("attach_requested", None, topic, sid, {
            "container": container, "link": link_name,
            "info": f"expiry={'never' if math.isinf(expiry) else expiry} presented={len(presented_set)}"}))
        # The client already holds what it presents, whether this is a resume or a new life of the
        # same identity (a non-durable one that ended): never hand those ids to it again.
        for gid in presented_set:
            rec = rt.owed.get(gid)
            if rec is not None:
                self._resolve(rec, sid, S_ACCEPTED, None, now, "resume")
            elif gid in rt.final_unnotified:
                rt.notify.append(gid)
            else:
                rec2 = self.records.get(gid)
                if rec2 is None and gid in self.recent_final:
                    rt.notify.append(gid)  # we were its origin and it is final
                elif rec2 is None:
                    if self._settled_by_local_publisher(gid):
                        rt.notify.append(gid)  # its publisher is here and settled it: final
                        continue
                    # not here (yet): a copy or a resend may bring it
                    self.placeholders.setdefault(gid, {})[sid] = now
                    self.log.append(("placeholder", gid, topic, sid, None))
                elif rec2.owed.get(sid) is not S_ACCEPTED:
                    # not owed to this life (or ended in an earlier one), yet the client holds it:
                    # count it as accepted so that the final settlement reaches it
                    rec2.owed[sid] = S_ACCEPTED
        rt.final_unnotified.clear()
        # only a client that hands over in arrival order (ours) presents `handed_last`; what a
        # client presents as accepted says nothing of order (a client may accept out of order)
        handed_last = tuple(handed_last)
        hi = rt.fifo_hi
        for gid in handed_last:
            seq = counter_seq(gid)
            if seq is not None and seq > hi.get(gid[:PLID_LEN], -1):
                hi[gid[:PLID_LEN]] = seq
        rt.queue = deque(rt.owed)
        ts = self.total.get(topic) if self.total else None
        if ts is not None:
            if ts.start_of(sid, sub.created) is None:
                self.out.append(SubmitOrder(topic, start_key(sid, sub.created)))  # (again after a restart)
            rt.thanded_ids = handed_last  # numbered: this router learns them all (a restarted one again)
            if resumed and (fresh or was_remote or stale_view):
                # what it was handed elsewhere: our clients say (handed-last); others do not, and
                # then it goes on from the lowest number held here for it
                rt.tnext = None if capable else 0
            owed = rt.owed
            rt.queue = deque(sorted(rt.queue, key=lambda g: _tnum_key(owed.get(g))))
        self.out.append(Announce(sid, tuple(sorted(presented_set))))
        return resumed

    def _distrust(self, rt: SubRuntime, now: float) -> None:
        """Our view of this subscription was stale (it has been elsewhere meanwhile): copies we held
        for it are dropped (their origins re-send what is still pending for it, forced by the epoch
        change), and it counts as arrived now (see `_pump`)."""
        sid = rt.sid
        rt.arrived_at = now
        for gid, rec in list(rt.owed.items()):
            if rec.origin is not None:
                del rt.owed[gid]
                del rec.owed[sid]
                rec.pending -= 1
                if rec.pending == 0:
                    self._decide(rec, now)

    def detach_subscriber(self, link: Any, sid: str, closed: bool, now: float) -> None:
        """The subscriber's link detached (`closed`: unsubscribe) or its connection dropped.
        Ignored when `link` is no longer the subscription's link (it was stolen by a newer one)."""
        rt = self.subs.get(sid)
        sub = self.table.get(sid)
        if rt is None or sub is None or not sub.live or rt.link != link:
            return
        self._unbind(rt)
        if closed:
            self._end(sid, now, "unsubscribed")
        elif sub.expiry <= 0:
            self._end(sid, now, "detached-not-durable")
        else:
            self.table.suspend(sid, now)
            self.log.append(("suspended", None, sub.topic, sid, None))
            self.out.append(Announce(sid))

    def _unbind(self, rt: SubRuntime) -> None:
        """Forget the current link: what was SENT on it is in doubt and will be redelivered."""
        rt.link = None
        rt.credit = 0
        if rt.notify:  # not told yet: tell it when it resumes and presents them
            rt.final_unnotified.update(rt.notify)
            rt.notify.clear()
        for gid in rt.on_link:
            rec = self.records.get(gid)
            if rec is not None and rec.owed.get(rt.sid) is S_SENT:
                rec.owed[rt.sid] = S_QUEUED
                rt.resend.add(gid)
        rt.on_link.clear()
        rt.queue.clear()

    def _end(self, sid: str, now: float, reason: str) -> None:
        """End a subscription homed here (unsubscribe, not durable, expiry)."""
        sub = self.table.end(sid, now, reason)
        if sub is not None:
            self.log.append(("unsubscribed" if reason == "unsubscribed" else "expired", None, sub.topic,
                             sid, reason))
            self.out.append(Announce(sid))
        self._ended(sid, now, reason)

    def _ended(self, sid: str, now: float, reason: str) -> None:
        rt = self.subs.pop(sid, None)
        for gid, phs in list(self.placeholders.items()):
            if phs.pop(sid, None) is not None and not phs:
                del self.placeholders[gid]
        for rec in list(self.remote_pending.pop(sid, {}).values()):
            self._resolve(rec, sid, S_ENDED, None, now, reason)
        if rt is None:
            return
        for rec in list(rt.owed.values()):
            self._resolve(rec, sid, S_ENDED, None, now, reason)

    def subscriber_credit(self, sid: str, credit: int) -> None:
        rt = self.subs.get(sid)
        if rt is None or rt.link is None:
            return
        rt.credit = credit
        self._pump(rt)

    def _pump(self, rt: SubRuntime) -> None:
        out = self.out
        if rt.notify and rt.credit > 0:
            batch = self.cfg.final_notify_batch
            while rt.notify and rt.credit > 0:
                chunk, rt.notify = tuple(rt.notify[:batch]), rt.notify[batch:]
                out.append(NotifyFinal(rt.sid, chunk))
                rt.credit -= 1
        q = rt.queue
        sid = rt.sid
        parked: list[str] | None = None
        late: list[Record] | None = None
        causal_late: list[Record] | None = None
        ttopic = self._total_topic(sid) if self.total else None
        blocked = False
        while q and rt.credit > 0:
            gid = q.popleft()
            rec = rt.owed.get(gid)
            if rec is None or rec.owed.get(sid) is not S_QUEUED:
                continue
            redelivery = bool(rec.redeliveries and sid in rec.redeliveries)
            if ttopic is not None and not self._total_ready(rec, rt, redelivery):
                continue  # not its turn: handed by number when it is (below), not kept in the queue
            if (rec.origin is None and not rec.pubs and not rec.pub_settled and self._withhold(rec, rt)) \
                    or (ttopic is None and rec.preds and not self._fifo_ready(rec, sid)):
                if ttopic is not None:
                    # total order: nothing numbered after it goes first (sent again in number order)
                    q.appendleft(gid)
                    blocked = True
                    if rec.tnum is not None:
                        self._ask_ahead(rt, ttopic, rec.tnum)
                    break
                if parked is None:
                    parked = []
                parked.append(gid)
                continue
            if rt.cpassed and gid in rt.cpassed and not redelivery:
                # causal order: a message that depends on it was handed first (it was not owed to
                # this subscription then): handing it now would break causal order
                rt.cpassed.discard(gid)
                if causal_late is None:
                    causal_late = []
                causal_late.append(rec)
                continue
            seq = rec.seq
            if seq is not None and ttopic is None:
                hi = rt.fifo_hi.get(rec.plid, -1)
                if seq < hi and not redelivery and not (rt.resend and gid in rt.resend):
                    if late is None:
                        late = []
                    late.append(rec)
                    continue
                if seq > hi:
                    rt.fifo_hi[rec.plid] = seq
            self._send(rt, rec, redelivery)
        if parked:
            q.extendleft(reversed(parked))  # kept in order; tick() pumps again
        if late:
            # a later message of its publisher was handed first: it came here only after that
            # (re-originated with a newer subscription table after its publisher failed over, for
            # a subscription not in force when it was first sent: a message it is owed holds every
            # later one back). Handing it now would break FIFO: it ends for this subscription.
            for rec in late:
                self._resolve(rec, sid, S_ENDED, None, self._now, "fifo: a later message was handed first")
        if causal_late:
            for rec in causal_late:
                self._resolve(rec, sid, S_ENDED, None, self._now, "causal: a message depending on it was handed first")
        if ttopic is not None and not blocked:
            # total order: hand the next numbers by looking them up (what waits is not rescanned)
            seq_of = self.total[ttopic].seq
            while rt.credit > 0:
                nxt = self._total_next(rt, ttopic)
                if nxt is None:
                    break
                rec = rt.owed.get(seq_of.get(nxt, ""))
                if rec is None or rec.owed.get(sid) is not S_QUEUED:
                    break
                if rec.origin is None and not rec.pubs and not rec.pub_settled and self._withhold(rec, rt):
                    q.append(rec.gid)  # asked about; tick() pumps again
                    self._ask_ahead(rt, ttopic, nxt)
                    break
                self._send(rt, rec, bool(rec.redeliveries and sid in rec.redeliveries))

    def _ask_ahead(self, rt: SubRuntime, topic: str, n: int) -> None:
        """The walk waits at number `n` for the mesh's answer about a message whose publisher left
        us: ask now about the next ones in the same case too, so that their answers come meanwhile
        (one at a time, a backlog of them took `stale_wait` each: chaos triangle, seed 11)."""
        seq_of = self.total[topic].seq
        sid = rt.sid
        for k in range(n + 1, n + 1 + ASK_AHEAD):
            g = seq_of.get(k)
            if g is None:
                break
            r = rt.owed.get(g)
            if r is not None and r.owed.get(sid) is S_QUEUED and r.origin is None and not r.pubs \
                    and not r.pub_settled:
                self._withhold(r, rt)

    def _send(self, rt: SubRuntime, rec: Record, redelivery: bool) -> None:
        gid = rec.gid
        rec.owed[rt.sid] = S_SENT
        rt.on_link.add(gid)
        rt.credit -= 1
        if rt.resend:
            rt.resend.discard(gid)
        self.out.append(Deliver(rt.sid, gid, rec.payload, redelivery))
        self.log.append(("delivered", gid, rec.topic, rt.sid, "redelivery" if redelivery else None))
        if self.causal:
            if rec.deps:
                self._causal_passed(rt, rec)
            group = self.causal.get(rec.topic) if rt.client else None
            if group is not None:
                self._causal_note(rt.client, group, gid, rec.topic, rec.deps)

    def _causal_passed(self, rt: SubRuntime, rec: Record) -> None:
        """`rec` goes to `rt` now: every dependency of its topic that `rt` was not handed here (its
        record final and gone, or here without a part for it), and every earlier message of that
        dependency's publisher link (a dependency stands for them: its client's past keeps only the
        latest of each link), must never come after it. For counter tags the FIFO high mark says it
        (`fifo_hi`: an earlier message that comes later ends for it); other gids are kept."""
        sid = rt.sid
        for g, t in rec.deps:
            if t != rec.topic:
                continue
            r = self.records.get(g)
            if r is not None and r.owed.get(sid) is not None and (r.owed[sid] is not S_QUEUED
                                                                  or rec.gid in r.preds):
                continue  # sent or resolved for it here (and its predecessors before it); or a cycle
            seq = counter_seq(g)
            if seq is not None:
                p = plid_of(g)
                if rt.fifo_hi.get(p, -1) <= seq:
                    rt.fifo_hi[p] = seq + 1  # (above it: it, too, ends if it comes only now)
            else:
                if rt.cpassed is None:
                    rt.cpassed = set()
                rt.cpassed.add(g)

    # ================================================================ causal order
    def _causal_note(self, client: str, group: str, gid: str, topic: str,
                     deps: tuple[tuple[str, str], ...]) -> None:
        """`gid` (and what it depended on) is now in the causal past of `client` for `group`: it was
        handed to it here, or it published it. Per publisher link the latest is kept (a link's
        messages are handed in its order, so depending on the latest covers the earlier ones)."""
        past = self.pasts.get((client, group))
        if past is None:
            past = self.pasts[(client, group)] = {}
        now = self._now
        for g, t in ((gid, topic), *deps):
            p = plid_of(g)
            r = counter_seq(g)
            rank = -1 if r is None else r
            cur = past.get(p)
            if cur is None or rank >= cur[0] or rank < 0:  # (a tag without a counter: the newest seen)
                past[p] = (rank, g, t, now)

    def _causal_deps(self, pl: PubLink, group: str) -> tuple[tuple[str, str], ...]:
        """The dependencies of a message its client publishes now on `pl`: its causal past, but its
        own link (FIFO covers it). A final message stays a dependency: its publisher may still resend
        it for a subscription that came in force since (re-originated, it is owed there); entries
        noted longer ago than we remember finals leave the past (as `_await` gives up on them)."""
        past = self.pasts.get((pl.client, group)) if pl.client else None
        if not past:
            return ()
        horizon = self._now - self.cfg.final_memory
        out = []
        for p, (_r, g, t, noted) in list(past.items()):
            if noted < horizon:
                del past[p]
            elif p != pl.plid:
                out.append((g, t))
        self.stats_causal_deps += len(out)
        return tuple(out)

    def _add_deps(self, rec: Record, deps: tuple[tuple[str, str], ...]) -> None:
        """Causal dependencies of `rec` (from its origin, or from a copy): it is held back behind
        those of its own topic exactly as behind a FIFO predecessor; all of them are passed on to
        the causal past of every client it is handed to."""
        rec.deps = deps if not rec.deps else tuple(dict.fromkeys(rec.deps + deps))
        same = tuple(g for g, t in deps if t == rec.topic and g != rec.gid and g not in rec.preds)
        if same:
            rec.preds = (*rec.preds, *same)

    def _total_topic(self, sid: str) -> str | None:
        """The topic of subscription `sid` if it is in total order."""
        sub = self.table.get(sid)
        return sub.topic if sub is not None and sub.topic in self.total else None

    def _chain(self, rec: Record) -> None:
        """A record of ours (we are its origin): its predecessor is the latest earlier message of
        its publisher link that is not final here. Our publishers send in publish order and resend
        what is in doubt first, so every earlier message still in doubt came here before it."""
        seq = rec.seq
        if seq is None:
            self._arrivals += 1
            seq = -(1 << 62) + self._arrivals  # any AMQP client: arrival order
        chain = self.chain.get(rec.plid)
        if chain is None:
            self.chain[rec.plid] = {rec.gid: seq}
            return
        if rec.gid in chain:
            return
        last = next(reversed(chain))
        last_seq = chain[last]
        chain[rec.gid] = seq
        if last_seq < seq:  # the usual case: it follows the latest one
            pred: str | None = last
        else:  # it came late (a resend of an older message): the latest one before it
            below = [(s, g) for g, s in chain.items() if s < seq]
            pred = max(below)[1] if below else None
            if last_seq > seq:  # keep the dict in publish order
                self.chain[rec.plid] = dict(sorted(chain.items(), key=lambda kv: kv[1]))
        if pred is not None:
            preds = rec.preds
            if not preds:
                rec.preds = (pred,)
            elif pred not in preds:
                rec.preds = (*preds, pred)

    # ================================================================ total order
    def ordered(self, topic: str, n: int, key: str, now: float, pump: bool = True) -> None:
        """The sequencer's number `n` of `topic` is `key` (a gid or a subscription's start). Numbers
        come in order, 1, 2, 3, ... (again from 1 after this router restarts: known ones are ignored).
        `pump=False`: more numbers follow at once; the last of them pumps the subscriptions (a
        restarted router learns thousands in one go: pumping after each was quadratic)."""
        self._now = now
        ts = self.total.get(topic)
        if ts is None or not ts.learn(n, key):
            return
        if parse_start(key) is None:
            rec = self.records.get(key)
            if rec is not None and rec.tnum is None:
                rec.tnum = n
                self._total_owed(rec, now)
        if pump:
            self.pump_topic(topic)

    def pump_topic(self, topic: str) -> None:
        """Hand what is ready to every subscription of `topic` homed here."""
        me = self.router_id
        for sub in self.table.live_for_topic(topic):
            if sub.home == me:
                rt = self.subs.get(sub.sid)
                if rt is not None and rt.link is not None and rt.credit > 0:
                    self._pump(rt)

    def _number(self, rec: Record, now: float) -> None:
        """A record of ours (origin) in a total-order topic: apply its number, or ask for one."""
        if rec.tnum is None:
            rec.tnum = self.total[rec.topic].num.get(rec.gid)
        if rec.tnum is None:
            self.out.append(SubmitOrder(rec.topic, rec.gid))  # a resend keeps its number
        else:
            self._total_owed(rec, now)

    def _total_owed(self, rec: Record, now: float) -> None:
        """`rec` has its number: it is owed to exactly the subscriptions (lives) started before it in
        the order. An origin adds the parts its table did not have when the message came; origin and
        destination end the parts of subscriptions started after it (both decide alike)."""
        ts = self.total[rec.topic]
        n = rec.tnum
        assert n is not None
        me = self.router_id
        gid = rec.gid
        if rec.origin is None:
            remote = False
            for sub in self.table.live_for_topic(rec.topic):
                if sub.sid not in rec.owed and ts.owed(n, sub.sid, sub.created):
                    self._owe(rec, sub.sid, sub.home)  # (pumped by `ordered`)
                    remote = remote or sub.home != me
            table = self.table
            for (sid, _life), s in ts.start.items():
                if s < n and sid not in rec.owed and table.get(sid) is None:
                    # started before it, but its entry has not reached our table yet (gossip and
                    # numbering race after a partition heals): owed; routed once the entry comes
                    self._owe(rec, sid, None)
            if remote and rec.payload and self._driving(rec):
                # (an origin whose publisher left does not resurrect it: its publisher resent it
                # elsewhere, where it may be final by now; see `reroute`)
                self._route(rec, force=False)
        for sid, st in list(rec.owed.items()):
            if st is not S_QUEUED:
                continue
            entry = self.table.get(sid)
            if entry is None or not entry.live or (rec.origin is not None and entry.home != me):
                continue
            if not ts.owed(n, sid, entry.created):
                self._resolve(rec, sid, S_ENDED, None, now, "total: subscribed after it in the order")
        if rec.origin is None and rec.outcome is None and rec.pending == 0 and gid in self.records:
            self._decide(rec, now)

    def _total_ready(self, rec: Record, rt: SubRuntime, redelivery: bool) -> bool:
        """May `rt` be handed `rec` (a total-order topic) now? Only the next number of the topic owed
        to it; one it was handed before (sent again) or one that came only after a later one was
        handed (it is owed: it is handed, and counted as late) goes at once."""
        n = rec.tnum
        if n is None:
            self.stats_total_held += 1
            return False
        nxt = self._total_next(rt, rec.topic)
        if nxt is None or n > nxt:
            self.stats_total_held += 1
            return False
        if n < nxt and not redelivery and not (rt.resend and rec.gid in rt.resend):
            self.stats_total_late += 1
            self.log.append(("total_late", rec.gid, rec.topic, rt.sid, {"number": n, "next": nxt}))
        return True

    def _total_next(self, rt: SubRuntime, topic: str) -> int | None:
        """The lowest number of `topic` not yet handed to `rt` (nor resolved for it) that it may be
        owed: it waits for that message's copy, or for its FINAL (then it was resolved for `rt`
        elsewhere, or not owed to it). None: its start is not numbered yet."""
        ts = self.total[topic]
        sid = rt.sid
        if rt.thanded_ids:  # what its client says it was handed: go on after the highest of them
            nums = [ts.num.get(g) for g in rt.thanded_ids]
            if None in nums:
                return None  # not learned yet (this router restarted and is catching up)
            rt.thanded = max(rt.thanded, *(n for n in nums if n is not None))
            rt.thanded_ids = ()
            if rt.tnext is not None and 0 < rt.tnext <= rt.thanded:
                rt.tnext = rt.thanded + 1
        p = rt.tnext
        if p is None or p == 0:
            sub = self.table.get(sid)
            s = ts.start_of(sid, sub.created) if sub is not None else None
            if s is None:
                return None
            if p == 0:  # moved or resumed without telling what it was handed: from what is held here
                held = [r.tnum for r in rt.owed.values() if r.tnum is not None and r.owed.get(sid) is S_QUEUED]
                if not held:
                    return None
                p = max(min(held), s + 1)
            else:
                p = max(s + 1, rt.thanded + 1)
        seq = ts.seq
        records = self.records
        while True:
            key = seq.get(p)
            if key is None:
                break
            if key[0] == "~":  # a subscription's start
                p += 1
                continue
            r = records.get(key)
            if r is not None:
                st = r.owed.get(sid)
                if st is S_QUEUED:
                    break
                if st is not None:
                    p += 1
                    continue
            elif key in self.recent_final:
                p += 1
                continue
            # owed to it and not here (yet): its copy is on the way, or it was resolved for it
            # elsewhere (it moved); its FINAL tells
            if self._await(key):
                p += 1
                continue
            break
        rt.tnext = p
        return p

    def _fifo_ready(self, rec: Record, sid: str) -> bool:
        """May `sid` be handed `rec` now? Only once each predecessor is resolved for it here: sent
        or resolved (it was, in turn, sent only after its own predecessors), or final (its
        subscriptions all had it). A predecessor queued here, or held here without a part for
        `sid` (its copy for `sid` may still come, e.g. re-routed after `sid` moved here), or not
        known here at all (we ask the mesh whether it is final), holds `rec` back."""
        for p in rec.preds:
            r = self.records.get(p)
            if r is None:
                if p in self.recent_final or self._await(p):
                    continue
                self.stats_fifo_held += 1
                return False
            st = r.owed.get(sid)
            if st is S_QUEUED and r.deps and rec.gid in r.preds:
                # two messages each said to depend on the other (causal dependencies a foreign client's
                # resend picked up at another router): waiting would be forever; this one goes first
                self.stats_causal_cycles += 1
                continue
            if st is S_QUEUED or st is None:
                self.stats_fifo_held += 1
                return False
        return True

    def _await(self, gid: str) -> bool:
        """A predecessor unknown here: ask the mesh whether it is final (a FINAL answer makes it
        known). Returns True when there is nobody to wait for: its publisher is attached here and
        settled it (nobody else may remember it: causal seed 194), a standalone router (it would be
        here), or nobody answered for longer than we remember finals."""
        if self._settled_by_local_publisher(gid):
            return True
        now = self._now
        times = self.awaited.get(gid)
        if times is None:
            times = self.awaited[gid] = [now, -math.inf]
        if self.mesh_size < 2 or now - times[0] > self.cfg.final_memory:
            return True
        if now - times[1] >= 4 * self.cfg.stale_wait:
            times[1] = now
            for r in sorted(self.reachable):
                if r != self.router_id:
                    self.out.append(SendQuery(r, gid))
        return False

    def _withhold(self, rec: Record, rt: SubRuntime) -> bool:
        """A record of ours whose publisher left (it may have resent it elsewhere, where it may be
        final by now). A subscription that has been elsewhere since the record was made may have got
        it there: it waits for a driving origin to list it for it, its publisher's return, or FINAL.
        One that never left gets it after we asked the mesh once."""
        if rec.created < rt.arrived_at and self.mesh_size > 1:
            # only a listing made since it arrived here counts
            return not (rec.listed and rec.listed.get(rt.sid, -1.0) >= rt.arrived_at)
        return self._must_ask(rec)

    def _must_ask(self, rec: Record) -> bool:
        """Its publisher left us (it may have resent it elsewhere, where it may be final by now):
        before handing it over, ask the mesh once and give the answer `stale_wait` to come."""
        if self.mesh_size < 2:
            return False  # a standalone router: nobody else can have it
        now = self._now
        if now - rec.asked_at > 4 * self.cfg.stale_wait:
            rec.asked_at = now
            for r in sorted(self.reachable):
                if r != self.router_id:
                    self.out.append(SendQuery(r, rec.gid))
            return True
        return now - rec.asked_at < self.cfg.stale_wait

    def queued(self, sid: str) -> int:
        rt = self.subs.get(sid)
        return len(rt.queue) + len(rt.notify) if rt is not None else 0

    def subscriber_outcome(self, sid: str, gid: str, outcome: Outcome, settled: bool,
                           error: tuple[str, str] | None, undeliverable: bool, now: float) -> None:
        """A subscriber's disposition for the delivery of `gid` on its current link."""
        self._now = now
        rt = self.subs.get(sid)
        if rt is None:
            return
        rec = rt.owed.get(gid)
        if settled or outcome in (O_RELEASED, O_MODIFIED):
            rt.on_link.discard(gid)  # the adapter settled the delivery: it is no longer on the link
        if rec is None:
            return  # already resolved (e.g. presented on resume, or a duplicate disposition)
        if outcome is O_ACCEPTED:
            self._resolve(rec, sid, S_ACCEPTED, None, now, None)
        elif outcome is O_REJECTED:
            self._resolve(rec, sid, S_REJECTED, error, now, None)
        elif outcome is O_MODIFIED and undeliverable:
            self._resolve(rec, sid, S_REJECTED, (errors.UNDELIVERABLE, "subscriber: undeliverable here"),
                          now, None)
        else:
            reds = rec.redeliveries
            if reds is None:
                reds = rec.redeliveries = {}
            n = reds.get(sid, 0) + 1
            reds[sid] = n
            self.log.append(("released" if outcome is O_RELEASED else "modified", gid, rec.topic,
                             sid, {"count": n}))
            if n > self.cfg.max_redeliveries:
                self._resolve(rec, sid, S_REJECTED, (
                    errors.DELIVERY_LIMIT,
                    f"released or modified {n - 1} times (limit {self.cfg.max_redeliveries})"), now, None)
            else:
                rec.owed[sid] = S_QUEUED
                if rt.link is not None:
                    rt.queue.appendleft(gid)
                    self._pump(rt)

    def _resolve(self, rec: Record, sid: str, st: S, error: tuple[str, str] | None, now: float,
                 why: str | None) -> None:
        cur = rec.owed.get(sid)
        if cur is None or cur in RESOLVED:
            return
        rec.owed[sid] = st
        rt = self.subs.get(sid)
        if rt is not None:
            rt.owed.pop(rec.gid, None)
            if rt.resend:
                rt.resend.discard(rec.gid)
        else:
            pend = self.remote_pending.get(sid)
            if pend is not None:
                pend.pop(rec.gid, None)
                if not pend:
                    del self.remote_pending[sid]
        if st is S_REJECTED:
            if rec.rejected_by is None:
                rec.rejected_by = []
            rec.rejected_by.append((sid, error))
        if st is S_ENDED:
            self.log.append(("ended", rec.gid, rec.topic, sid, why))
        else:
            self.log.append((_EVENT_OF[st], rec.gid, rec.topic, sid, why or (list(error) if error else None)))
        if rt is not None and rec.origins:
            for origin in rec.origins:  # tell every origin that sent us a copy
                self.out.append(SendAck(origin, rec.gid, sid, int(st), error))
        rec.pending -= 1
        if rec.pending == 0:
            if rec.origin is not None or rec.outcome is None:
                self._decide(rec, now)
            elif rec.payload:  # decided already (another origin's copy added this one): done again
                self.inflight_bytes -= len(rec.payload)
                rec.payload = b""

    # ================================================================ mesh: destination side
    def receive_copy(self, origin: str, origin_inc: str, gid: str, topic: str, sids: Iterable[str],
                     payload: bytes, now: float, preds: tuple[str, ...] = (),
                     deps: tuple[tuple[str, str], ...] = ()) -> None:
        """A copy from `origin` for the listed subscriptions (those homed here deliver it)."""
        self._now = now
        rec = self.records.get(gid)
        table = self.table
        if rec is None and gid in self.recent_final:
            # final already (its publisher settled it through another origin): a late copy
            self.out.append(SendFinal(origin, gid))
            return
        if rec is None and gid not in self.placeholders and not any(self._local(table.get(s)) for s in sids):
            return  # none of them is here (any more): their origin re-routes them by its own table
        if rec is None:
            rec = Record(gid, topic, payload, now)
            rec.origin = origin
            rec.origins = {origin: origin_inc}
            asked = self.held_for.pop(gid, None)
            if asked:
                rec.holders = set(asked)
            self.records[gid] = rec
            self.inflight_bytes += len(payload)
            self.log.append(("forward_received", gid, topic, None, {"peer": origin, "size": len(payload)}))
        else:  # a destination record, or ours when the publisher failed over to `origin`
            if rec.origins is None:
                rec.origins = {}
            rec.origins[origin] = origin_inc
        if preds:  # every origin's predecessors count (each saw its own part of the publisher's order)
            rec.preds = preds if not rec.preds else tuple(dict.fromkeys(rec.preds + preds))
        if deps:
            self._add_deps(rec, deps)
        self._absorb_placeholders(rec)
        ts = self.total.get(topic) if self.total else None
        if ts is not None and rec.tnum is None:
            rec.tnum = ts.num.get(gid)
        new_pending = False
        for sid in sids:
            sub = table.get(sid)
            if not self._local(sub):
                continue  # it moved away: the origin re-routes it by its own table
            assert sub is not None
            if ts is not None and rec.tnum is not None and rec.owed.get(sid) is None \
                    and not ts.owed(rec.tnum, sid, sub.created):
                # started after it in the order: not owed (its origin decides alike)
                self.out.append(SendAck(origin, gid, sid, int(S_ENDED), None))
                continue
            if rec.origin is None:  # ours too: `origin` (driving it) confirms it is owed here
                if rec.listed is None:
                    rec.listed = {}
                rec.listed[sid] = now
                new_pending = True
            cur = rec.owed.get(sid)
            if cur is None:
                rec.owed[sid] = S_QUEUED
                rec.pending += 1
                rt = self.subs[sid]
                rt.owed[gid] = rec
                new_pending = True
                if rt.link is not None:
                    rt.queue.append(gid)
                self.out.append(SendAck(origin, gid, sid, HELD, None))  # here: no need to re-send it
            elif cur in RESOLVED:
                self.out.append(SendAck(origin, gid, sid, int(cur), None))  # acknowledge again
            else:
                self.out.append(SendAck(origin, gid, sid, HELD, None))
        if new_pending:
            if not rec.payload:
                rec.payload = payload
                self.inflight_bytes += len(payload)
            for sid in sids:
                local = self.subs.get(sid)
                if local is not None and local.link is not None and local.credit > 0:
                    self._pump(local)
        elif rec.origin is not None and rec.pending == 0 and rec.payload:
            self._decide(rec, now)

    def _absorb_placeholders(self, rec: Record) -> None:
        """Subscriptions here whose clients presented this gid hold it: it counts as accepted by them
        (never handed again), and the record's FINAL will reach them."""
        held = self.placeholders.pop(rec.gid, None)
        if not held:
            return
        for sid in held:
            if self._local(self.table.get(sid)) and rec.owed.get(sid) not in RESOLVED:
                if rec.owed.get(sid) in (S_QUEUED, S_SENT):
                    self._resolve(rec, sid, S_ACCEPTED, None, rec.created, "placeholder")
                else:
                    rec.owed[sid] = S_ACCEPTED
                    self.log.append(("accepted", rec.gid, rec.topic, sid, "placeholder"))

    def handle_final(self, gid: str, now: float) -> bool:
        """`gid` is final: its publisher settled it (here or through another origin). Returns False
        when that cannot be true and is ignored: its publisher's delivery of it is open on a link
        here, waiting for the outcome we have not given (a publisher settles only after an outcome,
        and one that moved away would have left this link). Delivery carries on; a stale FINAL can
        cost at most a query later, a wrong one would be a false ACCEPTED."""
        rec = self.records.get(gid)
        if rec is None:
            if gid in self.placeholders:
                self._placeholder_final(gid)
            if self.awaited.pop(gid, None) is not None:
                self.recent_final[gid] = now  # a predecessor something waits for here
            return True
        if rec.pubs and rec.outcome is None and not rec.pub_settled:
            self.stats_final_ignored += 1
            return False
        if rec.origin is None and rec.outcome is None:
            # we are an origin too, still waiting, but its publisher settled it through another
            # origin: it is final everywhere. Stop: withdraw what is pending here.
            self.undecided -= 1
            rec.outcome = O_ACCEPTED
            self.log.append(("ended", gid, rec.topic, None, "final elsewhere"))
        rec.pub_settled = True
        self._finalize(rec, now)
        return True

    def handle_probe(self, gid: str, frm: str, now: float) -> None:
        """A destination asks whether `gid` is still in flight here (its origin). It asks only when
        it resolved every subscription of it long ago: if we still wait for one that `frm` told us
        it holds, its resolution was lost on the way (a connection reset between other routers
        loses acks without changing who is reachable). Send the copy again: it answers with what
        it knows."""
        rec = self.records.get(gid)
        if rec is None:
            self.out.append(SendFinal(frm, gid))
            return
        if rec.origin is not None or rec.outcome is not None or not rec.held or rec.fwd is None:
            return
        fwd = rec.fwd
        lost = [sid for sid in rec.held if fwd.get(sid) == frm]
        if lost and self._driving(rec):
            self._now = now
            rec.held.difference_update(lost)
            for sid in lost:
                del fwd[sid]
            self._route(rec, force=False)

    def handle_query(self, gid: str, frm: str, now: float) -> None:
        """Router `frm` holds a record of `gid` that lost its publisher and its origin: answer with
        what we know for sure (only positive knowledge: silence means we know nothing)."""
        rec = self.records.get(gid)
        if rec is not None:
            if rec.origin is None:  # an origin working on it: the asker gets its FINAL
                if rec.holders is None:
                    rec.holders = set()
                rec.holders.add(frm)
            return
        if gid in self.recent_final:
            self.out.append(SendFinal(frm, gid))
            return
        pl = self._declaring(plid_of(gid))
        if pl is None:
            return
        if declared_settled(pl.declared, pl.mark, gid):  # type: ignore[arg-type]
            self.out.append(SendFinal(frm, gid))  # its publisher is attached here and settled it
        elif gid in pl.declared:  # type: ignore[operator]
            self.held_for.setdefault(gid, {}).setdefault(frm, now)  # resent here: the asker gets our FINAL
        # else: published after that attach, elsewhere (this link is stale): we know nothing

    def _declaring(self, plid: str) -> PubLink | None:
        """The newest attach of publisher link `plid` here, if it declared what it holds in doubt
        (None: not attached here, or not one of our clients)."""
        pl = self.newest_link.get(plid)
        return pl if pl is not None and pl.declared is not None else None

    def _settled_by_local_publisher(self, gid: str) -> bool:
        """Its publisher is attached here and declared it no longer in doubt: it settled it."""
        pl = self._declaring(plid_of(gid))
        return pl is not None and declared_settled(pl.declared, pl.mark, gid)  # type: ignore[arg-type]

    # ================================================================ mesh: origin side
    def handle_ack(self, gid: str, sid: str, state: int, error: tuple[str, str] | None, now: float) -> None:
        rec = self.records.get(gid)
        if rec is None or rec.origin is not None:
            return
        if sid in self.subs:
            return  # homed here now: its local state is authoritative
        if state == HELD:
            if rec.owed.get(sid) in (S_QUEUED, S_SENT):
                if rec.held is None:
                    rec.held = set()
                rec.held.add(sid)
            return
        self._resolve(rec, sid, S(state), error, now, "remote")

    def _route(self, rec: Record, force: bool, unconfirmed_only: bool = False) -> None:
        """Send copies for the remote subscriptions still pending, to their current home routers
        (those reachable): only where they have not been sent yet, or all again when `force`
        (`unconfirmed_only`: those whose home has not confirmed holding the copy)."""
        me = self.router_id
        table = self.table
        reach = self.reachable
        dests: dict[str, list[str]] = {}
        fwd = rec.fwd
        for sid, st in rec.owed.items():
            if st is not S_QUEUED and st is not S_SENT:
                continue
            sub = table.get(sid)
            if sub is None or not sub.live or sub.home == me:
                continue
            home = sub.home
            if home not in reach:
                continue  # held here until its home router is reachable (or it moves)
            if not force and fwd is not None and fwd.get(sid) == home:
                continue
            if unconfirmed_only and rec.held is not None and sid in rec.held and fwd is not None \
                    and fwd.get(sid) == home:
                continue
            dests.setdefault(home, []).append(sid)
        if not dests:
            return
        if rec.held is not None and not unconfirmed_only:
            rec.held.difference_update(s for ss in dests.values() for s in ss)
        if rec.fwd is None:
            rec.fwd = {}
        if rec.holders is None:
            rec.holders = set()
        for home, sids in dests.items():
            for sid in sids:
                rec.fwd[sid] = home
            rec.holders.add(home)
        rec.sent_at = self._now
        self.out.append(Forward(rec.gid, rec.topic, rec.payload, {h: tuple(s) for h, s in dests.items()}, rec.preds,
                                rec.deps))
        self.log.append(("forwarded", rec.gid, rec.topic, None, {"peer": ",".join(sorted(dests))}))

    def set_reachable(self, reachable: dict[str, str], now: float) -> None:
        """The live graph changed: `reachable` maps every router we can reach to its incarnation.
        Pending copies are sent again (some may have been lost with a link or a router)."""
        self._now = now
        if reachable == self.reachable:
            return
        self.reachable = dict(reachable)
        self.reroute(force=True)

    def reroute(self, force: bool = False, sids: Iterable[str] | None = None) -> None:
        """Send pending copies again (a fault or a move). Only records whose publisher is still with
        us: when it left, responsibility is back with it (it resends, here or at another router,
        which then drives delivery) and a stale origin must not resurrect a message that may have
        become final elsewhere meanwhile."""
        if sids is None:
            for rec in list(self.records.values()):
                if rec.origin is None and rec.pending and rec.outcome is None and self._driving(rec):
                    self._route(rec, force)
            return
        seen: set[str] = set()
        for sid in sids:
            for rec in list(self.remote_pending.get(sid, {}).values()):
                if rec.gid not in seen and self._driving(rec):
                    seen.add(rec.gid)
                    self._route(rec, force)

    @staticmethod
    def _driving(rec: Record) -> bool:
        return bool(rec.pubs) or rec.pub_settled

    def subscription_changed(self, old: Subscription, now: float) -> None:
        """Another router's announcement changed the table entry of `old.sid` (now in the table)."""
        self._now = now
        sid = old.sid
        new = self.table.get(sid)
        assert new is not None
        me = self.router_id
        was_here = old.live and old.home == me
        if not new.live:
            if was_here:
                rt = self.subs.get(sid)
                if rt is not None and rt.link is not None:
                    self.out.append(DetachLink(sid, rt.link, errors.LinkStolen.condition,
                                               "the subscription was ended elsewhere"))
                    self._unbind(rt)
            self._ended(sid, now, new.end_reason or "ended")
            return
        if was_here and new.home != me:
            self._moved_away(sid, new, now)
        elif not was_here and new.home == me:
            self._moved_here(sid)
        elif new.home != me and (old.home != new.home or not old.live or old.epoch != new.epoch):
            # it (re)attached: its home may have dropped what it held for it, send it again
            self._forget_routing(sid)
            self.reroute(force=False, sids=[sid])

    def presented_elsewhere(self, sid: str, gids: Iterable[str], home: str, now: float) -> None:
        """Subscription `sid` (re)attached at router `home` presenting ids its client holds: as their
        origin we count them accepted, and the FINAL must reach `home`."""
        for gid in gids:
            rec = self.records.get(gid)
            if rec is not None and rec.origin is None:
                if rec.holders is None:
                    rec.holders = set()
                rec.holders.add(home)
                st = rec.owed.get(sid)
                if st is S_QUEUED or st is S_SENT:
                    self._resolve(rec, sid, S_ACCEPTED, None, now, "presented")
                elif st is None:
                    rec.owed[sid] = S_ACCEPTED
            elif rec is None and gid in self.recent_final:
                self.out.append(SendFinal(home, gid))

    def _moved_here(self, sid: str) -> None:
        """A subscription is homed here now: what origin records owed it remotely becomes local."""
        rt = self.subs.get(sid)
        if rt is None:
            rt = self.subs[sid] = SubRuntime(sid)
        rt.arrived_at = self._now
        for gid, rec in sorted(self.remote_pending.pop(sid, {}).items(), key=lambda kv: kv[1].created):
            rt.owed[gid] = rec
            if rec.owed.get(sid) is S_SENT:
                rec.owed[sid] = S_QUEUED
            if rt.link is not None:
                rt.queue.append(gid)

    def _moved_away(self, sid: str, new: Subscription, now: float) -> None:
        """A subscription homed here resumed at another router."""
        rt = self.subs.pop(sid, None)
        for gid, phs in list(self.placeholders.items()):  # its new home keeps its own placeholders
            if phs.pop(sid, None) is not None and not phs:
                del self.placeholders[gid]
        if rt is None:
            return
        if rt.link is not None:
            self.out.append(DetachLink(sid, rt.link, errors.LinkStolen.condition,
                                       f"the subscription resumed at router {new.home}"))
            self._unbind(rt)
        for gid, rec in list(rt.owed.items()):
            if rec.origin is None:  # ours: it is remote now, send it to the new home
                if rec.owed.get(sid) is S_SENT:
                    rec.owed[sid] = S_QUEUED
                self.remote_pending.setdefault(sid, {})[gid] = rec
            else:  # a destination copy: drop our part; its origin re-routes it
                del rec.owed[sid]
                rec.pending -= 1
                if rec.pending == 0:
                    self._decide(rec, now)
        self._forget_routing(sid)
        self.reroute(force=False, sids=[sid])

    def _forget_routing(self, sid: str) -> None:
        """Where copies for `sid` went no longer counts (it moved, or re-attached and its home may
        have dropped them): the next routing sends them to its home again."""
        for rec in self.remote_pending.get(sid, {}).values():
            if rec.fwd is not None:
                rec.fwd.pop(sid, None)
            if rec.held is not None:
                rec.held.discard(sid)

    # ================================================================ publisher resume
    def _publisher_declared(self, plid: str, in_doubt: set[str], mark: int | None, now: float) -> None:
        """One of our publishers re-attached and listed what it still holds in doubt: everything
        else of that link that we hold and it had published by then is settled on its side (it will
        never be resent)."""
        for rec in [r for r in self.records.values()
                    if r.plid == plid and r.origin is None and declared_settled(in_doubt, mark, r.gid)]:
            if not rec.pubs:  # it settled it (here, the settlement lost with its link, or elsewhere)
                self.handle_final(rec.gid, now)
        for gid in [g for g in self.placeholders if plid_of(g) == plid and declared_settled(in_doubt, mark, g)]:
            if gid not in self.records:
                self._placeholder_final(gid)

    def publisher_declared_elsewhere(self, plid: str, in_doubt: set[str], at: str, now: float,
                                     mark: int | None = None) -> None:
        """Publisher link `plid` attached at router `at`, holding `in_doubt` in doubt. Records of it we
        hold without its publisher: not in doubt any more means settled on its side (final); still in
        doubt means `at` becomes an origin for it: we ask to be told its FINAL. Messages it published
        after that attach (at or past `mark`) are in neither set: the declaration says nothing of them."""
        for rec in [r for r in self.records.values() if r.plid == plid and not r.pubs]:
            if rec.gid in in_doubt:
                self.out.append(SendHold(at, rec.gid))
            elif declared_settled(in_doubt, mark, rec.gid) and rec.origin is None:
                # our publishers settle only once they have an outcome: it is final (here, or at
                # the router that gave the outcome): stop whatever is still pending here
                self.handle_final(rec.gid, now)
        for gid in [g for g in self.placeholders if plid_of(g) == plid and declared_settled(in_doubt, mark, g)]:
            if gid not in self.records:
                self._placeholder_final(gid)

    def handle_hold(self, gid: str, frm: str, now: float) -> None:
        """Router `frm` holds a record of `gid` (an earlier origin of it): include it in the FINAL.
        The resend that makes us an origin may not be here yet: then remember the request."""
        rec = self.records.get(gid)
        if rec is not None:
            if rec.holders is None:
                rec.holders = set()
            rec.holders.add(frm)
        elif gid in self.recent_final:
            self.out.append(SendFinal(frm, gid))
        else:
            self.held_for.setdefault(gid, {})[frm] = now

    def _placeholder_final(self, gid: str) -> None:
        for sid in self.placeholders.pop(gid, {}):
            rt = self.subs.get(sid)
            if rt is None:
                sub = self.table.get(sid)
                if sub is not None and sub.live and sub.home != self.router_id:
                    self.out.append(SendFinal(sub.home, gid))  # it moved on: the FINAL follows it
                continue
            if rt.link is not None and rt.capable:
                rt.notify.append(gid)
                self._pump(rt)
            else:
                rt.final_unnotified.add(gid)
            self.log.append(("placeholder_final", gid, None, sid, None))

    # ================================================================ credit
    def _grant(self, pl: PubLink) -> None:
        want = self.cfg.link_credit - pl.outstanding
        if want <= 0 or pl.token not in self.pub_links:
            return
        room = self.cfg.max_inflight_messages - self.undecided - self.reserved_credit
        if len(self.records) >= self.cfg.max_decided_records + self.cfg.max_inflight_messages:
            room = 0
        if not self.ready or self.inflight_bytes >= self.cfg.max_inflight_bytes:
            room = 0
        n = min(want, room)
        if n > 0:
            pl.outstanding += n
            self.reserved_credit += n
            self.out.append(GrantCredit(pl.token, n))
        if n < want and not pl.blocked:
            pl.blocked = True
            self._blocked.append(pl)

    def _unblock(self) -> None:
        """Room was freed: top up links that were short of credit, oldest first."""
        if not self._blocked:
            return
        blocked, self._blocked = self._blocked, deque()
        for pl in blocked:
            pl.blocked = False
            if pl.token in self.pub_links:
                self._grant(pl)

    def set_ready(self, ready: bool) -> None:
        self.ready = ready
        if ready:
            self._unblock()

    # ================================================================ time
    def tick(self, now: float, may_expire: bool = True) -> None:
        """Expire suspended subscriptions homed here (only when `may_expire`: in a mesh, while the
        whole mesh is reachable), give up on vanished publishers and origins, probe for lost FINALs."""
        self._now = now
        if may_expire:
            for sub in self.table.expired(now, home=self.router_id):
                self._end(sub.sid, now, "expired")
        # decided records whose publisher (or origin) vanished without settling: after the horizon
        # (or, oldest first, when there are too many) we stop waiting for a resend that will not come
        orphaned = now - self.cfg.orphan_horizon
        excess = len(self.records) - self.undecided - self.cfg.max_decided_records
        reach = self.reachable
        orphans = sorted((r for r in self.records.values()
                          if r.pending == 0 and not r.pubs and (r.outcome is not None or r.origin is not None) and
                          (r.origin is None or not any(reach.get(o) == i for o, i in (r.origins or {}).items()))),
                         key=lambda r: r.decided)
        for rec in orphans:
            if rec.decided >= orphaned and excess <= 0:
                break
            excess -= 1
            rec.pub_settled = True
            self.log.append(("orphan_final", rec.gid, rec.topic, None, None))
            self._finalize(rec, now)
        # records done long ago that wait for a FINAL: ask their origin (if it is still the same
        # incarnation) whether the FINAL was lost, or, when no origin of theirs is left and no
        # publisher holds them, ask everybody
        probe_before = now - self.cfg.probe_after
        reach = self.reachable
        final_now: list[str] = []
        for rec in self.records.values():
            if rec.pubs or rec.probed >= probe_before:
                continue
            if rec.origin is None:
                # an origin whose publisher left: it resends elsewhere, or settled, or is gone
                if rec.pub_settled or rec.created >= probe_before or len(reach) < 2:
                    continue
                live: list[tuple[str, str]] = []
            else:
                if rec.pending or rec.decided >= probe_before:
                    continue
                live = [(o, i) for o, i in (rec.origins or {}).items() if reach.get(o) == i and o != self.router_id]
            rec.probed = now
            if self._settled_by_local_publisher(rec.gid):
                final_now.append(rec.gid)
            elif live:
                for origin, inc in live:
                    self.out.append(SendProbe(origin, rec.gid, inc))
            else:
                for r in sorted(reach):
                    if r != self.router_id:
                        self.out.append(SendQuery(r, rec.gid))
        for gid in final_now:
            self.handle_final(gid, now)
        forget = now - self.cfg.final_memory
        for gid in [g for g, rs in self.held_for.items() if max(rs.values()) < forget]:
            del self.held_for[gid]
        for gid in [g for g, (first, _) in self.awaited.items()
                    if g in self.records or g in self.recent_final or first < forget]:
            del self.awaited[gid]
        while self.recent_final:
            gid, t = next(iter(self.recent_final.items()))
            if t >= forget and len(self.recent_final) <= 1_000_000:
                break
            del self.recent_final[gid]
        for rt in self.subs.values():  # deliveries parked while we asked about them
            if rt.link is not None and rt.credit > 0 and (rt.queue or (self.total and self._total_topic(rt.sid))):
                self._pump(rt)
        # copies whose destination never confirmed them (lost with a connection that broke without
        # changing who is reachable): send them again
        retry_before = now - self.cfg.copy_retry
        for rec in list(self.records.values()):
            if rec.origin is None and rec.outcome is None and rec.fwd and rec.sent_at < retry_before \
                    and self._driving(rec):
                self._route(rec, force=True, unconfirmed_only=True)
        # placeholders nobody resolved: ask the mesh (an origin may have finalised it while it
        # could not reach the routers the subscription presented it at)
        known = [g for g in self.placeholders
                 if g not in self.records and (g in self.recent_final or self._settled_by_local_publisher(g))]
        for gid in known:
            self._placeholder_final(gid)
        if len(reach) > 1:
            for gid, phs in self.placeholders.items():
                if min(phs.values()) < probe_before and self._ph_queried.get(gid, 0.0) < probe_before:
                    self._ph_queried[gid] = now
                    for r in sorted(reach):
                        if r != self.router_id:
                            self.out.append(SendQuery(r, gid))
            for gid in [g for g in self._ph_queried if g not in self.placeholders]:
                del self._ph_queried[gid]
        horizon = now - self.cfg.placeholder_horizon
        for gid in [g for g, phs in self.placeholders.items() if min(phs.values()) < horizon]:
            if gid not in self.records:
                self._placeholder_final(gid)
            else:
                self.placeholders.pop(gid, None)

    # ================================================================ introspection
    def stats(self) -> dict[str, int]:
        live = list(self.table.live())
        return {
            "records": len(self.records), "undecided": self.undecided, "inflight_bytes": self.inflight_bytes,
            "destination_records": sum(1 for r in self.records.values() if r.origin is not None),
            "reserved_credit": self.reserved_credit, "subscriptions": len(live),
            "local_subscriptions": sum(1 for s in live if s.home == self.router_id),
            "active_subscriptions": sum(1 for s in live if s.state is SUB_ACTIVE),
            "placeholders": len(self.placeholders), "publisher_links": len(self.pub_links),
            "fifo_holds": self.stats_fifo_held, "fifo_awaited": len(self.awaited),
            "causal_deps": self.stats_causal_deps, "causal_clients": len(self.pasts),
            "causal_cycles": self.stats_causal_cycles,
            "finals_ignored": self.stats_final_ignored,
            "total_holds": self.stats_total_held, "total_late": self.stats_total_late,
        }
