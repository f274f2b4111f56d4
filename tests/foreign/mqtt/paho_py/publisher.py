"""paho-mqtt (Python) publisher for the MQTT foreign-client tests: publishes --count messages to
--topic at --qos, at most --rate per second, and reports each as `sent` when handed to paho and as
`acked` when paho says the protocol's last acknowledgement came (QoS 2: PUBCOMP; QoS 1: PUBACK),
with the MQTT 5 reason code. paho keeps at most 20 QoS 1/2 messages in flight and queues the rest
(its max_inflight_messages). Plain paho-mqtt.

One address: paho's network thread (loop_start) reconnects there by itself. A failover list
(--url A,B): paho has no list of its own, so a network thread of ours runs paho's loop and, on a
lost connection, connects the same client (its in-flight messages kept in the object, as MQTT
asks of a persistent session) to the next address of the list that accepts a TCP connection. It
probes with a plain socket first and calls paho's connect only for such an address, and paho's
automatic reconnect is off (reconnect_on_failure=False): paho-mqtt 2.2.0 resets its in-flight
messages at every reconnect attempt (Client._messages_reconnect_reset_out), and a second reset
before a connection succeeds turns a QoS 2 message waiting for PUBCOMP (to send PUBREL again)
into a new PUBLISH of a message it already had PUBREC for: its own duplicate. So one reset per
failover."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import Report, accepts, addresses, parser, payload, url_of  # noqa: E402


def main() -> None:
    a = parser(__doc__.splitlines()[0], "publisher").parse_args()
    rep = Report(a.report)
    v5 = a.mqtt == "5"
    addrs = addresses(a.url)
    failover = len(addrs) > 1
    c = (mqtt.Client(CallbackAPIVersion.VERSION2, client_id=a.client_id, protocol=mqtt.MQTTv5,
                     reconnect_on_failure=not failover) if v5 else
         mqtt.Client(CallbackAPIVersion.VERSION2, client_id=a.client_id, protocol=mqtt.MQTTv311,
                     clean_session=not a.persistent, reconnect_on_failure=not failover))
    c.reconnect_delay_set(1, 2)
    lock = threading.Lock()
    k_of: dict[int, int] = {}  # packet id -> message number, for the messages in flight
    early: dict[int, Any] = {}  # acknowledgements that came before publish() returned the packet id
    acked: set[int] = set()
    finished = threading.Event()

    def ack(mid: int, rc: Any) -> None:
        k = k_of.pop(mid)
        acked.add(k)
        rep.line("acked", k=k, mid=mid, rc=int(getattr(rc, "value", rc) or 0))
        if len(acked) == a.count:
            finished.set()

    def on_connect(client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        if rc.is_failure:
            rep.line("error", error=f"CONNACK {rc}")
            return
        rep.line("connected", present=bool(flags.session_present), url=f"{client.host}:{client.port}")

    def on_publish(client: Any, userdata: Any, mid: int, rc: Any, props: Any) -> None:
        with lock:
            if mid in k_of:
                ack(mid, rc)
            else:
                early[mid] = rc

    def on_disconnect(client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        rep.line("disconnected", rc=str(rc))

    c.on_connect, c.on_publish, c.on_disconnect = on_connect, on_publish, on_disconnect
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = a.expiry if a.persistent else 0

    def connect(addr: tuple[str, int]) -> None:
        if v5:
            c.connect(*addr, keepalive=10, clean_start=not a.persistent, properties=props)
        else:
            c.connect(*addr, keepalive=10)

    stop = threading.Event()
    if failover:
        net = threading.Thread(target=failover_loop, args=(c, addrs, connect, rep, stop), daemon=True)
        net.start()
    else:
        try:
            connect(addrs[0])
        except OSError as e:
            rep.line("error", error=repr(e))
            sys.exit(1)
        c.loop_start()
    start = time.monotonic()
    for k in range(a.count):
        if a.rate > 0:
            time.sleep(max(0.0, start + k / a.rate - time.monotonic()))
        info = c.publish(a.topic, payload(a.client_id, k, a.size), qos=a.qos)
        rep.line("sent", k=k, mid=info.mid)
        with lock:
            k_of[info.mid] = k
            if info.mid in early:
                ack(info.mid, early.pop(info.mid))
    finished.wait()
    rep.line("done")
    if failover:
        stop.set()  # (no reconnect from here on)
        c.disconnect()
        net.join(5)
    else:
        c.disconnect()
        c.loop_stop()


def failover_loop(c: mqtt.Client, addrs: list[tuple[str, int]], connect: Any, rep: Report,
                  stop: threading.Event) -> None:
    """paho's loop on this thread; on a lost connection, the next address of the list that accepts
    a TCP connection (one paho connect, so one reset of its in-flight messages, per failover)."""
    i, up, delay = 0, False, 0.05
    while True:
        if not up:
            if stop.is_set():
                return
            live = next((j % len(addrs) for j in range(i, i + len(addrs)) if accepts(addrs[j % len(addrs)])), None)
            if live is None:  # (none accepts now: try the list again shortly)
                time.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            i = live
            try:
                connect(addrs[i])
            except OSError as e:  # (it went between the probe and the connect: reported, the next one)
                rep.line("error", error=f"connect {url_of(addrs[i])} after a probe: {e!r}")
                i = (i + 1) % len(addrs)
                continue
            up, delay = True, 0.05
        rc = c.loop(timeout=0.05)
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            if stop.is_set():
                return
            up = False
            i = (i + 1) % len(addrs)  # (the connection is lost: on at the next address)


if __name__ == "__main__":
    main()
