"""What the delivery core asks its adapter to do, and the outcomes it speaks of.

Actions are imperative, small, and batched: a core call appends them to `DeliveryCore.out` and the
adapter drains the list after each batch of input.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class Outcome(IntEnum):
    ACCEPTED = 1
    REJECTED = 2
    RELEASED = 3
    MODIFIED = 4


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send `payload` to subscription `sid` on its current link, tag = gid, unsettled."""

    sid: str
    gid: str
    payload: bytes
    redelivery: bool


@dataclass(frozen=True, slots=True)
class SettleDelivery:
    """The message is final: settle its delivery on the subscription's current link."""

    sid: str
    gid: str


@dataclass(frozen=True, slots=True)
class NotifyFinal:
    """Tell a subscription (one of our clients) that ids it accepted on an earlier link are final."""

    sid: str
    gids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SendOutcome:
    """Tell the publisher delivery `pub` its outcome; `settle` for receiver-settle-mode first."""

    pub: Any
    outcome: Outcome
    error: tuple[str, str] | None
    settle: bool


@dataclass(frozen=True, slots=True)
class SettlePublisher:
    """The publisher settled `pub`: settle our side and forget the delivery."""

    pub: Any


@dataclass(frozen=True, slots=True)
class GrantCredit:
    link: Any
    credit: int


Action = Deliver | SettleDelivery | NotifyFinal | SendOutcome | SettlePublisher | GrantCredit
