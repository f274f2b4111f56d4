"""paho-mqtt (Python) subscriber for the MQTT foreign-client tests: subscribes to --topic at --qos
(with --persistent: clean start 0 and session expiry --expiry, or 3.1.1's clean session 0) and
reports every message paho hands over (`msg`: its key, topic, DUP flag, packet id).

paho delivers a QoS 2 message when the PUBREL comes, having sent PUBREC on the PUBLISH, and keeps
what it received in between in memory only (no persistence in paho-mqtt). A process that ends
there would lose messages the router already counts as accepted (PUBREC is the acceptance), so
SIGTERM stops gracefully: the driver runs paho's loop itself (Client.loop, one thread), and on
SIGTERM it goes on reading until no received QoS 2 message waits for its PUBREL (paho's
`_in_messages`, private but there since 1.x), then sends DISCONNECT before reading anything more.
What it has not read by then was never acknowledged: the router hands it again to the session's
next connection. If that moment does not come within --drain seconds the report says
`stop_unclean` with the packet ids still waiting. On a lost connection it reconnects by itself
(0.1 s to 1 s apart); with a failover list (--url A,B) at the next address of the list that
accepts a TCP connection (probed with a plain socket first, as the publisher does: one paho
reconnect per failover), the same client object keeping the QoS 2 messages it has PUBREC'd and
not yet had PUBREL for. A session found present is not subscribed again (the subscription is the
session's) unless --resubscribe; --resubscribe-after N subscribes again on the live connection
after N messages (both as some clients do). Plain paho-mqtt."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import Report, accepts, addresses, msg_fields, parser  # noqa: E402


def main() -> None:
    p = parser(__doc__.splitlines()[0], "subscriber")
    p.add_argument("--drain", type=float, default=3.0, help="at most this long to stop gracefully (seconds)")
    p.add_argument("--resubscribe", action="store_true",
                   help="subscribe on every connection, the session present or not (as mosquitto_sub does)")
    p.add_argument("--resubscribe-after", type=int, default=0,
                   help="after this many messages, subscribe to the same filter again (0: never)")
    a = p.parse_args()
    rep = Report(a.report)
    v5 = a.mqtt == "5"
    c = (mqtt.Client(CallbackAPIVersion.VERSION2, client_id=a.client_id, protocol=mqtt.MQTTv5) if v5 else
         mqtt.Client(CallbackAPIVersion.VERSION2, client_id=a.client_id, protocol=mqtt.MQTTv311,
                     clean_session=not a.persistent))
    stopping: list[float] = []

    def on_connect(client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        if rc.is_failure:
            rep.line("error", error=f"CONNACK {rc}")
            return
        present = bool(flags.session_present)
        rep.line("connected", present=present, url=f"{client.host}:{client.port}")
        if a.resubscribe or not (present and a.persistent):
            client.subscribe(a.topic, qos=a.qos)

    def on_subscribe(client: Any, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        rep.line("subscribed", granted=[int(getattr(x, "value", x)) for x in codes])

    got = [0]

    def on_message(client: Any, userdata: Any, m: mqtt.MQTTMessage) -> None:
        rep.line("msg", topic=m.topic, dup=bool(m.dup), mid=m.mid, qos=m.qos, **msg_fields(m.payload))
        got[0] += 1
        if got[0] == a.resubscribe_after:  # (the same filter again, on this connection)
            client.subscribe(a.topic, qos=a.qos)

    def on_disconnect(client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        rep.line("disconnected", rc=str(rc))

    c.on_connect, c.on_subscribe, c.on_message, c.on_disconnect = on_connect, on_subscribe, on_message, on_disconnect
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = a.expiry if a.persistent else 0
    addrs = addresses(a.url)
    i, up, delay = 0, False, 0.1
    while True:
        if stopping:
            waiting = sorted(c._in_messages)  # received, PUBREC sent, no PUBREL yet
            if not up or not waiting:
                break
            if time.monotonic() - stopping[0] > a.drain:
                rep.line("stop_unclean", waiting=waiting)
                break
        if not up:
            if len(addrs) > 1:  # (a failover list: the next address that accepts a TCP connection)
                live = next((j % len(addrs) for j in range(i, i + len(addrs)) if accepts(addrs[j % len(addrs)])),
                            None)
                if live is None:
                    time.sleep(delay)
                    delay = min(1.0, delay * 2)
                    continue
                i = live
            host, port = addrs[i]
            try:
                if v5:
                    c.connect(host, port, keepalive=10, clean_start=not a.persistent, properties=props)
                else:
                    c.connect(host, port, keepalive=10)
                up, delay = True, 0.1
            except OSError as e:
                rep.line("error", error=repr(e))
                i = (i + 1) % len(addrs)
                time.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
        rc = c.loop(timeout=0.05)
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            up = False
            if len(addrs) > 1:
                i = (i + 1) % len(addrs)  # (on at the next address)
            else:
                time.sleep(delay)
    rep.line("stopping")
    if up:
        c.disconnect()
    sys.exit(0)


if __name__ == "__main__":
    main()
