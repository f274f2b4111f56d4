"""A quiet router costs little (issue 32, item 2): its status is looked at once a second and written
only when it changed, and its tick takes no loop pass of its own for the log or the status when they
have nothing to do (router/server.py `_on_tick`, `_maybe_write_status`; common/settlement_log.py
`flush_due`)."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

from oncemesh.common.engine import _PassEnd
from oncemesh.common.settlement_log import Segments, SettlementLog
from oncemesh.router.config import RouterConfig
from oncemesh.router.server import STATUS_INTERVAL, Router


def _status_router(counts: list[int], written: list[dict[str, Any]], tick: float = 0.5) -> Router:
    """A router with only what the status uses: its counts come from `counts`, its writes go to `written`."""
    r = Router.__new__(Router)
    r.cfg = RouterConfig(id="Q", tick_interval=tick)
    r._status_checked = -math.inf
    r._last_stats = {}
    r.ready_info = lambda snap=None: {"id": "Q", "updated": time.time(),  # type: ignore[method-assign]
                                      "stats": {"records": counts[0], "rss_kb": counts[1]}}
    r.write_ready_file = lambda info=None: written.append(info or {})  # type: ignore[method-assign]
    return r


def test_the_status_is_looked_at_once_a_second_and_written_when_it_changed() -> None:
    counts = [0, 100]
    written: list[dict[str, Any]] = []
    r = _status_router(counts, written)
    r._maybe_write_status(now=10.0)  # the first look writes
    assert len(written) == 1
    counts[0] = 1  # a change...
    r._maybe_write_status(now=10.5)  # ...half a second later: not looked at yet
    assert len(written) == 1
    r._maybe_write_status(now=10.5 + 0.5)  # the tick a second after the last look writes it
    assert len(written) == 2 and written[-1]["stats"]["records"] == 1
    counts[1] = 200  # only a volatile figure changed: not written
    r._maybe_write_status(now=12.0)
    assert len(written) == 2
    counts[0] = 2  # a forced write goes at once, due or not
    r._maybe_write_status(force=True, now=12.1)
    assert len(written) == 3 and written[-1]["stats"]["records"] == 2
    r._maybe_write_status(now=12.6)  # (and counts as the look)
    assert len(written) == 3


def test_a_change_is_in_the_file_within_a_second_and_a_tick() -> None:
    """Ticks every 0.5 s, a little late each, the counts changing all the time: the file is written
    about once a second, never more than STATUS_INTERVAL and a tick after the last write."""
    counts = [0, 0]
    written_at: list[float] = []
    r = _status_router(counts, [])
    now = 0.0
    r.write_ready_file = lambda info=None: written_at.append(now)  # type: ignore[method-assign]
    for i in range(40):
        now = i * 0.5 + (0.003 * (i % 3))  # (a tick runs up to a few ms late)
        counts[0] += 1
        r._maybe_write_status(now=now)
    gaps = [b - a for a, b in zip(written_at, written_at[1:], strict=False)]
    assert len(written_at) == 20
    assert all(STATUS_INTERVAL - 0.25 <= g <= STATUS_INTERVAL + 0.5 for g in gaps), gaps


def test_an_idle_log_needs_no_flush_and_a_buffered_one_does(tmp_path: Path) -> None:
    slog = SettlementLog(tmp_path / "A.settlement.jsonl", src="router", node="A", inc="1",
                         segments=Segments(max_seconds=3600.0, compress=False))
    slog.flush()  # (its header)
    assert not slog.flush_due()
    slog.write("router_started", time.time())
    assert slog.flush_due()
    slog.flush()
    assert not slog.flush_due()
    assert slog.flush_due(time.monotonic() + 3600.0)  # the segment's time is up: the flush cuts it
    slog.close()
    assert not slog.flush_due()


def test_an_idle_router_takes_one_loop_pass_per_tick(tmp_path: Path) -> None:
    """With nothing to log and the status looked at once a second, a tick is one pass of the loop,
    not three (before: the tick, then the log's flush and the status in a pass each)."""
    ready = tmp_path / "Q.ready.json"
    cfg = RouterConfig(id="Q", listen=("127.0.0.1", 0), log_dir=tmp_path, ready_file=ready, tick_interval=0.02,
                       allow_anonymous=True)

    async def main() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        router = Router(cfg)
        await router.start()
        hook = loop._selector  # type: ignore[attr-defined]
        assert isinstance(hook, _PassEnd)
        ticks = 0
        marks: dict[int, asyncio.Future[tuple[int, int]]] = {10: loop.create_future(), 70: loop.create_future()}
        real_tick = router._on_tick

        def counted() -> None:
            nonlocal ticks
            ticks += 1
            real_tick()
            mark = marks.get(ticks)
            if mark is not None:  # (the passes so far, and the status writes)
                assert router.status_file is not None
                mark.set_result((hook.clock.passes, router.status_file.written))

        router._on_tick = counted  # type: ignore[method-assign]
        try:
            # (from the 10th tick, start-up's own passes and lines behind us, to the 70th: ~1.2 s)
            p0, w0 = await asyncio.wait_for(marks[10], 30)
            p1, w1 = await asyncio.wait_for(marks[70], 30)
            return 60, p1 - p0, w1 - w0
        finally:
            await router.stop()

    ticks, passes, written = asyncio.run(main())
    # one pass per tick, and the status's looks (~1-2) a pass each; three passes a tick would be 180
    assert passes <= ticks + 10, (ticks, passes)
    assert written <= 2, written  # (nothing changed: the status is not rewritten every look)
    assert ready.exists() is False  # (removed at stop)


def test_the_status_writer_makes_its_directory_when_it_is_missing(tmp_path: Path) -> None:
    """(Not before every write any more: only when the write finds no directory.)"""
    from oncemesh.router.statusfile import StatusFile

    path = tmp_path / "status" / "Q.json"
    sf = StatusFile(path)
    sf.write('{"n": 1}')
    sf.flush()
    assert path.read_text() == '{"n": 1}'
    path.unlink()
    path.parent.rmdir()  # (removed under a running router: made again)
    sf.write('{"n": 2}')
    sf.flush()
    sf.close()
    assert path.read_text() == '{"n": 2}' and sf.written == 2
    assert not path.with_suffix(".json.tmp").exists()
