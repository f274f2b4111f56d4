"""A simulated router's loop in passes (passes.py) carries out the edge's rules as the engine does:
one stopped router, its pile, and the order in which it takes it when it goes on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.sim.kernel import Scheduler
from tests.sim.passes import Input, SimLoop, Source


class Router:
    """Enough of a SimRouter: what the loop takes, holds and releases goes into `seen`."""

    def __init__(self) -> None:
        self.id = "R"
        self.incarnation = 1
        self.alive = True
        self.seen: list[str] = []
        k = Scheduler(1, start=1000.0)
        self.sim = SimpleNamespace(k=k, rng=k.rng, note=lambda text: None)
        self.core = SimpleNamespace(hold_handovers=lambda: self.seen.append("hold"),
                                    release_handovers=lambda: self.seen.append("release"))
        self.node = SimpleNamespace(tick=lambda now: self.seen.append("tick"))

    def process(self) -> None:
        self.seen.append("|")  # (the pass's drain: its end)


def _input(r: Router, key: Any, source: Source, what: str, eof: bool = False) -> Input:
    return Input(key, source, lambda: r.seen.append(what), eof)


def _stopped(mode: str, piled: list[tuple[Any, Source, str, bool]], seconds: float = 3.0) -> list[str]:
    r = Router()
    loop = SimLoop(r)  # type: ignore[arg-type]
    k = r.sim.k
    loop.next_tick = k.now + 0.25  # (its timer: what its poll waits for at most; it never fires here)
    loop.stop(mode, seconds, lambda: None)
    for n, (key, source, what, eof) in enumerate(piled):
        k.after(0.1 * (n + 1), loop.arrive, _input(r, key, source, what, eof))
    k.run(until=1020.0)
    return r.seen


PILE = [("pub", Source.CLIENT, "pub: transfers", False),
        ("peer", Source.MESH, "peer: transfers", False),
        ("sub", Source.CLIENT, "sub: credit", False),
        ("sub", Source.CLIENT, "sub: goodbye", True),
        ("pub", Source.CLIENT, "pub: goodbye", True)]


def test_stopped_in_its_poll_it_takes_clients_first_and_holds_hand_overs_past_their_goodbyes() -> None:
    """Stopped 3 s while waiting in its poll, it finds everything piled: the clients' data is
    taken as read, the peer's held (and, stale, for one more poll); the goodbyes behind the data
    come with the next read; hand-overs are released only at the end of the second pass after the
    stall's, after every goodbye."""
    assert _stopped("poll", PILE) == [
        "hold", "pub: transfers", "sub: credit", "|",  # pass 1: the peer's input waits a poll
        "sub: goodbye", "pub: goodbye", "peer: transfers", "|",  # pass 2: the ends, then the held input
        "release", "|"]  # pass 3


def test_stopped_on_its_way_out_of_its_poll_it_first_reads_only_what_that_poll_returned() -> None:
    """Its poll had returned the publisher's socket when it stopped: the first pass after reads
    only that; the next poll brings the rest (the peer's input, read after the stall, is taken at
    that pass's end, its hand-overs still held), the one after it the goodbye behind the
    subscriber's credit, and only then are hand-overs released. (Released a pass earlier, as
    before the simulation found it, the peer's messages went to the subscriber that had left.)"""
    assert _stopped("wake", PILE) == [
        "hold", "pub: transfers", "|",
        "sub: credit", "pub: goodbye", "peer: transfers", "|",
        "sub: goodbye", "release", "|"]


def test_a_short_stop_is_no_stall() -> None:
    """Stopped 0.3 s (less than HOLD_GAP past its poll's timeout): nothing is held; the peer's
    input still comes after the clients' of its pass."""
    seen = _stopped("poll", PILE[:3], seconds=0.35)
    assert "hold" not in seen and seen.index("sub: credit") < seen.index("peer: transfers")
