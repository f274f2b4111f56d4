"""A full disk must not lose settlement evidence silently: the router holds its log, stops granting
publisher credit, says so in its log and status, and resumes once space returns.

    publisher --> A --> subscriber        A's --log-dir on a 1 MiB tmpfs, filled up mid-run

Needs a tmpfs of its own (root: `mount -t tmpfs -o size=1m`); skipped with the reason otherwise.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncemesh.common.settlement_log import log_files, read_events
from oncemesh.harness.logsummary import LogSummary
from oncemesh.harness.procs import RouterProcess, wait_for
from tests.helpers import worker

COUNT = 400


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a 1 MiB tmpfs needs root (mount -t tmpfs); not root here")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def fill(path: Path) -> None:
    """Write until the file system is full."""
    with open(path, "wb", buffering=0) as f:
        chunk = b"\0" * 4096
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                chunk = chunk[: len(chunk) // 2]
                if not chunk:
                    return


def r_out(r: RouterProcess, n: int) -> str:
    assert r.proc is not None
    return r.proc.tail(n)


def router_lines(disk: Path) -> list[dict[str, Any]]:
    return [e for f in log_files(disk) if ".settlement." in f.name for e in read_events(f)]


def test_a_full_log_disk_stops_publisher_credit_and_resumes_without_losing_a_line(
        tiny_disk: Path, tmp_path: Path, procs: Any) -> None:
    r = RouterProcess("A", tmp_path / "router", settings={"link_credit": 20, "log_flush_interval": 0.05})
    r.log_dir = tiny_disk  # settlement log and router.log on the small disk; status file elsewhere
    procs.routers.append(r)
    r.start()
    client_logs = tmp_path / "client-logs"
    procs.add(worker("consume", "--url", r.url, "--topic", "t", "--name", "s", "--state-dir",
                     str(tmp_path / "sub"), "--log-dir", str(client_logs), "--count", str(COUNT),
                     workdir=tmp_path, name="consumer"))
    wait_for(lambda: any(client_logs.glob("*.subscriber.jsonl")), 15, "subscriber attached")
    filler = tiny_disk / "filler"
    fill(filler)
    pub = procs.add(worker("publish", "--url", r.url, "--topic", "t", "--count", str(COUNT), "--rate", "400",
                           "--state-dir", str(tmp_path / "pub"), "--log-dir", str(client_logs),
                           workdir=tmp_path, name="publisher"))
    blocked = wait_for(lambda: r.stats() if r.stats().get("log_writable") is False else None, 20,
                       "the status to say the settlement log is blocked")
    assert "space" in blocked["log_blocked_reason"].lower() and blocked["log_pending_bytes"] > 0
    wait_for(lambda: "router.log_blocked" in r_out(r, 200), 10, "router.log_blocked in the router's log")

    def accepted() -> int:
        s = LogSummary(client_logs)
        return sum(1 for o in s.outcome.values() if o == "ACCEPTED")

    # credit is withheld: the publisher cannot get everything accepted while the disk is full
    # (at most what it already had credit for, plus what was accepted before the disk filled)
    assert pub.alive() and accepted() < COUNT

    filler.unlink()  # space returns
    wait_for(lambda: r.stats().get("log_writable") is True, 20, "the log writable again in the status")
    wait_for(lambda: "router.log_resumed" in r_out(r, 400), 10, "router.log_resumed in the router's log")
    assert pub.wait(60) == 0, pub.tail()
    assert accepted() == COUNT
    r.stop(20)

    # every message the publisher was told ACCEPTED has its router evidence, no line torn
    lines = router_lines(tiny_disk)
    received = {x["gid"] for x in lines if x["ev"] == "received"}
    settled = {x["gid"] for x in lines if x["ev"] == "settled"}
    published = set(LogSummary(client_logs).published)
    assert len(published) == COUNT and published <= received and published <= settled
    assert all(f.name.endswith(".jsonl.gz") for f in log_files(tiny_disk) if ".settlement." in f.name)
