"""The edge's exactly-once rules: what a router's loop decides, pass by pass, that exactly-once
depends on when its process stalls (SIGSTOP, a starved CPU).

Theory of operation
-------------------
A loop pass polls its sockets, reads what the poll reported, runs the timers that are due, and
ends (after-pass work, output). A router that stalled wakes to a peer's messages for a subscriber
and that subscriber's goodbye both waiting; the subscriber, its router silent, has failed over and
accepted the messages elsewhere. Handed into the old link they reach no one, yet they are on record
as a second delivery after the acceptance (docs/engine.md, "Input order"). Four rules keep
that from happening; each is a plain decision over times and counts, here, so that the engine
(common/engine.py: selectors, sockets, Proton) and the simulator (tests/sim) carry out the same:

1. Input order (`HeldInput`): a client connection's input is taken when it is read; a mesh
   connection's is read at once but held to the end of the pass, after every client's input of
   the pass. An EOF read behind held input waits behind it; a connection lost takes what it held
   first; a connection's idle timer takes held input first (its idle check must not miss what
   came), unless a stall made it stale.
2. What a stall is (`PassClock`): a poll that took longer than its timeout allowed (stopped in or
   around it), a pass before it that took longer than `HOLD_GAP`, or input taken that long after
   its pass polled. A poll that overran its timeout by more than `STALL_GAP` dates from before it:
   a process stopped on its way out of the poll wakes with the events of the moment it stopped.
3. Held input that went stale (more than `STALL_GAP` since it was read or since its pass polled)
   waits for one more poll and the reads it brings, once (`HeldInput.at_pass_end`): an overloaded
   loop whose every pass is slow must not starve the mesh.
4. After a stall, hand-overs to subscribers' links are held (`HandoverHold`) until the end of the
   second pass after the one that learned of it: the stall's pass may read only what was ready
   when the process stopped (a poll it was stopped on its way out of), the next one reads what came
   meanwhile, and a connection's end (a client's goodbye) behind data is seen by the read after
   that (one recv per socket and pass). Released then even if those passes stalled too: a slow
   loop delays hand-overs by two passes, never starves them.

A fifth rule is about liveness, not exactly-once, and lives here for the same reason (a plain
decision the engine carries out):

5. One connection's work per pass is bounded (`PassBudget`): a client connection pushes at most
   `INPUT_BUDGET` bytes of its input into its engine per pass, and the engine handles at most
   `ENDPOINT_BUDGET` of its endpoint events (attach, detach, begin, end, open, close: each costs the
   router far more than a transfer's bytes say) per pass. What is left waits for the next pass,
   in the order it came, and the socket is not read meanwhile: a connection flooding frames (10,000
   attaches in one burst) cannot hold the loop for more than milliseconds, and every other
   connection is served between its slices. A connection lost or ended takes what it left first
   (as rule 1's held input). Mesh connections have no budget (their peers are routers of the
   mesh). After a stall, and for as long as rule 4 holds hand-overs, there is no budget: a
   client's input read in a pass is taken in that pass, before the pass's held mesh input (rule
   1), which is when that order matters (a goodbye behind a pile of a client's input).

Nothing here reads a clock, logs or does I/O: times are parameters (monotonic seconds), answers
are values. `HandoverHold(enabled=False)` takes rule 4 out (the simulation's proof that it matters:
tests/sim/test_edge_sim.py).
"""

from __future__ import annotations

from enum import Enum

STALL_GAP = 0.1  # seconds: held mesh input at the end of a pass this long (a stall) waits for one more poll
HOLD_GAP = 0.5  # seconds: a pass this late (a process stopped, or starved) is a stall: hand-overs are held
INPUT_BUDGET = 64 * 1024  # bytes of one client connection's input pushed into its engine per pass (rule 5)
ENDPOINT_BUDGET = 16  # endpoint events of one client connection handled per pass (rule 5)


class PassClock:
    """The times of a loop's passes, and whether the current one comes after a stall (rule 2).

    `polled(before, after, timeout)` once per poll; `input_taken(now)` as input is taken; a stall
    is told once per pass (`note_stall`)."""

    __slots__ = ("passes", "polled_at", "returned", "stall_noted", "unbudgeted_until")

    def __init__(self) -> None:
        self.passes = 0  # polls so far: which pass this is
        self.polled_at = 0.0  # when this pass's poll returned (or began, if it overran its timeout)
        self.returned = 0.0  # when the previous poll returned (0: none yet)
        self.stall_noted = False  # this pass's stall was told
        self.unbudgeted_until = -1  # rule 5: no pass budget up to this pass (a stall's hold)

    def polled(self, before: float, after: float, timeout: float | None) -> bool:
        """A poll that began at `before` with `timeout` (None: no limit) returned at `after`: a new
        pass. True: it comes after a stall, tell it (`note_stall` is done)."""
        late = timeout is not None and after - before > timeout + STALL_GAP
        self.polled_at = before if late else after
        stalled = (timeout is not None and after - before > timeout + HOLD_GAP) or (
            self.returned > 0.0 and before - self.returned > HOLD_GAP)
        self.returned = after
        self.stall_noted = False
        self.passes += 1
        if stalled:
            return self.note_stall()
        return False

    def input_taken(self, now: float) -> bool:
        """Input is taken at `now`. True: taken long after its pass polled (stopped after the poll:
        what it reads now is the stall's), a stall to tell now."""
        if self.stall_noted or now - self.polled_at <= HOLD_GAP:
            return False
        return self.note_stall()

    def note_stall(self) -> bool:
        """This pass comes after a stall: True the first time in the pass (tell it), else False."""
        if self.stall_noted:
            return False
        self.stall_noted = True
        self.unbudgeted_until = self.passes + 2  # (as long as rule 4's hold: `HandoverHold.stalled`)
        return True

    def stale(self, held_since: float, now: float) -> bool:
        """Has the process stalled since input held from `held_since` was read, or since this pass
        polled? (Its clients may have said something meanwhile that is not read yet.)"""
        since = held_since
        if 0.0 < self.polled_at < since:
            since = self.polled_at
        return now - since > STALL_GAP


class Source(Enum):
    """Whose connection input comes on."""

    CLIENT = "client"
    MESH = "mesh"  # another router


def holds_input(source: Source) -> bool:
    """Rule 1: is this connection's input held to the end of its pass (a peer's: after the
    clients' input of the pass), or taken as it is read (a client's)?"""
    return source is Source.MESH


class Read(Enum):
    """What to do with input just read on a connection that holds its input."""

    HOLD = "hold"  # keep it; the pass end is already asked about this connection's held input
    HOLD_FIRST = "hold first"  # keep it, and ask `at_pass_end` at the end of this pass


class PassEnd(Enum):
    """What the end of a pass does with a connection's held input."""

    TAKE = "take"  # process what is held (then the EOF held behind it)
    REPOLL = "repoll"  # wait for one more poll: ask again at the end of the next pass
    NOTHING = "nothing"  # nothing held


class Timer(Enum):
    """What a connection's idle timer does with held input before its idle check."""

    TAKE_FIRST = "take first"
    WAIT = "wait"  # stale: the pass end takes it after one more poll; the check comes then
    NOTHING = "nothing"  # nothing held


class HeldInput:
    """One connection's input held to the end of its pass (rules 1 and 3), for a connection that
    `holds_input`; the others take their input as it is read and never ask."""

    __slots__ = ("held", "since", "eof_held", "repolled")

    def __init__(self) -> None:
        self.held = False  # input is held
        self.since = 0.0  # when the held input's first part was read
        self.eof_held = False  # an EOF that came after held input: it follows that input
        self.repolled = False  # the held input already waited for one more poll

    def read(self, now: float) -> Read:
        """Input was read at `now`: it is held."""
        if self.held:
            return Read.HOLD
        self.held = True
        self.since = now
        return Read.HOLD_FIRST

    def eof(self) -> bool:
        """The peer ended its input. True: held behind the held input (taken with it); False:
        take the end now."""
        if self.held:
            self.eof_held = True
            return True
        return False

    def at_pass_end(self, stale: bool, closed: bool = False) -> PassEnd:
        """The end of the pass that held input (`stale`: `PassClock.stale`)."""
        if not self.held:
            return PassEnd.NOTHING
        if stale and not closed and not self.repolled:
            self.repolled = True
            return PassEnd.REPOLL
        return PassEnd.TAKE

    def on_timer(self, stale: bool) -> Timer:
        if not self.held:
            return Timer.NOTHING
        if stale and not self.repolled:
            return Timer.WAIT
        return Timer.TAKE_FIRST

    def taken(self) -> bool:
        """The held input is being processed (lost, timer, pass end): True if an EOF follows it."""
        eof = self.eof_held
        self.held = False
        self.repolled = False
        self.eof_held = False
        return eof


class HandoverHold:
    """Rule 4: after a stall, hand nothing to a subscriber's link until the end of the second pass
    after the one that learned of it. `stalled` when a stall is told; at the start of each pass
    `release_due` says whether the release belongs to this pass's end (before the input it holds
    back is taken there)."""

    __slots__ = ("enabled",)

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # False: no hold (the simulation's proof that it is needed)

    def stalled(self, clock: PassClock) -> int | None:
        """A stall was told in pass `clock.passes`: hold hand-overs now; returns the pass at whose end
        they are released (None: the hold is off). The next pass is the first whose poll began after
        the stall (the stall's own poll, if it was told there, may have returned only the sockets
        ready when the process stopped); the one after it sees the ends behind the data that one
        read. (Until the simulation found it, a stall told at the poll released a pass earlier:
        a subscriber's goodbye behind its credit came after the release, and a peer's message held
        to that pass end went into its link: tests/sim/test_sim.py, stop seed 29.)"""
        if not self.enabled:
            return None
        return clock.passes + 2

    @staticmethod
    def release_due(due: int, clock: PassClock) -> bool:
        """At the start of a pass: does the release due at the end of pass `due` belong to this one?"""
        return clock.passes >= due


class PassBudget:
    """Rule 5: what one connection may take in one pass. The engine asks `input` before it pushes
    bytes read (or left from an earlier pass) and `endpoint_events` before it handles endpoint
    events, each with the loop's `PassClock`; each pass starts with a full budget, and the passes
    of a stall's hold have none. An answer smaller than what is there means: leave the rest for
    the next pass."""

    __slots__ = ("input_budget", "endpoint_budget", "pass_no", "input_left", "endpoints_left")

    def __init__(self, input_budget: int = INPUT_BUDGET, endpoint_budget: int = ENDPOINT_BUDGET) -> None:
        if input_budget < 1 or endpoint_budget < 1:
            raise ValueError("a pass budget must let some work through")
        self.input_budget = input_budget
        self.endpoint_budget = endpoint_budget
        self.pass_no = -1
        self.input_left = input_budget
        self.endpoints_left = endpoint_budget

    def _refill(self, pass_no: int) -> None:
        if pass_no != self.pass_no:
            self.pass_no = pass_no
            self.input_left = self.input_budget
            self.endpoints_left = self.endpoint_budget

    def input(self, clock: PassClock, available: int) -> int:
        """`available` bytes of input wait: how many to push now (the rest waits for the next pass).
        (Once per read of a client connection: no calls inside.)"""
        passes = clock.passes
        if passes <= clock.unbudgeted_until:
            return available
        if passes != self.pass_no:
            self.pass_no = passes
            self.input_left = self.input_budget
            self.endpoints_left = self.endpoint_budget
        left = self.input_left
        n = available if available <= left else left
        self.input_left = left - n
        return n

    def endpoint_events(self, clock: PassClock) -> int:
        """How many endpoint events may still be handled in this pass (0: none, leave them; -1: no
        bound, a stall's hold)."""
        if clock.passes <= clock.unbudgeted_until:
            return -1
        self._refill(clock.passes)
        return self.endpoints_left

    def handled(self, clock: PassClock, n: int) -> None:
        """`n` endpoint events were handled in this pass."""
        self._refill(clock.passes)
        self.endpoints_left = max(0, self.endpoints_left - n)
