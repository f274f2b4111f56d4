"""The delivery core's settings (`DeliveryCore(config=...)`); `router.core` re-exports it for its
importers. A module of its own so that the core's parts and the order policies read the settings
without importing the core."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CoreConfig:
    max_inflight_messages: int = 20_000
    max_inflight_bytes: int = 256 * 1024 * 1024
    link_credit: int = 500  # credit window per publisher link
    max_redeliveries: int = 10  # RELEASED/MODIFIED beyond this turns into a rejection
    placeholder_horizon: float = 3600.0  # seconds an unmatched presented id is kept
    orphan_horizon: float = 3600.0  # seconds a decided record waits for a vanished publisher/origin
    max_decided_records: int = 200_000  # decided records awaiting settlement (small, no payload)
    probe_after: float = 5.0  # a resolved destination record asks its origin after this long
    copy_retry: float = 2.0  # an origin re-sends a copy its destination has not confirmed after this long
    stale_wait: float = 0.5  # a record whose publisher left asks the mesh this long before handing it over
    final_memory: float = 300.0  # seconds a router remembers a final gid (late copies and presenters)
    final_memory_young: float = 5.0  # seconds a final gid stays in the plain dict before it is compacted
    final_memory_entries: int = 1_000_000  # final gids and gid intervals remembered at most (oldest go first)
    final_notes_max: int = 200_000  # notes on final messages whose publisher may resend them (router/identity.py)
    final_notify_batch: int = 256
    # seconds a shared subscription's member whose connection dropped keeps what it was handed and
    # had not settled (in doubt: it may have accepted it) before that goes to another member
    # (router/groups.py)
    shared_member_grace: float = 30.0
    # a router hands shared subscriptions' messages only while it reached a majority of the mesh within
    # this many seconds; another router takes one over from its home only once it has not reached that
    # home for twice this long (router/groups.py: at most one side of a partition hands)
    shared_lease: float = 3.0
    # topics in total order by the sequencer (the mesh layer numbers what SubmitOrder asks for and
    # reports numbers back through `DeliveryCore.ordered`); empty for a standalone router
    total_topics: frozenset[str] = frozenset()
    # total order: seconds a decided message keeps its number from being compacted while its
    # publisher has not settled it (a resend through another router after that is numbered anew)
    total_pin: float = 60.0
    # topics in causal order -> their causal group (a topic without a group is a group of its own)
    causal_groups: dict[str, str] = field(default_factory=dict)
    # topics in an order mode named here (router/order/modes.py), over what the settings above say
    topic_orders: dict[str, str] = field(default_factory=dict)
    # topics whose publishers are identified by message-id (the topology's `identity = "message-id"`;
    # a link asks for it itself with the link property oncemesh.identity): router/identity.py
    msgid_topics: frozenset[str] = frozenset()
    # the message-id window: seconds, and entries at most (oldest forgotten first), that a router
    # remembers a final message's id with its outcome (a resend within it is answered, never handed)
    msgid_window: float = 300.0
    msgid_window_entries: int = 200_000
