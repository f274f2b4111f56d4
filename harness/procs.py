"""Real router and client processes for the tools (demo, bench, chaos, soak, failover) and the tests:
start, wait until ready, signal, stop, read their status, CPU and memory (product code, like
`trio.testing`; what only the tests use is in tests/helpers.py).

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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


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

        try:
            info = wait_for(ready, timeout, f"router {self.id} ready file")
        except TimeoutError:  # a router that never got ready is not left running (under valgrind: for hours)
            self.proc.stop(5.0)
            raise
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
