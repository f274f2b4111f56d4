"""A simulated router's event loop, in passes, carrying out the edge's rules (common/passrules.py)
as the real engine does (common/engine.py, router/server.py `_on_stall`).

A pass: the poll returns the connections that have input (in the order it came; after a stop on
the way out of the poll, only those that had input when the process stopped), the pass reads each
of them (a read takes everything that connection has up to its end, which the next pass's read
sees: a client's input is taken at once, a peer's is held), runs the timer if it is due (the idle timer takes held input first, unless stale), then
ends: a release of held hand-overs that is due, then the held input the rules say to take (the
rest waits one more poll), then the router performs its actions (`SimRouter.process`, the drain).

A router whose input does not pile up needs none of this: the kernel hands it each input at its own
instant, its poll returns that one input and its pass is exactly the call the simulator made
before passes existed (`busy` is False, the caller goes on as before, and the traces of the
simulations without stall faults stay the same). Input piles up only while the router is stopped
(SIGSTOP: its clock runs, it processes nothing), while it is starved (each pass takes long) or while
its rules still wait (held input, a hold not released yet); then the input goes through `arrive`
and passes of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oncemesh.common.passrules import (
    HandoverHold,
    HeldInput,
    PassClock,
    PassEnd,
    Read,
    Source,
    Timer,
    holds_input,
)

if TYPE_CHECKING:
    from tests.sim.simulator import SimRouter

STOP_MODES = ("poll", "wake", "read")  # stopped idle in its poll / on its way out of it / after a read


@dataclass(slots=True, eq=False)
class Input:
    """Something a connection said: `fn` makes the router take it. `key` names the connection (a
    client link's token; ("mesh", peer, connection number)); `eof`: the connection's end."""

    key: Any
    source: Source
    fn: Callable[[], object]
    eof: bool = False


class SimLoop:
    def __init__(self, router: SimRouter, hold_after_stall: bool = True) -> None:
        self.r = router
        self.k = router.sim.k
        self.hold = HandoverHold(hold_after_stall)
        self.reset()

    def reset(self) -> None:
        """A new process (start, restart): nothing piled, nothing held."""
        self.clock = PassClock()
        self.pile: list[Input] = []  # arrived, not read yet (in the socket buffers)
        self.held: dict[Any, tuple[HeldInput, list[Input]]] = {}  # read, held to a pass end
        self.after_pass: list[tuple[str, Any]] = []  # ("release", due) / ("held", key), in order
        self.releases: list[int] = []  # hold releases armed, not yet due
        self.repolls: list[Any] = []  # held input waiting for one more poll
        self.stopped = False
        self.stop_armed: tuple[str, float] | None = None  # (mode, seconds): stops at the next input
        self.first_poll: Any = None  # (stopped on its way out of its poll: what that poll returned)
        self.mid_pass = False  # stopped after a read: the pass ends when it goes on
        self.starved_until = 0.0
        self.waiting = False  # a pass is on its way (scheduled)
        self.poll_began = 0.0  # when the loop last began to wait in its poll (the previous pass ended)
        self.poll_timeout: float | None = None  # ... until its timer (as it was then)
        self.next_tick = 0.0  # when the router's timer is due next
        self.timer_due = False
        self.pass_timer = False  # the timer was due when this pass polled: it runs in this pass
        self.input_at = 0.0  # when the latest input was taken, in pass `input_pass`
        self.input_pass = -1
        self.in_pass = False  # between a poll and its pass end
        self.stops = 0  # stops so far (a thaw belongs to one)
        self.on_stop: Callable[[], None] = lambda: None  # (the simulation: its clients time it out)

    @property
    def now(self) -> float:
        return self.k.now

    def busy(self) -> bool:
        """Must input go through `arrive` (piled and taken in passes)? False: nothing piles up,
        the caller takes it at once as a pass of its own."""
        return bool(self.stopped or self.stop_armed or self.waiting or self.mid_pass or self.pile
                    or self.held or self.releases or self.repolls or self.now < self.starved_until)

    # -- faults ----------------------------------------------------------------------------------
    def stop(self, mode: str, seconds: float, on_stop: Callable[[], None]) -> None:
        """SIGSTOP for `seconds`: now, idle in its poll ("poll"), or at the next input, on its way
        out of the poll that reported it ("wake") or after reading it ("read")."""
        self._enter()
        self.on_stop = on_stop
        if mode == "poll":
            self._begin_stop(seconds)
        else:
            self.stop_armed = (mode, seconds)

    def _begin_stop(self, seconds: float) -> None:
        self.stopped = True
        self.stops += 1
        stop, inc = self.stops, self.r.incarnation
        self.k.after(seconds, self._thaw, stop, inc)
        self.on_stop()

    def starve(self, until: float) -> None:
        """Every pass until then takes long (a CPU shared with something greedier)."""
        self._enter()
        self.starved_until = until

    def _enter(self) -> None:
        """From passes of one input each (at their own instants, not timed) to timed passes: the
        loop has been waiting in its poll since its latest input, just now."""
        if not self.busy():
            self._poll_begins(self.now)
            self.clock.returned = self.now

    def _poll_begins(self, now: float) -> None:
        self.poll_began = now
        self.poll_timeout = 0.0 if self.timer_due else max(0.0, self.next_tick - now) if self.next_tick else None

    def _thaw(self, stop: int, inc: int) -> None:
        if stop != self.stops or inc != self.r.incarnation or not self.stopped or not self.r.alive:
            return
        self.thaw()

    def thaw(self) -> None:
        """SIGCONT: the loop goes on where it stopped."""
        if not self.stopped:
            return
        self.r.sim.note(f"{self.r.id} goes on ({len(self.pile)} inputs piled)")
        self.stopped = False
        if self.mid_pass:
            self.mid_pass = False
            self._finish(self.now)
        else:
            self._wake()

    # -- input -----------------------------------------------------------------------------------
    def arrive(self, inp: Input) -> None:
        """Input reaches the router's socket."""
        self.pile.append(inp)
        if self.stop_armed is not None:
            mode, seconds = self.stop_armed
            self.stop_armed = None
            if mode == "wake":  # its poll returned this connection, then the process stopped
                self.first_poll = inp.key
                self._poll_begins(self.now)  # (the poll that returned it)
                self._begin_stop(seconds)
                return
            # "read": the pass reads it, then the process stops before the pass ends
            self._poll(stop_after_reads=seconds)
            return
        self._wake()

    def timer(self) -> None:
        """The router's timer is due (the tick)."""
        self.timer_due = True
        self._wake()

    def _wake(self) -> None:
        if not self.stopped and not self.waiting and not self.mid_pass:
            self.waiting = True
            self.k.after(0.0, self._poll_event, self.r.incarnation)

    # -- a pass ----------------------------------------------------------------------------------
    def _poll_event(self, inc: int) -> None:
        if inc != self.r.incarnation or not self.r.alive or self.stopped:
            self.waiting = False
            return
        self._poll()

    def _poll(self, stop_after_reads: float | None = None) -> None:
        now = self.now
        self.in_pass = True
        before = self.poll_began or now
        if self.clock.polled(before, now, self.poll_timeout):
            self._stalled()
        if self.first_poll is not None:
            ready = [self.first_poll] if any(i.key == self.first_poll for i in self.pile) else []
            self.first_poll = None
        else:
            ready = list(dict.fromkeys(i.key for i in self.pile))
        # timers due when the poll returned run in this pass (one that falls due later, in the next)
        self.pass_timer, self.timer_due = self.timer_due, False
        # the pass's start: releases due at its end, then held input back from one more poll
        for due in list(self.releases):
            if HandoverHold.release_due(due, self.clock):
                self.releases.remove(due)
                self.after_pass.append(("release", due))
        self.after_pass.extend(("held", key) for key in self.repolls)
        self.repolls.clear()
        if stop_after_reads is not None:
            self._reads(ready)
            self.mid_pass = True
            self.waiting = False
            self._begin_stop(stop_after_reads)
            return
        cost = self.r.sim.rng.uniform(0.01, 0.9) if now < self.starved_until else 0.0
        self.waiting = True
        if cost:
            self.k.after(cost, self._work, ready, self.r.incarnation)
        else:
            self._work(ready, self.r.incarnation)

    def _work(self, ready: list[Any], inc: int) -> None:
        if inc != self.r.incarnation or not self.r.alive:
            return
        self._reads(ready)
        self._finish(self.now)

    def _reads(self, ready: list[Any]) -> None:
        for key in ready:
            # a read takes all the socket has, up to its end; the end is seen by the read after
            # (asyncio: one recv per ready socket and pass; an empty one is the EOF)
            mine = [i for i in self.pile if i.key == key]
            if not mine[0].eof:
                mine = mine[:next((n for n, i in enumerate(mine) if i.eof), len(mine))]
            else:
                mine = mine[:1]
            for inp in mine:
                self.pile.remove(inp)
                self._read(inp)

    def _read(self, inp: Input) -> None:
        if not holds_input(inp.source):
            self._take([inp])
            return
        entry = self.held.get(inp.key)
        if inp.eof:
            if entry is not None and entry[0].eof():
                entry[1].append(inp)  # (the end waits behind the input it follows)
            else:
                self._take([inp])
            return
        if entry is None:
            entry = self.held[inp.key] = (HeldInput(), [])
        if entry[0].read(self.now) is Read.HOLD_FIRST:
            self.after_pass.append(("held", inp.key))
        entry[1].append(inp)

    def input_time(self) -> float:
        """When what the router decides now was decided (`Engine.input_time`, the log's stamp: the
        latest input this pass took; now when it took none, or between passes)."""
        if self.input_pass == self.clock.passes and self.in_pass:
            return self.input_at
        return self.now

    def _take(self, inputs: list[Input]) -> None:
        self.input_at, self.input_pass = self.now, self.clock.passes
        if self.clock.input_taken(self.now):
            self._stalled()
        for inp in inputs:
            if self.r.alive:
                inp.fn()

    def _take_held(self, key: Any) -> None:
        h, inputs = self.held.pop(key)
        h.taken()
        self._take(inputs)

    def _stale(self, h: HeldInput) -> bool:
        return not h.repolled and self.clock.stale(h.since, self.now)

    def _finish(self, now: float) -> None:
        """The rest of a pass after its reads: the timer if due, then the pass end."""
        r = self.r
        if self.pass_timer:
            self.pass_timer = False
            for key, (h, _) in list(self.held.items()):
                if h.on_timer(self._stale(h)) is Timer.TAKE_FIRST:
                    self._take_held(key)
            if r.alive:
                r.node.tick(now)
        entries, self.after_pass = self.after_pass, []
        for kind, x in entries:
            if not r.alive:
                break
            if kind == "release":
                r.core.release_handovers()
            elif x in self.held:
                h = self.held[x][0]
                if h.at_pass_end(self._stale(h)) is PassEnd.REPOLL:
                    self.repolls.append(x)
                else:
                    self._take_held(x)
        if r.alive:
            r.process()
        self.waiting = False
        self.in_pass = False
        self._poll_begins(now)
        if self.pile or self.repolls or self.releases or self.timer_due:
            self._wake()

    def _stalled(self) -> None:
        due = self.hold.stalled(self.clock)
        if due is None:
            return
        self.r.sim.note(f"{self.r.id} stalled: hand-overs held until the end of pass {due}")
        self.r.core.hold_handovers()
        self.releases.append(due)
