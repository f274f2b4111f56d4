"""Every direct access to Proton's C engine (python-qpid-proton 0.40.0, cffi) lives here.

We drive the engine with raw cffi calls instead of Proton's Python wrapper objects: a wrapper call
costs microseconds, a `lib` call ~0.05 µs (docs/engine.md, "The engine layer"). Rare operations
(terminus, properties, conditions) use small helpers here so that no other module touches cffi.
"""

from __future__ import annotations

from typing import Any, cast

from cproton_ffi import ffi, lib
from proton._data import dat2obj, obj2dat

PROTON_VERSION = (lib.PN_VERSION_MAJOR, lib.PN_VERSION_MINOR, lib.PN_VERSION_POINT)
if PROTON_VERSION != (0, 40, 0):  # the pitfalls handled here were measured on 0.40.0 only
    raise ImportError(f"oncemesh needs python-qpid-proton 0.40.0, found {PROTON_VERSION}")

NULL = ffi.NULL

# delivery states (AMQP outcomes)
ACCEPTED = lib.PN_ACCEPTED
REJECTED = lib.PN_REJECTED
RELEASED = lib.PN_RELEASED
MODIFIED = lib.PN_MODIFIED
RECEIVED = lib.PN_RECEIVED

# endpoint states
LOCAL_UNINIT = lib.PN_LOCAL_UNINIT
LOCAL_ACTIVE = lib.PN_LOCAL_ACTIVE
LOCAL_CLOSED = lib.PN_LOCAL_CLOSED
REMOTE_UNINIT = lib.PN_REMOTE_UNINIT
REMOTE_ACTIVE = lib.PN_REMOTE_ACTIVE
REMOTE_CLOSED = lib.PN_REMOTE_CLOSED

SND_UNSETTLED = lib.PN_SND_UNSETTLED
SND_SETTLED = lib.PN_SND_SETTLED
SND_MIXED = lib.PN_SND_MIXED
RCV_FIRST = lib.PN_RCV_FIRST
RCV_SECOND = lib.PN_RCV_SECOND

EXPIRE_WITH_LINK = lib.PN_EXPIRE_WITH_LINK
EXPIRE_WITH_SESSION = lib.PN_EXPIRE_WITH_SESSION
EXPIRE_WITH_CONNECTION = lib.PN_EXPIRE_WITH_CONNECTION
EXPIRE_NEVER = lib.PN_EXPIRE_NEVER

# events
E_CONNECTION_REMOTE_OPEN = lib.PN_CONNECTION_REMOTE_OPEN
E_CONNECTION_REMOTE_CLOSE = lib.PN_CONNECTION_REMOTE_CLOSE
E_SESSION_REMOTE_OPEN = lib.PN_SESSION_REMOTE_OPEN
E_SESSION_REMOTE_CLOSE = lib.PN_SESSION_REMOTE_CLOSE
E_LINK_REMOTE_OPEN = lib.PN_LINK_REMOTE_OPEN
E_LINK_REMOTE_CLOSE = lib.PN_LINK_REMOTE_CLOSE
E_LINK_REMOTE_DETACH = lib.PN_LINK_REMOTE_DETACH
E_LINK_FLOW = lib.PN_LINK_FLOW
E_DELIVERY = lib.PN_DELIVERY
E_TRANSPORT_ERROR = lib.PN_TRANSPORT_ERROR
E_TRANSPORT_CLOSED = lib.PN_TRANSPORT_CLOSED

UINT_MAX = 0xFFFFFFFF
# pn_link_recv's answers below 0 (proton/error.h of 0.40, not exported to cffi): the end of a
# delivery with no more bytes, and PN_ABORTED (-11) or another error, below it
EOS = -1


def ptr_key(ptr: Any) -> int:
    """A hashable key for a C pointer (pointers are recycled: drop keys before freeing)."""
    return int(ffi.cast("uintptr_t", ptr))


def cstr(ptr: Any) -> str | None:
    if ptr == NULL:
        return None
    return ffi.string(ptr).decode("utf-8", "replace")


def bytes_of(pn_bytes: Any) -> bytes:
    if pn_bytes.start == NULL:
        return b""
    return ffi.unpack(pn_bytes.start, pn_bytes.size)


def delivery_tag(delivery: Any) -> bytes:
    return bytes_of(lib.pn_delivery_tag(delivery))


def set_condition(cond: Any, name: str, description: str | None, info: dict[Any, Any] | None = None) -> None:
    lib.pn_condition_set_name(cond, name.encode())
    if description:
        lib.pn_condition_set_description(cond, description.encode("utf-8", "replace"))
    if info:
        obj2dat(info, lib.pn_condition_info(cond))


def get_condition(cond: Any) -> tuple[str, str] | None:
    if cond == NULL or not lib.pn_condition_is_set(cond):
        return None
    return (cstr(lib.pn_condition_get_name(cond)) or "", cstr(lib.pn_condition_get_description(cond)) or "")


def condition_info(cond: Any) -> Any:
    if cond == NULL or not lib.pn_condition_is_set(cond):
        return None
    return dat2obj(lib.pn_condition_info(cond))


def data_to_obj(data: Any) -> Any:
    if data == NULL:
        return None
    return dat2obj(data)


def obj_to_data(obj: Any, data: Any) -> None:
    lib.pn_data_clear(data)
    obj2dat(obj, data)


def symbol_array(symbols: tuple[str, ...]) -> Any:
    """An AMQP array of symbols (terminus capabilities)."""
    from proton import UNDESCRIBED, Array, Data, symbol

    return Array(cast(Any, UNDESCRIBED), Data.SYMBOL, *(symbol(s) for s in symbols))


def terminus_address(term: Any) -> str | None:
    return cstr(lib.pn_terminus_get_address(term))


def set_terminus_address(term: Any, address: str | None) -> None:
    lib.pn_terminus_set_address(term, address.encode() if address is not None else NULL)


def new_buffer(size: int) -> tuple[bytearray, Any]:
    buf = bytearray(size)
    return buf, ffi.from_buffer(buf)


def from_buffer(b: bytes | bytearray | memoryview) -> Any:
    return ffi.from_buffer(b)


# ------------------------------------------------------------------ the delivery pool
# Proton keeps a connection's freed deliveries in a pool (pn_delivery pops the newest first) and
# each pooled delivery keeps its byte buffer at the largest message it ever carried
# (pn_buffer_clear keeps the capacity), for the life of the connection. The pool is as deep as the
# most deliveries the connection ever had alive at once (a burst of frames to a neighbour, a
# publisher's window), and over hours more and more of its deep members have carried a large
# message: a slow climb of the router's memory towards depth x largest message (measured: line3
# in total order, inter-router pools of 400-600 deliveries, a third of them at 8 KB after 7
# minutes, ~0.2 MB/min). Proton has no call to shrink a pool, so `trim_delivery_pool` frees what
# lies beyond the newest `keep`: it reads the connection's pool pointer from its struct (0.40.0's
# layout, checked against two fields Proton's public getters return before it is trusted) and
# pops with Proton's own list and reference-count functions (exported by the shared object, not
# by cffi's `lib`: reached in ABI mode, as docs/engine.md, "The engine layer", describes).
_CONNECTION_POOL = 368  # offsetof(pn_connection_t, delivery_pool), 0.40.0, LP64
_CONNECTION_CHECKS = ((176, "pn_connection_transport"), (360, "pn_connection_attachments"))  # (pure getters)
_abi_lib: Any = None


def _abi() -> Any:
    """Proton's list functions from its shared object, through ctypes. (Not cffi's ABI mode: its
    `cdef` imports and runs pycparser, ~50 ms of the loop's time at the first trim, a minute into
    a router's life; under callgrind ~90,000 instructions per message of a paced 1,800-message
    `oncemesh bench --instructions` run.)"""
    global _abi_lib
    if _abi_lib is None:
        import ctypes

        import cproton_ffi

        so = ctypes.CDLL(cproton_ffi.__file__)
        so.pn_list_pop.argtypes = [ctypes.c_void_p]
        so.pn_list_pop.restype = ctypes.c_void_p
        so.pn_list_size.argtypes = [ctypes.c_void_p]
        so.pn_list_size.restype = ctypes.c_size_t
        _abi_lib = so
    return _abi_lib


def _address(ptr: Any) -> int:
    return int(ffi.cast("uintptr_t", ptr))


def _field(conn: Any, offset: int) -> Any:
    return ffi.cast("void **", ffi.cast("char *", conn) + offset)[0]


def delivery_pool(conn: Any) -> Any:
    """The delivery pool (a `pn_list_t *`) of a live `pn_connection_t *`, or NULL when the layout
    is not the one this was written for (another platform or build: then nothing is trimmed)."""
    if ffi.sizeof("void *") != 8 or conn == NULL:
        return NULL
    for offset, getter in _CONNECTION_CHECKS:
        if ptr_key(_field(conn, offset)) != ptr_key(getattr(lib, getter)(conn)):
            return NULL
    return _field(conn, _CONNECTION_POOL)


def pool_size(conn: Any) -> int:
    """Deliveries in the connection's pool (0 when the layout check fails)."""
    pool = delivery_pool(conn)
    return int(_abi().pn_list_size(_address(pool))) if pool != NULL else 0


def trim_delivery_pool(conn: Any, keep: int) -> int:
    """Free the pooled deliveries of `conn` beyond the newest `keep` (their buffers with them).
    Returns how many were freed. A pooled delivery belongs to no link (Proton clears it when it
    pools one): its last reference is the pool's, so dropping it frees the delivery."""
    pool = delivery_pool(conn)
    if pool == NULL:
        return 0
    abi = _abi()
    at = _address(pool)
    freed = 0
    while abi.pn_list_size(at) > keep:
        d = abi.pn_list_pop(at)  # (an address: ctypes gives a void * as an int)
        lib.pn_decref(ffi.cast("void *", d))
        freed += 1
    return freed


__all__ = ["ffi", "lib"]
