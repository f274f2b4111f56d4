"""The keepers of MQTT sessions (interrouter/keeper.py): which router keeps a session, the image and
its acknowledgement over the member sessions, another keeper when one fails, the newest image
found by a fetch, and the strict decoding of the messages."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncemesh.interrouter.channel import Sessions
from oncemesh.interrouter.keeper import (
    ACK_TIMEOUT,
    FETCH_TIMEOUT,
    Keeper,
    KeepFetch,
    KeepImage,
    KeepPut,
    keeper_of,
)
from oncemesh.interrouter.members import msg_from_list, msg_to_list
from oncemesh.interrouter.strict import FrameError


class Net:
    """Routers' keepers joined by their member sessions; `run` carries frames until none is left
    (`lost`: routers whose frames vanish)."""

    def __init__(self, *ids: str) -> None:
        self.k: dict[str, Keeper] = {r: Keeper(r, Sessions()) for r in ids}
        self.lost: set[str] = set()
        for r, k in self.k.items():
            k.set_reachable([o for o in ids if o != r], 0.0)

    def run(self, now: float = 0.0) -> None:
        moved = True
        while moved:
            moved = False
            for r, k in self.k.items():
                out, k.sessions.out = k.sessions.out, []
                for f in out:
                    moved = True
                    if f.dst in self.lost or r in self.lost:
                        continue
                    ready, _ = self.k[f.dst].sessions.receive(r, f.epoch, f.seq, f.ack_epoch, f.ack, f.msg, now)
                    for msg in ready:
                        self.k[f.dst].receive(r, msg, now)
            for k in self.k.values():
                k.sessions.flush_acks()


IMAGE: dict[str, Any] = {"owner": "", "nonce": "n", "expiry": 60.0, "next_tag": 3, "seq": 5, "subs": [], "in": [],
                         "out": []}


def test_the_keeper_is_a_fixed_choice_among_the_candidates_that_moves_only_when_it_leaves():
    routers = ["A", "B", "C", "D"]
    chosen = keeper_of("client-1", routers)
    assert chosen in routers and keeper_of("client-1", list(reversed(routers))) == chosen
    others = [r for r in routers if r != chosen]
    assert keeper_of("client-1", [r for r in routers if r != "Z"]) == chosen
    assert keeper_of("client-1", others) != chosen
    assert keeper_of("client-1", []) is None
    assert len({keeper_of(f"c{i}", routers) for i in range(40)}) > 1  # (sessions spread over routers)


def test_an_image_put_is_kept_and_acknowledged():
    net = Net("A", "B", "C")
    a = net.k["A"]
    a.put("c1", 5, IMAGE, 0.0)
    net.run()
    keeper = a.ours["c1"].keeper
    assert keeper in ("B", "C") and net.k[keeper].kept_here["c1"].seq == 5
    assert a.kept == [("c1", 5)] and a.lonely == []


def test_a_keeper_that_does_not_answer_is_replaced_and_the_image_goes_to_another():
    net = Net("A", "B", "C")
    a = net.k["A"]
    first = keeper_of("c1", ["B", "C"])
    assert first is not None
    net.lost.add(first)
    a.put("c1", 5, IMAGE, 0.0)
    net.run(0.0)
    assert a.kept == []
    a.tick(ACK_TIMEOUT + 1)
    net.run(ACK_TIMEOUT + 1)
    other = "B" if first == "C" else "C"
    assert a.ours["c1"].keeper == other and net.k[other].kept_here["c1"].seq == 5 and a.kept == [("c1", 5)]


def test_with_no_other_router_the_session_is_lonely_until_one_comes():
    k = Keeper("A", Sessions())
    k.put("c1", 1, IMAGE, 0.0)
    assert k.lonely == ["c1"] and k.sessions.out == []
    k.lonely.clear()
    k.set_reachable(["B"], 1.0)
    assert [f.dst for f in k.sessions.out] == ["B"] and type(k.sessions.out[0].msg) is KeepPut


def test_a_broken_session_with_the_keeper_sends_the_image_again():
    net = Net("A", "B")
    a = net.k["A"]
    a.put("c1", 5, IMAGE, 0.0)
    net.run()
    a.kept.clear()
    a.session_broken("B", 1.0)
    net.run(1.0)
    assert a.kept == [("c1", 5)]


def test_a_fetch_takes_the_newest_image_and_ends_at_its_timeout_when_routers_are_silent():
    net = Net("A", "B", "C")
    net.k["B"].receive("X", KeepPut("c1", 4, '{"expiry": null, "seq": 4}'), 0.0)
    net.k["C"].receive("Y", KeepPut("c1", 9, '{"expiry": null, "seq": 9}'), 0.0)
    for k in net.k.values():
        k.sessions.out.clear()
    a = net.k["A"]
    a.fetch("c1", 1.0)
    net.run(1.0)
    assert a.fetched == [("c1", {"expiry": None, "seq": 9})]
    a.fetched.clear()
    net.lost.add("B")
    a.fetch("c2", 2.0)
    net.run(2.0)
    assert a.fetched == []
    a.tick(2.0 + FETCH_TIMEOUT)
    assert a.fetched == [("c2", None)]


def test_a_dropped_session_is_forgotten_by_its_keeper_and_an_older_put_does_not_overwrite_a_newer():
    net = Net("A", "B")
    a, b = net.k["A"], net.k["B"]
    a.put("c1", 5, IMAGE, 0.0)
    net.run()
    b.receive("A", KeepPut("c1", 3, '{"expiry": 1}'), 0.0)
    assert b.kept_here["c1"].seq == 5
    a.drop("c1", 1.0)
    net.run(1.0)
    assert "c1" not in b.kept_here


@given(st.one_of(
    st.builds(KeepPut, st.text(max_size=8), st.integers(0, 2**40), st.one_of(st.none(), st.text(max_size=20))),
    st.builds(KeepImage, st.text(max_size=8), st.integers(0, 2**40), st.one_of(st.none(), st.text(max_size=20))),
    st.builds(KeepFetch, st.text(max_size=8))))
def test_keeper_messages_round_trip_through_the_member_codec(m):
    assert msg_from_list(msg_to_list(m)) == m


@pytest.mark.parametrize("bad", [["KP", "c", -1, None], ["KP", "c", 1], ["KA", 5, 1], ["KI", "c", 1, 7],
                                 ["KF"], ["KP", "c", True, None]])
def test_malformed_keeper_messages_are_refused(bad):
    with pytest.raises(FrameError):
        msg_from_list(bad)


def test_a_kept_session_whose_home_is_out_of_reach_is_said_orphaned_once_until_put_again():
    """The keeper says what the session's publisher links would declare (router/core.py,
    `publisher_gone`) once its home is gone: once per image, and again after a newer Put."""
    net = Net("A", "B", "C")
    a = net.k["A"]
    a.put("c1", 5, IMAGE, 0.0)
    net.run()
    keeper = net.k[a.ours["c1"].keeper or ""]
    other = "C" if keeper.me == "B" else "B"
    keeper.set_reachable([other], 1.0)
    assert keeper.orphaned == [("c1", IMAGE)]
    keeper.orphaned.clear()
    keeper.set_reachable([other], 2.0)  # (the same view again: said once)
    assert keeper.orphaned == []
    keeper.set_reachable(["A", other], 3.0)
    a.put("c1", 6, {**IMAGE, "seq": 6}, 3.0)  # (the home is back and puts a newer image)
    net.run(3.0)
    keeper.set_reachable([other], 4.0)
    assert keeper.orphaned == [("c1", {**IMAGE, "seq": 6})]
    assert net.k[other].orphaned == []  # (only the keeper holds it)


def test_a_keeper_left_behind_is_the_keeper_again_when_the_home_reaches_it_and_holds_the_newest():
    """The home kept the session at K1, could not reach K1 for a while and kept it at K2: K1's copy
    is older than K2's. When the home reaches K1 again, K1 is its keeper again (the choice is a
    function of the reachable set) and gets the newest image; K2 drops its copy only once K1
    acknowledged it. A client resuming near K1 is never restored from the stale copy (old names
    and packet ids: duplicates), and there is a current copy at every moment."""
    net = Net("H", "X", "Y")
    h = net.k["H"]
    h.put("c1", 5, IMAGE, 0.0)
    net.run()
    k1 = h.ours["c1"].keeper or ""
    k2 = "Y" if k1 == "X" else "X"
    h.set_reachable([k2], 1.0)  # (K1 out of reach: the session goes to K2)
    net.run(1.0)
    assert h.ours["c1"].keeper == k2 and net.k[k2].kept_here["c1"].seq == 5
    h.put("c1", 9, {**IMAGE, "seq": 9}, 2.0)
    net.run(2.0)
    assert net.k[k1].kept_here["c1"].seq == 5  # (not reachable: still there)
    net.lost.add(k1)  # (K1's acknowledgement is late: K2 keeps its copy meanwhile)
    h.set_reachable([k1, k2], 3.0)
    net.run(3.0)
    assert h.ours["c1"].keeper == k1 and net.k[k2].kept_here["c1"].seq == 9
    net.lost.discard(k1)
    h.tick(3.5)
    h.sessions.tick(4.0)  # (the member session sends again what was not acknowledged)
    net.run(4.0)
    assert net.k[k1].kept_here["c1"].seq == 9 and "c1" not in net.k[k2].kept_here
    assert h.ours["c1"].keeper == k1 and not h.ours["c1"].former


def test_a_keeper_drops_its_copy_when_the_same_life_of_the_home_is_back_and_keeps_it_for_a_new_one():
    """Out of reach, the home may have kept its sessions elsewhere: when the same life comes back it
    holds them (and puts them again where they are kept), so this copy goes; a new life lost them,
    and this copy is what is left (a client resuming fetches it)."""
    for back_as, kept in (("h1", False), ("h2", True)):
        net = Net("H", "K")
        k = net.k["K"]
        k.set_reachable(["H"], 0.0, {"H": "h1"})
        net.k["H"].put("c1", 5, IMAGE, 0.0)
        net.run()
        assert k.kept_here["c1"].home_inc == "h1"
        k.set_reachable([], 1.0, {})
        assert "c1" in k.kept_here and k.orphaned == [("c1", IMAGE)]
        k.set_reachable(["H"], 2.0, {"H": back_as})
        assert ("c1" in k.kept_here) is kept, back_as


def test_a_fetch_asks_routers_beyond_the_neighbours_so_a_session_kept_far_away_is_found():
    # line3 A - B - C: B's session is kept at C (its neighbour); B dies and the client resumes at A,
    # whose only neighbour is B: without asking C (two hops away) the session would begin anew
    net = Net("A", "B", "C")
    b, a = net.k["B"], net.k["A"]
    b.set_reachable(["C"], 0.0)
    b.put("c1", 7, {**IMAGE, "seq": 7}, 0.0)
    net.run()
    assert net.k["C"].kept_here["c1"].seq == 7
    net.lost.add("B")
    a.set_reachable([], 1.0, fetchable=[])  # (B gone: A has no neighbour left that keeps sessions)
    a.set_reachable([], 1.0, fetchable=["C"])  # (C reachable over another path)
    a.fetch("c1", 1.0)
    net.run(1.0)
    assert a.fetched == [("c1", {**IMAGE, "seq": 7})]
    # only the neighbours would have missed it
    a.fetched.clear()
    a.set_reachable([], 2.0, fetchable=[])
    a.fetch("c1", 2.0)
    assert a.fetched == [("c1", None)]


def test_a_router_that_does_not_know_its_peers_yet_answers_no_fetch_and_asks_those_that_come():
    # a router just restarted: nobody reachable yet; a fetch must wait for its peers, not begin the
    # session anew at once (and not at FETCH_TIMEOUT either while the peers are still unknown)
    net = Net("A", "B")
    net.k["B"].receive("X", KeepPut("c1", 4, '{"expiry": null, "seq": 4}'), 0.0)
    net.k["B"].sessions.out.clear()
    a = net.k["A"]
    a.set_reachable([], 0.0)
    a.ready = False
    a.fetch("c1", 0.0)
    a.tick(10 * FETCH_TIMEOUT)
    assert a.fetched == [] and "c1" in a.fetches
    a.set_reachable(["B"], 11 * FETCH_TIMEOUT)  # (B comes: asked now)
    net.run(11 * FETCH_TIMEOUT)
    assert a.fetched == []  # (answered, but the peers are not all known yet)
    a.set_ready(11 * FETCH_TIMEOUT)
    assert a.fetched == [("c1", {"expiry": None, "seq": 4})]


def test_a_router_that_learns_its_peers_with_nobody_reachable_begins_the_session_anew_then():
    net = Net("A")
    a = net.k["A"]
    a.set_reachable([], 0.0)
    a.ready = False
    a.fetch("c1", 0.0)
    assert a.fetched == []
    a.set_ready(5.0)
    assert a.fetched == [("c1", None)]


def test_a_router_that_becomes_reachable_during_a_fetch_is_asked_too():
    net = Net("A", "B", "C")
    net.k["C"].receive("X", KeepPut("c1", 9, '{"expiry": null, "seq": 9}'), 0.0)
    net.k["C"].sessions.out.clear()
    a = net.k["A"]
    net.lost.add("B")  # (B is silent: the fetch stays open)
    a.set_reachable(["B"], 1.0)
    a.fetch("c1", 1.0)
    net.run(1.0)
    assert a.fetched == []
    a.set_reachable(["B", "C"], 1.5)
    net.run(1.5)
    a.tick(1.0 + FETCH_TIMEOUT)
    assert a.fetched == [("c1", {"expiry": None, "seq": 9})]


def test_a_patient_fetch_waits_for_the_routers_out_of_reach_and_takes_the_newer_copy_behind_them():
    # A holds the client's session from a connection that ended; C (out of reach now) holds a newer
    # one (the client went on there): a patient fetch waits for C instead of ending with nothing
    from oncemesh.interrouter.keeper import RESUME_WAIT

    net = Net("A", "C")
    net.k["C"].receive("X", KeepPut("c1", 9, '{"expiry": null, "seq": 9}'), 0.0)
    net.k["C"].sessions.out.clear()
    a = net.k["A"]
    a.others = frozenset({"C"})
    a.set_reachable([], 0.0)
    a.fetch("c1", 0.0, patient=True)
    a.tick(FETCH_TIMEOUT + 1.0)
    assert a.fetched == []  # (not given up at FETCH_TIMEOUT: C is out of reach)
    a.set_reachable(["C"], 3.0)
    net.run(3.0)
    assert a.fetched == [("c1", {"expiry": None, "seq": 9})]
    # one that never comes: ends at RESUME_WAIT; an impatient one at once
    a.fetched.clear()
    a.set_reachable([], 4.0)
    a.fetch("c2", 4.0, patient=True)
    a.tick(4.0 + RESUME_WAIT - 0.1)
    assert a.fetched == []
    a.tick(4.0 + RESUME_WAIT)
    assert a.fetched == [("c2", None)]
    a.fetched.clear()
    a.fetch("c3", 20.0)
    assert a.fetched == [("c3", None)]


def test_a_copy_kept_here_whose_home_went_out_of_reach_is_restored_only_patiently():
    # A kept H's session; A was cut off (H out of reach: the copy is marked lost) and H kept it at C
    # since: A must not resume its copy before it could ask C (line3 seed 5: a false PUBCOMP)
    from oncemesh.interrouter.keeper import RESUME_WAIT

    net = Net("A", "C")
    a = net.k["A"]
    a.others = frozenset({"C", "H"})
    a.receive("H", KeepPut("c1", 4, '{"expiry": null, "seq": 4}'), 0.0)
    net.k["C"].receive("H", KeepPut("c1", 9, '{"expiry": null, "seq": 9}'), 0.0)
    for k in net.k.values():
        k.sessions.out.clear()
    a.set_reachable([], 1.0)  # (H and C out of reach)
    assert a.kept_here["c1"].lost
    a.fetch("c1", 1.0)
    a.tick(1.0 + FETCH_TIMEOUT + 1.0)
    assert a.fetched == []
    a.set_reachable(["C"], 5.0)
    net.run(5.0)
    a.tick(5.0 + FETCH_TIMEOUT)
    a.tick(1.0 + RESUME_WAIT)
    assert a.fetched == [("c1", {"expiry": None, "seq": 9})]


def test_a_lost_copy_whose_home_alone_is_gone_is_restored_at_once():
    # the common failover: the home died, every other router still answers: nobody holds a newer copy
    net = Net("A", "C")
    a = net.k["A"]
    a.others = frozenset({"C", "H"})
    a.receive("H", KeepPut("c1", 4, '{"expiry": null, "seq": 4}'), 0.0)
    a.sessions.out.clear()
    a.set_reachable(["C"], 1.0)  # (H gone)
    assert a.kept_here["c1"].lost
    a.fetch("c1", 1.0)
    net.run(1.0)
    assert a.fetched == [("c1", {"expiry": None, "seq": 4})]
