"""`oncemesh chaos` end to end: real routers, proxies and clients, faults from a seed, and the
verdict of the Spark reconciliation.

The short run (default test run) plays 17 faults of every kind on the line A - B - C in 45 s; the
long run (`-m slow`) plays ten minutes on mesh4. Both pass only when the reconciliation finds
nothing lost, duplicated, unexpected or falsely accepted and the run quiesced.

    ONCEMESH_CHAOS_DURATION=1800 ONCEMESH_CHAOS_SEED=5 .venv/bin/pytest -m slow tests/chaos -s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from oncemesh.harness.chaos import (
    PROGRESS_EVERY,
    SETUP_TIMEOUT,
    ChaosConfig,
    ChaosError,
    _Client,
    _Run,
    run_chaos,
)
from oncemesh.harness.faults import FaultKind, Limits
from oncemesh.topology.load import example_path
from tests.helpers import wait_progressing

# How long a chaos run may say nothing: it speaks every PROGRESS_EVERY while traffic, healing or
# the reconciliation's Spark jobs move; its longest silent steps by design are one setup step (at
# most SETUP_TIMEOUT, then it fails and says so) and starting Spark up to its first job (151 s
# measured at load average ~20 on this 2-core machine). A bound on the whole run would measure how idle the machine
# is: the reconciliation alone took minutes on a loaded one.
SILENCE = 5 * max(SETUP_TIMEOUT, PROGRESS_EVERY)


def processes_of(state_dir: Path) -> list[str]:
    """Live processes whose command line names the run's state directory (routers, clients)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(state_dir) in cmd and state not in ("Z", "X"):
            out.append(f"{d.name}: {cmd}")
    return out


def oncemesh(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncemesh", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def following(*args: str, silence: float) -> subprocess.CompletedProcess[str]:
    """`oncemesh ARGS` to its end, for as long as it keeps saying something (stderr): only `silence`
    seconds without a line fail (after a SIGTERM, which a chaos run obeys by stopping what it started)."""
    proc = subprocess.Popen([sys.executable, "-m", "oncemesh", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    err: list[str] = []

    def read(stream: IO[str], into: list[str]) -> None:
        for line in stream:
            into.append(line)

    readers = [threading.Thread(target=read, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, err), daemon=True)]
    for t in readers:
        t.start()
    try:
        wait_progressing(lambda: proc.poll() is not None, lambda: len(err), silence, f"oncemesh {args[0]}")
    except TimeoutError as exc:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        pytest.fail(f"{exc}; what it said last:\n{''.join(err[-40:])}")
    for t in readers:
        t.join(10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(out), "".join(err))


def test_short_chaos_run_with_every_fault_keeps_the_promises(tmp_path: Path) -> None:
    """45 s of traffic on line3, seed 8: 17 faults of all four kinds (router SIGKILL+restart,
    SIGSTOP, partitions, client SIGKILL+restart), judged by reconciling every log of the run."""
    state = tmp_path / "run"
    proc = following("chaos", "line3", "--duration", "45", "--seed", "8", "--faults", "all",
                     "--state-dir", str(state), "--json", silence=SILENCE)
    print(proc.stderr[-6000:])
    result = json.loads(proc.stdout)
    assert proc.returncode == 0, result["verdict"]
    assert result["seed"] == 8 and result["quiescent"] and not result["crashes"]
    assert set(result["faults_injected"]) == {k.value for k in FaultKind}
    assert sum(result["faults_injected"].values()) >= 12
    rec = result["reconciliation"]
    total = 2 * 30 * 45  # publishers x rate x duration
    assert rec["messages"] == result["published"] == result["accepted"] == total
    assert rec["verdict"] == "pass" and rec["failures"] == 0 and result["false_outcomes"] == 0
    assert result["fifo_reversals"] == rec["fifo_reversals"] == 0  # the chaos topic's order: FIFO
    assert rec["subscriptions"] == 3
    for name, counts in result["subscriptions"].items():
        assert counts["ok"] == total, name
        assert counts["lost"] == counts["duplicated"] == counts["unexpected"] == 0
    assert "seed 8" in proc.stderr and "schedule (17 faults)" in proc.stderr
    assert (state / "chaos.json").exists() and (state / "reconcile").is_dir()
    assert processes_of(state) == []


def test_interrupted_run_stops_everything_it_started(tmp_path: Path) -> None:
    """Ctrl-C in the middle of the fault phase: every router, proxy and client is stopped."""
    state = tmp_path / "run"
    said: list[str] = []
    seen: list[list[str]] = []

    def say(text: str) -> None:
        said.append(text)
        if "start kill" in text and not seen:
            seen.append(processes_of(state))
            raise KeyboardInterrupt

    result = run_chaos("triangle", duration=30, seed=3, faults=[FaultKind.KILL], state_dir=state,
                       limits=Limits(mean_gap=1.0, warmup=1.0), say=say)
    assert seen and len(seen[0]) >= 3 + 5  # three routers and five clients were running
    assert result.interrupted and result.exit_code == 3
    assert processes_of(state) == []
    assert any("interrupted" in line for line in said)


def test_setup_errors_are_reported_and_start_nothing(tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "old.jsonl").write_text("{}\n")
    with pytest.raises(ChaosError, match="not empty"):
        run_chaos("line3", state_dir=busy)
    fixed = tmp_path / "fixed.toml"
    fixed.write_text(example_path("line3.toml").read_text().replace(
        'inter_router = "127.0.0.1:0"', 'inter_router = "127.0.0.1:1"', 1))
    proc = oncemesh("chaos", str(fixed), "--state-dir", str(tmp_path / "x"), timeout=60)
    assert proc.returncode == 2 and "inter-router ports 0" in proc.stderr
    proc = oncemesh("chaos", "nosuch", "--state-dir", str(tmp_path / "y"), timeout=60)
    assert proc.returncode == 2 and "no topology file nosuch" in proc.stderr
    proc = oncemesh("chaos", "line3", "--faults", "kill,reboot", timeout=60)
    assert proc.returncode == 2 and "unknown fault 'reboot'" in proc.stderr


@pytest.mark.slow
def test_long_chaos_run_keeps_the_promises(tmp_path: Path) -> None:
    """Ten minutes (ONCEMESH_CHAOS_DURATION) on mesh4 with every kind of fault."""
    duration = float(os.environ.get("ONCEMESH_CHAOS_DURATION", "600"))
    seed = int(os.environ.get("ONCEMESH_CHAOS_SEED", "11"))
    topology = os.environ.get("ONCEMESH_CHAOS_TOPOLOGY", "mesh4")
    result = run_chaos(topology, duration=duration, seed=seed, state_dir=tmp_path / "run")
    assert result.exit_code == 0, result.verdict()
    assert result.summary is not None and result.summary.passed
    assert result.published == result.accepted == 2 * 30 * int(duration)
    assert sum(result.injected.values()) >= duration / 10
    assert processes_of(tmp_path / "run") == []


class _Backlog:
    """The client logs of a run that has published and decided everything, with `missing` hand-overs
    still owed to its one subscription: one more arrives every `step` seconds (none if 0)."""

    def __init__(self, missing: int, step: float) -> None:
        self.published = {"g1", "g2"}
        self.outcome = dict.fromkeys(self.published, "ACCEPTED")
        self.owed = [f"m{i}" for i in range(missing)]
        self.step, self.at = step, time.monotonic()

    def by_link(self, name: str) -> object:
        return name

    def in_doubt(self) -> set[str]:
        return set()

    def missing(self, sub: object) -> set[str]:
        if self.step and self.owed and time.monotonic() - self.at >= self.step:
            self.owed.pop()
            self.at = time.monotonic()
        return set(self.owed)


def quiescing(backlog: _Backlog, settle: float) -> tuple[bool, float, list[str]]:
    """`_Run.quiesce` of a run (one publisher, finished; one subscriber) over `backlog`."""
    run = _Run.__new__(_Run)
    run.cfg = ChaosConfig(Path("line3.toml"), duration=1.0, publishers=1, subscribers=1, rate=2.0, settle=settle)
    run.clients = [_Client("sub-0", "consume", "A", [], Path("sub-0.out")),
                   _Client("pub-0", "publish", "A", [], Path("pub-0.out"), finished=True)]
    said: list[str] = []
    run.say, run.t0, run.watch = said.append, time.monotonic(), backlog  # type: ignore[assignment]
    run.deadline = run.t0 + 3600  # (the hard deadline, far away)
    run.tick = lambda: 0  # type: ignore[method-assign]
    t = time.monotonic()
    return run.quiesce(), time.monotonic() - t, said


def test_quiescence_is_awaited_while_the_backlog_shrinks_and_given_up_when_it_does_not() -> None:
    """A backlog that takes three times `settle` to drain, a little at a time, is waited for (a
    loaded machine catches up slowly); one that does not move is given up after `settle`."""
    done, took, said = quiescing(_Backlog(missing=6, step=0.25), settle=0.5)
    assert done and took >= 1.5 and "quiescent" in said[-1], said
    done, took, said = quiescing(_Backlog(missing=6, step=0.0), settle=0.5)
    assert not done and 0.5 <= took < 5 and "NOT QUIESCENT: no progress for 0.5s (work left 6)" in said[-1], said
