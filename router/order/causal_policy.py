"""Causal order across a causal group of topics (a policy of router/order/policy.py).

Theory of operation
-------------------
What a client publishes depends on what it was handed and published before, on any topic of the
topic's causal group: its *causal past*, kept per (client, group) by the router that serves it
(`CausalOrder.pasts`: per publisher link the latest message of the link in it, noted by `note`).
A message published into a causal topic carries its past as dependencies (`Record.deps`, from
`deps`; copies carry them too). Those of its own topic are held back exactly as FIFO predecessors
(`add_deps` adds them to `Record.preds`), so the FIFO rules apply (this policy extends
`fifo.FifoOrder`); those of other topics travel on into the past of each client it is handed to.

One rule more than FIFO: a dependency that a subscription was not handed here (not owed when it
came, or final) must never come after what depends on it (`passed`, when a record is handed): for
our publishers the FIFO high mark says it; other gids are kept in `SubRuntime.cpassed`, and such a
message that comes only later ends for the subscription (a `late` verdict).

Published in topology as `order = "causal"` (with an optional group); `CoreConfig.causal_groups`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...common.ids import counter_seq, plid_of
from ..state import S_QUEUED
from .fifo import FifoOrder
from .policy import PARK, Verdict, late

if TYPE_CHECKING:
    from ..state import PubLink, Record, SubRuntime
    from .policy import OrderHost

CAUSAL_LATE = late(1, "causal: a message depending on it was handed first")


class CausalOrder(FifoOrder):
    name = "causal"
    watches = True

    __slots__ = ("pasts", "deps_given")

    def __init__(self, core: OrderHost) -> None:
        super().__init__(core)
        # per (client, causal group), the client's causal past as this router knows it: publisher
        # link -> (seq or -1, gid, topic, when noted) of the latest message of that link in it
        self.pasts: dict[tuple[str, str], dict[str, tuple[int, str, str, float]]] = {}
        self.deps_given = 0  # dependencies attached to messages published here

    def may_hand(self, rt: SubRuntime, rec: Record, redelivery: bool) -> Verdict | None:
        if (rec.origin is None and not rec.pubs and not rec.pub_settled and self.core.handing.withhold(rec, rt)) \
                or (rec.preds and not self.ready(rec, rt.sid)):
            return PARK
        cpassed = rt.cpassed
        if cpassed and rec.gid in cpassed and not redelivery:
            # a message that depends on it was handed first (it was not owed to this subscription
            # then): handing it now would break causal order
            cpassed.discard(rec.gid)
            return CAUSAL_LATE
        return self.in_order(rt, rec, redelivery)

    def handed(self, rt: SubRuntime, rec: Record) -> None:
        if rec.deps:
            self.passed(rt, rec)
        group = self.core.causal.get(rec.topic) if rt.client else None
        if group is not None:
            self.note(rt.client, group, rec.gid, rec.topic, rec.deps)

    def passed(self, rt: SubRuntime, rec: Record) -> None:
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
        records = self.core.records
        for g, t in rec.deps:
            if t != rec.topic:
                continue
            r = records.get(g)
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

    def note(self, client: str, group: str, gid: str, topic: str, deps: tuple[tuple[str, str], ...]) -> None:
        """`gid` (and what it depended on) is now in the causal past of `client` for `group`: it was
        handed to it here, or it published it. Per publisher link the latest is kept (a link's
        messages are handed in its order, so depending on the latest covers the earlier ones)."""
        core = self.core
        past = self.pasts.get((client, group))
        if past is None:
            past = self.pasts[(client, group)] = {}
        now = core._now
        records = core.records
        for g, t in ((gid, topic), *deps):
            p = plid_of(g)
            rec = records.get(g)
            r = rec.seq if rec is not None else counter_seq(g)  # (not ours: no order by tag, `Record.seq`)
            rank = -1 if r is None else r
            cur = past.get(p)
            if cur is None or rank >= cur[0] or rank < 0:  # (a tag without a counter: the newest seen)
                past[p] = (rank, g, t, now)

    def deps(self, pl: PubLink, group: str) -> tuple[tuple[str, str], ...]:
        """The dependencies of a message its client publishes now on `pl`: its causal past, but its
        own link (FIFO covers it). A final message stays a dependency: its publisher may still resend
        it for a subscription that came in force since (re-originated, it is owed there); entries
        noted longer ago than we remember finals leave the past (as `_await` gives up on them)."""
        core = self.core
        past = self.pasts.get((pl.client, group)) if pl.client else None
        if not past:
            return ()
        horizon = core._now - core.cfg.final_memory
        out = []
        for p, (_r, g, t, noted) in list(past.items()):
            if noted < horizon:
                del past[p]
            elif p != pl.plid:
                out.append((g, t))
        self.deps_given += len(out)
        return tuple(out)

    @staticmethod
    def add_deps(rec: Record, deps: tuple[tuple[str, str], ...]) -> None:
        """Causal dependencies of `rec` (from its origin, or from a copy): it is held back behind
        those of its own topic exactly as behind a FIFO predecessor; all of them are passed on to
        the causal past of every client it is handed to."""
        rec.deps = deps if not rec.deps else tuple(dict.fromkeys(rec.deps + deps))
        same = tuple(g for g, t in deps if t == rec.topic and g != rec.gid and g not in rec.preds)
        if same:
            rec.preds = (*rec.preds, *same)
