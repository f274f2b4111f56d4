"""What one router has learned of one totally ordered topic's numbering (sans-IO, no clock).

The sequencer (`router.order.sequencer`) or the Lamport stream (`router.order.lamport`) numbers
*keys* 1, 2, 3, ... with no gap, and every router learns the numbers in order. A key is either a
message's gid or the start of a subscription's life (`start_key`): a subscription is owed exactly
the messages numbered after its start, so every router decides alike, from the numbering alone,
whether a message is owed to a subscription (the replicated table says where it is homed, not since
when it is owed).

Compaction. Numbers up to `base` are forgotten once no router needs them any more (the embedding
knows when: every router's `DeliveryCore.total_floor` reached it, docs/ordering.md "What is
bounded"); what stays of them is a `Checkpoint`: the starts of subscription lives numbered there
that have not ended (a message numbered later is owed to them) and, per publisher link, the highest
counter numbered there (a client that presents a message it was handed can be told "that was at or
below `base`" without its number). A router that restarted is sent the checkpoint instead of the
history below it (`restore`) and goes on from `base` + 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...common.ids import counter_seq, plid_of

START = "~"  # gids never contain it (common.ids): start keys cannot collide with messages
MAX_MARKS = 65_536  # publisher links whose highest counter a checkpoint keeps (the least recent go first)


def start_key(sid: str, created: float) -> str:
    """The key of one life of a subscription (a new life of the same identity has a new `created`)."""
    return f"{START}{sid}{START}{created!r}"


def parse_start(key: str) -> tuple[str, str] | None:
    """(sid, life) of a start key; None for a message's gid."""
    if not key.startswith(START):
        return None
    sid, _, life = key[1:].partition(START)
    return sid, life


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What a router needs of numbers 1 .. `number` to go on from `number` + 1."""

    number: int
    starts: tuple[tuple[str, int], ...]  # (start key, its number) of lives not known to have ended
    marks: tuple[tuple[str, int], ...]  # (publisher link, the highest counter seq numbered up to `number`)


class TotalStream:
    """Numbers learned so far (in order, from 1, or from a checkpoint's `base` + 1)."""

    __slots__ = ("seq", "num", "start", "top", "base", "marks")

    def __init__(self) -> None:
        self.seq: dict[int, str] = {}  # number -> key, for numbers above `base`
        self.num: dict[str, int] = {}  # gid -> number, for numbers above `base`
        self.start: dict[tuple[str, str], int] = {}  # (sid, life) -> number of its start (pruned: `compact`)
        self.top = 0  # highest number learned
        self.base = 0  # numbers up to this one are compacted
        self.marks: dict[str, int] = {}  # publisher link -> highest counter seq numbered up to `base`

    def learn(self, n: int, key: str) -> bool:
        """Number `n` is `key`. False when it was known already (a router re-learns after a restart)."""
        if n <= self.base or n in self.seq:
            return False
        self.seq[n] = key
        if n > self.top:
            self.top = n
        life = parse_start(key)
        if life is None:
            self.num[key] = n  # (numbered again after its first number was compacted: the new one counts)
        else:
            # a start submitted again (its router restarted before it learned it) keeps its first
            # number, at every router alike: live starts are never compacted away
            self.start.setdefault(life, n)
        return True

    def start_of(self, sid: str, created: float) -> int | None:
        return self.start.get((sid, repr(created)))

    def owed(self, n: int, sid: str, created: float) -> bool:
        """Is message number `n` owed to that life of `sid`? Only call it once `n` is learned: every
        number below it is learned too, so a start not learned yet comes after `n`."""
        s = self.start_of(sid, created)
        return s is not None and s < n

    # -- compaction ------------------------------------------------------------------------------
    def compact(self, upto: int, live: Callable[[str, str], bool]) -> Checkpoint:
        """Forget numbers up to `upto` (at most `top`); keep the starts of lives `live(sid, life)`
        says may still be live, and per publisher link its highest counter. Costs what it forgets."""
        upto = min(upto, self.top)
        seq, num, marks = self.seq, self.num, self.marks
        for n in range(self.base + 1, upto + 1):
            key = seq.pop(n, None)
            if key is None or key[:1] == START:
                continue
            if num.get(key) == n:  # (a gid numbered again later keeps its later number)
                del num[key]
            c = counter_seq(key)
            if c is not None:
                p = plid_of(key)
                old = marks.pop(p, -1)
                marks[p] = max(old, c)  # (re-inserted: the dict is in order of the latest numbered)
        self.base = max(self.base, upto)
        for life, s in list(self.start.items()):
            if s <= self.base and not live(*life):
                del self.start[life]  # an ended life is never live again (a new one has its own start)
        while len(marks) > MAX_MARKS:
            del marks[next(iter(marks))]  # (only the oldest: at most a few per compaction)
        return self.checkpoint()

    def checkpoint(self) -> Checkpoint:
        base = self.base
        starts = sorted((n, f"{START}{sid}{START}{life}") for (sid, life), n in self.start.items() if n <= base)
        return Checkpoint(base, tuple((k, n) for n, k in starts), tuple(sorted(self.marks.items())))

    def restore(self, cp: Checkpoint) -> bool:
        """Go on from `cp` (a restarted router sent a checkpoint instead of the history): what it
        summarizes replaces what was learned up to its number. False if it is not ahead of `base`."""
        if cp.number <= self.base:
            return False
        for n in [n for n in self.seq if n <= cp.number]:
            key = self.seq.pop(n)
            if self.num.get(key) == n:
                del self.num[key]
        for life in [life for life, s in self.start.items() if s <= cp.number]:
            del self.start[life]
        for key, n in cp.starts:
            parsed = parse_start(key)
            if parsed is not None:
                self.start[parsed] = n
        for p, c in cp.marks:
            if c > self.marks.get(p, -1):
                self.marks[p] = c
        self.base = cp.number
        self.top = max(self.top, cp.number)
        return True

    def below_base(self, gid: str) -> bool | None:
        """Was `gid` (a message this router has not learned the number of) numbered at or below
        `base`? False when it cannot have been: nothing is compacted, or its publisher link's highest
        counter compacted is below it (it is numbered later: wait for it); True when a later counter
        of its link was compacted (it was, or it was numbered out of its link's order: going on from
        `base` + 1 is safe either way); None when the checkpoint does not name its link (a link first
        numbered after `base`, or one dropped past `MAX_MARKS`) or it has no counter."""
        if self.base == 0:
            return False
        c = counter_seq(gid)
        m = self.marks.get(plid_of(gid))
        if c is None or m is None:
            return None
        return c <= m
