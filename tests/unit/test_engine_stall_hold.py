"""The router's hand-over hold after a stall, on a real event loop (router/server.py `_on_stall`,
driven by the engine's pass clock and the edge's rules, common/passrules.py `HandoverHold`):
held from the pass that learned of the stall until the end of the second pass after it."""

from __future__ import annotations

import asyncio
import time

from oncemesh.common.engine import Engine
from oncemesh.common.passrules import HOLD_GAP, HandoverHold
from oncemesh.router.server import Router


class Core:
    """What `_on_stall` and the release ask of the core, with the pass each came in."""

    def __init__(self, eng: Engine, seen: list[tuple[str, int]]) -> None:
        self.eng = eng
        self.seen = seen

    def _pass(self) -> int:
        assert self.eng.pass_clock is not None
        return self.eng.pass_clock.passes

    def hold_handovers(self) -> None:
        self.seen.append(("hold", self._pass()))

    def release_handovers(self) -> None:
        self.seen.append(("release", self._pass()))


def _held_passes(enabled: bool = True) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        eng = Engine(loop, pass_end=True)
        router = Router.__new__(Router)  # (only what the stall hook uses)
        router.engine = eng
        router.core = Core(eng, seen)  # type: ignore[assignment]
        router.handover_hold = HandoverHold(enabled)
        router.drain = lambda decided=None: None  # type: ignore[method-assign]
        eng.on_stall(router._on_stall)
        assert eng.pass_clock is not None
        eng.pass_clock.returned = time.monotonic() - HOLD_GAP - 0.1  # (the pass before took long)
        await asyncio.sleep(0.05)

    asyncio.run(main())
    return seen


def test_hand_overs_wait_two_passes_after_the_stalls() -> None:
    seen = _held_passes()
    assert [kind for kind, _ in seen] == ["hold", "release"]
    (_, held), (_, released) = seen
    # the next pass is the first whose poll began after the stall; the one after it sees the
    # goodbyes behind the data that one read (before: released a pass earlier)
    assert released == held + 2


def test_without_the_hold_nothing_is_held() -> None:
    assert _held_passes(enabled=False) == []
