"""Neighbour liveness: HELLO every `interval`, dead after `dead_after` of silence (the mesh's failure
detector: docs/operations.md, "How failures are noticed"). A neighbour that comes back with another incarnation restarted meanwhile.

Pure: the adapter reports what it heard (`heard`, `lost`) and calls `tick(now)`.
"""

from __future__ import annotations


class HelloMonitor:
    def __init__(self, neighbours: dict[str, float], interval: float, dead_after: float) -> None:
        self.costs = dict(neighbours)  # configured neighbours -> link cost
        self.interval = interval
        self.dead_after = dead_after
        self.last: dict[str, float] = {}  # live neighbour -> last time heard
        self.incarnation: dict[str, str] = {}
        self.next_hello = 0.0

    def heard(self, peer: str, inc: str, now: float) -> bool:
        """Something arrived from `peer`. True when that changes the live set (or its incarnation)."""
        if peer not in self.costs:
            return False
        changed = peer not in self.last or self.incarnation.get(peer) != inc
        self.last[peer] = now
        self.incarnation[peer] = inc
        return changed

    def touch(self, peer: str, now: float) -> None:
        """Any frame from a live neighbour counts as a sign of life."""
        if peer in self.last:
            self.last[peer] = now

    def lost(self, peer: str) -> bool:
        """The connection to `peer` closed (or it said goodbye). True if it was live."""
        return self.last.pop(peer, None) is not None

    def tick(self, now: float) -> list[str]:
        """Neighbours silent for `dead_after`: now dead."""
        dead = [p for p, t in self.last.items() if now - t >= self.dead_after]
        for p in dead:
            del self.last[p]
        return dead

    def hello_due(self, now: float) -> bool:
        if now >= self.next_hello:
            self.next_hello = now + self.interval
            return True
        return False

    def live(self) -> dict[str, float]:
        return {p: self.costs[p] for p in sorted(self.last)}
