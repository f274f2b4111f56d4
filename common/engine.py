"""asyncio <-> Proton engine: one `AmqpConnection` (an asyncio BufferedProtocol) per TCP connection.

Theory of operation
-------------------
Each connection owns a Proton connection, transport and collector. Bytes from the socket are
pushed into the transport; the collector's events are translated into calls on a
`ConnectionHandler` (the router or a client), which act on `Link` objects. Output is never written
from inside a handler: a connection that has something to say marks itself dirty, and the `Engine`
flushes every dirty connection once per event-loop pass, so that a burst of messages from one
publisher becomes one write per subscriber connection. The flush runs at the end of the pass that
made the output, just before the loop waits for I/O again (`_PassEnd`, a wrapper of the loop's
selector), not in a pass of its own: a `call_soon` cost a second pass per pass (a selector poll
and asyncio's bookkeeping), ~4.6 `epoll_wait` per message at 1,000 msg/s (docs/performance.md,
"Issue 19").

Handlers see our own `Link` objects and raw delivery pointers; nothing above this module touches
cffi. A handler exception is contained here (the one supervision point of a connection): the
connection is closed with `amqp:internal-error` and the process carries on.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import selectors
import ssl
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from . import errors
from . import ffi as F
from .cmalloc import trimmer
from .ffi import ffi, lib
from .passrules import HeldInput, PassBudget, PassClock, PassEnd, Read, Timer
from .sasl import SaslClient, SaslError, SaslServer
from .tls import TlsProvider, peer_common_name, peer_names

_release_c_heap = trimmer()  # glibc's malloc_trim(0); None elsewhere

log = logging.getLogger("oncemesh.engine")
MAX_PASSWORD_CHECKS = 16  # PLAIN logins checked at once; more get "try again" (a login storm must not queue)

# the per-message C calls, bound once (a `lib.` attribute lookup per call is measurable)
_peek = lib.pn_collector_peek
_pop = lib.pn_collector_pop
_etype = lib.pn_event_type
_edelivery = lib.pn_event_delivery
_elink = lib.pn_event_link
_dlink = lib.pn_delivery_link
_dupdated = lib.pn_delivery_updated
_dremote_state = lib.pn_delivery_remote_state
_dsettled = lib.pn_delivery_settled
_dsettle = lib.pn_delivery_settle
_daborted = lib.pn_delivery_aborted
_dpartial = lib.pn_delivery_partial
_dpending = lib.pn_delivery_pending
_dtag = lib.pn_delivery_tag
_lcurrent = lib.pn_link_current
_lrecv = lib.pn_link_recv
_ladvance = lib.pn_link_advance
_lsend = lib.pn_link_send
_ldelivery = lib.pn_delivery
_lcredit = lib.pn_link_credit
_lis_sender = lib.pn_link_is_sender
_unpack = ffi.unpack
_from_buffer = ffi.from_buffer
_NULL = ffi.NULL
_E_DELIVERY = F.E_DELIVERY
_E_LINK_FLOW = F.E_LINK_FLOW
_NO_CLOCK = PassClock()  # (no pass-end hook: no poll times to go by)
# the endpoint events a pass budget counts (those the handler works on: common/passrules.py, rule 5)
_BUDGETED = frozenset((F.E_LINK_REMOTE_OPEN, F.E_LINK_REMOTE_CLOSE, F.E_LINK_REMOTE_DETACH, F.E_SESSION_REMOTE_OPEN,
                       F.E_SESSION_REMOTE_CLOSE, F.E_CONNECTION_REMOTE_OPEN, F.E_CONNECTION_REMOTE_CLOSE))
# the other events `_on_endpoint_event` handles (every other type is popped unseen)
_TRANSPORT_ENDS = frozenset((F.E_TRANSPORT_ERROR, F.E_TRANSPORT_CLOSED))

DEFAULT_IDLE_TIMEOUT = 2.0
GC_THRESHOLD = 50_000  # young-generation allocations between cyclic collections (see tune_gc)
DEFAULT_MAX_FRAME = 1024 * 1024
_READ_CHUNK = 64 * 1024


class ConnectionHandler(Protocol):
    """What an application of the engine implements. All methods are called on the loop thread."""

    def on_connection_open(self, conn: AmqpConnection) -> None: ...

    def on_link_open(self, link: Link) -> None:
        """The peer attached `link` (remote-initiated when `link.local_uninit`)."""

    def on_credit(self, link: Link) -> None: ...

    def on_message(self, link: Link, delivery: Any, tag: bytes, payload: bytes, settled: bool) -> None: ...

    def on_delivery_update(self, link: Link, delivery: Any, state: int, settled: bool) -> None: ...

    # Optional: `on_delivery_updates(link, updates)`, consecutive updates of deliveries on one
    # sending link as `(delivery, state, settled)`, in order; a handler that has it gets a run of
    # them in one call (`Connection._dispatch_events`), one without it a call per update.

    def on_link_closed(self, link: Link, closed: bool, condition: tuple[str, str] | None) -> None: ...

    def on_connection_closed(self, conn: AmqpConnection, condition: tuple[str, str] | None) -> None: ...


class _PassEnd(selectors.BaseSelector):
    """The loop's selector, wrapped: before the loop waits for I/O (the end of a pass: every ready
    callback of the pass has run) the engines of this loop that have output flush it. Without this
    the flush was a `call_soon`, which asyncio runs in the next pass, after one more poll of the
    selector: two passes per pass. Output still leaves in the pass that made it, after its
    after-pass work and the write-ahead hooks, and nothing waits longer: when the flush scheduled
    something (a ready callback, a timer, a stop), the wait is shortened as asyncio would have.

    It relies on asyncio's selector loop (`_selector`, `_ready`, `_scheduled`, `_stopping`, all
    of CPython 3.11 to 3.13); on any other loop the engine falls back to `call_soon`."""

    def __init__(self, loop: Any, inner: selectors.BaseSelector) -> None:
        self.loop = loop
        self.inner = inner
        self.pending: list[Engine] = []  # engines with a flush due at the end of this pass
        # (monotonic) the passes' times and whether this one comes after a stall: the edge's rules
        # decide (common/passrules.py), this selector times the polls
        self.clock = PassClock()
        self.stall_hooks: list[Callable[[], None]] = []  # (`Engine.on_stall`)

    @classmethod
    def install(cls, loop: asyncio.AbstractEventLoop) -> _PassEnd | None:
        sel = getattr(loop, "_selector", None)
        if isinstance(sel, _PassEnd):
            return sel
        if not isinstance(loop, asyncio.selector_events.BaseSelectorEventLoop) or not isinstance(
                sel, selectors.BaseSelector) or not all(
                hasattr(loop, a) for a in ("_ready", "_scheduled", "_stopping")):
            return None
        hook = cls(loop, sel)
        loop._selector = hook  # type: ignore[attr-defined]  # asyncio's selector loop keeps its selector private: the pass-end hook wraps it
        return hook

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self.pending:
            self.run_pending()
            loop = self.loop
            if loop._ready or loop._stopping:
                timeout = 0
            elif loop._scheduled and timeout != 0:  # (a timer the flush started, due before the wait ends)
                due = max(0.0, loop._scheduled[0]._when - loop.time())
                timeout = due if timeout is None else min(timeout, due)
        before = time.monotonic()
        events = self.inner.select(timeout)
        # (a process stopped (SIGSTOP) while it waits here wakes with the events of the moment it
        # was stopped: the clock dates such a poll from before it, and tells a stall)
        if self.clock.polled(before, time.monotonic(), timeout):
            self.tell_stall()
        return events

    def note_stall(self) -> None:
        """Tell the hooks, once per pass, that this pass comes after a stall of the process."""
        if self.clock.note_stall():
            self.tell_stall()

    def tell_stall(self) -> None:
        for fn in self.stall_hooks:
            try:
                fn()
            except Exception:  # supervision point, as for a flush
                log.exception("engine.stall_hook_failed")

    def run_pending(self) -> None:
        while self.pending:  # (a flush can make output on another engine of the loop)
            engines, self.pending = self.pending, []
            for eng in engines:
                if eng._scheduled:
                    try:
                        eng._flush_all()
                    except Exception:  # supervision point: as asyncio's for a failed callback
                        log.exception("engine.flush_failed")

    # the rest of the selector's interface, as it is
    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self.inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.inner.modify(fileobj, events, data)

    def close(self) -> None:
        self.pending.clear()
        self.inner.close()

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self.inner.get_key(fileobj)

    def get_map(self) -> Any:
        return self.inner.get_map()


class Engine:
    """Per-loop state shared by all connections: the dirty set flushed once per loop pass."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, pass_end: bool | None = None) -> None:
        self.loop = loop or asyncio.get_event_loop()
        # The flush at the end of the pass (`_PassEnd`) is on unless turned off (`pass_end=False`, or
        # ONCEMESH_PASS_END=0 in the environment): one loop pass per pass with output instead of two
        # (~6 % fewer instructions per message at moderate rates, lower p99 on a quiet machine:
        # docs/performance.md, "Issue 19"). It wraps asyncio's private selector loop; any other loop
        # falls back to a `call_soon` per pass by itself.
        if pass_end is None:
            pass_end = os.environ.get("ONCEMESH_PASS_END", "1") != "0"
        self._pass_end = _PassEnd.install(self.loop) if pass_end else None  # None: a `call_soon` per pass
        # one output buffer for every connection: flushing is synchronous, one at a time
        self.out_buf, self.out_cbuf = F.new_buffer(_READ_CHUNK)
        self.out_view = memoryview(self.out_buf)
        # one read buffer for every connection: asyncio reads into it (`recv_into`, the connection is
        # a BufferedProtocol) and the read is pushed into Proton before the next one; what a
        # connection keeps for later is copied. (A plain Protocol got a new 256 KiB bytes object per
        # read: an mmap, an mremap and a munmap each, and a page to fault in.)
        self.in_view = memoryview(bytearray(_READ_CHUNK))
        self._dirty: set[AmqpConnection] = set()
        self._scheduled = False
        self._after_pass: list[Callable[[], None]] = []
        # when the input being processed was taken (wall clock, set as each read is pushed): what
        # it makes a handler decide dates from then, even if the process stalls before the decision
        # (the router's mesh frames: docs/settlement-log.md, "Times")
        self.input_at = 0.0
        self.input_pass = -1  # (`PassClock.passes` when `input_at` was taken)
        # run at the end of every pass that has output, after the after-pass functions and before
        # any connection is flushed: what must be on record before the peers learn of it (the
        # router's settlement log: write-ahead evidence, docs/settlement-log.md)
        self.before_output: list[Callable[[], None]] = []
        self.checks: set[asyncio.Task[None]] = set()  # PLAIN passwords being checked off the loop
        # security events of the connections driven here (the router's status shows them)
        self.counters: dict[str, int] = {"logins": 0, "login_failures": 0, "tls_handshake_failures": 0,
                                         "pooled_deliveries_freed": 0, "c_heap_trims": 0}
        # every connection whose Proton objects live (weakly: one whose socket never came up is not
        # released, and must not be kept for that)
        self.connections: weakref.WeakSet[AmqpConnection] = weakref.WeakSet()

    def trim_delivery_pools(self, keep: int) -> int:
        """Cut every connection's pool of freed deliveries to its newest `keep` (`F.trim_delivery_pool`:
        what a burst left behind, each with a buffer as large as its largest message). Returns how
        many were freed."""
        freed = sum(F.trim_delivery_pool(conn.pn_conn, keep) for conn in list(self.connections))
        self.counters["pooled_deliveries_freed"] += freed
        if _release_c_heap is not None:
            # what the burst's deliveries, buffers and tables held is free in the C heap now, in
            # pages glibc keeps: hand them back (malloc_trim, ~0.5-3 ms on a router's heap), or a
            # router's RSS keeps the high-water mark of every burst (docs/operations.md, "What can grow")
            _release_c_heap()
            self.counters["c_heap_trims"] += 1
        return freed

    def input_time(self) -> float | None:
        """When this pass's latest input was taken (None: none yet in this pass, or no pass-end
        hook to tell passes apart): what the pass decides from it dates from then."""
        pass_end = self._pass_end
        if pass_end is None or self.input_pass != pass_end.clock.passes:
            return None
        return self.input_at

    @property
    def pass_clock(self) -> PassClock | None:
        """The loop's passes (common/passrules.py; None without the pass-end hook)."""
        return self._pass_end.clock if self._pass_end is not None else None

    def on_stall(self, fn: Callable[[], None]) -> None:
        """Call `fn` at the start of any pass that comes after a stall of the process (SIGSTOP, a
        starved CPU): a poll that took longer than its timeout allowed, a pass before it that took
        longer than `HOLD_GAP`, or input taken that long after its pass polled. Only with the
        pass-end hook (the default): without it nothing is told."""
        if self._pass_end is not None:
            self._pass_end.stall_hooks.append(fn)

    def mark_dirty(self, conn: AmqpConnection) -> None:
        """(`AmqpConnection.touch` calls this once per pass: the connection remembers it is dirty.)"""
        self._dirty.add(conn)
        if not self._scheduled:
            self._schedule()

    def call_after_pass(self, fn: Callable[[], None]) -> None:
        """Run `fn` once at the end of this loop pass, before output is flushed."""
        self._after_pass.append(fn)
        if not self._scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self._scheduled = True
        if self._pass_end is not None:
            self._pass_end.pending.append(self)
        else:
            self.loop.call_soon(self._flush_all)

    def _flush_all(self) -> None:
        # Still scheduled while the after-pass work and the hooks run: what they touch or ask for
        # is done by this flush. (Unscheduled first, every pass that drained scheduled a second
        # round that found nothing to do but wrote the log's empty flush and walked the hooks:
        # ~1.7 rounds per pass at moderate rates.)
        self._scheduled = True
        while self._after_pass:
            fns, self._after_pass = self._after_pass, []
            for fn in fns:
                try:
                    fn()
                except Exception:  # supervision point for deferred work
                    log.exception("engine.after_pass_failed")
        for fn in self.before_output:
            try:
                fn()
            except Exception:  # supervision point (an I/O error is the hook's to report)
                log.exception("engine.before_output_failed")
        self._scheduled = False
        if self._after_pass:  # (asked for by a hook: a round of its own, after this output, as before)
            self._schedule()
        dirty, self._dirty = self._dirty, set()
        for conn in dirty:
            conn.dirty = False
            conn.flush()


class Link:
    """Our view of one Proton link. `ctx` belongs to the handler."""

    __slots__ = ("conn", "ptr", "name", "is_sender", "ctx", "key", "freed", "__weakref__")

    def __init__(self, conn: AmqpConnection, ptr: Any) -> None:
        self.conn = conn
        self.ptr = ptr
        self.name: str = F.cstr(lib.pn_link_name(ptr)) or ""
        self.is_sender: bool = bool(lib.pn_link_is_sender(ptr))
        self.ctx: Any = None
        self.key = ptr  # cffi pointers hash and compare by address
        self.freed = False

    # -- what the peer asked for -------------------------------------------------------------
    @property
    def remote_source_address(self) -> str | None:
        return F.terminus_address(lib.pn_link_remote_source(self.ptr))

    @property
    def remote_target_address(self) -> str | None:
        return F.terminus_address(lib.pn_link_remote_target(self.ptr))

    @property
    def remote_source_timeout(self) -> int:
        return int(lib.pn_terminus_get_timeout(lib.pn_link_remote_source(self.ptr)))

    @property
    def remote_source_expiry_policy(self) -> int:
        return int(lib.pn_terminus_get_expiry_policy(lib.pn_link_remote_source(self.ptr)))

    @property
    def remote_source_dynamic(self) -> bool:
        return bool(lib.pn_terminus_is_dynamic(lib.pn_link_remote_source(self.ptr)))

    @property
    def remote_source_filter(self) -> Any:
        """The filter map of the peer's source (Proton's Python values: a dict), None without one."""
        return F.data_to_obj(lib.pn_terminus_filter(lib.pn_link_remote_source(self.ptr)))

    @property
    def remote_source_capabilities(self) -> tuple[str, ...]:
        """The capabilities of the peer's source, as strings (a symbol, or an array or list of them)."""
        obj = F.data_to_obj(lib.pn_terminus_capabilities(lib.pn_link_remote_source(self.ptr)))
        if obj is None:
            return ()
        items = getattr(obj, "elements", obj)
        if isinstance(items, str):
            return (str(items),)
        return tuple(str(c) for c in items if isinstance(c, str)) if isinstance(items, list | tuple) else ()

    @property
    def remote_source_null(self) -> bool:
        """The peer's attach carried no source at all (not one without an address): a lookup of
        the terminus it had under this link name (Qpid JMS's unsubscribe)."""
        return int(lib.pn_terminus_get_type(lib.pn_link_remote_source(self.ptr))) == lib.PN_UNSPECIFIED

    @property
    def remote_target_dynamic(self) -> bool:
        return bool(lib.pn_terminus_is_dynamic(lib.pn_link_remote_target(self.ptr)))

    @property
    def remote_snd_settle_mode(self) -> int:
        return int(lib.pn_link_remote_snd_settle_mode(self.ptr))

    @property
    def remote_rcv_settle_mode(self) -> int:
        return int(lib.pn_link_remote_rcv_settle_mode(self.ptr))

    @property
    def remote_properties(self) -> dict[Any, Any]:
        obj = F.data_to_obj(lib.pn_link_remote_properties(self.ptr))
        return obj if isinstance(obj, dict) else {}

    @property
    def remote_max_message_size(self) -> int:
        return int(lib.pn_link_remote_max_message_size(self.ptr))

    @property
    def local_uninit(self) -> bool:
        return bool(lib.pn_link_state(self.ptr) & F.LOCAL_UNINIT)

    @property
    def active(self) -> bool:
        st = lib.pn_link_state(self.ptr)
        return bool(st & F.LOCAL_ACTIVE) and bool(st & F.REMOTE_ACTIVE)

    @property
    def local_active(self) -> bool:
        return (not self.freed) and bool(lib.pn_link_state(self.ptr) & F.LOCAL_ACTIVE)

    # -- local settings (before open) ----------------------------------------------------------
    def set_source(self, address: str | None, timeout: int = 0, expiry_policy: int | None = None) -> None:
        term = lib.pn_link_source(self.ptr)
        F.set_terminus_address(term, address)
        lib.pn_terminus_set_timeout(term, timeout)
        if expiry_policy is not None:
            lib.pn_terminus_set_expiry_policy(term, expiry_policy)

    def set_source_capabilities(self, capabilities: tuple[str, ...]) -> None:
        """Our source's capabilities (symbols)."""
        F.obj_to_data(F.symbol_array(capabilities), lib.pn_terminus_capabilities(lib.pn_link_source(self.ptr)))

    def set_source_filter(self, filters: Any) -> None:
        """Our source's filter map (the filters the router applies, echoed to the peer)."""
        F.obj_to_data(filters, lib.pn_terminus_filter(lib.pn_link_source(self.ptr)))

    def set_no_source(self) -> None:
        """Our attach carries no source (a null source: "no such terminus" for a lookup)."""
        lib.pn_terminus_set_type(lib.pn_link_source(self.ptr), lib.PN_UNSPECIFIED)

    def set_target(self, address: str | None) -> None:
        F.set_terminus_address(lib.pn_link_target(self.ptr), address)

    def set_settle_modes(self, snd: int, rcv: int) -> None:
        lib.pn_link_set_snd_settle_mode(self.ptr, snd)
        lib.pn_link_set_rcv_settle_mode(self.ptr, rcv)

    def set_properties(self, props: dict[Any, Any]) -> None:
        F.obj_to_data(props, lib.pn_link_properties(self.ptr))

    def set_max_message_size(self, size: int) -> None:
        lib.pn_link_set_max_message_size(self.ptr, size)

    def open(self) -> None:
        lib.pn_link_open(self.ptr)
        self.conn.touch()

    # -- traffic -------------------------------------------------------------------------------
    @property
    def credit(self) -> int:
        # (0 once Proton freed it, with its connection (`AmqpConnection._release`): whoever still
        # holds it sends nothing; a credit check before every send reads freed memory never more.
        # Found by a router's segfault: a mesh peer sending on the link of a connection just lost)
        return 0 if self.freed else int(_lcredit(self.ptr))

    @property
    def queued(self) -> int:
        return int(lib.pn_link_queued(self.ptr))

    @property
    def unsettled(self) -> int:
        return int(lib.pn_link_unsettled(self.ptr))

    def probe_fields(self) -> dict[str, int]:
        """What Proton holds for this link (router/heapprobe.py, a diagnosis tool)."""
        return {} if self.freed else {"unsettled": self.unsettled, "queued": self.queued}

    def flow(self, n: int) -> None:
        if n > 0 and not self.freed:  # (as `credit`: nothing for a link Proton freed)
            lib.pn_link_flow(self.ptr, n)
            self.conn.touch()

    def send(self, tag: bytes, payload: bytes | bytearray | memoryview, settled: bool = False) -> Any:
        """Send one complete message; returns the delivery pointer (None when pre-settled)."""
        ptr = self.ptr
        d = _ldelivery(ptr, (len(tag), _from_buffer(tag)))
        # (cffi passes a bytes object to a `const char *` parameter as it is: no buffer object)
        _lsend(ptr, payload if type(payload) is bytes else _from_buffer(payload), len(payload))
        _ladvance(ptr)
        conn = self.conn
        if not conn.dirty:
            conn.touch()
        if settled:
            _dsettle(d)
            return None
        return d

    def drained(self) -> None:
        lib.pn_link_drained(self.ptr)
        self.conn.touch()

    @property
    def draining(self) -> bool:
        return bool(lib.pn_link_get_drain(self.ptr))

    def close(self, condition: str | None = None, description: str | None = None, detach: bool = False,
              info: dict[Any, Any] | None = None) -> None:
        if self.freed:
            return
        if condition:
            F.set_condition(lib.pn_link_condition(self.ptr), condition, description, info)
        st = lib.pn_link_state(self.ptr)
        if st & F.LOCAL_UNINIT:
            # refusing an attach: AMQP wants an attach before the detach
            lib.pn_link_open(self.ptr)
        if not (st & F.LOCAL_CLOSED):
            if detach:
                lib.pn_link_detach(self.ptr)
            else:
                lib.pn_link_close(self.ptr)
        self.conn.touch()
        self.conn._maybe_free_link(self)

    def remote_condition_info(self) -> dict[Any, Any]:
        """The info fields of the condition the peer detached the link with; valid in `on_link_closed`."""
        if self.freed:
            return {}
        info = F.condition_info(lib.pn_link_remote_condition(self.ptr))
        return info if isinstance(info, dict) else {}

    def __repr__(self) -> str:
        return f"<Link {'snd' if self.is_sender else 'rcv'} {self.name!r}>"


# delivery-level helpers (deliveries stay raw pointers: one object per message is too costly)

# settle(delivery) and set_state(delivery, state) are Proton's C functions themselves: no Python
# frame around the two or three calls of them per message (a plain outcome, without a condition;
# `update` below sets those)
settle: Callable[[Any], None] = lib.pn_delivery_settle
set_state: Callable[[Any, int], None] = lib.pn_delivery_update


def update(delivery: Any, state: int, condition: tuple[str, str] | None = None,
           undeliverable: bool = False, info: dict[Any, Any] | None = None) -> None:
    if condition is not None:
        F.set_condition(lib.pn_disposition_condition(lib.pn_delivery_local(delivery)), condition[0],
                        condition[1], info)
    if undeliverable:
        lib.pn_disposition_set_undeliverable(lib.pn_delivery_local(delivery), True)
    lib.pn_delivery_update(delivery, state)


def remote_condition(delivery: Any) -> tuple[str, str] | None:
    return F.get_condition(lib.pn_disposition_condition(lib.pn_delivery_remote(delivery)))


def remote_undeliverable(delivery: Any) -> bool:
    return bool(lib.pn_disposition_is_undeliverable(lib.pn_delivery_remote(delivery)))


def remote_settled(delivery: Any) -> bool:
    return bool(lib.pn_delivery_settled(delivery))


def delivery_key(delivery: Any) -> int:
    return F.ptr_key(delivery)


class AmqpConnection(asyncio.BufferedProtocol):
    """One AMQP connection over one TCP connection, driven by the engine directly."""

    def __init__(self, engine: Engine, handler: ConnectionHandler, *, server: bool, container_id: str,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, max_frame: int = DEFAULT_MAX_FRAME,
                 hostname: str | None = None, properties: dict[Any, Any] | None = None,
                 offered_capabilities: Any = None,
                 sasl: Callable[[AmqpConnection], SaslServer | SaslClient] | None = None) -> None:
        """`sasl`: makes this connection's SASL layer once the transport (and its TLS) is up; the
        engine runs it before AMQP (common/sasl.py). Without it, Proton's own SASL offers and
        takes ANONYMOUS."""
        self.engine = engine
        self.handler = handler
        self.server = server
        self.ctx: Any = None  # handler-owned
        self.sock: asyncio.Transport | None = None
        self.peer: str = "?"
        self.links: dict[Any, Link] = {}  # keyed by the link pointer
        self.closed = False
        self.dirty = False  # in the engine's dirty set: flushed at the end of this loop pass
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline = 0
        self._close_reported = False
        self._sasl_factory = sasl
        self._early = b""  # bytes that came before connection_made (a TLS upgrade can deliver them first)
        # Read now, processed at the end of the pass (`defer_input`): the routers' mesh links. A
        # router that stalled (frozen, starved) finds a peer's messages and a client's goodbye both
        # waiting; its clients' input must be taken first, or it hands messages into a link whose
        # client has already left (and, failed over, accepted them elsewhere): a hand-over no one
        # receives, yet on record as a second delivery (docs/engine.md, "Input order").
        # What is held and when it is taken: the edge's rules (common/passrules.py, `HeldInput`).
        self.defer_input = False
        self._deferred: list[bytes] = []
        self._hold = HeldInput()  # (monotonic times)
        # What one pass may take of this connection's input and events (common/passrules.py, rule 5;
        # None: no bound, e.g. a mesh link or a client library's connection). What it leaves waits,
        # in order, for the next pass: bytes not pushed yet, events not handled yet, and an EOF
        # behind them; the socket is not read meanwhile (`_owe`, `_next_pass`).
        self.budget: PassBudget | None = None
        self._backlog: bytearray | None = None
        self._events_left = False
        self._eof_left = False
        self._owed = False  # a `_next_pass` is scheduled
        self._paused = False  # reading is paused until what was left is taken
        self.sasl: SaslServer | SaslClient | None = None
        self.user: str | None = None  # who logged in (SASL), None before or without
        self.auth_error: str | None = None  # why our login failed (client side)

        self.pn_conn = lib.pn_connection()
        engine.connections.add(self)
        self.pn_transport = lib.pn_transport()
        self.pn_collector = lib.pn_collector()
        lib.pn_connection_collect(self.pn_conn, self.pn_collector)
        lib.pn_connection_set_container(self.pn_conn, container_id.encode())
        if hostname:
            lib.pn_connection_set_hostname(self.pn_conn, hostname.encode())
        if properties:
            F.obj_to_data(properties, lib.pn_connection_properties(self.pn_conn))
        if offered_capabilities:
            F.obj_to_data(offered_capabilities, lib.pn_connection_offered_capabilities(self.pn_conn))
        if server:
            lib.pn_transport_set_server(self.pn_transport)
        if sasl is None:
            pn_sasl = lib.pn_sasl(self.pn_transport)
            lib.pn_sasl_allowed_mechs(pn_sasl, b"ANONYMOUS")
        lib.pn_transport_set_idle_timeout(self.pn_transport, int(idle_timeout * 1000))
        lib.pn_transport_set_max_frame(self.pn_transport, max_frame)
        lib.pn_transport_bind(self.pn_transport, self.pn_conn)
        if not server:
            lib.pn_connection_open(self.pn_conn)

    def probe_fields(self) -> dict[str, int]:
        """What Proton holds for this connection (router/heapprobe.py, a diagnosis tool)."""
        return {"delivery_pool": F.pool_size(self.pn_conn)} if self.pn_conn != F.NULL else {}

    # -- identity --------------------------------------------------------------------------------
    @property
    def remote_container(self) -> str | None:
        if self.pn_conn == F.NULL:  # (released: the connection is gone)
            return None
        return F.cstr(lib.pn_connection_remote_container(self.pn_conn))

    @property
    def remote_properties(self) -> dict[Any, Any]:
        if self.pn_conn == F.NULL:
            return {}
        obj = F.data_to_obj(lib.pn_connection_remote_properties(self.pn_conn))
        return obj if isinstance(obj, dict) else {}

    @property
    def remote_offered_capabilities(self) -> list[Any]:
        obj = F.data_to_obj(lib.pn_connection_remote_offered_capabilities(self.pn_conn))
        if obj is None:
            return []
        return list(obj) if isinstance(obj, list | tuple) else [obj]

    @property
    def encrypted(self) -> bool:
        return self.sock is not None and self.sock.get_extra_info("ssl_object") is not None

    @property
    def peer_common_name(self) -> str | None:
        """The common name of the peer's verified TLS certificate (None without one)."""
        return peer_common_name(self.sock.get_extra_info("peercert")) if self.sock is not None else None

    @property
    def peer_names(self) -> set[str]:
        """The names the peer's verified TLS certificate carries (empty without one)."""
        return peer_names(self.sock.get_extra_info("peercert")) if self.sock is not None else set()

    # -- asyncio (Buffered)Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.sock = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if self._sasl_factory is not None:
            self.sasl = self._sasl_factory(self)
            if isinstance(self.sasl, SaslClient):
                transport.write(self.sasl.start())
        self._process()
        if self._early:
            data, self._early = self._early, b""
            self.data_received(data)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.engine.in_view

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.engine.in_view[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        """Bytes read (`data` may be a view of the engine's read buffer: valid until this returns,
        so what is kept for later is copied)."""
        if self.closed:
            return
        if self.sock is None:  # (TLS: the application data of the handshake's last flight)
            self._early += data
            return
        sasl = self.sasl
        if sasl is not None and (not sasl.done or (isinstance(sasl, SaslServer) and sasl.check is not None)):
            self._sasl_received(bytes(data))
            return
        if self.defer_input:
            if self._hold.read(time.monotonic()) is Read.HOLD_FIRST:
                self.engine.call_after_pass(self._deferred_at_pass_end)
            self._deferred.append(bytes(data))
            return
        if self.budget is not None and self.engine._pass_end is not None:
            self._budgeted(data)
            return
        self._push(data)

    # -- the pass budget (common/passrules.py, rule 5) ---------------------------------------------
    def _budgeted(self, data: bytes | bytearray | memoryview) -> None:
        """Push what this pass's budget allows of `data`; the rest waits for the next pass."""
        if self._backlog is not None or self._events_left:  # behind what an earlier pass left
            if self._backlog is None:
                self._backlog = bytearray(data)
            else:
                self._backlog += data
            self._owe()
            return
        budget = self.budget
        assert budget is not None and self.engine._pass_end is not None
        n = budget.input(self.engine._pass_end.clock, len(data))
        if n < len(data):
            self._keep(memoryview(data)[n:])
            data = memoryview(data)[:n]  # (pushed from a view: no copy)
        if n:
            self._push(data)
        if self._backlog is not None or self._events_left:
            self._owe()

    def _keep(self, rest: memoryview) -> None:
        """Bytes not pushed in this pass, ahead of any kept before."""
        kept = bytearray(rest)
        if self._backlog:
            kept += self._backlog
        self._backlog = kept

    def _owe(self) -> None:
        """Something is left for the next pass: come back then, and read nothing more meanwhile."""
        if self._owed or self.closed:
            return
        self._owed = True
        if self.sock is not None and not self._paused:
            self._paused = True
            self.sock.pause_reading()
        self.engine.loop.call_soon(self._next_pass)

    def _next_pass(self) -> None:
        """A new pass: go on with what the last one left (events first: they came first)."""
        self._owed = False
        if self.closed:
            return
        if self._events_left:
            self._events_left = False
            self._process()  # (within this pass's budget: what is left again owes another pass)
            if self._events_left:
                return
        if self._backlog is not None:
            data, self._backlog = self._backlog, None
            self._budgeted(data)
            if self._owed:
                return
        if self._eof_left:
            self._eof_left = False
            lib.pn_transport_close_tail(self.pn_transport)
            self._process()
        elif self._paused and self.sock is not None:
            self._paused = False
            self.sock.resume_reading()

    def _take_left(self) -> None:
        """The connection ends: what its budget left is taken now, all of it (rule 5)."""
        if self.budget is None:
            return
        self.budget = None
        if self._events_left:
            self._events_left = False
            self._process()
        if self._backlog is not None:
            data, self._backlog = self._backlog, None
            self._push(bytes(data))
        if self._eof_left:
            self._eof_left = False
            lib.pn_transport_close_tail(self.pn_transport)
            self._process()

    def _held_input_stale(self) -> bool:
        """Did the process stall (frozen, starved) since the held input was read, or since this
        pass polled its sockets? Then its clients may have said something meanwhile that is not
        read yet."""
        pass_end = self.engine._pass_end
        clock = pass_end.clock if pass_end is not None else _NO_CLOCK
        return clock.stale(self._hold.since, time.monotonic())

    def _deferred_at_pass_end(self) -> None:
        held = self._hold
        if held.held and held.at_pass_end(not held.repolled and self._held_input_stale(),
                                          self.closed) is PassEnd.REPOLL:
            # let the loop poll once more first (this callback then runs ahead of that poll's
            # reads, the pass end after them)
            self.engine.loop.call_soon(self.engine.call_after_pass, self._deferred_at_pass_end)
            return
        self._take_deferred()

    def _take_deferred(self) -> None:
        """Process the input `defer_input` held back in this pass (in the order it came), then the
        EOF that came after it, if one did."""
        if not self._deferred:
            return
        chunks, self._deferred = self._deferred, []
        eof = self._hold.taken()
        if not self.closed:
            self._push(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        if eof and not self.closed:
            lib.pn_transport_close_tail(self.pn_transport)
            self._process()

    # -- SASL (before AMQP) ----------------------------------------------------------------------
    def _sasl_received(self, data: bytes) -> None:
        sasl = self.sasl
        assert sasl is not None and self.sock is not None
        try:
            out = sasl.receive(data)
        except SaslError as exc:
            log.warning("connection.sasl_error peer=%s error=%s", self.peer, exc)
            self.auth_error = f"SASL protocol error: {exc}"
            self.sock.abort()
            return
        if out:
            self.sock.write(out)
        if isinstance(sasl, SaslServer) and sasl.check is not None:
            if len(self.engine.checks) >= MAX_PASSWORD_CHECKS:
                sasl.check = None
                self.sock.write(sasl.refuse_busy())
                self._sasl_done()
                return
            task = self.engine.loop.create_task(self._check_password(sasl))
            self.engine.checks.add(task)
            task.add_done_callback(self.engine.checks.discard)
            return
        if sasl.done:
            self._sasl_done()

    async def _check_password(self, sasl: SaslServer) -> None:
        """A PLAIN password, checked off the event loop (a PBKDF2 of ~0.1 s releases the GIL)."""
        assert sasl.check is not None
        secret, password, _ = sasl.check
        ok = await self.engine.loop.run_in_executor(None, secret.check_password, password)
        if self.closed or self.sock is None:
            return
        self.sock.write(sasl.resolve(ok))
        self._sasl_done()

    def _sasl_done(self) -> None:
        sasl = self.sasl
        assert sasl is not None and self.sock is not None
        if isinstance(sasl, SaslServer):
            if sasl.user is None:
                self.engine.counters["login_failures"] += 1
                log.warning("connection.auth_failed peer=%s mechanism=%s reason=%s", self.peer, sasl.mechanism,
                            sasl.failed)
                self.sock.close()  # (after the outcome is written)
                return
            self.user = sasl.user
            self.engine.counters["logins"] += 1
            log.info("connection.authenticated peer=%s user=%s mechanism=%s", self.peer, sasl.user,
                     sasl.mechanism)
        else:
            if not sasl.ok:
                self.auth_error = sasl.failed
                self.sock.close()
                return
            self.user = sasl.user
        data, sasl.amqp = sasl.amqp, b""
        self.touch()
        if data and self.budget is not None and self.engine._pass_end is not None:
            self._budgeted(data)
        elif data:
            self._push(data)
        else:
            self._process()

    def _push(self, data: bytes | bytearray | memoryview) -> None:
        eng = self.engine
        eng.input_at = time.time()
        pass_end = eng._pass_end
        if pass_end is not None:
            clock = pass_end.clock
            eng.input_pass = clock.passes
            if clock.input_taken(time.monotonic()):
                pass_end.tell_stall()  # (stopped after this pass polled: what it reads now is the stall's)
        view = memoryview(data)
        while view:
            n = lib.pn_transport_push(self.pn_transport, ffi.from_buffer(view), len(view))
            if n < 0:
                break  # tail closed (error already set); drop the rest, and report it below
            view = view[n:]
            self._process()
            if n == 0:
                return
            if self._events_left and view:  # (the pass budget is spent: the rest waits behind them)
                self._keep(view)
                return
        else:
            # all pushed and processed: no second pass over an empty collector (two Proton calls
            # and the tick per read: ~2,500 instructions, a read per message at low rates)
            return
        self._process()

    def eof_received(self) -> bool:
        sasl = self.sasl
        if isinstance(sasl, SaslServer) and not sasl.done and self.sock is not None:
            self.engine.counters["login_failures"] += 1
            log.warning("connection.auth_failed peer=%s mechanism=%s reason=the client left during the SASL "
                        "exchange (offered: %s)", self.peer, sasl.mechanism, " ".join(sasl.policy.mechanisms()))
            sasl.done = True
            self.sock.close()
            return False
        if self._deferred and self._hold.eof():  # the end waits behind the input it follows (`defer_input`)
            return False
        if self._backlog is not None or self._events_left:  # (and behind what a pass budget left)
            self._eof_left = True
            return False
        lib.pn_transport_close_tail(self.pn_transport)
        self._process()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._take_left()  # (what was read before the loss, first)
        self._take_deferred()
        self.closed = True
        if self._timer:
            self._timer.cancel()
            self._timer = None
        try:
            if self.auth_error is not None:
                self._report_closed((errors.UnauthorizedAccess.condition, self.auth_error))
            else:
                self._report_closed((errors.ConnectionForced.condition,
                                     f"connection lost: {exc}" if exc else "connection lost"))
        finally:
            self._release()

    # -- operations for handlers -----------------------------------------------------------------
    def touch(self) -> None:
        if not self.dirty and not self.closed:
            self.dirty = True
            self.engine.mark_dirty(self)

    def open_session(self) -> Any:
        ssn = lib.pn_session(self.pn_conn)
        lib.pn_session_open(ssn)
        self.touch()
        return ssn

    def sender(self, session: Any, name: str) -> Link:
        return self._add_link(lib.pn_sender(session, name.encode()))

    def receiver(self, session: Any, name: str) -> Link:
        return self._add_link(lib.pn_receiver(session, name.encode()))

    def close(self, condition: str | None = None, description: str | None = None,
              info: dict[Any, Any] | None = None) -> None:
        if self.closed:
            return
        if condition:
            F.set_condition(lib.pn_connection_condition(self.pn_conn), condition, description, info)
        lib.pn_connection_close(self.pn_conn)
        self.touch()

    def remote_condition_info(self) -> dict[Any, Any]:
        """The info fields of the condition the peer closed the connection with (a redirect names
        where to go); empty when there are none. Valid in `on_connection_closed`."""
        if self.pn_conn == F.NULL:
            return {}
        info = F.condition_info(lib.pn_connection_remote_condition(self.pn_conn))
        return info if isinstance(info, dict) else {}

    def abort(self) -> None:
        """Drop the TCP connection at once (tests and chaos use it)."""
        if self.sock is not None:
            self.sock.abort()

    # -- internals -------------------------------------------------------------------------------
    def _add_link(self, ptr: Any) -> Link:
        link = Link(self, ptr)
        self.links[link.key] = link
        return link

    def _link_of(self, ptr: Any) -> Link:
        link = self.links.get(ptr)
        if link is None:
            link = self._add_link(ptr)
        return link

    def _maybe_free_link(self, link: Link) -> None:
        st = lib.pn_link_state(link.ptr)
        if (st & F.LOCAL_CLOSED) and (st & F.REMOTE_CLOSED) and not link.freed:
            link.freed = True
            self.links.pop(link.key, None)
            lib.pn_link_free(link.ptr)

    def _process(self) -> None:
        try:
            self._dispatch_events()
        except Exception as exc:  # supervision point: a faulty connection must not take the process down
            log.exception("connection.handler_failed peer=%s", self.peer)
            try:
                self.close(errors.OncemeshError.condition, f"internal error: {type(exc).__name__}: {exc}")
            except Exception:
                log.exception("connection.close_failed peer=%s", self.peer)
                self.abort()
        if self.closed:
            return
        # (Proton's timers and `touch`, inlined: this runs once per read, two calls fewer per pass)
        now = int(time.monotonic() * 1000)
        deadline = int(lib.pn_transport_tick(self.pn_transport, now))
        if deadline and (self._timer is None or deadline < self._timer_deadline):
            self._arm_timer(deadline, now)
        if not self.dirty:
            self.dirty = True
            self.engine.mark_dirty(self)

    def _dispatch_events(self) -> None:
        """Translate the collector's events into handler calls. Delivery events (three per
        message on a router) are handled here, in the loop, not in a method of their own: a call
        per event cost ~3% of the router's instructions per message (`oncemesh bench --instructions`)."""
        coll = self.pn_collector
        handler = self.handler
        links = self.links
        # a sending link's delivery updates that come one after the other go to the handler in one
        # call when it takes them so (a subscriber's dispositions of a pass: one core call for them);
        # the run is handed over before any other event is, so the order of what the handler sees
        # is the collector's
        batch: Any = getattr(handler, "on_delivery_updates", None)
        run: list[tuple[Any, int, bool]] = []
        run_link: Link | None = None
        # endpoint events this pass may still handle (-1: no bound; it never reaches 0), asked of the
        # budget at the first such event: most calls (a read of transfers) have none
        left: int | None = None
        start = 0
        budget = pass_end = None
        self._events_left = False  # (set again below if this pass's budget leaves some)
        while True:
            ev = _peek(coll)
            if not ev:  # (NULL: a cdata pointer is false; no comparison call)
                break
            etype = _etype(ev)
            if etype == _E_DELIVERY:
                d = _edelivery(ev)
                lptr = _dlink(d)
                link = links.get(lptr)
                if link is None or link.freed:
                    pass
                elif link.is_sender:
                    if _dupdated(d):  # (the _Bool functions return Python bools)
                        if batch is None:
                            handler.on_delivery_update(link, d, _dremote_state(d), _dsettled(d))
                        else:
                            if link is not run_link:
                                if run_link is not None:
                                    batch(run_link, run)
                                    run = []
                                run_link = link
                            run.append((d, _dremote_state(d), _dsettled(d)))
                    _pop(coll)
                    continue
                elif run_link is not None:  # (another event: the run first)
                    batch(run_link, run)
                    run = []
                    run_link = None
                    continue  # (this event again, links as they are now)
                elif _lcurrent(lptr) == d:
                    self._on_transfer(link, lptr, d)
                elif _dupdated(d):
                    # (not the current delivery: a complete message we advanced past; only a transfer
                    # still arriving can be aborted, and that one is current: `_on_transfer`. A call
                    # of Proton costs ~600 instructions: none that cannot answer yes)
                    handler.on_delivery_update(link, d, _dremote_state(d), _dsettled(d))
            elif run_link is not None and (etype == _E_LINK_FLOW or etype in _BUDGETED or etype in _TRANSPORT_ENDS):
                # (an event the handler sees: the run first, then this event again; one popped
                # unseen, as PN_TRANSPORT, does not end the run)
                batch(run_link, run)
                run = []
                run_link = None
                continue
            elif etype == _E_LINK_FLOW:
                lptr = _elink(ev)
                if _lis_sender(lptr):
                    link = links.get(lptr)
                    if link is not None and not link.freed:
                        handler.on_credit(link)
            elif etype in _BUDGETED:
                if left is None:
                    budget, pass_end = self.budget, self.engine._pass_end
                    left = start = budget.endpoint_events(pass_end.clock) \
                        if budget is not None and pass_end is not None else -1
                if left == 0:  # the pass budget is spent: this and what follows wait for the next pass
                    self._events_left = True
                    break
                left -= 1
                self._on_endpoint_event(etype, ev)
            elif etype in _TRANSPORT_ENDS:
                self._on_endpoint_event(etype, ev)
            # (anything else is popped unseen: mostly PN_TRANSPORT, which Proton posts for our own
            # sends, settles and flows, one per connection and pass at moderate rates; a call of
            # `_on_endpoint_event` that matched none of its cases cost ~1,500 instructions each)
            _pop(coll)
        if run_link is not None:
            batch(run_link, run)
        if start > 0 and left is not None and left != start and budget is not None and pass_end is not None:
            budget.handled(pass_end.clock, start - left)  # (a budget answered and events were handled)
        if self._events_left:
            self._owe()

    def _on_transfer(self, link: Link, lptr: Any, d: Any) -> None:
        """The current delivery of a receiving link: a complete message is read and handed over."""
        if _dpartial(d):  # (readable needs no call: a receiver's current delivery is readable)
            self.handler_partial(link, d)
            return
        eng = self.engine
        # read through the shared scratch (one copy, into the payload) without asking the size first
        got = _lrecv(lptr, eng.out_cbuf, _READ_CHUNK)
        if got < F.EOS:  # aborted (Proton marks an aborted delivery done: not partial; recv says so)
            _ladvance(lptr)
            _dsettle(d)
            lib.pn_link_flow(lptr, 1)  # an aborted transfer consumed credit
            return
        if got < _READ_CHUNK:
            payload = bytes(eng.out_view[:got]) if got > 0 else b""
        else:  # larger than the scratch: the rest in one more read
            rest = bytearray(_dpending(d))
            more = _lrecv(lptr, _from_buffer(rest), len(rest)) if rest else 0
            payload = bytes(eng.out_view) + bytes(rest[:max(more, 0)])
        _ladvance(lptr)
        t = _dtag(d)
        tag = _unpack(t.start, t.size) if t.size else b""
        settled = _dsettled(d)
        self.handler.on_message(link, d, tag, payload, settled)
        if settled:  # pre-settled: nothing more will happen to it
            _dsettle(d)

    def _on_endpoint_event(self, etype: int, ev: Any) -> None:
        handler = self.handler
        if etype == F.E_LINK_REMOTE_OPEN:
            handler.on_link_open(self._link_of(lib.pn_event_link(ev)))
        elif etype in (F.E_LINK_REMOTE_CLOSE, F.E_LINK_REMOTE_DETACH):
            lptr = lib.pn_event_link(ev)
            link = self.links.get(lptr)
            if link is not None and not link.freed:
                cond = F.get_condition(lib.pn_link_remote_condition(lptr))
                st = lib.pn_link_state(lptr)
                was_open = not (st & F.LOCAL_CLOSED)
                if was_open:
                    if etype == F.E_LINK_REMOTE_CLOSE:
                        lib.pn_link_close(lptr)
                    else:
                        lib.pn_link_detach(lptr)
                try:  # reported whoever closed first: a local close waits for this answer
                    handler.on_link_closed(link, etype == F.E_LINK_REMOTE_CLOSE, cond)
                finally:
                    self._maybe_free_link(link)
        elif etype == F.E_SESSION_REMOTE_OPEN:
            ssn = lib.pn_event_session(ev)
            if lib.pn_session_state(ssn) & F.LOCAL_UNINIT:
                lib.pn_session_open(ssn)
        elif etype == F.E_SESSION_REMOTE_CLOSE:
            ssn = lib.pn_event_session(ev)
            if not (lib.pn_session_state(ssn) & F.LOCAL_CLOSED):
                lib.pn_session_close(ssn)
        elif etype == F.E_CONNECTION_REMOTE_OPEN:
            if lib.pn_connection_state(self.pn_conn) & F.LOCAL_UNINIT:
                lib.pn_connection_open(self.pn_conn)
            handler.on_connection_open(self)
        elif etype == F.E_CONNECTION_REMOTE_CLOSE:
            cond = F.get_condition(lib.pn_connection_remote_condition(self.pn_conn))
            if not (lib.pn_connection_state(self.pn_conn) & F.LOCAL_CLOSED):
                lib.pn_connection_close(self.pn_conn)
            self._report_closed(cond)
        elif etype == F.E_TRANSPORT_ERROR:
            cond = F.get_condition(lib.pn_transport_condition(self.pn_transport))
            log.warning("connection.transport_error peer=%s condition=%s", self.peer, cond)
            self._report_closed(cond)
        elif etype == F.E_TRANSPORT_CLOSED:
            self._report_closed(None)

    def handler_partial(self, link: Link, d: Any) -> None:
        """A transfer still arriving: enforce the link's max message size while it grows."""
        limit = int(lib.pn_link_max_message_size(link.ptr))
        if limit and lib.pn_delivery_pending(d) > limit:
            link.close(errors.MessageTooLarge.condition,
                       f"message larger than the link's max-message-size of {limit} bytes")

    def _report_closed(self, cond: tuple[str, str] | None) -> None:
        if self._close_reported:
            return
        self._close_reported = True
        try:
            self.handler.on_connection_closed(self, cond)
        except Exception:
            log.exception("connection.close_handler_failed peer=%s", self.peer)

    def _arm_timer(self, deadline: int, now: int) -> None:
        """Proton's next timer event is due at `deadline` (ms, the clock of `pn_transport_tick`)."""
        if self._timer:
            self._timer.cancel()
        self._timer_deadline = deadline
        self._timer = self.engine.loop.call_later(max(0.0, (deadline - now) / 1000.0), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if not self.closed:
            if self._deferred:
                held = self._hold
                if held.on_timer(not held.repolled and self._held_input_stale()) is Timer.WAIT:
                    return  # (stalled: the pass end takes it after one more poll, then ticks)
                self._take_deferred()  # (held input first: the idle check must not miss what came)
            self._process()

    def flush(self) -> None:
        sock = self.sock
        if sock is None or self.closed:
            return
        sasl = self.sasl
        if sasl is not None and (not sasl.done or (isinstance(sasl, SaslServer) and sasl.check is not None)):
            return  # (AMQP waits for the SASL exchange)
        t = self.pn_transport
        eng = self.engine
        out = eng.out_cbuf
        view = eng.out_view
        size = len(view)
        while True:
            pending = lib.pn_transport_pending(t)
            if pending < 0:  # head closed: everything we had to say is written
                if not sock.is_closing():
                    sock.close()
                break
            if pending == 0:
                break
            n = lib.pn_transport_peek(t, out, pending if pending < size else size)
            if n <= 0:
                break
            # asyncio sends at once or copies what it could not send: the buffer is free again after
            sock.write(view[:n])
            lib.pn_transport_pop(t, n)

    def abandon(self) -> None:
        """Free the Proton objects of a connection whose transport never came up (a TLS handshake
        that failed or timed out): asyncio never calls connection_made or connection_lost on it, and
        nobody was told it existed. Without this its C objects outlive it (a dialer retrying a peer
        whose handshake fails, once a second: ~86,000 connections' worth a day)."""
        if self.sock is None:
            self.closed = True
            self._release()

    def _release(self) -> None:
        if self.pn_conn == F.NULL:
            return
        for link in self.links.values():
            link.freed = True  # (Proton frees them with the connection: whoever holds one must not call it)
        self.links.clear()
        # the same sequence as Proton's own wrappers: release the endpoints, then drop our references
        lib.pn_transport_unbind(self.pn_transport)
        lib.pn_connection_release(self.pn_conn)
        lib.pn_collector_free(self.pn_collector)
        lib.pn_decref(self.pn_conn)
        lib.pn_decref(self.pn_transport)
        self.pn_conn = F.NULL
        self.pn_transport = F.NULL
        self.pn_collector = F.NULL
        self.engine.connections.discard(self)


def tune_gc(threshold: int = GC_THRESHOLD) -> None:
    """For a process that moves messages: collect cycles far less often.

    Nearly everything per message (delivery records, actions, log tuples) is freed by reference
    counting within milliseconds, but Python's default (a young-generation collection every 700
    allocations) catches thousands of them alive in flight, traverses them and promotes them to
    the older generations, whose collections then traverse every record held. A sampled profile
    put the collector at ~6% of the router's CPU. With a threshold of 50,000 nearly all of them are
    freed before a collection sees them. `gc.freeze()` first moves what start-up made (modules,
    configuration) out of the collector's sight. Cycles are still collected, only in bigger
    batches: what a cycle holds lives a little longer."""
    gc.freeze()
    gc.set_threshold(threshold, 10, 10)


class Accepted(asyncio.Protocol):
    """What a listener makes for each accepted connection: an `AmqpConnection`, or another
    protocol's connection on the same loop (the router's MQTT listener, router/mqtt/edge.py)."""

    def abandon(self) -> None:
        """The connection never came up (its TLS handshake failed or its peer left): free it."""


async def listen(engine: Engine, factory: Callable[[], Accepted | AmqpConnection], host: str, port: int,
                 backlog: int = 1024, tls: TlsProvider | None = None) -> asyncio.Server:
    """A listener. With `tls`, each accepted connection is upgraded with the context current at
    that moment (so a reload applies to new connections only); a failed handshake is logged with
    the peer's address and the connection dropped."""
    if tls is None:
        return await engine.loop.create_server(factory, host, port, backlog=backlog, reuse_address=True)
    return await engine.loop.create_server(lambda: _TlsAccept(engine, factory, tls), host, port,
                                           backlog=backlog, reuse_address=True)


TLS_HANDSHAKE_TIMEOUT = 10.0


class _TlsAccept(asyncio.Protocol):
    """An accepted TCP connection until its TLS handshake is done; then the AMQP connection's."""

    def __init__(self, engine: Engine, factory: Callable[[], Accepted | AmqpConnection], tls: TlsProvider) -> None:
        self.engine = engine
        self.factory = factory
        self.tls = tls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # (nothing is read before start_tls takes the connection over)
        self.engine.loop.create_task(self._upgrade(transport))

    async def _upgrade(self, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        conn = self.factory()
        try:
            tls_transport = await self.engine.loop.start_tls(
                transport, conn, self.tls.context(), server_side=True, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT)
        except (TimeoutError, ssl.SSLError, OSError, ConnectionError) as exc:
            self.engine.counters["tls_handshake_failures"] += 1
            log.warning("tls.handshake_failed endpoint=%s peer=%s error=%s", self.tls.what,
                        f"{peer[0]}:{peer[1]}" if peer else "?", exc)
            transport.abort()
            conn.connection_lost(exc)
            return
        if tls_transport is None:  # (the peer went away during the handshake)
            transport.abort()
            conn.abandon()
            return
        conn.connection_made(tls_transport)

    def data_received(self, data: bytes) -> None:  # (reading is paused until start_tls)
        pass


async def connect(engine: Engine, factory: Callable[[], AmqpConnection], host: str, port: int,
                  timeout: float = 5.0, tls: ssl.SSLContext | None = None) -> AmqpConnection:
    """Dial `host:port`. A dial that fails after the TCP connection was made (TLS handshake refused
    or timed out, `timeout` passed) frees the AMQP connection it made (`abandon`)."""
    made: list[AmqpConnection] = []

    def make() -> AmqpConnection:
        conn = factory()
        made.append(conn)
        return conn

    try:
        _, proto = await asyncio.wait_for(engine.loop.create_connection(
            make, host, port, ssl=tls, server_hostname=host if tls is not None else None,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT if tls is not None else None), timeout)
    except BaseException:
        for conn in made:
            conn.abandon()
        raise
    assert isinstance(proto, AmqpConnection)
    return proto
