"""Errors a client meets at connect that no retry cures (issue 31, item 8): a secured router and no
user, an unknown user, `amqps://` to a plain listener, a router's certificate not trusted. Each is
said at once and by its cause, by the library and by the command line (put, get, stat), instead of
"no router reachable" after the whole reconnect timeout."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from oncemesh.clients.runtime import Client
from oncemesh.common.errors import AuthenticationFailed, TlsFailed
from oncemesh.common.pki import issue, make_ca
from oncemesh.common.tls import TlsFiles
from tests.integration.test_single_router import run

FAST = 8.0  # seconds: well under the 30 s (put/get) and 10 s (stat) the commands would retry for


def _oncemesh(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    import os

    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "oncemesh", *args], capture_output=True, text=True, timeout=90,
                       stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    return p, time.monotonic() - t0


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    f = tmp_path / "users.json"
    p = subprocess.run([sys.executable, "-m", "oncemesh", "user", "add", "alice", "--users-file", str(f),
                        "--password-stdin", "--iterations", "4096"], input="wonderland\n", capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return f


async def _fails(url: str, **kw: Any) -> tuple[BaseException, float]:
    t0 = time.monotonic()
    with pytest.raises(Exception) as ei:
        await Client(url, reconnect_timeout=30, connect_timeout=3, **kw).start()
    return ei.value, time.monotonic() - t0


def test_no_user_and_an_unknown_user_on_a_secured_router_are_said_at_once(make_router: Any, users_file: Path,
                                                                          tmp_path: Path) -> None:
    r = make_router("U", settings={"users_file": str(users_file)})
    e, took = run(_fails(r.url))
    assert isinstance(e, AuthenticationFailed) and "--user" in str(e) and took < FAST, (repr(e), took)
    e, took = run(_fails(r.url, user="mallory", password="x"))
    assert isinstance(e, AuthenticationFailed) and "authentication failed" in str(e) and took < FAST, (e, took)
    for cmd in (["put", "t", "m"], ["subscribe", "t", "--subscription", "s"], ["stat"]):
        p, took = _oncemesh(*cmd, "--url", r.url, "--state-dir", str(tmp_path / "c")) if cmd[0] != "stat" \
            else _oncemesh(*cmd, "--url", r.url)
        assert p.returncode == 1 and took < FAST + 5, (cmd, p.stderr, took)
        assert "no router reachable" not in p.stderr and "authentication" in p.stderr, (cmd, p.stderr)
        assert "--user" in p.stderr, (cmd, p.stderr)
    p, took = _oncemesh("stat", "--url", r.url, "--user", "mallory", env={"ONCEMESH_PASSWORD": "x"})
    assert p.returncode == 1 and "authentication failed" in p.stderr and took < FAST + 5, (p.stderr, took)


def test_tls_to_a_plain_listener_and_an_untrusted_certificate_are_said_at_once(make_router: Any,
                                                                               tmp_path: Path) -> None:
    plain = make_router("P")
    tls_url = plain.url.replace("amqp://", "amqps://")
    e, took = run(_fails(tls_url))
    assert isinstance(e, TlsFailed) and "plain" in str(e) and took < FAST, (repr(e), took)
    for cmd in (["put", "t", "m", "--state-dir", str(tmp_path / "c")], ["stat"]):
        p, took = _oncemesh(*cmd, "--url", tls_url)
        assert p.returncode == 1 and took < FAST + 5, (cmd, p.stderr, took)
        assert "no router reachable" not in p.stderr and "TLS" in p.stderr and "plain" in p.stderr, (cmd, p.stderr)
    pki = tmp_path / "pki"
    make_ca(pki)
    cert, key = issue(pki, "server", ["127.0.0.1"])
    other = tmp_path / "other"
    make_ca(other, "another CA")
    secured = make_router("S", settings={"tls_cert": str(cert), "tls_key": str(key)})
    e, took = run(_fails(secured.url, tls=TlsFiles(None, None, other / "ca.pem")))
    assert isinstance(e, TlsFailed) and "certificate" in str(e) and took < FAST, (repr(e), took)
    p, took = _oncemesh("stat", "--url", secured.url, "--ca", str(other / "ca.pem"))
    assert p.returncode == 1 and "certificate" in p.stderr and took < FAST + 5, (p.stderr, took)
