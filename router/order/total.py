"""What one router has learned of one totally ordered topic's numbering (sans-IO, no clock).

The sequencer (`router.order.sequencer`) numbers *keys* 1, 2, 3, ... with no gap, and every router
learns the numbers in order. A key is either a message's gid or the start of a subscription's life
(`start_key`): a subscription is owed exactly the messages numbered after its start, so every
router decides alike, from the numbering alone, whether a message is owed to a subscription (the
replicated table says where it is homed, not since when it is owed).
"""

from __future__ import annotations

START = "~"  # gids never contain it (common.ids): start keys cannot collide with messages


def start_key(sid: str, created: float) -> str:
    """The key of one life of a subscription (a new life of the same identity has a new `created`)."""
    return f"{START}{sid}{START}{created!r}"


def parse_start(key: str) -> tuple[str, str] | None:
    """(sid, life) of a start key; None for a message's gid."""
    if not key.startswith(START):
        return None
    sid, _, life = key[1:].partition(START)
    return sid, life


class TotalStream:
    """Numbers learned so far (in order, from 1 or from where this life of the router started)."""

    __slots__ = ("seq", "num", "start", "top")

    def __init__(self) -> None:
        self.seq: dict[int, str] = {}  # number -> key
        self.num: dict[str, int] = {}  # gid -> number
        self.start: dict[tuple[str, str], int] = {}  # (sid, life) -> number of its start
        self.top = 0  # highest number learned

    def learn(self, n: int, key: str) -> bool:
        """Number `n` is `key`. False when it was known already (a router re-learns after a restart)."""
        if n in self.seq:
            return False
        self.seq[n] = key
        if n > self.top:
            self.top = n
        life = parse_start(key)
        if life is None:
            self.num[key] = n
        else:
            self.start[life] = n
        return True

    def start_of(self, sid: str, created: float) -> int | None:
        return self.start.get((sid, repr(created)))

    def owed(self, n: int, sid: str, created: float) -> bool:
        """Is message number `n` owed to that life of `sid`? Only call it once `n` is learned: every
        number below it is learned too, so a start not learned yet comes after `n`."""
        s = self.start_of(sid, created)
        return s is not None and s < n
