"""The README's Python example runs as written against a real router (its URLs and state directory
pointed at this test's), and does what its comments say."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from oncemesh.harness.procs import RouterProcess

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_example_runs(router: RouterProcess, tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    code = readme[readme.index("```python") + len("```python"):]
    code = code[: code.index("```")]
    code = re.sub(r'"amqp://[^"]+"', f'"{router.url}"', code).replace('"./me"', repr(str(tmp_path / "me")))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "connection_lost" not in p.stderr, p.stderr  # (a normal close loses nothing)
    lines = p.stdout.splitlines()
    assert len(lines) == 2 and lines[0].endswith(" {'id': 1}"), p.stdout  # handed once, with its body
    assert lines[1] == "ACCEPTED", p.stdout


def using_it_commands() -> list[str]:
    """The command lines of the README's "Using it" block, in order (comments dropped)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Using it"):]
    block = section[section.index("```") + 3:]
    block = block[block.index("\n") + 1: block.index("```")]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_using_it_runs_in_order_as_written(tmp_path: Path) -> None:
    """Every command of "Using it", as written and in the order shown, each within a timeout: the
    mesh comes up, the subscription gets both messages and the publisher's outcome is ACCEPTED
    (the put that waits for it does not hang on a subscriber that is not running)."""
    commands = using_it_commands()
    assert [c.split()[1] for c in commands] == ["up", "status", "subscribe", "put", "get", "put", "unsubscribe",
                                                "reconcile", "roll", "down"]
    outs: list[subprocess.CompletedProcess[str]] = []
    url = None
    try:
        for line in commands:
            argv = shlex.split(line)
            if argv[1] == "reconcile":  # (minutes of Spark on a busy 2-core machine: tests/spark run it;
                continue                # issue 31 item 10 makes it seconds, then it belongs here too)
            assert argv[0] == "oncemesh"
            argv = [str(ROOT / a) if a.startswith("topology/examples/") else a for a in argv]
            if url is not None:
                argv = [a.replace("amqp://127.0.0.1:PORT", url) for a in argv]
            assert "PORT" not in " ".join(argv), line
            p = subprocess.run([sys.executable, "-m", "oncemesh.cli", *argv[1:]], capture_output=True, text=True,
                               timeout=300 if argv[1] == "roll" else 90, cwd=tmp_path)
            outs.append(p)
            assert p.returncode == 0, f"{line}\n{p.stdout}\n{p.stderr}"
            if argv[1] == "status":  # the URL the block calls amqp://127.0.0.1:PORT
                url = next(u for u in re.findall(r"amqp://127\.0\.0\.1:\d+", p.stdout))
    finally:
        if (tmp_path / "mesh").exists():
            subprocess.run([sys.executable, "-m", "oncemesh.cli", "down", "--state-dir", str(tmp_path / "mesh")],
                           capture_output=True, timeout=60)
    get = outs[4]
    assert get.stdout.splitlines() == ["hello", "world"], get.stdout
    assert "2 of 2 message(s) ACCEPTED" in outs[5].stderr, outs[5].stderr
