"""MQTT content <-> AMQP message bytes (router/mqtt/mapping.py).

The round trip MQTT -> AMQP -> MQTT is exact. Proton reads every field that ``to_amqp`` writes.
``from_amqp`` reads what Proton writes by the documented rules, which are restated here as a model
over Proton's own reading of the same bytes. It also reads sections it should pass over, drops what
MQTT cannot carry, and raises ``NotAMessage`` and nothing else on bytes that are not a message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import uuid
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Data, Message, char, float32, symbol, timestamp, ubyte, ulong

from oncemesh.router.mqtt.mapping import (
    AMQP_BODY_CONTENT_TYPE,
    CONTENT_TYPE_ANNOTATION,
    MAX_EXPIRY,
    PAYLOAD_FORMAT_ANNOTATION,
    USER_PROPERTIES_ANNOTATION,
    Decoded,
    MqttContent,
    NotAMessage,
    from_amqp,
    to_amqp,
)

NOW = 1_700_000_000_000  # ms since the epoch


def mqtt_text(min_size: int = 0, max_size: int = 12, exclude: str = "\x00") -> st.SearchStrategy[str]:
    """Strings an MQTT packet can carry (no NUL, no lone surrogate), short, or long enough to need
    AMQP's 4-byte sizes."""
    chars = st.characters(blacklist_characters=exclude, blacklist_categories=("Cs",))
    return st.one_of(st.text(chars, min_size=min_size, max_size=max_size), st.text(chars, min_size=90, max_size=300))


TEXT = mqtt_text()
TOPICS = mqtt_text(min_size=1, exclude="\x00+#")
NAMES = st.one_of(st.sampled_from(["a", "b", "", "é"]), TEXT)  # few names, so that they repeat
CONTENTS = st.builds(
    MqttContent,
    payload=st.binary(max_size=600),
    content_type=st.none() | TEXT,
    response_topic=st.none() | TOPICS,
    correlation_data=st.none() | st.binary(max_size=300),
    user_properties=st.lists(st.tuples(NAMES, TEXT), max_size=6).map(tuple),
    message_expiry=st.none() | st.integers(0, MAX_EXPIRY),
    payload_format=st.none() | st.sampled_from([0, 1]),
)
NOWS = st.integers(1, 2**45)


def proton(data: bytes | bytearray) -> Message:
    m = Message()
    m.decode(data)
    return m


def proton_content_type(data: bytes | bytearray) -> str | None:
    """The properties' content-type as Proton's decoder reads it (`Message.content_type` says
    symbol('None') when there is none)."""
    rest = bytes(data)
    while rest:
        d = Data()
        rest = rest[d.decode(rest):]
        d.rewind()
        d.next()
        section = d.get_object()
        if section.descriptor == 0x73:
            return section.value[6] if len(section.value) > 6 else None
    return None


def first_values(pairs: tuple[tuple[str, str], ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in pairs:
        out.setdefault(name, value)
    return out


# ----------------------------------------------------------------------------- MQTT -> AMQP -> MQTT

@given(TOPICS, CONTENTS, NOWS)
@settings(max_examples=300)
def test_the_round_trip_gives_the_content_back(topic: str, c: MqttContent, now: int) -> None:
    back = from_amqp(to_amqp(topic, c, now), now)
    assert back == c
    assert type(back.payload) is bytes


def test_repeated_user_property_names_come_back_in_order() -> None:
    c = MqttContent(payload=b"p", user_properties=(("a", "1"), ("b", "2"), ("a", "3"), ("a", "1")))
    assert from_amqp(to_amqp("t", c, NOW), NOW).user_properties == c.user_properties


@given(st.integers(1, MAX_EXPIRY), st.integers(0, 10**7))
def test_the_expiry_counts_down_from_the_absolute_time(expiry: int, later_ms: int) -> None:
    data = to_amqp("t", MqttContent(payload=b"", message_expiry=expiry), NOW)
    left_ms = expiry * 1000 - later_ms
    want = 0 if left_ms <= 0 else math.ceil(left_ms / 1000)
    assert from_amqp(data, NOW + later_ms).message_expiry == want


def test_an_expiry_due_or_past_is_zero_and_one_not_yet_due_is_at_least_one() -> None:
    data = to_amqp("t", MqttContent(payload=b"", message_expiry=2), NOW)
    assert from_amqp(data, NOW + 1999).message_expiry == 1
    assert from_amqp(data, NOW + 2000).message_expiry == 0
    assert from_amqp(data, NOW + 10**9).message_expiry == 0


def test_what_no_mqtt_packet_holds_is_refused_by_to_amqp() -> None:
    for bad in (MqttContent(payload=b"", message_expiry=-1), MqttContent(payload=b"", message_expiry=MAX_EXPIRY + 1),
                MqttContent(payload=b"", payload_format=2)):
        with pytest.raises(ValueError):
            to_amqp("t", bad, NOW)


# ----------------------------------------------------------------------------- Proton reads to_amqp

@given(TOPICS, CONTENTS, NOWS)
@settings(max_examples=300)
def test_proton_reads_every_field_to_amqp_writes(topic: str, c: MqttContent, now: int) -> None:
    data = to_amqp(topic, c, now)
    m = proton(data)
    assert m.address == topic
    assert bytes(m.body) == c.payload  # one data section
    ascii_type = c.content_type is not None and c.content_type.isascii()
    assert proton_content_type(data) == (c.content_type if ascii_type else None)
    assert m.reply_to == c.response_topic
    assert (None if m.correlation_id is None else bytes(m.correlation_id)) == c.correlation_data
    assert (m.properties or {}) == first_values(c.user_properties)
    assert list(m.properties or {}) == list(first_values(c.user_properties))  # the list's order
    annotations = m.annotations or {}
    repeats = len(first_values(c.user_properties)) < len(c.user_properties)
    if repeats:
        assert annotations[symbol(USER_PROPERTIES_ANNOTATION)] == [list(p) for p in c.user_properties]
    else:
        assert symbol(USER_PROPERTIES_ANNOTATION) not in annotations  # nothing to add when no name repeats
    if c.content_type is None or ascii_type:
        assert symbol(CONTENT_TYPE_ANNOTATION) not in annotations
    else:  # a symbol is ASCII: Proton's Data would raise on it (see the module's rules)
        assert annotations[symbol(CONTENT_TYPE_ANNOTATION)] == c.content_type
    if c.payload_format is None:
        assert symbol(PAYLOAD_FORMAT_ANNOTATION) not in annotations
    else:
        pf = annotations[symbol(PAYLOAD_FORMAT_ANNOTATION)]
        assert isinstance(pf, ubyte) and pf == c.payload_format
    if c.message_expiry is None:
        assert (m.ttl, m.durable, m.expiry_time, m.creation_time) == (0, False, 0, 0)
    else:
        assert m.durable
        assert round(m.ttl * 1000) == min(c.message_expiry * 1000, 2**32 - 1)
        assert round(m.expiry_time * 1000) == now + c.message_expiry * 1000
        assert round(m.creation_time * 1000) == now


def test_proton_sees_the_first_value_of_a_repeated_name_and_the_whole_list_in_the_annotation() -> None:
    c = MqttContent(payload=b"x", user_properties=(("a", "1"), ("a", "2"), ("b", "3")))
    m = proton(to_amqp("t", c, NOW))
    assert m.properties == {"a": "1", "b": "3"}
    assert m.annotations == {symbol(USER_PROPERTIES_ANNOTATION): [["a", "1"], ["a", "2"], ["b", "3"]]}


def test_an_expiry_longer_than_the_ttl_can_hold_is_exact_in_the_absolute_time() -> None:
    data = to_amqp("t", MqttContent(payload=b"", message_expiry=MAX_EXPIRY), NOW)
    assert round(proton(data).ttl * 1000) == 2**32 - 1  # the header's uint, capped
    assert from_amqp(data, NOW).message_expiry == MAX_EXPIRY


# ----------------------------------------------------------------------------- from_amqp reads Proton

def reads(m: Message, now: int = NOW) -> MqttContent:
    return from_amqp(m.encode(), now)  # Proton's encode gives a bytearray: taken as well


@pytest.mark.parametrize(("body", "inferred", "payload", "payload_format"), [
    ("héllo", False, "héllo".encode(), 1),
    ("", False, b"", 1),
    (b"raw", False, b"raw", None),  # Proton writes bytes as an amqp-value holding binary
    (b"raw", True, b"raw", None),  # ... and as a data section when told to
    (None, False, b"", None),  # no body section at all
])
def test_a_string_binary_or_absent_body_is_the_payload(body: object, inferred: bool, payload: bytes,
                                                       payload_format: int | None) -> None:
    c = reads(Message(body=body, inferred=inferred))
    assert (c.payload, c.payload_format, c.content_type) == (payload, payload_format, None)


@pytest.mark.parametrize(("body", "inferred", "code"), [
    ({"k": [1, 2], "n": None}, False, 0x77),
    ([1, "x", b"y"], False, 0x77),
    (5, False, 0x77),
    (uuid.UUID(int=7), False, 0x77),
    ([1, 2], True, 0x76),  # an amqp-sequence section
])
def test_any_other_body_is_carried_as_its_encoded_sections(body: object, inferred: bool, code: int) -> None:
    m = Message(body=body, inferred=inferred)
    m.content_type = symbol("application/json")  # said of the value, not of these bytes: replaced
    c = reads(m)
    assert c.content_type == AMQP_BODY_CONTENT_TYPE
    assert c.payload[:3] == bytes((0x00, 0x53, code))
    assert bytes(m.encode()).endswith(c.payload)  # the section's bytes as they came
    assert proton(c.payload).body == body  # any AMQP library reads the value back


def test_properties_become_the_mqtt_fields() -> None:
    m = Message(body=b"x", inferred=True)
    m.content_type = symbol("text/plain")
    m.reply_to = "replies/42"
    m.correlation_id = "req-1"
    c = reads(m)
    assert (c.content_type, c.response_topic, c.correlation_data) == ("text/plain", "replies/42", b"req-1")


@pytest.mark.parametrize(("correlation_id", "data"), [
    ("héllo", "héllo".encode()),
    (b"\x00\x01", b"\x00\x01"),
    (ulong(5), (5).to_bytes(8, "big")),
    (5, (5).to_bytes(8, "big")),  # Proton writes an int as a ulong
    (ulong(2**64 - 1), b"\xff" * 8),
    (uuid.UUID("12345678-1234-5678-1234-567812345678"), uuid.UUID("12345678-1234-5678-1234-567812345678").bytes),
])
def test_each_form_of_correlation_id_has_its_bytes(correlation_id: object, data: bytes) -> None:
    m = Message(body=b"")
    m.correlation_id = correlation_id
    assert reads(m).correlation_data == data


def test_application_properties_are_rendered_by_the_documented_rule_in_order() -> None:
    m = Message(body=b"")
    m.properties = {"s": "v", "n": -5, "big": 2**40, "t": True, "f": False, "d": 1.5, "e": 1e20,
                    "g": float32(0.1), "c": char("z"), "sym": symbol("q"),
                    # left out: no text every reader agrees on
                    "ts": timestamp(5), "bin": b"x", "u": uuid.UUID(int=1), "nl": None, "lst": [1], "map": {"a": 1}}
    assert reads(m).user_properties == (("s", "v"), ("n", "-5"), ("big", "1099511627776"), ("t", "true"),
                                        ("f", "false"), ("d", "1.5"), ("e", "1e+20"), ("g", "0.1"), ("c", "z"),
                                        ("sym", "q"))


def test_a_header_ttl_alone_is_rounded_up_and_the_absolute_time_wins_over_it() -> None:
    m = Message(body=b"")
    m.ttl = 2.001
    assert reads(m).message_expiry == 3
    m.ttl = 0.001
    assert reads(m).message_expiry == 1
    m.expiry_time = (NOW + 10_000) / 1000
    assert reads(m).message_expiry == 10
    m.expiry_time = (NOW - 1) / 1000
    assert reads(m).message_expiry == 0  # past: the caller drops it
    m.expiry_time = 2.0**40  # years away: capped at what MQTT can say
    assert reads(m).message_expiry == MAX_EXPIRY


def test_a_zero_ttl_or_absolute_expiry_time_reads_as_unset() -> None:
    """Proton writes 0 for unset (and never an explicit 0): a writer that meant "no expiry" must not
    have its messages dropped."""
    header = b"\x00\x53\x70\xc0\x08\x03\x40\x40\x70\x00\x00\x13\x88"  # ttl 5000 ms
    zero_ttl = b"\x00\x53\x70\xc0\x04\x03\x40\x40\x43"
    zero_time = b"\x00\x53\x73\xc0\x12\x09" + b"\x40" * 8 + b"\x83" + bytes(8)
    data = b"\x00\x53\x75\xa0\x00"
    assert from_amqp(header + zero_time + data, NOW).message_expiry == 5
    assert from_amqp(zero_ttl + zero_time + data, NOW).message_expiry is None


def test_a_message_with_nothing_set_has_nothing_but_its_payload() -> None:
    assert reads(Message(body=b"p", inferred=True)) == MqttContent(payload=b"p")


@st.composite
def proton_messages(draw: st.DrawFn) -> Message:
    body = draw(st.one_of(st.none(), st.text(max_size=40), st.binary(max_size=300), st.integers(-2**63, 2**63 - 1),
                          st.lists(st.integers(0, 9), max_size=4),
                          st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3)))
    m = Message(body=body, inferred=isinstance(body, bytes | list) and draw(st.booleans()))
    if draw(st.booleans()):
        m.content_type = symbol(draw(st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=20)))
    if draw(st.booleans()):
        m.reply_to = draw(st.text(st.sampled_from("ab/+#\x00é"), max_size=6))
    if draw(st.booleans()):
        m.correlation_id = draw(st.one_of(st.text(max_size=10), st.binary(max_size=10),
                                          st.integers(0, 2**64 - 1).map(ulong), st.uuids()))
    if draw(st.booleans()):
        m.properties = draw(st.dictionaries(
            st.text(st.sampled_from("ab\x00é"), max_size=3),
            st.one_of(st.text(st.sampled_from("xy\x00é"), max_size=3), st.integers(-2**63, 2**63 - 1), st.booleans(),
                      st.binary(max_size=3)), max_size=5))
    if draw(st.booleans()):
        m.ttl = draw(st.integers(0, 2**32 - 1)) / 1000
    if draw(st.booleans()):
        m.expiry_time = draw(st.integers(1, 2**42)) / 1000
    if draw(st.booleans()):
        m.annotations = {symbol("x-opt-other"): draw(st.integers(0, 9))}
    if draw(st.booleans()):
        m.instructions = {symbol("x-opt-delivery"): draw(st.text(max_size=5))}
    return m


def carried(s: str | None) -> str | None:
    return s if s is not None and "\x00" not in s and len(s.encode()) <= 65535 else None


def rendered(v: object) -> str | None:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return carried(v) if isinstance(v, str) else None


def model(m: Message, now: int) -> MqttContent:
    """The module docstring's rules, applied to what Proton read from the same bytes."""
    body = m.body
    content_type, payload_format = carried(proton_content_type(m.encode())), None
    if isinstance(body, str):
        payload, payload_format = body.encode(), 1
    elif isinstance(body, bytes | bytearray | memoryview):
        payload = bytes(body)
    elif body is None:
        payload = b""
    else:
        payload, content_type = b"", AMQP_BODY_CONTENT_TYPE  # the payload is checked by decoding it
    reply_to = m.reply_to if m.reply_to and not set(m.reply_to) & {"+", "#", "\x00"} else None
    cid = m.correlation_id
    correlation = (cid.encode() if isinstance(cid, str) else bytes(cid) if isinstance(cid, bytes | memoryview)
                   else cid.bytes if isinstance(cid, uuid.UUID) else None if cid is None else int(cid).to_bytes(8, "big"))
    pairs = tuple((k, r) for k, v in (m.properties or {}).items() if carried(k) is not None
                  and (r := rendered(v)) is not None)
    expiry_ms, ttl_ms = round(m.expiry_time * 1000), round(m.ttl * 1000)
    expiry = (min(max(0, math.ceil((expiry_ms - now) / 1000)), MAX_EXPIRY) if expiry_ms
              else math.ceil(ttl_ms / 1000) if ttl_ms else None)
    return MqttContent(payload=payload, content_type=content_type, response_topic=reply_to, correlation_data=correlation,
                       user_properties=pairs, message_expiry=expiry, payload_format=payload_format)


@given(proton_messages(), NOWS)
@settings(max_examples=400)
def test_any_proton_message_reads_by_the_documented_rules(m: Message, now: int) -> None:
    data = bytes(m.encode())
    got, want = from_amqp(data, now), model(proton(data), now)
    if want.content_type == AMQP_BODY_CONTENT_TYPE:
        assert proton(got.payload).body == m.body
        got = dataclasses.replace(got, payload=b"")
    assert got == want


# ----------------------------------------------------------------------------- other writers' sections

def test_delivery_annotations_message_annotations_footer_and_unknown_sections_are_passed_over() -> None:
    m = Message(body=b"payload", inferred=True)
    m.reply_to = "r"
    m.properties = {"k": "v"}
    plain = reads(m)
    m.instructions = {symbol("x-opt-hop"): 3, symbol("x-list"): [1, [2, {"a": b"b"}]]}
    m.annotations = {symbol("x-opt-trace"): ["a", "b"], ulong(7): "reserved key"}
    footer = b"\x00\x53\x78\xc1\x0b\x02\xa3\x05x-sig\xa0\x01\x00"
    unknown = b"\x00\x53\x79\xa1\x03abc" + b"\x00\xa3\x0cx-vendor:foo\x45"
    data = bytes(m.encode())
    got = from_amqp(data + footer + unknown, NOW)
    assert got == plain == MqttContent(payload=b"payload", response_topic="r", user_properties=(("k", "v"),))


def test_sections_named_by_ulong_or_symbol_descriptors_are_read() -> None:
    properties = b"\xc0\x0a\x05\x40\x40\xa1\x01t\x40\xa1\x01r"
    by_ulong = b"\x00\x80" + (0x73).to_bytes(8, "big") + properties
    by_name = b"\x00\xa3\x14amqp:properties:list" + properties
    data = b"\x00\xa3\x10amqp:data:binary\xa0\x02hi" + b"\x00\x53\x75\xb0\x00\x00\x00\x01!"  # two data sections
    for section in (by_ulong, by_name):
        assert from_amqp(section + data, NOW) == MqttContent(payload=b"hi!", response_topic="r")


def test_a_stale_user_property_list_yields_to_the_application_properties() -> None:
    """A Proton client that decodes a message, changes its properties and sends it on keeps its old
    annotations: its change wins over the stale list."""
    m = proton(to_amqp("t", MqttContent(payload=b"", user_properties=(("a", "1"), ("a", "2"))), NOW))
    m.properties = {"a": "9"}
    assert reads(m).user_properties == (("a", "9"),)


@pytest.mark.parametrize("value", ["not a list", [["a"]], [["a", 1]], [[b"a", "b"]], [["a", "b", "c"]], [["a\x00", "b"]]])
def test_someone_elses_annotation_of_that_name_is_ignored(value: object) -> None:
    m = Message(body=b"")
    m.properties = {"a": "x"}
    m.annotations = {symbol(USER_PROPERTIES_ANNOTATION): value}
    assert reads(m).user_properties == (("a", "x"),)


@pytest.mark.parametrize(("value", "body", "want"), [
    (ubyte(1), b"x", 1), (ubyte(0), "text", 0), (7, b"x", None), ("1", b"x", None), (ubyte(1), {"a": 1}, None),
])
def test_the_payload_format_annotation(value: object, body: object, want: int | None) -> None:
    m = Message(body=body)
    m.annotations = {symbol(PAYLOAD_FORMAT_ANNOTATION): value}
    assert reads(m).payload_format == want


# ----------------------------------------------------------------------------- what MQTT cannot carry

def with_reply_to(reply_to: str) -> bytes:
    """A message whose properties' reply-to is `reply_to`, written by hand (Proton cuts a string at
    a NUL), in the 4-byte-size forms."""
    text = reply_to.encode()
    fields = b"\x40\x40\x40\x40\xb1" + len(text).to_bytes(4, "big") + text
    properties = b"\xd0" + (len(fields) + 4).to_bytes(4, "big") + (5).to_bytes(4, "big") + fields
    return b"\x00\x53\x73" + properties + b"\x00\x53\x75\xa0\x00"


@pytest.mark.parametrize("reply_to", ["", "a/+", "a/#", "a\x00b", "x" * 65536])
def test_a_reply_to_that_is_no_mqtt_topic_name_is_left_out(reply_to: str) -> None:
    assert from_amqp(with_reply_to(reply_to), NOW).response_topic is None
    assert from_amqp(with_reply_to("replies/1"), NOW).response_topic == "replies/1"  # the same bytes, a good name


def test_strings_and_binary_mqtt_cannot_carry_are_left_out_not_the_message() -> None:
    m = Message(body=b"kept")
    m.content_type = symbol("t" * 65536)
    m.correlation_id = b"c" * 65536
    m.properties = {"ok": "1", "nul\x00": "x", "v": "nul\x00", "long": "l" * 65536}
    assert reads(m) == MqttContent(payload=b"kept", user_properties=(("ok", "1"),))


def test_a_string_body_that_is_not_utf8_is_no_text() -> None:
    data = b"\x00\x53\x77\xa1\x02\xc3\x28"  # Proton will not write it; another client might
    assert from_amqp(data, NOW) == MqttContent(payload=b"\xc3\x28")


# ----------------------------------------------------------------------------- bytes that are not messages

@pytest.mark.parametrize("data", [
    b"", b"\x00", b"\x00\x53", b"\x00\x53\x75", b"\xa1\x01x",
    b"\x00\x53\x75\xa1\x01x",  # a data section holding a string
    b"\x00\x53\x73\xa1\x01x",  # properties that are no list
    b"\x00\x53\x74\xc1\x03\x01\xa1\x00",  # a map with an odd count
    b"\x00\x53\x73\xd0\x00\x00\x00\x04\xff\xff\xff\xff",  # 4 billion items in no bytes
    b"\x00" * 100_000,  # descriptors all the way down: no recursion
    b"\x00\x53\x75\xa0\x05ab",  # runs past the end
])
def test_bytes_that_are_not_a_message_raise_not_a_message(data: bytes) -> None:
    with pytest.raises(NotAMessage):
        from_amqp(data, NOW)


@given(st.binary(max_size=200))
@settings(max_examples=500)
def test_random_bytes_read_or_raise_not_a_message(data: bytes) -> None:
    with contextlib.suppress(NotAMessage):
        from_amqp(data, NOW)


def seeds() -> list[bytes]:
    """Messages with every section and field the reader looks at, to be mutated."""
    full = MqttContent(payload=b"p" * 300, content_type="text/plain", response_topic="r/1", correlation_data=b"c",
                       user_properties=(("a", "1"), ("a", "2"), ("b", "x" * 300)), message_expiry=60, payload_format=1)
    out = [to_amqp("t/x", full, NOW), to_amqp("t", MqttContent(payload=b""), NOW),
           to_amqp("t", MqttContent(payload=b"", content_type="tëxt"), NOW)]
    for body, inferred in (("text", False), (b"bin", False), ({"k": [1, None]}, False), ([1, 2], True), (None, False)):
        m = Message(body=body, inferred=inferred)
        m.instructions = {symbol("x-opt-hop"): [1, {"a": b"b"}]}
        m.annotations = {symbol("x-opt-trace"): "x", symbol(PAYLOAD_FORMAT_ANNOTATION): ubyte(0)}
        m.properties = {"s": "v", "n": -5, "t": True, "d": 1.5, "g": float32(0.1), "c": char("z"), "u": uuid.UUID(int=1)}
        m.reply_to, m.correlation_id, m.content_type, m.ttl = "r", ulong(7), symbol("a/b"), 2.5
        m.expiry_time = (NOW + 5000) / 1000
        out.append(bytes(m.encode()) + b"\x00\x53\x78\xc1\x0b\x02\xa3\x05x-sig\xa0\x01\x00")
    return out


SEEDS = seeds()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(0, len(data) - 1)))
        op = draw(st.sampled_from(["set", "insert", "delete", "truncate"]))
        if op == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 4))]
        else:
            del data[at:]
    return bytes(data)


@given(mutated())
@settings(max_examples=600)
def test_mutated_messages_read_or_raise_not_a_message(data: bytes) -> None:
    try:
        c = from_amqp(data, NOW)
    except NotAMessage:
        return
    assert type(c.payload) is bytes
    assert all(type(n) is str and type(v) is str for n, v in c.user_properties)


def test_a_payload_is_read_once_and_only_what_time_does_not_change_is_kept() -> None:
    """`Decoded`: the same payload object is read once (a message delivered to several MQTT
    subscribers, or published by one here); a content with an expiry is read again each time (its
    seconds left change), a bytearray is never kept (it may change), and the cache starts again
    when full."""
    d = Decoded()
    c = MqttContent(payload=b"p", content_type="text/plain", user_properties=(("a", "1"),))
    data = to_amqp("t", c, NOW)
    d.remember(data, c)
    assert d.content(data, NOW + 10_000) is c
    other = to_amqp("t", MqttContent(payload=b"q"), NOW)
    first = d.content(other, NOW)
    assert first == MqttContent(payload=b"q") and d.content(other, NOW) is first
    copy = bytes(bytearray(other))  # (equal bytes, another object: read again)
    again = d.content(copy, NOW)
    assert again == first and again is not first
    ex = MqttContent(payload=b"e", message_expiry=60)
    exdata = to_amqp("t", ex, NOW)
    d.remember(exdata, ex)
    assert d.content(exdata, NOW + 30_000).message_expiry == 30
    mutable = cast(bytes, bytearray(other))
    assert d.content(mutable, NOW) == first and d.content(mutable, NOW) is not d.content(mutable, NOW)
    for i in range(Decoded.MAX_ENTRIES + 1):
        d.remember(to_amqp("t", MqttContent(payload=b"%d" % i), NOW), MqttContent(payload=b"%d" % i))
    assert d.content(data, NOW) is not c and d.content(data, NOW) == c
