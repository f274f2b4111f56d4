"""A raw AMQP 1.0 frame client for abusing the router on purpose (what Proton clients never do)."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from proton import Data, Described, symbol, ubyte, uint, ulong

OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
NAMES = {OPEN: "open", BEGIN: "begin", ATTACH: "attach", FLOW: "flow", TRANSFER: "transfer",
         DISPOSITION: "disposition", DETACH: "detach", END: "end", CLOSE: "close"}
SOURCE, TARGET, ERROR = 0x28, 0x29, 0x1D


def described(code: int, fields: list[Any]) -> Described:
    return Described(ulong(code), fields)


def encode(obj: Any) -> bytes:
    d = Data()
    d.put_object(obj)
    return bytes(d.encode())


def frame(code: int, fields: list[Any], channel: int = 0, payload: bytes = b"") -> bytes:
    body = encode(described(code, fields)) + payload
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


class RawClient:
    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.frames: list[tuple[int, list[Any]]] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def handshake(self, container: str = "raw-client") -> None:
        self.send(b"AMQP\x00\x01\x00\x00")
        self.send(frame(OPEN, [container, None, uint(65536)]))
        self.send(frame(BEGIN, [None, uint(0), uint(1000), uint(1000)]))
        self.expect(BEGIN)

    def attach_sender(self, name: str, address: str, handle: int = 0, snd_settle_mode: int = 0,
                      rcv_settle_mode: int = 1) -> None:
        self.send(frame(ATTACH, [name, uint(handle), False, ubyte(snd_settle_mode), ubyte(rcv_settle_mode),
                                 described(SOURCE, ["src"]), described(TARGET, [address]),
                                 None, None, uint(0)]))

    def transfer(self, handle: int, delivery_id: int, tag: bytes, payload: bytes, settled: bool = False) -> None:
        self.send(frame(TRANSFER, [uint(handle), uint(delivery_id), tag, uint(0), settled], payload=payload))

    def read_frame(self, timeout: float = 5.0) -> tuple[int, list[Any]] | None:
        deadline = time.monotonic() + timeout
        while True:
            if self.buf.startswith(b"AMQP"):
                self.buf = self.buf[8:]
                continue
            if len(self.buf) >= 8:
                size, doff = struct.unpack(">IB", self.buf[:5])
                if len(self.buf) >= size:
                    body = self.buf[doff * 4:size]
                    self.buf = self.buf[size:]
                    if not body:
                        continue  # heartbeat
                    d = Data()
                    d.decode(body)
                    d.rewind()
                    d.next()
                    obj = d.get_object()
                    f = (int(obj.descriptor), list(obj.value))
                    self.frames.append(f)
                    return f
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return None
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self.buf += chunk

    def expect(self, code: int, timeout: float = 5.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            f = self.read_frame(deadline - time.monotonic())
            if f is None:
                break
            if f[0] == code:
                return f[1]
        seen = [NAMES.get(c, hex(c)) for c, _ in self.frames]
        raise AssertionError(f"no {NAMES.get(code)} frame within {timeout}s (saw {seen})")

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.read_frame(deadline - time.monotonic()) is None:
                try:
                    self.sock.settimeout(0.2)
                    return self.sock.recv(1) == b""
                except TimeoutError:
                    continue
                except OSError:
                    return True
        return False

    def close(self) -> None:
        self.sock.close()


def error_condition(fields: list[Any], index: int) -> str | None:
    """The condition symbol of the error field at `index` of a performative (detach: 2, close: 0)."""
    if len(fields) <= index or fields[index] is None:
        return None
    err = fields[index]
    return str(err.value[0]) if isinstance(err, Described) else None


__all__ = ["RawClient", "symbol", "ubyte", "uint"]
