"""The read-only web console's data (`/console.json`, served with the page by router/http.py when
`http_console` is on; docs/operations.md, "The console").

One router's view, for a page that polls it once a second and fetches every other router's the
same way (CORS): the mesh as the topology draws it (routers, links, each router's HTTP address),
what this router sees of it (reachable routers, live links to its neighbours), its counters (the
page turns two polls into rates), what it holds in flight, its topics and subscriptions (the
management views' tables, router/management.py), and the audit's status file if one is named.

Rates of other routers come from those routers themselves, not from gossip: the mesh's wire
protocol stays as it is, and a router that cannot be reached shows as such.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..common import mgmtwire as W
from .management import MeshView, Request, RouterState, answer
from .snapshot import SnapshotSource

SUBSCRIPTION_ROWS = 500  # subscriptions in one console.json (the page says when there are more)
AUDIT_MAX_BYTES = 1 << 20
COUNTERS = ("received", "forwarded", "forward_received", "delivered", "accepted", "rejected", "released",
            "outcome", "settled")
STATS = ("records", "undecided", "inflight_bytes", "connections", "subscriptions", "local_subscriptions",
         "publisher_links", "loop_lag_p99_ms", "loop_lag_max_ms", "rss_kb")


def console_json(core: SnapshotSource, state: RouterState, mesh: MeshView | None, event_counts: dict[str, int],
                 http_self: str | None, peers_dir: Path | None, audit_file: Path | None, now: float) -> dict[str, Any]:
    status = state.management_status()
    stats: dict[str, Any] = status.get("stats", {})

    def table(view: str, limit: int = W.PAGE_MAX) -> dict[str, Any]:
        body = answer(Request(W.QUERY, view, limit), core, state, mesh, now).body or {}
        return {"columns": body.get("columns", []), "rows": body.get("rows", []), "total": body.get("total", 0)}

    routers = list(mesh.routers) if mesh is not None else [state.id]
    return {
        "router": state.id, "incarnation": state.incarnation, "time": now,
        "ready": bool(status.get("ready")), "why": status.get("why", {}),
        "peers": list(status.get("peers", [])), "neighbours": list(status.get("neighbours", [])),
        "mesh": {"routers": routers, "links": [list(link) for link in mesh.links] if mesh is not None else [],
                 "http": http_addresses(mesh, state.id, http_self, peers_dir)},
        "counters": {ev: int(event_counts.get(ev, 0)) for ev in COUNTERS},
        "stats": {k: stats.get(k) for k in STATS},
        "topics": table("topics"),
        "subscriptions": table("subscriptions", SUBSCRIPTION_ROWS),
        "orders": table("orders"),
        "audit": read_audit(audit_file),
    }


def http_addresses(mesh: MeshView | None, me: str, http_self: str | None, peers_dir: Path | None) -> dict[str, str]:
    """Each router's HTTP listener: from the topology when its port is fixed, else from its status
    file in `peers_dir` (routers started by `oncemesh up` on one machine, port 0)."""
    out = dict(mesh.http) if mesh is not None else {}
    if http_self:
        out[me] = http_self
    if mesh is not None and peers_dir is not None:
        for rid in mesh.routers:
            if rid in out:
                continue
            try:
                addr = json.loads((peers_dir / f"{rid}.json").read_text()).get("http")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(addr, str) and addr:
                out[rid] = addr
    return out


def read_audit(path: Path | None) -> dict[str, Any] | None:
    """The audit's status file (`audit_status_file`; `oncemesh audit` writes one): any JSON object.
    The page shows its `verdict` or `status`, its time (`updated` or `time`) and up to 20 of its
    `violations` (a list; or, as the audit writes them, a count with `recent_violations`). None when no file is named; an error entry when it cannot be read."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(AUDIT_MAX_BYTES + 1)
        if len(data) > AUDIT_MAX_BYTES:
            return {"file": str(path), "error": f"larger than {AUDIT_MAX_BYTES} bytes"}
        doc = json.loads(data)
    except FileNotFoundError:
        return {"file": str(path), "error": "not written yet (is the audit running?)"}
    except (OSError, ValueError) as exc:
        return {"file": str(path), "error": f"cannot read it: {exc}"}
    if not isinstance(doc, dict):
        return {"file": str(path), "error": "not a JSON object"}
    violations = doc.get("violations")
    recent = doc.get("recent_violations")
    if isinstance(violations, int) and not isinstance(violations, bool):
        # `oncemesh audit`'s own status.json: a count, the latest few in recent_violations
        listed = recent if isinstance(recent, list) else []
        count = violations
        status = doc.get("verdict", doc.get("status")) or (
            f"{count} violation(s)" if count else f"no violation ({doc.get('judgements', 0)} judgements)")
    else:
        listed = violations if isinstance(violations, list) else []
        count = len(listed)
        status = doc.get("verdict", doc.get("status"))
    return {"file": str(path), "status": status, "updated": doc.get("updated", doc.get("time")),
            "violations": listed[:20], "violation_count": count}
