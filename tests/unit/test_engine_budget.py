"""The engine carries out the pass budget (common/passrules.py, rule 5) on a real Proton engine:
a client connection's burst of attaches is handled a slice per loop pass, in order, with its socket
not read meanwhile, and resumed once the burst is taken; a connection lost takes what was left first.
(The router-level proof, a flood beside another client's round trips: tests/integration/test_pass_budget.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

from proton import ubyte, uint

from oncemesh.common.engine import AmqpConnection, Engine, Link
from oncemesh.common.passrules import PassBudget
from tests.integration.rawamqp import ATTACH, BEGIN, OPEN, described, frame
from tests.unit.test_engine_input_order import Sock as InputSock

HEADER = b"AMQP\x00\x01\x00\x00"


class Sock(InputSock):
    """Enough of an asyncio transport: it says when reading was paused and resumed."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def pause_reading(self) -> None:
        self.log.append("pause")

    def resume_reading(self) -> None:
        self.log.append("resume")


class Handler:
    """Records the pass in which each link's attach was handled."""

    def __init__(self, eng: Engine, log: list[str]) -> None:
        self.eng = eng
        self.log = log
        self.opened: list[tuple[int, str]] = []

    def pass_no(self) -> int:
        clock = self.eng.pass_clock
        assert clock is not None
        return clock.passes

    def on_connection_open(self, conn: AmqpConnection) -> None:
        pass

    def on_link_open(self, link: Link) -> None:
        self.opened.append((self.pass_no(), link.name))
        link.open()

    def on_credit(self, link: Link) -> None:
        pass

    def on_message(self, *a: Any) -> None:
        pass

    def on_delivery_update(self, *a: Any) -> None:
        pass

    def on_link_closed(self, *a: Any) -> None:
        pass

    def on_connection_closed(self, conn: AmqpConnection, condition: Any) -> None:
        self.log.append("closed")


def burst(n: int) -> bytes:
    return HEADER + frame(OPEN, ["flood", None, uint(65536)]) + frame(BEGIN, [None, uint(0), uint(1000), uint(1000)]) \
        + b"".join(frame(ATTACH, [f"p{i}", uint(i), False, ubyte(0), ubyte(1), described(0x28, ["src"]),
                                  described(0x29, ["t"]), None, None, uint(0)]) for i in range(n))


def run(n: int, budget: PassBudget | None, lose_after: float | None = None) -> tuple[Handler, list[str]]:
    log: list[str] = []
    handler: Handler | None = None

    async def main() -> None:
        nonlocal handler
        loop = asyncio.get_running_loop()
        eng = Engine(loop, pass_end=True)
        handler = Handler(eng, log)
        conn = AmqpConnection(eng, handler, server=True, container_id="r")  # type: ignore[arg-type]
        conn.sock = Sock(log)  # type: ignore[assignment]
        conn.budget = budget
        loop.call_soon(conn.data_received, burst(n))
        if lose_after is not None:
            loop.call_later(lose_after, conn.connection_lost, None)
        for _ in range(200):
            await asyncio.sleep(0)
            if len(handler.opened) == n and (not log or log[-1] != "pause"):
                break
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert handler is not None
    return handler, log


def test_a_burst_of_attaches_is_handled_a_slice_per_pass_in_order() -> None:
    h, log = run(100, PassBudget(64 * 1024, 16))
    assert [name for _, name in h.opened] == [f"p{i}" for i in range(100)]
    per_pass: dict[int, int] = {}
    for p, _ in h.opened:
        per_pass[p] = per_pass.get(p, 0) + 1
    assert max(per_pass.values()) <= 16 and len(per_pass) >= 100 // 16
    assert log == ["pause", "resume"], "reading paused while the burst was taken, resumed after"


def test_without_a_budget_the_burst_is_handled_at_once() -> None:
    h, log = run(100, None)
    assert len(h.opened) == 100 and len({p for p, _ in h.opened}) == 1 and not log


def test_a_connection_lost_takes_what_its_budget_left_first() -> None:
    h, log = run(200, PassBudget(64 * 1024, 4), lose_after=0.0)
    assert [name for _, name in h.opened] == [f"p{i}" for i in range(200)]
    assert log[-1] == "closed"
