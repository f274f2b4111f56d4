"""A put that waits for its outcome says what for, and --timeout ends it honestly (issue 31, item 7):
ACCEPTED needs every subscription, and one nobody reads holds the put."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from oncemesh.harness.procs import RouterProcess


def _oncemesh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncemesh", *args], capture_output=True, text=True, timeout=90,
                          stdin=subprocess.DEVNULL)


def test_put_says_which_subscription_it_waits_for_and_its_timeout_leaves_the_outbox_to_resend(
        router: RouterProcess, tmp_path: Path) -> None:
    sub = ["--url", router.url, "--state-dir", str(tmp_path / "sub")]
    pub = ["--url", router.url, "--state-dir", str(tmp_path / "pub")]
    assert _oncemesh("subscribe", "news", "--subscription", "s1", *sub).returncode == 0
    p = _oncemesh("put", "news", "hello", "world", "--timeout", "4", "--progress", "1", *pub)
    assert p.returncode == 1, p.stderr
    assert "waiting for 1 subscription(s) to accept: s1 (suspended, home A" in p.stderr, p.stderr
    assert "no outcome within 4s for 2 of 2 message(s)" in p.stderr and "outbox" in p.stderr, p.stderr
    got = _oncemesh("get", "news", "--subscription", "s1", "--count", "2", "--timeout", "30", *sub)
    assert got.stdout.splitlines() == ["hello", "world"], got.stderr
    flushed = _oncemesh("put", "news", "--flush", "--timeout", "30", *pub)  # (the outbox's: resent, not twice)
    assert flushed.returncode == 0 and "2 of 2 message(s) ACCEPTED" in flushed.stderr, flushed.stderr
    empty = _oncemesh("put", "news", "--flush", "--timeout", "30", *pub)  # nothing left: said, not a crash
    assert empty.returncode == 0 and "nothing in doubt" in empty.stderr, empty.stderr
    again = _oncemesh("get", "news", "--subscription", "s1", "--timeout", "2", *sub)
    assert again.returncode == 0 and again.stdout == "", again.stdout
