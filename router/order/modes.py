"""The ordering modes a topic can have, by name, and which mode each topic has (router/order/policy.py).

Adding a mode: write its policy (a module here with an `OrderPolicy` subclass), register it in
`MODES`, and choose it for topics (`CoreConfig.topic_orders`, topic -> mode name).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .causal_policy import CausalOrder
from .fifo import FifoOrder
from .policy import OrderPolicy
from .total_policy import TotalOrder

if TYPE_CHECKING:
    from ..core import CoreConfig

DEFAULT = "fifo"
MODES: dict[str, type[OrderPolicy]] = {
    FifoOrder.name: FifoOrder,
    CausalOrder.name: CausalOrder,
    TotalOrder.name: TotalOrder,  # numbered by the sequencer or by Lamport clocks alike
}


def topic_modes(cfg: CoreConfig) -> dict[str, str]:
    """Topic -> the name of its mode, for the topics not in the default mode. The mode-specific
    settings choose theirs (`total_topics`, `causal_groups`; total first); `topic_orders` names
    any mode (it wins)."""
    modes = {t: CausalOrder.name for t in cfg.causal_groups}
    modes.update((t, TotalOrder.name) for t in cfg.total_topics)
    modes.update(cfg.topic_orders)
    for t, m in modes.items():
        if m not in MODES:
            raise ValueError(f"topic {t}: no order mode {m!r} (known: {', '.join(sorted(MODES))})")
    return {t: m for t, m in modes.items() if m != DEFAULT}
