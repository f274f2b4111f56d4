"""The README runs as written: its Python example against a real router (its URLs and state directory
pointed at this test's), and the command blocks of "Using it" and "A secured mesh" in order, each
command within a timeout, doing what their comments say."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from oncemesh.harness.procs import RouterProcess

ROOT = Path(__file__).resolve().parents[2]
# `oncemesh reconcile` on the block's two messages: most of it is Spark's driver planning in a cold
# JVM (docs/reconcile.md, "What a run costs"), which took more than 15 minutes when the 2 cores
# were shared by a load of 20
RECONCILE_TIMEOUT = 1800


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
    (the put that waits for it does not hang on a subscriber that is not running), and the
    reconcile line says so at the top: the whole verdict first, from the routers' logs (the only
    logs under ./mesh), the client view named as not judged, the results in a temporary directory
    it names, nothing written in the current directory."""
    commands = using_it_commands()
    assert [c.split()[1] for c in commands] == ["up", "status", "subscribe", "put", "get", "put", "unsubscribe",
                                                "reconcile", "roll", "down"]
    outs: list[subprocess.CompletedProcess[str]] = []
    url = None
    tmpdir = tmp_path / "tmp"  # $TMPDIR of the reconcile line: where its results go unasked
    tmpdir.mkdir()
    try:
        for line in commands:
            argv = shlex.split(line)
            assert argv[0] == "oncemesh"
            argv = [str(ROOT / a) if a.startswith("topology/examples/") else a for a in argv]
            if url is not None:
                argv = [a.replace("amqp://127.0.0.1:PORT", url) for a in argv]
            assert "PORT" not in " ".join(argv), line
            env = {**os.environ, "TMPDIR": str(tmpdir)} if argv[1] == "reconcile" else None
            p = subprocess.run([sys.executable, "-m", "oncemesh.cli", *argv[1:]], capture_output=True, text=True,
                               timeout={"roll": 300, "reconcile": RECONCILE_TIMEOUT}.get(argv[1], 90), cwd=tmp_path,
                               env=env)
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
    reconcile = outs[7]
    verdict = json.loads(reconcile.stdout)
    assert list(verdict)[:4] == ["verdict", "exit_status", "headline", "views"], list(verdict)[:6]
    assert verdict["verdict"] == "pass" and verdict["exit_status"] == 0, verdict["headline"]
    router, client = verdict["views"]["router"], verdict["views"]["client"]
    assert router["judged"] and router["verdict"] == "pass", router  # hello and world, to s1: ok
    assert (router["pairs"], router["ok"], router["failures"]) == (2, 2, 0), router
    assert not client["judged"] and client["note"] == "no client logs: not judged", client
    assert verdict["headline"].startswith("PASS: router view: PASS: 2 pair(s): ok 2; client view: no client logs"), \
        verdict["headline"]
    assert 0 < verdict["spark_jobs"] <= 10, verdict["spark_jobs"]
    out = Path(verdict["out"])
    assert f"results: {out}" in reconcile.stderr, reconcile.stderr
    assert out.parent == tmpdir and out.name.startswith("oncemesh-reconcile-"), out
    assert (out / "summary.json").is_file(), sorted(p.name for p in out.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mesh", "pub", "sub", "tmp"]  # nothing else in ./


def secured_section() -> tuple[list[str], list[str]]:
    """The README's "A secured mesh": its TOML blocks (mesh.toml, policy.toml) and the command lines
    of its command block, in order (comments kept: they say what is refused)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## A secured mesh"):]
    section = section[: section.index("\n## ", 1)]
    blocks = section.split("```")[1::2]  # (the insides of the fences: language line first)
    tomls = [b.removeprefix("toml\n") for b in blocks if b.startswith("toml\n")]
    [commands] = [b for b in blocks if b.startswith("\n")]
    return tomls, [line.strip() for line in commands.splitlines() if line.strip()]


def test_a_secured_mesh_runs_in_order_as_written(tmp_path: Path) -> None:
    """Every command of "A secured mesh", as written and in the order shown, each within a timeout
    (`export` and `$VAR` as a shell does them; `...` is the password typed at `user add`'s prompt;
    PORT_A and PORT_B are read from `status`): `up --client-tls` makes the client listeners'
    certificates, `up` and `status` print amqps:// URLs that work with the CA they name, alice's
    subscription gets her message over TLS, and the policy refuses what the comment says."""
    (mesh_toml, policy_toml), commands = secured_section()
    sec = tmp_path / "sec"
    sec.mkdir()
    (sec / "mesh.toml").write_text(mesh_toml)
    (sec / "policy.toml").write_text(policy_toml)
    assert [" ".join(c.split()[:2]) for c in commands] == [
        "oncemesh user", "oncemesh up", "oncemesh status", "export ONCEMESH_PASSWORD=...",
        "export CA=./sec/state/client-tls/ca.pem", "oncemesh subscribe", "oncemesh put", "oncemesh get", "oncemesh put",
        "oncemesh down"]
    password = "correct horse"
    env = {k: v for k, v in os.environ.items() if k != "ONCEMESH_PASSWORD"}
    urls: dict[str, str] = {}
    outs: dict[str, subprocess.CompletedProcess[str]] = {}
    try:
        for line in commands:
            text, _, comment = line.partition("  #")
            text = re.sub(r"\$(\w+)", lambda m: env[m.group(1)], text.strip())
            argv = shlex.split(text)
            if argv[0] == "export":
                name, _, value = argv[1].partition("=")
                env[name] = password if value == "..." else value
                continue
            assert argv[0] == "oncemesh", line
            for rid, url in urls.items():
                argv = [a.replace(f"amqps://127.0.0.1:PORT_{rid}", url) for a in argv]
            assert "PORT" not in " ".join(argv), line
            # (no terminal: getpass reads the prompted password, and its confirmation, from stdin)
            p = subprocess.run([sys.executable, "-m", "oncemesh.cli", *argv[1:]], capture_output=True, text=True,
                               input=f"{password}\n{password}\n" if argv[1] == "user" else None,
                               timeout=90, cwd=tmp_path, env=env, start_new_session=True)
            outs.setdefault(argv[1], p)
            if "refused:" in comment:
                condition = comment.split("refused:")[1].strip()
                assert p.returncode == 1 and condition in p.stderr, f"{line}\n{p.stdout}\n{p.stderr}"
                continue
            assert p.returncode == 0, f"{line}\n{p.stdout}\n{p.stderr}"
            if argv[1] == "status":  # the URLs the block calls amqps://127.0.0.1:PORT_A and PORT_B
                urls = dict(re.findall(r"^(\w+)\s+\d+\s+(amqps://127\.0\.0\.1:\d+)\s", p.stdout, re.M))
                assert sorted(urls) == ["A", "B"], p.stdout
    finally:
        if (sec / "state").exists():
            subprocess.run([sys.executable, "-m", "oncemesh.cli", "down", "--state-dir", str(sec / "state")],
                           capture_output=True, timeout=60)
    ca = (tmp_path / env["CA"]).resolve()
    for cmd in ("up", "status"):  # the CA file the block passes is the one they name, with the URLs
        assert f"--ca {ca}" in outs[cmd].stdout and f"--url {urls['A']},{urls['B']}" in outs[cmd].stdout, \
            outs[cmd].stdout
    assert "amqp://" not in outs["up"].stdout and "amqp://" not in outs["status"].stdout
    assert outs["get"].stdout.splitlines() == ["hello"], outs["get"].stdout
