"""What a router remembers of messages that became final after their records were freed.

A late copy, a late presenter or a message waiting for its predecessor must learn that a gid is
final (never hand it again, never wait for it), for `final_memory` seconds after it became final.

Two tiers:

- **young**, `DeliveryCore.recent_final`: a plain dict gid -> when it became final, in the order
  added. Adding is one C-level store and membership one C-level lookup; both are on the per-message
  path, where a dict subclass or a method call would lose the interpreter's specialised paths
  (measured: +1,000-2,500 instructions per message). Gids stay young for `final_memory_young`
  seconds (5 s: ~75,000 gids at 15,000 msg/s, ~11 MB).
- **old**, `OldFinals`: what outlived that, compacted once per tick. Our publishers tag their
  messages with a counter (`ids.counter_tag`), so the gids of one publisher link that became final
  in one tick are a few runs of consecutive numbers: each run is one interval (lo, hi) in a sorted
  list per publisher link, ~120 bytes however many gids it covers. Gids without a counter form
  (hashed tags, tags of other clients that are not plain counters) stay one dict entry each (~150
  bytes) in the old tier.

Bound: `final_memory_entries` entries in all (young gids + intervals + loose old gids), the oldest
forgotten first when there are more: at most ~150 MB at the default million, whatever the rate;
~12 MB at 15,000 msg/s from our publishers (75,000 young gids, a few thousand intervals), which
then keep the whole `final_memory` window instead of the last 66 s.

Besides: `FinalNotes`, per tag, what a resend of a message whose publisher may not have had its
outcome is answered with (router/identity.py), bounded by `final_notes_max` and forgotten with the rest.

A gid is forgotten `final_memory` seconds after it became final, or up to one tick later in the old
tier (what one tick compacts is forgotten together, when its newest gid is). A gid that becomes
final again (a predecessor something waits for) is remembered longer while young; once old, from
the first time. Forgetting walks each tier once from the
front and costs what is forgotten: it never pops from the front of a dict with `next(iter(d))` per
gid, which walks every deleted slot again, quadratic in what was forgotten (with a million gids
each tick's purge grew from 0.26 s to 0.87 s in five rounds, and a loop pass past the idle timeout
closed every connection).
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import groupby, repeat
from operator import itemgetter

from ..common.ids import PLID_LEN
from ..common.vocab import Outcome


def counter_key(gid: str) -> tuple[str, int] | None:
    """(publisher link, number) of a gid whose tag is a plain counter (lower-case letters and digits,
    no leading zero: ours, `ids.counter_tag`, and decimal counters of other clients), else None.
    Read in base 36, so each such tag has one number and ours are consecutive; a decimal counter
    makes runs of ten."""
    if _COUNTER_GID.fullmatch(gid) is None:
        return None
    return gid[:PLID_LEN], int(gid[PLID_LEN + 1:], 36)


_ONE = rf"[a-z2-7]{{{PLID_LEN}}}:(?:0|[1-9a-z][0-9a-z]*)"  # (a plid is base 32, lower case)
_COUNTER_GID = re.compile(_ONE)
_COUNTER_GIDS = re.compile(rf"{_ONE}(?:\n{_ONE})*")
_PLID = itemgetter(slice(0, PLID_LEN))
_TAG = itemgetter(slice(PLID_LEN + 1, None))


class OldFinals:
    """The old tier: intervals of counter-numbered gids per publisher link, loose gids apart, and
    one queue of both in the order they were added (their forgetting order)."""

    __slots__ = ("_runs", "loose", "_order", "gids")

    def __init__(self) -> None:
        self._runs: dict[str, tuple[list[int], list[int]]] = {}  # key -> (sorted starts, ends)
        self.loose: dict[str, float] = {}
        self._order: deque[tuple[float, str, int, int]] = deque()  # (t, key or gid, lo, hi); lo < 0: loose
        self.gids = 0  # gids covered

    def __len__(self) -> int:
        """Entries held (intervals and loose gids): what the memory bound counts."""
        return len(self._order)

    def __bool__(self) -> bool:
        return bool(self._order)

    def top(self, plid: str) -> int | None:
        """The highest counter number of publisher link `plid` remembered here (None: none)."""
        runs = self._runs.get(plid)
        return runs[1][-1] if runs else None

    def __contains__(self, gid: str) -> bool:
        # (once per copy a destination receives, where the usual answer is no: `counter_key`'s
        # regex only when the publisher link has runs, no bisect past its newest)
        if gid in self.loose:
            return True
        runs = self._runs.get(gid[:PLID_LEN])
        if runs is None:
            return False
        k = counter_key(gid)
        if k is None:
            return False
        n = k[1]
        los, his = runs
        if not his or n > his[-1]:
            return False
        i = bisect_right(los, n) - 1
        return i >= 0 and n <= his[i]

    def add(self, gids: list[str], t: float) -> None:
        """Gids that became final at `t` at the latest (one tick's worth, oldest first). Per gid this
        is C-level work when they are all ours (one regex over the batch, a sort, `int` per tag); it
        runs once per tick, never on the per-message path."""
        joined = "\n".join(gids)
        if _COUNTER_GIDS.fullmatch(joined):
            counters = joined.split("\n")  # (a copy: sorted below)
        else:
            counters = []
            for gid in gids:
                if counter_key(gid) is not None:
                    counters.append(gid)
                elif gid not in self.loose:
                    self.loose[gid] = t
                    self._order.append((t, gid, -1, -1))
                    self.gids += 1
        counters.sort()  # (grouped by publisher link)
        for key, group in groupby(counters, key=_PLID):
            seqs = sorted(map(int, map(_TAG, group), repeat(36)))
            runs = self._runs.get(key)
            if runs is None:
                runs = self._runs[key] = ([], [])
            lo = seqs[0]
            if seqs[-1] - lo == len(seqs) - 1 and len(set(seqs)) == len(seqs):
                self._insert(key, runs, lo, seqs[-1], t)  # the usual: one run
                continue
            hi = lo
            for n in seqs:
                if n <= hi + 1:
                    if n > hi:
                        hi = n
                    continue
                self._insert(key, runs, lo, hi, t)
                lo = hi = n
            self._insert(key, runs, lo, hi, t)

    def _insert(self, key: str, runs: tuple[list[int], list[int]], lo: int, hi: int, t: float) -> None:
        los, his = runs
        i = bisect_left(los, lo)
        if (i > 0 and his[i - 1] >= lo) or (i < len(los) and los[i] <= hi):
            # overlaps what is remembered already (a gid final again): add only what is new
            start = None
            for n in range(lo, hi + 1):
                j = bisect_right(los, n) - 1
                known = j >= 0 and n <= his[j]
                if not known and start is None:
                    start = n
                elif known and start is not None:
                    self._insert(key, runs, start, n - 1, t)
                    start = None
            if start is not None:
                self._insert(key, runs, start, hi, t)
            return
        los.insert(i, lo)
        his.insert(i, hi)
        self._order.append((t, key, lo, hi))
        self.gids += hi - lo + 1

    def forget(self, before: float, max_entries: int) -> int:
        """Forget from the front what became final before `before`, and the oldest beyond
        `max_entries` entries. Returns how many gids were forgotten."""
        order = self._order
        gone = 0
        while order and (order[0][0] < before or len(order) > max_entries):
            _, key, lo, hi = order.popleft()
            if lo < 0:
                del self.loose[key]
                gone += 1
                continue
            los, his = self._runs[key]
            i = bisect_left(los, lo)
            del los[i], his[i]
            if not los:
                del self._runs[key]
            gone += hi - lo + 1
        self.gids -= gone
        return gone


def forget_finals(finals: dict[str, float], before: float, max_gids: int) -> int:
    """Forget, from the front of `finals` (gid -> when it became final, in the order added), the gids
    that became final before `before` (up to the first that did not: a gid final again keeps its
    place), and the oldest beyond `max_gids`. Returns how many."""
    excess = len(finals) - max_gids
    dead = []
    for gid, t in finals.items():  # one pass from the front
        if t >= before and excess <= 0:
            break
        dead.append(gid)
        excess -= 1
    for gid in dead:
        del finals[gid]
    return len(dead)


def age_finals(young: dict[str, float], old: OldFinals, now: float, memory: float, young_age: float,
               max_entries: int) -> tuple[int, int]:
    """One tick of the two tiers: forget what became final more than `memory` ago; move young gids
    older than `young_age` to the old tier (from the front, up to the first younger one); keep at
    most `max_entries` entries in all, forgetting the oldest first (old ones before young ones).
    Returns (gids forgotten, gids moved)."""
    before = now - memory
    gone = old.forget(before, max_entries)
    cut = now - young_age
    moving: list[str] = []
    dead: list[str] = []  # (older than `memory` yet young: behind a gid that became final again)
    newest = before
    for gid, t in young.items():  # one pass from the front
        if t >= cut:
            break
        if t < before:
            dead.append(gid)
            continue
        moving.append(gid)
        if t > newest:
            newest = t
    for gid in moving:
        del young[gid]
    for gid in dead:
        del young[gid]
    gone += len(dead)
    if moving:
        old.add(moving, newest)
    if len(young) + len(old) > max_entries:
        gone += old.forget(before, max(max_entries - len(young), 0))
        gone += forget_finals(young, before, max_entries - len(old))
    return gone, len(moving)


@dataclass(frozen=True, slots=True)
class FinalNote:
    """A message that became final here while its publisher may not have had its outcome: the
    router settled it in receiver-settle-mode first (the outcome may have been lost with the
    connection), or its publisher left without settling (orphan_final). A transfer under its tag on
    a later attachment with the same bytes is taken for its resend (router/identity.py)."""

    gid: str  # the message's global id: its tag's own, or the new identity it was given
    outcome: Outcome
    error: tuple[str, str] | None
    digest: str | None  # of its bytes (`ids.payload_digest`); None: not known (any bytes are taken for it)
    at: float  # when it became final


class FinalNotes:
    """Per tag (its plain gid), a note on the newest message under it that became final here, when
    that one's publisher may not have had its outcome (no note: its publisher settled it after the
    outcome, the usual). Forgotten with the final memory (`final_memory`), the oldest first beyond
    `final_notes_max` (~200 bytes each). Only links in receiver-settle-mode first and orphans leave
    notes."""

    __slots__ = ("by_tag", "tag_of")

    def __init__(self) -> None:
        self.by_tag: dict[str, FinalNote] = {}  # plain gid -> note, oldest first
        self.tag_of: dict[str, str] = {}  # a new identity's gid -> its tag's plain gid (notes on it)

    def __len__(self) -> int:
        return len(self.by_tag)

    def get(self, plain: str) -> FinalNote | None:
        return self.by_tag.get(plain)

    def __contains__(self, plain: str) -> bool:
        return plain in self.by_tag

    def of_gid(self, gid: str) -> tuple[str, FinalNote] | None:
        """(its tag's plain gid, the note) when the note is on message `gid`."""
        plain = self.tag_of.get(gid, gid)
        note = self.by_tag.get(plain)
        return (plain, note) if note is not None and note.gid == gid else None

    def put(self, plain: str, note: FinalNote) -> None:
        self.drop(plain)  # (to the back: forgetting walks from the front)
        self.by_tag[plain] = note
        if note.gid != plain:
            self.tag_of[note.gid] = plain

    def drop(self, plain: str) -> None:
        note = self.by_tag.pop(plain, None)
        if note is not None and note.gid != plain:
            self.tag_of.pop(note.gid, None)

    def forget(self, before: float, max_entries: int) -> int:
        """Forget from the front the notes made before `before`, and the oldest beyond `max_entries`.
        Returns how many."""
        notes = self.by_tag
        excess = len(notes) - max_entries
        dead = []
        for plain, note in notes.items():  # one pass from the front (see forget_finals)
            if note.at >= before and excess <= 0:
                break
            dead.append(plain)
            excess -= 1
        for plain in dead:
            self.drop(plain)
        return len(dead)
