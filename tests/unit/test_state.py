"""The per-subscription state rules (router/state.py, applied by router/records.py): every (from, to) pair is either a move of the
table, which keeps `Record.pending` equal to the number of subscriptions still QUEUED or SENT, or
raises IllegalMove and changes nothing."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncemesh.router.records import MOVES, RecordBook
from oncemesh.router.state import RESOLVED, S_ENDED, S_QUEUED, S_SENT, IllegalMove, Record, S

move = RecordBook().move

STATES: list[S | None] = [None, *S]


def _pending(rec: Record) -> int:
    return sum(1 for v in rec.owed.values() if v in (S_QUEUED, S_SENT))


def _record_in(state: S | None, others: dict[str, S] | None = None) -> Record:
    rec = Record("g" * 16 + ":1", "t", b"x", 0.0)
    for sid, s in (others or {}).items():
        rec.owed[sid] = s
    if state is not None:
        rec.owed["s"] = state
    rec.pending = _pending(rec)
    return rec


@pytest.mark.parametrize(("old", "to"), list(itertools.product(STATES, STATES)),
                         ids=lambda s: "absent" if s is None else s.name)
def test_every_pair_is_a_move_or_refused(old: S | None, to: S | None) -> None:
    rec = _record_in(old, {"other": S_QUEUED})
    before = (dict(rec.owed), rec.pending)
    if (old, to) in MOVES:
        move(rec, "s", to)
        assert rec.owed.get("s") == to
        assert rec.owed["other"] == S_QUEUED
        assert rec.pending == _pending(rec)
    else:
        with pytest.raises(IllegalMove, match=r"message g+:1 for subscription s"):
            move(rec, "s", to)
        assert (rec.owed, rec.pending) == before


def test_the_table_says_what_the_design_says() -> None:
    # a resolution is final but for the one correction the client's presented ids make
    for res in RESOLVED:
        assert {to for (old, to) in MOVES if old == res} <= {S.ACCEPTED}
    assert (S_ENDED, S.ACCEPTED) in MOVES
    assert (S.ACCEPTED, S.ACCEPTED) not in MOVES  # accepted twice is a duplicate, never a move
    assert (None, S_SENT) not in MOVES  # nothing is handed that was not owed first
    assert (None, None) not in MOVES
    # every entry's delta is what pending's definition makes it
    live = {S_QUEUED, S_SENT}
    for (old, to), delta in MOVES.items():
        assert delta == (to in live) - (old in live)


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(STATES)), max_size=60))
def test_pending_stays_true_over_any_sequence(steps: list[tuple[str, S | None]]) -> None:
    rec = _record_in(None)
    for sid, to in steps:
        old = rec.owed.get(sid)
        try:
            move(rec, sid, to)
        except IllegalMove:
            assert (old, to) not in MOVES
            assert rec.owed.get(sid) == old
        else:
            assert (old, to) in MOVES
            assert rec.owed.get(sid) == to
        assert rec.pending == _pending(rec)
