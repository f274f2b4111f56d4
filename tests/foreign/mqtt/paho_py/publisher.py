"""paho-mqtt (Python) publisher for the MQTT foreign-client tests: publishes --count messages to
--topic at --qos, at most --rate per second, and reports each as `sent` when handed to paho and as
`acked` when paho says the protocol's last acknowledgement came (QoS 2: PUBCOMP; QoS 1: PUBACK),
with the MQTT 5 reason code. paho keeps at most 20 QoS 1/2 messages in flight and queues the rest
(its max_inflight_messages); its network thread reconnects by itself. Plain paho-mqtt."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import Report, host_port, parser, payload  # noqa: E402


def main() -> None:
    a = parser(__doc__.splitlines()[0], "publisher").parse_args()
    rep = Report(a.report)
    v5 = a.mqtt == "5"
    c = (mqtt.Client(CallbackAPIVersion.VERSION2, client_id=a.client_id, protocol=mqtt.MQTTv5) if v5 else
         mqtt.Client(CallbackAPIVersion.VERSION2, client_id=a.client_id, protocol=mqtt.MQTTv311, clean_session=True))
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
        rep.line("connected", present=bool(flags.session_present))

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
    props.SessionExpiryInterval = 0
    host, port = host_port(a.url)
    try:
        if v5:
            c.connect(host, port, keepalive=10, clean_start=True, properties=props)
        else:
            c.connect(host, port, keepalive=10)
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
    c.disconnect()
    c.loop_stop()


if __name__ == "__main__":
    main()
