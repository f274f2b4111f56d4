"""What a publisher or subscriber and the client runtime that owns them know of each other, as types.

The runtime (`runtime.Client`) makes publishers and subscribers; they call it back through
`ClientHost`, the members of it they use, and it drives them through `LinkOwner`. Both are declared
here, below all three, so the imports go one way: runtime.py imports publisher.py and subscriber.py,
which import neither runtime.py nor each other.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..common.engine import AmqpConnection, Engine, Link
from ..common.settlement_log import SettlementLog
from .state import ClientState


class LinkOwner(Protocol):
    """A publisher or subscriber: it attaches its link on every connection the runtime makes, and
    hears the events of that link."""

    def attach(self, conn: AmqpConnection, session: Any) -> None: ...

    def connection_lost(self) -> None: ...

    def on_link_open(self, link: Link) -> None: ...

    def on_credit(self, link: Link) -> None: ...

    def on_message(self, link: Link, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None: ...

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None: ...

    def on_link_closed(self, link: Link, closed: bool, condition: tuple[str, str] | None) -> None: ...


class ClientHost(Protocol):
    """What a publisher or subscriber uses of the runtime that owns it (`runtime.Client` is one)."""

    @property
    def container_id(self) -> str: ...

    @property
    def state(self) -> ClientState:
        """The state directory (outbox, dedup store, sequence blocks)."""
        ...

    @property
    def engine(self) -> Engine | None:
        """None until the runtime started."""
        ...

    @property
    def conn(self) -> AmqpConnection | None:
        """The current router connection (None between connections)."""
        ...

    @property
    def session(self) -> Any: ...

    @property
    def connected(self) -> bool: ...

    @property
    def router_id(self) -> str | None:
        """The router of the current connection, as it names itself."""
        ...

    def settlement_log(self, role: str) -> SettlementLog: ...

    def add_owner(self, owner: LinkOwner) -> None:
        """Attach `owner` now if connected, and on every connection after."""

    def remove_owner(self, owner: LinkOwner) -> None: ...

    def causal_past(self, limit: int = ...) -> list[list[str]]:
        """`oncemesh.causal-past`, presented when a publisher attaches."""
        ...

    def move(self, info: dict[Any, Any]) -> None:
        """A router redirected one of our links: the whole connection moves."""
