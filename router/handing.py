"""What may be handed to a subscription now: the FIFO chain of each publisher, causal dependencies,
the total-order walk, and the records whose publisher left (asked about before they are handed).

Part of the delivery core (`router.core.DeliveryCore` composes it); sans-IO like the rest."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..common.ids import counter_seq, plid_of
from .actions import (
    SendQuery,
    SubmitOrder,
)
from .order.total import Checkpoint, parse_start
from .state import (
    S_ENDED,
    S_QUEUED,
    PubLink,
    Record,
    SubRuntime,
)

if TYPE_CHECKING:
    from .core import DeliveryCore

ASK_AHEAD = 512  # total order: numbers past the one the walk waits at whose questions go out with it


class Handing:
    """Part of `DeliveryCore` (its methods run on the core's state: `self` is the core)."""

    def _ask_ahead(self: DeliveryCore, rt: SubRuntime, topic: str, n: int) -> None:
        """The walk waits at number `n` for the mesh's answer about a message whose publisher left
        us: ask now about the next ones in the same case too, so that their answers come meanwhile
        (one at a time, a backlog of them took `stale_wait` each; regression test:
        test_core_total.py::test_a_backlog_whose_publisher_left_is_asked_about_at_once_not_one_by_one)."""
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

    def _causal_passed(self: DeliveryCore, rt: SubRuntime, rec: Record) -> None:
        """`rec` goes to `rt` now: every dependency of its topic that `rt` was not handed here (its
        record final and gone, or here without a part for it), and every earlier message of that
        dependency's publisher link (a dependency stands for them: its client's past keeps only the
        latest of each link), must never come after it. For our publishers' messages the FIFO high
        mark says it (`fifo_hi`: an earlier message that comes later ends for it); other gids are
        kept (a client not ours has no order by tag: `Record.seq`). A dependency whose record is
        gone here is final here (or nobody answered for it within `final_memory`): it cannot come
        again under its gid meanwhile (copies of a final gid are refused, a resend is answered or
        renamed), so what its tag reads as matters only for ours."""
        sid = rt.sid
        for g, t in rec.deps:
            if t != rec.topic:
                continue
            r = self.records.get(g)
            if r is not None and r.owed.get(sid) is not None and (r.owed[sid] is not S_QUEUED
                                                                  or rec.gid in r.preds):
                continue  # sent or resolved for it here (and its predecessors before it); or a cycle
            seq = r.seq if r is not None else counter_seq(g)
            if seq is not None:
                p = plid_of(g)
                if rt.fifo_hi.get(p, -1) <= seq:
                    rt.fifo_hi[p] = seq + 1  # (above it: it, too, ends if it comes only now)
            else:
                if rt.cpassed is None:
                    rt.cpassed = set()
                rt.cpassed.add(g)

    def _causal_note(self: DeliveryCore, client: str, group: str, gid: str, topic: str,
                     deps: tuple[tuple[str, str], ...]) -> None:
        """`gid` (and what it depended on) is now in the causal past of `client` for `group`: it was
        handed to it here, or it published it. Per publisher link the latest is kept (a link's
        messages are handed in its order, so depending on the latest covers the earlier ones)."""
        past = self.pasts.get((client, group))
        if past is None:
            past = self.pasts[(client, group)] = {}
        now = self._now
        records = self.records
        for g, t in ((gid, topic), *deps):
            p = plid_of(g)
            rec = records.get(g)
            r = rec.seq if rec is not None else counter_seq(g)  # (not ours: no order by tag, `Record.seq`)
            rank = -1 if r is None else r
            cur = past.get(p)
            if cur is None or rank >= cur[0] or rank < 0:  # (a tag without a counter: the newest seen)
                past[p] = (rank, g, t, now)

    def _causal_deps(self: DeliveryCore, pl: PubLink, group: str) -> tuple[tuple[str, str], ...]:
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

    def _add_deps(self: DeliveryCore, rec: Record, deps: tuple[tuple[str, str], ...]) -> None:
        """Causal dependencies of `rec` (from its origin, or from a copy): it is held back behind
        those of its own topic exactly as behind a FIFO predecessor; all of them are passed on to
        the causal past of every client it is handed to."""
        rec.deps = deps if not rec.deps else tuple(dict.fromkeys(rec.deps + deps))
        same = tuple(g for g, t in deps if t == rec.topic and g != rec.gid and g not in rec.preds)
        if same:
            rec.preds = (*rec.preds, *same)

    def _total_topic(self: DeliveryCore, sid: str) -> str | None:
        """The topic of subscription `sid` if it is in total order."""
        sub = self.table.get(sid)
        return sub.topic if sub is not None and sub.topic in self.total else None

    def _chain(self: DeliveryCore, rec: Record) -> None:
        """A record of ours (we are its origin): its predecessor is the latest earlier message of
        its publisher link that is not final here. Our publishers send in publish order and resend
        what is in doubt first, so every earlier message still in doubt came here before it; the
        order is their tags' counter (`Record.seq`). Any other client's is the order its messages
        come here (AMQP keeps a link's transfers in order), whatever its tags say."""
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

    def ordered(self: DeliveryCore, topic: str, n: int, key: str, now: float, pump: bool = True) -> None:
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

    def total_floor(self: DeliveryCore, topic: str, now: float) -> int:
        """The highest number of `topic` this router will not need again, so far: the numbers of
        messages it holds that are not resolved (or were decided less than `total_pin` ago: their
        publisher may resend them through another router, which must find their number), and the
        walk of every subscription homed here, are above it. The mesh layer tells the other routers;
        numbers up to the lowest floor of all are compacted (`total_compact`)."""
        self._now = now
        ts = self.total[topic]
        f = ts.top
        pinned = now - self.cfg.total_pin
        for rec in self.records.values():
            n = rec.tnum
            if n is not None and n <= f and rec.topic == topic and (rec.pending or rec.decided >= pinned):
                f = n - 1
        me = self.router_id
        for sub in self.table.live_for_topic(topic):
            if sub.home == me and (rt := self.subs.get(sub.sid)) is not None:
                # (the walk goes past what is resolved or not owed, with or without credit; it stops
                # at a message owed here and not handed yet. None: where it starts is not known yet,
                # and will be above what it needs: after its start, or what its client presents)
                p = self._total_next(rt, topic)
                if p is not None and p <= f:
                    f = p - 1
        return max(f, ts.base)

    def total_compact(self: DeliveryCore, topic: str, upto: int) -> Checkpoint:
        """Forget the numbers of `topic` up to `upto` (every router's `total_floor` reached it): what
        stays is the checkpoint a restarted router is sent instead of them."""
        table = self.table

        def live(sid: str, life: str) -> bool:
            sub = table.get(sid)
            return sub is None or (sub.live and repr(sub.created) == life)  # (not in our table yet: keep)

        return self.total[topic].compact(upto, live)

    def total_restore(self: DeliveryCore, topic: str, cp: Checkpoint, now: float) -> None:
        """This router restarted (or fell behind what the others compacted): it goes on from `cp`.
        Every message numbered up to it was resolved for every subscription, so walks go on after
        it; a message held here with a number below it that is still queued is handed (late)."""
        self._now = now
        ts = self.total.get(topic)
        if ts is None or not ts.restore(cp):
            return
        for sub in self.table.live_for_topic(topic):
            rt = self.subs.get(sub.sid)
            if rt is not None and rt.tnext is not None and 0 < rt.tnext <= ts.base:
                rt.tnext = ts.base + 1

    def pump_topic(self: DeliveryCore, topic: str) -> None:
        """Hand what is ready to every subscription of `topic` homed here."""
        me = self.router_id
        for sub in self.table.live_for_topic(topic):
            if sub.home == me:
                rt = self.subs.get(sub.sid)
                if rt is not None and rt.link is not None and rt.credit > 0:
                    self._pump(rt)

    def _number(self: DeliveryCore, rec: Record, now: float) -> None:
        """A record of ours (origin) in a total-order topic: apply its number, or ask for one."""
        if rec.tnum is None:
            rec.tnum = self.total[rec.topic].num.get(rec.gid)
        if rec.tnum is None:
            self.out.append(SubmitOrder(rec.topic, rec.gid))  # a resend keeps its number
        else:
            self._total_owed(rec, now)

    def _total_owed(self: DeliveryCore, rec: Record, now: float) -> None:
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

    def _total_ready(self: DeliveryCore, rec: Record, rt: SubRuntime, redelivery: bool) -> bool:
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

    def _total_next(self: DeliveryCore, rt: SubRuntime, topic: str) -> int | None:
        """The lowest number of `topic` not yet handed to `rt` (nor resolved for it) that it may be
        owed: it waits for that message's copy, or for its FINAL (then it was resolved for `rt`
        elsewhere, or not owed to it). None: its start is not numbered yet."""
        ts = self.total[topic]
        sid = rt.sid
        if rt.thanded_ids:  # what its client says it was handed: go on after the highest of them
            hi = rt.thanded
            for g in rt.thanded_ids:
                n = ts.num.get(g)
                if n is None:
                    below = ts.below_base(g)
                    if below is None:  # a link first numbered after the checkpoint, or one it dropped:
                        # learned soon if it is the first (this router is catching up), else compacted
                        below = self._now - rt.thanded_at > 4 * self.cfg.stale_wait
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
        if p <= ts.base:
            p = ts.base + 1  # compacted: every message up to `base` is resolved for every subscription
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
            elif key in self.recent_final or key in self.old_finals:
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

    def _fifo_ready(self: DeliveryCore, rec: Record, sid: str) -> bool:
        """May `sid` be handed `rec` now? Only once each predecessor is resolved for it here: sent
        or resolved (it was, in turn, sent only after its own predecessors), or final (its
        subscriptions all had it). A predecessor queued here, or held here without a part for
        `sid` (its copy for `sid` may still come, e.g. re-routed after `sid` moved here), or not
        known here at all (we ask the mesh whether it is final), holds `rec` back."""
        for p in rec.preds:
            r = self.records.get(p)
            if r is None:
                if p in self.recent_final or p in self.old_finals or self._await(p):
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

    def _await(self: DeliveryCore, gid: str) -> bool:
        """A predecessor unknown here: ask the mesh whether it is final (a FINAL answer makes it
        known). Returns True when there is nobody to wait for: its publisher is attached here and
        settled it (nobody else may remember it; test_sim.py::test_causal_order_regressions), a
        standalone router (it would be here), or nobody answered for longer than we remember finals."""
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
            self._ask_everybody(gid)
        return False

    def _withhold(self: DeliveryCore, rec: Record, rt: SubRuntime) -> bool:
        """A record of ours whose publisher left (it may have resent it elsewhere, where it may be
        final by now). A subscription that has been elsewhere since the record was made may have got
        it there: it waits for a driving origin to list it for it, its publisher's return, or FINAL.
        One that never left gets it after we asked the mesh once."""
        if rec.created < rt.arrived_at and self.mesh_size > 1:
            # only a listing made since it arrived here counts
            return not (rec.listed and rec.listed.get(rt.sid, -1.0) >= rt.arrived_at)
        return self._must_ask(rec)

    def _must_ask(self: DeliveryCore, rec: Record) -> bool:
        """Its publisher left us (it may have resent it elsewhere, where it may be final by now):
        before handing it over, ask the mesh once and give the answer `stale_wait` to come."""
        if self.mesh_size < 2:
            return False  # a standalone router: nobody else can have it
        now = self._now
        if now - rec.asked_at > 4 * self.cfg.stale_wait:
            rec.asked_at = now
            self._ask_everybody(rec.gid)
            return True
        return now - rec.asked_at < self.cfg.stale_wait

    def _ask_everybody(self: DeliveryCore, gid: str) -> None:
        """Ask every other reachable router whether `gid` is final (a FINAL answers; silence does not)."""
        me = self.router_id
        for r in sorted(self.reachable):
            if r != me:
                self.out.append(SendQuery(r, gid))
