"""Total-order numbering of one ordered stream (one topic) across a mesh of routers.

The idea: docs/ordering.md, "Total order by the sequencer" and "The cores for causal and total
order".

Theory of operation
-------------------
Any member router takes messages (`gid`s) for the stream; one member, the sequencer, numbers them;
every member delivers numbers 1, 2, 3, ... in order with no gap. The sequencer is the bully
coordinator, the highest member id a router believes alive (ELECTION / ANSWER / COORDINATOR, timeouts
driven by `tick`). Beliefs come from a failure detector that can be wrong (freezes, partitions), so two
routers may both act as sequencer: bully only chooses who *tries* to number; a quorum protocol in the
manner of Multi-Paxos decides the numbers. Bully additions, for liveness only: a leader's heartbeat
counts as its COORDINATOR; a leader outbid by a higher router it believes alive yields to it; a
restart of the coordinator (its first message of a new life) starts an election.

1. Ballots. A leader works in a ballot (round, member index, life): unique to one incarnation of one
   member, totally ordered. It takes a round above every round it has seen.
2. Promise. The leader asks every member to promise its ballot. A member promises only a ballot above
   the one it promised last, and answers with what it holds from the leader's delivery frontier on:
   committed entries, and accepted ones with their ballots. With promises from a majority
   (Q = N//2 + 1) the leader learns those committed entries, re-proposes every other reported slot
   with the value of the highest ballot reported (what may be committed is neither lost nor
   renumbered), and only then numbers new gids.
3. Accept. An entry is a batch (slot, ballot, first number, gids). A member accepts it if the ballot is
   at least the one it promised. Q acceptances commit it; the leader sends it to every member (SYNC),
   and members deliver entries in slot order. A leader proposes a new batch only when every slot below
   is committed, so a new leader finds no hole below the highest reported slot, and a batch's first
   number is the previous batch's first plus its size: no gap, no number twice. A gid is numbered
   only if it is not committed, in flight or queued, and the leader knows every committed slot below
   the new one: a resent gid keeps its number. A REQUEST carries the requester's delivery frontier;
   the leader ignores one from behind its compaction base (below), where it could not tell.
   Learning at the acceptor (N <= 3, so Q <= 2). The ballot's owner accepted an entry in that ballot
   before it sent the ACCEPT (`_propose`; with disk its vote is journaled in that pass), so a member
   that accepts an ACCEPT sent by the owner in the ballot's life holds a quorum of two votes: it
   learns and delivers the entry at once instead of from the SYNC, which follows the leader's round
   trip (two hops sooner; line3, leader C, at A: 2 hops after the proposal, not 4). It counts as
   the leader would (4.): the owner's vote in a life older than the newest known is dropped on
   arrival, its own vote is of its current life; with disk its vote is on disk before anything it
   delivered leaves the router (the embedding fsyncs the pass's journal before the pass's output:
   `MeshNode.flush`, before the engine flushes connections). Its ACCEPTED reports a frontier past
   the slot, and the leader sends it no SYNC for it. Larger groups learn from the SYNC (an acceptor
   would need Q - 2 more ACCEPTEDs: N^2 messages per batch).
   Why one batch in flight: the first number of slot s+1 is only known from slot s's size; with two
   slots in flight a new leader could find s+1 accepted and s in none of its promises, and neither a
   no-op nor a re-proposal of s could keep s+1's numbers without a gap. Pipelining would need a rule
   that makes that impossible (an acceptor accepts s+1 only holding s of the same ballot) and a proof
   that re-proposed neighbours stay consistent across ballots; not done.
4. Amnesia. A restarted router has lost its promises and acceptances; counting its old and its new
   votes alike could make two quorums that do not intersect. Rules (crash vectors, after Michael,
   Ports, Sharma, Szekeres, DISC 2017):
   - Every message carries the sender's `life` (incarnation number) and crash vector (highest life
     known per member). A receiver drops messages of an older life than it knows; a leader counts a
     promise or acceptance only if, when it counts, that life is still the newest it knows.
   - A restarted router first learns its life: one above the highest that K = N - Q + 1 other members
     (a majority of the others) know; its previous life told K others, and K + K > N - 1, so the new
     life is higher than any before. Then it sends RECOVER with that life; members that hold state
     raise their crash vectors (from then on they ignore and discount its old incarnation) and answer
     with their promise and entries. With K answers it adopts the highest promise, every committed
     entry and the highest-ballot accepted entry per slot; only then does it vote or stand for
     election. Why safe (whoever counted: the leader, or an acceptor learning at once, 3.): a
     quorum that counted an old vote has Q - 1 other members, and
     K + Q - 1 > N - 1, so one of them answered RECOVER. If it voted before answering, its answer
     brought that ballot or entry to the new life; if after, its vote carried the new crash vector and
     the leader discounted the old vote.
   - Assumption: at most N - Q members are crashed or recovering at once (a majority always holds its
     state; frozen or partitioned members count as holding it). Losing more loses committed entries.
   - `bootstrap=True` only for the first incarnations of a new group; any restart recovers.
5. Partitions. A side holding a majority keeps numbering. A minority side elects its own coordinator,
   whose promise round never completes: its routers keep (and retry) their gids, and nothing is
   committed or delivered there until the partition heals; then the highest member wins, its promise
   round learns everything, and the others catch up from its SYNCs.

Restart with disk. A member's votes (its life, crash vector, promise, and the entries it accepted or
learned from the compaction base on) are all it must not forget to go on voting as the same life;
they change per batch (acceptances), so the embedding keeps them as a journal (`take_journal`:
what changed since the last call, or a whole `snapshot` when the base moved or the life changed),
appended and fsynced before the pass's messages leave (a vote is on disk before it is cast).
`restore` makes a new incarnation that is the same life with the same votes: it counts toward
quorums at once and needs no RECOVER round (a group tolerates more restarts at once; a restart of
every member goes on). It lost what it delivered: it learns the chosen entries again from the
others (a base above its own comes with a checkpoint). A journal of a life that was recovering
restores nothing (it was amnesic then; it recovers again).

Cost in messages. Steady state, per batch of B gids: up to B REQUESTs (gids taken at routers other
than the leader), N-1 ACCEPT, N-1 ACCEPTED and N-1 SYNC: 3(N-1) + B, so 3N-2 per gid unbatched (for
N = 3 one SYNC fewer: the member whose ACCEPTED committed the batch learned it already); plus
2(N-1) per heartbeat. Per election: N-1 COORDINATOR when the highest live router starts it, O(N^2)
ELECTION/ANSWER when the lowest does; then 2(N-1) for the promise round and 3(N-1) per re-proposed
slot. A restart costs 4(N-1), the answers carrying the retained log. Numbering needs Q routers up and
connected; a restart needs K others holding state.

What grows, and compaction. Committed entries and the gid -> number map (which recognises resends)
grow until `compact(cp)` drops the entries whose numbers are all at or below `cp.number` and that
every member delivered (`stable`, from the leader's SYNC). How far that may go is the embedding's:
each member tells every other (`Floor`) the number below which its delivery core needs nothing
(`note_floor`: `DeliveryCore.total_floor`, which keeps the numbers of messages a publisher may still
resend), and `safe_floor` is the lowest of all (a life older than the newest one known counts as 0;
so does a member that never reported). `cp` (`total.Checkpoint`) is what the delivery core keeps of
those numbers; it travels with the compaction base (RecoverReply, Promise, and SYNC to a member
behind the base), and a member that starts delivering at the base (a restarted one) is handed it
first (`Restore`). Skipping compacted history, it cannot tell whether the gids it holds were numbered
there: it hands them back (`Unresolved`) rather than guess. Past `MAX_HISTORY` numbers not
compacted a leader numbers nothing more (its submitters retry: back-pressure) until it can compact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from itertools import islice

from ...common.errors import OncemeshError, RemoteProtocolError
from .total import Checkpoint

Ballot = tuple[int, int, int]  # (round, member index, life)
NO_BALLOT: Ballot = (0, -1, 0)
MAX_HISTORY = 500_000  # numbers committed and not compacted; past it the leader numbers nothing more
FLOOR_RESEND = 5.0  # a member's floor goes to the others when it moves, and at least this often


class UnknownMember(RemoteProtocolError):
    """A message came from a router that is not a member of this stream's group."""


class SequencerInvariantError(OncemeshError):
    """Our own state contradicts itself (a bug here, or the amnesia assumption was broken)."""


@dataclass(frozen=True, slots=True)
class Entry:
    slot: int
    ballot: Ballot
    first: int  # number of gids[0]
    gids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Election:
    pass


@dataclass(frozen=True, slots=True)
class Answer:
    pass


@dataclass(frozen=True, slots=True)
class Coordinator:
    pass


@dataclass(frozen=True, slots=True)
class CvQuery:
    nonce: str  # the asker's incarnation: answers to an older incarnation are not mistaken for ours


@dataclass(frozen=True, slots=True)
class CvReply:
    nonce: str


@dataclass(frozen=True, slots=True)
class Recover:
    nonce: str


@dataclass(frozen=True, slots=True)
class RecoverReply:
    nonce: str
    promised: Ballot
    base: int  # lowest retained slot and the number of its first gid
    base_num: int
    chosen: tuple[Entry, ...]
    accepted: tuple[Entry, ...]
    cp: Checkpoint | None  # what the numbers below `base_num` left (None: nothing compacted)


@dataclass(frozen=True, slots=True)
class Prepare:
    ballot: Ballot
    from_slot: int


@dataclass(frozen=True, slots=True)
class Promise:
    ballot: Ballot
    frontier: int  # next slot the promiser will deliver
    base: int
    base_num: int
    chosen: tuple[Entry, ...]
    accepted: tuple[Entry, ...]
    cp: Checkpoint | None


@dataclass(frozen=True, slots=True)
class Nack:
    ballot: Ballot
    promised: Ballot


@dataclass(frozen=True, slots=True)
class Accept:
    ballot: Ballot
    entry: Entry


@dataclass(frozen=True, slots=True)
class Accepted:
    ballot: Ballot
    slot: int
    frontier: int


@dataclass(frozen=True, slots=True)
class Sync:
    """Committed entries (facts: anyone may learn them), the sender's frontier, compaction mark."""

    entries: tuple[Entry, ...]
    top: int
    stable: int
    base: int
    base_num: int
    beat: bool  # a heartbeat: always answered with SyncAck
    cp: Checkpoint | None  # only to a member behind `base` (it goes on from there)


@dataclass(frozen=True, slots=True)
class SyncAck:
    frontier: int
    promised: Ballot  # tells a stale leader (one that proposes nothing) that it has been replaced


@dataclass(frozen=True, slots=True)
class Request:
    gid: str
    frontier: int  # the requester's next slot: below the leader's base, the leader cannot dedup


@dataclass(frozen=True, slots=True)
class Floor:
    """The number below which the sender's delivery core needs nothing (`note_floor`)."""

    floor: int


Body = (Election | Answer | Coordinator | CvQuery | CvReply | Recover | RecoverReply | Prepare | Promise
        | Nack | Accept | Accepted | Sync | SyncAck | Request | Floor)


@dataclass(frozen=True, slots=True)
class Wire:
    """One message: sender's life (-1 while it does not know it yet), crash vector (member order)."""

    life: int
    cv: tuple[int, ...]
    body: Body


@dataclass(frozen=True, slots=True)
class SendTo:
    to: str
    msg: Wire


@dataclass(frozen=True, slots=True)
class Delivered:
    """Hand number `n` (gid) to the application: consecutive numbers, from where this life started."""

    n: int
    gid: str


@dataclass(frozen=True, slots=True)
class Numbered:
    """A gid submitted here has its number (tell its publisher)."""

    gid: str
    n: int


@dataclass(frozen=True, slots=True)
class Restore:
    """This router starts delivering at a compaction base: go on from `cp` (the `Delivered` that
    follow are numbered after the base; those at or below `cp.number` are known already)."""

    cp: Checkpoint


@dataclass(frozen=True, slots=True)
class Unresolved:
    """This router cannot tell whether a gid submitted here has a number: it restarted (or caught up)
    past compacted history. Resubmit it if its publisher is still in doubt (then it is retained)."""

    gid: str


Action = SendTo | Delivered | Numbered | Unresolved | Restore


class Status(Enum):
    LEARN_LIFE = 1
    RECOVER = 2
    NORMAL = 3


class Lead(Enum):
    IDLE = 1
    PREPARING = 2
    LEADING = 3


@dataclass(frozen=True, slots=True)
class SeqState:
    """A member's votes (`SequencerNode.snapshot`, `restore`): life -1 means it was recovering
    (amnesic: nothing to restore)."""

    life: int
    cv: tuple[int, ...]
    promised: Ballot
    base: int  # the compaction base (slot, number) and its checkpoint (None: nothing compacted)
    base_num: int
    cp: Checkpoint | None
    votes: tuple[Entry, ...]  # accepted or learned, from the compaction base on


@dataclass(frozen=True, slots=True)
class Voted:
    """Journal: accepted (or learned) entries."""

    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class Promised:
    """Journal: the promise is now `ballot`."""

    ballot: Ballot


@dataclass(frozen=True, slots=True)
class Lives:
    """Journal: the crash vector is now `cv` (another member recovered with a new life)."""

    cv: tuple[int, ...]


Journal = Voted | Promised | Lives


@dataclass(frozen=True, slots=True)
class Timing:
    retry: float = 0.3  # resend unanswered RECOVER / PREPARE / ACCEPT / REQUEST; back off after NACK
    heartbeat: float = 0.5
    answer: float = 0.3  # bully: wait this long for an ANSWER
    coordinator: float = 1.0  # bully: then this long for COORDINATOR
    batch: int = 64
    sync_cap: int = 64  # entries per SYNC at most ...
    # ... and gids at most (a first entry goes even if larger): a SYNC is one control message, and
    # Proton keeps a pooled delivery's buffer at the largest frame it carried (interrouter/node.py,
    # MAX_CONTROL_FRAME): 64 entries of 64 gids made SYNCs of ~160 KB for a member behind
    sync_gids: int = 128


class SequencerNode:
    """One router's part in numbering one stream. Inputs: `submit`, `handle`, `peer_up`/`peer_down`,
    `tick`, `compact`, each with `now`; outputs appended to `out` (SendTo, Delivered, Numbered,
    Unresolved) for the adapter to drain. `members` is the fixed group; `incarnation` names this life."""

    def __init__(self, me: str, members: Sequence[str], incarnation: str, now: float, *,
                 bootstrap: bool = False, timing: Timing | None = None, max_history: int = MAX_HISTORY) -> None:
        self.members = tuple(sorted(set(members)))
        if me not in self.members:
            raise ValueError(f"{me!r} is not a member of {self.members}")
        self.me, self.inc, self.t = me, incarnation, timing or Timing()
        self.idx = {m: i for i, m in enumerate(self.members)}
        self.i, n = self.idx[me], len(self.members)
        self.quorum, self.k = n // 2 + 1, n - (n // 2 + 1) + 1
        self.others = tuple(m for m in self.members if m != me)
        self.out: list[Action] = []
        self.life = 0 if bootstrap else -1
        self.cv = [0] * n
        self.status = Status.NORMAL if bootstrap else Status.LEARN_LIFE
        self.replies: dict[str, RecoverReply | None] = {}
        # acceptor and learner
        self.promised: Ballot = NO_BALLOT
        self.top_round = 0
        self.acc: dict[int, Entry] = {}
        self.chosen: dict[int, Entry] = {}
        self.numbers: dict[str, int] = {}
        self.base = self.base_num = self.next_slot = self.next_num = 1
        self.cp: Checkpoint | None = None  # what numbers below `base_num` left (set when base > 1)
        self.max_history = max_history
        self.floors: dict[str, tuple[int, int]] = {}  # member -> (life, floor) it reported
        self.own_floor = 0
        self._floor_at = -FLOOR_RESEND
        self.held_back = 0  # batches not proposed: `max_history` numbers not compacted
        self.restored_from = 0  # the checkpoint this life went on from (0: none)
        # restart with disk: what changed since the embedding last took it (`take_journal`); None:
        # take a whole snapshot (a new life, a compaction)
        self._journal: list[Journal] | None = None
        self.journaling = False  # the embedding keeps votes on disk (it takes the journal every pass)
        self.restored = False
        self.top_chosen = 0  # highest slot learned committed
        self.delivered_any = False
        self.stable = 1  # slots below it are delivered everywhere (the leader says)
        # bully
        self.alive: set[str] = set()
        self.coordinator: str | None = None
        self.electing_until: float | None = None
        self.awaiting_until: float | None = None
        # leader
        self.lead = Lead.IDLE
        self.ballot: Ballot = NO_BALLOT
        self.promises: dict[str, tuple[int, Promise]] = {}
        self.inflight: dict[int, Entry] = {}
        self.votes: dict[int, dict[str, int]] = {}
        self.queue: dict[str, None] = {}  # ordered set
        self.known: dict[str, int] = {}  # members' delivery frontiers
        self.retry_at = now
        self.beat_at = now
        # submitter: gid -> when to resend
        self.pending: dict[str, float] = {}
        if bootstrap:
            self._start_election(now)
        else:
            self._recover_send(now)

    # ------------------------------------------------------------------ inputs
    def submit(self, gid: str, now: float) -> None:
        n = self.numbers.get(gid)
        if n is not None:
            self.out.append(Numbered(gid, n))
        elif gid not in self.pending:
            self._push(gid, now)

    def peer_up(self, r: str, now: float) -> None:
        self.alive.add(r)
        if self.status is not Status.NORMAL:
            return
        if self.coordinator == self.me:
            self._send(r, Coordinator())
        elif r > self.me and (self.coordinator is None or r > self.coordinator):
            self._start_election(now)

    def peer_down(self, r: str, now: float) -> None:
        self.alive.discard(r)
        if r == self.coordinator and self.status is Status.NORMAL:
            self._start_election(now)

    def handle(self, frm: str, msg: Wire, now: float) -> None:
        j = self.idx.get(frm)
        if j is None or frm == self.me:
            raise UnknownMember(f"order message from {frm!r}, not a peer in {self.members}")
        self._check(frm, msg)
        if 0 <= msg.life < self.cv[j]:
            return  # an older incarnation of frm
        cv = tuple(self.cv)
        for x, life in enumerate(msg.cv):
            if life > self.cv[x] and (x != self.i or self.life < 0):
                self.cv[x] = life
        if msg.life > self.cv[j]:
            self.cv[j] = msg.life
        if tuple(self.cv) != cv:
            self._note(Lives(tuple(self.cv)))
        body = msg.body
        if self.status is not Status.NORMAL:
            self._handle_recovering(frm, body, now)
            return
        match body:
            case CvQuery(nonce):
                self._send(frm, CvReply(nonce))
                if frm == self.coordinator:  # it restarted
                    self._start_election(now)
            case Recover(nonce):
                self.known.pop(frm, None)
                self._send(frm, RecoverReply(nonce, self.promised, self.base, self.base_num,
                                             tuple(self.chosen[s] for s in sorted(self.chosen)),
                                             tuple(self.acc[s] for s in sorted(self.acc)), self.cp))
            case Election():
                self._send(frm, Answer())
                if self.coordinator == self.me:
                    self._send(frm, Coordinator())
                elif self.electing_until is None and self.awaiting_until is None:
                    self._start_election(now)
            case Answer():
                if self.electing_until is not None:
                    self.electing_until, self.awaiting_until = None, now + self.t.coordinator
            case Coordinator():
                if frm > self.me:
                    self._set_coordinator(frm, now)
                elif self.coordinator == self.me:
                    self._send(frm, Coordinator())
                else:
                    self._start_election(now)
            case Prepare(ballot, from_slot):
                self._prepare(frm, ballot, from_slot, now)
            case Promise(ballot):
                if self.lead is Lead.PREPARING and ballot == self.ballot:
                    self.promises[frm] = (msg.life, body)
                    self.known[frm] = body.frontier
                    self._try_take_over(now)
            case Nack(ballot, promised):
                self.top_round = max(self.top_round, promised[0])
                if self.lead is not Lead.IDLE and ballot == self.ballot and promised > self.ballot:
                    self._preempted(promised, now)
            case Accept(ballot, entry):
                self._accept(frm, msg.life, ballot, entry, now)
            case Accepted(ballot, slot, frontier):
                self.known[frm] = frontier
                if self.lead is Lead.LEADING and ballot == self.ballot and slot in self.inflight:
                    self.votes[slot][frm] = msg.life
                    self._check_commit(slot, now)
            case Sync():
                self._sync_in(frm, body, now)
            case SyncAck(frontier, promised):
                self.known[frm] = frontier
                self.top_round = max(self.top_round, promised[0])
                if self.lead is not Lead.IDLE and promised > self.ballot:
                    self._preempted(promised, now)
                elif frontier < self.next_slot:
                    self._sync_to(frm, frontier, False)
            case Request(gid, frontier):
                if self.coordinator == self.me and frontier >= self.base:
                    self._enqueue(gid, now)
            case Floor(floor):
                cur = self.floors.get(frm)
                if cur is None or (msg.life, floor) > cur:
                    self.floors[frm] = (msg.life, floor)

    def tick(self, now: float) -> None:
        if self.status is not Status.NORMAL:
            if now >= self.retry_at:
                self._recover_send(now)
            return
        if self.electing_until is not None and now >= self.electing_until:
            self._become_coordinator(now)
        if self.awaiting_until is not None and now >= self.awaiting_until:
            self._start_election(now)
        if self.coordinator == self.me:
            if self.lead is Lead.IDLE and now >= self.retry_at:
                self._start_promise_round(now)
            elif self.lead is Lead.PREPARING and now >= self.retry_at:
                self.retry_at = now + self.t.retry
                for m in self.others:
                    if not self._counts(m, self.promises[m][0] if m in self.promises else -1):
                        self._send(m, Prepare(self.ballot, self.next_slot))
            elif self.lead is Lead.LEADING:
                if now >= self.retry_at:
                    self.retry_at = now + self.t.retry
                    for slot, e in self.inflight.items():
                        for m in self.others:
                            if not self._counts(m, self.votes[slot].get(m, -1)):
                                self._send(m, Accept(self.ballot, e))
                if now >= self.beat_at:
                    self.beat_at = now + self.t.heartbeat
                    for m in self.others:
                        self._sync_to(m, self.known.get(m, self.next_slot), True)
        for gid, due in list(self.pending.items()):
            if now >= due:
                self._push(gid, now)

    def note_floor(self, floor: int, now: float) -> None:
        """The number below which this router's delivery core needs nothing (`DeliveryCore.total_floor`):
        the other members are told when it moved, and every `FLOOR_RESEND`."""
        floor = min(floor, self.next_num - 1)
        if self.status is not Status.NORMAL or self.life < 0:
            return
        if floor != self.own_floor or now - self._floor_at >= FLOOR_RESEND:
            self.own_floor, self._floor_at = floor, now
            for m in self.others:
                self._send(m, Floor(floor))

    def safe_floor(self) -> int:
        """Numbers up to this one are needed by no member: the lowest floor of all (0 for a member
        that never reported, or whose newest life known has not yet)."""
        f = self.own_floor
        for m in self.others:
            life, floor = self.floors.get(m, (-1, 0))
            f = min(f, floor if life >= self.cv[self.idx[m]] else 0)
        return f

    def compact(self, cp: Checkpoint) -> None:
        """Forget committed entries whose numbers are all at or below `cp.number` (at most
        `safe_floor`) and that every member delivered; `cp` is what stays of them (sent to a member
        that starts at the base)."""
        if cp.number + 1 < self.base_num:
            return  # (older than what we hold)
        while self.base < min(self.stable, self.next_slot):
            e = self.chosen[self.base]
            if e.first + len(e.gids) - 1 > cp.number:
                break
            del self.chosen[self.base]
            for k, g in enumerate(e.gids):
                if self.numbers.get(g) == e.first + k:
                    del self.numbers[g]
            self.base, self.base_num = self.base + 1, e.first + len(e.gids)
        if cp != self.cp:
            self._journal = None  # (the votes below the base go: written whole)
        self.cp = cp
        self._propose_new()  # (a leader held back by `max_history`)

    @property
    def leading(self) -> bool:
        return self.lead is Lead.LEADING

    # ------------------------------------------------------------------ restart with disk
    def _note(self, j: Journal) -> None:
        if self._journal is not None and self.journaling:
            self._journal.append(j)

    def snapshot(self) -> SeqState:
        """This member's votes as a whole (life -1 while it recovers: nothing to restore)."""
        if self.status is not Status.NORMAL or self.life < 0:
            return SeqState(-1, tuple(self.cv), NO_BALLOT, 1, 1, None, ())
        votes = {s: e for s, e in self.chosen.items() if s >= self.base} | {
            s: e for s, e in self.acc.items() if s >= self.base}
        return SeqState(self.life, tuple(self.cv), self.promised, self.base, self.base_num, self.cp,
                        tuple(votes[s] for s in sorted(votes)))

    def take_journal(self) -> SeqState | list[Journal]:
        """What changed since the last call: the journal to append, or a whole snapshot (to write
        instead of what was there). Its votes must be on disk before this pass's messages leave."""
        j = self._journal
        self._journal = []
        return self.snapshot() if j is None else j

    @property
    def journal_pending(self) -> bool:
        return self._journal is None or bool(self._journal)

    @classmethod
    def restore(cls, state: SeqState | None, me: str, members: Sequence[str], incarnation: str, now: float, *,
                timing: Timing | None = None, max_history: int = MAX_HISTORY) -> SequencerNode:
        """A new incarnation with the votes of `state` (an earlier one's, from disk): the same life,
        voting at once. None, or a life that was recovering: an amnesic restart (it recovers)."""
        node = cls(me, members, incarnation, now, timing=timing, max_history=max_history)
        if state is None or state.life < 0 or len(state.cv) != len(node.members):
            return node
        node.out.clear()  # (no RECOVER: it is the same life)
        node.status, node.replies = Status.NORMAL, {}
        node.life = state.life
        node.cv = list(state.cv)
        node.cv[node.i] = state.life
        node.promised = state.promised
        node.top_round = state.promised[0]
        if state.cp is not None and state.base > 1:  # it goes on from its own base (or a later one's)
            node.base = node.next_slot = state.base
            node.base_num = node.next_num = state.base_num
            node._go_on_from(state.cp)
        node.acc = {e.slot: e for e in state.votes if e.slot >= node.base}
        node.restored = True
        node.journaling = True
        node._journal = None
        node._start_election(now)
        return node

    def _check(self, frm: str, msg: Wire) -> None:
        """What the codec cannot know: the sizes of this group. A crash vector of another length, or
        a ballot naming a member index that does not exist (only the null ballot has -1), is refused
        (a peer with another topology file, or a bug), never used as an index; so is a compaction
        base above 1 without its checkpoint (or with one that does not reach below the base)."""
        n = len(self.members)
        if len(msg.cv) != n:
            raise RemoteProtocolError(f"order message from {frm!r}: crash vector of {len(msg.cv)} members, "
                                      f"this group has {n} ({', '.join(self.members)})")
        body = msg.body
        if (isinstance(body, RecoverReply | Promise) or (isinstance(body, Sync) and body.cp is not None)) \
                and body.base > 1 and (body.cp is None or body.cp.number + 1 < body.base_num):
            raise RemoteProtocolError(f"order message from {frm!r}: compaction base {body.base} "
                                          f"(number {body.base_num}) without a checkpoint that reaches it")
        ballots = [getattr(body, f) for f in ("ballot", "promised") if hasattr(body, f)]
        entries = [*getattr(body, "chosen", ()), *getattr(body, "accepted", ()), *getattr(body, "entries", ())]
        if hasattr(body, "entry"):
            entries.append(body.entry)
        ballots += [e.ballot for e in entries]
        for b in ballots:
            if not (0 <= b[1] < n or b == NO_BALLOT):
                raise RemoteProtocolError(f"order message from {frm!r}: ballot {b} names member {b[1]}, "
                                          f"this group has {n}")

    # ------------------------------------------------------------------ recovery
    def _recover_send(self, now: float) -> None:
        self.retry_at = now + self.t.retry
        body: Body = CvQuery(self.inc) if self.status is Status.LEARN_LIFE else Recover(self.inc)
        for m in self.others:
            if m not in self.replies:
                self._send(m, body)

    def _handle_recovering(self, frm: str, body: Body, now: float) -> None:
        if self.status is Status.LEARN_LIFE and isinstance(body, CvReply) and body.nonce == self.inc:
            self.replies[frm] = None
            if len(self.replies) >= self.k:
                self.life = self.cv[self.i] = self.cv[self.i] + 1
                self.status, self.replies = Status.RECOVER, {}
                self._journal = None  # (a new life: its journal starts over)
                self._recover_send(now)
        elif self.status is Status.RECOVER and isinstance(body, RecoverReply) and body.nonce == self.inc:
            self.replies[frm] = body
            if len(self.replies) >= self.k:
                self._adopt([r for r in self.replies.values() if r is not None], now)

    def _adopt(self, replies: list[RecoverReply], now: float) -> None:
        self._journal = None  # (its first votes: written whole)
        self.promised = max(r.promised for r in replies)
        self.top_round = self.promised[0]
        top = max(replies, key=lambda r: (r.base, r.base_num))
        self.base, self.base_num = top.base, top.base_num
        self.next_slot, self.next_num = self.base, self.base_num
        if top.cp is not None and self.base > 1:
            self._go_on_from(top.cp)
        for r in replies:
            for e in r.chosen:
                self._learn(e)
        for r in replies:
            for e in r.accepted:
                old = self.acc.get(e.slot)
                if e.slot >= self.base and e.slot not in self.chosen and (old is None or e.ballot > old.ballot):
                    self.acc[e.slot] = e
        self.status, self.replies = Status.NORMAL, {}
        self._deliver()
        if self.base > 1:
            self._give_back()
        self._start_election(now)

    # ------------------------------------------------------------------ bully
    def _start_election(self, now: float) -> None:
        higher = sorted(m for m in self.alive if m > self.me)
        if not higher:
            self._become_coordinator(now)
            return
        if self.coordinator != self.me:
            self.coordinator = None
        for m in higher:
            self._send(m, Election())
        self.electing_until, self.awaiting_until = now + self.t.answer, None

    def _become_coordinator(self, now: float) -> None:
        self.electing_until = self.awaiting_until = None
        if self.coordinator != self.me:
            self._set_coordinator(self.me, now)
        for m in self.others:
            self._send(m, Coordinator())

    def _set_coordinator(self, c: str, now: float) -> None:
        self.electing_until = self.awaiting_until = None
        if c == self.coordinator:
            return
        self.coordinator = c
        if c != self.me:
            self._stop_leading(now)
            self.queue.clear()
        else:
            self.retry_at = now
            if self.lead is Lead.IDLE:
                self._start_promise_round(now)
        for gid in self.pending:
            self.pending[gid] = now  # resend to the new coordinator at the next tick

    # ------------------------------------------------------------------ leader
    def _start_promise_round(self, now: float) -> None:
        self.ballot = (max(self.top_round, self.promised[0]) + 1, self.i, self.life)
        self.top_round = self.ballot[0]
        self.promised = self.ballot
        self._note(Promised(self.ballot))
        self.lead, self.retry_at = Lead.PREPARING, now + self.t.retry
        self.inflight.clear()
        self.votes.clear()
        self.promises = {self.me: (self.life, self._promise(self.ballot, self.next_slot))}
        for m in self.others:
            self._send(m, Prepare(self.ballot, self.next_slot))
        self._try_take_over(now)

    def _counts(self, m: str, life: int) -> bool:
        """A vote counts only while its life is the newest we know of its member."""
        return life >= 0 and life >= self.cv[self.idx[m]]

    def _counted(self, votes: dict[str, int]) -> int:
        return sum(1 for m, life in votes.items() if self._counts(m, life))

    def _try_take_over(self, now: float) -> None:
        if self._counted({m: life for m, (life, _) in self.promises.items()}) < self.quorum:
            return
        valid = [p for m, (life, p) in self.promises.items() if self._counts(m, life)]
        top = max(valid, key=lambda p: p.base)
        if top.base > self.next_slot and top.cp is not None:
            self._jump(top.base, top.base_num, top.cp)
        for p in valid:
            for e in p.chosen:
                self._learn(e)
        self._deliver()
        best: dict[int, Entry] = {}
        for p in valid:
            for e in p.accepted:
                if e.slot >= self.next_slot and e.slot not in self.chosen and (
                        e.slot not in best or e.ballot > best[e.slot].ballot):
                    best[e.slot] = e
        self.lead, self.promises = Lead.LEADING, {}
        self.beat_at = now
        for slot in sorted(best):
            self._propose(Entry(slot, self.ballot, best[slot].first, best[slot].gids))
        self._propose_new()

    def _propose(self, e: Entry) -> None:
        self.inflight[e.slot] = self.acc[e.slot] = e
        self._note(Voted((e,)))
        self.votes[e.slot] = {self.me: self.life}
        for m in self.others:
            self._send(m, Accept(self.ballot, e))

    def _propose_new(self) -> None:
        if self.lead is not Lead.LEADING or self.inflight or not self.queue or self.top_chosen >= self.next_slot:
            return
        if self.next_num - self.base_num >= self.max_history:
            self.held_back += 1  # back-pressure: the members' floors must let us compact first
            return
        gids = tuple(islice(self.queue, self.t.batch))  # never numbered: _learn unqueues
        for g in gids:
            del self.queue[g]
        self._propose(Entry(self.next_slot, self.ballot, self.next_num, gids))

    def _enqueue(self, gid: str, now: float) -> None:
        if gid in self.numbers or gid in self.queue or any(gid in e.gids for e in self.inflight.values()):
            return
        self.queue[gid] = None
        self._propose_new()

    def _check_commit(self, slot: int, now: float) -> None:
        if self._counted(self.votes[slot]) < self.quorum:
            return
        e = self.inflight[slot]
        self._learn(e)
        self._deliver()
        for m in self.others:
            start = self.known.get(m, slot)
            if start <= slot:  # (one past it delivered it: it learned it from our ACCEPT)
                self._sync_to(m, start, False)
        self._propose_new()

    def _preempted(self, higher: Ballot, now: float) -> None:
        self._stop_leading(now)
        owner = self.members[higher[1]]
        if owner > self.me and owner in self.alive:
            self._set_coordinator(owner, now)

    def _stop_leading(self, now: float) -> None:
        self.lead, self.retry_at = Lead.IDLE, now + self.t.retry
        self.inflight.clear()
        self.votes.clear()
        self.promises = {}

    # ------------------------------------------------------------------ acceptor and learner
    def _promise(self, ballot: Ballot, from_slot: int) -> Promise:
        above = range(max(from_slot, self.base), self.top_chosen + 1)
        return Promise(ballot, self.next_slot, self.base, self.base_num,
                       tuple(self.chosen[s] for s in above if s in self.chosen),
                       tuple(self.acc[s] for s in sorted(self.acc) if s >= from_slot), self.cp)

    def _prepare(self, frm: str, ballot: Ballot, from_slot: int, now: float) -> None:
        self.top_round = max(self.top_round, ballot[0])
        if ballot < self.promised:
            self._send(frm, Nack(ballot, self.promised))
            return
        if ballot > self.promised:
            self.promised = ballot
            self._note(Promised(ballot))
            if self.lead is not Lead.IDLE:
                self._preempted(ballot, now)
        self._send(frm, self._promise(ballot, from_slot))  # again if equal: our promise was lost

    def _accept(self, frm: str, life: int, ballot: Ballot, e: Entry, now: float) -> None:
        self.top_round = max(self.top_round, ballot[0])
        if ballot < self.promised:
            self._send(frm, Nack(ballot, self.promised))
            return
        if e.slot < self.next_slot or e.slot in self.chosen:  # decided: tell, do not vote
            self._sync_to(frm, e.slot, False)
            return
        if ballot > self.promised:
            self.promised = ballot
            self._note(Promised(ballot))
            if self.lead is not Lead.IDLE:
                self._preempted(ballot, now)
        self.acc[e.slot] = e
        self._note(Voted((e,)))
        if self.quorum <= 2 and self.idx[frm] == ballot[1] and life == ballot[2]:
            # the leader's vote (it accepted `e` in its ballot before sending it) and ours make a
            # quorum: `e` is committed, learn it now rather than from the leader's SYNC (3.)
            self._learn(e)
            self._deliver()
        self._send(frm, Accepted(ballot, e.slot, self.next_slot))

    def _learn(self, e: Entry) -> None:
        if e.slot < self.next_slot or e.slot in self.chosen:
            return
        self.chosen[e.slot] = e
        self.top_chosen = max(self.top_chosen, e.slot)
        self.acc.pop(e.slot, None)
        self.inflight.pop(e.slot, None)
        self.votes.pop(e.slot, None)
        for k, g in enumerate(e.gids):
            self.numbers[g] = e.first + k
            self.queue.pop(g, None)
            if self.pending.pop(g, None) is not None:
                self.out.append(Numbered(g, e.first + k))

    def _deliver(self) -> None:
        while (e := self.chosen.get(self.next_slot)) is not None:
            if e.first != self.next_num:
                raise SequencerInvariantError(f"slot {e.slot} starts at {e.first}, expected {self.next_num}")
            for k, g in enumerate(e.gids):
                self.out.append(Delivered(e.first + k, g))
            self.next_slot, self.next_num = self.next_slot + 1, e.first + len(e.gids)
            self.delivered_any = True

    def _jump(self, base: int, base_num: int, cp: Checkpoint) -> None:
        """Start delivering at `base`, going on from `cp`: only before this life delivered anything
        (a gap otherwise)."""
        if not self.delivered_any and base > self.next_slot:
            for log in (self.chosen, self.acc):
                for s in [s for s in log if s < base]:
                    del log[s]
            self.base = self.next_slot = base
            self.base_num = self.next_num = base_num
            self._go_on_from(cp)
            self._give_back()

    def _go_on_from(self, cp: Checkpoint) -> None:
        """The delivery core goes on from `cp` (one that is not ahead of what it has changes nothing)."""
        if self.cp is None or cp.number > self.cp.number or not self.restored_from:
            self.cp = cp
            self.restored_from = cp.number
            self.out.append(Restore(cp))

    def _give_back(self) -> None:
        """Pending gids could be numbered in the history skipped: numbering them would be a guess."""
        self.out.extend(Unresolved(g) for g in self.pending)
        self.pending.clear()

    def _sync_in(self, frm: str, m: Sync, now: float) -> None:
        c = self.coordinator
        if m.beat and frm > self.me and frm != c and (c is None or frm > c or c not in self.alive):
            self._set_coordinator(frm, now)  # a leader's heartbeat doubles as its COORDINATOR
        if m.cp is not None and m.base > self.next_slot and (not m.entries or m.entries[0].slot > self.next_slot):
            self._jump(m.base, m.base_num, m.cp)
        for e in m.entries:
            self._learn(e)
        self._deliver()
        self.stable = max(self.stable, min(m.stable, self.next_slot))
        if m.beat or self.next_slot < m.top:
            self._send(frm, SyncAck(self.next_slot, self.promised))
        self._propose_new()

    def _sync_to(self, m: str, start: int, beat: bool) -> None:
        cp = self.cp if start < self.base else None  # it is behind our base: it goes on from there
        start = max(start, self.base)
        picked: list[Entry] = []
        gids = 0
        for s in range(start, start + self.t.sync_cap):
            e = self.chosen.get(s)
            if e is None:
                continue
            if picked and gids + len(e.gids) > self.t.sync_gids:
                break
            picked.append(e)
            gids += len(e.gids)
        entries = tuple(picked)
        if self.lead is Lead.LEADING:
            self.stable = min([self.next_slot] + [self.known.get(o, self.base) for o in self.others])
        self._send(m, Sync(entries, self.next_slot, self.stable, self.base, self.base_num, beat, cp))

    # ------------------------------------------------------------------ submitter
    def _push(self, gid: str, now: float) -> None:
        self.pending[gid] = now + self.t.retry
        if self.status is not Status.NORMAL or self.coordinator is None:
            return
        if self.coordinator == self.me:
            self._enqueue(gid, now)
        else:
            self._send(self.coordinator, Request(gid, self.next_slot))

    def _send(self, to: str, body: Body) -> None:
        self.out.append(SendTo(to, Wire(self.life, tuple(self.cv), body)))
