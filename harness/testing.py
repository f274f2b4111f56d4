"""Helpers for driving real router and client processes: used by the tests, the chaos command and
the benchmarks (product code, like `trio.testing`).

Every wait has a deadline and polls; nothing sleeps a fixed time to "let things settle". Only the
processes started here are ever signalled, by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ..common.ids import PLID_LEN, counter_seq
from ..common.settlement_log import log_files, read_events


class ProcessFailed(RuntimeError):
    pass


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll `pred` until it returns a truthy value or `timeout` elapses (then raise TimeoutError)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class Proc:
    """A child process with its output in a file."""

    def __init__(self, cmd: list[str], out: Path, env: dict[str, str] | None = None) -> None:
        self.cmd = cmd
        self.out = out
        out.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(out, "ab")  # noqa: SIM115 (kept open for the child's lifetime)
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen(cmd, stdout=self._fh, stderr=subprocess.STDOUT, env=e,
                                  start_new_session=True)

    @property
    def pid(self) -> int:
        return self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.p.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self.p.wait(timeout)
        finally:
            if self.p.returncode is not None:
                self._fh.close()

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                return self.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        return self.wait(timeout)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait(10)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.out.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""


class RouterProcess:
    """One standalone router process in `workdir` (state, logs, ready file)."""

    def __init__(self, router_id: str, workdir: Path, listen: str = "127.0.0.1:0",
                 settings: dict[str, Any] | None = None, extra: Iterable[str] = ()) -> None:
        self.id = router_id
        self.workdir = workdir
        self.listen = listen
        self.settings = dict(settings or {})
        self.extra = list(extra)
        self.state_dir = workdir / "state"
        self.log_dir = workdir / "logs"
        self.ready_file = workdir / f"{router_id}.ready.json"
        self.proc: Proc | None = None
        self.port: int | None = None
        self.starts = 0

    def command(self) -> list[str]:
        cmd = python_cmd("-m", "oncemesh", "router", "--id", self.id, "--listen", self.listen,
                         "--state-dir", str(self.state_dir), "--log-dir", str(self.log_dir),
                         "--ready-file", str(self.ready_file), *self.extra)
        settings = dict(self.settings)
        if not any(k in settings for k in ("users_file", "tls_verify_clients", "allow_anonymous")):
            settings["allow_anonymous"] = True  # (an open router, said explicitly; docs/security.md)
        for k, v in settings.items():
            cmd += ["--set", f"{k}={v}"]
        return cmd

    def start(self, timeout: float = 15.0) -> RouterProcess:
        self.ready_file.unlink(missing_ok=True)
        self.proc = Proc(self.command(), self.workdir / f"{self.id}.out")
        self.starts += 1
        pid = self.proc.pid

        def ready() -> dict[str, Any] | None:
            if self.proc is not None and not self.proc.alive():
                raise ProcessFailed(f"router {self.id} exited at start:\n{self.proc.tail()}")
            info = read_json(self.ready_file)
            return info if info and info.get("pid") == pid else None

        info = wait_for(ready, timeout, f"router {self.id} ready file")
        self.port = int(info["listen"].rsplit(":", 1)[1])
        self.listen = f"127.0.0.1:{self.port}"  # a restart comes back on the same port
        return self

    @property
    def url(self) -> str:
        return f"{'amqps' if self.settings.get('tls_cert') else 'amqp'}://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def status(self) -> dict[str, Any]:
        return read_json(self.ready_file) or {}

    def stats(self) -> dict[str, Any]:
        st: dict[str, Any] = self.status().get("stats", {})
        return st

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def stop(self, timeout: float = 10.0) -> int | None:
        return self.proc.stop(timeout) if self.proc is not None else None

    def freeze(self) -> None:
        if self.proc is not None:
            self.proc.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc is not None:
            self.proc.signal(signal.SIGCONT)

    def restart(self, timeout: float = 15.0) -> RouterProcess:
        if self.alive():
            self.kill()
        return self.start(timeout)

    def rss_kb(self) -> int:
        return rss_kb(self.pid)

    def tail(self, n: int = 40) -> str:
        return self.proc.tail(n) if self.proc is not None else ""


def log_has(path: Path, *words: str) -> bool:
    """Has a log file (JSON lines or text) a line holding every one of `words`? (False while it is
    not there yet.)"""
    try:
        return any(all(w in line for w in words) for line in path.read_text().splitlines())
    except FileNotFoundError:
        return False


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, in seconds.

    Summed from /proc/PID/task/*/schedstat (nanoseconds) where the kernel has it: /proc/PID/stat
    counts in clock ticks (10 ms), too coarse for a short run (a 300-message bench run read 0.0).
    Falls back to /proc/PID/stat.
    """
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except FileNotFoundError:
        if not os.path.exists(f"/proc/{pid}"):
            raise
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def worker(kind: str, *args: str, workdir: Path, name: str) -> Proc:
    """Start `python -m oncemesh.harness.worker KIND ARGS...` with its output in workdir/NAME.out."""
    return Proc(python_cmd("-m", "oncemesh.harness.worker", kind, *args), workdir / f"{name}.out")


# ---------------------------------------------------------------------- settlement logs
def iter_log_lines(*dirs: Path) -> Iterator[dict[str, Any]]:
    """Every event of every settlement log under `dirs`, v1-shaped (a v2 line's grouped ids are one
    event each; common.settlement_log.read_events)."""
    for d in dirs:
        for path in log_files(Path(d)):  # plain and gzipped segments
            yield from read_events(path)


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


class LogSummary:
    """A quick, in-process reading of client settlement logs (the Spark job is the full judge)."""

    def __init__(self, *dirs: Path) -> None:
        self.published: dict[str, dict[str, Any]] = {}
        self.outcome: dict[str, str] = {}
        self.handed: Counter[tuple[str, str]] = Counter()  # (sub, gid) -> hand-overs
        self.hand_order: dict[str, list[tuple[float, int, str]]] = {}  # sub -> (ts, n, gid) handed
        self.duplicates: Counter[tuple[str, str]] = Counter()
        self.router_events: Counter[str] = Counter()
        # per client (container id): (ts, kind, gid) of what it was handed and what it published
        self.client_events: dict[str, list[tuple[float, int, str]]] = {}
        for e in iter_log_lines(*dirs):
            src, ev = e.get("src"), e.get("ev")
            if src == "publisher":
                if ev == "published":
                    self.published.setdefault(e["gid"], e)
                    self.client_events.setdefault(str(e.get("node")), []).append((float(e["ts"]), 1, e["gid"]))
                elif ev == "outcome":
                    self.outcome[e["gid"]] = e["outcome"]
            elif src == "subscriber":
                if ev == "handed":
                    self.handed[(e["sub"], e["gid"])] += 1
                    self.client_events.setdefault(str(e.get("node")), []).append((float(e["ts"]), 0, e["gid"]))
                    self.hand_order.setdefault(e["sub"], []).append((float(e["ts"]), int(e.get("n", 0)), e["gid"]))
                elif ev == "duplicate":
                    self.duplicates[(e["sub"], e["gid"])] += 1
            elif src == "router":
                self.router_events[str(ev)] += 1

    def handed_to(self, sub: str) -> Counter[str]:
        return Counter({g: n for (s, g), n in self.handed.items() if s == sub})

    def subs(self) -> set[str]:
        return {s for s, _ in self.handed}

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
