"""Delivery core, total order: numbers from the sequencer decide the hand-over order and which
subscriptions a message is owed to (the mesh layer's sequencer is played by hand here)."""

from __future__ import annotations

from oncemesh.common.ids import publisher_link_id, subscription_id
from oncemesh.common.vocab import Outcome
from oncemesh.router.actions import (
    Deliver,
    SendAck,
    SendOutcome,
    SendQuery,
    SubmitOrder,
)
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.order.total import start_key
from oncemesh.router.state import HELD, S
from oncemesh.router.subscriptions import SubscriptionTable

T = "t"
PL = publisher_link_id("pub", "p")


class Total:
    """One core whose topic `t` is in total order, and a counter playing the sequencer."""

    def __init__(self, router: str = "R", mesh: bool = False) -> None:
        self.core = DeliveryCore(router, SubscriptionTable(), CoreConfig(total_topics=frozenset({T})))
        if mesh:  # in a mesh with origin A: numbers not here are asked about
            self.core.mesh_size = 2
            self.core.reachable = {"A": "1", router: ""}
        self.now = 0.0
        self.n = 0
        self.pub_link = object()
        self.core.attach_publisher(self.pub_link, PL, T, True, None, self.now)
        self.core.out.clear()

    def take(self) -> list[object]:
        out, self.core.out = self.core.out, []
        return out

    def number(self, key: str) -> list[object]:
        self.n += 1
        self.core.ordered(T, self.n, key, self.now)
        return self.take()

    def sub(self, name: str, handed_last: tuple[str, ...] = (), capable: bool = True,
            link: object | None = None) -> tuple[str, object, list[object]]:
        sid = subscription_id("c", name, T)
        link = link or object()
        self.core.attach_subscriber(link, sid, T, "c", name, 60.0, capable, None, self.now,
                                    handed_last=handed_last)
        self.core.subscriber_credit(sid, 100)
        return sid, link, self.take()

    def start(self, sid: str) -> list[object]:
        sub = self.core.table.get(sid)
        assert sub is not None
        return self.number(start_key(sid, sub.created))

    def publish(self, tag: bytes) -> tuple[object, str, list[object]]:
        tok = object()
        self.core.pub_links[self.pub_link].outstanding += 1
        self.core.reserved_credit += 1
        gid = self.core.publish(self.pub_link, tok, tag, b"body-" + tag, self.now)
        return tok, gid, self.take()


def delivered(acts: list[object]) -> list[str]:
    return [a.gid for a in acts if isinstance(a, Deliver)]


def outcomes(acts: list[object]) -> list[SendOutcome]:
    return [a for a in acts if isinstance(a, SendOutcome)]


def test_a_new_subscription_asks_for_its_start_and_gets_nothing_before_it_is_numbered() -> None:
    t = Total()
    sid, _, acts = t.sub("a")
    sub = t.core.table.get(sid)
    assert sub is not None
    assert SubmitOrder(T, start_key(sid, sub.created)) in acts
    _, gid, acts = t.publish(b"1")
    assert SubmitOrder(T, gid) in acts and not delivered(acts)
    assert not delivered(t.number(gid))  # numbered before the subscription started: not owed
    assert t.core.records.get(gid) is None or t.core.records[gid].owed.get(sid) is not S.QUEUED


def test_messages_are_handed_in_number_order_not_arrival_order() -> None:
    t = Total()
    sid, _, _ = t.sub("a")
    t.start(sid)
    _, g1, acts1 = t.publish(b"1")
    _, g2, acts2 = t.publish(b"2")
    assert not delivered(acts1 + acts2)  # not numbered yet
    assert delivered(t.number(g2)) == [g2]
    assert delivered(t.number(g1)) == [g1]


def test_an_unnumbered_message_holds_back_nothing_but_is_not_handed() -> None:
    t = Total()
    sid, _, _ = t.sub("a")
    t.start(sid)
    _, g1, _ = t.publish(b"1")
    _, g2, _ = t.publish(b"2")
    assert delivered(t.number(g1)) == [g1]
    assert t.core.records[g2].tnum is None and t.core.records[g2].owed[sid] is S.QUEUED
    assert delivered(t.number(g2)) == [g2]


def test_the_publisher_is_told_only_after_the_number_decides_who_is_owed() -> None:
    t = Total()
    tok, gid, acts = t.publish(b"1")
    assert not outcomes(acts)  # nobody subscribed, yet a subscription started before it may exist
    [o] = outcomes(t.number(gid))
    assert o.outcome is Outcome.ACCEPTED and o.pub is tok


def test_a_subscription_started_before_the_number_is_owed_even_if_the_table_had_it_later() -> None:
    t = Total()
    tok, gid, _ = t.publish(b"1")  # no subscription in the table yet
    sid, _, _ = t.sub("a")
    t.start(sid)
    acts = t.number(gid)
    assert delivered(acts) == [gid] and not outcomes(acts)
    t.core.subscriber_outcome(sid, gid, Outcome.ACCEPTED, False, None, False, t.now)
    [o] = outcomes(t.take())
    assert o.outcome is Outcome.ACCEPTED


def test_a_subscription_started_after_the_number_is_not_owed_it() -> None:
    t = Total()
    sid, _, _ = t.sub("a")
    tok, gid, _ = t.publish(b"1")  # in the table when it came, started after it in the order
    acts = t.number(gid)
    t.start(sid)
    assert not delivered(acts)
    [o] = outcomes(acts)
    assert o.outcome is Outcome.ACCEPTED
    assert ("ended", gid, T, sid, "total: subscribed after it in the order") in t.core.log


def test_a_destination_acks_ended_for_a_subscription_started_after_the_number() -> None:
    t = Total("B")
    sid, _, _ = t.sub("a")
    gid = PL + ":x1"
    t.number(gid)  # known before the copy comes, and before the subscription's start
    t.start(sid)
    t.core.receive_copy("A", "1", gid, T, [sid], b"p", t.now)
    acts = t.take()
    assert SendAck("A", gid, sid, int(S.ENDED), None) in acts and not delivered(acts)


def test_a_destination_hands_copies_in_number_order() -> None:
    t = Total("B")
    sid, _, _ = t.sub("a")
    t.start(sid)
    g1, g2 = PL + ":x1", PL + ":x2"
    t.core.receive_copy("A", "1", g2, T, [sid], b"p2", t.now)
    t.core.receive_copy("A", "1", g1, T, [sid], b"p1", t.now)
    acts = t.take()
    assert SendAck("A", g1, sid, HELD, None) in acts and not delivered(acts)
    assert delivered(t.number(g2)) == [g2]  # number 2, the next after its start
    assert delivered(t.number(g1)) == [g1]


def test_a_number_whose_message_is_not_here_holds_the_next_until_its_final() -> None:
    t = Total("B", mesh=True)
    sid, _, _ = t.sub("a")
    t.start(sid)
    g1, g2 = PL + ":x1", PL + ":x2"
    t.number(g1)  # its copy has not come
    t.number(g2)
    t.core.receive_copy("A", "1", g2, T, [sid], b"p2", t.now)
    acts = t.take()
    assert not delivered(acts)
    assert t.core.stats()["total_holds"] > 0
    # g1's FINAL (its part for this subscription was resolved elsewhere) releases g2
    t.core.handle_final(g1, t.now)
    t.now += 1.0
    t.core.tick(t.now)
    assert delivered(t.take()) == [g2]


def test_a_number_its_publisher_attached_here_settled_does_not_hold_the_next() -> None:
    """Nobody else may remember g1 was final (they restarted, or their memory of finals ended):
    its publisher, attached here, declared it settled (not in doubt, below its next seq)."""
    t = Total("B", mesh=True)
    sid, _, _ = t.sub("a")
    t.start(sid)
    pl = publisher_link_id("pub2", "p")
    g1, g2 = pl + ":1", pl + ":2"
    t.number(g1)
    t.number(g2)
    t.core.receive_copy("A", "1", g2, T, [sid], b"p2", t.now)
    assert not delivered(t.take())
    t.core.attach_publisher(object(), pl, T, True, [], t.now, 3)  # (in doubt: nothing; next seq 3)
    t.now += 1.0
    t.core.tick(t.now)
    assert delivered(t.take()) == [g2]


def test_a_copy_that_comes_late_is_handed_in_order_once_it_is_here() -> None:
    t = Total("B", mesh=True)
    sid, _, _ = t.sub("a")
    t.start(sid)
    g1, g2 = PL + ":x1", PL + ":x2"
    t.number(g1)
    t.number(g2)
    t.core.receive_copy("A", "1", g2, T, [sid], b"p2", t.now)
    assert not delivered(t.take())
    t.core.receive_copy("A", "1", g1, T, [sid], b"p1", t.now)
    assert delivered(t.take()) == [g1, g2]


def test_a_resumed_subscription_goes_on_after_what_its_client_says_it_was_handed() -> None:
    t = Total("B", mesh=True)
    sid, link, _ = t.sub("a")
    t.start(sid)
    g1, g2 = PL + ":x1", PL + ":x2"
    t.number(g1)
    t.number(g2)
    # the router restarted (a new core learns the numbering again); only g2 is held here now
    t2 = Total("B")
    t2.core = DeliveryCore("B", t.core.table, CoreConfig(total_topics=frozenset({T})))
    t2.core.mesh_size = 2
    t2.core.reachable = {"A": "1", "B": ""}
    for n, key in t.core.total[T].seq.items():
        t2.core.ordered(T, n, key, t2.now)
    t2.core.receive_copy("A", "1", g2, T, [sid], b"p2", t2.now)
    t2.take()
    t2.core.attach_subscriber(object(), sid, T, "c", "a", 60.0, True, None, t2.now, handed_last=(g1,))
    t2.core.subscriber_credit(sid, 10)
    assert delivered(t2.take()) == [g2]  # g1 was handed (and accepted): it does not wait for it


def test_redelivery_after_a_resume_keeps_the_number_order() -> None:
    t = Total()
    sid, link, _ = t.sub("a")
    t.start(sid)
    _, g1, _ = t.publish(b"1")
    _, g2, _ = t.publish(b"2")
    t.number(g2)
    t.number(g1)  # order: g2, g1
    t.core.detach_subscriber(link, sid, False, t.now)  # both were sent, neither accepted
    t.take()
    _, _, acts = t.sub("a")
    assert delivered(acts) == [g2, g1]


def test_a_start_numbered_before_the_table_entry_arrives_still_makes_the_message_owed() -> None:
    t = Total("A")
    tok, gid, _ = t.publish(b"1")
    t.number(start_key("remote-sub-00001", 5.0))  # number 1; its entry is not in the table yet
    acts = t.number(gid)  # number 2
    assert not outcomes(acts)  # owed to it: the publisher waits
    assert t.core.records[gid].owed["remote-sub-00001"] is S.QUEUED


def test_a_backlog_whose_publisher_left_is_asked_about_at_once_not_one_by_one() -> None:
    """Messages of ours whose publisher left (it may have resent them elsewhere) are handed only
    after the mesh was asked and had `stale_wait` to answer. Asked one at a time, in number order,
    a backlog of thousands took `stale_wait` each (chaos triangle, seed 11): the walk asks ahead."""
    t = Total("B", mesh=True)
    t.now = 100.0  # (records made at time 0 would count as asked about at 0)
    sid, _, _ = t.sub("a")
    t.start(sid)
    t.core.subscriber_credit(sid, 0)
    gids = []
    for i in range(20):
        _, gid, _ = t.publish(f"m{i}".encode())
        t.number(gid)
        gids.append(gid)
    t.core.detach_publisher(t.pub_link)  # its publisher left us
    t.take()
    t.core.subscriber_credit(sid, 100)
    acts = t.take()
    assert not delivered(acts)
    asked = {a.gid for a in acts if isinstance(a, SendQuery)}
    assert asked == set(gids)  # all of them at once
    t.now += t.core.cfg.stale_wait + 0.01
    t.core.tick(t.now)
    assert delivered(t.take()) == gids  # one wait for the whole backlog, in number order
