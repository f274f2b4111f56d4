"""Total order by Lamport clocks and acknowledgements for one ordered stream.

The idea: docs/ordering.md, "Total order by Lamport clocks" and "Clocks, vectors and elections, and
the modes compared".

Theory of operation
-------------------
Normal case. Routers run in views: a view is a member set (router -> incarnation) named by the
ballot that created it. Every member may originate: the router that first accepts a publish stamps
it with key (view, clock + 1, router id) and sends it to the other members; a receiver sets
clock = max(clock, ts) + 1, queues the entry by key and sends a timestamped ACK to every other
member. A router delivers the head of its queue once every member other than itself and the origin
has ACKed that entry. Why this orders totally: q's ACK for m carries ts > ts(m), q sent everything
it stamped earlier before that ACK, and channels are FIFO, so nothing with a smaller key can still
come from q: the classic "a later timestamp from every sender" rule, every member counted as a
sender (a router that gains a publisher needs no view change). We wait for the ACK *of m*, not any
later timestamp, because it also makes delivery uniform: whatever one router delivered, every member
holds. So each router's deliveries in a view are a prefix of the key order of all the view's entries.
A gid is stamped at most once per router; a second copy (resent elsewhere) is skipped where it falls
in the order, identically everywhere, so no router delivers a gid twice.

View changes (crash, restart, partition, a link reset) follow the failure detector's `member_down` /
`member_up`: the lowest id of the reachable set coordinates (the others after staggered timeouts).
One Paxos instance per view, so a coordinator dying half-way cannot split the outcome:
  1. Prepare: a router promises, then freezes (no stamping, ACK or delivery in its view) and answers
     with its view, its last delivered key, the entries it holds, and its history after the key the
     coordinator asks for (the lowest position among stale or restarted routers).
  2. A read quorum of the latest view must answer: ceil(n/2) of its n members, and n//2 + 1 minus
     the members known to have restarted since (an amnesic incarnation never votes again, so quorums
     of the remaining ones still intersect every earlier majority). If one of them accepted a
     decision for that view it is proposed again unchanged; else the new decision says how the old
     view ends: all entries up to the highest key any member delivered (every member holds those:
     uniformity) plus the union of the held entries above it (the flush: a dead router's message that
     any survivor holds), and carries the history the stale members miss.
  3. Accept from every promiser, then Commit. Members that were current deliver the cut in key order,
     skipping what they had; stale and restarted ones deliver the carried history and the cut. Old
     entries outside the cut are dropped and reported `Orphaned` (nobody delivered them): the
     exactly-once core has the publisher resend them, under the same gid, to be stamped anew.
Installing implies being caught up, so any member of a quorum can tell the whole story; a member
that missed the Commit of the latest view is sent it before it is counted. Assumed of the adapter:
channels are FIFO while connected, and a connection that breaks (frames lost) is reported to both
ends (`member_down`, later `member_up` with the incarnation, which changes on every restart).

What waits. Partition: only the side holding a read quorum of the latest view can form a view; the
other side freezes when it tries, and cannot deliver anyway (it lacks ACKs): no router delivers past
an entry it cannot rule out. After a crash every router waits one view change (Prepare, Accept,
Commit). If fewer than ceil(n/2) members of the latest view keep their state (amnesic restarts
before the next view forms; votes restored from disk count, below), the stream blocks: the survivors cannot know what the lost ones
decided, and an operator must recover from the settlement log.

Duplicates. A gid is stamped at most once per router, but two routers may stamp it (its publisher
resent it elsewhere before it was delivered): only the first key is delivered, identically
everywhere, with no memory of what was delivered long ago. A router stamps a gid only if it holds no
entry of it, so a second stamp k2 was made before its router got the first, k1; it sent k2 before
its ACK of k1 (FIFO), so every member holds k2 when it delivers k1 and drops it then. At a view
change the cut is consumed in key order, skipping a gid consumed earlier in the same cut; and the
coordinator leaves out of the decision's extra entries any whose gid a promiser holds at or below
`upto` (it is in the cut already; a member that delivered it had dropped the other copy).

Compaction. Each router tells every other (`Floor`) the number below which its embedding no longer
needs the history (`note_floor`: `DeliveryCore.total_floor`); numbers up to the lowest floor of all
routers (`safe_floor`; a router's new life counts as 0 until it reports) are compacted (`compact`)
into a checkpoint (`Base`: the key and number where it ends, and `total.Checkpoint`). A member that
needs history below it (a restarted one) is sent the checkpoint and the history after it and goes on
from that number (`Restore`). Past `MAX_HISTORY` entries not compacted a router stamps nothing more
(its publishers' messages wait: back-pressure) until the others' floors let it compact.

Restart with disk. What a member must not forget to keep voting is small and changes only in view
changes: its promise, the highest ballot it saw, what it accepted, the view it installed
(`snapshot()`; `durable` counts its changes). An adapter that writes it (fsynced) before the
messages of the same pass leave can `restore` it into a new incarnation: that member is not
amnesic for Paxos (its votes stand, it counts toward read quorums of its view), only for the stream
(it lost its queue and what it delivered: it freezes, and takes the history like a restarted
member). A read quorum holding restored members also needs one member of the view that did not
restart (`intact`): every entry any member delivered was held by every member of the view, so such
a member holds all of them, and the cut cannot lose one. A view whose members all restarted waits.
(Genesis is never restored: there every member's life is named 0 and a restarted one could not be
told from the others; a restart before the first view change is amnesic.)

Cost per published message in a stable view of R routers: R - 1 data frames and (R - 1)^2 ACKs
(R(R - 1) in all; the origin's data frame stands for its own ACK), counted in `stats`. A view change
costs 5(R - 1) control frames (7(R - 1) when a second Prepare asks for the history of stale
members), carrying the held entries and that history.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from .total import Checkpoint

Ballot = tuple[int, str]  # (round number, coordinator id); a view is named by the ballot that created it
Key = tuple[Ballot, int, str]  # (view, Lamport timestamp, origin router): the total order
GENESIS: Ballot = (0, "")
MAX_BACKOFF = 4  # a view change retries after view_timeout * (rank + 1) * 2**min(attempts, MAX_BACKOFF)
MIN_KEY: Key = ((-1, ""), 0, "")
MAX_LIVES = 16  # lives a snapshot names (restarts with disk since this router last installed a view)
MAX_FUTURE = 100_000  # messages kept for a view not installed here yet; past it they are dropped (below)
MAX_HISTORY = 500_000  # entries delivered and not compacted; past it this router stamps nothing more
FLOOR_RESEND = 5.0  # a router's floor goes to the others when it moves, and at least this often
Members = tuple[tuple[str, int], ...]  # (router id, incarnation), sorted


@dataclass(frozen=True, slots=True)
class Entry:
    key: Key
    gid: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Base:
    """Where a history begins: the entries up to `key` (numbers up to `cp.number`) are compacted into `cp`."""

    key: Key
    cp: Checkpoint


@dataclass(frozen=True, slots=True)
class Decision:
    """How view `base` ends and view `view` begins: the value one Paxos instance agrees on."""

    view: Ballot
    base: Ballot
    members: Members
    upto: Key  # entries of `base` up to this key are in the cut ...
    extra: tuple[Entry, ...]  # ... and these above it
    history: tuple[Entry, ...]  # what stale members miss, up to `upto`
    floor: Base | None  # `history` starts after it: a member behind it goes on from its checkpoint


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A member's durable part (`LamportNode.snapshot`, `LamportNode.restore`)."""

    promised: Ballot
    seen: Ballot
    installed: Ballot
    members: Members
    accepted: tuple[Ballot, Decision] | None
    commit: Commit | None  # the commit that installed `installed`: a lagging member may need it
    lives: tuple[int, ...]  # the incarnations whose votes this state carries (restored ones, newest last)


# -- router-to-router messages -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Data:
    entry: Entry


@dataclass(frozen=True, slots=True)
class Ack:
    key: Key
    ts: int


@dataclass(frozen=True, slots=True)
class Prepare:
    ballot: Ballot
    after: Key | None  # send your history after this key (None: not needed)


@dataclass(frozen=True, slots=True)
class Promise:
    ballot: Ballot
    incarnation: int
    installed: Ballot | None
    view_members: Members
    last: Key
    held: tuple[Entry, ...]
    history: tuple[Entry, ...]
    floor: Base | None  # `history` starts after it (it was compacted below)
    accepted: tuple[Ballot, Decision] | None
    commit: Commit | None  # the commit that installed `installed` (None for genesis)


@dataclass(frozen=True, slots=True)
class Refuse:
    ballot: Ballot
    promised: Ballot


@dataclass(frozen=True, slots=True)
class Accept:
    ballot: Ballot
    decision: Decision


@dataclass(frozen=True, slots=True)
class Accepted:
    ballot: Ballot


@dataclass(frozen=True, slots=True)
class Commit:
    ballot: Ballot
    decision: Decision


@dataclass(frozen=True, slots=True)
class Floor:
    """The sender's life and the number below which it no longer needs the history (`note_floor`)."""

    incarnation: int
    floor: int


Wire = Data | Ack | Prepare | Promise | Refuse | Accept | Accepted | Commit | Floor


# -- actions for the adapter -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Send:
    to: str
    msg: Wire


@dataclass(frozen=True, slots=True)
class Deliver:
    gid: str
    payload: bytes
    key: Key
    n: int  # its number: 1, 2, 3, ... the same at every router


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A publish of a gid this router already delivered: the publisher may take it as settled."""

    gid: str


@dataclass(frozen=True, slots=True)
class Orphaned:
    """Entries nobody delivered before a view change; their publishers must resend (same gids)."""

    gids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Restore:
    """This router is sent a checkpoint instead of the history below it: go on from `cp.number` + 1
    (the `Deliver`s that follow are numbered from there)."""

    cp: Checkpoint


@dataclass(frozen=True, slots=True)
class ViewInstalled:
    view: Ballot
    members: tuple[str, ...]


Action = Send | Deliver | Duplicate | Orphaned | Restore | ViewInstalled


@dataclass(slots=True)
class Counters:
    stamped: int = 0
    delivered: int = 0
    data_sent: int = 0
    acks_sent: int = 0
    control_sent: int = 0
    view_changes: int = 0
    future_dropped: int = 0
    duplicates_dropped: int = 0  # entries of a gid delivered under another key
    compactions: int = 0
    restored_from: int = 0  # the checkpoint number this router last went on from (0: none)
    history_full: int = 0  # times stamping waited because `MAX_HISTORY` entries were not compacted


@dataclass(slots=True)
class _Round:
    ballot: Ballot
    targets: dict[str, int]
    after: Key | None
    promises: dict[str, Promise] = field(default_factory=dict)
    decision: Decision | None = None
    accepted: set[str] = field(default_factory=set)


class LamportNode:
    """One router's share of one ordered stream. Inputs: `publish`, `handle` (a message from a
    peer), `member_down` / `member_up` (failure detector), `tick`; each returns the actions."""

    def __init__(self, me: str, universe: Iterable[str], incarnation: int = 0, *, restarted: bool = False,
                 view_timeout: float = 0.5, max_history: int = MAX_HISTORY) -> None:
        self.me = me
        self.incarnation = incarnation
        self.view_timeout = view_timeout
        self.max_history = max_history
        self.universe = tuple(sorted(set(universe)))
        genesis = {r: 0 for r in self.universe}
        self.installed: Ballot | None = None if restarted else GENESIS
        self.members: dict[str, int] = {} if restarted else dict(genesis)
        # (genesis names every member's first life 0, whatever its incarnation: see `_propose`)
        self.up: dict[str, int] = {me: incarnation} if restarted else {**genesis, me: incarnation}
        self.promised: Ballot = GENESIS
        self.seen: Ballot = GENESIS
        self.accepted: tuple[Ballot, Decision] | None = None
        self.commit: Commit | None = None
        self.damaged = False  # a member was reported down since the view was installed
        self.since: float | None = None  # when this router started wanting a view change
        # rounds started since the last view was installed: each waits twice as long as the one
        # before it (up to 2**MAX_BACKOFF times) before another starts, so that a round whose
        # messages are big (a restarted member is sent the whole history) can finish
        self.attempts = 0
        self.round: _Round | None = None
        self.clock = 0
        self.last: Key = MIN_KEY
        self.count = 0  # entries delivered: the number of the last one
        self.base: Base | None = None  # the history starts after it (None: from the first entry)
        self.history: deque[Entry] = deque()  # entries numbered `hbase` + 1 .. `count`
        self.delivered: dict[str, int] = {}  # gid -> number, for the entries in `history`
        self.floors: dict[str, tuple[int, int]] = {}  # router -> (incarnation, floor) it reported
        self.own_floor = 0
        self._floor_at = -FLOOR_RESEND
        self.queue: dict[Key, Entry] = {}
        self._heap: list[Key] = []
        self.acks: dict[Key, set[str]] = {}
        self.queued: dict[str, int] = {}  # gid -> copies in the queue
        self.pending: dict[str, bytes] = {}  # accepted from a publisher, not stamped yet
        self.future: list[tuple[str, Data | Ack]] = []  # for a view not installed yet
        self.stats = Counters()
        self.restored = False  # restored from a snapshot: votes, but lost the stream (see `restore`)
        self.lives: tuple[int, ...] = (incarnation,)
        self.durable = 0  # bumped whenever what `snapshot` returns changes
        self._out: list[Action] = []
        self._loop: deque[Wire] = deque()

    @property
    def frozen(self) -> bool:
        return self.installed is None or self.promised > self.installed or self.restored

    @property
    def hbase(self) -> int:
        """The number of the last compacted entry (the history holds those after it)."""
        return self.base.cp.number if self.base is not None else 0

    # -- durable state ----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot | None:
        """What to write to disk (None: nothing worth restoring: no view installed since genesis).
        It must be on disk before the messages produced with it leave (a vote is a promise kept)."""
        if self.installed is None or self.installed == GENESIS:
            return None
        return Snapshot(self.promised, self.seen, self.installed, tuple(sorted(self.members.items())),
                        self.accepted, self.commit, self.lives)

    @classmethod
    def restore(cls, snap: Snapshot | None, me: str, universe: Iterable[str], incarnation: int, *,
                view_timeout: float = 0.5, max_history: int = MAX_HISTORY) -> LamportNode:
        """A new incarnation that remembers its votes (`snap` from an earlier one; None: amnesic)."""
        node = cls(me, universe, incarnation, restarted=True, view_timeout=view_timeout,
                   max_history=max_history)
        if snap is not None:
            node.promised, node.seen, node.accepted = snap.promised, snap.seen, snap.accepted
            node.installed, node.members, node.commit = snap.installed, dict(snap.members), snap.commit
            # an adapter may write the decisions before the votes (bigger, rarer): a crash between
            # the two leaves decisions newer than the votes, which they imply
            if snap.accepted is not None:
                node.promised = max(node.promised, snap.accepted[0])
            if snap.commit is not None and snap.commit.decision.view > snap.installed:
                node.installed, node.members = snap.commit.decision.view, dict(snap.commit.decision.members)
                node.promised = max(node.promised, snap.commit.ballot)
            node.restored = True
            node.lives = (*snap.lives, incarnation)[-MAX_LIVES:]
            node.durable = 1
        return node

    # -- inputs -----------------------------------------------------------------------------------
    def publish(self, gid: str, payload: bytes, now: float) -> list[Action]:
        if gid in self.delivered:
            self._out.append(Duplicate(gid))
        elif gid not in self.pending and gid not in self.queued:
            self.pending[gid] = payload
            self._stamp()
        return self._finish(now)

    def handle(self, frm: str, msg: Wire, now: float) -> list[Action]:
        self._dispatch(frm, msg, now)
        return self._finish(now)

    def member_down(self, r: str, now: float) -> list[Action]:
        if r != self.me:
            self.up.pop(r, None)
            self.damaged = self.damaged or r in self.members
            self._review(now, start=True)
        return self._finish(now)

    def member_up(self, r: str, incarnation: int, now: float) -> list[Action]:
        if r != self.me:
            self.up[r] = incarnation
            cur = self.floors.get(r)
            if cur is not None and incarnation > cur[0]:
                self.floors[r] = (incarnation, 0)  # a new life: nothing compacts past 0 until it reports
            self._send(r, Floor(self.incarnation, self.own_floor))
            self._review(now, start=True)
        return self._finish(now)

    # -- compaction -------------------------------------------------------------------------------
    def note_floor(self, floor: int, now: float) -> list[Action]:
        """The number below which this router's embedding no longer needs the history
        (`DeliveryCore.total_floor`): the other routers are told when it moved, and every
        `FLOOR_RESEND` (a router that restarted, or missed it, learns it again)."""
        floor = min(floor, self.count)
        if floor != self.own_floor or now - self._floor_at >= FLOOR_RESEND:
            self.own_floor, self._floor_at = floor, now
            for r in sorted(self.up):
                if r != self.me:
                    self._send(r, Floor(self.incarnation, floor))
        return self._finish(now)

    def safe_floor(self) -> int:
        """Numbers up to this one are needed by no router: the lowest floor of all (0 for a router
        that never reported, or whose new life has not yet)."""
        f = self.own_floor
        for r in self.universe:
            if r != self.me:
                f = min(f, self.floors.get(r, (0, 0))[1])
        return f

    def compact(self, cp: Checkpoint, now: float) -> list[Action]:
        """Forget the history up to `cp.number` (at most `safe_floor`, and `cp` what the embedding
        keeps of those numbers): a member that needs it is sent `cp` instead."""
        upto = min(cp.number, self.count)
        if upto > self.hbase and upto == cp.number:
            history, delivered = self.history, self.delivered
            e = history[0]
            for _ in range(upto - self.hbase):
                e = history.popleft()
                n = delivered.get(e.gid)
                if n is not None and n <= upto:
                    del delivered[e.gid]
            self.base = Base(e.key, cp)
            self.stats.compactions += 1
            last = self.last
            for k in [k for k in self.acks if k <= last]:
                del self.acks[k]  # (acks of copies dropped as duplicates: nobody delivers those)
            self._stamp()
        return self._finish(now)

    def tick(self, now: float) -> list[Action]:
        if self._wants_change() and self.since is not None:
            rank = sorted(self.up).index(self.me)
            if now - self.since >= self.view_timeout * (rank + 1) * (1 << min(self.attempts, MAX_BACKOFF)):
                self._start_round(now, None)
        return self._finish(now)

    # -- plumbing ---------------------------------------------------------------------------------
    def _finish(self, now: float) -> list[Action]:
        while self._loop:
            self._dispatch(self.me, self._loop.popleft(), now)
        out, self._out = self._out, []
        return out

    def _send(self, to: str, msg: Wire) -> None:
        if to == self.me:
            self._loop.append(msg)
            return
        self._out.append(Send(to, msg))
        if isinstance(msg, Data):
            self.stats.data_sent += 1
        elif isinstance(msg, Ack):
            self.stats.acks_sent += 1
        else:
            self.stats.control_sent += 1

    def _dispatch(self, frm: str, msg: Wire, now: float) -> None:
        match msg:
            case Floor():
                cur = self.floors.get(frm)
                if frm in self.universe and frm != self.me and (cur is None or (msg.incarnation, msg.floor) > cur):
                    self.floors[frm] = (msg.incarnation, msg.floor)
            case Data():
                if self._in_view(frm, msg.entry.key[0], msg):
                    self._on_data(frm, msg.entry)
            case Ack():
                if self._in_view(frm, msg.key[0], msg):
                    self._on_ack(frm, msg)
            case Prepare():
                self._on_prepare(frm, msg, now)
            case Promise():
                self._on_promise(frm, msg, now)
            case Refuse():
                self._on_refuse(msg, now)
            case Accept():
                self._on_accept(frm, msg, now)
            case Accepted():
                self._on_accepted(frm, msg)
            case Commit():
                self._on_commit(msg, now)

    def _in_view(self, frm: str, view: Ballot, msg: Data | Ack) -> bool:
        if self.installed is None or view > self.installed:
            if len(self.future) >= MAX_FUTURE:
                # bounded: dropped unacknowledged, nobody delivers them without our ACK (a member
                # of that view) or they are not ours to deliver; the view change ahead orphans them
                self.stats.future_dropped += 1
                self.damaged = True
                return False
            self.future.append((frm, msg))  # a member installed it before us: keep it for then
            return False
        return view == self.installed and frm in self.members  # older views: the change decided

    # -- the ordered stream -----------------------------------------------------------------------
    def _stamp(self) -> None:
        if self.frozen or self.me not in self.members or not self.pending:
            return
        assert self.installed is not None
        # entries kept and in flight count toward `max_history`: past it what is pending waits for
        # the others' floors (`compact`): back-pressure
        room = self.max_history - (self.count - self.hbase) - len(self.queue)
        done: list[str] = []
        for gid, payload in self.pending.items():
            if gid in self.queued or gid in self.delivered:
                done.append(gid)
                continue
            if room <= 0:
                self.stats.history_full += 1
                break
            room -= 1
            done.append(gid)
            self.clock += 1
            e = Entry((self.installed, self.clock, self.me), gid, payload)
            self._enqueue(e)
            self.stats.stamped += 1
            for r in self.members:
                if r != self.me:
                    self._send(r, Data(e))
        if len(done) == len(self.pending):
            self.pending.clear()
        else:
            for gid in done:
                del self.pending[gid]
        self._deliver()

    def _enqueue(self, e: Entry) -> None:
        self.queue[e.key] = e
        heapq.heappush(self._heap, e.key)
        self.queued[e.gid] = self.queued.get(e.gid, 0) + 1

    def _unqueue(self, key: Key) -> Entry:
        e = self.queue.pop(key)
        self.acks.pop(key, None)
        n = self.queued[e.gid] - 1
        if n:
            self.queued[e.gid] = n
        else:
            del self.queued[e.gid]
        return e

    def _on_data(self, frm: str, e: Entry) -> None:
        if e.key[2] != frm or e.key in self.queue or e.key <= self.last:
            return
        self.clock = max(self.clock, e.key[1]) + 1
        self._enqueue(e)
        if not self.frozen:
            for r in self.members:
                if r != self.me:
                    self._send(r, Ack(e.key, self.clock))
        self._deliver()

    def _on_ack(self, frm: str, a: Ack) -> None:
        self.clock = max(self.clock, a.ts) + 1
        if a.key > self.last:
            self.acks.setdefault(a.key, set()).add(frm)
            self._deliver()

    def _deliver(self) -> None:
        if self.frozen:
            return
        heap, members, me = self._heap, self.members, self.me
        while heap:
            key = heap[0]
            if key not in self.queue:
                heapq.heappop(heap)
                continue
            got = self.acks.get(key, ())
            if any(r not in got for r in members if r != me and r != key[2]):
                return
            heapq.heappop(heap)
            e = self._unqueue(key)
            self._consume(e, None)
            if e.gid in self.queued:
                # another copy, stamped elsewhere before its router got this one: every member holds
                # it now and drops it here (see "Duplicates")
                for k in [k for k, x in self.queue.items() if x.gid == e.gid]:
                    self._unqueue(k)
                    self.stats.duplicates_dropped += 1

    def _consume(self, e: Entry, cut: set[str] | None) -> None:
        """Deliver `e` next. `cut`: the gids consumed so far in this view change's cut (a gid
        twice in one cut is delivered at its first key)."""
        if e.key <= self.last:
            return
        self.last = e.key
        if cut is not None:
            if e.gid in cut:
                self.stats.duplicates_dropped += 1
                return
            cut.add(e.gid)
        self.count = n = self.count + 1
        self.delivered[e.gid] = n
        self.pending.pop(e.gid, None)
        self.history.append(e)
        self.stats.delivered += 1
        self._out.append(Deliver(e.gid, e.payload, e.key, n))

    def _rebase(self, base: Base) -> None:
        """Go on from a checkpoint (the history below it is compacted everywhere)."""
        self.last = base.key
        self.count = base.cp.number
        self.base = base
        self.history.clear()
        self.delivered.clear()
        for key, _ in base.cp.starts:
            self.pending.pop(key, None)  # (a start submitted again after a restart: numbered already)
        self.stats.restored_from = base.cp.number
        self._out.append(Restore(base.cp))

    # -- view changes -----------------------------------------------------------------------------
    def _wants_change(self) -> bool:
        return self.damaged or self.frozen or self.members != self.up

    def _review(self, now: float, start: bool) -> None:
        if not self._wants_change():
            self.since = None
            return
        if self.since is None:
            self.since = now
        rd = self.round
        if start and min(self.up) == self.me and (rd is None or rd.targets != self.up):
            self._start_round(now, None)

    def _start_round(self, now: float, after: Key | None) -> None:
        ballot = (max(self.promised[0], self.seen[0]) + 1, self.me)
        self.seen, self.since = ballot, now
        self.durable += 1
        self.attempts += 1
        self.round = _Round(ballot, dict(self.up), after)
        for r in sorted(self.up):
            self._send(r, Prepare(ballot, after))

    def _on_prepare(self, frm: str, m: Prepare, now: float) -> None:
        self.seen = max(self.seen, m.ballot)
        if m.ballot < self.promised:
            self._send(frm, Refuse(m.ballot, self.promised))
            return
        if m.ballot != self.promised:
            self.promised = m.ballot
            self.durable += 1
        self._defer(m.ballot, now)
        history = () if m.after is None else tuple(e for e in self.history if e.key > m.after)
        floor = self.base if m.after is not None and self.base is not None and m.after < self.base.key else None
        self._send(frm, Promise(m.ballot, self.incarnation, self.installed, tuple(sorted(self.members.items())),
                                self.last, tuple(self.queue[k] for k in sorted(self.queue)), history,
                                floor, self.accepted, self.commit))
        self._review(now, start=False)

    def _defer(self, ballot: Ballot, now: float) -> None:
        """A round of a coordinator ranked before us (a lower id) is under way: our own timer starts
        again (rounds that carry big histories take seconds under load; routers starting rounds of
        their own meanwhile only pre-empt it, over and over: seen in chaos, mesh4 seed 45). The
        lowest router defers to nobody, so some router's timer always runs."""
        if ballot[1] < self.me and self.since is not None:
            self.since = now

    def _on_promise(self, frm: str, m: Promise, now: float) -> None:
        rd = self.round
        if rd is None or m.ballot != rd.ballot or rd.targets.get(frm) != m.incarnation or rd.decision:
            return
        rd.promises[frm] = m
        if len(rd.promises) == len(rd.targets):
            self._propose(rd, now)

    def _propose(self, rd: _Round, now: float) -> None:
        ps = rd.promises
        base = max((p.installed for p in ps.values() if p.installed is not None), default=None)
        current = {r: p for r, p in ps.items() if p.installed == base}
        base_members = next(iter(current.values())).view_members if current else ()
        # lagging: a member of the latest view, or a restored life of one (its view names its earlier life)
        lagging = [r for r, p in ps.items() if p.installed != base and (
            (r, p.incarnation) in base_members
            or (p.installed not in (None, GENESIS) and (r, dict(p.view_members).get(r, -1)) in base_members))]
        commit = next((p.commit for p in current.values() if p.commit is not None), None)
        if lagging and commit is not None:
            for r in lagging:  # members that missed the commit of the latest view get it first
                self._send(r, commit)
            self._start_round(now, rd.after)
            return
        n = len(base_members)
        # restored from disk (a new life that promises the latest view): it votes, but lost the stream
        restored = {r for r, p in current.items() if base != GENESIS and (r, p.incarnation) not in base_members}
        # restarted: never votes again. Genesis's 0 stands for every member's first life, whatever its
        # incarnation: there a restarted member is one that promises no installed view
        if base == GENESIS:
            lost = sum(1 for p in ps.values() if p.installed is None)
        else:
            lost = sum(1 for r, i in base_members if rd.targets.get(r, i) != i and r not in restored)
        if base is None or len(current) < max(n - n // 2, n // 2 + 1 - lost) or len(restored) == len(current):
            self.round = None  # no quorum of the latest view here (minority side), or nobody intact: wait
            if commit is not None:  # a restored life of a member may take the view (rounds back off)
                for r, p in ps.items():  # (restored: its view names an earlier life of it)
                    if p.installed not in (None, GENESIS, base) and r != self.me \
                            and (r, p.incarnation) not in p.view_members:
                        self._send(r, commit)
            return
        stale = [p.last for r, p in ps.items() if p.installed != base or r in restored]
        if stale and (rd.after is None or rd.after > min(stale)):
            self._start_round(now, min(stale))  # again, asking for the history they miss
            return
        prior = [p.accepted for p in current.values() if p.accepted and p.accepted[1].base == base]
        if prior:
            decision = max(prior, key=lambda a: a[0])[1]  # Paxos: keep what may have been chosen
        else:
            donor = max((p for r, p in current.items() if r not in restored), key=lambda p: p.last)
            # a gid held at or below `upto` is in the cut: its copies above it are left out (a
            # member that delivered it dropped them; see "Duplicates")
            cut = {e.gid for p in current.values() for e in p.held if e.key <= donor.last}
            extra = {e.key: e for p in current.values() for e in p.held if e.key > donor.last and e.gid not in cut}
            floor = donor.floor if stale and donor.floor is not None and min(stale) < donor.floor.key else None
            decision = Decision(rd.ballot, base, tuple(sorted(rd.targets.items())), donor.last,
                                tuple(extra[k] for k in sorted(extra)), donor.history if stale else (), floor)
        rd.decision = decision
        for r in sorted(rd.targets):
            self._send(r, Accept(rd.ballot, decision))

    def _on_refuse(self, m: Refuse, now: float) -> None:
        self.seen = max(self.seen, m.promised)
        rd = self.round
        if rd is not None and rd.ballot == m.ballot:
            self.round = None
            self._review(now, start=True)  # we now know the higher ballot: outbid it once

    def _on_accept(self, frm: str, m: Accept, now: float) -> None:
        self.seen = max(self.seen, m.ballot)
        if m.ballot < self.promised:
            self._send(frm, Refuse(m.ballot, self.promised))
            return
        self.promised = m.ballot
        if self.installed is not None and m.decision.base == self.installed:
            self.accepted = (m.ballot, m.decision)  # only a current member's acceptance counts
        self.durable += 1
        self._defer(m.ballot, now)
        self._send(frm, Accepted(m.ballot))

    def _on_accepted(self, frm: str, m: Accepted) -> None:
        rd = self.round
        if rd is None or rd.decision is None or m.ballot != rd.ballot or frm not in rd.targets:
            return
        rd.accepted.add(frm)
        if len(rd.accepted) == len(rd.targets):
            self.round = None
            to = set(rd.targets) | {r for r, _ in rd.decision.members if r in self.up}
            for r in sorted(to):
                self._send(r, Commit(rd.ballot, rd.decision))

    def _on_commit(self, m: Commit, now: float) -> None:
        d = m.decision
        self.seen = max(self.seen, m.ballot)
        if self.installed is not None and d.view <= self.installed:
            return
        if (self.me, self.incarnation) not in d.members:
            if self.restored and any((self.me, i) in d.members for i in self.lives):
                # made for the life we restored (it accepted it, then died): we learn the view, not
                # the stream (we deliver nothing from it); a round with our new life follows
                self.promised = max(self.promised, m.ballot)
                self.installed, self.members, self.accepted, self.commit = d.view, dict(d.members), None, m
                self.durable += 1
                self._review(now, start=True)
            return
        self.promised = max(self.promised, m.ballot)
        old = [self.queue[k] for k in sorted(self.queue)]
        current = self.installed == d.base and not self.restored
        if d.floor is not None and d.floor.key > self.last:
            self._rebase(d.floor)  # restarted: the history below the others' checkpoint is compacted
            current = False
        # (stale or restarted: the decision carries what this router misses)
        cut = {e.key: e for e in old if e.key <= d.upto} if current else {e.key: e for e in d.history}
        cut.update((e.key, e) for e in d.extra)
        seen: set[str] = set()
        for k in sorted(cut):
            self._consume(cut[k], seen)
        self.last = max(self.last, d.upto)
        orphans = tuple(dict.fromkeys(e.gid for e in old if e.gid not in self.delivered))
        if orphans:
            self._out.append(Orphaned(orphans))
        self.queue.clear()
        self._heap.clear()
        self.acks.clear()
        self.queued.clear()
        self.installed, self.members, self.accepted, self.commit = d.view, dict(d.members), None, m
        self.damaged = self.restored = False
        self.lives = (self.incarnation,)
        self.durable += 1
        self.attempts = 0
        self.stats.view_changes += 1
        self._out.append(ViewInstalled(d.view, tuple(r for r, _ in d.members)))
        future, self.future = self.future, []
        for frm, msg in future:
            if (msg.entry.key[0] if isinstance(msg, Data) else msg.key[0]) >= d.view:
                self._dispatch(frm, msg, now)
        self._stamp()
        self._deliver()
        self._review(now, start=True)
