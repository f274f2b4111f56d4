"""Shared subscriptions in the delivery core (router/groups.py): members split the messages, each
message is handed to one member at a time and accepted once; what a member leaves goes to another."""

from __future__ import annotations

import pytest

from oncemesh.common import errors
from oncemesh.common.ids import publisher_link_id, shared_subscription_id, subscription_id
from oncemesh.common.vocab import Outcome
from oncemesh.router.actions import Deliver, DetachLink, DrainCredit, GrantCredit, SendOutcome, SettleDelivery
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.groups import group_key
from oncemesh.router.state import S
from oncemesh.router.subscriptions import SubscriptionTable, SubState

PL = publisher_link_id("pub", "p")
G = shared_subscription_id("", "work", "t")


class Shared:
    """A core with one publisher on topic t and shared subscription "work" on it."""

    def __init__(self, **cfg: object) -> None:
        self.core = DeliveryCore("R", SubscriptionTable(), CoreConfig(**cfg))  # type: ignore[arg-type]
        self.now = 0.0
        self.pub_link = object()
        self.core.attach_publisher(self.pub_link, PL, "t", True, None, self.now)
        self.n = 0
        self.links: dict[str, object] = {}
        self.take()

    def take(self) -> list[object]:
        out, self.core.out = self.core.out, []
        return [a for a in out if not isinstance(a, GrantCredit)]

    def member(self, container: str, name: str = "work|global", credit: int = 5, presented: list[str] | None = None,
               selector: str = "", expiry: float = 60.0) -> str:
        mid = subscription_id(container, name, "t")
        link = self.links[mid] = object()
        self.core.attach_subscriber(link, G, "t", "", "work", expiry, False, presented, self.now, selector=selector,
                                    member=mid, member_name=name)
        self.core.subscriber_credit(mid, credit)
        return mid

    def publish(self, n: int = 1) -> list[str]:
        gids = []
        for _ in range(n):
            self.n += 1
            gids.append(self.core.publish(self.pub_link, object(), str(self.n).encode(), b"m", self.now))
        return gids

    def outcome(self, mid: str, gid: str, o: Outcome = Outcome.ACCEPTED, settled: bool = False) -> None:
        self.core.subscriber_outcome(mid, gid, o, settled, None, False, self.now)


def handed(acts: list[object]) -> list[tuple[str, str]]:
    return [(a.sid, a.gid) for a in acts if isinstance(a, Deliver)]


def test_group_key_follows_qpid_jms_link_names_and_capabilities() -> None:
    assert group_key("sub", ["topic"], "c1") is None
    assert group_key("sub", ["shared"], "c1") == ("c1", "sub")
    assert group_key("sub|2", ["shared"], "c1") == ("c1", "sub")
    assert group_key("sub|global2", ["shared", "global"], "c1") == ("", "sub")
    assert group_key("sub|global-volatile1", ("shared", "global"), "c9") == ("", "sub")


def test_members_split_the_messages_and_each_is_accepted_once() -> None:
    h = Shared()
    a, b = h.member("ca"), h.member("cb")
    h.take()
    gids = h.publish(6)
    acts = h.take()
    got = handed(acts)
    assert sorted(g for _, g in got) == sorted(gids)  # each handed once
    assert {m for m, _ in got} == {a, b}  # to both members
    for mid, gid in got:
        h.outcome(mid, gid)
    acts = h.take()
    assert [o.outcome for o in acts if isinstance(o, SendOutcome)] == [Outcome.ACCEPTED] * 6
    # one subscription in the table, with one owed part per message
    assert [s.sid for s in h.core.table.live()] == [G]
    for gid in gids:
        assert h.core.records[gid].owed == {G: S.ACCEPTED}
    # the publisher settles: each delivery is settled on the member link that holds it
    for tok in list(h.core.pub_of):
        h.core.publisher_settled(tok, h.now)
    settles = {(a.sid, a.gid) for a in h.take() if isinstance(a, SettleDelivery)}
    assert settles == set(got)


def test_work_follows_credit() -> None:
    h = Shared()
    a = h.member("ca", credit=0)
    b = h.member("cb", credit=3)
    h.take()
    h.publish(5)
    assert {m for m, _ in handed(h.take())} == {b}  # a granted nothing: it gets nothing
    h.core.subscriber_credit(a, 2)
    assert [m for m, _ in handed(h.take())] == [a, a]


def test_a_member_that_detaches_gives_back_what_it_did_not_accept() -> None:
    h = Shared()
    a = h.member("ca", credit=2)
    h.take()
    g1, g2 = h.publish(2)
    assert handed(h.take()) == [(a, g1), (a, g2)]
    h.outcome(a, g1)
    b = h.member("cb", credit=0)
    h.core.detach_subscriber(h.links[a], a, False, h.now, clean=True)
    assert handed(h.take()) == []  # b has no credit yet
    h.core.subscriber_credit(b, 5)
    assert handed(h.take()) == [(b, g2)]  # g1 was accepted by a: never handed again
    assert h.core.records[g2].owed[G] is S.SENT and h.core.records[g1].owed[G] is S.ACCEPTED


def test_a_member_that_drops_holds_its_messages_until_it_returns_and_presents() -> None:
    h = Shared()
    a = h.member("ca", credit=2)
    b = h.member("cb", credit=0)
    h.take()
    g1, g2 = h.publish(2)
    assert handed(h.take()) == [(a, g1), (a, g2)]
    h.core.detach_subscriber(h.links[a], a, False, h.now)  # its connection dropped: in doubt
    h.core.subscriber_credit(b, 5)
    assert handed(h.take()) == []  # nothing of a's goes to b while a may come back
    h.now += 1
    h.member("ca", credit=5, presented=[g1])  # a is back: it accepted g1; g2 goes to anyone
    acts = h.take()
    assert h.core.records[g1].owed[G] is S.ACCEPTED
    assert [g for _, g in handed(acts)] == [g2]


def test_a_dropped_member_is_given_up_after_the_grace() -> None:
    h = Shared(shared_member_grace=10.0)
    a = h.member("ca", credit=1)
    b = h.member("cb", credit=0)
    h.take()
    (g1,) = h.publish(1)
    assert handed(h.take()) == [(a, g1)]
    h.core.detach_subscriber(h.links[a], a, False, h.now)
    h.core.subscriber_credit(b, 5)
    h.now += 9
    h.core.tick(h.now)
    assert handed(h.take()) == []
    h.now += 2
    h.core.tick(h.now)
    assert handed(h.take()) == [(b, g1)]
    assert any(e[0] == "released" and e[3] == G and "left" in str(e[4]) for e in h.core.log)


def test_a_released_message_goes_to_another_member() -> None:
    h = Shared()
    a = h.member("ca", credit=1)
    b = h.member("cb", credit=1)
    h.take()
    (g1,) = h.publish(1)
    ((first, _),) = handed(h.take())
    other = b if first == a else a
    h.outcome(first, g1, Outcome.RELEASED, settled=True)
    assert handed(h.take()) == [(other, g1)]


def test_the_last_member_leaving_suspends_or_ends_the_subscription() -> None:
    h = Shared()
    a, b = h.member("ca"), h.member("cb")
    h.core.detach_subscriber(h.links[a], a, True, h.now, clean=True)  # one member closes: it just leaves
    assert h.core.table.get(G).state is SubState.ACTIVE
    h.core.detach_subscriber(h.links[b], b, False, h.now, clean=True)  # the last one detaches: suspended
    assert h.core.table.get(G).state is SubState.SUSPENDED
    h.member("ca")
    assert h.core.table.get(G).state is SubState.ACTIVE
    h.core.detach_subscriber(h.links[a], a, True, h.now, clean=True)  # the last one closes: unsubscribed
    assert h.core.table.get(G).state is SubState.ENDED
    assert not h.core.member_sid and G not in h.core.groups


def test_members_share_one_selector() -> None:
    from proton import Message

    h = Shared()
    h.member("ca", selector="n > 1")
    with pytest.raises(errors.PreconditionFailed, match="same selector"):
        h.member("cb", selector="n > 2")
    h.member("cb", selector="n > 1")
    h.take()
    for n in (1, 2, 3):
        tok = object()
        h.core.publish(h.pub_link, tok, f"s{n}".encode(), bytes(Message(properties={"n": n}).encode()), h.now)
        if n == 1:
            h.core.publisher_settled(tok, h.now)  # (final: what FIFO waits for before the next is handed)
    assert len(handed(h.take())) == 2


def test_a_member_at_another_router_is_relayed_to_the_home() -> None:
    h = Shared()
    h.member("ca")
    entry = h.core.table.get(G)
    other = DeliveryCore("S", SubscriptionTable())
    other.reachable = {"S": "", "R": ""}
    other.table.merge(entry)
    mid = subscription_id("cb", "work|global", "t")
    with pytest.raises(errors.RelayMember, match="router R") as exc:
        other.attach_subscriber(object(), G, "t", "", "work", 60.0, False, None, 0.0, member=mid,
                                member_name="work|global")
    assert exc.value.home == "R"  # (relayed there: interrouter/members.py; an adapter without a mesh redirects)
    # once R is unreachable (down), the member takes the subscription where it is
    other.reachable = {"S": ""}
    other.attach_subscriber(object(), G, "t", "", "work", 60.0, False, None, 0.0, member=mid,
                            member_name="work|global")
    assert other.table.get(G).home == "S"


def test_moving_away_detaches_every_member() -> None:
    h = Shared()
    a, b = h.member("ca"), h.member("cb")
    h.take()
    newer = h.core.table.get(G)
    assert newer is not None
    from dataclasses import replace

    moved = replace(newer, home="S", epoch=newer.epoch + 5)
    old = h.core.table.merge(moved)
    assert old is not None
    h.core.subscription_changed(old, h.now)
    detached = {a.sid for a in h.take() if isinstance(a, DetachLink)}
    assert detached == {a, b}
    assert not h.core.member_sid


def test_a_member_asking_to_drain_gets_its_credit_used_up() -> None:
    h = Shared()
    a = h.member("ca", credit=0)
    h.take()
    h.core.subscriber_credit(a, 3, drain=True)
    assert [x.sid for x in h.take() if isinstance(x, DrainCredit)] == [a]


def test_a_new_home_hands_nothing_until_the_former_members_came_back_or_the_grace_passed() -> None:
    """The subscription moves (its home is down): what its members accepted there may not be known
    at the new home, so it hands nothing until each member listed there presented, or the grace."""
    h = Shared()
    a, b = h.member("ca"), h.member("cb")
    entry = h.core.table.get(G)
    assert entry is not None and set(entry.members) == {a, b}
    s = Shared(shared_member_grace=5.0)
    s.core.table.merge(entry)  # (R is not reachable from S: the member takes the subscription)
    s.member("ca")
    s.take()
    (g1,) = s.publish(1)
    assert handed(s.take()) == []  # b, a member at R, may have accepted what S does not know of
    s.member("cb", presented=[])
    assert [g for _, g in handed(s.take())] == [g1]
    # and when a former member never comes back: after the grace
    t = Shared(shared_member_grace=5.0)
    t.core.table.merge(s.core.table.get(G))
    t.member("ca")
    t.take()
    (g2,) = t.publish(1)
    assert handed(t.take()) == []
    t.now += 6
    t.core.tick(t.now)
    assert [g for _, g in handed(t.take())] == [g2]


def test_a_home_cut_off_from_the_majority_hands_nothing_and_goes_on_once_it_reaches_it_again() -> None:
    """The lease (`DeliveryCore.lease_held`): a home that has not reached a majority of the mesh within
    `shared_lease` hands nothing (another router may have taken the subscription over); when it
    reaches a majority again, what waited is handed at once, not at some later tick."""
    h = Shared(shared_lease=3.0)
    h.core.set_mesh(3, "1")
    h.core.set_reachable({"R": "1", "S": "1"}, 0.0)  # a majority of 3
    a = h.member("ca")
    h.take()
    h.core.set_reachable({"R": "1"}, 0.5)  # cut off
    h.now = 4.0  # past the lease
    [g] = h.publish(1)
    assert handed(h.take()) == []
    h.core.set_reachable({"R": "1", "T": "1"}, 4.1)  # a majority again
    assert handed(h.take()) == [(a, g)]
