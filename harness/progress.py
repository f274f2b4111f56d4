"""Following a run as it happens, from the client settlement logs (chaos runs, fault tests).

Why not wait for the Spark reconciliation: a fault scenario needs to know *now* whether traffic
flows (to time a failover, to decide that a run has quiesced, to cut a link mid-stream), and
Spark is the judge at the end, not a monitor. Client logs are exact (docs/settlement-log.md: a
client flushes before it acts), so reading them is enough to see progress; the verdict still comes
from `spark.job.reconcile_paths`.

`ClientLogs.poll()` reads only what was appended since the last call (complete lines only: a line
being written, or torn by a SIGKILL, is left for later or skipped), so it can be called every few
tens of milliseconds during a long run.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..common.topics import matches


def read_new_lines(path: Path, offset: int) -> tuple[int, list[dict[str, object]], int]:
    """The JSON objects of the complete lines of `path` past byte `offset`: (the offset after
    them, the objects, lines that did not parse). A line being written (no newline yet) is left
    for the next call; a file that cannot be read gives nothing."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset, [], 0
    end = data.rfind(b"\n")
    if end < 0:
        return offset, [], 0
    events: list[dict[str, object]] = []
    malformed = 0
    for raw in data[:end].split(b"\n"):
        if not raw.strip():
            continue
        try:
            e = json.loads(raw)
        except ValueError:
            malformed += 1
            continue
        if isinstance(e, dict):
            events.append(e)
    return offset + end + 1, events, malformed


def _owes(topic_filter: str, topic: str) -> bool:
    """Does a subscription to `topic_filter` owe a message of `topic` (a name, or unknown: "")?"""
    return topic_filter == topic or (bool(topic_filter) and bool(topic) and matches(topic_filter, topic))


@dataclass(slots=True)
class Subscription:
    """What the logs say about one subscription (by subscription id)."""

    sub: str
    link: str | None = None  # the subscriber's link name (the worker's --name)
    topic: str | None = None
    started: float | None = None  # first subscribed/resumed line
    ended: bool = False  # unsubscribed by the application
    handed: dict[str, float] = field(default_factory=dict)  # gid -> first hand-over time
    times: list[float] = field(default_factory=list)  # every hand-over time, in log order
    repeats: Counter[str] = field(default_factory=Counter)  # gid -> hand-overs beyond the first


class ClientLogs:
    """Incremental reader of every `*.publisher.jsonl` and `*.subscriber.jsonl` under some dirs."""

    def __init__(self, *dirs: Path) -> None:
        self.dirs = [Path(d) for d in dirs]
        self._offsets: dict[Path, int] = {}
        self.published: dict[str, float] = {}  # gid -> first `published` time (any run)
        self.topic_of: dict[str, str] = {}  # gid -> topic
        self.outcome: dict[str, str] = {}  # gid -> last outcome told
        self.accepted_at: dict[str, float] = {}  # gid -> first time ACCEPTED was told
        self.subs: dict[str, Subscription] = {}
        self.malformed = 0

    def poll(self) -> int:
        """Read what was appended since the last call; returns the number of lines read."""
        n = 0
        for d in self.dirs:
            if not d.is_dir():
                continue
            for path in sorted(d.rglob("*.jsonl")):
                if path.name.endswith((".publisher.jsonl", ".subscriber.jsonl")):
                    n += self._read(path)
        return n

    def _read(self, path: Path) -> int:
        self._offsets[path], events, malformed = read_new_lines(path, self._offsets.get(path, 0))
        self.malformed += malformed
        for e in events:
            self._event(e)
        return len(events)

    def _event(self, e: dict[str, object]) -> None:
        ev, gid, ts = e.get("ev"), e.get("gid"), e.get("ts")
        t = float(ts) if isinstance(ts, int | float) else 0.0
        if e.get("src") == "publisher" and isinstance(gid, str):
            if ev == "published":
                if gid not in self.published or t < self.published[gid]:
                    self.published[gid] = t
                if isinstance(e.get("topic"), str):
                    self.topic_of[gid] = str(e["topic"])
            elif ev == "outcome" and isinstance(e.get("outcome"), str):
                self.outcome[gid] = str(e["outcome"])
                if e["outcome"] == "ACCEPTED":
                    self.accepted_at.setdefault(gid, t)
            return
        sid = e.get("sub")
        if e.get("src") != "subscriber" or not isinstance(sid, str):
            return
        s = self.subs.get(sid)
        if s is None:
            s = self.subs[sid] = Subscription(sid)
        if ev in ("subscribed", "resumed"):
            s.link = str(e.get("link") or s.link)
            s.topic = str(e.get("topic") or s.topic)
            if s.started is None:
                s.started = t
        elif ev == "unsubscribed":
            s.ended = True
        elif ev == "handed" and isinstance(gid, str):
            s.times.append(t)
            if gid in s.handed:
                s.repeats[gid] += 1
            else:
                s.handed[gid] = t

    # ------------------------------------------------------------------ questions
    def by_link(self, link: str) -> Subscription | None:
        """The subscription whose link name is `link` (a worker's --name)."""
        for s in self.subs.values():
            if s.link == link:
                return s
        return None

    def owed(self, s: Subscription) -> set[str]:
        """Messages first sent, on a topic its filter matches, after the subscription started (the client's view of
        "in force": the router may have put it in force slightly earlier, never later)."""
        if s.started is None:
            return set()
        f = s.topic or ""
        return {g for g, t in self.published.items()
                if t >= s.started and _owes(f, self.topic_of.get(g) or f)}

    def missing(self, s: Subscription) -> set[str]:
        return self.owed(s) - set(s.handed)

    def in_doubt(self) -> set[str]:
        """Published, and no final outcome told yet."""
        return {g for g in self.published if self.outcome.get(g) not in ("ACCEPTED", "REJECTED")}

    def duplicates(self) -> list[str]:
        """Subscriptions that had a message handed more than once (definite at any time)."""
        return [f"subscription {s.link or s.sub}: {len(s.repeats)} message(s) handed more than once, "
                f"e.g. {sorted(s.repeats)[:3]}" for s in self.subs.values() if s.repeats]

    def violations(self, skew: float = 0.0) -> list[str]:
        """Safety problems visible in the client logs alone (the reconciliation is the full judge):
        a message handed twice to one subscription; ACCEPTED told before a subscription in force
        (and not ended) had it handed. Ask when the writers are quiet: mid-run, an outcome line can
        be read before the hand-over line that preceded it (another file), a transient report."""
        out = self.duplicates()
        for s in self.subs.values():
            if s.ended or s.started is None:
                continue
            early = sorted(g for g, t_acc in self.accepted_at.items()
                           if self.published.get(g, 0.0) >= s.started
                           and self.topic_of.get(g, s.topic) == s.topic
                           and s.handed.get(g, float("inf")) > t_acc + skew)
            if early:
                out.append(f"subscription {s.link or s.sub}: {len(early)} message(s) told ACCEPTED before "
                           f"it had them (or though it never had them), e.g. {early[:3]}")
        return out

    def last_handed(self) -> float | None:
        return max((s.times[-1] for s in self.subs.values() if s.times), default=None)
