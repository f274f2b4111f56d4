"""The MQTT session state machine (router/mqtt/session.py), with no socket and no core: packets in,
packets and requests out. What it must never do: give one exchange two names (a resent PUBLISH is
the same message), or one name to two messages; free a QoS 2 packet id the mesh may hand again."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from oncemesh.router.mqtt.mapping import MqttContent
from oncemesh.router.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Reason,
    Suback,
    SubOptions,
    Subscribe,
)
from oncemesh.router.mqtt.session import (
    Close,
    Credit,
    Limits,
    Login,
    MqttConnection,
    PublishMsg,
    Release,
    SessionState,
    Settled,
    Stage,
    SubscribeTo,
    split_share,
)


def connected(level: int = 5, state: SessionState | None = None, present: bool = False,
              limits: Limits | None = None, **connect: object) -> tuple[MqttConnection, SessionState]:
    c = MqttConnection(limits or Limits(), 0.0)
    c.received(Connect(level=level, client_id="c1", clean_start=state is None, **connect), 0.0)  # type: ignore[arg-type]
    assert [type(a) for a in c.asks] == [Login]
    c.asks.clear()
    st = state or SessionState("c1", "", "n1", 60.0)
    c.accepted(st, present)
    assert type(c.out[0]) is Connack and c.out[0].session_present is present
    del c.out[0]
    c.asks = [a for a in c.asks if type(a) is not Credit]
    return c, st


def pub(pid: int, qos: int = 2, dup: bool = False, payload: bytes = b"x", topic: str = "t") -> Publish:
    return Publish(topic=topic, payload=payload, qos=qos, dup=dup, packet_id=pid)


def asks_of(c: MqttConnection, kind: type) -> list:
    found = [a for a in c.asks if type(a) is kind]
    c.asks.clear()
    return found


# ---------------------------------------------------------------- CONNECT

def test_the_first_packet_must_be_connect():
    c = MqttConnection(Limits(), 0.0)
    c.received(Pingreq(), 0.0)
    assert [type(a) for a in c.asks] == [Close] and c.asks[0].reason == Reason.PROTOCOL_ERROR


def test_a_second_connect_closes_the_connection_with_a_protocol_error():
    c, _ = connected()
    c.received(Connect(level=5, client_id="c1"), 1.0)
    closes = asks_of(c, Close)
    assert closes and closes[0].reason == Reason.PROTOCOL_ERROR
    assert type(c.out[-1]) is Disconnect and c.out[-1].reason_code == Reason.PROTOCOL_ERROR


def test_an_empty_client_id_without_clean_session_is_refused_at_3_1_1():
    c = MqttConnection(Limits(), 0.0)
    c.received(Connect(level=4, client_id="", clean_start=False), 0.0)
    assert type(c.out[0]) is Connack and c.out[0].reason_code == Reason.CLIENT_IDENTIFIER_NOT_VALID
    assert [type(a) for a in c.asks] == [Close]


def test_connack_of_mqtt5_says_retain_is_unavailable_and_the_receive_maximum():
    c = MqttConnection(Limits(receive_maximum=7), 0.0)
    c.received(Connect(level=5, client_id="c1"), 0.0)
    c.accepted(SessionState("c1", "", "n", 0.0), False)
    ack = c.out[0]
    assert type(ack) is Connack and ack.properties.retain_available == 0 and ack.properties.receive_maximum == 7


def test_pingreq_is_answered_and_silence_past_one_and_a_half_keep_alives_closes():
    c, _ = connected(keep_alive=10)
    c.received(Pingreq(), 5.0)
    assert c.out == [Pingresp()]
    c.tick(19.0)
    assert not c.asks
    c.tick(20.5)
    closes = asks_of(c, Close)
    assert closes and closes[0].reason == Reason.KEEP_ALIVE_TIMEOUT and closes[0].will


# ---------------------------------------------------------------- the client publishes

def test_qos2_publish_resent_before_its_outcome_is_the_same_message_and_pubrec_waits_for_the_outcome():
    c, st = connected()
    c.received(pub(5), 1.0)
    first = asks_of(c, PublishMsg)
    assert len(first) == 1 and first[0].qos == 2 and c.out == []  # no PUBREC before the mesh decided
    c.received(pub(5, dup=True), 1.1)
    assert asks_of(c, PublishMsg) == []  # in flight on this connection: its outcome answers both
    c.outcome(5, 0)
    assert c.out == [Pubrec(5)]
    c.out.clear()
    c.received(pub(5, dup=True), 1.2)  # PUBREC lost: the client sends it again
    assert c.out == [Pubrec(5)] and asks_of(c, PublishMsg) == []
    c.out.clear()
    c.received(Pubrel(5), 1.3)
    assert [a.tag for a in asks_of(c, Release)] == [first[0].tag] and c.out == [Pubcomp(5)]
    c.out.clear()
    c.received(pub(5), 2.0)  # the id used again: a new message, a new name
    again = asks_of(c, PublishMsg)
    assert len(again) == 1 and again[0].tag != first[0].tag
    assert st.inbound[5].tag == again[0].tag


def test_a_resend_after_a_reconnect_is_published_again_under_its_first_tag():
    c, st = connected()
    c.received(pub(9), 1.0)
    tag = asks_of(c, PublishMsg)[0].tag
    c.lost()
    c2, _ = connected(state=st, present=True)
    c2.received(pub(9, dup=True), 2.0)
    again = asks_of(c2, PublishMsg)
    assert [a.tag for a in again] == [tag]  # the core merges it, or answers it with its outcome


def test_a_rejected_qos2_publish_ends_its_exchange_with_the_reason():
    c, st = connected()
    c.received(pub(3), 1.0)
    c.outcome(3, Reason.NOT_AUTHORIZED)
    assert c.out == [Pubrec(3, Reason.NOT_AUTHORIZED)] and 3 not in st.inbound


def test_3_1_1_acks_carry_no_failure_reason():
    c, _ = connected(level=4)
    c.received(pub(3, qos=1), 1.0)
    c.outcome(3, Reason.NOT_AUTHORIZED)
    assert c.out == [Puback(3, 0)]


def test_pubrel_before_pubrec_is_a_protocol_error():
    c, _ = connected()
    c.received(pub(4), 1.0)
    c.asks.clear()
    c.received(Pubrel(4), 1.1)
    closes = asks_of(c, Close)
    assert closes and closes[0].reason == Reason.PROTOCOL_ERROR


def test_pubrel_of_an_unknown_id_is_answered_not_found():
    c, _ = connected()
    c.received(Pubrel(77), 1.0)
    assert c.out == [Pubcomp(77, Reason.PACKET_IDENTIFIER_NOT_FOUND)]


def test_more_unanswered_publishes_than_the_receive_maximum_are_taken_not_refused():
    """paho-mqtt sends every message it queued at once after a reconnect, whatever CONNACK's Receive
    Maximum: disconnecting it (0x93) would repeat at every reconnect; it is read more slowly instead."""
    c, st = connected(limits=Limits(receive_maximum=2))
    for pid in (1, 2, 3, 4):
        c.received(pub(pid), 1.0)
    assert len(asks_of(c, PublishMsg)) == 4 and not c.out and len(st.inbound) == 4


def test_a_retained_publish_at_mqtt5_is_refused_with_its_reason():
    c, _ = connected()
    c.received(Publish(topic="t", payload=b"x", qos=1, retain=True, packet_id=1), 1.0)
    closes = asks_of(c, Close)
    assert closes and closes[0].reason == Reason.RETAIN_NOT_SUPPORTED


def test_a_packet_id_in_use_by_the_other_qos_is_refused():
    c, _ = connected()
    c.received(pub(6, qos=2), 1.0)
    c.received(pub(6, qos=1), 1.0)
    closes = asks_of(c, Close)
    assert closes and closes[0].reason == Reason.PACKET_IDENTIFIER_IN_USE


def test_qos0_is_published_without_tracking():
    c, st = connected()
    c.received(Publish(topic="t", payload=b"x", qos=0), 1.0)
    [a] = asks_of(c, PublishMsg)
    assert a.qos == 0 and not st.inbound and c.out == []


# ---------------------------------------------------------------- the client subscribes

def subscribed(c: MqttConnection, *filters: tuple[str, int]) -> None:
    c.received(Subscribe(packet_id=1, subscriptions=tuple((f, SubOptions(qos=q)) for f, q in filters)), 0.5)
    [ask] = asks_of(c, SubscribeTo)
    for i, s in enumerate(ask.subs):
        s.sid = f"sid{i}"
    c.subscribed(1, ask.subs, tuple(s.qos for s in ask.subs))
    assert type(c.out[-1]) is Suback
    c.out.clear()
    c.asks.clear()


def test_qos2_delivery_pubrec_is_acceptance_and_the_session_remembers_it_until_final():
    """PUBREC is the subscription's acceptance; PUBREL follows at once (the client's Receive
    Maximum counts the exchange until PUBCOMP: it must not wait for other subscriptions), and the
    session remembers the message until it is final: presented on resume, never sent again."""
    c, st = connected()
    subscribed(c, ("a/#", 2))
    c.deliver("sid0", "g1", "a/b", MqttContent(b"p"), False)
    [p] = c.out
    assert type(p) is Publish and p.qos == 2 and not p.dup and p.topic == "a/b"
    c.out.clear()
    c.received(Pubrec(p.packet_id), 1.0)
    assert asks_of(c, Settled) == [Settled("sid0", "g1", True, False)] and c.out == [Pubrel(p.packet_id)]
    c.out.clear()
    c.received(Pubcomp(p.packet_id), 1.1)
    assert not st.outbound and st.held_for("sid0") == ["g1"]
    c.deliver("sid0", "g1", "a/b", MqttContent(b"p"), True)  # handed again (a failover): taken, not sent
    assert c.out == [] and asks_of(c, Settled) == [Settled("sid0", "g1", True, False)]
    assert SessionState.from_image("c1", st.image()).held_for("sid0") == ["g1"]
    c.final("sid0", "g1")
    assert st.held_for("sid0") == [] and c.out == []


def test_a_final_before_the_pubrec_sends_pubrel_right_after_it():
    c, _ = connected()
    subscribed(c, ("t", 2))
    c.deliver("sid0", "g1", "t", MqttContent(b"p"), False)
    pid = c.out[0].packet_id
    c.out.clear()
    c.final("sid0", "g1")
    assert c.out == []
    c.received(Pubrec(pid), 1.0)
    assert c.out == [Pubrel(pid)]


def test_a_redelivery_goes_under_its_packet_id_with_dup_and_pubrel_is_resent_on_resume():
    c, st = connected()
    subscribed(c, ("t", 2))
    c.deliver("sid0", "g1", "t", MqttContent(b"1"), False)
    c.deliver("sid0", "g2", "t", MqttContent(b"2"), False)
    p1, p2 = c.out[0].packet_id, c.out[1].packet_id
    assert p1 != p2
    c.received(Pubrec(p2), 1.0)
    c.final("sid0", "g2")
    c.lost()
    c2, _ = connected(state=st, present=True)
    assert Pubrel(p2) in c2.out  # what was released is released again on resume
    c2.out.clear()
    c2.deliver("sid0", "g1", "t", MqttContent(b"1"), True)
    assert c2.out == [Publish(topic="t", payload=b"1", qos=2, dup=True, packet_id=p1)]


def test_deliveries_beyond_the_clients_receive_maximum_wait_for_its_acks():
    c, _ = connected(properties=Properties(receive_maximum=1))
    subscribed(c, ("t", 1))
    c.deliver("sid0", "g1", "t", MqttContent(b"1"), False)
    c.deliver("sid0", "g2", "t", MqttContent(b"2"), False)
    assert len(c.out) == 1
    pid = c.out[0].packet_id
    c.out.clear()
    c.received(Puback(pid), 1.0)
    assert asks_of(c, Settled) == [Settled("sid0", "g1", True, True)]
    assert len(c.out) == 1 and c.out[0].payload == b"2"


def test_qos0_subscription_takes_the_message_as_accepted_when_sent():
    c, _ = connected()
    subscribed(c, ("t", 0))
    c.deliver("sid0", "g1", "t", MqttContent(b"1"), False)
    assert c.out[0].qos == 0 and c.out[0].packet_id is None
    assert [a for a in c.asks if type(a) is Settled] == [Settled("sid0", "g1", True, True)]


def test_disconnect_with_will_reason_asks_for_the_will_and_a_plain_one_does_not():
    c, _ = connected()
    c.received(Disconnect(0x04), 1.0)
    assert asks_of(c, Close)[0].will
    c2, _ = connected()
    c2.received(Disconnect(0), 1.0)
    assert not asks_of(c2, Close)[0].will


def test_share_filters_split_and_a_malformed_one_is_no_filter():
    assert split_share("$share/g/a/+") == ("g", "a/+")
    assert split_share("a/b") == ("", "a/b")
    c, _ = connected()
    c.received(Subscribe(packet_id=2, subscriptions=(("$share/g", SubOptions(qos=1)),)), 1.0)
    [ask] = asks_of(c, SubscribeTo)
    assert ask.subs[0].match == ""  # the router refuses it: TOPIC_FILTER_INVALID


# ---------------------------------------------------------------- the naming rule, by hypothesis

ops = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("outcome"), st.integers(1, 3)),
    st.tuples(st.just("pubrel"), st.integers(1, 3)),
    st.tuples(st.just("reconnect"), st.just(0)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_one_exchange_one_name_and_never_a_name_twice(seq):
    """Whatever the client resends and whenever the connection breaks: every PublishMsg of one
    exchange (a packet id from its PUBLISH to its PUBREL) carries one tag, and no tag ever names two
    exchanges."""
    c, st_ = connected()
    exchange_of_tag: dict[bytes, int] = {}
    current: dict[int, int] = {}  # packet id -> exchange number
    n = 0
    for op in seq:
        if op[0] == "publish":
            pid = op[1]
            if pid not in current:
                n += 1
                current[pid] = n
            c.received(pub(pid, dup=op[2]), 1.0)
        elif op[0] == "outcome":
            c.outcome(op[1], 0)
        elif op[0] == "pubrel":
            inb = st_.inbound.get(op[1])
            c.received(Pubrel(op[1]), 1.0)
            if inb is not None and inb.answered:
                current.pop(op[1], None)
        else:
            c.lost()
            c, _ = connected(state=st_, present=True)
        if c.state.value == "closed":  # (a PUBREL before its PUBREC: the client's error)
            c, _ = connected(state=st_, present=True)
        for a in [a for a in c.asks if type(a) is PublishMsg]:
            ex = current[a.pid]
            assert exchange_of_tag.setdefault(a.tag, ex) == ex
        c.asks.clear()
    tags_per_exchange: dict[int, set[bytes]] = {}
    for tag, ex in exchange_of_tag.items():
        tags_per_exchange.setdefault(ex, set()).add(tag)
    assert all(len(t) == 1 for t in tags_per_exchange.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["deliver", "pubrec", "final", "pubcomp"]), st.integers(0, 5)),
                max_size=60))
def test_a_message_the_client_accepted_is_never_sent_to_it_again_until_final(seq):
    """Whatever the order of deliveries (first or again), PUBRECs, PUBCOMPs and finals: a packet id
    names one exchange at a time, and a message accepted (PUBREC) and not final is never sent to the
    client again (under any packet id) and is presented while the session holds it."""
    c, st_ = connected()
    subscribed(c, ("t", 2))
    finals: set[str] = set()
    accepted: set[str] = set()
    for op, i in seq:
        gid = f"g{i}"
        if op == "deliver":
            if gid in finals:
                continue  # (the mesh never hands a final message again)
            c.deliver("sid0", gid, "t", MqttContent(b""), gid in accepted)
            sent = [p for p in c.out if type(p) is Publish]
            assert not (sent and gid in accepted and not sent[-1].dup), f"{gid} accepted, sent again"
        elif op == "final":
            if gid in accepted:
                finals.add(gid)
                c.final("sid0", gid)
        else:
            pids = sorted(st_.outbound)
            if pids:
                pid = pids[i % len(pids)]
                ob = st_.outbound[pid]
                if op == "pubrec" and ob.stage is Stage.SENT:
                    accepted.add(ob.gid)
                c.received(Pubrec(pid) if op == "pubrec" else Pubcomp(pid), 1.0)
        in_use = [ob.pid for ob in st_.outbound.values()]
        assert len(in_use) == len(set(in_use))
        for g in accepted - finals:
            assert g in st_.held_for("sid0")  # presented if the subscription attaches again
        c.asks.clear()
        c.out.clear()


def test_a_topic_alias_is_refused_since_none_is_offered():
    c, _ = connected()
    c.received(Publish(topic="t", payload=b"x", qos=1, packet_id=1, properties=Properties(topic_alias=1)), 1.0)
    closes = asks_of(c, Close)
    assert closes and closes[0].reason == Reason.TOPIC_ALIAS_INVALID


def test_enhanced_authentication_is_refused_with_its_reason():
    c = MqttConnection(Limits(), 0.0)
    c.received(Connect(level=5, client_id="c", properties=Properties(authentication_method="SCRAM-SHA-1")), 0.0)
    assert type(c.out[0]) is Connack and c.out[0].reason_code == Reason.BAD_AUTHENTICATION_METHOD
    assert [type(a) for a in c.asks] == [Close]


def test_an_expired_message_is_not_sent_and_the_subscription_is_done_with_it():
    c, _ = connected()
    subscribed(c, ("t", 2))
    c.deliver("sid0", "g1", "t", MqttContent(b"old", message_expiry=0), False)
    assert c.out == [] and [a for a in c.asks if type(a) is Settled] == [Settled("sid0", "g1", True, True)]


# ---------------------------------------------------------------- with a keeper (router/mqtt/session.py, `_emit`)

def kept_session(*filters: tuple[str, int]) -> tuple[MqttConnection, SessionState]:
    """A connected session with `filters`, whose keeper holds it as it is."""
    c, st = connected()
    if filters:
        subscribed(c, *filters)
    c.replicate = True
    c.kept(st.seq)
    c.asks.clear()
    return c, st


def test_with_a_keeper_a_new_publish_waits_until_its_name_is_kept():
    c, st = kept_session()
    c.received(pub(1), 1.0)
    assert asks_of(c, PublishMsg) == [] and c.dirty
    image = st.image()
    assert [e[0] for e in image["in"]] == [1]
    c.kept(st.seq)
    [ask] = asks_of(c, PublishMsg)
    assert ask.tag.decode() == image["in"][0][1]


def test_with_a_keeper_a_delivery_waits_for_its_packet_id_and_an_acceptance_for_its_stage():
    c, st = kept_session(("t", 2))
    c.deliver("sid0", "g1", "t", MqttContent(b"p"), False)
    assert c.out == []
    c.kept(st.seq)
    [p] = c.out
    c.out.clear()
    c.received(Pubrec(p.packet_id), 1.0)
    assert asks_of(c, Settled) == []  # the mesh learns of the acceptance only once the keeper knows it
    assert c.out == []  # (nor the PUBREL: the keeper must hold that the session remembers g1)
    assert st.image()["out"][0][4] == "released" and st.image()["rel"] == [["sid0", "g1"]]
    c.kept(st.seq)
    assert asks_of(c, Settled) == [Settled("sid0", "g1", True, False)] and c.out == [Pubrel(p.packet_id)]


def test_with_a_keeper_an_exchange_ends_only_once_the_keeper_knows():
    c, st = kept_session()
    c.received(pub(3), 1.0)
    c.kept(st.seq)
    c.asks.clear()
    c.outcome(3, 0)
    assert c.out == [Pubrec(3)]  # (not held: the client's PUBREL ends it wherever it comes)
    c.out.clear()
    c.received(Pubrel(3), 1.1)
    assert c.out == [] and 3 not in st.image()["in"]
    c.kept(st.seq)
    assert c.out == [Pubcomp(3)]


def test_no_keeper_to_be_had_lets_everything_out():
    c, st = kept_session()
    c.received(pub(1), 1.0)
    c.received(pub(2, qos=1), 1.0)
    assert asks_of(c, PublishMsg) == []
    c.unreplicated()
    assert [a.pid for a in asks_of(c, PublishMsg)] == [1, 2]


def test_an_image_restores_the_session_and_a_restored_pubrel_ends_its_exchange():
    c, st = kept_session(("a/#", 2))
    c.received(pub(7), 1.0)
    c.deliver("sid0", "g1", "a/b", MqttContent(b"p"), False)
    c.kept(st.seq)
    image = st.image()
    back = SessionState.from_image("c1", json.loads(json.dumps(image)))
    assert back.image() == image and back.restored
    c2, _ = connected(state=back, present=True)
    c2.replicate = True
    c2.received(Pubrel(7), 2.0)  # (the gone router had sent PUBREC: its outcome was decided)
    assert [a.tag for a in asks_of(c2, Release)] == [image["in"][0][1].encode()]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 3), st.integers(1, 2)),
    st.tuples(st.just("outcome"), st.integers(1, 3), st.just(0)),
    st.tuples(st.just("pubrel"), st.integers(1, 3), st.just(0)),
    st.tuples(st.just("deliver"), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("pubrec"), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("final"), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("pubcomp"), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("put"), st.just(0), st.just(0)),
    st.tuples(st.just("ack"), st.just(0), st.just(0)),
), max_size=60))
def test_what_goes_out_was_kept_first(seq):
    """Whatever the interleaving of packets, puts and acknowledgements: every PUBLISH to the client,
    every PublishMsg, every acceptance told to the mesh and every end of an exchange (PUBACK, PUBCOMP)
    goes out only when the image the keeper acknowledged already says so, which is what lets another
    router resume the session after this one's crash without a message twice."""
    c, st_ = kept_session(("t", 2))
    puts: list[tuple[int, dict]] = []
    acked: dict = st_.image()
    seen: set[int] = set()  # packet ids the client got a PUBLISH under (it acknowledges only those)
    gid_of: dict[int, str] = {}  # packet id -> the message last sent under it
    accepted: set[str] = set()  # what the mesh was told was accepted (only those can become final)
    submitted: set[int] = set()  # packet ids whose PublishMsg reached the core (only those get an outcome)
    for op, a, b in seq:
        if op == "publish":
            c.received(pub(a, qos=b), 1.0)
        elif op == "outcome":
            if a in submitted:
                submitted.discard(a)
                c.outcome(a, 0)
        elif op == "pubrel":
            c.received(Pubrel(a), 1.0)
        elif op == "deliver":
            c.deliver("sid0", f"g{a}", "t", MqttContent(b""), False)
        elif op == "final":
            if f"g{a}" in accepted:
                c.final("sid0", f"g{a}")
        elif op in ("pubrec", "pubcomp"):
            pids = sorted(p for p in st_.outbound if p in seen)
            if pids:
                pid = pids[a % len(pids)]
                c.received(Pubrec(pid) if op == "pubrec" else Pubcomp(pid), 1.0)
        elif op == "put":
            puts.append((st_.seq, json.loads(json.dumps(st_.image()))))
        elif op == "ack" and puts:
            s, acked = puts.pop(0)
            c.kept(s)
        if c.state.value == "closed":
            return  # (a client's protocol error ends the run)
        kept_in = {e[0]: e[1] for e in acked["in"]}
        kept_out = {e[0]: (e[2], e[4]) for e in acked["out"]}
        for ask in c.asks:
            if type(ask) is PublishMsg and ask.qos:
                assert kept_in.get(ask.pid) == ask.tag.decode()
                submitted.add(ask.pid)
            if type(ask) is Settled and ask.accepted and not ask.settled:
                assert (ask.gid, "received") in kept_out.values() or (ask.gid, "released") in kept_out.values() \
                    or ["sid0", ask.gid] in acked.get("rel", [])
                accepted.add(ask.gid)
        for p in c.out:
            if type(p) is Publish and p.qos:
                assert p.packet_id in kept_out
                seen.add(p.packet_id)
                gid_of[p.packet_id] = kept_out[p.packet_id][0]
            if type(p) in (Pubcomp, Puback) and p.packet_id in st_.inbound:
                pass  # (a new exchange under the id, after the end)
            elif type(p) is Pubcomp:
                assert p.packet_id not in kept_in or p.reason_code == Reason.PACKET_IDENTIFIER_NOT_FOUND
            if type(p) is Pubrel:  # (the client may forget it after this: the keeper holds that it was taken)
                # (released in the kept image, or remembered there: a client's early PUBCOMP ended it)
                assert kept_out.get(p.packet_id, ("", ""))[1] == "released" \
                    or ["sid0", gid_of.get(p.packet_id)] in acked.get("rel", []), (p, acked)
        c.asks.clear()
        c.out.clear()


def test_a_subscription_attached_again_gets_its_whole_window_again():
    """The core starts a link attached again (a SUBSCRIBE repeated on a live connection) with no
    credit: the session grants its window anew, or the subscription would get nothing more (found
    by tests/foreign/test_mqtt_foreign.py)."""
    c, _ = connected(limits=Limits(sub_credit=8))
    c.in_force("sid0")
    c.in_force("sid0")
    assert [a.n for a in asks_of(c, Credit)] == [8, 8] and c.granted["sid0"] == 8


def test_packets_sent_before_connack_are_handled_once_the_connect_is_taken():
    """MQTT 3.1.4: a client need not wait for CONNACK (a password is checked off the loop meanwhile)."""
    c = MqttConnection(Limits(), 0.0)
    c.received(Connect(level=5, client_id="c1"), 0.0)
    c.received(Subscribe(packet_id=1, subscriptions=(("t", SubOptions(qos=1)),)), 0.0)
    c.received(pub(2, qos=1), 0.0)
    assert [type(a) for a in c.asks] == [Login] and c.out == []
    c.asks.clear()
    c.accepted(SessionState("c1", "", "n", 0.0), False)
    assert type(c.out[0]) is Connack
    assert [type(a) for a in c.asks] == [SubscribeTo, PublishMsg]


def test_a_final_notification_counts_against_the_credit_as_the_core_counts_it():
    """The core counts each FINAL notification as a transfer; a QoS 1 subscription gets one per batch
    of messages it took, and without counting them its credit ran dry (found by the bench)."""
    c, _ = connected(limits=Limits(sub_credit=4))
    c.in_force("sid0")
    c.asks.clear()
    c.notified("sid0", ("g1", "g2"))
    c.notified("sid0", ("g3",))
    assert c.granted["sid0"] == 4 and [a.n for a in asks_of(c, Credit)] == [4]


def test_the_declarations_name_what_the_client_may_still_send_again_and_the_mark_of_what_follows():
    """What the session's publisher links declare (at attach, or said by a keeper when the router is
    gone): in doubt, the PUBLISHes named and not answered; settled, every other tag below the mark
    (answered: the client sends PUBREL, never that PUBLISH again; ended); the mark, the next tag's
    number. The same from the keeper's image as from the session itself."""
    c, st = connected()
    for pid, qos in ((1, 2), (2, 2), (3, 1), (4, 2), (5, 1)):
        c.received(pub(pid, qos=qos), 1.0)
    tags = {a.pid: a.tag for a in asks_of(c, PublishMsg)}
    c.outcome(2, 0)  # PUBREC: answered
    c.outcome(3, 0)  # PUBACK: ended
    c.received(pub(4, dup=True), 1.1)
    c.outcome(4, 0)
    c.received(Pubrel(4), 1.2)  # ended
    decl = st.declarations()
    assert [(q, sorted(t)) for q, _, t, _ in decl] == [(1, [tags[5]]), (2, [tags[1]])]
    assert {m for *_, m in decl} == {st.next_tag + 1} and st.next_tag == 5
    assert decl[0][1] != decl[1][1]  # (one link per QoS)
    assert SessionState.from_image("c1", st.image()).declarations() == decl


def test_a_resend_that_is_not_the_message_its_packet_id_named_is_a_new_message():
    """A session restored from a stale copy (line3 seed 5: a keeper cut off from the newer copy)
    maps a packet id to an older message, already answered: the client's resend under that id,
    another message, must be published as new, never answered with the old one's outcome (a PUBREC
    for a message never published). The digest of topic and payload tells them apart, through the
    image too; the same message resent is still the same message."""
    c, st = connected()
    c.received(pub(9, payload=b"old"), 1.0)
    old = asks_of(c, PublishMsg)[0]
    c.outcome(9, 0)  # (PUBREC sent: answered)
    stale = SessionState.from_image("c1", json.loads(json.dumps(st.image())))  # (the copy as of then)
    c.lost()
    c2, _ = connected(state=stale, present=True)
    c2.received(pub(9, dup=True, payload=b"new"), 2.0)
    fresh = asks_of(c2, PublishMsg)
    assert len(fresh) == 1 and fresh[0].tag != old.tag and fresh[0].content.payload == b"new"
    assert not [p for p in c2.out if type(p) is Pubrec] and c2.stale_entries == 1
    # the same message resent: answered with its outcome, as before
    c3, _ = connected(state=SessionState.from_image("c1", json.loads(json.dumps(st.image()))), present=True)
    c3.received(pub(9, dup=True, payload=b"old"), 3.0)
    assert [type(p) for p in c3.out] == [Pubrec] and not asks_of(c3, PublishMsg) and c3.stale_entries == 0
