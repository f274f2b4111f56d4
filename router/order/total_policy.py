"""Total order: one order of a topic's messages for all its subscribers (a policy of router/order/policy.py).

Theory of operation
-------------------
The mesh layer numbers a total-order topic's messages and its subscriptions' starts 1, 2, 3, ...
(by the sequencer, router/order/sequencer.py, or by Lamport clocks, router/order/lamport.py: the
topology chooses; the core sees no difference) and tells every router the numbers in order
(`ordered`); what one router learned is its `total.TotalStream` (`DeliveryCore.total`, per topic).
A message is owed to exactly the subscription lives started before it (`owed`): every router
decides that alike, from the numbers alone.

Each subscription walks the numbers (`next`: the lowest number not yet handed to it nor resolved
for it, kept in `SubRuntime.tnext`); it is handed only that one (`may_hand` skips the others: they
are handed by the walk when their turn comes, `after_queue`). A record whose publisher left waits
for the mesh's answer, and nothing numbered after it goes first (BLOCK); the walk asks about the
next ones in the same case at once (`ask_ahead`). Numbers no router needs any more are compacted
(`floor`, `compact`, `restore`: the mesh layer drives them through `DeliveryCore.total_floor`,
`total_compact`, `total_restore`).

Published in topology as `order = "total"`; `CoreConfig.total_topics`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..actions import SubmitOrder
from ..state import S_ENDED, S_QUEUED
from .policy import BLOCK, SKIP, OrderPolicy, Verdict
from .total import Checkpoint, parse_start

if TYPE_CHECKING:
    from ..state import Record, SubRuntime
    from .policy import OrderHost

ASK_AHEAD = 512  # numbers past the one the walk waits at whose questions go out with it


class TotalOrder(OrderPolicy):
    name = "total"
    walks = True

    __slots__ = ("held", "late")

    def __init__(self, core: OrderHost) -> None:
        super().__init__(core)
        self.held = 0  # times a delivery waited for an earlier number of its topic
        self.late = 0  # handed after a later number (it came only after that was handed)

    def may_hand(self, rt: SubRuntime, rec: Record, redelivery: bool) -> Verdict | None:
        if not self.ready(rec, rt, redelivery):
            return SKIP  # not its turn: handed by number when it is (`after_queue`), not kept in the queue
        core = self.core
        if rec.origin is None and not rec.pubs and not rec.pub_settled and core.handing.withhold(rec, rt):
            # nothing numbered after it goes first (sent again in number order)
            if rec.tnum is not None:
                sub = core.table.get(rt.sid)
                assert sub is not None  # (its policy was chosen by it)
                self.ask_ahead(rt, sub.topic, rec.tnum)
            return BLOCK
        return None

    def after_queue(self, rt: SubRuntime) -> None:
        """Hand the next numbers by looking them up (what waits is not rescanned)."""
        core = self.core
        sub = core.table.get(rt.sid)
        assert sub is not None  # (its policy was chosen by it)
        topic = sub.topic
        seq_of = core.total[topic].seq
        sid = rt.sid
        while rt.credit > 0:
            nxt = self.next(rt, topic)
            if nxt is None:
                break
            rec = rt.owed.get(seq_of.get(nxt, ""))
            if rec is None or rec.owed.get(sid) is not S_QUEUED:
                break
            if rec.origin is None and not rec.pubs and not rec.pub_settled and core.handing.withhold(rec, rt):
                rt.queue.append(rec.gid)  # asked about; tick() pumps again
                self.ask_ahead(rt, topic, nxt)
                break
            core._send(rt, rec, bool(rec.redeliveries and sid in rec.redeliveries))

    def ask_ahead(self, rt: SubRuntime, topic: str, n: int) -> None:
        """The walk waits at number `n` for the mesh's answer about a message whose publisher left
        us: ask now about the next ones in the same case too, so that their answers come meanwhile
        (one at a time, a backlog of them took `stale_wait` each; regression test:
        test_core_total.py::test_a_backlog_whose_publisher_left_is_asked_about_at_once_not_one_by_one)."""
        core = self.core
        seq_of = core.total[topic].seq
        sid = rt.sid
        for k in range(n + 1, n + 1 + ASK_AHEAD):
            g = seq_of.get(k)
            if g is None:
                break
            r = rt.owed.get(g)
            if r is not None and r.owed.get(sid) is S_QUEUED and r.origin is None and not r.pubs \
                    and not r.pub_settled:
                core.handing.withhold(r, rt)

    def ready(self, rec: Record, rt: SubRuntime, redelivery: bool) -> bool:
        """May `rt` be handed `rec` (a total-order topic) now? Only the next number of the topic owed
        to it; one it was handed before (sent again) or one that came only after a later one was
        handed (it is owed: it is handed, and counted as late) goes at once."""
        core = self.core
        n = rec.tnum
        if n is None:
            self.held += 1
            return False
        nxt = self.next(rt, rec.topic)
        if nxt is None or n > nxt:
            self.held += 1
            return False
        if n < nxt and not redelivery and not (rt.resend and rec.gid in rt.resend):
            self.late += 1
            core.log.append(("total_late", rec.gid, rec.topic, rt.sid, {"number": n, "next": nxt}))
        return True

    def next(self, rt: SubRuntime, topic: str) -> int | None:
        """The lowest number of `topic` not yet handed to `rt` (nor resolved for it) that it may be
        owed: it waits for that message's copy, or for its FINAL (then it was resolved for `rt`
        elsewhere, or not owed to it). None: its start is not numbered yet."""
        core = self.core
        ts = core.total[topic]
        sid = rt.sid
        if rt.thanded_ids:  # what its client says it was handed: go on after the highest of them
            hi = rt.thanded
            for g in rt.thanded_ids:
                n = ts.num.get(g)
                if n is None:
                    below = ts.below_base(g)
                    if below is None:  # a link first numbered after the checkpoint, or one it dropped:
                        # learned soon if it is the first (this router is catching up), else compacted
                        below = core._now - rt.thanded_at > 4 * core.cfg.stale_wait
                    if not below:
                        return None  # not learned yet (this router restarted and is catching up)
                    n = ts.base  # compacted: everything up to `base` was resolved for every subscription
                hi = max(hi, n)
            rt.thanded = hi
            rt.thanded_ids = ()
            if rt.tnext is not None and 0 < rt.tnext <= rt.thanded:
                rt.tnext = rt.thanded + 1
        p = rt.tnext
        if p is None or p == 0:
            sub = core.table.get(sid)
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
        if p <= ts.base:
            p = ts.base + 1  # compacted: every message up to `base` is resolved for every subscription
        seq = ts.seq
        records = core.records
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
            elif key in core.recent_final or key in core.old_finals:
                p += 1
                continue
            # owed to it and not here (yet): its copy is on the way, or it was resolved for it
            # elsewhere (it moved); its FINAL tells
            if core.handing.await_pred(key):
                p += 1
                continue
            break
        rt.tnext = p
        return p

    def owed(self, rec: Record, now: float) -> None:
        """`rec` has its number: it is owed to exactly the subscriptions (lives) started before it in
        the order. An origin adds the parts its table did not have when the message came; origin and
        destination end the parts of subscriptions started after it (both decide alike)."""
        core = self.core
        ts = core.total[rec.topic]
        n = rec.tnum
        assert n is not None
        me = core.router_id
        gid = rec.gid
        if rec.origin is None:
            remote = False
            for sub in core.table.live_for_topic(rec.topic):
                if sub.sid not in rec.owed and ts.owed(n, sub.sid, sub.created):
                    core._owe(rec, sub.sid, sub.home)  # (pumped by `ordered`)
                    remote = remote or sub.home != me
            table = core.table
            for (sid, _life), s in ts.start.items():
                if s < n and sid not in rec.owed and table.get(sid) is None:
                    # started before it, but its entry has not reached our table yet (gossip and
                    # numbering race after a partition heals): owed; routed once the entry comes
                    core._owe(rec, sid, None)
            if remote and rec.payload and core.meshside.driving(rec):
                # (an origin whose publisher left does not resurrect it: its publisher resent it
                # elsewhere, where it may be final by now; see `reroute`)
                core.meshside.route(rec, force=False)
        for sid, st in list(rec.owed.items()):
            if st is not S_QUEUED:
                continue
            entry = core.table.get(sid)
            if entry is None or not entry.live or (rec.origin is not None and entry.home != me):
                continue
            if not ts.owed(n, sid, entry.created):
                core._resolve(rec, sid, S_ENDED, None, now, "total: subscribed after it in the order")
        if rec.origin is None and rec.outcome is None and rec.pending == 0 and gid in core.records:
            core._decide(rec, now)

    def number(self, rec: Record, now: float) -> None:
        """A record of ours (origin) in a total-order topic: apply its number, or ask for one."""
        core = self.core
        if rec.tnum is None:
            rec.tnum = core.total[rec.topic].num.get(rec.gid)
        if rec.tnum is None:
            core.out.append(SubmitOrder(rec.topic, rec.gid))  # a resend keeps its number
        else:
            self.owed(rec, now)

    def ordered(self, topic: str, n: int, key: str, now: float, pump: bool = True) -> None:
        """The sequencer's number `n` of `topic` is `key` (a gid or a subscription's start). Numbers
        come in order, 1, 2, 3, ... (again from 1 after this router restarts: known ones are ignored).
        `pump=False`: more numbers follow at once; the last of them pumps the subscriptions (a
        restarted router learns thousands in one go: pumping after each was quadratic)."""
        core = self.core
        core._now = now
        ts = core.total.get(topic)
        if ts is None or not ts.learn(n, key):
            return
        if parse_start(key) is None:
            rec = core.records.get(key)
            if rec is not None and rec.tnum is None:
                rec.tnum = n
                self.owed(rec, now)
        if pump:
            core.pump_topic(topic)

    def floor(self, topic: str, now: float) -> int:
        """The highest number of `topic` this router will not need again, so far: the numbers of
        messages it holds that are not resolved (or were decided less than `total_pin` ago: their
        publisher may resend them through another router, which must find their number), and the
        walk of every subscription homed here, are above it. The mesh layer tells the other routers;
        numbers up to the lowest floor of all are compacted (`total_compact`)."""
        core = self.core
        core._now = now
        ts = core.total[topic]
        f = ts.top
        pinned = now - core.cfg.total_pin
        for rec in core.records.values():
            n = rec.tnum
            if n is not None and n <= f and rec.topic == topic and (rec.pending or rec.decided >= pinned):
                f = n - 1
        me = core.router_id
        for sub in core.table.live_for_topic(topic):
            if sub.home == me and (rt := core.subs.get(sub.sid)) is not None:
                # (the walk goes past what is resolved or not owed, with or without credit; it stops
                # at a message owed here and not handed yet. None: where it starts is not known yet,
                # and will be above what it needs: after its start, or what its client presents)
                p = self.next(rt, topic)
                if p is not None and p <= f:
                    f = p - 1
        return max(f, ts.base)

    def compact(self, topic: str, upto: int) -> Checkpoint:
        """Forget the numbers of `topic` up to `upto` (every router's `total_floor` reached it): what
        stays is the checkpoint a restarted router is sent instead of them."""
        core = self.core
        table = core.table

        def live(sid: str, life: str) -> bool:
            sub = table.get(sid)
            return sub is None or (sub.live and repr(sub.created) == life)  # (not in our table yet: keep)

        return core.total[topic].compact(upto, live)

    def restore(self, topic: str, cp: Checkpoint, now: float) -> None:
        """This router restarted (or fell behind what the others compacted): it goes on from `cp`.
        Every message numbered up to it was resolved for every subscription, so walks go on after
        it; a message held here with a number below it that is still queued is handed (late)."""
        core = self.core
        core._now = now
        ts = core.total.get(topic)
        if ts is None or not ts.restore(cp):
            return
        for sub in core.table.live_for_topic(topic):
            rt = core.subs.get(sub.sid)
            if rt is not None and rt.tnext is not None and 0 < rt.tnext <= ts.base:
                rt.tnext = ts.base + 1
