"""Admission: what a client connection may hold before it is anyone, and how often a password may be
guessed (docs/security.md, "Threat model"; docs/operations.md, "Bad input").

Theory of operation. Sans-IO: the router calls these with the connection (any hashable key), its
source address and `now` (monotonic seconds); they decide, the router acts (closes, refuses, logs).

- `PreAuth` holds the connections that have not yet logged in and sent their AMQP open. Each may
  stay at most `timeout` seconds (`expired(now)` names the ones past it); at most `per_source` of
  them may come from one address and `total` in all, so that idle handshakes never fill the
  router's `max_connections` and never starve the clients that did log in. Deadlines are kept in
  arrival order (one timeout for all), so `expired` reads only what it returns.
- `LoginThrottle` counts failed password logins per source address and per user name (known or
  not: the answer must not tell them apart). The first `free` failures cost nothing; after them
  each login of that source or user waits `base * 2**(failures - free - 1)` seconds after the last
  failure, at most `max_wait`: a guesser is slowed to a crawl, the owner is never locked out for
  longer than `max_wait` (the right password works once the wait has passed, and clears the
  user's count). Failures are forgotten `forget` seconds after the last one; at most `max_entries`
  names and addresses are remembered (the oldest forgotten first), so names made up by the
  million cannot grow the router's memory.
- `passwords_in_clear` says whether a password login is offered on a connection without TLS: a
  SCRAM exchange read off the network can be attacked offline, so by default only from loopback.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class PreAuthLimits:
    timeout: float = 10.0  # seconds from the TCP accept to the AMQP open (login included)
    per_source: int = 64  # connections not yet open, from one address
    total: int = 1024  # connections not yet open, in all


class PreAuth(Generic[K]):
    """The connections of a listener that have not logged in and opened yet (see the module)."""

    def __init__(self, limits: PreAuthLimits) -> None:
        self.limits = limits
        self._pending: dict[K, tuple[str, float]] = {}  # key -> (source, deadline), in arrival order
        self._by_source: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, key: object) -> bool:
        return key in self._pending

    def from_source(self, source: str) -> int:
        return self._by_source[source]

    def arrive(self, key: K, source: str, now: float) -> str | None:
        """A new connection: None if it may go on (it is counted), else why not (it is not)."""
        if key in self._pending:
            return None
        if len(self._pending) >= self.limits.total:
            return "preauth_total"
        if self._by_source[source] >= self.limits.per_source:
            return "preauth_per_source"
        self._pending[key] = (source, now + self.limits.timeout)
        self._by_source[source] += 1
        return None

    def leave(self, key: K) -> bool:
        """The connection opened (or closed): it holds no pre-authentication slot any more. True if
        it held one."""
        entry = self._pending.pop(key, None)
        if entry is None:
            return False
        source = entry[0]
        self._by_source[source] -= 1
        if self._by_source[source] <= 0:
            del self._by_source[source]
        return True

    def expired(self, now: float) -> list[K]:
        """The connections past their deadline, oldest first (still counted until `leave`)."""
        out = []
        for key, (_, deadline) in self._pending.items():
            if deadline > now:
                break
            out.append(key)
        return out


@dataclass(frozen=True, slots=True)
class ThrottleLimits:
    free: int = 5  # failed logins (per source, per user) that cost no wait
    base: float = 1.0  # the first wait, seconds; doubled with each further failure
    max_wait: float = 60.0  # no wait is longer: the owner is never locked out for good
    forget: float = 900.0  # failures are forgotten this long after the last one
    max_entries: int = 10_000  # names and addresses remembered (each), the oldest forgotten first


class _Failures:
    __slots__ = ("count", "last")

    def __init__(self, last: float) -> None:
        self.count = 0
        self.last = last


class LoginThrottle:
    """Failed password logins per source address and per user (see the module)."""

    def __init__(self, limits: ThrottleLimits) -> None:
        self.limits = limits
        self._sources: dict[str, _Failures] = {}
        self._users: dict[str, _Failures] = {}

    def __len__(self) -> int:
        return len(self._sources) + len(self._users)

    def _wait_of(self, rec: _Failures | None, now: float) -> float:
        lim = self.limits
        if rec is None or rec.count <= lim.free or now - rec.last >= lim.forget:
            return 0.0
        wait = min(lim.base * 2.0 ** min(rec.count - lim.free - 1, 64), lim.max_wait)
        return max(0.0, rec.last + wait - now)

    def wait(self, source: str, user: str, now: float) -> float:
        """Seconds before a login of `user` from `source` is taken (0: now)."""
        return max(self._wait_of(self._sources.get(source), now), self._wait_of(self._users.get(user), now))

    def failed(self, source: str, user: str, now: float) -> None:
        """A password login failed (a wrong password or an unknown user: counted alike)."""
        for table, key in ((self._sources, source), (self._users, user)):
            rec = table.pop(key, None)  # (re-inserted: the dict's order is the order of last failure)
            if rec is None or now - rec.last >= self.limits.forget:
                rec = _Failures(now)
            rec.count += 1
            rec.last = now
            table[key] = rec
            while len(table) > self.limits.max_entries:
                del table[next(iter(table))]

    def succeeded(self, user: str) -> None:
        """The right password: the user's failures are forgotten (its source's are not: one account
        that logs in must not wash the guesses made from the same address against others)."""
        self._users.pop(user, None)


def passwords_in_clear(setting: str, source: str) -> bool:
    """May a connection without TLS from `source` log in with a password? `setting`: the router's
    `passwords_without_tls`, "allow", "refuse" or "loopback" (only from a loopback address: what a
    capture there shows, the host's root could read anyway)."""
    if setting == "allow":
        return True
    if setting != "loopback":
        return False
    try:
        addr = ipaddress.ip_address(source.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback
