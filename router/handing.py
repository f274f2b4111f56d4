"""What may be handed to a subscription now, as far as it is no topic's order: the chain of each
publisher link's messages (`Record.preds`, which the orders read), the records whose publisher left
(asked about before they are handed), and predecessors not known here (asked about).

Which record may go when, by the order of its topic, is the topic's policy (router/order/policy.py:
fifo.py, causal_policy.py, total_policy.py), which the pump asks; the policies ask this part
(`withhold`, `await_pred`).

A part of the delivery core (`router.core.DeliveryCore` makes one, `core.handing`). It owns what
only it writes: the chain of each publisher link (`chain`, `arrivals`) and the predecessors it
waits for (`awaited`). What it needs of the core it asks through `HandingHost`, the narrow view of
the core it is given (never the core's module). Sans-IO like the rest."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

from .coreview import CoreView

if TYPE_CHECKING:

    from .state import Record, SubRuntime


class HandingHost(CoreView, Protocol):
    """What the handing rules ask of the delivery core."""

    @property
    def mesh_size(self) -> int: ...
    @property
    def _now(self) -> float: ...

    def is_final(self, gid: str) -> bool: ...
    def _settled_by_local_publisher(self, gid: str) -> bool: ...
    def _ask_everybody(self, gid: str) -> None: ...


def chain_key(rec: Record) -> str:
    """The chain a record is in: its publisher link's and its topic's. A link attached to a topic has
    one chain; an anonymous relay link (router/core.py, `publish`) one per topic it sends to, so that
    a subscription waits only for earlier messages it may be owed (never, say, for a message of
    another topic that a suspended subscription holds back). (A plid has a fixed length: the
    concatenation is unambiguous.)"""
    return rec.plid + rec.topic


class Handing:
    """The handing rules that are no topic's order (see the module's docstring)."""

    __slots__ = ("core", "chain", "arrivals", "awaited")

    def __init__(self, core: HandingHost) -> None:
        self.core = core
        # FIFO: per publisher link and topic (`chain_key`), our records of it not final yet, in publish
        # order: gid -> seq
        self.chain: dict[str, dict[str, int]] = {}
        self.arrivals = 0  # the order of messages without counter tags (any AMQP client)
        self.awaited: dict[str, list[float]] = {}  # predecessors unknown here -> [first wanted, last asked]

    def chain_record(self, rec: Record) -> None:
        """A record of ours (we are its origin): its predecessor is the latest earlier message of
        its publisher link (on its topic: `chain_key`) that is not final here. Our publishers send in publish order and resend
        what is in doubt first, so every earlier message still in doubt came here before it; the
        order is their tags' counter (`Record.seq`). Any other client's is the order its messages
        come here (AMQP keeps a link's transfers in order), whatever its tags say."""
        seq = rec.seq
        if seq is None:
            self.arrivals += 1
            seq = -(1 << 62) + self.arrivals  # any AMQP client: arrival order
        chains = self.chain
        key = rec.plid + rec.topic  # (`chain_key`, inlined: once per message)
        chain = chains.get(key)
        if chain is None:
            chains[key] = {rec.gid: seq}
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
                chains[key] = dict(sorted(chain.items(), key=lambda kv: kv[1]))
        if pred is not None:
            preds = rec.preds
            if not preds:
                rec.preds = (pred,)
            elif pred not in preds:
                rec.preds = (*preds, pred)

    def cover_preds(self, rec: Record) -> None:
        """Subscriptions with selectors: a predecessor that is not owed to every subscription `rec`
        is owed to does not order `rec` for the others (it may become final, or never be known where
        they are, while an earlier message owed to them is still on its way): `rec` also waits for
        that predecessor's own predecessors, transitively, down to ones owed to each of them (records
        final here are left out: every part of them was resolved). Without selectors a later message
        of a chain is owed to no subscription its predecessor was not (FIFO subscriptions in force
        only grow along a chain), and this is never needed."""
        preds = rec.preds
        if not preds:
            return
        owed = rec.owed.keys()
        records = self.core.records
        out = list(preds)
        seen = set(preds)
        stack = list(preds)
        while stack:
            p = records.get(stack.pop())
            if p is None or p.owed.keys() >= owed:
                continue
            for q in p.preds:
                if q not in seen:
                    seen.add(q)
                    out.append(q)
                    stack.append(q)
        if len(out) > len(preds):
            rec.preds = tuple(out)

    def unchain(self, rec: Record) -> None:
        """`rec` is final: it leaves its publisher link's chain."""
        key = chain_key(rec)
        chain = self.chain.get(key)
        if chain is not None and chain.pop(rec.gid, None) is not None and not chain:
            del self.chain[key]

    def await_pred(self, gid: str) -> bool:
        """A predecessor unknown here: ask the mesh whether it is final (a FINAL answer makes it
        known). Returns True when there is nobody to wait for: its publisher is attached here and
        settled it (nobody else may remember it; test_sim.py::test_causal_order_regressions), a
        standalone router (it would be here), or nobody answered for longer than we remember finals."""
        core = self.core
        if core._settled_by_local_publisher(gid):
            return True
        now = core._now
        times = self.awaited.get(gid)
        if times is None:
            times = self.awaited[gid] = [now, -math.inf]
        if core.mesh_size < 2 or now - times[0] > core.cfg.final_memory:
            return True
        if now - times[1] >= 4 * core.cfg.stale_wait:
            times[1] = now
            core._ask_everybody(gid)
        return False

    def awaited_final(self, gid: str) -> bool:
        """`gid` became known final: True when something here waited for it (it is no longer)."""
        return self.awaited.pop(gid, None) is not None

    def forget_awaited(self, forget: float) -> None:
        """Stop waiting for predecessors known here by now, or first wanted before `forget`."""
        core = self.core
        records = core.records
        for gid in [g for g, (first, _) in self.awaited.items()
                    if g in records or core.is_final(g) or first < forget]:
            del self.awaited[gid]

    def withhold(self, rec: Record, rt: SubRuntime) -> bool:
        """A record of ours whose publisher left (it may have resent it elsewhere, where it may be
        final by now). A subscription that has been elsewhere since the record was made may have got
        it there: it waits for a driving origin to list it for it, its publisher's return, or FINAL.
        One that never left gets it after we asked the mesh once."""
        if rec.created < rt.arrived_at and self.core.mesh_size > 1:
            # only a listing made since it arrived here counts
            return not (rec.listed and rec.listed.get(rt.sid, -1.0) >= rt.arrived_at)
        return self.must_ask(rec)

    def must_ask(self, rec: Record) -> bool:
        """Its publisher left us (it may have resent it elsewhere, where it may be final by now):
        before handing it over, ask the mesh once and give the answer `stale_wait` to come."""
        core = self.core
        if core.mesh_size < 2:
            return False  # a standalone router: nobody else can have it
        now = core._now
        if now - rec.asked_at > 4 * core.cfg.stale_wait:
            rec.asked_at = now
            core._ask_everybody(rec.gid)
            return True
        return now - rec.asked_at < core.cfg.stale_wait
