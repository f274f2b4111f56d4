"""What a topology file describes, once it has been validated (see `topology.load`).

These are plain frozen values: the router, the mesh layer, the launcher and the simulator all read
the same `Topology`, so nothing here opens sockets or reads files. Everything that can be wrong
with a topology is caught by the loader; the methods here may assume a consistent object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import networkx as nx

from ..common.vocab import MESSAGE_ID, TAG

DEFAULT_HELLO_INTERVAL = 1.0
DEFAULT_DEAD_AFTER = 3.0
DEFAULT_COST = 1.0


class Order(StrEnum):
    """Per-topic delivery order (docs/promises.md, promise 6)."""

    FIFO = "fifo"  # per publisher link and subscription, across failover (docs/ordering.md)
    CAUSAL = "causal"  # what a client was handed comes before what it then published (docs/ordering.md)
    TOTAL = "total"  # one order for all subscribers of the topic (docs/ordering.md)


class TotalOrder(StrEnum):
    """How a total order is agreed on."""

    SEQUENCER = "sequencer"  # an elected sequencer numbers messages (bully election)
    LAMPORT = "lamport"  # Lamport clocks with acknowledgements from every member


@dataclass(frozen=True, slots=True)
class RouterSpec:
    """One router: its client listener, its inter-router listener and its own settings.

    A port of 0 means "any free port"; the bound port is then only known at run time (the router
    writes it to its ready file, which the launcher and the router's peers read).
    """

    id: str
    host: str
    port: int
    inter_host: str
    inter_port: int
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def listen(self) -> str:
        return _hostport(self.host, self.port)

    @property
    def inter_router(self) -> str:
        return _hostport(self.inter_host, self.inter_port)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """An inter-router link. Undirected: `a` and `b` are stored in lexical order."""

    a: str
    b: str
    cost: float = DEFAULT_COST

    def __str__(self) -> str:
        return f"{self.a}–{self.b}"


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """Per-topic settings; topics not listed in the file get `TopicSpec(name)`."""

    name: str
    order: Order = Order.FIFO
    total: TotalOrder | None = None  # set (default SEQUENCER) exactly when order is TOTAL
    causal_group: str | None = None  # only with order CAUSAL; topics of a group share one causal order
    # what names a message of this topic: "tag" (container id, link name, delivery tag: the default)
    # or "message-id" (its message-id, for clients that choose tags themselves; docs/clients.md)
    identity: str = TAG


@dataclass(frozen=True, slots=True)
class Topology:
    name: str
    routers: Mapping[str, RouterSpec]
    links: tuple[LinkSpec, ...] = ()
    topics: Mapping[str, TopicSpec] = field(default_factory=dict)
    hello_interval: float = DEFAULT_HELLO_INTERVAL
    dead_after: float = DEFAULT_DEAD_AFTER
    defaults: Mapping[str, Any] = field(default_factory=dict)  # settings for every router
    source: Path | None = None

    def router(self, router_id: str) -> RouterSpec:
        try:
            return self.routers[router_id]
        except KeyError:
            raise KeyError(f"router {router_id!r} is not in topology {self.name!r} "
                           f"(routers: {', '.join(sorted(self.routers))})") from None

    def graph(self) -> nx.Graph:
        """A fresh undirected graph: one node per router, one edge per link with its `cost`."""
        g = nx.Graph()
        g.add_nodes_from(sorted(self.routers))
        for link in self.links:
            g.add_edge(link.a, link.b, cost=link.cost)
        return g

    def link(self, a: str, b: str) -> LinkSpec | None:
        lo, hi = sorted((a, b))
        for link in self.links:
            if link.a == lo and link.b == hi:
                return link
        return None

    def neighbours(self, router_id: str) -> tuple[str, ...]:
        """The routers linked to `router_id`, sorted."""
        self.router(router_id)
        out = {link.b for link in self.links if link.a == router_id}
        out |= {link.a for link in self.links if link.b == router_id}
        return tuple(sorted(out))

    def router_settings(self, router_id: str) -> dict[str, Any]:
        """Settings for one router: the mesh-wide `[defaults]`, overridden by the router's own."""
        return {**self.defaults, **self.router(router_id).settings}

    def topic(self, name: str) -> TopicSpec:
        return self.topics.get(name) or TopicSpec(name)

    def total_topics(self, algorithm: TotalOrder) -> list[str]:
        """The topics in total order agreed on by `algorithm` (enforced by the routers)."""
        return sorted(n for n, t in self.topics.items() if t.order is Order.TOTAL and t.total is algorithm)

    def causal_groups(self) -> dict[str, str]:
        """Topics in causal order -> their causal group (a topic without one is a group of its own)."""
        return {n: f"group {t.causal_group}" if t.causal_group else f"topic {n}"
                for n, t in sorted(self.topics.items()) if t.order is Order.CAUSAL}

    def msgid_topics(self) -> frozenset[str]:
        """Topics whose publishers are identified by message-id (`identity = "message-id"`)."""
        return frozenset(n for n, t in self.topics.items() if t.identity == MESSAGE_ID)

    def dialer(self, a: str, b: str) -> str:
        """Which end of link a–b opens the TCP connection: the lexically smaller id.

        Exactly one side dials so that two routers starting together do not race to open two
        connections for one link; a fixed rule needs no negotiation and is easy to see in logs.
        """
        if self.link(a, b) is None:
            raise ValueError(f"there is no link {a}–{b} in topology {self.name!r}")
        return min(a, b)


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
