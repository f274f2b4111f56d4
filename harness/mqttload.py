"""Lean MQTT 5 load clients: one publisher or subscriber per process, on our own codec.

    python -m oncemesh.harness.mqttload pub --url HOST:PORT --topic T --qos 2 --ready F --result F (--count N | --duration S)
    python -m oncemesh.harness.mqttload sub --url HOST:PORT --topic T --qos 2 --ready F --result F [--publishers N]

Why not paho-mqtt: in Python it costs the client more CPU per message than the router spends, so a
benchmark through it measures paho. These clients speak MQTT through `router/mqtt/codec.py` (the
router's own sans-IO codec: `Decoder(server=False, level=5)` for what the server sends, `encode` for
what they send) on a bare asyncio protocol, and do only what the protocol requires, so the same
clients load an oncemesh router's `mqtt_listen` and any other MQTT 5 broker (Mosquitto).

- The publisher sends `--count` messages (or for `--duration` seconds) at QoS 1 or 2, keeping at most
  `--window` PUBLISHes unanswered (never more than the CONNACK's Receive Maximum): QoS 1 ends with
  PUBACK, QoS 2 with PUBREC, PUBREL, PUBCOMP. Its rate is completed exchanges per second.
- The subscriber holds a persistent session (Session Expiry Interval `--expiry`, ended with the run:
  DISCONNECT with expiry 0) subscribed at `--qos`; it answers PUBLISH with PUBACK (QoS 1) or PUBREC,
  then PUBCOMP on PUBREL (QoS 2), and counts each message once by the key in its payload (publisher
  index, sequence number): the `Tally`. A QoS 2 PUBLISH under a packet id it has not seen PUBREL for
  is the same message again (DUP), not a second one.
- Exactly-once check (`Tally.violations`): at QoS 2 a message delivered twice or missing is a
  violation; at QoS 1 a missing message is (duplicates are MQTT's at-least-once, counted). The
  subscriber's result lists them; `oncemesh bench` fails the run on any.

Payloads are `--size` bytes and start with the AMQP bench clients' header (`benchclients.HEADER`: the
publisher's CLOCK_MONOTONIC send time, sequence number, publisher index, flags), so latency and the
last-message signal work as there. Coordination is the same too: a JSON ready file once connected
(the subscriber: once SUBACK granted the QoS), SIGUSR1 starts a publisher, a JSON result file at the
end; every wait is bounded by `--timeout`, and a subscriber that has heard nothing for `--stall`
seconds after its first message ends with what it has (a missing message fails fast).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import struct
import sys
import time
from array import array
from collections import deque
from pathlib import Path
from typing import Any

from ..router.mqtt.codec import Decoder, MqttError, encode
from ..router.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    SubOptions,
    Subscribe,
)
from .benchclients import (
    FLAG_LAST,
    FLAG_WARMUP,
    HEADER,
    MAGIC,
    cpu_now,
    parse_hostport,
    percentiles,
    write_json,
)

LEVEL = 5  # MQTT 5: Receive Maximum, reason codes in every ack, session expiry
MIN_PAYLOAD = HEADER.size
DEFAULT_WINDOW = 100  # the router's mqtt_receive_maximum default
KEEP_ALIVE = 60
_U16 = struct.Struct(">H")


class Tally:
    """Each message once, by its key (publisher index, sequence number) read from the payload's header.

    A count per key (saturating at 255, in one bytearray per publisher); the publisher's last message
    (FLAG_LAST) says how many it sent. `violations(qos)` is the exactly-once verdict."""

    __slots__ = ("seen", "totals", "distinct", "duplicates", "foreign", "out_of_order", "_next")

    def __init__(self) -> None:
        self.seen: dict[int, bytearray] = {}
        self.totals: dict[int, int] = {}  # publisher index -> messages it sent (from FLAG_LAST)
        self.distinct = 0
        self.duplicates = 0  # deliveries of a key already counted
        self.foreign = 0  # payloads without our header
        self.out_of_order = 0
        self._next: dict[int, int] = {}

    def add(self, payload: bytes) -> tuple[int, int] | None:
        """Count one delivery; (send time ns, flags) of a first delivery, None for a duplicate or a
        foreign payload."""
        if payload[:4] != MAGIC:
            self.foreign += 1
            return None
        _, t_send, seq, pub, flags = HEADER.unpack_from(payload, 0)
        b = self.seen.get(pub)
        if b is None:
            b = self.seen[pub] = bytearray(max(1024, seq + 1))
        elif seq >= len(b):
            b.extend(bytes(max(seq + 1 - len(b), len(b))))
        if flags & FLAG_LAST:
            self.totals[pub] = seq + 1
        n = b[seq]
        if n < 255:
            b[seq] = n + 1
        if n:
            self.duplicates += 1
            return None
        self.distinct += 1
        if seq != self._next.get(pub, 0):
            self.out_of_order += 1
        self._next[pub] = seq + 1
        return t_send, flags

    @property
    def expected(self) -> int:
        return sum(self.totals.values())

    def complete(self, publishers: int) -> bool:
        return len(self.totals) >= publishers and self.distinct >= self.expected

    def missing(self) -> int:
        """Keys below a publisher's total never delivered (publishers whose last message never came
        are not counted here: `violations` names them)."""
        out = 0
        for pub, total in self.totals.items():
            b = self.seen.get(pub, bytearray())
            out += total - sum(1 for x in b[:total] if x)
        return out

    def violations(self, qos: int, publishers: int) -> list[str]:
        """What breaks the QoS's promise: QoS 2, a message twice or missing; QoS 1, one missing."""
        out = []
        if len(self.totals) < publishers:
            absent = sorted(set(range(publishers)) - set(self.totals))
            out.append(f"QoS {qos}: the last message of publisher(s) {absent} never arrived "
                       f"({self.distinct} distinct messages got): messages lost")
        missing = self.missing()
        if missing:
            out.append(f"QoS {qos}: {missing} of {self.expected} messages missing (lost)")
        if qos == 2 and self.duplicates:
            out.append(f"QoS 2: {self.duplicates} duplicate deliveries (a message handed twice under "
                       f"different packet ids: not exactly once)")
        return out


def payload_template(size: int) -> bytearray:
    if size < MIN_PAYLOAD:
        raise ValueError(f"MQTT payload size must be at least {MIN_PAYLOAD} bytes (the bench header)")
    return bytearray(HEADER.size) + b"x" * (size - HEADER.size)


def publish_template(topic: str, qos: int, size: int) -> tuple[bytearray, int, int]:
    """An encoded PUBLISH (packet id 1) of a `size`-byte payload, the offset of its packet id and of its
    payload: the publisher patches both in a copy for each message (our codec builds it once)."""
    payload = bytes(payload_template(size))
    frame = bytearray(encode(Publish(topic=topic, payload=payload, qos=qos, packet_id=1), LEVEL))
    pay_off = len(frame) - size
    pid_off = frame.index(topic.encode()) + len(topic.encode())
    assert frame[pay_off:] == payload and frame[pid_off:pid_off + 2] == b"\x00\x01"
    return frame, pid_off, pay_off


def ack_template(cls: type[Puback | Pubrec | Pubrel | Pubcomp]) -> bytes:
    """The 4 bytes of a successful ack at level 5 (reason 0, no properties: the short form)."""
    frame = encode(cls(1), LEVEL)
    assert len(frame) == 4 and frame[2:] == b"\x00\x01"
    return frame[:2]


_PUBACK, _PUBREC, _PUBREL, _PUBCOMP = (ack_template(c) for c in (Puback, Pubrec, Pubrel, Pubcomp))


class _Client(asyncio.Protocol):
    """One MQTT connection: decode what comes, answer, write once per callback."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.loop = asyncio.get_running_loop()
        self.decoder = Decoder(max_packet_size=1 << 24, server=False, level=LEVEL)
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes | bytearray] = []
        self.connack: asyncio.Future[Connack] = self.loop.create_future()
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.error: str | None = None
        self.unexpected = 0  # acks for packet ids not in flight: a protocol fault of the server
        self.last_heard = time.monotonic()
        self._ping: asyncio.TimerHandle | None = None

    # -- asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.send(encode(self.connect_packet(), LEVEL))
        self.flush()
        self._ping = self.loop.call_later(KEEP_ALIVE / 2, self._keep_alive)

    def data_received(self, data: bytes) -> None:
        self.last_heard = time.monotonic()
        try:
            packets = self.decoder.feed(data)
        except MqttError as exc:
            self.fail(f"malformed data from the server: {exc}")
            return
        for p in packets:
            self.handle(p)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ping is not None:
            self._ping.cancel()
        if not self.done.done():
            self.fail(f"connection lost: {exc or 'closed by the server'}")
        if not self.connack.done():
            self.connack.set_exception(ConnectionError(self.error or "connection lost before CONNACK"))

    # -- ours
    def connect_packet(self) -> Connect:
        raise NotImplementedError

    def handle(self, p: Any) -> None:
        if isinstance(p, Connack):
            if p.reason_code:
                self.fail(f"CONNACK refused: reason {p.reason_code:#04x}")
            if not self.connack.done():
                self.connack.set_result(p)
        elif isinstance(p, Disconnect):
            self.fail(f"DISCONNECT from the server: reason {p.reason_code:#04x} {p.properties.reason_string or ''}")
        elif isinstance(p, Pingresp):
            pass
        else:
            self.fail(f"unexpected {type(p).__name__} from the server")

    def send(self, b: bytes | bytearray) -> None:
        self.out.append(b)

    def flush(self) -> None:
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def fail(self, why: str) -> None:
        if self.error is None:
            self.error = why
        self.finish()

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def _keep_alive(self) -> None:
        self.send(encode(Pingreq(), LEVEL))
        self.flush()
        self._ping = self.loop.call_later(KEEP_ALIVE / 2, self._keep_alive)

    async def close(self, disconnect: Disconnect | None = None) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        self.send(encode(disconnect or Disconnect(), LEVEL))
        self.flush()
        t.close()  # (buffered data is written first)
        for _ in range(200):
            if self.transport is None or t.get_write_buffer_size() == 0:
                break
            await asyncio.sleep(0.005)


class Publisher(_Client):
    """Sends as fast as the window allows, or at `--rate` messages per second."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.qos = args.qos
        self.frame, self.pid_off, self.pay_off = publish_template(args.topic, args.qos, args.size)
        self.window = args.window
        self.free: deque[int] = deque()
        self.inflight: dict[int, int] = {}  # packet id -> 1 sent (QoS 1/2), 2 PUBREC came (QoS 2)
        self.going = False
        self.stopped = False
        self.seq = 0
        self.outcomes = 0
        self.refused = 0  # acks with a failure reason (>= 0x80)
        self.no_subscribers = 0  # acks with reason 0x10
        self.t_go = self.t_end = self.t_warm = self.t_last_outcome = 0
        self.cpu_go = 0.0
        self._tick: asyncio.TimerHandle | None = None
        self.receive_maximum: int | None = None

    def connect_packet(self) -> Connect:
        return Connect(level=LEVEL, clean_start=True, keep_alive=KEEP_ALIVE, client_id=self.args.client_id,
                       properties=Properties(receive_maximum=max(1, self.args.window)))

    def connected(self, ack: Connack) -> None:
        self.receive_maximum = ack.properties.receive_maximum
        self.window = min(self.args.window, self.receive_maximum or 65535)
        self.free.extend(range(1, self.window + 1))

    def handle(self, p: Any) -> None:
        kind = type(p)
        if kind is Pubrec or kind is Pubcomp or kind is Puback:
            self._ack(p, kind)
        else:
            super().handle(p)

    def _ack(self, p: Puback | Pubrec | Pubcomp, kind: type) -> None:
        pid = p.packet_id
        stage = self.inflight.get(pid)
        code = p.reason_code
        if kind is Pubrec:
            if stage != 1 or self.qos != 2:
                self.unexpected += 1
                return
            if code >= 0x80:  # refused: the exchange ends here (MQTT 5 4.3.3)
                self.refused += 1
                self._done_with(pid)
                return
            if code == 0x10:
                self.no_subscribers += 1
            self.inflight[pid] = 2
            self.send(_PUBREL + _U16.pack(pid))
            return
        expected = (stage == 1 and self.qos == 1) if kind is Puback else stage == 2  # (PUBCOMP)
        if not expected:
            self.unexpected += 1
            return
        if code >= 0x80:
            self.refused += 1
        elif code == 0x10:
            self.no_subscribers += 1
        self._done_with(pid)

    def _done_with(self, pid: int) -> None:
        del self.inflight[pid]
        self.free.append(pid)
        self.outcomes += 1
        if self.stopped:
            if not self.inflight:
                self.t_last_outcome = time.monotonic_ns()
                self.finish()
        else:
            self.pump()

    def go(self) -> None:
        if self.going:
            return
        self.going = True
        self.cpu_go = cpu_now()
        now = time.monotonic_ns()
        self.t_go = now
        self.t_warm = now + int(self.args.warmup * 1e9)
        self.t_end = now + int(self.args.duration * 1e9) if self.args.duration else 0
        self.pump()
        self.flush()

    def pump(self) -> None:
        if self.stopped or not self.going:
            return
        args = self.args
        count, rate = args.count, args.rate
        due = 1 << 62
        if rate:
            due = int((time.monotonic_ns() - self.t_go) * rate / 1e9) + 1
        frame, pid_off, pay_off = self.frame, self.pid_off, self.pay_off
        pack, pack_pid, index = HEADER.pack_into, _U16.pack_into, args.index
        free, inflight, send, clock = self.free, self.inflight, self.out.append, time.monotonic_ns
        while free and self.seq < due:
            now = clock()
            seq = self.seq
            last = (count and seq + 1 >= count) or (self.t_end and now >= self.t_end)
            warm = now < self.t_warm and (not count or seq * 10 < count)  # at most 10% of a --count
            pid = free.popleft()
            pack_pid(frame, pid_off, pid)
            pack(frame, pay_off, MAGIC, now, seq, index, (FLAG_LAST if last else 0) | (FLAG_WARMUP if warm else 0))
            send(bytes(frame))
            inflight[pid] = 1
            self.seq = seq + 1
            if last:
                self.stopped = True
                break
        if not self.stopped and rate and self._tick is None:
            self._tick = self.loop.call_later(0.001, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        self.pump()
        self.flush()

    def result(self) -> dict[str, Any]:
        span = max(1, (self.t_last_outcome or time.monotonic_ns()) - self.t_go) / 1e9
        err = self.error
        if err is None and self.unexpected:
            err = f"{self.unexpected} acks for packet ids not in flight"
        if err is None and self.refused:
            err = f"{self.refused} PUBLISHes refused (ack reason >= 0x80)"
        return {"kind": "pub", "protocol": "mqtt", "index": self.args.index, "qos": self.qos, "sent": self.seq,
                "outcomes": self.outcomes, "accepted": self.outcomes - self.refused, "refused": self.refused,
                "no_subscribers": self.no_subscribers, "window": self.window,
                "receive_maximum": self.receive_maximum, "seconds": round(span, 4),
                "msg_s": round(self.outcomes / span, 1), "cpu_s": round(cpu_now() - self.cpu_go, 4), "error": err}


class Subscriber(_Client):
    """A persistent session subscribed at `--qos`; counts each message once (`Tally`)."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.qos = args.qos
        self.tally = Tally()
        self.subscribed: asyncio.Future[int] = self.loop.create_future()
        self.awaiting_rel: set[int] = set()  # QoS 2: PUBREC sent, PUBREL not yet
        self.deliveries = 0
        self.resent = 0  # QoS 2 PUBLISH again under a packet id awaiting PUBREL (DUP): the same message
        self.unknown_rel = 0
        self.qos_seen: dict[int, int] = {}
        self.lat = array("q")
        self.measured = 0
        self.t_first = self.t_last = 0
        self.cpu_first: float | None = None
        self._stall: asyncio.TimerHandle | None = None
        self.session_present = False

    def connect_packet(self) -> Connect:
        return Connect(level=LEVEL, clean_start=True, keep_alive=KEEP_ALIVE, client_id=self.args.client_id,
                       properties=Properties(session_expiry_interval=int(self.args.expiry),
                                             receive_maximum=max(1, self.args.window)))

    def connected(self, ack: Connack) -> None:
        self.session_present = ack.session_present
        self.send(encode(Subscribe(1, ((self.args.topic, SubOptions(qos=self.qos)),)), LEVEL))
        self.flush()

    def handle(self, p: Any) -> None:
        kind = type(p)
        if kind is Publish:
            self._publish(p)
        elif kind is Pubrel:
            pid = p.packet_id
            if pid in self.awaiting_rel:
                self.awaiting_rel.discard(pid)
            else:
                self.unknown_rel += 1
            self.send(_PUBCOMP + _U16.pack(pid))
            self._check_done()
        elif kind is Suback:
            code = p.reason_codes[0] if p.reason_codes else 0x80
            if code >= 0x80 or code != self.qos:
                self.fail(f"SUBACK: {'refused' if code >= 0x80 else 'granted QoS'} {code:#04x}, asked QoS {self.qos}")
            if not self.subscribed.done():
                self.subscribed.set_result(code)
        else:
            super().handle(p)

    def _publish(self, p: Publish) -> None:
        now = time.monotonic_ns()
        q = p.qos
        self.qos_seen[q] = self.qos_seen.get(q, 0) + 1
        if q == 2:
            pid = p.packet_id
            assert pid is not None
            self.send(_PUBREC + _U16.pack(pid))
            if pid in self.awaiting_rel:  # the same exchange again (DUP): delivered once already
                self.resent += 1
                return
            self.awaiting_rel.add(pid)
        elif q == 1:
            assert p.packet_id is not None
            self.send(_PUBACK + _U16.pack(p.packet_id))
        self.deliveries += 1
        first = self.tally.add(p.payload)
        if first is not None:
            t_send, flags = first
            if not flags & FLAG_WARMUP:
                if not self.measured:
                    self.t_first = now
                    self.cpu_first = cpu_now()
                self.measured += 1
                self.lat.append(now - t_send)
        self.t_last = now
        if self._stall is None and self.args.stall:
            self._stall = self.loop.call_later(self.args.stall, self._check_stall)
        self._check_done()

    def _check_done(self) -> None:
        if self.tally.complete(self.args.publishers) and not self.awaiting_rel:
            self.finish()

    def _check_stall(self) -> None:
        """Nothing heard for `--stall` seconds since the first message: end with what came (the
        verdict says what is missing) rather than wait for the run's timeout."""
        idle = time.monotonic() - self.last_heard
        if idle >= self.args.stall:
            if self.error is None and not self.tally.complete(self.args.publishers):
                self.error = f"stalled: nothing from the server for {idle:.1f} s"
            self.finish()
            return
        self._stall = self.loop.call_later(self.args.stall - idle + 0.01, self._check_stall)

    def result(self) -> dict[str, Any]:
        span = max(1, self.t_last - self.t_first) / 1e9
        cpu = (cpu_now() - self.cpu_first) if self.cpu_first is not None else 0.0
        t = self.tally
        violations = t.violations(self.qos, self.args.publishers)
        if self.awaiting_rel:
            violations.append(f"QoS 2: {len(self.awaiting_rel)} messages never released (no PUBREL)")
        return {"kind": "sub", "protocol": "mqtt", "index": self.args.index, "qos": self.qos,
                "received": self.deliveries, "distinct": t.distinct, "duplicates": t.duplicates,
                "missing": t.missing(), "expected": t.expected, "complete": t.complete(self.args.publishers),
                "violations": violations, "resent_same_packet_id": self.resent, "unknown_pubrel": self.unknown_rel,
                "qos_seen": {str(k): v for k, v in sorted(self.qos_seen.items())},
                "measured": self.measured, "seconds": round(span, 4),
                "msg_s": round(max(0, self.measured - 1) / span, 1) if self.measured > 1 else 0.0,
                "cpu_s": round(cpu, 4), "latency_ms": percentiles(self.lat), "out_of_order": t.out_of_order,
                "foreign": t.foreign, "session_present": self.session_present, "error": self.error}


async def _connect(client: _Client, url: str, timeout: float) -> Connack:
    host, port = parse_hostport(url)
    await asyncio.wait_for(client.loop.create_connection(lambda: client, host, port), timeout)
    ack = await asyncio.wait_for(client.connack, timeout)
    if ack.reason_code:
        raise SystemExit(f"{client.args.kind}: CONNACK refused, reason {ack.reason_code:#04x}")
    return ack


async def run_pub(args: argparse.Namespace) -> int:
    pub = Publisher(args)
    go = asyncio.Event()
    pub.loop.add_signal_handler(signal.SIGUSR1, go.set)
    pub.connected(await _connect(pub, args.url, min(args.timeout, 20.0)))
    write_json(args.ready, {"pid": os.getpid(), "window": pub.window, "receive_maximum": pub.receive_maximum})
    await asyncio.wait_for(go.wait(), args.timeout)
    pub.go()
    try:
        await asyncio.wait_for(asyncio.shield(pub.done), args.timeout)
    except TimeoutError:
        pub.error = pub.error or f"timed out after {args.timeout}s ({len(pub.inflight)} exchanges unfinished)"
    res = pub.result()
    write_json(args.result, res)
    await pub.close()
    return 0 if res["error"] is None else 1


async def run_sub(args: argparse.Namespace) -> int:
    sub = Subscriber(args)
    sub.connected(await _connect(sub, args.url, min(args.timeout, 20.0)))
    try:
        await asyncio.wait_for(asyncio.shield(sub.subscribed), min(args.timeout, 20.0))
    except TimeoutError:
        raise SystemExit(f"sub: no SUBACK within {min(args.timeout, 20.0)}s") from None
    if sub.error is not None:
        raise SystemExit(f"sub: {sub.error}")
    write_json(args.ready, {"pid": os.getpid(), "granted_qos": sub.subscribed.result()})
    try:
        await asyncio.wait_for(asyncio.shield(sub.done), args.timeout)
    except TimeoutError:
        sub.error = sub.error or f"timed out after {args.timeout}s"
    res = sub.result()
    write_json(args.result, res)
    await sub.close(Disconnect(properties=Properties(session_expiry_interval=0)))  # the session ends with the run
    return 0 if res["error"] is None and not res["violations"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oncemesh.harness.mqttload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="kind", required=True)
    for kind in ("pub", "sub"):
        q = sub.add_parser(kind)
        q.add_argument("--url", required=True, help="HOST:PORT of the MQTT listener")
        q.add_argument("--topic", default="bench")
        q.add_argument("--qos", type=int, choices=(0, 1, 2), default=2)
        q.add_argument("--ready", type=Path, required=True, help="JSON written once connected (sub: subscribed)")
        q.add_argument("--result", type=Path, required=True, help="JSON written at the end")
        q.add_argument("--index", type=int, default=0)
        q.add_argument("--client-id", default=None, help="default: bench-KIND-INDEX-PID")
        q.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                       help="pub: PUBLISHes unanswered at most (and never above the CONNACK's Receive Maximum); "
                            "sub: the Receive Maximum it asks of the server")
        q.add_argument("--timeout", type=float, default=120.0)
    pp = sub.choices["pub"]
    pp.add_argument("--size", type=int, default=100, help=f"payload bytes (>= {MIN_PAYLOAD})")
    pp.add_argument("--count", type=int, default=0, help="messages to send (0: use --duration)")
    pp.add_argument("--duration", type=float, default=0.0, help="seconds to send for")
    pp.add_argument("--rate", type=float, default=0.0, help="messages per second (0: unbounded)")
    pp.add_argument("--warmup", type=float, default=0.5, help="seconds excluded from latency and rates")
    sp = sub.choices["sub"]
    sp.add_argument("--publishers", type=int, default=1, help="publishers whose last message ends the run")
    sp.add_argument("--expiry", type=int, default=300, help="Session Expiry Interval (s): a persistent session")
    sp.add_argument("--stall", type=float, default=15.0,
                    help="after the first message, end when nothing came for this long (0: only --timeout)")
    args = p.parse_args(argv)
    if args.kind == "pub" and not (args.count or args.duration):
        p.error("pub needs --count or --duration")
    if args.kind == "pub" and args.size < MIN_PAYLOAD:
        p.error(f"--size must be at least {MIN_PAYLOAD}")
    if args.client_id is None:
        args.client_id = f"bench-{args.kind}-{args.index}-{os.getpid()}"
    return asyncio.run(run_pub(args) if args.kind == "pub" else run_sub(args))


if __name__ == "__main__":
    sys.exit(main())
