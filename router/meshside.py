"""The delivery core's mesh side: copies toward subscriptions' home routers, their acknowledgements,
FINAL / PROBE / QUERY / HOLD, publishers' declarations made at other routers, and the queries the
mesh layer (interrouter/node.py) makes.

A part of the delivery core (`router.core.DeliveryCore` makes one, `core.meshside`; the core offers
its inputs and queries to the mesh layer as they are, `core.receive_copy` is `core.meshside.receive_copy`).
It owns what only it writes: who asked for the FINAL of a record not here yet (`held_for`), the
records of ours another router drives now (`driven_elsewhere`) and the count of FINALs it refused
(`stats_final_ignored`); where each copy went is the record's (`Record.fwd`, `held`, `holders`).
What it needs of the core it asks through `MeshHost`, the narrow view of the core it is given
(never the core's module): the records through the book, the subscriptions, the final memory, and
the core's own steps (`_resolve`, `_decide`, `_finalize`, `_pump`, the placeholders'). Which
subscriptions move between routers, and the placeholders, are the core's (router/core.py).
Sans-IO like the rest."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from ..common.ids import counter_seq, plid_of
from ..common.settlement_log import Peer
from ..common.vocab import O_ACCEPTED, Outcome
from .actions import Forward, SendAck, SendFinal, SendHold
from .coreview import CoreView
from .state import HELD, RESOLVED, S_ENDED, S_QUEUED, S_SENT, Record, S

if TYPE_CHECKING:
    from .finals import FinalNotes
    from .handing import Handing
    from .identity import Identities, WireNote
    from .order.causal_policy import CausalOrder
    from .order.total import Checkpoint, TotalStream
    from .records import RecordBook
    from .state import PubLink, SubRuntime
    from .subscriptions import Subscription


def declared_settled(in_doubt: set[str], mark: int | None, gid: str) -> bool:
    """Does a publisher's declaration (what it held in doubt when it attached, and the next
    sequence number it would use then) say it settled `gid`? Only what it had published by then
    and no longer holds in doubt: a message published after the declaration is not in it either
    (a frozen router that comes back holds an old attach; regression test:
    test_core.py::test_a_declaration_says_nothing_of_messages_published_after_it)."""
    if gid in in_doubt:
        return False
    if mark is None:
        return True
    seq = counter_seq(gid)
    return seq is not None and seq < mark


def _resolved_for(owed: dict[str, S], dests: dict[str, list[str]]) -> bool:
    """Is a record whose parts are `owed` resolved for every subscription of `dests`? (Once per
    copy and predecessor: plain loops, the usual answer, no, comes at the first.)"""
    for sids in dests.values():
        for sid in sids:
            if owed.get(sid) not in RESOLVED:
                return False
    return True


class MeshHost(CoreView, Protocol):
    """What the mesh side asks of the delivery core."""

    _now: float  # (the latest time the core was given: every input sets it)

    @property
    def book(self) -> RecordBook: ...
    @property
    def remote_pending(self) -> Mapping[str, Mapping[str, Record]]: ...
    @property
    def placeholders(self) -> Mapping[str, Mapping[str, float]]: ...
    @property
    def reachable(self) -> Mapping[str, str]: ...
    @property
    def newest_link(self) -> Mapping[str, PubLink]: ...
    @property
    def total(self) -> Mapping[str, TotalStream]: ...
    @property
    def causal_order(self) -> CausalOrder: ...
    @property
    def handing(self) -> Handing: ...
    @property
    def ids(self) -> Identities: ...
    @property
    def final_notes(self) -> FinalNotes: ...

    def is_final(self, gid: str) -> bool: ...
    def remember_final(self, gid: str, now: float) -> None: ...
    def _local(self, sub: Subscription | None) -> bool: ...
    def _owe_here(self, rec: Record, sid: str) -> SubRuntime: ...
    def _absorb_placeholders(self, rec: Record) -> None: ...
    def _placeholder_final(self, gid: str) -> None: ...
    def _resolve(self, rec: Record, sid: str, st: S, error: tuple[str, str] | None, now: float,
                 why: str | None) -> None: ...
    def _decide(self, rec: Record, now: float) -> None: ...
    def _finalize(self, rec: Record, now: float) -> None: ...
    def _pump(self, rt: SubRuntime) -> None: ...


class MeshSide:
    """The mesh side of the delivery core (see the module's docstring)."""

    __slots__ = ("core", "held_for", "driven_elsewhere", "stats_final_ignored")

    def __init__(self, core: MeshHost) -> None:
        self.core = core
        self.held_for: dict[str, dict[str, float]] = {}  # gid -> routers that asked for its FINAL
        # origin records whose publisher re-attached at another router holding them in doubt: that
        # router drives them now and sends us their FINAL (gid -> router); pruned by a sweep
        self.driven_elsewhere: dict[str, str] = {}
        self.stats_final_ignored = 0  # FINALs refused: the publisher's delivery is open here

    def take_held_for(self, gid: str) -> dict[str, float] | None:
        """Who asked for the FINAL of `gid` before its record was made here (they are told it)."""
        return self.held_for.pop(gid, None)

    def forget_older(self, forget: float) -> None:
        """Forget requests for a FINAL older than `forget`, and records driven elsewhere that are gone."""
        for gid in [g for g, rs in self.held_for.items() if max(rs.values()) < forget]:
            del self.held_for[gid]
        if self.driven_elsewhere:
            records = self.core.records
            for gid in [g for g in self.driven_elsewhere if g not in records]:
                del self.driven_elsewhere[gid]

    def receive_copy(self, origin: str, origin_inc: str, gid: str, topic: str, sids: Iterable[str],
                     payload: bytes, now: float, preds: tuple[str, ...] = (),
                     deps: tuple[tuple[str, str], ...] = (), by_arrival: bool = False) -> None:
        """A copy from `origin` for the listed subscriptions (those homed here deliver it).
        `by_arrival`: its publisher declared no order (not ours): its order is the one its origin
        received it in, which `preds` carry, never its tag (`Record.seq` stays None). A copy without
        it (ours, or from a router older than it) reads its publish order from its tag's counter."""
        core = self.core
        core._now = now
        rec = core.records.get(gid)
        if rec is None and core.is_final(gid):
            # final already (its publisher settled it through another origin): a late copy
            core.out.append(SendFinal(origin, gid))
            return
        # those homed here (looked up once each; the others moved away: the origin re-routes them
        # by its own table)
        get, homed_here = core.table.get, core._local
        here = [(sid, sub) for sid in sids if homed_here(sub := get(sid))]
        if rec is None and not here and gid not in core.placeholders:
            return  # none of them is here (any more)
        if rec is None:
            rec = Record(gid, topic, payload, now)
            if not by_arrival:
                rec.seq = counter_seq(gid)
            rec.origins = {origin: origin_inc}
            asked = self.held_for.pop(gid, None)
            if asked:
                rec.holders = set(asked)
            core.book.add_copy(rec, origin)
            core.log.append(("forward_received", gid, topic, None, Peer(origin)))
        else:  # a destination record, or ours when the publisher failed over to `origin`
            if by_arrival:
                rec.seq = None  # (an origin that knows its publisher says so: never ordered by its tag)
            if rec.origins is None:
                rec.origins = {}
            rec.origins[origin] = origin_inc
        if preds:  # every origin's predecessors count (each saw its own part of the publisher's order)
            rec.preds = preds if not rec.preds else tuple(dict.fromkeys(rec.preds + preds))
        if deps:
            core.causal_order.add_deps(rec, deps)
        core._absorb_placeholders(rec)
        ts = core.total.get(topic) if core.total else None
        if ts is not None and rec.tnum is None:
            rec.tnum = ts.num.get(gid)
        new_pending = False
        for sid, sub in here:
            assert sub is not None  # (`_local`)
            if ts is not None and rec.tnum is not None and rec.owed.get(sid) is None \
                    and not ts.owed(rec.tnum, sid, sub.created):
                # started after it in the order: not owed (its origin decides alike)
                core.out.append(SendAck(origin, gid, sid, int(S_ENDED), None))
                continue
            if rec.origin is None:  # ours too: `origin` (driving it) confirms it is owed here
                if rec.listed is None:
                    rec.listed = {}
                rec.listed[sid] = now
                new_pending = True
            cur = rec.owed.get(sid)
            if cur is None:
                core._owe_here(rec, sid)
                new_pending = True
                core.out.append(SendAck(origin, gid, sid, HELD, None))  # here: no need to re-send it
            elif cur in RESOLVED:
                core.out.append(SendAck(origin, gid, sid, int(cur), None))  # acknowledge again
            else:
                core.out.append(SendAck(origin, gid, sid, HELD, None))
        if new_pending:
            core.book.carry(rec, payload)
            for sid in sids:
                local = core.subs.get(sid)
                if local is not None and local.link is not None and local.credit > 0:
                    core._pump(local)
        elif rec.origin is not None and rec.pending == 0 and rec.payload:
            core._decide(rec, now)

    def handle_final(self, gid: str, now: float, note: WireNote | None = None) -> bool:
        """`gid` is final: its publisher settled it (here or through another origin). Returns False
        when that cannot be true and is ignored: its publisher's delivery of it is open on a link
        here, waiting for the outcome we have not given (a publisher settles only after an outcome,
        and one that moved away would have left this link). Delivery carries on; a stale FINAL can
        cost at most a query later, a wrong one would be a false ACCEPTED. `note`: the sender's
        note on it (router/identity.py): then that open delivery may be a resend of it."""
        core = self.core
        if note is not None:
            core.ids.learn_note(note, now)
        rec = core.records.get(gid)
        if rec is None:
            if gid in core.placeholders:
                core._placeholder_final(gid)
            if core.handing.awaited_final(gid):
                core.remember_final(gid, now)  # a predecessor something waits for here
            return True
        resent = False
        if rec.pubs and rec.outcome is None and not rec.pub_settled:
            resent = note is not None and core.ids.resent_final(rec, note)
            if not resent:
                self.stats_final_ignored += 1
                return False
        if rec.origin is None and rec.outcome is None:
            # we are an origin too, still waiting, but its publisher settled it through another
            # origin: it is final everywhere. Stop: withdraw what is pending here. (A resend of a
            # message the router that sent the note settled: its outcome, told below.)
            core.book.conclude(rec, O_ACCEPTED if note is None else Outcome(note[2]), None if note is None else note[3])
            core.log.append(("ended", gid, rec.topic, None, "final elsewhere" if not resent else "resent final"))
        rec.pub_settled = True
        core._finalize(rec, now)
        return True

    def handle_probe(self, gid: str, frm: str, now: float) -> None:
        """A destination asks whether `gid` is still in flight here (its origin). It asks only when
        it resolved every subscription of it long ago: if we still wait for one that `frm` told us
        it holds, its resolution was lost on the way (a connection reset between other routers
        loses acks without changing who is reachable). Send the copy again: it answers with what
        it knows."""
        core = self.core
        rec = core.records.get(gid)
        if rec is None:
            core.out.append(SendFinal(frm, gid))
            return
        if rec.origin is not None or rec.outcome is not None or not rec.held or rec.fwd is None:
            return
        fwd = rec.fwd
        lost = [sid for sid in rec.held if fwd.get(sid) == frm]
        if lost and self.driving(rec):
            core._now = now
            rec.held.difference_update(lost)
            for sid in lost:
                del fwd[sid]
            self.route(rec, force=False)

    def handle_query(self, gid: str, frm: str, now: float) -> None:
        """Router `frm` holds a record of `gid` that lost its publisher and its origin: answer with
        what we know for sure (only positive knowledge: silence means we know nothing)."""
        core = self.core
        rec = core.records.get(gid)
        if rec is not None:
            if rec.origin is None:  # an origin working on it: the asker gets its FINAL
                if rec.holders is None:
                    rec.holders = set()
                rec.holders.add(frm)
            return
        if core.is_final(gid):
            core.out.append(SendFinal(frm, gid))
            return
        # the newest attach of its publisher link here, if it declared what it held in doubt (our clients)
        pl = core.newest_link.get(plid_of(gid))
        if pl is None or pl.declared is None:
            return
        if declared_settled(pl.declared, pl.mark, gid):
            core.out.append(SendFinal(frm, gid))  # its publisher is attached here and settled it
        elif gid in pl.declared and pl.token is not None:  # (not a declaration made for it: `publisher_gone`)
            self.held_for.setdefault(gid, {}).setdefault(frm, now)  # resent here: the asker gets our FINAL
        # else: published after that attach, elsewhere (this link is stale): we know nothing

    def handle_ack(self, gid: str, sid: str, state: int, error: tuple[str, str] | None, now: float) -> None:
        """A subscription's home router resolved (or holds: HELD) its part of a record of ours."""
        core = self.core
        rec = core.records.get(gid)
        if rec is None or rec.origin is not None:
            return
        if sid in core.subs:
            return  # homed here now: its local state is authoritative
        if state == HELD:
            if rec.owed.get(sid) in (S_QUEUED, S_SENT):
                if rec.held is None:
                    rec.held = set()
                rec.held.add(sid)
            return
        core._resolve(rec, sid, S(state), error, now, "remote")

    def route(self, rec: Record, force: bool, unconfirmed_only: bool = False) -> None:
        """Send copies for the remote subscriptions still pending, to their current home routers
        (those reachable): only where they have not been sent yet, or all again when `force`
        (`unconfirmed_only`: those whose home has not confirmed holding the copy)."""
        core = self.core
        me = core.router_id
        table = core.table
        reach = core.reachable
        dests: dict[str, list[str]] = {}
        fwd = rec.fwd
        for sid, st in rec.owed.items():
            if st is not S_QUEUED and st is not S_SENT:
                continue
            sub = table.get(sid)
            if sub is None or not sub.live or sub.home == me:
                continue
            home = sub.home
            if home not in reach:
                continue  # held here until its home router is reachable (or it moves)
            if not force and fwd is not None and fwd.get(sid) == home:
                continue
            if unconfirmed_only and rec.held is not None and sid in rec.held and fwd is not None \
                    and fwd.get(sid) == home:
                continue
            dests.setdefault(home, []).append(sid)
        if not dests:
            return
        if rec.held is not None and not unconfirmed_only:
            rec.held.difference_update(s for ss in dests.values() for s in ss)
        if rec.fwd is None:
            rec.fwd = {}
        if rec.holders is None:
            rec.holders = set()
        for home, sids in dests.items():
            for sid in sids:
                rec.fwd[sid] = home
            rec.holders.add(home)
        rec.sent_at = core._now
        preds = rec.preds
        if preds:
            preds = self._preds_for(preds, dests)
        core.out.append(Forward(rec.gid, rec.topic, rec.payload, {h: tuple(s) for h, s in dests.items()}, preds,
                                rec.deps, rec.seq is None))
        core.log.append(("forwarded", rec.gid, rec.topic, None, Peer(",".join(sorted(dests)))))

    def _preds_for(self, preds: tuple[str, ...], dests: dict[str, list[str]]) -> tuple[str, ...]:
        """The predecessors a copy for the subscriptions of `dests` must carry: not those whose
        record here says they are resolved (accepted, rejected, ended) for every one of them. A
        destination waits for a predecessor it does not know until it learns it is final; one whose
        publisher never settles never is, and a subscription that moved since it was handed it would
        wait `final_memory` for its whole backlog (issue 31, item 14). What is resolved for it here
        was handed to it (after its own predecessors): nothing is left to wait for."""
        core = self.core
        records = core.records
        keep: list[str] | None = None
        for i, p in enumerate(preds):
            r = records.get(p)
            if r is not None and _resolved_for(r.owed, dests):
                if keep is None:
                    keep = list(preds[:i])
                continue
            if keep is not None:
                keep.append(p)
        return preds if keep is None else tuple(keep)

    def reroute(self, force: bool = False, sids: Iterable[str] | None = None) -> None:
        """Send pending copies again (a fault or a move). Only records whose publisher is still with
        us: when it left, responsibility is back with it (it resends, here or at another router,
        which then drives delivery) and a stale origin must not resurrect a message that may have
        become final elsewhere meanwhile."""
        core = self.core
        if sids is None:
            for rec in list(core.records.values()):
                if rec.origin is None and rec.pending and rec.outcome is None and self.driving(rec):
                    self.route(rec, force)
            return
        seen: set[str] = set()
        for sid in sids:
            for rec in list(core.remote_pending.get(sid, {}).values()):
                if rec.gid not in seen and self.driving(rec):
                    seen.add(rec.gid)
                    self.route(rec, force)

    @staticmethod
    def driving(rec: Record) -> bool:
        """Does this origin drive `rec` (its publisher is with us, or settled it)?"""
        return bool(rec.pubs) or rec.pub_settled

    def forget_routing(self, sid: str) -> None:
        """Where copies for `sid` went no longer counts (it moved, or re-attached and its home may
        have dropped them): the next routing sends them to its home again."""
        core = self.core
        for rec in core.remote_pending.get(sid, {}).values():
            if rec.fwd is not None:
                rec.fwd.pop(sid, None)
            if rec.held is not None:
                rec.held.discard(sid)

    def publisher_declared_elsewhere(self, plid: str, in_doubt: set[str], at: str, now: float,
                                     mark: int | None = None) -> None:
        """Publisher link `plid` attached at router `at`, holding `in_doubt` in doubt. Records of it we
        hold without its publisher: not in doubt any more means settled on its side (final); still in
        doubt means `at` becomes an origin for it: we ask to be told its FINAL. Messages it published
        after that attach (at or past `mark`) are in neither set: the declaration says nothing of them."""
        core = self.core
        for rec in [r for r in core.records.values() if r.plid == plid and not r.pubs]:
            if rec.gid in in_doubt:
                core.out.append(SendHold(at, rec.gid))
                if rec.origin is None:
                    self.driven_elsewhere[rec.gid] = at  # its publisher resends it there: `at` drives it
            elif declared_settled(in_doubt, mark, rec.gid) and rec.origin is None:
                # our publishers settle only once they have an outcome: it is final (here, or at
                # the router that gave the outcome): stop whatever is still pending here
                self.handle_final(rec.gid, now)
        for gid in [g for g in core.placeholders if plid_of(g) == plid and declared_settled(in_doubt, mark, g)]:
            if gid not in core.records:
                core._placeholder_final(gid)

    def handle_hold(self, gid: str, frm: str, now: float) -> None:
        """Router `frm` holds a record of `gid` (an earlier origin of it): include it in the FINAL.
        The resend that makes us an origin may not be here yet: then remember the request."""
        core = self.core
        rec = core.records.get(gid)
        if rec is not None:
            if rec.holders is None:
                rec.holders = set()
            rec.holders.add(frm)
        elif core.is_final(gid):
            core.out.append(SendFinal(frm, gid))
        else:
            self.held_for.setdefault(gid, {})[frm] = now

    def has_record(self, gid: str) -> bool:
        """Does this router hold a delivery record of `gid`?"""
        core = self.core
        return gid in core.records

    def has_final_notes(self) -> bool:
        """Does this router keep any note on a final message whose outcome its publisher may have
        missed? (If not, `notes_on` finds nothing: the FINALs it sends need not ask it.)"""
        core = self.core
        return bool(core.final_notes) or bool(core.ids.id_notes)

    def in_total_order(self, topic: str) -> bool:
        """Is `topic` in total order here (the core keeps its numbering stream)?"""
        core = self.core
        return topic in core.total

    def total_base(self, topic: str) -> int:
        """Up to which number the stream of `topic` (in total order) forgot its history here
        (compacted; 0: nothing yet)."""
        return self.core.total[topic].base

    def total_checkpoint(self, topic: str) -> Checkpoint:
        """The checkpoint of the stream of `topic` (in total order) as it stands, compacted nothing
        more (`total_compact` compacts first)."""
        return self.core.total[topic].checkpoint()

    def total_start_of(self, topic: str, sid: str, created: float) -> int | None:
        """The number that the start of the life of subscription `sid` created at `created` got in the
        stream of `topic` (in total order); None while it has none here."""
        return self.core.total[topic].start_of(sid, created)
