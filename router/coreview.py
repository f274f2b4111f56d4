"""What the parts of the delivery core read of it in common: `CoreView`, the base of each part's
own Protocol (`sweeps.SweepHost`, `handing.HandingHost`, `meshside.MeshHost`,
`identity.IdentityHost`, `order.policy.OrderHost`, `drain.DrainView`), which adds what that part
alone asks. The parts see the core through these and never import router/core.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .actions import Action
    from .coreconfig import CoreConfig
    from .state import Record, SubRuntime
    from .subscriptions import SubscriptionTable


class CoreView(Protocol):
    """The delivery core as its parts read it: who it is, its settings, the subscription table, the
    records (written by its `RecordBook` alone) and the subscriptions homed here; and where every
    part puts its actions and settlement-log events (`out`, `log`)."""

    @property
    def cfg(self) -> CoreConfig: ...
    @property
    def out(self) -> list[Action]: ...
    @property
    def log(self) -> list[tuple[Any, ...]]: ...

    @property
    def router_id(self) -> str: ...
    @property
    def table(self) -> SubscriptionTable: ...
    @property
    def records(self) -> Mapping[str, Record]: ...
    @property
    def subs(self) -> Mapping[str, SubRuntime]: ...
