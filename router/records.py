"""The delivery records and every count derived from them, with their one owner: `RecordBook`.

Theory of operation
-------------------
What a message is for each subscription it is owed to (`Record.owed[sid]`, router/state.py) changes
only here, by the table `MOVES` below: `RecordBook.move` is the general setter, and the hot path's
moves have their own methods doing the same work inline (`add_origin`: absent -> QUEUED or ACCEPTED
on a record just made; `sent`: QUEUED -> SENT; `resolve`: QUEUED or SENT -> a resolution). A move not in the
table is a bug of ours (`IllegalMove`).

The book also alone writes what is counted from the records, so that no count is kept by hand
anywhere else (tests/unit/test_record_owner.py fails if one is):
- `Record.pending`: the subscriptions still QUEUED or SENT (by the table: at 0 the record is decided);
- `by_gid`: the records held (the core reads it as `DeliveryCore.records`, never writes it);
- `undecided`: records of this origin without an outcome (what the publishers' credit budget counts):
  it changes with `Record.origin` and `Record.outcome`, which only the book sets;
- `inflight_bytes`: the payloads held (it changes with `Record.payload`, which only the book sets
  once the record is in it);
- `destination_records`: records held for another origin (counted for the status, not scanned).

Who decides when a record is added, decided or freed is the delivery core (router/core.py); the
book only keeps the state and its counts true.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn

from ..common.vocab import Outcome
from .state import RESOLVED, S_ACCEPTED, S_QUEUED, S_SENT, IllegalMove, Record, S

if TYPE_CHECKING:
    from .subscriptions import Subscription

# (from, to) -> change of Record.pending. Only these moves exist.
MOVES: dict[tuple[S | None, S | None], int] = {
    (None, S_QUEUED): +1,  # owed: in force when it was published (or a copy for it came)
    (None, S.ACCEPTED): 0,  # its subscriber holds it already (presented it), owed or not
    (S.ENDED, S.ACCEPTED): 0,  # ended in an earlier life of the same identity that holds it
    (S.REJECTED, S.ACCEPTED): 0,  # (the same, rejected then: the client says it holds it)
    (S_QUEUED, S_SENT): 0,  # handed to the current link
    (S_SENT, S_QUEUED): 0,  # its link went, or it was released: handed again later
    (S_QUEUED, S_QUEUED): 0,
    **{(a, b): -1 for a in (S_QUEUED, S_SENT) for b in RESOLVED},  # resolved
    (S_QUEUED, None): -1,  # dropped: it moved away, or a stale copy
    (S_SENT, None): -1,
}

# MOVES as `move` reads it per message (three moves per message on the hot path): a list per
# destination state indexed by the origin state (_ABSENT for none), holding the change of pending or
# None for "not a move"; moves to None (a dropped part) in a dict of their own. Half the cost of
# looking (from, to) tuples up in MOVES.
_ABSENT = len(S)
_TO_STATE: list[list[int | None]] = [[None] * (len(S) + 1) for _ in S]
_TO_NONE: dict[S | None, int] = {}
for (_old, _to), _delta in MOVES.items():
    if _to is None:
        _TO_NONE[_old] = _delta
    else:
        _TO_STATE[_to][_ABSENT if _old is None else _old] = _delta


def _illegal(rec: Record, sid: str, to: S | None) -> NoReturn:
    raise IllegalMove(f"message {rec.gid} for subscription {sid}: {rec.owed.get(sid)!r} -> {to!r} is not a move")


class RecordBook:
    """The records held by one router's delivery core, their states and their counts (see above)."""

    __slots__ = ("by_gid", "undecided", "inflight_bytes", "destination_records")

    def __init__(self) -> None:
        self.by_gid: dict[str, Record] = {}
        self.undecided = 0  # records of this origin still waiting: what the budget counts
        self.inflight_bytes = 0
        self.destination_records = 0  # records held for another origin

    # ------------------------------------------------------------ states
    def move(self, rec: Record, sid: str, to: S | None) -> None:
        """The general way to change the state of `rec` for `sid` (see MOVES)."""
        owed = rec.owed
        if to is not None:
            delta = _TO_STATE[to][owed.get(sid, _ABSENT)]
            if delta is None:
                _illegal(rec, sid, to)
            owed[sid] = to
        else:
            delta = _TO_NONE.get(owed.get(sid))
            if delta is None:
                _illegal(rec, sid, to)
            del owed[sid]
        rec.pending += delta

    @staticmethod
    def sent(rec: Record, sid: str) -> None:
        """QUEUED -> SENT (the caller checked it is QUEUED); pending unchanged, by the table."""
        rec.owed[sid] = S_SENT

    @staticmethod
    def resolve(rec: Record, sid: str, st: S) -> bool:
        """QUEUED or SENT -> the resolution `st`. False (nothing changes) when `sid` is not owed it
        or resolved already."""
        owed = rec.owed
        cur = owed.get(sid)
        if cur is not S_QUEUED and cur is not S_SENT:
            return False
        delta = _TO_STATE[st][cur]
        if delta is None:
            _illegal(rec, sid, st)
        owed[sid] = st
        rec.pending += delta
        return True

    # ------------------------------------------------------------ records and their counts
    def add_origin(self, rec: Record, subs: Iterable[Subscription], held: dict[str, float] | None,
                   me: str) -> None:
        """A new record of ours (we are its origin), undecided, owed to each of `subs` (the live
        subscriptions of its topic): QUEUED, but ACCEPTED for those homed here (`me`) whose client
        presented it already (`held`: the placeholders of its gid). (absent -> QUEUED and absent ->
        ACCEPTED by the table, applied here directly: the record is fresh and the table's
        subscriptions are distinct; no call per subscription.)"""
        self.by_gid[rec.gid] = rec
        self.inflight_bytes += len(rec.payload)
        self.undecided += 1
        owed = rec.owed
        queued = 0
        for sub in subs:
            sid = sub.sid
            if held is not None and sid in held and sub.home == me:
                owed[sid] = S_ACCEPTED
            else:
                owed[sid] = S_QUEUED
                queued += 1
        rec.pending += queued

    def add_copy(self, rec: Record, origin: str) -> None:
        """A new destination record: a copy from `origin`."""
        rec.origin = origin
        self.destination_records += 1
        self.by_gid[rec.gid] = rec
        self.inflight_bytes += len(rec.payload)

    def adopt(self, rec: Record, payload: bytes) -> None:
        """A destination record becomes ours (its publisher resent it here), undecided."""
        rec.origin = None
        self.destination_records -= 1
        if not rec.payload:
            rec.payload = payload
            self.inflight_bytes += len(payload)
        self.undecided += 1

    def carry(self, rec: Record, payload: bytes) -> None:
        """`rec` is owed here again: hold its payload if it was freed."""
        if not rec.payload:
            rec.payload = payload
            self.inflight_bytes += len(payload)

    def free_payload(self, rec: Record) -> None:
        self.inflight_bytes -= len(rec.payload)
        rec.payload = b""

    def conclude(self, rec: Record, outcome: Outcome, error: tuple[str, str] | None) -> None:
        """A record of ours (undecided) has its outcome: it leaves the budget's count."""
        rec.outcome = outcome
        rec.error = error
        self.undecided -= 1

    def decide(self, rec: Record, outcome: Outcome, error: tuple[str, str] | None) -> None:
        """`conclude`, and its payload is freed (every subscription is done with it)."""
        rec.outcome = outcome
        rec.error = error
        self.undecided -= 1
        self.inflight_bytes -= len(rec.payload)
        rec.payload = b""

    def remove(self, rec: Record) -> None:
        """`rec` leaves the book (final, or a destination record nobody here has a part in)."""
        del self.by_gid[rec.gid]
        if rec.origin is not None:
            self.destination_records -= 1
        if rec.payload:
            self.inflight_bytes -= len(rec.payload)
            rec.payload = b""
