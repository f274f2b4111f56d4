"""What the router asks of the mesh layer, as a type: the router never imports the mesh.

The composition root (`oncemesh.cli`) builds a router with a factory that makes its mesh layer
(`interrouter.mesh.Mesh`, which satisfies `MeshPort`) once the router's delivery core exists; the
router holds it for its whole life. The mesh calls the router back through the router's own methods
(interrouter imports router, never the other way round).
"""

from __future__ import annotations

from typing import Any, Protocol

from ..common.engine import Engine
from .actions import MeshAction


class MeshPort(Protocol):
    async def start(self, engine: Engine) -> None:
        """Listen for and dial the neighbours; the router's listener is up."""

    async def stop(self) -> None:
        """Say goodbye to the other routers and close the inter-router connections."""

    def tick(self, now: float) -> None:
        """Timers of the mesh; ticks the delivery core too (expiry only while the mesh is whole)."""

    def perform_all(self, acts: list[MeshAction]) -> None:
        """Carry out core actions that concern other routers, in order (one call per batch)."""

    def attach_pending(self, sid: str) -> bool:
        """Does the ATTACH of subscription `sid` still wait for the other routers' acknowledgements?"""
        ...

    def relay_attach(self, link: Any, att: Any, home: str, now: float) -> None:
        """Relay member `att.member` of shared subscription `att.sid` (a `SubscriberAttach`) to its
        home `home` (interrouter/members.py); its ATTACH is answered once the home took it."""

    def relay_credit(self, mid: str, credit: int, drain: bool, now: float) -> None:
        """A relayed member's link credit."""

    def relay_disposition(self, mid: str, gid: str, outcome: Any, settled: bool, error: tuple[str, str] | None,
                          undeliverable: bool, now: float) -> None:
        """A relayed member's disposition."""

    def relay_detach(self, link: Any, mid: str, closed: bool, clean: bool, now: float) -> None:
        """A relayed member's link detached (`clean`) or its connection dropped."""

    def perform_member(self, act: Any) -> bool:
        """Carry out a core action for a member another router relays here (False: not one)."""
        ...

    # MQTT sessions' keepers (interrouter/keeper.py): answers come through the router's `keeper_outputs`
    def keep_session(self, cid: str, seq: int, image: dict[str, Any], now: float) -> None:
        """Have another router keep the image of MQTT session `cid` as of `seq`."""

    def drop_session(self, cid: str, now: float) -> None:
        """MQTT session `cid` ended here: its keeper forgets it."""

    def fetch_session(self, cid: str, now: float, patient: bool = False) -> None:
        """Ask every reachable router for the newest image of MQTT session `cid` (`patient`: wait
        for the routers out of reach too, a while: interrouter/keeper.py, "A patient fetch")."""

    def ready_info(self) -> dict[str, Any]:
        """The mesh's part of the router's status file (peers, convergence, inter-router address)."""
        ...

    def client_url(self, router_id: str) -> str | None:
        """Where the clients of router `router_id` connect (None: unknown)."""
        ...

    def redirect_targets(self) -> list[tuple[str, str]]:
        """(router id, client URL) of the live neighbours whose client address is known, best first:
        where a draining router sends its clients."""
        ...

    def drain_facts(self) -> dict[str, int]:
        """What a draining router still waits for on the mesh side (counts by name; 0: nothing)."""
        ...
