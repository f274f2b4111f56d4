"""What the delivery core asks its adapter to do, and the outcomes it speaks of.

Actions are imperative, small, and batched: a core call appends them to `DeliveryCore.out` and the
adapter drains the list after each batch of input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, final

from ..common.vocab import Outcome


@final
@dataclass(slots=True)
class Deliver:
    """Send `payload` to subscription `sid` on its current link, tag = gid, unsettled."""

    sid: str
    gid: str
    payload: bytes
    redelivery: bool


@final
@dataclass(slots=True)
class SettleDelivery:
    """The message is final: settle its delivery on the subscription's current link."""

    sid: str
    gid: str


@final
@dataclass(slots=True)
class DrainCredit:
    """The subscription's link asked for a drain and nothing more can be sent now: use up the
    credit left (the client learns the drain is done; AMQP's drain, answered whenever the queue
    empties, not only when the credit came)."""

    sid: str


@final
@dataclass(slots=True)
class NotifyFinal:
    """Tell a subscription (one of our clients) that ids it accepted on an earlier link are final."""

    sid: str
    gids: tuple[str, ...]


@final
@dataclass(slots=True)
class SendOutcome:
    """Tell the publisher delivery `pub` its outcome; `settle` for receiver-settle-mode first."""

    pub: Any
    outcome: Outcome
    error: tuple[str, str] | None
    settle: bool


@final
@dataclass(slots=True)
class SettlePublisher:
    """The publisher settled `pub`: settle our side and forget the delivery."""

    pub: Any


@final
@dataclass(slots=True)
class GrantCredit:
    link: Any
    credit: int


# ---------------------------------------------------------------- mesh: addressed to other routers


@final
@dataclass(slots=True)
class Forward:
    """Send a copy of `gid` toward the routers in `dests`, each to deliver to the listed subscriptions."""

    gid: str
    topic: str
    payload: bytes
    dests: dict[str, tuple[str, ...]]
    preds: tuple[str, ...] = ()  # FIFO: earlier messages of its publisher it must not overtake
    deps: tuple[tuple[str, str], ...] = ()  # causal order: (gid, topic) its publisher depended on
    by_arrival: bool = False  # FIFO: its publisher declared no order: `preds` are its order, not its tag


@final
@dataclass(slots=True)
class SendAck:
    """Tell origin router `to` what subscription `sid` (hosted here) did with `gid`."""

    to: str
    gid: str
    sid: str
    state: int  # core.S value: ACCEPTED, REJECTED or ENDED
    error: tuple[str, str] | None


@final
@dataclass(slots=True)
class SendFinal:
    """Tell router `to` that `gid` is final (its publisher settled it)."""

    to: str
    gid: str


@final
@dataclass(slots=True)
class SendProbe:
    """Ask origin router `to` whether `gid` is still in flight (a FINAL may have been lost).
    `inc` is the incarnation of `to` that forwarded it: another incarnation knows nothing of it."""

    to: str
    gid: str
    inc: str


@final
@dataclass(slots=True)
class SendQuery:
    """Ask router `to` what it knows of `gid` (a record of ours lost its publisher and its origin)."""

    to: str
    gid: str


@final
@dataclass(slots=True)
class DeclarePublisher:
    """One of our publishers attached here and declared what it holds in doubt: tell the mesh, so
    that routers holding its other messages stop waiting for it (or join the new origin's FINAL)."""

    plid: str
    in_doubt: tuple[str, ...]
    mark: int | None = None  # the next sequence number it will use (counter tags): see PubLink.mark


@final
@dataclass(slots=True)
class SendHold:
    """Tell router `to` (a new origin of `gid`) that we hold a record of it: include us in its FINAL."""

    to: str
    gid: str


@final
@dataclass(slots=True)
class Announce:
    """A subscription homed here changed: tell the mesh (the entry is in the table). `presented`: the
    ids its subscriber presented when it attached here (empty for other changes)."""

    sid: str
    presented: tuple[str, ...] = ()


@final
@dataclass(slots=True)
class DetachLink:
    """Detach the local link of `sid` (the subscription moved to another router, or ended there, or
    another identity's life of it holds it: amqp:unauthorized-access)."""

    sid: str
    link: Any
    condition: str
    description: str


@final
@dataclass(slots=True)
class SubmitOrder:
    """Have `key` (a gid, or a subscription's start) numbered in the total order of `topic`."""

    topic: str
    key: str


# what the router's own adapter performs on client links
# Every action class is final: a router dispatches on `type(act) is C` (mypy narrows that, and
# checks with assert_never that every action is handled, only for final classes).
ClientAction = Deliver | SettleDelivery | DrainCredit | NotifyFinal | SendOutcome | SettlePublisher | GrantCredit | DetachLink
# what the mesh layer performs (a standalone router has no use for them but Announce, which it drops)
MeshAction = (Forward | SendAck | SendFinal | SendProbe | Announce | DeclarePublisher | SendHold | SendQuery
              | SubmitOrder)
Action = ClientAction | MeshAction
