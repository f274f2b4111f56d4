"""Subscription gossip: every router holds the whole subscription table.

Theory of operation
-------------------
A router announces every change of a subscription homed at it (SubUpdate, the table entry). Others
merge it into their table by (epoch, home, state) and acknowledge it. Announcements are reliable on
their own: each one is retransmitted (when the live graph changes, and every `retry` seconds) to
the routers that have not acknowledged it yet, because a frame can be lost with a connection that
broke without changing who is reachable. A newer announcement of the same subscription replaces an
older one still in flight.

What waits for acknowledgements is the subscriber's ATTACH (`blocking`):
- a *new* subscription (a new life) waits for every router of the topology: then no router can
  receive a message after the ATTACH is answered without owing it to the subscription ("in force").
  A router that is unreachable gets the announcement when it comes back;
- a *resume* waits for the routers reachable when it was announced (minus those that become
  unreachable meanwhile): the old home, if reachable, may refuse it (`ok=False`) because it ended
  that life; the resume then becomes a new life.

Any router refuses an announcement of a life that another identity's life beats
(router/subscriptions.py, `ForeignClaim`): the refusal's reason says so, and that attach is refused,
never made a new life.
Other announcements (suspend, end) wait for nobody; a router that was unreachable learns them from
the table sync when it comes back.

Two routers that become reachable to each other exchange their whole tables (TableSync, asking for
the other's in return); a router counts as synced with another once it merged that router's table
in its current incarnation, and retries until it is.

Pure: messages out are appended to `self.out`; the mesh layer routes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..router.subscriptions import ForeignClaim, LifeEnded, Subscription, SubscriptionTable
from .messages import Routed, SubAck, SubUpdate, TableSync


@dataclass
class PendingAttach:
    req: int
    sid: str
    new_life: bool
    waiting: set[str]
    blocking: bool = True
    refused: str | None = None
    sent_to: set[str] = field(default_factory=set)
    presented: tuple[str, ...] = ()


class Gossip:
    def __init__(self, me: str, inc: str, table: SubscriptionTable, routers: set[str]) -> None:
        self.me = me
        self.inc = inc
        self.table = table
        self.routers = set(routers)  # every router of the topology
        self.reachable: dict[str, str] = {me: inc}
        self.synced: dict[str, str] = {}  # router -> incarnation whose table we merged
        self.sent_sync: dict[str, str] = {}  # router -> incarnation we sent our table to
        self.pending: dict[int, PendingAttach] = {}
        self.out: list[Routed] = []
        self._req = 0

    def _others(self) -> list[str]:
        return sorted(r for r in self.reachable if r != self.me)

    # ------------------------------------------------------------------ our announcements
    def announce(self, sid: str, wait: bool, new_life: bool, presented: tuple[str, ...] = ()) -> int | None:
        """Tell every router about subscription `sid` (reliably). With `wait` (an ATTACH), returns a
        request id that `completed()` reports once the acknowledgements it needs are in."""
        sub = self.table.get(sid)
        if sub is None:
            return None
        self.cancel(sid)  # a newer announcement replaces one still in flight
        self._req += 1
        req = self._req
        waiting = self.routers - {self.me} if wait and new_life else set(self.reachable) - {self.me}
        p = PendingAttach(req, sid, new_life, waiting, blocking=wait, presented=presented)
        self.pending[req] = p
        entry = sub.to_json()
        for r in self._others():
            self.out.append(SubUpdate(self.me, r, entry, req, presented))
            p.sent_to.add(r)
        return req if wait else None

    def handle_ack(self, msg: SubAck) -> None:
        p = self.pending.get(msg.req)
        if p is None or p.sid != msg.sid:
            return
        if not msg.ok and p.refused is None:
            p.refused = msg.reason or f"refused by {msg.src}"
        p.waiting.discard(msg.src)

    def completed(self) -> list[PendingAttach]:
        """Attaches whose acknowledgements are complete (or refused): removed and returned.
        Non-blocking announcements that everyone acknowledged are simply dropped."""
        done = [p for p in self.pending.values() if not p.waiting or p.refused is not None]
        for p in done:
            del self.pending[p.req]
        return [p for p in done if p.blocking]

    def cancel(self, sid: str) -> None:
        for req in [r for r, p in self.pending.items() if p.sid == sid]:
            del self.pending[req]

    def resend(self) -> None:
        """Retransmit every announcement to the reachable routers that have not acknowledged it."""
        for p in self.pending.values():
            sub = self.table.get(p.sid)
            if sub is None:
                continue
            entry = sub.to_json()
            for r in sorted(p.waiting):
                if r in self.reachable:
                    self.out.append(SubUpdate(self.me, r, entry, p.req, p.presented))
                    p.sent_to.add(r)

    # ------------------------------------------------------------------ others' announcements
    def handle_update(self, msg: SubUpdate) -> Subscription | None:
        """Merge an announcement; returns the previous entry when the table changed."""
        try:
            old = self.table.merge(Subscription.from_json(msg.entry))
            ok, reason = True, None
        except (LifeEnded, ForeignClaim) as exc:
            old, ok, reason = None, False, str(exc)
        if msg.req is not None:
            self.out.append(SubAck(self.me, msg.src, str(msg.entry["sid"]), msg.req, ok, reason))
        return old

    def sync_message(self, to: str, inc: str | None = None, reply: bool = True) -> TableSync:
        """Our whole table for router `to` (incarnation `inc`, when known)."""
        if inc is not None:
            self.sent_sync[to] = inc
        return TableSync(self.me, to, self.inc, [s.to_json() for s in self.table], reply)

    def handle_sync(self, msg: TableSync) -> list[Subscription]:
        """Merge another router's whole table; returns the previous entries that changed."""
        changed = []
        for e in msg.entries:
            try:
                old = self.table.merge(Subscription.from_json(e))
            except (LifeEnded, ForeignClaim):
                continue  # we know that life ended, or another holds it: they will learn it from our table
            if old is not None:
                changed.append(old)
        self.synced[msg.src] = msg.inc
        if msg.reply or self.sent_sync.get(msg.src) != msg.inc:  # it restarted, or asked: answer
            self.out.append(self.sync_message(msg.src, msg.inc, reply=False))
        return changed

    def resync(self) -> None:
        """Ask every reachable router we have not synced with (in its incarnation) for its table."""
        for r, inc in self.reachable.items():
            if r != self.me and self.synced.get(r) != inc:
                self.out.append(self.sync_message(r, inc, reply=True))

    # ------------------------------------------------------------------ membership
    def reachable_changed(self, reachable: dict[str, str]) -> list[str]:
        """The live graph changed. Returns the routers that are newly reachable (or restarted): the
        mesh layer sends them our table. Announcements in flight are sent again, and stop waiting
        (unless an ATTACH of a new life needs them) for routers that became unreachable."""
        fresh = [r for r, inc in reachable.items() if r != self.me and self.reachable.get(r) != inc]
        self.reachable = dict(reachable)
        for p in self.pending.values():
            if not (p.new_life and p.blocking):
                p.waiting &= set(reachable)
        self.resend()
        return fresh

    def unacknowledged(self) -> int:
        """Our announcements that a reachable router has not acknowledged yet (a draining router
        waits for none to be left: its subscriptions' state is then known mesh-wide)."""
        reach = set(self.reachable)
        return sum(1 for p in self.pending.values() if p.waiting & reach)

    def all_reachable(self) -> bool:
        return self.routers <= set(self.reachable)

    def synced_with_reachable(self) -> bool:
        return all(self.synced.get(r) == inc for r, inc in self.reachable.items() if r != self.me)
