"""The deployment files (topology/deploy/, docs/operations.md "Across machines"):

- the systemd unit passes `systemd-analyze verify` (skipped, saying why, where it is not installed;
  Debian's package `systemd` has it), its command lines parse with oncemesh's own parser, and its
  hardening is there;
- the container file refers only to things that exist: the files it copies, the package it installs,
  the command it runs (parsed by oncemesh's parser), the health check (run against a real router),
  the Debian packages it installs. No container engine runs on the project's machine (the docker
  CLI has no daemon), so the image is never built here;
- make-pki.sh's certificates and the three-host example pass `oncemesh check`, and the example run
  on this machine (host names made loopback, ports 0) is a working secured mesh that `oncemesh stat`
  reads over TLS with a password.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from oncemesh.cli import build_parser
from oncemesh.clients.runtime import Client
from oncemesh.common.tls import TlsFiles
from oncemesh.topology.check import check
from tests.integration.test_single_router import run
from tests.integration.test_stat import stat

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "topology" / "deploy"
UNIT = DEPLOY / "oncemesh@.service"
CONTAINERFILE = DEPLOY / "Containerfile"
INSTALLED = "/opt/oncemesh/bin/oncemesh"


def unit_commands() -> dict[str, list[str]]:
    """ExecStart/ExecStartPre/ExecReload of the unit, continuation lines joined, %i as r1."""
    text = UNIT.read_text().replace("\\\n", " ")
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"(ExecStart|ExecStartPre|ExecReload)=(.*)", line)
        if m:
            out[m[1]] = shlex.split(m[2].replace("%i", "r1"))
    return out


def test_the_unit_runs_oncemesh_as_its_parser_expects_with_hardening() -> None:
    cmds = unit_commands()
    parser = build_parser()
    for key in ("ExecStart", "ExecStartPre"):
        argv = cmds[key]
        assert argv[0] == INSTALLED
        args = parser.parse_args(argv[1:])  # (exits on an unknown option)
        assert args.func.__name__ == {"ExecStart": "cmd_router", "ExecStartPre": "cmd_check"}[key]
    assert cmds["ExecReload"] == ["/bin/kill", "-HUP", "$MAINPID"]
    keys = dict(line.split("=", 1) for line in UNIT.read_text().splitlines() if "=" in line and line[0].isupper())
    for k, v in {"User": "oncemesh", "ProtectSystem": "strict", "NoNewPrivileges": "true", "PrivateTmp": "true",
                 "CapabilityBoundingSet": "", "Restart": "on-failure", "LimitNOFILE": "65536",
                 "ReadWritePaths": "/var/lib/oncemesh /var/log/oncemesh", "StartLimitBurst": "5"}.items():
        assert keys.get(k) == v, k
    router = parser.parse_args(cmds["ExecStart"][1:])
    assert str(router.state_dir) in keys["ReadWritePaths"] and str(router.log_dir) in keys["ReadWritePaths"]
    sysusers = (DEPLOY / "oncemesh.sysusers.conf").read_text()
    assert re.search(r"^u oncemesh - .* /var/lib/oncemesh", sysusers, re.M)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (Debian: apt-get install systemd)")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    """With the install path made this checkout's (verify checks that commands exist); any warning
    (an unknown key, a misspelt system-call group) fails the test, not only errors."""
    oncemesh = shutil.which("oncemesh", path=str(Path(sys.executable).parent))
    assert oncemesh is not None
    (tmp_path / UNIT.name).write_text(UNIT.read_text().replace(INSTALLED, oncemesh))
    out = subprocess.run(["systemd-analyze", "verify", f"{tmp_path}/oncemesh@r1.service"], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and out.stderr.strip() == "", out.stderr


def containerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the container file, continuation lines joined, comments out."""
    lines = [ln for ln in CONTAINERFILE.read_text().splitlines() if not ln.lstrip().startswith("#")]
    text = "\n".join(lines).replace("\\\n", " ")
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln.strip() else "")
            for ln in text.splitlines() if ln.strip()]


def test_the_container_file_refers_to_what_exists() -> None:
    instrs = containerfile()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # every COPY from the build context exists, and together they are the package's folders
    copied = []
    for op, arg in instrs:
        if op == "COPY" and not arg.startswith("--from"):
            *srcs, _dest = arg.split()
            for src in srcs:
                assert (ROOT / src).exists(), src
                copied.append(src)
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    assert folders <= set(copied) and "pyproject.toml" in copied
    # it installs the package by its name, and runs its console script with options oncemesh knows
    runs = " ".join(arg for op, arg in instrs if op == "RUN")
    assert f"--find-links /wheels {pyproject['project']['name']}" in runs
    entry = json.loads(next(arg for op, arg in instrs if op == "ENTRYPOINT"))
    assert entry[0] in pyproject["project"]["scripts"]
    args = build_parser().parse_args([*entry[1:], "--id", "r1"])
    assert args.func.__name__ == "cmd_router" and str(args.topology) == "/etc/oncemesh/mesh.toml"
    # the directories it writes are volumes owned by the user it runs as, and that user is made
    volumes = json.loads(next(arg for op, arg in instrs if op == "VOLUME"))
    assert {str(args.state_dir), str(args.log_dir)} == set(volumes)
    user = next(arg for op, arg in instrs if op == "USER")
    assert f"useradd --system --uid 10001 --gid {user}" in runs and f"chown {user}:{user}" in runs
    # the ports it exposes are the example topology's
    example = tomllib.loads((DEPLOY / "mesh-3hosts.toml").read_text())
    r1 = example["routers"]["r1"]
    ports = {int(r1["listen"].rsplit(":", 1)[1]), int(r1["inter_router"].rsplit(":", 1)[1]),
             int(example["defaults"]["http_listen"].rsplit(":", 1)[1])}
    assert ports <= {int(p) for p in next(arg for op, arg in instrs if op == "EXPOSE").split()}
    # the Python it builds on is one the package supports
    version = re.search(r"ARG PYTHON_VERSION=(\d+\.\d+)", CONTAINERFILE.read_text())
    assert version and tuple(map(int, version[1].split("."))) >= (3, 11)
    assert pyproject["project"]["requires-python"] == ">=3.11"


@pytest.mark.skipif(shutil.which("apt-cache") is None, reason="apt-cache is not installed (not a Debian system)")
def test_the_build_packages_exist_in_debian() -> None:
    """The image's base is Debian bookworm, as this machine (apt-cache: the package index, no download)."""
    run_line = next(arg for op, arg in containerfile() if op == "RUN" and "apt-get install" in arg)
    packages = run_line.split("--no-install-recommends", 1)[1].split("&&", 1)[0].split()
    assert {"libssl-dev", "pkg-config", "gcc"} <= set(packages)
    out = subprocess.run(["apt-cache", "show", "--no-all-versions", *packages], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert sorted(set(re.findall(r"^Package: (\S+)", out.stdout, re.M))) == sorted(packages)


def test_the_health_check_command_works_against_a_router(make_router: Any) -> None:
    hc = next(arg for op, arg in containerfile() if op == "HEALTHCHECK")
    argv = json.loads(hc.split("CMD", 1)[1])
    assert argv[0] == "python"
    r = make_router("H", settings={"http_listen": "127.0.0.1:0"})
    port = r.status()["http"].rsplit(":", 1)[1]
    code = argv[-1].replace(":9090/", f":{port}/")
    assert code != argv[-1]
    assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0
    r.stop()
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30).returncode != 0


def make_example(tmp_path: Path, hosts: dict[str, str]) -> Path:
    """The three-host example's files as docs/operations.md makes them: make-pki.sh, a users file
    (alice in ops), the policy, the topology. Returns the topology's path."""
    etc = tmp_path / "etc"
    etc.mkdir()
    subprocess.run([str(DEPLOY / "make-pki.sh"), str(etc / "pki"), *(f"{r}={h}" for r, h in hosts.items())],
                   check=True, capture_output=True, timeout=120)
    subprocess.run([sys.executable, "-m", "oncemesh", "user", "add", "alice", "--users-file", str(etc / "users.json"),
                    "--groups", "ops", "--password-stdin", "--iterations", "4096"], input="wonderland\n", text=True,
                   check=True, capture_output=True, timeout=60)
    shutil.copy(DEPLOY / "policy.toml", etc / "policy.toml")
    shutil.copy(DEPLOY / "mesh-3hosts.toml", etc / "mesh.toml")
    return etc / "mesh.toml"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_the_three_host_example_checks_clean(tmp_path: Path) -> None:
    topo = make_example(tmp_path, {r: f"{r}.example.net" for r in ("r1", "r2", "r3")})
    rep = check(topo, ports=False)
    assert rep.errors == [] and not [f for f in rep.findings if f.level == "warning"], rep.findings
    # on r1's host: its own key only
    for r in ("r2", "r3"):
        for suffix in (".key", "-client.key"):
            (topo.parent / "pki" / f"{r}{suffix}").unlink()
    assert check(topo, ports=False, router="r1").errors == []
    out = subprocess.run([sys.executable, "-m", "oncemesh", "check", str(topo), "--router", "r1", "--no-ports", "-q"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_the_three_host_example_runs_here_on_loopback(tmp_path: Path, mesh_of: Any) -> None:
    """The example with its host names made `localhost` and its ports 0: make-pki.sh's certificates
    carry the mesh (mutual TLS) and the client listeners (amqps, host name checked by our client)."""
    topo = make_example(tmp_path, {r: "localhost" for r in ("r1", "r2", "r3")})
    text = re.sub(r"r\d\.example\.net:\d+", "localhost:0", topo.read_text())
    topo.write_text(text.replace('"0.0.0.0:9090"', '"127.0.0.1:0"'))
    mesh = mesh_of(topo)
    ca = topo.parent / "pki" / "ca.pem"
    urls = [u.replace("127.0.0.1", "localhost") for u in mesh.urls()]

    async def main() -> None:
        kw: dict[str, Any] = {"tls": TlsFiles(ca=ca), "user": "alice", "password": "wonderland"}
        sub_c = await Client(urls[2], **kw).start()
        pub_c = await Client(urls[0], **kw).start()
        try:
            sub = sub_c.subscriber("orders", "s", expiry=0)
            await sub.wait_attached(20)
            fut = await pub_c.publisher("orders", "p").send("hello")
            assert [m.body for m in await sub.get_many(1, timeout=20)] == ["hello"]
            assert (await asyncio.wait_for(fut, 20)).accepted
        finally:
            await pub_c.close()
            await sub_c.close()
        rc, out, err = await stat("peers", "--url", urls[1], "--ca", str(ca), "--user", "alice", "--json",
                                  env={"ONCEMESH_PASSWORD": "wonderland"})
        assert rc == 0, err
        rows = json.loads(out)["peers"]["rows"]
        assert {(r["router"], r["reachable"], r["link_up"]) for r in rows} == {("r1", True, True), ("r3", True, True)}

    run(main(), timeout=120)
    status = json.loads(mesh.ready_file("r2").read_text())
    assert status["mesh_security"] == "mutual-tls" and status["client_auth"] == "sasl"
