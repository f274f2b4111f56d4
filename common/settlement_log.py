"""The settlement log: one JSON object per line per event, schema versioned (docs/settlement-log.md).

This is data, not logging. Routers write every delivery-record event; clients write what they
published (with the outcome) and what they handed to the application. The Spark reconciliation
(`spark/`) reads all of it; `spark/schema.py` holds the same schema as a StructType and a test keeps
the two in step.

Lines are buffered and written with one `write` per flush (a timer, a size threshold, shutdown).
A flushed line is in the kernel's page cache, so it survives a SIGKILL of the process; the unflushed
tail (at most `flush_interval` seconds) does not, which the reconciliation tolerates for routers.
Clients flush before they acknowledge, so their logs are exact.

Segments (`Segments`, routers): the log is a series of files `<stem>.<inc>.<n>.jsonl`, a new one
when the open one reaches a size or an age; a closed segment is compressed to `.jsonl.gz` by a
worker thread (never on the event loop: gzip of a 64 MiB segment takes about a second), and
retention deletes the oldest closed segments by age or total size, only when configured. A crash
between writing `X.jsonl.gz` and removing `X.jsonl` leaves both: readers take the `.gz` (it is
renamed into place only when complete) and the next start removes the plain one.

Schema v2 (segmented logs, i.e. routers): every segment starts with a header line naming the
writer once (`{"v":2,"h":"segment","t0":...,"src":...,"node":...,"inc":...,"seg":n}`), and its
other lines use short keys, times in microseconds after the header's `t0`, and one line per
(event, topic, subscription, info) per flush pass with the global ids of that pass grouped
(`"g":["plid:7 8 9"]`: the first id whole, the next ones as what follows its first 13
characters). A closed segment ends with a `segment_closed` line. `read_events` gives back one v1-shaped
dict per (event, id), whichever the version; unsegmented logs (clients) still write v1 lines.
docs/settlement-log.md has the whole schema.

A full disk (ENOSPC, EDQUOT, or free space below a floor) never loses a line: the unwritten bytes
stay in memory, `writable` turns False and `on_writable(False)` is called (the router then stops
granting publishers credit, so what is held stays bounded); every later flush retries, and the
first that writes everything calls `on_writable(True)`. A writer in `hold` mode (routers) keeps
going; otherwise (clients, which flush before they act) `flush` raises after keeping the bytes.
"""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cmalloc import trimmer

SCHEMA_VERSION = 2  # what segmented logs (routers) write; readers read 1 and 2
V1 = 1  # what unsegmented logs (clients) still write
GID_PREFIX = 13  # a v2 gid group: the ids after the first are written as what follows its first 13 chars
ROTATE_RETRY = 60.0  # seconds between attempts to start a new segment after one failed
STALL_GAP = 0.1  # v2: core events more than this apart within one flush are not stamped as one (what a stall split)


class SizeCount(tuple[int, int]):
    """Info of a core "received" log event: (size, count), written as "size" and "count" fields.
    A tuple subclass, not a dict: the commonest event of the hot path is formatted in one step."""

    __slots__ = ()


class AcceptedBy(int):
    """Info of a core "outcome" event when the outcome is ACCEPTED: the number of subscriptions."""

    __slots__ = ()


class Peer(str):
    """Info of a core "forwarded" / "forward_received" event: the neighbour router(s), written as
    `peer` (a str subclass: the writer groups the ids of one pass by it)."""

    __slots__ = ()


class Owed:
    """Info of a core "received" (or "owed") event: the subscriptions a record is owed to at its
    origin, each with its home router then, written as `"o":{"home":"sid sid",...}` (home "" when
    the router did not know it yet). The core keeps one instance per (topic, table version), so the
    writer groups a pass's new records by identity and encodes the set once."""

    __slots__ = ("pairs", "json")

    def __init__(self, pairs: Iterable[tuple[str, str | None]]) -> None:
        self.pairs = tuple(pairs)
        by_home: dict[str, list[str]] = {}
        for sid, home in self.pairs:
            by_home.setdefault(home or "", []).append(sid)
        self.json = _enc({home: " ".join(sids) for home, sids in by_home.items()})

    def __len__(self) -> int:
        return len(self.pairs)

    def __repr__(self) -> str:
        return f"Owed({self.pairs!r})"

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
    # v2 (routers)
    "owed": "map",  # received/owed: home router -> space-separated subscription ids owed the message
    "seg": "int",  # segment_opened/segment_closed: the segment's number in its incarnation
}

ROUTER_EVENTS = {
    "router_started", "router_stopped",
    "received", "delivered", "accepted", "rejected", "released", "modified", "ended", "outcome",
    "settled", "placeholder", "placeholder_final", "orphan_final",
    "attach_requested", "subscribed", "resumed", "suspended", "unsubscribed", "expired",
    "forwarded", "forward_received", "remote_ack", "peer_up", "peer_down",
    # v2: parts an origin adds to a record after it was received (a resend adopted here, total
    # order), and the segment boundaries (the header line reads as `segment_opened`)
    "owed", "segment_opened", "segment_closed",
    # a life made for a claim the mesh refused (another identity holds the subscription) ended: not
    # an end of the subscription's own life
    "claim_refused",
}
PUBLISHER_EVENTS = {"published", "outcome"}
SUBSCRIBER_EVENTS = {"subscribed", "resumed", "unsubscribed", "handed", "duplicate"}
EVENTS = ROUTER_EVENTS | PUBLISHER_EVENTS | SUBSCRIBER_EVENTS

_enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

# v2: fields with a short key (the others keep their v1 name)
_V2_KEYS = {"gid": "g", "topic": "p", "sub": "s", "info": "i", "owed": "o"}
_V1_NAMES = {v: k for k, v in _V2_KEYS.items()}
# events whose global ids a client presented (any string): grouped only when they are plain
_PRESENTED = frozenset({"placeholder", "placeholder_final"})


def _groupable(gid: str) -> bool:
    """Can `gid` go into a v2 id group (a JSON string of space-separated ids) as it is? Our gids
    always can (ids.py: printable ASCII, no space, quote or backslash); a client-presented one may not."""
    return gid.isascii() and gid.isprintable() and " " not in gid and '"' not in gid and "\\" not in gid


def _gid_groups(gids: list[str]) -> str:
    """The JSON array of a v2 line's ids: runs of ids sharing their first GID_PREFIX characters
    become one string, the first id whole, the others without that prefix ("p:1 2 3")."""
    if len(gids) == 1:  # (the common case at moderate rates: a message per loop pass)
        return '["' + gids[0] + '"]'
    # The common case at full rate: one run (one publisher link's ids), found and written by C
    # string methods instead of a Python step per id (a line per event and subscription, so 2 per
    # delivery: ~1,000 instructions per id saved). The ids hold no space (`_groupable`): in the ids
    # joined by spaces, " " + prefix is found only where an id starts; one run when every id after
    # the first starts so and is longer than the prefix.
    first = gids[0]
    pre = first[:GID_PREFIX]
    joined = " ".join(gids)
    sp = " " + pre
    if len(pre) == GID_PREFIX and joined.count(sp) == len(gids) - 1 and sp + " " not in joined \
            and not joined.endswith(sp):
        return '["' + first + joined[len(first):].replace(sp, " ") + '"]'
    return _gid_runs(gids)


def _gid_runs(gids: list[str]) -> str:
    """`_gid_groups`, id by id (the general case: several runs)."""
    runs: list[list[str]] = []
    cur = None
    toks: list[str] = []
    for g in gids:
        pre = g[:GID_PREFIX]
        if pre == cur and len(g) > GID_PREFIX:
            toks.append(g[GID_PREFIX:])
        else:
            cur = pre
            toks = [g]
            runs.append(toks)
    return '["' + '","'.join(" ".join(t) for t in runs) + '"]'


def expand_gids(groups: Iterable[str]) -> list[str]:
    """The ids of a v2 `g` array, in order (the inverse of `_gid_groups`)."""
    out: list[str] = []
    for run in groups:
        toks = run.split(" ")
        first = toks[0]
        pre = first[:GID_PREFIX]
        out.append(first)
        out.extend(pre + t for t in toks[1:])
    return out


class _Single:
    """A v2 pass entry written on a line of its own (a key of the pass's ordered dict of groups)."""

    __slots__ = ("entry",)

    def __init__(self, entry: tuple[Any, ...]) -> None:
        self.entry = entry

log = logging.getLogger("oncemesh.settlement_log")

# errors that mean "no room": the bytes are kept and the write is retried later
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
PLAIN, COMPRESSED = ".jsonl", ".jsonl.gz"
# zlib's fast deflate: on these logs ~42x at ~3 ms of CPU per MB (level 6: ~45x at ~7 ms per MB)
GZIP_LEVEL = 3


@dataclass(frozen=True, slots=True)
class Segments:
    """How a log is cut into segments and how long they are kept. 0 means "no limit"; retention 0
    keeps every segment (the default: evidence is deleted only when the operator says so)."""

    max_bytes: int = 64 * 1024 * 1024  # a new segment after this many bytes
    max_seconds: float = 3600.0  # ... or when the open one is this old
    retention_bytes: int = 0  # delete the oldest closed segments while all of them exceed this
    retention_seconds: float = 0.0  # delete closed segments whose last line is older than this
    compress: bool = True  # gzip closed segments (in a worker thread)
    free_floor_bytes: int = 0  # hold the log (as on ENOSPC) while the file system has less free


def segment_name(stem: str, inc: str, n: int, compressed: bool = False) -> str:
    """`<stem>.<inc>.<n>.jsonl` (`.jsonl.gz` once compressed); n counts from 1 in each incarnation."""
    return f"{stem}.{inc}.{n:06d}{COMPRESSED if compressed else PLAIN}"


def _segment_re(stem: str) -> re.Pattern[str]:
    return re.compile(re.escape(stem) + r"\.(?P<inc>[^.]+)\.(?P<n>\d{6})(?P<ext>\.jsonl(?:\.gz)?)$")


def compress_segment(path: Path) -> Path:
    """gzip `X.jsonl` to `X.jsonl.gz` (written as `.tmp`, synced, renamed), then remove `X.jsonl`.
    zlib releases the GIL while it compresses, so a worker thread does not stall the event loop.
    The segment is read into one buffer, reused chunk after chunk (not a new 1 MiB object per read)."""
    gz = path.with_name(path.name + ".gz")
    tmp = path.with_name(path.name + ".gz.tmp")
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb") as src, open(tmp, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0) as dst:
            while n := src.readinto(buf):
                dst.write(view[:n])
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, gz)
    path.unlink(missing_ok=True)
    return gz


# JSON-lines files a router keeps in its state directory that are not settlement logs: the total
# order's journals (interrouter/orderstate.py, `<router>.order.<topic>.seq.jsonl`)
NOT_LOGS = re.compile(r"\.order\..+\.seq\.jsonl$")


def log_files(directory: Path) -> list[Path]:
    """Every settlement-log file under `directory` (recursively): plain `*.jsonl` and compressed
    `*.jsonl.gz`, without a plain segment whose `.gz` exists (a crash between the two: the `.gz` is
    the complete one), nor a router's other JSON-lines files (`NOT_LOGS`: a reconciliation of a
    router's whole state directory counted a total-order journal's lines as malformed)."""
    found = sorted(f for f in directory.rglob("*.jsonl*") if f.is_file() and f.name.endswith((PLAIN, COMPRESSED))
                   and not NOT_LOGS.search(f.name))
    names = {str(f) for f in found}
    return [f for f in found if not (f.name.endswith(PLAIN) and str(f) + ".gz" in names)]


def read_lines(path: Path) -> Iterable[str]:
    """The lines of one log file, plain or gzipped (a torn gzip tail ends the file quietly)."""
    if path.name.endswith(".gz"):
        try:
            with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
                yield from f
        except EOFError:
            return
    else:
        with open(path, encoding="utf-8", newline="\n") as f:
            yield from f


def expand_line(obj: dict[str, Any], header: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One parsed line -> its events as v1-shaped dicts (full field names, `v`, `ts`, `src`, `node`,
    `inc`, `ev`; one dict per global id of a v2 group). A v1 line is returned as it is; a v2 line
    takes the writer's fields from `header` (the segment's header line; None: not known, then the
    line is returned as it is, without them); a header returns its `segment_opened` event."""
    if "v" in obj and "h" not in obj:
        return [obj]
    if "h" in obj:  # a header: the segment's first line
        t0 = obj.get("t0")
        return [{"v": obj.get("v"), "ts": t0 / 1e6 if isinstance(t0, int) else None, "src": obj.get("src"),
                 "node": obj.get("node"), "inc": obj.get("inc"), "ev": "segment_opened", "seg": obj.get("seg")}]
    base: dict[str, Any] = {}
    if header is not None:
        t0 = header.get("t0")
        t = obj.get("t")
        base = {"v": header.get("v"), "ts": (t0 + t) / 1e6 if isinstance(t0, int) and isinstance(t, int) else None,
                "src": header.get("src"), "node": header.get("node"), "inc": header.get("inc")}
    ev: dict[str, Any] = {**base, "ev": obj.get("e")}
    for k, v in obj.items():
        if k in ("t", "e", "g"):
            continue
        ev[_V1_NAMES.get(k, k)] = v
    groups = obj.get("g")
    if not isinstance(groups, list):
        return [ev]
    return [{**ev, "gid": g} for g in expand_gids(groups)]


def read_events(path: Path) -> Iterable[dict[str, Any]]:
    """The events of one log file (v1 or v2, plain or gzipped) as v1-shaped dicts (`expand_line`).
    Lines that are not JSON objects (a torn last line) are skipped."""
    header: dict[str, Any] | None = None
    for line in read_lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if "h" in obj:
            header = obj
        yield from expand_line(obj, header)


def _free_bytes(directory: str) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


# After each job the housekeeper hands the memory it freed back to the system. Each worker thread
# is new and glibc may give it a malloc arena of its own; what a compression allocated there (its
# read and output chunks, zlib's state) stayed resident after it was freed: line3 routers at 2,000
# msg/s gained ~2-7 MB per new arena over a 20-minute soak (docs/operations.md, "What can grow").
release_free_memory = trimmer()


class _Housekeeper:
    """The worker thread of one segmented log: compresses closed segments and applies retention.
    Jobs are paths (compress, then retention) or None (retention only)."""

    def __init__(self, directory: Path, stem: str, policy: Segments, open_path: Callable[[], Path | None]) -> None:
        self.directory = directory
        self.pattern = _segment_re(stem)
        self.policy = policy
        self.open_path = open_path
        self.jobs: queue.Queue[Path | None] = queue.Queue()
        self.compressed = 0
        self.deleted = 0
        self.name = f"slog-{stem}"
        self._lock = threading.Lock()
        self._running = False

    def submit(self, job: Path | None) -> None:
        """Queue a job; a thread runs while there are jobs and ends when there are none (an idle
        second thread costs the event loop's thread ~1% more instructions per message: CPython's
        GIL hand-offs around every I/O call)."""
        with self._lock:
            self.jobs.put(job)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name=self.name, daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._lock:
                try:
                    job = self.jobs.get_nowait()
                except queue.Empty:
                    self._running = False
                    return
            try:
                if job is not None and self.policy.compress and job.exists():
                    compress_segment(job)
                    self.compressed += 1
                self.retain()
            except OSError as exc:  # ENOSPC while compressing: the plain segment stays, readable
                log.warning("settlement_log.housekeeping_failed path=%s error=%s", job, exc)
            finally:
                if release_free_memory is not None:
                    release_free_memory()
                self.jobs.task_done()

    def segments(self) -> list[tuple[float, str, Path, int]]:
        """Closed segments on disk: (mtime, name, path, size), oldest first."""
        out = []
        current = self.open_path()
        for entry in os.scandir(self.directory):
            if not self.pattern.match(entry.name) or (current is not None and entry.name == current.name):
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            out.append((st.st_mtime, entry.name, Path(entry.path), st.st_size))
        out.sort()
        return out

    def retain(self, now: float | None = None) -> list[Path]:
        """Delete the oldest closed segments beyond the retention limits (none when both are 0)."""
        p = self.policy
        if not p.retention_bytes and not p.retention_seconds:
            return []
        now = time.time() if now is None else now
        segs = self.segments()
        current = self.open_path()
        total = sum(s[3] for s in segs) + (current.stat().st_size if current is not None and current.exists() else 0)
        gone = []
        for mtime, _name, path, size in segs:
            old = p.retention_seconds and mtime < now - p.retention_seconds
            big = p.retention_bytes and total > p.retention_bytes
            if not (old or big):
                break
            path.unlink(missing_ok=True)
            total -= size
            gone.append(path)
            self.deleted += 1
            log.info("settlement_log.segment_deleted path=%s reason=%s", path, "age" if old else "size")
        return gone


class SettlementLog:
    """One writer's settlement log. `path` names the log: with `segments`, the files are
    `<path without .jsonl>.<inc>.<n>.jsonl` (see `Segments`); without, `path` itself, appended to.
    `write_fn` and `free_bytes_fn` are the I/O, injectable for tests."""

    # slots: the hot path reads a dozen attributes per call; as a plain instance this class has
    # more attributes than CPython 3.11 shares keys for (30), and every read gets slower (~1%/msg)
    __slots__ = ("path", "segments", "hold", "on_writable", "_write_fn", "_free_bytes", "writable",
                 "blocked_since", "block_reason", "blocks", "_pending", "_seg_n", "_seg_bytes",
                 "_seg_opened", "_rotate_retry_at", "open_segment", "_keeper", "_stem", "src", "node", "inc", "flush_interval",
                 "max_buffer", "_buf", "_fd", "_head", "_tail", "_topics", "_ev_tails", "_strs", "last_flush",
                 "v2", "_t0", "_last_t", "_groups", "_groups_ts", "_grouped")

    def __init__(self, path: Path | str | None, src: str, node: str, inc: str,
                 flush_interval: float = 0.2, max_buffer: int = 4096, segments: Segments | None = None,
                 hold: bool = False, on_writable: Callable[[bool], None] | None = None,
                 write_fn: Callable[[int, memoryview], int] = os.write,
                 free_bytes_fn: Callable[[str], int] = _free_bytes) -> None:
        self.path = Path(path) if path else None
        self.segments = segments
        self.hold = hold
        self.on_writable = on_writable
        self._write_fn = write_fn
        self._free_bytes = free_bytes_fn
        self.writable = True
        self.blocked_since: float | None = None  # wall clock of the first failed write of this block
        self.block_reason = ""
        self.blocks = 0
        self._pending = b""  # encoded bytes not written yet (a full disk): written before anything else
        self._seg_n = 0
        self._seg_bytes = 0
        self._seg_opened = 0.0
        self._rotate_retry_at = 0.0  # after a failed rotation, the next attempt waits until then
        self.open_segment: Path | None = None
        self._keeper: _Housekeeper | None = None
        self._stem = ""
        self.src = src
        self.node = node
        self.inc = inc
        self.flush_interval = flush_interval
        self.max_buffer = max_buffer
        self._buf: list[str] = []
        self._fd: int | None = None
        self._head = f'{{"v":{V1},"ts":'
        self._tail = f',"src":{_enc(src)},"node":{_enc(node)},"inc":{_enc(inc)},"ev":"'
        self._topics: dict[str, str] = {}
        self._ev_tails: dict[str, str] = {}
        self._strs: dict[str, str] = {}  # JSON encodings of frequent string values
        self.last_flush = time.monotonic()
        self.v2 = segments is not None  # segmented logs (routers) write v2, others v1
        self._t0 = 0  # v2: the open segment's time base (unix microseconds, in its header)
        self._last_t = 0  # v2: the latest line time written, relative to _t0 (never decreases)
        self._groups: dict[Any, list[str] | None] = {}  # v2: core entries gathered until the next flush
        self._groups_ts = 0.0  # v2: the latest ts given with them
        self._grouped = 0  # v2: how many
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.segments is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            else:
                stem = self.path.name[:-len(PLAIN)] if self.path.name.endswith(PLAIN) else self.path.name
                self._stem = stem
                self._keeper = _Housekeeper(self.path.parent, stem, self.segments, lambda: self.open_segment)
                self._recover()
                self._open_next()

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

    def _rel(self, ts: float) -> int:
        """v2: `ts` as microseconds after the segment's t0, never less than the previous line's (a
        wall clock stepping back does not reorder a segment's lines)."""
        t = int(ts * 1_000_000) - self._t0
        if t < self._last_t:
            return self._last_t
        self._last_t = t
        return t

    def write(self, ev: str, ts: float, gid: str | None = None, topic: str | None = None,
              sub: str | None = None, **fields: Any) -> None:
        if self._fd is None:
            return
        if self.v2:
            self._render()  # (what was gathered before it goes first)
            self._buf.append(self._line_v2(f'{{"t":{self._rel(ts)},"e":"{ev}"', gid, topic, sub, fields))
            if len(self._buf) >= self.max_buffer:
                self.flush()
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

    def _line_v2(self, head: str, gid: str | None, topic: str | None, sub: str | None,
                 fields: dict[str, Any]) -> str:
        """One v2 line (not grouped): short keys for the common fields, the others as in v1."""
        line = head
        if gid is not None:
            line += ',"g":["' + gid + '"]' if _groupable(gid) else ',"gid":' + _enc(gid)
        if topic is not None:
            line += ',"p":' + self._topic(topic)
        if sub is not None:
            line += ',"s":' + _enc(sub)
        for k, v in fields.items():
            if v is None:
                continue
            tv = type(v)
            key = _V2_KEYS.get(k, k)
            if tv is int:
                line += f',"{key}":{v}'
            elif tv is Owed:
                line += f',"{key}":{v.json}'
            else:
                line += f',"{key}":{_enc(v)}'
        return line + "}\n"

    def _core_events_v2(self, ts: float, entries: Iterable[tuple[Any, ...]]) -> None:
        """The v2 hot path. Entries are gathered until the next flush (the router flushes once per
        loop pass, before the pass's output leaves) and then written one line per (event, topic,
        subscription, info), its global ids grouped, stamped with the latest `ts` given since the
        previous flush. Infos that differ per message (a count, an error) get a line each; a
        subscription's lifecycle (an entry without gid) is written at once, after what came before."""
        groups = self._groups
        if ts > self._groups_ts:
            if groups and ts - self._groups_ts > STALL_GAP:
                # what was gathered keeps its own time: events decided before a stall (a freeze, a
                # starved CPU) in the middle of a pass are not dated after it ("Times")
                self._render()
                groups = self._groups
            self._groups_ts = ts
        n = 0
        for entry in entries:
            n += 1
            ev, gid, topic, sid, info = entry
            ti = type(info)
            if gid is not None and (info is None or ti is str or ti is AcceptedBy or ti is Owed or ti is Peer) \
                    and (ev not in _PRESENTED or _groupable(gid)):
                key = (ev, topic, sid, info)
                g = groups.get(key)
                if g is None:
                    groups[key] = [gid]
                else:
                    g.append(gid)
            elif gid is None:  # a subscription's lifecycle: the reconciliation needs it promptly
                groups[_Single(entry)] = None
                self.flush()  # (renders what was gathered, this line last)
                groups = self._groups
                if ts > self._groups_ts:
                    self._groups_ts = ts
                n = 0
            else:
                groups[_Single(entry)] = None
        self._grouped += n
        if self._grouped >= self.max_buffer:
            self.flush()

    def _render(self) -> None:
        """The gathered core entries as v2 lines, into the write buffer."""
        groups = self._groups
        if not groups:
            return
        self._groups = {}
        self._grouped = 0
        head = f'{{"t":{self._rel(self._groups_ts)},"e":"'
        self._groups_ts = 0.0
        out = self._buf
        topics = self._topics
        topic_of = self._topic
        strs = self._strs
        for key, gids in groups.items():
            if gids is None:
                out.append(self._single_v2(head, key.entry))
                continue
            ev, topic, sid, info = key
            line = head + ev + '"'
            if topic is not None:
                line += ',"p":' + (topics.get(topic) or topic_of(topic))
            if sid is not None:
                line += ',"s":"' + sid + '"'
            if info is not None:
                ti = type(info)
                if ti is Owed:
                    line += ',"o":' + info.json
                elif ti is AcceptedBy:
                    line += ',"outcome":"ACCEPTED"'
                elif ti is Peer:
                    line += ',"peer":' + _enc(info)
                else:
                    enc = strs.get(info)
                    if enc is None:
                        enc = _enc(info)
                        if len(strs) < 4096:
                            strs[info] = enc
                    line += ',"i":' + enc
            out.append(line + ',"g":' + _gid_groups(gids) + "}\n")

    def _single_v2(self, head: str, entry: tuple[Any, ...]) -> str:
        ev, gid, topic, sid, info = entry
        fields: dict[str, Any]
        if type(info) is dict:
            fields = info
        elif type(info) is SizeCount:
            fields = {"size": info[0], "count": info[1]}
        elif type(info) is str:
            fields = {"info": info}
        elif info is not None:  # a condition (name, description)
            fields = {"error": ": ".join(map(str, info))}
        else:
            fields = {}
        return self._line_v2(head + ev + '"', gid, topic, sid, fields)

    def write_core_event(self, ts: float, entry: tuple[Any, ...]) -> None:
        """A delivery-core log tuple: (ev, gid, topic, sid, info)."""
        self.write_core_events(ts, (entry,))

    def write_core_events(self, ts: float, entries: Iterable[tuple[Any, ...]]) -> None:
        """Delivery-core log tuples (ev, gid, topic, sid, info), all stamped `ts`: the hot path.
        Global ids and subscription ids need no JSON escaping (ids.py keeps them to safe ASCII)."""
        if self._fd is None:
            return
        if self.v2:
            self._core_events_v2(ts, entries)
            return
        head = f'{{"v":{V1},"ts":{ts!r}'
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
            elif type(info) is Peer:
                line += ',"peer":' + _enc(str(info))
            elif type(info) is Owed:
                line += f',"count":{len(info)}'
            elif info is not None:  # a condition (name, description)
                line += ',"error":' + _enc(": ".join(map(str, info)))
            out.append(line + "}\n")
        if lifecycle or len(out) >= self.max_buffer:
            self.flush()

    def _ev_tail(self, ev: str) -> str:
        t = self._ev_tails[ev] = self._tail + ev + '"'
        return t

    # ------------------------------------------------------------------ segments
    def _recover(self) -> None:
        """At start: earlier incarnations' segments are closed; finish what a crash interrupted
        (a `.gz.tmp` is removed, a plain segment next to its `.gz` is removed, the others are
        compressed) and apply retention."""
        assert self.path is not None and self._keeper is not None
        pattern = _segment_re(self._stem)
        names = {e.name for e in os.scandir(self.path.parent)}
        for name in sorted(names):  # first, before the worker makes new ones
            if name.endswith(".gz.tmp") and pattern.match(name[:-len(".tmp")]):
                (self.path.parent / name).unlink(missing_ok=True)
        for name in sorted(names):
            m = pattern.match(name)
            if m is None or m["ext"] != PLAIN:
                continue
            if name + ".gz" in names:
                (self.path.parent / name).unlink(missing_ok=True)
            else:  # no process writes it any more: this incarnation has not opened one yet
                self._keeper.submit(self.path.parent / name)
        self._keeper.submit(None)

    def _open_next(self) -> None:
        assert self.path is not None
        seg = self.path.parent / segment_name(self._stem, self.inc, self._seg_n + 1)
        self._fd = os.open(seg, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._seg_n += 1
        self.open_segment = seg
        self._seg_bytes = 0
        self._seg_opened = time.monotonic()
        if self.v2:
            # the header names the writer once for the whole segment; it goes out before any line
            # of the segment (at the next flush, with them), so even an idle segment is not empty
            self._t0 = time.time_ns() // 1000
            self._last_t = 0
            header = {"v": SCHEMA_VERSION, "h": "segment", "t0": self._t0, "src": self.src,
                      "node": self.node, "inc": self.inc, "seg": self._seg_n}
            self._pending = (_enc(header) + "\n").encode("utf-8") + self._pending

    def _close_segment(self) -> None:
        """Close the open segment and hand it to the worker (compression, retention)."""
        if self._fd is None or self.open_segment is None or self._keeper is None:
            return
        if self.v2 and self._seg_bytes and not self._pending:
            # the trailer: a closed segment that lacks it was cut short (docs/settlement-log.md)
            trailer = f'{{"t":{self._rel(time.time())},"e":"segment_closed","seg":{self._seg_n}}}\n'.encode()
            try:
                self._seg_bytes += self._write_fn(self._fd, memoryview(trailer))
            except OSError as exc:
                log.warning("settlement_log.trailer_failed path=%s error=%s", self.open_segment, exc)
        os.close(self._fd)
        self._fd = None
        closed, self.open_segment = self.open_segment, None
        if self._seg_bytes == 0:
            closed.unlink(missing_ok=True)
            return
        self._keeper.submit(closed)

    def _rotation_due(self, now: float) -> bool:
        """Is the open segment's size or time up (nothing held, no failed rotation waiting)?"""
        p = self.segments
        if p is None or self._pending or self._seg_bytes == 0 or now < self._rotate_retry_at:
            return False
        return bool((p.max_bytes and self._seg_bytes >= p.max_bytes)
                    or (p.max_seconds and now - self._seg_opened >= p.max_seconds))

    def _maybe_rotate(self, now: float | None = None) -> None:
        if now is None:
            now = time.monotonic()
        if self._rotation_due(now):
            # the new file first (no room for it: the open one stays), then the old one is closed
            old = (self._fd, self.open_segment, self._seg_bytes, self._seg_n, self._t0, self._last_t)
            try:
                self._open_next()
            except OSError as exc:  # no room for a new file: keep appending to the open one
                self._rotate_retry_at = now + ROTATE_RETRY
                log.warning("settlement_log.rotate_failed path=%s error=%s (appending to it; next try in %.0f s)",
                            old[1], exc, ROTATE_RETRY)
                return
            new = (self._fd, self.open_segment, self._seg_bytes, self._seg_n, self._t0, self._last_t)
            header, self._pending = self._pending, b""  # (nothing else was pending: see above)
            self._fd, self.open_segment, self._seg_bytes, self._seg_n, self._t0, self._last_t = old
            self._close_segment()
            self._fd, self.open_segment, self._seg_bytes, self._seg_n, self._t0, self._last_t = new
            self._pending = header

    # ------------------------------------------------------------------ writing
    def _set_writable(self, writable: bool, reason: str = "") -> None:
        if writable == self.writable:
            return
        self.writable = writable
        if writable:
            self.blocked_since = None
            self.block_reason = ""
        else:
            self.blocks += 1
            self.blocked_since = time.time()
            self.block_reason = reason
        if self.on_writable is not None:
            self.on_writable(writable)

    @property
    def pending_bytes(self) -> int:
        """Bytes held in memory, not yet written (buffered lines and what a full disk refused)."""
        return len(self._pending) + sum(len(line) for line in self._buf) + 20 * self._grouped

    def flush_due(self, now: float | None = None) -> bool:
        """Would `flush` do anything now: write what is buffered or held, or cut a segment whose
        time (or size) is up? A caller that gives the flush a loop pass of its own (the router's
        tick) asks first: an idle log needs no pass. `now`: monotonic."""
        if self._fd is None:
            return False
        if self._groups or self._buf or self._pending:
            return True
        return self._rotation_due(time.monotonic() if now is None else now)

    def flush(self) -> None:
        """Write everything buffered. On a full disk the bytes are kept (never dropped) and the log
        turns not writable; a writer not in `hold` mode then raises the OSError."""
        if self._fd is None:
            return
        if self._groups:
            self._render()
        if self._buf:
            self._pending += "".join(self._buf).encode("utf-8")
            self._buf.clear()
        if not self._pending:
            if self.segments is not None and self.segments.max_seconds:
                self._maybe_rotate()
            return
        floor = self.segments.free_floor_bytes if self.segments is not None else 0
        if floor and self.path is not None:
            try:
                free = self._free_bytes(str(self.path.parent))
            except OSError:
                free = floor
            if free < floor:
                self._set_writable(False, f"free space {free} B below the floor of {floor} B")
                if not self.hold:
                    raise OSError(errno.ENOSPC, f"settlement log held: {self.block_reason}")
                return
        pending = self._pending
        written = 0
        try:
            # one write, the usual (a pass's lines are a few hundred bytes); a short one goes on
            with memoryview(pending) as view:
                written = self._write_fn(self._fd, view)
                while written < len(view):
                    written += self._write_fn(self._fd, view[written:])
        except OSError as exc:
            self._pending = pending[written:]
            self._seg_bytes += written
            if exc.errno not in NO_SPACE:
                raise
            self._set_writable(False, os.strerror(exc.errno))
            if not self.hold:
                raise
            return
        self._seg_bytes += written
        self._pending = b""
        self.last_flush = now = time.monotonic()
        if not self.writable:
            self._set_writable(True)
        self._maybe_rotate(now)

    def close(self, wait: bool = True) -> None:
        """Flush, close the open segment (compressed by the worker) and, with `wait`, wait until
        the worker is done. Bytes a full disk still refuses are reported, then dropped."""
        try:
            self.flush()
        except OSError as exc:
            log.error("settlement_log.lost_at_close path=%s bytes=%d error=%s", self.path,
                      self.pending_bytes, exc)
        if self._pending:
            log.error("settlement_log.lost_at_close path=%s bytes=%d reason=%s", self.path,
                      len(self._pending), self.block_reason)
            self._pending = b""
        if self._keeper is not None:
            self._close_segment()
            if wait:
                self._keeper.jobs.join()
        elif self._fd is not None:
            os.close(self._fd)
        self._fd = None

    def stats(self) -> dict[str, Any]:
        """For the router's status: writable, blocked since, held bytes, segments."""
        out: dict[str, Any] = {"log_writable": self.writable, "log_pending_bytes": self.pending_bytes,
                               "log_blocks": self.blocks}
        if self.blocked_since is not None:
            out["log_blocked_since"] = round(self.blocked_since, 3)
            out["log_blocked_reason"] = self.block_reason
        if self._keeper is not None:
            out["log_segment"] = self.open_segment.name if self.open_segment is not None else None
            out["log_segments_compressed"] = self._keeper.compressed
            out["log_segments_deleted"] = self._keeper.deleted
        return out
