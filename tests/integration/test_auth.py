"""Client authentication (docs/security.md): password logins from the users file (SCRAM-SHA-256,
PLAIN over TLS only), certificates (EXTERNAL), anonymous access only where allowed. Real router
processes; our client, and python-qpid-proton's own client as a foreign one."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from proton import ProtonException, SSLDomain
from proton.utils import BlockingConnection

from oncemesh.clients.runtime import Client
from oncemesh.common.errors import AuthenticationFailed, LinkRefused, NoRouterAvailable
from oncemesh.common.pki import issue, make_ca
from oncemesh.common.tls import TlsFiles
from oncemesh.harness.procs import wait_for
from tests.helpers import log_has
from tests.integration.test_single_router import run


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
    wait_for(lambda: log_has(log, "connection.authenticated", "user=alice", "mechanism=SCRAM-SHA-256"), 10, "log")

    async def refused(**kw: Any) -> BaseException:
        with pytest.raises((AuthenticationFailed, NoRouterAvailable)) as ei:
            await Client(r.url, reconnect_timeout=2, connect_timeout=3, **kw).start()
        return ei.value

    e = run(refused(user="alice", password="WRONG"))
    assert isinstance(e, AuthenticationFailed) and "authentication failed" in str(e)
    wait_for(lambda: log_has(log, "connection.auth_failed", "wrong user name or password for 'alice'"), 10, "log")
    assert isinstance(run(refused(user="mallory", password="x")), AuthenticationFailed)
    anonymous = run(refused())  # not allowed here: said at once, by name
    assert isinstance(anonymous, AuthenticationFailed) and "authentication required" in str(anonymous)
    wait_for(lambda: log_has(log, "connection.auth_failed", "left during the SASL exchange",
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
    wait_for(lambda: log_has(log, "connection.authenticated", "user=carol", "mechanism=EXTERNAL"), 10, "log")
    # a password over TLS (SCRAM: our client's first choice) and anonymous (allowed on this router)
    run(_roundtrip(r.url, "t3", tls=carol, user="bob", password="builder"))
    wait_for(lambda: log_has(log, "user=bob", "mechanism=SCRAM-SHA-256"), 10, "log")
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
    wait_for(lambda: log_has(log, "user=alice", "mechanism=PLAIN"), 10, "a foreign PLAIN login")
    with pytest.raises(ProtonException):
        BlockingConnection(r.url, timeout=5, ssl_domain=domain, user="alice", password="nope",
                           allowed_mechs="PLAIN").close()
    wait_for(lambda: log_has(log, "connection.auth_failed", "mechanism=PLAIN"), 10, "a refused PLAIN login")


POLICY = """
[groups.ops]
publish = ["orders/#"]
subscribe = ["orders/#"]

[users.bob]
subscribe = ["orders/eu"]
max_connections = 1
"""


def test_the_policy_decides_topics_and_limits_and_a_subscription_stays_its_makers(
        make_router: Any, users_file: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    r = make_router("P", settings={"users_file": str(users_file), "policy_file": str(policy)})
    log = r.log_dir / "P.router.log"
    # (alice is in group ops: users_file fixture)

    async def main() -> None:
        alice = await Client(r.url, user="alice", password="wonderland", container_id="shared").start()
        bob = await Client(r.url, user="bob", password="builder", container_id="shared").start()
        try:
            mine = alice.subscriber("orders/eu", "s", expiry=60)
            await mine.wait_attached(10)
            with pytest.raises(LinkRefused) as ei:  # bob presents alice's container id and link name
                await bob.subscriber("orders/eu", "s", expiry=60).wait_attached(10)
            assert ei.value.condition == "amqp:unauthorized-access" and "another identity" in ei.value.description
            fut = await alice.publisher("orders/eu", "p").send("only for alice's subscription")
            assert [m.body for m in await mine.get_many(1, timeout=10)] == ["only for alice's subscription"]
            assert (await asyncio.wait_for(fut, 10)).accepted
            with pytest.raises(LinkRefused) as ei:
                await alice.publisher("secret", "p2").wait_attached(10)
            assert ei.value.condition == "amqp:unauthorized-access" and "may not publish to 'secret'" in str(ei.value)
            theirs = bob.subscriber("orders/eu", "b", expiry=0)
            await theirs.wait_attached(10)
            for make in (lambda: bob.subscriber("orders/us", "b2", expiry=0), lambda: bob.publisher("orders/eu", "bp")):
                with pytest.raises(LinkRefused) as ei:
                    await make().wait_attached(10)
                assert ei.value.condition == "amqp:unauthorized-access"
            with pytest.raises((AuthenticationFailed, NoRouterAvailable, ConnectionError)):
                await Client(r.url, user="bob", password="builder", reconnect_timeout=2, connect_timeout=3).start()
            wait_for(lambda: log_has(log, "connection.refused reason=max_connections_per_user user=bob"), 10, "log")
            # a reloaded policy applies to new links
            policy.write_text(POLICY + 'publish = ["orders/eu"]\n')
            r.proc.signal(signal.SIGHUP)  # type: ignore[union-attr]
            wait_for(lambda: log_has(log, "policy.reloaded"), 10, "the reload")
            fut = await bob.publisher("orders/eu", "bp2").send("from bob")
            assert "from bob" in [m.body for m in await theirs.get_many(1, timeout=10)]
            assert "from bob" in [m.body for m in await mine.get_many(1, timeout=10)]
            assert (await asyncio.wait_for(fut, 10)).accepted
        finally:
            await bob.close()
            await alice.close()

    run(main(), timeout=120)
    try:
        wait_for(lambda: r.stats().get("unauthorized_attaches", 0) >= 4 and r.stats().get("limited_connections", 0) >= 1
                 and r.stats().get("logins", 0) >= 3, 10, "the refusals counted in the status")
    except TimeoutError:
        raise AssertionError(r.stats()) from None
    bad = tmp_path / "bad.toml"
    bad.write_text("[users.bob]\npublsh = ['x']\n")
    out = subprocess.run([sys.executable, "-m", "oncemesh", "router", "--id", "X", "--listen", "127.0.0.1:0",
                          "--set", f"policy_file={bad}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown key users.bob.publsh (did you mean 'publish'?)" in out.stderr


def test_the_command_line_takes_credentials_and_a_ca(make_router: Any, users_file: Path, tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    make_ca(pki)
    cert, key = issue(pki, "server", ["127.0.0.1"])
    r = make_router("C", settings={"users_file": str(users_file), "tls_cert": str(cert), "tls_key": str(key)})
    common = ["--url", r.url, "--ca", str(pki / "ca.pem"), "--user", "alice", "--connect-timeout", "5"]

    def cli(*args: str, password: str = "wonderland") -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "ONCEMESH_PASSWORD": password}
        return subprocess.run([sys.executable, "-m", "oncemesh", *args], capture_output=True, text=True,
                              timeout=60, env=env, cwd=tmp_path)

    state = ["--state-dir", str(tmp_path / "client")]
    assert cli("subscribe", "cli", "--subscription", "s", *common, *state).returncode == 0
    assert cli("put", "cli", "hello", "--no-wait", *common, *state).returncode == 0  # (the outcome waits for get)
    out = cli("get", "cli", "--subscription", "s", "--count", "1", "--timeout", "20", *common, *state)
    assert out.returncode == 0 and "hello" in out.stdout, out.stderr
    bad = cli("put", "cli", "x", *common, *state, password="wrong")
    assert bad.returncode == 1 and "authentication failed" in bad.stderr
    untrusted = cli("put", "cli", "x", "--url", r.url, "--user", "alice", "--connect-timeout", "2", *state)
    assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr


def test_the_readme_secured_mesh_runs_with_paths_relative_to_its_topology(mesh_of: Any, users_file: Path,
                                                                           tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## A secured mesh"):]
    mesh_toml, policy_toml = (b.split("```")[0] for b in section.split("```toml")[1:3])
    sec = tmp_path / "sec"
    sec.mkdir()
    (sec / "mesh.toml").write_text(mesh_toml)
    (sec / "policy.toml").write_text(policy_toml)
    (sec / "users.json").write_bytes(users_file.read_bytes())  # (alice, in group ops)
    mesh = mesh_of(sec / "mesh.toml")
    a, b = mesh.urls()

    async def main() -> None:
        sub_c = await Client(b, user="alice", password="wonderland").start()
        pub_c = await Client(a, user="alice", password="wonderland").start()
        try:
            sub = sub_c.subscriber("orders/eu", "s1", expiry=0)
            await sub.wait_attached(10)
            fut = await pub_c.publisher("orders/eu", "p").send("hello")
            assert [m.body for m in await sub.get_many(1, timeout=20)] == ["hello"]
            assert (await asyncio.wait_for(fut, 20)).accepted
            with pytest.raises(LinkRefused, match="may not publish to 'secrets'"):
                await pub_c.publisher("secrets", "p2").wait_attached(10)
            # bob, at the other router, presents alice's container id and link name: the owner is in the
            # gossiped entry, so A refuses him too, and her subscription at B goes on
            thief = await Client(a, user="bob", password="builder", container_id=sub_c.container_id).start()
            try:
                with pytest.raises(LinkRefused, match="another identity"):
                    await thief.subscriber("orders/eu", "s1", expiry=0).wait_attached(10)
            finally:
                await thief.close()
            fut = await pub_c.publisher("orders/eu", "p3").send("still hers")
            assert [m.body for m in await sub.get_many(1, timeout=20)] == ["still hers"]
            assert (await asyncio.wait_for(fut, 20)).accepted
        finally:
            await pub_c.close()
            await sub_c.close()

    run(main(), timeout=90)


def test_an_open_router_must_be_asked_for(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "oncemesh", "router", "--id", "X", "--listen", "127.0.0.1:0"]
    out = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no way for clients to log in" in out.stderr and "--allow-anonymous" in out.stderr
    out = subprocess.run([*base, "--set", "allow_anonymous=false"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no way for clients to log in" in out.stderr  # ("false" is false)
    out = subprocess.run([*base, "--set", "allow_anonymous=maybe"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "allow_anonymous must be true or false" in out.stderr


MIXED_MESH = """
[routers.A]
listen = "127.0.0.1:0"
inter_router = "127.0.0.1:0"
[routers.A.settings]
users_file = "users.json"

[routers.B]
listen = "127.0.0.1:0"
inter_router = "127.0.0.1:0"
[routers.B.settings]
allow_anonymous = true

[[links]]
between = ["A", "B"]
"""


def test_an_open_router_of_the_mesh_does_not_hand_a_subscription_to_anonymous_clients(
        mesh_of: Any, users_file: Path, tmp_path: Path) -> None:
    """A subscription alice made at A (which authenticates) belongs to her at every router: an
    unauthenticated client at B (open: no SASL, no user at all) presenting her container id and link
    name is refused, and her messages keep coming to her."""
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "mesh.toml").write_text(MIXED_MESH)
    (d / "users.json").write_bytes(users_file.read_bytes())
    a, b = mesh_of(d / "mesh.toml").urls()

    async def main() -> None:
        alice = await Client(a, user="alice", password="wonderland").start()
        try:
            sub = alice.subscriber("orders", "s1", expiry=60)
            await sub.wait_attached(10)
            thief = await Client(b, container_id=alice.container_id).start()
            try:
                with pytest.raises(LinkRefused, match="another identity") as ei:
                    await thief.subscriber("orders", "s1", expiry=60).wait_attached(10)
                assert ei.value.condition == "amqp:unauthorized-access"
                fut = await thief.publisher("orders", "p").send("for alice")
                assert [m.body for m in await sub.get_many(1, timeout=20)] == ["for alice"]
                assert (await asyncio.wait_for(fut, 20)).accepted
            finally:
                await thief.close()
        finally:
            await alice.close()

    run(main(), timeout=90)


def test_a_bad_malloc_threshold_is_refused_at_start(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "oncemesh", "router", "--id", "X", "--listen", "127.0.0.1:0", "--allow-anonymous"]
    out = subprocess.run([*base, "--set", "malloc_mmap_threshold=-5"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "malloc_mmap_threshold: -5 is not 0" in out.stderr
