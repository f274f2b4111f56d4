"""A quick, in-process reading of settlement logs: what was published, its outcome, and what each
subscription was handed (`oncemesh demo` prints it; the Spark job is the full judge).

The order checks the tests add over the same reading are in tests/helpers.py (`OrderSummary`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..common.settlement_log import log_files, read_events


def iter_log_lines(*dirs: Path) -> Iterator[dict[str, Any]]:
    """Every event of every settlement log under `dirs`, v1-shaped (a v2 line's grouped ids are one
    event each; common.settlement_log.read_events)."""
    for d in dirs:
        for path in log_files(Path(d)):  # plain and gzipped segments
            yield from read_events(path)


class LogSummary:
    """The client settlement logs under some directories, read once."""

    def __init__(self, *dirs: Path) -> None:
        self.published: dict[str, dict[str, Any]] = {}
        self.outcome: dict[str, str] = {}
        self.handed: Counter[tuple[str, str]] = Counter()  # (sub, gid) -> hand-overs
        self.duplicates: Counter[tuple[str, str]] = Counter()
        for e in iter_log_lines(*dirs):
            self.take(e)

    def take(self, e: dict[str, Any]) -> None:
        """Count one event of the logs (in log order)."""
        src, ev = e.get("src"), e.get("ev")
        if src == "publisher":
            if ev == "published":
                self.published.setdefault(e["gid"], e)
            elif ev == "outcome":
                self.outcome[e["gid"]] = e["outcome"]
        elif src == "subscriber":
            if ev == "handed":
                self.handed[(e["sub"], e["gid"])] += 1
            elif ev == "duplicate":
                self.duplicates[(e["sub"], e["gid"])] += 1

    def handed_to(self, sub: str) -> Counter[str]:
        return Counter({g: n for (s, g), n in self.handed.items() if s == sub})

    def subs(self) -> set[str]:
        return {s for s, _ in self.handed}

    def check_exactly_once(self, subs: Iterable[str], gids: Iterable[str] | None = None) -> list[str]:
        """Problems (empty when fine): each gid published handed exactly once to each sub."""
        problems = []
        want = set(gids) if gids is not None else set(self.published)
        for sub in subs:
            got = self.handed_to(sub)
            missing = want - set(got)
            dup = {g: n for g, n in got.items() if n > 1}
            unexpected = set(got) - set(self.published)
            if missing:
                problems.append(f"{sub}: {len(missing)} missing, e.g. {sorted(missing)[:3]}")
            if dup:
                problems.append(f"{sub}: {len(dup)} duplicated, e.g. {list(dup.items())[:3]}")
            if unexpected:
                problems.append(f"{sub}: {len(unexpected)} unexpected, e.g. {sorted(unexpected)[:3]}")
        return problems
