"""The mesh as the router's management views and console show it (router.management.MeshView),
made from a topology by the composition root: every router, every link, and the HTTP listener
of each router where its settings name one that others can reach."""

from __future__ import annotations

from ..router.config import parse_hostport
from ..router.management import MeshView
from .model import Topology

_WILDCARD = ("0.0.0.0", "::", "")


def mesh_view(topo: Topology) -> MeshView:
    """`http`: router id -> HOST:PORT of its HTTP listener, for routers whose `http_listen` has a
    fixed port; a wildcard host (0.0.0.0) is replaced by the router's client host. Port 0 is
    learned at run time from the peers' status files (console)."""
    http: dict[str, str] = {}
    for rid, spec in topo.routers.items():
        listen = topo.router_settings(rid).get("http_listen")
        if not listen:
            continue
        try:
            host, port = parse_hostport(str(listen))
        except ValueError:
            continue  # (the router refuses to start with it; `oncemesh check` says why)
        if port == 0:
            continue
        if host in _WILDCARD:
            host = spec.host if spec.host not in _WILDCARD else ""
        if host:
            http[rid] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return MeshView(tuple(sorted(topo.routers)), tuple((link.a, link.b) for link in topo.links), http)
