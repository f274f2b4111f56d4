"""A dial whose TLS handshake fails frees the AMQP connection it made (common/engine.py, `connect`,
`AmqpConnection.abandon`): asyncio never tells such a protocol it existed, so without this its
Proton objects outlive it, one set per retry of a dialer (a router towards a misconfigured peer, a
client towards a router whose certificate it does not trust)."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import pytest

from oncemesh.common import ffi as F
from oncemesh.common.engine import AmqpConnection, Engine, connect


class _Quiet:
    """A connection handler that is never called (the connection never opens)."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"handler called: {name}")


async def _server(reply: bytes) -> tuple[asyncio.Server, int]:
    """A TCP server on loopback that answers anything with `reply` and hangs up (not TLS)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("reply", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b""], ids=["garbage", "hang-up"])
def test_a_failed_tls_dial_frees_the_connection_it_made(reply: bytes) -> None:
    async def main() -> None:
        engine = Engine(asyncio.get_running_loop())
        server, port = await _server(reply)
        made: list[AmqpConnection] = []

        def factory() -> AmqpConnection:
            conn = AmqpConnection(engine, _Quiet(), server=False, container_id="dialer")  # type: ignore[arg-type]
            made.append(conn)
            return conn

        ctx = ssl.create_default_context()
        try:
            for _ in range(3):
                with pytest.raises((ssl.SSLError, OSError)):
                    await connect(engine, factory, "127.0.0.1", port, tls=ctx)
        finally:
            server.close()
            await server.wait_closed()
        assert len(made) == 3  # (the TCP connection was made each time: the handshake failed)
        assert all(c.pn_conn == F.NULL and c.pn_transport == F.NULL for c in made)
        assert len(engine.connections) == 0

    asyncio.run(main())


def test_abandon_leaves_a_connection_that_came_up_alone() -> None:
    async def main() -> None:
        engine = Engine(asyncio.get_running_loop())
        conn = AmqpConnection(engine, _Quiet(), server=False, container_id="x")  # type: ignore[arg-type]
        conn.sock = object()  # type: ignore[assignment]  # (as after connection_made)
        conn.abandon()
        assert conn.pn_conn != F.NULL  # its end is connection_lost's, which reports it
        conn.sock = None
        conn.abandon()
        assert conn.pn_conn == F.NULL
        conn.abandon()  # (twice is harmless)

    asyncio.run(main())
