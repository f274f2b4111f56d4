"""Client authentication (docs/security.md): password logins from the users file (SCRAM-SHA-256,
PLAIN over TLS only), certificates (EXTERNAL), anonymous access only where allowed. Real router
processes; our client, and python-qpid-proton's own client as a foreign one."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from proton import ProtonException, SSLDomain
from proton.utils import BlockingConnection

from oncemesh.clients.runtime import Client
from oncemesh.common.errors import AuthenticationFailed, NoRouterAvailable
from oncemesh.common.pki import issue, make_ca
from oncemesh.common.tls import TlsFiles
from oncemesh.harness.testing import wait_for
from tests.integration.test_single_router import run


def _log_has(path: Path, *words: str) -> bool:
    try:
        return any(all(w in line for w in words) for line in path.read_text().splitlines())
    except FileNotFoundError:
        return False


def _oncemesh(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncemesh", *args], input=stdin, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    f = tmp_path / "users.json"
    assert _oncemesh("user", "add", "alice", "--users-file", str(f), "--password-stdin", "--groups", "ops,dev",
                     "--iterations", "4096", stdin="wonderland\n").returncode == 0
    assert _oncemesh("user", "add", "bob", "--users-file", str(f), "--password-stdin", "--iterations", "4096",
                     stdin="builder\n").returncode == 0
    return f


def test_the_users_command_keeps_salted_keys_never_passwords(users_file: Path) -> None:
    text = users_file.read_text()
    assert "wonderland" not in text and "stored_key" in text and oct(users_file.stat().st_mode)[-3:] == "600"
    out = _oncemesh("user", "list", "--users-file", str(users_file))
    assert out.returncode == 0 and out.stdout.split("\n")[:2] == ["alice\tops,dev", "bob\t-"]
    assert _oncemesh("user", "remove", "bob", "--users-file", str(users_file)).returncode == 0
    assert "bob" not in _oncemesh("user", "list", "--users-file", str(users_file)).stdout
    gone = _oncemesh("user", "remove", "bob", "--users-file", str(users_file))
    assert gone.returncode == 1 and "no user 'bob'" in gone.stderr
    bad = _oncemesh("user", "add", "x", "--users-file", str(users_file), "--password-stdin", stdin="\n")
    assert bad.returncode == 2 and "empty password" in bad.stderr


async def _roundtrip(url: str, topic: str, **kw: Any) -> str | None:
    c = await Client(url, **kw).start()
    try:
        sub = c.subscriber(topic, "s", expiry=0)
        await sub.wait_attached(10)
        fut = await c.publisher(topic, "p").send("hello")
        assert [m.body for m in await sub.get_many(1, timeout=10)] == ["hello"]
        assert (await asyncio.wait_for(fut, 10)).accepted
        return c.conn.user if c.conn is not None else None
    finally:
        await c.close()


def test_passwords_over_plain_tcp_only_by_scram(make_router: Any, users_file: Path) -> None:
    r = make_router("U", settings={"users_file": str(users_file)})
    log = r.log_dir / "U.router.log"
    assert r.status()["client_auth"] == "sasl"
    run(_roundtrip(r.url, "t1", user="alice", password="wonderland"))
    wait_for(lambda: _log_has(log, "connection.authenticated", "user=alice", "mechanism=SCRAM-SHA-256"), 10, "log")

    async def refused(**kw: Any) -> BaseException:
        with pytest.raises((AuthenticationFailed, NoRouterAvailable)) as ei:
            await Client(r.url, reconnect_timeout=2, connect_timeout=3, **kw).start()
        return ei.value

    e = run(refused(user="alice", password="WRONG"))
    assert isinstance(e, AuthenticationFailed) and "authentication failed" in str(e)
    wait_for(lambda: _log_has(log, "connection.auth_failed", "wrong user name or password for 'alice'"), 10, "log")
    assert isinstance(run(refused(user="mallory", password="x")), AuthenticationFailed)
    assert isinstance(run(refused()), NoRouterAvailable)  # anonymous: not allowed here
    wait_for(lambda: _log_has(log, "connection.auth_failed", "left during the SASL exchange",
                              "offered: SCRAM-SHA-256"), 10, "log")
    # a foreign client: PLAIN in clear is not offered, so Proton's client cannot log in
    with pytest.raises(ProtonException):
        BlockingConnection(r.url, timeout=5, user="alice", password="wonderland", allowed_mechs="PLAIN",
                           sasl_enabled=True).close()


def test_tls_plain_external_and_anonymous_where_allowed(make_router: Any, users_file: Path, tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    make_ca(pki)
    cert, key = issue(pki, "server", ["127.0.0.1"])
    ccert, ckey = issue(pki, "carol", ["carol"], common_name="carol")
    r = make_router("S", settings={"users_file": str(users_file), "tls_cert": str(cert), "tls_key": str(key),
                                   "tls_ca": str(pki / "ca.pem"), "tls_verify_clients": True,
                                   "allow_anonymous": True})
    log = r.log_dir / "S.router.log"
    ca = pki / "ca.pem"
    carol = TlsFiles(ccert, ckey, ca)
    assert r.status()["client_auth"] == "sasl+anonymous"
    # our client: a certificate and no password is SASL EXTERNAL, as the certificate's name
    run(_roundtrip(r.url, "t2", tls=carol))
    wait_for(lambda: _log_has(log, "connection.authenticated", "user=carol", "mechanism=EXTERNAL"), 10, "log")
    # a password over TLS (SCRAM: our client's first choice) and anonymous (allowed on this router)
    run(_roundtrip(r.url, "t3", tls=carol, user="bob", password="builder"))
    wait_for(lambda: _log_has(log, "user=bob", "mechanism=SCRAM-SHA-256"), 10, "log")
    run(_roundtrip(r.url, "t4", tls=carol))
    # Proton's own client (C TLS, its built-in SASL): PLAIN over TLS works, a wrong password does not
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(ca))
    domain.set_credentials(str(ccert), str(ckey), None)
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER)
    conn = BlockingConnection(r.url, timeout=10, ssl_domain=domain, user="alice", password="wonderland",
                              allowed_mechs="PLAIN")
    try:
        sender = conn.create_sender("foreign")
        assert sender is not None
    finally:
        conn.close()
    wait_for(lambda: _log_has(log, "user=alice", "mechanism=PLAIN"), 10, "a foreign PLAIN login")
    with pytest.raises(ProtonException):
        BlockingConnection(r.url, timeout=5, ssl_domain=domain, user="alice", password="nope",
                           allowed_mechs="PLAIN").close()
    wait_for(lambda: _log_has(log, "connection.auth_failed", "mechanism=PLAIN"), 10, "a refused PLAIN login")
