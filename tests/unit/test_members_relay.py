"""Relayed members of a shared subscription (interrouter/members.py): a member attached at router C
is a member of the group at its home R, through a reliable session; the rules stay in R's core."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncemesh.common.ids import subscription_id
from oncemesh.common.vocab import Outcome
from oncemesh.interrouter.channel import Sessions
from oncemesh.interrouter.members import (
    JOIN_TIMEOUT,
    Credit,
    Disposition,
    Drained,
    Hand,
    Join,
    Joined,
    Left,
    MemberHome,
    MemberMsg,
    Notify,
    Refused,
    Relay,
    Settle,
    msg_from_list,
    msg_to_list,
)
from oncemesh.interrouter.strict import FrameError
from oncemesh.router.actions import Deliver, DetachLink, SendOutcome, SettleDelivery
from oncemesh.router.state import S
from tests.unit.test_shared import G, Shared, handed


class Pair:
    """Home R (a core with shared subscription G, `Shared`) and relay C, their sessions joined by
    `pump` (which may drop frames)."""

    def __init__(self, **cfg: object) -> None:
        self.h = Shared(**cfg)
        self.home_ses: Sessions[MemberMsg] = Sessions()
        self.relay_ses: Sessions[MemberMsg] = Sessions()
        self.home = MemberHome(self.h.core, self.home_ses)
        self.relay = Relay("C", self.relay_ses)
        self.local: list[object] = []  # the core's actions for its own links
        self.drop = 0  # frames to drop, next ones first
        self.pending = False  # the mesh has not acknowledged the subscription's announcement yet

    @property
    def now(self) -> float:
        return self.h.now

    def pump(self) -> None:
        """Move the core's actions and the frames until nothing moves."""
        for _ in range(50):
            moved = False
            for a in self.h.take():
                if getattr(a, "sid", None) in self.home.remote:
                    self.home.perform(a, self.now)  # type: ignore[arg-type]
                else:
                    self.local.append(a)
            self.home.answer(lambda sid: self.pending, self.now)  # (the end of the home's pass)
            for ses, other, src, side in ((self.home_ses, self.relay_ses, "R", "relay"),
                                          (self.relay_ses, self.home_ses, "C", "home")):
                ses.flush_acks()
                frames, ses.out = ses.out, []
                for f in frames:
                    moved = True
                    if self.drop:
                        self.drop -= 1
                        continue
                    ready, broken = other.receive(src, f.epoch, f.seq, f.ack_epoch, f.ack, f.msg, self.now)
                    if broken and side == "home":
                        self.home.relay_lost("C", self.now)
                    for m in ready:
                        if side == "home":
                            self.home.receive("C", m, self.now)
                        else:
                            self.relay.receive("R", m, self.now)
            if not moved and not self.h.core.out:
                return
        raise AssertionError("no quiet after 50 rounds")

    def tick(self, dt: float) -> None:
        self.h.now += dt
        self.home_ses.tick(self.now)
        self.relay_ses.tick(self.now)
        self.relay.tick(self.now)
        self.pump()

    def relayed(self, container: str = "cr", credit: int = 5, presented: tuple[str, ...] = (),
                selector: str = "") -> tuple[str, object]:
        mid = subscription_id(container, "work|global", "t")
        link = object()
        self.relay.attach(link, Join(G, mid, "work|global", "t", "", "work", 60.0, False, selector, "", presented, None),
                          "R", self.now)
        self.relay.credit(mid, credit, False, self.now)
        self.pump()
        return mid, link

    def relay_out(self) -> list[object]:
        out, self.relay.out = self.relay.out, []
        return out


def test_a_relayed_member_and_a_local_one_split_the_messages_and_each_is_accepted_once() -> None:
    p = Pair()
    local = p.h.member("ca")
    mid, _ = p.relayed()
    assert p.relay.answered == [mid]  # the home took the join: the member's ATTACH is answered now
    gids = p.h.publish(6)
    p.pump()
    at_relay = [(a.sid, a.gid) for a in p.relay_out() if isinstance(a, Deliver)]
    at_home = handed(p.local)
    assert {m for m, _ in at_relay} == {mid} and {m for m, _ in at_home} == {local}
    assert sorted(g for _, g in at_relay + at_home) == sorted(gids)  # each handed once, to one member
    p.local.clear()
    for _, gid in at_relay:
        p.relay.disposition(mid, gid, Outcome.ACCEPTED, False, None, False, p.now)
    for _, gid in at_home:
        p.h.outcome(local, gid)
    p.pump()
    assert [a.outcome for a in p.local if isinstance(a, SendOutcome)] == [Outcome.ACCEPTED] * 6
    for gid in gids:
        assert p.h.core.records[gid].owed == {G: S.ACCEPTED}
    for tok in list(p.h.core.pub_of):
        p.h.core.publisher_settled(tok, p.now)
    p.pump()
    assert {(a.sid, a.gid) for a in p.relay_out() if isinstance(a, SettleDelivery)} == set(at_relay)
    assert not p.relay.members[mid].held


def test_a_join_is_answered_only_once_the_mesh_acknowledged_its_subscription() -> None:
    """As a local ATTACH: the subscription is in force from the answer, and origins owe it messages
    only once they know of it (the simulator found a false ACCEPTED without this)."""
    p = Pair()
    p.pending = True
    mid, _ = p.relayed()
    assert p.relay.answered == [] and p.home.waiting == {G: [("C", mid)]}
    p.pending = False
    p.home.attach_done(G, None, p.now)
    p.pump()
    assert p.relay.answered == [mid]


def test_frames_lost_on_the_way_are_sent_again_and_nothing_is_lost() -> None:
    p = Pair()
    mid, _ = p.relayed()
    gids = p.h.publish(3)
    p.drop = 2  # the first hand-overs vanish on the way
    p.pump()
    got = [a.gid for a in p.relay_out() if isinstance(a, Deliver)]
    assert len(got) < 3
    p.tick(1.0)  # the session sends what was not acknowledged again
    got += [a.gid for a in p.relay_out() if isinstance(a, Deliver)]
    assert sorted(got) == sorted(gids)
    for gid in gids:
        p.relay.disposition(mid, gid, Outcome.ACCEPTED, False, None, False, p.now)
    p.drop = 1  # one disposition vanishes: it goes again
    p.pump()
    p.tick(1.0)
    assert [a.outcome for a in p.local if isinstance(a, SendOutcome)] == [Outcome.ACCEPTED] * 3


def test_a_broken_session_lets_the_link_go_and_the_member_attaches_again_presenting_what_it_accepted() -> None:
    p = Pair(shared_member_grace=30.0)
    local = p.h.member("ca", credit=0)
    mid, link = p.relayed(credit=5)
    g1, g2 = p.h.publish(2)
    p.pump()
    assert [a.gid for a in p.relay_out() if isinstance(a, Deliver)] == [g1, g2]
    p.relay.disposition(mid, g1, Outcome.ACCEPTED, False, None, False, p.now)  # ... and the session breaks
    p.relay_ses.out.clear()  # (the disposition is lost with it)
    p.home.relay_lost("C", p.now)  # the home: the member's connection dropped: g1, g2 in doubt
    p.relay.session_broken("R", p.now)
    # the relay lets the link go (it holds g2, unaccepted: the home may give it to another member)
    [d] = p.relay_out()
    assert isinstance(d, DetachLink) and (d.link, d.condition) == (link, "amqp:link:redirect")
    assert not p.relay.relays(mid)
    mid2, _ = p.relayed(credit=5, presented=(g1,))  # its client attaches again, presenting g1
    assert mid2 == mid
    p.h.core.subscriber_credit(local, 5)
    p.pump()
    # g1 counted accepted (presented); g2 was not accepted: handed again, to one member only
    assert p.h.core.records[g1].owed == {G: S.ACCEPTED}
    again = [a.gid for a in p.relay_out() if isinstance(a, Deliver)] + [g for _, g in handed(p.local)]
    assert again == [g2]


def test_a_join_the_home_refuses_detaches_the_link_with_its_condition() -> None:
    p = Pair()
    p.h.member("ca", selector="k > 1")
    mid, link = p.relayed(selector="k > 2")  # one subscription, one selector
    [d] = [a for a in p.relay_out() if isinstance(a, DetachLink)]
    assert (d.sid, d.link, d.condition) == (mid, link, "amqp:precondition-failed")
    assert not p.relay.relays(mid) and mid not in p.home.remote


def test_a_join_nobody_answers_is_given_up_with_a_redirect_to_the_home() -> None:
    relay = Relay("C", Sessions())
    link = object()
    relay.attach(link, Join(G, "m1", "work|global", "t", "", "work", 60.0, False, "", "", (), None), "R", 0.0)
    relay.tick(JOIN_TIMEOUT - 0.1)
    assert not relay.out
    relay.tick(JOIN_TIMEOUT)
    [d] = relay.out
    assert isinstance(d, DetachLink) and d.condition == "amqp:link:redirect" and "router R" in d.description


def test_when_the_home_moves_the_link_is_let_go_with_a_redirect() -> None:
    p = Pair()
    mid, link = p.relayed()
    p.relay.home_changed(G, "R", p.now)  # (no change)
    assert not p.relay_out() and p.relay.relays(mid)
    p.relay.home_changed(G, "C", p.now)  # it moved here (or anywhere else): attach again
    [d] = p.relay_out()
    assert isinstance(d, DetachLink) and (d.sid, d.link, d.condition) == (mid, link, "amqp:link:redirect")
    assert not p.relay.relays(mid)


def test_a_hand_over_that_comes_twice_is_delivered_once_on_the_link() -> None:
    relay = Relay("C", Sessions())
    relay.attach(object(), Join(G, "m1", "work|global", "t", "", "work", 60.0, False, "", "", (), None), "R", 0.0)
    relay.receive("R", Joined("m1"), 0.0)
    relay.receive("R", Hand("m1", "g", b"x", False), 0.0)
    relay.receive("R", Hand("m1", "g", b"x", True), 0.0)
    assert [a.gid for a in relay.out if isinstance(a, Deliver)] == ["g"]


def test_a_member_that_leaves_cleanly_gives_back_what_it_did_not_accept() -> None:
    p = Pair()
    local = p.h.member("ca", credit=0)
    mid, link = p.relayed(credit=5)
    g1, g2 = p.h.publish(2)
    p.pump()
    p.relay_out()
    p.relay.disposition(mid, g1, Outcome.ACCEPTED, False, None, False, p.now)
    p.relay.detach(link, mid, False, True, p.now)  # its dispositions first, then the detach
    p.h.core.subscriber_credit(local, 5)
    p.pump()
    assert p.h.core.records[g1].owed == {G: S.ACCEPTED}
    assert handed(p.local) == [(local, g2)]
    assert mid not in p.home.remote


_gid = st.text("abc:0123", min_size=1, max_size=12)
_msgs = st.one_of(
    st.builds(Hand, _gid, _gid, st.binary(max_size=64), st.booleans()),
    st.builds(Disposition, _gid, _gid, st.sampled_from([1, 2, 3, 4]), st.booleans(),
              st.none() | st.tuples(_gid, st.text(max_size=20)), st.booleans()),
    st.builds(Settle, _gid, _gid), st.builds(Credit, _gid, st.integers(0, 10**6), st.booleans()),
    st.builds(Notify, _gid, st.lists(_gid, max_size=4).map(tuple)), st.builds(Drained, _gid),
    st.builds(Joined, _gid), st.builds(Refused, _gid, _gid, st.text(max_size=20)),
    st.builds(Left, _gid, st.booleans(), st.booleans()),
    st.builds(Join, _gid, _gid, _gid, _gid, _gid, _gid, st.sampled_from([0.0, 60.0, float("inf")]), st.booleans(),
              st.text(max_size=10), st.text(max_size=10), st.lists(_gid, max_size=4).map(tuple),
              st.none() | st.integers(0, 10**9)))


@given(_msgs)
def test_every_member_message_goes_through_its_codec_unchanged(m: MemberMsg) -> None:
    assert msg_from_list(msg_to_list(m)) == m


@pytest.mark.parametrize("bad", [[], ["X", "m"], ["S", "m"], ["S", 1, "g"], ["C", "m", -1, False],
                                 ["D", "m", "g", 9, False, None, False], ["H", "m", "g", "!!", False],
                                 ["L", "m", 0, True], "S"])
def test_a_malformed_member_message_is_refused(bad: object) -> None:
    with pytest.raises(FrameError):
        msg_from_list(bad)


def test_a_relay_that_is_gone_holds_its_members_share_in_doubt_until_the_grace_passes() -> None:
    p = Pair(shared_member_grace=30.0)
    local = p.h.member("ca", credit=0)
    mid, _ = p.relayed(credit=5)
    [g] = p.h.publish(1)
    p.pump()
    assert [a.gid for a in p.relay_out() if isinstance(a, Deliver)] == [g]
    p.home.relay_lost("C", p.now)  # C died: it never comes back
    p.h.core.subscriber_credit(local, 5)
    [g2] = p.h.publish(1)
    p.pump()
    assert handed(p.local) == [(local, g2)]  # new messages go to the members still here
    p.local.clear()
    p.h.now += 31.0
    p.h.core.tick(p.now)
    p.pump()
    assert handed(p.local) == [(local, g)]  # what the gone member held: in doubt, then given up
