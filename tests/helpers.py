"""What only the tests use over the product's process and log helpers (oncemesh.harness.procs,
oncemesh.harness.logsummary): client worker processes, log searches, and the order checks of a
run's client logs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from oncemesh.common.ids import PLID_LEN, counter_seq
from oncemesh.harness.logsummary import LogSummary, iter_log_lines
from oncemesh.harness.procs import Proc, python_cmd


def log_has(path: Path, *words: str) -> bool:
    """Has a log file (JSON lines or text) a line holding every one of `words`? (False while it is
    not there yet.)"""
    try:
        return any(all(w in line for w in words) for line in path.read_text().splitlines())
    except FileNotFoundError:
        return False


def worker(kind: str, *args: str, workdir: Path, name: str) -> Proc:
    """Start `python -m oncemesh.harness.worker KIND ARGS...` with its output in workdir/NAME.out."""
    return Proc(python_cmd("-m", "oncemesh.harness.worker", kind, *args), workdir / f"{name}.out")


def deliveries_after_acceptance(*dirs: Path) -> list[tuple[str, str, str, float, str, float]]:
    """Every hand-over the routers' logs under `dirs` show after the (message, subscription) pair
    was first accepted: (gid, subscription, router, delivered at, accepted at router, accepted at).
    With no router crashed, each is a duplicate by the router view's rules (docs/reconcile.md)."""
    accepted: dict[tuple[str, str], tuple[float, str]] = {}
    delivered: list[tuple[str, str, str, float]] = []
    for ev in iter_log_lines(*dirs):
        if ev.get("src") != "router" or not ev.get("sub") or not ev.get("gid"):
            continue
        key = (ev["gid"], ev["sub"])
        if ev["ev"] == "accepted":
            if key not in accepted or ev["ts"] < accepted[key][0]:
                accepted[key] = (ev["ts"], ev["node"])
        elif ev["ev"] == "delivered":
            delivered.append((ev["gid"], ev["sub"], ev["node"], ev["ts"]))
    late = []
    for gid, sub, node, ts in delivered:
        first = accepted.get((gid, sub))
        if first is not None and ts > first[0]:
            late.append((gid, sub, node, ts, first[1], first[0]))
    return sorted(late, key=lambda x: x[3])


class OrderSummary(LogSummary):
    """A `LogSummary` that also keeps the order of hand-overs and publishes, and checks the order
    modes against it: FIFO per publisher link, causal, total."""

    def __init__(self, *dirs: Path) -> None:
        self.hand_order: dict[str, list[tuple[float, int, str]]] = {}  # sub -> (ts, n, gid) handed
        # per client (container id): (ts, kind, gid) of what it was handed and what it published
        self.client_events: dict[str, list[tuple[float, int, str]]] = {}
        super().__init__(*dirs)

    def take(self, e: dict[str, Any]) -> None:
        super().take(e)
        src, ev = e.get("src"), e.get("ev")
        if src == "publisher" and ev == "published":
            self.client_events.setdefault(str(e.get("node")), []).append((float(e["ts"]), 1, e["gid"]))
        elif src == "subscriber" and ev == "handed":
            self.client_events.setdefault(str(e.get("node")), []).append((float(e["ts"]), 0, e["gid"]))
            self.hand_order.setdefault(e["sub"], []).append((float(e["ts"]), int(e.get("n", 0)), e["gid"]))

    def check_fifo(self, subs: Iterable[str]) -> list[str]:
        """Problems (empty when fine): per subscription and publisher link, hand-overs in publish
        order (the seq of our publishers' counter tags)."""
        problems = []
        for sub in subs:
            last: dict[str, tuple[int, str]] = {}
            reversals = []
            for _, _, gid in sorted(self.hand_order.get(sub, [])):
                seq = counter_seq(gid)
                if seq is None:
                    continue
                prev = last.get(gid[:PLID_LEN])
                if prev is not None and prev[0] > seq:
                    reversals.append((prev[1], gid))
                if prev is None or prev[0] < seq:
                    last[gid[:PLID_LEN]] = (seq, gid)
            if reversals:
                problems.append(f"{sub}: {len(reversals)} handed after a later message of their publisher, "
                                f"e.g. {reversals[:3]}")
        return problems

    def causal_deps(self) -> dict[str, set[str]]:
        """gid -> what its client had been handed before it published it (direct dependencies, from
        the client logs; a resend keeps its first publish)."""
        deps: dict[str, set[str]] = {}
        for events in self.client_events.values():
            seen: set[str] = set()
            for _, kind, gid in sorted(events):
                if kind == 0:
                    seen.add(gid)
                elif gid not in deps:
                    deps[gid] = set(seen)
        return deps

    def check_causal(self, subs: Iterable[str]) -> list[str]:
        """Problems (empty when fine): no subscription was handed a message before one its client
        had been handed before publishing it."""
        deps = self.causal_deps()
        problems = []
        for sub in subs:
            order = [g for _, _, g in sorted(self.hand_order.get(sub, []))]
            pos = {g: k for k, g in enumerate(order)}
            bad = [(a, b) for k, b in enumerate(order) for a in deps.get(b, ()) if pos.get(a, -1) > k]
            if bad:
                problems.append(f"{sub}: {len(bad)} handed before a message they depend on, e.g. {bad[:3]}")
        return problems

    def check_total(self, subs: Iterable[str]) -> list[str]:
        """Problems (empty when fine): every two subscriptions were handed the messages they both
        got in the same order (a topic in total order)."""
        orders = {sub: [g for _, _, g in sorted(self.hand_order.get(sub, []))] for sub in subs}
        problems = []
        names = sorted(orders)
        for i, a in enumerate(names):
            pos = {g: k for k, g in enumerate(orders[a])}
            for b in names[i + 1:]:
                common = [g for g in orders[b] if g in pos]
                bad = [(x, y) for x, y in zip(common, common[1:], strict=False) if pos[x] > pos[y]]
                if bad:
                    problems.append(f"{a} and {b} were handed {len(bad)} pairs in opposite orders, e.g. {bad[:3]}")
        return problems


def wait_progressing(goal: Callable[[], Any], progress: Callable[[], Any], stall: float, what: str,
                     interval: float = 0.5) -> Any:
    """Poll `goal` until it returns a truthy value, for as long as the work it waits for moves:
    `progress()` returns a marker of that work (counts, sizes), and only `stall` seconds without
    any change of it fail (TimeoutError). For waits whose length is the machine's speed (a loaded
    machine is slow, not stuck): a bound on the total would measure how idle the machine is."""
    last = progress()
    since = time.monotonic()
    while True:
        v = goal()
        if v:
            return v
        now = progress()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > stall:
            raise TimeoutError(f"no progress for {stall:g}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def two_router_mesh(defaults: str) -> str:
    """A topology file's text: routers A and B on loopback (ports chosen at start), one link, and
    `defaults` (TOML lines) as the [defaults] of both."""
    routers = "".join(f'\n[routers.{r}]\nlisten = "127.0.0.1:0"\ninter_router = "127.0.0.1:0"\n' for r in "AB")
    return f'[defaults]\n{defaults.strip()}\n{routers}\n[[links]]\nbetween = ["A", "B"]\n'


@contextmanager
def local_spark(app_name: str) -> Iterator[Any]:
    """A local Spark session for the tests that reconcile (local[2], a 2 GB heap, two shuffle
    partitions; `oncemesh reconcile` run in-process finds it active and uses it), stopped at the
    end if this call started it."""
    from oncemesh.spark.job import spark_session

    session, created = spark_session("local[2]", driver_memory="2g", shuffle_partitions=2, app_name=app_name)
    try:
        yield session
    finally:
        if created:
            session.stop()
