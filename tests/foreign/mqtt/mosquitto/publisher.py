"""Debian's mosquitto_pub driven for the MQTT foreign-client tests: one `mosquitto_pub -l` process
publishes each line it reads on standard input as one message to --topic at --qos; this driver
writes message k's payload ("C:k;" padded to --size) as line k, at most --rate lines a second, and
turns mosquitto_pub's debug output (-d) into the JSON-lines report.

What the report sees: `connected` (CONNACK 0; mosquitto_pub does not print session present),
`sent {k}` when the line is handed over, `acked {k}` when mosquitto_pub logs the PUBCOMP (QoS 2)
or PUBACK (QoS 1) of packet id k+1 (libmosquitto numbers a client's messages 1, 2, ... in the
order they are published, and -l publishes the lines in order), `error` for its error lines, and
`done` once every message is acknowledged (then standard input is closed and mosquitto_pub
disconnects). What it cannot see: a resend (mosquitto_pub logs it as another PUBLISH with d1, not
as a message of ours), a reason code of PUBREC in MQTT 5 (logged, not reported), anything of a
payload containing a newline (never: ours have none). mosquitto_pub keeps at most 20 messages in
flight and queues the rest. --persistent: -c (and -x --expiry in MQTT 5).

A failover list (--url A,B): mosquitto_pub takes one address, so it is given the loopback address
of this driver's relay, which sends each of its connections to the next address of the list that
accepts one (relay.py says why this and not a new mosquitto_pub per address: a new process has
none of the session state MQTT asks the client to keep). libmosquitto reconnects by itself, 1 s
after a lost connection, the messages in flight kept. `connected` says which address. A PUBREL it
sends again there for an exchange the router had ended (its PUBCOMP lost with the connection) is
answered PUBCOMP 0x92, Packet Identifier not found, "not an error during recovery" (MQTT 5,
3.7.2.1): mosquitto_pub says "Warning: Publish N failed", and after a reconnect the report says
`recovered {mid}` for it, not `error` (the message is `acked`: its exchange is complete)."""

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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from relay import Relay  # noqa: E402

from common import Report, addresses, parser, payload  # noqa: E402

ACK = re.compile(r"received (PUBCOMP|PUBACK) \(Mid: (\d+), RC:(\d+)\)")
FAILED = re.compile(r"^Warning: Publish (\d+) failed: Packet Identifier not found")
NOT_FOUND = 0x92
ERROR = re.compile(r"^(Error|Connection error|Unable|Warning)\b")


def _die_with_parent() -> None:
    """(in the child, before exec) SIGKILL it when this driver dies (Linux prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def main() -> None:
    a = parser(__doc__.splitlines()[0], "publisher").parse_args()
    rep = Report(a.report)
    addrs = addresses(a.url)
    relay = None
    if len(addrs) > 1:
        relay = Relay(addrs, lambda url: rep.line("relayed", url=url))
        addrs = [("127.0.0.1", relay.port)]
    host, port = addrs[0]
    cmd = ["stdbuf", "-oL", "-eL", "mosquitto_pub", "-h", host, "-p", str(port), "-i", a.client_id,
           "-V", "mqttv5" if a.mqtt == "5" else "mqttv311", "-q", str(a.qos), "-t", a.topic,
           "-k", "10", "-l", "-d"]
    if a.persistent:
        cmd += ["-c"] + (["-x", str(a.expiry)] if a.mqtt == "5" else [])
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             preexec_fn=_die_with_parent)
    assert child.stdin is not None and child.stdout is not None
    out = child.stdout
    os.set_blocking(out.fileno(), False)
    sel = selectors.DefaultSelector()
    sel.register(out, selectors.EVENT_READ)
    buf = b""
    acked: set[int] = set()
    recovered: set[int] = set()  # packet ids whose PUBCOMP said 0x92 after a reconnect
    connections = 0
    k, start, closed = 0, time.monotonic(), False
    while True:
        now = time.monotonic()
        due = a.count if a.rate <= 0 else min(a.count, int((now - start) * a.rate) + 1)
        while k < due and not closed:
            try:
                child.stdin.write(payload(a.client_id, k, a.size) + b"\n")
                child.stdin.flush()
            except BrokenPipeError:  # (it ended: its output says why)
                closed = True
                break
            rep.line("sent", k=k, mid=k + 1)
            k += 1
        if len(acked) == a.count and not closed:
            rep.line("done")
            child.stdin.close()
            closed = True
        for _ in sel.select(timeout=0.01 if k < a.count else 0.2):
            chunk = out.read()
            if not chunk:
                sel.unregister(out)
                break
            buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            print(line, flush=True)  # (mosquitto_pub's own output, kept in the driver's output file)
            if "received CONNACK" in line:
                ok = line.rstrip().endswith("(0)")
                connections += ok
                rep.line("connected" if ok else "error", present=None, log=line,
                         url=relay.current if relay else f"{host}:{port}")
            elif m := ACK.search(line):
                mid = int(m.group(2))
                if m.group(1) == "PUBCOMP" and int(m.group(3)) == NOT_FOUND and connections > 1:
                    recovered.add(mid)
                if 1 <= mid <= a.count and mid - 1 not in acked:
                    acked.add(mid - 1)
                    rep.line("acked", k=mid - 1, mid=mid, rc=int(m.group(3)))
            elif (m := FAILED.search(line)) and int(m.group(1)) in recovered:
                rep.line("recovered", mid=int(m.group(1)), log=line)  # (see the module's docstring)
            elif ERROR.search(line):
                rep.line("error", error=line)
        if not sel.get_map():  # (its output ended: it exited)
            break
    rc = child.wait(10)
    rep.line("exit", rc=rc)
    sys.exit(0 if rc == 0 and len(acked) == a.count else 1)


if __name__ == "__main__":
    main()
