"""What a router remembers of final gids (router/finals.py): the same answers as a plain model,
compact intervals for counter-tagged gids, a bound on entries, and forgetting that costs the same
per tick with millions remembered as with a few."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from oncemesh.common.ids import counter_tag, global_id
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.finals import OldFinals, age_finals, counter_key, forget_finals
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


_PLIDS = ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]


def _gid(kind: int, n: int) -> str:
    """A gid of one of the tag kinds routers see: ours (base-36 counter), a decimal counter, a tag
    that is no counter (hashed)."""
    plid = _PLIDS[n % 2]
    if kind == 0:
        return global_id(plid, counter_tag(n))
    if kind == 1:
        return global_id(plid, str(n).encode())
    return global_id(plid, b"\x00\x01" + n.to_bytes(4, "big"))


def test_counter_keys_are_one_to_one() -> None:
    seen: dict[tuple[str, int], str] = {}
    for kind in (0, 1):
        for n in range(3000):
            gid = _gid(kind, n)
            k = counter_key(gid)
            assert k is not None and seen.setdefault(k, gid) == gid
    assert counter_key(global_id(_PLIDS[0], b"007")) is None  # (one form per gid: not the same as "7")
    assert counter_key(global_id(_PLIDS[0], b"Ab")) is None
    assert counter_key(_gid(2, 5)) is None


MEMORY, YOUNG = 30.0, 2.0


@given(st.lists(st.tuples(st.sampled_from(["final", "tick"]), st.integers(0, 2), st.integers(0, 60),
                          st.floats(0, 4)), max_size=120))
def test_the_two_tiers_answer_like_a_model(steps: list[tuple[str, int, int, float]]) -> None:
    """Model: gid -> when it first became final. Remembered at least `MEMORY` seconds after that
    (a gid final again while old keeps its first time), forgotten once nothing became final for
    `MEMORY + YOUNG` and two ticks later."""
    young: dict[str, float] = {}
    old = OldFinals()
    model: dict[str, float] = {}
    now = 0.0
    for op, kind, n, dt in steps:
        now += dt
        if op == "final":
            gid = _gid(kind, n)
            young[gid] = now
            model.setdefault(gid, now)
        else:
            age_finals(young, old, now, MEMORY, YOUNG, 10_000)
        for gid, t in model.items():
            if t >= now - MEMORY:
                assert gid in young or gid in old, (gid, t, now)
        assert old.gids == sum(1 for g in model if g in old and g not in young) + \
            sum(1 for g in model if g in old and g in young)  # (counted once each)
    for k in range(3):
        now += MEMORY + YOUNG if k == 0 else 1.0
        age_finals(young, old, now, MEMORY, YOUNG, 10_000)
    assert not young and not old and old.gids == 0
    assert not any(_gid(kind, n) in old for kind in range(3) for n in range(61))


@given(st.lists(st.integers(0, 200), max_size=300, unique=True), st.integers(1, 40))
def test_the_bound_holds_and_the_newest_are_kept(ns: list[int], cap: int) -> None:
    young: dict[str, float] = {}
    old = OldFinals()
    now = 0.0
    for i, n in enumerate(ns):
        now += 0.5
        young[_gid(2 if n % 7 == 0 else 0, n)] = now
        if i % 5 == 0:
            age_finals(young, old, now, 1e9, YOUNG, cap)
            assert len(young) + len(old) <= cap
    age_finals(young, old, now, 1e9, YOUNG, cap)
    assert len(young) + len(old) <= cap
    if ns:
        assert _gid(2 if ns[-1] % 7 == 0 else 0, ns[-1]) in young  # (the newest is young, never the one forgotten)


def test_our_publishers_gids_take_a_few_intervals() -> None:
    """A million gids of two publishers, final in runs with a straggler now and then (the mesh
    finishes messages out of order): intervals, not a million dict entries."""
    young: dict[str, float] = {}
    old = OldFinals()
    now = 0.0
    straggler = None
    for n in range(500_000):
        for plid in _PLIDS:
            if n % 1000 == 17 and straggler is None:
                straggler = global_id(plid, counter_tag(n))  # final a little later
                continue
            young[global_id(plid, counter_tag(n))] = now
        if n % 7500 == 0:
            if straggler is not None:
                young[straggler] = now
                straggler = None
            now += 0.5
            age_finals(young, old, now, 300.0, YOUNG, 1_000_000)
    now += YOUNG + 1
    age_finals(young, old, now, 300.0, YOUNG, 1_000_000)
    assert not young and old.gids == 1_000_000 - (1 if straggler else 0)
    # (per batch a run per publisher; each of the 1,000 stragglers is an interval and splits a run in two)
    assert len(old) < 3_000, len(old)
    assert all(global_id(p, counter_tag(n)) in old for p in _PLIDS for n in (0, 17, 7500, 499_999))
    assert global_id(_PLIDS[0], counter_tag(500_000)) not in old


def test_a_gid_final_again_after_it_was_compacted_is_counted_once() -> None:
    young: dict[str, float] = {}
    old = OldFinals()
    for n in range(10):
        young[_gid(0, 2 * n)] = 0.0  # (one publisher: even numbers)
    age_finals(young, old, 5.0, 100.0, YOUNG, 1000)
    for n in range(20):
        young[_gid(0, 2 * n)] = 6.0  # final again, and ten new ones
    age_finals(young, old, 10.0, 100.0, YOUNG, 1000)
    assert old.gids == 20 and all(_gid(0, 2 * n) in old for n in range(20))
    assert _gid(0, 41) not in old


def test_the_purge_cost_per_tick_stays_flat_with_millions_of_final_gids() -> None:
    """Final gids at 10,000 per simulated second for 170 s, with tags that are no counters (one
    old-tier entry each, the worst case), a tick every 2 s: once the 60 s window is full each tick
    moves 20,000 gids to the old tier and forgets 20,000. A purge that walked what it deleted before
    (dict front-popping: 0.26 -> 0.87 s in five rounds at a million) grows round after round; this
    one must not."""
    core = DeliveryCore("R", SubscriptionTable(), CoreConfig(final_memory=60.0, final_memory_entries=10_000_000))
    per_round, dt = 20_000, 1e-4
    times = []
    i = 0
    for _round in range(85):
        for _ in range(per_round):
            core.recent_final[f"{i:016x}:{i}"] = i * dt
            i += 1
        t0 = time.process_time()
        core.tick(i * dt)
        times.append(time.process_time() - t0)
    remembered = len(core.recent_final) + core.old_finals.gids
    assert 600_000 <= remembered <= 660_000, remembered  # (the window: 60 s of gids, give or take a tick)
    early, late = sorted(times[35:55]), sorted(times[65:85])  # (the window full since round 33)
    assert late[len(late) // 2] < 3 * early[len(early) // 2] + 0.002, (early, late)


def test_only_a_counter_tag_of_a_link_with_runs_is_looked_up_in_them() -> None:
    """`OldFinals.__contains__` reads a gid's number only for a link with runs, and only from a
    plain counter tag: one that names the same number another way (a leading zero, upper case) is
    another message, and one past the newest run is not final."""
    old = OldFinals()
    plid = _PLIDS[0]
    old.add([f"{plid}:{n:x}" for n in (10, 11, 12)], 1.0)  # (base 36 and hex agree below 36)
    assert all(f"{plid}:{n:x}" in old for n in (10, 11, 12))
    assert f"{plid}:d" not in old and f"{plid}:9" not in old  # past the newest, before the oldest
    assert f"{plid}:0b" not in old and f"{plid}:B" not in old  # the number of "b" written otherwise
    assert f"{_PLIDS[1]}:b" not in old  # another link: none of its runs
