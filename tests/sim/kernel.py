"""The simulators' kernel: one seeded scheduler, one network, one violation type, one replay.

The three simulations (the whole mesh in simulator.py, the sequencer in order_sequencer_sim.py,
Lamport in test_order_lamport_sim.py) run real sans-IO cores under this kernel. Everything random
is drawn from the scheduler's `rng`, and events at the same time run in the order they were
scheduled, and nothing iterates in an order that depends on the interpreter's hash seed or on
object addresses, so a seed replays exactly, in any process (test_kernel.py runs some under two
hash seeds).

The network: per ordered pair (src, dst) a FIFO channel; a frame arrives after the delay its sender
drew, never before a frame sent earlier on the same pair. Each channel belongs to a connection,
numbered per ordered pair or per link (both directions share one: TCP); `reset` starts a new
connection, and a frame of an earlier connection is lost on arrival. A receiver that cannot take a
frame yet (a frozen process: the kernel buffers it) returns False and gets it again `retry` later,
still subject to its connection.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import os
import random
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Violation(AssertionError):
    """A promise the simulated system broke (the message says which, the trace shows how)."""


class Scheduler:
    """A clock and the events still to come, ordered by (time, order of scheduling)."""

    def __init__(self, seed: int, start: float = 0.0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = start
        self.steps = 0
        self._events: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        # `trace()`: a running digest of every step (its time and what ran), for comparing two
        # versions of the code seed by seed (tests/sim/trace_hashes.py); off unless asked for
        self._trace: Any = None

    def trace(self) -> None:
        """Keep a digest of every step from now on (`digest()`)."""
        self._trace = hashlib.blake2b(digest_size=8)

    def digest(self) -> str:
        return self._trace.hexdigest() if self._trace is not None else ""

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, fn, args))

    def after(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + delay, fn, *args)

    def pending(self) -> bool:
        return bool(self._events)

    def next_at(self) -> float:
        """When the next event happens (infinity: nothing is scheduled)."""
        return self._events[0][0] if self._events else math.inf

    def retime(self, shift: Callable[[Callable[..., Any], tuple[Any, ...]], float]) -> None:
        """Move events still to come later by `shift(fn, args)` seconds (0: unchanged)."""
        self._events = [(t + shift(fn, args), q, fn, args) for t, q, fn, args in self._events]
        heapq.heapify(self._events)

    def step(self) -> None:
        t, _, fn, args = heapq.heappop(self._events)
        self.now = t
        self.steps += 1
        if self._trace is not None:
            self._trace.update(f"{t!r} {getattr(fn, '__qualname__', '?')}\n".encode())
        fn(*args)

    def run(self, *, until: float = math.inf, stop: Callable[[], bool] | None = None,
            max_steps: int | None = None, runaway: bool = False) -> None:
        """Run events up to time `until`, until `stop()` holds after one, or for `max_steps` (then a
        Violation when `runaway`: a simulation that should have ended by then)."""
        while self._events and self._events[0][0] <= until:
            if max_steps is not None and self.steps >= max_steps:
                if runaway:
                    raise Violation(f"runaway simulation: {self.steps} events")
                return
            self.step()
            if stop is not None and stop():
                return


class Network:
    """FIFO channels between named processes, with connections (see the module's docstring)."""

    def __init__(self, sched: Scheduler, *, per_link: bool, retry: float = 0.05) -> None:
        self.sched = sched
        self.per_link = per_link
        self.retry = retry
        self.frames = 0
        self._conn: dict[Any, int] = {}
        self._last: dict[tuple[str, str], float] = {}

    def _key(self, a: str, b: str) -> Any:
        return frozenset((a, b)) if self.per_link else (a, b)

    def connection(self, a: str, b: str) -> int:
        return self._conn.get(self._key(a, b), 0)

    def reset(self, a: str, b: str) -> None:
        """A new connection between a and b: what is in flight on the old one is lost."""
        k = self._key(a, b)
        self._conn[k] = self._conn.get(k, 0) + 1

    def send(self, src: str, dst: str, delay: float, deliver: Callable[..., bool | None], *args: Any) -> float:
        """`deliver(*args)` at dst after `delay` (FIFO per pair), unless the connection was reset.
        Returns when it arrives."""
        at = max(self.sched.now + delay, self._last.get((src, dst), 0.0))
        self._last[(src, dst)] = at
        self.frames += 1
        self.sched.at(at, self._arrive, src, dst, self.connection(src, dst), deliver, args)
        return at

    def delay_sent(self, src: str, lag: dict[str, float]) -> None:
        """Frames `src` sent that are still in flight arrive `lag[dst]` later (a dead process's
        last frames crawling in; the order per channel is kept)."""
        def shift(fn: Callable[..., Any], args: tuple[Any, ...]) -> float:
            return lag[args[1]] if fn == self._arrive and args[0] == src else 0.0
        self.sched.retime(shift)
        for dst, extra in lag.items():
            if (src, dst) in self._last:
                self._last[(src, dst)] += extra

    def _arrive(self, src: str, dst: str, conn: int, deliver: Callable[..., bool | None], args: tuple[Any, ...]) -> None:
        if self.connection(src, dst) != conn:
            return
        if deliver(*args) is False:  # not taken yet: buffered, offered again later
            self.sched.after(self.retry, self._arrive, src, dst, conn, deliver, args)


def replay_line(command: str) -> str:
    """The command that replays a run (exactly, in any process: no hash seed to give)."""
    return command


def judged(run: Callable[[], T], *, what: str, replay: str, describe: Callable[[], str],
           crashes: bool = False) -> T:
    """Run a simulation; a Violation (and with `crashes` any exception of the code under test)
    fails the test with what was simulated, the command that replays it and the simulation's trace."""
    try:
        return run()
    except Violation as exc:
        raise AssertionError(f"{what}: {exc}\nreplay: {replay_line(replay)}\n{describe()}") from None
    except Exception as exc:
        if not crashes:
            raise
        raise AssertionError(f"{what}: {type(exc).__name__}: {exc}\nreplay: {replay_line(replay)}\n"
                             f"{describe()}") from exc


def env_seeds(default: int, var: str = "ONCEMESH_ORDER_SEEDS") -> range:
    """Seeds 1..N, N from the environment (more seeds on demand) or `default`."""
    return range(1, int(os.environ.get(var, default)) + 1)


def env_seed(var: str = "ONCEMESH_ORDER_SEED") -> int | None:
    """The one seed to replay, from the environment (None: no replay asked for)."""
    seed = os.environ.get(var)
    return None if seed is None else int(seed)
