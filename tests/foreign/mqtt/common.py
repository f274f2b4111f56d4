"""Shared by the Python drivers of the MQTT foreign-client tests (paho_py/, mosquitto/): the command
line every family takes, the JSON-lines report, and the payload's key. Nothing from oncemesh.

    publisher  --url HOST:PORT[,HOST:PORT...] --topic T --client-id C --count N --report F
               [--qos 2] [--mqtt 5|3.1.1] [--rate MSG/S] [--size BYTES] [--persistent] [--expiry SECONDS]
    subscriber --url HOST:PORT[,HOST:PORT...] --topic FILTER --client-id C --report F
               [--qos 2] [--mqtt 5|3.1.1] [--persistent] [--expiry SECONDS]

--url with several addresses is a failover list: on a lost connection the client goes on at the
next address of the list (round), with the same client id and its own session state.

A publisher's message k carries the payload "C:k;" padded with "x" to --size bytes: "C:k" is its
key. Report lines: connected {present, url}, subscribed {granted}, sent {k}, acked {k}, msg {k,
topic, dup, mid, qos, size, hex}, stopping, disconnected, done, error.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from typing import Any

HEX_UP_TO = 512  # payloads up to this size are reported whole (hex), so a test can compare bytes


def parser(what: str, role: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=what)
    p.add_argument("--url", required=True,
                   help="HOST:PORT of the router's MQTT listener; HOST:PORT,HOST:PORT,...: a failover list")
    p.add_argument("--topic", required=True, help="topic (publisher) or filter (subscriber)")
    p.add_argument("--client-id", required=True)
    p.add_argument("--report", required=True, help="JSON-lines report file (appended to)")
    p.add_argument("--qos", type=int, default=2)
    p.add_argument("--mqtt", default="5", choices=["5", "3.1.1"])
    if role == "publisher":
        p.add_argument("--count", type=int, default=100)
        p.add_argument("--rate", type=float, default=0, help="messages per second at most (0: no cap)")
        p.add_argument("--size", type=int, default=0, help="pad payloads to this many bytes")
    p.add_argument("--persistent", action="store_true",
                   help="clean start 0 / clean session 0, with --expiry (MQTT 5)")
    p.add_argument("--expiry", type=int, default=600, help="session expiry interval, MQTT 5 (seconds)")
    return p


def host_port(url: str) -> tuple[str, int]:
    host, _, port = url.rpartition(":")
    return host or "127.0.0.1", int(port)


def addresses(url: str) -> list[tuple[str, int]]:
    """--url's addresses: one, or a failover list (comma-separated)."""
    return [host_port(u.strip()) for u in url.split(",") if u.strip()]


def url_of(addr: tuple[str, int]) -> str:
    return f"{addr[0]}:{addr[1]}"


def accepts(addr: tuple[str, int], timeout: float = 1.0) -> bool:
    """Whether `addr` accepts a TCP connection now (a plain socket, closed at once)."""
    try:
        with socket.create_connection(addr, timeout=timeout):
            return True
    except OSError:
        return False


def payload(client_id: str, k: int, size: int) -> bytes:
    return f"{client_id}:{k};".ljust(size, "x").encode()


def key_of(data: bytes) -> str:
    """The key of a payload ("C:k" before the first ';'); the AMQP foreign publishers write "L:k;..." too."""
    return data.split(b";", 1)[0].decode(errors="replace")


def msg_fields(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {"k": key_of(data), "size": len(data)}
    if len(data) <= HEX_UP_TO:
        out["hex"] = data.hex()
    return out


class Report:
    """One JSON object per line, flushed at once: the test reads the file while the client runs,
    and a stopped client must leave every line it wrote."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "a")  # noqa: SIM115 (open for the process's life)
        self.lock = threading.Lock()  # (a driver's helper threads report too)

    def line(self, ev: str, **fields: Any) -> None:
        with self.lock:
            self.f.write(json.dumps({"ev": ev, "ts": time.time(), **fields}) + "\n")
            self.f.flush()
