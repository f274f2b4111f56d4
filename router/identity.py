"""Which message a publisher's transfer is: a new one, a resend of one in flight, or a resend of one
that became final. One part of the delivery core (`router.core.DeliveryCore` holds one `Identities` and asks it;
it sees the core through `IdentityHost`); sans-IO.

Theory of operation
-------------------
A message's identity is (container id, link name, delivery tag): its gid (common/ids.py). Our
clients never use a tag twice. AMQP lets any other sender use a tag again once its delivery is
settled (Qpid JMS always does, from a pool; Proton C++'s default tags do), so for a client not
ours a tag says which message only together with what happened to it before, here:

1. **Used on this attachment before** (the link is the same Proton link, never detached) and that
   delivery settled, by the router (receiver-settle-mode first: the router settles with the
   outcome) or by the publisher before any outcome (pre-settled): certainly another message, the
   outcome of the first could not be lost while the link stayed attached. So is a tag whose
   delivery is still open on this link (a sender bug, seen with Proton C++'s default tags). It gets
   a *new identity* (`ids.new_identity`: unique to this router incarnation and message, never a
   counter tag), remembered under its tag while its record lives (`alias_of`), so that a resend of
   it on a later attachment here merges with it.
2. **A record lives under it** (its own, or the newest new identity given under its tag): a
   resend of that message (merged, as ever).
3. **Final here** (remembered for `final_memory`):
   - its publisher settled it after the outcome (receiver-settle-mode second, the usual): the
     publisher had the outcome and will not resend it: another message, a new identity;
   - the router settled it in mode first, or it became final as an orphan (its publisher left
     without settling): a resend may be under way (its outcome may have been lost with the
     connection). Such messages leave a *note* (`finals.FinalNote`: outcome and a digest of the
     bytes): a transfer with the same bytes is taken for the resend and answered with that outcome,
     never delivered again; other bytes are another message (a new identity). A resend carries the
     message's bytes as they were (every client we know resends the same encoded message).
4. Otherwise: a new message under the tag's own gid.

Ours declare what they hold in doubt (`oncemesh.in-doubt`) and never reuse a tag: only what they
declared can be a resend of a final message (answered from a note), nothing is renamed for them.

What it costs: our clients' links, nothing; any other client's link in receiver-settle-mode second,
a comparison per message while its tags grow (`PubLink.fresh`: the largest counter-like gid of the
link known not final here, above which nothing of the link can be in the old tier of the final
memory); links in mode first (and links whose tags do not grow) the lookups above, a digest of the
message, and `SETTLED_KEPT` settled tags per link.

**Identity by message-id** (opt-in: the link property `oncemesh.identity` = "message-id", or the
topic's `identity = "message-id"` in the topology for links that declare nothing in doubt). Some
client libraries choose each tag themselves and cannot resend under the old one after a failover;
for their links the tag says nothing, and a message is named by the `message-id` of its properties
within a scope, (topic, authenticated user): `ids.msgid_gid`. The same gid at every router, under
any container id, link name or tag, so the rules that merge resends by gid (copies, FINAL, the
final memory) apply unchanged. `by_message_id` decides, in this order:

5. **No message-id** (or properties that cannot be read): REJECTED with a condition, nothing kept.
6. **A record lives under it**: a resend (merged, as rule 2).
7. **Final within the window** (`msgid_window` seconds, `msgid_window_entries` at most, the oldest
   forgotten first): answered with the outcome it had, never handed again. Every message-id record
   leaves a note (`id_notes`, whatever the settle mode: the id, not the bytes, says which message),
   and a FINAL carries it to every router that held a copy, which answers a resend the same way.
8. **Final here but its note forgotten** (more than `msgid_window_entries` ids within the final
   memory): REJECTED with amqp:precondition-failed: it is not handed again, and its outcome is not
   known here any more.
9. Otherwise, a new message (past the window: a resend is handed again, docs/clients.md).

Limits (docs/clients.md): a router that did not see a tag's earlier use (the publisher failed over
from another router) knows only what the final memory there says: a message the other router
renamed is unknown to it, and a tag final there only within the last `final_memory_young` seconds
(young, not compacted yet) on a mode-second link whose tags grow is not looked up.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol

from ..common import errors
from ..common.ids import (
    BadMessage,
    counter_tag,
    is_msgid_gid,
    message_id_key,
    msgid_gid,
    new_identity,
    payload_digest,
)
from ..common.vocab import O_REJECTED, Outcome
from .actions import SendOutcome
from .coreview import CoreView
from .finals import FinalNote, FinalNotes
from .state import PubLink, Record

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .finals import OldFinals

SETTLED_KEPT = 4096  # tags a link remembers it settled on its attachment (mode first): rule 1

_OUTCOMES = frozenset(int(o) for o in Outcome)

# a note as the FINAL carries it: (gid, its tag's plain gid, outcome, error, digest of its bytes)
WireNote = tuple[str, str, int, tuple[str, str] | None, str | None]


def later(gid: str, than: str) -> bool:
    """Is `gid` after `than` in the order of counter tags of one publisher link? For tags in counter
    form (lower-case letters and digits, no leading zero: `finals.counter_key`) the order of
    (length, text) is the order of their numbers, without parsing them."""
    return len(gid) > len(than) or (len(gid) == len(than) and gid > than)


class IdentityHost(CoreView, Protocol):
    """What `Identities` asks of the delivery core: its records, final memory and publisher links
    (read), where actions and log events go, and the publisher deliveries it registers."""

    @property
    def incarnation(self) -> str: ...
    @property
    def recent_final(self) -> Mapping[str, float]: ...
    @property
    def old_finals(self) -> OldFinals: ...
    @property
    def newest_link(self) -> Mapping[str, PubLink]: ...
    def unsettled_on(self, pl: PubLink, pub: Any, gid: str) -> None: ...

    def is_final(self, gid: str) -> bool: ...


class Identities:
    """Which message a transfer is (see the theory above): one per delivery core, which asks it
    (`identify`, `settled_on_link`, `final`, ...). It alone writes what it remembers: the notes on
    final messages (`final_notes`), the records that leave one (`noted`), the new identities given
    under a tag (`alias_of`, `plain_of`) and the tag floors of links gone (`fresh_of`); it reads the
    core's records, final memory and publisher links."""

    __slots__ = ("core", "final_notes", "noted", "alias_of", "plain_of", "fresh_of", "stats_new_identities",
                 "stats_finals_answered", "id_notes", "stats_ids_refused")

    def __init__(self, core: IdentityHost) -> None:
        self.core = core
        self.final_notes = FinalNotes()  # tag -> the newest message under it final while its outcome may be lost
        self.noted: dict[str, str | None] = {}  # records that leave a note when final -> digest of their bytes
        self.alias_of: dict[str, str] = {}  # plain gid -> the new identity under its tag whose record lives
        self.plain_of: dict[str, str] = {}  # and back
        self.fresh_of: dict[str, tuple[str, float]] = {}  # plid -> (PubLink.fresh of its last link here, when)
        self.stats_new_identities = 0  # messages under a tag used before, given a new identity
        self.stats_finals_answered = 0  # resends of final messages answered with their outcome
        # message-id identities (rules 5-9): gid -> the note of a final one, the window's memory
        self.id_notes = FinalNotes()
        self.stats_ids_refused = 0  # messages refused on links identified by message-id (rules 5, 8)

    def link_gone(self, pl: PubLink, now: float) -> None:
        """Publisher link `pl` detached: where its tags stood, for its next link here (`fresh_floor`)."""
        if pl.fresh:
            self.fresh_of[pl.plid] = (pl.fresh, now)

    def orphaned(self, rec: Record) -> None:
        """`rec`, ours, becomes final without its publisher: it may still resend it (a note is left)."""
        if rec.origin is None and rec.gid not in self.noted:
            self.noted[rec.gid] = None

    def identify(self, pl: PubLink, pub: Any, tag: bytes, gid: str, rec: Record | None,
                  payload: bytes, now: float) -> tuple[str, Record | None, bool]:
        """The message a transfer of `tag` (plain gid `gid`, its record `rec` if one lives) on `pl`
        is: (its gid, the record to merge into or None for a new record, answered): answered when
        it was a resend of a message that became final, answered with its outcome here (nothing
        more to do)."""
        if later(gid, pl.fresh):
            pl.fresh = gid
            if pl.second and pl.declared is None:
                pl.flen = len(gid)  # (then the next of its tags is taken for fresh at a glance: `publish`)
        if pl.declared is not None:  # ours: only a declared resend comes here (with no record)
            note = self.final_notes.get(gid) if rec is None else None
            if note is not None and (note.digest is None or note.digest == payload_digest(payload)):
                self.answer_from_note(pl, pub, gid, note, len(payload))
                return note.gid, None, True
            return gid, rec, False
        if pl.settled is not None and gid in pl.settled:
            return self.renamed(pl, tag, gid, payload), None, False  # rule 1
        alias = self.alias_of.get(gid) if self.alias_of else None
        live = self.core.records.get(alias) if alias is not None else None
        if live is None:
            live = rec
        if live is not None:
            if live.pubs and any(p in pl.pubs for p in live.pubs):
                return self.renamed(pl, tag, gid, payload), None, False  # rule 1: its delivery is open here
            if not pl.second and live.gid not in self.noted:
                self.noted[live.gid] = payload_digest(payload)
            return live.gid, live, False  # rule 2
        note = self.final_notes.get(gid)
        if note is None and not self.core.is_final(gid):
            if not pl.second:
                self.noted[gid] = payload_digest(payload)
            return gid, None, False  # rule 4
        if note is not None and (note.digest is None or note.digest == payload_digest(payload)):
            self.answer_from_note(pl, pub, gid, note, len(payload))
            return note.gid, None, True  # rule 3: a resend of a final message
        return self.renamed(pl, tag, gid, payload), None, False  # rule 3: its publisher had the outcome, or other bytes

    def by_message_id(self, pl: PubLink, pub: Any, payload: bytes) -> tuple[str, Record | None, bool]:
        """Which message a transfer on `pl`, a link identified by message-id, is (rules 5-9): (its
        gid, the record to merge into or None for a new one, answered): answered when it was refused
        or answered with the outcome of a final message (nothing more to do)."""
        try:
            key = message_id_key(payload)
        except BadMessage as exc:
            return self.refuse(pl, pub, errors.DecodeError.condition,
                               f"the message's properties cannot be read for its message-id: {exc}")
        if key is None:
            return self.refuse(pl, pub, errors.MissingMessageId.condition,
                               "this link is identified by message-id (link property oncemesh.identity, or the "
                               "topic's identity in the topology): a message without a message-id cannot be told "
                               "from a resend; set the message's id")
        gid = msgid_gid(pl.plid, key)
        core = self.core
        rec = core.records.get(gid)
        if rec is None:
            note = self.id_notes.get(gid)
            if note is not None:  # rule 7
                self.answer_from_note(pl, pub, gid, note, len(payload))
                return gid, None, True
            if gid in core.recent_final or gid in core.old_finals:  # rule 8
                return self.refuse(pl, pub, errors.PreconditionFailed.condition,
                                   "this message-id became final here, and its outcome is no longer remembered "
                                   "(beyond msgid_window_entries): it is not handed again")
        if gid not in self.noted:
            self.noted[gid] = None  # its note, when final (rule 7)
        return gid, rec, False

    def refuse(self, pl: PubLink, pub: Any, condition: str, text: str) -> tuple[str, None, bool]:
        """REJECTED with a condition: the message is not taken (nothing is kept of it)."""
        self.stats_ids_refused += 1
        self.core.out.append(SendOutcome(pub, O_REJECTED, (condition, text), not pl.second))
        return "", None, True

    def renamed(self, pl: PubLink, tag: bytes, gid: str, payload: bytes) -> str:
        """A new identity for another message under the tag of `gid` (see the theory above)."""
        self.stats_new_identities += 1
        new = new_identity(pl.plid, tag, f"{self.core.router_id}\0{self.core.incarnation}\0{self.stats_new_identities}")
        self.alias_of[gid] = new
        self.plain_of[new] = gid
        if not pl.second:
            self.noted[new] = payload_digest(payload)
        return new

    def answer_from_note(self, pl: PubLink, pub: Any, gid: str, note: FinalNote, size: int) -> None:
        """A resend of a message that became final here (its outcome lost with the publisher's
        connection): its outcome, never another delivery."""
        self.stats_finals_answered += 1
        self.core.log.append(("received", note.gid, pl.topic, None, {"size": size, "info": "merged"}))
        settle = not pl.second
        self.core.out.append(SendOutcome(pub, note.outcome, note.error, settle))
        if settle:
            if pl.declared is None:
                self.settled_on_link(pl, gid)
        else:  # (its settlement frees the tag on this link: `publisher_settled`)
            self.core.unsettled_on(pl, pub, gid)

    def settled_on_link(self, pl: PubLink, gid: str) -> None:
        """The delivery of (plain) `gid` on `pl` was settled while the link stays attached: that tag
        names another message if it comes again on this link (rule 1). The newest `SETTLED_KEPT`."""
        kept = pl.settled
        if kept is None:
            kept = pl.settled = OrderedDict()
        kept[self.plain_of.get(gid, gid) if self.plain_of else gid] = None
        if len(kept) > SETTLED_KEPT:
            kept.popitem(last=False)

    def final(self, rec: Record, now: float) -> None:
        """`rec` (ours, an origin record) became final: what its tag must say from now on."""
        gid = rec.gid
        plain = self.plain_of.pop(gid, None) if self.plain_of else None
        if plain is not None and self.alias_of.get(plain) == gid:
            del self.alias_of[plain]
        if gid not in self.noted:
            if plain is not None:
                self.final_notes.drop(plain)  # the newest message under its tag: its publisher had the outcome
            return
        digest = self.noted.pop(gid)
        if rec.outcome is not None and rec.origin is None:
            (self.id_notes if is_msgid_gid(gid) else self.final_notes).put(
                plain or gid, FinalNote(gid, rec.outcome, rec.error, digest, now))

    def notes_on(self, gids: list[str]) -> tuple[WireNote, ...]:
        """The notes this router has on `gids` (a FINAL it sends carries them: a router the
        publisher fails over to then knows a resend of one for what it is)."""
        out = []
        for gid in gids:
            found = (self.id_notes if is_msgid_gid(gid) else self.final_notes).of_gid(gid)
            if found is not None:
                plain, n = found
                out.append((gid, plain, int(n.outcome), n.error, n.digest))
        return tuple(out)

    def learn_note(self, note: WireNote, now: float) -> None:
        """Another router's note on a message that became final there (its FINAL carried it)."""
        gid, plain, outcome, error, digest = note
        if outcome in _OUTCOMES:
            if is_msgid_gid(gid):
                if gid == plain:  # (a message-id note: its gid is its own key, and no digest counts)
                    self.id_notes.put(gid, FinalNote(gid, Outcome(outcome), error, None, now))
                return
            self.final_notes.put(plain, FinalNote(gid, Outcome(outcome), error, digest, now))

    def resent_final(self, rec: Record, note: WireNote) -> bool:
        """A FINAL with a note for a record whose publisher's delivery is open here: is that
        delivery a resend of the message that became final there (the same bytes)? Its publisher
        lost the outcome and came here; it is answered with that outcome (see `handle_final`)."""
        if note[4] is not None and (not rec.payload or note[4] != payload_digest(rec.payload)):
            return False  # another message under that identity (it waits: docs/clients.md)
        self.stats_finals_answered += 1
        return True

    def fresh_floor(self, pl: PubLink) -> None:
        """Where a new link of a client not ours starts `PubLink.fresh`: at the largest counter gid of its publisher link
        remembered in the old tier of the final memory, sent by an earlier link of it here
        (`fresh_of`), or by one still attached."""
        plid = pl.plid
        floor = ""
        top = self.core.old_finals.top(plid)
        if top is not None:
            floor = f"{plid}:{counter_tag(top).decode()}"
        earlier = self.fresh_of.get(plid)
        if earlier is not None and later(earlier[0], floor):
            floor = earlier[0]
        newest = self.core.newest_link.get(plid)
        if newest is not None and later(newest.fresh, floor):
            floor = newest.fresh
        pl.fresh = floor
        if pl.second:
            pl.flen = len(floor)

    def forget(self, now: float) -> None:
        """Tick: forget notes and links' tag floors older than `final_memory`."""
        cfg = self.core.cfg
        before = now - cfg.final_memory
        self.final_notes.forget(before, cfg.final_notes_max)
        if self.id_notes:
            self.id_notes.forget(now - cfg.msgid_window, cfg.msgid_window_entries)
        if self.fresh_of:
            for plid in [p for p, (_, t) in self.fresh_of.items() if t < before]:
                del self.fresh_of[plid]
