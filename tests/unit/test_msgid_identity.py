"""Identity by message-id (router/identity.py, rules 5-9; docs/clients.md, "Identity by message-id"):
for publishers whose library chooses each delivery tag itself, a message is named by its
`message-id` within (topic, user), so a resend under a fresh tag, on a new link, through another
router, is the same message: merged while it lives, answered with its outcome while final within
the window, never handed twice. First the derivation, then one router, then a mesh."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message, symbol, ulong

from oncemesh.common import ids
from oncemesh.common.ids import BadMessage, identity_scope, message_id_key, msgid_gid
from oncemesh.common.vocab import Outcome
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.subscriptions import SubscriptionTable
from tests.unit.test_identity import Mesh, delivered, outcomes


def enc(mid: Any = None, **kw: Any) -> bytes:
    return bytes(Message(id=mid, body="x", **kw).encode())


# ------------------------------------------------------------------ the derivation


def test_the_message_id_is_read_whatever_its_type_and_the_sections_before_it() -> None:
    u = uuid.UUID(int=7)
    assert message_id_key(enc("m-1")) == b"sm-1"
    assert message_id_key(enc(ulong(5))) == b"n5"
    assert message_id_key(enc(ulong(0))) == b"n0"
    assert message_id_key(enc(ulong(2**40))) == b"n" + str(2**40).encode()
    assert message_id_key(enc(u)) == b"u" + u.bytes
    assert message_id_key(enc(b"\x00\xff")) == b"b\x00\xff"
    assert message_id_key(enc("x" * 300)) == b"s" + b"x" * 300  # (str32)
    # a header, delivery and message annotations before the properties are skipped
    m = Message(id="k", body="x", durable=True, priority=7, ttl=5,
                annotations={symbol("x-opt-a"): [1, 2.5, {"n": None}]}, instructions={symbol("d"): b"z"})
    assert message_id_key(bytes(m.encode())) == b"sk"
    assert message_id_key(enc(None)) is None  # properties without a message-id
    assert message_id_key(bytes(Message(body="x").encode())) is None
    assert message_id_key(b"\x00\x53\x77\xa1\x01x") is None  # a body alone: no properties
    # the string "1" and the number 1 are two ids
    assert message_id_key(enc("1")) != message_id_key(enc(ulong(1)))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_unreadable_bytes_raise_bad_message_and_nothing_else(data: bytes) -> None:
    with contextlib.suppress(BadMessage):  # (anything else fails the test: an IndexError, ...)
        message_id_key(data)
    with contextlib.suppress(BadMessage):  # (a message cut short)
        message_id_key(enc("id")[:len(data) % 20])


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=80), st.text(max_size=20), st.text(max_size=20))
def test_a_message_id_gives_one_gid_per_topic_and_user(mid: str, topic: str, user: str) -> None:
    g = msgid_gid(identity_scope(topic, user), message_id_key(enc(mid)) or b"")
    assert len(g) == ids.GID_MAX and g.isascii() and ids.is_msgid_gid(g)
    assert ids.counter_seq(g) is None and not ids.is_control_tag(g.encode())
    assert g == msgid_gid(identity_scope(topic, user), b"s" + mid.encode())  # the same at any router
    assert g != msgid_gid(identity_scope(topic + "x", user), b"s" + mid.encode())
    assert g != msgid_gid(identity_scope(topic, user + "x"), b"s" + mid.encode())
    assert not ids.is_msgid_gid(ids.global_id(ids.publisher_link_id("c", "l"), mid.encode()))


# ------------------------------------------------------------------ one router


class One:
    """One core, topic `t`, one subscription `s`; publisher links identified by message-id."""

    def __init__(self, **cfg: Any) -> None:
        self.core = DeliveryCore("R", SubscriptionTable(), CoreConfig(**cfg))
        self.core.incarnation = "1"
        self.now = 0.0
        self.sid = ids.subscription_id("c", "s", "t")
        self.core.attach_subscriber(object(), self.sid, "t", "c", "s", 60.0, False, None, self.now)
        self.core.subscriber_credit(self.sid, 1000)
        self.take()

    def take(self) -> list[object]:
        out, self.core.out = self.core.out, []
        return out

    def link(self, name: str = "p", second: bool = True, user: str = "alice", by_id: bool = True) -> object:
        link = object()
        self.core.attach_publisher(link, ids.publisher_link_id("lib", name), "t", second, None, self.now,
                                   by_id=by_id, user=user)
        self.take()
        return link

    def send(self, link: object, tag: bytes, mid: Any) -> tuple[object, list[object]]:
        tok = object()
        self.core.publish(link, tok, tag, enc(mid), self.now)
        return tok, self.take()

    def accept_all(self) -> list[object]:
        for g in list(self.core.subs[self.sid].on_link):
            self.core.subscriber_outcome(self.sid, g, Outcome.ACCEPTED, False, None, False, self.now)
        return self.take()


def test_a_resend_under_a_fresh_tag_on_a_new_link_is_the_same_message() -> None:
    r = One()
    a = r.link("p1")
    _, acts = r.send(a, b"0", "order-17")
    [(_, gid, _)] = delivered(acts)
    assert gid == msgid_gid(identity_scope("t", "alice"), b"sorder-17")
    r.core.detach_publisher(a)  # its connection dropped before the outcome
    b = r.link("p2")  # the library attaches anew (another link name) and numbers its tags again
    tok, acts = r.send(b, b"5", "order-17")
    assert not delivered(acts), "handed twice"
    [o] = outcomes(r.accept_all())
    assert o.pub is tok and o.outcome is Outcome.ACCEPTED


@pytest.mark.parametrize("second", [True, False])
def test_a_resend_of_a_final_message_is_answered_with_its_outcome(second: bool) -> None:
    r = One()
    a = r.link(second=second)
    tok, _ = r.send(a, b"0", "m1")
    [o] = outcomes(r.accept_all())
    assert o.outcome is Outcome.ACCEPTED and o.settle is (not second)
    if second:
        r.core.publisher_settled(tok, r.now)  # it had the outcome: with tags, a resend would be new
        r.take()
    assert not r.core.records
    tok, acts = r.send(a, b"1", "m1")
    assert not delivered(acts)
    [o] = outcomes(acts)
    assert o.pub is tok and o.outcome is Outcome.ACCEPTED and o.settle is (not second)


def test_a_rejected_message_is_answered_rejected_again() -> None:
    r = One()
    a = r.link()
    tok, acts = r.send(a, b"0", "m1")
    [(_, gid, _)] = delivered(acts)
    r.core.subscriber_outcome(r.sid, gid, Outcome.REJECTED, False, ("app:bad", "no"), False, r.now)
    [o] = outcomes(r.take())
    r.core.publisher_settled(tok, r.now)
    r.take()
    _, acts = r.send(r.link("p2"), b"0", "m1")
    [o2] = outcomes(acts)
    assert not delivered(acts) and o2.outcome is o.outcome is Outcome.REJECTED and o2.error == o.error


def test_a_message_without_a_message_id_is_rejected_with_a_condition_and_the_link_stays() -> None:
    r = One()
    a = r.link(second=False)
    tok, acts = r.send(a, b"0", None)
    [o] = outcomes(acts)
    assert o.pub is tok and o.outcome is Outcome.REJECTED and o.settle
    assert o.error is not None and o.error[0] == "amqp:invalid-field" and "message-id" in o.error[1]
    assert not delivered(acts) and not r.core.records
    tok = object()
    r.core.publish(a, tok, b"1", b"\x00\x53\x73\xc0\x05\x01", r.now)  # properties cut short
    [o] = outcomes(r.take())
    assert o.outcome is Outcome.REJECTED and o.error is not None and o.error[0] == "amqp:decode-error"
    _, acts = r.send(a, b"2", "m2")  # the link goes on
    assert len(delivered(acts)) == 1


def test_the_scope_is_the_user_on_the_topic_whatever_the_link() -> None:
    r = One()
    _, acts = r.send(r.link("p1", user="alice"), b"0", "m1")
    assert len(delivered(acts)) == 1
    _, acts = r.send(r.link("p2", user="alice"), b"0", "m1")
    assert not delivered(acts)  # another link of alice: the same message
    _, acts = r.send(r.link("p3", user="bob"), b"0", "m1")
    assert len(delivered(acts)) == 1  # bob's m1 is his own: alice cannot suppress it, nor he hers
    _, acts = r.send(r.link("p4", user="alice", by_id=False), b"0", "m1")
    assert len(delivered(acts)) == 1  # a link identified by tag (the default) is not in the scope


def test_a_topic_set_to_message_id_identifies_links_that_declare_nothing() -> None:
    r = One(msgid_topics=frozenset({"t"}))
    _, acts = r.send(r.link("p1", by_id=False), b"0", "m1")
    _, acts2 = r.send(r.link("p2", by_id=False), b"0", "m1")
    assert len(delivered(acts)) == 1 and not delivered(acts2)
    ours = object()  # our clients declare what they hold in doubt and keep their tags
    r.core.attach_publisher(ours, ids.publisher_link_id("c", "q"), "t", True, [], r.now, mark=0, user="alice")
    r.take()
    tok = object()
    gid = r.core.publish(ours, tok, b"0", enc(None), r.now)
    assert gid == ids.global_id(ids.publisher_link_id("c", "q"), b"0") and len(delivered(r.take())) == 1
    with pytest.raises(Exception, match="declares no tags"):
        r.core.attach_publisher(object(), "x" * 12, "t", True, [b"0"], r.now, mark=1, by_id=True)


def test_the_window_is_bounded_by_time_and_entries() -> None:
    r = One(msgid_window=60.0, msgid_window_entries=2, final_memory=30.0)
    a = r.link(second=False)
    for n in range(3):
        r.send(a, b"%d" % n, f"m{n}")
        r.accept_all()
    r.core.tick(r.now)
    assert len(r.core.ids.id_notes) == 2  # the oldest went first
    # m0: final here (the final memory) but its outcome forgotten: refused, never handed again
    _, acts = r.send(a, b"9", "m0")
    [o] = outcomes(acts)
    assert not delivered(acts) and o.outcome is Outcome.REJECTED and o.error is not None
    assert o.error[0] == "amqp:precondition-failed"
    r.now = 45.0  # past the final memory, within the window: answered from the window
    r.core.tick(r.now)
    _, acts = r.send(a, b"10", "m1")
    assert not delivered(acts) and outcomes(acts)[0].outcome is Outcome.ACCEPTED
    r.now = 61.0  # past the window: a new message (docs/clients.md)
    r.core.tick(r.now)
    assert len(r.core.ids.id_notes) == 0
    _, acts = r.send(a, b"11", "m1")
    assert len(delivered(acts)) == 1


# ------------------------------------------------------------------ across a mesh


class Dead:
    """A router that was SIGKILLed: whatever is sent to it is lost."""

    out: list[object] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: True


def by_id(m: Mesh, at: str, name: str, second: bool = True) -> object:
    link = object()
    m.cores[at].attach_publisher(link, ids.publisher_link_id("lib", name), "t", second, None, m.now,
                                 by_id=True, user="alice")
    return link


def publish(m: Mesh, at: str, link: object, tag: bytes, mid: str) -> object:
    tok = object()
    m.cores[at].publish(link, tok, tag, enc(mid), m.now)
    m.pump()
    return tok


def kill(m: Mesh, router: str) -> None:
    m.cores[router] = Dead()  # type: ignore[assignment]
    for r, core in m.cores.items():
        if r != router:
            core.reachable = {x: "1" for x in m.cores if x != router}


def test_a_resend_through_another_router_after_the_origin_died_is_handed_once() -> None:
    """A is the publisher's router, B homes the subscription. m1 is handed and accepted at B; A dies
    before the outcome reaches the publisher, which fails over to X and resends m1 under a fresh tag
    on a new link: X's copy merges at B (accepted already), and the publisher gets ACCEPTED."""
    m = Mesh("ABX", home="B")
    publish(m, "A", by_id(m, "A", "p1"), b"0", "m1")
    m.accept_all()
    assert len(m.delivered) == 1  # (its outcome, sent to the publisher, is lost with A)
    kill(m, "A")
    x = by_id(m, "X", "p2")
    tok = publish(m, "X", x, b"17", "m1")
    m.accept_all()
    assert len(m.delivered) == 1, f"handed twice: {m.delivered}"
    assert m.outcomes[-1].pub is tok and m.outcomes[-1].outcome is Outcome.ACCEPTED


def test_a_resend_of_a_message_final_at_a_dead_router_is_answered_through_the_final_it_sent() -> None:
    """Mode first: A settled m1 (final) and sent B its FINAL with the note; the outcome was lost with
    the publisher's connection and A died. The resend at X (which never held m1) goes to B as a copy;
    B knows m1 final and answers with FINAL and the note: X answers the publisher, hands nothing."""
    m = Mesh("ABX", home="B")
    publish(m, "A", by_id(m, "A", "p1", second=False), b"0", "m1")
    m.accept_all()
    assert [o.outcome for o in m.outcomes] == [Outcome.ACCEPTED] and not m.cores["B"].records
    kill(m, "A")
    tok = publish(m, "X", by_id(m, "X", "p2", second=False), b"3", "m1")
    assert len(m.delivered) == 1 and not m.ignored
    assert m.outcomes[-1].pub is tok and m.outcomes[-1].outcome is Outcome.ACCEPTED


def test_without_it_a_fresh_tag_is_a_new_message() -> None:
    """The failure of issue 31 item 13, as tags see it (the default): the resend is handed again."""
    m = Mesh("ABX", home="B")
    a, x = object(), object()
    m.cores["A"].attach_publisher(a, ids.publisher_link_id("lib", "p1"), "t", True, None, m.now)
    publish(m, "A", a, b"0", "m1")
    m.accept_all()
    kill(m, "A")
    m.cores["X"].attach_publisher(x, ids.publisher_link_id("lib", "p1"), "t", True, None, m.now)
    publish(m, "X", x, b"17", "m1")
    m.accept_all()
    assert len(m.delivered) == 2


def test_deliveries_are_named_by_the_message_id_gid() -> None:
    m = Mesh("AB", home="B")
    publish(m, "A", by_id(m, "A", "p1"), b"0", "m1")
    assert [g for g, _ in m.delivered] == [msgid_gid(identity_scope("t", "alice"), b"sm1")]
