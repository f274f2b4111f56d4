"""The delivery core: delivery records, outcome aggregation, resume, back-pressure. Sans-IO.

Theory of operation
-------------------
Everything that decides what happens to a message lives here; the adapter only translates engine
events into calls and performs the returned actions (appended to `self.out`). Time is a parameter.

A *record* exists per message (global id, `gid`) from its first arrival until it is *final*. When
it is created, the message is owed to every live (active or suspended) subscription of its topic:
`rec.owed[sid]` starts QUEUED. A subscription moves QUEUED -> SENT (handed to its link) -> ACCEPTED
or REJECTED; RELEASED / MODIFIED send it back to QUEUED (redelivered, up to `max_redeliveries`);
ending the subscription turns what it still owed into ENDED. When no subscription is left QUEUED or
SENT the record has its outcome: ACCEPTED when none rejected, otherwise REJECTED naming the
subscriptions that did. Only then is the publisher told (promise 2).

A record is final when it has its outcome *and* the publisher settled (receiver-settle-mode
second: the publisher's settlement means it will never resend). Then every subscriber delivery of
it is settled, and the record is freed. Settling a subscriber delivery is our promise that the gid
will never be handed to that subscription again; our subscriber clients keep each accepted id in
their deduplication store until they see that settlement.

Resends merge by gid: a publisher that lost its link resends in-doubt messages with the same tags
(same gids) and gets the outcome of the existing record. A subscriber that reattaches presents the
ids it accepted but has not seen settled; they are marked ACCEPTED (or kept as *placeholders* when
the message is not here yet, e.g. after a router restart before the publisher resent it), and
everything else still owed to it is redelivered under the same tag. Ids accepted on an earlier link
whose record became final meanwhile are reported with NotifyFinal.

Back-pressure: publishers get credit only while records, plus credit already granted, stay within
the in-flight budget (messages and bytes). Nothing is ever dropped to make room.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from router import errors
from router.actions import (
    Action,
    Deliver,
    GrantCredit,
    NotifyFinal,
    Outcome,
    SendOutcome,
    SettleDelivery,
    SettlePublisher,
)
from router.ids import global_id, plid_of
from router.subscriptions import SubscriptionTable, SubState


class S(IntEnum):
    """State of one message for one subscription."""

    QUEUED = 0
    SENT = 1
    ACCEPTED = 2
    REJECTED = 3
    ENDED = 4


@dataclass(slots=True)
class CoreConfig:
    max_inflight_messages: int = 20_000
    max_inflight_bytes: int = 256 * 1024 * 1024
    link_credit: int = 500  # credit window per publisher link
    max_redeliveries: int = 10  # RELEASED/MODIFIED beyond this turns into a rejection
    placeholder_horizon: float = 3600.0  # seconds an unmatched presented id is kept
    orphan_horizon: float = 3600.0  # seconds a decided record waits for a vanished publisher to settle
    max_decided_records: int = 200_000  # decided records awaiting settlement (small, no payload)
    final_notify_batch: int = 256


class Record:
    __slots__ = ("gid", "topic", "payload", "plid", "pubs", "owed", "pending", "outcome", "error",
                 "pub_settled", "created", "decided", "redeliveries", "rejected_by")

    def __init__(self, gid: str, topic: str, payload: bytes, now: float) -> None:
        self.gid = gid
        self.topic = topic
        self.payload = payload
        self.plid = plid_of(gid)
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


class SubRuntime:
    """Delivery-side state of one live subscription hosted here."""

    __slots__ = ("sid", "link", "credit", "queue", "owed", "on_link", "capable", "final_unnotified",
                 "notify")

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


class PubLink:
    __slots__ = ("token", "plid", "topic", "second", "outstanding", "pubs", "blocked")

    def __init__(self, token: Any, plid: str, topic: str, second: bool) -> None:
        self.token = token
        self.plid = plid
        self.topic = topic
        self.second = second  # receiver-settle-mode second
        self.outstanding = 0  # credit granted and not yet used
        self.pubs: dict[Any, str] = {}  # publisher delivery token -> gid
        self.blocked = False  # waiting in DeliveryCore._blocked for room in the budget


class DeliveryCore:
    def __init__(self, router_id: str, table: SubscriptionTable | None = None,
                 config: CoreConfig | None = None) -> None:
        self.router_id = router_id
        self.table = table if table is not None else SubscriptionTable()  # (an empty table is falsy)
        self.cfg = config if config is not None else CoreConfig()
        self.records: dict[str, Record] = {}
        self.subs: dict[str, SubRuntime] = {}
        self.pub_links: dict[Any, PubLink] = {}
        self.pub_of: dict[Any, tuple[PubLink, str]] = {}  # publisher delivery token -> (link, gid)
        self.placeholders: dict[str, dict[str, float]] = {}  # gid -> {sid: since}
        self.inflight_bytes = 0
        self.undecided = 0  # records still waiting for subscriptions: what the budget counts
        self.reserved_credit = 0
        self.ready = True  # grant publishers credit only when ready (table loaded / synced)
        self._blocked: deque[PubLink] = deque()
        self.out: list[Action] = []
        self.log: list[tuple[Any, ...]] = []  # settlement-log events, drained by the adapter
        for sub in self.table.live():
            self.subs.setdefault(sub.sid, SubRuntime(sub.sid))

    # ================================================================ publishers
    def attach_publisher(self, token: Any, plid: str, topic: str, second: bool,
                         in_doubt: Iterable[bytes] | None, now: float) -> None:
        pl = PubLink(token, plid, topic, second)
        self.pub_links[token] = pl
        if in_doubt is not None:
            self._publisher_declared(plid, {global_id(plid, t) for t in in_doubt}, now)
        self._grant(pl)

    def detach_publisher(self, token: Any) -> None:
        pl = self.pub_links.pop(token, None)
        if pl is None:
            return
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
        pl = self.pub_links[link_token]
        if pl.outstanding <= 0:
            raise errors.TransferLimitExceeded("transfer sent without link credit")
        pl.outstanding -= 1
        self.reserved_credit -= 1
        gid = global_id(pl.plid, tag)
        rec = self.records.get(gid)
        if rec is None:
            rec = self._new_record(gid, pl.topic, payload, now)
        else:
            self.log.append(("received", gid, rec.topic, None, {"size": len(payload), "info": "merged"}))
        rec.pubs.append(pub)
        pl.pubs[pub] = gid
        self.pub_of[pub] = (pl, gid)
        if rec.outcome is not None:
            self._tell_publisher(rec, pub, pl)
            self._maybe_final(rec, now)
        if pl.outstanding <= self.cfg.link_credit // 2:
            self._grant(pl)
        return gid

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
        self._maybe_final(rec, now)

    def _new_record(self, gid: str, topic: str, payload: bytes, now: float) -> Record:
        rec = Record(gid, topic, payload, now)
        self.records[gid] = rec
        self.inflight_bytes += len(payload)
        self.undecided += 1
        held = self.placeholders.pop(gid, None)
        for sub in self.table.live_for_topic(topic):
            sid = sub.sid
            if held is not None and sid in held:
                rec.owed[sid] = S.ACCEPTED
                self.log.append(("accepted", gid, topic, sid, "placeholder"))
                continue
            rec.owed[sid] = S.QUEUED
            rec.pending += 1
            rt = self.subs[sid]
            rt.owed[gid] = rec
            if rt.link is not None:
                rt.queue.append(gid)
        self.log.append(("received", gid, topic, None, {"size": len(payload), "count": len(rec.owed)}))
        if rec.pending == 0:
            self._decide(rec, now)
        else:
            for sid in rec.owed:
                rt = self.subs[sid]
                if rt.link is not None and rt.credit > 0:
                    self._pump(rt)
        return rec

    # ================================================================ outcomes
    def _decide(self, rec: Record, now: float) -> None:
        if rec.rejected_by:
            rec.outcome = Outcome.REJECTED
            names = ", ".join(sid for sid, _ in rec.rejected_by)
            first = rec.rejected_by[0][1]
            # the first subscriber's condition travels on; the description names every rejecter
            detail = f": {first[1]}" if first and first[1] else ""
            rec.error = (first[0] if first else errors.SUBSCRIBER_REJECTED,
                         f"rejected by subscription(s) {names}{detail}")
        else:
            rec.outcome = Outcome.ACCEPTED
        rec.decided = now
        # every subscription is done with it: only its outcome and settlement remain to be told, so
        # the payload is freed now and the record stops counting against the in-flight budget
        self.undecided -= 1
        self.inflight_bytes -= len(rec.payload)
        rec.payload = b""
        self._unblock()
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
        for pub in rec.pubs:  # other legs (a resend on a second link): settle them too
            entry = self.pub_of.pop(pub, None)
            if entry is not None:
                entry[0].pubs.pop(pub, None)
                if rec.outcome is not None:
                    self.out.append(SendOutcome(pub, rec.outcome, rec.error, True))
        for sid, st in rec.owed.items():
            rt = self.subs.get(sid)
            if rt is None:
                continue
            if gid in rt.on_link:
                rt.on_link.discard(gid)
                self.out.append(SettleDelivery(sid, gid))
            elif st is S.ACCEPTED:
                if rt.link is not None and rt.capable:
                    rt.notify.append(gid)
                    self._pump(rt)
                elif rt.capable:
                    rt.final_unnotified.add(gid)
        self.log.append(("settled", gid, rec.topic, None, None))
        self._unblock()

    # ================================================================ subscriptions
    def attach_subscriber(self, link: Any, sid: str, topic: str, container: str, link_name: str,
                          expiry: float, capable: bool, presented: Iterable[str] | None,
                          now: float) -> bool:
        """A subscriber link attached (new or resuming). Returns True when it resumed."""
        old_rt = self.subs.get(sid)
        if old_rt is not None and old_rt.link is not None:
            self._unbind(old_rt)  # the same identity attached again: the new link wins (adapter steals)
        sub, resumed = self.table.attach(sid, topic, container, link_name, expiry, self.router_id, now)
        rt = self.subs.get(sid)
        if rt is None:
            rt = self.subs[sid] = SubRuntime(sid)
        rt.link = link
        rt.capable = capable
        rt.credit = 0
        presented_set = set(presented or ())
        self.log.append(("resumed" if resumed else "subscribed", None, topic, sid, {
            "container": container, "link": link_name,
            "info": f"expiry={'never' if math.isinf(expiry) else expiry} presented={len(presented_set)}"}))
        # The client already holds what it presents, whether this is a resume or a new life of the
        # same identity (a non-durable one that ended): never hand those ids to it again.
        if presented_set:
            for gid in presented_set:
                rec = rt.owed.get(gid)
                if rec is not None:
                    self._resolve(rec, sid, S.ACCEPTED, None, now, "resume")
                elif gid in rt.final_unnotified:
                    rt.notify.append(gid)
                else:
                    rec2 = self.records.get(gid)
                    if rec2 is None:  # not here (yet): a resend may bring it
                        self.placeholders.setdefault(gid, {})[sid] = now
                        self.log.append(("placeholder", gid, topic, sid, None))
                    elif rec2.owed.get(sid) is not S.ACCEPTED:
                        # not owed to this life (or ended in an earlier one), yet the client holds
                        # it: count it as accepted so that the final settlement reaches it
                        rec2.owed[sid] = S.ACCEPTED
                    # else already ACCEPTED here: its settlement comes when the record is final
        rt.final_unnotified.clear()
        rt.queue = deque(rt.owed)
        return resumed

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

    def _unbind(self, rt: SubRuntime) -> None:
        """Forget the current link: what was SENT on it is in doubt and will be redelivered."""
        rt.link = None
        rt.credit = 0
        if rt.notify:  # not told yet: tell it when it resumes and presents them
            rt.final_unnotified.update(rt.notify)
            rt.notify.clear()
        for gid in rt.on_link:
            rec = self.records.get(gid)
            if rec is not None and rec.owed.get(rt.sid) is S.SENT:
                rec.owed[rt.sid] = S.QUEUED
        rt.on_link.clear()
        rt.queue.clear()

    def _end(self, sid: str, now: float, reason: str) -> None:
        sub = self.table.end(sid, now, reason)
        rt = self.subs.pop(sid, None)
        if sub is not None:
            self.log.append(("unsubscribed" if reason == "unsubscribed" else "expired", None, sub.topic,
                             sid, reason))
        for gid, phs in list(self.placeholders.items()):
            if phs.pop(sid, None) is not None and not phs:
                del self.placeholders[gid]
        if rt is None:
            return
        for rec in list(rt.owed.values()):
            self._resolve(rec, sid, S.ENDED, None, now, reason)

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
        while q and rt.credit > 0:
            gid = q.popleft()
            rec = rt.owed.get(gid)
            if rec is None or rec.owed.get(sid) is not S.QUEUED:
                continue
            rec.owed[sid] = S.SENT
            rt.on_link.add(gid)
            rt.credit -= 1
            redelivery = bool(rec.redeliveries and sid in rec.redeliveries)
            out.append(Deliver(sid, gid, rec.payload, redelivery))
            self.log.append(("delivered", gid, rec.topic, sid, "redelivery" if redelivery else None))

    def queued(self, sid: str) -> int:
        rt = self.subs.get(sid)
        return len(rt.queue) + len(rt.notify) if rt is not None else 0

    def subscriber_outcome(self, sid: str, gid: str, outcome: Outcome, settled: bool,
                           error: tuple[str, str] | None, undeliverable: bool, now: float) -> None:
        """A subscriber's disposition for the delivery of `gid` on its current link."""
        rt = self.subs.get(sid)
        if rt is None:
            return
        rec = rt.owed.get(gid)
        if settled or outcome in (Outcome.RELEASED, Outcome.MODIFIED):
            rt.on_link.discard(gid)  # the adapter settled the delivery: it is no longer on the link
        if rec is None:
            return  # already resolved (e.g. presented on resume, or a duplicate disposition)
        if outcome is Outcome.ACCEPTED:
            self._resolve(rec, sid, S.ACCEPTED, None, now, None)
        elif outcome is Outcome.REJECTED:
            self._resolve(rec, sid, S.REJECTED, error, now, None)
        elif outcome is Outcome.MODIFIED and undeliverable:
            self._resolve(rec, sid, S.REJECTED, (errors.UNDELIVERABLE, "subscriber: undeliverable here"),
                          now, None)
        else:
            reds = rec.redeliveries
            if reds is None:
                reds = rec.redeliveries = {}
            n = reds.get(sid, 0) + 1
            reds[sid] = n
            self.log.append(("released" if outcome is Outcome.RELEASED else "modified", gid, rec.topic,
                             sid, {"count": n}))
            if n > self.cfg.max_redeliveries:
                self._resolve(rec, sid, S.REJECTED, (
                    errors.DELIVERY_LIMIT,
                    f"released or modified {n - 1} times (limit {self.cfg.max_redeliveries})"), now, None)
            else:
                rec.owed[sid] = S.QUEUED
                if rt.link is not None:
                    rt.queue.appendleft(gid)
                    self._pump(rt)

    def _resolve(self, rec: Record, sid: str, st: S, error: tuple[str, str] | None, now: float,
                 why: str | None) -> None:
        cur = rec.owed.get(sid)
        if cur is None or cur in (S.ACCEPTED, S.REJECTED, S.ENDED):
            return
        rec.owed[sid] = st
        rt = self.subs.get(sid)
        if rt is not None:
            rt.owed.pop(rec.gid, None)
        if st is S.REJECTED:
            if rec.rejected_by is None:
                rec.rejected_by = []
            rec.rejected_by.append((sid, error))
        if st is S.ENDED:
            self.log.append(("ended", rec.gid, rec.topic, sid, why))
        else:
            self.log.append((st.name.lower(), rec.gid, rec.topic, sid, why or (list(error) if error else None)))
        rec.pending -= 1
        if rec.pending == 0:
            self._decide(rec, now)

    # ================================================================ publisher resume
    def _publisher_declared(self, plid: str, in_doubt: set[str], now: float) -> None:
        """One of our publishers re-attached and listed what it still holds in doubt: everything
        else of that link that we hold is settled on its side (it will never be resent)."""
        for rec in [r for r in self.records.values() if r.plid == plid and r.gid not in in_doubt]:
            if not rec.pubs:
                rec.pub_settled = True
                self._maybe_final(rec, now)
        for gid in [g for g in self.placeholders if plid_of(g) == plid and g not in in_doubt]:
            if gid not in self.records:
                self._placeholder_final(gid)

    def _placeholder_final(self, gid: str) -> None:
        for sid in self.placeholders.pop(gid, {}):
            rt = self.subs.get(sid)
            if rt is None:
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
    def tick(self, now: float) -> None:
        for sub in self.table.expired(now):
            self._end(sub.sid, now, "expired")
        # decided records whose publisher vanished without settling: after the horizon (or, oldest
        # first, when there are too many) we stop waiting for a resend that will not come
        orphaned = now - self.cfg.orphan_horizon
        excess = len(self.records) - self.undecided - self.cfg.max_decided_records
        orphans = sorted((r for r in self.records.values() if r.outcome is not None and not r.pubs),
                         key=lambda r: r.decided)
        for rec in orphans:
            if rec.decided >= orphaned and excess <= 0:
                break
            excess -= 1
            rec.pub_settled = True
            self.log.append(("orphan_final", rec.gid, rec.topic, None, None))
            self._finalize(rec, now)
        horizon = now - self.cfg.placeholder_horizon
        for gid in [g for g, phs in self.placeholders.items() if min(phs.values()) < horizon]:
            if gid not in self.records:
                self._placeholder_final(gid)
            else:
                self.placeholders.pop(gid, None)

    # ================================================================ introspection
    def stats(self) -> dict[str, int]:
        return {
            "records": len(self.records), "undecided": self.undecided, "inflight_bytes": self.inflight_bytes,
            "reserved_credit": self.reserved_credit, "subscriptions": sum(1 for _ in self.table.live()),
            "active_subscriptions": sum(1 for s in self.table.live() if s.state is SubState.ACTIVE),
            "placeholders": len(self.placeholders), "publisher_links": len(self.pub_links),
        }
