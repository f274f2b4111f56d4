"""The C allocator's hooks (common/cmalloc.py): a fixed mmap threshold keeps large blocks off the heap.

Each case runs in a fresh interpreter: the threshold is process-wide and must not leak into pytest."""

from __future__ import annotations

import subprocess
import sys

import pytest

from oncemesh.common.cmalloc import MAX_MMAP_THRESHOLD, mallinfo_reader, set_mmap_threshold, trimmer

glibc = pytest.mark.skipif(mallinfo_reader() is None, reason="not glibc >= 2.33 (no mallinfo2)")

# a 4 MiB block is mmapped and freed (glibc's own threshold then rises to 4 MiB), then three blocks of
# 1 MiB are made: how many of their bytes got pages of their own?
PROBE = """
import sys
from oncemesh.common.cmalloc import mallinfo_reader, set_mmap_threshold
if sys.argv[1] != "0":
    assert set_mmap_threshold(int(sys.argv[1]))
info = mallinfo_reader()
big = bytearray(4 << 20)
del big
before = info()["mmapped"]
blocks = [bytearray(1 << 20) for _ in range(3)]
print(info()["mmapped"] - before)
"""


def mmapped_after_a_large_free(threshold: int) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, str(threshold)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@glibc
def test_glibcs_own_threshold_rises_and_a_fixed_one_does_not() -> None:
    # glibc's default: the freed 4 MiB block moved the line, the 1 MiB blocks come from the heap
    assert mmapped_after_a_large_free(0) < 1 << 20
    # fixed at 128 KiB: each 1 MiB block has pages of its own (back to the system when freed)
    assert mmapped_after_a_large_free(128 * 1024) >= 3 << 20


def test_an_out_of_range_threshold_is_refused() -> None:
    for bad in (0, -1, MAX_MMAP_THRESHOLD + 1):
        with pytest.raises(ValueError, match="mmap threshold"):
            set_mmap_threshold(bad)


@glibc
def test_the_trimmer_calls_malloc_trim() -> None:
    trim = trimmer()
    assert trim is not None and trim() in (0, 1)
