"""Admission (router/admission.py; docs/security.md, "Threat model"; docs/operations.md, "Bad input"):
what a connection may do before it is anyone, how many links it may hold, what a refused connection
does (nothing), and how password guessing is slowed. Real routers on loopback; raw sockets as the
attackers (from 127.0.0.2 and 127.0.0.3, other source addresses of the loopback network), our client
as the legitimate user (from 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from proton import symbol, ubyte, uint

from oncemesh.clients.runtime import Client
from oncemesh.common.pki import issue, make_ca
from oncemesh.common.sasl import INIT, OUTCOME, SASL_HEADER, FrameReader, SaslClient, encode_frame
from oncemesh.harness.logsummary import iter_log_lines
from oncemesh.harness.procs import wait_for
from tests.helpers import log_has
from tests.integration.rawamqp import (
    ATTACH,
    BEGIN,
    CLOSE,
    DETACH,
    OPEN,
    RawClient,
    described,
    error_condition,
    frame,
)
from tests.integration.test_auth import _oncemesh, _roundtrip
from tests.integration.test_single_router import run

SASL_ONLY = SASL_HEADER  # a login begun and never finished
AMQP_ONLY = b"AMQP\x00\x01\x00\x00"  # (an open router) the AMQP header, and never an open


def _connect(port: int, source: str, send: bytes = b"") -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    if send:
        s.sendall(send)
    return s


def _closed_within(s: socket.socket, deadline: float) -> bool:
    """Read until the router closes the socket (True) or `deadline` (monotonic) passes (False)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        s.settimeout(left)
        try:
            if not s.recv(65536):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True


def _users(tmp_path: Path, *entries: tuple[str, str, int]) -> Path:
    f = tmp_path / "users.json"
    for name, password, iterations in entries:
        out = _oncemesh("user", "add", name, "--users-file", str(f), "--password-stdin", "--iterations",
                        str(iterations), stdin=password + "\n")
        assert out.returncode == 0, out.stderr
    return f


def test_handshakes_that_never_finish_are_closed_and_never_lock_clients_out(make_router: Any,
                                                                            tmp_path: Path) -> None:
    """Hole 2 of issue 31: idle pre-authentication connections filled max_connections for ever."""
    users = _users(tmp_path, ("alice", "wonderland", 4096))
    r = make_router("H", settings={"users_file": str(users), "max_connections": 6, "auth_timeout": 1.5,
                                   "max_preauth_per_source": 3, "max_preauth_connections": 8})
    log = r.log_dir / "H.router.log"
    idle = [_connect(r.port, "127.0.0.2") for _ in range(10)]  # TCP only
    idle += [_connect(r.port, "127.0.0.3", SASL_ONLY) for _ in range(10)]  # a login begun
    # the legitimate client logs in and works while the attackers hold all they may
    assert run(_roundtrip(r.url, "t", user="alice", password="wonderland")) == "alice"
    wait_for(lambda: log_has(log, "connection.refused", "peer=127.0.0.3", "reason=preauth_per_source"), 10,
             "the refusals beyond the per-source limit")
    deadline = time.monotonic() + 15
    assert all(_closed_within(s, deadline) for s in idle), "a pre-authentication connection was never closed"
    for s in idle:
        s.close()
    wait_for(lambda: log_has(log, "connection.auth_timeout", "peer=127.0.0.2", "stage=sasl")
             and log_has(log, "connection.auth_timeout", "peer=127.0.0.3", "stage=sasl"), 10, "the timeouts logged")
    wait_for(lambda: r.stats().get("preauth_refused", 0) >= 14 and r.stats().get("auth_timeouts", 0) >= 6, 10,
             "the refusals and timeouts counted in the status")
    # and again: nothing of the attack is left over
    assert run(_roundtrip(r.url, "t2", user="alice", password="wonderland")) == "alice"


def test_an_open_router_closes_and_logs_every_connection_that_does_not_open(make_router: Any) -> None:
    """Holes 2 and 6 of issue 31: an open router's pre-open connections were closed late or never,
    and most unlogged."""
    r = make_router("O", settings={"allow_anonymous": True, "idle_timeout": 1, "auth_timeout": 2})
    log = r.log_dir / "O.router.log"
    socks = [_connect(r.port, "127.0.0.1", data) for data in (b"", b"AM", AMQP_ONLY, SASL_ONLY) for _ in range(3)]
    deadline = time.monotonic() + 15
    assert all(_closed_within(s, deadline) for s in socks), "a connection that never opened was never closed"
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    wait_for(lambda: all(log_has(log, f"peer=127.0.0.1:{p} ") for p in ports), 10,
             "a log line for every connection closed before its open")


def _raw_greedy(port: int, container: str) -> list[tuple[int, list[Any]]]:
    """Open a connection and, right behind the open, attach two durable subscriptions and a publisher;
    the frames the router answered, until its close."""
    c = RawClient("127.0.0.1", port)
    durable = [described(0x28, [f"orders.{i}", uint(2), symbol("never"), uint(0)]) for i in range(2)]
    c.send(AMQP_ONLY + frame(OPEN, [container, None, uint(65536)])
           + frame(BEGIN, [None, uint(0), uint(1000), uint(1000)])
           + b"".join(frame(ATTACH, [f"sub{i}", uint(i), True, ubyte(0), ubyte(1), durable[i],
                                     described(0x29, [None])]) for i in range(2))
           + frame(ATTACH, ["pub", uint(2), False, ubyte(0), ubyte(1), described(0x28, ["src"]),
                            described(0x29, ["orders.0"]), None, None, uint(0)]))
    try:
        c.expect(CLOSE, timeout=10)
    finally:
        c.close()
    return c.frames


def _limited(tmp_path: Path, limit: str, name: str, value: int) -> dict[str, Any]:
    """An open router's settings with the limit `name` set router-wide (`limit` "router") or for the
    anonymous user in a policy file ("user")."""
    if limit == "router":
        return {"allow_anonymous": True, name: value}
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[anonymous]\npublish = ["#"]\nsubscribe = ["#"]\n{name} = {value}\n')
    return {"allow_anonymous": True, "policy_file": str(policy)}


@pytest.mark.parametrize("limit", ["router", "user"])
def test_a_connection_refused_for_its_limit_does_nothing(make_router: Any, tmp_path: Path, limit: str) -> None:
    """Hole 4 of issue 31: a connection refused for max_connections still carried out the attaches
    sent right behind its open (durable subscriptions made by a user at its limit)."""
    r = make_router("L", settings=_limited(tmp_path, limit, "max_connections", 1))

    async def main() -> None:
        holder = await Client(r.url, container_id="holder").start()  # the one connection allowed
        try:
            frames = await asyncio.to_thread(_raw_greedy, r.port, "greedy")
        finally:
            await holder.close()
        codes = [code for code, _ in frames]
        assert ATTACH not in codes and DETACH not in codes, codes  # no link of it was even answered
        close = next(f for code, f in frames if code == CLOSE)
        assert error_condition(close, 0) == "amqp:resource-limit-exceeded"

    run(main())
    r.stop()
    assert not [e for e in iter_log_lines(r.log_dir) if "greedy" in json.dumps(e)], \
        "the settlement log holds something of the refused connection"
    table = json.loads((r.state_dir / "L.subscriptions.json").read_text())
    assert "greedy" not in json.dumps(table)


def _attach_many(port: int, n: int) -> tuple[int, int, bool]:
    """Attach `n` publisher links on one connection at once: (links answered open, links refused
    with amqp:resource-limit-exceeded, whether the router ended the connection)."""
    c = RawClient("127.0.0.1", port, timeout=30)
    c.handshake("many")
    c.send(b"".join(frame(ATTACH, [f"p{i}", uint(i), False, ubyte(0), ubyte(1), described(0x28, ["src"]),
                                   described(0x29, ["many"]), None, None, uint(0)]) for i in range(n)))
    c.send(frame(DETACH, [uint(0), True]))  # (its answer comes after every answer to the attaches)
    attached = refused = 0
    ended = False
    while True:
        f = c.read_frame(30)
        if f is None or f[0] == CLOSE:
            ended = f is None or error_condition(f[1], 0) == "amqp:resource-limit-exceeded"
            assert ended, f
            break
        code, fields = f
        if code == ATTACH:
            attached += 1
        elif code == DETACH:
            if error_condition(fields, 2) is None:
                break
            assert error_condition(fields, 2) == "amqp:resource-limit-exceeded"
            refused += 1
    c.close()
    return attached - refused, refused, ended


@pytest.mark.parametrize("limit", ["router", "user"])
def test_links_per_connection_are_limited(make_router: Any, tmp_path: Path, limit: str) -> None:
    """Hole 3 of issue 31: 10,000 links on one connection stalled the router for ~19 s."""
    r = make_router("K", settings=_limited(tmp_path, limit, "max_links_per_connection", 20))
    log = r.log_dir / "K.router.log"
    assert _attach_many(r.port, 35) == (20, 15, False)
    wait_for(lambda: log_has(log, "link.refused", "reason=max_links_per_connection", "limit=20"), 10, "the log line")
    assert sum(1 for line in log.read_text().splitlines() if "max_links_per_connection" in line) == 1
    wait_for(lambda: r.stats().get("limited_links") == 15, 10, "the refusals counted in the status")
    # a peer that keeps attaching past its refusals loses the connection at twice the limit
    accepted, refused, ended = _attach_many(r.port, 200)
    assert ended and accepted == 20 and refused <= 21, (accepted, refused)
    wait_for(lambda: log_has(log, "connection.closed_for_links", "links=41", "limit=20"), 10, "the close logged")
    assert run(_roundtrip(r.url, "still-served")) is None  # (anonymous) the router serves others


def _sasl(port: int, mech: str, response: bytes, tls: ssl.SSLContext | None = None) -> tuple[int, float]:
    """One SASL login by hand: (outcome code, seconds from the init to the outcome)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    s = tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls is not None else raw
    try:
        s.sendall(SASL_HEADER)
        reader = FrameReader()
        got = b""
        while len(got) < 8:
            got += s.recv(65536)
        reader.feed(got[8:])
        while reader.frame() is None:
            reader.feed(s.recv(65536))
        t0 = time.perf_counter()
        s.sendall(encode_frame(INIT, [symbol(mech), response]))
        while True:
            fr = reader.frame()
            if fr is not None:
                code, fields = fr
                assert code == OUTCOME, code
                return int(fields[0]), time.perf_counter() - t0
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed before the outcome")
            reader.feed(chunk)
    finally:
        s.close()


def _scram(port: int, user: str, password: str) -> str | None:
    """A SCRAM login by hand: None if it worked, else why not."""
    client = SaslClient(user, password, False, False)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(client.start())
        while not client.done:
            chunk = s.recv(65536)
            if not chunk:
                return "closed"
            out = client.receive(chunk)
            if out:
                s.sendall(out)
    return None if client.ok else client.failed


def test_failed_logins_are_throttled_and_the_owner_gets_back_in(make_router: Any, tmp_path: Path) -> None:
    """Hole 5 of issue 31: the right password worked at once after 500 wrong ones."""
    users = _users(tmp_path, ("alice", "wonderland", 4096))
    r = make_router("T", settings={"users_file": str(users), "login_failures_free": 2, "login_backoff": 1,
                                   "login_backoff_max": 2})
    log = r.log_dir / "T.router.log"
    for _ in range(3):
        assert "SASL outcome 1" in (_scram(r.port, "alice", "guess") or "")
    # the guesser is slowed down: even the right password waits now (the answer tells nothing)
    assert "SASL outcome 4" in (_scram(r.port, "alice", "wonderland") or "")
    wait_for(lambda: log_has(log, "connection.auth_failed", "too many failed logins for 'alice'"), 10, "the log")
    # and never for good: once the wait has passed, the owner logs in
    wait_for(lambda: _scram(r.port, "alice", "wonderland") is None, 10, "the owner's login after the wait", 0.25)
    wait_for(lambda: r.stats().get("login_failures", 0) >= 4 and r.stats().get("logins", 0) >= 1, 10, "the status")


def test_an_unknown_user_is_answered_like_a_known_one(make_router: Any, tmp_path: Path) -> None:
    """Hole 5 of issue 31: PLAIN answered an unknown user in 11 ms, a known one in 39-143 ms."""
    users = _users(tmp_path, ("alice", "wonderland", 200_000))
    pki = tmp_path / "pki"
    make_ca(pki)
    cert, key = issue(pki, "server", ["127.0.0.1"])
    r = make_router("P", settings={"users_file": str(users), "tls_cert": str(cert), "tls_key": str(key),
                                   "login_failures_free": 1000})
    tls = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    known, unknown = [], []
    for _ in range(5):
        code, t = _sasl(r.port, "PLAIN", b"\0alice\0wrong", tls)
        assert code == 1
        known.append(t)
        code, t = _sasl(r.port, "PLAIN", b"\0mallory\0wrong", tls)
        assert code == 1
        unknown.append(t)
    k, u = statistics.median(known), statistics.median(unknown)
    assert u > k / 3, f"an unknown user is answered in {u * 1000:.1f} ms, a known one in {k * 1000:.1f} ms"


def test_password_logins_without_tls_only_where_allowed(make_router: Any, tmp_path: Path) -> None:
    """Hole 5 of issue 31: a SCRAM exchange read off a plain listener falls to an offline guess."""
    users = _users(tmp_path, ("alice", "wonderland", 4096))
    r = make_router("N", settings={"users_file": str(users), "passwords_without_tls": "refuse"})
    assert "no mechanism" in (_scram(r.port, "alice", "wonderland") or "")
