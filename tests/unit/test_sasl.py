"""The SASL layer (common/sasl.py), client against server in memory: every mechanism, every way a
login fails, and the byte stream cut anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncemesh.common.sasl import (
    AMQP_HEADER,
    SASL_HEADER,
    SaslClient,
    SaslError,
    SaslServer,
    ScramSecret,
    ServerPolicy,
    encode_frame,
)
from oncemesh.router.users import User, Users, common_iterations, save_users

SECRETS = {"alice": ScramSecret.from_password("wonderland", 4096), "bob": ScramSecret.from_password("builder", 4096)}


def policy(encrypted: bool = True, external: str | None = None, anonymous: bool = False) -> ServerPolicy:
    return ServerPolicy(SECRETS.get, encrypted, external, anonymous)


def exchange(client: SaslClient, server: SaslServer, cuts: list[int] | None = None) -> bytes:
    """Run the exchange; returns what reached the server after SASL (the start of AMQP). `cuts`:
    chunk sizes to cut each message into."""
    sizes = iter(cuts or [])

    def chunks(data: bytes) -> list[bytes]:
        out = []
        while data:
            n = max(1, next(sizes, len(data)))
            out.append(data[:n])
            data = data[n:]
        return out

    to_server = client.start()
    for _ in range(10):
        to_client = b"".join(server.receive(c) for c in chunks(to_server))
        if server.check is not None:  # (the I/O edge checks a PLAIN password off the loop)
            secret, password, _ = server.check
            to_client += server.resolve(secret.check_password(password))
        if not to_client:
            break
        to_server = b"".join(client.receive(c) for c in chunks(to_client))
        if client.done:
            if client.ok:  # (the engine's own AMQP header follows)
                for c in chunks(to_server + AMQP_HEADER + b"AMQP-FRAMES"):
                    server.receive(c)
            break
    return server.amqp


@pytest.mark.parametrize("mech_user,password,encrypted,expected_mech", [
    ("alice", "wonderland", True, "SCRAM-SHA-256"),
    ("bob", "builder", False, "SCRAM-SHA-256"),  # (SCRAM needs no TLS: the password never crosses)
])
def test_scram_logs_in_and_the_server_proves_itself(mech_user: str, password: str, encrypted: bool,
                                                   expected_mech: str) -> None:
    client, server = SaslClient(mech_user, password, encrypted, False), SaslServer(policy(encrypted))
    rest = exchange(client, server)
    assert client.ok and server.done and server.user == mech_user and server.mechanism == expected_mech
    assert rest == AMQP_HEADER + b"AMQP-FRAMES"


def test_plain_only_over_tls() -> None:
    server = SaslServer(policy(encrypted=True))
    frames = server.receive(SASL_HEADER)
    assert b"PLAIN" in frames and b"SCRAM-SHA-256" in frames
    assert b"PLAIN" not in SaslServer(policy(encrypted=False)).receive(SASL_HEADER)
    # a PLAIN login, as a foreign client would send it
    s = SaslServer(policy(encrypted=True))
    s.receive(SASL_HEADER)
    assert s.receive(encode_frame(0x41, ["PLAIN", b"\0alice\0wonderland"])) == b"" and s.check is not None
    out = s.resolve(s.check[0].check_password(s.check[1]))
    assert s.done and s.user == "alice" and out.endswith(b"\x50\x00\x40")  # (outcome: code 0, no data)
    s = SaslServer(policy(encrypted=False))
    s.receive(SASL_HEADER)
    s.receive(encode_frame(0x41, ["PLAIN", b"\0alice\0wonderland"]))
    assert s.done and s.user is None and "not offered" in (s.failed or "")


@pytest.mark.parametrize("user,password", [("alice", "WRONG"), ("mallory", "wonderland"), ("alice", "")])
def test_a_wrong_password_or_an_unknown_user_fails_alike(user: str, password: str) -> None:
    for encrypted in (True, False):
        client, server = SaslClient(user, password, encrypted, False), SaslServer(policy(encrypted))
        exchange(client, server)
        assert server.done and server.user is None and "wrong user name or password" in (server.failed or "")
        assert client.done and not client.ok and "authentication failed" in (client.failed or "")
    s = SaslServer(policy(encrypted=True))
    s.receive(SASL_HEADER)
    s.receive(encode_frame(0x41, ["PLAIN", f"\0{user}\0{password}".encode()]))
    if s.check is not None:
        s.resolve(s.check[0].check_password(s.check[1]))
    assert s.user is None and "wrong user name or password" in (s.failed or "")


def test_external_is_the_certificate_identity() -> None:
    client, server = SaslClient(None, None, True, True), SaslServer(policy(external="CN-of-cert"))
    exchange(client, server)
    assert client.ok and server.user == "CN-of-cert" and server.mechanism == "EXTERNAL"
    server = SaslServer(policy(external=None))  # no certificate: EXTERNAL is not offered
    assert b"EXTERNAL" not in server.receive(SASL_HEADER)


def test_anonymous_only_where_allowed() -> None:
    client, server = SaslClient(None, None, True, False), SaslServer(policy(anonymous=True))
    exchange(client, server)
    assert client.ok and server.user == "anonymous"
    client, server = SaslClient(None, None, True, False), SaslServer(policy(anonymous=False))
    exchange(client, server)
    assert not client.ok and "no mechanism" in (client.failed or "") and server.user is None
    for allowed in (True, False):  # a client that skips SASL
        server = SaslServer(policy(anonymous=allowed))
        assert server.receive(AMQP_HEADER + b"rest") == b""
        assert server.done and server.without_sasl and server.amqp == AMQP_HEADER + b"rest"
        assert (server.user == "anonymous") is allowed and (server.failed is None) is allowed


def test_a_client_must_not_trust_a_server_that_does_not_know_the_password() -> None:
    """A server that answers SCRAM with another secret's signature: the client refuses it."""
    client = SaslClient("alice", "wonderland", True, False)
    evil = SaslServer(ServerPolicy({"alice": ScramSecret.from_password("wonderland", 4096)}.get, True))
    to_server = client.start()
    to_client = evil.receive(to_server)
    to_server = client.receive(to_client)  # client-first
    to_client = evil.receive(to_server)  # server-first
    evil._scram = (*evil._scram[:3], ScramSecret.from_password("other", 4096, evil._scram[3].salt))  # type: ignore[misc,index]
    to_server = client.receive(to_client)  # client-final
    to_client = evil.receive(to_server)
    client.receive(to_client)
    assert not client.ok


@pytest.mark.parametrize("junk", [b"HTTP/1.1 200", b"AMQP\x01\x01\x00\x00", encode_frame(0x44, [])])
def test_garbage_is_a_protocol_error(junk: bytes) -> None:
    server = SaslServer(policy())
    with pytest.raises(SaslError):
        server.receive(junk if junk.startswith((b"HTTP", b"AMQP")) else SASL_HEADER + junk)


def test_an_oversized_frame_is_refused() -> None:
    server = SaslServer(policy())
    with pytest.raises(SaslError, match="not a SASL frame"):
        server.receive(SASL_HEADER + (10**6).to_bytes(4, "big") + b"\x02\x01\x00\x00")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), max_size=60), st.sampled_from(["scram", "plain-ext", "anon"]))
def test_the_stream_may_be_cut_anywhere(cuts: list[int], kind: str) -> None:
    if kind == "scram":
        client, server = SaslClient("alice", "wonderland", True, False), SaslServer(policy())
    elif kind == "plain-ext":
        client, server = SaslClient(None, None, True, True), SaslServer(policy(external="x"))
    else:
        client, server = SaslClient(None, None, False, False), SaslServer(policy(anonymous=True))
    rest = exchange(client, server, cuts)
    assert client.ok and server.user is not None and rest == AMQP_HEADER + b"AMQP-FRAMES"


def test_secrets_survive_json_and_never_hold_the_password() -> None:
    s = ScramSecret.from_password("pa55word", 4096)
    d = s.to_json()
    assert "pa55word" not in str(d) and ScramSecret.from_json(d) == s
    assert s.check_password("pa55word") and not s.check_password("pa55wordx")


def _challenge(server: SaslServer, user: str) -> dict[str, str]:
    """The SCRAM server-first attributes a server answers `user`'s client-first with."""
    server.receive(SASL_HEADER)
    out = server.receive(encode_frame(0x41, ["SCRAM-SHA-256", f"n,,n={user},r=abc".encode()]))
    text = out[out.index(b"r=abc"):].split(b"\x00")[0].decode(errors="replace")
    return dict(p.split("=", 1) for p in text.split(",") if "=" in p)


def test_an_unknown_user_costs_and_looks_like_a_known_one(tmp_path: Path) -> None:
    """SCRAM shows an unknown name the users' own iteration count and a salt as stable as a real
    one (across restarts and routers sharing the file); PLAIN checks its password against a decoy
    with the same work (a PBKDF2 of that count) and fails."""
    f = tmp_path / "users.json"
    save_users(f, {"alice": User("alice", SECRETS["alice"]), "bob": User("bob", SECRETS["bob"])})
    a, b = Users(f), Users(f)  # (two routers, or one restarted)
    known = _challenge(SaslServer(ServerPolicy(a.secret, False, decoy=a.decoy)), "alice")
    ghost = _challenge(SaslServer(ServerPolicy(a.secret, False, decoy=a.decoy)), "mallory")
    again = _challenge(SaslServer(ServerPolicy(b.secret, False, decoy=b.decoy)), "mallory")
    assert known["i"] == ghost["i"] == "4096" and ghost["s"] == again["s"] != known["s"]
    s = SaslServer(ServerPolicy(a.secret, True, decoy=a.decoy))
    s.receive(SASL_HEADER)
    s.receive(encode_frame(0x41, ["PLAIN", b"\0mallory\0wonderland"]))
    assert s.check is not None and s.check[0].iterations == SECRETS["alice"].iterations  # the same work
    s.resolve(s.check[0].check_password(s.check[1]))
    assert s.done and s.user is None and "wrong user name or password" in (s.failed or "")
    assert common_iterations({"a": User("a", SECRETS["alice"]), "b": User("b", SECRETS["bob"]),
                              "c": User("c", ScramSecret(b"s", 100_000, b"k", b"k"))}) == 4096


def test_a_throttled_login_is_told_to_wait_unheard() -> None:
    waits = {"alice": 7.0}
    for mech, resp in (("SCRAM-SHA-256", b"n,,n=alice,r=abc"), ("PLAIN", b"\0alice\0wonderland")):
        s = SaslServer(ServerPolicy(SECRETS.get, True, throttle=lambda u: waits.get(u, 0.0)))
        s.receive(SASL_HEADER)
        out = s.receive(encode_frame(0x41, [mech, resp]))
        assert s.done and s.throttled and s.check is None and s.login == "alice"
        assert out.endswith(b"\x50\x04\x40") and "try again in 7 s" in (s.failed or "")  # (outcome sys-temp)
    client, server = SaslClient("bob", "builder", False, False), SaslServer(
        ServerPolicy(SECRETS.get, False, throttle=lambda u: waits.get(u, 0.0)))
    exchange(client, server)
    assert client.ok and not server.throttled and server.login == "bob"


def test_a_listener_may_refuse_password_logins() -> None:
    offered = SaslServer(ServerPolicy(SECRETS.get, False, "cn", passwords=False)).receive(SASL_HEADER)
    assert b"SCRAM" not in offered and b"PLAIN" not in offered and b"EXTERNAL" in offered
    client, server = SaslClient("alice", "wonderland", False, False), SaslServer(
        ServerPolicy(SECRETS.get, False, passwords=False))
    exchange(client, server)
    assert not client.ok and "no mechanism" in (client.failed or "")
