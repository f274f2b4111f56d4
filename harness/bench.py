"""`oncemesh bench`: throughput, latency, router CPU per message and memory, side by side with baselines.

Why it is built this way
------------------------
- Figures on a shared, noisy 2-core machine are only comparable when measured in the same run,
  interleaved (case A, B, C, then A, B, C again ...), and reported as medians. Every ratio in the
  report compares cases of the same run.
- Clients are separate processes (`harness.benchclients`, lean clients on the router's own I/O layer)
  so that the router never shares a Python interpreter with them; the same clients talk to the
  router, to each other (the direct-link ceiling), to a naive `proton.reactor.Container` relay
  (below) and to RabbitMQ, so that only the thing in the middle changes. The MQTT cases (`--mqtt`,
  and the `mosquitto` baseline) do the same with `harness.mqttload` (MQTT 5 on the router's own
  codec): the router's MQTT listener and Mosquitto get the same clients; `--mqtt` is a flag, not a
  baseline, because its cases measure the router itself (its other protocol), beside its AMQP case.
- Router CPU comes from /proc/PID/stat of the router processes between the publishers' start
  signal and the end of the run; divided by the messages published times the routers each message
  crossed, it is CPU-µs per message per hop. Peak memory is VmHWM.
- Latency is publish -> hand-over: the publisher stamps CLOCK_MONOTONIC into the message, the
  subscriber (another process on the same machine, same clock) subtracts on arrival. It is measured
  at a fixed rate, where it means something (at an unbounded rate it only measures the window).

Run `oncemesh bench --help` for the options; docs/performance.md has the figures and how to read them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..topology.load import example_path
from .benchclients import MIN_SIZE, MODES
from .mqttload import DEFAULT_WINDOW as MQTT_WINDOW
from .procs import Proc, RouterProcess, cpu_seconds, python_cmd, read_json, rss_kb, wait_for

CLIENTS_NOTE = ("lean engine clients (harness.benchclients: common.engine driven directly, one "
                "process per publisher and subscriber), not the full client library (its dedup store, "
                "outbox and settlement logs cost per message)")
JSON_VERSION = 1
RABBIT_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
RABBIT_LIB = Path("/usr/lib/rabbitmq/lib")
MOSQUITTO = "mosquitto"  # Debian's broker: /usr/sbin/mosquitto (apt-get install -y mosquitto)
POLL = 0.02


class BenchError(RuntimeError):
    """A run could not be completed (a process failed to start or did not finish in time)."""


# ---------------------------------------------------------------------- small process helpers
def peak_rss_kb(pid: int) -> int:
    """VmHWM: the process's peak resident set size."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def group_pids(pgid: int) -> list[int]:
    """Processes of one process group (RabbitMQ: the start script, beam and its helpers)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(entry))
    return out


def safe_cpu(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


def free_port() -> int:
    """A free loopback port, for servers that cannot bind port 0 themselves (RabbitMQ)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raise_fd_limit() -> tuple[int, int]:
    """Children inherit the soft limit: thousands of connections need more than the usual 1024."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _git_commit() -> str | None:
    """The code measured: the router is being optimised with this tool, so every figure names it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def machine_info() -> dict[str, Any]:
    import proton

    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    rabbit = sorted(p.name for p in RABBIT_LIB.glob("rabbitmq_server-*")) if RABBIT_LIB.exists() else []
    return {"commit": _git_commit(), "cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "proton": ".".join(map(str, proton.VERSION)), "kernel": platform.release(),
            "rabbitmq": rabbit[-1].split("-", 1)[1] if rabbit else None, "mosquitto": Mosquitto.version(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}


# ---------------------------------------------------------------------- the naive Container relay
def run_container_relay(ready: Path, host: str = "127.0.0.1") -> int:
    """The obvious Python router: a `proton.reactor.Container` with a MessagingHandler that forwards
    each message to every receiver of its address and passes outcomes and settlement back.

    Exactly-once chaining, like the router: the publisher's delivery is accepted once every copy was
    accepted, and the copies are settled when the publisher settles. Messages are decoded and
    re-encoded (that is what `on_message` gives you). Prefetch 500 matches the router's link credit.
    Kept small on purpose: it is the baseline the performance targets are stated against
    (docs/performance.md, "Where the router stands against its targets"), not a product.
    """
    from proton import Delivery, Link
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    class Relay(MessagingHandler):
        def __init__(self) -> None:
            super().__init__(prefetch=500, auto_accept=False, auto_settle=False)
            self.senders: dict[str | None, list[Any]] = defaultdict(list)
            self.copies: dict[Any, list[Any]] = {}  # publisher delivery -> [copies pending, copies]
            self.origin: dict[Any, Any] = {}  # copy -> publisher delivery

        def on_start(self, event: Any) -> None:
            acceptor = event.container.listen(f"{host}:0")
            port = acceptor._selectable._delegate.getsockname()[1]  # Container has no port-0 API
            tmp = ready.with_suffix(".tmp")
            tmp.write_text(json.dumps({"pid": os.getpid(), "port": port}))
            os.replace(tmp, ready)

        def on_link_opening(self, event: Any) -> None:
            link = event.link
            link.source.copy(link.remote_source)
            link.target.copy(link.remote_target)
            link.snd_settle_mode = link.remote_snd_settle_mode
            link.rcv_settle_mode = link.remote_rcv_settle_mode
            if link.is_sender:
                self.senders[link.remote_source.address].append(link)

        def on_link_closing(self, event: Any) -> None:
            link = event.link
            if link.is_sender and link in self.senders.get(link.source.address, []):
                self.senders[link.source.address].remove(link)

        on_link_closed = on_link_closing

        def on_message(self, event: Any) -> None:
            up = event.delivery
            outs = self.senders.get(event.link.target.address) or []
            if up.settled:  # pre-settled: forward pre-settled, nothing comes back
                for s in outs:
                    s.send(event.message).settle()
                up.settle()
                return
            if not outs:
                up.update(Delivery.ACCEPTED)
                up.settle()
                return
            copies = []
            for s in outs:
                d = s.send(event.message)
                if s.snd_settle_mode == Link.SND_SETTLED:
                    d.settle()
                    continue
                self.origin[d] = up
                copies.append(d)
            self.copies[up] = [len(copies), copies]
            self._maybe_accept(up)

        def _maybe_accept(self, up: Any) -> None:
            entry = self.copies.get(up)
            if entry is None or entry[0] > 0:
                return
            up.update(Delivery.ACCEPTED)
            if up.link.rcv_settle_mode == Link.RCV_FIRST:  # at-least-once: done with it
                self.copies.pop(up)
                up.settle()

        def on_accepted(self, event: Any) -> None:
            up = self.origin.get(event.delivery)
            if up is not None and up in self.copies:
                self.copies[up][0] -= 1
                self._maybe_accept(up)

        on_rejected = on_accepted  # naive: any outcome counts as an answer

        def on_settled(self, event: Any) -> None:
            d = event.delivery
            if d.link.is_receiver:  # the publisher settled (mode second): settle the copies
                entry = self.copies.pop(d, None)
                for c in entry[1] if entry else ():
                    self.origin.pop(c, None)
                    c.settle()
            else:
                self.origin.pop(d, None)
            d.settle()

    Container(Relay()).run()
    return 0


# ---------------------------------------------------------------------- servers under test
class Server:
    """Something the clients connect to: a router, a mesh, the relay, RabbitMQ (or nothing)."""

    kind = "none"
    ca: Path | None = None  # clients connect with TLS trusting this CA (a router with client TLS)

    def url(self, at: str) -> str:
        raise NotImplementedError

    def mqtt_url(self, at: str) -> str:
        """HOST:PORT of the MQTT listener (the MQTT cases)."""
        raise NotImplementedError(f"{self.kind} has no MQTT listener")

    def address(self, topic: str) -> str:
        return topic

    def pids(self) -> list[int]:
        return []

    def status(self, at: str) -> dict[str, Any]:
        return {}

    def hops(self, pub_at: str, sub_ats: list[str]) -> int:
        return 1

    def stop(self) -> None:
        pass


class SingleRouter(Server):
    kind = "router"

    def __init__(self, workdir: Path, settings: dict[str, Any] | None = None,
                 router: RouterProcess | None = None, tls: bool = False) -> None:
        """Starts a router in `workdir` (`tls`: its client listener speaks TLS, with a CA made
        there), or takes `router`, started by the caller."""
        if router is None:
            settings = dict(settings or {})
            if tls:
                from ..common.pki import issue, make_ca

                make_ca(workdir / "pki")
                cert, key = issue(workdir / "pki", "router", ["127.0.0.1"])
                settings.update(tls_cert=str(cert), tls_key=str(key))
                self.ca = workdir / "pki" / "ca.pem"
            router = RouterProcess("A", workdir, settings=settings).start()
        self.router = router

    def url(self, at: str) -> str:
        return f"127.0.0.1:{self.router.port}"

    def mqtt_url(self, at: str) -> str:
        where = self.router.status().get("mqtt")
        if not where:
            raise BenchError("the router has no MQTT listener (mqtt_listen)")
        return str(where)

    def pids(self) -> list[int]:
        return [self.router.pid]

    def status(self, at: str) -> dict[str, Any]:
        return self.router.status()

    def stop(self) -> None:
        try:
            self.router.stop(10)
        except Exception:  # noqa: BLE001 - cleanup must go on; kill by pid
            self.router.kill()


@dataclass(frozen=True, slots=True)
class Wan:
    """How every inter-router link of a mesh case behaves (topology/proxy.py, `set_wan`)."""

    delay: float  # one way, seconds
    jitter: float = 0.0  # seconds, uniform in [-jitter, +jitter], never reordering
    loss: float = 0.0  # share of TCP segments lost (each costs a retransmission)
    rate: float = 0.0  # bytes per second each way (0: no limit)

    def text(self) -> str:
        out = f"{self.delay * 1000:g} ms"
        if self.jitter:
            out += f" +- {self.jitter * 1000:g} ms"
        if self.loss:
            out += f", {self.loss * 100:g} % loss"
        if self.rate:
            out += f", {self.rate / 1e6:g} MB/s"
        return out


def parse_wan(text: str) -> Wan:
    """`DELAY[,JITTER[,LOSS[,RATE]]]`: times as `20ms` or seconds, loss as `0.1%` or a share,
    rate in bytes per second with an optional k or M (`10M`)."""
    def seconds(v: str) -> float:
        v = v.strip().lower()
        return float(v[:-2]) / 1000 if v.endswith("ms") else float(v[:-1]) if v.endswith("s") else float(v)

    def share(v: str) -> float:
        v = v.strip()
        return float(v[:-1]) / 100 if v.endswith("%") else float(v)

    def rate(v: str) -> float:
        v = v.strip().lower().removesuffix("b/s").removesuffix("/s")
        mult = {"k": 1e3, "m": 1e6, "g": 1e9}.get(v[-1:], 1.0)
        return float(v[:-1] if mult != 1.0 else v) * mult

    parts = [x for x in text.split(",")]
    try:
        if not 1 <= len(parts) <= 4 or not parts[0].strip():
            raise ValueError(text)
        wan = Wan(seconds(parts[0]), seconds(parts[1]) if len(parts) > 1 else 0.0,
                  share(parts[2]) if len(parts) > 2 else 0.0, rate(parts[3]) if len(parts) > 3 else 0.0)
    except ValueError:
        raise ValueError(f"--wan {text!r}: expected DELAY[,JITTER[,LOSS[,RATE]]], e.g. 20ms,5ms,0.1% "
                         f"or 20ms,5ms,0.1%,10M") from None
    if wan.delay < 0 or wan.jitter < 0 or wan.rate < 0 or not 0 <= wan.loss < 1:
        raise ValueError(f"--wan {text!r}: delay, jitter and rate must be >= 0 and loss below 100%")
    return wan


class MeshServer(Server):
    kind = "mesh"

    def __init__(self, topology: Path, workdir: Path, timeout: float = 90.0, insecure_mesh: bool = False,
                 wan: Wan | None = None, wrap: Callable[[str], list[str]] | None = None) -> None:
        """`wan`: every inter-router link runs through a proxy that behaves like a WAN link; `wrap`:
        what each router runs under (callgrind)."""
        from ..topology.launcher import Mesh

        self.mesh = Mesh(topology, workdir, insecure_mesh=insecure_mesh, proxies=wan is not None, wrap=wrap)
        self.stop_timeout = 10.0 if wrap is None else 300.0  # (callgrind writes its counts as the router exits)
        self.graph = self.mesh.topology.graph()
        self.wan = wan
        try:
            self.mesh.up(timeout=timeout)
            if wan is not None:
                for i, link in enumerate(self.mesh.topology.links):
                    self.mesh.wan_link(link.a, link.b, wan.delay, wan.jitter, wan.loss, wan.rate, seed=i)
        except BaseException:
            self.mesh.down(timeout=10)
            raise
        self._status = {s.id: s for s in self.mesh.status()}

    def link_counters(self) -> dict[str, dict[str, int]]:
        """Bytes each way, chunks and chunks held for a retransmission, per link (with `wan`)."""
        if self.wan is None:
            return {}
        out = {}
        for link in self.mesh.topology.links:
            st = self.mesh.link_stats(link.a, link.b)
            out[st.name] = {"bytes_up": st.bytes_up, "bytes_down": st.bytes_down, "chunks": st.chunks,
                            "lost": st.lost}
        return out

    def url(self, at: str) -> str:
        s = self._status[at]
        assert s.url is not None
        return s.url.split("://", 1)[1]

    def pids(self) -> list[int]:
        return [s.pid for s in self._status.values() if s.pid]

    def status(self, at: str) -> dict[str, Any]:
        return self.mesh._read_ready(at) or {}

    def hops(self, pub_at: str, sub_ats: list[str]) -> int:
        """Routers a message from `pub_at` crosses to reach every router in `sub_ats` (its tree)."""
        import networkx as nx

        nodes = {pub_at}
        for s in sub_ats:
            nodes.update(nx.shortest_path(self.graph, pub_at, s, weight="cost"))
        return len(nodes)

    def stop(self) -> None:
        self.mesh.down(timeout=self.stop_timeout)


class ContainerRelay(Server):
    kind = "container"

    def __init__(self, workdir: Path) -> None:
        ready = workdir / "relay.ready.json"
        self.proc = Proc(python_cmd("-m", "oncemesh.harness.bench", "relay", "--ready", str(ready)), workdir / "relay.out")
        info = wait_for(lambda: self._ready(ready), 30, "the Container relay")
        self.port = int(info["port"])

    def _ready(self, ready: Path) -> dict[str, Any] | None:
        if not self.proc.alive():
            raise BenchError(f"the Container relay exited at start:\n{self.proc.tail()}")
        return read_json(ready)

    def url(self, at: str) -> str:
        return f"127.0.0.1:{self.port}"

    def pids(self) -> list[int]:
        return [self.proc.pid]

    def stop(self) -> None:
        self.proc.stop(5)


class RabbitMQ(Server):
    """A private RabbitMQ node with the AMQP 1.0 plugin, on loopback, in its own directory.

    Nothing of the system installation is touched: its config, enabled-plugins file, data, logs,
    Erlang cookie (HOME) and node name are ours; epmd runs on a port of ours, bound to loopback,
    and is stopped with `epmd -kill` on that port. RabbitMQ cannot bind port 0, so the ports are
    picked free just before the start (a small race, retried once).
    """

    kind = "rabbitmq"

    @staticmethod
    def unavailable() -> str | None:
        if not RABBIT_SCRIPT.exists():
            return ("RabbitMQ is not installed (Debian: apt-get install -y rabbitmq-server; the bench "
                    "enables the rabbitmq_amqp1_0 plugin on its own node)")
        if not any(RABBIT_LIB.glob("rabbitmq_server-*/plugins/rabbitmq_amqp1_0-*")):
            return "RabbitMQ is installed without its rabbitmq_amqp1_0 plugin"
        if not shutil.which("epmd"):
            return "epmd (Erlang) not found"
        return None

    def __init__(self, workdir: Path, timeout: float = 120.0) -> None:
        self.dir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.epmd_port = 0
        last = ""
        for _ in range(2):
            try:
                self._start(timeout)
                return
            except BenchError as exc:
                last = str(exc)
                self.stop()
        raise BenchError(last)

    def _start(self, timeout: float) -> None:
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        self.port, dist, self.epmd_port = free_port(), free_port(), free_port()
        (d / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")
        (d / "rabbitmq-env.conf").write_text("")
        (d / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\nlog.console = true\nlog.console.level = warning\n"
            "log.file = false\n")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(d), "LANG": "C.UTF-8",
               "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
               "RABBITMQ_NODENAME": f"oncemesh-bench-{os.getpid()}@localhost",
               "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
               "RABBITMQ_MNESIA_BASE": str(d / "mnesia"), "RABBITMQ_LOG_BASE": str(d / "log"),
               "RABBITMQ_PLUGINS_EXPAND_DIR": str(d / "plugins-expand"),
               "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"), "RABBITMQ_DIST_PORT": str(dist),
               "ERL_EPMD_PORT": str(self.epmd_port), "ERL_EPMD_ADDRESS": "127.0.0.1",
               "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}"}
        self.env = env
        out = open(d / "rabbitmq.out", "ab")  # noqa: SIM115 - the child's stdout for its lifetime
        self.proc = subprocess.Popen([str(RABBIT_SCRIPT)], stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, env=env, cwd=str(d), start_new_session=True)
        out.close()

        def listening() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                tail = (d / "rabbitmq.out").read_text(errors="replace")[-2000:]
                raise BenchError(f"RabbitMQ exited at start (code {self.proc.returncode}):\n{tail}")
            with socket.socket() as s:
                s.settimeout(0.5)
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        try:
            wait_for(listening, timeout, "RabbitMQ to listen", interval=0.1)
        except TimeoutError as exc:
            raise BenchError(str(exc)) from None

    def url(self, at: str) -> str:
        return f"127.0.0.1:{self.port}"

    def address(self, topic: str) -> str:
        return f"/topic/{topic}"  # amq.topic with the topic as routing key: pub/sub fan-out

    def pids(self) -> list[int]:
        return group_pids(self.proc.pid) if self.proc is not None else []

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            pgid = proc.pid  # start_new_session: the group is the one we created
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                wait_for(lambda: not group_pids(pgid), 30, "RabbitMQ to stop", interval=0.1)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.proc = None
        if self.epmd_port:  # the epmd our node started on its private port
            subprocess.run(["epmd", "-kill"], env={**os.environ, "ERL_EPMD_PORT": str(self.epmd_port)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10, check=False)
            self.epmd_port = 0


class Mosquitto(Server):
    """A private Mosquitto broker (one process) on loopback, with its own configuration file.

    Nothing of the system installation is used but the binary: no system config, no persistence
    file, its log to our file. Mosquitto cannot bind port 0, so the port is picked free just before
    the start (a small race, retried once). What differs from its defaults, and why:
    - `max_inflight_messages` = the router's `mqtt_receive_maximum` (100; Mosquitto's default is
      20): the same window of unanswered QoS 1/2 PUBLISHes both ways as the router's;
    - `max_queued_messages 0` (no limit; default 1,000): above the limit Mosquitto *drops* QoS 1/2
      messages for a subscriber that is behind, which the exactly-once check would report as lost;
    - `set_tcp_nodelay true`, `sys_interval 0` (no $SYS publications), `persistence false` (its
      default: messages in memory only, as it acknowledges them).
    """

    kind = "mosquitto"

    @staticmethod
    def executable() -> str | None:
        found = shutil.which(MOSQUITTO)
        if found is None and Path("/usr/sbin/mosquitto").exists():  # (not on a non-root PATH)
            found = "/usr/sbin/mosquitto"
        return found

    @staticmethod
    def unavailable() -> str | None:
        if Mosquitto.executable() is None:
            return ("Mosquitto is not installed (Debian: apt-get install -y mosquitto; the bench runs its own "
                    "broker process on loopback with its own configuration)")
        return None

    @staticmethod
    def version() -> str | None:
        exe = Mosquitto.executable()
        if exe is None:
            return None
        try:
            out = subprocess.run([exe, "-h"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        words = out.split()
        return words[2] if len(words) > 2 and words[:2] == ["mosquitto", "version"] else None

    def __init__(self, workdir: Path, receive_maximum: int = MQTT_WINDOW, timeout: float = 30.0) -> None:
        exe = self.executable()
        if exe is None:
            raise BenchError(str(self.unavailable()))
        self.dir = workdir
        self.proc: Proc | None = None
        last = ""
        for _ in range(2):
            try:
                self._start(exe, receive_maximum, timeout)
                return
            except BenchError as exc:
                last = str(exc)
                self.stop()
        raise BenchError(last)

    def _start(self, exe: str, receive_maximum: int, timeout: float) -> None:
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        conf = d / "mosquitto.conf"
        conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                        f"max_inflight_messages {receive_maximum}\nmax_queued_messages 0\nset_tcp_nodelay true\n"
                        "sys_interval 0\nlog_dest stdout\nlog_type error\nlog_type warning\n")
        self.proc = proc = Proc([exe, "-c", str(conf)], d / "mosquitto.out")

        def listening() -> bool:
            if not proc.alive():
                raise BenchError(f"Mosquitto exited at start:\n{proc.tail(10)}")
            with socket.socket() as s:
                s.settimeout(0.5)
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        try:
            wait_for(listening, timeout, "Mosquitto to listen", interval=0.02)
        except TimeoutError as exc:
            raise BenchError(str(exc)) from None

    def url(self, at: str) -> str:
        return f"127.0.0.1:{self.port}"

    mqtt_url = url

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None else []

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(5)
            self.proc = None


class Direct(Server):
    """No server: each publisher connects to its subscriber's own listener."""

    kind = "direct"


# ---------------------------------------------------------------------- one run
@dataclass(slots=True)
class Case:
    """One measured configuration. Publisher i sends to pub_topics[i] via router pub_at[i];
    subscriber j receives sub_topics[j] via sub_at[j]."""

    name: str
    kind: str  # router | mesh | direct | container | rabbitmq | mosquitto
    pub_at: list[str]
    sub_at: list[str]
    pub_topics: list[str]
    sub_topics: list[str]
    rate: float = 0.0
    topology: Path | None = None
    label: str = ""
    mode: str | None = None  # overrides Settings.mode (RabbitMQ cannot do exactly-once)
    tls: bool = False  # router: clients connect over TLS
    insecure_mesh: bool = False  # mesh: inter-router connections without TLS (--insecure-mesh)
    wan: Wan | None = None  # mesh: every inter-router link behaves like this WAN link (--wan)
    shared: bool = False  # the subscribers of a topic are the members of one shared subscription
    protocol: str = "amqp"  # amqp | mqtt (harness/mqttload.py's clients, MQTT 5)
    qos: int = 2  # mqtt: the publishers' and subscribers' QoS

    @classmethod
    def fan(cls, name: str, kind: str, pubs: int, subs: int, rate: float = 0.0, *, at: str = "A",
            topology: Path | None = None, pub_at: list[str] | None = None,
            sub_at: list[str] | None = None) -> Case:
        pa = pub_at or [at] * pubs
        sa = sub_at or [at] * subs
        return cls(name, kind, pa, sa, ["t"] * len(pa), ["t"] * len(sa), rate, topology)

    def shape(self) -> str:
        mid = {"router": "router", "mesh": "mesh", "direct": "direct link", "container": "Container relay",
               "rabbitmq": "RabbitMQ", "mosquitto": "Mosquitto"}[self.kind]
        where = ""
        if self.kind == "mesh":
            where = f" (pubs at {','.join(self.pub_at)}; subs at {','.join(self.sub_at)})"
        subs = f"shared subscription of {len(self.sub_at)} members" if self.shared else f"{len(self.sub_at)} sub"
        return f"{len(self.pub_at)} pub -> {mid} -> {subs}{where}"


@dataclass(slots=True)
class Settings:
    mode: str = "exactly-once"
    size: int = 100
    duration: float = 3.0
    count: int = 0
    warmup: float = 0.5
    window: int = 1000
    credit: int = 1000
    timeout: float = 120.0
    router_settings: dict[str, Any] = field(default_factory=dict)
    order: str = "fifo"  # the order of the run's topics on a topology: fifo | total (sequencer) | lamport
    trace: bool = False  # subscribers write every message's send time and latency (subJ.trace)
    idle_timeout: float = 2.0  # the clients' (a router under callgrind stalls for seconds)
    mqtt_window: int = MQTT_WINDOW  # MQTT publishers: PUBLISHes unanswered (at most the CONNACK's Receive Maximum)


def _start_server(case: Case, workdir: Path, cfg: Settings, rabbit: RabbitMQ | None,
                  topics: list[str] | None = None) -> Server:
    if case.kind == "router":
        settings = cfg.router_settings
        if case.protocol == "mqtt":
            settings = {**settings, "mqtt_listen": "127.0.0.1:0"}
        return SingleRouter(workdir / "router", settings, tls=case.tls)
    if case.kind == "mosquitto":
        return Mosquitto(workdir / "mosquitto", int(cfg.router_settings.get("mqtt_receive_maximum", MQTT_WINDOW)))
    if case.kind == "mesh":
        assert case.topology is not None
        topo = case.topology
        if cfg.order != "fifo" and topics:
            from ..topology.load import with_topic_order

            topo = with_topic_order(topo, topics, cfg.order, workdir / f"{Path(topo).stem}-{cfg.order}.toml")
        if cfg.router_settings:  # (--set: for every router of the topology, over its [defaults])
            from ..topology.load import with_overrides

            topo = with_overrides(topo, workdir / f"{Path(topo).stem}-set.toml", defaults=cfg.router_settings)
        return MeshServer(topo, workdir / "mesh", insecure_mesh=case.insecure_mesh, wan=case.wan)
    if case.kind == "container":
        return ContainerRelay(workdir)
    if case.kind == "rabbitmq":
        assert rabbit is not None
        return rabbit
    return Direct()


def _wait_files(procs: list[tuple[Proc, Path]], timeout: float, what: str) -> list[dict[str, Any]]:
    def ready() -> list[dict[str, Any]] | None:
        out = []
        for p, f in procs:
            info = read_json(f)
            if info is None:
                if not p.alive():
                    raise BenchError(f"{what} exited before it was ready:\n{p.tail(15)}")
                return None
            out.append(info)
        return out

    try:
        got: list[dict[str, Any]] = wait_for(ready, timeout, what, POLL)
    except TimeoutError as exc:
        raise BenchError(f"{exc}:\n" + "\n".join(p.tail(10) for p, _ in procs)) from None
    return got


def run_suffix(tag: str) -> str:
    """What `run_once` appends to the topics of a run (`t` -> `t-SUFFIX`): a caller that starts the
    server itself (`oncemesh soak`) names those topics in its topology."""
    return f"{tag}-{os.getpid()}"


def run_once(case: Case, cfg: Settings, workdir: Path, tag: str, rabbit: RabbitMQ | None = None,
             profile: float = 0.0, server: Server | None = None) -> dict[str, Any]:
    """Start the server (unless given) and the clients of `case`, run it, and measure it. Everything
    started here is stopped here; a given server and the shared RabbitMQ node are left running."""
    wd = workdir / tag
    wd.mkdir(parents=True, exist_ok=True)
    for stale in [*wd.glob("*.ready.json"), *wd.glob("*.result.json")]:
        stale.unlink()  # (a --workdir used before: an old file would pass for this run's)
    uniq = run_suffix(tag)
    owned = server is None and case.kind != "rabbitmq"
    if server is None:
        server = _start_server(case, wd, cfg, rabbit, [f"{t}-{uniq}" for t in set(case.pub_topics)])
    procs: list[Proc] = []
    try:
        # (the clients' timeout runs from "go": a run of --duration first sends for that long)
        timeout = cfg.timeout + (cfg.duration if not cfg.count else 0.0)
        common = ["--mode", case.mode or cfg.mode, "--timeout", str(timeout), "--idle-timeout", str(cfg.idle_timeout)]
        if server.ca is not None:
            common += ["--ca", str(server.ca)]
        mqtt = case.protocol == "mqtt"
        if mqtt:  # (harness/mqttload.py: MQTT 5 at the case's QoS; its own window, no TLS, no --mode)
            common = ["--qos", str(case.qos), "--timeout", str(timeout), "--window", str(cfg.mqtt_window)]
        subs: list[tuple[Proc, Path, Path]] = []
        for j, (at, topic) in enumerate(zip(case.sub_at, case.sub_topics, strict=True)):
            npubs = sum(1 for t in case.pub_topics if t == topic)
            ready, result = wd / f"sub{j}.ready.json", wd / f"sub{j}.result.json"
            files = ["--ready", str(ready), "--result", str(result), "--index", str(j), "--publishers", str(npubs)]
            if mqtt:
                cmd = python_cmd("-m", "oncemesh.harness.mqttload", "sub", "--url", server.mqtt_url(at), "--topic",
                                 f"{topic}-{uniq}", "--client-id", f"bench-sub{j}-{uniq}", *files, *common)
            else:
                where = ["--listen", "127.0.0.1:0"] if case.kind == "direct" else ["--url", server.url(at)]
                cmd = python_cmd("-m", "oncemesh.harness.benchclients", "sub", *where, "--address",
                                 server.address(f"{topic}-{uniq}"), *files, "--credit", str(cfg.credit), *common,
                                 *(["--shared", f"bench-{topic}"] if case.shared else []),
                                 *(["--trace", str(wd / f"sub{j}.trace")] if cfg.trace else []))
            p = Proc(cmd, wd / f"sub{j}.out")
            procs.append(p)
            subs.append((p, ready, result))
        sub_info = _wait_files([(p, r) for p, r, _ in subs], 60, "subscribers")
        pubs: list[tuple[Proc, Path, Path]] = []
        for i, (at, topic) in enumerate(zip(case.pub_at, case.pub_topics, strict=True)):
            ready, result = wd / f"pub{i}.ready.json", wd / f"pub{i}.result.json"
            amount = ["--count", str(cfg.count)] if cfg.count else ["--duration", str(cfg.duration)]
            load = ["--ready", str(ready), "--result", str(result), "--index", str(i), "--size", str(cfg.size),
                    "--rate", str(case.rate), "--warmup", str(cfg.warmup), *amount]
            if mqtt:
                cmd = python_cmd("-m", "oncemesh.harness.mqttload", "pub", "--url", server.mqtt_url(at), "--topic",
                                 f"{topic}-{uniq}", "--client-id", f"bench-pub{i}-{uniq}", *load, *common)
            else:
                url = f"127.0.0.1:{sub_info[i]['port']}" if case.kind == "direct" else server.url(at)
                cmd = python_cmd("-m", "oncemesh.harness.benchclients", "pub", "--url", url, "--address",
                                 server.address(f"{topic}-{uniq}"), *load, "--window", str(cfg.window), *common)
            p = Proc(cmd, wd / f"pub{i}.out")
            procs.append(p)
            pubs.append((p, ready, result))
        pub_info = _wait_files([(p, r) for p, r, _ in pubs], 60, "publishers")
        wire0 = _mesh_counters(server, time.time())
        links0 = server.link_counters() if isinstance(server, MeshServer) else {}
        spids = server.pids()
        cpu0 = {pid: safe_cpu(pid) for pid in spids}
        t0 = time.monotonic()
        for p, _, _ in pubs:
            p.signal(signal.SIGUSR1)
        spy = _start_profiler(spids[0], profile, wd) if profile and spids else None
        limit = (cfg.duration if not cfg.count else 0) + cfg.timeout + 30
        try:
            if case.shared:  # every outcome in: each message accepted by a member; the members end
                wait_for(lambda: not any(p.alive() for p, _, _ in pubs), limit, f"{case.name}: publishers to finish",
                         POLL)
                for p, _, _ in subs:
                    p.signal(signal.SIGUSR2)
            wait_for(lambda: not any(p.alive() for p in procs), limit, f"{case.name}: clients to finish", POLL)
        except TimeoutError as exc:
            raise BenchError(f"{exc}\n" + "\n".join(p.tail(5) for p in procs)) from None
        wall = time.monotonic() - t0
        cpu = {pid: safe_cpu(pid) - cpu0.get(pid, 0.0) for pid in spids}
        peak = max((peak_rss_kb(pid) for pid in spids), default=0)
        prof = _finish_profiler(spy) if spy is not None else None
        pres = [read_json(r) or {"error": f"no result: {p.tail(5)}"} for p, _, r in pubs]
        sres = [read_json(r) or {"error": f"no result: {p.tail(5)}"} for p, _, r in subs]
        hop_msgs = 0
        for i, r in enumerate(pres):
            sub_ats = [a for a, t in zip(case.sub_at, case.sub_topics, strict=True) if t == case.pub_topics[i]]
            hop_msgs += int(r.get("outcomes", 0)) * (server.hops(case.pub_at[i], sub_ats) if sub_ats else 1)
        summary = _summarise(case, pres, sres, pub_info, sub_info, cpu, peak, wall, hop_msgs, prof)
        if links0:
            assert isinstance(server, MeshServer)
            summary["links"] = {name: {"up_bytes_s": round((c["bytes_up"] - links0[name]["bytes_up"]) / wall),
                                       "down_bytes_s": round((c["bytes_down"] - links0[name]["bytes_down"]) / wall),
                                       "retransmitted_chunks": c["lost"] - links0[name]["lost"]}
                                for name, c in server.link_counters().items()}
        wire1 = _mesh_counters(server, time.time())
        if wire0 is not None and wire1 is not None and summary["published"]:
            n = summary["published"]
            summary["wire_per_msg"] = {k: round((wire1[k] - wire0[k]) / n, 2) for k in wire1}
        return summary
    finally:
        for p in procs:
            with contextlib.suppress(Exception):
                p.stop(5)
        if owned:
            server.stop()


def _mesh_counters(server: Server, after: float, timeout: float = 3.0) -> dict[str, int] | None:
    """Inter-router traffic so far, summed over the routers of a mesh: data copies and control
    messages sent (per hop), and of these the sequencer's; from status files written after `after`
    (they are refreshed about every second). None for other servers, or when a status is late."""
    if not isinstance(server, MeshServer):
        return None
    deadline = time.monotonic() + timeout
    while True:
        infos = [server.mesh._read_ready(r) or {} for r in sorted(server._status)]
        if all(float(i.get("updated", 0.0)) > after for i in infos):
            break
        if time.monotonic() > deadline:
            return None
        time.sleep(POLL)
    total = {"copies": 0, "control": 0, "order": 0}
    for i in infos:
        m = i.get("mesh", {})
        total["copies"] += int(m.get("copies_out", 0))
        total["control"] += int(m.get("control_out", 0))
        total["order"] += int(m.get("order_out", 0))
    return total


def _summarise(case: Case, pres: list[dict[str, Any]], sres: list[dict[str, Any]],
               pub_info: list[dict[str, Any]], sub_info: list[dict[str, Any]], cpu: dict[int, float],
               peak: int, wall: float, hop_msgs: int, prof: dict[str, Any] | None) -> dict[str, Any]:
    outcomes = sum(int(r.get("outcomes", 0)) for r in pres)
    delivered = sum(int(r.get("received", 0)) for r in sres)
    measured = sum(int(r.get("measured", 0)) for r in sres)
    errors = [str(r["error"]) for r in [*pres, *sres] if r.get("error")]
    errors += [f"sub {r.get('index')}: incomplete ({r.get('received')}/{r.get('expected')})"
               for r in sres if not r.get("complete")]
    errors += [f"sub {r.get('index')}: {r['out_of_order']} out of order" for r in sres if r.get("out_of_order")]
    if case.shared and delivered != outcomes:  # each message to one member, once
        errors.append(f"shared subscription: its members got {delivered} messages for {outcomes} outcomes")
    if case.protocol == "mqtt":
        errors[:0] = mqtt_violations(case.qos, sres)  # (first: the loudest)
    per_sub = [float(r.get("msg_s", 0.0)) for r in sres]
    lats = [r.get("latency_ms") or {} for r in sres]
    worst = {k: max((lat.get(k) or 0.0) for lat in lats) if lats else None
             for k in ("p50", "p99", "p999", "max")}
    server_cpu = sum(cpu.values())
    pub_cpu = sum(float(r.get("cpu_s", 0.0)) for r in pres)
    sub_cpu = sum(float(r.get("cpu_s", 0.0)) for r in sres)
    modes = Counter(str(i.get("remote_rcv_settle_mode")) for i in [*pub_info, *sub_info]) \
        if case.protocol == "amqp" else Counter()
    out: dict[str, Any] = {
        "ok": not errors, "errors": errors[:5],
        "published": outcomes, "delivered": delivered,
        "published_msg_s": round(sum(float(r.get("msg_s", 0.0)) for r in pres), 1),
        "delivered_msg_s_per_sub": round(statistics.fmean(per_sub), 1) if per_sub else 0.0,
        "delivered_msg_s_min_sub": round(min(per_sub), 1) if per_sub else 0.0,
        "delivered_msg_s_total": round(sum(per_sub), 1),
        "latency_ms": worst,
        "server_cpu_s": round(server_cpu, 4) if cpu else None,
        "server_cpu_util": round(server_cpu / wall, 3) if wall and cpu else None,
        "server_cpu_us_per_msg_hop": round(server_cpu / hop_msgs * 1e6, 2) if hop_msgs and cpu else None,
        "server_cpu_us_per_delivery": round(server_cpu / delivered * 1e6, 2) if delivered and cpu else None,
        "server_peak_rss_kb": peak or None,
        "pub_cpu_us_per_msg": round(pub_cpu / outcomes * 1e6, 2) if outcomes else None,
        "sub_cpu_us_per_msg": round(sub_cpu / measured * 1e6, 2) if measured else None,
        "remote_rcv_settle_modes": dict(modes), "wall_s": round(wall, 3),
    }
    if case.kind == "mesh":  # per subscriber: the path from the publisher's router to its router
        out["latency_by_sub"] = [{"at": at, **{k: (lat or {}).get(k) for k in ("p50", "p99", "p999", "max")}}
                                 for at, lat in zip(case.sub_at, lats, strict=False)]
    if case.shared:  # what each member got
        out["shares"] = [int(r.get("received", 0)) for r in sres]
    if case.protocol == "mqtt":
        out["mqtt"] = {"qos": case.qos, "duplicates": sum(int(r.get("duplicates", 0)) for r in sres),
                       "missing": sum(int(r.get("missing", 0)) for r in sres),
                       "window": [i.get("window") for i in pub_info],
                       "receive_maximum": [i.get("receive_maximum") for i in pub_info]}
    if prof is not None:
        out["profile"] = prof
    return out


def mqtt_violations(qos: int, sres: list[dict[str, Any]]) -> list[str]:
    """The exactly-once check of an MQTT case, from its subscribers' results (harness/mqttload.py's
    `Tally`): each violation the subscriber found, and, not trusting that list alone, its counts: at
    QoS 2 a duplicate or a missing message fails the run, at QoS 1 a missing one (duplicates are
    QoS 1's at-least-once: counted, not a failure). A subscriber without a result (it crashed) has no
    counts: its error says so and fails the run elsewhere."""
    out = []
    for r in sres:
        if "distinct" not in r:
            continue
        who = f"sub {r.get('index')}"
        said = [str(v) for v in r.get("violations") or []]
        out += [f"{who}: {v}" for v in said]
        if said:
            continue
        dups, missing = int(r.get("duplicates", 0)), int(r.get("missing", 0))
        if qos == 2 and dups:
            out.append(f"{who}: QoS 2: {dups} duplicate deliveries (not exactly once)")
        if qos >= 1 and missing:
            out.append(f"{who}: QoS {qos}: {missing} messages missing (lost)")
    return out


# ---------------------------------------------------------------------- profiling (py-spy)
def _py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def _start_profiler(pid: int, seconds: float, wd: Path) -> tuple[subprocess.Popen[bytes], Path] | None:
    exe = _py_spy()
    if exe is None:
        log("py-spy not found (pip install py-spy): no profile")
        return None
    out = wd / "profile.raw"
    p = subprocess.Popen([exe, "record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-r", "250", "-f", "raw",
                          "-o", str(out), "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return p, out


def _finish_profiler(spy: tuple[subprocess.Popen[bytes], Path]) -> dict[str, Any]:
    p, out = spy
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    if not out.exists():
        return {"error": (err or b"").decode(errors="replace")[-500:] or "py-spy wrote nothing"}
    return summarise_profile(out)


def _frame_name(frame: str) -> str:
    """'fn (path/to/file.py:123)' -> 'fn (file.py)': per function, not per line."""
    name, _, loc = frame.partition(" (")
    path = loc.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{name} ({short})"


_PROJECT_DIRS = ("router/", "interrouter/", "clients/")


def _ours(frame: str) -> bool:
    """A frame of the router's own code, below the entry point (whose share is always ~100%)."""
    loc = frame.partition(" (")[2]  # py-spy gives paths relative to sys.path: "router/core.py:12)"
    return any(loc.startswith(d) or f"/{d}" in loc for d in _PROJECT_DIRS) and "router/cli.py" not in loc


def summarise_profile(raw: Path, top: int = 15) -> dict[str, Any]:
    """Self sample shares per function (any code), and inclusive shares per function of the
    project's own code, from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        k = int(n)
        total += k
        frames = [_frame_name(f) for f in stack.split(";") if "(" in f]
        if not frames:
            continue
        own[frames[-1]] += k
        for f in {_frame_name(f) for f in stack.split(";") if _ours(f)}:
            incl[f] += k
    if not total:
        return {"samples": 0, "self": [], "inclusive": []}
    return {"samples": total,
            "self": [[f, round(100 * v / total, 1)] for f, v in own.most_common(top)],
            "inclusive": [[f, round(100 * v / total, 1)] for f, v in incl.most_common(top)]}


# ---------------------------------------------------------------------- aggregation
_MEDIAN_KEYS = ("published_msg_s", "delivered_msg_s_per_sub", "delivered_msg_s_min_sub", "delivered_msg_s_total",
                "server_cpu_us_per_msg_hop", "server_cpu_us_per_delivery", "server_cpu_util",
                "server_peak_rss_kb", "pub_cpu_us_per_msg", "sub_cpu_us_per_msg")


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs that succeeded: a failed run has no figures (a case none of whose runs
    succeeded has none at all, and is reported as failed)."""
    good = [r for r in runs if r.get("ok")]
    out: dict[str, Any] = {}
    for k in _MEDIAN_KEYS:
        vals = [r[k] for r in good if r.get(k) is not None]
        out[k] = round(statistics.median(vals), 2) if vals else None
    out["latency_ms"] = {}
    for k in ("p50", "p99", "p999", "max"):
        vals = [r["latency_ms"][k] for r in good if r.get("latency_ms", {}).get(k) is not None]
        out["latency_ms"][k] = round(statistics.median(vals), 3) if vals else None
    subs = [r["latency_by_sub"] for r in good if r.get("latency_by_sub")]
    if subs:  # per subscriber (a mesh): medians per position
        out["latency_by_sub"] = [
            {"at": entries[0]["at"], **{k: round(statistics.median(v), 3) if (
                v := [e[k] for e in entries if e.get(k) is not None]) else None for k in ("p50", "p99", "p999", "max")}}
            for entries in zip(*subs, strict=False)]
    links = [r["links"] for r in good if r.get("links")]
    if links:
        out["links"] = {name: {k: round(statistics.median(lk[name][k] for lk in links)) for k in links[0][name]}
                        for name in links[0]}
    wires = [r["wire_per_msg"] for r in good if r.get("wire_per_msg")]
    if wires:  # inter-router messages per published message (a mesh)
        out["wire_per_msg"] = {k: round(statistics.median(w[k] for w in wires), 2) for k in wires[0]}
    out["ok_runs"] = sum(1 for r in runs if r.get("ok"))
    out["runs"] = len(runs)
    return out


def _wire_text(w: dict[str, float] | None) -> str:
    """Inter-router messages per published message: copies + control (of which the sequencer's)."""
    if not w:
        return "-"
    return f"{w['copies'] + w['control']:.1f} ({w['copies']:.1f}+{w['control']:.1f}, seq {w['order']:.1f})"


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


# ---------------------------------------------------------------------- suites
BASELINES = ("direct", "container", "rabbitmq", "mosquitto")


# the Debian packages of the baselines that are servers of their own (`--install-baselines`)
BASELINE_PACKAGES = {"rabbitmq": "rabbitmq-server", "mosquitto": "mosquitto"}


def install_baselines(base: list[str]) -> list[str]:
    """Install the Debian packages of the baselines in `base` that are not installed (apt-get, as
    root): the bench's set-up on a fresh machine. Returns notes of what was done or why not; a
    baseline still unavailable afterwards is skipped with its reason, as without the option."""
    unavailable = {"rabbitmq": RabbitMQ.unavailable, "mosquitto": Mosquitto.unavailable}
    wanted = [BASELINE_PACKAGES[b] for b in base if b in BASELINE_PACKAGES and unavailable[b]()]
    if not wanted:
        return []
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return [f"--install-baselines: needs apt-get as root; install by hand: apt-get install -y {' '.join(wanted)}"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *wanted]
    log(f"installing {' '.join(wanted)} (apt-get)")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:  # (a stale package index: once more after an update)
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, env=env)
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return [f"--install-baselines: apt-get install {' '.join(wanted)} failed: {tail[0]}"]
    return [f"installed {' '.join(wanted)} (apt-get)"]


def throughput_cases(args: argparse.Namespace) -> tuple[list[Case], list[Case], list[str]]:
    """The scenario, its 1:1 twin (the targets are defined on 1:1) and the baselines; then the same
    at a fixed rate for latency. Returns (throughput cases, latency cases, notes)."""
    notes: list[str] = []
    presettled = args.mode == "presettled"
    cases: list[Case] = []
    lat: list[Case] = []
    base = [b for b in args.baselines.split(",") if b] if args.baselines else []
    for b in base:
        if b not in BASELINES:
            raise SystemExit(f"oncemesh bench: unknown baseline {b!r} ({', '.join(BASELINES)})")
    if getattr(args, "install_baselines", False):
        notes.extend(install_baselines(base))
    if "rabbitmq" in base and (why := RabbitMQ.unavailable()):
        notes.append(f"RabbitMQ skipped: {why}")
        base.remove("rabbitmq")
    if "mosquitto" in base and (why := Mosquitto.unavailable()):
        notes.append(f"Mosquitto skipped: {why}")
        base.remove("mosquitto")
    mqtt = bool(getattr(args, "mqtt", False))
    if presettled:
        notes.append("router skipped: it refuses pre-settled links (at-most-once); baselines only")
    elif args.topology is not None:
        pub_at, sub_at = _placement(args)
        wan = parse_wan(args.wan) if getattr(args, "wan", None) else None
        scen = Case.fan("mesh", "mesh", 0, 0, args.rate, topology=args.topology, pub_at=pub_at, sub_at=sub_at)
        scen.wan = wan
        cases.append(scen)
        if wan is not None:  # the same on plain links, side by side
            cases.append(Case.fan("mesh-lan", "mesh", 0, 0, args.rate, topology=args.topology, pub_at=pub_at,
                                  sub_at=sub_at))
        if args.tls:  # the same without inter-router TLS, side by side
            cases.append(Case.fan("mesh-insecure", "mesh", 0, 0, args.rate, topology=args.topology,
                                  pub_at=pub_at, sub_at=sub_at))
            cases[-1].insecure_mesh = True
        if args.latency_rate:
            lat.append(Case.fan("mesh@rate", "mesh", 0, 0, args.latency_rate, topology=args.topology,
                                pub_at=pub_at, sub_at=sub_at))
            lat[-1].wan = wan
            if wan is not None:
                lat.append(Case.fan("mesh-lan@rate", "mesh", 0, 0, args.latency_rate, topology=args.topology,
                                    pub_at=pub_at, sub_at=sub_at))
    else:
        cases.append(Case.fan("router", "router", args.publishers, args.subscribers, args.rate))
        if args.latency_rate:
            lat.append(Case.fan("router@rate", "router", args.publishers, args.subscribers, args.latency_rate))
    shared = bool(getattr(args, "shared", False))
    for c in cases + lat:
        c.shared = shared
    one_to_one = args.topology is None and (args.publishers, args.subscribers) == (1, 1)
    if not presettled and not one_to_one and (base or args.tls or shared or mqtt):  # the targets and the baselines are 1:1
        cases.append(Case.fan("router-1:1", "router", 1, 1, args.rate))
    if mqtt:  # the router's MQTT listener, 1:1, beside the AMQP 1:1 case (ratios: mqtt_section)
        for qos in (2, 1):
            cases.append(Case.fan(f"mqtt-qos{qos}-1:1", "router", 1, 1, args.rate))
            cases[-1].protocol, cases[-1].qos = "mqtt", qos
            if args.latency_rate:
                lat.append(Case.fan(f"mqtt-qos{qos}@rate", "router", 1, 1, args.latency_rate))
                lat[-1].protocol, lat[-1].qos = "mqtt", qos
        notes.append("MQTT cases: MQTT 5 clients of harness/mqttload.py (our codec, one process each; payload of "
                     f"--size bytes; window {getattr(args, 'mqtt_window', MQTT_WINDOW)} PUBLISHes, at most the "
                     "CONNACK's Receive Maximum); the subscriber holds a persistent session; QoS 2 fails the run "
                     "on a duplicate or a missing message, QoS 1 on a missing one")
    if args.tls and not presettled:  # the 1:1 case again with client TLS, side by side
        cases.append(Case.fan("router-1:1-tls", "router", 1, 1, args.rate))
        cases[-1].tls = True
    rabbit_mode = None
    if "rabbitmq" in base and args.mode == "exactly-once":
        # RabbitMQ 3.x ends the session on receiver-settle-mode second: it cannot settle per hop
        # exactly once, so it runs at-least-once, next to the router at-least-once (like for like)
        rabbit_mode = "at-least-once"
        notes.append("RabbitMQ runs at-least-once: it refuses receiver-settle-mode second "
                     "('rcv-settle-mode second not supported'); compare it with the router's at-least-once case")
        if not presettled:
            cases.append(Case.fan("router-1:1-alo", "router", 1, 1, args.rate))
            cases[-1].mode = "at-least-once"
    for b in base:
        cases.append(Case.fan(b, b, 1, 1, args.rate))
        if args.latency_rate:
            lat.append(Case.fan(f"{b}@rate", b, 1, 1, args.latency_rate))
    for c in cases + lat:
        if c.kind == "rabbitmq":
            c.mode = rabbit_mode
        if c.kind == "mosquitto":  # MQTT only: QoS 2, the MQTT load clients
            c.protocol, c.qos = "mqtt", 2
        c.label = c.shape() + (f" @ {c.rate:g} msg/s" if c.rate else "") + (f" [{c.mode}]" if c.mode else "") \
            + (f" [MQTT 5 QoS {c.qos}]" if c.protocol == "mqtt" else "") \
            + (" [client TLS]" if c.tls else "") + (" [inter-router TLS]" if c.kind == "mesh" and not c.insecure_mesh
                                                    else " [no inter-router TLS]" if c.kind == "mesh" else "") \
            + (f" [WAN links {c.wan.text()}]" if c.wan is not None else "")
    return cases, lat, notes


def run_suite(cases: list[Case], cfg: Settings, workdir: Path, repeat: int, rabbit: RabbitMQ | None,
              prefix: str = "") -> dict[str, dict[str, Any]]:
    """Every case once per round, rounds repeated: side by side, so that noise hits them alike."""
    runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in cases}
    for rep in range(repeat):
        for c in cases:
            tag = f"{prefix}{c.name.replace(':', '_').replace('@', '_at_')}-{rep}"
            log(f"round {rep + 1}/{repeat}: {c.label}")
            try:
                r = run_once(c, cfg, workdir, tag, rabbit if c.kind == "rabbitmq" else None)
            except (BenchError, TimeoutError, OSError) as exc:
                r = {"ok": False, "errors": [str(exc)[-1500:]], "latency_ms": {}}
            if not r.get("ok"):
                log(f"  {c.name}: problem: {'; '.join(r.get('errors', []))[:500]}")
            else:
                log(f"  {c.name}: {r['delivered_msg_s_per_sub']:.0f} msg/s/sub, server "
                    f"{r['server_cpu_us_per_msg_hop']} CPU-us/msg/hop")
            runs[c.name].append(r)
    return {c.name: {"label": c.label, "kind": c.kind, "rate": c.rate, "protocol": c.protocol,
                     **({"qos": c.qos} if c.protocol == "mqtt" else {}), "median": median_of(runs[c.name]),
                     "runs": runs[c.name]} for c in cases}


def mqtt_section(t: dict[str, dict[str, Any]], reference: str | None) -> dict[str, Any] | None:
    """The MQTT cases beside the AMQP 1:1 case (`reference`) of the same run: their medians, and
    their ratios to it round by round (the median of the per-round ratios: the cases of a round are
    run one after the other, so a ratio inside a round shares that round's noise)."""
    names = [n for n, c in t.items() if c.get("protocol") == "mqtt"]
    if not names:
        return None
    ref = t.get(reference) if reference else None
    out: dict[str, Any] = {"reference": reference, "reference_label": ref["label"] if ref else None, "cases": {}}
    for n in names:
        c = t[n]
        md = c["median"]
        rounds = []
        for i, run in enumerate(c["runs"]):
            base = ref["runs"][i] if ref is not None and i < len(ref["runs"]) else None
            ok = run.get("ok") and base is not None and base.get("ok")
            rounds.append({"msg_s_ratio": ratio(run.get("delivered_msg_s_per_sub"), base.get("delivered_msg_s_per_sub"))
                           if ok and base is not None else None,
                           "cpu_ratio": ratio(run.get("server_cpu_us_per_msg_hop"), base.get("server_cpu_us_per_msg_hop"))
                           if ok and base is not None else None})

        def med(key: str, rows: list[dict[str, Any]] = rounds) -> float | None:
            vals = [r[key] for r in rows if r[key] is not None]
            return round(statistics.median(vals), 3) if vals else None

        out["cases"][n] = {"label": c["label"], "kind": c["kind"], "qos": c.get("qos"),
                           "delivered_msg_s_per_sub": md["delivered_msg_s_per_sub"],
                           "server_cpu_us_per_msg": md["server_cpu_us_per_msg_hop"],
                           "msg_s_ratio": med("msg_s_ratio"), "cpu_ratio": med("cpu_ratio"), "rounds": rounds,
                           "duplicates": sum(int((r.get("mqtt") or {}).get("duplicates", 0)) for r in c["runs"]),
                           "ok_runs": md["ok_runs"], "runs": md["runs"]}
    return out


def full_mesh_topology(n: int, path: Path) -> Path:
    lines = [f'[mesh]\nname = "bench-full{n}"\nhello_interval = 1.0\ndead_after = 3.0\n']
    ids = [f"R{i + 1}" for i in range(n)]
    for r in ids:
        lines.append(f'[routers.{r}]\nlisten = "127.0.0.1:0"\ninter_router = "127.0.0.1:0"\n')
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            lines.append(f'[[links]]\nbetween = ["{a}", "{b}"]\n')
    path.write_text("\n".join(lines))
    return path


def scale_out(args: argparse.Namespace, cfg: Settings, workdir: Path) -> dict[str, Any]:
    """1, 2, 4 routers in a full mesh; topic i published at router i and subscribed at the next
    router (each message crosses two routers when n > 1): aggregate delivered msg/s."""
    cases = []
    for n in args.scale_routers:
        topo = full_mesh_topology(n, workdir / f"full{n}.toml")
        ids = [f"R{i + 1}" for i in range(n)]
        sub_at = [ids[(i + 1) % n] for i in range(n)] if args.scale_placement == "next" else list(ids)
        c = Case(f"mesh{n}", "mesh", list(ids), sub_at, [f"t{i}" for i in range(n)], [f"t{i}" for i in range(n)],
                 0.0, topo)
        c.label = f"{n} router(s), full mesh, {n} topic(s): pub at R(i), sub at " + \
            ("R(i+1)" if args.scale_placement == "next" else "R(i)")
        cases.append(c)
    if args.line3:
        line = example_path("line3.toml")
        c = Case.fan("line3-fanout", "mesh", 0, 0, 0.0, topology=line, pub_at=["A"], sub_at=["A", "B", "C"])
        c.label = "line3 A-B-C fan-out: 1 pub at A, subs at A, B, C"
        cases.append(c)
    res = run_suite(cases, cfg, workdir, args.repeat, None, prefix="scale-")
    return {"placement": args.scale_placement, "cases": res, "hop_ratios": hop_ratios(res, "mesh1")}


def hop_ratios(cases: dict[str, dict[str, Any]], reference: str) -> dict[str, float | None]:
    """Each case's CPU per message per hop over the one router's (`reference`), the median of the
    per-round ratios (a round's cases share its noise): what a mesh hop costs against a local one."""
    ref = cases.get(reference)
    out: dict[str, float | None] = {}
    if ref is None:
        return out
    for name, c in cases.items():
        if name == reference:
            continue
        vals = [x for run, base in zip(c["runs"], ref["runs"], strict=False)
                if run.get("ok") and base.get("ok")
                and (x := ratio(run.get("server_cpu_us_per_msg_hop"), base.get("server_cpu_us_per_msg_hop"))) is not None]
        out[name] = round(statistics.median(vals), 2) if vals else None
    return out


def memory_suite(args: argparse.Namespace, cfg: Settings, workdir: Path) -> dict[str, Any]:
    """Router memory per 1,000 idle client connections and per 10,000 held messages, and a check
    that one router holds `--connections` concurrent connections and still carries traffic."""
    out: dict[str, Any] = {}
    wd = workdir / "memory"
    wd.mkdir(parents=True, exist_ok=True)
    # idle connections
    n = args.connections
    router = RouterProcess("A", wd / "conns")
    router.start()
    hold: Proc | None = None
    try:
        rss0 = rss_kb(router.pid)
        ready = wd / "hold.ready.json"
        hold = Proc(python_cmd("-m", "oncemesh.harness.benchclients", "hold", "--url", f"127.0.0.1:{router.port}",
                               "--connections", str(n), "--ready", str(ready), "--timeout", "300"),
                    wd / "hold.out")
        info = _wait_files([(hold, ready)], 300, f"{n} client connections")[0]
        held = int(info["connections"])
        wait_for(lambda: router.stats().get("connections", 0) >= held, 30, "the router to count the connections")
        rss1 = rss_kb(router.pid)
        c0, t0 = safe_cpu(router.pid), time.monotonic()
        wait_for(lambda: time.monotonic() - t0 >= 2.0, 5, "the idle measurement window", 0.05)
        cpu_share = (safe_cpu(router.pid) - c0) / (time.monotonic() - t0)  # heartbeats of idle connections
        probe = Case.fan("probe", "router", 1, 1)
        probe_cfg = Settings(mode=cfg.mode, size=cfg.size, count=2000, duration=0, warmup=0, timeout=60)
        traffic = _probe_traffic(router, probe, probe_cfg, wd)
        out["connections"] = {
            "requested": n, "held": held, "failed": info.get("failed"), "errors": info.get("errors"),
            "router_counted": router.stats().get("connections"), "fd_soft_limit": info.get("fd_limit"),
            "rss_before_kb": rss0, "rss_after_kb": rss1,
            "kb_per_1000": round((rss1 - rss0) / held * 1000, 1) if held else None,
            "traffic_while_held": traffic, "router_cpu_share_while_held": round(cpu_share, 3),
            "ok": held >= n and bool(traffic.get("ok"))}
    finally:
        if hold is not None:
            hold.stop(10)
        router.stop(15)
    # held (unsettled) messages: a suspended durable subscriber, a publisher that keeps its link
    m = args.held_messages
    router = RouterProcess("A", wd / "held", settings={"max_inflight_messages": max(20_000, m + 1000)})
    router.start()
    procs: list[Proc] = []
    try:
        url = f"127.0.0.1:{router.port}"
        sready = wd / "susp.ready.json"
        s = Proc(python_cmd("-m", "oncemesh.harness.benchclients", "sub", "--url", url, "--address", "held",
                            "--ready", str(sready), "--expiry", "600", "--suspend", "--mode", cfg.mode),
                 wd / "susp.out")
        procs.append(s)
        _wait_files([(s, sready)], 60, "the durable subscriber")
        s.wait(30)
        wait_for(lambda: router.stats().get("active_subscriptions", 1) == 0, 30, "the subscription to be suspended")
        pready, presult = wd / "heldpub.ready.json", wd / "heldpub.result.json"
        p = Proc(python_cmd("-m", "oncemesh.harness.benchclients", "pub", "--url", url, "--address", "held", "--ready",
                            str(pready), "--result", str(presult), "--count", str(m), "--window", str(m + 1),
                            "--size", str(cfg.size), "--hold", "--mode", cfg.mode, "--timeout", "300"),
                 wd / "heldpub.out")
        procs.append(p)
        _wait_files([(p, pready)], 60, "the publisher")
        rss0 = rss_kb(router.pid)
        p.signal(signal.SIGUSR1)
        _wait_files([(p, presult)], 300, "the publisher to send everything")
        wait_for(lambda: router.stats().get("undecided", 0) >= m, 120, f"the router to hold {m} messages", 0.1)
        rss1 = rss_kb(router.pid)
        out["held_messages"] = {"messages": m, "size": cfg.size, "held": router.stats().get("undecided"),
                                "rss_before_kb": rss0, "rss_after_kb": rss1,
                                "kb_per_10000": round((rss1 - rss0) / m * 10_000, 1),
                                "bytes_per_message": round((rss1 - rss0) * 1024 / m, 1)}
    finally:
        for pr in procs:
            pr.stop(5)
        router.stop(15)
    return out


def _probe_traffic(router: RouterProcess, case: Case, cfg: Settings, wd: Path) -> dict[str, Any]:
    """A short run through a router that is busy holding connections: does it still carry traffic?"""

    class Existing(SingleRouter):
        def __init__(self) -> None:  # the running router; not started (nor stopped) by run_once
            self.router = router

    try:
        r = run_once(case, cfg, wd, "probe", server=Existing())
    except (BenchError, TimeoutError) as exc:
        return {"ok": False, "errors": [str(exc)[-500:]]}
    return {"ok": r["ok"], "messages": r["published"], "msg_s": r["delivered_msg_s_per_sub"],
            "p99_ms": r["latency_ms"].get("p99"), "errors": r["errors"]}


class _CallgrindRouter(RouterProcess):
    """A standalone router run under valgrind's callgrind (it counts instructions, ~50x slower)."""

    def __init__(self, workdir: Path, out: Path, settings: dict[str, Any]) -> None:
        super().__init__("A", workdir, settings=settings)
        self.out = out

    def command(self) -> list[str]:
        # (one file per thread, `OUT-01` the event loop's: the settlement log compresses closed
        # segments on a worker thread, which the report shows apart)
        return [*_callgrind_argv(self.out), *super().command()]


def _callgrind_argv(out: Path) -> list[str]:
    """valgrind's callgrind in front of a process, one output file per thread (`OUT-01`, ...)."""
    return ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}"]


def _callgrind_total(path: Path) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise BenchError(f"no instruction total in {path}")


def _callgrind_threads(out: Path) -> tuple[int, int]:
    """(instructions of the main thread, of all other threads) from callgrind's per-thread files
    `OUT-01`, `OUT-02`, ... (`--separate-threads=yes`; thread 1 runs the event loop)."""
    files = sorted(out.parent.glob(out.name + "-*"))
    if not files:
        return _callgrind_total(out), 0
    main = _callgrind_total(files[0])
    return main, sum(_callgrind_total(f) for f in files[1:])


def _callgrind_calls(path: Path, fn: str) -> int:
    """How often the profiled thread called the C function `fn` (the sum of its call sites in a
    callgrind file, which names a function once, `(id) name`, and later by `(id)` alone)."""
    ids: set[str] = set()
    calls = 0
    callee: str | None = None
    with open(path) as f:
        for line in f:
            if line.startswith("cfn="):
                ident, _, name = line[4:].rstrip("\n").partition(" ")
                if name == fn:
                    ids.add(ident)
                callee = ident
            elif line.startswith("fn="):
                ident, _, name = line[3:].rstrip("\n").partition(" ")
                if name == fn:
                    ids.add(ident)
            elif line.startswith("calls=") and callee is not None:
                if callee in ids:
                    calls += int(line[6:].split()[0])
                callee = None
    return calls


def _loop_passes(out: Path) -> int:
    """Passes of the event loop in a callgrind run: its polls (`select.epoll.poll`, one per pass of
    asyncio's selector loop), in the event loop's thread's file (`OUT-01`)."""
    files = sorted(out.parent.glob(out.name + "-*"))
    return _callgrind_calls(files[0] if files else out, "select_epoll_poll")


def instructions_suite(args: argparse.Namespace, cfg: Settings, workdir: Path) -> dict[str, Any]:
    """Instructions the router executes per message (1:1 exactly-once), counted by callgrind: the
    one figure this noisy, shared machine repeats exactly, so that two versions of the code can be
    compared in different runs. Two runs of N and 6N messages; the difference divided by 5N leaves
    out start-up and shutdown. Under callgrind the router is the bottleneck by far, so its batches
    are larger than at full speed: compare these figures with each other, not with CPU-us.
    With `--instructions-fanout K` also a 1 -> K fan-out through one router (K subscribers, each its
    own durable subscription of the topic), per message and per delivery, beside the 1:1 figure."""
    if shutil.which("valgrind") is None:
        return {"error": "valgrind is not installed (apt-get install valgrind): no instruction count"}
    n = args.instructions
    # (with --instructions-rate the publisher is paced: a message or so per loop pass, the regime of
    # moderate rates whose fixed costs per pass the saturated count hides; docs/performance.md)
    rate = getattr(args, "instructions_rate", 0.0)
    res = _instructions_router(Case.fan("instructions", "router", 1, 1, rate), n, cfg, workdir / "instructions")
    if "error" in res:
        return res
    res["rate"] = rate or None
    k = getattr(args, "instructions_fanout", 0)
    if k:
        fan = _instructions_router(Case.fan("instructions-fanout", "router", 1, k, rate), n, cfg,
                                   workdir / "instructions-fanout")
        res["fanout"] = fan
        if "per_message" in fan:
            fan["subscribers"] = k
            fan["per_delivery"] = round(fan["per_message"] / k)
            # (1.0: a delivery of the fan-out costs what a whole 1:1 message costs; the once-per-message
            # work shared by K subscribers brings it below)
            res["fanout_delivery_ratio"] = round(fan["per_message"] / k / res["per_message"], 3)
    if args.topology is not None:
        mesh = instructions_mesh(args, cfg, workdir)
        res["mesh"] = mesh
        if mesh.get("per_message_hop"):
            res["mesh_hop_ratio"] = round(mesh["per_message_hop"] / res["per_message"], 2)
    return res


def _instructions_router(case: Case, n: int, cfg: Settings, base: Path) -> dict[str, Any]:
    """The case through one router under callgrind, N and 6N messages: its instructions per published
    message (the event loop's thread and the workers apart), or {"error": ...}."""
    totals: dict[int, tuple[int, int]] = {}
    passes: dict[int, int] = {}
    for count in (n, 6 * n):
        wd = base.with_name(f"{base.name}-{count}")
        out = wd / "callgrind.out"
        # (~50x slower, a pass over a batch of 1,000 messages takes seconds, and the router would take
        # its clients' input, still unread in the socket, for silence: its idle timeout is raised)
        router = _CallgrindRouter(wd / "router", out, {**cfg.router_settings, "idle_timeout": 600})
        log(f"instructions: {count} messages through a router under callgrind ({case.shape()})")
        router.start(timeout=300)
        try:
            icfg = dataclasses.replace(cfg, count=count, duration=0.0, warmup=0.0, timeout=max(cfg.timeout, 600.0),
                                       idle_timeout=600.0)
            r = run_once(case, icfg, wd, "run", server=SingleRouter(wd, router=router))
        finally:
            router.stop(300)
        if not r["ok"]:
            return {"error": f"the run of {count} messages ({case.shape()}) failed: {r['errors']}"}
        totals[count] = _callgrind_threads(out)
        passes[count] = _loop_passes(out)
    loop, workers = ((totals[6 * n][i] - totals[n][i]) / (5 * n) for i in (0, 1))
    return {"messages": [n, 6 * n], "instructions": [sum(totals[n]), sum(totals[6 * n])],
            "per_message": round(loop + workers), "per_message_loop": round(loop),
            "per_message_workers": round(workers),
            # (how many messages a pass carried: the regime of the count; paced, it depends on how
            # fast the machine let the router run under callgrind)
            "passes": [passes[n], passes[6 * n]],
            "passes_per_message": round((passes[6 * n] - passes[n]) / (5 * n), 2)}


def instructions_mesh(args: argparse.Namespace, cfg: Settings, workdir: Path) -> dict[str, Any]:
    """`--instructions` with `--topology`: every router of the scenario (its --pub-at, --sub-at)
    under callgrind, the instructions of all of them per message per hop (the routers each message
    crosses, as in the throughput table), over N and 6N messages as for the single router; beside
    it the 1:1 router's, their ratio is the cost of a mesh hop against a local one, repeatable."""
    from ..topology.load import with_overrides

    assert args.topology is not None
    n = args.instructions
    rate = getattr(args, "instructions_rate", 0.0)
    ids = _topology_ids(args.topology)
    pub_at, sub_at = _placement(args)
    totals: dict[int, int] = {}
    hops = 1
    for count in (n, 6 * n):
        wd = workdir / f"instructions-mesh-{count}"
        wd.mkdir(parents=True, exist_ok=True)
        # (under callgrind a pass takes seconds: neighbours and clients must not take it for silence,
        # and an origin must not re-send copies whose HELD is merely slow: measured, a 3,000-message
        # run spiralled into re-sends, 5.8 M instructions per message at the origin)
        topo = with_overrides(args.topology, wd / "topology.toml", mesh={"dead_after": 600.0},
                              defaults={**cfg.router_settings, "idle_timeout": 600.0, "copy_retry": 600.0,
                                        "probe_after": 600.0})
        outs = {r: wd / f"callgrind.{r}.out" for r in ids}

        def wrap(rid: str, outs: dict[str, Path] = outs) -> list[str]:
            return _callgrind_argv(outs[rid])

        case = Case.fan("instructions-mesh", "mesh", 0, 0, rate, topology=topo, pub_at=pub_at, sub_at=sub_at)
        log(f"instructions: {count} messages through {args.topology.name} ({', '.join(ids)}) under callgrind")
        server = MeshServer(topo, wd / "mesh", timeout=600.0, wrap=wrap)
        try:
            hops = server.hops(pub_at[0], sub_at)
            icfg = dataclasses.replace(cfg, count=count, duration=0.0, warmup=0.0, timeout=max(cfg.timeout, 900.0),
                                       idle_timeout=600.0, router_settings={})
            r = run_once(case, icfg, wd, "run", server=server)
        finally:
            server.stop()
        if not r["ok"]:
            return {"error": f"the mesh run of {count} messages failed: {r['errors']}"}
        totals[count] = sum(sum(_callgrind_threads(out)) for out in outs.values())  # (none: BenchError)
    per_msg = (totals[6 * n] - totals[n]) / (5 * n)
    return {"messages": [n, 6 * n], "instructions": [totals[n], totals[6 * n]], "hops": hops,
            "per_message": round(per_msg), "per_message_hop": round(per_msg / hops),
            "pub_at": pub_at, "sub_at": sub_at, "rate": rate or None}


def profile_router(args: argparse.Namespace, cfg: Settings, workdir: Path) -> dict[str, Any]:
    """py-spy on the router of a 1:1 unbounded run (the hot path the targets are about)."""
    case = Case.fan("profile", "router", 1, 1)
    pcfg = dataclasses.replace(cfg, count=0, duration=args.profile + 1.0)
    r = run_once(case, pcfg, workdir, "profile", profile=args.profile)
    prof = r.get("profile") or {"error": "no profile"}
    prof["run"] = {k: r.get(k) for k in ("delivered_msg_s_per_sub", "server_cpu_us_per_msg_hop", "ok")}
    return prof


# ---------------------------------------------------------------------- targets and report
# ---------------------------------------------------------------------- topic matching (common/topics.py)
TOPIC_TREE = (("orders", "payments", "stock", "users", "audit", "metrics", "alerts", "logs"),
              tuple(f"r{i}" for i in range(10)), tuple(f"shop{i}" for i in range(50)),
              tuple(f"item{i}" for i in range(50)))
"""The benchmark's tree of topic names: 4 levels of 8, 10, 50 and 50 names (200,000 names)."""
TOPIC_MIX = (("literal", 0.70), ("plus_level_1", 0.05), ("plus_level_2..4", 0.15),
             ("rest_after_3", 0.08), ("rest_after_2", 0.02))
"""Kinds of subscription filters and their shares: a whole name; '+' in place of the first level; '+' in
place of level 2, 3 or 4; '#' after 3 levels (50 names); '#' after 2 levels (2,500 names)."""


def _topic_filter(rnd: random.Random, kind: str) -> str:
    levels = [rnd.choice(names) for names in TOPIC_TREE]
    if kind == "plus_level_1":
        levels[0] = "+"
    elif kind == "plus_level_2..4":
        levels[rnd.randrange(1, 4)] = "+"
    elif kind == "rest_after_3":
        levels = levels[:3] + ["#"]
    elif kind == "rest_after_2":
        levels = levels[:2] + ["#"]
    return "/".join(levels)


def topic_match_suite(sizes: tuple[int, ...] = (1, 1_000, 100_000), messages: int = 20_000,
                      scan_messages: int = 500, seed: int = 29) -> dict[str, Any]:
    """CPU-us per `TopicIndex.match` call (process CPU time, not wall) with `sizes` subscriptions whose
    filters follow TOPIC_MIX over TOPIC_TREE, names published drawn uniformly from the same tree; how many
    subscriptions a message matched on average; for the largest size the index's build time and memory
    (tracemalloc: what the index allocates, not the filter strings and keys, which the subscription table
    holds anyway). Up to 1,000 subscriptions, a naive scan (`matches` over every filter) beside it."""
    import gc
    import tracemalloc

    from ..common.topics import TopicIndex, matches

    rnd = random.Random(seed)
    kinds = [k for k, _ in TOPIC_MIX]
    weights = [w for _, w in TOPIC_MIX]
    published = ["/".join(rnd.choice(names) for names in TOPIC_TREE) for _ in range(messages)]
    out: dict[str, Any] = {"tree_levels": [len(n) for n in TOPIC_TREE], "mix": dict(TOPIC_MIX),
                           "messages": messages, "seed": seed, "cases": {}}

    def build(subs: list[tuple[str, str]]) -> TopicIndex[str]:
        idx: TopicIndex[str] = TopicIndex()
        for f, key in subs:
            idx.add(f, key)
        return idx

    for n in sizes:
        subs = [(_topic_filter(rnd, kind), f"sub{i}")
                for i, kind in enumerate(rnd.choices(kinds, weights, k=n))]
        gc.collect()
        t0 = time.process_time()
        idx = build(subs)
        build_s = time.process_time() - t0
        match = idx.match
        for topic in published[:200]:  # warm-up
            match(topic)
        matched = 0
        t0 = time.process_time()
        for topic in published:
            matched += len(match(topic))
        cpu = time.process_time() - t0
        case: dict[str, Any] = {"subscriptions": n, "entries": len(idx), "trie_nodes": idx.node_count(),
                                "cpu_us_per_match": cpu / messages * 1e6,
                                "matched_per_message": matched / messages,
                                "build_s": build_s, "build_us_per_subscription": build_s / n * 1e6}
        if n <= 1_000:
            few = published[:scan_messages]
            scanned = 0
            t0 = time.process_time()
            for topic in few:
                scanned += len({k for f, k in subs if matches(f, topic)})
            case["scan_cpu_us_per_match"] = (time.process_time() - t0) / len(few) * 1e6
            case["scan_messages"] = len(few)
            case["scan_matched_per_message"] = scanned / len(few)
        out["cases"][str(n)] = case
        del idx
    largest = max(sizes)
    subs = [(_topic_filter(rnd, kind), f"sub{i}") for i, kind in enumerate(rnd.choices(kinds, weights, k=largest))]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        idx = build(subs)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    out["memory"] = {"subscriptions": largest, "bytes": held, "bytes_per_subscription": held / largest,
                     "trie_nodes": idx.node_count()}
    return out


def _topic_match_text(tm: dict[str, Any]) -> list[str]:
    lines = [f"topic matching (common/topics.py TopicIndex; tree of {' x '.join(map(str, tm['tree_levels']))} names, "
             f"filters {', '.join(f'{k} {v:.0%}' for k, v in tm['mix'].items())}; {tm['messages']:,} names "
             f"published, process CPU time)"]
    rows = [["subscriptions", "CPU-us per match", "matched per message", "naive scan CPU-us", "build us/sub",
             "trie nodes"]]
    for c in tm["cases"].values():
        rows.append([f"{c['subscriptions']:,}", _fmt(c["cpu_us_per_match"], 2), _fmt(c["matched_per_message"], 2),
                     _fmt(c.get("scan_cpu_us_per_match"), 1), _fmt(c["build_us_per_subscription"], 2),
                     f"{c['trie_nodes']:,}"])
    mem = tm["memory"]
    lines += [_table(rows), f"index memory at {mem['subscriptions']:,} subscriptions: {mem['bytes'] / 1e6:.1f} MB "
              f"({_fmt(mem['bytes_per_subscription'])} B per subscription; tracemalloc, the filter strings and "
              f"keys not counted)", ""]
    return lines


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The speed targets (docs/performance.md, "Where the router stands against its targets"), evaluated where this run measured what they are about."""
    t = report["throughput"]
    sc = report["scenario"]
    out: list[dict[str, Any]] = []
    if sc["mode"] != "exactly-once" or sc["size"] != 100:
        return out
    one = t.get("router-1:1") or (t.get("router") if sc["publishers"] == 1 and sc["subscribers"] == 1
                                  and not sc.get("topology") else None)
    if one is not None:
        m = one["median"]
        out.append({"target": "router CPU-us per message per hop (1:1) <= 10",
                    "value": m["server_cpu_us_per_msg_hop"],
                    "met": m["server_cpu_us_per_msg_hop"] is not None and m["server_cpu_us_per_msg_hop"] <= 10})
        for base, want in (("direct", 0.8), ("container", 15.0)):
            if base in t:
                v = ratio(m["delivered_msg_s_per_sub"], t[base]["median"]["delivered_msg_s_per_sub"])
                out.append({"target": f"throughput router / {base} (1:1) >= {want:g}", "value": v,
                            "met": v is not None and v >= want})
    for cases in ((report.get("scale_out") or {}).get("cases") or {}, t):
        for name, c in cases.items():
            if name == "line3-fanout" or (c["kind"] == "mesh" and "line3" in str(sc.get("topology") or "")):
                v = c["median"]["delivered_msg_s_min_sub"]
                out.append({"target": "fan-out over the 3-router line >= 50000 msg/s per subscriber",
                            "value": v, "met": v is not None and v >= 50_000})
    return out


def _links_text(section: dict[str, Any]) -> list[str]:
    """Traffic per inter-router link (cases run with --wan): bytes per second each way."""
    rows = [["case", "link", "up kB/s", "down kB/s", "chunks held for a retransmission"]]
    for c in section.values():
        for name, lk in (c["median"].get("links") or {}).items():
            rows.append([c["label"], name, _fmt(lk["up_bytes_s"] / 1000, 1), _fmt(lk["down_bytes_s"] / 1000, 1),
                         _fmt(lk["retransmitted_chunks"])])
    return ["inter-router links (up: from the dialing router)", _table(rows), ""] if len(rows) > 1 else []


def latency_curve(args: argparse.Namespace, cfg: Settings, workdir: Path) -> dict[str, Any]:
    """The scenario's latency at each rate of `--latency-curve` (msg/s per publisher), the rates
    interleaved in each round like every other suite; a rate is saturated when the subscribers got
    less than 95% of it. With `--chart`, a PNG of p50/p99/p999 against the offered rate."""
    rates = sorted({float(r) for r in args.latency_curve.split(",") if r.strip()})
    wan = parse_wan(args.wan) if args.wan else None
    load = [round(x, 1) for x in os.getloadavg()]
    if not rates or min(rates) <= 0:
        raise SystemExit("oncemesh bench: --latency-curve wants positive rates, e.g. 500,1000,2000,4000")
    cases = []
    for r in rates:
        if args.topology is not None:
            pub_at, sub_at = _placement(args)
            c = Case.fan(f"curve@{r:g}", "mesh", 0, 0, r, topology=args.topology, pub_at=pub_at, sub_at=sub_at)
            c.wan = wan
        else:
            c = Case.fan(f"curve@{r:g}", "router", args.publishers, args.subscribers, r)
        c.label = c.shape() + f" @ {r:g} msg/s"
        cases.append(c)
    res = run_suite(cases, cfg, workdir, args.repeat, None, prefix="curve-")
    points = []
    for c in cases:
        md = res[c.name]["median"]
        got = md["delivered_msg_s_per_sub"]
        points.append({"rate": c.rate, "median": md, "runs": res[c.name]["runs"],
                       "saturated": got is None or got < 0.95 * c.rate * (
                           len(c.pub_at) if c.kind == "router" else 1)})
    label = cases[0].shape() + (f", inter-router links {wan.text()}" if wan else "")
    out: dict[str, Any] = {"label": label, "points": points, "load_at_start": load,
                           "commit": _git_commit()}
    if args.chart is not None:
        out["chart"] = str(render_curve(out, args.chart))
    return out


def render_curve(curve: dict[str, Any], path: Path) -> Path:
    """p50, p99 and p999 against the offered rate (log-log), saturated rates marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in curve["points"] if p["median"]["ok_runs"]]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for key, style in (("p50", "o-"), ("p99", "s-"), ("p999", "^-")):
        xs = [p["rate"] for p in pts if p["median"]["latency_ms"][key] is not None]
        ys = [p["median"]["latency_ms"][key] for p in pts if p["median"]["latency_ms"][key] is not None]
        ax.plot(xs, ys, style, label=key)
    sat = [p["rate"] for p in pts if p["saturated"]]
    if sat:
        ax.axvspan(min(sat), max(p["rate"] for p in pts), color="#f4cccc", alpha=0.5, label="saturated")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered rate, msg/s per publisher")
    ax.set_ylabel("publish -> hand-over, ms (worst subscriber)")
    code = f"code {curve['commit']}, " if curve.get("commit") else ""
    ax.set_title(f"{curve['label']}\n{code}load average at start {curve.get('load_at_start')}, "
                 f"{os.cpu_count()} cores", fontsize="medium")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _topology_ids(path: Path) -> list[str]:
    from ..topology.load import load_topology

    return sorted(load_topology(path).routers)


def _placement(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The routers of --topology the publishers and subscribers connect to (--pub-at: default the
    first router, one per publisher; --sub-at: default every router); a router not in it is an error."""
    ids = _topology_ids(args.topology)
    pub_at = args.pub_at.split(",") if args.pub_at else [ids[0]] * args.publishers
    sub_at = args.sub_at.split(",") if args.sub_at else list(ids)
    for r in [*pub_at, *sub_at]:
        if r not in ids:
            raise SystemExit(f"oncemesh bench: router {r!r} is not in {args.topology} ({', '.join(ids)})")
    return pub_at, sub_at


def _mqtt_text(mq: dict[str, Any], t: dict[str, Any], title: str) -> list[str]:
    """The MQTT cases beside the AMQP 1:1 case: rates, server CPU per message, ratios per round."""
    ref = mq.get("reference")
    rows = [["case", "delivered msg/s", "server CPU-us/msg", "msg/s / AMQP", "CPU / AMQP", "QoS 1 duplicates", "ok"]]
    if ref in t:
        md = t[ref]["median"]
        rows.append([t[ref]["label"] + " [AMQP]", _fmt(md["delivered_msg_s_per_sub"]),
                     _fmt(md["server_cpu_us_per_msg_hop"], 1), "1", "1", "", _ok_text(md)])
    for c in mq["cases"].values():
        rows.append([c["label"], _fmt(c["delivered_msg_s_per_sub"]), _fmt(c["server_cpu_us_per_msg"], 1),
                     _fmt(c["msg_s_ratio"], 3), _fmt(c["cpu_ratio"], 3),
                     _fmt(c["duplicates"]) if c.get("qos") == 1 else "", f"{c['ok_runs']}/{c['runs']}"
                     + ("" if c["ok_runs"] else " FAILED")])
    head = f"{title}; ratios to the AMQP case of the same round, median over the rounds)"
    if ref is None:
        head += ": no AMQP 1:1 case in this run, no ratios"
    return [head, _table(rows), ""]


def _ok_text(md: dict[str, Any]) -> str:
    """Runs that succeeded; a case with none is FAILED (and has no figures: see median_of)."""
    return f"{md['ok_runs']}/{md['runs']}" + ("" if md["ok_runs"] else " FAILED")


def _fmt(v: Any, nd: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float | int):
        return f"{v:,.{nd}f}"
    return str(v)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                     for r in rows)


def format_report(rep: dict[str, Any]) -> str:
    sc = rep["scenario"]
    m = rep["machine"]
    amount = f"{sc['count']} messages per publisher" if sc["count"] else f"{sc['duration']:g} s per run"
    lines = [f"oncemesh bench: {sc['mode']}, {sc['size']}-byte messages, {amount}, median of {rep['repeat']} "
             f"(cases interleaved in each round)" + (f", topics in {sc['order']} order" if sc.get("order") and
                                                    sc["order"] != "fifo" else ""),
             f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, Proton {m['proton']}, "
             f"Linux {m['kernel']}" + (f", RabbitMQ {m['rabbitmq']}" if m.get("rabbitmq") else "")
             + (f", Mosquitto {m['mosquitto']}" if m.get("mosquitto") else "")
             + f"; load at start {m['loadavg_at_start']}" + (f"; code {m['commit']}" if m.get("commit") else ""),
             f"clients: {rep['clients']}", ""]
    for note in rep.get("notes", []):
        lines.append(f"note: {note}")
    head = ["case", "published msg/s", "delivered msg/s/sub", "server CPU-us/msg/hop", "server CPU %",
            "peak RSS MB", "pub / sub CPU-us/msg", "wire msgs/msg", "ok"]

    def rows_of(section: dict[str, Any]) -> list[list[str]]:
        rows = [head]
        for c in section.values():
            md = c["median"]
            rows.append([c["label"], _fmt(md["published_msg_s"]), _fmt(md["delivered_msg_s_per_sub"]),
                         _fmt(md["server_cpu_us_per_msg_hop"], 1),
                         _fmt(md["server_cpu_util"] * 100 if md["server_cpu_util"] is not None else None),
                         _fmt(md["server_peak_rss_kb"] / 1024 if md["server_peak_rss_kb"] else None, 1),
                         f"{_fmt(md['pub_cpu_us_per_msg'], 1)} / {_fmt(md['sub_cpu_us_per_msg'], 1)}",
                         _wire_text(md.get("wire_per_msg")), _ok_text(md)])
        return rows

    if rep["throughput"]:
        lines += ["throughput (unbounded rate unless stated)", _table(rows_of(rep["throughput"])), ""]
    if rep.get("mqtt"):
        lines += _mqtt_text(rep["mqtt"], rep["throughput"], "MQTT beside AMQP (1:1")
    if rep.get("mqtt_at_rate"):
        lines += _mqtt_text(rep["mqtt_at_rate"], rep["latency"],
                            f"MQTT beside AMQP at {sc['latency_rate']:g} msg/s (the latency pass, 1:1")
    if rep.get("latency"):
        rows = [["case", "p50 ms", "p99 ms", "p999 ms", "max ms", "delivered msg/s/sub", "server CPU-us/msg/hop", "ok"]]
        for c in rep["latency"].values():
            md = c["median"]
            lat = md["latency_ms"]
            rows.append([c["label"], _fmt(lat["p50"], 3), _fmt(lat["p99"], 3), _fmt(lat["p999"], 3), _fmt(lat["max"], 3),
                         _fmt(md["delivered_msg_s_per_sub"]), _fmt(md["server_cpu_us_per_msg_hop"], 1), _ok_text(md)])
            for e in md.get("latency_by_sub") or []:
                rows.append([f"  subscriber at {e['at']}", _fmt(e["p50"], 3), _fmt(e["p99"], 3), _fmt(e["p999"], 3),
                             _fmt(e["max"], 3), "", "", ""])
        lines += ["latency, publish -> hand-over (worst subscriber of each run; median of runs)", _table(rows), ""]
        lines += _links_text(rep["latency"])
    if rep["throughput"]:
        lines += _links_text(rep["throughput"])
    curve = rep.get("latency_curve")
    if curve:
        rows = [["offered msg/s", "delivered msg/s/sub", "p50 ms", "p99 ms", "p999 ms", "max ms",
                 "server CPU-us/msg/hop", "ok"]]
        for pt in curve["points"]:
            md = pt["median"]
            lat = md["latency_ms"]
            rows.append([_fmt(pt["rate"]) + (" (saturated)" if pt.get("saturated") else ""),
                         _fmt(md["delivered_msg_s_per_sub"]), _fmt(lat["p50"], 3), _fmt(lat["p99"], 3),
                         _fmt(lat["p999"], 3), _fmt(lat["max"], 3), _fmt(md["server_cpu_us_per_msg_hop"], 1),
                         _ok_text(md)])
        lines += [f"latency curve: {curve['label']} (worst subscriber; median of runs)", _table(rows)]
        if curve.get("chart"):
            lines.append(f"chart: {curve['chart']}")
        lines.append("")
    if rep.get("ratios"):
        lines.append("ratios (delivered msg/s per subscriber, same run): " + ", ".join(
            f"{k} = {_fmt(v, 3)}" for k, v in rep["ratios"].items()))
        lines.append("")
    so = rep.get("scale_out")
    if so:
        rows = [["case", "aggregate delivered msg/s", "per sub (min)", "router CPU-us/msg/hop", "routers CPU %", "ok"]]
        for c in so["cases"].values():
            md = c["median"]
            rows.append([c["label"], _fmt(md["delivered_msg_s_total"]), _fmt(md["delivered_msg_s_min_sub"]),
                         _fmt(md["server_cpu_us_per_msg_hop"], 1),
                         _fmt(md["server_cpu_util"] * 100 if md["server_cpu_util"] is not None else None),
                         _ok_text(md)])
        lines += ["scale-out", _table(rows)]
        if so.get("hop_ratios"):
            lines.append("CPU per message per hop / the 1 router's (median of per-round ratios): " + ", ".join(
                f"{so['cases'][k]['label'].split(':')[0]} {_fmt(v, 2)}" for k, v in so["hop_ratios"].items()))
        lines.append("")
    mem = rep.get("memory")
    if mem:
        c = mem.get("connections", {})
        h = mem.get("held_messages", {})
        if c:
            lines.append(f"connections: held {c['held']}/{c['requested']} idle client connections "
                         f"(router counted {c['router_counted']}); {_fmt(c['kb_per_1000'])} KB per 1,000; router CPU "
                         f"{_fmt(c['router_cpu_share_while_held'] * 100, 1)}% while holding them; traffic while held: "
                         f"{'ok' if c['traffic_while_held'].get('ok') else 'FAILED'} "
                         f"({_fmt(c['traffic_while_held'].get('msg_s'))} msg/s)")
        if h:
            lines.append(f"held messages: {h['held']} unsettled {h['size']}-byte messages for a suspended "
                         f"subscriber: {_fmt(h['kb_per_10000'])} KB per 10,000 ({_fmt(h['bytes_per_message'])} B each)")
        lines.append("")
    prof = rep.get("profile")
    if prof:
        if prof.get("self"):
            lines.append(f"router profile (py-spy, {prof['samples']} samples; run: "
                         f"{_fmt(prof['run'].get('delivered_msg_s_per_sub'))} msg/s, "
                         f"{prof['run'].get('server_cpu_us_per_msg_hop')} CPU-us/msg)")
            rows = [["self %", "function"]] + [[f"{p:.1f}", f] for f, p in prof["self"]]
            lines += [_table(rows), ""]
            rows = [["inclusive %", "function"]] + [[f"{p:.1f}", f] for f, p in prof["inclusive"]]
            lines += [_table(rows), ""]
        else:
            lines += [f"profile: {prof.get('error')}", ""]
    ins = rep.get("instructions")
    if ins:
        if "per_message" in ins:
            lines += [f"router instructions per message (callgrind, 1:1 exactly-once, runs of "
                      f"{ins['messages'][0]:,} and {ins['messages'][1]:,} messages"
                      + (f" at {ins['rate']:g} msg/s" if ins.get("rate") else "") + f"): {ins['per_message']:,}"
                      + (f" ({ins['per_message_loop']:,} on the event loop's thread, {ins['per_message_workers']:,} "
                         f"on worker threads: the status file's writer, the settlement log's compression)" if "per_message_loop" in ins else "")
                      + (f"; {ins['passes_per_message']:g} loop passes per message" if "passes_per_message" in ins
                         else ""), ""]
            f = ins.get("fanout")
            if f and "per_delivery" in f:
                lines += [f"router instructions, 1 pub -> router -> {f['subscribers']} subs (each its own durable "
                          f"subscription, same runs' sizes): {f['per_message']:,} per message, {f['per_delivery']:,} "
                          f"per delivery; per delivery / 1:1 message: {ins.get('fanout_delivery_ratio')}", ""]
            elif f:
                lines += [f"fan-out instructions: {f.get('error')}", ""]
            m = ins.get("mesh")
            if m and "per_message_hop" in m:
                lines += [f"mesh instructions per message per hop (every router under callgrind, pubs at "
                          f"{','.join(m['pub_at'])}, subs at {','.join(m['sub_at'])}, {m['hops']} hops, same runs' "
                          f"sizes): {m['per_message_hop']:,} ({m['per_message']:,} per message); per hop / 1:1 router: "
                          f"{ins.get('mesh_hop_ratio')}", ""]
            elif m:
                lines += [f"mesh instructions: {m.get('error')}", ""]
        else:
            lines += [f"instructions: {ins.get('error')}", ""]
    if rep.get("topic_match"):
        lines += _topic_match_text(rep["topic_match"])
    if rep.get("targets"):
        lines.append("targets")
        for t in rep["targets"]:
            lines.append(f"  {'MET ' if t['met'] else 'NOT '} {t['target']}: {_fmt(t['value'], 2)}")
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------- CLI
def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", help="measure throughput, latency, CPU and memory against baselines",
        description="Benchmark a router (or a topology) with client processes, side by side with a direct\n"
                    "sender->receiver link, a naive proton.reactor.Container relay and RabbitMQ (AMQP 1.0).\n"
                    "Default: exactly-once, 100-byte messages, 1 publisher -> router -> 2 subscribers,\n"
                    "3 s per run, median of 3, plus a latency pass at 2,000 msg/s.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n"
               "  oncemesh bench                                 # the default scenario and baselines\n"
               "  oncemesh bench --json > bench.json\n"
               "  oncemesh bench --topology topology/examples/line3.toml --pub-at A --sub-at C,C\n"
               "  oncemesh bench --scale-out --memory --profile 3  # everything of docs/performance.md\n"
               "  oncemesh bench --mqtt --subscribers 1 --baselines mosquitto  # MQTT beside AMQP, and Mosquitto")
    p.add_argument("--mode", choices=MODES, default="exactly-once",
                   help="the publishers' delivery guarantee (default exactly-once)")
    p.add_argument("--size", type=int, default=100, help=f"encoded message size in bytes (>= {MIN_SIZE})")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--duration", type=float, default=3.0, help="seconds each publisher sends (default 3)")
    g.add_argument("--count", type=int, default=0, help="messages per publisher instead of --duration")
    p.add_argument("--rate", type=float, default=0.0, help="msg/s per publisher for the throughput cases "
                                                            "(default 0: unbounded)")
    p.add_argument("--latency-rate", type=float, default=2000.0,
                   help="msg/s per publisher of the latency pass (0: no latency pass; default 2000)")
    p.add_argument("--publishers", type=int, default=1, help="publisher processes (default 1)")
    p.add_argument("--subscribers", type=int, default=2, help="subscriber processes (default 2)")
    p.add_argument("--topology", type=Path, default=None, help="run the scenario on this topology (TOML)")
    p.add_argument("--shared", action="store_true",
                   help="the subscribers are the members of one shared subscription (each message to one of "
                        "them, work split by credit) instead of each having its own; the 1:1 case runs beside "
                        "it; the members must together get each message once")
    p.add_argument("--pub-at", default=None, help="router ids of the publishers, comma-separated "
                                                   "(default: --publishers at the first router)")
    p.add_argument("--sub-at", default=None, help="router ids of the subscribers (default: one per router)")
    p.add_argument("--baselines", default="direct,container,rabbitmq",
                   help="comma-separated: direct, container, rabbitmq, mosquitto ('' for none; mosquitto: MQTT 5 "
                        "QoS 2 1:1 through Mosquitto, with the MQTT load clients)")
    p.add_argument("--install-baselines", action="store_true",
                   help="first install the Debian packages of the chosen baselines that are missing (rabbitmq: "
                        "rabbitmq-server, mosquitto: mosquitto; apt-get, as root); the bench runs its own broker "
                        "process either way and never touches a system service")
    p.add_argument("--mqtt", action="store_true",
                   help="also: MQTT 5 QoS 2 and QoS 1, 1 pub -> router -> 1 sub through the router's MQTT listener "
                        "(harness/mqttload.py clients), beside the AMQP 1:1 case, with their ratios to it; a QoS 2 "
                        "duplicate or a missing message fails the run (add --baselines mosquitto to compare)")
    p.add_argument("--mqtt-window", type=int, default=MQTT_WINDOW,
                   help=f"MQTT publishers: PUBLISHes unanswered at most (default {MQTT_WINDOW}; never more than the "
                        "CONNACK's Receive Maximum)")
    p.add_argument("--repeat", type=int, default=3, help="rounds; figures are medians (default 3)")
    p.add_argument("--warmup", type=float, default=0.5, help="seconds excluded from rates and latency")
    p.add_argument("--window", type=int, default=1000, help="publisher: max messages without outcome")
    p.add_argument("--credit", type=int, default=1000, help="subscriber link credit")
    p.add_argument("--tls", action="store_true",
                   help="also: the 1:1 router case with client TLS, and (with --topology) the mesh without "
                        "inter-router TLS, each beside its twin in the same run (the cost of TLS)")
    p.add_argument("--order", choices=("fifo", "causal", "total", "lamport"), default="fifo",
                   help="with --topology: the order of the run's topics (causal: the bench's publishers and "
                        "subscribers are separate clients, so no message gets a dependency; total: by the "
                        "sequencer; lamport: total by Lamport clocks; default fifo)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="router setting for every router of the run (repeatable; on a topology over its "
                        "[defaults], under each router's own settings)")
    p.add_argument("--scale-out", action="store_true", help="also: 1, 2, 4 routers in a full mesh, and the "
                                                           "line3 fan-out")
    p.add_argument("--scale-placement", choices=("next", "local"), default="next",
                   help="scale-out: subscriber of topic i at the next router (default) or the same one")
    p.add_argument("--memory", action="store_true", help="also: memory per idle connection and per held "
                                                        "message, and --connections held at once")
    p.add_argument("--connections", type=int, default=5000, help="idle connections to hold (default 5000)")
    p.add_argument("--held-messages", type=int, default=10_000,
                   help="--memory: messages held for a suspended subscription (default 10000)")
    p.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                   help="also: py-spy profile of the router under 1:1 load for SECONDS")
    p.add_argument("--instructions", type=int, default=0, metavar="N",
                   help="also: instructions the router executes per message (1:1 exactly-once), counted by "
                        "valgrind's callgrind over N and 6N messages (repeatable on a noisy machine: use it "
                        "to compare versions; 2000 takes ~2 min); with --topology also every router of that "
                        "scenario, per message per hop, and its ratio to the 1:1 router (the cost of a mesh hop)")
    p.add_argument("--instructions-fanout", type=int, default=0, metavar="K",
                   help="with --instructions: also a 1 -> K fan-out through one router (K subscribers, each its own "
                        "durable subscription of the topic) under callgrind, its instructions per message and per "
                        "delivery, and per delivery / the 1:1 message (1.0: a delivery costs a whole message)")
    p.add_argument("--instructions-rate", type=float, default=0.0, metavar="MSG_S",
                   help="the publisher's rate in the --instructions runs (default 0: as fast as it goes, large "
                        "batches; e.g. 40: about one message per loop pass under callgrind, the moderate-rate regime)")
    p.add_argument("--no-main", action="store_true", help="skip the scenario and its baselines (run only "
                                                        "--scale-out / --memory / --profile / --instructions / "
                                                        "--latency-curve / --topic-match)")
    p.add_argument("--topic-match", action="store_true",
                   help="also: the topic index's matching cost per message (CPU-us per match with 1, 1,000 and "
                        "100,000 wildcard and literal subscriptions), its build time and memory; in-process, "
                        "a few seconds")
    p.add_argument("--latency-curve", default=None, metavar="RATES",
                   help="also: the scenario's latency at each of these rates (msg/s per publisher, comma-"
                        "separated, e.g. 250,500,1000,2000,4000,8000,16000), up to saturation")
    p.add_argument("--chart", type=Path, default=None, metavar="PNG",
                   help="with --latency-curve: draw it (p50/p99/p999 against the rate) into this PNG")
    p.add_argument("--wan", default=None, metavar="DELAY[,JITTER[,LOSS[,RATE]]]",
                   help="with --topology: every inter-router link runs through a proxy that behaves like a "
                        "WAN link, e.g. 20ms,5ms,0.1%% (one-way delay, jitter, lost TCP segments; RATE in "
                        "bytes/s each way, e.g. 10M); the same mesh on plain links runs beside it (mesh-lan); "
                        "traffic per link and latency per subscriber are reported")
    p.add_argument("--trace", action="store_true",
                   help="subscribers write each message's send time and latency to subJ.trace in the run's "
                        "directory (use with --workdir)")
    p.add_argument("--json", action="store_true", help="print JSON only (progress goes to stderr)")
    p.add_argument("--workdir", type=Path, default=None, help="keep run directories here (default: temporary)")
    p.set_defaults(func=cmd_bench, scale_routers=(1, 2, 4), line3=True)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.size < MIN_SIZE:
        print(f"oncemesh bench: --size must be at least {MIN_SIZE}", file=sys.stderr)
        return 2
    if args.topology is None and (args.pub_at or args.sub_at):
        print("oncemesh bench: --pub-at/--sub-at need --topology", file=sys.stderr)
        return 2
    if args.wan and args.topology is None:
        print("oncemesh bench: --wan needs --topology (it shapes the inter-router links)", file=sys.stderr)
        return 2
    if args.instructions_fanout and (not args.instructions or args.instructions_fanout < 2):
        print("oncemesh bench: --instructions-fanout K needs --instructions and K of at least 2", file=sys.stderr)
        return 2
    if args.chart is not None and not args.latency_curve:
        print("oncemesh bench: --chart draws the --latency-curve", file=sys.stderr)
        return 2
    if args.chart is not None:
        from ..spark import chart as spark_chart

        if not spark_chart.available():
            print("oncemesh bench: --chart needs matplotlib (pip install 'oncemesh[chart]')", file=sys.stderr)
            return 2
    try:
        wan = parse_wan(args.wan) if args.wan else None
    except ValueError as exc:
        print(f"oncemesh bench: {exc}", file=sys.stderr)
        return 2
    settings = dict(kv.split("=", 1) for kv in args.set)
    cfg = Settings(mode=args.mode, size=args.size, duration=0.0 if args.count else args.duration,
                   count=args.count, warmup=args.warmup, window=args.window, credit=args.credit,
                   router_settings=settings, order=args.order, trace=args.trace, mqtt_window=args.mqtt_window)
    fd = raise_fd_limit()
    with _workdir(args.workdir) as workdir:
        cases, lat_cases, notes = throughput_cases(args) if not args.no_main else ([], [], [])
        report: dict[str, Any] = {
            "version": JSON_VERSION, "machine": machine_info(), "clients": CLIENTS_NOTE, "repeat": args.repeat,
            "scenario": {"mode": args.mode, "size": args.size, "duration": cfg.duration, "count": cfg.count,
                         "rate": args.rate, "latency_rate": args.latency_rate, "publishers": args.publishers,
                         "subscribers": args.subscribers, "topology": str(args.topology) if args.topology else None,
                         "order": args.order,
                         "wan": dataclasses.asdict(wan) if wan else None,
                         "warmup": args.warmup, "window": args.window, "credit": args.credit,
                         "router_settings": settings, "fd_limit": fd[0],
                         "mqtt": args.mqtt, "mqtt_window": args.mqtt_window},
            "notes": notes, "throughput": {}, "latency": {}, "ratios": {}}
        rabbit: RabbitMQ | None = None
        try:
            if any(c.kind == "rabbitmq" for c in cases + lat_cases):
                log("starting RabbitMQ (private node on loopback)")
                try:
                    rabbit = RabbitMQ(workdir / "rabbitmq")
                except BenchError as exc:
                    notes.append(f"RabbitMQ skipped: could not start it: {str(exc)[:300]}")
                    cases = [c for c in cases if c.kind != "rabbitmq"]
                    lat_cases = [c for c in lat_cases if c.kind != "rabbitmq"]
            report["throughput"] = run_suite(cases, cfg, workdir, args.repeat, rabbit)
            if lat_cases:
                report["latency"] = run_suite(lat_cases, cfg, workdir, args.repeat, rabbit, prefix="lat-")
        finally:
            if rabbit is not None:
                rabbit.stop()
        t = report["throughput"]
        main_name = next(iter(t), None)
        one = "router-1:1" if "router-1:1" in t else ("router" if "router" in t else None)

        def per_sub(name: str | None) -> float | None:
            return t[name]["median"]["delivered_msg_s_per_sub"] if name in t else None

        if "router-1:1-alo" in t and "rabbitmq" in t:
            report["ratios"]["router-1:1-alo / rabbitmq"] = ratio(per_sub("router-1:1-alo"), per_sub("rabbitmq"))
        for base in ("direct", "container", "rabbitmq"):
            if base in t and main_name and main_name != base:
                report["ratios"][f"{main_name} / {base}"] = ratio(per_sub(main_name), per_sub(base))
                if one and one != main_name:
                    report["ratios"][f"{one} / {base}"] = ratio(per_sub(one), per_sub(base))
        mq = mqtt_section(t, one)
        if mq is not None:
            report["mqtt"] = mq  # (its ratios to the AMQP case are per round: they are not repeated in "ratios")
            if "mosquitto" in t:
                for name in ("mqtt-qos2-1:1", one):
                    if name in t:
                        report["ratios"][f"{name} / mosquitto"] = ratio(per_sub(name), per_sub("mosquitto"))
        lat = report["latency"]
        one_lat = "router@rate" if one == "router" and "router@rate" in lat else None  # (a 1:1 scenario)
        mq_lat = mqtt_section(lat, one_lat) if lat else None
        if mq_lat is not None:  # the same at the latency pass's fixed rate: CPU per message in one regime
            report["mqtt_at_rate"] = mq_lat
        if args.scale_out:
            report["scale_out"] = scale_out(args, cfg, workdir)
        if args.memory:
            report["memory"] = memory_suite(args, cfg, workdir)
        if args.profile:
            report["profile"] = profile_router(args, cfg, workdir)
        if args.instructions:
            report["instructions"] = instructions_suite(args, cfg, workdir)
        if args.topic_match:
            log("topic matching: 1, 1,000 and 100,000 subscriptions")
            report["topic_match"] = topic_match_suite()
        if args.latency_curve:
            report["latency_curve"] = latency_curve(args, cfg, workdir)
        report["targets"] = targets(report)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report), end="")
    bad = [name for sec in ("throughput", "latency") for name, c in report[sec].items() if not c["median"]["ok_runs"]]
    return 1 if bad else 0


@contextlib.contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="oncemesh-bench-") as d:
        yield Path(d)


def main(argv: list[str] | None = None) -> int:
    """`python -m oncemesh.harness.bench relay --ready FILE`: the Container relay process (internal)."""
    p = argparse.ArgumentParser(prog="python -m oncemesh.harness.bench")
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("relay", help="run the naive Container relay (used by oncemesh bench)")
    r.add_argument("--ready", type=Path, required=True)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return run_container_relay(args.ready)


if __name__ == "__main__":
    sys.exit(main())
