"""When a router is ready to take traffic (`readiness`, `ready_from`: /readyz, `oncemesh_ready`, the
management views), and what every reader of the router's state sees of it (`ObservedRouter`).

The readers (router/http.py: /metrics, /readyz, the console; router/mgmtlink.py: `$management`)
take the router as an `ObservedRouter`, or a Protocol of their own built on it, never as the concrete
`server.Router`: the router makes its readers and imports them, they import neither it nor each
other. They read the delivery core through its snapshot (router/snapshot.py), never its attributes.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from .meshport import MeshPort
from .snapshot import CoreSnapshot, SnapshotSource


class ObservedRouter(Protocol):
    """What the readers of a router's state all use of it (`server.Router` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def incarnation(self) -> str: ...

    @property
    def core(self) -> SnapshotSource:
        """The delivery core, as readers see it: its snapshot."""
        ...

    @property
    def mesh(self) -> MeshPort | None:
        """The mesh layer (None: a router on its own)."""
        ...

    @property
    def draining(self) -> bool: ...

    def ready_info(self, snap: CoreSnapshot | None = None) -> dict[str, Any]:
        """The status (the ready file's content); `snap`: the core's with its counts, if the caller
        has one."""
        ...


def readiness(r: ObservedRouter, snap: CoreSnapshot | None = None) -> tuple[bool, dict[str, Any]]:
    """Ready to take traffic (see `ready_from`); `snap`: the core's, if the caller has one."""
    seen = snap if snap is not None else r.core.snapshot(time.time())
    return ready_from(seen.ready, seen.log_writable, r.mesh.ready_info() if r.mesh is not None else None,
                      r.draining)


def ready_from(table_synced: bool, log_writable: bool, mesh: dict[str, Any] | None,
               draining: bool = False) -> tuple[bool, dict[str, Any]]:
    """Ready: the subscription table is loaded and (in a mesh) was synced with every router it could
    reach, the peers are known (every router of the topology heard from, or `dead_after` passed
    since start: the rest is down), and publishers get credit (the settlement log can be written).
    A router recovering says why not, with 503: a load balancer sends it no new clients meanwhile;
    /healthz stays 200 (no restart loop).

    `mesh_converged` (every reachable router's current table merged) is reported, not required:
    it turns false at every router for a moment whenever any router (re)joins, and a router that
    was synced once keeps serving correctly meanwhile (new subscriptions wait for the
    acknowledgements anyway). Gating on it would take the whole mesh out of a load balancer at
    every restart of one router.

    A draining router (SIGUSR1, before a restart) is not ready: it sends its clients elsewhere."""
    why: dict[str, Any] = {"table_synced": bool(table_synced), "log_writable": bool(log_writable),
                           "accepting_publishers": bool(table_synced and log_writable and not draining),
                           "draining": bool(draining)}
    if mesh is not None:
        why["peers_known"] = bool(mesh.get("ready", table_synced))
        why["mesh_converged"] = bool(mesh.get("converged", False))
        why["peers"] = list(mesh.get("peers", []))
    ok = why["table_synced"] and why["log_writable"] and why.get("peers_known", True) and not draining
    return ok, why
