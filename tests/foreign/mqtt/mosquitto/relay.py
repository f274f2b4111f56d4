"""The failover list of the mosquitto drivers: mosquitto_pub and mosquitto_sub connect to one
host and port only (no list), and libmosquitto reconnects there by itself after a lost connection
(1 s later), keeping its session state in memory: the QoS 2 messages it sent and has no PUBCOMP
for, those it received and has no PUBREL for (lib/messages_mosq.c, message__reconnect_reset: the
state is kept, and a second reset changes nothing, unlike paho-mqtt's). A new process would have
none of it. So with a list the driver gives mosquitto a loopback address of its own (port 0) and
relays each connection mosquitto makes there, byte for byte, to one address of the list: the
current one, or the next that accepts a TCP connection; when the router's side of a relayed
connection ends, mosquitto's side is closed too and the next connection goes to the next address.
The MQTT conversation is mosquitto's and the router's alone; the relay only chooses where it goes."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


class Relay:
    def __init__(self, addrs: list[tuple[str, int]], said: Callable[[str | None], None]) -> None:
        self.addrs = addrs
        self.said = said  # told each relayed connection's address ("HOST:PORT"), None when none accepts
        self.i = 0
        self.current: str | None = None  # the address of the connection being relayed
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.lsock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            down, _ = self.lsock.accept()
            up = None
            for j in range(len(self.addrs)):
                k = (self.i + j) % len(self.addrs)
                try:
                    up = socket.create_connection(self.addrs[k], timeout=2)
                except OSError:
                    continue
                self.i = k
                break
            if up is None:  # (no address accepts now: mosquitto tries again in a second)
                self.said(None)
                down.close()
                continue
            up.settimeout(None)
            for s in (up, down):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.current = "{}:{}".format(*self.addrs[self.i])
            self.said(self.current)
            ended = threading.Event()
            threading.Thread(target=self._pump, args=(down, up, ended, False), daemon=True).start()
            self._pump(up, down, ended, True)  # (one relayed connection at a time: mosquitto makes one)

    def _pump(self, src: socket.socket, dst: socket.socket, ended: threading.Event, upstream: bool) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        first = not ended.is_set()
        ended.set()
        if first and upstream:  # (the router's side ended: the next connection goes to the next address)
            self.i = (self.i + 1) % len(self.addrs)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
