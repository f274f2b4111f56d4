"""`oncemesh chaos`: a mesh of real processes, real traffic, a seeded fault schedule, and a verdict.

The promises (docs/promises.md) must hold while routers, links and clients crash; this is where
that is tried as a whole. Theory of operation:

1. The fault schedule is generated from the seed before anything starts (`harness.faults`), printed
   and saved (`chaos.json`), so that a failing run can be told and replayed by its seed.
2. The mesh runs as router processes with a fault-injecting proxy on every link (`Mesh(...,
   proxies=True)`). Durable subscriber workers and publisher workers (`harness.worker`, each with
   its own state directory and every router's URL for failover) are spread over the routers;
   every subscription is in force before the first message is sent, so every message is owed to
   every subscription.
3. The schedule is played: routers SIGKILLed and restarted, SIGSTOPped and SIGCONTed, links cut or
   silenced through the proxies, client processes SIGKILLed and restarted with their state
   directories. A router fault waits (a little) until the previous victim is back.
4. Then everything is healed, and the run waits for quiescence: every publisher exited 0 with all
   its outcomes, every subscription has had every message. It waits as long as the work left
   (messages to publish, outcomes to tell, hand-overs owed) keeps shrinking, and gives up after
   `settle` seconds without a new low: a loaded machine catches up slowly, a stuck mesh not at all.
5. Everything started is stopped, by PID, always (errors, Ctrl-C, SIGTERM included).
6. The verdict comes from the Spark reconciliation of every settlement log of the run
   (`spark.job.reconcile_paths`), not from the absence of errors. Router crashes (exits we did not
   cause) are findings too.

MQTT clients (`--mqtt N`): every router gets an MQTT listener (127.0.0.1, port 0), and N of the
publishers and N of the subscribers are MQTT 5 QoS 2 workers (`harness.mqttworker`: a persistent
session, its client-side state in its state directory, so client kills apply to them too; a failover
list of the home router, the session's keeper, then the others, rewritten when a restarted router's
listener has a new port). Every publisher, AMQP or MQTT, publishes on TOPIC and every subscriber takes
it: every message is owed to every subscription. An MQTT client writes no settlement log, so:

- An MQTT publisher's message at an AMQP subscriber: the router names its gid, which the MQTT client
  never learns. The AMQP subscribers note, per message handed, its gid and what its payload names
  (`NAME:N:`, `harness.worker` `--bodies`); `write_mqtt_publisher_logs` turns an MQTT publisher's report
  (`published`, `completed` and their times) and those names into its settlement log, so the
  reconciliation's client view knows its messages as it knows an AMQP publisher's and judges them at
  every AMQP subscription (lost, duplicated, unexpected, false ACCEPTED: PUBCOMP plays ACCEPTED).
  `mqtt_at_amqp` judges them there again by payload (the hand-overs from the subscribers' settlement
  logs, only the names from the notes), which needs no gid: a message PUBCOMP'd that no AMQP
  subscriber had (no gid to name), one number handed under two gids, a number its publisher never
  sent, and FIFO order.
- An MQTT subscription: the client view does not judge it (it counts it unobserved); the router view
  does (the routers' logs alone), and so does `_Run.mqtt_violations` from the workers' reports: each
  message once at each MQTT subscriber, none missing that its publisher was told was taken, FIFO
  order per publisher, every PUBCOMP, no resume without its session.

Progress and quiescence read the reports and the bodies too.

Exit status: 0 the promises held and the run quiesced; 1 a promise was broken (lost, duplicated,
unexpected, false ACCEPTED) or a process crashed; 3 no promise broken but the run did not quiesce
in time (liveness); 2 the run could not be set up.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..interrouter.keeper import keeper_of
from ..spark import pyspark_missing
from ..topology.launcher import Mesh, MeshError, RouterState
from ..topology.load import TopologyError, example_path, load_topology, with_topic_order
from .faults import ALL_FAULTS, Fault, FaultKind, Limits, make_schedule, parse_faults
from .mqttworker import ReportReader, fifo_reversals
from .procs import Proc, python_cmd
from .progress import ClientLogs
from .worker import BodyReader

if TYPE_CHECKING:
    from ..spark.reconcile import Summary

EXAMPLES = example_path()
TOPIC = "chaos"
# with --wildcards: publisher j publishes to chaos/p{j}; subscriber i subscribes to filter i mod 4:
# every topic, publisher 0's topic by name, one level of the tree, and publisher 1's by a '#' filter
WILD_TOPIC = "chaos/p{}"
WILD_FILTERS = ("chaos/#", "chaos/p0", "chaos/+", "chaos/p1/#")
# with --shared: every subscriber is a member of this shared subscription
SHARED_NAME = "chaos-shared"
TICK = 0.1  # seconds between looks at processes and logs while playing the schedule
PROGRESS_EVERY = 10.0
STALL = 20.0  # after every publisher finished: this long without a client log line means stuck
SETUP_TIMEOUT = 60.0
DEFAULT_SIZE = 64
WAIT_VICTIM = 10.0  # a router fault waits at most this long for the previous victim to be back


class ChaosError(Exception):
    """The run could not be set up (bad arguments, a mesh that would not start)."""


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    topology: Path
    duration: float = 60.0  # seconds of traffic with faults
    seed: int | None = None  # None: a random one (printed)
    faults: tuple[FaultKind, ...] = ALL_FAULTS
    state_dir: Path | None = None  # None: a new temporary directory (kept)
    publishers: int = 2
    subscribers: int = 3
    rate: float = 30.0  # messages per second, per publisher
    size: int = DEFAULT_SIZE  # message bytes
    settle: float | None = None  # after healing, give up on quiescence after this long without progress
    #                              (default max(60, duration/2)); see `_Run.quiesce`
    limits: Limits = Limits()
    reconcile: bool = True
    order: str = "fifo"  # the chaos topic's order: fifo, or total (by the sequencer)
    # publishers on a topic each (`WILD_TOPIC`), subscriptions to filters over them (`WILD_FILTERS`)
    wildcards: bool = False
    # the subscribers are the members of one shared subscription (`SHARED_NAME`): each message is
    # owed to it once, and handed to one member
    shared: bool = False
    # this many of the publishers and of the subscribers are MQTT 5 QoS 2 workers (harness/mqttworker.py)
    mqtt: int = 0

    @property
    def settle_timeout(self) -> float:
        return self.settle if self.settle is not None else max(60.0, self.duration / 2)

    @property
    def hard_deadline(self) -> float:
        """Seconds setup and the fault phase may take, whatever happens, and how long a client keeps
        trying to reconnect (quiescence is bounded by its progress instead: `_Run.quiesce`)."""
        return SETUP_TIMEOUT + self.duration + WAIT_VICTIM + self.settle_timeout + 60.0


@dataclass(slots=True)
class ChaosResult:
    seed: int
    state_dir: Path
    schedule: list[Fault]
    injected: Counter[str] = field(default_factory=Counter)  # fault kind -> applied
    skipped: list[str] = field(default_factory=list)  # faults not applied, and why
    published: int = 0
    accepted: int = 0
    in_doubt: int = 0
    handed: dict[str, int] = field(default_factory=dict)  # subscriber name -> distinct messages
    quiescent: bool = False
    crashes: list[str] = field(default_factory=list)  # processes that exited without us causing it
    client_violations: list[str] = field(default_factory=list)  # from the client logs alone
    summary: Summary | None = None
    subscriptions: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> class -> pairs
    seconds: float = 0.0
    interrupted: bool = False
    error: str | None = None
    order: str = "fifo"  # the chaos topic's order (what order_failures counts)
    shared: bool = False  # the subscribers were members of one shared subscription: no order promised
    router_evidence: list[str] = field(default_factory=list)  # the log lines of failing router-view pairs
    mqtt: dict[str, dict[str, Any]] = field(default_factory=dict)  # MQTT worker name -> what its report says
    # AMQP subscriber -> what it was handed of the MQTT publishers' messages (`mqtt_at_amqp`)
    mqtt_at_amqp: dict[str, dict[str, int]] = field(default_factory=dict)
    mqtt_reversals: int = 0  # FIFO reversals of the workers' own views: MQTT subscribers, MQTT publishers'
    #                          messages at AMQP subscribers (the reconciliation does not see these)

    @property
    def safety_failures(self) -> int:
        """lost + duplicated + unexpected + false ACCEPTED (from the reconciliation)."""
        return self.summary.failures if self.summary is not None else 0

    @property
    def false_outcomes(self) -> int:
        return self.summary.false_accept if self.summary is not None else 0

    @property
    def order_failures(self) -> int:
        """FIFO reversals (messages handed after a later one of the same publisher), or with
        `--order total` the pairs of subscriptions handed messages in opposite orders."""
        if self.shared:  # (a shared subscription promises no order: docs/promises.md)
            return 0
        if self.summary is None:
            return self.mqtt_reversals
        return self.mqtt_reversals + (self.summary.total_order_disagreements if self.order in ("total", "lamport")
                                      else self.summary.fifo_reversals)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def exit_code(self) -> int:
        if self.safety_failures or self.order_failures or self.client_violations or self.crashes:
            return 1
        if self.error is not None:
            return 2
        if not self.quiescent or self.interrupted:
            return 3
        return 0

    def verdict(self) -> str:
        order = "" if self.shared else (f" or out of {'total' if self.order in ('total', 'lamport') else 'FIFO'} "
                                        f"order")
        return {0: f"PASS: nothing lost, duplicated, unexpected or falsely accepted{order}; the run quiesced"
                   + (" (a shared subscription: no order promised)" if self.shared else ""),
                1: "FAIL: promises broken or processes crashed (see above)",
                2: f"ERROR: {self.error}",
                3: "LIVENESS: nothing broken, but the run did not quiesce in time"}[self.exit_code]

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "state_dir": str(self.state_dir), "verdict": self.verdict(),
            "exit_code": self.exit_code, "seconds": round(self.seconds, 1),
            "faults_injected": dict(self.injected), "faults_skipped": self.skipped,
            "schedule": [f.to_json() for f in self.schedule],
            "published": self.published, "accepted": self.accepted, "in_doubt": self.in_doubt,
            "handed": self.handed, "quiescent": self.quiescent, "crashes": self.crashes,
            "client_violations": self.client_violations, "false_outcomes": self.false_outcomes,
            "fifo_reversals": self.summary.fifo_reversals if self.summary is not None else 0,
            "total_order_disagreements": self.summary.total_order_disagreements if self.summary is not None else 0,
            "order": self.order,
            "subscriptions": self.subscriptions, "interrupted": self.interrupted, "error": self.error,
            "router_evidence": self.router_evidence, "mqtt": self.mqtt, "mqtt_at_amqp": self.mqtt_at_amqp,
            "mqtt_reversals": self.mqtt_reversals,
            "reconciliation": self.summary.to_dict() if self.summary is not None else None,
        }


@dataclass(slots=True)
class _Client:
    """One worker process that we may kill and restart (same command, same state directory)."""

    name: str
    kind: str  # "publish" | "consume"
    home: str  # the router it is meant to use first
    args: list[str]  # the worker's arguments, without --url
    out: Path
    protocol: str = "amqp"  # amqp (harness/worker.py) | mqtt (harness/mqttworker.py)
    report: ReportReader | None = None  # an MQTT worker's report
    bodies: BodyReader | None = None  # with --mqtt, an AMQP subscriber's gid -> payload names (`--bodies`)
    urls: str = ""  # every router's URL, its home first (known once the mesh is up)
    link: str = ""  # a subscriber's subscription name (its logs' `link`): its own, or the shared one
    proc: Proc | None = None
    down: bool = False  # killed by us, not restarted yet
    finished: bool = False  # a publisher that exited 0
    failures: int = 0

    @property
    def cmd(self) -> list[str]:
        module = "oncemesh.harness.mqttworker" if self.protocol == "mqtt" else "oncemesh.harness.worker"
        return [*python_cmd("-m", module, self.kind), "--url", self.urls, *self.args]

    def start(self) -> None:
        self.proc = Proc(self.cmd, self.out)
        self.down = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


@dataclass(order=True, slots=True)
class _Action:
    t: float
    seq: int
    fault: Fault = field(compare=False)
    end: bool = field(compare=False, default=False)
    waited: float = field(compare=False, default=0.0)


def resolve_topology(text: str | Path) -> Path:
    """A topology file, or the name of one in topology/examples (`line3`, `triangle`, ...)."""
    p = Path(text)
    if p.exists():
        return p
    example = EXAMPLES / f"{text}.toml"
    if example.exists():
        return example
    raise ChaosError(f"no topology file {text} (nor topology/examples/{text}.toml)")


class _Run:
    """The state of one chaos run; `run_chaos` drives it."""

    def __init__(self, cfg: ChaosConfig, say: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.say = say
        self.seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(1, 2**31)
        self.state = self._state_dir(cfg.state_dir)
        self.client_logs = self.state / "clientlogs"
        self.topology = load_topology(cfg.topology)
        fixed = sorted(r.id for r in self.topology.routers.values() if r.inter_port)
        if fixed:
            raise ChaosError(f"{cfg.topology}: chaos puts a proxy on every link, which needs inter-router "
                             f"ports 0; {', '.join(fixed)} have fixed ones")
        self.routers = sorted(self.topology.routers)
        self.clients = self._clients()
        self.schedule = make_schedule(self.topology, [c.name for c in self.clients], cfg.duration, self.seed,
                                      cfg.faults, cfg.limits)
        self.result = ChaosResult(self.seed, self.state, self.schedule, order=cfg.order, shared=cfg.shared)
        self.mesh: Mesh | None = None
        self.watch = ClientLogs(self.client_logs)
        self.expect: dict[str, str] = dict.fromkeys(self.routers, "up")  # up | killed | frozen
        self.mqtt_addr: dict[str, str] = {}  # router -> its MQTT listener's HOST:PORT (the last known)
        self.down_links: set[tuple[str, str]] = set()
        self.t0 = 0.0
        self.t0_wall = 0.0  # (the wall clock at t0: log lines carry wall-clock times)
        self.deadline = 0.0
        self._reported_dups: set[str] = set()
        self._events = (self.state / "chaos-events.log").open("a")

    # ------------------------------------------------------------------ setup
    @staticmethod
    def _state_dir(given: Path | None) -> Path:
        if given is None:
            return Path(tempfile.mkdtemp(prefix="oncemesh-chaos-")).resolve()
        given = given.resolve()
        if given.exists() and any(given.iterdir()):
            raise ChaosError(f"{given} is not empty: the verdict reads every log in the state directory, "
                             f"so each run needs a fresh one")
        given.mkdir(parents=True, exist_ok=True)
        return given

    def _clients(self) -> list[_Client]:
        """Subscribers from the first router on, publishers from the last one back, so that most
        messages cross the mesh; every client knows every router (its home first) for failover."""
        cfg, n = self.cfg, len(self.routers)
        out = []
        reconnect = str(int(cfg.hard_deadline))
        count = max(1, int(cfg.rate * cfg.duration))
        for i in range(cfg.subscribers):
            home = self.routers[i % n]
            if i < cfg.mqtt:  # (the first subscribers and publishers: their traffic crosses the mesh)
                out.append(self._mqtt_client(f"sub-{i}", "consume", home, [
                    "--topic", TOPIC, "--reconnect-timeout", reconnect]))
                continue
            topic = WILD_FILTERS[i % len(WILD_FILTERS)] if cfg.wildcards else TOPIC
            bodies = self.state / "clients" / f"sub-{i}.bodies"  # (JSON lines; not *.jsonl: no settlement log)
            sub = self._client(f"sub-{i}", "consume", home, [
                "--topic", topic, "--name", SHARED_NAME if cfg.shared else f"sub-{i}", "--reconnect-timeout",
                reconnect, *(["--shared"] if cfg.shared else []), *(["--bodies", str(bodies)] if cfg.mqtt else [])])
            sub.link = SHARED_NAME if cfg.shared else sub.name
            if cfg.mqtt:
                sub.bodies = BodyReader(bodies)
            out.append(sub)
        for j in range(cfg.publishers):
            home = self.routers[(n - 1 - j) % n]
            if j < cfg.mqtt:
                out.append(self._mqtt_client(f"pub-{j}", "publish", home, [
                    "--topic", TOPIC, "--count", str(count), "--rate", str(cfg.rate), "--size", str(cfg.size),
                    "--reconnect-timeout", reconnect]))
                continue
            topic = WILD_TOPIC.format(j) if cfg.wildcards else TOPIC
            out.append(self._client(f"pub-{j}", "publish", home, [
                "--topic", topic, "--name", f"pub-{j}", "--count", str(count), "--rate", str(cfg.rate),
                "--size", str(cfg.size), "--reconnect-timeout", reconnect]))
        return out

    @property
    def count(self) -> int:
        """Messages each publisher sends."""
        return max(1, int(self.cfg.rate * self.cfg.duration))

    def _mqtt_client(self, name: str, kind: str, home: str, args: list[str]) -> _Client:
        """An MQTT 5 QoS 2 worker (harness/mqttworker.py): client id = its name, its session's client-side
        state in its state directory (so a SIGKILL and restart is safe), a report the run polls."""
        report = self.state / "clients" / f"{name}.report"  # (JSON lines; not *.jsonl: no settlement log)
        return _Client(name, kind, home, [*args, "--client-id", name, "--state-dir", str(self.state / "clients" / name),
                                          "--report", str(report), "--url-file", str(self._url_file(name))],
                       self.state / "clients" / f"{name}.out", protocol="mqtt", report=ReportReader(report))

    @property
    def mqtt_clients(self) -> list[_Client]:
        return [c for c in self.clients if c.protocol == "mqtt"]

    def _client(self, name: str, kind: str, home: str, args: list[str]) -> _Client:
        return _Client(name, kind, home, [*args, "--state-dir", str(self.state / "clients" / name),
                                          "--log-dir", str(self.client_logs)],
                       self.state / "clients" / f"{name}.out")

    def _urls(self, home: str) -> str:
        assert self.mesh is not None
        i = self.routers.index(home)
        order = self.routers[i:] + self.routers[:i]
        return ",".join(self.mesh.url(r) for r in order)

    def _url_file(self, name: str) -> Path:
        return self.state / "clients" / f"{name}.urls"

    def refresh_mqtt_urls(self) -> None:
        """Every MQTT worker's failover list (`_mqtt_urls`) from the routers' MQTT addresses now: a
        restarted router's listener (port 0) may have a new port. Written (atomically) when it changed;
        the workers read theirs before each connection attempt."""
        if not self.cfg.mqtt or self.mesh is None:
            return
        for s in self.mesh.status():
            if s.mqtt and s.alive:
                self.mqtt_addr[s.id] = s.mqtt
        for c in self.mqtt_clients:
            urls = self._mqtt_urls(c, self.mqtt_addr)
            if urls != c.urls:
                c.urls = urls
                path = self._url_file(c.name)
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(urls + "\n")
                tmp.replace(path)

    def _mqtt_urls(self, c: _Client, mqtt: dict[str, str]) -> str:
        """An MQTT client's failover list: its home, then its session's keeper (the router that holds
        the session's copy, interrouter/keeper.py: where a resume finds it when the home dies), then
        the keeper's other neighbours, then the rest (docs/mqtt.md, "Sessions across routers")."""
        keeper = keeper_of(c.name, self.topology.neighbours(c.home))
        i = self.routers.index(c.home)
        rest = [r for r in self.routers[i + 1:] + self.routers[:i] if r != keeper]
        near = set(self.topology.neighbours(keeper)) if keeper is not None else set()
        order = [c.home, *([keeper] if keeper is not None else []), *sorted(rest, key=lambda r: r not in near)]
        missing = [r for r in order if not mqtt.get(r)]
        if missing:
            raise ChaosError(f"router(s) {', '.join(missing)} have no MQTT listener (their status has no 'mqtt')")
        return ",".join(mqtt[r] for r in order)

    def event(self, what: str, **fields: Any) -> None:
        t = time.monotonic() - self.t0 if self.t0 else 0.0
        self._events.write(json.dumps({"t": round(t, 3), "ts": time.time(), "event": what, **fields}) + "\n")
        self._events.flush()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def setup(self) -> None:
        cfg = self.cfg
        (self.state / "chaos.json").write_text(json.dumps({
            "seed": self.seed, "topology": str(cfg.topology.resolve()), "duration": cfg.duration,
            "faults": [k.value for k in cfg.faults], "publishers": cfg.publishers,
            "subscribers": cfg.subscribers, "rate": cfg.rate, "size": cfg.size, "code": _code_version(),
            "wildcards": cfg.wildcards, "shared": cfg.shared, "mqtt": cfg.mqtt,
            "schedule": [f.to_json() for f in self.schedule]}, indent=2) + "\n")
        self.say(f"oncemesh chaos: seed {self.seed}, topology {cfg.topology}, {cfg.duration:g}s of traffic, "
                 f"faults {','.join(k.value for k in cfg.faults) or 'none'}; state and logs in {self.state}; "
                 f"code {_code_version()}")
        self.say(f"schedule ({len(self.schedule)} faults):")
        for f in self.schedule:
            self.say("  " + f.describe())
        topo = cfg.topology
        if cfg.order != "fifo":
            topo = with_topic_order(topo, [TOPIC], cfg.order, self.state / f"{Path(topo).stem}-{cfg.order}.toml")
        if cfg.mqtt:
            topo = with_mqtt_listeners(topo, self.state / f"{Path(topo).stem}-mqtt.toml")
        self.mesh = Mesh(topo, self.state, proxies=True)
        statuses = self.mesh.up(timeout=min(SETUP_TIMEOUT, self.remaining()))
        self.say("mesh up: " + ", ".join(f"{s.id} {s.url}" + (f" mqtt://{s.mqtt}" if s.mqtt else "")
                                         for s in statuses))
        for c in self.clients:
            if c.protocol == "amqp":
                c.urls = self._urls(c.home)
        self.refresh_mqtt_urls()
        for c in self.clients:
            if c.kind == "consume":
                c.start()
        subs = sorted({c.link for c in self.clients if c.kind == "consume" and c.protocol == "amqp"})
        msubs = [c for c in self.mqtt_clients if c.kind == "consume"]
        self._wait(lambda: all((s := self.watch.by_link(n)) is not None and s.started for n in subs)
                   and all(c.report is not None and c.report.subscribed for c in msubs),
                   min(SETUP_TIMEOUT, self.remaining()), "every subscription in force")
        self.say(f"{len(subs) + len(msubs)} subscriptions in force"
                 + (f" ({len(msubs)} MQTT session(s))" if msubs else "")
                 + f"; starting {cfg.publishers} publishers at {cfg.rate:g} msg/s each"
                 + (f" ({cfg.mqtt} MQTT)" if cfg.mqtt else "") + f", all on {TOPIC}")

    def _wait(self, pred: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.watch.poll()
            self.poll_reports()
            self.check_processes()
            if pred():
                return
            if time.monotonic() >= deadline:
                raise ChaosError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(TICK)

    # ------------------------------------------------------------------ the fault phase
    def play(self) -> None:
        cfg = self.cfg
        self.t0 = time.monotonic()
        self.t0_wall = time.time()
        for c in self.clients:
            if c.kind == "publish":
                c.start()
        self.event("traffic_started")
        heap = [_Action(f.at, i, f) for i, f in enumerate(self.schedule)]
        heapq.heapify(heap)
        seq = len(heap)
        last_progress = 0.0
        while True:
            now = time.monotonic() - self.t0
            while heap and heap[0].t <= now:
                a = heapq.heappop(heap)
                retry = self.apply(a, now)
                if retry is not None:
                    heapq.heappush(heap, retry)
                elif not a.end:
                    seq += 1
                    heapq.heappush(heap, _Action(now + a.fault.duration, seq, a.fault, end=True))
            if now >= cfg.duration and not heap:
                return
            if self.remaining() <= 0:
                self.say("hard deadline reached during the fault phase: healing now")
                return
            self.tick()
            if now - last_progress >= PROGRESS_EVERY:
                last_progress = now
                self.progress(now)
            nxt = heap[0].t if heap else cfg.duration
            time.sleep(max(0.0, min(TICK, nxt - (time.monotonic() - self.t0))))

    def apply(self, a: _Action, now: float) -> _Action | None:
        """Start or end one fault; returns the action again (later) if it must wait."""
        f, mesh = a.fault, self.mesh
        assert mesh is not None
        if f.kind in (FaultKind.KILL, FaultKind.FREEZE) and not a.end:
            others = [s for s in mesh.status() if s.id != f.target and s.state is not RouterState.RUNNING]
            if others and a.waited < WAIT_VICTIM:  # keep to one router down: let the last victim come back
                return _Action(a.t + 0.2, a.seq, f, a.end, a.waited + 0.2)
            if self.expect[f.target] != "up" or not mesh.router_status(f.target).alive:
                self.skip(f, f"router {f.target} is not running")
                return None
        label = "end" if a.end else "start"
        self.say(f"[{now:7.2f}s] {label:<5} {f.kind.value:<11} {f.what()}")
        self.event(f"fault_{label}", **f.to_json())
        try:
            if f.kind is FaultKind.KILL:
                if a.end:
                    self.expect[f.target] = "up"
                    mesh.start_router(f.target)
                else:
                    self.expect[f.target] = "killed"
                    mesh.kill_router(f.target)
            elif f.kind is FaultKind.FREEZE:
                if a.end:
                    self.expect[f.target] = "up"
                    mesh.thaw(f.target)
                else:
                    self.expect[f.target] = "frozen"
                    mesh.freeze(f.target)
            elif f.kind is FaultKind.PARTITION:
                for x, y in f.links:
                    if a.end:
                        mesh.restore_link(x, y)
                        self.down_links.discard((x, y))
                    else:
                        (mesh.blackhole_link if f.silent else mesh.cut_link)(x, y)
                        self.down_links.add((x, y))
            else:
                self._client_fault(f, a.end)
                return None
        except MeshError as exc:
            self.say(f"  could not apply: {exc}")
            self.result.skipped.append(f"{f.describe()}: {exc}")
            return None
        if not a.end:
            self.result.injected[f.kind.value] += 1
        return None

    def skip(self, f: Fault, why: str) -> None:
        self.result.skipped.append(f"{f.describe()}: skipped, {why}")
        self.say(f"  skipped ({why}): {f.describe()}")
        self.event("fault_skipped", why=why, **f.to_json())

    def _client_fault(self, f: Fault, end: bool) -> None:
        c = next(c for c in self.clients if c.name == f.target)
        if end:
            if c.down:
                c.start()
                self.event("client_restarted", name=c.name, pid=c.pid)
            return
        if c.finished or c.proc is None or not c.proc.alive():
            self.skip(f, f"client {c.name} is not running (finished)")
            return
        c.down = True
        c.proc.kill()
        self.result.injected[f.kind.value] += 1

    # ------------------------------------------------------------------ watching
    def poll_reports(self) -> int:
        """Read what the MQTT workers reported, and the AMQP subscribers noted of their messages'
        payloads, since the last call; returns the number of lines."""
        return (sum(c.report.poll() for c in self.mqtt_clients if c.report is not None)
                + sum(c.bodies.poll() for c in self.clients if c.bodies is not None))

    def tick(self) -> int:
        """Look at the logs and the processes; returns the number of new client log lines (and MQTT
        report lines)."""
        n = self.watch.poll() + self.poll_reports()
        self.refresh_mqtt_urls()
        self.check_processes()
        for d in self.watch.duplicates() + self.mqtt_duplicates():
            if d not in self._reported_dups:
                self._reported_dups.add(d)
                self.say(f"  VIOLATION seen in the client logs: {d}")
        return n

    def mqtt_duplicates(self) -> list[str]:
        out = []
        for c in self.mqtt_clients:
            dups = c.report.duplicates() if c.report is not None else {}
            if dups:
                out.append(f"MQTT subscriber {c.name}: {len(dups)} message(s) delivered more than once, "
                           f"e.g. {[f'{p}:{n}' for p, n in sorted(dups)[:3]]}")
        return out

    def check_processes(self) -> None:
        mesh = self.mesh
        if mesh is not None:
            for s in mesh.status():
                if s.state is RouterState.DEAD and self.expect.get(s.id) == "up":
                    self._router_died(s.id)
        for c in self.clients:
            if c.proc is None or c.down or c.finished or c.proc.alive():
                continue
            code = c.proc.wait(1)
            if c.kind == "publish" and code == 0:
                c.finished = True
                self.event("publisher_finished", name=c.name)
                continue
            c.failures += 1
            tail = c.proc.tail(15)
            self.result.crashes.append(f"client {c.name} exited with {code} (we did not kill it):\n{tail}")
            self.say(f"  CRASH: client {c.name} exited with {code}; restarting it. The end of {c.out}:\n{tail}")
            self.event("client_crashed", name=c.name, code=code)
            if c.failures <= 3:
                c.start()

    def _router_died(self, rid: str) -> None:
        """A router we did not kill is dead: it lost its old port while restarting (take a new one),
        or it crashed (a finding: keep its output, restart it so the run goes on)."""
        assert self.mesh is not None
        tail = self.mesh.tail(rid, 40)
        rec = self.mesh._load_state()["routers"].get(rid) or {}
        if "cannot listen" in tail and rec.get("sticky"):
            self.say(f"  router {rid}: its old client port was taken meanwhile; starting it on a new one")
            self.mesh.start_router(rid, sticky=False)
            return
        self.result.crashes.append(f"router {rid} (pid {rec.get('pid')}) exited by itself; the end of "
                                   f"{self.mesh.out_file(rid)}:\n{tail}")
        self.say(f"  CRASH: router {rid} exited by itself; restarting it. The end of its output:\n{tail}")
        self.event("router_crashed", router=rid, pid=rec.get("pid"))
        self.mesh.start_router(rid)

    def progress(self, now: float) -> None:
        w = self.watch
        acc = sum(1 for o in w.outcome.values() if o == "ACCEPTED")
        handed = " ".join(f"{s.link}:{len(s.handed)}" for s in sorted(w.subs.values(), key=lambda s: s.link or ""))
        assert self.mesh is not None
        states = " ".join(f"{s.id}:{s.state.value}" for s in self.mesh.status())
        mqtt = ""
        for c in self.mqtt_clients:
            r = c.report
            assert r is not None
            mqtt += (f" {c.name}:{len(r.published)}/{len(r.completed)}" if c.kind == "publish"
                     else f" {c.name}:{len(r.delivered)}")
        if mqtt:
            owed = len([c for c in self.mqtt_clients if c.kind == "publish"]) * self.count
            mqtt += "".join(f" {n}:{owed - k}" for n, k in self.mqtt_missing_at_amqp().items())
        self.say(f"[{now:7.2f}s] published {len(w.published)}, accepted {acc}, handed {handed}; "
                 + (f"MQTT (published/completed, delivered; AMQP subscribers: MQTT messages handed){mqtt}; "
                    if mqtt else "")
                 + f"faults {sum(self.result.injected.values())}; routers {states}")

    # ------------------------------------------------------------------ healing and quiescence
    def heal(self) -> None:
        mesh = self.mesh
        assert mesh is not None
        self.say(f"[{time.monotonic() - self.t0:7.2f}s] healing: links restored, routers thawed and "
                 f"restarted, clients restarted")
        self.event("heal")
        with contextlib.suppress(MeshError):
            mesh.heal()
        self.down_links.clear()
        for s in mesh.status():
            if s.state is RouterState.FROZEN:
                mesh.thaw(s.id)
            elif not s.alive:
                mesh.start_router(s.id)
            self.expect[s.id] = "up"
        for c in self.clients:
            if c.down:
                c.start()

    def work_left(self, missing: dict[str, int]) -> int:
        """What stands between the run and quiescence, in steps that each take it one lower:
        messages not yet published (each brings an outcome and a hand-over per subscription),
        outcomes not yet told, hand-overs owed. Never below 0, so a run cannot make new lows
        for ever: `quiesce` waits while it does."""
        owed_per_message = 1 + len({c.link for c in self.clients if c.kind == "consume" and c.protocol == "amqp"})
        total = (self.cfg.publishers - self.cfg.mqtt) * self.count
        unpublished = max(0, total - len(self.watch.published))
        left = unpublished * owed_per_message + len(self.watch.in_doubt()) + sum(missing.values())
        for c in self.mqtt_clients:  # MQTT: messages to send, exchanges to end, deliveries owed (their reports)
            r = c.report
            assert r is not None
            if c.kind == "publish":
                sent = r.published | r.completed  # (a SIGKILL may come between a commit and its `published` line)
                left += max(0, self.count - len(sent)) + max(0, len(sent - r.completed) - len(r.refused))
        return left + sum(self.mqtt_missing().values()) + sum(self.mqtt_missing_at_amqp().values())

    def mqtt_missing(self) -> dict[str, int]:
        """MQTT subscriber -> messages not delivered yet (every publisher's every message is owed to it:
        its subscription was in force before the first was sent)."""
        pubs = [c.name for c in self.clients if c.kind == "publish"]
        out = {}
        for c in self.mqtt_clients:
            if c.kind == "consume" and c.report is not None:
                got = sum(len({n for n in c.report.distinct_of(p) if 0 <= n < self.count}) for p in pubs)
                out[c.name] = len(pubs) * self.count - got
        return out

    def amqp_handed(self) -> dict[str, list[str]]:
        """AMQP subscriber (with `--bodies`) -> the gid of every hand-over its settlement log has, first
        hand-overs in their order (by time; a batch's in its lines' order), then the repeats."""
        out = {}
        for c in self.clients:
            if c.bodies is None:
                continue
            s = self.watch.by_link(c.link)
            first = sorted(s.handed, key=s.handed.__getitem__) if s is not None else []
            out[c.name] = first + ([g for g, k in s.repeats.items() for _ in range(k)] if s is not None else [])
        return out

    def mqtt_missing_at_amqp(self) -> dict[str, int]:
        """AMQP subscriber -> the MQTT publishers' messages it was not handed yet (its settlement log,
        the gids named by the subscribers' `--bodies`)."""
        pubs = {c.name for c in self.mqtt_clients if c.kind == "publish"}
        names = payload_names(c.bodies for c in self.clients if c.bodies is not None)
        out = {}
        for sub, gids in self.amqp_handed().items():
            keys = {names.get(g, (None, None)) for g in gids}
            out[sub] = len(pubs) * self.count - len({(p, n) for p, n in keys
                                                     if p in pubs and n is not None and 0 <= n < self.count})
        return out

    def quiesce(self) -> bool:
        """Wait until every publisher has finished and every subscription has had everything: as
        long as the work left makes new lows, and at most `settle_timeout` after the last one (not
        a deadline on the whole: how long catching up takes is the machine's speed times the
        backlog the faults left)."""
        subs = sorted({c.link for c in self.clients if c.kind == "consume" and c.protocol == "amqp"})
        pubs = [c for c in self.clients if c.kind == "publish"]
        last = quiet_since = low_since = time.monotonic()
        low: int | None = None
        while True:
            if self.tick():
                quiet_since = time.monotonic()
            done_pubs = all(c.finished for c in pubs)
            gaps = {n: self.watch.missing(s) for n in subs if (s := self.watch.by_link(n)) is not None}
            missing = {n: len(g) for n, g in gaps.items()}
            left = self.work_left(missing)
            if low is None or left < low:
                low, low_since = left, time.monotonic()
            mmissing = self.mqtt_missing() | {f"{n} (from MQTT)": k for n, k in self.mqtt_missing_at_amqp().items()}
            if done_pubs and len(missing) == len(subs) and not any(missing.values()) and not any(mmissing.values()):
                self.say(f"[{time.monotonic() - self.t0:7.2f}s] quiescent: every publisher finished, "
                         f"every subscription has every message")
                return True
            decided = all(self.watch.outcome.get(g) in ("ACCEPTED", "REJECTED") for g in set().union(*gaps.values()))
            if done_pubs and decided and time.monotonic() - quiet_since >= STALL:
                # every outcome told, nothing moving: what is missing will not come (a broken promise)
                self.say(f"NOT QUIESCENT: every publisher finished with every outcome, nothing moved for "
                         f"{STALL:g}s, and messages are missing: "
                         + "; ".join([f"{n}: {len(g)}, e.g. {sorted(g)[:3]}" for n, g in gaps.items() if g]
                                     + [f"{n}: {k}" for n, k in mmissing.items() if k]))
                return False
            if time.monotonic() - low_since >= self.cfg.settle_timeout:
                self.say(f"NOT QUIESCENT: no progress for {self.cfg.settle_timeout:g}s (work left {left}); "
                         f"publishers still running: "
                         f"{', '.join(c.name for c in pubs if not c.finished) or 'none'}; messages missing "
                         f"per subscription: {missing | mmissing}; in doubt: "
                         f"{len(self.watch.in_doubt())}")
                return False
            if time.monotonic() - last >= PROGRESS_EVERY:
                last = time.monotonic()
                self.progress(last - self.t0)
            time.sleep(TICK)

    def stop_all(self) -> None:
        """Every process this run started, by PID: clients, then the routers and the proxies."""
        for c in self.clients:
            if c.proc is not None and c.proc.alive():
                try:
                    c.proc.stop(5)
                except Exception as exc:  # the one place that must not give up: keep stopping the rest
                    self.say(f"  could not stop client {c.name} (pid {c.pid}): {exc}")
        if self.mesh is not None:
            try:
                self.mesh.down(timeout=10)
            except MeshError as exc:
                self.say(f"  oncemesh chaos: stopping the mesh: {exc}")
        self.event("stopped")
        self._events.close()

    # ------------------------------------------------------------------ verdict
    def mqtt_violations(self) -> list[str]:
        """The MQTT workers' own verdict, from their reports (and `result.mqtt`, what each says), and
        the MQTT publishers' messages at the AMQP subscribers (`mqtt_at_amqp`, `result.mqtt_at_amqp`).

        Why the reports: an MQTT client writes no settlement log, so the reconciliation's client view
        does not judge an MQTT subscription (known from router lines only, it is counted as
        `unobserved_subscriptions`, not judged). So every pair with an MQTT subscriber is judged by
        the router view (the routers' logs alone) and here: each message once at each MQTT
        subscriber (by its payload's publisher and number, whichever protocol published it), none
        missing whose publisher was told it was taken (PUBCOMP; an AMQP publisher that finished was
        told ACCEPTED for all), per publisher in FIFO order (`ReportReader.reversals`: first
        deliveries, as the reconciliation takes first hand-overs), every PUBLISH ended with PUBCOMP
        (no refusal), and every resume finding its session (a CONNACK without it means the client's
        state and the server's parted ways)."""
        out: list[str] = []
        pubs = {c.name: c for c in self.clients if c.kind == "publish"}
        reversals = 0
        for c in self.mqtt_clients:
            rep = c.report
            assert rep is not None
            if rep.session_lost:
                out.append(f"MQTT {c.name}: {rep.session_lost} resume(s) without the session (CONNACK session "
                           f"present 0): its in-flight QoS 2 state was gone at the router")
            if c.kind == "publish":
                self.result.mqtt[c.name] = {"published": len(rep.published), "completed": len(rep.completed),
                                            "refused": len(rep.refused), "connections": rep.connections,
                                            "session_lost": rep.session_lost}
                if rep.refused:
                    out.append(f"MQTT publisher {c.name}: {len(rep.refused)} PUBLISH(es) refused, e.g. "
                               f"{sorted(rep.refused.items())[:3]} (number, reason)")
                continue
            dups = rep.duplicates()
            unexpected = sorted(k for k in rep.delivered if k[0] not in pubs or not 0 <= k[1] < self.count)
            lost = []
            for name, p in pubs.items():
                told = (p.report.completed if p.report is not None
                        else set(range(self.count)) if p.finished else set())
                lost += [(name, n) for n in sorted(told - rep.distinct_of(name))]
            reversed_ = {name: r for name in pubs if (r := rep.reversals(name))}
            reversals += sum(len(r) for r in reversed_.values())
            self.result.mqtt[c.name] = {"delivered": sum(len(x) for x in rep.delivered.values()),
                                        "distinct": len(rep.delivered), "duplicates": sum(dups.values()),
                                        "missing": self.mqtt_missing().get(c.name, 0), "lost": len(lost),
                                        "unexpected": len(unexpected),
                                        "fifo_reversals": sum(len(r) for r in reversed_.values()),
                                        "connections": rep.connections, "session_lost": rep.session_lost}
            if dups:
                out.append(f"MQTT subscriber {c.name}: {len(dups)} message(s) delivered more than once, e.g. "
                           f"{[f'{p}:{n}' for p, n in sorted(dups)[:3]]}")
            if lost:
                out.append(f"MQTT subscriber {c.name}: {len(lost)} message(s) never delivered that their publisher "
                           f"was told were taken, e.g. {[f'{p}:{n}' for p, n in lost[:3]]}")
            if unexpected:
                out.append(f"MQTT subscriber {c.name}: {len(unexpected)} message(s) no publisher sent, e.g. "
                           f"{[f'{p}:{n}' for p, n in unexpected[:3]]}")
            for name, r in sorted(reversed_.items()):
                out.append(f"MQTT subscriber {c.name}: {len(r)} message(s) of {name} delivered after a later one "
                           f"of {name} (FIFO), e.g. {name}:{r[:3]}")
        mpubs = {c.name: c.report for c in self.mqtt_clients if c.kind == "publish" and c.report is not None}
        if mpubs and any(c.bodies is not None for c in self.clients):
            names = payload_names(c.bodies for c in self.clients if c.bodies is not None)
            found, self.result.mqtt_at_amqp, amqp_reversals = mqtt_at_amqp(self.amqp_handed(), names, mpubs,
                                                                           self.watch.published, self.count)
            out += found
            reversals += amqp_reversals
        self.result.mqtt_reversals = reversals
        return out

    def judge(self) -> None:
        r, w = self.result, self.watch
        w.poll()
        r.published = len(w.published)
        r.accepted = sum(1 for o in w.outcome.values() if o == "ACCEPTED")
        r.in_doubt = len(w.in_doubt())
        names = {s.sub: s.link or s.sub for s in w.subs.values()}
        r.handed = {names[s.sub]: len(s.handed) for s in w.subs.values()}
        r.client_violations = w.violations()  # the writers are stopped: no transient reports
        self.poll_reports()
        r.client_violations += self.mqtt_violations()
        for c in self.mqtt_clients:
            if c.kind == "consume":
                r.handed[c.name] = r.mqtt[c.name]["distinct"]
        if not self.cfg.reconcile:
            return
        mpubs = {c.name: c.report for c in self.mqtt_clients if c.kind == "publish" and c.report is not None}
        if mpubs:  # (before Spark reads the run's logs: the MQTT publishers' messages, named by their gids)
            named = payload_names(c.bodies for c in self.clients if c.bodies is not None)
            gids = name_mqtt_gids(named, mpubs, w.published)
            write_mqtt_publisher_logs(self.state / "mqttlogs", mpubs, gids, TOPIC, self.cfg.size)
        self.say("reconciling every settlement log of the run with Spark ...")
        from pyspark.sql import SparkSession

        from ..spark.job import reconcile_paths

        ours = SparkSession.getActiveSession() is None  # (a session the caller runs is left running)
        with _spark_progress(lambda text: self.say(f"[{time.monotonic() - self.t0:7.2f}s] reconciling: {text}")):
            summary = reconcile_paths([self.state], out=self.state / "reconcile", chart=False, keep_session=True)
        try:
            if summary.router_view.failures:
                rows = failing_router_pairs(self.state / "reconcile")
                r.router_evidence = router_evidence(rows, self.state / "logs", self.t0_wall)
        finally:
            session = SparkSession.getActiveSession()
            if ours and session is not None:
                session.stop()
        r.summary = summary
        for sc in summary.per_subscription:
            r.subscriptions[names.get(sc.sub, sc.sub)] = dict(sc.counts)

    def report(self) -> None:
        r = self.result
        self.say("")
        self.say(f"seed {r.seed}: {r.seconds:.0f}s, {r.published} messages published, {r.accepted} ACCEPTED, "
                 f"{r.in_doubt} in doubt; faults injected: "
                 + (", ".join(f"{k} {n}" for k, n in sorted(r.injected.items())) or "none")
                 + (f"; {len(r.skipped)} skipped" if r.skipped else ""))
        if r.summary is not None:
            s = r.summary
            self.say(f"reconciliation: {s.messages} messages, {s.pairs} (message, subscription) pairs, "
                     f"{s.valid_lines} log lines")
            cols = ("ok", "lost", "duplicated", "unexpected", "in_doubt")
            self.say("  " + "subscription".ljust(14) + "".join(c.rjust(12) for c in cols))
            for name, counts in sorted(r.subscriptions.items()):
                self.say("  " + name.ljust(14) + "".join(str(counts.get(c, 0)).rjust(12) for c in cols))
            self.say(f"  false publisher outcomes (ACCEPTED before every subscription had it): {s.false_accept}")
            self.say(f"  FIFO: {s.fifo_reversals} handed after a later message of their publisher, "
                     f"{s.fifo_gaps} skipped while a later one was handed")
            if self.cfg.order in ("total", "lamport"):
                self.say(f"  total order: {s.total_order_disagreements} pair(s) of subscriptions handed messages "
                         f"in opposite orders")
            rv = s.router_view
            self.say(f"  router view (the routers' logs alone): {rv.pairs} pairs, "
                     + ", ".join(f"{c} {n}" for c, n in rv.counts if n or c in ("ok", "lost", "duplicated")))
            for line in r.router_evidence:
                self.say(f"    {line}")
            if self.cfg.mqtt:
                self.say(f"  MQTT sessions: {s.unobserved_subscriptions} subscription(s) without a subscriber log "
                         f"(the client view does not judge them; the router view above and their reports do)")
        for name, m in sorted(r.mqtt.items()):
            self.say(f"  MQTT {name}: " + ", ".join(f"{k} {v}" for k, v in m.items()))
        for name, m in sorted(r.mqtt_at_amqp.items()):
            self.say(f"  MQTT publishers' messages at {name}: " + ", ".join(f"{k} {v}" for k, v in m.items()))
        if self.cfg.mqtt:
            self.say(f"  FIFO (the MQTT workers' views, not in the reconciliation): {r.mqtt_reversals} handed or "
                     f"delivered after a later message of their publisher")
        for v in r.client_violations:
            self.say(f"  VIOLATION (client logs): {v}")
        for c in r.crashes:
            self.say(f"  CRASH: {c.splitlines()[0]}")
        self.say(f"verdict: {r.verdict()}")
        self.say(f"replay: oncemesh chaos {self.cfg.topology} --seed {r.seed} --duration {self.cfg.duration:g} "
                 f"--faults {','.join(k.value for k in self.cfg.faults) or 'none'} --publishers "
                 f"{self.cfg.publishers} --subscribers {self.cfg.subscribers} --rate {self.cfg.rate:g}"
                 + (f" --size {self.cfg.size}" if self.cfg.size != DEFAULT_SIZE else "")
                 + (f" --order {self.cfg.order}" if self.cfg.order != "fifo" else "")
                 + (" --wildcards" if self.cfg.wildcards else "") + (" --shared" if self.cfg.shared else "")
                 + (f" --mqtt {self.cfg.mqtt}" if self.cfg.mqtt else "")
                 + (f" --mean-gap {self.cfg.limits.mean_gap:g}" if self.cfg.limits.mean_gap != Limits().mean_gap
                    else ""))


def with_mqtt_listeners(path: str | Path, dest: Path) -> Path:
    """A copy of topology file `path` at `dest` where every router has an MQTT listener on
    127.0.0.1, port 0 (`mqtt_listen` in `[defaults]`; a router's own setting still wins)."""
    text = Path(path).read_text()
    line = 'mqtt_listen = "127.0.0.1:0"'
    header = re.search(r"^\[defaults\][ \t]*(#.*)?$", text, re.MULTILINE)
    if header is None:
        text = f"[defaults]\n{line}\n\n{text}"
    elif not re.search(r"^mqtt_listen\s*=", text[header.end():].split("\n[", 1)[0], re.MULTILINE):
        text = f"{text[:header.end()]}\n{line}{text[header.end():]}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    load_topology(dest)  # (raises TopologyError for a file that is wrong)
    return dest


def mqtt_at_amqp(handed: Mapping[str, Sequence[str]], names: Mapping[str, tuple[str | None, int | None]],
                 pubs: Mapping[str, ReportReader], amqp_published: Container[str],
                 count: int) -> tuple[list[str], dict[str, dict[str, int]], int]:
    """The MQTT publishers' (`pubs`: name -> report) messages at the AMQP subscribers, judged by payload:
    (violations, per subscriber its counts, FIFO reversals). `handed`: AMQP subscriber -> the gid of
    every hand-over, in hand-over order (its settlement log's `handed` lines: exact); `names`: gid ->
    (publisher, number) its payload names (`payload_names`). Every message is owed to every subscriber
    (each was in force before the first was sent), so at each: each number once (`duplicated`: handed
    more than once, under one gid or several), none missing that its publisher was told was taken
    (`lost`: PUBCOMP came), none its publisher never sent (`unexpected`: a number outside the run's,
    or never `published` nor `completed`, a payload that names no publisher, a gid nothing names),
    and per publisher in FIFO order (first hand-overs, `fifo_reversals` as the reconciliation counts
    them). Messages whose gid an AMQP publisher logged (`amqp_published`) are the reconciliation's to
    judge, and left out."""
    out: list[str] = []
    counts: dict[str, dict[str, int]] = {}
    reversals = 0
    sent = {p: rep.published | rep.completed for p, rep in pubs.items()}
    for name, gids in sorted(handed.items()):
        seen: dict[tuple[str, int], int] = {}  # (publisher, number) -> hand-overs, in first hand-over order
        unexpected: list[str] = []
        for g in gids:
            if g in amqp_published:
                continue
            p, n = names.get(g, (None, None))
            if p is None or n is None or p not in sent or not 0 <= n < count or n not in sent[p]:
                unexpected.append(f"{p}:{n}" if p is not None else f"gid {g}")
                continue
            seen[(p, n)] = seen.get((p, n), 0) + 1
        dups = sorted(k for k, k_n in seen.items() if k_n > 1)
        lost = [(p, n) for p, rep in sorted(pubs.items()) for n in sorted(rep.completed) if (p, n) not in seen]
        reversed_ = {p: r for p in sorted(pubs) if (r := fifo_reversals([n for q, n in seen if q == p]))}
        n_rev = sum(len(r) for r in reversed_.values())
        reversals += n_rev
        counts[name] = {"distinct": len(seen), "duplicates": sum(seen[k] - 1 for k in dups), "lost": len(lost),
                        "unexpected": len(unexpected), "fifo_reversals": n_rev}
        if dups:
            out.append(f"AMQP subscriber {name}: {len(dups)} MQTT-published message(s) handed more than once, "
                       f"e.g. {[f'{p}:{n}' for p, n in dups[:3]]}")
        if lost:
            out.append(f"AMQP subscriber {name}: {len(lost)} MQTT-published message(s) never handed that their "
                       f"publisher was told were taken (PUBCOMP), e.g. {[f'{p}:{n}' for p, n in lost[:3]]}")
        if unexpected:
            out.append(f"AMQP subscriber {name}: {len(unexpected)} message(s) handed that no publisher sent, "
                       f"e.g. {unexpected[:3]}")
        for p, r in reversed_.items():
            out.append(f"AMQP subscriber {name}: {len(r)} message(s) of MQTT publisher {p} handed after a later "
                       f"one of {p} (FIFO), e.g. {p}:{r[:3]}")
    return out, counts, reversals


def payload_names(notes: Iterable[BodyReader]) -> dict[str, tuple[str | None, int | None]]:
    """gid -> (publisher, number) its payload names, from every AMQP subscriber's `--bodies` notes: a
    subscriber SIGKILLed between a hand-over and its note leaves the name to the others."""
    out: dict[str, tuple[str | None, int | None]] = {}
    for b in notes:
        for g, key in b.names.items():
            out.setdefault(g, key)
    return out


def name_mqtt_gids(names: Mapping[str, tuple[str | None, int | None]], pubs: Container[str],
                   amqp_published: Container[str]) -> dict[str, dict[str, int]]:
    """MQTT publisher -> gid -> its message number: the gids the routers gave the messages of the MQTT
    publishers `pubs`, as the payloads name them (`payload_names`)."""
    out: dict[str, dict[str, int]] = {}
    for g, (p, n) in names.items():
        if p is not None and n is not None and p in pubs and g not in amqp_published:
            out.setdefault(p, {})[g] = n
    return out


def write_mqtt_publisher_logs(dest: Path, pubs: Mapping[str, ReportReader], names: Mapping[str, Mapping[str, int]],
                              topic: str, size: int) -> list[Path]:
    """The settlement log an MQTT publisher would have written, had it known the gids of its messages
    (`names`, `name_mqtt_gids`), as `dest/NAME.publisher.jsonl`: so the reconciliation's client view
    judges its messages at every AMQP subscription as an AMQP publisher's (its `published` line,
    from the report's `published` time, its `outcome`: ACCEPTED at the report's `completed` time,
    PUBCOMP following PUBREC, which comes only once every subscription owed the message took it;
    REJECTED for a refused PUBLISH; none while in doubt). No `seq`: their order is `mqtt_at_amqp`'s
    to judge (FIFO by the payloads' numbers), not counted twice. A message no AMQP subscriber was
    handed has no gid, and no line: `mqtt_at_amqp` finds it lost."""
    from ..common.settlement_log import SettlementLog

    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name, rep in sorted(pubs.items()):
        path = dest / f"{name}.publisher.jsonl"
        log = SettlementLog(path, src="publisher", node=f"mqtt:{name}", inc="report")
        plid = f"mqtt:{name}"
        lines: list[tuple[float, str, str, int]] = []
        for g, n in names.get(name, {}).items():
            t_pub = min((t for t in (rep.published_at.get(n), rep.completed_at.get(n)) if t is not None), default=None)
            if t_pub is None:  # (never reported sent: unexpected at the subscribers, both views)
                continue
            lines.append((t_pub, "published", g, n))
            if n in rep.completed_at:
                lines.append((rep.completed_at[n], "ACCEPTED", g, n))
            elif n in rep.refused:
                lines.append((t_pub, "REJECTED", g, n))
        for ts, what, g, n in sorted(lines, key=lambda x: (x[0], x[1] != "published", x[3])):
            if what == "published":
                log.write("published", ts, g, topic, None, pub=plid, link=name, size=size)
            else:
                log.write("outcome", ts, g, topic, None, pub=plid, link=name, outcome=what,
                          error=f"PUBREC reason {rep.refused[n]:#04x}" if what == "REJECTED" else None)
        log.close()
        out.append(path)
    return out


def failing_router_pairs(reconcile_dir: Path, n: int = 3) -> list[dict[str, Any]]:
    """The first `n` failing pairs of the router view, from the anomalies `reconcile` wrote there
    (the active Spark session reads them)."""
    from pyspark.sql import SparkSession

    from ..spark.routerview import FAILURES

    spark = SparkSession.getActiveSession()
    if spark is None:
        return []
    return [r.asDict() for r in spark.read.parquet(str(reconcile_dir / "router_anomalies.parquet"))
            .where(f"class in ({', '.join(repr(c) for c in FAILURES)})").orderBy("t_recv", "gid", "sub")
            .limit(n).collect()]


_LIFECYCLE = ("subscribed", "resumed", "suspended", "unsubscribed", "expired", "claim_refused")
_ROUTER_LIFE = ("router_started", "router_stopped", "peer_up", "peer_down")


def router_evidence(rows: Sequence[dict[str, Any]], log_dir: Path, t0: float, margin: float = 5.0) -> list[str]:
    """The routers' log lines of the router view's pairs `rows` (gid, sub, class, home, origin and
    counts, as in its anomalies), in time order, times in seconds from `t0`: every line of the
    message for that subscription, the subscription's lifecycle lines (where it was attached when),
    and the routers' starts, stops and peers coming and going within `margin` seconds of the
    message. What a finding starts from, printed in the report since the run's directory may be gone
    when someone looks."""
    from ..common.settlement_log import log_files, read_events

    wanted = {r["gid"]: r for r in rows}
    subs = {r["sub"] for r in rows}
    found: dict[str, list[tuple[float, str]]] = {g: [] for g in wanted}
    lifecycle: dict[str, list[tuple[float, str]]] = {s: [] for s in subs}
    routers: list[tuple[float, str]] = []

    def text(ev: dict[str, Any]) -> str:
        fields = " ".join(f"{k}={ev[k]}" for k in ("peer", "outcome", "info") if ev.get(k))
        return f"{ev['node']}/{str(ev.get('inc'))[-6:]} {ev['ev']} {fields}".rstrip()

    for path in log_files(log_dir):
        for ev in read_events(path):
            ts, name = ev.get("ts"), ev.get("ev")
            if not isinstance(ts, float) or ev.get("src") not in (None, "router"):
                continue
            g, sub = str(ev.get("gid")), str(ev.get("sub"))
            if g in wanted and ev.get("sub") in (None, wanted[g]["sub"]):
                found[g].append((ts, text(ev)))
            elif name in _LIFECYCLE and sub in subs:
                lifecycle[sub].append((ts, text(ev)))
            elif name in _ROUTER_LIFE:
                routers.append((ts, text(ev)))
    out = []
    for g, row in wanted.items():
        out.append(f"{row['class']}: {g} for {row['sub']} (home {row['home']}, origin {row['origin']}; "
                   f"{row['deliveries']} deliveries, {row['dispositions']} dispositions, "
                   f"{row['delivered_after']} after the acceptance):")
        mine = found[g]
        if mine:
            lo, hi = min(t for t, _ in mine) - margin, max(t for t, _ in mine) + margin
            mine = mine + [x for x in routers if lo <= x[0] <= hi]
        out += [f"  {ts - t0:9.3f}s  {line}" for ts, line in sorted(mine + lifecycle[row["sub"]])]
    return out


def _code_version() -> str:
    """Which code ran (a finding must name it): the git commit of this tree, `+dirty` when it
    has uncommitted changes; the directory when it is not a git checkout."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return str(root)
    return sha + ("+dirty" if dirty else "")


@contextlib.contextmanager
def _spark_progress(say: Callable[[str], None], every: float = PROGRESS_EVERY) -> Iterator[None]:
    """While the block runs, say every `every` seconds how far Spark has got, when it has moved
    since the last time: minutes of silence cannot be told from a hang (by a user, or a test that
    waits on the run's progress)."""
    stop = threading.Event()

    def follow() -> None:
        from pyspark import SparkContext  # (imported by the caller already: no import race)

        last: tuple[int, int] | None = None
        while not stop.wait(every):
            sc = SparkContext._active_spark_context  # (any thread's: the session is the caller's thread's)
            if sc is None or getattr(sc, "_jsc", None) is None:  # (not started yet, or starting)
                continue
            try:
                tracker = sc.statusTracker()
                jobs = [*tracker.getJobIdsForGroup(None), *tracker.getActiveJobsIds()]
                stages = [st for i in tracker.getActiveStageIds() if (st := tracker.getStageInfo(i)) is not None]
            except Exception:  # (the context stopping under us: nothing to say)
                continue
            done, tasks = sum(st.numCompletedTasks for st in stages), sum(st.numTasks for st in stages)
            now = (max(jobs, default=-1), done)
            if now != last:
                say("Spark started" if last is None and not jobs else f"Spark job {now[0] + 1}"
                    + (f", {done} of {tasks} tasks of its stages" if stages else ""))
                last = now

    thread = threading.Thread(target=follow, name="spark-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(every + 5)


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """Ctrl-C (or SIGTERM) while we clean up must not leave processes behind: ignore them until
    we are done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def run_chaos(topology: str | Path, *, duration: float = 60.0, seed: int | None = None,
              faults: Sequence[FaultKind] | str = ALL_FAULTS, state_dir: Path | str | None = None,
              publishers: int = 2, subscribers: int = 3, rate: float = 30.0, size: int = DEFAULT_SIZE,
              settle: float | None = None, limits: Limits | None = None, reconcile: bool = True,
              say: Callable[[str], None] | None = None, order: str = "fifo", wildcards: bool = False,
              shared: bool = False, mqtt: int = 0) -> ChaosResult:
    """One chaos run (see the module docstring); the result says what happened and the verdict.

    Raises ChaosError when the run cannot even be set up with these arguments; every other
    failure is in the result (`exit_code`, `error`), after everything started has been stopped."""
    if isinstance(faults, str):
        faults = parse_faults(faults)
    if duration <= 0 or publishers < 1 or subscribers < 1 or rate <= 0:
        raise ChaosError("duration, publishers, subscribers and rate must be positive")
    if wildcards and order != "fifo":
        raise ChaosError("--wildcards needs --order fifo: a wildcard filter may only match FIFO topics")
    if shared and (order != "fifo" or wildcards):
        raise ChaosError("--shared needs --order fifo and no --wildcards")
    if mqtt < 0 or mqtt > min(publishers, subscribers):
        raise ChaosError(f"--mqtt {mqtt}: between 0 and the number of publishers and of subscribers")
    if mqtt and (order != "fifo" or wildcards or shared):
        raise ChaosError("--mqtt needs --order fifo and no --wildcards or --shared")
    cfg = ChaosConfig(resolve_topology(topology), duration, seed, tuple(faults),
                      Path(state_dir) if state_dir is not None else None, publishers, subscribers, rate,
                      size, settle, limits or Limits(), reconcile, order, wildcards, shared, mqtt)
    try:
        run = _Run(cfg, say or (lambda text: print(text, flush=True)))
    except TopologyError as exc:
        raise ChaosError(str(exc)) from None
    started = time.monotonic()
    run.deadline = started + cfg.hard_deadline
    r = run.result
    try:
        run.setup()
        run.play()
        run.heal()
        r.quiescent = run.quiesce()
    except KeyboardInterrupt:
        r.interrupted = True
        run.say("interrupted: stopping everything this run started")
    except (ChaosError, MeshError, TimeoutError, OSError) as exc:
        r.error = str(exc)
        run.say(f"oncemesh chaos: {exc}")
    finally:
        with _no_interrupts():
            run.stop_all()
    r.seconds = time.monotonic() - started
    if not r.interrupted:
        try:
            run.judge()
        except Exception as exc:  # the reconciliation's own failure must not hide the run's state
            r.error = f"reconciliation failed: {exc}"
            run.say(f"oncemesh chaos: {r.error}")
    (run.state / "chaos-result.json").write_text(json.dumps(r.to_json(), indent=2) + "\n")
    run.report()
    return r


# ---------------------------------------------------------------------- CLI
def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "chaos", help="run a mesh under a seeded fault schedule and judge it by reconciliation",
        description="Start the mesh of TOPOLOGY as local processes with a fault-injecting proxy on every\n"
                    "link, run durable subscribers and publishers spread over the routers, play a fault\n"
                    "schedule generated from --seed (router SIGKILL+restart, SIGSTOP/SIGCONT, link cuts\n"
                    "and silences, client SIGKILL+restart), heal, wait for quiescence, stop everything,\n"
                    "and judge every settlement log with the Spark reconciliation.\n\n"
                    "Exit status: 0 pass; 1 a promise broken (lost, duplicated, unexpected, false\n"
                    "ACCEPTED) or a process crashed; 3 nothing broken but no quiescence in time; 2 setup.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example:  oncemesh chaos line3 --duration 60 --seed 7\n"
               "          oncemesh chaos topology/examples/mesh4.toml --duration 600 --faults kill,partition")
    p.add_argument("topology", help="topology file, or the name of one in topology/examples (line3, triangle, "
                                    "mesh4, hubs); inter-router ports must be 0")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of traffic under faults (default 60)")
    p.add_argument("--seed", type=int, default=None, help="seed of the fault schedule (default: random, printed)")
    p.add_argument("--faults", default="all",
                   help="comma-separated: kill,freeze,partition,client-kill (default all; 'none' for none)")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="a new or empty directory for the run's state and logs (default: a new temporary "
                        "directory); kept afterwards")
    p.add_argument("--publishers", type=int, default=2, help="publisher processes (default 2)")
    p.add_argument("--subscribers", type=int, default=3, help="durable subscriber processes (default 3)")
    p.add_argument("--rate", type=float, default=30.0, help="messages per second per publisher (default 30)")
    p.add_argument("--size", type=int, default=64, help="message bytes (default 64)")
    p.add_argument("--settle", type=float, default=None,
                   help="after healing, wait for quiescence while the work left shrinks; give up after this "
                        "many seconds without progress (default max(60, duration/2))")
    p.add_argument("--mean-gap", type=float, default=Limits().mean_gap,
                   help=f"mean seconds between fault starts (default {Limits().mean_gap:g})")
    p.add_argument("--order", choices=("fifo", "total", "lamport"), default="fifo",
                   help="the chaos topic's order (total: by the sequencer; lamport: total by Lamport clocks; "
                        "both make the verdict also fail on subscriptions handed messages in opposite orders "
                        "instead of FIFO reversals)")
    p.add_argument("--wildcards", action="store_true",
                   help="publisher j publishes to chaos/pJ and the subscribers take the filters chaos/#, "
                        "chaos/p0, chaos/+ and chaos/p1/# in turn: each is owed exactly what its filter "
                        "matches (fifo order only)")
    p.add_argument("--shared", action="store_true",
                   help="the subscribers are the members of one shared subscription: each message is owed to it "
                        "once and handed to one member, whichever member's router crashes (fifo order only)")
    p.add_argument("--mqtt", type=int, default=0, metavar="N",
                   help="N of the publishers and N of the subscribers are MQTT 5 QoS 2 clients (persistent sessions, "
                        "failing over to the session's keeper; harness/mqttworker.py) on every router's MQTT "
                        "listener, all on the one topic. MQTT publishers' messages are judged at the AMQP "
                        "subscribers by both views of the reconciliation (the gids named by the payloads) and "
                        "by payload; MQTT subscribers by the router view and their reports (each message once, "
                        "FIFO per publisher, every PUBCOMP); client faults apply to them too (fifo order only)")
    p.add_argument("--no-reconcile", action="store_true", help="skip the Spark reconciliation (no verdict on "
                                                                "safety beyond the client logs)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout (progress on stderr)")
    p.set_defaults(func=cmd_chaos)


def cmd_chaos(args: argparse.Namespace) -> int:
    out = sys.stderr if args.json else sys.stdout

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    missing = None if args.no_reconcile else pyspark_missing("oncemesh chaos")
    if missing is not None:  # (before the run: its verdict is the reconciliation)
        print(f"{missing} (its verdict; --no-reconcile runs without one)", file=sys.stderr)
        return 2
    old = signal.signal(signal.SIGTERM, terminate)
    try:
        result = run_chaos(args.topology, duration=args.duration, seed=args.seed, faults=parse_faults(args.faults),
                           state_dir=args.state_dir, publishers=args.publishers, subscribers=args.subscribers,
                           rate=args.rate, size=args.size, settle=args.settle,
                           limits=Limits(mean_gap=args.mean_gap), reconcile=not args.no_reconcile, say=say,
                           order=args.order, wildcards=args.wildcards, shared=args.shared, mqtt=args.mqtt)
    except (ChaosError, ValueError) as exc:
        print(f"oncemesh chaos: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, old)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    return 130 if result.interrupted else result.exit_code
