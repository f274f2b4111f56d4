"""What may be handed to a subscription now, as far as it is no topic's order: the chain of each
publisher link's messages (`Record.preds`, which the orders read), the records whose publisher left
(asked about before they are handed), predecessors not known here (asked about), and the doors the
mesh layer uses to the total order (`ordered`, `total_floor`, `total_compact`, `total_restore`).

Which record may go when, by the order of its topic, is the topic's policy (router/order/policy.py:
fifo.py, causal_policy.py, total_policy.py), which the pump asks. Part of the delivery core
(`router.core.DeliveryCore` composes it); sans-IO like the rest."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .actions import SendQuery
from .order.total import Checkpoint
from .state import Record, SubRuntime

if TYPE_CHECKING:
    from .core import DeliveryCore


class Handing:
    """Part of `DeliveryCore` (its methods run on the core's state: `self` is the core)."""

    def ordered(self: DeliveryCore, topic: str, n: int, key: str, now: float, pump: bool = True) -> None:
        """The mesh layer's number `n` of `topic` is `key` (total order: `TotalOrder.ordered`)."""
        self.total_order.ordered(topic, n, key, now, pump)

    def total_floor(self: DeliveryCore, topic: str, now: float) -> int:
        """The highest number of `topic` this router will not need again, so far (`TotalOrder.floor`)."""
        return self.total_order.floor(topic, now)

    def total_compact(self: DeliveryCore, topic: str, upto: int) -> Checkpoint:
        """Forget the numbers of `topic` up to `upto` (`TotalOrder.compact`)."""
        return self.total_order.compact(topic, upto)

    def total_restore(self: DeliveryCore, topic: str, cp: Checkpoint, now: float) -> None:
        """Go on from checkpoint `cp` (`TotalOrder.restore`)."""
        self.total_order.restore(topic, cp, now)

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

    def pump_topic(self: DeliveryCore, topic: str) -> None:
        """Hand what is ready to every subscription of `topic` homed here."""
        me = self.router_id
        for sub in self.table.live_for_topic(topic):
            if sub.home == me:
                rt = self.subs.get(sub.sid)
                if rt is not None and rt.link is not None and rt.credit > 0:
                    self._pump(rt)

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
