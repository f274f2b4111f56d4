"""Messages between routers (wire protocol version 6, docs/wire-protocol.md), and the rule by which
routers of different versions talk (`negotiate_version`).

Neighbour-only: Hello, Bye. Flooded: LinkState. Routed (src -> dst, hop by hop along the shortest
paths): SubUpdate, SubAck, TableSync, Acks, Finals, Probes, Queries, PubDeclare, Holds, Order,
LamportOrder, MemberFrame. Data copies travel in their own frames (`codec.encode_copy`) so that transit routers can
pass the payload on without decoding it.

The classes are final: the codec and the node dispatch on `type(m) is C`, which mypy narrows (for a
final class in both branches), and end with `assert_never` so that a kind left out is a type error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, final

from ..common.errors import IncompatibleVersion, RemoteProtocolError
from ..router.order import lamport
from ..router.order.sequencer import Wire
from .members import MemberMsg

# The inter-router protocol version this router speaks. 1: routers that announced no version (only
# `oncemesh.mesh`); 2: the open frame carries `oncemesh.version` and `oncemesh.client-url`, the
# frames are those of 1; 3: the total-order messages (O, LO) carry compaction (floors, checkpoints).
# A router and a peer at most VERSION_SPAN apart interoperate: each speaks the lower of the two
# versions to the other (a rolling upgrade runs one version apart).
PROTOCOL_VERSION = 6
# The first version whose O and LO messages this router's strict order codecs read: to and from a
# neighbour speaking an older one, no order message is passed (the order streams treat the routers
# behind it as cut off until it is upgraded; every other message flows as before).
ORDER_VERSION = 3
# The first version that carries relayed members of shared subscriptions (MemberFrame, kind "M":
# interrouter/members.py). A router relays a member only to a home whose path speaks it all the way;
# a Join that is never answered is given up with a redirect to the home (members.JOIN_TIMEOUT).
MEMBERS_VERSION = 4
# The first version whose member sessions carry the MQTT sessions' keepers (interrouter/keeper.py):
# a router keeps its sessions at neighbours that speak it, and fetches them from any router it reaches
# through one (never through an older router, whose strict decoder would close the connection on the
# new kinds: the router before it drops them, `MeshNode._route_control`).
KEEPER_VERSION = 5
# The first version that reads the compact frames (interrouter/codec.py: "d" data frames, "c" control
# frames, no JSON on the per-message path): a router sends them only to a neighbour that speaks it,
# and the JSON forms to an older one (every message flows as in version 5 there).
COMPACT_VERSION = 6
VERSION_SPAN = 1
UNVERSIONED = 1  # what a peer that sends no `oncemesh.version` speaks


def speaks_version(setting: int) -> int:
    """The version a router speaks by its `mesh_protocol_version` setting: 0 is PROTOCOL_VERSION; an
    older one (at most VERSION_SPAN behind: a router of the older version could not talk to newer
    neighbours otherwise) makes it speak as a router of that version to every neighbour, for a
    rolling upgrade's test or a measurement of the older frames. Anything else is a ValueError."""
    if setting == 0:
        return PROTOCOL_VERSION
    if not PROTOCOL_VERSION - VERSION_SPAN <= setting <= PROTOCOL_VERSION:
        raise ValueError(f"setting mesh_protocol_version must be 0 (the newest, {PROTOCOL_VERSION}) or "
                         f"{PROTOCOL_VERSION - VERSION_SPAN}..{PROTOCOL_VERSION}, got {setting}")
    return setting


def negotiate_version(ours: int, theirs: object) -> int:
    """The version two neighbours speak to each other: the lower of the two, when they are at most
    VERSION_SPAN apart. A version that is no positive integer is the peer's error
    (`RemoteProtocolError`, amqp:invalid-field); one too far from ours raises `IncompatibleVersion`
    (amqp:not-implemented), whose message names both versions."""
    if isinstance(theirs, bool) or not isinstance(theirs, int) or theirs < 1:
        raise RemoteProtocolError(f"the inter-router protocol version must be a positive integer, got {theirs!r}")
    if abs(ours - theirs) > VERSION_SPAN:
        newer = "upgrade this router" if theirs > ours else "upgrade the peer"
        raise IncompatibleVersion(f"this router speaks inter-router protocol version {ours}, the peer version "
                                  f"{theirs}: more than {VERSION_SPAN} apart ({newer} first; a rolling upgrade "
                                  f"goes one version at a time, docs/wire-protocol.md)")
    return min(ours, theirs)


@final
@dataclass(frozen=True, slots=True)
class Hello:
    """Every `hello_interval` to each neighbour; silence for `dead_after` means it is dead."""

    src: str
    inc: str


@final
@dataclass(frozen=True, slots=True)
class Bye:
    """A router shutting down cleanly (leave): its neighbours need not wait for `dead_after`."""

    src: str
    inc: str


@final
@dataclass(frozen=True, slots=True)
class LinkState:
    """A router's live neighbours with their costs, flooded to the whole mesh. A higher `seq`
    (within an incarnation) replaces an older advertisement; a new incarnation replaces all."""

    origin: str
    inc: str
    seq: int
    neighbours: dict[str, float]


@final
@dataclass(frozen=True, slots=True)
class SubUpdate:
    """A subscription homed at `src` changed (attach, resume, suspend, end). `req` asks for a SubAck.
    An attach carries the ids its client presented (accepted, not seen settled): their origins count
    them as accepted and make sure the FINAL reaches the subscription's new home."""

    src: str
    dst: str
    entry: dict[str, Any]
    req: int | None
    presented: tuple[str, ...] = ()


@final
@dataclass(frozen=True, slots=True)
class SubAck:
    """The answer to a SubUpdate with a request id: `ok` False refuses a resume (it ended here)."""

    src: str
    dst: str
    sid: str
    req: int
    ok: bool
    reason: str | None = None


@final
@dataclass(frozen=True, slots=True)
class TableSync:
    """The whole subscription table, sent to every router that becomes reachable."""

    src: str
    dst: str
    inc: str
    entries: list[dict[str, Any]]
    reply: bool = False  # asks for the receiver's table in return


@final
@dataclass(frozen=True, slots=True)
class Acks:
    """From a destination to an origin: (gid, sid, state, error) for each resolved subscription."""

    src: str
    dst: str
    items: list[tuple[str, str, int, tuple[str, str] | None]]


@final
@dataclass(frozen=True, slots=True)
class Finals:
    """From an origin: these gids are final (settled by their publishers). `notes`: for those whose
    publisher may not have had the outcome (the router settled in receiver-settle-mode first, or it
    left), what a resend of it is answered with: (gid, its tag's plain gid, outcome, error, digest of
    its bytes) (router/identity.py)."""

    src: str
    dst: str
    gids: list[str]
    notes: tuple[tuple[str, str, int, tuple[str, str] | None, str | None], ...] = ()


@final
@dataclass(frozen=True, slots=True)
class Probes:
    """From a destination to an origin: are these gids still in flight? (A FINAL may be lost.)
    `inc` is the origin incarnation that forwarded them: only that incarnation may answer (a
    restarted origin has no record of them, which says nothing about whether they are final)."""

    src: str
    dst: str
    gids: list[str]
    inc: str = ""


@final
@dataclass(frozen=True, slots=True)
class Queries:
    """To any router: what do you know of these gids? (Our records of them lost publisher and origin.)"""

    src: str
    dst: str
    gids: list[str]


@final
@dataclass(frozen=True, slots=True)
class PubDeclare:
    """Publisher link `plid` attached at `src` and holds `gids` in doubt; everything else it had
    published by then it settled. `mark`: the next sequence number it would use then (our clients'
    counter tags; None: every other tag of the link counts as settled)."""

    src: str
    dst: str
    plid: str
    gids: list[str]
    mark: int | None = None


@final
@dataclass(frozen=True, slots=True)
class Holds:
    """To a (new) origin: we hold records of these gids; tell us their FINAL."""

    src: str
    dst: str
    gids: list[str]


@final
@dataclass(frozen=True, slots=True)
class Order:
    """One message of the total-order sequencer of `topic` (its numbering group), from the group's
    member `src` to `dst`. Encoded by `interrouter.ordercodec`."""

    dst: str
    src: str
    topic: str
    wire: Wire


@final
@dataclass(frozen=True, slots=True)
class LamportOrder:
    """One frame of a reliable session (`interrouter.channel`) of the Lamport total-order stream of
    `topic` (`router.order.lamport`), from the stream's member `src` to `dst`: session `epoch`, its
    number `seq` (0: no message, an acknowledgement only), the acknowledgement of `dst`'s session
    toward `src` (`ack_epoch`, every seq up to `ack` arrived), and the message. Encoded by
    `interrouter.lamportcodec`."""

    dst: str
    src: str
    topic: str
    epoch: int
    seq: int
    ack_epoch: int
    ack: int
    msg: lamport.Wire | None


@final
@dataclass(frozen=True, slots=True)
class MemberFrame:
    """One frame of the reliable session (`interrouter.channel`) between `src` and `dst` that
    carries relayed members of shared subscriptions (`interrouter.members`): session `epoch`, its
    number `seq` (0: an acknowledgement only), the acknowledgement of `dst`'s session (`ack_epoch`,
    `ack`), and the message."""

    dst: str
    src: str
    epoch: int
    seq: int
    ack_epoch: int
    ack: int
    msg: MemberMsg | None


@final
@dataclass(frozen=True, slots=True)
class Copy:
    """A message copy: from `origin` (incarnation `inc`), to deliver at each router of `dests` to
    the listed subscriptions. `payload` is the publisher's message, never decoded."""

    origin: str
    inc: str
    gid: str
    topic: str
    dests: dict[str, tuple[str, ...]]
    payload: bytes
    preds: tuple[str, ...] = ()  # FIFO: earlier messages of its publisher it must not overtake
    deps: tuple[tuple[str, str], ...] = ()  # causal order: (gid, topic) its publisher depended on
    by_arrival: bool = False  # FIFO: its publisher declared no order: `preds` are its order, not its tag


Control = (Hello | Bye | LinkState | SubUpdate | SubAck | TableSync | Acks | Finals | Probes | PubDeclare | Holds
           | Queries | Order | LamportOrder | MemberFrame)
Routed = (SubUpdate | SubAck | TableSync | Acks | Finals | Probes | PubDeclare | Holds | Queries | Order
          | LamportOrder | MemberFrame)
