"""Forged router logs: consistent histories written by the real writer, then one mutation with the
verdict it must get. The checker checks itself with these (tests/spark/test_router_view.py), and
the live audit's test forges a line the same way.

A history (`history`): routers `<p>A`, `<p>B`, `<p>C` (p: a prefix that keeps histories apart, so
that many are judged in one reconciliation), subscriptions on topic `<p>t` each homed at one of
them (in force before anything is published), messages each entering at one origin and owed to
every subscription: received (with the owed set), forwarded / forward_received toward remote
homes, delivered and accepted at the home, the origin's echo of a remote acceptance, the outcome
ACCEPTED after every acceptance, settled. Each event is its own flush pass (one line per event),
so that a mutation can take out, add or move exactly one line. Segments are small: a router's log
has several.

Mutations (`MUTATIONS`) and what the router view must say:

| mutation | expected |
|---|---|
| none | every pair ok |
| drop_accept_local | the home's `accepted` of a pair homed at its origin removed: that pair `lost` |
| drop_accept_remote | the home's `accepted` removed, the origin's echo kept: `unjudged` (evidence_gap) |
| drop_accept_and_echo | both removed: `lost` |
| duplicate_delivery | `delivered` again after the acceptance (a later link): `duplicated` |
| duplicate_accept | a second disposition: `duplicated` |
| outcome_early | the outcome moved before the message's last acceptance: that pair `false_accept` |
| drop_received | the origin's `received` removed: every pair of the message `unjudged` (no_owed_set) |
| unexpected_delivery | delivered and accepted to a subscription nobody owed: `unexpected` |
| truncate | a closed segment cut short (its trailer gone): the router's pairs `unjudged` (partial_log) |
| drop_segment | a segment removed: the router's pairs `unjudged` |
| shared_given_back | a shared subscription's message: handed to member m1, given back when it left (`released`), handed to m2 and accepted: `ok` |
| shared_two_members | handed to members m1 and m2 both, each accepting it: `duplicated` |
| shared_none_accepted | handed to member m1, given back, and no member accepted it (a pair homed at its origin): `lost` |
| crash_redelivered | the home is SIGKILLed right after a remote pair's acceptance, before its origin heard of it; its next life hands the message again and it is accepted, the origin's echo after that: `redelivered` |
| crash_told_duplicated | the same, but the origin heard of the first acceptance before the crash: `duplicated` |
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncemesh.common.settlement_log import AcceptedBy, Owed, Peer, Segments, SettlementLog, log_files

MUTATIONS = ("none", "drop_accept_local", "drop_accept_remote", "drop_accept_and_echo", "duplicate_delivery",
             "duplicate_accept", "outcome_early", "drop_received", "unexpected_delivery", "truncate",
             "drop_segment", "shared_given_back", "shared_two_members", "shared_none_accepted",
             "crash_redelivered", "crash_told_duplicated")
BASE = 1_900_000_000.0  # event times (after any real segment header's t0: lines keep their times)
SEGMENT_BYTES = 400


@dataclass(slots=True)
class Event:
    router: str
    ts: float
    entry: tuple[Any, ...]  # (ev, gid, topic, sid, info) as the delivery core logs it
    life: int = 1  # the router's incarnation (2: after a crash)


@dataclass(slots=True)
class History:
    prefix: str
    routers: tuple[str, ...]
    subs: dict[str, str]  # sid -> home router
    topic: str
    messages: dict[str, str]  # gid -> origin router
    events: list[Event] = field(default_factory=list)
    expected: dict[tuple[str, str], str] = field(default_factory=dict)  # (gid, sid) -> router-view class
    partial_routers: set[str] = field(default_factory=set)
    mutation: str = "none"

    def pairs(self) -> list[tuple[str, str]]:
        return [(g, s) for g in self.messages for s in self.subs]


def history(prefix: str, rng: random.Random, subs: int = 3, messages: int = 3, base: float = BASE) -> History:
    """A consistent history (module docstring); every pair expected `ok`."""
    routers = tuple(prefix + r for r in "ABC")
    topic = prefix + "t"
    sub_homes = {f"{prefix}s{i}": rng.choice(routers) for i in range(subs)}
    plid = (prefix + "plid" + "x" * 12)[:12]
    msgs = {f"{plid}:{j}": rng.choice(routers) for j in range(messages)}
    h = History(prefix, routers, sub_homes, topic, msgs)
    ev = h.events
    for r in routers:
        ev.append(Event(r, base - 10, ("router_started", None, None, None, {"info": "forged"})))
    for i, (sid, home) in enumerate(sub_homes.items()):
        ev.append(Event(home, base - 5 + i * 0.01, ("subscribed", None, topic, sid,
                                                    {"container": prefix + "c", "link": sid, "count": 1})))
    owed = Owed(list(sub_homes.items()))
    for j, (gid, origin) in enumerate(msgs.items()):
        t = base + j * 10
        ev.append(Event(origin, t, ("received", gid, topic, None, owed)))
        remote = sorted({home for home in sub_homes.values() if home != origin})
        if remote:
            ev.append(Event(origin, t + 0.1, ("forwarded", gid, topic, None, Peer(",".join(remote)))))
            for home in remote:
                ev.append(Event(home, t + 0.2, ("forward_received", gid, topic, None, Peer(origin))))
        for i, (sid, home) in enumerate(sub_homes.items()):
            ev.append(Event(home, t + 1 + i * 0.01, ("delivered", gid, topic, sid, None)))
            ev.append(Event(home, t + 2 + i * 0.01, ("accepted", gid, topic, sid, None)))
            if home != origin:
                ev.append(Event(origin, t + 3 + i * 0.01, ("accepted", gid, topic, sid, "remote")))
        ev.append(Event(origin, t + 4, ("outcome", gid, topic, None, AcceptedBy(len(sub_homes)))))
        ev.append(Event(origin, t + 5, ("settled", gid, topic, None, None)))
        for home in remote:
            ev.append(Event(home, t + 5.5, ("settled", gid, topic, None, None)))
    for r in routers:
        ev.append(Event(r, base + 10 * messages + 10, ("router_stopped", None, None, None, None)))
    h.expected = {p: "ok" for p in h.pairs()}
    return h


_ANY = object()


def _find(h: History, ev: str, gid: str, sid: str | None, router: str | None = None,
          info: Any = _ANY) -> Event:
    """The event (ev, gid, sid) at `router` (any when None) with `info` (any when not given)."""
    return next(e for e in h.events if e.entry[0] == ev and e.entry[1] == gid and e.entry[3] == sid
                and (router is None or e.router == router) and (info is _ANY or e.entry[4] == info))


def mutate(h: History, mutation: str, rng: random.Random) -> bool:
    """Apply one mutation to the events (file mutations are applied by `write`). Returns False when
    this history has no place for it (e.g. no pair homed at its origin)."""
    h.mutation = mutation
    local = [(g, s) for g, s in h.pairs() if h.subs[s] == h.messages[g]]
    remote = [(g, s) for g, s in h.pairs() if h.subs[s] != h.messages[g]]
    if mutation == "none":
        return True
    if mutation == "drop_accept_local":
        if not local:
            return False
        g, s = rng.choice(local)
        h.events.remove(_find(h, "accepted", g, s, info=None))
        h.expected[(g, s)] = "lost"
    elif mutation in ("drop_accept_remote", "drop_accept_and_echo"):
        if not remote:
            return False
        g, s = rng.choice(remote)
        h.events.remove(_find(h, "accepted", g, s, h.subs[s], None))
        if mutation == "drop_accept_and_echo":
            h.events.remove(_find(h, "accepted", g, s, h.messages[g], "remote"))
            h.expected[(g, s)] = "lost"
        else:
            h.expected[(g, s)] = "unjudged"
    elif mutation == "duplicate_delivery":
        g, s = rng.choice(h.pairs())
        acc = _find(h, "accepted", g, s, h.subs[s], None)
        h.events.append(Event(acc.router, acc.ts + 0.5, ("delivered", g, h.topic, s, "redelivery")))
        h.expected[(g, s)] = "duplicated"
    elif mutation == "duplicate_accept":
        g, s = rng.choice(h.pairs())
        acc = _find(h, "accepted", g, s, h.subs[s], None)
        h.events.append(Event(acc.router, acc.ts + 0.001, ("accepted", g, h.topic, s, None)))
        h.expected[(g, s)] = "duplicated"
    elif mutation == "outcome_early":
        g = rng.choice(list(h.messages))
        last = max((_find(h, "accepted", g, s, h.subs[s], None) for s in h.subs), key=lambda e: e.ts)
        out = _find(h, "outcome", g, None)
        out.ts = last.ts - 0.005  # after every other acceptance of it, before this one
        h.expected[(g, str(last.entry[3]))] = "false_accept"
    elif mutation == "drop_received":
        g = rng.choice(list(h.messages))
        h.events.remove(_find(h, "received", g, None))
        for s in h.subs:
            h.expected[(g, s)] = "unjudged"
    elif mutation == "unexpected_delivery":
        g = rng.choice(list(h.messages))
        home = rng.choice(h.routers)
        stray = h.prefix + "stray"
        t = _find(h, "received", g, None).ts
        h.events.append(Event(home, t + 1.5, ("delivered", g, h.topic, stray, None)))
        h.events.append(Event(home, t + 2.5, ("accepted", g, h.topic, stray, None)))
        h.expected[(g, stray)] = "unexpected"
    elif mutation in ("truncate", "drop_segment"):
        busy = {r: sum(e.router == r for e in h.events) for r in h.routers}
        target = max(h.routers, key=lambda r: (busy[r], r))
        if busy[target] < 12:
            return False  # too few lines for three segments
        h.partial_routers.add(target)
        for g, s in h.pairs():
            if h.subs[s] == target or h.messages[g] == target:
                h.expected[(g, s)] = "unjudged"
    elif mutation.startswith("shared_"):  # the subscription is a shared one: its lines name members
        pairs = local if mutation == "shared_none_accepted" else h.pairs()
        if not pairs:
            return False
        g, s = rng.choice(pairs)
        home = h.subs[s]
        dl = _find(h, "delivered", g, s, home, None)
        acc = _find(h, "accepted", g, s, home, None)
        dl.entry = (*dl.entry[:4], "member=m1")
        if mutation == "shared_two_members":
            acc.entry = (*acc.entry[:4], "member=m1")
            h.events.append(Event(home, dl.ts + 0.1, ("delivered", g, h.topic, s, "member=m2")))
            h.events.append(Event(home, acc.ts + 0.001, ("accepted", g, h.topic, s, "member=m2")))
            h.expected[(g, s)] = "duplicated"
        else:
            h.events.append(Event(home, dl.ts + 0.1, ("released", g, h.topic, s, "member=m1 left")))
            if mutation == "shared_given_back":
                acc.entry = (*acc.entry[:4], "member=m2")
                h.events.append(Event(home, dl.ts + 0.2, ("delivered", g, h.topic, s, "member=m2")))
            else:
                h.events.remove(acc)
                h.expected[(g, s)] = "lost"
    elif mutation.startswith("crash_"):
        if not remote:
            return False
        g, s = rng.choice(remote)
        home = h.subs[s]
        acc = _find(h, "accepted", g, s, home, None)
        echo = _find(h, "accepted", g, s, h.messages[g], "remote")
        for e in h.events:  # the home dies with this acceptance its last line; a new life goes on
            if e.router == home and e.ts > acc.ts:
                e.life = 2
        h.events.append(Event(home, acc.ts + 0.001, ("router_started", None, None, None, {"info": "forged"}), 2))
        h.events.append(Event(home, acc.ts + 0.5, ("delivered", g, h.topic, s, "redelivery"), 2))
        h.events.append(Event(home, acc.ts + 0.6, ("accepted", g, h.topic, s, None), 2))
        if mutation == "crash_redelivered":
            echo.ts = acc.ts + 0.7  # the echo of the second acceptance
            h.expected[(g, s)] = "redelivered"
        else:
            echo.ts = acc.ts  # told, then killed
            h.expected[(g, s)] = "duplicated"
    else:
        raise ValueError(f"unknown mutation {mutation!r}")
    return True


def write(h: History, directory: Path, rng: random.Random | None = None) -> list[Path]:
    """Write every router's log with the real writer (one flush pass per event, small segments),
    then the file mutations. Returns the files."""
    directory.mkdir(parents=True, exist_ok=True)
    for r, life in sorted({(e.router, e.life) for e in h.events}):
        log = SettlementLog(directory / f"{r}.settlement.jsonl", src="router", node=r, inc=f"{r}-{life}",
                            segments=Segments(max_bytes=SEGMENT_BYTES, max_seconds=0, compress=False))
        for e in sorted((e for e in h.events if e.router == r and e.life == life), key=lambda e: e.ts):
            log.write_core_events(e.ts, [e.entry])
            log.flush()
        log.close()
        if life == 1 and any(e.router == r and e.life == 2 for e in h.events):  # killed: no trailer
            last = max(f for f in log_files(directory) if f.name.startswith(f"{r}.settlement.{r}-1."))
            lines = last.read_text().splitlines(keepends=True)
            assert '"segment_closed"' in lines[-1], lines[-1]
            last.write_text("".join(lines[:-1]))
    if h.partial_routers:
        [target] = h.partial_routers
        segs = sorted(f for f in log_files(directory) if f.name.startswith(target + ".settlement."))
        if len(segs) < 3:
            raise ValueError(f"{target}: {len(segs)} segments, too few to cut one short")
        victim = segs[len(segs) // 2]
        if h.mutation == "drop_segment":
            victim.unlink()
        else:  # its trailer and the lines before it go
            lines = victim.read_text().splitlines(keepends=True)
            victim.write_text("".join(lines[:max(1, len(lines) - 2)]))
    return log_files(directory)


def forge(kinds: Iterable[str], directory: Path, seed: int = 1) -> list[History]:
    """One history per mutation kind (prefixes h0_, h1_, ...), all written under `directory`."""
    out = []
    for i, kind in enumerate(kinds):
        rng = random.Random(f"{seed}-{i}-{kind}")
        for _ in range(50):
            h = history(f"h{i}_", rng, subs=rng.randint(2, 3), messages=rng.randint(2, 4))
            if mutate(h, kind, rng):
                break
        else:
            raise ValueError(f"no history found for {kind}")
        write(h, directory / h.prefix)
        out.append(h)
    return out


def clear(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
