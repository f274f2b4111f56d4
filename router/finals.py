"""What a router remembers of messages that became final after their records were freed.

A late copy, a late presenter or a message waiting for its predecessor must learn that a gid is
final (never hand it again, never wait for it), for `final_memory` seconds after it became final.

`FinalMemory` is the set of those gids (a dict: membership is one C-level lookup, on the hot path),
with the order they were added in kept beside it in a deque, so that forgetting the oldest costs
one step per gid forgotten, whatever the size. (Forgetting from the front of a dict by
`next(iter(d))` is quadratic in CPython: the iteration walks every slot already deleted. With a
million gids, each tick's purge grew from 0.26 s to 0.87 s in five rounds and a loop pass past the
idle timeout closed every connection.)

Bound: at most `max_gids` gids (the oldest forgotten first when there are more), each about 150
bytes with its key string: ~150 MB at the default million. Compacting it further (per-publisher
ranges) is future work.
"""

from __future__ import annotations

from collections import deque


class FinalMemory(dict[str, float]):
    """gid -> when it first became final here. Add with `add` (not `[]=`), forget with `forget`."""

    __slots__ = ("_order", "max_gids")

    def __init__(self, max_gids: int = 1_000_000) -> None:
        super().__init__()
        self._order: deque[str] = deque()
        self.max_gids = max_gids

    def add(self, gid: str, now: float) -> None:
        """`gid` is final (again: it keeps the time it first became final)."""
        if gid not in self:
            self[gid] = now
            self._order.append(gid)

    def forget(self, before: float) -> int:
        """Forget the gids that became final before `before`, and the oldest beyond `max_gids`.
        Returns how many; the cost is one step per gid forgotten."""
        order = self._order
        n = 0
        while order:
            gid = order[0]
            t = self.get(gid)
            if t is not None and t >= before and len(self) <= self.max_gids:
                break
            order.popleft()
            if t is not None:
                del self[gid]
                n += 1
        return n
