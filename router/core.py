"""The delivery core: delivery records, outcome aggregation, resume, back-pressure, mesh forwarding.
Sans-IO: time is a parameter, actions are appended to `self.out`, log events to `self.log`.

Theory of operation
-------------------
A *record* exists per message (global id, `gid`) from its first arrival until it is *final*.

At its *origin* (the router the publisher is attached to; `rec.origin is None`) the record is
authoritative: at creation the message is owed to every live (active or suspended) subscription of
its topic in the replicated table, wherever it is homed: `rec.owed[sid]` starts QUEUED. Local
subscriptions go QUEUED -> SENT (handed to the link) -> ACCEPTED | REJECTED; RELEASED / MODIFIED
send them back to QUEUED (redelivered, up to `max_redeliveries`). Remote ones are resolved by
acknowledgements from their home router. Ending a subscription turns what it still owed into ENDED.
When nothing is QUEUED or SENT the record is *decided*: ACCEPTED unless someone rejected it (then
REJECTED naming who). Only then is the publisher told (promise 2); the payload is freed and the
record leaves the in-flight budget.

A record is *final* when it is decided and its publisher settled it (receiver-settle-mode second:
the publisher will never resend it). Then every subscriber delivery of it is settled, ids accepted on
earlier links are reported final (NotifyFinal), the routers holding copies get FINAL, and it is freed.
Settling a subscriber delivery is our promise that the gid will never be handed to that
subscription again.

For remote subscriptions the origin sends copies (Forward) toward their home routers, each copy
naming the subscriptions its destination is to deliver to. A *destination record*
(`rec.origin` set) holds the payload for local delivery, resolves its local subscriptions exactly like
the origin does, and acknowledges each resolution to the origin (SendAck). It is freed on FINAL.
Copies are merged by gid, so a copy that arrives twice (a re-send after a fault, or from a second
origin after a publisher failover) never hands anything twice: resolved subscriptions are simply
acknowledged again. The origin keeps the payload until the record is decided and re-sends pending
copies whenever the live graph changes or a subscription moves (`reroute`).

Resume. A subscriber that re-attaches presents the ids it accepted but has not seen settled; they
are marked ACCEPTED (or kept as *placeholders* until a copy or resend brings the message) and
everything else still owed to it is redelivered under the same tag. A publisher re-attaches with the
same link name, declares its in-doubt tags, and resends them; resends merge by gid.

Back-pressure: publishers get credit only while undecided records of this origin, plus credit
already granted, stay within the budget (messages and bytes). Nothing is ever dropped.

Who owns what
-------------
The core makes its parts and holds them; each owns the state only it writes and sees the core
through a `Protocol` in its own module (no part imports this one; docs/architecture.md, "Who owns
what in the delivery core"):
- `self.book`, a `records.RecordBook`: the records, their per-subscription states and every count
  that follows from them (`pending`, `undecided`, `inflight_bytes`, `destination_records`); it alone
  writes them (the rules: router/records.py; a test fails on a write anywhere else). The core
  decides when a record is made, moved, decided and freed, and asks the book to do it.
- `self.orders`: the order of each topic, its policy (router/order/policy.py, FIFO the default),
  which `_pump` asks before it hands a record; the pump has no branch per mode (`OrderHost`).
- `self.ids`, an `identity.Identities`: which message a transfer is (tags reused by clients not
  ours), with the notes and new identities it keeps (`IdentityHost`).
- `self.handing`, a `handing.Handing`: each publisher link's chain and the predecessors awaited
  (`HandingHost`).
- `self.meshside`, a `meshside.MeshSide`: copies, acknowledgements, FINAL / PROBE / QUERY / HOLD;
  it owns who asked for a FINAL (`held_for`) and what another router drives (`driven_elsewhere`)
  (`MeshHost`). Its inputs are offered here as they are (`self.receive_copy`, ...).
- `self.sweeps`, a `sweeps.Sweeps`: the housekeeping `tick` runs (`SweepHost`).
- The core's own, which several parts read and change only through its methods: the subscriptions'
  delivery side (`SubRuntime`, `remote_pending`), the publisher links (`PubLink`), placeholders,
  the final memory, the live graph (`reachable`), credit, and which subscriptions move.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..common import errors
from ..common.amqpmsg import with_to
from ..common.ids import PLID_LEN, counter_seq, global_id, identity_scope, plid_of
from ..common.selector import Selector, SelectorError, message_fields
from ..common.selector import parse as parse_selector
from ..common.settlement_log import AcceptedBy, Owed
from ..common.topics import check_name, is_wildcard, matches
from ..common.vocab import O_ACCEPTED, O_MODIFIED, O_REJECTED, O_RELEASED, Outcome
from .actions import (
    Action,
    Announce,
    DeclarePublisher,
    Deliver,
    DetachLink,
    DrainCredit,
    GrantCredit,
    NotifyFinal,
    SendAck,
    SendFinal,
    SendOutcome,
    SendQuery,
    SettleDelivery,
    SettlePublisher,
    SubmitOrder,
)
from .coreconfig import CoreConfig as CoreConfig  # (re-exported: its importers name it from here)
from .finals import FinalNotes, OldFinals, age_finals
from .groups import Group, Member
from .handing import Handing
from .identity import Identities, WireNote
from .meshside import MeshSide, declared_settled
from .order.causal_policy import CausalOrder
from .order.fifo import FifoOrder
from .order.modes import DEFAULT, MODES, topic_modes
from .order.policy import BLOCK, PARK, SKIP, OrderPolicy, Verdict
from .order.total import Checkpoint, TotalStream, start_key
from .order.total_policy import TotalOrder
from .records import RecordBook
from .snapshot import (
    NOTHING,
    CoreCounts,
    CoreSnapshot,
    Parts,
    publisher_rows,
    record_page,
    subscription_page,
    topic_rows,
    unnumbered,
)
from .state import (
    _EVENT_OF,
    RESOLVED,
    S_ACCEPTED,
    S_ENDED,
    S_QUEUED,
    S_REJECTED,
    S_SENT,
    PubLink,
    Record,
    S,
    SubRuntime,
    tnum_key,
)
from .subscriptions import (
    SUB_ACTIVE,
    Subscription,
    SubscriptionTable,
    SubState,
    foreign,
    owned_by_another,
    refused_as_foreign,
)
from .sweeps import Sweeps


def _refusal(sid: str, link: object, holder: Subscription) -> DetachLink:
    """The link of a claim that another identity's life of the subscription beat (`holder`): refused."""
    return DetachLink(sid, link, errors.UnauthorizedAccess.condition,
                      f"subscription {sid} belongs to another identity (made first, at router {holder.home}); "
                      f"attach with the credentials that made it")


# a subscriber's disposition as `subscriber_outcome` takes it: (gid, outcome, settled, error,
# undeliverable); `subscriber_outcomes` takes a list of them, a bare gid for the usual ACCEPTED
OutcomeItem = tuple[str, Outcome, bool, "tuple[str, str] | None", bool]

# why a life made here for a claim the mesh refused (another identity holds the subscription) ends
CLAIM_REFUSED = "refused: another identity holds it"


@dataclass(frozen=True, slots=True)
class SubscriberAttach:
    """What a subscriber's ATTACH asked for, kept with its link (a refused resume takes it again)."""

    sid: str
    topic: str
    container: str
    link_name: str
    expiry: float
    capable: bool  # the client presents ids and takes FINAL notifications (ours do)
    presented: list[str] | None  # ids it accepted and has not seen settled
    epoch: int | None = None
    handed_last: tuple[str, ...] = ()  # per publisher link, the latest message it was handed
    owner: str = ""  # the authenticated identity attaching ("" without client authentication)
    selector: str = ""  # its JMS message selector ("" none; checked: `DeliveryCore.selector_of`)
    member: str = ""  # a member link of shared subscription `sid`: the member's own id (router/groups.py)
    member_name: str = ""  # ... and its link name (`link_name` is then the subscription's name)


SELECTOR_CHANGED = "selector changed"  # why a life ended when its link came back with another selector


class DeliveryCore:
    """The delivery core of one router. The per-message path (publish -> pump -> send -> resolve)
    is here; the order of each topic is its policy (router/order/policy.py), what may be handed
    now otherwise is `handing` (router/handing.py), which message a transfer is `ids`
    (router/identity.py), the mesh side `meshside` (router/meshside.py), housekeeping `sweeps`
    (router/sweeps.py); the records, their states and counts are written by `book` alone
    (router/records.py). Each part owns its state (see the module's docstring)."""

    def __init__(self, router_id: str, table: SubscriptionTable | None = None,
                 config: CoreConfig | None = None) -> None:
        self.router_id = router_id
        self.table = table if table is not None else SubscriptionTable()  # (an empty table is falsy)
        self.cfg = config if config is not None else CoreConfig()
        # the records, their states and the counts that follow from them: written by the book alone
        # (router/records.py); `records` is its dict, read here and by the mesh layer, never written
        self.book = RecordBook()
        self.records: dict[str, Record] = self.book.by_gid
        self.subs: dict[str, SubRuntime] = {}  # subscriptions homed here
        # shared subscriptions homed here (router/groups.py), and each member link's subscription
        self.groups: dict[str, SubRuntime] = {}
        self.member_sid: dict[str, str] = {}
        self.remote_pending: dict[str, dict[str, Record]] = {}  # remote sid -> origin records owing it
        self.pub_links: dict[Any, PubLink] = {}
        self.pub_of: dict[Any, tuple[PubLink, str]] = {}  # publisher delivery token -> (link, gid)
        self.placeholders: dict[str, dict[str, float]] = {}  # gid -> {sid: since}
        self.recent_final: dict[str, float] = {}  # gid -> when it became final here: the young tier
        self.old_finals = OldFinals()  # and the compacted old tier (router/finals.py)
        # which message a transfer is, for clients that reuse tags (router/identity.py)
        self.incarnation = ""  # (the adapter sets it: new identities are unique to it)
        self.ids = Identities(self)  # (it owns what it remembers of tags and final messages)
        self.stats_reclaimed = 0  # subscriptions claimed again for their live link here (meshside.py)
        self.reachable: dict[str, str] = {router_id: ""}  # router -> incarnation (mesh layer sets it)
        # shared subscriptions' lease (`lease_held`, `_refuse_member`): when this router last reached a
        # majority of the mesh, when it last reached each router, and when it first heard of any
        self.last_whole = 0.0
        self.last_seen: dict[str, float] = {}
        self._born: float | None = None
        self.newest_link: dict[str, PubLink] = {}  # plid -> its most recent attach here
        self.reserved_credit = 0
        self.ready = True  # grant publishers credit only when ready (table loaded / synced)
        self.log_writable = True  # and only while the settlement log can be written (a full disk)
        self.draining = False  # and never again once the router drains (router/drain.py)
        self._blocked: deque[PubLink] = deque()
        self.out: list[Action] = []
        self.log: list[tuple[Any, ...]] = []  # settlement-log events: (ev, gid, topic, sid, info)
        # Hand-overs held (`hold_handovers`): the edge holds them while it catches up after a stall of
        # its process (SIGSTOP, a starved CPU), until it has read what its clients said meanwhile
        # (a subscriber that left, failed over and accepted the message elsewhere): `release_handovers`.
        self.hold_pumps = False
        self._held_pumps: dict[str, SubRuntime] = {}
        self._owed_sets: dict[str, tuple[int, Owed]] = {}  # topic -> (table version, its owed set)
        self._selectors: dict[str, Selector] = {}  # selector text -> parsed (`selector_of`)
        self._now = 0.0  # the latest time we were given (stamps copies sent from untimed calls)
        self.mesh_size = 1  # routers in the topology (the mesh layer sets it): 1 = standalone
        # total order: per topic, the numbering learned so far
        self.total: dict[str, TotalStream] = {t: TotalStream() for t in self.cfg.total_topics}
        # causal order: the causal group of each topic in one (the pasts: `CausalOrder.pasts`)
        self.causal = self.cfg.causal_groups
        # the order of each topic: one policy object per mode (router/order/modes.py), FIFO the default
        self.order_modes: dict[str, OrderPolicy] = {name: mode(self) for name, mode in MODES.items()}
        self.fifo = self.order_modes[DEFAULT]
        self.orders = {t: self.order_modes[m] for t, m in topic_modes(self.cfg).items()}  # (not the default)
        # (the two the core also asks outside the pump: numbering, and a publisher's causal past)
        self.total_order: TotalOrder = cast(TotalOrder, self.order_modes[TotalOrder.name])
        self.causal_order: CausalOrder = cast(CausalOrder, self.order_modes[CausalOrder.name])
        for sub in self.table.live():
            if sub.home == router_id:
                self.subs.setdefault(sub.sid, SubRuntime(sub.sid))
        self.sweeps = Sweeps(self)  # housekeeping (router/sweeps.py), run by `tick`
        # publisher links' chains and the predecessors awaited (router/handing.py), which the policies ask
        self.handing = Handing(self)
        # copies, acknowledgements, FINAL / PROBE / QUERY / HOLD (router/meshside.py); its inputs and
        # queries are offered here as they are (no layer in between: receive_copy and handle_ack come
        # once per message): `core.receive_copy` is `core.meshside.receive_copy`
        mesh = self.meshside = MeshSide(self)
        self.receive_copy = mesh.receive_copy
        self.handle_ack = mesh.handle_ack
        self.handle_final = mesh.handle_final
        self.handle_probe = mesh.handle_probe
        self.handle_query = mesh.handle_query
        self.handle_hold = mesh.handle_hold
        self.publisher_declared_elsewhere = mesh.publisher_declared_elsewhere
        self.reroute = mesh.reroute
        self.has_record = mesh.has_record
        self.has_final_notes = mesh.has_final_notes
        self.in_total_order = mesh.in_total_order
        self.total_base = mesh.total_base
        self.total_checkpoint = mesh.total_checkpoint
        self.total_start_of = mesh.total_start_of

    @property
    def undecided(self) -> int:
        """Records of this origin still waiting: what the budget counts (kept by `book`)."""
        return self.book.undecided

    @property
    def inflight_bytes(self) -> int:
        return self.book.inflight_bytes

    @property
    def destination_records(self) -> int:
        """Records held for another origin (counted, not scanned, for the status; kept by `book`)."""
        return self.book.destination_records

    @property
    def final_notes(self) -> FinalNotes:
        """Notes on final messages whose publisher may resend them (kept by `ids`, router/identity.py)."""
        return self.ids.final_notes

    def notes_on(self, gids: list[str]) -> tuple[WireNote, ...]:
        """The notes this router has on `gids` (a FINAL it sends carries them)."""
        return self.ids.notes_on(gids)

    def _identify(self, pl: PubLink, pub: Any, tag: bytes, gid: str, rec: Record | None, payload: bytes,
                  now: float) -> tuple[str, Record | None, bool]:
        """Which message a transfer is, when its tag may name another one (`Identities.identify`)."""
        return self.ids.identify(pl, pub, tag, gid, rec, payload, now)

    def is_final(self, gid: str) -> bool:
        """Did `gid` become final here within `final_memory` (its record freed), or, identified by
        message-id, within the window (router/identity.py)?"""
        return gid in self.recent_final or gid in self.old_finals or gid in self.ids.id_notes.by_tag

    def _local(self, sub: Subscription | None) -> bool:
        return sub is not None and sub.live and sub.home == self.router_id

    # ================================================================ publishers: attach, publish, settle
    def attach_publisher(self, token: Any, plid: str, topic: str, second: bool,
                         in_doubt: Iterable[bytes] | None, now: float, mark: int | None = None,
                         client: str = "", past: Iterable[tuple[str, str]] = (), by_id: bool = False,
                         user: str = "", ordered: bool = True) -> None:
        """`past`: causal order, what its client says it was handed and published (our clients
        present it: a router it moved to learns what the one before knew). `by_id`: the link asked
        to be identified by message-id (oncemesh.identity); so is every link of a topic in
        `msgid_topics` that declares nothing in doubt (ours declare, and keep their tags). Such a
        link stands for the scope of `user` on its topic (`ids.identity_scope`, router/identity.py).
        `topic` "": an anonymous relay link, each message naming its own topic (`publish`).
        `ordered` False: it declares, but its tags' counter is not its order (`PubLink.ordered`)."""
        self._now = now
        by_id = by_id or (in_doubt is None and topic in self.cfg.msgid_topics)
        if by_id and not topic:
            raise errors.NotImplementedMode("an anonymous relay link is named by its delivery tags: identity by "
                                            "message-id is for a link attached to its topic")
        if by_id:
            if in_doubt is not None:
                raise errors.RemoteProtocolError("a link identified by message-id declares no tags in doubt")
            plid = identity_scope(topic, user)
        pl = PubLink(token, plid, topic, second, client)
        pl.by_id = by_id
        pl.ordered = ordered
        group = self.causal.get(topic) if self.causal and client else None
        if group is not None:
            for g, t in past:
                if self.causal.get(t) == group:
                    self.causal_order.note(client, group, g, t, ())
        if in_doubt is None and not pl.by_id:  # not ours: it may reuse tags (identity.py; before it is the newest)
            self.ids.fresh_floor(pl)
        self.pub_links[token] = pl
        # the newest attach of a link name supersedes older ones still open here (their connections
        # not yet noticed dead, e.g. after a freeze): only its declaration is evidence (an older
        # declaration, made before a message existed, took it for settled; regression test:
        # test_core.py::test_an_older_link_of_the_same_publisher_is_no_evidence_of_settlement)
        self.newest_link[plid] = pl
        if in_doubt is not None:
            gids = {global_id(plid, t) for t in in_doubt}
            pl.declared = gids
            pl.mark = mark
            self._publisher_declared(plid, gids, mark, now)
            if len(self.reachable) > 1:
                self.out.append(DeclarePublisher(plid, tuple(sorted(gids)), mark))
        self._grant(pl)

    def publisher_gone(self, plid: str, in_doubt: Iterable[bytes], mark: int, now: float) -> None:
        """Publisher link `plid`'s declaration, made for it by this router as the keeper of its
        client's session when the router it was attached to is gone (an MQTT session: its image
        says which tags were in doubt, `SessionState.declarations`). As `attach_publisher` with that
        declaration, without a link: what this router holds of it that the declaration says settled
        is final, and so are the ids subscribers presented here; and it is evidence for the mesh's
        questions later (`MeshSide.handle_query`, the placeholder sweep), until a link of it
        attaches here. Not sent to the mesh: the others ask (a placeholder, a copy without its
        origin), and only what is settled is answered; a resend of what is in doubt is the
        client's, at the router it comes back to."""
        self._now = now
        gids = {global_id(plid, t) for t in in_doubt}
        pl = self.newest_link.get(plid)
        if pl is not None and pl.token is not None:
            return  # (its client is back here: its own declaration is the newer evidence)
        ghost = PubLink(None, plid, "", True)
        ghost.declared = gids
        ghost.mark = mark
        ghost.ordered = False
        self.newest_link[plid] = ghost
        self._publisher_declared(plid, gids, mark, now)

    def publisher_released(self, token: Any, tag: bytes, now: float) -> None:
        """The publisher on link `token` settled `tag`, a message it declared in doubt when it
        attached and did not send again here: it was answered at a router that is gone (an MQTT
        client's PUBREL after the PUBREC of a router that died: it never sends that PUBLISH again).
        It is out of doubt: what this router holds of it, and the ids subscribers presented, are
        final, and the mesh's questions about it are answered so."""
        self._now = now
        pl = self.pub_links.get(token)
        if pl is None or pl.declared is None:
            return
        gid = global_id(pl.plid, tag)
        if gid not in pl.declared:
            return
        pl.declared = pl.declared - {gid}
        self._publisher_declared(pl.plid, pl.declared, pl.mark, now)

    def detach_publisher(self, token: Any) -> None:
        pl = self.pub_links.pop(token, None)
        if pl is None:
            return
        if self.newest_link.get(pl.plid) is pl:
            del self.newest_link[pl.plid]
        self.ids.link_gone(pl, self._now)
        self.reserved_credit -= pl.outstanding
        pl.outstanding = 0
        for pub, gid in pl.pubs.items():
            self.pub_of.pop(pub, None)
            rec = self.records.get(gid)
            if rec is not None and pub in rec.pubs:
                rec.pubs.remove(pub)
        pl.pubs.clear()
        self._unblock()

    def publish(self, link_token: Any, pub: Any, tag: bytes, payload: bytes, now: float,
                topic: str | None = None) -> str:
        """A transfer arrived on a publisher link. Returns the gid ("" when it was refused).
        `topic`: on an anonymous relay link (attached with topic ""), the message's own (its `to`,
        "" when it has none); a message this relay may not carry is REJECTED and settled
        (`relay_refusal`), and the link goes on."""
        self._now = now
        pl = self.pub_links[link_token]
        if pl.outstanding <= 0:
            raise errors.TransferLimitExceeded("transfer sent without link credit")
        pl.outstanding -= 1
        self.reserved_credit -= 1
        if topic is None:
            topic = pl.topic
        elif not pl.topic:
            why = self.relay_refusal(topic)
            if why is not None:
                self._refuse(pl, pub, why)
                return ""
        else:
            raise errors.RemoteProtocolError("a topic per message only on an anonymous relay link")
        answered = False  # (refused, or a resend of a final message answered with its outcome: nothing to keep)
        if pl.by_id:  # identified by its message-id, whatever its tag (router/identity.py)
            gid, rec, answered = self.ids.by_message_id(pl, pub, payload)
        else:
            gid = global_id(pl.plid, tag)
            rec = self.records.get(gid)
            if pl.declared is None or (pl.declared and rec is None and gid in pl.declared):
                # a tag used before may name another message, or a final one (router/identity.py); ours
                # reuse none: only what they declared in doubt may be final meanwhile
                if len(gid) != pl.flen or gid <= pl.fresh:
                    gid, rec, answered = self._identify(pl, pub, tag, gid, rec, payload, now)
                else:
                    pl.fresh = gid  # (the usual, in mode second: the next of its tags, never seen here)
        if answered:
            pass
        elif rec is None:
            if self.causal:
                group = self.causal.get(topic)
                # (a resend its client declared in doubt gets none here: what the client was handed
                # since it first sent it is no dependency of it, and could close a cycle of waits)
                deps = self.causal_order.deps(pl, group) if group is not None and not (
                    pl.declared and gid in pl.declared) else ()
                self._new_record(gid, topic, payload, now, deps, pub, pl)
                if group is not None and pl.client:
                    self.causal_order.note(pl.client, group, gid, topic, ())  # what it published is in its past
            else:
                self._new_record(gid, topic, payload, now, (), pub, pl)
        else:
            self._merge(rec, pub, pl, payload, now)
        if pl.outstanding <= self.cfg.link_credit // 2:
            self._grant(pl)
        return gid

    def relay_refusal(self, topic: str) -> tuple[str, str] | None:
        """Why a message on an anonymous relay link may not go to `topic` (its `to`): the AMQP error
        it is REJECTED with, or None. A relay carries messages to FIFO topics whose publishers are
        named by delivery tag (docs/clients.md, "Anonymous relay")."""
        if not topic:
            return (errors.InvalidAddress.condition, "a message on an anonymous relay link names its topic in its "
                                                   "properties' `to` field; this one has none")
        why = check_name(topic)
        if why is not None:
            return (errors.InvalidAddress.condition, f"`to` {topic[:64]!r} is not a topic name: {why}")
        if topic[0] in "$_":
            return (errors.UnauthorizedAccess.condition, f"`to` {topic[:64]!r} is reserved for the routers")
        if topic in self.orders:
            return (errors.NotImplementedMode.condition,
                    f"topic {topic!r} is in {self.orders[topic].name} order: publish to it on a link attached "
                    f"to it by name, not through the anonymous relay")
        if topic in self.cfg.msgid_topics:
            return (errors.NotImplementedMode.condition,
                    f"topic {topic!r} names its publishers by message-id: publish to it on a link attached to "
                    f"it by name, not through the anonymous relay")
        return None

    def refuse_transfer(self, link_token: Any, pub: Any, error: tuple[str, str]) -> None:
        """A transfer on a publisher link that the adapter refuses as a message (e.g. a relayed message
        to a topic its user may not publish to): it takes its credit, is REJECTED with `error` and
        settled; the link goes on."""
        pl = self.pub_links[link_token]
        if pl.outstanding <= 0:
            raise errors.TransferLimitExceeded("transfer sent without link credit")
        pl.outstanding -= 1
        self.reserved_credit -= 1
        self._refuse(pl, pub, error)

    def _refuse(self, pl: PubLink, pub: Any, error: tuple[str, str]) -> None:
        """A transfer on `pl` that is no message of the mesh (its credit taken already): REJECTED with
        `error` and settled; the link gets credit again."""
        self.out.append(SendOutcome(pub, O_REJECTED, error, True))
        if pl.outstanding <= self.cfg.link_credit // 2:
            self._grant(pl)

    def _merge(self, rec: Record, pub: Any, pl: PubLink, payload: bytes, now: float) -> None:
        """A resend of a message we hold (as its origin or as a destination of a copy)."""
        gid = rec.gid
        self.log.append(("received", gid, rec.topic, None, "merged"))
        if rec.origin is not None:
            if pl.declared is None or not pl.ordered:
                rec.seq = None  # (its order here is the one we receive it in: `_new_record`)
            self._adopt(rec, payload, now)
        elif rec.outcome is None and not rec.pubs:
            rec.pubs.append(pub)  # its publisher is back: we drive its delivery again
            self.meshside.route(rec, force=True)
            rec.pubs.remove(pub)
        rec.pubs.append(pub)
        pl.pubs[pub] = gid
        self.pub_of[pub] = (pl, gid)
        if rec.outcome is not None:
            self._tell_publisher(rec, pub, pl)
            self._maybe_final(rec, now)

    def unsettled_on(self, pl: PubLink, pub: Any, gid: str) -> None:
        """`pub`, a delivery of `gid` on `pl`, waits for its publisher's settlement
        (`publisher_settled`). (The publish path writes the same two entries inline.)"""
        pl.pubs[pub] = gid
        self.pub_of[pub] = (pl, gid)

    def publisher_settled(self, pub: Any, now: float) -> None:
        entry = self.pub_of.pop(pub, None)
        self.out.append(SettlePublisher(pub))
        if entry is None:
            return
        pl, gid = entry
        pl.pubs.pop(pub, None)
        rec = self.records.get(gid)
        if rec is None:
            if pl.declared is None:  # an answered resend (router/identity.py): its tag is free on the link
                self.ids.settled_on_link(pl, gid)
            return
        try:  # noqa: SIM105 - one search of the list, not two (contextlib.suppress costs two calls)
            rec.pubs.remove(pub)
        except ValueError:
            pass
        rec.pub_settled = True
        if rec.outcome is not None:  # (_maybe_final, inlined)
            self._finalize(rec, now)
        elif pl.declared is None:  # settled before its outcome: the tag is free on this link (identity.py)
            self.ids.settled_on_link(pl, gid)

    def _new_record(self, gid: str, topic: str, payload: bytes, now: float,
                    deps: tuple[tuple[str, str], ...], pub: Any, pl: PubLink) -> Record:
        """A new message from publisher delivery `pub` on `pl`. The delivery is registered before
        the record is routed or handed: a record without a live publisher delivery is one whose
        publisher left, which is withheld until the mesh was asked about it (every fresh message
        in a mesh was, until the next one came)."""
        rec = Record(gid, topic, payload, now)
        if pl.declared is not None and pl.ordered:
            # ours declared their sequence at attach: their tags' counter is their publish order.
            # Any other client's order is the one we receive its messages in (`_chain`): a tag it
            # chose says nothing of it (random, or started again on a new connection), nor does one
            # the MQTT edge gave (its client resends in its own order: `PubLink.ordered`)
            rec.seq = counter_seq(gid)
        rec.pubs.append(pub)
        pl.pubs[pub] = gid
        self.pub_of[pub] = (pl, gid)
        self.handing.chain_record(rec)
        if deps:
            CausalOrder.add_deps(rec, deps)
        if self.meshside.held_for:
            asked = self.meshside.take_held_for(gid)
            if asked:
                rec.holders = set(asked)
        held = self.placeholders.pop(gid, None) if self.placeholders else None
        me = self.router_id
        live = self.table.live_for_topic(topic)
        selected = self._select(live, payload) if self.table.selective else None
        if selected is not None:
            live = selected  # (a selector turned it away from some: owed to the others)
        self.book.add_origin(rec, live, held, me)  # owed to each (but what their clients hold already)
        if self.table.selective and rec.preds:
            self.handing.cover_preds(rec)
        subs = self.subs
        remote = False
        queued = 0
        first: SubRuntime | None = None  # local subscriptions to pump once the record is set up
        more: list[SubRuntime] | None = None
        for sub in live:
            sid = sub.sid
            if sub.home == me:
                if held is not None and sid in held:
                    self.log.append(("accepted", gid, topic, sid, "placeholder"))
                    rt = subs.get(sid)  # (pumped below all the same, as every local part is)
                    if rt is None:
                        continue
                else:
                    rt = subs[sid]
                    queued += 1
                    rt.owed[gid] = rec
                    if rt.link is not None:
                        rt.queue.append(gid)
                if rt.link is not None and rt.credit > 0:
                    if first is None:
                        first = rt
                    elif more is None:
                        more = [rt]
                    else:
                        more.append(rt)
            else:
                queued += 1
                self.remote_pending.setdefault(sid, {})[gid] = rec
                remote = True
        if selected is not None:
            self.log.append(("received", gid, topic, None, Owed((sub.sid, sub.home) for sub in selected)))
        else:
            hit = self._owed_sets.get(topic)  # (`_owed_set`, its usual case inlined: once per message)
            self.log.append(("received", gid, topic, None,
                             hit[1] if hit is not None and hit[0] == self.table.version else self._owed_set(topic)))
        if self.total and topic in self.total:
            self.total_order.number(rec, now)  # may add or end parts, and decide it
            if rec.outcome is not None:
                return rec
            if rec.pending == 0:
                self._decide(rec, now)  # (a total-order record waits for its number)
                return rec
            if remote:
                self.meshside.route(rec, force=False)
            for sid in rec.owed:  # (numbering may have added parts)
                local = subs.get(sid)
                if local is not None and local.link is not None and local.credit > 0:
                    self._pump(local)
            return rec
        if queued == 0:
            self._decide(rec, now)
            return rec
        if remote:
            self.meshside.route(rec, force=False)
        if first is not None:
            if first.link is not None and first.credit > 0:
                self._pump(first)
            if more is not None:
                for rt in more:
                    if rt.link is not None and rt.credit > 0:
                        self._pump(rt)
        return rec

    def _owed_set(self, topic: str) -> Owed:
        """The settlement log's record of whom a new record of `topic` is owed to: every live
        subscription of the topic with its home (what `_new_record` gives a part), one object per
        table version (the log groups a pass's records by it and encodes it once)."""
        version = self.table.version
        hit = self._owed_sets.get(topic)
        if hit is not None and hit[0] == version:
            return hit[1]
        if len(self._owed_sets) > 10_000:
            self._owed_sets.clear()
        owed = Owed((sub.sid, sub.home) for sub in self.table.live_for_topic(topic))
        self._owed_sets[topic] = (version, owed)
        return owed

    def _adopt(self, rec: Record, payload: bytes, now: float) -> None:
        """A publisher resent here a message we only held as a destination (its origin died or the
        publisher failed over to us): we become an origin for it, owing what our table says."""
        self.book.adopt(rec, payload)  # counted until decided, like any record of ours
        self.handing.chain_record(rec)
        self._absorb_placeholders(rec)
        live = self.table.live_for_topic(rec.topic)
        selected = self._select(live, payload) if self.table.selective else None
        fresh: list[SubRuntime] = []
        for sub in live if selected is None else selected:
            if sub.sid not in rec.owed:
                rt = self._owe(rec, sub.sid, sub.home)
                if rt is not None:
                    fresh.append(rt)
        if self.table.selective and rec.preds:
            self.handing.cover_preds(rec)  # (once its parts are all there)
        for rt in fresh:
            self._pump(rt)
        if self.total and rec.topic in self.total:
            self.total_order.number(rec, now)
            if rec.outcome is not None:
                return
        if rec.pending == 0:
            self._decide(rec, now)
        else:
            self.meshside.route(rec, force=True)

    def _owe(self, rec: Record, sid: str, home: str | None) -> SubRuntime | None:
        """A new QUEUED part of `rec` (not on the hot path of `_new_record`) for `sid`, homed at
        `home` (None: not in our table yet). Returns the local subscription when it has a link
        (the caller pumps it)."""
        self.book.move(rec, sid, S_QUEUED)
        if rec.origin is None:  # a part added after the record was received: the log says so
            self.log.append(("owed", rec.gid, rec.topic, None, Owed(((sid, home),))))
        if home != self.router_id:
            self.remote_pending.setdefault(sid, {})[rec.gid] = rec
            return None
        rt = self.subs.get(sid)
        if rt is None:
            rt = self.subs[sid] = SubRuntime(sid)
        rt.owed[rec.gid] = rec
        if rt.link is None:
            return None
        rt.queue.append(rec.gid)
        return rt

    # ================================================================ outcomes: decide, tell the publisher, finalize
    def _decide(self, rec: Record, now: float) -> None:
        if self.total and rec.tnum is None and rec.origin is None and rec.topic in self.total:
            return  # its number may make it owed to more subscriptions: decided once numbered
        book = self.book
        if rec.origin is not None:  # a destination record: our local subscriptions are done
            rec.decided = now
            book.free_payload(rec)
            if not rec.owed and rec.gid not in self.placeholders:
                book.remove(rec)  # no subscription here has a part in it any more
            return
        rec.decided = now
        # every subscription is done with it: only its outcome and settlement remain to be told, so
        # the payload is freed now and the record stops counting against the in-flight budget
        if rec.rejected_by:
            names = ", ".join(sid for sid, _ in rec.rejected_by)
            first = rec.rejected_by[0][1]
            # the first subscriber's condition travels on; the description names every rejecter
            detail = f": {first[1]}" if first and first[1] else ""
            outcome = O_REJECTED
            book.decide(rec, outcome, (first[0] if first else errors.SUBSCRIBER_REJECTED,
                                       f"rejected by subscription(s) {names}{detail}"))
        else:
            outcome = O_ACCEPTED
            book.decide(rec, outcome, rec.error)
        if self._blocked:
            self._unblock()
        if outcome is O_ACCEPTED and rec.error is None:
            self.log.append(("outcome", rec.gid, rec.topic, None, AcceptedBy(len(rec.owed))))
        else:
            self.log.append(("outcome", rec.gid, rec.topic, None, {
                "outcome": outcome.name, "count": len(rec.owed),
                "error": f"{rec.error[0]}: {rec.error[1]}" if rec.error else None}))
        for pub in list(rec.pubs):
            entry = self.pub_of.get(pub)
            if entry is not None:
                self._tell_publisher(rec, pub, entry[0])
        if rec.pub_settled:  # (_maybe_final, inlined: the outcome is set)
            self._finalize(rec, now)

    def _tell_publisher(self, rec: Record, pub: Any, pl: PubLink) -> None:
        assert rec.outcome is not None
        settle = not pl.second
        self.out.append(SendOutcome(pub, rec.outcome, rec.error, settle))
        if settle:  # receiver-settle-mode first: we settle first; the publisher is done with it
            rec.pub_settled = True
            rec.pubs.remove(pub)
            pl.pubs.pop(pub, None)
            self.pub_of.pop(pub, None)
            if pl.declared is None:
                self.ids.settled_on_link(pl, rec.gid)  # the tag is free on this link (identity.py)

    def _maybe_final(self, rec: Record, now: float) -> None:
        if rec.outcome is None or not rec.pub_settled:
            return
        self._finalize(rec, now)

    def _finalize(self, rec: Record, now: float) -> None:
        gid = rec.gid
        self.book.remove(rec)
        self.handing.unchain(rec)
        for pub in rec.pubs:  # other legs (a resend on a second link): settle them too
            entry = self.pub_of.pop(pub, None)
            if entry is not None:
                entry[0].pubs.pop(pub, None)
                if rec.outcome is not None:
                    self.out.append(SendOutcome(pub, rec.outcome, rec.error, True))
        tell: set[str] | None = set(rec.holders) if rec.holders else None
        subs = self.subs
        for sid, st in rec.owed.items():
            rt = subs.get(sid)
            if rt is None:
                me = self.router_id
                if rec.origin is None:
                    sub = self.table.get(sid)
                    if sub is not None and sub.live and sub.home != me:
                        if tell is None:
                            tell = set()
                        tell.add(sub.home)  # its new home may hold a placeholder for it
                    pend = self.remote_pending.get(sid)
                    if pend is not None:
                        pend.pop(gid, None)
                continue
            if st is S_QUEUED or st is S_SENT:  # final elsewhere before it got here: withdrawn
                rt.owed.pop(gid, None)
                rt.resend.discard(gid)
            on_link = rt.on_link
            if gid in on_link:
                on_link.remove(gid)
                self.out.append(SettleDelivery(sid if rt.group is None else self._settle_in_group(rt, gid), gid))
            elif rt.group is not None:  # (held by a member that dropped, or presented by one)
                if st is S_ACCEPTED:
                    self._member_final(rt, gid)
                else:
                    self._settle_in_group(rt, gid)
            elif st is S_ACCEPTED:
                if rt.link is not None and rt.capable:
                    rt.notify.append(gid)
                    self._pump(rt)
                elif rt.capable:
                    rt.final_unnotified.add(gid)
        if rec.origin is None and tell:
            tell.discard(self.router_id)
            for router in sorted(tell):
                self.out.append(SendFinal(router, gid))
        self.recent_final[gid] = now  # late copies and late presenters learn it is final
        ids = self.ids
        if ids.noted or ids.plain_of:
            ids.final(rec, now)  # what its tag says from now on (router/identity.py)
        if self.placeholders and gid in self.placeholders:  # others here hold it without a part in it
            self._placeholder_final(gid)
        self.log.append(("settled", gid, rec.topic, None, None))
        if self._blocked:
            self._unblock()

    # ================================================================ subscribers: attach, detach, pump, send, resolve
    def attach_subscriber(self, link: Any, sid: str, topic: str, container: str, link_name: str,
                          expiry: float, capable: bool, presented: Iterable[str] | None,
                          now: float, epoch: int | None = None, handed_last: Iterable[str] = (),
                          owner: str = "", selector: str = "", member: str = "", member_name: str = "") -> bool:
        """A subscriber link attached here (new or resuming). Returns True when it resumed.
        `epoch`: the subscription's epoch its client last attached with (our clients present it).
        `handed_last`: per publisher link, the latest message its client was handed (FIFO: an
        earlier one that comes only now is not handed after it). Raises `UnauthorizedAccess`, having
        changed nothing, when the subscription is live and another identity's (`refuse_owner`).
        `selector`: a JMS message selector: only what it selects is owed to the subscription; a live
        subscription attached with another selector ends, and a new life begins with this one (JMS:
        changing a durable subscription's selector is unsubscribing and subscribing again).
        `member`: the link is a member of shared subscription `sid` (its own id: router/groups.py),
        which other members may hold too; `link_name` is then the subscription's name (`container`
        its scope) and `member_name` the member's link name."""
        self._now = now
        self.refuse_owner(sid, owner)
        self.refuse_filter(topic, selector)
        old_rt = self.subs.get(sid)
        if member:
            self._refuse_member(sid, old_rt, selector)
        elif old_rt is not None and old_rt.link is not None:
            self._unbind(old_rt)  # the same identity attached again: the new link wins (adapter steals)
        before = self.table.get(sid)
        if before is not None and before.live and before.selector != selector:
            self._end(sid, now, SELECTOR_CHANGED)
            before = self.table.get(sid)
        was_remote = before is not None and before.live and before.home != self.router_id
        # the client attached somewhere after the last change we know of: we missed its travels, and
        # what we still hold for it may have been dealt with elsewhere meanwhile
        stale_view = before is not None and before.live and epoch is not None and before.epoch < epoch
        sub, resumed = self.table.attach(sid, topic, container, link_name, expiry, self.router_id, now,
                                         min_epoch=epoch or 0, owner=owner, inc=self.incarnation, selector=selector)
        rt = self.subs.get(sid)
        fresh = rt is None
        if rt is None:
            rt = self.subs[sid] = SubRuntime(sid)
        if was_remote:
            self._moved_here(sid)
        if stale_view:
            self._distrust(rt, now)
        if member:
            self._join(rt, member, member_name, link, capable)
            self._await_former(rt, sub, member, now)
        else:
            rt.link = link
            rt.capable = capable
            rt.credit = 0
        rt.wild = is_wildcard(topic)
        rt.client = container
        presented_set = set(presented or ())
        self.log.append(("attach_requested", None, topic, sid, {
            "container": container, "link": link_name,
            "info": f"expiry={'never' if math.isinf(expiry) else expiry} presented={len(presented_set)}"}))
        # The client already holds what it presents, whether this is a resume or a new life of the
        # same identity (a non-durable one that ended): never hand those ids to it again.
        for gid in dict.fromkeys(presented or ()):  # (in the order presented, not the hash seed's)
            rec = rt.owed.get(gid)
            if rec is not None:
                self._resolve(rec, sid, S_ACCEPTED, None, now, "resume")
            elif gid in rt.final_unnotified:
                rt.notify.append(gid)
            else:
                rec2 = self.records.get(gid)
                if rec2 is None and self.is_final(gid):
                    rt.notify.append(gid)  # we were its origin and it is final
                elif rec2 is None:
                    if self._settled_by_local_publisher(gid):
                        rt.notify.append(gid)  # its publisher is here and settled it: final
                        continue
                    # not here (yet): a copy or a resend may bring it
                    self.placeholders.setdefault(gid, {})[sid] = now
                    self.log.append(("placeholder", gid, topic, sid, None))
                elif rec2.owed.get(sid) is not S_ACCEPTED:
                    # not owed to this life (or ended in an earlier one), yet the client holds it:
                    # count it as accepted so that the final settlement reaches it
                    self.book.move(rec2, sid, S_ACCEPTED)
                    self.log.append(("accepted", gid, topic, sid, "resume"))  # (acks of it say so)
        rt.final_unnotified.clear()
        if member:
            self._presented_by_member(rt, member, presented_set)
        # only a client that hands over in arrival order (ours) presents `handed_last`; what a
        # client presents as accepted says nothing of order (a client may accept out of order)
        handed_last = tuple(handed_last)
        hi = rt.fifo_hi
        for gid in handed_last:
            seq = counter_seq(gid)
            if seq is not None and seq > hi.get(gid[:PLID_LEN], -1):
                hi[gid[:PLID_LEN]] = seq
        rt.queue = deque(rt.owed)
        ts = self.total.get(topic) if self.total else None
        if ts is not None:
            if ts.start_of(sid, sub.created) is None:
                self.out.append(SubmitOrder(topic, start_key(sid, sub.created)))  # (again after a restart)
            rt.thanded_ids = handed_last  # numbered: this router learns them all (a restarted one again)
            rt.thanded_at = now
            if resumed and (fresh or was_remote or stale_view):
                # what it was handed elsewhere: our clients say (handed-last); others do not, and
                # then it goes on from the lowest number held here for it
                rt.tnext = None if capable else 0
            owed = rt.owed
            rt.queue = deque(sorted(rt.queue, key=lambda g: tnum_key(owed.get(g))))
        self.out.append(Announce(sid, tuple(sorted(presented_set))))
        return resumed

    def _distrust(self, rt: SubRuntime, now: float) -> None:
        """Our view of this subscription was stale (it has been elsewhere meanwhile): copies we held
        for it are dropped (their origins re-send what is still pending for it, forced by the epoch
        change), and it counts as arrived now (see `_pump`)."""
        sid = rt.sid
        rt.arrived_at = now
        for gid, rec in list(rt.owed.items()):
            if rec.origin is not None:
                del rt.owed[gid]
                self.book.move(rec, sid, None)
                if rec.pending == 0:
                    self._decide(rec, now)

    def refuse_owner(self, sid: str, owner: str) -> None:
        """Raise `UnauthorizedAccess` when subscription `sid` is live here and was made by another
        identity than `owner` (the authenticated identity attaching; "" none): only its owner may
        attach to it (docs/security.md). A claim made before this router heard of it is settled
        by the mesh (router/subscriptions.py, `holding_life`)."""
        if owned_by_another(self.table.get(sid), owner):
            raise errors.UnauthorizedAccess(f"subscription {sid} belongs to another identity; attach with the "
                                            f"credentials that made it")

    def refuse_filter(self, topic_filter: str, selector: str = "") -> None:
        """Raise `NotImplementedMode` when wildcard filter `topic_filter` (or a filter with a selector)
        matches a topic that is not in FIFO order (router/order/modes.py): a subscription across
        several topics gets each publisher's messages in the order it published them, and no order
        across topics; a causal or total order is a promise about one topic's (or group's)
        subscribers, which this version does not extend to a wildcard subscription, nor to one that
        skips messages (docs/promises.md, "Topics and wildcards"). A selector that does not parse
        raises `InvalidAddress` (amqp:invalid-field) with the reason."""
        if selector:
            self.selector_of(selector)
            if self.orders and topic_filter in self.orders:
                raise errors.NotImplementedMode(
                    f"topic {topic_filter!r} is in {self.orders[topic_filter].name} order: a subscription with a "
                    f"selector may only be to FIFO topics")
        if not self.orders or not is_wildcard(topic_filter):
            return
        clash = sorted(t for t in self.orders if matches(topic_filter, t))
        if clash:
            named = ", ".join(f"{t} ({self.orders[t].name})" for t in clash[:5])
            more = f" and {len(clash) - 5} more" if len(clash) > 5 else ""
            raise errors.NotImplementedMode(
                f"filter {topic_filter!r} matches topics in an order other than FIFO: {named}{more}; a "
                f"wildcard subscription may only match FIFO topics (subscribe to those topics by name)")

    def selector_of(self, text: str) -> Selector:
        """The parsed selector `text` (parsed once per text; `InvalidAddress` with the reason when it
        does not parse)."""
        sel = self._selectors.get(text)
        if sel is None:
            try:
                sel = parse_selector(text)
            except SelectorError as exc:
                raise errors.InvalidAddress(f"selector {text[:200]!r}: {exc}") from None
            if len(self._selectors) > 10_000:
                self._selectors.clear()
            self._selectors[text] = sel
        return sel

    def _select(self, live: Iterable[Subscription], payload: bytes) -> tuple[Subscription, ...] | None:
        """Of the subscriptions `live`, those a message with `payload` is owed to, when a selector
        of one of them turns it away (None: every one is owed it). The message's fields are read
        once, and only when a subscription with a selector is among them."""
        fields: dict[str, object] | None = None
        out: list[Subscription] = []
        dropped = False
        for sub in live:
            if sub.selector:
                if fields is None:
                    fields = message_fields(payload)
                if not self.selector_of(sub.selector).matches(fields):
                    dropped = True
                    continue
            out.append(sub)
        return tuple(out) if dropped else None

    def attach(self, link: Any, att: SubscriberAttach, now: float) -> bool:
        """`attach_subscriber` with what the ATTACH asked for. Returns True when it resumed."""
        return self.attach_subscriber(link, att.sid, att.topic, att.container, att.link_name, att.expiry,
                                      att.capable, att.presented, now, att.epoch, att.handed_last, att.owner,
                                      att.selector, att.member, att.member_name)

    def resume_refused(self, link: Any, att: SubscriberAttach, now: float, reason: str | None = None) -> bool:
        """The mesh refused the attach of `att` here (`reason`: the refusal's). Returns True when
        the caller answers the ATTACH once the mesh acknowledged it again, False when it is refused.
        - The subscription's old home ended that life meanwhile: the link becomes the first link of
          a new life of the same identity (the old life is ended here too, and the same ATTACH is
          taken again, now as a new subscription).
        - The subscription belongs to another identity (its life holds it: `holding_life`; this
          claim was made before the other life's announcement came): the claim is refused, its link
          detached with amqp:unauthorized-access, and the life made here for it ends; it is never
          made a new life."""
        if refused_as_foreign(reason):
            rt = self.subs.get(att.sid)
            links = self._links_of(rt) if rt is not None else []
            if all(held is not link for _, held in links):
                return False  # (already taken from it: subscription_changed closed it)
            for lid, held in links:  # (a shared one: every member here attached to the life refused)
                self.out.append(DetachLink(lid, held, errors.UnauthorizedAccess.condition,
                                           f"subscription {att.sid} belongs to another identity; attach with the "
                                           f"credentials that made it"))
            assert rt is not None
            self._unbind(rt)
            sub = self.table.get(att.sid)
            if sub is not None and sub.live and sub.home == self.router_id and sub.owner == att.owner:
                self._end(att.sid, now, CLAIM_REFUSED)
            return False
        self.detach_subscriber(link, att.member or att.sid, True, now, clean=True)
        self.attach(link, att, now)
        return True

    def detach_subscriber(self, link: Any, sid: str, closed: bool, now: float, clean: bool = False) -> None:
        """The subscriber's link detached (`closed`: unsubscribe) or its connection dropped.
        Ignored when `link` is no longer the subscription's link (it was stolen by a newer one).
        `clean`: the link detached (an AMQP detach came: every disposition its client sent came
        before it), not its connection dropped. `sid` may be a shared subscription's member."""
        if self.member_sid and sid in self.member_sid:
            self._member_left(link, sid, closed, clean, now)
            return
        rt = self.subs.get(sid)
        sub = self.table.get(sid)
        if rt is None or sub is None or not sub.live or rt.link != link:
            return
        self._unbind(rt)
        self._link_gone(sub, closed, now)

    def _link_gone(self, sub: Subscription, closed: bool, now: float) -> None:
        """The last link of live subscription `sub` homed here went: it ends (`closed`: unsubscribed;
        not durable) or is suspended."""
        sid = sub.sid
        if closed:
            self._end(sid, now, "unsubscribed")
        elif sub.expiry <= 0:
            self._end(sid, now, "detached-not-durable")
        else:
            self.table.suspend(sid, now)
            self.log.append(("suspended", None, sub.topic, sid, None))
            self.out.append(Announce(sid))

    def _refuse_member(self, sid: str, rt: SubRuntime | None, selector: str) -> None:
        """Raise when a member may not join shared subscription `sid` here: its home is another
        router this one reaches (`LinkRedirect`: members attach at its home; it moves only when its
        home is down or cut off), or its attached members have another selector
        (`PreconditionFailed`: one subscription, one selector)."""
        sub = self.table.get(sid)
        if not self.ready and (sub is None or not sub.live or sub.home != self.router_id):
            # (a router that has not synced its table with the mesh yet cannot know where its home is,
            # nor which members it had: the members' acceptances are known there)
            raise errors.LinkRedirect(
                f"router {self.router_id} has not synced its subscription table with the mesh yet: a member of "
                f"shared subscription {sid} attaches again in a moment, here or at another router")
        if sub is None or not sub.live:
            return
        seen = self.last_seen.get(sub.home, self._born if self._born is not None else self._now)
        if sub.home != self.router_id and sub.home not in self.reachable and self.mesh_size > 1 \
                and self._now - seen < 2 * self.cfg.shared_lease:
            # (its home may still hand it, cut off from us, until its lease runs out: `lease_held`)
            raise errors.LinkRedirect(
                f"shared subscription {sub.link!r} ({sid}) has its home at router {sub.home}, last heard of "
                f"{self._now - seen:.1f} s ago: attach there, or here again once it has been gone "
                f"{2 * self.cfg.shared_lease:g} s (shared_lease)")
        if sub.home != self.router_id and sub.home in self.reachable:
            # (suspended there too: what its members accepted there is known there, and only there):
            # relayed there by this router (interrouter/members.py), or redirected
            raise errors.RelayMember(sub.home,
                f"shared subscription {sub.link!r} ({sid}) has its home at router {sub.home}: attach there (the "
                f"members of a shared subscription attach at its home; it moves to another router only when "
                f"that one is down or cut off)")
        if sub.selector != selector and rt is not None and rt.group is not None and rt.group.attached():
            raise errors.PreconditionFailed(
                f"shared subscription {sub.link!r} has selector {sub.selector!r} and members attached with it; a "
                f"member must attach with the same selector")

    def _join(self, rt: SubRuntime, mid: str, name: str, link: Any, capable: bool) -> None:
        """Member `mid` (link `name`) attached to shared subscription `rt`. A member that comes
        back (its connection dropped, or this link took its place) gives back what it held: what
        it presents is counted accepted by the caller, the rest goes to any member."""
        grp = rt.group
        if grp is None:
            grp = rt.group = Group(rt.sid)
        if self.groups.get(rt.sid) is not rt:
            self.groups[rt.sid] = rt
        old = grp.members.get(mid)
        if old is not None:
            self._give_back(rt, old, keep_accepted=False)  # (it presents what it holds: held again below)
        grp.members[mid] = Member(mid, name, link)
        if capable:
            grp.capable.add(mid)
        else:
            grp.capable.discard(mid)
            grp.notify.pop(mid, None)
        self.member_sid[mid] = rt.sid
        rt.link = grp
        rt.capable = False  # (its members are told nothing of FINALs: several links, one subscription)
        rt.credit = grp.credit()

    def _await_former(self, rt: SubRuntime, sub: Subscription, mid: str, now: float) -> None:
        """Member `mid` joined shared subscription `rt` (table entry `sub`). Members the entry lists
        that this runtime never had were attached at its previous home, or here before a restart:
        what they accepted there may not be known here, so nothing is handed until each came back
        and presented it, or `shared_member_grace` passed. Then the entry lists the members."""
        grp = rt.group
        assert grp is not None
        former = {m for m in sub.members if m not in grp.members and m not in grp.awaiting}
        if former:
            grp.awaiting |= former
            grp.hold_until = now + self.cfg.shared_member_grace
        grp.awaiting.discard(mid)
        self.table.set_members(rt.sid, grp.listed())

    def _members_changed(self, rt: SubRuntime) -> None:
        """Tell the mesh the members of shared subscription `rt` when they changed."""
        grp = rt.group
        if grp is not None and self.table.set_members(rt.sid, grp.listed()):
            self.out.append(Announce(rt.sid))

    def _presented_by_member(self, rt: SubRuntime, mid: str, presented: set[str]) -> None:
        """Member `mid` presented `presented` (accepted, settlement not seen): those final already
        are told it (`rt.notify`, filled by the attach, is the member's); the others are held by
        it, so that their FINAL reaches it (`_member_final`)."""
        grp = rt.group
        assert grp is not None
        if rt.notify:
            if mid in grp.capable:
                grp.notify.setdefault(mid, []).extend(rt.notify)
            rt.notify.clear()
        m = grp.members[mid]
        for gid in presented:
            if gid in self.records or gid in self.placeholders:
                grp.holder[gid] = mid
                m.held.add(gid)

    def _member_final(self, rt: SubRuntime, gid: str) -> None:
        """`gid`, accepted by a member of shared subscription `rt` whose settlement it did not see on
        a link, is final: the member that holds it is told when it has credit (ours only)."""
        grp = rt.group
        assert grp is not None
        mid = self._settle_in_group(rt, gid)
        if mid and mid in grp.capable and mid in grp.members:  # (a member that left: until it held nothing)
            grp.notify.setdefault(mid, []).append(gid)
            if rt.link is not None:
                self._pump(rt)

    def _notify_members(self, rt: SubRuntime, grp: Group) -> None:
        """Tell attached members with credit the final ids they wait for (`Group.notify`)."""
        batch = self.cfg.final_notify_batch
        for m in grp.attached():
            ids = grp.notify.get(m.mid)
            while ids and m.credit > 0:
                chunk = tuple(ids[:batch])
                del ids[:batch]
                self.out.append(NotifyFinal(m.mid, chunk))
                m.credit -= 1
                rt.credit -= 1
            if ids is not None and not ids:
                del grp.notify[m.mid]

    def _give_back(self, rt: SubRuntime, m: Member, keep_accepted: bool = True) -> None:
        """Member `m` leaves shared subscription `rt`: what it was handed and did not accept goes back
        to the subscription's queue, for any member. What it accepted and is not final yet it keeps
        (`keep_accepted`): it stays listed in the table, without a link, until that is final, so
        that a new home of the subscription waits for it (`_await_former`), and learns of it when it
        comes back."""
        grp = rt.group
        assert grp is not None
        self.member_sid.pop(m.mid, None)
        held = grp.let_go(m)
        if not held:
            return
        sid = rt.sid
        kept: set[str] = set()
        for gid in held:
            rt.on_link.discard(gid)
            rec = self.records.get(gid)
            st = rec.owed.get(sid) if rec is not None else None
            if st is S_SENT:
                assert rec is not None
                self.book.move(rec, sid, S_QUEUED)
                rt.resend.add(gid)
                self.log.append(("released", gid, rec.topic, sid, f"member={m.name} left"))
            elif st is S_ACCEPTED or (rec is None and gid in self.placeholders):
                kept.add(gid)
        if kept and keep_accepted:
            gone = grp.members[m.mid] = Member(m.mid, m.name, None)
            gone.held = kept
            for gid in kept:
                grp.holder[gid] = m.mid
        if rt.link is not None:
            rt.queue = deque(rt.owed)  # (the pump skips what is not QUEUED)

    def _settle_in_group(self, rt: SubRuntime, gid: str) -> str:
        """`gid` is settled for shared subscription `rt`: the member that held it (`Group.settled`); a
        member that left and held nothing more leaves the table's list."""
        grp = rt.group
        assert grp is not None
        mid = grp.settled(gid)
        m = grp.members.get(mid) if mid else None
        if m is not None and m.link is None and m.dropped is None and not m.held:
            del grp.members[mid]
            grp.notify.pop(mid, None)
            self._members_changed(rt)
        return mid

    def _member_left(self, link: Any, mid: str, closed: bool, clean: bool, now: float) -> None:
        """A member link of a shared subscription detached (`clean`) or its connection dropped.
        When it was the last member attached, the subscription is detached as a plain one is."""
        m, rt = self._member(mid)
        if m is None or rt is None or m.link is not link:
            return
        grp = rt.group
        assert grp is not None
        if clean:
            self._give_back(rt, m)
            self._members_changed(rt)
        else:  # in doubt: what it holds waits for it (`shared_member_grace`)
            m.link = None
            m.credit = 0
            m.drain = False
            m.dropped = now
            for gid in m.held:
                rt.on_link.discard(gid)
        if grp.attached():
            rt.credit = grp.credit()
            self._pump(rt)
            return
        rt.link = None
        rt.credit = 0
        rt.queue.clear()
        sub = self.table.get(rt.sid)
        if sub is not None and sub.live and sub.home == self.router_id:
            self._link_gone(sub, closed, now)

    def _give_up_members(self, now: float) -> None:
        """Members that dropped and did not come back within `shared_member_grace`: what they held
        goes to the other members."""
        grace = self.cfg.shared_member_grace
        for rt in list(self.groups.values()):
            grp = rt.group
            if grp is None:
                continue
            gone = grp.given_up(now, grace)
            for m in gone:
                self._give_back(rt, m)
            hold_over = bool(grp.awaiting) and now >= grp.hold_until  # (awaited members given up alike)
            if hold_over:
                grp.awaiting.clear()
            if gone or hold_over:
                self._members_changed(rt)
                if rt.link is not None:
                    self._pump(rt)

    def _links_of(self, rt: SubRuntime) -> list[tuple[str, Any]]:
        """(id, link) of each link attached to `rt`: its link, or its members' (a shared one)."""
        grp = rt.group
        if grp is None:
            return [(rt.sid, rt.link)] if rt.link is not None else []
        return [(m.mid, m.link) for m in grp.members.values() if m.link is not None]

    def _forget_group(self, rt: SubRuntime) -> None:
        grp = rt.group
        if grp is None:
            return
        for mid in grp.members:
            self.member_sid.pop(mid, None)
        grp.members.clear()
        grp.holder.clear()
        if self.groups.get(rt.sid) is rt:
            del self.groups[rt.sid]

    def _unbind(self, rt: SubRuntime) -> None:
        """Forget the current link: what was SENT on it is in doubt and will be redelivered. (A
        shared subscription: every member's, and what members that dropped held.)"""
        if rt.group is not None:
            for m in rt.group.members.values():
                rt.on_link.update(m.held)
            self._forget_group(rt)
        rt.link = None
        rt.credit = 0
        if rt.notify:  # not told yet: tell it when it resumes and presents them
            rt.final_unnotified.update(rt.notify)
            rt.notify.clear()
        for gid in rt.on_link:
            rec = self.records.get(gid)
            if rec is not None and rec.owed.get(rt.sid) is S_SENT:
                self.book.move(rec, rt.sid, S_QUEUED)
                rt.resend.add(gid)
        rt.on_link.clear()
        rt.queue.clear()

    def _end(self, sid: str, now: float, reason: str) -> None:
        """End a subscription homed here (unsubscribe, not durable, expiry)."""
        sub = self.table.end(sid, now, reason)
        if sub is not None:
            # a refused claim's life is not the subscription's: its end is no end of the owner's
            # life in the logs (`claim_refused`, which the reconciliation's lives do not read)
            event = "unsubscribed" if reason in ("unsubscribed", SELECTOR_CHANGED) else \
                "claim_refused" if reason == CLAIM_REFUSED else "expired"
            self.log.append((event, None, sub.topic, sid, reason))
            self.out.append(Announce(sid))
        self._ended(sid, now, reason)

    def _ended(self, sid: str, now: float, reason: str) -> None:
        rt = self.subs.pop(sid, None)
        if rt is not None and rt.group is not None:
            self._forget_group(rt)
        for gid, phs in list(self.placeholders.items()):
            if phs.pop(sid, None) is not None and not phs:
                del self.placeholders[gid]
        for rec in list(self.remote_pending.pop(sid, {}).values()):
            self._resolve(rec, sid, S_ENDED, None, now, reason)
        if rt is None:
            return
        for rec in list(rt.owed.values()):
            self._resolve(rec, sid, S_ENDED, None, now, reason)

    def subscriber_credit(self, sid: str, credit: int, drain: bool = False) -> None:
        """The subscription's link has `credit` (the adapter's count); `drain`: its client asked to
        drain (a pull consumer): what cannot be sent now uses up the credit (`DrainCredit`), here
        or whenever its queue empties later."""
        rt = self.subs.get(sid)
        if rt is None:
            m, rt = self._member(sid)
            if m is None or rt is None or m.link is None:
                return
            m.credit = credit
            m.drain = drain
            rt.credit = rt.group.credit() if rt.group is not None else 0
            self._pump(rt)
            return
        if rt.link is None:
            return
        rt.credit = credit
        rt.drain = drain
        self._pump(rt)

    def _member(self, mid: str) -> tuple[Member | None, SubRuntime | None]:
        """The member `mid` of a shared subscription homed here, and that subscription's runtime."""
        g = self.member_sid.get(mid) if self.member_sid else None
        rt = self.subs.get(g) if g is not None else None
        if rt is None or rt.group is None:
            return None, None
        return rt.group.members.get(mid), rt

    def hold_handovers(self) -> None:
        """Hand nothing to a subscriber's link until `release_handovers` (what would have gone waits,
        QUEUED, as if the link had no credit)."""
        self.hold_pumps = True

    def release_handovers(self) -> None:
        """Hand over what waited while held, to the subscriptions still attached here."""
        self.hold_pumps = False
        held, self._held_pumps = self._held_pumps, {}
        for sid, rt in held.items():
            if self.subs.get(sid) is rt and rt.link is not None:
                self._pump(rt)

    def _pump(self, rt: SubRuntime) -> None:
        if self.hold_pumps:
            self._held_pumps[rt.sid] = rt
            return
        if rt.notify and rt.credit > 0:
            batch = self.cfg.final_notify_batch
            while rt.notify and rt.credit > 0:
                chunk, rt.notify = tuple(rt.notify[:batch]), rt.notify[batch:]
                self.out.append(NotifyFinal(rt.sid, chunk))
                rt.credit -= 1
        q = rt.queue
        sid = rt.sid
        order = self._order_of(sid) if self.orders else self.fifo
        may_hand = order.may_hand
        handed = order.handed if order.watches else None
        parked: list[str] | None = None
        late: list[tuple[Verdict, Record]] | None = None
        blocked = False
        book = self.book
        out = self.out
        log = self.log
        wild = rt.wild
        grp = rt.group
        if grp is not None:
            if grp.notify and rt.credit > 0:
                self._notify_members(rt, grp)
            if grp.awaiting or not self.lease_held(self._now):
                return  # (members of its previous home awaited: `_await_former`; or cut off: the lease)
        while q and rt.credit > 0:
            gid = q.popleft()
            rec = rt.owed.get(gid)
            if rec is None or rec.owed.get(sid) is not S_QUEUED:
                continue
            reds = rec.redeliveries
            redelivery = reds is not None and sid in reds
            verdict = may_hand(rt, rec, redelivery)
            if verdict is None:
                # (`_send`, inlined: once per message)
                book.sent(rec, sid)
                rt.on_link.add(gid)
                rt.credit -= 1
                if rt.resend:
                    rt.resend.discard(gid)
                if grp is None:
                    out.append(Deliver(sid, gid, rec.payload if not wild else with_to(rec.payload, rec.topic),
                                       redelivery))
                    log.append(("delivered", gid, rec.topic, sid, "redelivery" if redelivery else None))
                else:
                    self._hand_member(rt, grp, rec, redelivery)
                if handed is not None:
                    handed(rt, rec)
            elif verdict is PARK:
                if parked is None:
                    parked = []
                parked.append(gid)
            elif verdict is BLOCK:
                q.appendleft(gid)
                blocked = True
                break
            elif verdict is not SKIP:  # late: handing it now would break the order (after the walk)
                if late is None:
                    late = []
                late.append((verdict, rec))
        if parked:
            q.extendleft(reversed(parked))  # kept in order; tick() pumps again
        if late:
            if len(late) > 1:
                late.sort(key=lambda vr: vr[0].rank)  # (stable: each kind in the order found)
            for verdict, rec in late:
                self._resolve(rec, sid, S_ENDED, None, self._now, verdict.why)
        if order.walks and not blocked:
            order.after_queue(rt)
        if rt.drain and rt.credit > 0 and not q and not rt.notify:
            rt.credit = 0
            self.out.append(DrainCredit(sid))
        elif grp is not None and not q and rt.credit > 0:
            for m in grp.attached():  # members that asked to drain: what cannot go now uses up their credit
                if m.drain and m.credit > 0:
                    rt.credit -= m.credit
                    m.credit = 0
                    self.out.append(DrainCredit(m.mid))

    def _hand_member(self, rt: SubRuntime, grp: Group, rec: Record, redelivery: bool) -> None:
        """Hand `rec` (SENT already) to the next member of shared subscription `rt` with credit."""
        mid = grp.hand(rec.gid)
        m = grp.members[mid]
        self.out.append(Deliver(mid, rec.gid, rec.payload if not rt.wild else with_to(rec.payload, rec.topic),
                                redelivery))
        self.log.append(("delivered", rec.gid, rec.topic, grp.sid,
                         f"redelivery member={m.name}" if redelivery else f"member={m.name}"))

    def _send(self, rt: SubRuntime, rec: Record, redelivery: bool) -> None:
        """Hand `rec` (QUEUED for `rt`: the callers check it) to the subscription's link."""
        gid = rec.gid
        sid = rt.sid
        self.book.sent(rec, sid)
        rt.on_link.add(gid)
        rt.credit -= 1
        if rt.resend:
            rt.resend.discard(gid)
        if rt.group is not None:
            self._hand_member(rt, rt.group, rec, redelivery)
            return
        self.out.append(Deliver(sid, gid, rec.payload if not rt.wild else with_to(rec.payload, rec.topic), redelivery))
        self.log.append(("delivered", gid, rec.topic, sid, "redelivery" if redelivery else None))

    def _order_of(self, sid: str) -> OrderPolicy:
        """The order policy of subscription `sid`'s topic."""
        if not self.orders:
            return self.fifo
        sub = self.table.get(sid)
        return self.fifo if sub is None else self.orders.get(sub.topic, self.fifo)

    def subscriber_outcomes(self, sid: str, items: Sequence[str | OutcomeItem], now: float) -> None:
        """A pass's dispositions of subscription `sid`'s current link, in the order they came, in
        one call: each item is what `subscriber_outcome` takes, `(gid, outcome, settled, error,
        undeliverable)`, or the gid alone for the usual one (ACCEPTED, not settled). The same as a
        `subscriber_outcome` call per item, in order (tests/unit/test_outcomes_batch.py holds the
        two equal); the usual item is taken without that call."""
        rt = self.subs.get(sid)
        if rt is None:  # (a member of a shared subscription: item by item)
            for item in items:
                if type(item) is str:
                    self.subscriber_outcome(sid, item, O_ACCEPTED, False, None, False, now)
                else:
                    self.subscriber_outcome(sid, *cast(OutcomeItem, item), now)
            return
        self._now = now
        owed = rt.owed
        resolve = self._resolve
        for item in items:
            if type(item) is str:  # (`subscriber_outcome`'s first case, inlined)
                rec = owed.get(item)
                if rec is not None:
                    resolve(rec, sid, S_ACCEPTED, None, now, None)
            else:
                self.subscriber_outcome(sid, *cast(OutcomeItem, item), now)

    def subscriber_outcome(self, sid: str, gid: str, outcome: Outcome, settled: bool,
                           error: tuple[str, str] | None, undeliverable: bool, now: float) -> None:
        """A subscriber's disposition for the delivery of `gid` on its current link."""
        self._now = now
        rt = self.subs.get(sid)
        why: str | None = None
        if rt is None:  # a member of a shared subscription? (router/groups.py)
            m, rt = self._member(sid)
            if m is None or rt is None or gid not in m.held:
                return
            assert rt.group is not None
            sid = rt.sid
            why = f"member={m.name}"
            if settled or outcome in (O_RELEASED, O_MODIFIED):
                rt.group.settled(gid)
        rec = rt.owed.get(gid)
        if outcome is O_ACCEPTED and not settled:  # (the usual: one test instead of three)
            if rec is not None:
                self._resolve(rec, sid, S_ACCEPTED, None, now, why)
            return
        if settled or outcome in (O_RELEASED, O_MODIFIED):
            rt.on_link.discard(gid)  # the adapter settled the delivery: it is no longer on the link
        if rec is None:
            return  # already resolved (e.g. presented on resume, or a duplicate disposition)
        if outcome is O_ACCEPTED:
            self._resolve(rec, sid, S_ACCEPTED, None, now, why)
        elif outcome is O_REJECTED:
            self._resolve(rec, sid, S_REJECTED, error, now, why)
        elif outcome is O_MODIFIED and undeliverable:
            self._resolve(rec, sid, S_REJECTED, (errors.UNDELIVERABLE, "subscriber: undeliverable here"),
                          now, why)
        else:
            reds = rec.redeliveries
            if reds is None:
                reds = rec.redeliveries = {}
            n = reds.get(sid, 0) + 1
            reds[sid] = n
            self.log.append(("released" if outcome is O_RELEASED else "modified", gid, rec.topic,
                             sid, {"count": n}))
            if n > self.cfg.max_redeliveries:
                self._resolve(rec, sid, S_REJECTED, (
                    errors.DELIVERY_LIMIT,
                    f"released or modified {n - 1} times (limit {self.cfg.max_redeliveries})"), now, None)
            else:
                self.book.move(rec, sid, S_QUEUED)
                if rt.link is not None:
                    rt.queue.appendleft(gid)
                    self._pump(rt)

    def _resolve(self, rec: Record, sid: str, st: S, error: tuple[str, str] | None, now: float,
                 why: str | None) -> None:
        if not self.book.resolve(rec, sid, st):
            return  # not owed, or resolved already
        gid = rec.gid
        rt = self.subs.get(sid)
        if rt is not None:
            rt.owed.pop(gid, None)
            if rt.resend:
                rt.resend.discard(gid)
        else:
            pend = self.remote_pending.get(sid)
            if pend is not None:
                pend.pop(rec.gid, None)
                if not pend:
                    del self.remote_pending[sid]
        if st is S_REJECTED:
            if rec.rejected_by is None:
                rec.rejected_by = []
            rec.rejected_by.append((sid, error))
        if st is S_ENDED:
            self.log.append(("ended", gid, rec.topic, sid, why))
        else:
            self.log.append((_EVENT_OF[st], gid, rec.topic, sid, why or (list(error) if error else None)))
        if rt is not None and rec.origins:
            for origin in rec.origins:  # tell every origin that sent us a copy
                self.out.append(SendAck(origin, gid, sid, int(st), error))
        if rec.pending == 0:
            if rec.origin is not None or rec.outcome is None:
                self._decide(rec, now)
            elif rec.payload:  # decided already (another origin's copy added this one): done again
                self.book.free_payload(rec)

    # ================================================================ credit
    def _grant(self, pl: PubLink) -> bool:
        """Top up `pl`'s credit as far as the budget allows. True when no room is left for anyone."""
        want = self.cfg.link_credit - pl.outstanding
        if want <= 0 or pl.token not in self.pub_links:
            return False
        book = self.book
        room = self.cfg.max_inflight_messages - book.undecided - self.reserved_credit
        if len(book.by_gid) >= self.cfg.max_decided_records + self.cfg.max_inflight_messages:
            room = 0
        if not self.ready or not self.log_writable or self.draining \
                or book.inflight_bytes >= self.cfg.max_inflight_bytes:
            room = 0
        n = min(want, room)
        if n > 0:
            pl.outstanding += n
            self.reserved_credit += n
            self.out.append(GrantCredit(pl.token, n))
        if n < want and not pl.blocked:
            pl.blocked = True
            self._blocked.append(pl)
        return room <= n

    def _unblock(self) -> None:
        """Room was freed: top up links that were short of credit, oldest first. Once no room is
        left the rest stay blocked as they are, in order: asking each would give nothing, and a
        connection of a thousand blocked links closing asked every one of them at each link's
        detach (~a million calls: seconds of the loop; common/passrules.py, rule 5)."""
        if not self._blocked:
            return
        blocked, self._blocked = self._blocked, deque()
        while blocked:
            pl = blocked.popleft()
            pl.blocked = False
            if pl.token in self.pub_links and self._grant(pl):
                break
        self._blocked.extend(blocked)

    def set_ready(self, ready: bool) -> None:
        self.ready = ready
        if ready:
            self._unblock()

    def set_draining(self) -> None:
        """The router drains (it will exit): publishers get no more credit here; what they send with
        the credit they hold is handled as ever. There is no way back: a drain ends in an exit."""
        self.draining = True

    def set_log_writable(self, writable: bool) -> None:
        """The settlement log can(not) be written: no publisher credit while it cannot, so that
        nothing is accepted without its evidence; credit flows again once it can."""
        self.log_writable = writable
        if writable:
            self._unblock()

    # ================================================================ subscriptions that move, placeholders
    def _absorb_placeholders(self, rec: Record) -> None:
        """Subscriptions here whose clients presented this gid hold it: it counts as accepted by them
        (never handed again), and the record's FINAL will reach them."""
        held = self.placeholders.pop(rec.gid, None)
        if not held:
            return
        for sid in held:
            if self._local(self.table.get(sid)) and rec.owed.get(sid) not in RESOLVED:
                if rec.owed.get(sid) in (S_QUEUED, S_SENT):
                    self._resolve(rec, sid, S_ACCEPTED, None, rec.created, "placeholder")
                else:
                    self.book.move(rec, sid, S_ACCEPTED)
                    self.log.append(("accepted", rec.gid, rec.topic, sid, "placeholder"))

    def _settled_by_local_publisher(self, gid: str) -> bool:
        """Its publisher is attached here and declared it no longer in doubt: it settled it. (The
        newest attach of its link, and only if it declared what it held in doubt: our clients; or
        the declaration made for it here, `publisher_gone`.)"""
        pl = self.newest_link.get(plid_of(gid))
        return pl is not None and pl.declared is not None and declared_settled(pl.declared, pl.mark, gid)

    def set_reachable(self, reachable: dict[str, str], now: float) -> None:
        """The live graph changed: `reachable` maps every router we can reach to its incarnation.
        Pending copies are sent again (some may have been lost with a link or a router)."""
        self._now = now
        self._note_reach(now, reachable)
        if reachable == self.reachable:
            return
        self.reachable = dict(reachable)
        self.meshside.reroute(force=True)

    def _note_reach(self, now: float, reachable: Mapping[str, str]) -> None:
        if self._born is None:
            self._born = now
        for r in reachable:
            self.last_seen[r] = now
        if 2 * len(reachable) > self.mesh_size:  # (a majority: one side of a partition at most)
            regained = not self.lease_held(now)
            self.last_whole = now
            if regained and self.groups:  # what waited for the lease goes on (`_pump` held it)
                for rt in list(self.groups.values()):
                    if rt.link is not None and rt.queue:
                        self._pump(rt)

    def lease_held(self, now: float) -> bool:
        """May this router hand shared subscriptions' messages now? Only while it reached a majority
        of the mesh within `shared_lease` (a router cut off longer may have been replaced as home)."""
        return self.mesh_size <= 1 or now - self.last_whole <= self.cfg.shared_lease

    def subscription_changed(self, old: Subscription, now: float) -> None:
        """Another router's announcement changed the table entry of `old.sid` (now in the table)."""
        self._now = now
        sid = old.sid
        new = self.table.get(sid)
        assert new is not None
        me = self.router_id
        was_here = old.live and old.home == me
        if not new.live:
            if was_here:
                rt = self.subs.get(sid)
                if rt is not None and rt.link is not None:
                    for lid, link in self._links_of(rt):
                        if foreign(old, new):
                            self.out.append(_refusal(lid, link, new))
                        else:
                            self.out.append(DetachLink(lid, link, errors.LinkStolen.condition,
                                                       "the subscription was ended elsewhere"))
                    self._unbind(rt)
            self._ended(sid, now, new.end_reason or "ended")
            return
        if was_here and new.home != me and self._claim_again(old, new):
            self.table.reclaim(old, me, self.incarnation, now)
            self.stats_reclaimed += 1
            self.out.append(Announce(sid))  # (its own announcement: every router merges it as a resume here)
        elif was_here and new.home != me:
            self._moved_away(sid, new, now, foreign(old, new))
        elif not was_here and new.home == me:
            self._moved_here(sid)
        elif new.home != me and (old.home != new.home or not old.live or old.epoch != new.epoch):
            # it (re)attached: its home may have dropped what it held for it, send it again
            self.meshside.forget_routing(sid)
            self.meshside.reroute(force=False, sids=[sid])

    def _claim_again(self, mine: Subscription, won: Subscription) -> bool:
        """A claim of another router (`won`) beat ours (`mine`) in the merge. True when we hold the
        subscription's live link and that claim is not backed by one, so that the live link keeps it
        (we claim again, above it) rather than being closed for a claim the client no longer uses:
        - it is suspended at its home (the client left it; our link is the newer attach), or
        - it is active, made by an earlier incarnation of its home (a restarted router has no links;
          a third router that had not heard of the restart passed it on), or
        - it is active at a router we cannot reach, at our epoch: a concurrent claim we cannot
          check (two routers that did not hear of each other resumed it from the same entry).
        An active claim of its home's current incarnation wins as before (the newest attach wins:
        a router that knew ours claims above it), and so does anything of another life or owner."""
        rt = self.subs.get(mine.sid)
        if rt is None or rt.link is None or not won.live:
            return False
        if won.created != mine.created or won.owner != mine.owner:
            return False
        if won.state is SubState.SUSPENDED:
            return True
        home_inc = self.reachable.get(won.home)
        if home_inc is None:
            return won.epoch == mine.epoch
        return bool(won.inc) and bool(home_inc) and won.inc != home_inc

    def presented_elsewhere(self, sid: str, gids: Iterable[str], home: str, now: float) -> None:
        """Subscription `sid` (re)attached at router `home` presenting ids its client holds: as their
        origin we count them accepted, and the FINAL must reach `home`."""
        for gid in gids:
            rec = self.records.get(gid)
            if rec is not None and rec.origin is None:
                if rec.holders is None:
                    rec.holders = set()
                rec.holders.add(home)
                st = rec.owed.get(sid)
                if st is S_QUEUED or st is S_SENT:
                    self._resolve(rec, sid, S_ACCEPTED, None, now, "presented")
                elif st is None:
                    self.book.move(rec, sid, S_ACCEPTED)
            elif rec is None and self.is_final(gid):
                self.out.append(SendFinal(home, gid))

    def _moved_here(self, sid: str) -> None:
        """A subscription is homed here now: what origin records owed it remotely becomes local."""
        rt = self.subs.get(sid)
        if rt is None:
            rt = self.subs[sid] = SubRuntime(sid)
        rt.arrived_at = self._now
        for gid, rec in sorted(self.remote_pending.pop(sid, {}).items(), key=lambda kv: kv[1].created):
            rt.owed[gid] = rec
            if rec.owed.get(sid) is S_SENT:
                self.book.move(rec, sid, S_QUEUED)
            if rt.link is not None:
                rt.queue.append(gid)

    def _moved_away(self, sid: str, new: Subscription, now: float, other: bool = False) -> None:
        """A subscription homed here resumed at another router (`other`: it is another identity's
        life that holds it, made first: our link's claim is refused, not stolen)."""
        rt = self.subs.pop(sid, None)
        for gid, phs in list(self.placeholders.items()):  # its new home keeps its own placeholders
            if phs.pop(sid, None) is not None and not phs:
                del self.placeholders[gid]
        if rt is None:
            return
        if rt.link is not None:
            for lid, link in self._links_of(rt):
                self.out.append(_refusal(lid, link, new) if other else DetachLink(
                    lid, link, errors.LinkStolen.condition, f"the subscription resumed at router {new.home}"))
        self._unbind(rt)  # (a shared one's members that dropped too)
        for gid, rec in list(rt.owed.items()):
            if rec.origin is None:  # ours: it is remote now, send it to the new home
                if rec.owed.get(sid) is S_SENT:
                    self.book.move(rec, sid, S_QUEUED)
                self.remote_pending.setdefault(sid, {})[gid] = rec
            else:  # a destination copy: drop our part; its origin re-routes it
                self.book.move(rec, sid, None)
                if rec.pending == 0:
                    self._decide(rec, now)
        self.meshside.forget_routing(sid)
        self.meshside.reroute(force=False, sids=[sid])

    def _publisher_declared(self, plid: str, in_doubt: set[str], mark: int | None, now: float) -> None:
        """One of our publishers re-attached and listed what it still holds in doubt: everything
        else of that link that we hold and it had published by then is settled on its side (it will
        never be resent)."""
        for rec in [r for r in self.records.values()
                    if r.plid == plid and r.origin is None and declared_settled(in_doubt, mark, r.gid)]:
            if not rec.pubs:  # it settled it (here, the settlement lost with its link, or elsewhere)
                self.meshside.handle_final(rec.gid, now)
        for gid in [g for g in self.placeholders if plid_of(g) == plid and declared_settled(in_doubt, mark, g)]:
            if gid not in self.records:
                self._placeholder_final(gid)

    def _placeholder_final(self, gid: str) -> None:
        for sid in self.placeholders.pop(gid, {}):
            rt = self.subs.get(sid)
            if rt is None:
                sub = self.table.get(sid)
                if sub is not None and sub.live and sub.home != self.router_id:
                    self.out.append(SendFinal(sub.home, gid))  # it moved on: the FINAL follows it
                continue
            if rt.group is not None:
                self._member_final(rt, gid)
            elif rt.link is not None and rt.capable:
                rt.notify.append(gid)
                self._pump(rt)
            else:
                rt.final_unnotified.add(gid)
            self.log.append(("placeholder_final", gid, None, sid, None))

    # ---- for the mesh layer (interrouter/node.py): one input that configures the core for the mesh,
    # and queries that read without writing (tests/unit/test_mesh_seam.py holds the list; the
    # others are the mesh side's, router/meshside.py)
    def set_mesh(self, size: int, incarnation: str) -> None:
        """Input from the mesh layer when it starts: the topology has `size` routers (1: a router
        alone) and this life of the router is `incarnation` (the one its adapter gave the core, if
        it did: the router's), which claims in the subscription table and new identities carry."""
        self.incarnation = incarnation
        self.mesh_size = size

    def reachable_routers(self) -> Mapping[str, str]:
        """Router -> incarnation of every router this one reaches, itself included: what
        `set_reachable` was last told (read only)."""
        return self.reachable

    def subscriptions_reclaimed(self) -> int:
        """How many subscriptions this router claimed again for their live link here (a count that
        only grows: `subscription_changed` raised it when it changed)."""
        return self.stats_reclaimed

    def remember_final(self, gid: str, now: float) -> None:
        """`gid` is final (its record is not here): late copies and presenters learn it."""
        self.recent_final[gid] = now

    def _owe_here(self, rec: Record, sid: str) -> SubRuntime:
        """A new QUEUED part of `rec` for `sid`, homed here (a copy's: `MeshSide.receive_copy`)."""
        self.book.move(rec, sid, S_QUEUED)
        rt = self.subs[sid]
        rt.owed[rec.gid] = rec
        if rt.link is not None:
            rt.queue.append(rec.gid)
        return rt

    @property
    def driven_elsewhere(self) -> Mapping[str, str]:
        """Records of ours another router drives now (kept by `meshside`; a drain reads it)."""
        return self.meshside.driven_elsewhere

    # ================================================================ the mesh layer's doors to the total order
    def ordered(self, topic: str, n: int, key: str, now: float, pump: bool = True) -> None:
        """The mesh layer's number `n` of `topic` is `key` (total order: `TotalOrder.ordered`)."""
        self.total_order.ordered(topic, n, key, now, pump)

    def total_floor(self, topic: str, now: float) -> int:
        """The highest number of `topic` this router will not need again, so far (`TotalOrder.floor`)."""
        return self.total_order.floor(topic, now)

    def total_compact(self, topic: str, upto: int) -> Checkpoint:
        """Forget the numbers of `topic` up to `upto` (`TotalOrder.compact`)."""
        return self.total_order.compact(topic, upto)

    def total_restore(self, topic: str, cp: Checkpoint, now: float) -> None:
        """Go on from checkpoint `cp` (`TotalOrder.restore`)."""
        self.total_order.restore(topic, cp, now)

    def pump_topic(self, topic: str) -> None:
        """Hand what is ready to every subscription of `topic` homed here."""
        me = self.router_id
        for sub in self.table.live_for_topic(topic):
            if sub.home == me:
                rt = self.subs.get(sub.sid)
                if rt is not None and rt.link is not None and rt.credit > 0:
                    self._pump(rt)

    def _ask_everybody(self, gid: str) -> None:
        """Ask every other reachable router whether `gid` is final (a FINAL answers; silence does not)."""
        me = self.router_id
        for r in sorted(self.reachable):
            if r != me:
                self.out.append(SendQuery(r, gid))

    # ================================================================ housekeeping, and what readers see
    def tick(self, now: float, may_expire: bool = True) -> None:
        """Run the sweeps (router/sweeps.py). Expiry only when `may_expire` (in a mesh: while the
        whole mesh is reachable)."""
        self._now = now
        self._note_reach(now, self.reachable)
        self.sweeps.sweep(now, may_expire)
        if self.groups:
            self._give_up_members(now)

    def forget_older(self, now: float) -> None:
        """Forget what is older than `final_memory` (a sweep asks): who held a copy, the predecessors
        we waited for, records driven elsewhere that are gone, and finals (the oldest first; at most
        `final_memory_entries` remembered; router/finals.py)."""
        forget = now - self.cfg.final_memory
        self.meshside.forget_older(forget)
        self.handing.forget_awaited(forget)
        age_finals(self.recent_final, self.old_finals, now, self.cfg.final_memory, self.cfg.final_memory_young,
                   self.cfg.final_memory_entries)
        self.ids.forget(now)

    def drop_placeholder(self, gid: str) -> None:
        """Give up on the placeholders of `gid` (a sweep asks: past `placeholder_horizon`)."""
        self.placeholders.pop(gid, None)

    def stats(self) -> dict[str, int]:
        live = list(self.table.live())
        fifo, causal = cast(FifoOrder, self.fifo), self.causal_order
        return {
            "records": len(self.records), "undecided": self.undecided, "inflight_bytes": self.inflight_bytes,
            "destination_records": self.destination_records,
            "reserved_credit": self.reserved_credit, "subscriptions": len(live),
            "local_subscriptions": sum(1 for s in live if s.home == self.router_id),
            "active_subscriptions": sum(1 for s in live if s.state is SUB_ACTIVE),
            "placeholders": len(self.placeholders), "publisher_links": len(self.pub_links),
            "fifo_holds": fifo.held + causal.held, "fifo_awaited": len(self.handing.awaited),
            "causal_deps": causal.deps_given, "causal_clients": len(causal.pasts),
            "causal_cycles": fifo.cycles + causal.cycles,
            "finals_ignored": self.meshside.stats_final_ignored, "subscriptions_reclaimed": self.stats_reclaimed,
            "new_identities": self.ids.stats_new_identities, "finals_answered": self.ids.stats_finals_answered,
            "final_notes": len(self.ids.final_notes),
            "final_gids": len(self.recent_final) + self.old_finals.gids,
            "final_entries": len(self.recent_final) + len(self.old_finals),
            "total_holds": self.total_order.held, "total_late": self.total_order.late,
        }

    def snapshot(self, now: float, parts: Parts = NOTHING) -> CoreSnapshot:
        """What the status, /metrics and the management views see of the core, as of `now`: the
        parts asked for (router/snapshot.py). Made when a reader asks, never per message."""
        subs, pub_links, records = self.subs, self.pub_links, self.records
        return CoreSnapshot(
            now, self.ready, self.log_writable, len(self._blocked),
            counts=CoreCounts(**self.stats()) if parts.counts else None,
            topics=topic_rows(self.table, subs, self.router_id, pub_links.values(), records.values(), self.total,
                              self.causal) if parts.topics else None,
            publishers=publisher_rows(pub_links, self._blocked, parts.publishers) if parts.publishers else {},
            backlogs={sid: len(rt.owed) for sid in parts.subscribers if (rt := subs.get(sid)) is not None},
            subscriptions=subscription_page(self.table, subs, self.remote_pending, self.router_id,
                                            parts.subscriptions, now) if parts.subscriptions is not None else None,
            records=record_page(records, parts.records, now) if parts.records is not None else None,
            unnumbered=unnumbered(records.values(), parts.unnumbered))
