"""The delivery core's housekeeping: the named sweeps `DeliveryCore.tick` runs, in order.

A part of the delivery core (`router.core.DeliveryCore` makes one, `core.sweeps`, and asks it to
sweep). It owns what only it writes: when the orphans were last scanned (`orphans_swept`) and when
each placeholder was last asked about (`ph_queried`). Everything else it changes it asks its owner
to change, through `SweepHost`, the narrow view of the core it is given (never the core's module).
Sans-IO like the rest."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from .actions import SendProbe
from .coreview import CoreView

if TYPE_CHECKING:
    from .identity import Identities
    from .meshside import MeshSide
    from .order.policy import OrderPolicy
    from .state import Record, SubRuntime

# seconds between two scans for orphans (each looks at every record: 20,000 in flight took ~5 ms, a
# pause of the loop at every tick); a record is finalised at most this long after its horizon
ORPHAN_SCAN = 5.0


class SweepHost(CoreView, Protocol):
    """What the sweeps ask of the delivery core: what they read, and the core's own steps they run."""

    @property
    def undecided(self) -> int: ...
    @property
    def placeholders(self) -> Mapping[str, Mapping[str, float]]: ...
    @property
    def reachable(self) -> Mapping[str, str]: ...
    @property
    def mesh_size(self) -> int: ...
    @property
    def ids(self) -> Identities: ...
    @property
    def meshside(self) -> MeshSide: ...

    def is_final(self, gid: str) -> bool: ...
    def forget_older(self, now: float) -> None: ...
    def drop_placeholder(self, gid: str) -> None: ...
    def _end(self, sid: str, now: float, reason: str) -> None: ...
    def _finalize(self, rec: Record, now: float) -> None: ...
    def _settled_by_local_publisher(self, gid: str) -> bool: ...
    def _ask_everybody(self, gid: str) -> None: ...
    def _order_of(self, sid: str) -> OrderPolicy: ...
    def _pump(self, rt: SubRuntime) -> None: ...
    def _placeholder_final(self, gid: str) -> None: ...


class Sweeps:
    """The core's housekeeping (see the module's docstring)."""

    __slots__ = ("core", "orphans_swept", "ph_queried")

    def __init__(self, core: SweepHost) -> None:
        self.core = core
        self.orphans_swept = -math.inf  # when `_sweep_orphans` last looked at every record
        self.ph_queried: dict[str, float] = {}  # placeholder gid -> last time we asked the mesh

    def sweep(self, now: float, may_expire: bool = True) -> None:
        """Run the sweeps, in this order. Expiry only when `may_expire` (in a mesh: while the whole
        mesh is reachable)."""
        if may_expire:
            self._sweep_expired_subscriptions(now)
        self._sweep_orphans(now)
        self._sweep_probes(now)
        self._sweep_forgotten(now)
        self._sweep_parked(now)
        self._sweep_unconfirmed_copies(now)
        self._sweep_placeholders(now)

    def _sweep_expired_subscriptions(self, now: float) -> None:
        """Suspended subscriptions homed here whose expiry passed end."""
        core = self.core
        for sub in core.table.expired(now, home=core.router_id):
            core._end(sub.sid, now, "expired")

    def _sweep_orphans(self, now: float) -> None:
        """Decided records whose publisher (or origin) vanished without settling: after the horizon
        (or, oldest first, when there are too many) we stop waiting for a resend that will not come."""
        core = self.core
        cfg = core.cfg
        orphaned = now - cfg.orphan_horizon
        excess = len(core.records) - core.undecided - cfg.max_decided_records
        if excess <= 0 and now - self.orphans_swept < min(cfg.orphan_horizon / 10, ORPHAN_SCAN):
            return  # (a scan of every record: at most every few seconds unless there are too many)
        self.orphans_swept = now
        reach = core.reachable
        orphans = sorted((r for r in core.records.values()
                          if r.pending == 0 and not r.pubs and (r.outcome is not None or r.origin is not None) and
                          (r.origin is None or not any(reach.get(o) == i for o, i in (r.origins or {}).items()))),
                         key=lambda r: r.decided)
        for rec in orphans:
            if rec.decided >= orphaned and excess <= 0:
                break
            excess -= 1
            rec.pub_settled = True
            core.ids.orphaned(rec)  # its publisher may still resend it (router/identity.py)
            core.log.append(("orphan_final", rec.gid, rec.topic, None, None))
            core._finalize(rec, now)

    def _sweep_probes(self, now: float) -> None:
        """Records done long ago that wait for a FINAL: ask their origin (if it is still the same
        incarnation) whether the FINAL was lost, or, when no origin of theirs is left and no
        publisher holds them, ask everybody."""
        core = self.core
        if core.mesh_size < 2:
            return  # a standalone router: no destination records, nobody to ask (a scan per tick less)
        probe_before = now - core.cfg.probe_after
        reach = core.reachable
        me = core.router_id
        final_now: list[str] = []
        for rec in core.records.values():
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
                live = [(o, i) for o, i in (rec.origins or {}).items() if reach.get(o) == i and o != me]
            rec.probed = now
            if core._settled_by_local_publisher(rec.gid):
                final_now.append(rec.gid)
            elif live:
                for origin, inc in live:
                    core.out.append(SendProbe(origin, rec.gid, inc))
            else:
                core._ask_everybody(rec.gid)
        for gid in final_now:
            core.meshside.handle_final(gid, now)

    def _sweep_forgotten(self, now: float) -> None:
        """Forget what is older than `final_memory`: who held a copy, the predecessors we waited
        for, and finals (the oldest first; at most `final_memory_entries` remembered; router/finals.py).
        Each is its owner's to forget: the core's `forget_older`."""
        self.core.forget_older(now)

    def _sweep_parked(self, now: float) -> None:
        """Deliveries parked while we asked about them: pump the links that have credit."""
        core = self.core
        for rt in core.subs.values():
            if rt.link is not None and rt.credit > 0 and (rt.queue or core._order_of(rt.sid).walks):
                core._pump(rt)

    def _sweep_unconfirmed_copies(self, now: float) -> None:
        """Copies whose destination never confirmed them (lost with a connection that broke without
        changing who is reachable): send them again."""
        core = self.core
        if len(core.reachable) < 2:
            return  # no other router reachable: no copy could go anywhere (`route` skips them)
        retry_before = now - core.cfg.copy_retry
        for rec in list(core.records.values()):
            if rec.origin is None and rec.outcome is None and rec.fwd and rec.sent_at < retry_before \
                    and core.meshside.driving(rec):
                core.meshside.route(rec, force=True, unconfirmed_only=True)

    def _sweep_placeholders(self, now: float) -> None:
        """Placeholders nobody resolved: resolve those now known final, ask the mesh about the rest
        (an origin may have finalised one while it could not reach the routers the subscription
        presented it at), and give up on them after `placeholder_horizon`."""
        core = self.core
        placeholders = core.placeholders
        known = [g for g in placeholders
                 if g not in core.records and (core.is_final(g) or core._settled_by_local_publisher(g))]
        for gid in known:
            core._placeholder_final(gid)
        probe_before = now - core.cfg.probe_after
        queried = self.ph_queried
        if len(core.reachable) > 1:
            for gid, phs in placeholders.items():
                if min(phs.values()) < probe_before and queried.get(gid, 0.0) < probe_before:
                    queried[gid] = now
                    core._ask_everybody(gid)
            for gid in [g for g in queried if g not in placeholders]:
                del queried[gid]
        horizon = now - core.cfg.placeholder_horizon
        for gid in [g for g, phs in placeholders.items() if min(phs.values()) < horizon]:
            if gid not in core.records:
                core._placeholder_final(gid)
            else:
                core.drop_placeholder(gid)
