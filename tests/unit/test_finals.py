"""What a router remembers of final gids (router/finals.py): the same answers as a plain model, and
forgetting that costs the same per tick with millions remembered as with a few."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.finals import forget_finals
from oncemesh.router.subscriptions import SubscriptionTable


@given(st.lists(st.one_of(st.tuples(st.just("add"), st.integers(0, 30), st.floats(0, 100)),
                          st.tuples(st.just("forget"), st.integers(0, 0), st.floats(0, 100))), max_size=80),
       st.integers(1, 20))
def test_it_answers_like_a_model(steps: list[tuple[str, int, float]], cap: int) -> None:
    """Model: an ordered dict; forget drops from the front while the time is before the cut (or
    there are more than the cap), and stops at the first that is not."""
    fm: dict[str, float] = {}
    model: dict[str, float] = {}
    now = 0.0
    for op, g, t in steps:
        now = max(now, t)  # time goes forward
        gid = f"g{g}"
        if op == "add":
            fm[gid] = now
            model[gid] = now
        else:
            keys = list(model)
            k = 0
            while k < len(keys) and (model[keys[k]] < now or len(keys) - k > cap):
                k += 1
            expected = {key: model[key] for key in keys[k:]}
            assert forget_finals(fm, now, cap) == k
            model = expected
        assert list(fm.items()) == list(model.items())
        assert all((gid in fm) == (gid in model) for gid in (f"g{i}" for i in range(31)))


def test_a_gid_final_again_keeps_its_place_and_holds_the_later_ones() -> None:
    fm: dict[str, float] = {}
    fm["a"] = 1.0
    fm["b"] = 2.0
    fm["a"] = 3.0  # final again (e.g. a predecessor something waits for): remembered longer
    assert forget_finals(fm, 2.5, 10) == 0 and "b" in fm  # (b waits behind it: remembered a little longer)
    assert forget_finals(fm, 3.5, 10) == 2 and not fm


def _purge_rounds(core: DeliveryCore, rounds: int, per_round: int, start: float) -> list[float]:
    times = []
    for k in range(rounds):
        t0 = time.process_time()
        core.tick(start + core.cfg.final_memory + (k + 1) * per_round * 1e-3)
        times.append(time.process_time() - t0)
    return times


def test_the_purge_cost_per_tick_stays_flat_with_millions_of_final_gids() -> None:
    """Two million final gids, one every microsecond of simulated time; every tick forgets the next
    20,000. A purge that walked what it deleted before (dict front-popping: 0.26 -> 0.87 s in five
    rounds at a million) grows round after round; this one must not."""
    core = DeliveryCore("R", SubscriptionTable(), CoreConfig(final_memory=300.0, final_memory_gids=10_000_000))
    n, per_round = 2_000_000, 20_000
    for i in range(n):
        core.recent_final[f"{i:016x}:{i}"] = i * 1e-3
    # warm up, then compare early rounds with late ones (the same work each: per_round gids)
    times = _purge_rounds(core, 80, per_round, 0.0)
    assert len(core.recent_final) == n - 80 * per_round
    early, late = sorted(times[5:25]), sorted(times[60:80])
    assert late[len(late) // 2] < 3 * early[len(early) // 2] + 0.002, (early, late)
