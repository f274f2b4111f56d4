"""The engine's end of a pass (common/engine.py `_PassEnd`): output made in a loop pass is flushed
in that pass, before the loop polls its selector again (not in a second pass after one more poll),
after the pass's after-pass work and the write-ahead hooks; and nothing the flush starts waits
longer than it would have."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from oncemesh.common.engine import Engine, _PassEnd


class Conn:
    """Enough of an AmqpConnection for the dirty set."""

    def __init__(self, out: list[str], name: str = "output") -> None:
        self.dirty = True
        self.out = out
        self.name = name

    def flush(self) -> None:
        self.out.append(self.name)


def _count_polls(loop: asyncio.AbstractEventLoop) -> list[Any]:
    hook = loop._selector  # type: ignore[attr-defined]
    assert isinstance(hook, _PassEnd)
    polls: list[Any] = []
    real = hook.inner.select

    def select(timeout: float | None = None) -> Any:
        polls.append(timeout)
        return real(timeout)

    hook.inner.select = select  # type: ignore[method-assign]
    return polls


def test_output_leaves_in_the_pass_that_made_it() -> None:
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        eng = Engine(loop, pass_end=True)
        polls = _count_polls(loop)
        eng.before_output.append(lambda: order.append(f"log written (polls {len(polls)})"))
        seen: list[int] = []

        def handler() -> None:  # (a data_received: input handled, output made)
            seen.append(len(polls))
            eng.call_after_pass(lambda: order.append(f"drain (polls {len(polls)})"))
            eng.mark_dirty(Conn(order, f"output (polls {len(polls)})"))  # type: ignore[arg-type]

        loop.call_soon(handler)
        await asyncio.sleep(0.02)
        n = seen[0]
        # drain, log and output all before the loop polled its selector again
        assert order == [f"drain (polls {n})", f"log written (polls {n})", f"output (polls {n})"]

    asyncio.run(main())


def test_what_the_flush_starts_does_not_wait() -> None:
    """A callback, a timer or a stop made by the flush shortens the wait that follows it."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        eng = Engine(loop, pass_end=True)
        soon = loop.create_future()
        later = loop.create_future()
        eng.call_after_pass(lambda: loop.call_soon(soon.set_result, time.monotonic()))
        eng.call_after_pass(lambda: loop.call_later(0.02, lambda: later.set_result(time.monotonic())))
        t0 = time.monotonic()
        # the only other timer is wait_for's, 5 s away: without the check the loop would sleep on it
        assert await asyncio.wait_for(soon, 5) - t0 < 0.5
        assert await asyncio.wait_for(later, 5) - t0 < 0.5

    asyncio.run(main())


def test_engines_of_one_loop_share_the_hook_and_direct_flushes_stay_safe() -> None:
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        a, b = Engine(loop, pass_end=True), Engine(loop, pass_end=True)
        assert a._pass_end is b._pass_end is loop._selector  # type: ignore[attr-defined]
        a.mark_dirty(Conn(order, "a"))  # type: ignore[arg-type]
        b.mark_dirty(Conn(order, "b"))  # type: ignore[arg-type]
        a._flush_all()  # (a direct flush, as shutdown does: the hook then skips a)
        a.call_after_pass(lambda: b.mark_dirty(Conn(order, "b2")))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert order[0] == "a" and sorted(order[1:]) == ["b", "b2"]  # (b's two in its dirty set: any order)


def test_a_failing_flush_is_contained(caplog: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        eng = Engine(loop, pass_end=True)
        eng._flush_all = lambda: 1 / 0  # type: ignore[method-assign]
        eng._schedule()
        await asyncio.sleep(0.01)
        eng._scheduled = False

    asyncio.run(main())
    assert "engine.flush_failed" in caplog.text


def test_other_loops_fall_back_to_call_soon() -> None:
    order: list[str] = []

    class Loop:
        def call_soon(self, fn: Any) -> None:
            order.append("call_soon")

    eng = Engine(Loop(), pass_end=True)  # type: ignore[arg-type]
    assert eng._pass_end is None
    eng.mark_dirty(Conn(order))  # type: ignore[arg-type]
    assert order == ["call_soon"]


def test_on_by_default_and_off_with_the_environment(monkeypatch: Any) -> None:
    """The default engine flushes at the end of the pass; ONCEMESH_PASS_END=0 (or `pass_end=False`)
    goes back to a `call_soon` pass, which still flushes."""
    monkeypatch.delenv("ONCEMESH_PASS_END", raising=False)
    loop = asyncio.new_event_loop()
    try:
        eng = Engine(loop)
        assert isinstance(eng._pass_end, _PassEnd) and loop._selector is eng._pass_end  # type: ignore[attr-defined]
    finally:
        loop.close()
    for env, arg in (("0", None), (None, False)):  # off by the environment, off by the argument
        if env is not None:
            monkeypatch.setenv("ONCEMESH_PASS_END", env)
        loop = asyncio.new_event_loop()
        try:
            eng = Engine(loop, pass_end=arg)
            assert eng._pass_end is None and not isinstance(loop._selector, _PassEnd)  # type: ignore[attr-defined]
            out: list[str] = []
            eng.mark_dirty(Conn(out))  # type: ignore[arg-type]
            loop.run_until_complete(asyncio.sleep(0.01))
            assert out == ["output"]
        finally:
            loop.close()
