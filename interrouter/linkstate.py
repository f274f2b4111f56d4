"""Link state and paths: who is alive and reachable, and the next hop toward each router.

Theory of operation
-------------------
Every router advertises its *live* neighbours (those it exchanges HELLOs with) with their costs in
a LinkState, flooded to the whole mesh. An advertisement replaces an older one from the same router
when its (incarnation, seq) is newer. The live graph has an edge a-b only when both a and b
advertise each other (a half-dead link is dead). Reachability and shortest paths by cost are
computed over that graph with networkx; ties break on router ids so that every router computes the
same tree. A router that is not reachable is treated as gone until it is reachable again; its
advertisement is kept (so that a restart, a new incarnation, is recognised).

Pure: time is a parameter, nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from .messages import LinkState


def newer(a_inc: str, a_seq: int, b_inc: str, b_seq: int) -> bool:
    """Is (a_inc, a_seq) newer than (b_inc, b_seq)? Incarnations are start times (µs) as text."""
    ai, bi = int(a_inc or 0), int(b_inc or 0)
    return (ai, a_seq) > (bi, b_seq)


@dataclass
class Routes:
    reachable: dict[str, str]  # router -> incarnation (including ourselves)
    next_hop: dict[str, str]  # router -> neighbour to send through (not for ourselves)
    distance: dict[str, float]


class LinkStateDb:
    def __init__(self, me: str, inc: str) -> None:
        self.me = me
        self.inc = inc
        self.seq = 0
        self.ads: dict[str, LinkState] = {}
        self.live_neighbours: dict[str, float] = {}
        self._routes: Routes | None = None

    # -- our own advertisement ---------------------------------------------------------------
    def set_neighbours(self, live: dict[str, float]) -> LinkState | None:
        """Our live neighbours changed: returns our new advertisement to flood (None if unchanged)."""
        if live == self.live_neighbours and self.me in self.ads:
            return None
        self.live_neighbours = dict(live)
        self.seq += 1
        ad = LinkState(self.me, self.inc, self.seq, dict(live))
        self.ads[self.me] = ad
        self._routes = None
        return ad

    def own(self) -> LinkState:
        ad = self.ads.get(self.me)
        if ad is None:
            ad = self.set_neighbours(self.live_neighbours)
            assert ad is not None
        return ad

    # -- others' advertisements ---------------------------------------------------------------
    def update(self, ad: LinkState) -> bool:
        """Apply an advertisement; True when it is new (then flood it on to the other neighbours)."""
        if ad.origin == self.me:
            if newer(ad.inc, ad.seq, self.inc, self.seq) and ad.inc == self.inc:
                self.seq = ad.seq  # our own old advertisement echoed back after a restart
            return False
        cur = self.ads.get(ad.origin)
        if cur is not None and not newer(ad.inc, ad.seq, cur.inc, cur.seq):
            return False
        self.ads[ad.origin] = ad
        self._routes = None
        return True

    def known(self) -> list[LinkState]:
        return list(self.ads.values())

    # -- the live graph -------------------------------------------------------------------------
    def graph(self) -> nx.Graph:
        g = nx.Graph()
        g.add_node(self.me)
        for a in sorted(self.ads):
            ad = self.ads[a]
            for b in sorted(ad.neighbours):
                other = self.ads.get(b)
                if other is not None and a in other.neighbours:
                    cost = max(ad.neighbours[b], other.neighbours[a])
                    g.add_edge(a, b, cost=cost)
        return g

    def routes(self) -> Routes:
        if self._routes is not None:
            return self._routes
        g = self.graph()
        dist, paths = nx.single_source_dijkstra(g, self.me, weight="cost")
        reach = {r: (self.ads[r].inc if r in self.ads else "") for r in dist}
        reach[self.me] = self.inc
        hops = {r: p[1] for r, p in paths.items() if len(p) > 1}
        self._routes = Routes(reach, hops, dict(dist))
        return self._routes
