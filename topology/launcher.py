"""The local launcher: a whole mesh as router processes on this machine (`oncemesh up/status/down`).

Tests, the chaos runner and operators share this code. Theory of operation:

- Everything lives in one state directory (default `./oncemesh-state`):
  `mesh.json` (what the launcher started: topology, and per router its pid, process start time,
  last client address), `routers/ID/` (each router's --state-dir), `logs/` (settlement and router
  logs, and `ID.out`, the router's stdout/stderr), `status/ID.json` (each router's ready file,
  which its peers also read to find each other's ports).
- Routers run in their own session (`start_new_session`), so they outlive `oncemesh up` and a
  Ctrl-C in its terminal. Any process can then read `mesh.json` to report status or stop them.
- A pid is only ever signalled after checking that it is still the process we started: same
  kernel start time (/proc/PID/stat) and a command line with this router's id and ready file.
  Pids are reused; a stale `mesh.json` must never make us kill a stranger. (Linux: needs /proc.)
- Waiting is always against a deadline, polling the ready files.
- A router restarted from a topology that gives it port 0 gets its previous client port back
  (`--listen`), so that clients holding its URL reconnect to it; if that port was taken meanwhile,
  it starts on a fresh port instead.
- With `proxies=True` every inter-router link runs through a fault-injecting proxy
  (`topology.proxy`) owned by this `Mesh` object, so that links can be cut, blackholed or delayed
  (partitions). Each router then gets its own peers directory, `peers/ID/`, whose `PEER.json` names
  the proxy's address (and the peer's pid, which the router checks is alive) for every neighbour it
  dials; the proxy finds the real listener at each accept from `status/PEER.json`, so a listener
  that restarts on a new port is still reached. It needs inter-router ports 0 in the topology (a
  fixed port is dialed directly). The proxies live in this process: when it exits, proxied links
  go down, and only this object may start routers of that mesh.
- With `client_tls=True` (`oncemesh up --client-tls`, remembered in `mesh.json`) every router whose
  topology names no `tls_cert` gets a client-listener certificate from a client CA made in
  `client-tls/` (common/pki.py, `make_client_pki`; never the mesh CA), passed with `--set tls_cert=...`,
  and `tls_ca` = that CA where the topology asks for client certificates and names no CA of its own.
  Its URLs are then amqps://, and `client_tls_hint` says which files clients pass (`--ca`, and
  `--cert`/`--key` for certificates made with `make_client_cert`).
- A drain (`drain_router`, `oncemesh drain`) is the router's own work (SIGUSR1, router/drain.py):
  the launcher signals it, shows its progress from the ready file, waits for the exit and reads the
  report the router left (`ID.drain.json`). A rolling restart (`roll`, `oncemesh roll`) drains,
  restarts and waits for convergence, one router after another.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import networkx as nx

from .load import TopologyError, load_topology, parse_topology
from .model import LinkSpec, Topology, TotalOrder
from .proxy import Mode, ProxyHub, ProxyStats

DEFAULT_STATE_DIR = Path("oncemesh-state")
STATE_DIR_ENV = "ONCEMESH_STATE_DIR"
POLL_INTERVAL = 0.02  # seconds between looks at ready files / processes while waiting on a deadline
STATE_VERSION = 1


class MeshError(Exception):
    """The launcher cannot do what was asked (a router would not start, the mesh did not converge,
    the state directory belongs to another mesh). The message says what to look at."""


class RouterStartError(MeshError):
    """A router exited while starting; `tail` holds the end of its output."""

    def __init__(self, router_id: str, message: str, tail: str) -> None:
        self.router_id = router_id
        self.tail = tail
        super().__init__(message + ("\n" + tail if tail else ""))


class RouterState(StrEnum):
    STOPPED = "stopped"  # never started here, or stopped by the launcher
    STARTING = "starting"  # the process runs but has not written its ready file yet
    RUNNING = "running"
    FROZEN = "frozen"  # SIGSTOPped (see Mesh.freeze)
    DRAINING = "draining"  # moving its clients away before it exits (see Mesh.drain_router)
    DEAD = "dead"  # it was started and is gone without the launcher stopping it (crash, SIGKILL)


class StopOutcome(StrEnum):
    STOPPED = "stopped"  # exited after SIGTERM
    KILLED = "killed"  # did not exit within the timeout: SIGKILLed
    NOT_RUNNING = "not running"


@dataclass(frozen=True, slots=True)
class RouterStatus:
    id: str
    state: RouterState
    pid: int | None = None
    url: str | None = None
    listen: str | None = None
    inter_router: str | None = None
    incarnation: str | None = None
    peers: tuple[str, ...] = ()
    converged: bool = False
    started: float | None = None  # wall-clock time the launcher started it
    order: dict[str, Any] | None = None  # per total-order topic: its sequencer as this router sees it
    loop_lag_ms: tuple[float, float] | None = None  # event-loop lag, max and p99 of the last minute
    log_blocked: str | None = None  # why the settlement log cannot be written (no publisher credit)
    http: str | None = None  # HOST:PORT of /metrics, /healthz, /readyz (with http_listen)
    mqtt: str | None = None  # HOST:PORT of its MQTT listener (with mqtt_listen; docs/mqtt.md)

    @property
    def alive(self) -> bool:
        return self.state in (RouterState.STARTING, RouterState.RUNNING, RouterState.FROZEN, RouterState.DRAINING)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        d["peers"] = list(self.peers)
        d["alive"] = self.alive
        return d


@dataclass(frozen=True, slots=True)
class DrainResult:
    """How one router's drain went (from the report the router leaves, `ID.drain.json`)."""

    id: str
    outcome: str  # "drained", "timed out" (it exited all the same), "killed" (it did not exit), "no report"
    seconds: float  # from the signal to the exit, as the launcher saw it
    redirected: int = 0  # client connections the router told to move
    remaining: dict[str, int] = field(default_factory=dict)  # what still depended on it when it exited
    dependents: dict[str, int] = field(default_factory=dict)  # every count it reported at the end
    restart_seconds: float | None = None  # a rolling restart: from the exit until the mesh converged again

    @property
    def clean(self) -> bool:
        return self.outcome == "drained"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        text = f"{self.id}: {self.outcome} in {self.seconds:.2f} s, {self.redirected} client connection(s) redirected"
        if self.remaining:
            text += "; still depending on it: " + ", ".join(f"{k} {v}" for k, v in self.remaining.items())
        if self.restart_seconds is not None:
            text += f"; restarted, mesh converged {self.restart_seconds:.2f} s after the exit"
        return text


def drain_process(router_id: str, pid: int, ready_file: Path, report: Path | None, timeout: float,
                  alive: Callable[[], bool], say: Callable[[str], None] | None = None) -> DrainResult:
    """Drain one router process (SIGUSR1), follow it in its ready file, wait until it exits, and read
    its report. One that has not exited after `timeout` is stopped (SIGTERM, SIGKILL): `killed`."""
    started = time.monotonic()
    os.kill(pid, signal.SIGUSR1)
    last = ""
    while alive():
        info = _read_json(ready_file)
        status = info.get("draining") if info and info.get("pid") == pid else None
        if isinstance(status, dict):
            if status.get("report"):
                report = Path(status["report"])
            line = (f"{router_id}: {status.get('phase')}, {status.get('redirected', 0)} redirected; waiting for "
                    + (", ".join(f"{k} {v}" for k, v in (status.get("waiting_for") or {}).items()) or "nothing"))
            if say is not None and line != last:
                say(line)
            last = line
        if time.monotonic() - started > timeout:
            for sig in (signal.SIGTERM, signal.SIGCONT, signal.SIGKILL):
                if not alive():
                    break
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                _until(lambda: not alive(), 5.0 if sig != signal.SIGCONT else 0.0)
            return DrainResult(router_id, "killed", round(time.monotonic() - started, 3))
        time.sleep(POLL_INTERVAL)
    took = round(time.monotonic() - started, 3)
    rep = _read_json(report) if report is not None else None
    if not rep or rep.get("pid") != pid:
        result = DrainResult(router_id, "no report", took)
    else:
        result = DrainResult(router_id, str(rep.get("outcome")), took, int(rep.get("redirected", 0)),
                             dict(rep.get("remaining") or {}), dict(rep.get("dependents") or {}))
    if say is not None:
        # always the end, from the report: a quick drain exits before a poll of its status sees it
        say(result.describe())
    return result


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _until(pred: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)
    return True


@dataclass(frozen=True, slots=True)
class _Proc:
    state: str  # the kernel's one-letter state: R, S, T, Z, ...
    start: int  # start time in clock ticks since boot: with the pid, names one process
    cmdline: tuple[str, ...]


def _proc(pid: int) -> _Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may contain spaces and ')'
    return _Proc(fields[0], int(fields[19]), tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a))


def _tail(path: Path, offset: int = 0, lines: int = 30) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


class Mesh:
    """The routers of one topology, run as local processes under `state_dir`.

    Safe to use from several processes: changes to `mesh.json` are made under a file lock.
    """

    def __init__(self, topology_path: str | Path, state_dir: str | Path = DEFAULT_STATE_DIR, *,
                 topology: Topology | None = None, proxies: bool = False, insecure_mesh: bool = False,
                 client_tls: bool | None = None, wrap: Callable[[str], list[str]] | None = None) -> None:
        self.topology_path = Path(topology_path).resolve()
        # a command each router runs under (its id -> the argv in front; measurements: callgrind)
        self.wrap = wrap
        # without TLS files named in the topology, the routers get a private CA made in tls_dir
        self.insecure_mesh = insecure_mesh
        self.topology = topology if topology is not None else load_topology(self.topology_path)
        self.state_dir = Path(state_dir).resolve()
        # client listeners with certificates made in client_tls_dir (None: as this state dir was last started)
        self.client_tls = bool(self._load_state().get("client_tls", False)) if client_tls is None else client_tls
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # pid -> process started by this object
        self._exit_codes: dict[int, int] = {}  # pid -> exit code, for children that have exited
        self.proxies: ProxyHub | None = None  # the link proxies, with proxies=True (see _ensure_proxies)
        self._proxy_id = uuid.uuid4().hex if proxies else None  # names this object's proxies in mesh.json
        if proxies:
            fixed = sorted(r.id for r in self.topology.routers.values() if r.inter_port)
            if fixed:
                raise MeshError(f"proxied links need inter-router ports 0 in the topology; "
                                f"{', '.join(fixed)} have fixed ones ({self.topology_path})")
        recorded = self._load_state().get("topology")
        if recorded and Path(recorded) != self.topology_path:
            running = [s.id for s in self.status() if s.alive]
            if running:
                raise MeshError(f"{self.state_dir} holds a running mesh started from {recorded} "
                                f"(routers {', '.join(running)}); stop it first (oncemesh down --state-dir "
                                f"{self.state_dir}) or use another --state-dir")

    def __enter__(self) -> Mesh:
        return self

    def __exit__(self, *exc: object) -> None:
        """`with Mesh(...) as mesh:` stops every router on the way out, also when a test fails."""
        self.down()

    @classmethod
    def open(cls, state_dir: str | Path = DEFAULT_STATE_DIR) -> Mesh:
        """The mesh last started in `state_dir`. Works even when its topology file has since been
        edited into an invalid state or deleted (it uses the copy recorded at start), so that
        `status` and `down` always work."""
        state_path = Path(state_dir).resolve() / "mesh.json"
        try:
            st = json.loads(state_path.read_text())
        except FileNotFoundError:
            raise MeshError(f"no mesh in {Path(state_dir).resolve()} (start one with: oncemesh up FILE "
                            f"--state-dir {state_dir})") from None
        except (OSError, ValueError) as exc:
            raise MeshError(f"cannot read {state_path}: {exc}") from None
        path = Path(st.get("topology", ""))
        try:
            topo = load_topology(path)
        except TopologyError:
            if "topology_text" not in st:
                raise
            topo = parse_topology(st["topology_text"], f"{path} (as recorded in {state_path})")
        return cls(path, state_dir, topology=topo, insecure_mesh=bool(st.get("insecure_mesh", False)),
                   client_tls=bool(st.get("client_tls", False)))

    # ------------------------------------------------------------------ paths
    @property
    def status_dir(self) -> Path:
        return self.state_dir / "status"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    def ready_file(self, router_id: str) -> Path:
        return self.status_dir / f"{router_id}.json"

    def out_file(self, router_id: str) -> Path:
        return self.log_dir / f"{router_id}.out"

    def peers_dir(self, router_id: str) -> Path:
        """Where the router looks up the addresses of the neighbours it dials: the shared status
        directory, or with proxies its own directory naming the proxies."""
        return self.state_dir / "peers" / router_id if self._proxy_id else self.status_dir

    @property
    def tls_dir(self) -> Path:
        """The private mesh CA and router certificates `up` makes when the topology names none."""
        return self.state_dir / "tls"

    @property
    def client_tls_dir(self) -> Path:
        """The client CA, listener and client certificates `up --client-tls` makes (common/pki.py)."""
        return self.state_dir / "client-tls"

    @property
    def client_ca(self) -> Path:
        """The CA file clients trust (`--ca`) for listeners with certificates made here."""
        return self.client_tls_dir / "ca.pem"

    def _made_listener(self, router_id: str) -> bool:
        """Does this router's client listener get a certificate made here (client_tls, and the
        topology names no tls_cert for it)?"""
        return self.client_tls and "tls_cert" not in self.topology.router_settings(router_id)

    def _asks_client_certs(self, router_id: str) -> bool:
        return _yes(self.topology.router_settings(router_id).get("tls_verify_clients", False))

    def _trusts_client_ca(self, router_id: str) -> bool:
        """Does this router take client certificates from the client CA made here?"""
        return (self._made_listener(router_id) and self._asks_client_certs(router_id)
                and "tls_ca" not in self.topology.router_settings(router_id))

    def _client_tls_args(self, router_id: str) -> list[str]:
        """The `--set` arguments that give a router the client-listener files made here."""
        if not self._made_listener(router_id):
            return []
        d = self.client_tls_dir / "routers"
        args = ["--set", f"tls_cert={d / f'{router_id}.pem'}", "--set", f"tls_key={d / f'{router_id}.key'}"]
        if self._trusts_client_ca(router_id):
            args += ["--set", f"tls_ca={self.client_ca}"]  # (client certificates from make_client_cert)
        return args

    def make_client_cert(self, name: str) -> tuple[Path, Path]:
        """A client certificate and key for `name` (SASL EXTERNAL's identity: the common name) from
        the client CA, for routers that ask for client certificates (tls_verify_clients) and trust
        that CA (client_tls, no tls_ca of their own). Kept if it exists."""
        from ..common.pki import make_ca, make_client_cert  # (cryptography: loaded only when asked)

        if not self.client_tls:
            raise MeshError("client certificates come from the client CA that --client-tls makes: start the mesh "
                            "with `oncemesh up FILE --client-tls`")
        make_ca(self.client_tls_dir, "oncemesh client CA")
        try:
            return make_client_cert(self.client_tls_dir, name)
        except ValueError as exc:
            raise MeshError(str(exc)) from None

    def client_tls_hint(self, urls: list[str] | None = None) -> list[str]:
        """What a client needs for the TLS listeners of this mesh, a line each, ending in an example
        command (nothing if no router listens with TLS): the CA to trust, and a client certificate
        where routers ask for one. `up` and `status` print it."""
        tls = [rid for rid in sorted(self.topology.routers)
               if self._made_listener(rid) or "tls_cert" in self.topology.router_settings(rid)]
        if not tls:
            return []
        made = [rid for rid in tls if self._made_listener(rid)]
        own = [rid for rid in tls if not self._made_listener(rid)]
        lines: list[str] = []
        flags: list[str] = []
        if made:
            lines.append(f"client TLS at {', '.join(made)}: certificates of the CA {self.client_ca}, naming "
                         f"127.0.0.1 and localhost: clients pass --ca {self.client_ca}")
            flags += ["--ca", str(self.client_ca)]
        if own:
            lines.append(f"client TLS at {', '.join(own)}: the topology's certificates (tls_cert): clients pass "
                         f"--ca with the CA that issued them")
            flags += [] if made else ["--ca", "CA.pem"]
        asking = [rid for rid in tls if self._asks_client_certs(rid)]
        if asking:
            d = self.client_tls_dir / "users"
            users = sorted(p.stem for p in d.glob("*.pem")) if any(map(self._trusts_client_ca, asking)) else []
            if users:
                lines.append(f"{', '.join(asking)} ask for a client certificate: made for {', '.join(users)} "
                             f"({d}/NAME.pem and NAME.key)")
                flags += ["--cert", str(d / f"{users[0]}.pem"), "--key", str(d / f"{users[0]}.key")]
            else:
                how = (f"make one with `oncemesh up --state-dir {self.state_dir} --client-cert NAME`"
                       if any(map(self._trusts_client_ca, asking)) else "signed by a CA in their tls_ca")
                lines.append(f"{', '.join(asking)} ask for a client certificate: {how}")
                flags += ["--cert", "CERT.pem", "--key", "KEY.pem"]
        if any("users_file" in self.topology.router_settings(rid) for rid in tls):
            flags += ["--user", "NAME"]  # (the password from $ONCEMESH_PASSWORD or a prompt)
        urls = self.urls() if urls is None else urls
        lines.append(f"  e.g. oncemesh put TOPIC MESSAGE --url {','.join(urls) or 'URL'} {' '.join(flags)}")
        return lines

    def open_to_anonymous(self) -> bool:
        """Does the topology configure no client authentication (no users_file, tls_verify_clients
        or allow_anonymous in any router's settings)? Then `up` runs its routers open to anonymous
        clients, as a local mesh for trying things out, and says so (docs/security.md)."""
        keys = ("users_file", "tls_verify_clients", "allow_anonymous")
        return not any(k in self.topology.router_settings(rid) for rid in self.topology.routers for k in keys)

    def _own_pki(self) -> bool:
        """Do the routers use the CA made in `tls_dir` (the topology names no TLS files)?"""
        return not self.insecure_mesh and not any(
            "mesh_tls_cert" in self.topology.router_settings(rid) for rid in self.topology.routers)

    def router_command(self, router_id: str, listen: str | None = None) -> list[str]:
        """The exact command line of one router (shown in mesh.json, checked against /proc)."""
        cmd = [sys.executable, "-m", "oncemesh", "router", "--topology", str(self.topology_path),
               "--id", router_id, "--state-dir", str(self.state_dir / "routers" / router_id),
               "--log-dir", str(self.log_dir), "--ready-file", str(self.ready_file(router_id)),
               "--peers-dir", str(self.peers_dir(router_id))]
        if self.open_to_anonymous():
            cmd.append("--allow-anonymous")
        if self.insecure_mesh:
            cmd.append("--insecure-mesh")
        elif self._own_pki():
            cmd += ["--mesh-tls-dir", str(self.tls_dir)]
        cmd += self._client_tls_args(router_id)
        if listen is not None:
            cmd += ["--listen", listen]
        return cmd

    # ------------------------------------------------------------------ mesh.json
    def _load_state(self) -> dict[str, Any]:
        try:
            st: dict[str, Any] = json.loads((self.state_dir / "mesh.json").read_text())
        except (OSError, ValueError):
            st = {}
        st.setdefault("routers", {})
        return st

    def _save_state(self, st: dict[str, Any]) -> None:
        path = self.state_dir / "mesh.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(st, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """mesh.json, read under an exclusive lock and written back at the end (also after an
        error: a router started before it must stay on record)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with (self.state_dir / "mesh.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            st = self._load_state()
            try:
                yield st
            finally:
                self._save_state(st)

    def _record_topology(self, st: dict[str, Any]) -> None:
        for rid in [r for r in st["routers"] if r not in self.topology.routers]:
            if self._ours(rid, st["routers"][rid]) is None:
                del st["routers"][rid]  # of an earlier topology, and gone
        raw = self.topology_path.read_bytes()
        st.update(version=STATE_VERSION, name=self.topology.name, topology=str(self.topology_path),
                  topology_text=raw.decode("utf-8"), topology_sha256=hashlib.sha256(raw).hexdigest())

    # ------------------------------------------------------------------ processes
    def _reap(self) -> None:
        for pid, proc in list(self._children.items()):
            code = proc.poll()
            if code is not None:
                self._exit_codes[pid] = code
                del self._children[pid]

    def _ours(self, router_id: str, rec: dict[str, Any] | None) -> _Proc | None:
        """The live process recorded for `router_id`, if it is still the one we started."""
        if not rec or not rec.get("pid"):
            return None
        info = _proc(rec["pid"])
        if info is None or info.state in ("Z", "X") or info.start != rec.get("proc_start"):
            return None
        args = info.cmdline
        if not args:  # mid-exec (arguments not set up yet) or exiting: pid + start time suffice
            return info
        for flag, value in (("--id", router_id), ("--ready-file", str(self.ready_file(router_id)))):
            if not any(args[i] == flag and args[i + 1] == value for i in range(len(args) - 1)):
                return None
        return info

    def _read_ready(self, router_id: str) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = json.loads(self.ready_file(router_id).read_text())
            return info
        except (OSError, ValueError):
            return None

    def _status_of(self, router_id: str, rec: dict[str, Any] | None) -> RouterStatus:
        if not rec or not rec.get("pid"):
            return RouterStatus(router_id, RouterState.STOPPED)
        pid, started = rec["pid"], rec.get("started")
        proc = self._ours(router_id, rec)
        if proc is None:
            return RouterStatus(router_id, RouterState.DEAD, pid, started=started)
        ready = self._read_ready(router_id)
        if ready is None or ready.get("pid") != pid:
            state = RouterState.FROZEN if proc.state in ("T", "t") else RouterState.STARTING
            return RouterStatus(router_id, state, pid, started=started)
        return RouterStatus(
            router_id, RouterState.FROZEN if proc.state in ("T", "t") else
            RouterState.DRAINING if ready.get("draining") else RouterState.RUNNING, pid,
            url=ready.get("url"), listen=ready.get("listen"), inter_router=ready.get("inter_router"),
            incarnation=ready.get("incarnation"), peers=tuple(sorted(ready.get("peers", ()))),
            converged=bool(ready.get("converged")), started=started, order=ready.get("order") or None,
            loop_lag_ms=_lag_of(ready.get("stats") or {}),
            log_blocked=_log_blocked_of(ready.get("stats") or {}), http=ready.get("http"), mqtt=ready.get("mqtt"))

    def _ids(self, st: dict[str, Any]) -> list[str]:
        """The topology's routers, and any other this state dir started that still runs (e.g. one
        since removed from the file), so that `status` shows it and `down` stops it."""
        extra = {rid for rid, rec in st["routers"].items()
                 if rid not in self.topology.routers and self._ours(rid, rec) is not None}
        return sorted(set(self.topology.routers) | extra)

    def _launch(self, router_id: str, st: dict[str, Any], sticky: bool = True) -> None:
        spec = self.topology.router(router_id)
        rec = st["routers"].get(router_id) or {}
        listen = None
        if sticky and spec.port == 0:  # reuse the previous port, so that clients find it again
            old = self._read_ready(router_id) or {}
            listen = old.get("listen") or rec.get("listen")
        self.ready_file(router_id).unlink(missing_ok=True)
        for d in (self.status_dir, self.log_dir, self.state_dir / "routers" / router_id):
            d.mkdir(parents=True, exist_ok=True)
        if self._own_pki():
            from ..common.pki import make_mesh_pki  # (cryptography: loaded only when a mesh starts)

            make_mesh_pki(self.tls_dir, self.topology.routers)
        if self.client_tls:
            from ..common.pki import make_client_pki

            make_client_pki(self.client_tls_dir, {rid: [spec.host] for rid, spec in self.topology.routers.items()
                                                  if self._made_listener(rid)})
        st["insecure_mesh"] = self.insecure_mesh
        st["client_tls"] = self.client_tls
        cmd = self.router_command(router_id, listen)
        if self.wrap is not None:
            cmd = [*self.wrap(router_id), *cmd]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with self.out_file(router_id).open("ab") as out:
            offset = out.tell()
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} oncemesh: starting router {router_id}: "
                      f"{' '.join(cmd)}\n".encode())
            out.flush()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=self.state_dir, env=env)
        self._children[proc.pid] = proc
        info = _proc(proc.pid)
        st["routers"][router_id] = {
            "pid": proc.pid, "proc_start": info.start if info else None, "started": time.time(),
            "listen": listen or rec.get("listen"), "sticky": listen is not None, "out_offset": offset,
            "topology_sha256": st.get("topology_sha256"), "cmd": cmd, "proxies": self._proxy_id}
        if self._proxy_id:
            for n in self.topology.neighbours(router_id):
                if self.topology.dialer(router_id, n) == n:  # n dials us: tell it our new pid
                    self._write_peer_file(n, router_id, proc.pid)

    # ------------------------------------------------------------------ link proxies
    def _check_proxy_owner(self, st: dict[str, Any]) -> None:
        """Only the object whose proxies the running routers use may start more of them: a router
        started with other proxies (or none) would dial addresses that mean nothing to the rest."""
        for rid, rec in st["routers"].items():
            if self._ours(rid, rec) is None or rec.get("proxies") == self._proxy_id:
                continue
            if rec.get("proxies"):
                why = ("runs with its links through proxies owned by the process that started it "
                       "(e.g. oncemesh chaos)")
            else:
                why = "runs with direct links, and this launcher puts its links through proxies"
            raise MeshError(f"router {rid} {why}; stop the mesh first (oncemesh down --state-dir "
                            f"{self.state_dir})")

    def _ensure_proxies(self, st: dict[str, Any]) -> None:
        """With proxies: start them (one per link) unless running, and point every dialer at them."""
        if not self._proxy_id:
            return
        if self.proxies is None or not self.proxies.running:
            self.proxies = ProxyHub()
            self.proxies.start()
            for link in self.topology.links:
                listener = link.b if self.topology.dialer(link.a, link.b) == link.a else link.a
                self.proxies.add(self.link_name(link.a, link.b), self._resolver(listener))
        for link in self.topology.links:
            dialer = self.topology.dialer(link.a, link.b)
            listener = link.b if dialer == link.a else link.a
            rec = st["routers"].get(listener)
            if self._ours(listener, rec) is not None and rec is not None:
                self._write_peer_file(dialer, listener, int(rec["pid"]))
            else:
                (self.peers_dir(dialer) / f"{listener}.json").unlink(missing_ok=True)
        hub = self.proxies
        st["proxies"] = {"owner": self._proxy_id, "pid": os.getpid(),
                         "links": {n: hub.address(n) for n in hub.names()}}

    def _resolver(self, listener: str) -> Any:
        """Where the proxy of a link finds `listener` now: its ready file (None: not running)."""
        def resolve() -> tuple[str, int] | None:
            info = self._read_ready(listener)
            if not info or not info.get("inter_router"):
                return None
            try:
                if info.get("pid"):
                    os.kill(int(info["pid"]), 0)
                host, _, port = str(info["inter_router"]).rpartition(":")
                return host.strip("[]"), int(port)
            except (OSError, ValueError, TypeError):
                return None
        return resolve

    def _write_peer_file(self, dialer: str, listener: str, pid: int) -> None:
        if self.proxies is None:
            return
        name = self.link_name(dialer, listener)
        d = self.peers_dir(dialer)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{listener}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"id": listener, "inter_router": self.proxies.address(name), "pid": pid,
                                   "via": f"proxy of link {name}"}) + "\n")
        os.replace(tmp, path)

    def link_name(self, a: str, b: str) -> str:
        """The name of link a–b (and of its proxy): `LO-HI`."""
        if self.topology.link(a, b) is None:
            raise MeshError(f"there is no link {a}–{b} in topology {self.topology.name!r}")
        lo, hi = sorted((a, b))
        return f"{lo}-{hi}"

    def _hub(self) -> ProxyHub:
        if self.proxies is None or not self.proxies.running:
            raise MeshError("this mesh has no link proxies running (use Mesh(..., proxies=True) and up())")
        return self.proxies

    def cut_link(self, a: str, b: str) -> None:
        """Drop the link's connections at once (RST) and refuse new ones until `restore_link`."""
        self._hub().cut(self.link_name(a, b))

    def blackhole_link(self, a: str, b: str) -> None:
        """The link goes silent both ways: the routers notice only when HELLOs time out."""
        self._hub().blackhole(self.link_name(a, b))

    def restore_link(self, a: str, b: str) -> None:
        self._hub().restore(self.link_name(a, b))

    def delay_link(self, a: str, b: str, seconds: float) -> None:
        """Hold every chunk on the link `seconds` before passing it on (0: no delay)."""
        self._hub().set_delay(self.link_name(a, b), seconds)

    def wan_link(self, a: str, b: str, delay: float, jitter: float = 0.0, loss: float = 0.0,
                 rate: float = 0.0, seed: int | None = None) -> None:
        """Make link a–b behave like a WAN link: one-way delay and jitter (s), a share of segments
        lost (each costs a TCP retransmission), bytes per second each way (topology/proxy.py)."""
        self._hub().set_wan(self.link_name(a, b), delay, jitter, loss, rate, seed)

    def partition(self, side: Iterable[str]) -> list[LinkSpec]:
        """Cut every link between `side` and the rest of the mesh; returns the links cut."""
        inside = set(side)
        unknown = inside - set(self.topology.routers)
        if unknown:
            raise MeshError(f"unknown routers {', '.join(sorted(unknown))}")
        crossing = [link for link in self.topology.links if (link.a in inside) != (link.b in inside)]
        for link in crossing:
            self.cut_link(link.a, link.b)
        return crossing

    def heal(self) -> None:
        """Restore every link, without delay."""
        hub = self._hub()
        for name in hub.names():
            hub.restore(name)
            hub.set_wan(name, 0.0)

    def link_mode(self, a: str, b: str) -> Mode:
        return self._hub().mode(self.link_name(a, b))

    def link_stats(self, a: str, b: str) -> ProxyStats:
        return self._hub().stats(self.link_name(a, b))

    def live_links(self) -> list[LinkSpec]:
        """Links both of whose routers run and list each other as live neighbours (in their ready
        files). `wait_converged` looks at reachability only: a router can reach a peer over another
        path before their direct link is back."""
        ready = {s.id: self._read_ready(s.id) or {} for s in self.status() if s.state is RouterState.RUNNING}
        return [link for link in self.topology.links
                if link.b in ready.get(link.a, {}).get("neighbours", ())
                and link.a in ready.get(link.b, {}).get("neighbours", ())]

    def links_down(self) -> list[LinkSpec]:
        """Links whose proxy is cut or blackholed (none without proxies)."""
        if self.proxies is None or not self.proxies.running:
            return []
        return [link for link in self.topology.links
                if self.proxies.mode(self.link_name(link.a, link.b)) is not Mode.FORWARDING]

    def _exit_code(self, pid: int | None) -> int | None:
        """How a router this object started ended (None: still running, or not our child)."""
        self._reap()
        return self._exit_codes.get(pid) if pid else None

    def tail(self, router_id: str, lines: int = 30) -> str:
        """The end of what the router's latest run printed (its .out file), indented."""
        rec = self._load_state()["routers"].get(router_id) or {}
        return _tail(self.out_file(router_id), rec.get("out_offset", 0), lines)

    def _wait_gone(self, pids: Iterable[tuple[str, dict[str, Any]]], deadline: float) -> list[str]:
        """Wait until none of these routers runs; return those still running at the deadline."""
        left = list(pids)
        while True:
            self._reap()
            left = [(rid, rec) for rid, rec in left if self._ours(rid, rec) is not None]
            if not left or time.monotonic() >= deadline:
                return [rid for rid, _ in left]
            time.sleep(POLL_INTERVAL)

    # ------------------------------------------------------------------ the API
    def status(self) -> list[RouterStatus]:
        """Every router of the topology (and any other this state dir started), by id."""
        self._reap()
        st = self._load_state()
        return [self._status_of(rid, st["routers"].get(rid)) for rid in self._ids(st)]

    def router_status(self, router_id: str) -> RouterStatus:
        self._reap()
        return self._status_of(router_id, self._load_state()["routers"].get(router_id))

    def up(self, wait: bool = True, timeout: float = 60.0) -> list[RouterStatus]:
        """Start every router that is not running; with `wait`, until the mesh has converged.

        Routers already running are left alone, so `up` after a crash restarts just the dead ones.
        Raises RouterStartError if a router exits while starting, MeshError on timeout.
        """
        deadline = time.monotonic() + timeout
        self._reap()
        with self._locked() as st:
            self._check_proxy_owner(st)
            self._record_topology(st)
            self._ensure_proxies(st)
            started = [rid for rid in sorted(self.topology.routers)
                       if not self._status_of(rid, st["routers"].get(rid)).alive]
            for rid in started:
                self._launch(rid, st)
        if wait:
            self._wait_ready(started, deadline, timeout)
            return self.wait_converged(max(0.0, deadline - time.monotonic()))
        return self.status()

    def start_router(self, router_id: str, wait: float | None = None, sticky: bool = True) -> None:
        """Start one router. Without `wait`, returns at once (see `wait_converged`); with it, waits
        up to `wait` seconds until the router is ready (not until the mesh converged), starting it
        on a fresh port if its previous one was taken meanwhile. `sticky=False` takes a fresh port
        at once."""
        self.topology.router(router_id)
        deadline = time.monotonic() + (wait or 0.0)
        self._reap()
        with self._locked() as st:
            current = self._status_of(router_id, st["routers"].get(router_id))
            if current.alive:
                raise MeshError(f"router {router_id} is already running (pid {current.pid})")
            self._check_proxy_owner(st)
            self._record_topology(st)
            self._ensure_proxies(st)
            self._launch(router_id, st, sticky=sticky)
        if wait is not None:
            self._wait_ready([router_id], deadline, wait)

    def _wait_ready(self, ids: list[str], deadline: float, timeout: float) -> None:
        pending = set(ids)
        retried: set[str] = set()
        while pending:
            self._reap()
            st = self._load_state()
            for rid in sorted(pending):
                rec = st["routers"].get(rid)
                s = self._status_of(rid, rec)
                if s.state is RouterState.RUNNING:
                    pending.discard(rid)
                    with self._locked() as locked:
                        if locked["routers"].get(rid, {}).get("pid") == s.pid:
                            locked["routers"][rid]["listen"] = s.listen
                elif s.state is RouterState.DEAD:
                    tail = self.tail(rid)
                    if rec and rec.get("sticky") and rid not in retried and "cannot listen" in tail:
                        retried.add(rid)  # its old port was taken meanwhile: take any free port
                        with self._locked() as locked:
                            self._launch(rid, locked, sticky=False)
                        continue
                    code = self._exit_code(s.pid)
                    raise RouterStartError(rid, f"router {rid} exited while starting"
                                           f"{'' if code is None else f' (exit code {code})'}; "
                                           f"the end of {self.out_file(rid)}:", tail)
            if pending and time.monotonic() >= deadline:
                rid = min(pending)
                raise MeshError(f"router {rid} did not become ready within {timeout:g} s; the end of "
                                f"{self.out_file(rid)}:\n{self.tail(rid)}")
            if pending:
                time.sleep(POLL_INTERVAL)

    def expected_peers(self, router_id: str, up: Iterable[str] | None = None) -> tuple[str, ...]:
        """The peers `router_id` should see when the routers `up` (default: all) are running:
        every router it can reach through running routers (and links not cut by a proxy)."""
        up_set = set(self.topology.routers if up is None else up)
        full = self.topology.graph()
        full.remove_edges_from((link.a, link.b) for link in self.links_down())
        g = full.subgraph(up_set)
        if router_id not in g:
            return ()
        return tuple(sorted(nx.node_connected_component(g, router_id) - {router_id}))

    def convergence_problems(self, up: Iterable[str] | None = None,
                             statuses: list[RouterStatus] | None = None) -> list[str]:
        """What keeps the mesh from having converged (empty when it has), one line per router; judged
        on `statuses` when given (one reading of the status files), else on a fresh reading."""
        expect = sorted(self.topology.routers if up is None else up)
        by_id = {s.id: s for s in (self.status() if statuses is None else statuses)}
        problems = []
        for rid in expect:
            s = by_id.get(rid) or RouterStatus(rid, RouterState.STOPPED)
            want = self.expected_peers(rid, expect) if len(self.topology.routers) > 1 else ()
            if s.state is not RouterState.RUNNING:
                problems.append(f"{rid}: {s.state.value}")
            elif not s.converged:
                problems.append(f"{rid}: not converged yet (peers {', '.join(s.peers) or 'none'})")
            elif s.peers != want:
                problems.append(f"{rid}: peers {', '.join(s.peers) or 'none'}, expected {', '.join(want) or 'none'}")
        return problems

    def wait_converged(self, timeout: float = 30.0, up: Iterable[str] | None = None) -> list[RouterStatus]:
        """Wait until each router in `up` (default: all) runs, says it has converged and sees as
        peers exactly the routers it can reach. Fails at once if a router is not running. Returns the
        reading of the status files that was judged converged (a later reading may already show the
        next change: a peer that flaps, a router that dies)."""
        expect = sorted(self.topology.routers if up is None else up)
        deadline = time.monotonic() + timeout
        while True:
            statuses = self.status()
            problems = self.convergence_problems(expect, statuses)
            if not problems:
                return statuses
            gone = [p for p in problems if p.endswith((": dead", ": stopped"))]
            if gone:
                rid = gone[0].split(":")[0]
                raise MeshError(f"the mesh cannot converge: router {gone[0]}; the end of "
                                f"{self.out_file(rid)}:\n{self.tail(rid)}")
            if time.monotonic() >= deadline:
                raise MeshError(f"the mesh did not converge within {timeout:g} s:\n  " + "\n  ".join(problems))
            time.sleep(POLL_INTERVAL)

    def order_problems(self) -> list[str]:
        """Total-order streams that a running router does not see in their normal state (a sequencer
        being elected or a restarted member recovering its part, a Lamport view changing)."""
        out = []
        for s in self.status():
            if s.state is not RouterState.RUNNING or not s.order:
                continue
            for topic, o in sorted(s.order.items()):
                if o.get("state") != "normal" or (o.get("algorithm") == "lamport" and not o.get("view")):
                    out.append(f"{s.id}: topic {topic} ({o.get('algorithm')}) {o.get('state')}")
        return out

    def wait_order_settled(self, timeout: float = 30.0) -> None:
        """Wait until every running router sees every total-order stream in its normal state."""
        if not _until(lambda: not self.order_problems(), timeout):
            raise MeshError(f"the total-order streams did not settle within {timeout:g} s:\n  "
                            + "\n  ".join(self.order_problems()))

    def stop_router(self, router_id: str, timeout: float = 10.0) -> StopOutcome:
        """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
        return self._stop([router_id], timeout)[router_id]

    def down(self, timeout: float = 10.0) -> dict[str, StopOutcome]:
        """Stop every router this state dir started (all at once); their state and logs stay.
        This object's link proxies stop too (after the routers)."""
        try:
            return self._stop(None, timeout)
        finally:
            if self.proxies is not None:
                self.proxies.close()

    def _stop(self, ids: list[str] | None, timeout: float) -> dict[str, StopOutcome]:
        self._reap()
        if not (self.state_dir / "mesh.json").exists():
            return dict.fromkeys(ids or [], StopOutcome.NOT_RUNNING)
        with self._locked() as st:
            outcome: dict[str, StopOutcome] = {}
            running: list[tuple[str, dict[str, Any]]] = []
            for rid in ids if ids is not None else self._ids(st):
                rec = st["routers"].get(rid)
                if self._ours(rid, rec) is None:
                    outcome[rid] = StopOutcome.NOT_RUNNING
                    continue
                assert rec is not None
                ready = self._read_ready(rid)
                if ready and ready.get("pid") == rec["pid"]:
                    rec["listen"] = ready.get("listen")
                os.kill(rec["pid"], signal.SIGTERM)
                os.kill(rec["pid"], signal.SIGCONT)  # a frozen router must run to see SIGTERM
                running.append((rid, rec))
            stubborn = set(self._wait_gone(running, time.monotonic() + timeout))
            for rid, rec in running:
                if rid in stubborn and self._ours(rid, rec) is not None:
                    os.kill(rec["pid"], signal.SIGKILL)
            left = self._wait_gone([(r, rec) for r, rec in running if r in stubborn], time.monotonic() + 10)
            if left:
                raise MeshError(f"routers {', '.join(left)} survived SIGKILL (stuck in the kernel?)")
            for rid, _ in running:
                outcome[rid] = StopOutcome.KILLED if rid in stubborn else StopOutcome.STOPPED
                if rid in stubborn:
                    self.ready_file(rid).unlink(missing_ok=True)
            for rid in outcome:
                if rid in st["routers"]:
                    st["routers"][rid]["pid"] = None
            return outcome

    def drain_router(self, router_id: str, timeout: float | None = None,
                     say: Callable[[str], None] | None = None) -> DrainResult:
        """Drain one router (SIGUSR1): it moves its clients to other routers, waits until nothing
        depends on it and exits (docs/operations.md, "Rolling restart and upgrade"). Returns once it
        has exited, with its report. `timeout`: how long to wait for the exit before stopping it
        (default: its drain_timeout setting plus 15 s)."""
        self._reap()
        with self._locked() as st:
            rec = st["routers"].get(router_id)
            status = self._status_of(router_id, rec)
            if status.state is RouterState.FROZEN:
                raise MeshError(f"router {router_id} is frozen (SIGSTOP): thaw it first, a frozen router cannot drain")
            if status.state not in (RouterState.RUNNING, RouterState.DRAINING) or rec is None:
                raise MeshError(f"router {router_id} is {status.state.value}: only a running router can drain")
            rec["listen"] = status.listen or rec.get("listen")  # a restart comes back on the same port
        pid = int(rec["pid"])
        if timeout is None:
            timeout = float(self.topology.router_settings(router_id).get("drain_timeout", 30.0)) + 15.0

        def alive() -> bool:
            self._reap()
            return self._ours(router_id, rec) is not None

        result = drain_process(router_id, pid, self.ready_file(router_id),
                               self.state_dir / "routers" / router_id / f"{router_id}.drain.json", timeout,
                               alive, say)
        with self._locked() as st:
            if st["routers"].get(router_id, {}).get("pid") == pid:
                st["routers"][router_id]["pid"] = None  # stopped on purpose: not dead
        if result.outcome == "killed":
            self.ready_file(router_id).unlink(missing_ok=True)
        return result

    def roll(self, order: Iterable[str] | None = None, drain_timeout: float | None = None,
             ready_timeout: float = 60.0, say: Callable[[str], None] | None = None) -> list[DrainResult]:
        """A rolling restart: for each router in turn (default: by id), drain it, start it again and
        wait until the mesh has converged, before the next. Raises MeshError when a router does not
        come back or the mesh does not converge (the results so far are in its message)."""
        ids = list(order) if order is not None else sorted(self.topology.routers)
        for rid in ids:
            self.topology.router(rid)
        self.wait_converged(ready_timeout)  # start from a whole mesh
        self.wait_order_settled(ready_timeout)
        results: list[DrainResult] = []
        for rid in ids:
            res = self.drain_router(rid, drain_timeout, say)
            t = time.monotonic()
            try:
                self.start_router(rid, wait=ready_timeout)
                self.wait_converged(ready_timeout)
                # a total-order topic takes a restarted router back into its numbering before the
                # next may leave (two away at once would stop it: docs/ordering.md)
                self.wait_order_settled(ready_timeout)
            except MeshError as exc:
                raise MeshError(f"rolling restart stopped at {rid} ({res.describe()}): {exc}") from None
            res = replace(res, restart_seconds=round(time.monotonic() - t, 3))
            results.append(res)
            if say is not None:
                say(f"{rid}: restarted, mesh converged {res.restart_seconds:.2f} s after the exit")
        return results

    def kill_router(self, router_id: str, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Send `sig` to one router (default SIGKILL: a crash). With SIGKILL, returns once the
        process is gone, so that `status` shows it dead. Its ready file stays, as after a crash."""
        rec = self._running_record(router_id)
        os.kill(rec["pid"], sig)
        if sig == signal.SIGKILL and self._wait_gone([(router_id, rec)], time.monotonic() + timeout):
            raise MeshError(f"router {router_id} (pid {rec['pid']}) survived SIGKILL for {timeout:g} s")

    def freeze(self, router_id: str, timeout: float = 10.0) -> None:
        """SIGSTOP: the router stops dead without closing anything (a hung process)."""
        self._signal_and_wait(router_id, signal.SIGSTOP, frozen=True, timeout=timeout)

    def thaw(self, router_id: str, timeout: float = 10.0) -> None:
        """SIGCONT: a frozen router carries on where it stopped."""
        self._signal_and_wait(router_id, signal.SIGCONT, frozen=False, timeout=timeout)

    def _signal_and_wait(self, router_id: str, sig: int, frozen: bool, timeout: float) -> None:
        rec = self._running_record(router_id)
        os.kill(rec["pid"], sig)
        deadline = time.monotonic() + timeout
        while True:
            info = self._ours(router_id, rec)
            if info is None:
                raise MeshError(f"router {router_id} exited")
            if (info.state in ("T", "t")) == frozen:
                return
            if time.monotonic() >= deadline:
                raise MeshError(f"router {router_id} did not {'stop' if frozen else 'continue'} within {timeout:g} s")
            time.sleep(POLL_INTERVAL)

    def _running_record(self, router_id: str) -> dict[str, Any]:
        self._reap()
        rec: dict[str, Any] | None = self._load_state()["routers"].get(router_id)
        if rec is None or self._ours(router_id, rec) is None:
            raise MeshError(f"router {router_id} is not running")
        return rec

    def url(self, router_id: str) -> str:
        """The client URL of a running router (ports chosen at run time included)."""
        s = self.router_status(router_id)
        if s.url is None:
            raise MeshError(f"router {router_id} is {s.state.value}: it has no URL (start it with oncemesh up)")
        return s.url

    def urls(self) -> list[str]:
        """Client URLs of the running routers, by router id: join with ',' for a client's --url."""
        return [s.url for s in self.status() if s.url is not None]

    def outdated(self) -> list[str]:
        """Running routers started from an earlier version of the topology file, or with other
        client-listener files than `client_tls` now gives them."""
        st = self._load_state()
        text = self.topology_path.read_bytes() if self.topology_path.exists() else b""
        now = hashlib.sha256(text).hexdigest()

        def tls_args(cmd: list[str]) -> list[str]:
            return [a for a in cmd if a.startswith(("tls_cert=", "tls_key=", "tls_ca="))]

        out = []
        for s in self.status():
            rec = st["routers"].get(s.id, {})
            if s.alive and (rec.get("topology_sha256") not in (None, now) or (
                    "cmd" in rec and tls_args(rec["cmd"]) != tls_args(self._client_tls_args(s.id)))):
                out.append(s.id)
        return out


def _yes(v: Any) -> bool:
    """A yes/no setting as the router reads it (TOML bool, or text from --set)."""
    return v is True or str(v).strip().lower() in ("true", "yes", "1", "on")


# ---------------------------------------------------------------------- CLI
def default_state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    state_help = (f"where the mesh keeps its state, logs and status files (default ${STATE_DIR_ENV} or "
                  f"./{DEFAULT_STATE_DIR}); one mesh per state directory")
    p = sub.add_parser(
        "up", help="start a mesh of routers on this machine",
        description="Start every router of a topology file as a local process and wait until the mesh\n"
                    "has converged. On a running mesh, start only the routers that are not running\n"
                    "(that is how to restart a crashed one). Routers keep running after this command\n"
                    "exits; stop them with `oncemesh down`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example:  oncemesh up topology/examples/line3.toml\n"
               "          oncemesh put news hello --url $(oncemesh status --urls)")
    p.add_argument("topology", type=Path, nargs="?", default=None,
                   help="topology file (TOML, see docs/topology.md); default: the one the state "
                        "directory was started with")
    p.add_argument("--state-dir", type=Path, default=None, help=state_help)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the mesh (default 60)")
    p.add_argument("--no-wait", action="store_true", help="return once the processes are started")
    p.add_argument("--check", action="store_true",
                   help="only validate the topology file and describe it; start nothing (exit 2 if invalid)")
    p.add_argument("--client-tls", action=argparse.BooleanOptionalAction, default=None,
                   help="client listeners speak TLS (amqps://) with certificates made here: a client CA "
                        "(STATE/client-tls/ca.pem, what clients pass with --ca) and per router a certificate "
                        "naming 127.0.0.1 and localhost, for routers whose topology names no tls_cert "
                        "(default: as the state directory was last started)")
    p.add_argument("--client-cert", action="append", default=[], metavar="NAME",
                   help="also make a client certificate for NAME (STATE/client-tls/users/NAME.pem and .key; "
                        "the identity it proves: NAME) for routers with tls_verify_clients; implies "
                        "--client-tls; repeatable")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("status", help="show the routers of the local mesh",
                       description="One line per router: id, pid, client URL, alive (state), peers, "
                                   "incarnation. Exit status 0 if every router runs, 1 if some do "
                                   "not, 2 if there is no mesh in the state directory.")
    p.add_argument("--state-dir", type=Path, default=None, help=state_help)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    fmt.add_argument("--urls", action="store_true",
                     help="print only the client URLs of running routers, comma-separated (for --url)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("down", help="stop the local mesh",
                       description="Stop every router of the local mesh: SIGTERM, then SIGKILL after "
                                   "--timeout. Their state and logs stay in the state directory.")
    p.add_argument("--state-dir", type=Path, default=None, help=state_help)
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds a router gets to stop cleanly before SIGKILL (default 10)")
    p.set_defaults(func=cmd_down)

    drain_text = (
        "A draining router takes no new work (no publisher credit; new connections and attaches\n"
        "are refused with amqp:connection:redirect / amqp:link:redirect naming a neighbour's client\n"
        "address), moves its clients to other routers (ours at once: publishers resend what is in\n"
        "doubt, subscribers resume), waits until nothing in flight depends on it (at most its\n"
        "drain_timeout setting, default 30 s) and exits. Nothing is lost, duplicated or falsely\n"
        "accepted, also when it times out (what it held is then repaired as after a crash).\n\n"
        "Exit status: 0 every router drained; 3 one timed out or had to be killed (it was stopped\n"
        "all the same; the report says what still depended on it); 1 an error (the message says\n"
        "which); 2 no mesh or bad arguments.")
    p = sub.add_parser(
        "drain", help="drain routers (and restart them): move their clients away, exit with nothing in flight",
        description="Drain routers of the local mesh one after another (SIGUSR1), following each until it\n"
                    "exits; with --restart, start each again and wait until the mesh has converged before\n"
                    "the next. --ready-file drains a router not started by `oncemesh up` (e.g. one run by\n"
                    "systemd: the file it was given with --ready-file).\n\n" + drain_text,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example:  oncemesh drain B --restart\n"
               "          oncemesh drain --ready-file /run/oncemesh/A.json")
    p.add_argument("routers", nargs="*", metavar="ID", help="routers to drain, in this order")
    p.add_argument("--state-dir", type=Path, default=None, help=state_help)
    p.add_argument("--ready-file", type=Path, default=None,
                   help="drain the router that writes this ready file instead (not a launcher's mesh)")
    p.add_argument("--restart", action="store_true", help="start each router again once it has exited, and "
                                                         "wait until the mesh has converged")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for each router's exit before stopping it (default: its "
                        "drain_timeout + 15)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_drain)

    p = sub.add_parser(
        "roll", help="rolling restart of the local mesh: drain, restart, converge, one router after another",
        description="Restart every router of the local mesh one after another without losing anything:\n"
                    "drain it, wait for its exit, start it again, wait until the mesh has converged,\n"
                    "then the next (`oncemesh drain --restart` over every router). Run it after\n"
                    "upgrading the code: routers one protocol version apart work together meanwhile.\n\n"
                    + drain_text,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example:  oncemesh roll --order C,B,A")
    p.add_argument("--state-dir", type=Path, default=None, help=state_help)
    p.add_argument("--order", default=None, help="comma-separated router ids (default: every router, by id)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for each router's exit before stopping it (default: its "
                        "drain_timeout + 15)")
    p.add_argument("--ready-timeout", type=float, default=60.0,
                   help="seconds for a restarted router to be ready and the mesh to converge (default 60)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_roll)


def _alive_text(s: RouterStatus) -> str:
    return {RouterState.RUNNING: "yes", RouterState.STARTING: "yes (starting)", RouterState.FROZEN: "yes (frozen)",
            RouterState.DRAINING: "yes (draining)",
            RouterState.DEAD: "no (dead)", RouterState.STOPPED: "no (stopped)"}[s.state]


def _lag_of(stats: dict[str, Any]) -> tuple[float, float] | None:
    if "loop_lag_max_ms" not in stats:
        return None
    return (float(stats["loop_lag_max_ms"]), float(stats.get("loop_lag_p99_ms", 0.0)))


def _log_blocked_of(stats: dict[str, Any]) -> str | None:
    if stats.get("log_writable", True):
        return None
    return str(stats.get("log_blocked_reason") or "settlement log not writable")


def format_table(statuses: list[RouterStatus]) -> str:
    rows: list[tuple[str, ...]] = [("ID", "PID", "URL", "ALIVE", "PEERS", "LOOP LAG MAX/P99", "INCARNATION", "METRICS")]
    for s in statuses:
        peers = ",".join(s.peers) if s.peers else "-"
        if s.state is RouterState.RUNNING and not s.converged:
            peers += " (converging)"
        lag = f"{s.loop_lag_ms[0]:.0f}/{s.loop_lag_ms[1]:.0f} ms" if s.loop_lag_ms else "-"
        alive = _alive_text(s) + (f", LOG BLOCKED: {s.log_blocked} (no publisher credit)" if s.log_blocked else "")
        rows.append((s.id, str(s.pid) if s.pid else "-", s.url or "-", alive, peers, lag,
                     s.incarnation or "-", f"http://{s.http}/metrics" if s.http else "-"))
    if all(r[-1] == "-" for r in rows[1:]):  # (no router serves HTTP: no column for it)
        rows = [r[:-1] for r in rows]
    if any(s.mqtt for s in statuses):  # (MQTT listeners: a column of their addresses)
        rows = [(*rows[0], "MQTT")] + [(*r, f"mqtt://{s.mqtt}" if s.mqtt else "-")
                                       for r, s in zip(rows[1:], statuses, strict=True)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def describe(topo: Topology) -> str:
    """A short human summary of a valid topology (for `oncemesh up --check`)."""
    out = [f"mesh {topo.name!r}: {len(topo.routers)} router(s), {len(topo.links)} link(s), connected; "
           f"hello every {topo.hello_interval:g} s, dead after {topo.dead_after:g} s"]
    for rid, r in sorted(topo.routers.items()):
        settings = ", ".join(f"{k}={v}" for k, v in sorted(topo.router_settings(rid).items()))
        out.append(f"  {rid}: listen {r.listen}, inter-router {r.inter_router}, neighbours "
                   f"{', '.join(topo.neighbours(rid)) or 'none'}" + (f"; {settings}" if settings else ""))
    for link in topo.links:
        out.append(f"  link {link}: cost {link.cost:g}, {topo.dialer(link.a, link.b)} dials")
    for name, t in sorted(topo.topics.items()):
        out.append(f"  topic {name}: {_order_text(t)}")
    return "\n".join(out)


def _order_text(t: Any) -> str:
    extra = t.total or t.causal_group
    text = f"order {t.order}" + (f" ({extra})" if extra else "")
    return text


def format_topics(topo: Topology, statuses: list[RouterStatus]) -> str:
    """The topics of the topology with their order, and for a total-order topic the sequencer (or
    the Lamport view) the running routers see and how many numbers they learned (`oncemesh status`)."""
    out = []
    for name, t in sorted(topo.topics.items()):
        line = f"topic {name}: {_order_text(t)}"
        seen = {s.id: s.order[name] for s in statuses if s.order and name in s.order}
        if seen:
            lamport = t.total is TotalOrder.LAMPORT
            views: dict[str, list[str]] = {}
            for rid, o in sorted(seen.items()):
                if lamport:
                    v = o.get("view")
                    seen_as = (f"view {v[0]}.{v[1] or 'genesis'} of {','.join(o.get('members') or [])}"
                               + (" (changing)" if o.get("state") == "frozen" else "")) if v else "joining"
                else:
                    seen_as = str(o.get("sequencer") or "being elected")
                views.setdefault(seen_as, []).append(rid)
            if len(views) == 1:
                who = next(iter(views))
            else:  # the routers do not agree (yet): say who sees what
                who = "; ".join(f"{v} at {','.join(rs)}" for v, rs in sorted(views.items()))
            numbered = max(int(o.get("numbered", 0)) for o in seen.values())
            line += f"; {'Lamport' if lamport else 'sequencer'} {who}, numbered {numbered}"
        out.append(line)
    return "\n".join(out)


def file_problems(topology: Path, client_tls: bool = False) -> list[Any]:
    """`oncemesh check`'s errors for the files a topology names (certificates, keys, users, policy),
    before any router starts on them (ports are left to the routers: `up` may find its own running).
    `client_tls`: `up` makes the client listeners' certificates the topology does not name. A
    topology that does not load is left to `Mesh`, which says why."""
    from .check import check  # (cryptography and the router's file readers: only for `up`)

    try:
        load_topology(topology)
    except TopologyError:
        return []
    return list(check(topology, ports=False, client_tls=client_tls).errors)


def _client_tls_of(state_dir: Path, asked: bool | None) -> bool:
    """--client-tls / --no-client-tls, else as the state directory was last started."""
    if asked is not None:
        return asked
    return bool((_read_json(Path(state_dir) / "mesh.json") or {}).get("client_tls", False))


def cmd_up(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    if args.check:
        if args.topology is None:
            print("oncemesh up --check: give the topology FILE to check", file=sys.stderr)
            return 2
        try:
            print(describe(load_topology(args.topology)))
        except TopologyError as exc:
            print(exc, file=sys.stderr)
            return 2
        return 0
    if args.client_cert and args.client_tls is False:
        print("oncemesh up: --client-cert makes a certificate of the client CA that --client-tls makes; "
              "it does not go with --no-client-tls", file=sys.stderr)
        return 2
    client_tls = args.client_tls if args.client_tls is not None else (True if args.client_cert else None)
    if args.topology is not None and (problems := file_problems(args.topology, _client_tls_of(state_dir, client_tls))):
        for f in problems:
            print(str(f), file=sys.stderr)
        print(f"oncemesh up: {len(problems)} error(s) in what {args.topology} names; no router started "
              f"(`oncemesh check {args.topology}` checks it all)", file=sys.stderr)
        return 2
    try:
        mesh = Mesh.open(state_dir) if args.topology is None else Mesh(args.topology, state_dir, client_tls=client_tls)
        if client_tls is not None:
            mesh.client_tls = client_tls
        before = {s.id for s in mesh.status() if s.alive}
        statuses = mesh.up(wait=not args.no_wait, timeout=args.timeout)
        for name in args.client_cert:
            mesh.make_client_cert(name)
    except TopologyError as exc:
        print(exc, file=sys.stderr)
        return 2
    except MeshError as exc:
        print(f"oncemesh up: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("oncemesh up: interrupted; routers already started keep running (oncemesh status / down)",
              file=sys.stderr)
        return 130
    print(format_table(statuses))
    started = sorted(set(mesh.topology.routers) - before)
    print(f"\nmesh {mesh.topology.name!r} in {mesh.state_dir}: "
          + (f"started {', '.join(started)}" if started else "all routers were already running")
          + (f"; {', '.join(sorted(before))} already running" if before and started else ""))
    stale = mesh.outdated()
    if stale:
        print(f"note: {', '.join(stale)} run an earlier version of {mesh.topology_path}; restart them "
              f"to apply it (oncemesh down, then oncemesh up)")
    if not args.no_wait:
        print(f"client URLs: {','.join(mesh.urls())}")
        for line in mesh.client_tls_hint():
            print(line)
    if mesh.open_to_anonymous():
        print("note: the topology configures no client authentication, so its routers let anonymous clients "
              "publish and subscribe (set users_file or tls_verify_clients; docs/security.md)")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    try:
        mesh = Mesh.open(state_dir)
    except (MeshError, TopologyError) as exc:
        print(f"oncemesh status: {exc}", file=sys.stderr)
        return 2
    statuses = mesh.status()
    if args.json:
        print(json.dumps({"mesh": mesh.topology.name, "topology": str(mesh.topology_path),
                          "state_dir": str(mesh.state_dir), "routers": [s.to_json() for s in statuses],
                          "client_ca": str(mesh.client_ca) if mesh.client_tls else None},
                         indent=2))
    elif args.urls:
        print(",".join(mesh.urls()))
    else:
        print(format_table(statuses))
        topics = format_topics(mesh.topology, statuses)
        if topics:
            print(topics)
        for line in mesh.client_tls_hint():
            print(line)
    return 0 if all(s.alive for s in statuses) else 1


def _say_to(json_out: bool) -> Callable[[str], None]:
    out = sys.stderr if json_out else sys.stdout
    return lambda text: print(text, file=out, flush=True)


def _print_results(results: list[DrainResult], json_out: bool) -> int:
    """(In text, each result was said as it came.)"""
    if json_out:
        print(json.dumps([r.to_json() for r in results], indent=2))
    return 0 if all(r.clean for r in results) else 3


def drain_ready_file(ready_file: Path, timeout: float | None, say: Callable[[str], None] | None) -> DrainResult:
    """Drain the router that writes `ready_file` (one run by a service manager). Its process must
    be an `oncemesh router` started with that ready file (checked in /proc before any signal)."""
    info = _read_json(ready_file)
    if info is None or not info.get("pid"):
        raise MeshError(f"{ready_file}: no router status in it (is the router running?)")
    pid, rid = int(info["pid"]), str(info.get("id", "?"))
    proc = _proc(pid)
    args = proc.cmdline if proc is not None else ()
    given = [Path(args[i + 1]).resolve() for i in range(len(args) - 1) if args[i] == "--ready-file"]
    if proc is None or "router" not in args or ready_file.resolve() not in given:
        raise MeshError(f"{ready_file}: process {pid} is not the oncemesh router that writes this file "
                        f"(a stale file?); nothing signalled")
    start = proc.start

    def alive() -> bool:
        p = _proc(pid)
        return p is not None and p.start == start and p.state not in ("Z", "X")

    dirs = {args[i]: Path(args[i + 1]) for i in range(len(args) - 1) if args[i] in ("--state-dir", "--log-dir")}
    where = dirs.get("--state-dir") or dirs.get("--log-dir")  # (where the router writes its report)
    if where is not None and not where.is_absolute():
        where = Path(f"/proc/{pid}/cwd").resolve() / where
    report = where / f"{rid}.drain.json" if where is not None else None
    return drain_process(rid, pid, ready_file, report, timeout if timeout is not None else 45.0, alive, say)


def cmd_drain(args: argparse.Namespace) -> int:
    say = _say_to(args.json)
    if args.ready_file is not None:
        if args.routers or args.restart:
            print("oncemesh drain: --ready-file drains that one router; it takes no ID and no --restart (start "
                  "it again with your service manager)", file=sys.stderr)
            return 2
        try:
            return _print_results([drain_ready_file(args.ready_file, args.timeout, say)], args.json)
        except MeshError as exc:
            print(f"oncemesh drain: {exc}", file=sys.stderr)
            return 1
    if not args.routers:
        print("oncemesh drain: name the routers to drain (or give --ready-file); `oncemesh roll` restarts them "
              "all", file=sys.stderr)
        return 2
    try:
        mesh = Mesh.open(args.state_dir or default_state_dir())
    except (MeshError, TopologyError) as exc:
        print(f"oncemesh drain: {exc}", file=sys.stderr)
        return 2
    unknown = [r for r in args.routers if r not in mesh.topology.routers]
    if unknown:
        print(f"oncemesh drain: no router {', '.join(unknown)} in the mesh (routers: "
              f"{', '.join(sorted(mesh.topology.routers))})", file=sys.stderr)
        return 2
    results: list[DrainResult] = []
    try:
        for rid in args.routers:
            if args.restart:
                results += mesh.roll([rid], args.timeout, say=say)
            else:
                results.append(mesh.drain_router(rid, args.timeout, say))
                say(results[-1].describe())
    except MeshError as exc:
        print(f"oncemesh drain: {exc}", file=sys.stderr)
        _print_results(results, args.json)
        return 1
    return _print_results(results, args.json)


def cmd_roll(args: argparse.Namespace) -> int:
    say = _say_to(args.json)
    try:
        mesh = Mesh.open(args.state_dir or default_state_dir())
    except (MeshError, TopologyError) as exc:
        print(f"oncemesh roll: {exc}", file=sys.stderr)
        return 2
    order = [r.strip() for r in args.order.split(",") if r.strip()] if args.order else None
    try:
        results = mesh.roll(order, args.timeout, args.ready_timeout, say)
    except (MeshError, KeyError) as exc:
        print(f"oncemesh roll: {exc}", file=sys.stderr)
        return 1
    say(f"rolling restart done: {len(results)} router(s)")
    return _print_results(results, args.json)


def cmd_down(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    try:
        mesh = Mesh.open(state_dir)
    except MeshError as exc:
        print(f"oncemesh down: nothing to stop: {exc}", file=sys.stderr)
        return 0
    except TopologyError as exc:
        print(f"oncemesh down: {exc}", file=sys.stderr)
        return 2
    try:
        outcome = mesh.down(args.timeout)
    except MeshError as exc:
        print(f"oncemesh down: {exc}", file=sys.stderr)
        return 1
    for kind in (StopOutcome.STOPPED, StopOutcome.KILLED):
        ids = sorted(r for r, o in outcome.items() if o is kind)
        if ids:
            extra = f" (did not stop within {args.timeout:g} s)" if kind is StopOutcome.KILLED else ""
            print(f"{kind.value}: {', '.join(ids)}{extra}")
    if not any(o is not StopOutcome.NOT_RUNNING for o in outcome.values()):
        print("no router was running")
    return 0
