"""Every direct access to Proton's C engine (python-qpid-proton 0.40.0, cffi) lives here.

We drive the engine with raw cffi calls instead of Proton's Python wrapper objects: a wrapper call
costs microseconds, a `lib` call ~0.05 µs (../shared/notes/proton-engine.md). Rare operations
(terminus, properties, conditions) use small helpers here so that no other module touches cffi.
"""

from __future__ import annotations

from typing import Any

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


def terminus_address(term: Any) -> str | None:
    return cstr(lib.pn_terminus_get_address(term))


def set_terminus_address(term: Any, address: str | None) -> None:
    lib.pn_terminus_set_address(term, address.encode() if address is not None else NULL)


def new_buffer(size: int) -> tuple[bytearray, Any]:
    buf = bytearray(size)
    return buf, ffi.from_buffer(buf)


def from_buffer(b: bytes | bytearray | memoryview) -> Any:
    return ffi.from_buffer(b)


__all__ = ["ffi", "lib"]
