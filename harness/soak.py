"""`oncemesh soak`: a router (or a mesh) under steady traffic for a long time, sampled, and judged.

What a soak answers that a benchmark does not: does anything grow while nothing should (memory, the
settlement log beyond its rotation, in-flight records), does the event loop stall, does any
connection drop. Theory of operation:

1. The server is one router (`RouterProcess`) or the mesh of a topology file (`bench.MeshServer`,
   the launcher), its topics given an order mode with `with_topic_order` (as `oncemesh chaos
   --order` and `oncemesh bench --order` do; causal too).
2. *Witness* traffic, always: durable subscribers and publishers of the client library
   (`harness.worker`) that write settlement logs, on a topic of its own. They are what the Spark
   reconciliation judges at the end (`spark.job.reconcile_paths`, as chaos does).
3. *Load*: with `--clients bench` (the default), the lean exactly-once engine clients of
   `oncemesh bench` (`bench.run_once` on the server started here), at `--rate` or unbounded; they
   write no settlement log (that is what makes them lean), so their traffic is checked by their own
   counts: every message ACCEPTED, each subscriber handed every message once, in order. With
   `--clients library` the witness is the load: its publishers send at `--rate`.
4. A sampler thread reads, every `--interval` seconds, each router's RSS (/proc/PID/status of the
   processes started here), its status file (loop lag, GC pause, in-flight records, connections)
   and the bytes of its log files (every file under its log directory: the settlement log rotates
   into compressed segments, so no file name is assumed).
5. Afterwards: per router the maxima, and least-squares slopes after `--warmup` with their 95%
   confidence interval (RSS and log bytes, in MB/min), so that "RSS slope within noise of 0" is a
   yes or no; connections dropped (router logs: errors on client connections, neighbours lost;
   client side: bench clients' errors, witness failovers); log bytes per (message, subscription)
   pair; the reconciliation's verdict.

Exit status: 0 pass; 1 the run failed (a connection dropped, a router exited, clients failed or
miscounted, the reconciliation did not pass); 2 the run could not be set up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..router.core import CoreConfig
from ..spark import pyspark_missing
from ..topology.load import TopologyError, with_topic_order
from .bench import BenchError, Case, MeshServer, Server, Settings, SingleRouter, run_once, run_suffix
from .chaos import ChaosError, resolve_topology
from .procs import Proc, ProcessFailed, RouterProcess, python_cmd, read_json, rss_kb
from .progress import ClientLogs

if TYPE_CHECKING:
    from ..spark.reconcile import Summary

LOAD_TOPIC = "t"  # bench.run_once appends run_suffix(tag)
LOAD_TAG = "load"
WITNESS_TOPIC = "soak-witness"
ORDERS = ("fifo", "causal", "total", "lamport")
SETUP_TIMEOUT = 90.0
SETTLE = 120.0  # after the load: the witness's last messages must be handed within this
MB = 1024 * 1024
# router log events that mean a connection was lost or refused (a clean close logs nothing)
DROP_EVENTS = ("connection.closed", "connection.refused", "link.closed_on_error", "mesh.peer_down",
               "mesh.peer_dead")
STALL_EVENT = "router.loop_stall"


class SoakError(Exception):
    """The run could not be set up (bad arguments, a server or client that would not start)."""


# ---------------------------------------------------------------------- the maths (pure)
# two-sided 95% quantiles of Student's t, by degrees of freedom; between entries the smaller df's
# (larger) value is used, so the interval is never narrower than the exact one
_T975 = ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365),
         (8, 2.306), (9, 2.262), (10, 2.228), (12, 2.179), (15, 2.131), (20, 2.086), (25, 2.060),
         (30, 2.042), (40, 2.021), (60, 2.000), (120, 1.980))


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with `df` degrees of freedom (1.96 beyond 120)."""
    if df < 1:
        raise ValueError("degrees of freedom must be at least 1")
    if df > _T975[-1][0]:
        return 1.96
    value = _T975[0][1]
    for d, t in _T975:
        if d > df:
            break
        value = t
    return value


@dataclass(frozen=True, slots=True)
class Fit:
    """A least-squares line y = intercept + slope * x over n points, with its noise: the residual
    standard deviation and the half-width of the slope's 95% confidence interval. Consecutive
    samples of a process's memory are correlated, so the interval is, if anything, too narrow:
    "within noise" judged by it is a strict test."""

    n: int
    slope: float
    intercept: float
    residual_std: float
    slope_stderr: float
    ci95: float

    @property
    def within_noise(self) -> bool:
        """The slope is indistinguishable from 0: 0 lies in its 95% confidence interval."""
        return abs(self.slope) <= self.ci95

    def scaled(self, k: float) -> Fit:
        """The same fit with y (and so slope, noise) multiplied by k (units, per-minute rates)."""
        return Fit(self.n, self.slope * k, self.intercept * k, self.residual_std * abs(k),
                   self.slope_stderr * abs(k), self.ci95 * abs(k))


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Fit | None:
    """Ordinary least squares of ys on xs; None with fewer than 3 points or no spread in x."""
    n = len(xs)
    if n != len(ys):
        raise ValueError("xs and ys differ in length")
    if n < 3:
        return None
    mx = math.fsum(xs) / n
    my = math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx <= 0.0:
        return None
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = my - slope * mx
    ssr = math.fsum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    s = math.sqrt(ssr / (n - 2))
    se = s / math.sqrt(sxx)
    return Fit(n, slope, intercept, s, se, t975(n - 2) * se)


def after_warmup(points: Sequence[tuple[float, float]], warmup: float) -> tuple[list[float], list[float]]:
    """The (t, y) points with t >= warmup, as two lists."""
    kept = [(t, y) for t, y in points if t >= warmup]
    return [t for t, _ in kept], [y for _, y in kept]


# ---------------------------------------------------------------------- sampling
@dataclass(frozen=True, slots=True)
class Target:
    """One router process to watch: its status file, and its files in a log directory (every file
    whose name starts with `prefix`; all of them when the directory is its own)."""

    id: str
    pid: int
    status: Path
    log_dir: Path
    prefix: str = ""

    @property
    def router_log(self) -> Path:
        return self.log_dir / f"{self.id}.router.log"


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds since the traffic started
    router: str
    alive: bool
    rss_kb: int | None
    log_bytes: int
    loop_lag_max_ms: float | None  # the router's last complete minute (the minute so far before)
    loop_lag_p99_ms: float | None
    loop_lag_worst_ms: float | None  # since the router started
    gc_pause_max_ms: float | None
    records: int | None  # in-flight delivery records
    undecided: int | None
    inflight_bytes: int | None
    connections: int | None
    status_age_s: float | None  # how old the status file was when read
    log_segments_deleted: int | None = None  # by the settlement log's retention, since the router started


def dir_bytes(directory: Path, prefix: str = "") -> int:
    """Bytes of every file under `directory` (recursively) whose name starts with `prefix`. Files
    that vanish while we look (a segment being compressed and removed) are skipped."""
    total = 0
    if not directory.is_dir():
        return 0
    for root, _, files in os.walk(directory):
        for name in files:
            if name.startswith(prefix):
                with contextlib.suppress(FileNotFoundError):
                    total += os.stat(os.path.join(root, name)).st_size
    return total


def _num(d: dict[str, Any], key: str) -> Any:
    v = d.get(key)
    return v if isinstance(v, int | float) else None


def take_sample(target: Target, t: float, now: float | None = None) -> Sample:
    alive = os.path.exists(f"/proc/{target.pid}")
    rss: int | None = None
    if alive:
        try:
            rss = rss_kb(target.pid)
        except OSError:
            alive = False
    status = read_json(target.status) or {}
    stats = status.get("stats") if isinstance(status.get("stats"), dict) else {}
    assert isinstance(stats, dict)
    updated = _num(status, "updated")
    now = time.time() if now is None else now
    return Sample(round(t, 3), target.id, alive, rss, dir_bytes(target.log_dir, target.prefix),
                  _num(stats, "loop_lag_max_ms"), _num(stats, "loop_lag_p99_ms"), _num(stats, "loop_lag_worst_ms"),
                  _num(stats, "gc_pause_max_ms"), _num(stats, "records"), _num(stats, "undecided"),
                  _num(stats, "inflight_bytes"), _num(stats, "connections"),
                  round(now - updated, 2) if updated is not None else None, _num(stats, "log_segments_deleted"))


class Sampler:
    """Samples every target every `interval` seconds on a thread of its own (it only reads files)."""

    def __init__(self, targets: Sequence[Target], interval: float) -> None:
        self.targets = list(targets)
        self.interval = interval
        self.samples: list[Sample] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._thread.start()

    def sample(self) -> None:
        t = time.monotonic() - self.t0
        got = [take_sample(tg, t) for tg in self.targets]
        with self._lock:
            self.samples.extend(got)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        """Stop the thread and take one last sample (the state at the end of the traffic)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.interval + 10)
        self.sample()

    def of(self, router: str) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if s.router == router]


def count_events(path: Path, names: Sequence[str], since: float, until: float) -> Counter[str]:
    """Lines of a router's JSON log whose event starts with one of `names`, with since <= ts <= until."""
    out: Counter[str] = Counter()
    try:
        f = path.open(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return out
    with f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if not isinstance(e, dict):
                continue
            ts, ev = e.get("ts"), str(e.get("event", ""))
            if not isinstance(ts, int | float) or not since <= ts <= until:
                continue
            name = ev.split(" ", 1)[0]
            if name in names:
                out[name] += 1
    return out


# ---------------------------------------------------------------------- analysis (pure)
def _max(values: Sequence[float | int | None]) -> float | None:
    got = [v for v in values if v is not None]
    return max(got) if got else None


def rss_growth_at_highs(samples: Sequence[Sample], warmup: float) -> tuple[float, float] | None:
    """(RSS growth after the warm-up, the part of it in steps at new in-flight highs), MB.

    A router's memory follows the most it ever held in flight: Python's dicts keep the capacity
    they grew to, Proton keeps a connection's delivery objects and their buffers at the largest
    number alive at once. Both are bounded by the in-flight limits (docs/operations.md, "What can
    grow"). A step of RSS is counted "at a new high" when the sample before it, its own or the
    next saw more records in flight than every sample before them (samples a second apart can
    lag the spike by one); the rest is growth at levels seen before, which is what a leak adds."""
    points = [(s.t, s.rss_kb / 1024, s.records) for s in samples if s.rss_kb is not None]
    highs: list[bool] = []
    top = -1
    for _, _, rec in points:
        highs.append(rec is not None and rec > top)
        if rec is not None:
            top = max(top, rec)
    start = next((i for i, (t, _, _) in enumerate(points) if t >= warmup), None)
    if start is None or start + 1 >= len(points):
        return None
    at_highs = 0.0
    for i in range(start + 1, len(points)):
        if any(highs[j] for j in (i - 1, i, i + 1) if j < len(points)):
            at_highs += points[i][1] - points[i - 1][1]
    return points[-1][1] - points[start][1], at_highs


def router_figures(samples: Sequence[Sample], warmup: float) -> dict[str, Any]:
    """Maxima and slopes of one router's samples (JSON-ready)."""
    rss = [(s.t, s.rss_kb / 1024) for s in samples if s.rss_kb is not None]
    logs = [(s.t, s.log_bytes / MB) for s in samples]
    out: dict[str, Any] = {
        "samples": len(samples),
        "rss_mb_first": round(rss[0][1], 2) if rss else None,
        "rss_mb_last": round(rss[-1][1], 2) if rss else None,
        "rss_mb_max": round(max(y for _, y in rss), 2) if rss else None,
        "loop_lag_max_ms": _max([s.loop_lag_max_ms for s in samples]),
        "loop_lag_p99_max_ms": _max([s.loop_lag_p99_ms for s in samples]),
        "loop_lag_worst_ms": _max([s.loop_lag_worst_ms for s in samples]),
        "gc_pause_max_ms": _max([s.gc_pause_max_ms for s in samples]),
        "records_max": _max([s.records for s in samples]),
        "undecided_max": _max([s.undecided for s in samples]),
        "inflight_bytes_max": _max([s.inflight_bytes for s in samples]),
        "connections_max": _max([s.connections for s in samples]),
        "log_bytes_last": samples[-1].log_bytes if samples else 0,
        "log_segments_deleted": _max([s.log_segments_deleted for s in samples]),
        "exited": any(not s.alive for s in samples),
    }
    for key, points in (("rss", rss), ("log", logs)):
        xs, ys = after_warmup(points, warmup)
        fit = fit_line(xs, ys)
        per_min = fit.scaled(60.0) if fit is not None else None  # MB per second -> MB per minute
        out[f"{key}_slope_mb_per_min"] = round(per_min.slope, 4) if per_min else None
        out[f"{key}_slope_ci95_mb_per_min"] = round(per_min.ci95, 4) if per_min else None
        out[f"{key}_residual_std_mb"] = round(fit.residual_std, 4) if fit else None
        out[f"{key}_slope_within_noise"] = per_min.within_noise if per_min else None
        out[f"{key}_fit_samples"] = fit.n if fit else len(xs)
    split = rss_growth_at_highs(samples, warmup)
    out["rss_growth_after_warmup_mb"] = round(split[0], 2) if split else None
    out["rss_growth_at_inflight_highs_mb"] = round(split[1], 2) if split else None
    return out


# ---------------------------------------------------------------------- the run
@dataclass(frozen=True, slots=True)
class SoakConfig:
    target: str  # "router" (one standalone router) or a topology file / example name
    duration: float = 60.0  # seconds of load
    rate: float = 0.0  # messages per second in all (split over the publishers); 0: unbounded
    clients: str = "bench"  # bench (lean load + witness) | library (the witness is the load)
    order: str = "fifo"
    pub_at: tuple[str, ...] = ()  # routers of the load's publishers (default: the first router)
    sub_at: tuple[str, ...] = ()  # routers of its subscribers (default: one at every router)
    size: int = 100
    interval: float = 1.0
    warmup: float | None = None  # seconds excluded from the slopes (default: `default_warmup`)
    witness_rate: float = 20.0  # witness messages per second (with --clients bench)
    reconcile: bool = True
    reconcile_router_logs: bool = False
    workdir: Path | None = None
    router_settings: tuple[tuple[str, str], ...] = ()
    insecure_mesh: bool = False  # a topology's inter-router connections without TLS (to compare)

    @property
    def warmup_s(self) -> float:
        if self.warmup is not None:
            return self.warmup
        final_memory = dict(self.router_settings).get("final_memory", CoreConfig().final_memory)
        return default_warmup(self.duration, float(final_memory))


def default_warmup(duration: float, final_memory: float) -> float:
    """Seconds left out of the slopes when not told: a router's memory grows by design until its
    final-gid memory (`final_memory`, 300 s by default) is full, then stays; so a minute past that,
    or a fifth of the run if longer, but never more than half the run."""
    return min(duration / 2, max(duration / 5, final_memory + 60.0))


@dataclass(slots=True)
class SoakResult:
    config: SoakConfig
    workdir: Path
    routers: dict[str, dict[str, Any]] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)
    witness: dict[str, Any] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)  # where seen -> count
    stalls: int = 0
    log_bytes_live: int = 0  # the routers' log files at the end of the traffic (last sample)
    log_bytes: int = 0  # the same after the routers stopped (a router closes its segment on stop)
    pairs: int = 0
    summary: Summary | None = None
    problems: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0  # from start to everything stopped
    reconcile_seconds: float = 0.0

    @property
    def connections_dropped(self) -> int:
        """Drops seen by the routers or the clients (one drop may be seen by both sides)."""
        return sum(self.dropped.values())

    @property
    def verdict(self) -> str:
        if self.summary is None:
            return "skipped" if not self.config.reconcile else "none"
        return "pass" if self.summary.passed and not self.order_failures else "fail"

    @property
    def order_failures(self) -> int:
        s, order = self.summary, self.config.order
        if s is None:
            return 0
        if order in ("total", "lamport"):
            return s.total_order_disagreements
        return s.fifo_reversals + (s.causal_violations if order == "causal" else 0)

    @property
    def interrupted(self) -> bool:
        return self.error == "interrupted"

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if self.error is not None and not self.samples:
            return 2
        failed = (self.error is not None or self.problems or self.connections_dropped
                  or self.verdict not in ("pass", "skipped"))
        return 1 if failed else 0

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "target": c.target, "order": c.order, "clients": c.clients, "duration_s": c.duration,
            "rate": c.rate or "unbounded", "warmup_s": c.warmup_s, "interval_s": c.interval,
            "workdir": str(self.workdir), "seconds": round(self.seconds, 1),
            "reconcile_seconds": round(self.reconcile_seconds, 1),
            "exit_code": self.exit_code, "passed": self.exit_code == 0,
            "verdict": self.verdict, "problems": self.problems, "error": self.error,
            "connections_dropped": self.connections_dropped, "dropped": self.dropped,
            "loop_stalls": self.stalls, "pairs": self.pairs,
            "log_bytes_live": self.log_bytes_live, "log_bytes": self.log_bytes,
            "log_bytes_per_pair_live": round(self.log_bytes_live / self.pairs, 1) if self.pairs else None,
            "log_bytes_per_pair": round(self.log_bytes / self.pairs, 1) if self.pairs else None,
            "load": self.load, "witness": self.witness, "routers": self.routers,
            "reconciliation": self.summary.to_dict() if self.summary is not None else None,
            "samples": [asdict(s) for s in self.samples],
        }


@dataclass(slots=True)
class _Witness:
    """The library clients: durable subscribers first (in force before anything is sent), then
    publishers, each a `harness.worker` process with its state and settlement log."""

    procs: dict[str, Proc] = field(default_factory=dict)
    pubs: list[str] = field(default_factory=list)
    subs: list[str] = field(default_factory=list)
    count: int = 0  # messages in all (every subscriber is owed them all)


class _Run:
    def __init__(self, cfg: SoakConfig, say: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.say = say
        self.wd = self._workdir(cfg.workdir)
        self.result = SoakResult(cfg, self.wd)
        self.server: Server | None = None
        self.targets: list[Target] = []
        self.urls: dict[str, str] = {}
        self.routers: list[str] = []
        self.witness = _Witness()
        self.client_logs = self.wd / "clientlogs"
        self.sampler: Sampler | None = None
        self.t_start = self.t_end = 0.0  # wall clock of the traffic
        self._witness_plan: list[tuple[str, str, float, int]] = []  # name, router, rate, count
        self._done = threading.Event()

    @staticmethod
    def _workdir(given: Path | None) -> Path:
        if given is None:
            return Path(tempfile.mkdtemp(prefix="oncemesh-soak-")).resolve()
        given = given.resolve()
        if given.exists() and any(given.iterdir()):
            raise SoakError(f"{given} is not empty: the verdict reads every log under it, so each run needs "
                            f"a fresh one")
        given.mkdir(parents=True, exist_ok=True)
        return given

    # ------------------------------------------------------------------ setup
    def start_server(self) -> None:
        cfg = self.cfg
        settings = dict(cfg.router_settings)
        if cfg.target == "router":
            if cfg.order != "fifo":
                raise SoakError("--order needs a topology (topology/examples/single.toml is one router)")
            rp = RouterProcess("A", self.wd / "router", settings=settings)
            try:
                rp.start(timeout=SETUP_TIMEOUT)
            except (ProcessFailed, TimeoutError) as exc:
                rp.kill()
                raise SoakError(f"the router did not start: {exc}") from None
            self.server = SingleRouter(self.wd, router=rp)
            self.targets = [Target("A", rp.pid, rp.ready_file, rp.log_dir)]
        else:
            if settings:
                raise SoakError("--set applies to a single router; a topology file carries its routers' settings")
            try:
                path = resolve_topology(cfg.target)
                topo = with_topic_order(path, [f"{LOAD_TOPIC}-{run_suffix(LOAD_TAG)}", WITNESS_TOPIC], cfg.order,
                                        self.wd / f"{path.stem}-{cfg.order}.toml")
            except (ChaosError, TopologyError, ValueError) as exc:
                raise SoakError(str(exc)) from None
            try:
                mesh = MeshServer(topo, self.wd / "mesh", timeout=SETUP_TIMEOUT, insecure_mesh=cfg.insecure_mesh)
            except Exception as exc:  # MeshError, RouterStartError, TimeoutError: it was stopped
                raise SoakError(f"the mesh did not start: {exc}") from None
            self.server = mesh
            self.targets = [Target(s.id, s.pid, mesh.mesh.ready_file(s.id), mesh.mesh.log_dir, f"{s.id}.")
                            for s in mesh.mesh.status() if s.pid]
        self.routers = [t.id for t in self.targets]
        self.urls = {r: "amqp://" + self.server.url(r) for r in self.routers}
        for r in (*cfg.pub_at, *cfg.sub_at):
            if r not in self.urls:
                raise SoakError(f"no router {r!r} (routers: {', '.join(self.routers)})")
        rate = f"{cfg.rate:g} msg/s" if cfg.rate else "unbounded rate"
        self.say(f"oncemesh soak: {cfg.target} ({', '.join(f'{t.id} pid {t.pid}' for t in self.targets)}), "
                 f"order {cfg.order}, {cfg.clients} clients, {rate}")
        self.say(f"  {cfg.duration:g}s of load, samples every {cfg.interval:g}s, slopes after {cfg.warmup_s:g}s; "
                 f"work directory {self.wd}")

    @property
    def pub_at(self) -> list[str]:
        return list(self.cfg.pub_at) or [self.routers[0]]

    @property
    def sub_at(self) -> list[str]:
        return list(self.cfg.sub_at) or list(self.routers)

    def _worker(self, name: str, kind: str, at: str, *args: str) -> Proc:
        cmd = [*python_cmd("-m", "oncemesh.harness.worker", kind), "--url", self.urls[at], "--topic", WITNESS_TOPIC,
               "--name", name, "--state-dir", str(self.wd / "clients" / name), "--log-dir", str(self.client_logs),
               *args]
        p = Proc(cmd, self.wd / "clients" / f"{name}.out")
        self.witness.procs[name] = p
        return p

    def start_witness_subscribers(self) -> None:
        cfg, w = self.cfg, self.witness
        if cfg.clients == "library":
            rate, pubs = cfg.rate, self.pub_at
        else:
            rate, pubs = cfg.witness_rate, [self.routers[-1]]
        if rate <= 0:
            raise SoakError("--clients library needs a --rate (the client library is not a load generator)"
                            if cfg.clients == "library" else "--witness-rate must be positive")
        per_pub = max(1, round(rate / len(pubs) * cfg.duration))
        w.count = per_pub * len(pubs)
        self._witness_plan = [(f"w-pub-{i}", at, rate / len(pubs), per_pub) for i, at in enumerate(pubs)]
        for j, at in enumerate(self.sub_at):
            name = f"w-sub-{j}"
            self._worker(name, "consume", at, "--count", str(w.count))
            w.subs.append(name)
        watch = ClientLogs(self.client_logs)
        deadline = time.monotonic() + SETUP_TIMEOUT
        while not all((s := watch.by_link(n)) is not None and s.started for n in w.subs):
            watch.poll()
            for n in w.subs:
                if not w.procs[n].alive():
                    raise SoakError(f"witness subscriber {n} exited at start:\n{w.procs[n].tail(15)}")
            if time.monotonic() > deadline:
                raise SoakError(f"timed out after {SETUP_TIMEOUT:g}s waiting for the witness subscriptions")
            time.sleep(0.05)

    def start_witness_publishers(self) -> None:
        timeout = str(self.cfg.duration + SETTLE)
        for name, at, rate, count in self._witness_plan:
            self._worker(name, "publish", at, "--count", str(count), "--rate", f"{rate:g}", "--timeout", timeout)
            self.witness.pubs.append(name)

    # ------------------------------------------------------------------ traffic
    def run(self) -> None:
        cfg = self.cfg
        self.start_server()
        self.start_witness_subscribers()
        self.sampler = Sampler(self.targets, cfg.interval)
        self.sampler.start()
        self.t_start = time.time()
        self.start_witness_publishers()
        progress = threading.Thread(target=self._progress, name="soak-progress", daemon=True)
        progress.start()
        try:
            if cfg.clients == "bench":
                self.run_bench_load()
            self.wait_witness()
        finally:
            self._done.set()
            self.t_end = time.time()
            self.sampler.stop()

    def run_bench_load(self) -> None:
        cfg, server = self.cfg, self.server
        assert server is not None
        pubs, subs = self.pub_at, self.sub_at
        case = Case("soak", "router" if cfg.target == "router" else "mesh", pubs, subs,
                    [LOAD_TOPIC] * len(pubs), [LOAD_TOPIC] * len(subs), cfg.rate / len(pubs) if cfg.rate else 0.0)
        settings = Settings(size=cfg.size, duration=cfg.duration, order=cfg.order)
        rate = f"{cfg.rate:g} msg/s" if cfg.rate else "unbounded"
        self.say(f"load: {case.shape()}, {rate}, exactly-once, "
                 f"{cfg.size}-byte messages")
        try:
            summary = run_once(case, settings, self.wd / "bench", LOAD_TAG, server=server)
        except BenchError as exc:
            self.result.problems.append(f"load clients: {exc}")
            summary = {}
        self.result.load = self._load_figures(summary, len(subs))

    def _load_figures(self, summary: dict[str, Any], nsubs: int) -> dict[str, Any]:
        """The bench clients' own check of exactly-once: their result files, beside run_once's summary."""
        rd = self.wd / "bench" / LOAD_TAG
        pres = [read_json(p) or {} for p in sorted(rd.glob("pub*.result.json"))]
        sres = [read_json(p) or {} for p in sorted(rd.glob("sub*.result.json"))]
        sent = sum(int(r.get("sent", 0)) for r in pres)
        outcomes = sum(int(r.get("outcomes", 0)) for r in pres)
        accepted = sum(int(r.get("accepted", 0)) for r in pres)
        received = [int(r.get("received", 0)) for r in sres]
        out_of_order = sum(int(r.get("out_of_order", 0)) for r in sres)
        errors = [str(r["error"]) for r in [*pres, *sres] if r.get("error")]
        dropped = sum(1 for e in errors if "connection closed" in e or "link closed" in e)
        if dropped:
            self.result.dropped["load_clients"] = dropped
        problems = self.result.problems
        if len(pres) != len(self.pub_at) or len(sres) != nsubs:
            problems.append(f"load clients: {len(pres)} publisher and {len(sres)} subscriber results of "
                            f"{len(self.pub_at)} and {nsubs}")
        if outcomes != sent or accepted != sent:
            problems.append(f"load: {sent} sent, {outcomes} outcomes, {accepted} ACCEPTED")
        bad = [n for n in received if n != accepted]
        if bad:
            problems.append(f"load: subscribers received {received}, each should have {accepted} (ACCEPTED)")
        if out_of_order:
            problems.append(f"load: {out_of_order} messages out of order or repeated")
        problems.extend(f"load client: {e}" for e in errors)
        wall = float(summary.get("wall_s") or 0.0)
        return {"publishers": len(pres), "subscribers": len(sres), "sent": sent, "accepted": accepted,
                "delivered": sum(received), "out_of_order": out_of_order,
                "published_msg_s": summary.get("published_msg_s"),
                "delivered_msg_s_per_sub": summary.get("delivered_msg_s_per_sub"),
                "latency_ms": summary.get("latency_ms"), "wall_s": wall or None, "errors": errors[:5]}

    def wait_witness(self) -> None:
        """Until every witness client exited (publishers with all outcomes, subscribers with every
        message), or the deadline: then what is missing is a problem."""
        w = self.witness
        deadline = time.monotonic() + (self.cfg.duration if self.cfg.clients == "library" else 0.0) + SETTLE
        while any(p.alive() for p in w.procs.values()) and time.monotonic() < deadline:
            time.sleep(0.1)

    def _progress(self) -> None:
        every = max(10.0, self.cfg.interval)
        assert self.sampler is not None
        while not self._done.wait(every):
            last = {s.router: s for s in self.sampler.samples[-len(self.targets):]}
            self.say(f"[{time.monotonic() - self.sampler.t0:7.1f}s] " + "  ".join(
                f"{r}: rss {s.rss_kb / 1024 if s.rss_kb else 0:.0f} MB, lag {s.loop_lag_max_ms} ms, "
                f"records {s.records}, log {s.log_bytes / MB:.1f} MB" for r, s in sorted(last.items())))

    # ------------------------------------------------------------------ the end
    def stop_all(self) -> None:
        for name, p in self.witness.procs.items():
            if p.alive():
                self.result.problems.append(f"witness {name} still running at the end:\n{p.tail(5)}")
                with contextlib.suppress(Exception):
                    p.stop(5)
        if self.server is not None:
            self.server.stop()

    def judge(self) -> None:
        r, w = self.result, self.witness
        if self.sampler is not None:
            r.samples = list(self.sampler.samples)
            for t in self.targets:
                r.routers[t.id] = {"pid": t.pid, **router_figures(self.sampler.of(t.id), self.cfg.warmup_s)}
                if r.routers[t.id]["exited"]:
                    r.problems.append(f"router {t.id} (pid {t.pid}) exited during the run")
        # router logs, over the traffic only (stopping the mesh at the end loses peers on purpose)
        if self.t_start:
            events: Counter[str] = Counter()
            for t in self.targets:
                events += count_events(t.router_log, (*DROP_EVENTS, STALL_EVENT), self.t_start, self.t_end)
            r.stalls = events.pop(STALL_EVENT, 0)
            for k, n in events.items():
                r.dropped[f"router:{k}"] = n
        # witness clients: exit codes, final JSON lines (failovers), the counts in their logs
        failovers = 0
        for name, p in w.procs.items():
            if p.alive():
                continue
            code = p.wait(1)
            line = next((ln for ln in reversed(p.tail(20).splitlines()) if ln.startswith("{")), "")
            info = json.loads(line) if line else {}
            failovers += int(info.get("failovers", 0))
            if code != 0:
                r.problems.append(f"witness {name} exited with {code}:\n{p.tail(10)}")
        if failovers:
            r.dropped["witness_failovers"] = failovers
        logs = ClientLogs(self.client_logs)
        logs.poll()
        handed = dict(sorted((s.link or s.sub, len(s.handed)) for s in logs.subs.values()))
        accepted = sum(1 for o in logs.outcome.values() if o == "ACCEPTED")
        r.witness = {"publishers": len(w.pubs), "subscribers": len(w.subs), "expected": w.count,
                     "published": len(logs.published), "accepted": accepted, "handed": handed,
                     "violations": logs.violations()}
        if len(logs.published) != w.count or accepted != w.count or any(n != w.count for n in handed.values()):
            r.problems.append(f"witness: {w.count} expected, {len(logs.published)} published, {accepted} ACCEPTED, "
                              f"handed {handed}")
        r.problems.extend(f"witness: {v}" for v in r.witness["violations"])
        # log bytes per (message, subscription) pair: every router's files at the end of the
        # traffic, and at rest
        last = {s.router: s for s in r.samples}
        r.log_bytes_live = sum(s.log_bytes for s in last.values())
        r.log_bytes = sum(dir_bytes(t.log_dir, t.prefix) for t in self.targets)
        r.pairs = sum(handed.values()) + int(r.load.get("delivered", 0))
        if self.cfg.reconcile:
            self.reconcile()

    def reconcile(self) -> None:
        paths = [self.client_logs]
        if self.cfg.reconcile_router_logs:
            paths += sorted({t.log_dir for t in self.targets})
        self.say("reconciling the witness's settlement logs with Spark ...")
        from ..spark.job import reconcile_paths

        t0 = time.monotonic()
        self.result.summary = reconcile_paths(paths, out=self.wd / "reconcile", chart=False)
        self.result.reconcile_seconds = time.monotonic() - t0


def run_soak(cfg: SoakConfig, say: Callable[[str], None] | None = None) -> SoakResult:
    """One soak run (module docstring). Raises SoakError when it cannot be set up with these
    arguments; everything else is in the result, after everything started was stopped."""
    if cfg.duration <= 0 or cfg.interval <= 0 or cfg.rate < 0 or cfg.size < 1:
        raise SoakError("--duration and --interval must be positive, --rate not negative")
    if cfg.order not in ORDERS:
        raise SoakError(f"unknown order {cfg.order!r} ({', '.join(ORDERS)})")
    if cfg.clients not in ("bench", "library"):
        raise SoakError(f"unknown clients {cfg.clients!r} (bench, library)")
    run = _Run(cfg, say or (lambda text: print(text, flush=True)))
    started = time.monotonic()
    r = run.result
    try:
        run.run()
    except KeyboardInterrupt:
        r.error = "interrupted"
    except (SoakError, OSError, TimeoutError) as exc:
        r.error = str(exc)
        run.say(f"oncemesh soak: {exc}")
    finally:
        run.stop_all()
    r.seconds = time.monotonic() - started
    if r.error != "interrupted" and run.sampler is not None:  # (else it never got going: nothing to judge)
        try:
            run.judge()
        except Exception as exc:  # the judge's own failure must not hide what the run measured
            r.error = f"judging failed: {exc}"
            run.say(f"oncemesh soak: {r.error}")
    (run.wd / "soak-result.json").write_text(json.dumps(r.to_json(), indent=1) + "\n")
    return r


# ---------------------------------------------------------------------- output
def _f(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def format_report(r: SoakResult) -> str:
    c = r.config
    rows = [["router", "samples", "RSS MB first", "last", "max", "RSS slope MB/min", "±95%", "flat",
             "lag max ms", "p99 max", "GC max ms", "records max", "conns max", "log MB", "log MB/min"]]
    for rid, f in sorted(r.routers.items()):
        rows.append([rid, _f(f["samples"]), _f(f["rss_mb_first"]), _f(f["rss_mb_last"]), _f(f["rss_mb_max"]),
                     _f(f["rss_slope_mb_per_min"], 3), _f(f["rss_slope_ci95_mb_per_min"], 3),
                     _f(f["rss_slope_within_noise"]), _f(f["loop_lag_worst_ms"]), _f(f["loop_lag_p99_max_ms"]),
                     _f(f["gc_pause_max_ms"]), _f(f["records_max"]), _f(f["connections_max"]),
                     _f(f["log_bytes_last"] / MB, 2), _f(f["log_slope_mb_per_min"], 3)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.append(f"(slopes: least squares after the first {c.warmup_s:g}s; 'flat': 0 lies in the 95% interval; "
                 f"lag max: the worst since the router started)")
    grown = [(rid, f) for rid, f in sorted(r.routers.items()) if f.get("rss_growth_after_warmup_mb") is not None]
    if grown:
        lines.append("RSS after the warm-up: " + "; ".join(
            f"{rid} {f['rss_growth_after_warmup_mb']:+.1f} MB ({f['rss_growth_at_inflight_highs_mb']:+.1f} in steps "
            f"at new in-flight highs, {f['rss_growth_after_warmup_mb'] - f['rss_growth_at_inflight_highs_mb']:+.1f} "
            f"elsewhere)" for rid, f in grown))
    if r.load:
        ld = r.load
        lines.append(f"load: {_f(ld.get('sent'))} sent, {_f(ld.get('accepted'))} ACCEPTED, {_f(ld.get('delivered'))} "
                     f"delivered to {ld.get('subscribers')} subscriber(s); {_f(ld.get('published_msg_s'))} msg/s "
                     f"published; out of order or repeated: {ld.get('out_of_order')}")
    if r.witness:
        wt = r.witness
        lines.append(f"witness: {wt['published']} published, {wt['accepted']} ACCEPTED, handed {wt['handed']}")
    lines.append(f"connections dropped: {r.connections_dropped}"
                 + (f" ({', '.join(f'{k} {n}' for k, n in sorted(r.dropped.items()))})" if r.dropped else "")
                 + f"; loop stalls logged: {r.stalls}")
    per = (lambda n: _f(n / r.pairs if r.pairs else None))  # noqa: E731
    lines.append(f"router log bytes for {r.pairs:,} (message, subscription) pairs: {r.log_bytes_live:,} at the "
                 f"end of the traffic ({per(r.log_bytes_live)} per pair), {r.log_bytes:,} after the routers "
                 f"stopped ({per(r.log_bytes)} per pair)")
    deleted = sum(f.get("log_segments_deleted") or 0 for f in r.routers.values())
    if deleted:
        lines.append(f"  (retention deleted {deleted} settlement-log segment(s) during the run: the bytes per pair "
                     f"count only what was kept)")
    if r.summary is not None:
        s = r.summary
        lines.append(f"reconciliation: {s.messages} messages, {s.pairs} pairs: lost {s.lost}, duplicated "
                     f"{s.duplicated}, unexpected {s.unexpected}, false accept {s.false_accept}, in doubt "
                     f"{s.in_doubt}; order failures {r.order_failures}")
    for p in r.problems:
        lines.append(f"PROBLEM: {p}")
    if r.error:
        lines.append(f"ERROR: {r.error}")
    lines.append(f"verdict: {'PASS' if r.exit_code == 0 else 'FAIL'} (reconciliation {r.verdict}); "
                 f"everything is in {r.workdir}")
    return "\n".join(lines)


def chart_available() -> bool:
    from ..spark import chart

    return chart.available()


def render_chart(r: SoakResult, path: Path) -> Path:
    """RSS, loop lag, in-flight records and log bytes over time, one line per router; the RSS fit
    after the warm-up dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8), sharex=True)
    fig.suptitle(f"oncemesh soak: {r.config.target}, order {r.config.order}, "
                 f"{r.config.rate:g} msg/s" if r.config.rate else f"oncemesh soak: {r.config.target}, unbounded")
    panels = (("RSS (MB)", lambda s: s.rss_kb / 1024 if s.rss_kb is not None else None),
              ("loop lag max (ms, per minute)", lambda s: s.loop_lag_max_ms),
              ("in-flight records", lambda s: s.records),
              ("log bytes (MB)", lambda s: s.log_bytes / MB))
    warm = r.config.warmup_s
    for ax, (title, get) in zip(axes.flat, panels, strict=True):
        for rid in sorted(r.routers):
            pts = [(s.t, v) for s in r.samples if s.router == rid and (v := get(s)) is not None]
            if pts:
                ax.plot([t for t, _ in pts], [v for _, v in pts], label=rid, linewidth=1)
            if title.startswith("RSS"):
                fit = fit_line(*after_warmup(pts, warm))
                if fit is not None and pts:
                    xs = [warm, pts[-1][0]]
                    ax.plot(xs, [fit.intercept + fit.slope * x for x in xs], linestyle="--", linewidth=1,
                            label=f"{rid} fit {fit.slope * 60:+.3f}±{fit.ci95 * 60:.3f} MB/min")
        ax.axvspan(0, warm, color="#dddddd", alpha=0.5)
        ax.set_title(title)
        ax.set_xlabel("seconds")
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------- CLI
def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "soak", help="run a router or a mesh under steady traffic for a long time; sample and judge it",
        description="Run one router (TARGET 'router') or the mesh of a topology file under traffic for\n"
                    "--duration seconds, at --rate messages per second in all or unbounded, and sample\n"
                    "every router every --interval seconds: RSS (/proc), event-loop lag, GC pauses,\n"
                    "in-flight records and connections (its status file), bytes of its log files.\n"
                    "Then print per router the maxima and the slopes of RSS and log bytes after the\n"
                    "warm-up (least squares, MB/min, with a 95% confidence interval: 'flat' when 0 is\n"
                    "in it), connections dropped, log bytes per (message, subscription) pair, and the\n"
                    "verdict of the Spark reconciliation.\n\n"
                    "Load: --clients bench (default) uses the lean exactly-once clients of `oncemesh\n"
                    "bench` (checked by their own counts: all ACCEPTED, every subscriber every message\n"
                    "once, in order) beside a small witness of client-library publishers and durable\n"
                    "subscribers at --witness-rate whose settlement logs are reconciled; --clients\n"
                    "library makes the witness the load (every message reconciled; needs --rate).\n"
                    "Publishers at --pub-at (default the first router), subscribers at --sub-at\n"
                    "(default one at every router); the witness publishes at the last router.\n\n"
                    "Exit status: 0 pass; 1 a connection dropped, a router exited, clients failed or\n"
                    "miscounted, or the reconciliation did not pass; 2 the run could not be set up;\n"
                    "130 interrupted (Ctrl-C, SIGTERM: everything started is stopped first).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n"
               "  oncemesh soak router --duration 1800                       # one router, unbounded, 30 min\n"
               "  oncemesh soak line3 --order causal --rate 2000 --duration 600 --chart causal.png\n"
               "  oncemesh soak router --duration 20 --rate 300 --json       # a quick look, as JSON")
    p.add_argument("target", help="'router' (one standalone router), or a topology file or the name of one in "
                                  "topology/examples (line3, triangle, mesh4, hubs, single)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="messages per second in all, split over the publishers (default 0: unbounded)")
    p.add_argument("--order", choices=ORDERS, default="fifo",
                   help="the order of the run's topics (a topology only): fifo, causal, total (sequencer), lamport")
    p.add_argument("--clients", choices=("bench", "library"), default="bench",
                   help="the load's clients (default bench; see above)")
    p.add_argument("--pub-at", default="", help="comma-separated routers of the publishers (default: the first)")
    p.add_argument("--sub-at", default="", help="comma-separated routers of the subscribers, repeats allowed "
                                                "(default: one at every router)")
    p.add_argument("--size", type=int, default=100, help="load message bytes (default 100)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds left out of the slopes (default: final_memory + 60 s, or a fifth of the "
                        "run if longer, at most half of it: a router fills its final-gid memory first)")
    p.add_argument("--witness-rate", type=float, default=20.0,
                   help="witness messages per second with --clients bench (default 20)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting of the single router (repeatable; see docs/operations.md)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="a new or empty directory for the run (default: a new temporary one); kept")
    p.add_argument("--no-reconcile", action="store_true", help="skip the Spark reconciliation (verdict 'skipped')")
    p.add_argument("--reconcile-router-logs", action="store_true",
                   help="reconcile the routers' settlement logs too (their lines for the bench load make "
                        "this slow on long runs; the verdict comes from the client logs either way)")
    p.add_argument("--insecure-mesh", action="store_true",
                   help="a topology's inter-router connections without TLS (default: mutual TLS with a CA "
                        "made for the run), to compare the two side by side")
    p.add_argument("--json", action="store_true", help="print the result (samples included) as JSON on stdout; "
                                                       "progress and the table on stderr")
    p.add_argument("--chart", type=Path, default=None, metavar="PNG",
                   help="draw RSS, loop lag, in-flight records and log bytes over time (needs matplotlib)")
    p.set_defaults(func=cmd_soak)


def cmd_soak(args: argparse.Namespace) -> int:
    out = sys.stderr if args.json else sys.stdout

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    if args.chart is not None and not chart_available():
        print("oncemesh soak: --chart needs matplotlib (pip install 'oncemesh[chart]')", file=sys.stderr)
        return 2
    missing = None if args.no_reconcile else pyspark_missing("oncemesh soak")
    if missing is not None:  # (before the run: its verdict is the reconciliation)
        print(f"{missing} (its verdict; --no-reconcile runs without one)", file=sys.stderr)
        return 2

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # stop everything started, as Ctrl-C does

    old = signal.signal(signal.SIGTERM, terminate)
    try:
        settings = tuple(tuple(kv.split("=", 1)) for kv in args.set)
        if any(len(kv) != 2 for kv in settings):
            raise SoakError("--set takes NAME=VALUE")
        cfg = SoakConfig(args.target, args.duration, args.rate, args.clients, args.order,
                         tuple(x for x in args.pub_at.split(",") if x), tuple(x for x in args.sub_at.split(",") if x),
                         args.size, args.interval, args.warmup, args.witness_rate, not args.no_reconcile,
                         args.reconcile_router_logs, args.workdir,
                         settings, args.insecure_mesh)
        result = run_soak(cfg, say)
    except SoakError as exc:
        print(f"oncemesh soak: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, old)
    say(format_report(result))
    if args.chart is not None and result.samples:
        say(f"chart: {render_chart(result, args.chart)}")
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    return result.exit_code
