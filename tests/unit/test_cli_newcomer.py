"""The command line as a newcomer meets it (issue 31, items 9 and 12): what it says, and how it
ends, where it used to say nothing, the wrong thing, or a traceback. No router needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from oncemesh.clients.state import ClientState


def oncemesh(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncemesh", *args], capture_output=True, text=True, timeout=60,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL, cwd=cwd)


def test_get_from_a_subscription_this_state_does_not_hold_says_so_and_makes_none(tmp_path: Path) -> None:
    state = ClientState(tmp_path / "sub")
    state.remember_subscription("sid-1", "news", "s1", 60.0)
    state.close()
    # (the URL has no router: the answer comes before any connection)
    p = oncemesh("get", "news", "--subscription", "s1", "--url", "amqp://127.0.0.1:1", "--state-dir",
                 str(tmp_path / "other"), "--connect-timeout", "1")
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert "no subscription 's1' on 'news'" in p.stderr and "oncemesh subscribe news --subscription s1" in p.stderr
    assert "--state-dir" in p.stderr and not (tmp_path / "other").exists()  # (and no state made by asking)
    p = oncemesh("get", "sport", "--subscription", "s1", "--url", "amqp://127.0.0.1:1", "--state-dir",
                 str(tmp_path / "sub"), "--connect-timeout", "1")
    assert p.returncode == 2 and "it has 's1' on 'news'" in p.stderr, p.stderr
    # the state that holds it goes on to connect (and here finds no router)
    p = oncemesh("get", "news", "--subscription", "s1", "--url", "amqp://127.0.0.1:1", "--state-dir",
                 str(tmp_path / "sub"), "--connect-timeout", "1")
    assert p.returncode == 1 and "no router reachable" in p.stderr, p.stderr
