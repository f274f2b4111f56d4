"""How late the router's event loop runs its timers: the measure of a stall.

The router's tick is a timer; how much later than asked it runs is the time the loop spent on
something else (a long pass, a collection, a slow disk). A lag past the idle timeout closes every
connection, so the router measures it on every tick and reports, per minute, the maximum and the
99th percentile (in its status and its log), and logs a single lag beyond `stall` at once.
Collections of the cyclic garbage collector are timed too (their longest pause per minute): the
usual suspect of a stall that no code path explains.

Sans-IO: time is a parameter; the router feeds it samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LagSummary:
    """One minute (or the minute so far) of samples, in milliseconds."""

    samples: int
    max_ms: float
    p99_ms: float
    gc_max_ms: float

    def fields(self) -> dict[str, float]:
        return {"loop_lag_max_ms": round(self.max_ms, 1), "loop_lag_p99_ms": round(self.p99_ms, 1),
                "gc_pause_max_ms": round(self.gc_max_ms, 1), "loop_lag_samples": self.samples}


def _summary(lags: list[float], gc_max: float) -> LagSummary:
    if not lags:
        return LagSummary(0, 0.0, 0.0, gc_max * 1000)
    ordered = sorted(lags)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return LagSummary(len(lags), ordered[-1] * 1000, p99 * 1000, gc_max * 1000)


class LoopLag:
    """Samples of loop lag (seconds), summarised per `window` seconds."""

    def __init__(self, window: float = 60.0, stall: float = 0.5) -> None:
        self.window = window
        self.stall = stall
        self._start: float | None = None
        self._lags: list[float] = []
        self._gc_max = 0.0
        self.last: LagSummary | None = None  # the last complete window
        self.worst_ms = 0.0  # the largest lag since start

    def sample(self, lag: float, now: float) -> tuple[LagSummary | None, bool]:
        """One lag (seconds) at `now`. Returns (the summary of a window that just ended, whether
        this lag is a stall)."""
        done = self._roll(now)
        lag = max(lag, 0.0)
        self._lags.append(lag)
        self.worst_ms = max(self.worst_ms, lag * 1000)
        return done, lag >= self.stall

    def gc_pause(self, seconds: float, now: float) -> LagSummary | None:
        done = self._roll(now)
        self._gc_max = max(self._gc_max, seconds)
        return done

    def current(self) -> LagSummary:
        """The window so far."""
        return _summary(self._lags, self._gc_max)

    def _roll(self, now: float) -> LagSummary | None:
        if self._start is None:
            self._start = now
            return None
        if now - self._start < self.window:
            return None
        self.last = _summary(self._lags, self._gc_max)
        self._lags = []
        self._gc_max = 0.0
        self._start = now
        return self.last
