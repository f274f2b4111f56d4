"""Where an MQTT session resumes: the edge's decisions about sessions, keepers and attaches (pure).

Theory of operation
-------------------
session.py decides every packet of one connection; what is left to decide is *which* session a
connection gets and what the delivery core is told of it. Those rules were the edge's glue
(router/mqtt/edge.py); they are here so that the mesh simulator (tests/sim/mqtt_sim.py) runs the
same ones:

- **Fetch first** (`needs_fetch`): a client that resumes (clean start 0) at a router with a mesh
  gets CONNACK only after the keepers answered, unless this router holds its session from a
  connection still open (a takeover here): the session may have gone on at another router since.
- **A new session** (`new_session`): its nonce and its first version come from the time it begins
  (nanoseconds, given): a keeper still holding an older session of the client id takes this one's
  images as the newer, and its tags are never an older life's.
- **Present or not** (`admit`): a held session resumes unless the client asked for a clean start;
  then it ends (its subscriptions end with it).
- **The image or the session held here** (`fetched_session`): the keepers' image wins when this
  router holds no session of the client, or holds one from an ended connection that is older (a
  lower `seq`): its client went on elsewhere.
- **What the core is told** (`publisher_links`, `attach_args`): each of the two publisher links
  declares what its client holds in doubt (`SessionState.declarations`), not ordered (an MQTT
  client resends in its own order); each filter is one subscription (a `$share/G/F` one a member of
  G), presenting what the client accepted and was not told final (`SessionState.held_for`).
- **The keepers' answers** (`fetch_answers`, `kept_seq`, `orphan_declarations`): a fetched image
  goes to the first connection that waited for it (the others find it held here); the keeper's
  acknowledgement raises what the session knows kept; a kept session whose router is out of reach
  is declared for its publisher links by the keeper (`DeliveryCore.publisher_gone`).

Time is a parameter; nothing here logs, reads a clock or touches a connection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar, final

from ...common.ids import shared_subscription_id, subscription_id
from ..core import SubscriberAttach
from .session import SessionState, SubState

T = TypeVar("T")


@final
@dataclass(frozen=True, slots=True)
class PublisherLink:
    """One of a session's two publisher links, as the core's `attach_publisher` takes it."""

    qos: int  # 1: the outcome settles; 2: the client settles (PUBREL)
    plid: str
    second: bool  # receiver-settle-mode second (QoS 2)
    in_doubt: list[bytes]  # tags named and not answered: the client may send them again
    mark: int  # the next tag's number: every earlier tag of this life not in doubt is settled
    ordered: bool = False  # (an MQTT client resends in its own order: never ended as late)


def needs_fetch(clean_start: bool, keepers: bool, fetched: bool, held: bool, connected: bool) -> bool:
    """Ask the keepers for the session before CONNACK? `keepers`: this router has a mesh;
    `fetched`: this connection asked already; `held`: this router holds a session of the client
    id; `connected`: from a connection still open."""
    return not clean_start and keepers and not fetched and (not held or not connected)


def patient_fetch(held: bool) -> bool:
    """A fetch waits a while for the routers out of reach too when this router holds the session
    from a connection that ended (`held`): the client may have gone on elsewhere since, and a copy
    newer than this one may be behind them (interrouter/keeper.py, "A patient fetch")."""
    return held


def new_session(client_id: str, owner: str, expiry: float, born_ns: int) -> SessionState:
    """A session that begins now (`born_ns`: the time in nanoseconds)."""
    st = SessionState(client_id, owner, f"{born_ns:x}", expiry if expiry > 0 else 0.0, seq=born_ns // 1000)
    st.kept = st.seq  # (nothing of it depends on a keeper yet)
    return st


def admit(held: SessionState | None, clean_start: bool) -> tuple[bool, bool]:
    """(session present, the held session ends) for a CONNECT with `clean_start`."""
    present = held is not None and not clean_start
    return present, held is not None and not present


def fetched_session(client_id: str, image: dict[str, Any] | None, local: SessionState | None,
                    local_connected: bool, now: float) -> SessionState | None:
    """The session restored from the keepers' `image` when it wins over `local` (the session this
    router holds, `local_connected`: from an open connection), else None. Raises KeyError,
    TypeError or ValueError for an image it cannot read."""
    if image is None or not (local is None or (not local_connected and int(image.get("seq", 0)) > local.seq)):
        return None
    st = SessionState.from_image(client_id, image)
    st.kept = st.seq
    st.ended_at = now
    return st


def publisher_links(st: SessionState) -> list[PublisherLink]:
    """What the session's publisher links declare when its client attaches."""
    return [PublisherLink(qos, plid, qos == 2, tags, mark) for qos, plid, tags, mark in st.declarations()]


def orphan_declarations(client_id: str, image: dict[str, Any]) -> list[PublisherLink]:
    """What a keeper declares for the publisher links of a kept session whose router is out of
    reach (`Keeper.orphaned`). Raises KeyError, TypeError or ValueError for an unreadable image."""
    return publisher_links(SessionState.from_image(client_id, image))


def resubscriptions(st: SessionState, present: bool) -> tuple[SubState, ...]:
    """The filters attached again when the session resumes (none for a new one)."""
    return tuple(st.subs.values()) if present else ()


def attach_args(client_id: str, user: str, sub: SubState, st: SessionState,
                presented: tuple[str, ...]) -> SubscriberAttach:
    """The subscription a filter is with the core: durable for the session's expiry, capable
    (takes FINAL notifications), presenting `presented` (`SessionState.held_for` of its sid)."""
    expiry = math.inf if math.isinf(st.expiry) else st.expiry
    if sub.group:
        member = subscription_id(client_id, sub.topic_filter, sub.match)
        sid = shared_subscription_id("", sub.group, sub.match)
        return SubscriberAttach(sid, sub.match, "", sub.group, expiry, True, list(presented), None, (),
                                user, "", member, sub.topic_filter)
    sid = subscription_id(client_id, sub.topic_filter, sub.match)
    return SubscriberAttach(sid, sub.match, client_id, sub.topic_filter, expiry, True, list(presented),
                            None, (), user)


def presented(st: SessionState, sub: SubState) -> tuple[str, ...]:
    """What the client presents when filter `sub` attaches: what it accepted, not seen final."""
    return tuple(st.held_for(sub.sid))


def kept_seq(st: SessionState | None, seq: int) -> None:
    """The keeper acknowledged the session's image up to `seq`."""
    if st is not None and seq > st.kept:
        st.kept = seq


def fetch_answers(image: dict[str, Any] | None, waiting: list[T]) -> list[tuple[T, dict[str, Any] | None]]:
    """The keepers' answer to a fetch, per connection that waited: the image to the first, none
    to the others (they find the session held here by then)."""
    out: list[tuple[T, dict[str, Any] | None]] = []
    for w in waiting:
        out.append((w, image))
        image = None
    return out
