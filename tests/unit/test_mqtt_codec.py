"""The MQTT packet codec (router/mqtt/codec.py): every packet round-trips at both levels whatever the
chunking, the spec's examples decode to what they say, each validation rule raises the error class
that names its reason code, and garbage raises nothing but `MqttError`."""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncemesh.router.mqtt.codec import (
    Decoder,
    MalformedPacket,
    MqttError,
    PacketTooLarge,
    ProtocolError,
    UnsupportedProtocolVersion,
    encode,
)
from oncemesh.router.mqtt.packets import (
    BOOLEAN_PROPERTIES,
    EMPTY,
    NONZERO_PROPERTIES,
    PROPERTIES,
    REASON_FOR_311,
    REASONS,
    SUBSCRIPTION_IDENTIFIER,
    VARINT_MAX,
    WILL,
    Auth,
    Connack,
    Connack311,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    PropertySpec,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Reason,
    Suback,
    SubOptions,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Where,
    Will,
    Wire,
    connack_code,
)

P = PacketType
FAST = settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ------------------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
TOPIC = st.text(st.characters(codec="utf-8", exclude_characters="\x00+#"), min_size=1, max_size=8)
PID = st.integers(1, 0xFFFF)
LEVELS = st.sampled_from([4, 5])


def _value(pid: int, spec: PropertySpec, subids: int) -> st.SearchStrategy[Any]:
    low = 1 if pid in NONZERO_PROPERTIES else 0
    if pid in BOOLEAN_PROPERTIES:
        return st.integers(0, 1)
    if spec.wire is Wire.TWO_BYTE:
        return st.integers(max(low, 1 if pid == 0x23 else 0), 0xFFFF)
    if spec.wire is Wire.FOUR_BYTE:
        return st.integers(low, 2**32 - 1)
    if spec.wire is Wire.VARINT:
        return st.lists(st.integers(1, VARINT_MAX), min_size=1, max_size=subids).map(tuple)
    if spec.wire is Wire.UTF8:
        return TOPIC if pid == 0x08 else TEXT
    if spec.wire is Wire.UTF8_PAIR:
        return st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=3).map(tuple)
    return st.binary(max_size=8)


@st.composite
def properties(draw: st.DrawFn, kind: Where, subids: int = 1) -> Properties:
    """Valid properties for a `kind` packet; `subids`: how many subscription identifiers it may carry."""
    values: dict[str, Any] = {}
    for pid, spec in PROPERTIES.items():
        if kind not in spec.allowed or (pid == SUBSCRIPTION_IDENTIFIER and not subids):
            continue
        if draw(st.integers(0, 3)) == 0:
            values[spec.field] = draw(_value(pid, spec, subids))
    if "authentication_data" in values and "authentication_method" not in values:
        del values["authentication_data"]
    return Properties(**values)


def props_at(level: int, kind: Where, subids: int = 1) -> st.SearchStrategy[Properties]:
    return properties(kind, subids) if level == 5 else st.just(EMPTY)


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(draw(TOPIC), draw(st.binary(max_size=8)), draw(st.integers(0, 2)), draw(st.booleans()),
                    draw(props_at(level, WILL)))
    username = draw(st.none() | TEXT)
    password = draw(st.none() | st.binary(max_size=8))
    if level == 4 and password is not None and username is None:
        username = ""
    return Connect(level, draw(st.booleans()), draw(st.integers(0, 0xFFFF)), draw(TEXT), will, username, password,
                   draw(props_at(level, P.CONNECT)))


@st.composite
def connacks(draw: st.DrawFn, level: int) -> Connack:
    codes = sorted(REASONS[P.CONNACK]) if level == 5 else sorted(REASON_FOR_311.values())
    reason = draw(st.sampled_from(codes))
    return Connack(draw(st.booleans()) and not reason, reason, draw(props_at(level, P.CONNACK)))


@st.composite
def publishes(draw: st.DrawFn, level: int, subids: int) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(props_at(level, P.PUBLISH, subids))
    topic = draw(TOPIC | st.just("")) if props.topic_alias is not None else draw(TOPIC)
    return Publish(topic, draw(st.binary(max_size=40)), qos, draw(st.booleans()), qos > 0 and draw(st.booleans()),
                   draw(PID) if qos else None, props)


@st.composite
def acks(draw: st.DrawFn, level: int) -> Puback | Pubrec | Pubrel | Pubcomp:
    cls = draw(st.sampled_from([Puback, Pubrec, Pubrel, Pubcomp]))
    if level == 4:
        return cls(draw(PID))
    return cls(draw(PID), draw(st.sampled_from(sorted(REASONS[cls.TYPE]))), draw(properties(cls.TYPE)))


@st.composite
def subscribes(draw: st.DrawFn, level: int) -> Subscribe:
    def options() -> SubOptions:
        if level == 4:
            return SubOptions(draw(st.integers(0, 2)))
        return SubOptions(draw(st.integers(0, 2)), draw(st.booleans()), draw(st.booleans()), draw(st.integers(0, 2)))
    n = draw(st.integers(1, 4))
    return Subscribe(draw(PID), tuple((draw(TEXT), options()) for _ in range(n)), draw(props_at(level, P.SUBSCRIBE)))


@st.composite
def subacks(draw: st.DrawFn, level: int) -> Suback:
    codes = sorted(REASONS[P.SUBACK]) if level == 5 else [0, 1, 2, 0x80]
    return Suback(draw(PID), tuple(draw(st.lists(st.sampled_from(codes), min_size=1, max_size=5))),
                  draw(props_at(level, P.SUBACK)))


@st.composite
def unsubscribes(draw: st.DrawFn, level: int) -> Unsubscribe:
    return Unsubscribe(draw(PID), tuple(draw(st.lists(TEXT, min_size=1, max_size=4))),
                       draw(props_at(level, P.UNSUBSCRIBE)))


@st.composite
def unsubacks(draw: st.DrawFn, level: int) -> Unsuback:
    if level == 4:
        return Unsuback(draw(PID))
    codes = draw(st.lists(st.sampled_from(sorted(REASONS[P.UNSUBACK])), min_size=1, max_size=5))
    return Unsuback(draw(PID), tuple(codes), draw(properties(P.UNSUBACK)))


@st.composite
def disconnects(draw: st.DrawFn, level: int) -> Disconnect:
    if level == 4:
        return Disconnect()
    return Disconnect(draw(st.sampled_from(sorted(REASONS[P.DISCONNECT]))), draw(properties(P.DISCONNECT)))


auths = st.builds(Auth, st.sampled_from(sorted(REASONS[P.AUTH])), properties(P.AUTH))


def client_packets(level: int) -> st.SearchStrategy[Packet]:
    """What a client sends (a server-side decoder takes it); a client's PUBLISH has no subscription id."""
    out: list[st.SearchStrategy[Packet]] = [
        connects(level), publishes(level, 0), acks(level), subscribes(level), unsubscribes(level),
        st.just(Pingreq()), disconnects(level)]
    return st.one_of(out + [auths] if level == 5 else out)


def server_packets(level: int) -> st.SearchStrategy[Packet]:
    out: list[st.SearchStrategy[Packet]] = [
        connacks(level), publishes(level, 3), acks(level), subacks(level), unsubacks(level),
        st.just(Pingresp()), disconnects(level)]
    return st.one_of(out + [auths] if level == 5 else out)


# --- helpers ---------------------------------------------------------------------------------------

def vbi(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def frame(b0: int, body: bytes) -> bytes:
    return bytes([b0]) + vbi(len(body)) + body


def s(text: bytes) -> bytes:
    return len(text).to_bytes(2, "big") + text


def connect_bytes(level: int = 4, flags: int = 0x02, props: bytes = b"\x00", payload: bytes = s(b"a"),
                  name: bytes = b"MQTT") -> bytes:
    return frame(0x10, s(name) + bytes([level, flags]) + b"\x00\x3c" + (props if level == 5 else b"") + payload)


def server(level: int, max_packet_size: int = 1 << 20) -> Decoder:
    d = Decoder(max_packet_size)
    assert d.feed(connect_bytes(level)) == [Connect(level, True, 60, "a")]
    return d


def after_connect(level: int, data: bytes) -> list[Packet]:
    return server(level).feed(data)


def refused(error: type[MqttError], level: int, data: bytes, *, to_client: bool = False) -> MqttError:
    """The error the decoder raises for `data` (after a CONNECT of `level`, or on a client-side decoder)."""
    d = Decoder(server=False, level=level) if to_client else server(level)
    with pytest.raises(error) as e:
        d.feed(data)
    assert type(e.value) is error, f"{type(e.value).__name__}: {e.value}"
    with pytest.raises(error):  # the decoder is spent
        d.feed(b"\xc0\x00")
    return e.value


def props(*fields: bytes) -> bytes:
    body = b"".join(fields)
    return vbi(len(body)) + body


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def well_typed(value: object, hint: Any) -> bool:
    """`value` is of the annotated type `hint`, down through tuples and nested dataclasses."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(well_typed(value, h) for h in get_args(hint))
    if origin is tuple:
        args = get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(well_typed(v, args[0]) for v in value)
        return len(args) == len(value) and all(well_typed(v, a) for v, a in zip(value, args, strict=True))
    if hint is type(None):
        return value is None
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (bool, str, bytes):
        return type(value) is hint
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = get_type_hints(hint)
        return isinstance(value, hint) and all(well_typed(getattr(value, f.name), hints[f.name])
                                               for f in dataclasses.fields(hint))
    raise AssertionError(f"no check for {hint!r}")


def sane(p: Packet) -> bool:
    """A decoded packet is a packet, its fields of their types, and what MQTT fixes holds."""
    if not well_typed(p, type(p)):
        return False
    if isinstance(p, Publish):
        return p.qos in (0, 1, 2) and (p.packet_id is None) == (p.qos == 0) and (not p.dup or p.qos > 0)
    if isinstance(p, Subscribe | Unsubscribe):
        return p.packet_id > 0 and len(p.subscriptions if isinstance(p, Subscribe) else p.filters) > 0
    return True


# --- round trips -----------------------------------------------------------------------------------

@FAST
@given(st.data())
def test_client_packets_round_trip_through_a_server_decoder_in_any_chunking(data: st.DataObject) -> None:
    level = data.draw(LEVELS)
    packets = data.draw(st.lists(client_packets(level), min_size=1, max_size=4))
    wire = b"".join(encode(p, level) for p in packets)
    assert after_connect(level, wire) == packets
    d = server(level)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=6))
    assert [p for c in chunks(wire, cuts) for p in d.feed(c)] == packets
    assert d.pending == 0
    d = server(level)
    assert [p for i in range(len(wire)) for p in d.feed(wire[i:i + 1])] == packets


@FAST
@given(st.data())
def test_server_packets_round_trip_through_a_client_decoder_in_any_chunking(data: st.DataObject) -> None:
    level = data.draw(LEVELS)
    packets = data.draw(st.lists(server_packets(level), min_size=1, max_size=4))
    wire = b"".join(encode(p, level) for p in packets)
    assert Decoder(server=False, level=level).feed(wire) == packets
    d = Decoder(server=False, level=level)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=6))
    assert [p for c in chunks(wire, cuts) for p in d.feed(c)] == packets
    d = Decoder(server=False, level=level)
    assert [p for i in range(len(wire)) for p in d.feed(memoryview(wire)[i:i + 1])] == packets
    assert d.pending == 0


def test_a_big_publish_arrives_in_pieces_and_many_small_ones_in_one_feed() -> None:
    big = Publish("t", bytes(range(256)) * 4000, 1, packet_id=7)
    wire = encode(big, 5)
    d = server(5)
    got = [p for i in range(0, len(wire), 1000) for p in d.feed(wire[i:i + 1000])]
    assert got == [big] and d.pending == 0
    small = [Publish(f"t/{i}", b"x", 0) for i in range(500)]
    assert d.feed(b"".join(encode(p, 5) for p in small)) == small


# --- the spec's examples, by hand ------------------------------------------------------------------

@pytest.mark.parametrize(("hexa", "level", "packet"), [
    # 3.1.1 CONNECT: client id "a", clean session, keep alive 60
    ("100d 0004 4d515454 04 02 003c 0001 61", 4, Connect(4, True, 60, "a")),
    # the same with a will "w" = "bye" (QoS 1, retained), user name "u" and password "p": flags 0xee
    ("101b 0004 4d515454 04 ee 003c 0001 61 0001 77 0003 627965 0001 75 0001 70", 4,
     Connect(4, True, 60, "a", Will("w", b"bye", 1, True), "u", b"p")),
    # MQTT 5 CONNECT with session expiry interval 3600 (property 0x11)
    ("1013 0004 4d515454 05 02 003c 05 11 00000e10 0001 61", 5,
     Connect(5, True, 60, "a", properties=Properties(session_expiry_interval=3600))),
    # PUBLISH QoS 1 to "a/b", packet id 10, payload "hi"; at level 5 with an empty property length
    ("3209 0003 612f62 000a 6869", 4, Publish("a/b", b"hi", 1, packet_id=10)),
    ("320a 0003 612f62 000a 00 6869", 5, Publish("a/b", b"hi", 1, packet_id=10)),
    # PUBLISH QoS 0, retained, with a topic alias and an empty topic (MQTT 5)
    ("3107 0000 03 2300 05 7a", 5, Publish("", b"z", 0, True, properties=Properties(topic_alias=5))),
    # SUBSCRIBE packet id 1: "a/b" QoS 1, "c/#" QoS 2
    ("820e 0001 0003 612f62 01 0003 632f23 02", 4,
     Subscribe(1, (("a/b", SubOptions(1)), ("c/#", SubOptions(2))))),
    # MQTT 5 SUBSCRIBE: QoS 1, no local, retain as published, retain handling 2 (options 0x2d)
    ("8209 0001 00 0003 612f62 2d", 5, Subscribe(1, (("a/b", SubOptions(1, True, True, 2)),))),
    ("a205 0002 0001 78", 4, Unsubscribe(2, ("x",))),
    ("6202 0003", 4, Pubrel(3)),
    ("c000", 4, Pingreq()),
    ("e000", 4, Disconnect()),
    ("e000", 5, Disconnect()),
    ("e001 04", 5, Disconnect(Reason.DISCONNECT_WITH_WILL_MESSAGE)),
    ("4002 0001", 5, Puback(1)),
    ("4003 0001 10", 5, Puback(1, Reason.NO_MATCHING_SUBSCRIBERS)),
    ("f000", 5, Auth()),
])
def test_client_vectors_decode_and_encode(hexa: str, level: int, packet: Packet) -> None:
    wire = bytes.fromhex(hexa.replace(" ", ""))
    got = Decoder().feed(wire) if isinstance(packet, Connect) else after_connect(level, wire)
    assert got == [packet]
    assert encode(packet, level) == wire


@pytest.mark.parametrize(("hexa", "level", "packet"), [
    ("2002 0000", 4, Connack(False, Reason.SUCCESS)),
    ("2002 0100", 4, Connack(True, Reason.SUCCESS)),
    ("2002 0005", 4, Connack(False, Reason.NOT_AUTHORIZED)),
    ("2003 0000 00", 5, Connack(False, Reason.SUCCESS)),
    ("2003 0087 00", 5, Connack(False, Reason.NOT_AUTHORIZED)),
    ("9005 0001 00 01 80", 4, Suback(1, (0, 1, 0x80))),
    ("b002 0001", 4, Unsuback(1)),
    ("b004 0001 00 11", 5, Unsuback(1, (Reason.NO_SUBSCRIPTION_EXISTED,))),
    ("d000", 4, Pingresp()),
])
def test_server_vectors_decode_and_encode(hexa: str, level: int, packet: Packet) -> None:
    wire = bytes.fromhex(hexa.replace(" ", ""))
    assert Decoder(server=False, level=level).feed(wire) == [packet]
    assert encode(packet, level) == wire


def test_publish_from_a_server_may_carry_several_subscription_identifiers() -> None:
    wire = frame(0x30, s(b"t") + props(b"\x0b\x01", b"\x0b\x80\x01") + b"x")
    (p,) = Decoder(server=False, level=5).feed(wire)
    assert p == Publish("t", b"x", properties=Properties(subscription_identifiers=(1, 128)))
    assert encode(p, 5) == wire


def test_user_properties_keep_order_and_repeats() -> None:
    pairs = (("k", "2"), ("a", "1"), ("k", "2"))
    wire = frame(0xE0, b"\x00" + props(*(b"\x26" + s(k.encode()) + s(v.encode()) for k, v in pairs)))
    assert after_connect(5, wire) == [Disconnect(0, Properties(user_properties=pairs))]


# --- the decoder's state ---------------------------------------------------------------------------

def test_level_is_set_by_the_connect_and_a_second_connect_is_returned() -> None:
    d = Decoder()
    assert d.level is None
    first, second = encode(Connect(5, client_id="x"), 5), encode(Connect(4, client_id="y"), 4)
    assert d.feed(first[:5]) == [] and d.level is None
    assert d.feed(first[5:] + second) == [Connect(5, client_id="x"), Connect(4, client_id="y")]
    assert d.level == 5


@pytest.mark.parametrize("first", ["c000", "3000", "e000", "8200", "f000"])
def test_the_first_packet_must_be_a_connect(first: str) -> None:
    d = Decoder()
    with pytest.raises(ProtocolError):
        d.feed(bytes.fromhex(first)[:1])  # its first byte says enough
    assert d.level is None


@pytest.mark.parametrize("b0", [0x20, 0x90, 0xB0, 0xD0])
def test_packets_only_servers_send_are_refused_from_a_client(b0: int) -> None:
    refused(ProtocolError, 5, bytes([b0, 0]))


@pytest.mark.parametrize("b0", [0x10, 0x82, 0xA2, 0xC0])
def test_packets_only_clients_send_are_refused_from_a_server(b0: int) -> None:
    refused(ProtocolError, 5, bytes([b0, 0]), to_client=True)


def test_a_client_side_decoder_needs_its_level() -> None:
    with pytest.raises(ValueError):
        Decoder(server=False)


def test_an_announced_packet_over_the_maximum_is_refused_before_its_body() -> None:
    d = server(4)
    header = bytes([0x30]) + vbi(2 << 20)
    assert len(header) == 5  # 2 MiB needs a 4-byte remaining length
    with pytest.raises(PacketTooLarge):
        d.feed(header)
    with pytest.raises(PacketTooLarge):
        d.feed(b"\x00" * 100)
    # the maximum counts the whole packet, its fixed header too: 1 + 1 + 98 bytes pass, 1 + 1 + 99 do not
    body = s(b"t") + b"x" * 96
    assert len(server(4, 100).feed(frame(0x30, body[:-1]))) == 1
    with pytest.raises(PacketTooLarge):
        server(4, 100).feed(frame(0x30, body)[:2])


def test_a_remaining_length_of_more_than_four_bytes_is_malformed_without_a_fifth() -> None:
    refused(MalformedPacket, 4, b"\x30\xff\xff\xff\xff")


def test_a_remaining_length_not_in_its_shortest_form_is_malformed() -> None:
    refused(MalformedPacket, 4, b"\xc0\x80\x00")


# --- validation: fixed header ----------------------------------------------------------------------

@pytest.mark.parametrize("b0", [0x41, 0x52, 0x60, 0x63, 0x78, 0x80, 0x83, 0xA0, 0xAA, 0xC1, 0xE2, 0xF4])
def test_fixed_header_flags_other_than_the_spec_s_are_malformed(b0: int) -> None:
    refused(MalformedPacket, 5, bytes([b0]))


def test_connect_fixed_header_flags_are_checked_too() -> None:
    with pytest.raises(MalformedPacket):
        Decoder().feed(b"\x11")


def test_packet_type_0_is_malformed() -> None:
    refused(MalformedPacket, 4, b"\x00\x00")


def test_auth_does_not_exist_at_level_4() -> None:
    refused(MalformedPacket, 4, b"\xf0\x00")


def test_publish_qos_3_is_malformed() -> None:
    refused(MalformedPacket, 4, frame(0x36, s(b"t") + b"\x00\x01"))


def test_dup_on_a_qos_0_publish_is_malformed() -> None:
    refused(MalformedPacket, 4, frame(0x38, s(b"t")))


# --- validation: packet identifiers, topics, strings -----------------------------------------------

@pytest.mark.parametrize("wire", [
    frame(0x32, s(b"t") + b"\x00\x00"),
    frame(0x82, b"\x00\x00" + s(b"t") + b"\x00"),
    frame(0xA2, b"\x00\x00" + s(b"t")),
    frame(0x40, b"\x00\x00"),
])
def test_packet_identifier_0_is_malformed(wire: bytes) -> None:
    refused(MalformedPacket, 4, wire)


@pytest.mark.parametrize("topic", [b"a/+", b"#", b"a/#", b"+", b""])
@pytest.mark.parametrize("level", [4, 5])
def test_topic_names_with_wildcards_or_empty_are_refused(topic: bytes, level: int) -> None:
    refused(ProtocolError, level, frame(0x30, s(topic) + (b"\x00" if level == 5 else b"")))


def test_an_empty_topic_name_with_a_topic_alias_is_taken_at_level_5() -> None:
    assert after_connect(5, frame(0x30, s(b"") + props(b"\x23\x00\x01"))) == [
        Publish("", properties=Properties(topic_alias=1))]


@pytest.mark.parametrize("bad", [b"\xff", b"a\x00b", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82"])
def test_strings_that_are_not_mqtt_utf8_are_malformed(bad: bytes) -> None:
    refused(MalformedPacket, 4, frame(0x30, s(bad)))  # a topic
    with pytest.raises(MalformedPacket):
        Decoder().feed(connect_bytes(payload=s(bad)))  # a client identifier
    refused(MalformedPacket, 5, frame(0xE0, b"\x00" + props(b"\x26" + s(b"k") + s(bad))))  # a user property
    refused(MalformedPacket, 4, frame(0x82, b"\x00\x01" + s(bad) + b"\x00"))  # a topic filter


def test_a_string_running_past_the_packet_is_malformed() -> None:
    refused(MalformedPacket, 4, frame(0x30, b"\x00\x09abc"))


def test_a_publish_payload_is_bytes_not_validated() -> None:
    assert after_connect(5, frame(0x30, s(b"t") + props(b"\x01\x01") + b"\xff\x00")) == [
        Publish("t", b"\xff\x00", properties=Properties(payload_format_indicator=1))]


# --- validation: CONNECT ---------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "level"), [(b"MQIsdp", 3), (b"MQTT", 3), (b"MQTT", 6), (b"MQTT", 0),
                                              (b"MQIsdp", 4)])
def test_other_protocol_versions_are_unsupported_and_say_their_level(name: bytes, level: int) -> None:
    d = Decoder()
    with pytest.raises(UnsupportedProtocolVersion) as e:
        d.feed(connect_bytes(level, name=name))
    assert e.value.level == level and e.value.reason == Reason.UNSUPPORTED_PROTOCOL_VERSION
    with pytest.raises(UnsupportedProtocolVersion) as again:
        d.feed(b"")
    assert again.value.level == level
    assert d.level is None


def test_a_protocol_name_other_than_mqtt_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        Decoder().feed(connect_bytes(4, name=b"HTTP"))


@pytest.mark.parametrize("flags", [
    0x03,  # the reserved bit
    0x0A,  # will QoS without the will flag
    0x22,  # will retain without the will flag
    0x1E,  # will QoS 3
])
@pytest.mark.parametrize("level", [4, 5])
def test_connect_flags_against_the_spec_are_malformed(flags: int, level: int) -> None:
    payload = s(b"a") + (b"\x00" if level == 5 else b"") + s(b"w") + s(b"x")
    with pytest.raises(MalformedPacket):
        Decoder().feed(connect_bytes(level, flags, payload=payload))


def test_a_password_without_a_user_name_is_malformed_at_level_4_only() -> None:
    with pytest.raises(MalformedPacket):
        Decoder().feed(connect_bytes(4, 0x42, payload=s(b"a") + s(b"pw")))
    (c,) = Decoder().feed(connect_bytes(5, 0x42, payload=s(b"a") + s(b"pw")))
    assert isinstance(c, Connect) and c.username is None and c.password == b"pw"


def test_a_connect_with_bytes_left_over_is_malformed() -> None:
    with pytest.raises(MalformedPacket):
        Decoder().feed(connect_bytes(4, payload=s(b"a") + b"\x00"))


def test_a_truncated_connect_is_malformed() -> None:
    with pytest.raises(MalformedPacket):
        Decoder().feed(connect_bytes(4, 0x82, payload=s(b"a")))  # the user name flag, no user name


def test_authentication_data_without_a_method_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        Decoder().feed(connect_bytes(5, props=props(b"\x16" + s(b"d"))))


# --- validation: SUBSCRIBE, UNSUBSCRIBE ------------------------------------------------------------

@pytest.mark.parametrize("level", [4, 5])
def test_subscribe_and_unsubscribe_without_a_filter_are_protocol_errors(level: int) -> None:
    empty = b"\x00" if level == 5 else b""
    refused(ProtocolError, level, frame(0x82, b"\x00\x01" + empty))
    refused(ProtocolError, level, frame(0xA2, b"\x00\x01" + empty))


@pytest.mark.parametrize(("level", "options", "error"), [
    (5, 0x40, MalformedPacket), (5, 0x80, MalformedPacket),  # reserved bits 6-7
    (5, 0x03, ProtocolError),  # maximum QoS 3
    (5, 0x30, ProtocolError),  # retain handling 3
    (4, 0x04, MalformedPacket), (4, 0x80, MalformedPacket),  # 3.1.1: the upper 6 bits reserved
    (4, 0x03, MalformedPacket),  # 3.1.1: QoS 3
])
def test_subscription_options_against_the_spec(level: int, options: int, error: type[MqttError]) -> None:
    refused(error, level, frame(0x82, b"\x00\x01" + (b"\x00" if level == 5 else b"") + s(b"t") + bytes([options])))


def test_a_filter_without_its_options_byte_is_malformed() -> None:
    refused(MalformedPacket, 4, frame(0x82, b"\x00\x01" + s(b"t")))


# --- validation: properties ------------------------------------------------------------------------

def pub5(properties: bytes) -> bytes:
    return frame(0x30, s(b"t") + properties + b"payload")


@pytest.mark.parametrize(("wire", "error"), [
    (pub5(props(b"\x05\x00")), MalformedPacket),  # no property 0x05
    (pub5(props(b"\x12" + s(b"id"))), MalformedPacket),  # assigned client identifier: CONNACK only
    (pub5(props(b"\x18\x00\x00\x00\x01")), MalformedPacket),  # will delay interval: wills only
    (frame(0x40, b"\x00\x01\x00" + props(b"\x23\x00\x01")), MalformedPacket),  # topic alias on PUBACK
    (pub5(props(b"\x02\x00\x00\x00\x01", b"\x02\x00\x00\x00\x02")), ProtocolError),  # twice
    (pub5(props(b"\x03" + s(b"a"), b"\x03" + s(b"a"))), ProtocolError),
    (pub5(props(b"\x0b\x01")), ProtocolError),  # a subscription identifier from a client
    (frame(0x82, b"\x00\x01" + props(b"\x0b\x01", b"\x0b\x02") + s(b"t") + b"\x00"), ProtocolError),
    (frame(0x82, b"\x00\x01" + props(b"\x0b\x00") + s(b"t") + b"\x00"), ProtocolError),  # subscription id 0
    (pub5(props(b"\x01\x02")), ProtocolError),  # payload format indicator 2
    (pub5(props(b"\x08" + s(b"a/#"))), ProtocolError),  # a wildcard in the response topic
    (frame(0x30, s(b"t") + b"\x10\x02\x00"), MalformedPacket),  # property length past the packet end
    (pub5(b"\x03\x02\x00\x00"), MalformedPacket),  # a value past the property length
    (pub5(b"\x80\x80\x80\x80\x01"), MalformedPacket),  # a property length of 5 bytes
    (frame(0x30, s(b"t")), MalformedPacket),  # no property length at all
])
def test_properties_against_the_spec(wire: bytes, error: type[MqttError]) -> None:
    refused(error, 5, wire)


@pytest.mark.parametrize("prop", [
    b"\x21\x00\x00",  # receive maximum 0
    b"\x27\x00\x00\x00\x00",  # maximum packet size 0
    b"\x17\x02",  # request problem information 2
    b"\x19\x05",  # request response information 5
    b"\x11\x00\x00\x00\x01\x11\x00\x00\x00\x01",  # session expiry twice
])
def test_connect_property_values_against_the_spec(prop: bytes) -> None:
    with pytest.raises(ProtocolError):
        Decoder().feed(connect_bytes(5, props=props(prop)))


@pytest.mark.parametrize("prop", [b"\x24\x02", b"\x25\x02", b"\x28\x07", b"\x29\x02", b"\x2a\x02", b"\x21\x00\x00"])
def test_connack_property_values_against_the_spec(prop: bytes) -> None:
    refused(ProtocolError, 5, frame(0x20, b"\x00\x00" + props(prop)), to_client=True)


def test_will_properties_are_checked_as_will_properties() -> None:
    ok = s(b"a") + props(b"\x18\x00\x00\x00\x05") + s(b"w") + s(b"x")
    (c,) = Decoder().feed(connect_bytes(5, 0x06, payload=ok))
    assert isinstance(c, Connect) and c.will == Will("w", b"x", properties=Properties(will_delay_interval=5))
    session_expiry_in_a_will = s(b"a") + props(b"\x11\x00\x00\x00\x05") + s(b"w") + s(b"x")
    with pytest.raises(MalformedPacket):
        Decoder().feed(connect_bytes(5, 0x06, payload=session_expiry_in_a_will))


# --- validation: lengths and reason codes ----------------------------------------------------------

@pytest.mark.parametrize(("level", "wire", "to_client"), [
    (4, b"\xc0\x01\x00", False),  # PINGREQ with a body
    (4, b"\x40\x03\x00\x01\x00", False),  # a 3.1.1 PUBACK of 3 bytes
    (4, b"\xe0\x01\x00", False),  # a 3.1.1 DISCONNECT with a body
    (5, b"\x40\x05\x00\x01\x00\x00\x00", False),  # PUBACK: reason, properties, one byte more
    (5, b"\xe0\x03\x00\x00\x00", False),
    (4, b"\x20\x03\x00\x00\x00", True),  # a 3.1.1 CONNACK of 3 bytes
    (4, b"\xb0\x03\x00\x01\x00", True),  # a 3.1.1 UNSUBACK with a reason code
    (4, b"\xd0\x01\x00", True),
    (4, b"\x20\x02\x02\x00", True),  # reserved acknowledge flags
])
def test_bytes_left_over_where_the_spec_fixes_the_length_are_malformed(level: int, wire: bytes,
                                                                       to_client: bool) -> None:
    refused(MalformedPacket, level, wire, to_client=to_client)


@pytest.mark.parametrize(("level", "wire", "to_client"), [
    (5, b"\x40\x03\x00\x01\x05", False),  # PUBACK reason 0x05
    (5, b"\x62\x03\x00\x01\x10", False),  # PUBREL reason 0x10 (a PUBACK reason)
    (5, b"\xe0\x01\x18", False),  # DISCONNECT reason 0x18 (an AUTH reason)
    (5, b"\xf0\x01\x80", False),
    (5, b"\x20\x03\x00\x10\x00", True),  # CONNACK reason 0x10
    (4, b"\x20\x02\x00\x06", True),  # 3.1.1 return code 6
    (4, b"\x20\x02\x01\x05", True),  # session present on a refusal
    (5, b"\x20\x03\x01\x87\x00", True),
    (4, b"\x90\x03\x00\x01\x03", True),  # 3.1.1 SUBACK code 3
    (5, b"\x90\x04\x00\x01\x00\x10", True),
    (5, b"\x90\x03\x00\x01\x00", True),  # SUBACK without a code
    (5, b"\xb0\x03\x00\x01\x00", True),  # UNSUBACK without a code
])
def test_reason_codes_a_packet_may_not_carry_are_protocol_errors(level: int, wire: bytes, to_client: bool) -> None:
    refused(ProtocolError, level, wire, to_client=to_client)


def test_errors_carry_their_reason_code() -> None:
    assert MalformedPacket.reason == 0x81 and ProtocolError.reason == 0x82
    assert PacketTooLarge.reason == 0x95 and UnsupportedProtocolVersion.reason == 0x84


def test_error_messages_do_not_echo_huge_input() -> None:
    e = refused(ProtocolError, 4, frame(0x30, s(b"#" * 5000)))
    assert "PUBLISH" in str(e) and len(str(e)) < 200


# --- encoding --------------------------------------------------------------------------------------

def test_level_4_leaves_out_what_3_1_1_cannot_carry() -> None:
    rich = Properties(message_expiry_interval=5, user_properties=(("k", "v"),))
    assert encode(Publish("t", b"x", properties=rich), 4) == encode(Publish("t", b"x"), 4)
    assert encode(Puback(3, Reason.NO_MATCHING_SUBSCRIBERS, Properties(reason_string="r")), 4) == b"\x40\x02\x00\x03"
    assert encode(Disconnect(Reason.SERVER_SHUTTING_DOWN), 4) == b"\xe0\x00"
    assert encode(Unsuback(1, (0x11,)), 4) == b"\xb0\x02\x00\x01"
    assert encode(Suback(1, (0, 2, Reason.NOT_AUTHORIZED, Reason.QUOTA_EXCEEDED)), 4) == bytes.fromhex(
        "900600010002 8080")
    assert encode(Subscribe(1, (("t", SubOptions(1, True, True, 2)),)), 4) == frame(0x82, b"\x00\x01" + s(b"t") + b"\x01")


def test_mqtt_5_acks_are_as_short_as_the_spec_allows() -> None:
    assert encode(Pubrec(9), 5) == b"\x50\x02\x00\x09"
    assert encode(Pubcomp(9, Reason.PACKET_IDENTIFIER_NOT_FOUND), 5) == b"\x70\x03\x00\x09\x92"
    assert encode(Puback(9, 0, Properties(reason_string="r")), 5) == b"\x40\x08\x00\x09\x00\x04\x1f\x00\x01r"
    assert encode(Disconnect(), 5) == b"\xe0\x00" and encode(Auth(), 5) == b"\xf0\x00"


def test_auth_cannot_be_encoded_at_level_4() -> None:
    with pytest.raises(ValueError):
        encode(Auth(), 4)


@pytest.mark.parametrize(("packet", "level"), [
    (Publish("t", qos=1), 4),  # QoS 1 without a packet identifier
    (Publish("t", packet_id=1), 4),  # a packet identifier at QoS 0
    (Publish("a/+"), 5),
    (Publish(""), 5),  # no topic alias either
    (Publish("t", properties=Properties(session_expiry_interval=1)), 5),
    (Connect(4), 5),  # a level-4 CONNECT at level 5
    (Connect(4, password=b"p"), 4),
    (Subscribe(1, ()), 4),
    (Subscribe(1, (("t", SubOptions(3)),)), 5),
    (Puback(0), 5),
    (Puback(1, 0x87 + 0x100), 5),
    (Connack(False, Connack311.NOT_AUTHORIZED), 4),  # a 3.1.1 code where the MQTT 5 reason belongs
    (Unsuback(1), 5),
    (Publish("t\x00"), 4),
    (Publish("t", properties=Properties(receive_maximum=0)), 5),
    (Publish("t"), 3),
])
def test_packets_mqtt_cannot_carry_are_value_errors(packet: Packet, level: int) -> None:
    with pytest.raises(ValueError):
        encode(packet, level)


@pytest.mark.parametrize(("reason", "code"), [
    (Reason.SUCCESS, Connack311.ACCEPTED),
    (Reason.UNSUPPORTED_PROTOCOL_VERSION, Connack311.UNACCEPTABLE_PROTOCOL_VERSION),
    (Reason.CLIENT_IDENTIFIER_NOT_VALID, Connack311.IDENTIFIER_REJECTED),
    (Reason.SERVER_UNAVAILABLE, Connack311.SERVER_UNAVAILABLE),
    (Reason.SERVER_BUSY, Connack311.SERVER_UNAVAILABLE),
    (Reason.MALFORMED_PACKET, Connack311.SERVER_UNAVAILABLE),
    (Reason.BAD_USER_NAME_OR_PASSWORD, Connack311.BAD_USER_NAME_OR_PASSWORD),
    (Reason.BAD_AUTHENTICATION_METHOD, Connack311.BAD_USER_NAME_OR_PASSWORD),
    (Reason.NOT_AUTHORIZED, Connack311.NOT_AUTHORIZED),
    (Reason.BANNED, Connack311.NOT_AUTHORIZED),
])
def test_connack_code_maps_mqtt_5_reasons_to_the_nearest_3_1_1_code(reason: Reason, code: Connack311) -> None:
    assert connack_code(reason, 4) == code
    assert connack_code(reason, 5) == reason
    assert encode(Connack(False, reason), 4) == bytes([0x20, 2, 0, code])


def test_connack_code_maps_every_connack_reason_and_only_those() -> None:
    assert {connack_code(r, 4) for r in REASONS[P.CONNACK]} == set(Connack311)
    with pytest.raises(ValueError):
        connack_code(Reason.NO_MATCHING_SUBSCRIBERS, 4)


# MQTT 5 spec 2.2.2.2, Table 2-4, copied by hand: id, wire type, where allowed
TABLE_2_4 = """
01 byte   PUBLISH WILL
02 four   PUBLISH WILL
03 utf8   PUBLISH WILL
08 utf8   PUBLISH WILL
09 binary PUBLISH WILL
0B varint PUBLISH SUBSCRIBE
11 four   CONNECT CONNACK DISCONNECT
12 utf8   CONNACK
13 two    CONNACK
15 utf8   CONNECT CONNACK AUTH
16 binary CONNECT CONNACK AUTH
17 byte   CONNECT
18 four   WILL
19 byte   CONNECT
1A utf8   CONNACK
1C utf8   CONNACK DISCONNECT
1F utf8   CONNACK PUBACK PUBREC PUBREL PUBCOMP SUBACK UNSUBACK DISCONNECT AUTH
21 two    CONNECT CONNACK
22 two    CONNECT CONNACK
23 two    PUBLISH
24 byte   CONNACK
25 byte   CONNACK
26 pair   CONNECT CONNACK PUBLISH WILL PUBACK PUBREC PUBREL PUBCOMP SUBSCRIBE SUBACK UNSUBSCRIBE UNSUBACK DISCONNECT AUTH
27 four   CONNECT CONNACK
28 byte   CONNACK
29 byte   CONNACK
2A byte   CONNACK
"""
WIRES = {"byte": Wire.BYTE, "two": Wire.TWO_BYTE, "four": Wire.FOUR_BYTE, "varint": Wire.VARINT,
         "utf8": Wire.UTF8, "pair": Wire.UTF8_PAIR, "binary": Wire.BINARY}


def test_the_property_table_is_the_spec_s() -> None:
    spec: dict[int, tuple[Wire, frozenset[Where]]] = {}
    for line in TABLE_2_4.strip().splitlines():
        pid, wire, *where = line.split()
        spec[int(pid, 16)] = (WIRES[wire], frozenset(WILL if w == "WILL" else P[w] for w in where))
    assert {pid: (s.wire, s.allowed) for pid, s in PROPERTIES.items()} == spec
    assert {s.field for s in PROPERTIES.values()} == {f.name for f in dataclasses.fields(Properties)}


# --- fuzz ------------------------------------------------------------------------------------------

def take(d: Decoder, pieces: list[bytes]) -> None:
    """Feed `pieces`: only packets of their types come out, or an MqttError."""
    for piece in pieces:
        try:
            got = d.feed(piece)
        except MqttError:
            return
        assert all(sane(p) for p in got), got


# first bytes of a fixed header that some decoder takes, so that random bodies get looked at
HEADS = st.sampled_from([0x10, 0x20, *range(0x30, 0x40), 0x40, 0x50, 0x62, 0x70, 0x82, 0x90, 0xA2, 0xB0, 0xC0,
                         0xD0, 0xE0, 0xF0])


@FAST
@given(LEVELS, HEADS, st.integers(0, 40), st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=4))
def test_random_bytes_after_a_connect_raise_only_mqtt_errors(level: int, b0: int, size: int, junk: bytes,
                                                             cuts: list[int]) -> None:
    wire = bytes([b0, size]) + junk
    take(server(level), chunks(wire, [c for c in cuts if c <= len(wire)]))


@FAST
@given(LEVELS, HEADS, st.integers(0, 40), st.binary(max_size=300))
def test_random_bytes_to_a_client_raise_only_mqtt_errors(level: int, b0: int, size: int, junk: bytes) -> None:
    take(Decoder(server=False, level=level), [bytes([b0, size]) + junk])


@FAST
@given(st.binary(max_size=100))
def test_random_bytes_as_a_first_packet_raise_only_mqtt_errors(junk: bytes) -> None:
    take(Decoder(), [connect_bytes(5)[:3] + junk])
    take(Decoder(), [b"\x10" + junk])


@st.composite
def mutated(draw: st.DrawFn, wire: bytes) -> bytes:
    out = bytearray(wire)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, max(len(out) - 1, 0)))
        how = draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        if how == "insert" or not out:
            out[i:i] = bytes([draw(st.integers(0, 255))])
        elif how == "delete":
            del out[i]
        elif how == "flip":
            out[i] ^= 1 << draw(st.integers(0, 7))
        else:
            out[i] = draw(st.integers(0, 255))
    return bytes(out)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_packets_raise_only_mqtt_errors(data: st.DataObject) -> None:
    level = data.draw(LEVELS)
    to_client = data.draw(st.booleans())
    strategy = server_packets(level) if to_client else client_packets(level)
    packets = data.draw(st.lists(strategy, min_size=1, max_size=3))
    wire = data.draw(mutated(b"".join(encode(p, level) for p in packets)))
    d = Decoder(server=False, level=level) if to_client else server(level)
    take(d, chunks(wire, data.draw(st.lists(st.integers(0, len(wire)), max_size=3))))


@settings(max_examples=100)
@given(st.data())
def test_mutated_connects_raise_only_mqtt_errors(data: st.DataObject) -> None:
    level = data.draw(LEVELS)
    wire = data.draw(mutated(encode(data.draw(connects(level)), level)))
    take(Decoder(), [wire])
