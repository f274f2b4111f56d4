"""interrouter.channel: reliable FIFO sessions over a path that loses, duplicates and reorders."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from oncemesh.interrouter.channel import Frame, Sessions


def deliver(ses: Sessions[int], f: Frame[int], src: str, now: float) -> tuple[list[int], bool]:
    return ses.receive(src, f.epoch, f.seq, f.ack_epoch, f.ack, f.msg, now)


def drain(ses: Sessions[int]) -> list[Frame[int]]:
    out, ses.out = ses.out, []
    return out


def test_in_order_once_and_acknowledged() -> None:
    a, b = Sessions[int](), Sessions[int]()
    for m in range(5):
        a.send("B", m, 1.0)
    got: list[int] = []
    for f in drain(a):
        ready, broken = deliver(b, f, "A", 1.0)
        got += ready
        assert not broken
    assert got == [0, 1, 2, 3, 4]
    assert a.unacked() == 5
    b.flush_acks()
    (ack,) = drain(b)
    assert ack.seq == 0 and ack.msg is None and ack.ack == 5
    deliver(a, ack, "B", 1.1)
    assert a.unacked() == 0
    b.flush_acks()
    assert drain(b) == []  # nothing owed any more


def test_acks_ride_on_messages() -> None:
    a, b = Sessions[int](), Sessions[int]()
    a.send("B", 7, 1.0)
    deliver(b, drain(a)[0], "A", 1.0)
    b.send("A", 8, 1.0)
    (f,) = drain(b)
    assert f.ack == 1
    b.flush_acks()
    assert drain(b) == []  # the message carried it
    ready, _ = deliver(a, f, "B", 1.0)
    assert ready == [8] and a.unacked() == 0


def test_lost_messages_go_again_after_retry() -> None:
    a, b = Sessions[int](retry=0.3), Sessions[int]()
    a.send("B", 1, 1.0)
    a.send("B", 2, 1.0)
    first, second = drain(a)
    assert deliver(b, second, "A", 1.0) == ([], False)  # early: held until 1 comes
    a.tick(1.2)
    assert drain(a) == []  # not yet
    a.tick(1.31)
    again = drain(a)
    assert [f.seq for f in again] == [1, 2]
    assert deliver(b, again[0], "A", 1.31) == ([1, 2], False)
    assert deliver(b, again[1], "A", 1.31) == ([], False)  # a duplicate
    assert b.stats["duplicates"] == 1 and a.stats["resent"] == 2


def test_reset_opens_a_new_epoch_and_the_receiver_reports_the_break() -> None:
    a, b = Sessions[int](), Sessions[int]()
    a.send("B", 1, 1.0)
    old = drain(a)[0]
    deliver(b, old, "A", 1.0)
    a.send("B", 2, 1.0)
    drain(a)  # lost with the connection
    a.reset("B")
    assert a.unacked() == 0
    a.send("B", 3, 2.0)
    new = drain(a)[0]
    assert new.epoch > old.epoch and new.seq == 1
    assert deliver(b, new, "A", 2.0) == ([3], True)
    assert deliver(b, old, "A", 2.0) == ([], False)  # of the old session: dropped
    assert b.stats["stale"] == 1


def test_the_receiver_goes_on_with_a_session_after_resetting_its_own() -> None:
    """B ends its session toward A (A looked unreachable to B); A did not notice and goes on with
    its session toward B: B still hands on what comes, in order."""
    a, b = Sessions[int](), Sessions[int]()
    a.send("B", 1, 1.0)
    deliver(b, drain(a)[0], "A", 1.0)
    b.reset("A")
    a.send("B", 2, 1.5)
    assert deliver(b, drain(a)[0], "A", 1.5) == ([2], False)


def test_epochs_grow_across_lives() -> None:
    a = Sessions[int]()
    a.send("B", 1, 5.0)
    e1 = drain(a)[0].epoch
    a2 = Sessions[int]()  # the same router restarted (no memory), later
    a2.send("B", 1, 5.5)
    assert drain(a2)[0].epoch > e1


def test_a_session_seen_mid_way_waits_for_its_start() -> None:
    """Its start was overtaken (or went to an earlier life of ours, then its sender opens a new
    session once it learns our incarnation): nothing is handed on out of order."""
    a, b = Sessions[int](), Sessions[int]()
    for m in range(3):
        a.send("B", m, 1.0)
    frames = drain(a)
    assert deliver(b, frames[2], "A", 1.0) == ([], False)
    assert deliver(b, frames[1], "A", 1.0) == ([], False)
    assert deliver(b, frames[0], "A", 1.0) == ([0, 1, 2], False)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**32))
def test_exactly_once_in_order_over_a_lossy_reordering_path(n: int, seed: int) -> None:
    """Whatever the path loses (not everything, forever), duplicates or reorders, the receiver hands
    on every message exactly once and in order, and the sender ends with nothing unacknowledged."""
    rng = random.Random(seed)
    a, b = Sessions[int](retry=0.3), Sessions[int]()
    now = 1.0
    got: list[int] = []
    for m in range(n):
        a.send("B", m, now)
    in_flight: list[tuple[str, Frame[int]]] = [("A", f) for f in drain(a)]
    for _step in range(2000):
        if len(got) == n and a.unacked() == 0:
            break
        now += 0.05
        rng.shuffle(in_flight)
        keep: list[tuple[str, Frame[int]]] = []
        for src, f in in_flight:
            r = rng.random()
            if r < 0.25:
                continue  # lost
            if r < 0.35:
                keep.append((src, f))  # delayed
                continue
            if src == "A":
                ready, broken = deliver(b, f, "A", now)
                assert not broken
                got += ready
            else:
                deliver(a, f, "B", now)
            if r < 0.4:
                keep.append((src, f))  # and duplicated
        b.flush_acks()
        a.tick(now)
        in_flight = keep + [("A", f) for f in drain(a)] + [("B", f) for f in drain(b)]
    assert got == list(range(n))
    assert a.unacked() == 0


def test_resends_back_off_until_something_is_acknowledged() -> None:
    """A peer slow to answer (reading a big message) is not buried under copies: each resend waits
    twice as long as the one before; an acknowledgement brings the wait back to `retry`."""
    a = Sessions[int](retry=0.3)
    a.send("B", 1, 0.0)
    epoch = drain(a)[0].epoch
    times = []
    now = 0.0
    while now < 5.0:
        now = round(now + 0.05, 2)
        a.tick(now)
        if drain(a):
            times.append(now)
    assert times[:4] == [0.3, 0.9, 2.1, 4.5]  # waits of 0.3, 0.6, 1.2, 2.4 s
    a.receive("B", 7, 0, epoch, 1, None, now)  # B acknowledges seq 1
    a.send("B", 2, now)
    drain(a)
    a.tick(now + 0.31)
    assert [f.seq for f in drain(a)] == [2]  # after 0.3 s again


def test_early_messages_beyond_the_bound_are_dropped_unacknowledged_and_come_again() -> None:
    a, b = Sessions[int](), Sessions[int](max_early=2)
    for m in range(5):
        a.send("B", m, 1.0)
    first, *rest = drain(a)
    for f in rest:  # 1..4 come before 0: two are kept, two dropped
        assert deliver(b, f, "A", 1.0) == ([], False)
    assert b.stats["early"] == 2 and b.stats["early_dropped"] == 2
    got, _ = deliver(b, first, "A", 1.0)
    assert got == [0, 1, 2]
    b.flush_acks()
    deliver(a, drain(b)[0], "B", 1.1)
    assert a.unacked() == 2
    a.tick(1.1 + a.retry)
    for f in drain(a):
        got += deliver(b, f, "A", 2.0)[0]
    assert got == [0, 1, 2, 3, 4]


def test_a_peer_that_acknowledges_nothing_is_refused_past_the_bound_and_the_session_ends() -> None:
    a, b = Sessions[int](max_unacked=3), Sessions[int]()
    assert all(a.send("B", m, 1.0) for m in range(3))
    assert a.send("B", 3, 1.0) is False and a.stats["overflows"] == 1
    assert a.unacked() == 0  # what it held is dropped with the session
    out = drain(a)
    assert [f.seq for f in out] == [1, 2, 3]
    for f in out:
        deliver(b, f, "A", 1.0)
    assert a.send("B", 4, 2.0)  # a new session, which the receiver reports as a break
    (f,) = drain(a)
    assert deliver(b, f, "A", 2.0) == ([4], True)
