"""The reconciliation judges the logs of a real run: one router process and the `oncemesh` client
commands, all writing their settlement logs to one directory.

    subscribe s1 --> put m1..m5 --no-wait --> get --count 5
                     get --count 3 (running) <-- put m6..m8 (waits for ACCEPTED)
    router stopped with SIGTERM; reconcile the log directory: 8 pairs, all ok.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from oncemesh.spark.job import reconcile_paths
from oncemesh.spark.schema import CLASSES

pytestmark = pytest.mark.spark

STEP_TIMEOUT = 60.0


def oncemesh_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("oncemesh")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "oncemesh"]


def wait_ready(path: Path, proc: subprocess.Popen[bytes], deadline: float) -> dict[str, object]:
    """The router's ready file, once it is complete JSON; fails at the deadline or if the router exits."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"router exited with {proc.returncode} before it was ready")
        try:
            info: dict[str, object] = json.loads(path.read_text())
            if info.get("url"):
                return info
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(0.02)  # returns at once if the router dies
    raise AssertionError(f"router not ready within the deadline ({path} missing or incomplete)")


@pytest.fixture
def router(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    logs = tmp_path / "logs"
    ready = tmp_path / "ready.json"
    with open(tmp_path / "router.out", "wb") as out:
        proc = subprocess.Popen([*oncemesh_cmd(), "router", "--id", "A", "--listen", "127.0.0.1:0",
                                 "--state-dir", str(tmp_path / "router-state"), "--log-dir", str(logs),
                                 "--ready-file", str(ready), "--allow-anonymous"], stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        info = wait_ready(ready, proc, time.monotonic() + STEP_TIMEOUT)
        yield str(info["url"]), proc, logs
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(STEP_TIMEOUT)


def client(args: list[str], url: str, state: Path, logs: Path) -> list[str]:
    return [*oncemesh_cmd(), *args, "--url", url, "--state-dir", str(state), "--log-dir", str(logs)]


def test_logs_of_a_real_run_reconcile_all_ok(spark: SparkSession, tmp_path: Path,
                                            router: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    url, proc, logs = router
    sub_state, pub_state = tmp_path / "sub", tmp_path / "pub"

    def run(args: list[str], state: Path) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(client(args, url, state, logs), capture_output=True, text=True,
                           timeout=STEP_TIMEOUT)
        assert p.returncode == 0, f"{' '.join(args)}: rc {p.returncode}\n{p.stderr}"
        return p

    run(["subscribe", "orders", "--subscription", "s1"], sub_state)
    run(["put", "orders", "m1", "m2", "m3", "m4", "m5", "--no-wait"], pub_state)
    got = run(["get", "orders", "--subscription", "s1", "--count", "5", "--timeout", "30"], sub_state)
    assert got.stdout.split() == ["m1", "m2", "m3", "m4", "m5"]

    getter = subprocess.Popen(client(["get", "orders", "--subscription", "s1", "--count", "3",
                                      "--timeout", "30"], url, sub_state, logs),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run(["put", "orders", "m6", "m7", "m8"], pub_state)
        out, err = getter.communicate(timeout=STEP_TIMEOUT)
    finally:
        if getter.poll() is None:
            os.kill(getter.pid, signal.SIGKILL)
            getter.wait(STEP_TIMEOUT)
    assert getter.returncode == 0, err
    assert out.split() == ["m6", "m7", "m8"]

    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(STEP_TIMEOUT) == 0

    summary = reconcile_paths([logs], spark=spark, out=tmp_path / "out")
    assert summary.class_counts() == {c: (8 if c == "ok" else 0) for c in CLASSES}
    assert (summary.messages, summary.pairs, summary.owed_pairs, summary.subscriptions) == (8, 8, 8, 1)
    assert (summary.malformed_lines, summary.newer_version_lines, summary.unknown_event_lines) == (0, 0, 0)
    assert summary.passed
    assert [r.node for r in summary.routers] == ["A"]
