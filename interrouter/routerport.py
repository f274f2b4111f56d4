"""What the mesh layer asks of its router, as a type: `interrouter.mesh.Mesh` reaches the router only
through `RouterPort` (router/server.py's `Router` satisfies it), and the delivery core only through
the core's inputs and its queries (`set_mesh`, `reachable_routers`, ... at the end of `router.core.DeliveryCore`; interrouter/node.py).

The router's side of the same seam is `router.meshport.MeshPort`: what the router asks of the mesh.
tests/unit/test_mesh_seam.py checks that the mesh layer keeps to both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..router.config import RouterConfig
    from ..router.core import DeliveryCore
    from ..router.subscriptions import SubscriptionTable


class RouterPort(Protocol):
    @property
    def id(self) -> str:
        """This router's id in the topology."""
        ...

    @property
    def incarnation(self) -> str:
        """This life of the router (new at every start)."""
        ...

    @property
    def cfg(self) -> RouterConfig:
        """The router's configuration (read only)."""
        ...

    @property
    def core(self) -> DeliveryCore:
        """The delivery core, for the mesh node to call its inputs and queries."""
        ...

    @property
    def table(self) -> SubscriptionTable:
        """The subscription table the core reads and the mesh's gossip keeps in step."""
        ...

    def client_url(self) -> str | None:
        """Where clients reach this router (told to the neighbours); the listener is up."""
        ...

    def drain(self, decided: float | None = None) -> None:
        """Perform the core's actions (`decided`: when the input that made them was taken)."""

    def taking(self, taken: float) -> None:
        """Input taken at `taken` is about to make the core decide; the router drains it at the end
        of the pass (what earlier input decided is dated by that input's time)."""

    def mesh_attach_done(self, sid: str, refused: str | None) -> None:
        """The other routers acknowledged (or refused) the announcement of subscriber `sid`'s attach."""

    def mesh_event(self, event: str, now: float, peer: str, info: str | None) -> None:
        """An event of the mesh layer for the settlement log."""

    def relay_outputs(self, actions: list[Any], answered: list[str]) -> None:
        """What the relay of shared subscriptions' members decided (interrouter/members.py): actions
        on relayed links (by member id), and members whose ATTACH is answered now."""

    def keeper_outputs(self, kept: list[tuple[str, int]], fetched: list[tuple[str, dict[str, Any] | None]],
                       lonely: list[str], orphaned: list[tuple[str, dict[str, Any]]]) -> None:
        """What the MQTT sessions' keepers answered (interrouter/keeper.py): images kept up to a
        seq, images fetched (None: none kept anywhere), sessions with no keeper to be had, and
        images kept here whose home is out of reach."""

    def write_ready_file(self) -> None:
        """Write the router's status file again (the mesh's view changed)."""
