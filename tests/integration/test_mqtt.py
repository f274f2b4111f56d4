"""MQTT clients on a real router process (paho-mqtt, MQTT 3.1.1 and 5): QoS 2 each message once,
PUBREC only after the subscriptions owed it accepted it, one topic space with AMQP, persistent
sessions, and bad input answered by the protocol with the router going on."""

from __future__ import annotations

import json
import random
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from proton import Message

from oncemesh.clients.blocking import BlockingClient
from oncemesh.common.pki import issue, make_ca
from oncemesh.common.settlement_log import read_events
from oncemesh.harness.procs import RouterProcess
from oncemesh.topology.launcher import format_table
from tests.conftest import EXAMPLES


def mqtt_addr(r: RouterProcess) -> tuple[str, int]:
    host, port = r.status()["mqtt"].rsplit(":", 1)
    return host, int(port)


def wait_until(cond: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what or cond}")
        time.sleep(0.02)


class Paho:
    """A paho-mqtt client on its own network thread, recording what it gets."""

    def __init__(self, r: RouterProcess, cid: str, v5: bool = True, persistent: bool = False,
                 reconnect: bool = True) -> None:
        self.v5 = v5
        self.addr = mqtt_addr(r)
        kw: dict[str, Any] = {"reconnect_on_failure": reconnect}
        if not v5:
            kw["clean_session"] = not persistent
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid,
                             protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311, **kw)
        self.persistent = persistent
        self.got: list[mqtt.MQTTMessage] = []
        self.acked: list[int] = []
        self.present: list[bool] = []
        self.connack: list[Any] = []
        self.subacks: list[list[Any]] = []
        self.c.on_message = lambda c, u, m: self.got.append(m)
        self.c.on_publish = lambda c, u, mid, rc, props: self.acked.append(mid)
        self.c.on_connect = self._on_connect
        self.c.on_subscribe = lambda c, u, mid, codes, props: self.subacks.append(list(codes))

    def _on_connect(self, c: Any, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.present.append(bool(flags.session_present))
        self.connack.append(rc)

    def connect(self) -> Paho:
        n = len(self.connack)
        if self.v5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 300 if self.persistent else 0
            self.c.connect(*self.addr, clean_start=not self.persistent, properties=props)
        else:
            self.c.connect(*self.addr)
        self.c.loop_start()
        wait_until(lambda: len(self.connack) > n, what="CONNACK")
        return self

    def subscribe(self, topic: str, qos: int = 2) -> list[Any]:
        n = len(self.subacks)
        self.c.subscribe(topic, qos=qos)
        wait_until(lambda: len(self.subacks) > n, what="SUBACK")
        return self.subacks[-1]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


@contextmanager
def paho(r: RouterProcess, cid: str, **kw: Any) -> Iterator[Paho]:
    p = Paho(r, cid, **kw).connect()
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def mq(make_router: Any) -> RouterProcess:
    r: RouterProcess = make_router("Q", settings={"mqtt_listen": "127.0.0.1:0"})
    return r


@pytest.mark.parametrize("pub_v5,sub_v5", [(True, True), (False, True), (True, False)])
def test_qos2_each_message_once_at_both_protocol_levels(mq: RouterProcess, pub_v5: bool, sub_v5: bool) -> None:
    n = 150
    with paho(mq, "s", v5=sub_v5) as s, paho(mq, "p", v5=pub_v5) as p:
        assert [str(c) for c in s.subscribe("lv/#")] == ["Granted QoS 2"]
        for i in range(n):
            p.c.publish(f"lv/{i % 3}", f"m{i}".encode(), qos=2)
        wait_until(lambda: len(s.got) >= n and len(p.acked) >= n, what="all delivered and acknowledged")
        time.sleep(0.3)  # (nothing more may come)
        assert sorted(m.payload for m in s.got) == sorted(f"m{i}".encode() for i in range(n))
        assert {m.topic for m in s.got} == {"lv/0", "lv/1", "lv/2"} and all(m.qos == 2 for m in s.got)
        assert len(p.acked) == n


def test_pubrec_waits_for_a_persistent_session_that_is_away_and_it_gets_each_message_once(
        mq: RouterProcess) -> None:
    """A publisher hears PUBREC only when every subscription owed the message accepted it: a
    persistent subscriber away holds it; once back it gets each message, once, and the publisher
    its acknowledgements."""
    sub = Paho(mq, "away", persistent=True).connect()
    assert [str(c) for c in sub.subscribe("pw/x")] == ["Granted QoS 2"]
    sub.close()
    with paho(mq, "pw-pub") as p:
        for i in range(20):
            p.c.publish("pw/x", f"m{i}".encode(), qos=2)
        time.sleep(1.0)
        assert p.acked == []  # the mesh did not decide: the subscription owed them has not accepted them
        back = Paho(mq, "away", persistent=True).connect()
        try:
            assert back.present == [True]
            wait_until(lambda: len(back.got) >= 20 and len(p.acked) >= 20, what="delivered after the return")
            time.sleep(0.3)
            assert sorted(m.payload for m in back.got) == sorted(f"m{i}".encode() for i in range(20))
        finally:
            back.close()


def test_a_3_1_1_session_without_clean_session_is_resumed_with_its_subscription(mq: RouterProcess) -> None:
    sub = Paho(mq, "v4-away", v5=False, persistent=True).connect()
    sub.subscribe("v4/x", qos=1)
    sub.close()
    with paho(mq, "v4-pub", v5=False) as p:
        for i in range(10):
            p.c.publish("v4/x", f"m{i}".encode(), qos=1)
        back = Paho(mq, "v4-away", v5=False, persistent=True).connect()
        try:
            assert back.present == [True]
            wait_until(lambda: len({m.payload for m in back.got}) >= 10 and len(p.acked) >= 10,
                       what="delivered after the return")
            assert {m.payload for m in back.got} == {f"m{i}".encode() for i in range(10)}
        finally:
            back.close()


def test_amqp_and_mqtt_share_one_topic_space_both_ways(mq: RouterProcess) -> None:
    with BlockingClient(mq.url) as amqp, paho(mq, "mix-s") as s, paho(mq, "mix-p") as p:
        s.subscribe("mix/+")
        asub = amqp.subscriber("mix/m", "amqp-sub", expiry=0)
        asub.wait_attached(10)
        # AMQP -> MQTT: body, content type, reply-to, correlation id, application properties
        msg = Message(body=b"from-amqp", content_type="text/plain", reply_to="mix/reply",
                      correlation_id=b"c-1", properties={"k": "v", "n": 3})
        res = amqp.publisher("mix/a").put(msg.encode(), raw=True, timeout=20)
        assert res.accepted
        wait_until(lambda: len(s.got) >= 1, what="the AMQP message at the MQTT subscriber")
        m = s.got[0]
        assert (m.topic, m.payload) == ("mix/a", b"from-amqp")
        props = m.properties
        assert props.ContentType == "text/plain" and props.ResponseTopic == "mix/reply"
        assert props.CorrelationData == b"c-1"
        assert ("k", "v") in props.UserProperty and ("n", "3") in props.UserProperty
        # MQTT -> AMQP
        out = Properties(PacketTypes.PUBLISH)
        out.ContentType = "application/json"
        out.UserProperty = [("a", "1"), ("a", "2")]
        out.CorrelationData = b"xyz"
        p.c.publish("mix/m", b'{"v": 1}', qos=2, properties=out)
        d = asub.get(timeout=20)
        assert d is not None
        got = Message()
        got.decode(d.payload)
        assert got.body == b'{"v": 1}' and got.content_type == "application/json"
        assert got.address == "mix/m" and got.correlation_id == b"xyz"
        assert got.properties["a"] == "1"  # (repeated names: the first; MQTT subscribers get the list)
        wait_until(lambda: len(s.got) >= 2, what="the MQTT message at the MQTT subscriber too")
        assert s.got[1].properties.UserProperty == [("a", "1"), ("a", "2")]


def raw_connect(addr: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(addr, timeout=10)
    return sock


def read_packet(sock: socket.socket) -> bytes:
    first = sock.recv(1)
    if not first:
        return b""
    mult, length, head = 1, 0, first
    while True:
        b = sock.recv(1)[0]
        head += bytes([b])
        length += (b & 0x7F) * mult
        mult *= 128
        if not b & 0x80:
            break
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            break
        body += chunk
    return head + body


def connect_packet(level: int, cid: bytes = b"raw", name: bytes = b"MQTT") -> bytes:
    var = struct.pack("!H", len(name)) + name + bytes([level, 0x02]) + struct.pack("!H", 30)
    if level == 5:
        var += b"\x00"
    payload = struct.pack("!H", len(cid)) + cid
    body = var + payload
    return bytes([0x10, len(body)]) + body


def test_bad_input_gets_the_protocols_answer_and_the_router_goes_on(mq: RouterProcess) -> None:
    addr = mqtt_addr(mq)
    # garbage: closed
    with raw_connect(addr) as s:
        s.sendall(b"\xff\x00garbage" * 10)
        assert read_packet(s) == b"" or s.recv(100) == b""
    # an unknown protocol level: 3.1.1's CONNACK 1 (unacceptable protocol version)
    with raw_connect(addr) as s:
        s.sendall(connect_packet(3, name=b"MQIsdp"))
        assert read_packet(s) == b"\x20\x02\x00\x01"
    # MQTT 5 with level 6: CONNACK 0x84
    with raw_connect(addr) as s:
        s.sendall(connect_packet(6))
        ack = read_packet(s)
        assert ack[:1] == b"\x20" and ack[3] == 0x84
    # a second CONNECT: DISCONNECT protocol error (MQTT 5), then closed
    with raw_connect(addr) as s:
        s.sendall(connect_packet(5))
        assert read_packet(s)[:1] == b"\x20"
        s.sendall(connect_packet(5))
        d = read_packet(s)
        assert d[:1] == b"\xe0" and d[2] == 0x82
    # oversize: a PUBLISH announcing more than the maximum packet size
    with raw_connect(addr) as s:
        s.sendall(connect_packet(5))
        read_packet(s)
        s.sendall(b"\x32\xff\xff\xff\x7f")
        d = read_packet(s)
        assert d == b"" or (d[:1] == b"\xe0" and d[2] == 0x95)
    # fuzzed packets after a valid CONNECT (a fixed seed: the same bytes each run)
    rng = random.Random(7)
    for i in range(40):
        with raw_connect(addr) as s:
            s.sendall(connect_packet(5 if i % 2 else 4, cid=f"fz{i}".encode()))
            assert read_packet(s)[:1] == b"\x20"
            junk = bytes([rng.choice([0x30, 0x32, 0x34, 0x62, 0x82, 0xa2, 0xc0, 0xe0, 0xf0, 0x10, 0x20])]) + bytes(
                rng.randrange(256) for _ in range(rng.randrange(1, 60)))
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)  # (no more bytes: a packet left half-way ends with the connection)
            s.settimeout(5)
            try:
                while read_packet(s):  # (answers, a DISCONNECT, then the close; or a wait for more bytes)
                    pass
            except (TimeoutError, OSError, IndexError):
                pass
    # the router is still there and serves
    with paho(mq, "after") as c, paho(mq, "after-p") as p:
        c.subscribe("ok")
        p.c.publish("ok", b"fine", qos=1)
        wait_until(lambda: len(c.got) == 1, what="a message after the bad input")
    log = (mq.log_dir / "Q.router.log").read_text()
    assert "mqtt.bad_packet" in log


def test_the_settlement_log_records_mqtt_subscriptions_and_their_acceptances(mq: RouterProcess) -> None:
    with paho(mq, "logged-s") as s, paho(mq, "logged-p") as p:
        s.subscribe("lg/t")
        for i in range(5):
            p.c.publish("lg/t", f"{i}".encode(), qos=2)
        wait_until(lambda: len(p.acked) == 5, what="acknowledgements")
    events = [e for f in sorted(mq.log_dir.glob("Q.settlement.*")) for e in read_events(f)]
    subscribed = [e for e in events if e.get("ev") == "subscribed" and e.get("container") == "logged-s"]
    assert subscribed and subscribed[0]["link"] == "lg/t" and subscribed[0]["info"] == "mqtt"
    sid = subscribed[0]["sub"]
    accepted = {e["gid"] for e in events if e.get("ev") == "accepted" and e.get("sub") == sid}
    outcomes = {e["gid"] for e in events if e.get("ev") == "outcome"}
    assert len(accepted) == 5 and accepted <= outcomes


def test_logins_against_the_users_file(make_router: Any, tmp_path: Any) -> None:
    users = tmp_path / "users.json"
    done = subprocess.run([sys.executable, "-m", "oncemesh", "user", "add", "alice", "--users-file", str(users),
                           "--password-stdin", "--iterations", "4096"], input="wonderland\n", text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    r: RouterProcess = make_router("U", settings={"mqtt_listen": "127.0.0.1:0", "users_file": str(users)})
    for v5 in (True, False):
        anonymous = Paho(r, "nobody", v5=v5)
        anonymous.c.connect(*anonymous.addr)
        anonymous.c.loop_start()
        wait_until(lambda a=anonymous: bool(a.connack), what="CONNACK")  # type: ignore[misc]
        anonymous.c.loop_stop()
        # (paho names a 3.1.1 return code by its MQTT 5 reason: 5 is "Not authorized", 4 "Bad user name or password")
        assert str(anonymous.connack[0]) == "Not authorized"
        wrong = Paho(r, "mallory", v5=v5)
        wrong.c.username_pw_set("alice", "guess")
        wrong.c.connect(*wrong.addr)
        wrong.c.loop_start()
        wait_until(lambda w=wrong: bool(w.connack), what="CONNACK")  # type: ignore[misc]
        wrong.c.loop_stop()
        assert str(wrong.connack[0]) == "Bad user name or password"
    alice = Paho(r, "alice-1")
    alice.c.username_pw_set("alice", "wonderland")
    alice.connect()
    try:
        assert alice.connack[0].value == 0
        assert [str(c) for c in alice.subscribe("u/t")] == ["Granted QoS 2"]
    finally:
        alice.close()
    # the client id is alice's session now: another identity may not take it over
    other = Paho(r, "alice-1")
    other.c.connect(*other.addr)
    other.c.loop_start()
    wait_until(lambda: bool(other.connack), what="CONNACK")
    other.c.loop_stop()
    assert str(other.connack[0]) == "Not authorized"
    assert "mqtt.login_failed" in (r.log_dir / "U.router.log").read_text()


class _MeshRouter:
    """What `Paho` reads of a router (its status' MQTT address), for a router of a launched mesh."""

    def __init__(self, mesh: Any, rid: str) -> None:
        self.mesh = mesh
        self.rid = rid

    def status(self) -> dict[str, Any]:
        return json.loads(self.mesh.ready_file(self.rid).read_text())


def test_mqtt_clients_across_a_mesh_each_message_once(mesh_of: Any, tmp_path: Any) -> None:
    """line3 with an MQTT listener on every router: a QoS 2 publisher at A, a persistent QoS 2
    subscriber at C and a wildcard one at B; C's goes away mid-stream (DISCONNECT) and comes back
    at C: each message once at each subscriber, and every PUBCOMP at the publisher."""
    topo = tmp_path / "line3-mqtt.toml"
    topo.write_text('[defaults]\nmqtt_listen = "127.0.0.1:0"\n\n' + (EXAMPLES / "line3.toml").read_text())
    m = mesh_of(topo)
    a, b, c = (_MeshRouter(m, rid) for rid in "ABC")
    statuses = m.status()
    assert all(s.mqtt for s in statuses) and format_table(statuses).count("mqtt://") == 3  # (oncemesh status)
    n = 200
    at_c = Paho(c, "mesh-c", persistent=True).connect()  # type: ignore[arg-type]
    at_c.subscribe("mesh/t")
    with paho(b, "mesh-b") as at_b, paho(a, "mesh-p") as p:  # type: ignore[arg-type]
        at_b.subscribe("mesh/+")
        for i in range(n):
            p.c.publish("mesh/t", f"m{i}".encode(), qos=2)
            if i == n // 2:
                wait_until(lambda: len(at_c.got) > n // 4, what="C's subscriber under way")
                at_c.close()
        # the same client object comes back: an MQTT client keeps its session's state (the QoS 2
        # packet ids it took and has not seen released) across its connections, as the protocol asks
        at_c.connect()
        try:
            assert at_c.present == [False, True]
            wait_until(lambda: len(p.acked) >= n and len(at_b.got) >= n and len(at_c.got) >= n, timeout=60,
                       what="every message at B and C, every PUBCOMP at A")
            time.sleep(0.3)
            assert sorted(m.payload for m in at_c.got) == sorted(f"m{i}".encode() for i in range(n))
            assert sorted(m.payload for m in at_b.got) == sorted(f"m{i}".encode() for i in range(n))
        finally:
            at_c.close()


def test_qos2_sessions_resume_at_another_router_after_a_crash_each_message_once(mesh_of: Any, tmp_path: Any) -> None:
    """line3 with an MQTT listener on every router; a persistent QoS 2 publisher and subscriber, both
    at A. A is SIGKILLed mid-stream; both clients come back at B, with their own session state (the
    MQTT client keeps its side), and B takes the session's state from A's keeper (interrouter/keeper.py):
    every message reaches the subscriber once, and every PUBLISH gets its PUBCOMP."""
    topo = tmp_path / "line3-mqtt.toml"
    topo.write_text('[defaults]\nmqtt_listen = "127.0.0.1:0"\n\n' + (EXAMPLES / "line3.toml").read_text())
    m = mesh_of(topo)
    a, b = _MeshRouter(m, "A"), _MeshRouter(m, "B")
    n = 300
    # (the test is their failover: paho-mqtt 2.2.0 retrying the dead router itself resets its
    # in-flight messages at each attempt, and after two it sends a message it had PUBREC for again
    # as a new PUBLISH, its own duplicate: docs/mqtt.md, "Clients")
    sub = Paho(a, "crash-s", persistent=True, reconnect=False).connect()  # type: ignore[arg-type]
    pub = Paho(a, "crash-p", persistent=True, reconnect=False).connect()  # type: ignore[arg-type]
    try:
        sub.subscribe("crash/t")
        for i in range(n):
            pub.c.publish("crash/t", f"m{i}".encode(), qos=2)
        wait_until(lambda: len(sub.got) >= n // 3, what="a third delivered")
        m.kill_router("A")
        for c in (sub, pub):
            c.c.loop_stop()
            c.addr = mqtt_addr(b)  # type: ignore[arg-type]
            c.connect()
        assert sub.present[-1] and pub.present[-1]  # (their sessions, restored at B from A's keeper)
        try:
            wait_until(lambda: len(pub.acked) >= n and len(sub.got) >= n, timeout=60,
                       what="every message delivered and every PUBCOMP")
        except AssertionError:
            missing = sorted({f"m{i}".encode() for i in range(n)} - {x.payload for x in sub.got})
            raise AssertionError(f"{len(pub.acked)} PUBCOMPs of {n}, {len(sub.got)} delivered; missing "
                                 f"{missing[:10]}") from None
        time.sleep(0.5)
        got = [x.payload for x in sub.got]
        twice = sorted(g for g in set(got) if got.count(g) > 1)
        assert not twice, "delivered twice (payload, [(packet id, dup, index)]): " + str(
            [(g, [(x.mid, x.dup, i) for i, x in enumerate(sub.got) if x.payload == g]) for g in twice[:5]])
        assert set(got) == {f"m{i}".encode() for i in range(n)}
    finally:
        sub.close()
        pub.close()
    log = (m.log_dir / "B.router.log").read_text()
    assert "mqtt.session_restored client=crash-s" in log and "mqtt.session_restored client=crash-p" in log
    # B, their keeper, declared for the publisher's links when A went (router/core.py, publisher_gone)
    assert "mqtt.session_orphaned client=crash-p" in log


SQUARE = """[mesh]
name = "square"
hello_interval = 1.0
dead_after = 3.0

[defaults]
mqtt_listen = "127.0.0.1:0"
""" + "".join(f'\n[routers.{r}]\nlisten = "127.0.0.1:0"\ninter_router = "127.0.0.1:0"\n' for r in "ABCD") + "".join(
    f'\n[[links]]\nbetween = ["{x}", "{y}"]\n' for x, y in ("AB", "BC", "CD", "DA"))


def test_a_session_resumes_at_a_router_that_is_not_a_neighbour_of_its_keeper(mesh_of: Any, tmp_path: Any) -> None:
    """A square A - B - C - D - A; a persistent QoS 2 publisher and subscriber at B whose sessions B
    keeps at C (its neighbours are A and C). B is SIGKILLed mid-stream and both clients resume at A,
    which is not a neighbour of C: A asks every router it reaches (interrouter/keeper.py, "Fetch"),
    finds the sessions at C through D, and each message arrives once with every PUBCOMP."""
    from oncemesh.interrouter.keeper import keeper_of

    topo = tmp_path / "square.toml"
    topo.write_text(SQUARE)
    m = mesh_of(topo)
    a, b = _MeshRouter(m, "A"), _MeshRouter(m, "B")
    sub_id, pub_id = (next(f"far-{role}-{i}" for i in range(200) if keeper_of(f"far-{role}-{i}", ["A", "C"]) == "C")
                      for role in ("s", "p"))
    n = 200
    sub = Paho(b, sub_id, persistent=True, reconnect=False).connect()  # type: ignore[arg-type]
    pub = Paho(b, pub_id, persistent=True, reconnect=False).connect()  # type: ignore[arg-type]
    try:
        sub.subscribe("far/t")
        for i in range(n):
            pub.c.publish("far/t", f"m{i}".encode(), qos=2)
        wait_until(lambda: len(sub.got) >= n // 3, what="a third delivered")
        m.kill_router("B")
        for c in (sub, pub):
            c.c.loop_stop()
            c.addr = mqtt_addr(a)  # type: ignore[arg-type]
            c.connect()
        assert sub.present[-1] and pub.present[-1]  # (found at C, two hops from A)
        wait_until(lambda: len(pub.acked) >= n and len(sub.got) >= n, timeout=60,
                   what="every message delivered and every PUBCOMP")
        time.sleep(0.5)
        got = [x.payload for x in sub.got]
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(n)), "lost or delivered twice"
    finally:
        sub.close()
        pub.close()
    log = (m.log_dir / "A.router.log").read_text()
    assert f"mqtt.session_restored client={sub_id}" in log and f"mqtt.session_restored client={pub_id}" in log


def test_the_mqtt_listener_speaks_tls_with_the_client_listeners_certificates(make_router: Any, tmp_path: Any) -> None:
    """With tls_cert the MQTT listener is TLS too: a verified client certificate names the client (as
    SASL EXTERNAL does for AMQP), a user name beside it must be the same, and a password goes over
    TLS only where passwords_without_tls says (not at all here)."""
    pki = tmp_path / "pki"
    make_ca(pki)
    cert, key = issue(pki, "server", ["127.0.0.1"])
    ccert, ckey = issue(pki, "carol", ["carol"], common_name="carol")
    r: RouterProcess = make_router("T", settings={"mqtt_listen": "127.0.0.1:0", "tls_cert": str(cert),
                                                  "tls_key": str(key), "tls_ca": str(pki / "ca.pem"),
                                                  "tls_verify_clients": True})

    def tls_client(cid: str, user: str | None = None) -> Paho:
        p = Paho(r, cid)
        p.c.tls_set(ca_certs=str(pki / "ca.pem"), certfile=str(ccert), keyfile=str(ckey))
        if user is not None:
            p.c.username_pw_set(user, "x")
        return p

    carol = tls_client("carol-1").connect()
    try:
        assert str(carol.connack[0]) == "Success"
        carol.subscribe("tls/t")
        with _tls(tls_client("carol-p")) as p:
            p.c.publish("tls/t", b"over tls", qos=2)
            wait_until(lambda: len(carol.got) == 1, what="the message over TLS")
        assert carol.got[0].payload == b"over tls"
    finally:
        carol.close()
    mallory = tls_client("mallory-1", user="mallory")
    n = len(mallory.connack)
    mallory.c.connect(*mallory.addr)
    mallory.c.loop_start()
    wait_until(lambda: len(mallory.connack) > n, what="CONNACK")
    mallory.c.loop_stop()
    assert str(mallory.connack[-1]) == "Not authorized"  # (the certificate says carol)
    # plain TCP does not reach the TLS listener
    with socket.create_connection(mqtt_addr(r), timeout=10) as s:
        s.sendall(connect_packet(5))
        assert read_packet(s) == b""


@contextmanager
def _tls(p: Paho) -> Iterator[Paho]:
    p.connect()
    try:
        yield p
    finally:
        p.close()


def test_the_policys_limits_apply_to_mqtt_clients(make_router: Any, tmp_path: Any) -> None:
    users = tmp_path / "users.json"
    done = subprocess.run([sys.executable, "-m", "oncemesh", "user", "add", "alice", "--users-file", str(users),
                           "--password-stdin", "--iterations", "4096"], input="wonderland\n", text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    policy = tmp_path / "policy.toml"
    policy.write_text('[users.alice]\npublish = ["lim/#"]\nsubscribe = ["lim/#"]\nmax_connections = 1\n'
                      'max_subscriptions = 1\nmax_message_size = 10\n')
    r: RouterProcess = make_router("L", settings={"mqtt_listen": "127.0.0.1:0", "users_file": str(users),
                                                  "policy_file": str(policy)})
    alice = Paho(r, "alice-a")
    alice.c.username_pw_set("alice", "wonderland")
    alice.connect()
    try:
        assert [str(c) for c in alice.subscribe("lim/a")] == ["Granted QoS 2"]
        assert [str(c) for c in alice.subscribe("lim/b")] == ["Quota exceeded"]  # max_subscriptions 1
        assert [str(c) for c in alice.subscribe("other")] == ["Not authorized"]  # not in her patterns
        rcs: list[Any] = []
        alice.c.on_publish = lambda c, u, mid, rc, props: rcs.append(str(rc))
        alice.c.publish("lim/a", b"x" * 11, qos=1)  # max_message_size 10
        alice.c.publish("lim/a", b"fine", qos=1)
        wait_until(lambda: len(rcs) == 2, what="both PUBACKs")
        assert sorted(rcs) == ["Quota exceeded", "Success"]
        second = Paho(r, "alice-b")
        second.c.username_pw_set("alice", "wonderland")
        second.c.connect(*second.addr)
        second.c.loop_start()
        wait_until(lambda: bool(second.connack), what="CONNACK")
        second.c.loop_stop()
        assert str(second.connack[0]) == "Quota exceeded"  # max_connections 1
    finally:
        alice.close()
    log = (r.log_dir / "L.router.log").read_text()
    assert "connection.refused reason=max_connections_per_user user=alice" in log  # (the router's count, AMQP's too)


def test_shared_subscription_members_at_different_routers_split_the_messages(mesh_of: Any, tmp_path: Any) -> None:
    """$share/GROUP/FILTER members at A and at C of line3: the group lives at the router where it was
    made (A); C relays its member there (interrouter/members.py). Each message reaches one member,
    once, and both take a share."""
    topo = tmp_path / "line3-mqtt.toml"
    topo.write_text('[defaults]\nmqtt_listen = "127.0.0.1:0"\n\n' + (EXAMPLES / "line3.toml").read_text())
    m = mesh_of(topo)
    a, b, c = (_MeshRouter(m, rid) for rid in "ABC")
    n = 200
    with paho(a, "sh-a") as at_a, paho(c, "sh-c") as at_c, paho(b, "sh-p") as p:  # type: ignore[arg-type]
        assert [str(x) for x in at_a.subscribe("$share/g/sh/t")] == ["Granted QoS 2"]
        assert [str(x) for x in at_c.subscribe("$share/g/sh/t")] == ["Granted QoS 2"]
        for i in range(n):
            p.c.publish("sh/t", f"m{i}".encode(), qos=2)
        wait_until(lambda: len(at_a.got) + len(at_c.got) >= n and len(p.acked) >= n, timeout=60,
                   what="every message at one member, every PUBCOMP")
        time.sleep(0.3)
        every = [x.payload for x in at_a.got] + [x.payload for x in at_c.got]
        assert sorted(every) == sorted(f"m{i}".encode() for i in range(n))
        assert at_a.got and at_c.got, (len(at_a.got), len(at_c.got))
    assert "mqtt.relayed client=sh-c" in (m.log_dir / "C.router.log").read_text()


def test_a_will_is_published_after_its_delay_unless_the_client_is_back(mq: RouterProcess) -> None:
    def dying(cid: str) -> Paho:
        p = Paho(mq, cid, persistent=True)
        props = Properties(PacketTypes.WILLMESSAGE)
        props.WillDelayInterval = 2
        p.c.will_set("will/t", f"{cid} is gone".encode(), qos=1, properties=props)
        return p.connect()

    def vanish(p: Paho) -> None:  # (the connection drops: no DISCONNECT)
        p.c.loop_stop()
        sock = p.c.socket()
        assert sock is not None
        sock.close()

    with paho(mq, "will-watch") as watch:
        watch.subscribe("will/t", qos=1)
        gone = dying("will-a")
        back = dying("will-b")
        t0 = time.monotonic()
        vanish(gone)
        vanish(back)
        again = Paho(mq, "will-b", persistent=True).connect()  # back within the delay: no will for it
        try:
            time.sleep(1.0)
            assert watch.got == []  # not before the delay
            wait_until(lambda: len(watch.got) >= 1, timeout=10, what="will-a's will")
            assert time.monotonic() - t0 >= 1.9
            time.sleep(2.0)
            assert [m.payload for m in watch.got] == [b"will-a is gone"]
        finally:
            again.close()
