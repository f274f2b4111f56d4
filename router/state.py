"""The state of a message for each subscription it is owed to, and what a record holds.

Theory of operation
-------------------
A message's record (`Record.owed`) holds one state per subscription: QUEUED (owed, not on a link),
SENT (handed to the subscription's current link, no outcome yet), then one of the resolutions
ACCEPTED, REJECTED (counted in the publisher's outcome) or ENDED (the subscription ended first).
`Record.pending` counts the subscriptions still QUEUED or SENT: at 0 the record is decided.

Absent (None) means "not owed": a subscription that was not in force, or whose part was dropped
(it moved away, or a stale copy was distrusted).

This module says what the states are and what a record holds. Who changes them is one object:
`router.records.RecordBook`, which holds the records, applies the table of moves (`MOVES`: a move
not in it is a bug of ours, `IllegalMove`), and alone writes `owed`, `pending` and what the counts
of the core follow from (`origin`, `outcome`, `payload`). Nothing else writes them (a test says so).
The subscription- and publisher-side state below (`SubRuntime`, `PubLink`) is written by the core.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from ..common.errors import OncemeshError
from ..common.ids import PLID_LEN
from ..common.vocab import Outcome

if TYPE_CHECKING:
    from .groups import Group


class S(IntEnum):
    """State of one message for one subscription."""

    QUEUED = 0
    SENT = 1
    ACCEPTED = 2
    REJECTED = 3
    ENDED = 4


# The members as module constants for the per-message code: in Python 3.11 `S.QUEUED` goes through
# EnumType.__getattr__, which keeps the interpreter from caching the lookup (~0.1 µs each, a dozen
# per message). The same for Outcome (router.actions) and SubState (router.subscriptions).
S_QUEUED, S_SENT, S_ACCEPTED, S_REJECTED, S_ENDED = S.QUEUED, S.SENT, S.ACCEPTED, S.REJECTED, S.ENDED
RESOLVED = (S_ACCEPTED, S_REJECTED, S_ENDED)
_EVENT_OF = {st: st.name.lower() for st in S}  # settlement-log event of a resolution (no enum lookups per message)
HELD = 5  # acknowledgement state: the copy arrived at the subscription's home (not resolved yet)


class IllegalMove(OncemeshError):
    """A state change the rules do not allow: a bug in the delivery core, never the peer's fault."""


class Record:
    __slots__ = ("gid", "topic", "payload", "plid", "pubs", "owed", "pending", "outcome", "error",
                 "pub_settled", "created", "decided", "redeliveries", "rejected_by", "origin", "origins",
                 "fwd", "holders", "probed", "held", "sent_at", "asked_at", "listed", "preds", "seq", "tnum",
                 "deps")

    def __init__(self, gid: str, topic: str, payload: bytes, now: float) -> None:
        self.gid = gid
        self.topic = topic
        self.payload = payload
        self.plid = gid[:PLID_LEN]  # (ids.plid_of, inlined: one per message)
        self.pubs: list[Any] = []  # live publisher delivery tokens awaiting an outcome / settlement
        self.owed: dict[str, S] = {}
        self.pending = 0  # subscriptions still QUEUED or SENT
        self.outcome: Outcome | None = None
        self.error: tuple[str, str] | None = None
        self.pub_settled = False
        self.created = now
        self.decided = 0.0
        self.redeliveries: dict[str, int] | None = None
        self.rejected_by: list[tuple[str, tuple[str, str] | None]] | None = None
        self.origin: str | None = None  # None: we are its origin; else the origin router's id
        self.origins: dict[str, str] | None = None  # destination: origin router -> its incarnation
        self.fwd: dict[str, str] | None = None  # origin: remote sid -> router its copy went to
        self.holders: set[str] | None = None  # origin: routers that got a copy (FINAL goes there)
        self.probed = 0.0
        self.held: set[str] | None = None  # origin: remote sids whose home confirmed the copy
        self.sent_at = 0.0  # origin: when copies were last sent
        self.asked_at = 0.0  # origin without its publisher: when we last asked the mesh about it
        self.listed: dict[str, float] | None = None  # origin: local sid -> when another origin listed it
        # FIFO: the earlier messages of its publisher not yet final at an origin when this one came
        # there (the latest of them, one per origin): no subscription is handed it before them
        self.preds: tuple[str, ...] = ()
        # its place in its publisher's order, for our clients (they declare their sequence at attach:
        # the counter of their tags); None for every other client, whose order is the one its origin
        # received its messages in (the chain: `preds`), never its tag. Set by whoever makes it (the
        # origin knows the publisher link; a copy says so: `MeshSide.receive_copy`)
        self.seq: int | None = None
        self.tnum: int | None = None  # total order: its number in its topic, once learned here
        # causal order: its publishing client's causal past when it published it, (gid, topic) per
        # publisher link of the causal group (those of its own topic are also in `preds`)
        self.deps: tuple[tuple[str, str], ...] = ()


class SubRuntime:
    """Delivery-side state of one subscription homed here."""

    __slots__ = ("sid", "link", "credit", "queue", "owed", "on_link", "capable", "final_unnotified",
                 "notify", "arrived_at", "fifo_hi", "resend", "tnext", "thanded", "thanded_ids", "thanded_at",
                 "client", "cpassed", "drain", "wild", "group")

    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.link: Any = None  # adapter token of the attached link, None while suspended
        self.credit = 0
        self.drain = False  # its link asked to drain: credit left when nothing more can go is used up
        # its filter is a wildcard: each message handed carries its topic as properties.to
        # (common/amqpmsg.py), set when the publisher left it empty
        self.wild = False
        # a shared subscription's members (router/groups.py): then `link` is this group while any
        # member is attached, `credit` the sum of theirs, and each message goes to one of them
        self.group: Group | None = None
        self.queue: deque[str] = deque()  # gids QUEUED, in the order to send
        self.owed: dict[str, Record] = {}  # gids QUEUED or SENT for this subscription, arrival order
        self.on_link: set[str] = set()  # gids with an unsettled delivery on the current link
        self.capable = False  # speaks our resume protocol (presents ids, understands NotifyFinal)
        self.final_unnotified: set[str] = set()  # accepted on an earlier link, final since
        self.notify: list[str] = []  # final ids to report on the current link
        self.arrived_at = 0.0  # when it came (back) here from elsewhere (0: it never left)
        # FIFO: per publisher link, the latest seq sent to it here (or handed, as its client says):
        # an earlier message sent for the first time only now would be handed after it
        self.fifo_hi: dict[str, int] = {}
        # sent on an earlier link and not accepted there: sent again whatever was sent after it (it
        # was first sent in order; a client may accept out of order)
        self.resend: set[str] = set()
        # total order: the next number of its topic to hand it (None: from its start), and the
        # highest number its client says it was handed (our clients present `handed-last`)
        self.tnext: int | None = None
        self.thanded = 0
        self.thanded_ids: tuple[str, ...] = ()  # presented handed-last ids whose numbers we must learn first
        self.thanded_at = 0.0  # when they were presented
        self.client = ""  # causal order: its client (AMQP container id), whose causal past grows with it
        # causal order: dependencies of messages handed to it that it was not handed itself (not owed
        # when they came, or final): one that comes only now would be handed after what depends on it
        self.cpassed: set[str] | None = None


class PubLink:
    __slots__ = ("token", "plid", "topic", "second", "outstanding", "pubs", "blocked", "declared", "mark",
                 "client", "fresh", "flen", "settled", "by_id", "ordered")

    def __init__(self, token: Any, plid: str, topic: str, second: bool, client: str = "") -> None:
        self.token = token
        self.client = client  # its AMQP container id (causal order: whose causal past it publishes in)
        self.plid = plid
        self.topic = topic
        self.second = second  # receiver-settle-mode second
        self.outstanding = 0  # credit granted and not yet used
        self.pubs: dict[Any, str] = {}  # publisher delivery token -> gid
        self.blocked = False  # waiting in DeliveryCore._blocked for room in the budget
        self.declared: set[str] | None = None  # gids it held in doubt when it attached (our clients)
        # the next sequence number (counter tags) it would use when it attached: what it declared
        # says nothing of messages it published later (None: a client without counter tags)
        self.mark: int | None = None
        # which tags name another message if they come again (router/identity.py): the largest
        # counter-like gid known fresh on this link, its length (-1: no transfer is taken for fresh
        # without a look), and the tags settled on this attachment
        self.fresh = ""
        self.flen = -1
        self.settled: OrderedDict[str, None] | None = None
        # identified by message-id (router/identity.py): `plid` is then its scope (ids.identity_scope)
        self.by_id = False
        # with a declaration: do its counter tags count its publish order, and does it resend what it
        # holds in doubt before anything newer (our clients)? False for a link that declares but whose
        # client may resend out of order (the MQTT edge's: a client's resends after a reconnect are
        # its own): then its order is the one we receive its messages in, as for any AMQP client
        self.ordered = True


def tnum_key(rec: Record | None) -> float:
    return rec.tnum if rec is not None and rec.tnum is not None else math.inf
