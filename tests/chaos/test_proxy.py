"""The fault-injecting proxy on its own: forwarding, cut, blackhole, delay, re-resolving its target.

    client socket --> proxy (127.0.0.1:0) --> echo server (127.0.0.1:0)

Plain blocking sockets with timeouts on the test side; the proxies run on the hub's thread.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from oncemesh.topology.proxy import HOST, LinkProxy, Mode, ProxyError, ProxyHub

TIMEOUT = 5.0


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while True:
            try:
                data = self.request.recv(65536)
            except OSError:
                return
            if not data:
                return
            self.request.sendall(data)


class EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__((HOST, 0), _Echo)
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def addr(self) -> tuple[str, int]:
        host, port = self.server_address[:2]
        return str(host), int(port)

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub() -> Iterator[ProxyHub]:
    with ProxyHub() as h:
        yield h


def connect(port: int) -> socket.socket:
    s = socket.create_connection((HOST, port), timeout=TIMEOUT)
    s.settimeout(TIMEOUT)
    return s


def roundtrip(s: socket.socket, data: bytes) -> bytes:
    s.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def is_reset(s: socket.socket) -> bool:
    """The connection was reset (or closed) by the other side: a send/recv fails or reads EOF."""
    s.settimeout(TIMEOUT)
    try:
        s.sendall(b"ping")
        return s.recv(16) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def refused(port: int) -> bool:
    """A new connection gets nowhere: reset while connecting (the RST can beat connect()'s return),
    or reset right after."""
    try:
        s = connect(port)
    except ConnectionResetError:
        return True
    with s:
        return is_reset(s)


def wait_until(pred: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_forwards_both_ways_on_loopback_port_0(hub: ProxyHub, echo: EchoServer) -> None:
    port = hub.add("A-B", lambda: echo.addr)
    assert port != 0 and hub.address("A-B") == f"{HOST}:{port}"
    with connect(port) as s:
        assert s.getpeername() == (HOST, port)
        big = bytes(range(256)) * 2000  # 512 KB: several chunks, back-pressure in between
        assert roundtrip(s, big) == big
    st = hub.stats("A-B")
    assert st.accepted == 1 and st.forwarded == 1 and st.bytes_up == len(big) and st.bytes_down == len(big)


def test_cut_resets_every_connection_and_refuses_new_ones_until_restored(hub: ProxyHub, echo: EchoServer) -> None:
    port = hub.add("A-B", lambda: echo.addr)
    a, b = connect(port), connect(port)
    assert roundtrip(a, b"x") == b"x" and roundtrip(b, b"y") == b"y"
    hub.cut("A-B")
    assert hub.mode("A-B") is Mode.CUT
    assert is_reset(a) and is_reset(b)
    assert refused(port)  # accepted by the kernel, reset by the proxy: nothing gets through
    hub.restore("A-B")
    with connect(port) as d:
        assert roundtrip(d, b"again") == b"again"
    assert hub.stats("A-B").reset >= 3
    a.close()
    b.close()


def test_blackhole_moves_nothing_then_restore_delivers_what_waited(hub: ProxyHub, echo: EchoServer) -> None:
    port = hub.add("A-B", lambda: echo.addr)
    s = connect(port)
    assert roundtrip(s, b"before") == b"before"
    hub.blackhole("A-B")
    s.sendall(b"held")
    s.settimeout(0.5)
    with pytest.raises(TimeoutError):
        s.recv(16)  # silent, not reset: only a heartbeat timeout would notice
    late = connect(port)  # accepted, but not answered either
    late.settimeout(0.3)
    late.sendall(b"late")
    with pytest.raises(TimeoutError):
        late.recv(16)
    hub.restore("A-B")
    s.settimeout(TIMEOUT)
    late.settimeout(TIMEOUT)
    assert s.recv(16) == b"held"
    assert late.recv(16) == b"late"
    s.close()
    late.close()


def test_delay_holds_each_chunk_and_keeps_order(hub: ProxyHub, echo: EchoServer) -> None:
    port = hub.add("A-B", lambda: echo.addr)
    hub.set_delay("A-B", 0.2)
    with connect(port) as s:
        t0 = time.monotonic()
        assert roundtrip(s, b"one") == b"one"
        assert time.monotonic() - t0 >= 0.4  # 0.2 s each way
        for i in range(5):
            s.sendall(f"<{i}>".encode())
        got = b""
        while len(got) < 15:
            got += s.recv(64)
        assert got == b"<0><1><2><3><4>"
    hub.set_delay("A-B", 0.0)
    with pytest.raises(ProxyError):
        hub.set_delay("nope", 1.0)


def test_wan_link_delays_with_jitter_in_order_and_a_loss_costs_a_retransmission(hub: ProxyHub,
                                                                            echo: EchoServer) -> None:
    port = hub.add("A-B", lambda: echo.addr)
    hub.set_wan("A-B", 0.05, jitter=0.02, seed=1)
    with connect(port) as s:
        times = []
        for i in range(5):
            t0 = time.monotonic()
            assert roundtrip(s, f"<{i}>".encode()) == f"<{i}>".encode()
            times.append(time.monotonic() - t0)
        assert all(0.06 <= t < 1.0 for t in times), times  # two one-way delays of 50 +- 20 ms
        for i in range(20):  # jitter never reorders (TCP delivers in order)
            s.sendall(f"<{i:02d}>".encode())
        got = b""
        while len(got) < 80:
            got += s.recv(256)
        assert got == b"".join(f"<{i:02d}>".encode() for i in range(20))
    hub.set_wan("A-B", 0.05, loss=0.9, seed=1)  # nearly every chunk waits for a retransmission
    with connect(port) as s:
        t0 = time.monotonic()
        assert roundtrip(s, b"lost?") == b"lost?"  # an idle link: probe and retransmission, 3 round trips
        assert time.monotonic() - t0 >= 0.1 + 0.3
    assert hub.stats("A-B").lost >= 1
    hub.set_wan("A-B", 0.0, rate=20_000)  # 20 kB/s: 8 kB take 0.4 s
    with connect(port) as s:
        t0 = time.monotonic()
        s.sendall(b"x" * 8000)
        got = b""
        while len(got) < 8000:
            got += s.recv(65536)
        assert time.monotonic() - t0 >= 0.35
    with pytest.raises(ValueError):
        LinkProxy("x", lambda: None).set_wan(0.01, loss=1.5)


def test_target_is_resolved_at_each_accept(hub: ProxyHub) -> None:
    """A listener that restarts on a new port is found by the next connection."""
    first, second = EchoServer(), EchoServer()
    target: list[tuple[str, int] | None] = [first.addr]
    try:
        port = hub.add("A-B", lambda: target[0])
        with connect(port) as s:
            assert roundtrip(s, b"1") == b"1"
        target[0] = None  # listener down (no ready file): the dialer is reset at once
        assert refused(port)
        first.stop()
        target[0] = first.addr  # stale address of a dead listener: reset too
        assert refused(port)
        target[0] = second.addr
        with connect(port) as s:
            assert roundtrip(s, b"2") == b"2"
        assert hub.stats("A-B").forwarded == 2
    finally:
        second.stop()


def test_one_side_closing_closes_the_other(hub: ProxyHub, echo: EchoServer) -> None:
    port = hub.add("A-B", lambda: echo.addr)
    s = connect(port)
    assert roundtrip(s, b"x") == b"x"
    s.shutdown(socket.SHUT_WR)
    assert s.recv(16) == b""  # the echo server saw EOF, closed, and the proxy passed it back
    s.close()
    wait_until(lambda: hub.stats("A-B").open == 0, "the proxy to forget the connection")


def test_only_loopback_and_unknown_names_are_errors(hub: ProxyHub, echo: EchoServer) -> None:
    with pytest.raises(ValueError):
        LinkProxy("x", lambda: echo.addr, host="0.0.0.0")
    hub.add("A-B", lambda: echo.addr)
    with pytest.raises(ProxyError):
        hub.add("A-B", lambda: echo.addr)
    with pytest.raises(ProxyError):
        hub.cut("B-C")
    assert hub.names() == ["A-B"]


def test_close_resets_open_connections_and_stops_the_thread(echo: EchoServer) -> None:
    hub = ProxyHub()
    hub.start()
    port = hub.add("A-B", lambda: echo.addr)
    s = connect(port)
    assert roundtrip(s, b"x") == b"x"
    hub.close()
    assert not hub.running
    assert is_reset(s)
    s.close()
    with pytest.raises(OSError):
        connect(port).close()
    with pytest.raises(ProxyError):
        hub.add("B-C", lambda: echo.addr)
