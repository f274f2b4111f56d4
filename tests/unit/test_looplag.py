"""Event-loop lag accounting (router/looplag.py): per-window max and p99, stalls, GC pauses."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from oncemesh.router.looplag import LoopLag


def test_a_window_summarises_max_and_p99_then_starts_again() -> None:
    lag = LoopLag(window=60.0, stall=0.5)
    assert lag.sample(0.001, 0.0) == (None, False)
    for i in range(1, 199):
        done, stall = lag.sample(0.002, i * 0.25)
        assert done is None and not stall
    assert lag.sample(0.1, 50.0) == (None, False)
    assert lag.sample(0.7, 55.0) == (None, True)  # a stall is told at once
    cur = lag.current()
    assert cur.samples == 201 and cur.max_ms == 700.0 and 2.0 <= cur.p99_ms <= 100.0
    done, _ = lag.sample(0.003, 60.0)  # the minute is over: its summary, and a fresh window
    assert done is not None and done.samples == 201 and done.max_ms == 700.0
    assert lag.last == done and lag.current().samples == 1 and lag.current().max_ms == 3.0
    assert lag.worst_ms == 700.0


def test_gc_pauses_count_in_their_window() -> None:
    lag = LoopLag(window=10.0)
    lag.sample(0.0, 0.0)
    assert lag.gc_pause(0.25, 1.0) is None
    assert lag.gc_pause(0.05, 2.0) is None
    assert lag.current().gc_max_ms == 250.0
    done = lag.gc_pause(0.01, 11.0)
    assert done is not None and done.gc_max_ms == 250.0 and lag.current().gc_max_ms == 10.0


@given(st.lists(st.floats(0.0, 5.0), min_size=1, max_size=500))
def test_p99_is_a_sample_at_or_below_the_max_with_at_most_1_percent_above(lags: list[float]) -> None:
    lag = LoopLag(window=1e9)
    for i, x in enumerate(lags):
        lag.sample(x, float(i))
    s = lag.current()
    ms = [x * 1000 for x in lags]
    assert s.max_ms == max(ms) and s.p99_ms in ms and s.p99_ms <= s.max_ms
    assert sum(1 for x in ms if x > s.p99_ms) <= len(ms) // 100


def test_the_status_file_is_not_rewritten_for_lag_figures_alone() -> None:
    from oncemesh.router.looplag import LagSummary
    from oncemesh.router.server import _VOLATILE_STATS

    assert {*LagSummary(0, 0.0, 0.0, 0.0).fields(), "loop_lag_worst_ms", "rss_kb"} == set(_VOLATILE_STATS)
