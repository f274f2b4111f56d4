"""The README's Python example runs as written against a real router (its URLs and state directory
pointed at this test's), and does what its comments say."""

from __future__ import annotations

import re
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
    lines = p.stdout.splitlines()
    assert len(lines) == 2 and lines[0].endswith(" {'id': 1}"), p.stdout  # handed once, with its body
    assert lines[1] == "ACCEPTED", p.stdout
