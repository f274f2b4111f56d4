"""Wire vocabulary shared by routers, the mesh and clients: message outcomes."""

from __future__ import annotations

from enum import IntEnum


class Outcome(IntEnum):
    ACCEPTED = 1
    REJECTED = 2
    RELEASED = 3
    MODIFIED = 4


# (module constants for per-message code: see router.core.S_QUEUED)
O_ACCEPTED, O_REJECTED, O_RELEASED, O_MODIFIED = Outcome.ACCEPTED, Outcome.REJECTED, Outcome.RELEASED, Outcome.MODIFIED
