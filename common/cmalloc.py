"""The C library's allocator (glibc's malloc), where the router's long-run memory is decided.

Python objects live in CPython's own arenas, but everything larger than 512 bytes (a dict's or a
list's table, a bytes of a message, Proton's buffers, zlib's state) comes from malloc. Three hooks,
each a no-op (None) where the C library lacks it (musl, macOS):

- `set_mmap_threshold(n)`: allocations of `n` bytes or more get pages of their own (mmap) and go back
  to the system when freed. glibc's default starts at 128 KiB but *rises* to the size of each mmapped
  block that is freed (up to 32 MiB), after which blocks of that size come from the heap, where a
  block freed below a live one cannot go back: a router's table of a few MB (a final-gid run list,
  a dict being rebuilt, a compression's buffers) freed once moves the line and every later one
  fragments the heap. Line3 in Lamport order at 1,500 msg/s for 10 minutes: RSS slopes after the
  warm-up +0.91 / +0.51 / +0.56 MB/min with the moving threshold, +0.18 / +0.23 / +0.07 with it fixed
  at 128 KiB (docs/operations.md, "What can grow"). Setting it also fixes glibc's trim threshold.
- `trimmer()`: `malloc_trim(0)`, handing free pages of every arena back to the system.
- `mallinfo_reader()`: `mallinfo2()`, the bytes of the C heap (diagnosis: router/heapprobe.py).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's ceiling on 64-bit (HEAP_MAX_SIZE / 2)


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def set_mmap_threshold(n: int) -> bool:
    """Fix glibc's mmap threshold at `n` bytes (and with it stop its dynamic adjustment). False where
    there is no `mallopt` or glibc refused the value (above `MAX_MMAP_THRESHOLD`)."""
    if not 0 < n <= MAX_MMAP_THRESHOLD:
        raise ValueError(f"mmap threshold {n} is not in 1..{MAX_MMAP_THRESHOLD}")
    libc = _libc()
    fn = getattr(libc, "mallopt", None) if libc is not None else None
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return bool(fn(M_MMAP_THRESHOLD, n))


def trimmer() -> Callable[[], int] | None:
    """A function that calls glibc's `malloc_trim(0)` (returns 1 when memory went back), or None."""
    libc = _libc()
    fn = getattr(libc, "malloc_trim", None) if libc is not None else None
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: int(fn(0))


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def mallinfo_reader() -> Callable[[], dict[str, int]] | None:
    """A function that reads glibc's `mallinfo2()` (bytes of the C heap: `arena`, `in_use`, `free`,
    `mmapped`, `top_free`), or None where there is none (not glibc, or glibc before 2.33)."""
    libc = _libc()
    fn = getattr(libc, "mallinfo2", None) if libc is not None else None
    if fn is None:
        return None
    fn.restype = _MallInfo2

    def read() -> dict[str, int]:
        m = fn()
        return {"arena": m.arena, "in_use": m.uordblks, "free": m.fordblks, "mmapped": m.hblkhd,
                "top_free": m.keepcost}
    return read
