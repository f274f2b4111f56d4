"""What a router process reads about itself and how it sets up its interpreter."""

from __future__ import annotations

import gc

from oncemesh.common.engine import GC_THRESHOLD, tune_gc
from oncemesh.router.server import _rss_kb


def _vmrss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


def test_rss_from_statm_agrees_with_vmrss() -> None:
    ballast = bytearray(32 * 1024 * 1024)  # 32 MB touched: the two readings must both see it
    ballast[::4096] = b"x" * len(ballast[::4096])
    a, b = _rss_kb(), _vmrss_kb()
    assert a > 32 * 1024
    assert abs(a - b) <= max(2048, b // 20), (a, b)


def test_tune_gc_raises_the_young_threshold_and_freezes_start_up() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold()[0] == GC_THRESHOLD
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
