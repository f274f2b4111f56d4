"""Debian's mosquitto_sub driven for the MQTT foreign-client tests: one `mosquitto_sub` subscribed
to --topic at --qos (--persistent: -c, and -x --expiry in MQTT 5), printing each message as
`MSG %m %q %l %x %t` (-F: packet id, QoS, length, payload in hex, topic) among its debug lines
(-d); this driver turns them into the JSON-lines report.

What the report sees: `connected` (CONNACK 0; mosquitto_sub does not print session present: it is
null), `subscribed` (mosquitto_sub subscribes again on every connection, session present or not),
`msg {k, topic, dup, mid, qos}` (dup: the d flag of the last PUBLISH logged under that packet id),
`error` for its error lines. What it cannot see: which connection a message came on (libmosquitto
reconnects by itself, quietly).

libmosquitto delivers a QoS 2 message when the PUBREL comes (it sends PUBREC on the PUBLISH and
keeps the message in memory only), and mosquitto_sub's SIGTERM disconnects at once: messages
between PUBREC and PUBREL would be lost to it, though the router counts them as accepted. So on
SIGTERM this driver stops mosquitto_sub (SIGSTOP), reads all it printed, and only when every
packet id it logged a PUBREC for has been printed as a message does it send SIGTERM (then
SIGCONT); otherwise it lets it run 20 ms and tries again, for at most --drain seconds (then
SIGTERM anyway, and the report says `stop_unclean` with the packet ids waiting). A PUBLISH that
libmosquitto read but had not answered when it disconnects was never acknowledged: the router hands
it again to the session's next connection.

A failover list (--url A,B): mosquitto_sub takes one address, so it is given the loopback address
of this driver's relay, which sends each of its connections to the next address of the list that
accepts one (relay.py says why this and not a new mosquitto_sub per address: a new process has
lost the messages the old one PUBREC'd and had no PUBREL for, which the router counts as
accepted). libmosquitto reconnects by itself, 1 s after a lost connection, keeping those messages.
`connected` says which address. In MQTT 5 it then asks for a Receive Maximum of 65535 (-D CONNECT
receive-maximum; MQTT 5's value when none is given) instead of libmosquitto's 20: libmosquitto
2.0.11 counts a QoS 2 PUBLISH sent again (DUP, after the reconnect) under a packet id it already
holds as one more message unanswered, and queues a second copy of it (lib/handle_publish.c: no
look-up of the packet id; the reconnect had counted the one it holds), so with 20 it drops the
connection as a protocol error ("A network protocol error occurred") when the router, within the
20 it was told, sends the 20th. With 65535 the miscount never reaches the limit; the second copy is
delivered by the PUBREL, which takes the first; but a later PUBREL under that packet id, for a new
message, would deliver the stale copy again: libmosquitto's own duplicate. So the report says
`held_twice {mid}` whenever such a PUBLISH comes, and a test seeing a duplicate can tell whose it is."""

from __future__ import annotations

import ctypes
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from relay import Relay  # noqa: E402

from common import Report, addresses, msg_fields, parser  # noqa: E402

PUBLISH = re.compile(r"received PUBLISH \(d(\d), q(\d), r\d, m(\d+),")
PUBREC = re.compile(r"sending PUBREC \(m(\d+),")
SUBACK = re.compile(r"^Subscribed \(mid: \d+\): (.*)$")
ERROR = re.compile(r"^(Error|Connection error|Unable|Warning)\b")


def _die_with_parent() -> None:
    """(in the child, before exec) SIGKILL it when this driver dies, however it dies: a driver
    killed itself must not leave mosquitto_sub running (Linux prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


class Driver:
    def __init__(self, a: Any) -> None:
        self.a = a
        self.rep = Report(a.report)
        addrs = addresses(a.url)
        self.relay = None
        if len(addrs) > 1:
            self.relay = Relay(addrs, lambda url: self.rep.line("relayed", url=url))
            addrs = [("127.0.0.1", self.relay.port)]
        host, port = addrs[0]
        self.url = f"{host}:{port}"
        cmd = ["stdbuf", "-oL", "-eL", "mosquitto_sub", "-h", host, "-p", str(port), "-i", a.client_id,
               "-V", "mqttv5" if a.mqtt == "5" else "mqttv311", "-q", str(a.qos), "-t", a.topic,
               "-k", "10", "-d", "-F", "MSG %m %q %l %x %t"]
        if a.persistent:
            cmd += ["-c"] + (["-x", str(a.expiry)] if a.mqtt == "5" else [])
        if self.relay is not None and a.mqtt == "5":
            cmd += ["-D", "CONNECT", "receive-maximum", "65535"]
        self.child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        assert self.child.stdout is not None
        self.out = self.child.stdout
        os.set_blocking(self.out.fileno(), False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.out, selectors.EVENT_READ)
        self.buf = b""
        self.dup: dict[int, bool] = {}
        self.waiting: set[int] = set()  # PUBREC sent, message not printed yet

    def pump(self, timeout: float) -> bool:
        """Read and report what is there (waiting up to `timeout` for something); False at EOF."""
        for _ in self.sel.select(timeout):
            chunk = self.out.read()
            if not chunk:
                self.sel.unregister(self.out)
                return False
            self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for raw in lines:
            print(raw.decode(errors="replace"), flush=True)  # (kept in the driver's output file)
            self.line(raw.decode(errors="replace"))
        return bool(self.sel.get_map())

    def line(self, line: str) -> None:
        if line.startswith("MSG "):
            _, mid, qos, _size, hexed, topic = line.split(" ", 5)
            pid = int(mid)
            self.waiting.discard(pid)
            self.rep.line("msg", topic=topic, dup=self.dup.pop(pid, None), mid=pid, qos=int(qos),
                          **msg_fields(bytes.fromhex(hexed)))
        elif m := PUBLISH.search(line):
            pid = int(m.group(3))
            self.dup[pid] = m.group(1) == "1"
            if pid in self.waiting and int(m.group(2)) == 2:  # (libmosquitto queues a second copy: see above)
                self.rep.line("held_twice", mid=pid)
        elif m := PUBREC.search(line):
            self.waiting.add(int(m.group(1)))
        elif "received CONNACK" in line:
            ok = line.rstrip().endswith("(0)")
            self.rep.line("connected" if ok else "error", present=None, log=line,
                          url=self.relay.current if self.relay else self.url)
        elif m := SUBACK.match(line):
            self.rep.line("subscribed", granted=[int(x) for x in m.group(1).split(",") if x.strip().isdigit()])
        elif ERROR.search(line):
            self.rep.line("error", error=line)

    def quiet(self) -> bool:
        """Stop mosquitto_sub, read everything it printed: True if no accepted message is unprinted."""
        os.kill(self.child.pid, signal.SIGSTOP)
        os.waitpid(self.child.pid, os.WUNTRACED)
        while self.pump(0.0) and self.sel.select(0.0):
            pass
        return not self.waiting

    def stop(self) -> None:
        deadline = time.monotonic() + self.a.drain
        while self.child.poll() is None:
            if self.quiet() or time.monotonic() > deadline:
                if self.waiting:
                    self.rep.line("stop_unclean", waiting=sorted(self.waiting))
                os.kill(self.child.pid, signal.SIGTERM)
                os.kill(self.child.pid, signal.SIGCONT)
                break
            os.kill(self.child.pid, signal.SIGCONT)
            self.pump(0.02)
        self.rep.line("stopping")
        end = time.monotonic() + 1.5
        while self.pump(0.1) and time.monotonic() < end:
            pass
        if self.child.poll() is None and time.monotonic() >= end:
            self.child.kill()
        self.rep.line("disconnected", rc=self.child.wait(5))


def main() -> None:
    p = parser(__doc__.splitlines()[0], "subscriber")
    p.add_argument("--drain", type=float, default=3.0, help="at most this long to stop gracefully (seconds)")
    a = p.parse_args()
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    d = Driver(a)
    while not stopping:
        if not d.pump(0.1):
            d.rep.line("error", error=f"mosquitto_sub exited with {d.child.wait(5)}")
            sys.exit(1)
    d.stop()


if __name__ == "__main__":
    main()
