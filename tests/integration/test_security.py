"""Security (docs/security.md): the mesh is closed, certificates are reloaded without dropping
connections, and a mesh without TLS starts only when the operator says so. Real router processes
on loopback; impostors speak real TLS and AMQP."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from oncemesh.clients.runtime import Client
from oncemesh.common.engine import AmqpConnection, Engine, connect
from oncemesh.common.errors import NoRouterAvailable, TlsFailed
from oncemesh.common.pki import issue, make_ca
from oncemesh.common.symbols import PROP_INCARNATION, PROP_MESH, PROP_ROUTER
from oncemesh.common.tls import TlsFiles, make_context
from oncemesh.harness.procs import wait_for
from oncemesh.topology.launcher import Mesh
from tests.conftest import EXAMPLES
from tests.helpers import log_has, two_router_mesh
from tests.integration.test_single_router import run


class _Probe:
    """The AMQP side of an impostor: opens with a router's properties, records how it ends."""

    def __init__(self) -> None:
        self.opened = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[tuple[str, str] | None] = asyncio.get_running_loop().create_future()

    def on_connection_open(self, conn: AmqpConnection) -> None:
        if not self.opened.done():
            self.opened.set_result(None)

    def on_link_open(self, link: Any) -> None:
        pass

    def on_credit(self, link: Any) -> None:
        pass

    def on_message(self, link: Any, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None:
        pass

    def on_delivery_update(self, link: Any, delivery: Any, state: int, settled: bool) -> None:
        pass

    def on_link_closed(self, link: Any, closed: bool, condition: tuple[str, str] | None) -> None:
        pass

    def on_connection_closed(self, conn: AmqpConnection, condition: tuple[str, str] | None) -> None:
        if not self.closed.done():
            self.closed.set_result(condition)


def _claim(port: int, claimed: str, tls: ssl.SSLContext | None) -> tuple[bool, tuple[str, str] | None]:
    """Connect to an inter-router port claiming to be router `claimed`: was the AMQP connection
    opened by the other side, and with what condition did it end (None: none, e.g. the TLS
    handshake failed)."""

    async def main() -> tuple[bool, tuple[str, str] | None]:
        engine = Engine(asyncio.get_running_loop())
        probe = _Probe()
        props = {PROP_ROUTER: claimed, PROP_INCARNATION: "1", PROP_MESH: 1}
        try:
            await connect(engine, lambda: AmqpConnection(engine, probe, server=False,  # type: ignore[arg-type]
                                                         container_id=f"oncemesh-router-{claimed}",
                                                         properties=props), "127.0.0.1", port, tls=tls)
        except (ssl.SSLError, OSError):
            return False, None
        cond = await asyncio.wait_for(probe.closed, 10)
        return probe.opened.done(), cond

    return run(main())


def _inter_router_port(mesh: Mesh, rid: str) -> int:
    info = json.loads(mesh.ready_file(rid).read_text())
    return int(info["inter_router"].rsplit(":", 1)[1])


async def _roundtrip(pub_url: str, sub_url: str, topic: str, body: str, **kw: Any) -> None:
    sc = await Client(sub_url, **kw).start()
    pc = await Client(pub_url, **kw).start()
    try:
        sub = sc.subscriber(topic, "s", expiry=60)
        await sub.wait_attached(10)
        fut = await pc.publisher(topic, "p").send(body)
        got = await sub.get_many(1, timeout=20)
        assert [m.body for m in got] == [body]
        assert (await asyncio.wait_for(fut, 20)).accepted
    finally:
        await pc.close()
        await sc.close()


def test_a_local_mesh_is_closed_by_default(mesh_of: Any, tmp_path: Path) -> None:
    mesh = mesh_of("line3")
    assert (mesh.tls_dir / "ca.pem").exists() and (mesh.tls_dir / "B.pem").exists()
    for rid in "ABC":
        assert json.loads(mesh.ready_file(rid).read_text())["mesh_security"] == "mutual-tls"
    urls = dict(zip("ABC", mesh.urls(), strict=True))
    run(_roundtrip(urls["A"], urls["C"], "closed", "over TLS"))  # (A -> B -> C)
    port = _inter_router_port(mesh, "B")
    b_log = mesh.log_dir / "B.router.log"

    # 1. plain AMQP (no TLS) claiming to be A: the handshake fails, and B says who tried
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"AMQP\x00\x01\x00\x00")
        assert s.recv(100) == b""
        local = s.getsockname()[1]
    wait_for(lambda: log_has(b_log, "tls.handshake_failed", f"127.0.0.1:{local}"), 10, "B logs the handshake")

    # 2. TLS with a certificate for "A" from another CA: refused in the handshake
    other = tmp_path / "other-ca"
    make_ca(other, "not the mesh CA")
    cert, key = issue(other, "A", ["A", "urn:oncemesh:router:A"], common_name="A")
    foreign = make_context(TlsFiles(cert, key, mesh.tls_dir / "ca.pem"), server=False)
    opened, _ = _claim(port, "A", foreign)  # (with TLS 1.3 the client's side of the handshake ends first)
    assert not opened
    wait_for(lambda: log_has(b_log, "tls.handshake_failed", "CERTIFICATE_VERIFY_FAILED"), 10, "B logs it")

    # 3. a certificate of the mesh CA that names C, claiming to be A: refused by identity
    stolen = tmp_path / "stolen"
    cert, key = issue(stolen, "C", ["C", "urn:oncemesh:router:C"], common_name="C", ca_dir=mesh.tls_dir)
    impostor = make_context(TlsFiles(cert, key, mesh.tls_dir / "ca.pem"), server=False)
    _, cond = _claim(port, "A", impostor)
    assert cond is not None and cond[0] == "amqp:unauthorized-access" and "'A'" in cond[1], cond
    wait_for(lambda: log_has(b_log, "mesh.peer_refused", "claimed='A'", "reason=identity",
                              "certificate_names=C,urn:oncemesh:router:C"), 10, "B logs the impostor")

    # 4. a mesh-CA certificate for A that has expired: refused in the handshake
    cert, key = issue(tmp_path / "expired", "A", ["A", "urn:oncemesh:router:A"], common_name="A",
                      ca_dir=mesh.tls_dir, valid_days=1, start_days=-3)
    opened, _ = _claim(port, "A", make_context(TlsFiles(cert, key, mesh.tls_dir / "ca.pem"), server=False))
    assert not opened
    wait_for(lambda: log_has(b_log, "tls.handshake_failed", "certificate has expired"), 10, "B logs it")
    wait_for(lambda: json.loads(mesh.ready_file("B").read_text())["stats"]["tls_handshake_failures"] >= 3, 10,
             "B counts them in its status")

    # the mesh is untouched: B still has both neighbours, traffic still flows
    assert set(json.loads(mesh.ready_file("B").read_text())["peers"]) == {"A", "C"}
    run(_roundtrip(urls["C"], urls["A"], "closed-again", "still"))


def test_a_mesh_without_tls_starts_only_when_the_operator_says_so(tmp_path: Path) -> None:
    line3 = EXAMPLES / "line3.toml"
    out = subprocess.run([sys.executable, "-m", "oncemesh", "router", "--topology", str(line3), "--id", "A",
                          "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "the mesh is closed" in out.stderr and "--insecure-mesh" in out.stderr
    with Mesh(line3, tmp_path / "insecure", insecure_mesh=True) as mesh:
        mesh.up(timeout=60)
        assert not mesh.tls_dir.exists()
        assert all(json.loads(mesh.ready_file(r).read_text())["mesh_security"] == "INSECURE" for r in "ABC")
        assert log_has(mesh.log_dir / "A.router.log", "mesh.INSECURE")
        assert "--insecure-mesh" in Mesh.open(mesh.state_dir).router_command("A")  # (kept for restarts)


def test_client_tls_certificates_are_reloaded_without_dropping_connections(make_router: Any,
                                                                           tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    make_ca(pki / "ca1", "CA one")
    make_ca(pki / "ca2", "CA two")
    cert, key = issue(pki, "server", ["127.0.0.1", "localhost"], ca_dir=pki / "ca1")
    r = make_router("T", settings={"tls_cert": str(cert), "tls_key": str(key)})
    assert r.url.startswith("amqps://") and r.status()["url"].startswith("amqps://")
    ca1, ca2 = TlsFiles(ca=pki / "ca1" / "ca.pem"), TlsFiles(ca=pki / "ca2" / "ca.pem")
    # a plaintext client on the TLS-only listener: dropped in the handshake, logged, counted
    with pytest.raises(NoRouterAvailable):
        run(Client(r.url.replace("amqps://", "amqp://"), reconnect_timeout=2, connect_timeout=3).start())
    wait_for(lambda: log_has(r.log_dir / "T.router.log", "tls.handshake_failed", "endpoint=client-listener"), 10,
             "the plaintext client is logged")

    async def main() -> None:
        with pytest.raises(TlsFailed, match="CERTIFICATE_VERIFY_FAILED"):  # trusting another CA: final, at once
            await Client(r.url, tls=ca2, reconnect_timeout=2, connect_timeout=5).start()
        kept = await Client(r.url, tls=ca1).start()
        try:
            sub = kept.subscriber("tls", "s", expiry=60)
            await sub.wait_attached(10)
            pub = kept.publisher("tls", "p")
            before = await pub.send("before")
            assert [m.body for m in await sub.get_many(1, timeout=10)] == ["before"]
            assert (await asyncio.wait_for(before, 10)).accepted
            # renew: a certificate from CA two in the same files, then SIGHUP
            issue(pki, "server", ["127.0.0.1", "localhost"], ca_dir=pki / "ca2")
            r.proc.signal(signal.SIGHUP)  # type: ignore[union-attr]
            wait_for(lambda: log_has(r.log_dir / "T.router.log", "tls.reloaded", "generation=2"), 10,
                     "the router reloads")
            # the connection made before goes on; new ones need CA two
            after = await pub.send("after")
            assert [m.body for m in await sub.get_many(1, timeout=10)] == ["after"]
            assert (await asyncio.wait_for(after, 10)).accepted and kept.failovers == 0
            fresh = await Client(r.url, tls=ca2).start()
            await fresh.close()
            with pytest.raises(TlsFailed, match="CERTIFICATE_VERIFY_FAILED"):
                await Client(r.url, tls=ca1, reconnect_timeout=2, connect_timeout=5).start()
        finally:
            await kept.close()

    run(main(), timeout=90)
    # a reload that cannot read its files keeps the certificate in use
    (pki / "server.key").write_text("not a key")
    r.proc.signal(signal.SIGHUP)  # type: ignore[union-attr]
    wait_for(lambda: log_has(r.log_dir / "T.router.log", "tls.reload_failed"), 10, "the failed reload is logged")
    run(_roundtrip(r.url, r.url, "tls2", "still served", tls=ca2))


CERT_MESH = two_router_mesh("tls_verify_clients = true  # clients must show a certificate of the client CA: SASL EXTERNAL")


def test_up_makes_client_tls_and_client_certificates_that_its_printed_hint_names(tmp_path: Path) -> None:
    """`oncemesh up --client-cert alice` on a topology that asks for client certificates: the routers
    listen with TLS (certificates of a client CA, not the mesh CA, naming 127.0.0.1 and localhost),
    `up` prints amqps:// URLs and the --ca/--cert/--key a client passes, and a client with exactly
    those reaches both routers as alice; one without the certificate does not. A restart from the
    state directory alone keeps it all."""
    (tmp_path / "mesh.toml").write_text(CERT_MESH)
    state = tmp_path / "state"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "oncemesh", *args], capture_output=True, text=True,
                              timeout=90, cwd=tmp_path)

    try:
        up = cli("up", str(tmp_path / "mesh.toml"), "--state-dir", str(state), "--client-cert", "alice")
        assert up.returncode == 0, up.stdout + up.stderr
        [hint] = [line for line in up.stdout.splitlines() if "e.g. oncemesh put" in line]
        flags = hint.split("MESSAGE ", 1)[1].split()
        d = state / "client-tls"
        assert flags[2:] == ["--ca", str(d / "ca.pem"), "--cert", str(d / "users" / "alice.pem"),
                             "--key", str(d / "users" / "alice.key")], hint
        urls = flags[1].split(",")
        assert flags[0] == "--url" and len(urls) == 2 and all(u.startswith("amqps://127.0.0.1:") for u in urls)
        listener = x509.load_pem_x509_certificate((d / "routers" / "A.pem").read_bytes())
        names = listener.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert {"127.0.0.1", "localhost"} <= {str(n.value) for n in names}
        assert listener.issuer.rfc4514_string() == "CN=oncemesh client CA"
        assert (d / "ca.pem").read_bytes() != (state / "tls" / "ca.pem").read_bytes()  # (not the mesh CA)

        a, b = urls
        sub = ["--state-dir", str(tmp_path / "sub")]
        assert cli("subscribe", "t", "--subscription", "s", "--url", b, *flags[2:], *sub).returncode == 0
        put = cli("put", "t", "hello", "--no-wait", "--url", a, *flags[2:], "--state-dir", str(tmp_path / "pub"))
        assert put.returncode == 0, put.stderr
        got = cli("get", "t", "--subscription", "s", "--count", "1", "--timeout", "30", "--url", b, *flags[2:], *sub)
        assert got.returncode == 0 and got.stdout.splitlines() == ["hello"], got.stderr
        stat = cli("stat", "--url", a, *flags[2:])  # (stat takes the same options)
        assert stat.returncode == 0 and "amqps://" in stat.stdout, stat.stderr
        no_cert = cli("put", "t", "x", "--no-wait", "--url", a, "--ca", str(d / "ca.pem"), "--connect-timeout", "5")
        assert no_cert.returncode != 0, no_cert.stdout

        assert cli("down", "--state-dir", str(state)).returncode == 0
        again = cli("up", "--state-dir", str(state))  # (no topology, no flags: as it was started)
        assert again.returncode == 0, again.stderr
        assert "amqp://" not in again.stdout and f"--cert {d / 'users' / 'alice.pem'}" in again.stdout, again.stdout
        status = cli("status", "--state-dir", str(state), "--json")
        assert json.loads(status.stdout)["client_ca"] == str(d / "ca.pem")
        url = json.loads(status.stdout)["routers"][0]["url"]
        put = cli("put", "t", "again", "--no-wait", "--url", url, *flags[2:], "--state-dir", str(tmp_path / "pub"))
        assert url.startswith("amqps://") and put.returncode == 0, put.stderr
    finally:
        cli("down", "--state-dir", str(state))
