"""Hole 3 of issue 31, its second half: no single connection's work may hold the router's loop
(common/passrules.py, rule 5: a budget per connection and pass). One raw client floods the router
with thousands of attaches in one burst while another client goes on with its round trips
(publish, hand-over, accept, outcome): it must make progress while the flood is being taken, not
only after it. Judged by the order of events (round trips completed between the flood's first byte
and the router's answer to its last frame), never by a time threshold."""

from __future__ import annotations

import asyncio
import struct
import threading
from typing import Any

from proton import ubyte, uint

from oncemesh.clients.runtime import Client
from oncemesh.harness.procs import wait_for
from tests.integration.rawamqp import ATTACH, CLOSE, DETACH, RawClient, described, frame

FLOOD = 2000  # attaches in one burst (under the connection's link limit, raised for the test)


class RoundTrips(threading.Thread):
    """A publisher and a subscriber on one connection, one message at a time, counting round trips
    (each: sent, handed, accepted, its outcome back) until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.done = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # (reported by the test)
            self.error = exc

    async def _main(self) -> None:
        c = await Client(self.url, container_id="steady").start()
        try:
            sub = c.subscriber("rt", "s", expiry=0)
            await sub.wait_attached(10)
            pub = c.publisher("rt", "p")
            while not self.stopping.is_set():
                fut = await pub.send(f"ping {self.done}")
                assert len(await sub.get_many(1, timeout=30)) == 1
                assert (await asyncio.wait_for(fut, 30)).accepted
                self.done += 1
        finally:
            await c.close()


def flood(port: int, n: int, on_sent: Any, on_done: Any) -> int:
    """Attach `n` publisher links on one connection in one burst, then detach the first: the answer
    to that detach comes after every answer to the attaches. `on_sent` is called before the burst
    goes, `on_done` as soon as that last answer is read (frames are only counted by their
    performative, never decoded: the time of reading must be the router's, not ours). Returns the
    links answered open."""
    c = RawClient("127.0.0.1", port, timeout=120)
    try:
        c.handshake("flood")
        burst = b"".join(frame(ATTACH, [f"p{i}", uint(i), False, ubyte(0), ubyte(1), described(0x28, ["src"]),
                                        described(0x29, ["flood"]), None, None, uint(0)]) for i in range(n))
        on_sent()
        c.send(burst + frame(DETACH, [uint(0), True]))
        buf = c.buf
        attached = 0
        while True:
            while len(buf) >= 8:
                size = struct.unpack_from(">I", buf)[0]
                if len(buf) < size:
                    break
                body, buf = buf[:size], buf[size:]
                code = body[10] if size > 10 and body[8:10] == b"\x00\x53" else None  # (small ulong descriptor)
                assert code not in (CLOSE, None), body
                if code == ATTACH:
                    attached += 1
                elif code == DETACH:
                    on_done()
                    return attached
            chunk = c.sock.recv(1 << 16)
            assert chunk, "the router closed the connection"
            buf += chunk
    finally:
        c.close()


def test_a_connection_flooding_attaches_does_not_hold_up_another_clients_round_trips(make_router: Any) -> None:
    r = make_router("F", settings={"allow_anonymous": True, "max_links_per_connection": FLOOD + 10})
    steady = RoundTrips(r.url)
    steady.start()
    try:
        wait_for(lambda: steady.done >= 3 or steady.error is not None, 30, "the steady client's first round trips")
        assert steady.error is None, steady.error
        at: dict[str, int] = {}
        attached = flood(r.port, FLOOD, lambda: at.setdefault("start", steady.done),
                         lambda: at.setdefault("end", steady.done))
        during = at["end"] - at["start"]
        assert attached == FLOOD
        # Without a budget the router took the flood as it read it (two or three reads of 64-256 KiB,
        # each a pass of up to ~1 s here), and the steady client completed at most a round trip
        # between the flood's first byte and its last answer; taken in slices of a budget per pass,
        # the steady client goes on between them (22-30 round trips here).
        assert during >= 5, f"the steady client completed {during} round trips while the flood was taken"
    finally:
        steady.stopping.set()
        steady.join(30)
    assert steady.error is None, steady.error
