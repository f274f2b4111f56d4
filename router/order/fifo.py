"""FIFO per publisher: the default order of a topic (a policy of router/order/policy.py).

Theory of operation
-------------------
Each subscription is handed a publisher link's messages in the order they were published. Two
rules, both per record and subscription:

- *Predecessors* (`Record.preds`, set by the core's chain of each publisher link at the origin and
  carried by copies): a record waits (PARK) until each predecessor is sent or resolved for the
  subscription here, or final; one not known here is asked about (`Handing.await_pred`, router/handing.py).
- *The high mark* (`SubRuntime.fifo_hi`, per publisher link the highest counter sent to the
  subscription here, or handed as its client says): for our clients, whose tags count their
  publish order (`Record.seq`), an earlier message sent for the first time only after a later one
  would break the order: it ends for the subscription (a `late` verdict). Never for another client:
  its tags are no order.

A record whose publisher left the origin waits (PARK) until the mesh was asked about it
(`Handing.withhold`), whatever the order. The state this mode keeps is on the subscription
(`fifo_hi`) and the record (`preds`); the count of holds is the policy's own (`held`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..state import S_QUEUED
from .policy import PARK, OrderPolicy, Verdict, late

if TYPE_CHECKING:
    from ..state import Record, SubRuntime
    from .policy import OrderHost

FIFO_LATE = late(0, "fifo: a later message was handed first")


class FifoOrder(OrderPolicy):
    name = "fifo"

    __slots__ = ("held", "cycles")

    def __init__(self, core: OrderHost) -> None:
        super().__init__(core)
        self.held = 0  # times a delivery was held back behind an earlier message of its publisher
        self.cycles = 0  # two messages found waiting for each other (one went first)

    def may_hand(self, rt: SubRuntime, rec: Record, redelivery: bool) -> Verdict | None:
        if (rec.origin is None and not rec.pubs and not rec.pub_settled and self.core.handing.withhold(rec, rt)) \
                or (rec.preds and not self.ready(rec, rt.sid)):
            return PARK  # kept in order; tick() pumps again
        return self.in_order(rt, rec, redelivery)

    def in_order(self, rt: SubRuntime, rec: Record, redelivery: bool) -> Verdict | None:
        """The high mark's rule (see above); None when it may go, and then the mark follows it."""
        seq = rec.seq  # (None: not ours, ordered by its origin's arrival order alone, `preds`)
        if seq is not None:
            hi = rt.fifo_hi.get(rec.plid, -1)
            if seq < hi and not redelivery and not (rt.resend and rec.gid in rt.resend) and rt.group is None:
                # a later message of its publisher (ours: they declared their order) was handed
                # first: it came here only after that (re-originated with a newer subscription table
                # after its publisher failed over, for a subscription not in force when it was first
                # sent: a message it is owed holds every later one back). Handing it now would break
                # FIFO: it ends for this subscription. (A shared subscription promises no order: what
                # a member gave back goes to another after later ones; router/groups.py)
                return FIFO_LATE
            if seq > hi:
                rt.fifo_hi[rec.plid] = seq
        return None

    def ready(self, rec: Record, sid: str) -> bool:
        """May `sid` be handed `rec` now? Only once each predecessor is resolved for it here: sent
        or resolved (it was, in turn, sent only after its own predecessors), or final (its
        subscriptions all had it). A predecessor queued here, or held here without a part for
        `sid` (its copy for `sid` may still come, e.g. re-routed after `sid` moved here), or not
        known here at all (we ask the mesh whether it is final), holds `rec` back."""
        core = self.core
        for p in rec.preds:
            r = core.records.get(p)
            if r is None:
                if p in core.recent_final or p in core.old_finals or core.handing.await_pred(p):
                    continue
                self.held += 1
                return False
            st = r.owed.get(sid)
            if st is S_QUEUED and r.deps and rec.gid in r.preds:
                # two messages each said to depend on the other (causal dependencies a foreign client's
                # resend picked up at another router): waiting would be forever; this one goes first
                self.cycles += 1
                continue
            if st is S_QUEUED or st is None:
                self.held += 1
                return False
        return True
