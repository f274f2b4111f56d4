"""Draining a router before it exits (a restart or an upgrade): sans-IO, time is a parameter.

Theory of operation
-------------------
A drain must leave nothing behind that anyone waits for, and create no duplicate and no false
ACCEPTED. Exactly-once never rests on it: a router may die at any moment and the protocol repairs
what it held (publishers resend what is in doubt, subscribers present what they accepted, origins
re-send copies). What a drain adds is that nobody has to *wait* for those repairs: every message
this router is working on reaches its outcome here or is handed on, and every client moves at once.

1. The adapter stops the intake: the core grants publishers no more credit (what they send with the
   credit they hold is handled as ever), new client connections and attaches are refused with a
   redirect to a neighbour (`amqp:connection:redirect` / `amqp:link:redirect`).
2. Client connections move (`Drain.step` says which to close, with the redirect): one whose
   publishers had deliveries open here when the drain began is kept until those are settled (their
   outcomes come from subscribers that are still connected), at most `grace`; the others (only
   subscribers) once no connection waits that way any more. Our clients reconnect to another router
   of their list at once: publishers declare and resend what is in doubt, subscribers resume and
   present what they accepted; other clients see the redirect and its address.
3. Then it waits until nothing depends on it (`Dependents.blocking`): no message it originated that
   it still drives (a publisher here, or pre-settled), none whose publisher left without re-attaching
   elsewhere (given `grace` after the last connection went: ours re-attach in milliseconds and say
   what they hold in doubt, which makes another router drive those messages and send us their
   FINAL), no subscription announcement unacknowledged by a reachable router, no frame unsent.
   Messages it only holds copies of need nothing: their origins re-send to the subscriptions' new
   homes. Suspended subscriptions homed here stay homed here, known to every router.
4. Done, or at `timeout` (what still depended on it is reported): the adapter stops the router.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol

from .coreview import CoreView
from .subscriptions import SubState


class DrainView(CoreView, Protocol):
    """What a drain reads of the delivery core (`core_dependents`), never its module."""

    @property
    def placeholders(self) -> Mapping[str, Mapping[str, float]]: ...
    @property
    def driven_elsewhere(self) -> Mapping[str, str]: ...


class DrainPhase(StrEnum):
    MOVING = "moving clients"  # client connections are being redirected
    SETTLING = "settling"  # no client left: waiting until nothing depends on the router
    DRAINED = "drained"
    TIMED_OUT = "timed out"


@dataclass(frozen=True, slots=True)
class Dependents:
    """What still depends on a draining router: counts, the first group blocks its exit."""

    connections: int = 0  # client connections not yet told to move
    publisher_deliveries: int = 0  # publisher deliveries open here (no outcome, or not settled)
    subscriber_links: int = 0  # subscriptions homed here with a link
    driving: int = 0  # messages it originated and drives (publisher here, or pre-settled), not final
    publisher_left: int = 0  # ... whose publisher left and has not re-attached anywhere (yet)
    announcements: int = 0  # subscription announcements a reachable router has not acknowledged
    frames_queued: int = 0  # frames to neighbours not yet handed to a connection
    # (informational)
    taken_over: int = 0  # messages it originated that another router drives now (their publisher moved)
    destination_records: int = 0  # copies it holds for subscriptions homed here (their origins re-send)
    suspended_here: int = 0  # subscriptions homed here whose subscriber is away: they stay homed here
    placeholders: int = 0

    def blocking(self, publisher_left_counts: bool = True) -> dict[str, int]:
        """The non-zero counts that keep the router from exiting."""
        keys = ("connections", "publisher_deliveries", "subscriber_links", "driving", "announcements",
                "frames_queued") + (("publisher_left",) if publisher_left_counts else ())
        d = asdict(self)
        return {k: d[k] for k in keys if d[k]}

    def nonzero(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if v}


def core_dependents(core: DrainView) -> dict[str, int]:
    """The delivery core's part of `Dependents` (not on the per-message path: a drain looks a few
    times a second)."""
    driving = publisher_left = taken_over = destination = 0
    elsewhere = core.driven_elsewhere
    for rec in core.records.values():
        if rec.origin is not None:
            destination += 1
        elif rec.pubs or rec.pub_settled:
            driving += 1
        elif rec.gid in elsewhere:
            taken_over += 1
        else:
            publisher_left += 1
    me = core.router_id
    suspended = sum(1 for s in core.table.live() if s.home == me and s.state is SubState.SUSPENDED)
    return {"subscriber_links": sum(1 for rt in core.subs.values() if rt.link is not None),
            "driving": driving, "publisher_left": publisher_left, "taken_over": taken_over,
            "destination_records": destination, "suspended_here": suspended,
            "placeholders": len(core.placeholders)}


@dataclass(frozen=True, slots=True)
class ConnView:
    """A client connection as the drain sees it."""

    waiting: int  # publisher deliveries open here when the drain began that are still open
    subscriber: bool  # it carries a subscriber link


@dataclass(frozen=True, slots=True)
class DrainStep:
    close: list[Any] = field(default_factory=list)  # connections to redirect now
    done: bool = False


@dataclass(frozen=True, slots=True)
class DrainReport:
    """How a drain ended (written by the router, read by `oncemesh drain`)."""

    outcome: str  # DrainPhase.DRAINED or DrainPhase.TIMED_OUT
    seconds: float
    redirected: int  # client connections told to move
    remaining: dict[str, int]  # what still depended on the router at the end (empty when drained)
    dependents: dict[str, int]  # every non-zero count at the end, informational ones included


class Drain:
    """The decisions of one drain: which connections move when, and when the router may exit."""

    def __init__(self, started: float, timeout: float, grace: float) -> None:
        self.started = started
        self.timeout = timeout
        self.grace = grace
        self.phase = DrainPhase.MOVING
        self.redirected = 0
        self.clients_gone_at: float | None = None
        self.last: Dependents = Dependents()
        self.report: DrainReport | None = None

    @property
    def deadline(self) -> float:
        return self.started + self.timeout

    def step(self, now: float, conns: Mapping[Any, ConnView], deps: Dependents) -> DrainStep:
        """Look again: `conns` are the client connections not yet told to move, `deps` what depends
        on the router (its `connections` is len(conns))."""
        if self.report is not None:
            return DrainStep(done=True)
        if now >= self.deadline:
            self.last = deps
            self._end(now, DrainPhase.TIMED_OUT, deps.blocking(self._left_counts(now)))
            self.redirected += len(conns)
            return DrainStep(close=list(conns), done=True)
        close: list[Any] = []
        if conns:
            in_grace = now < self.started + self.grace
            publishers_busy = in_grace and any(c.waiting for c in conns.values())
            for key, c in conns.items():
                if c.waiting and in_grace:
                    continue  # its publishers' outcomes come here, from subscribers still connected
                if c.subscriber and publishers_busy:
                    continue  # subscribers stay while publishers elsewhere wait for their outcomes
                close.append(key)
            self.redirected += len(close)
        self.last = replace(deps, connections=deps.connections - len(close))
        if len(close) == len(conns):
            if self.clients_gone_at is None:
                self.clients_gone_at = now
                self.phase = DrainPhase.SETTLING
            if not self.last.blocking(self._left_counts(now)):
                self._end(now, DrainPhase.DRAINED, {})
                return DrainStep(close=close, done=True)
        return DrainStep(close=close)

    def _left_counts(self, now: float) -> bool:
        """Do messages whose publisher left still keep the router? Only until `grace` after the last
        client went: ours have re-attached elsewhere by then (and said what they hold in doubt)."""
        return self.clients_gone_at is None or now < self.clients_gone_at + self.grace

    def _end(self, now: float, phase: DrainPhase, remaining: dict[str, int]) -> None:
        self.phase = phase
        self.report = DrainReport(phase.value, round(now - self.started, 3), self.redirected, remaining,
                                  self.last.nonzero())

    def waiting_for(self, now: float) -> dict[str, int]:
        """What keeps the router, as of the latest look."""
        return self.last.blocking(self._left_counts(now))

    def status(self, now: float) -> dict[str, object]:
        """For the status file and the log while it drains."""
        return {"phase": self.phase.value, "since": self.started, "seconds": round(now - self.started, 3),
                "timeout": self.timeout, "redirected": self.redirected,
                "waiting_for": self.waiting_for(now),
                "dependents": self.last.nonzero()}
