"""The delivery core's mesh side: copies toward subscriptions' home routers, their acknowledgements,
FINAL / PROBE / QUERY / HOLD, subscriptions that move between routers, and publishers' declarations
of what they hold in doubt.

Part of the delivery core (`router.core.DeliveryCore` composes it); sans-IO like the rest."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ..common import errors
from ..common.ids import counter_seq, plid_of
from ..common.settlement_log import Peer
from ..common.vocab import O_ACCEPTED, Outcome
from .actions import (
    Announce,
    DetachLink,
    Forward,
    SendAck,
    SendFinal,
    SendHold,
)
from .identity import WireNote
from .order.total import Checkpoint
from .state import (
    HELD,
    RESOLVED,
    S_ACCEPTED,
    S_ENDED,
    S_QUEUED,
    S_SENT,
    Record,
    S,
    SubRuntime,
)
from .subscriptions import Subscription, SubState, foreign

if TYPE_CHECKING:
    from .core import DeliveryCore


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


def _refusal(sid: str, link: object, holder: Subscription) -> DetachLink:
    """The link of a claim that another identity's life of the subscription beat (`holder`): refused."""
    return DetachLink(sid, link, errors.UnauthorizedAccess.condition,
                      f"subscription {sid} belongs to another identity (made first, at router {holder.home}); "
                      f"attach with the credentials that made it")


def _resolved_for(owed: dict[str, S], dests: dict[str, list[str]]) -> bool:
    """Is a record whose parts are `owed` resolved for every subscription of `dests`? (Once per
    copy and predecessor: plain loops, the usual answer, no, comes at the first.)"""
    for sids in dests.values():
        for sid in sids:
            if owed.get(sid) not in RESOLVED:
                return False
    return True


class MeshSide:
    """Part of `DeliveryCore` (its methods run on the core's state: `self` is the core)."""

    def receive_copy(self: DeliveryCore, origin: str, origin_inc: str, gid: str, topic: str, sids: Iterable[str],
                     payload: bytes, now: float, preds: tuple[str, ...] = (),
                     deps: tuple[tuple[str, str], ...] = (), by_arrival: bool = False) -> None:
        """A copy from `origin` for the listed subscriptions (those homed here deliver it).
        `by_arrival`: its publisher declared no order (not ours): its order is the one its origin
        received it in, which `preds` carry, never its tag (`Record.seq` stays None). A copy without
        it (ours, or from a router older than it) reads its publish order from its tag's counter."""
        self._now = now
        rec = self.records.get(gid)
        table = self.table
        if rec is None and self.is_final(gid):
            # final already (its publisher settled it through another origin): a late copy
            self.out.append(SendFinal(origin, gid))
            return
        if rec is None and gid not in self.placeholders and not any(self._local(table.get(s)) for s in sids):
            return  # none of them is here (any more): their origin re-routes them by its own table
        if rec is None:
            rec = Record(gid, topic, payload, now)
            if not by_arrival:
                rec.seq = counter_seq(gid)
            rec.origins = {origin: origin_inc}
            asked = self.held_for.pop(gid, None)
            if asked:
                rec.holders = set(asked)
            self.book.add_copy(rec, origin)
            self.log.append(("forward_received", gid, topic, None, Peer(origin)))
        else:  # a destination record, or ours when the publisher failed over to `origin`
            if by_arrival:
                rec.seq = None  # (an origin that knows its publisher says so: never ordered by its tag)
            if rec.origins is None:
                rec.origins = {}
            rec.origins[origin] = origin_inc
        if preds:  # every origin's predecessors count (each saw its own part of the publisher's order)
            rec.preds = preds if not rec.preds else tuple(dict.fromkeys(rec.preds + preds))
        if deps:
            self.causal_order.add_deps(rec, deps)
        self._absorb_placeholders(rec)
        ts = self.total.get(topic) if self.total else None
        if ts is not None and rec.tnum is None:
            rec.tnum = ts.num.get(gid)
        new_pending = False
        for sid in sids:
            sub = table.get(sid)
            if not self._local(sub):
                continue  # it moved away: the origin re-routes it by its own table
            assert sub is not None
            if ts is not None and rec.tnum is not None and rec.owed.get(sid) is None \
                    and not ts.owed(rec.tnum, sid, sub.created):
                # started after it in the order: not owed (its origin decides alike)
                self.out.append(SendAck(origin, gid, sid, int(S_ENDED), None))
                continue
            if rec.origin is None:  # ours too: `origin` (driving it) confirms it is owed here
                if rec.listed is None:
                    rec.listed = {}
                rec.listed[sid] = now
                new_pending = True
            cur = rec.owed.get(sid)
            if cur is None:
                self.book.move(rec, sid, S_QUEUED)
                rt = self.subs[sid]
                rt.owed[gid] = rec
                new_pending = True
                if rt.link is not None:
                    rt.queue.append(gid)
                self.out.append(SendAck(origin, gid, sid, HELD, None))  # here: no need to re-send it
            elif cur in RESOLVED:
                self.out.append(SendAck(origin, gid, sid, int(cur), None))  # acknowledge again
            else:
                self.out.append(SendAck(origin, gid, sid, HELD, None))
        if new_pending:
            self.book.carry(rec, payload)
            for sid in sids:
                local = self.subs.get(sid)
                if local is not None and local.link is not None and local.credit > 0:
                    self._pump(local)
        elif rec.origin is not None and rec.pending == 0 and rec.payload:
            self._decide(rec, now)

    def _absorb_placeholders(self: DeliveryCore, rec: Record) -> None:
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

    def handle_final(self: DeliveryCore, gid: str, now: float, note: WireNote | None = None) -> bool:
        """`gid` is final: its publisher settled it (here or through another origin). Returns False
        when that cannot be true and is ignored: its publisher's delivery of it is open on a link
        here, waiting for the outcome we have not given (a publisher settles only after an outcome,
        and one that moved away would have left this link). Delivery carries on; a stale FINAL can
        cost at most a query later, a wrong one would be a false ACCEPTED. `note`: the sender's
        note on it (router/identity.py): then that open delivery may be a resend of it."""
        if note is not None:
            self.ids.learn_note(note, now)
        rec = self.records.get(gid)
        if rec is None:
            if gid in self.placeholders:
                self._placeholder_final(gid)
            if self.awaited.pop(gid, None) is not None:
                self.recent_final[gid] = now  # a predecessor something waits for here
            return True
        resent = False
        if rec.pubs and rec.outcome is None and not rec.pub_settled:
            resent = note is not None and self.ids.resent_final(rec, note)
            if not resent:
                self.stats_final_ignored += 1
                return False
        if rec.origin is None and rec.outcome is None:
            # we are an origin too, still waiting, but its publisher settled it through another
            # origin: it is final everywhere. Stop: withdraw what is pending here. (A resend of a
            # message the router that sent the note settled: its outcome, told below.)
            self.book.conclude(rec, O_ACCEPTED if note is None else Outcome(note[2]), None if note is None else note[3])
            self.log.append(("ended", gid, rec.topic, None, "final elsewhere" if not resent else "resent final"))
        rec.pub_settled = True
        self._finalize(rec, now)
        return True

    def handle_probe(self: DeliveryCore, gid: str, frm: str, now: float) -> None:
        """A destination asks whether `gid` is still in flight here (its origin). It asks only when
        it resolved every subscription of it long ago: if we still wait for one that `frm` told us
        it holds, its resolution was lost on the way (a connection reset between other routers
        loses acks without changing who is reachable). Send the copy again: it answers with what
        it knows."""
        rec = self.records.get(gid)
        if rec is None:
            self.out.append(SendFinal(frm, gid))
            return
        if rec.origin is not None or rec.outcome is not None or not rec.held or rec.fwd is None:
            return
        fwd = rec.fwd
        lost = [sid for sid in rec.held if fwd.get(sid) == frm]
        if lost and self._driving(rec):
            self._now = now
            rec.held.difference_update(lost)
            for sid in lost:
                del fwd[sid]
            self._route(rec, force=False)

    def handle_query(self: DeliveryCore, gid: str, frm: str, now: float) -> None:
        """Router `frm` holds a record of `gid` that lost its publisher and its origin: answer with
        what we know for sure (only positive knowledge: silence means we know nothing)."""
        rec = self.records.get(gid)
        if rec is not None:
            if rec.origin is None:  # an origin working on it: the asker gets its FINAL
                if rec.holders is None:
                    rec.holders = set()
                rec.holders.add(frm)
            return
        if self.is_final(gid):
            self.out.append(SendFinal(frm, gid))
            return
        # the newest attach of its publisher link here, if it declared what it held in doubt (our clients)
        pl = self.newest_link.get(plid_of(gid))
        if pl is None or pl.declared is None:
            return
        if declared_settled(pl.declared, pl.mark, gid):
            self.out.append(SendFinal(frm, gid))  # its publisher is attached here and settled it
        elif gid in pl.declared:
            self.held_for.setdefault(gid, {}).setdefault(frm, now)  # resent here: the asker gets our FINAL
        # else: published after that attach, elsewhere (this link is stale): we know nothing

    def _settled_by_local_publisher(self: DeliveryCore, gid: str) -> bool:
        """Its publisher is attached here and declared it no longer in doubt: it settled it. (The
        newest attach of its link, and only if it declared what it held in doubt: our clients.)"""
        pl = self.newest_link.get(plid_of(gid))
        return pl is not None and pl.declared is not None and declared_settled(pl.declared, pl.mark, gid)

    def handle_ack(self: DeliveryCore, gid: str, sid: str, state: int, error: tuple[str, str] | None, now: float) -> None:
        rec = self.records.get(gid)
        if rec is None or rec.origin is not None:
            return
        if sid in self.subs:
            return  # homed here now: its local state is authoritative
        if state == HELD:
            if rec.owed.get(sid) in (S_QUEUED, S_SENT):
                if rec.held is None:
                    rec.held = set()
                rec.held.add(sid)
            return
        self._resolve(rec, sid, S(state), error, now, "remote")

    def _route(self: DeliveryCore, rec: Record, force: bool, unconfirmed_only: bool = False) -> None:
        """Send copies for the remote subscriptions still pending, to their current home routers
        (those reachable): only where they have not been sent yet, or all again when `force`
        (`unconfirmed_only`: those whose home has not confirmed holding the copy)."""
        me = self.router_id
        table = self.table
        reach = self.reachable
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
        rec.sent_at = self._now
        preds = rec.preds
        if preds:
            preds = self._preds_for(preds, dests)
        self.out.append(Forward(rec.gid, rec.topic, rec.payload, {h: tuple(s) for h, s in dests.items()}, preds,
                                rec.deps, rec.seq is None))
        self.log.append(("forwarded", rec.gid, rec.topic, None, Peer(",".join(sorted(dests)))))

    def _preds_for(self: DeliveryCore, preds: tuple[str, ...], dests: dict[str, list[str]]) -> tuple[str, ...]:
        """The predecessors a copy for the subscriptions of `dests` must carry: not those whose
        record here says they are resolved (accepted, rejected, ended) for every one of them. A
        destination waits for a predecessor it does not know until it learns it is final; one whose
        publisher never settles never is, and a subscription that moved since it was handed it would
        wait `final_memory` for its whole backlog (issue 31, item 14). What is resolved for it here
        was handed to it (after its own predecessors): nothing is left to wait for."""
        records = self.records
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

    def set_reachable(self: DeliveryCore, reachable: dict[str, str], now: float) -> None:
        """The live graph changed: `reachable` maps every router we can reach to its incarnation.
        Pending copies are sent again (some may have been lost with a link or a router)."""
        self._now = now
        if reachable == self.reachable:
            return
        self.reachable = dict(reachable)
        self.reroute(force=True)

    def reroute(self: DeliveryCore, force: bool = False, sids: Iterable[str] | None = None) -> None:
        """Send pending copies again (a fault or a move). Only records whose publisher is still with
        us: when it left, responsibility is back with it (it resends, here or at another router,
        which then drives delivery) and a stale origin must not resurrect a message that may have
        become final elsewhere meanwhile."""
        if sids is None:
            for rec in list(self.records.values()):
                if rec.origin is None and rec.pending and rec.outcome is None and self._driving(rec):
                    self._route(rec, force)
            return
        seen: set[str] = set()
        for sid in sids:
            for rec in list(self.remote_pending.get(sid, {}).values()):
                if rec.gid not in seen and self._driving(rec):
                    seen.add(rec.gid)
                    self._route(rec, force)

    @staticmethod
    def _driving(rec: Record) -> bool:
        return bool(rec.pubs) or rec.pub_settled

    def subscription_changed(self: DeliveryCore, old: Subscription, now: float) -> None:
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
                    if foreign(old, new):
                        self.out.append(_refusal(sid, rt.link, new))
                    else:
                        self.out.append(DetachLink(sid, rt.link, errors.LinkStolen.condition,
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
            self._forget_routing(sid)
            self.reroute(force=False, sids=[sid])

    def _claim_again(self: DeliveryCore, mine: Subscription, won: Subscription) -> bool:
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

    def presented_elsewhere(self: DeliveryCore, sid: str, gids: Iterable[str], home: str, now: float) -> None:
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

    def _moved_here(self: DeliveryCore, sid: str) -> None:
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

    def _moved_away(self: DeliveryCore, sid: str, new: Subscription, now: float, other: bool = False) -> None:
        """A subscription homed here resumed at another router (`other`: it is another identity's
        life that holds it, made first: our link's claim is refused, not stolen)."""
        rt = self.subs.pop(sid, None)
        for gid, phs in list(self.placeholders.items()):  # its new home keeps its own placeholders
            if phs.pop(sid, None) is not None and not phs:
                del self.placeholders[gid]
        if rt is None:
            return
        if rt.link is not None:
            self.out.append(_refusal(sid, rt.link, new) if other else DetachLink(
                sid, rt.link, errors.LinkStolen.condition, f"the subscription resumed at router {new.home}"))
            self._unbind(rt)
        for gid, rec in list(rt.owed.items()):
            if rec.origin is None:  # ours: it is remote now, send it to the new home
                if rec.owed.get(sid) is S_SENT:
                    self.book.move(rec, sid, S_QUEUED)
                self.remote_pending.setdefault(sid, {})[gid] = rec
            else:  # a destination copy: drop our part; its origin re-routes it
                self.book.move(rec, sid, None)
                if rec.pending == 0:
                    self._decide(rec, now)
        self._forget_routing(sid)
        self.reroute(force=False, sids=[sid])

    def _forget_routing(self: DeliveryCore, sid: str) -> None:
        """Where copies for `sid` went no longer counts (it moved, or re-attached and its home may
        have dropped them): the next routing sends them to its home again."""
        for rec in self.remote_pending.get(sid, {}).values():
            if rec.fwd is not None:
                rec.fwd.pop(sid, None)
            if rec.held is not None:
                rec.held.discard(sid)

    def _publisher_declared(self: DeliveryCore, plid: str, in_doubt: set[str], mark: int | None, now: float) -> None:
        """One of our publishers re-attached and listed what it still holds in doubt: everything
        else of that link that we hold and it had published by then is settled on its side (it will
        never be resent)."""
        for rec in [r for r in self.records.values()
                    if r.plid == plid and r.origin is None and declared_settled(in_doubt, mark, r.gid)]:
            if not rec.pubs:  # it settled it (here, the settlement lost with its link, or elsewhere)
                self.handle_final(rec.gid, now)
        for gid in [g for g in self.placeholders if plid_of(g) == plid and declared_settled(in_doubt, mark, g)]:
            if gid not in self.records:
                self._placeholder_final(gid)

    def publisher_declared_elsewhere(self: DeliveryCore, plid: str, in_doubt: set[str], at: str, now: float,
                                     mark: int | None = None) -> None:
        """Publisher link `plid` attached at router `at`, holding `in_doubt` in doubt. Records of it we
        hold without its publisher: not in doubt any more means settled on its side (final); still in
        doubt means `at` becomes an origin for it: we ask to be told its FINAL. Messages it published
        after that attach (at or past `mark`) are in neither set: the declaration says nothing of them."""
        for rec in [r for r in self.records.values() if r.plid == plid and not r.pubs]:
            if rec.gid in in_doubt:
                self.out.append(SendHold(at, rec.gid))
                if rec.origin is None:
                    self.driven_elsewhere[rec.gid] = at  # its publisher resends it there: `at` drives it
            elif declared_settled(in_doubt, mark, rec.gid) and rec.origin is None:
                # our publishers settle only once they have an outcome: it is final (here, or at
                # the router that gave the outcome): stop whatever is still pending here
                self.handle_final(rec.gid, now)
        for gid in [g for g in self.placeholders if plid_of(g) == plid and declared_settled(in_doubt, mark, g)]:
            if gid not in self.records:
                self._placeholder_final(gid)

    def handle_hold(self: DeliveryCore, gid: str, frm: str, now: float) -> None:
        """Router `frm` holds a record of `gid` (an earlier origin of it): include it in the FINAL.
        The resend that makes us an origin may not be here yet: then remember the request."""
        rec = self.records.get(gid)
        if rec is not None:
            if rec.holders is None:
                rec.holders = set()
            rec.holders.add(frm)
        elif self.is_final(gid):
            self.out.append(SendFinal(frm, gid))
        else:
            self.held_for.setdefault(gid, {})[frm] = now

    def _placeholder_final(self: DeliveryCore, gid: str) -> None:
        for sid in self.placeholders.pop(gid, {}):
            rt = self.subs.get(sid)
            if rt is None:
                sub = self.table.get(sid)
                if sub is not None and sub.live and sub.home != self.router_id:
                    self.out.append(SendFinal(sub.home, gid))  # it moved on: the FINAL follows it
                continue
            if rt.link is not None and rt.capable:
                rt.notify.append(gid)
                self._pump(rt)
            else:
                rt.final_unnotified.add(gid)
            self.log.append(("placeholder_final", gid, None, sid, None))

    # ---- read by the mesh side (interrouter/node.py)
    # What the mesh layer (`interrouter.node.MeshNode`) asks of the core besides its inputs above:
    # one input that configures the core for the mesh, and queries that read without writing. The
    # node reads nothing else of the core (tests/unit/test_mesh_seam.py holds the list).

    def set_mesh(self: DeliveryCore, size: int, incarnation: str) -> None:
        """Input from the mesh layer when it starts: the topology has `size` routers (1: a router
        alone) and this life of the router is `incarnation` (the one its adapter gave the core, if
        it did: the router's), which claims in the subscription table and new identities carry."""
        self.incarnation = incarnation
        self.mesh_size = size

    def reachable_routers(self: DeliveryCore) -> Mapping[str, str]:
        """Router -> incarnation of every router this one reaches, itself included: what
        `set_reachable` was last told (read only)."""
        return self.reachable

    def has_record(self: DeliveryCore, gid: str) -> bool:
        """Does this router hold a delivery record of `gid`?"""
        return gid in self.records

    def has_final_notes(self: DeliveryCore) -> bool:
        """Does this router keep any note on a final message whose outcome its publisher may have
        missed? (If not, `notes_on` finds nothing: the FINALs it sends need not ask it.)"""
        return bool(self.final_notes) or bool(self.ids.id_notes)

    def subscriptions_reclaimed(self: DeliveryCore) -> int:
        """How many subscriptions this router claimed again for their live link here (a count that
        only grows: `subscription_changed` raised it when it changed)."""
        return self.stats_reclaimed

    def in_total_order(self: DeliveryCore, topic: str) -> bool:
        """Is `topic` in total order here (the core keeps its numbering stream)?"""
        return topic in self.total

    def total_base(self: DeliveryCore, topic: str) -> int:
        """Up to which number the stream of `topic` (in total order) forgot its history here
        (compacted; 0: nothing yet)."""
        return self.total[topic].base

    def total_checkpoint(self: DeliveryCore, topic: str) -> Checkpoint:
        """The checkpoint of the stream of `topic` (in total order) as it stands, compacted nothing
        more (`total_compact` compacts first)."""
        return self.total[topic].checkpoint()

    def total_start_of(self: DeliveryCore, topic: str, sid: str, created: float) -> int | None:
        """The number that the start of the life of subscription `sid` created at `created` got in the
        stream of `topic` (in total order); None while it has none here."""
        return self.total[topic].start_of(sid, created)
