"""The edge's exactly-once rules (common/passrules.py), over their inputs: what counts as a stall,
when held mesh input is stale and waits one more poll (once), in which order a pass takes its
input, and when hand-overs are held and released after a stall.

The engine (tests/unit/test_engine_input_order.py) and the simulator (tests/sim/test_edge_sim.py)
carry these answers out; here they are checked as plain functions of times and counts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from oncemesh.common.passrules import (
    HOLD_GAP,
    STALL_GAP,
    HandoverHold,
    HeldInput,
    PassBudget,
    PassClock,
    PassEnd,
    Read,
    Source,
    Timer,
    holds_input,
)

times = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
timeouts = st.none() | st.floats(min_value=0.0, max_value=5.0, allow_nan=False)


@given(st.lists(st.tuples(times, times, timeouts), min_size=1, max_size=20))
def test_a_poll_is_a_stall_when_it_overran_its_timeout_or_the_pass_before_took_long(
        polls: list[tuple[float, float, float | None]]) -> None:
    clock = PassClock()
    now = 1.0
    previous_return = 0.0
    for n, (gap, took, timeout) in enumerate(polls, start=1):
        before = now + gap  # the previous pass took `gap`
        after = before + took
        told = clock.polled(before, after, timeout)
        overran = timeout is not None and took > timeout + HOLD_GAP
        slow_pass = previous_return > 0.0 and before - previous_return > HOLD_GAP
        assert told is (overran or slow_pass)
        assert clock.passes == n and clock.stall_noted is told
        # a poll that overran its timeout dates from before it (it returned the events of then)
        late = timeout is not None and took > timeout + STALL_GAP
        assert clock.polled_at == (before if late else after)
        assert clock.note_stall() is not told  # told once per pass
        assert clock.note_stall() is False
        previous_return = now = after


@given(times, times)
def test_input_taken_long_after_its_poll_is_a_stall_told_once(polled: float, later: float) -> None:
    clock = PassClock()
    clock.polled(polled, polled, 1.0)
    told = clock.input_taken(polled + later)
    assert told is (later > HOLD_GAP)
    assert clock.input_taken(polled + later + HOLD_GAP + 1) is not told  # (once per pass)


@given(times, times, times)
def test_held_input_is_stale_after_a_gap_since_its_read_or_its_poll(polled: float, read: float, now: float) -> None:
    clock = PassClock()
    clock.polled(polled, polled, None)
    since = min(read, polled) if polled > 0.0 else read
    assert clock.stale(read, now) is (now - since > STALL_GAP)


def test_only_a_peers_input_is_held() -> None:
    assert holds_input(Source.MESH) and not holds_input(Source.CLIENT)


ops = st.lists(st.sampled_from(["read", "eof", "end", "end stale", "timer", "timer stale", "lost"]), max_size=40)


@given(ops)
def test_held_input_waits_one_more_poll_at_most_and_its_eof_follows_it(script: list[str]) -> None:
    """Against a model: a batch of held input is taken at the latest at the second pass end after
    it was held; an EOF read behind it is taken with it, never before; a timer takes it first
    unless it is stale (and has not waited yet)."""
    h = HeldInput()
    held = eof_behind = repolled = False
    for op in script:
        if op == "read":
            r = h.read(1.0)
            assert r is (Read.HOLD if held else Read.HOLD_FIRST)
            held = True
        elif op == "eof":
            assert h.eof() is held
            eof_behind = eof_behind or held
        elif op.startswith("end"):
            got = h.at_pass_end(op == "end stale")
            if not held:
                assert got is PassEnd.NOTHING
                continue
            if op == "end stale" and not repolled:
                assert got is PassEnd.REPOLL
                repolled = True
                continue
            assert got is PassEnd.TAKE
            assert h.taken() is eof_behind
            held = eof_behind = repolled = False
        elif op.startswith("timer"):
            got2 = h.on_timer(op == "timer stale")
            if not held:
                assert got2 is Timer.NOTHING
            elif op == "timer stale" and not repolled:
                assert got2 is Timer.WAIT
            else:
                assert got2 is Timer.TAKE_FIRST
                assert h.taken() is eof_behind
                held = eof_behind = repolled = False
        else:  # the connection was lost: what it held first
            if held:
                assert h.taken() is eof_behind
            held = eof_behind = repolled = False
        assert h.held is held and h.eof_held is eof_behind and h.repolled is repolled


def test_a_closed_connection_takes_its_held_input_at_once() -> None:
    h = HeldInput()
    h.read(0.0)
    assert h.at_pass_end(stale=True, closed=True) is PassEnd.TAKE


@given(st.integers(min_value=1, max_value=1000))
def test_hand_overs_are_released_at_the_end_of_the_second_pass_after_the_stalls(passes: int) -> None:
    """Told at the poll or while taking input: the next pass is the first whose poll began after
    the stall, and the one after it sees the goodbyes (EOF) behind the data that one read."""
    clock = PassClock()
    clock.passes = passes
    due = HandoverHold().stalled(clock)
    assert due == passes + 2
    for p in range(passes, due + 3):
        clock.passes = p
        assert HandoverHold.release_due(due, clock) is (p >= due)
    assert HandoverHold(enabled=False).stalled(clock) is None  # (the hold taken out)


# ------------------------------------------------------------------ rule 5: a budget per connection and pass


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 100_000), st.integers(0, 40)), max_size=60),
       st.integers(1, 70_000), st.integers(1, 20))
def test_a_connection_takes_at_most_its_budget_per_pass(
        steps: list[tuple[bool, int, int]], input_budget: int, endpoint_budget: int) -> None:
    """Against a model: within one pass a connection is given at most `input_budget` bytes and
    `endpoint_budget` endpoint events, whatever it asks; a new pass gives it the whole budget again;
    it is never given more than is there, and never nothing while its pass has budget left."""
    clock = PassClock()
    b = PassBudget(input_budget, endpoint_budget)
    given_bytes = handled = 0
    for new_pass, available, events in steps:
        if new_pass:
            clock.polled(1.0, 1.0, 0.0)
            given_bytes = handled = 0
        n = b.input(clock, available)
        assert 0 <= n <= available
        assert n == min(available, input_budget - given_bytes)
        given_bytes += n
        left = b.endpoint_events(clock)
        assert left == endpoint_budget - handled
        took = min(left, events)
        b.handled(clock, took)
        handled += took
        assert given_bytes <= input_budget and handled <= endpoint_budget


def test_a_flood_is_taken_in_slices_one_per_pass() -> None:
    """10,000 attaches read at once (~100 bytes each): a pass takes one slice of the bytes and
    handles at most the budget's endpoint events; the rest waits, and every pass takes more."""
    clock = PassClock()
    b = PassBudget(16 * 1024, 16)
    waiting_bytes, waiting_events, passes = 10_000 * 100, 10_000, 0
    while waiting_bytes or waiting_events:
        clock.polled(1.0 + passes / 1000, 1.0 + passes / 1000, 0.0)
        passes += 1
        took = b.input(clock, waiting_bytes)
        assert 0 < took <= 16 * 1024 or not waiting_bytes
        waiting_bytes -= took
        events = min(b.endpoint_events(clock), waiting_events)
        assert 0 < events <= 16
        b.handled(clock, events)
        waiting_events -= events
        assert b.endpoint_events(clock) == 16 - events and b.input(clock, 1) in (0, 1)
    assert passes == 10_000 // 16


def test_no_budget_while_a_stall_holds_hand_overs() -> None:
    """After a stall, a client's input read in a pass is taken in that pass (before its held mesh
    input: rule 1), as long as rule 4 holds hand-overs; then the budget applies again."""
    clock = PassClock()
    b = PassBudget(100, 2)
    clock.polled(1.0, 1.0, 0.0)
    assert b.input(clock, 1000) == 100 and b.endpoint_events(clock) == 2
    clock.polled(1.0, 3.0, 0.0)  # a poll that overran its timeout: a stall
    due = HandoverHold().stalled(clock)
    assert due is not None
    while clock.passes <= due:
        assert b.input(clock, 10**6) == 10**6 and b.endpoint_events(clock) == -1
        clock.polled(3.0, 3.0, 0.0)
    assert b.input(clock, 1000) == 100 and b.endpoint_events(clock) == 2


def test_a_budget_lets_some_work_through() -> None:
    for args in ((0, 1), (1, 0)):
        try:
            PassBudget(*args)
        except ValueError:
            continue
        raise AssertionError(f"PassBudget{args} would stop a connection for good")
