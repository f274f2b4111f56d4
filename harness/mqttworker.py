"""MQTT 5 QoS 2 worker processes for `oncemesh chaos --mqtt`: a persistent session that fails over.

    python -m oncemesh.harness.mqttworker publish --url H:P[,H:P...] --topic T --client-id C --count N
        [--rate R] [--size B] [--state-dir D] [--report F]
    python -m oncemesh.harness.mqttworker consume --url H:P[,H:P...] --topic T [--topic U ...] --client-id C
        [--count N] [--state-dir D] [--report F]

Built on our own codec (router/mqtt/codec.py, packets.py), as harness/mqttload.py, not paho-mqtt:
`oncemesh chaos` is a product command and paho-mqtt only a test dependency.

Theory of operation. A worker holds one MQTT 5 session (clean start 1 the first time, 0 ever after;
Session Expiry Interval `--expiry`) and keeps the client's half of it, as MQTT asks of a client:

- The publisher's messages in flight: packet id -> (message number, whether PUBREC came). On a new
  connection it sends again, in their order, PUBLISH with DUP for those without PUBREC and PUBREL
  for those with it; never a PUBLISH again once PUBREC came (that would be a new message).
- The subscriber's QoS 2 packet ids PUBREC'd and not yet released. A message is delivered (its
  `delivered` report line) when its PUBLISH first comes under a packet id not held; a PUBLISH under
  a held id is the same message again (DUP) and is only answered with PUBREC; PUBREL releases the id.

On connection loss (or a router silent for `--dead-after` s, or no CONNACK within `--connect-timeout`
s: a SIGSTOPped router still accepts TCP) it goes on at the next address of `--url`, cycling, with
the same client id and that state (`--url-file`: a list re-read before each attempt, which the chaos
runner rewrites when a restarted router's MQTT listener has a new port). A worker restarted with its
state directory starts at the address where its session was last taken (`where.json`: its index in
the list), not at the head of the list: the session lives there, and a router that is neither the
session's keeper nor a neighbour of it would start a new session (docs/mqtt.md, "Where it stops"). `oncemesh chaos` orders the list so that the session's keeper
(docs/mqtt.md, "Sessions across routers") comes right after the home router.

With `--state-dir`, the state is a JSON file written atomically (temporary file, fsync, rename,
fsync of the directory) *before* the packet that depends on it goes out: before a new PUBLISH
(the publisher then continues its numbering after a restart), before PUBREL, before PUBREC of a
new delivery. A delivery is the state's commit: it carries a delivery number (`xid`), and the
report line naming it is written after; a worker restarted with the same state directory writes the
lines of committed deliveries its report lacks, so a SIGKILL between the two neither loses nor
repeats one (a publisher, likewise, the `published` lines of the messages in flight its report
lacks). So a worker SIGKILLed at any point and restarted with the same state directory goes on
exactly once.

Payloads are `NAME:N:` and padding (an AMQP chaos publisher's are the same shape): a subscriber
keys each delivery by (publisher, number), whichever protocol published it, and counts the
duplicates. The report (`--report`, JSON lines, appended, for the chaos runner to poll: `Report`)
says `published` / `completed` / `refused` (publisher), `delivered` (subscriber, with its xid), and
`connected`, `session_lost` (CONNACK without the session a resume needs: the client-side state no
longer matches the server's, a broken promise), `subscribed`, `done`. One JSON summary line is
printed at the end, as harness/worker.py does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.durable import write_durably
from ..router.mqtt.codec import Decoder, MqttError, encode
from ..router.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    SubOptions,
    Subscribe,
)
from .progress import read_new_lines

LEVEL = 5
STATE_FILE = "mqtt-state.json"
WHERE_FILE = "where.json"  # the index in the address list of the last router that took the session
PACKET_ID_NOT_FOUND = 0x92
Packet = Any  # a packet of router/mqtt/packets.py
Report = Callable[[dict[str, Any]], None]


def save_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically and durably (`write_durably`)."""
    write_durably(path, json.dumps(data, sort_keys=True))


def load_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def payload_of(name: str, n: int, size: int) -> bytes:
    head = f"{name}:{n}:".encode()
    return head + b"x" * max(0, size - len(head))


def key_of(payload: bytes) -> tuple[str, int] | None:
    """(publisher name, message number) of a chaos payload `NAME:N:...`, None for any other."""
    parts = payload.split(b":", 2)
    if len(parts) < 3:
        return None
    try:
        return parts[0].decode(), int(parts[1])
    except (UnicodeDecodeError, ValueError):
        return None


# ---------------------------------------------------------------------- the client's session state (pure)
@dataclass(slots=True)
class Publisher:
    """A QoS 2 publisher's half of the session: sans-IO, packets in and out, state saved through
    `save` before the packet that depends on it is returned, report lines through `report`."""

    client_id: str
    topic: str
    count: int
    size: int = 64
    save: Callable[[dict[str, Any]], None] = lambda _: None
    report: Report = lambda _: None
    started: bool = False  # a session exists at the server: connect with clean start 0
    next: int = 0  # the next message's number
    last_pid: int = 0
    inflight: dict[int, list[Any]] = field(default_factory=dict)  # packet id -> [number, PUBREC came]
    unexpected: int = 0  # acks for packet ids not in flight (or in the wrong state)
    refused: int = 0
    completed: int = 0
    session_lost: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"kind": "publish", "client_id": self.client_id, "started": self.started, "next": self.next,
                "last_pid": self.last_pid, "inflight": {str(p): v for p, v in self.inflight.items()}}

    def restore(self, d: dict[str, Any]) -> None:
        if d.get("kind") != "publish" or d.get("client_id") != self.client_id:
            raise ValueError(f"state of another worker ({d.get('kind')} {d.get('client_id')})")
        self.started, self.next, self.last_pid = bool(d["started"]), int(d["next"]), int(d["last_pid"])
        self.inflight = {int(p): [int(v[0]), bool(v[1])] for p, v in d["inflight"].items()}

    def _commit(self) -> None:
        self.save(self.to_json())

    @property
    def done(self) -> bool:
        return self.next >= self.count and not self.inflight

    def connected(self, session_present: bool) -> list[Packet]:
        """CONNACK came: what goes again, in the messages' order (PUBLISH with DUP before PUBREC,
        PUBREL after)."""
        if self.started and not session_present:
            self.session_lost += 1
            self.report({"ev": "session_lost", "inflight": len(self.inflight)})
        if not self.started:
            self.started = True
            self._commit()
        out: list[Packet] = []
        for pid, (n, rec) in sorted(self.inflight.items(), key=lambda kv: kv[1][0]):
            out.append(Pubrel(pid) if rec else self._publish(pid, n, dup=True))
        return out

    def _publish(self, pid: int, n: int, dup: bool = False) -> Publish:
        return Publish(topic=self.topic, payload=payload_of(self.client_id, n, self.size), qos=2, dup=dup,
                       packet_id=pid)

    def _free_pid(self) -> int:
        pid = self.last_pid
        for _ in range(65535):
            pid = pid % 65535 + 1
            if pid not in self.inflight:
                return pid
        raise RuntimeError("no free packet id")

    def new_message(self) -> Publish | None:
        """The next message's PUBLISH (its state saved first), or None when all were sent."""
        if self.next >= self.count:
            return None
        pid = self._free_pid()
        n = self.next
        self.inflight[pid] = [n, False]
        self.next, self.last_pid = n + 1, pid
        self._commit()
        self.report({"ev": "published", "n": n, "pid": pid})
        return self._publish(pid, n)

    def recover(self, reported: set[int]) -> None:
        """After a restart: report the messages in flight whose `published` line the report lacks
        (`reported`: the numbers it has as published or completed): a SIGKILL between the commit of a
        new PUBLISH and its line. A message that left the flight had its `completed` (or `refused`)
        line written before the commit that ended it."""
        for n, _ in sorted(self.inflight.values()):
            if n not in reported:
                self.report({"ev": "published", "n": n, "recovered": True})

    def pubrec(self, p: Pubrec) -> list[Packet]:
        st = self.inflight.get(p.packet_id)
        if st is None:
            self.unexpected += 1
            return []
        if st[1]:  # PUBREC again (our PUBREL crossed it): PUBREL again
            return [Pubrel(p.packet_id)]
        if p.reason_code >= 0x80:  # refused: the exchange ends here (MQTT 5 4.3.3)
            del self.inflight[p.packet_id]
            self.refused += 1
            self._commit()
            self.report({"ev": "refused", "n": st[0], "reason": p.reason_code})
            return []
        st[1] = True
        self._commit()  # before PUBREL: from now on never a PUBLISH of it again
        return [Pubrel(p.packet_id)]

    def pubcomp(self, p: Pubcomp) -> None:
        st = self.inflight.get(p.packet_id)
        if st is None or not st[1]:
            self.unexpected += 1
            return
        # the report first: a SIGKILL before the commit sends PUBREL again and reports again (counted once)
        self.report({"ev": "completed", "n": st[0], "reason": p.reason_code})
        del self.inflight[p.packet_id]
        self.completed += 1
        self._commit()


@dataclass(slots=True)
class Subscriber:
    """A QoS 2 subscriber's half of the session (sans-IO, as `Publisher`). A delivery is committed
    (saved, with its xid) before its PUBREC goes; its report line follows (and `recover` writes the
    lines of committed deliveries a report lacks)."""

    client_id: str
    filters: tuple[str, ...]
    save: Callable[[dict[str, Any]], None] = lambda _: None
    report: Report = lambda _: None
    started: bool = False
    subscribed: bool = False
    xid: int = 0  # the next delivery's number
    awaiting: dict[int, list[Any]] = field(default_factory=dict)  # packet id -> [xid, publisher, number]
    delivered: int = 0
    resent: int = 0  # PUBLISH again under a held packet id (the same message: not delivered again)
    unknown_rel: int = 0
    foreign: int = 0  # payloads that are not NAME:N:...
    not_qos2: int = 0
    session_lost: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"kind": "consume", "client_id": self.client_id, "filters": list(self.filters),
                "started": self.started, "subscribed": self.subscribed, "xid": self.xid,
                "awaiting": {str(p): v for p, v in self.awaiting.items()}}

    def restore(self, d: dict[str, Any]) -> None:
        if d.get("kind") != "consume" or d.get("client_id") != self.client_id:
            raise ValueError(f"state of another worker ({d.get('kind')} {d.get('client_id')})")
        if tuple(d["filters"]) != self.filters:
            raise ValueError(f"state subscribed to {d['filters']}, not {list(self.filters)}")
        self.started, self.subscribed, self.xid = bool(d["started"]), bool(d["subscribed"]), int(d["xid"])
        self.awaiting = {int(p): [int(v[0]), str(v[1]), int(v[2])] for p, v in d["awaiting"].items()}

    def _commit(self) -> None:
        self.save(self.to_json())

    def recover(self, reported: set[int]) -> None:
        """After a restart: report the committed deliveries whose line the report lacks (`reported`:
        the xids it has)."""
        for xid, p, n in sorted(self.awaiting.values()):
            if xid not in reported:
                self.report({"ev": "delivered", "p": p, "n": n, "xid": xid, "recovered": True})

    def connected(self, session_present: bool) -> list[Packet]:
        if self.started and not session_present:
            # the server has nothing of ours: a PUBLISH under a held id would be a new message now
            self.session_lost += 1
            self.report({"ev": "session_lost", "awaiting": len(self.awaiting)})
            self.awaiting.clear()
            self.subscribed = False
        self.started = True
        self._commit()
        if self.subscribed:
            return []
        return [Subscribe(1, tuple((f, SubOptions(qos=2)) for f in self.filters))]

    def suback(self, p: Suback) -> str | None:
        """None, or why the subscription failed."""
        if list(p.reason_codes) != [2] * len(self.filters):
            return f"SUBACK {list(p.reason_codes)} for {list(self.filters)} (QoS 2 asked)"
        self.subscribed = True
        self._commit()
        self.report({"ev": "subscribed", "filters": list(self.filters)})
        return None

    def publish(self, p: Publish) -> list[Packet]:
        if p.qos != 2 or p.packet_id is None:
            self.not_qos2 += 1
            return []
        pid = p.packet_id
        if pid in self.awaiting:  # the same exchange again (DUP): delivered once already
            self.resent += 1
            return [Pubrec(pid)]
        key = key_of(p.payload)
        if key is None:
            self.foreign += 1
            key = ("?", -1)
        xid = self.xid
        self.awaiting[pid] = [xid, key[0], key[1]]
        self.xid = xid + 1
        self._commit()  # the delivery's commit, before PUBREC
        self.delivered += 1
        self.report({"ev": "delivered", "p": key[0], "n": key[1], "xid": xid, "pid": pid})
        return [Pubrec(pid)]

    def pubrel(self, p: Pubrel) -> list[Packet]:
        if self.awaiting.pop(p.packet_id, None) is None:
            self.unknown_rel += 1
            return [Pubcomp(p.packet_id, PACKET_ID_NOT_FOUND)]
        self._commit()
        return [Pubcomp(p.packet_id)]


# ---------------------------------------------------------------------- the report, read back
@dataclass(slots=True)
class ReportReader:
    """Incremental reader of a worker's report (complete lines only; a torn line is skipped)."""

    path: Path
    offset: int = 0
    published: set[int] = field(default_factory=set)
    completed: set[int] = field(default_factory=set)
    published_at: dict[int, float] = field(default_factory=dict)  # number -> its first `published` line's ts
    completed_at: dict[int, float] = field(default_factory=dict)  # number -> its first `completed` line's ts
    refused: dict[int, int] = field(default_factory=dict)
    delivered: dict[tuple[str, int], set[int]] = field(default_factory=dict)  # key -> xids
    xids: set[int] = field(default_factory=set)
    session_lost: int = 0
    subscribed: bool = False
    connections: int = 0
    done: dict[str, Any] | None = None
    malformed: int = 0

    def poll(self) -> int:
        self.offset, events, malformed = read_new_lines(self.path, self.offset)
        self.malformed += malformed
        for e in events:
            self._event(e)
        return len(events)

    def _event(self, e: dict[str, Any]) -> None:
        ev = e.get("ev")
        ts = e.get("ts")
        if ev == "published":
            self.published.add(int(e["n"]))
            if isinstance(ts, int | float) and not e.get("recovered"):  # (a recovered line's is the restart's)
                self.published_at.setdefault(int(e["n"]), float(ts))
        elif ev == "completed":
            self.completed.add(int(e["n"]))
            if isinstance(ts, int | float):
                self.completed_at.setdefault(int(e["n"]), float(ts))
        elif ev == "refused":
            self.refused[int(e["n"])] = int(e.get("reason") or 0)
        elif ev == "delivered":
            self.xids.add(int(e["xid"]))
            self.delivered.setdefault((str(e["p"]), int(e["n"])), set()).add(int(e["xid"]))
        elif ev == "session_lost":
            self.session_lost += 1
        elif ev == "subscribed":
            self.subscribed = True
        elif ev == "connected":
            self.connections += 1
        elif ev == "done":
            self.done = e

    def duplicates(self) -> dict[tuple[str, int], int]:
        """Messages delivered more than once (under different deliveries): key -> extra deliveries."""
        return {k: len(x) - 1 for k, x in self.delivered.items() if len(x) > 1}

    def distinct_of(self, publisher: str) -> set[int]:
        return {n for p, n in self.delivered if p == publisher}

    def order_of(self, publisher: str) -> list[int]:
        """`publisher`'s message numbers in the order they were first delivered (by delivery number,
        xid: a recovered line keeps its place). A message delivered again does not move: that is a
        duplicate, not a reordering (as the reconciliation's `handed_order` takes a first hand-over)."""
        return [n for (p, n), xids in sorted(self.delivered.items(), key=lambda kx: min(kx[1])) if p == publisher]

    def reversals(self, publisher: str) -> list[int]:
        """FIFO reversals of `publisher`'s messages here: the numbers first delivered after a higher
        number of the same publisher (the reconciliation's `fifo_reversals`, with the publisher's
        numbering as its seq). Empty when its messages came in the order it published them."""
        return fifo_reversals(self.order_of(publisher))


def fifo_reversals(order: list[int]) -> list[int]:
    """The numbers of `order` that come after a higher one (`spark/reconcile.py`, `fifo_order`:
    a position whose seq is below the maximum seq handed before it)."""
    out, top = [], -1
    for n in order:
        if n < top:
            out.append(n)
        top = max(top, n)
    return out


# ---------------------------------------------------------------------- the connection
class _Conn(asyncio.Protocol):
    def __init__(self, on_packets: Callable[[list[Packet]], None]) -> None:
        self.on_packets = on_packets
        self.decoder = Decoder(max_packet_size=1 << 24, server=False, level=LEVEL)
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.last_heard = time.monotonic()
        self.pinged = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.last_heard = time.monotonic()
        try:
            packets = self.decoder.feed(data)
        except MqttError as exc:
            self.close(f"malformed data from the server: {exc}")
            return
        if packets:
            self.on_packets(packets)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(f"connection lost: {exc or 'closed by the server'}")

    def send(self, packets: list[Packet]) -> None:
        if packets and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(encode(p, LEVEL) for p in packets))

    def close(self, why: str) -> None:
        if not self.lost.done():
            self.lost.set_result(why)
        if self.transport is not None:
            self.transport.abort()


class Worker:
    """Drives a `Publisher` or `Subscriber` over connections to the addresses of `--url`, in turn."""

    def __init__(self, args: argparse.Namespace, core: Publisher | Subscriber, report: Report,
                 save: Callable[[dict[str, Any]], None]) -> None:
        self.args = args
        self.core = core
        self.report = report
        # group commit: the packets one read (or one pump) makes go out after one save of the state,
        # and the report lines that name what a save committed are written after it
        self._save = save
        self._state: dict[str, Any] | None = None
        self._later: list[dict[str, Any]] = []
        core.save, core.report = self._save_later, self._report
        self.urls = self._urls()
        self.stopping = asyncio.Event()
        self.conn: _Conn | None = None
        self.connack: asyncio.Future[Connack] | None = None
        self.failed: str | None = None
        self.failovers = 0
        self.t0 = time.monotonic()
        self.sending = False  # connected, and what the CONNACK asked to go again has gone
        self.win = args.window  # exchanges in flight at most (the CONNACK's Receive Maximum too)
        self.start_n = core.next if isinstance(core, Publisher) else 0  # (--rate counts from here)
        self.t_rate = self.t0

    def _urls(self) -> list[str]:
        """The addresses to try, in order: `--url-file`'s line when it has one (re-read before each
        attempt: a restarted router may listen on another port), else `--url`."""
        text = ""
        if self.args.url_file is not None:
            with contextlib.suppress(OSError):
                text = self.args.url_file.read_text().strip()
        return [u.strip() for u in (text or self.args.url).split(",") if u.strip()]

    def _save_later(self, d: dict[str, Any]) -> None:
        self._state = d

    def _report(self, e: dict[str, Any]) -> None:
        if self._state is not None and e.get("ev") in ("delivered", "published"):
            self._later.append(e)  # (after the save that commits it: see `flush`)
        else:
            self.report(e)

    def flush(self, out: list[Packet]) -> None:
        """Save the state if it changed (fsync), write the report lines that waited for it, then send
        `out`: nothing that depends on a change goes out before the change is on disk."""
        if self._state is not None:
            self._save(self._state)
            self._state = None
        for e in self._later:
            self.report(e)
        self._later.clear()
        if self.conn is not None:
            self.conn.send(out)

    def on_packets(self, packets: list[Packet]) -> None:
        out: list[Packet] = []
        for p in packets:
            if self.conn is None or self.conn.lost.done():
                break
            out += self.handle(p)
        out += self.pump()
        self.flush(out)

    def handle(self, p: Packet) -> list[Packet]:
        core, conn = self.core, self.conn
        assert conn is not None
        if isinstance(p, Connack):
            if self.connack is not None and not self.connack.done():
                self.connack.set_result(p)
            return []
        if isinstance(p, Pingresp):
            return []
        if isinstance(p, Disconnect):
            conn.close(f"DISCONNECT from the server: reason {p.reason_code:#04x}")
            return []
        if isinstance(core, Publisher):
            if isinstance(p, Pubrec):
                return core.pubrec(p)
            if isinstance(p, Pubcomp):
                core.pubcomp(p)
                return []
        else:
            if isinstance(p, Publish):
                return core.publish(p)
            if isinstance(p, Pubrel):
                return core.pubrel(p)
            if isinstance(p, Suback):
                why = core.suback(p)
                if why is not None:
                    self.failed = why
                    self.stopping.set()
                return []
        conn.close(f"unexpected {type(p).__name__} from the server")
        return []

    # -- the publisher's pace
    def pump(self) -> list[Packet]:
        """The publisher's new PUBLISHes that are due and fit the window."""
        core, conn = self.core, self.conn
        if not isinstance(core, Publisher) or conn is None or conn.lost.done() or not self.sending:
            return []
        due = core.count
        if self.args.rate:
            due = self.start_n + int((time.monotonic() - self.t_rate) * self.args.rate) + 1
        out = []
        while len(core.inflight) < self.win and core.next < min(due, core.count):
            p = core.new_message()
            if p is None:
                break
            out.append(p)
        return out

    async def connect(self, url: str) -> Connack:
        host, _, port = url.rpartition(":")
        loop = asyncio.get_running_loop()
        self.connack = loop.create_future()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _Conn(self.on_packets), host or "127.0.0.1", int(port)),
            self.args.connect_timeout)
        self.conn = conn
        conn.send([Connect(level=LEVEL, clean_start=not self.core.started, keep_alive=self.args.keep_alive,
                           client_id=self.core.client_id,
                           properties=Properties(session_expiry_interval=self.args.expiry,
                                                 receive_maximum=self.args.window))])
        waits: list[asyncio.Future[Any]] = [self.connack, conn.lost]
        done, _ = await asyncio.wait(waits, timeout=self.args.connect_timeout, return_when=asyncio.FIRST_COMPLETED)
        if self.connack not in done:
            conn.close("no CONNACK")
            raise ConnectionError(conn.lost.result() if conn.lost.done() and conn.lost.result() != "no CONNACK"
                                  else f"no CONNACK within {self.args.connect_timeout}s")
        ack = self.connack.result()
        if ack.reason_code:
            conn.close("refused")
            raise ConnectionError(f"CONNACK refused: reason {ack.reason_code:#04x}")
        return ack

    def _where(self) -> Path | None:
        return self.args.state_dir / WHERE_FILE if self.args.state_dir is not None else None

    def _last_at(self) -> int:
        """Where the session was last taken (an index in the address list): a restarted worker goes
        back there first, where the session lives, rather than to the head of its list."""
        path = self._where()
        d = load_json(path) if path is not None else None
        return int(d.get("at") or 0) if d is not None else 0

    async def run(self) -> None:
        i = self._last_at()
        last_up = time.monotonic()
        while not self.stopping.is_set() and not self.finished():
            self.urls = self._urls()
            url = self.urls[i % len(self.urls)]
            try:
                ack = await self.connect(url)
            except (OSError, TimeoutError, ConnectionError) as exc:
                i += 1
                if time.monotonic() - last_up > self.args.reconnect_timeout:
                    self.failed = f"no router answered for {self.args.reconnect_timeout:g}s (last: {url}: {exc})"
                    return
                if i % len(self.urls) == 0:  # (every address tried: a pause before the next round)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stopping.wait(), 0.2)
                continue
            conn = self.conn
            assert conn is not None
            where = self._where()
            if where is not None:
                save_json(where, {"at": i % len(self.urls), "url": url})
            self.report({"ev": "connected", "url": url, "session_present": ack.session_present,
                         "t": round(time.monotonic() - self.t0, 3)})
            rm = ack.properties.receive_maximum
            self.win = min(self.args.window, rm or 65535)
            again = self.core.connected(ack.session_present)
            self.sending = True
            self.flush(again + self.pump())
            why = await self.serve(conn)
            last_up = time.monotonic()
            self.sending = False
            if not self.finished() and not self.stopping.is_set():
                self.failovers += 1
                i += 1  # go on at the next address
                self.report({"ev": "disconnected", "url": url, "why": why, "t": round(time.monotonic() - self.t0, 3)})
        if self.conn is not None and self.conn.transport is not None and not self.conn.lost.done():
            if isinstance(self.core, Publisher) and self.core.done:  # every exchange ended: the session may end
                self.conn.send([Disconnect(properties=Properties(session_expiry_interval=0))])
            else:
                self.conn.send([Disconnect()])
            self.conn.transport.close()

    def finished(self) -> bool:
        core = self.core
        if isinstance(core, Publisher):
            return core.done
        return bool(self.args.count) and core.delivered >= self.args.count and not core.awaiting

    async def serve(self, conn: _Conn) -> str:
        """Until the connection is lost, the server falls silent, or the work is done."""
        ping_every = max(0.5, self.args.keep_alive / 2)
        while True:
            if self.finished() or self.stopping.is_set():
                return "done"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(conn.lost), 0.05 if getattr(self.args, "rate", 0.0) else 0.5)
            if conn.lost.done():
                return conn.lost.result()
            self.flush(self.pump())
            silent = time.monotonic() - conn.last_heard
            if silent >= self.args.dead_after:
                conn.close(f"nothing from the server for {silent:.1f}s")
                return conn.lost.result()
            if silent >= ping_every and conn.pinged <= conn.last_heard:
                conn.send([Pingreq()])
                conn.pinged = time.monotonic()


class _ReportFile:
    def __init__(self, path: Path | None) -> None:
        self.f = open(path, "a") if path is not None else None  # noqa: SIM115 (open for the process's life)

    def __call__(self, e: dict[str, Any]) -> None:
        if self.f is not None:
            self.f.write(json.dumps({**e, "ts": round(time.time(), 6)}) + "\n")
            self.f.flush()  # (a write to the kernel: a SIGKILL does not lose it)


async def amain(args: argparse.Namespace) -> int:
    report = _ReportFile(args.report)
    state_path = args.state_dir / STATE_FILE if args.state_dir is not None else None
    if args.state_dir is not None:
        args.state_dir.mkdir(parents=True, exist_ok=True)

    def save(d: dict[str, Any]) -> None:
        if state_path is not None:
            save_json(state_path, d)

    core: Publisher | Subscriber
    if args.kind == "publish":
        core = Publisher(args.client_id, args.topic[0], args.count, args.size, save, report)
    else:
        core = Subscriber(args.client_id, tuple(args.topic), save, report)
    saved = load_json(state_path) if state_path is not None else None
    if saved is not None:
        core.restore(saved)
        if args.report is not None:
            reader = ReportReader(args.report)
            reader.poll()
            if isinstance(core, Subscriber):
                core.recover(reader.xids)
            else:
                core.recover(reader.published | reader.completed)
    report({"ev": "start", "pid": os.getpid(), "kind": args.kind, "client_id": args.client_id,
            "resumed": saved is not None, "next": core.next if isinstance(core, Publisher) else core.xid})
    w = Worker(args, core, report, save)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, w.stopping.set)
    await w.run()
    if isinstance(core, Publisher):
        summary: dict[str, Any] = {"published": core.next, "completed": core.completed, "refused": core.refused,
                                   "inflight": len(core.inflight), "unexpected_acks": core.unexpected}
    else:
        summary = {"delivered": core.delivered, "resent_same_packet_id": core.resent,
                   "unknown_pubrel": core.unknown_rel, "foreign": core.foreign, "not_qos2": core.not_qos2,
                   "awaiting_pubrel": len(core.awaiting)}
    summary |= {"failovers": w.failovers, "session_lost": core.session_lost, "error": w.failed,
                "seconds": round(time.monotonic() - w.t0, 3)}
    report({"ev": "done", **summary})
    print(json.dumps(summary), flush=True)
    return 1 if w.failed is not None or (isinstance(core, Publisher) and (core.refused or not core.done)) else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oncemesh.harness.mqttworker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="kind", required=True)
    for kind in ("publish", "consume"):
        q = sub.add_parser(kind)
        q.add_argument("--url", required=True, help="HOST:PORT of MQTT listeners, comma-separated: tried in turn")
        q.add_argument("--url-file", type=Path, default=None,
                       help="a file with such a list, re-read before each connection attempt (wins over --url "
                            "when not empty)")
        q.add_argument("--topic", required=True, action="append",
                       help="publish: the topic; consume: a filter (repeat for more, one SUBSCRIBE)")
        q.add_argument("--client-id", required=True)
        q.add_argument("--count", type=int, default=0,
                       help="publish: messages to send; consume: exit after this many deliveries (0: until SIGTERM)")
        q.add_argument("--qos", type=int, choices=(2,), default=2, help="QoS 2 only")
        q.add_argument("--state-dir", type=Path, default=None, help="the session's client-side state, kept here")
        q.add_argument("--report", type=Path, default=None, help="JSON lines appended here")
        q.add_argument("--expiry", type=int, default=3600, help="Session Expiry Interval (s)")
        q.add_argument("--window", type=int, default=100,
                       help="at most this many QoS 2 exchanges in flight (and the Receive Maximum asked)")
        q.add_argument("--keep-alive", type=int, default=4, help="seconds (PINGREQ after half of it silent)")
        q.add_argument("--dead-after", type=float, default=10.0,
                       help="a connection silent this long is given up (a SIGSTOPped router)")
        q.add_argument("--connect-timeout", type=float, default=5.0)
        q.add_argument("--reconnect-timeout", type=float, default=120.0,
                       help="give up after this long without a connection")
    pp = sub.choices["publish"]
    pp.add_argument("--rate", type=float, default=0.0, help="messages per second (0: as fast as the window allows)")
    pp.add_argument("--size", type=int, default=64)
    args = p.parse_args(argv)
    if args.kind == "publish" and (args.count <= 0 or len(args.topic) != 1):
        p.error("publish needs --count N > 0 and one --topic")
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
