"""Proton's pool of freed deliveries and its trim (common/ffi.py, `trim_delivery_pool`).

Proton pools a connection's freed deliveries for reuse, each with its byte buffer at the largest
message it carried; the router cuts the pools back once a minute. These tests drive a real Proton
connection (no socket: deliveries on a link of an unbound connection are freed when settled)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cproton_ffi import ffi, lib

from oncemesh.common import ffi as F
from oncemesh.common.cmalloc import mallinfo_reader


@pytest.fixture
def link() -> Iterator[tuple[Any, Any]]:
    """A sender link of a connection without a transport: a settled delivery is freed at once."""
    conn = lib.pn_connection()
    snd = lib.pn_sender(lib.pn_session(conn), b"out")
    yield conn, snd
    lib.pn_connection_release(conn)


def send_and_settle(snd: Any, count: int, size: int) -> None:
    body = b"x" * size
    ds = []
    for i in range(count):
        tag = str(i).encode()
        ds.append(lib.pn_delivery(snd, (len(tag), ffi.from_buffer(tag))))
        lib.pn_link_send(snd, body, len(body))
        lib.pn_link_advance(snd)
    for d in ds:
        lib.pn_delivery_settle(d)


def test_the_layout_check_finds_the_pool_of_a_connection_bound_to_its_transport() -> None:
    conn, transport = lib.pn_connection(), lib.pn_transport()
    lib.pn_transport_bind(transport, conn)  # (as every connection of ours is: the check reads its transport)
    try:
        assert F.delivery_pool(conn) != F.NULL
        assert F.pool_size(conn) == 0
    finally:
        lib.pn_transport_unbind(transport)
        lib.pn_connection_release(conn)
        lib.pn_decref(transport)
    assert F.delivery_pool(F.NULL) == F.NULL and F.trim_delivery_pool(F.NULL, 0) == 0


def test_a_connection_of_another_layout_is_not_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the checked fields are not where 0.40.0 keeps them (here: the offsets shifted by one
    field, as another build's layout would put them), nothing is read as a pool or freed."""
    conn, transport = lib.pn_connection(), lib.pn_transport()
    lib.pn_transport_bind(transport, conn)
    try:
        assert F.delivery_pool(conn) != F.NULL
        monkeypatch.setattr(F, "_CONNECTION_CHECKS", tuple((off + 8, g) for off, g in F._CONNECTION_CHECKS))
        assert F.delivery_pool(conn) == F.NULL
        assert F.pool_size(conn) == 0 and F.trim_delivery_pool(conn, 0) == 0
    finally:
        lib.pn_transport_unbind(transport)
        lib.pn_connection_release(conn)
        lib.pn_decref(transport)


def test_settled_deliveries_are_pooled_and_the_trim_keeps_the_newest(link: tuple[Any, Any]) -> None:
    conn, snd = link
    send_and_settle(snd, 10, 100)
    assert F.pool_size(conn) == 10
    assert F.trim_delivery_pool(conn, 3) == 7
    assert F.pool_size(conn) == 3
    assert F.trim_delivery_pool(conn, 3) == 0
    # the pool goes on working: new deliveries take the pooled ones first, then new ones
    send_and_settle(snd, 5, 100)
    assert F.pool_size(conn) == 5
    assert F.trim_delivery_pool(conn, 0) == 5 and F.pool_size(conn) == 0
    send_and_settle(snd, 2, 100)
    assert F.pool_size(conn) == 2


def test_a_trim_gives_the_large_buffers_back_to_the_c_heap(link: tuple[Any, Any]) -> None:
    """The reason for the trim: a pooled delivery keeps a buffer as large as its largest message."""
    mallinfo = mallinfo_reader()
    if mallinfo is None:
        pytest.skip("glibc's mallinfo2 is needed to see the C heap")
    conn, snd = link
    send_and_settle(snd, 100, 64 * 1024)  # a burst of large messages: 100 pooled 64 KiB buffers
    held = mallinfo()["in_use"] + mallinfo()["mmapped"]
    send_and_settle(snd, 100, 10)  # small ones after it reuse the same deliveries: nothing given back
    assert mallinfo()["in_use"] + mallinfo()["mmapped"] > held - 1024 * 1024
    assert F.trim_delivery_pool(conn, 4) == 96
    assert mallinfo()["in_use"] + mallinfo()["mmapped"] < held - 96 * 60 * 1024
