"""Admission (router/admission.py): the pre-authentication bounds and the login throttle, against
simple models, over every sequence of arrivals, departures, failures and clock steps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from oncemesh.router.admission import (
    LoginThrottle,
    PreAuth,
    PreAuthLimits,
    ThrottleLimits,
    passwords_in_clear,
)

SOURCES = st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3"])
USERS = st.sampled_from(["alice", "bob", "mallory", "nobody"])

# one step: ("arrive", conn, source) | ("leave", conn) | ("tick", dt)
PRE_STEPS = st.lists(st.one_of(
    st.tuples(st.just("arrive"), st.integers(0, 30), SOURCES),
    st.tuples(st.just("leave"), st.integers(0, 30)),
    st.tuples(st.just("tick"), st.floats(0, 3)),
), max_size=80)


@given(PRE_STEPS, st.integers(1, 5), st.integers(1, 12), st.floats(0.5, 5))
def test_pre_authentication_slots_never_exceed_their_limits_and_expire_on_time(
        steps: list[tuple], per_source: int, total: int, timeout: float) -> None:
    pre: PreAuth[int] = PreAuth(PreAuthLimits(timeout, per_source, total))
    model: dict[int, tuple[str, float]] = {}
    now = 0.0
    for step in steps:
        if step[0] == "arrive":
            _, conn, source = step
            refused = pre.arrive(conn, source, now)
            if conn in model:
                assert refused is None
                continue
            full = len(model) >= total
            crowded = sum(1 for s, _ in model.values() if s == source) >= per_source
            assert (refused is not None) == (full or crowded), (refused, full, crowded)
            if refused is None:
                model[conn] = (source, now + timeout)
        elif step[0] == "leave":
            assert pre.leave(step[1]) == (step[1] in model)
            model.pop(step[1], None)
        else:
            now += step[1]
        assert len(pre) == len(model) <= total
        for source in {s for s, _ in model.values()}:
            assert pre.from_source(source) == sum(1 for s, _ in model.values() if s == source) <= per_source
        expired = pre.expired(now)
        assert expired == [c for c, (_, d) in model.items() if d <= now]


def test_a_slot_comes_back_when_its_connection_leaves() -> None:
    pre: PreAuth[str] = PreAuth(PreAuthLimits(timeout=10, per_source=2, total=3))
    assert pre.arrive("a", "x", 0) is None and pre.arrive("b", "x", 0) is None
    assert pre.arrive("c", "x", 0) == "preauth_per_source"
    assert pre.arrive("d", "y", 0) is None
    assert pre.arrive("e", "z", 0) == "preauth_total"
    assert pre.leave("a") and not pre.leave("a")
    assert pre.arrive("c", "x", 1) is None
    assert pre.expired(9.9) == [] and pre.expired(10) == ["b", "d"] and pre.expired(11) == ["b", "d", "c"]


# one step: ("fail", source, user) | ("ok", user) | ("tick", dt)
THROTTLE_STEPS = st.lists(st.one_of(
    st.tuples(st.just("fail"), SOURCES, USERS),
    st.tuples(st.just("ok"), USERS),
    st.tuples(st.just("tick"), st.floats(0, 100)),
), max_size=60)


@given(THROTTLE_STEPS, st.integers(0, 6), st.floats(0.1, 5), st.floats(1, 120))
def test_the_throttle_slows_guessing_and_never_locks_anyone_out_for_good(
        steps: list[tuple], free: int, base: float, max_wait: float) -> None:
    lim = ThrottleLimits(free=free, base=base, max_wait=max_wait, forget=1000.0, max_entries=100)
    th = LoginThrottle(lim)
    fails: dict[str, list[float]] = {}  # key -> times of failures since it was last cleared
    now = 0.0
    for step in steps:
        if step[0] == "fail":
            _, source, user = step
            assert th.wait(source, user, now) >= 0
            th.failed(source, user, now)
            for key in ("s:" + source, "u:" + user):
                fails[key] = [t for t in fails.get(key, []) if now - t < lim.forget] + [now]
            n = max(len(fails["s:" + source]), len(fails["u:" + user]))
            if n > free:  # past the free failures, the next login waits, and more with each failure
                assert th.wait(source, user, now) >= min(base * 2 ** (n - free - 1), max_wait) - 1e-9
            else:
                assert th.wait(source, user, now) == 0
        elif step[0] == "ok":
            th.succeeded(step[1])
            fails.pop("u:" + step[1], None)
        else:
            now += step[1]
        for source in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
            for user in ("alice", "bob", "mallory", "nobody"):
                w = th.wait(source, user, now)
                assert 0 <= w <= max_wait + 1e-9  # never longer than max_wait ...
                assert th.wait(source, user, now + w) == 0  # ... and then the owner may log in again
                if not fails.get("s:" + source) and not fails.get("u:" + user):
                    assert w == 0


def test_the_right_password_clears_the_user_not_the_source() -> None:
    th = LoginThrottle(ThrottleLimits(free=2, base=1, max_wait=60))
    for t in range(4):
        th.failed("10.0.0.9", "alice", float(t))
    assert th.wait("10.0.0.9", "alice", 3.0) == 2.0  # 4 failures, 2 free: 1 * 2**1 after the last
    assert th.wait("10.0.0.1", "alice", 3.0) == 2.0  # the user, from anywhere
    assert th.wait("10.0.0.9", "bob", 3.0) == 2.0  # the source, for anyone
    assert th.wait("10.0.0.1", "alice", 5.0) == 0.0  # and then no more
    th.succeeded("alice")
    assert th.wait("10.0.0.1", "alice", 3.0) == 0.0 and th.wait("10.0.0.9", "bob", 3.0) == 2.0


def test_made_up_names_cannot_grow_the_throttle_past_its_bound() -> None:
    th = LoginThrottle(ThrottleLimits(max_entries=50))
    for i in range(1000):
        th.failed(f"10.0.{i // 250}.{i % 250}", f"user{i}", float(i))
    assert len(th) == 100


def test_passwords_in_clear_only_from_loopback_by_default() -> None:
    for source in ("127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1", "[::1]"):
        assert passwords_in_clear("loopback", source), source
    for source in ("10.0.0.1", "192.168.1.5", "2001:db8::1", "::ffff:10.0.0.1", "?", ""):
        assert not passwords_in_clear("loopback", source), source
    assert passwords_in_clear("allow", "10.0.0.1") and not passwords_in_clear("refuse", "127.0.0.1")
