"""What the parts of the delivery core read of it in common: `CoreView`, the base of each part's
own Protocol (`sweeps.SweepHost`, `handing.HandingHost`, `meshside.MeshHost`,
`identity.IdentityHost`, `order.policy.OrderHost`, `drain.DrainView`), which adds what that part
alone asks. The parts see the core through these and never import router/core.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .state import Record, SubRuntime
    from .subscriptions import SubscriptionTable


class CoreView(Protocol):
    """The delivery core as its parts read it: who it is, the subscription table, the records
    (written by its `RecordBook` alone) and the subscriptions homed here."""

    @property
    def router_id(self) -> str: ...
    @property
    def table(self) -> SubscriptionTable: ...
    @property
    def records(self) -> Mapping[str, Record]: ...
    @property
    def subs(self) -> Mapping[str, SubRuntime]: ...
