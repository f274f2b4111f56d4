"""`oncemesh check` (topology/check.py): a good secured three-router setup passes; each kind of
broken input is reported with where it is and what to do, and fails the check."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from oncemesh.common.pki import issue, make_ca
from oncemesh.common.sasl import ScramSecret
from oncemesh.common.tls import router_uri
from oncemesh.router.users import User, save_users
from oncemesh.topology.check import ERROR, NOTE, WARNING, Report, check

TOPOLOGY = """
[mesh]
name = "prod"

[defaults]
mesh_tls_ca = "pki/ca.pem"
users_file = "users.json"
policy_file = "policy.toml"
http_listen = "127.0.0.1:0"

[routers.r1]
listen = "127.0.0.1:0"
inter_router = "127.0.0.1:0"
[routers.r1.settings]
mesh_tls_cert = "pki/r1.pem"
mesh_tls_key = "pki/r1.key"
tls_cert = "pki/client-r1.pem"
tls_key = "pki/client-r1.key"
tls_ca = "pki/ca.pem"

[routers.r2]
listen = "127.0.0.1:0"
inter_router = "127.0.0.1:0"
[routers.r2.settings]
mesh_tls_cert = "pki/r2.pem"
mesh_tls_key = "pki/r2.key"

[routers.r3]
listen = "127.0.0.1:0"
inter_router = "127.0.0.1:0"
[routers.r3.settings]
mesh_tls_cert = "pki/r3.pem"
mesh_tls_key = "pki/r3.key"

[[links]]
between = ["r1", "r2"]

[[links]]
between = ["r2", "r3"]
"""

POLICY = """
[groups.ops]
publish = ["#"]
subscribe = ["#"]
manage = true
"""


@pytest.fixture
def setup(tmp_path: Path) -> Path:
    """A valid secured mesh: mesh CA and router certificates, a client-listener certificate for r1,
    a users file (alice in ops) and a policy. Returns the topology file."""
    d = tmp_path / "etc"
    pki = d / "pki"
    make_ca(pki)
    for rid in ("r1", "r2", "r3"):
        issue(pki, rid, [rid, router_uri(rid)], common_name=rid)
    issue(pki, "client-r1", ["127.0.0.1"])
    save_users(d / "users.json", {"alice": User("alice", ScramSecret.from_password("pw", 4096), ("ops",))})
    (d / "policy.toml").write_text(POLICY)
    (d / "mesh.toml").write_text(TOPOLOGY)
    return d / "mesh.toml"


def found(rep: Report, level: str, *words: str) -> bool:
    return any(f.level == level and all(w in str(f) for w in words) for f in rep.findings)


def test_a_good_secured_mesh_passes(setup: Path) -> None:
    rep = check(setup)
    assert rep.errors == [] and not [f for f in rep.findings if f.level == WARNING], rep.findings
    assert len(rep.checked) >= 10  # topology, users, policy, CA, 3 router certs + keys, client cert + key
    out = subprocess.run([sys.executable, "-m", "oncemesh", "check", str(setup)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "0 error(s), 0 warning(s)" in out.stdout and ": OK" in out.stdout


def line_of(words: str) -> str:
    """`mesh.toml:N` of the first line of TOPOLOGY holding `words`."""
    return f"mesh.toml:{next(i for i, line in enumerate(TOPOLOGY.split(chr(10)), 1) if words in line)}"


R1_LISTEN = '[routers.r1]\nlisten = "127.0.0.1:0"'


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


# each case breaks the good setup one way; the finding must say where and what
CASES: dict[str, tuple[Callable[[Path], None], str, tuple[str, ...]]] = {
    "topology syntax": (lambda t: edit(t, '[mesh]\nname = "prod"', '[mesh\nname = "prod"'), ERROR,
                        ("mesh.toml:",)),
    "unknown setting": (lambda t: edit(t, 'http_listen = "127.0.0.1:0"', 'htp_listen = "127.0.0.1:0"'), ERROR,
                        (line_of("http_listen"), "unknown setting 'htp_listen'", "did you mean 'http_listen'")),
    "missing certificate": (lambda t: (t.parent / "pki/r2.pem").unlink(), ERROR,
                            (f"{line_of('pki/r2.pem')} [routers.r2.settings] mesh_tls_cert", "cannot read", "pki/r2.pem: no such file")),
    "key of another certificate": (lambda t: shutil.copy(t.parent / "pki/r1.key", t.parent / "pki/r3.key"), ERROR,
                                   ("[routers.r3.settings] mesh_tls_cert", "KEY_VALUES_MISMATCH")),
    "expired certificate": (lambda t: issue(t.parent / "pki", "r2", ["r2"], common_name="r2", valid_days=1,
                                            start_days=-10), ERROR,
                            ("[routers.r2.settings] mesh_tls_cert", "expired on", "renew it")),
    "expiring soon": (lambda t: issue(t.parent / "pki", "r2", ["r2"], common_name="r2", valid_days=10), WARNING,
                      ("mesh certificate expires on", "renew it soon")),
    "certificate not naming the router": (lambda t: issue(t.parent / "pki", "r3", ["r9"], common_name="r9"), ERROR,
                                          ("router r3's mesh certificate", "does not name 'r3'", "CN=r3")),
    "another CA": (lambda t: (make_ca(t.parent / "other"), issue(t.parent / "pki", "r2", ["r2"], common_name="r2",
                                                                 ca_dir=t.parent / "other")), ERROR,
                   ("was not issued by a CA in", "pki/ca.pem")),
    "neighbour trusts another CA": (lambda t: (make_ca(t.parent / "other"), edit(
        t, 'mesh_tls_cert = "pki/r3.pem"', 'mesh_tls_cert = "pki/r3.pem"\nmesh_tls_ca = "other/ca.pem"')), ERROR,
        ("link r2–r3", "router r2's mesh certificate", "router r3's mesh CA file")),
    "CA file garbage": (lambda t: (t.parent / "pki/ca.pem").write_text("not a certificate\n"), ERROR,
                        ("CA file", "ca.pem")),
    "mesh key not set": (lambda t: edit(t, 'mesh_tls_key = "pki/r2.key"\n', ""), ERROR,
                         ("router r2: mesh_tls_key not set", "refuses to start")),
    "client certificate without the listener's host": (
        lambda t: issue(t.parent / "pki", "client-r1", ["r1.example.net"]), WARNING,
        ("client listener", "does not name the listener's host '127.0.0.1'")),
    "client certificates without a TLS listener": (
        lambda t: edit(t, 'mesh_tls_key = "pki/r2.key"', 'mesh_tls_key = "pki/r2.key"\ntls_verify_clients = true'),
        ERROR, ("[routers.r2.settings] tls_verify_clients", "need a TLS listener")),
    "users file broken": (lambda t: (t.parent / "users.json").write_text("{not json"), ERROR,
                          ("[defaults] users_file", "users file", "oncemesh user add")),
    "users file missing": (lambda t: (t.parent / "users.json").unlink(), ERROR, ("does not exist",)),
    "users file readable by others": (lambda t: (t.parent / "users.json").chmod(0o644), WARNING,
                                      ("readable by others", "chmod 600")),
    "policy unknown key": (lambda t: (t.parent / "policy.toml").write_text('[users.alice]\npublsh = ["a"]\n'), ERROR,
                           ("policy.toml", "unknown key users.alice.publsh (did you mean 'publish'?)")),
    "policy for nobody": (lambda t: (t.parent / "policy.toml").write_text(POLICY + '[users.alcie]\nmanage = true\n'),
                          WARNING, ("[users.alcie]", "no user 'alcie' in the users file")),
    "bad http_listen": (lambda t: edit(t, 'http_listen = "127.0.0.1:0"', 'http_listen = "127.0.0.1:90x"'), ERROR,
                        ("[defaults] http_listen", "port '90x' is not a number", "HOST:PORT")),
    "port out of range": (lambda t: edit(t, R1_LISTEN, '[routers.r1]\nlisten = "127.0.0.1:70000"'), ERROR,
                          (f"mesh.toml:{int(line_of('[routers.r1]').split(':')[1]) + 1}", "out of range")),
    "insecure mesh": (lambda t: edit(t, "[defaults]\n", "[defaults]\ninsecure_mesh = true\n"), WARNING,
                      ("insecure_mesh", "forge acknowledgements")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_broken_input_is_found(setup: Path, case: str) -> None:
    breaker, level, words = CASES[case]
    breaker(setup)
    rep = check(setup, ports=False)
    assert found(rep, level, *words), "\n".join(map(str, rep.findings))
    assert bool(rep.errors) == (level == ERROR)  # (a warning alone passes the check)


def test_the_command_exits_1_on_an_error_and_says_it_on_stderr(setup: Path) -> None:
    CASES["expired certificate"][0](setup)
    out = subprocess.run([sys.executable, "-m", "oncemesh", "check", str(setup), "--no-ports", "-q"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "ERROR" in out.stderr and "expired on" in out.stderr
    assert "1 error(s)" in out.stderr and "NOTE" not in out.stdout


def test_a_port_in_use_here_is_a_warning_and_strict_fails(setup: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        edit(setup, R1_LISTEN, f'[routers.r1]\nlisten = "127.0.0.1:{port}"')
        rep = check(setup)
        assert found(rep, WARNING, f"127.0.0.1:{port} is in use on this machine", "listen")
        out = subprocess.run([sys.executable, "-m", "oncemesh", "check", str(setup), "--strict"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and "1 warning(s)" in out.stderr


def test_policy_and_users_given_apart_and_the_mesh_tls_dir(tmp_path: Path) -> None:
    """`--policy`, `--users` and `--mesh-tls-dir` check files the topology does not name."""
    pki = tmp_path / "tls"
    make_ca(pki)
    issue(pki, "A", ["A"], common_name="A")
    issue(pki, "B", ["Z"], common_name="Z")
    (tmp_path / "bad-policy.toml").write_text("[anonymus]\n")
    rep = check(Path(__file__).resolve().parents[2] / "topology/examples/triangle.toml",
                policy=tmp_path / "bad-policy.toml", users=tmp_path / "none.json", mesh_tls_dir=pki, ports=False)
    assert found(rep, ERROR, "bad-policy.toml", "unknown table [anonymus] (did you mean 'anonymous'?)")
    assert found(rep, ERROR, "--users", "none.json does not exist")
    assert found(rep, ERROR, "--mesh-tls-dir", "router B's mesh certificate", "does not name 'B'")
    assert found(rep, ERROR, "--mesh-tls-dir", "C.pem", "no such file")
    assert not found(rep, NOTE, "no mesh TLS files")
    help_out = subprocess.run([sys.executable, "-m", "oncemesh", "check", "--help"], capture_output=True, text=True,
                              timeout=60)
    assert help_out.returncode == 0 and "Exit status: 0 no errors" in help_out.stdout


def test_one_host_checks_only_its_router(setup: Path) -> None:
    """On r1's host only r1's key is there: --router r1 checks r1's files, and r1's certificate
    against its neighbour r2's mesh CA file (readable here)."""
    pki = setup.parent / "pki"
    for rid in ("r2", "r3"):
        (pki / f"{rid}.key").unlink()
    assert check(setup, ports=False).errors  # the whole mesh: r2's and r3's keys are missing here
    assert check(setup, ports=False, router="r1").errors == []
    make_ca(setup.parent / "other")
    issue(pki, "r1", ["r1"], common_name="r1", ca_dir=setup.parent / "other")
    edit(setup, 'mesh_tls_cert = "pki/r1.pem"', 'mesh_tls_cert = "pki/r1.pem"\nmesh_tls_ca = "other/ca.pem"')
    rep = check(setup, ports=False, router="r1")
    assert found(rep, ERROR, "link r1–r2", "router r2's mesh CA file", "r2 refuses r1"), rep.findings
    assert found(check(setup, router="r9"), ERROR, "no router 'r9'")
