"""Ordering as a per-topic policy: what the delivery core's pump asks before it hands a message.

Theory of operation
-------------------
`DeliveryCore._pump` walks a subscription's queue (the records QUEUED for it, in the order to
send) while its link has credit, and asks the policy of the subscription's topic about each record:
`may_hand(rt, rec, redelivery)` answers None (hand it now) or a `Verdict`:

- `PARK`: not now; it keeps its place in the queue and is asked again at the next pump (`tick`);
- `BLOCK`: not now, and nothing queued after it either: it goes back to the head and the walk stops;
- `SKIP`: not now; it leaves the queue (the policy hands it by its own walk when its turn comes);
- a `Late`: never, for this subscription: handing it now would break the order. After the walk it
  ends for the subscription (ENDED, with the verdict's reason), in the order of the verdicts' rank.

Then `handed(rt, rec)` follows each hand-over (for a policy that `watches`), and once the queue
walk is done (unless it was blocked) `after_queue(rt)`, where a policy that hands by its own walk
(`walks`) hands the rest.
The pump has no branch per mode: what differs between modes is in their policy.

The modes (router/order/modes.py registers them; `CoreConfig` chooses one per topic, FIFO the
default): `fifo.FifoOrder`, `causal_policy.CausalOrder`, `total_policy.TotalOrder` (one policy for
both total orders: the mesh layer numbers a topic by the sequencer or by Lamport clocks and tells
the core the numbers alike, `DeliveryCore.ordered`). A policy object belongs to one core, which it sees
through `OrderHost` (below), and reads its records and subscriptions; the state it keeps for its
mode is named in its module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

from ..coreview import CoreView

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..finals import OldFinals
    from ..handing import Handing
    from ..state import Record, S, SubRuntime
    from .total import TotalStream


class CopyRoutes(Protocol):
    """What a policy asks of the core's mesh side (router/meshside.py): does this origin drive a
    record, and send its copies."""

    def driving(self, rec: Record) -> bool: ...
    def route(self, rec: Record, force: bool, unconfirmed_only: bool = False) -> None: ...


class OrderHost(CoreView, Protocol):
    """What the order policies ask of the delivery core (never its module): its records,
    subscriptions and final memory (read), the handing part (`withhold`, `await_pred`), the core's
    own steps a policy that walks runs (`_send`, `_owe`, `_resolve`, `_decide`; copies: `meshside`),
    (the policies keep their own counts; the causal policy its clients' pasts)."""

    _now: float

    @property
    def recent_final(self) -> Mapping[str, float]: ...
    @property
    def old_finals(self) -> OldFinals: ...
    @property
    def total(self) -> Mapping[str, TotalStream]: ...
    @property
    def causal(self) -> Mapping[str, str]: ...
    @property
    def handing(self) -> Handing: ...
    @property
    def meshside(self) -> CopyRoutes: ...

    def pump_topic(self, topic: str) -> None: ...
    def _send(self, rt: SubRuntime, rec: Record, redelivery: bool) -> None: ...
    def _owe(self, rec: Record, sid: str, home: str | None) -> SubRuntime | None: ...
    def _resolve(self, rec: Record, sid: str, st: S, error: tuple[str, str] | None, now: float,
                 why: str | None) -> None: ...
    def _decide(self, rec: Record, now: float) -> None: ...


class Verdict:
    """Why a record is not handed now (see the theory above)."""

    __slots__ = ("name", "rank", "why")

    def __init__(self, name: str, rank: int = 0, why: str = "") -> None:
        self.name = name
        self.rank = rank
        self.why = why

    def __repr__(self) -> str:
        return f"Verdict({self.name})"


PARK = Verdict("park")
BLOCK = Verdict("block")
SKIP = Verdict("skip")


def late(rank: int, why: str) -> Verdict:
    """A verdict that ends the record for the subscription (`why`: the settlement log's reason)."""
    return Verdict("late", rank, why)


class OrderPolicy:
    """The interface the pump asks (see the theory above). One instance per mode and core."""

    name: ClassVar[str] = ""
    # (the pump calls these two only when they are set: a call less per message for FIFO)
    walks: ClassVar[bool] = False  # hands by its own walk after the queue (`after_queue`)
    watches: ClassVar[bool] = False  # wants to hear of every hand-over (`handed`)

    __slots__ = ("core",)

    def __init__(self, core: OrderHost) -> None:
        self.core = core

    def may_hand(self, rt: SubRuntime, rec: Record, redelivery: bool) -> Verdict | None:
        """May `rec` (QUEUED for `rt`) be handed to `rt` now? None: yes."""
        raise NotImplementedError

    def handed(self, rt: SubRuntime, rec: Record) -> None:
        """`rec` was just handed to `rt`."""

    def after_queue(self, rt: SubRuntime) -> None:
        """The queue walk is done (not blocked) and `rt` may have credit left."""
