"""The settlement log: one JSON object per line per event, schema versioned (docs/settlement-log.md).

This is data, not logging. Routers write every delivery-record event; clients write what they
published (with the outcome) and what they handed to the application. The Spark reconciliation
(`spark/`) reads all of it; `spark/schema.py` holds the same schema as a StructType and a test keeps
the two in step.

Lines are buffered and written with one `write` per flush (a timer, a size threshold, shutdown).
A flushed line is in the kernel's page cache, so it survives a SIGKILL of the process; the unflushed
tail (at most `flush_interval` seconds) does not, which the reconciliation tolerates for routers.
Clients flush before they acknowledge, so their logs are exact.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1


class SizeCount(tuple[int, int]):
    """Info of a core "received" log event: (size, count), written as "size" and "count" fields.
    A tuple subclass, not a dict: the commonest event of the hot path is formatted in one step."""

    __slots__ = ()


class AcceptedBy(int):
    """Info of a core "outcome" event when the outcome is ACCEPTED: the number of subscriptions."""

    __slots__ = ()

# field name -> JSON type, in line order. Every line has v, ts, src, node, inc, ev; the rest are
# present only when they apply. Keep in step with spark/schema.py and docs/settlement-log.md.
FIELDS: dict[str, str] = {
    "v": "int",  # schema version
    "ts": "float",  # unix seconds (wall clock of the writer)
    "src": "string",  # router | publisher | subscriber
    "node": "string",  # router id, or client container id
    "inc": "string",  # router incarnation, or client process run id
    "ev": "string",  # event name (see EVENTS)
    "gid": "string",  # global message id
    "topic": "string",
    "sub": "string",  # subscription id (hash of container, link, topic)
    "pub": "string",  # publisher link id (hash of container, link)
    "container": "string",  # subscriber/publisher container id (subscription and link events)
    "link": "string",  # link name
    "peer": "string",  # neighbour router (inter-router events)
    "outcome": "string",  # ACCEPTED | REJECTED | RELEASED | MODIFIED | IN_DOUBT
    "error": "string",  # condition: description
    "size": "int",  # message bytes
    "count": "int",  # owed subscriptions (received/outcome), redelivery count, ...
    "seq": "int",  # client-side sequence number (publish order)
    "info": "string",  # free-form detail (a reason, a JSON string)
}

ROUTER_EVENTS = {
    "router_started", "router_stopped",
    "received", "delivered", "accepted", "rejected", "released", "modified", "ended", "outcome",
    "settled", "placeholder", "placeholder_final", "orphan_final",
    "attach_requested", "subscribed", "resumed", "suspended", "unsubscribed", "expired",
    "forwarded", "forward_received", "remote_ack", "peer_up", "peer_down",
}
PUBLISHER_EVENTS = {"published", "outcome"}
SUBSCRIBER_EVENTS = {"subscribed", "resumed", "unsubscribed", "handed", "duplicate"}
EVENTS = ROUTER_EVENTS | PUBLISHER_EVENTS | SUBSCRIBER_EVENTS

_enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class SettlementLog:
    def __init__(self, path: Path | str | None, src: str, node: str, inc: str,
                 flush_interval: float = 0.2, max_buffer: int = 4096) -> None:
        self.path = Path(path) if path else None
        self.src = src
        self.node = node
        self.inc = inc
        self.flush_interval = flush_interval
        self.max_buffer = max_buffer
        self._buf: list[str] = []
        self._fd: int | None = None
        self._head = f'{{"v":{SCHEMA_VERSION},"ts":'
        self._tail = f',"src":{_enc(src)},"node":{_enc(node)},"inc":{_enc(inc)},"ev":"'
        self._topics: dict[str, str] = {}
        self._ev_tails: dict[str, str] = {}
        self._strs: dict[str, str] = {}  # JSON encodings of frequent string values
        self.last_flush = time.monotonic()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def _topic(self, topic: str) -> str:
        t = self._topics.get(topic)
        if t is None:
            if len(self._topics) > 10_000:
                self._topics.clear()
            t = self._topics[topic] = _enc(topic)
        return t

    def write(self, ev: str, ts: float, gid: str | None = None, topic: str | None = None,
              sub: str | None = None, **fields: Any) -> None:
        if self._fd is None:
            return
        parts = [self._head, repr(ts), self._tail, ev, '"']
        if gid is not None:
            parts.append(f',"gid":{_enc(gid)}')
        if topic is not None:
            parts.append(f',"topic":{self._topic(topic)}')
        if sub is not None:
            parts.append(f',"sub":"{sub}"')
        strs = self._strs
        for k, v in fields.items():
            if v is None:
                continue
            tv = type(v)
            if tv is int:
                parts.append(f',"{k}":{v}')
            elif tv is str:
                enc = strs.get(v)
                if enc is None:
                    enc = _enc(v)
                    if len(strs) < 1000:  # links, publishers, outcomes: a handful of values
                        strs[v] = enc
                parts.append(f',"{k}":{enc}')
            else:
                parts.append(f',"{k}":{_enc(v)}')
        parts.append("}\n")
        self._buf.append("".join(parts))
        if len(self._buf) >= self.max_buffer:
            self.flush()

    def write_core_event(self, ts: float, entry: tuple[Any, ...]) -> None:
        """A delivery-core log tuple: (ev, gid, topic, sid, info)."""
        self.write_core_events(ts, (entry,))

    def write_core_events(self, ts: float, entries: Iterable[tuple[Any, ...]]) -> None:
        """Delivery-core log tuples (ev, gid, topic, sid, info), all stamped `ts`: the hot path.
        Global ids and subscription ids need no JSON escaping (ids.py keeps them to safe ASCII)."""
        if self._fd is None:
            return
        head = f'{{"v":{SCHEMA_VERSION},"ts":{ts!r}'
        tails = self._ev_tails
        topics = self._topics
        topic_of = self._topic
        strs = self._strs
        out = self._buf
        lifecycle = False
        for ev, gid, topic, sid, info in entries:
            tail = tails.get(ev) or self._ev_tail(ev)
            t = (topics.get(topic) or topic_of(topic)) if topic is not None else None
            if gid is not None and t is not None:  # the common shapes, one f-string
                if info is None:
                    if sid is not None:
                        out.append(f'{head}{tail},"gid":"{gid}","topic":{t},"sub":"{sid}"}}\n')
                    else:
                        out.append(f'{head}{tail},"gid":"{gid}","topic":{t}}}\n')
                    continue
                ti = type(info)
                if ti is SizeCount:
                    out.append(f'{head}{tail},"gid":"{gid}","topic":{t},"size":{info[0]},"count":{info[1]}}}\n')
                    continue
                if ti is AcceptedBy:
                    out.append(f'{head}{tail},"gid":"{gid}","topic":{t},"outcome":"ACCEPTED","count":{info}}}\n')
                    continue
            line = head + tail
            if gid is not None:
                line += ',"gid":"' + gid + '"'
            else:
                lifecycle = True  # a subscription's lifecycle: the reconciliation needs it promptly
            if t is not None:
                line += ',"topic":' + t
            if sid is not None:
                line += ',"sub":"' + sid + '"'
            if type(info) is dict:
                for k, v in info.items():
                    if v is None:
                        continue
                    if type(v) is int:
                        line += f',"{k}":{v}'
                    else:
                        enc = strs.get(v) if type(v) is str else None
                        if enc is None:
                            enc = _enc(v)
                            if type(v) is str and len(strs) < 4096:
                                strs[v] = enc
                        line += f',"{k}":' + enc
            elif type(info) is str:
                enc = strs.get(info)
                if enc is None:
                    enc = strs[info] = _enc(info)
                line += ',"info":' + enc
            elif info is not None:  # a condition (name, description)
                line += ',"error":' + _enc(": ".join(map(str, info)))
            out.append(line + "}\n")
        if lifecycle or len(out) >= self.max_buffer:
            self.flush()

    def _ev_tail(self, ev: str) -> str:
        t = self._ev_tails[ev] = self._tail + ev + '"'
        return t

    def flush(self) -> None:
        if self._fd is None or not self._buf:
            return
        data = "".join(self._buf).encode("utf-8")
        self._buf.clear()
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self.last_flush = time.monotonic()

    def close(self) -> None:
        self.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
