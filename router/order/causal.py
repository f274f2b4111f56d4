"""Causal delivery with reduced version vectors: the publishing side and the hold-back.

The idea, and why the routers run a simpler form of it: docs/ordering.md, "The cores for causal and
total order".

Theory of operation
-------------------
Names. A message is (publisher, seq): `publisher` is a publisher link id (one link publishes to one
topic), and each link numbers its messages 1, 2, 3, ... without gaps. A version vector (VV) maps
publisher -> seq and means "that publisher's messages 1..seq"; it is *reduced*: it lists only the
publishers a message depends on, never a full vector over every publisher of the group.

Publishing side (`CausalTracker`, one per client). The client's causal past is the per-publisher
maximum over what it was handed (on any topic of the causal group) and what it published itself,
merged with the deps each handed message carried. Because every message's deps are themselves that
closure, the client's past is closed transitively: if a -> c -> b, b's vector covers a even when the
client never saw a. `next_message(link)` returns the next seq of that link and the client's past
without the link's own entry (seq - 1 is implied: a link's messages are delivered in seq order).

What is exact and what is conservative. The vector is exact for the causal past up to per-publisher
FIFO closure: (p, s) in the past implies (p, 1..s-1) in the past, which is true (p published them
first). We do NOT drop an entry because another entry implies it (c depends on a, so b's {c} would
imply {a}): that pruning is only sound at a subscription that is handed c, and a subscription is not
handed c when c is on a topic it does not get, or was published before it was in force there; it
would then deliver b before a. Keeping the closure costs one entry per publisher in the causal past.
The only pruning offered is `stable(floor)`: entries every subscription, present and future, has
already resolved (the caller knows it from settlement), which no receiver can still wait for.

Delivering side (`CausalBuffer`, one per subscription). Per publisher a frontier f[p]: every message
(p, 1..f[p]) is resolved, i.e. delivered here, or declared not owed, or declared lost. A message
(p, s, deps) is deliverable when f[p] >= s - 1 and f[q] >= t for every (q, t) in deps. Delivering it
resolves (p, s). Why safe: if a -> b and the subscription gets both, a = (q, t) is covered by b's
deps (or is b's predecessor), so b waits until (q, 1..t) are all resolved, which includes a being
delivered (a is owed, so it is resolved only by delivery, unless the caller says otherwise).
Duplicates: anything at or below the frontier, or already held, is dropped; a publisher's messages
are delivered in seq order, so the frontier alone remembers what was delivered (no per-message set).

What the subscription is not owed must be declared by the caller, who knows it (the buffer does not
know topics or subscription history): `not_owed(p)` for a link of a topic the subscription does not
get, `not_owed(p, upto)` for a link's messages published before the subscription was in force
there, `known_lost(p, seq)` for one message that will never come (e.g. rejected). Until then the
buffer waits; `waiting_on(now, older_than)` lists the publishers that block held messages and the
seq it needs next from each, so the caller can look up the link's topic or give up on a message.
The start cut need
not be causally consistent: a message declared not owed is never delivered later (it is dropped if
it shows up), and everything it depended on that is owed is still awaited through the closure.

What waits. During a partition or after a crash, a message whose causal past is stuck on the other
side (or in a router being restarted) is held, and everything after it from the same publisher;
messages with no such dependency flow. Nothing here times out: redelivery after a crash is the
exactly-once core's job (a resend is absorbed as a duplicate). A publisher client that restarts
empty must publish on a new link id: its seqs would start at 1 again.

Cost: nothing on the wire but the vector: one (link id, seq) pair per publisher link in the
publisher's causal past (bounded by the links of the causal group; `stable` trims it).

Memory: O(publishers) for frontiers, plus the sparse holes above a frontier, plus held messages,
bounded by `max_pending`: beyond it a message that would have to wait is refused with
`HoldBackFull` (amqp:resource-limit-exceeded; the caller leaves it unsettled, to be offered again),
while one deliverable at once is always taken, so the buffer can always drain. `now` only stamps
held messages so that `waiting_on` can report how long they waited.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from ...common.errors import ResourceLimitExceeded

_ALL = 1 << 62  # frontier of a publisher declared wholly not owed


@dataclass(frozen=True, slots=True)
class VersionVector:
    """A reduced version vector: sorted (publisher, seq) pairs with seq >= 1; absent means 0."""

    entries: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, mapping: Mapping[str, int] | Iterable[tuple[str, int]]) -> VersionVector:
        items = mapping.items() if isinstance(mapping, Mapping) else mapping
        best: dict[str, int] = {}
        for p, s in items:
            if s > best.get(p, 0):
                best[p] = s
        return cls(tuple(sorted(best.items())))

    def get(self, publisher: str) -> int:
        for p, s in self.entries:
            if p == publisher:
                return s
        return 0

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def as_dict(self) -> dict[str, int]:
        return dict(self.entries)

    def merge(self, other: VersionVector) -> VersionVector:
        """Pointwise maximum: the union of two causal pasts."""
        return VersionVector.of(self.entries + other.entries)

    def dominates(self, other: VersionVector) -> bool:
        """True when self covers other (other's past is contained in self's)."""
        mine = dict(self.entries)
        return all(mine.get(p, 0) >= s for p, s in other.entries)

    def with_entry(self, publisher: str, seq: int) -> VersionVector:
        return VersionVector.of(self.entries + ((publisher, seq),))

    def without(self, publisher: str) -> VersionVector:
        return VersionVector(tuple(e for e in self.entries if e[0] != publisher))

    def reduce(self, implied: VersionVector) -> VersionVector:
        """Drop the entries `implied` already covers. Sound only when every receiver is known to have
        resolved `implied` (see the module comment: implication through another message is not)."""
        floor = dict(implied.entries)
        return VersionVector(tuple((p, s) for p, s in self.entries if s > floor.get(p, 0)))


class CausalTracker:
    """One client's causal past, to stamp its next message with (see the module comment)."""

    def __init__(self) -> None:
        self._past: dict[str, int] = {}
        self._seq: dict[str, int] = {}
        self._floor: dict[str, int] = {}

    @property
    def past(self) -> VersionVector:
        return VersionVector.of(self._past)

    def handed(self, publisher: str, seq: int, deps: VersionVector) -> None:
        """The client was handed (publisher, seq) carrying `deps`: both join its causal past."""
        past = self._past
        for p, s in deps.entries:
            if s > past.get(p, 0):
                past[p] = s
        if seq > past.get(publisher, 0):
            past[publisher] = seq

    def next_message(self, link: str) -> tuple[int, VersionVector]:
        """Seq and deps for the client's next message on `link`; the message joins the past."""
        seq = self._seq.get(link, 0) + 1
        self._seq[link] = seq
        floor = self._floor
        deps = VersionVector(tuple(sorted(
            (p, s) for p, s in self._past.items() if p != link and s > floor.get(p, 0))))
        self._past[link] = seq
        return seq, deps

    def stable(self, floor: VersionVector) -> None:
        """Entries at or below `floor` are resolved at every subscription, present and future."""
        for p, s in floor.entries:
            if s > self._floor.get(p, 0):
                self._floor[p] = s


@dataclass(frozen=True, slots=True)
class CausalDeliver:
    """Hand this message to the subscription now; the list order is the delivery order."""

    msg_id: str
    publisher: str
    seq: int


class HoldBackFull(ResourceLimitExceeded):
    """Our side: the subscription holds `max_pending` messages waiting for their causal past."""


class _Held:
    __slots__ = ("msg_id", "deps", "since")

    def __init__(self, msg_id: str, deps: VersionVector, since: float) -> None:
        self.msg_id = msg_id
        self.deps = deps
        self.since = since


class CausalBuffer:
    """Causal hold-back for one subscription (see the module comment for the rules)."""

    def __init__(self, max_pending: int = 100_000) -> None:
        self.max_pending = max_pending
        self._front: dict[str, int] = {}
        self._holes: dict[str, set[int]] = {}  # resolved seqs above the frontier (lost, not owed)
        self._held: dict[tuple[str, int], _Held] = {}
        self._blocked: dict[str, list[tuple[int, str, int]]] = {}  # p -> heap of (needed seq, key)
        self.delivered = 0
        self.duplicates = 0
        self.discarded = 0

    # -- inputs -----------------------------------------------------------------------------------

    def offer(self, msg_id: str, publisher: str, seq: int, deps: VersionVector,
              now: float) -> list[CausalDeliver]:
        key = (publisher, seq)
        if seq <= self._front.get(publisher, 0) or key in self._held \
                or seq in self._holes.get(publisher, ()):
            self.duplicates += 1
            return []
        if len(self._held) >= self.max_pending and self._unmet(key, deps) is not None:
            raise HoldBackFull(f"subscription holds {len(self._held)} messages awaiting their causal past")
        self._held[key] = _Held(msg_id, deps, now)
        return self._run([key])

    def not_owed(self, publisher: str, upto_seq: int | None = None) -> list[CausalDeliver]:
        """This subscription gets none of `publisher`'s messages up to `upto_seq` that it has not
        already got (None: none at all, the link is on a topic the subscription does not get)."""
        upto = _ALL if upto_seq is None else upto_seq
        if upto <= self._front.get(publisher, 0):
            return []
        for key in [k for k in self._held if k[0] == publisher and k[1] <= upto]:
            del self._held[key]
            self.discarded += 1
        holes = self._holes.get(publisher)
        if holes:
            holes.difference_update([s for s in holes if s <= upto])
        work: list[tuple[str, int]] = []
        self._extend(publisher, upto, work)
        return self._run(work)

    def known_lost(self, publisher: str, seq: int) -> list[CausalDeliver]:
        """(publisher, seq) will never come to this subscription; messages after it may."""
        if seq <= self._front.get(publisher, 0):
            return []
        if self._held.pop((publisher, seq), None) is not None:
            self.discarded += 1
        work: list[tuple[str, int]] = []
        self._resolve(publisher, seq, work)
        return self._run(work)

    # -- queries ----------------------------------------------------------------------------------

    def frontier(self, publisher: str) -> int:
        return self._front.get(publisher, 0)

    @property
    def pending(self) -> int:
        return len(self._held)

    def waiting_on(self, now: float = 0.0, older_than: float = 0.0) -> dict[str, int]:
        """Publishers that block a message held longer than `older_than` -> the seq awaited next."""
        out: dict[str, int] = {}
        for key, h in self._held.items():
            if now - h.since >= older_than:
                need = self._unmet(key, h.deps)
                if need is not None:
                    out[need[0]] = self._front.get(need[0], 0) + 1
        return out

    # -- rules ------------------------------------------------------------------------------------

    def _unmet(self, key: tuple[str, int], deps: VersionVector) -> tuple[str, int] | None:
        """The first requirement of a held message not yet resolved: (publisher, seq) or None."""
        front = self._front
        p, s = key
        if front.get(p, 0) < s - 1:
            return (p, s - 1)
        for q, t in deps.entries:
            if front.get(q, 0) < t:
                return (q, t)
        return None

    def _run(self, work: list[tuple[str, int]]) -> list[CausalDeliver]:
        out: list[CausalDeliver] = []
        while work:
            key = work.pop()
            h = self._held.get(key)
            if h is None:
                continue
            need = self._unmet(key, h.deps)
            if need is not None:
                heapq.heappush(self._blocked.setdefault(need[0], []), (need[1], key[0], key[1]))
                continue
            del self._held[key]
            self.delivered += 1
            out.append(CausalDeliver(h.msg_id, key[0], key[1]))
            self._resolve(key[0], key[1], work)
        return out

    def _resolve(self, p: str, s: int, work: list[tuple[str, int]]) -> None:
        if s != self._front.get(p, 0) + 1:
            self._holes.setdefault(p, set()).add(s)
            return
        self._extend(p, s, work)

    def _extend(self, p: str, upto: int, work: list[tuple[str, int]]) -> None:
        """The frontier of p moves to `upto` (and over any resolved holes right after it); the
        messages blocked on p up to there are re-examined."""
        holes = self._holes.get(p)
        while holes and upto + 1 in holes:
            holes.remove(upto + 1)
            upto += 1
        if holes is not None and not holes:
            del self._holes[p]
        self._front[p] = upto
        heap = self._blocked.get(p)
        while heap and heap[0][0] <= upto:
            _, q, t = heapq.heappop(heap)
            work.append((q, t))
        if heap is not None and not heap:
            del self._blocked[p]
