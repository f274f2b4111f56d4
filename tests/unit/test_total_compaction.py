"""Compaction of a total-order topic's numbering: `router.order.total` (`TotalStream.compact`,
`checkpoint`, `restore`, `below_base`) and the delivery core's side of it (`DeliveryCore.total_floor`,
`total_compact`, `total_restore`, the walk after a checkpoint). The order streams' side is in
test_order_lamport.py and test_order_sequencer.py; the whole is in the simulators.

The promise: a router that goes on from a checkpoint decides exactly as one that learned every
number (who is owed a message, in which order it is handed), hands nothing numbered at or below it,
and numbers are compacted only once no router needs them (`total_floor`).
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from oncemesh.common.ids import counter_tag, global_id, publisher_link_id
from oncemesh.common.vocab import Outcome
from oncemesh.router.actions import Deliver
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.order.total import Checkpoint, TotalStream, parse_start, start_key
from tests.unit.test_core_total import PL, T, Total, delivered

PLIDS = [publisher_link_id("pub", f"p{i}") for i in range(3)]
SIDS = [f"sid-{i}" for i in range(3)]


@st.composite
def numberings(draw: st.DrawFn) -> tuple[list[str], int, set[tuple[str, str]]]:
    """Keys numbered 1..N (messages of three publisher links, mostly in their counter order, and
    starts of subscription lives), a compaction point, and the lives that ended before it."""
    keys: list[str] = []
    nxt = dict.fromkeys(PLIDS, 0)
    lives: list[tuple[str, float]] = []
    for _ in range(draw(st.integers(1, 40))):
        if draw(st.integers(0, 4)) == 0:
            sid = draw(st.sampled_from(SIDS))
            created = float(len(keys))
            lives.append((sid, created))
            keys.append(start_key(sid, created))
        else:
            p = draw(st.sampled_from(PLIDS))
            seq = nxt[p] - draw(st.integers(0, 1)) * draw(st.integers(0, 2))  # now and then an older one
            seq = max(seq, 0)
            gid = global_id(p, counter_tag(seq))
            if gid in keys:
                continue
            keys.append(gid)
            nxt[p] = max(nxt[p], seq + 1)
    cut = draw(st.integers(0, len(keys)))
    ended = {(sid, repr(c)) for sid, c in lives if draw(st.booleans())}
    return keys, cut, ended


def learned(keys: list[str]) -> TotalStream:
    ts = TotalStream()
    for n, k in enumerate(keys, 1):
        assert ts.learn(n, k)
    return ts


@settings(max_examples=300, deadline=None)
@given(numberings())
def test_a_stream_restored_from_a_checkpoint_answers_as_one_that_learned_everything(
        case: tuple[list[str], int, set[tuple[str, str]]]) -> None:
    keys, cut, ended = case
    full = learned(keys)
    compacted = learned(keys)
    cp = compacted.compact(cut, lambda sid, life: (sid, life) not in ended)
    assert cp.number == cut == compacted.base and compacted.checkpoint() == cp
    fresh = TotalStream()
    assert fresh.restore(cp) is (cut > 0)
    for n, k in enumerate(keys[cut:], cut + 1):
        assert fresh.learn(n, k)
    assert not fresh.learn(cut, keys[cut - 1]) if cut else True  # numbers below the checkpoint are known
    for ts in (compacted, fresh):
        assert ts.top == full.top and ts.seq == {n: k for n, k in full.seq.items() if n > cut}
        assert ts.num == {g: n for g, n in full.num.items() if n > cut}
        for life, s in full.start.items():
            if life not in ended or s > cut:
                assert ts.start.get(life) == s  # a live life keeps its start, wherever it is
            else:
                assert life not in ts.start  # an ended one compacted away
        for k in keys:
            parsed = parse_start(k)
            if parsed is not None and parsed not in ended:
                sid, life = parsed
                for n in range(cut + 1, len(keys) + 1):
                    assert ts.owed(n, sid, float(life)) == full.owed(n, sid, float(life))
        for n, k in enumerate(keys[:cut], 1):
            if parse_start(k) is None and full.num[k] == n:
                assert ts.below_base(k) is True  # compacted: at or below the base
        for p in PLIDS:
            done = [int(k[-1], 36) for k in keys[:cut] if k.startswith(p)]
            later = global_id(p, counter_tag(100))
            assert ts.below_base(later) is (False if done else None if cut else False)


def test_a_checkpoint_is_as_small_as_what_is_live() -> None:
    ts = TotalStream()
    n = 0
    for i in range(1000):
        n += 1
        ts.learn(n, global_id(PL, counter_tag(i)))
    n += 1
    ts.learn(n, start_key("s", 1.0))
    cp = ts.compact(n, lambda sid, life: True)
    assert cp == Checkpoint(n, ((start_key("s", 1.0), n),), ((PL, 999),))
    assert not ts.seq and not ts.num


# ---------------------------------------------------------------------- the delivery core


def test_the_floor_stays_below_a_message_not_resolved_and_moves_once_it_is_final() -> None:
    t = Total()
    sid, _, _ = t.sub("a")
    t.start(sid)  # number 1
    tok1, g1, _ = t.publish(b"1")
    tok2, g2, _ = t.publish(b"2")
    t.number(g1)
    t.number(g2)
    assert t.core.total_floor(T, t.now) == 1  # both handed, neither accepted
    t.core.subscriber_outcome(sid, g1, Outcome.ACCEPTED, False, None, False, t.now)
    t.take()
    t.now += t.core.cfg.total_pin + 1  # (decided long ago: its publisher may not resend it any more)
    assert t.core.total_floor(T, t.now) == 2
    t.core.subscriber_outcome(sid, g2, Outcome.ACCEPTED, False, None, False, t.now)
    t.take()
    assert t.core.total_floor(T, t.now) == 2  # decided just now: pinned while its publisher may resend it
    t.core.publisher_settled(tok2, t.now)
    t.core.publisher_settled(tok1, t.now)
    assert t.core.total_floor(T, t.now) == 3  # final: nobody needs numbers 1..3


def test_the_floor_stays_below_a_number_whose_message_the_walk_waits_for() -> None:
    t = Total("B", mesh=True)
    sid, _, _ = t.sub("a")
    t.start(sid)
    g1, g2 = PL + ":x1", PL + ":x2"
    t.number(g1)  # its copy has not come: the walk waits at 2
    t.number(g2)
    assert t.core.total_floor(T, t.now) == 1
    t.core.handle_final(g1, t.now)  # resolved elsewhere: the walk waits at 3 now
    assert t.core.total_floor(T, t.now) == 2
    t.core.handle_final(g2, t.now)
    assert t.core.total_floor(T, t.now) == 3


def test_a_core_going_on_from_a_checkpoint_hands_the_same_messages_in_the_same_order() -> None:
    """Router B restarts: it is sent a checkpoint at 3 and learns 4.. as B did before; its resumed
    subscription (whose client presents the last message it was handed, number 3) is handed 5, 6 in
    order and nothing numbered at or below 3; it is owed what comes after the checkpoint. A start
    whose life the table does not have (yet) stays in the checkpoint."""
    t = Total("B", mesh=True)
    sid, _, _ = t.sub("a")
    t.start(sid)  # 1
    g = [PL + f":x{i}" for i in range(1, 5)]
    t.number(g[0])  # 2
    t.number(g[1])  # 3
    t.number(start_key("not-here-yet-01", 9.0))  # 4: a life the table does not have yet
    t.number(g[2])  # 5
    t.number(g[3])  # 6
    for gid in g[:2]:
        t.core.total_floor(T, t.now)  # (the walk waits for it: a FINAL answers)
        t.core.handle_final(gid, t.now)
    assert t.core.total_floor(T, t.now) == 4  # the walk waits at 5 now
    cp = t.core.total_compact(T, 4)
    assert cp.number == 4 and [k for k, _ in cp.starts] == [start_key(sid, t.core.table.get(sid).created),
                                                            start_key("not-here-yet-01", 9.0)]

    b = DeliveryCore("B", t.core.table, CoreConfig(total_topics=frozenset({T})))
    b.mesh_size, b.reachable = 2, {"A": "1", "B": ""}
    b.total_restore(T, cp, t.now)
    for n in (5, 6):
        b.ordered(T, n, t.core.total[T].seq[n], t.now)
    for gid in g[2:]:
        b.receive_copy("A", "1", gid, T, [sid], b"p", t.now)
    b.out.clear()
    b.attach_subscriber(object(), sid, T, "c", "a", 60.0, True, None, t.now, handed_last=(g[1],))
    b.subscriber_credit(sid, 10)
    assert [a.gid for a in b.out if isinstance(a, Deliver)] == g[2:]
    assert b.total[T].owed(5, sid, t.core.table.get(sid).created) and b.total[T].owed(5, "not-here-yet-01", 9.0)


def test_the_start_of_a_life_that_ended_leaves_the_checkpoint() -> None:
    t = Total()
    a, link, _ = t.sub("a")
    t.start(a)
    b, _, _ = t.sub("b")
    t.start(b)
    t.core.detach_subscriber(link, a, True, t.now)  # closed: that life ended
    t.take()
    cp = t.core.total_compact(T, 2)
    assert [k for k, _ in cp.starts] == [start_key(b, t.core.table.get(b).created)]


def test_a_presented_id_of_a_link_the_checkpoint_does_not_name_waits_a_little_then_counts_as_compacted() -> None:
    t = Total("B", mesh=True)
    sid, _, _ = t.sub("a")
    t.start(sid)
    g1 = PL + ":x1"
    t.number(g1)
    t.core.handle_final(g1, t.now)
    cp = t.core.total_compact(T, 2)
    b = Total("B", mesh=True)
    b.core = DeliveryCore("B", t.core.table, CoreConfig(total_topics=frozenset({T})))
    b.core.mesh_size, b.core.reachable = 2, {"A": "1", "B": ""}
    b.core.total_restore(T, cp, b.now)
    g2 = PL + ":x2"
    b.core.ordered(T, 3, g2, b.now)
    b.core.receive_copy("A", "1", g2, T, [sid], b"p", b.now)
    b.take()
    other = publisher_link_id("gone", "p") + ":7"  # its link is not in the checkpoint
    b.core.attach_subscriber(object(), sid, T, "c", "a", 60.0, True, None, b.now, handed_last=(other,))
    b.core.subscriber_credit(sid, 10)
    assert not delivered(b.take())  # it may be numbered after the checkpoint and not learned yet
    b.now += 4 * b.core.cfg.stale_wait + 0.1
    b.core.tick(b.now)
    assert delivered(b.take()) == [g2]


def test_numbers_at_or_below_the_checkpoint_learned_again_change_nothing() -> None:
    """A stream may tell them again (a sequencer that restarted from a lower base re-delivers): the
    core ignores them, hands nothing twice, and goes on with the next number."""
    t = Total()
    sid, _, _ = t.sub("a")
    t.start(sid)
    tok, gid, _ = t.publish(b"1")
    assert delivered(t.number(gid)) == [gid]
    t.core.subscriber_outcome(sid, gid, Outcome.ACCEPTED, False, None, False, t.now)
    t.take()
    t.core.publisher_settled(tok, t.now)
    t.now += t.core.cfg.total_pin + 1
    assert t.core.total_floor(T, t.now) == 2
    t.core.total_compact(T, 2)
    assert t.core.total[T].num == {} and t.core.total[T].seq == {}
    for n, key in ((1, start_key(sid, t.core.table.get(sid).created)), (2, gid)):
        t.core.ordered(T, n, key, t.now)
    assert not delivered(t.take()) and t.core.total[T].top == 2
    _, g2, _ = t.publish(b"2")
    assert delivered(t.number(g2)) == [g2]


def test_a_start_numbered_again_keeps_its_first_number_and_a_gid_its_latest() -> None:
    """A restarted router submits the start of a subscription that attaches there again before it
    learned it: the later number changes nothing. A gid is numbered again only once its first number
    was compacted somewhere (a resend long after): the later number is the one records get."""
    ts = TotalStream()
    k = start_key("s", 1.0)
    ts.learn(1, k)
    ts.learn(2, PL + ":1")
    ts.learn(3, k)
    ts.learn(4, PL + ":1")
    assert ts.start_of("s", 1.0) == 1 and ts.owed(2, "s", 1.0)
    assert ts.num[PL + ":1"] == 4
    ts.compact(2, lambda sid, life: True)
    assert ts.num[PL + ":1"] == 4 and ts.start_of("s", 1.0) == 1
