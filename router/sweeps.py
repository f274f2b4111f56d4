"""The delivery core's housekeeping, as named sweeps run by `tick`, and its statistics.

Part of the delivery core (`router.core.DeliveryCore` composes it); sans-IO like the rest."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .actions import SendProbe
from .finals import age_finals
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
from .subscriptions import SUB_ACTIVE

if TYPE_CHECKING:
    from .core import DeliveryCore

# seconds between two scans for orphans (each looks at every record: 20,000 in flight took ~5 ms, a
# pause of the loop at every tick); a record is finalised at most this long after its horizon
ORPHAN_SCAN = 5.0


class Sweeps:
    """Part of `DeliveryCore` (its methods run on the core's state: `self` is the core)."""

    def tick(self: DeliveryCore, now: float, may_expire: bool = True) -> None:
        """Run the sweeps, in this order. Expiry only when `may_expire` (in a mesh: while the whole
        mesh is reachable)."""
        self._now = now
        if may_expire:
            self._sweep_expired_subscriptions(now)
        self._sweep_orphans(now)
        self._sweep_probes(now)
        self._sweep_forgotten(now)
        self._sweep_parked(now)
        self._sweep_unconfirmed_copies(now)
        self._sweep_placeholders(now)

    def _sweep_expired_subscriptions(self: DeliveryCore, now: float) -> None:
        """Suspended subscriptions homed here whose expiry passed end."""
        for sub in self.table.expired(now, home=self.router_id):
            self._end(sub.sid, now, "expired")

    def _sweep_orphans(self: DeliveryCore, now: float) -> None:
        """Decided records whose publisher (or origin) vanished without settling: after the horizon
        (or, oldest first, when there are too many) we stop waiting for a resend that will not come."""
        orphaned = now - self.cfg.orphan_horizon
        excess = len(self.records) - self.undecided - self.cfg.max_decided_records
        if excess <= 0 and now - self._orphans_swept < min(self.cfg.orphan_horizon / 10, ORPHAN_SCAN):
            return  # (a scan of every record: at most every few seconds unless there are too many)
        self._orphans_swept = now
        reach = self.reachable
        orphans = sorted((r for r in self.records.values()
                          if r.pending == 0 and not r.pubs and (r.outcome is not None or r.origin is not None) and
                          (r.origin is None or not any(reach.get(o) == i for o, i in (r.origins or {}).items()))),
                         key=lambda r: r.decided)
        for rec in orphans:
            if rec.decided >= orphaned and excess <= 0:
                break
            excess -= 1
            rec.pub_settled = True
            self.ids.orphaned(rec)  # its publisher may still resend it (router/identity.py)
            self.log.append(("orphan_final", rec.gid, rec.topic, None, None))
            self._finalize(rec, now)

    def _sweep_probes(self: DeliveryCore, now: float) -> None:
        """Records done long ago that wait for a FINAL: ask their origin (if it is still the same
        incarnation) whether the FINAL was lost, or, when no origin of theirs is left and no
        publisher holds them, ask everybody."""
        if self.mesh_size < 2:
            return  # a standalone router: no destination records, nobody to ask (a scan per tick less)
        probe_before = now - self.cfg.probe_after
        reach = self.reachable
        final_now: list[str] = []
        for rec in self.records.values():
            if rec.pubs or rec.probed >= probe_before:
                continue
            if rec.origin is None:
                # an origin whose publisher left: it resends elsewhere, or settled, or is gone
                if rec.pub_settled or rec.created >= probe_before or len(reach) < 2:
                    continue
                live: list[tuple[str, str]] = []
            else:
                if rec.pending or rec.decided >= probe_before:
                    continue
                live = [(o, i) for o, i in (rec.origins or {}).items() if reach.get(o) == i and o != self.router_id]
            rec.probed = now
            if self._settled_by_local_publisher(rec.gid):
                final_now.append(rec.gid)
            elif live:
                for origin, inc in live:
                    self.out.append(SendProbe(origin, rec.gid, inc))
            else:
                self._ask_everybody(rec.gid)
        for gid in final_now:
            self.handle_final(gid, now)

    def _sweep_forgotten(self: DeliveryCore, now: float) -> None:
        """Forget what is older than `final_memory`: who held a copy, the predecessors we waited
        for, and finals (the oldest first; at most `final_memory_entries` remembered; router/finals.py)."""
        forget = now - self.cfg.final_memory
        for gid in [g for g, rs in self.held_for.items() if max(rs.values()) < forget]:
            del self.held_for[gid]
        for gid in [g for g, (first, _) in self.awaited.items()
                    if g in self.records or self.is_final(g) or first < forget]:
            del self.awaited[gid]
        if self.driven_elsewhere:
            for gid in [g for g in self.driven_elsewhere if g not in self.records]:
                del self.driven_elsewhere[gid]
        age_finals(self.recent_final, self.old_finals, now, self.cfg.final_memory, self.cfg.final_memory_young,
                   self.cfg.final_memory_entries)
        self.ids.forget(now)

    def _sweep_parked(self: DeliveryCore, now: float) -> None:
        """Deliveries parked while we asked about them: pump the links that have credit."""
        for rt in self.subs.values():
            if rt.link is not None and rt.credit > 0 and (rt.queue or self._order_of(rt.sid).walks):
                self._pump(rt)

    def _sweep_unconfirmed_copies(self: DeliveryCore, now: float) -> None:
        """Copies whose destination never confirmed them (lost with a connection that broke without
        changing who is reachable): send them again."""
        if len(self.reachable) < 2:
            return  # no other router reachable: no copy could go anywhere (`_route` skips them)
        retry_before = now - self.cfg.copy_retry
        for rec in list(self.records.values()):
            if rec.origin is None and rec.outcome is None and rec.fwd and rec.sent_at < retry_before \
                    and self._driving(rec):
                self._route(rec, force=True, unconfirmed_only=True)

    def _sweep_placeholders(self: DeliveryCore, now: float) -> None:
        """Placeholders nobody resolved: resolve those now known final, ask the mesh about the rest
        (an origin may have finalised one while it could not reach the routers the subscription
        presented it at), and give up on them after `placeholder_horizon`."""
        known = [g for g in self.placeholders
                 if g not in self.records and (self.is_final(g) or self._settled_by_local_publisher(g))]
        for gid in known:
            self._placeholder_final(gid)
        probe_before = now - self.cfg.probe_after
        if len(self.reachable) > 1:
            for gid, phs in self.placeholders.items():
                if min(phs.values()) < probe_before and self._ph_queried.get(gid, 0.0) < probe_before:
                    self._ph_queried[gid] = now
                    self._ask_everybody(gid)
            for gid in [g for g in self._ph_queried if g not in self.placeholders]:
                del self._ph_queried[gid]
        horizon = now - self.cfg.placeholder_horizon
        for gid in [g for g, phs in self.placeholders.items() if min(phs.values()) < horizon]:
            if gid not in self.records:
                self._placeholder_final(gid)
            else:
                self.placeholders.pop(gid, None)

    def stats(self: DeliveryCore) -> dict[str, int]:
        live = list(self.table.live())
        return {
            "records": len(self.records), "undecided": self.undecided, "inflight_bytes": self.inflight_bytes,
            "destination_records": self.destination_records,
            "reserved_credit": self.reserved_credit, "subscriptions": len(live),
            "local_subscriptions": sum(1 for s in live if s.home == self.router_id),
            "active_subscriptions": sum(1 for s in live if s.state is SUB_ACTIVE),
            "placeholders": len(self.placeholders), "publisher_links": len(self.pub_links),
            "fifo_holds": self.stats_fifo_held, "fifo_awaited": len(self.awaited),
            "causal_deps": self.stats_causal_deps, "causal_clients": len(self.pasts),
            "causal_cycles": self.stats_causal_cycles,
            "finals_ignored": self.stats_final_ignored, "subscriptions_reclaimed": self.stats_reclaimed,
            "new_identities": self.ids.stats_new_identities, "finals_answered": self.ids.stats_finals_answered,
            "final_notes": len(self.ids.final_notes),
            "final_gids": len(self.recent_final) + self.old_finals.gids,
            "final_entries": len(self.recent_final) + len(self.old_finals),
            "total_holds": self.stats_total_held, "total_late": self.stats_total_late,
        }

    def snapshot(self: DeliveryCore, now: float, parts: Parts = NOTHING) -> CoreSnapshot:
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
