"""Setting a message's `to` in its bytes (common/amqpmsg.py), checked against Proton: the field set
when it was empty, everything else as it was, and bytes that are not a message left alone."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message, symbol

from oncemesh.common.amqpmsg import Unreadable, read_to, skip, with_to

TEXT = st.text(max_size=300)
BODIES = st.one_of(st.none(), TEXT, st.binary(max_size=600), st.integers(-2**63, 2**63 - 1),
                   st.lists(st.integers(0, 1000), max_size=5), st.dictionaries(st.text(max_size=5), st.integers(-2**63, 2**63 - 1), max_size=4))


@st.composite
def messages(draw: st.DrawFn) -> Message:
    m = Message(body=draw(BODIES))
    if draw(st.booleans()):
        m.address = draw(st.text(min_size=1, max_size=300))
    if draw(st.booleans()):
        m.id = draw(st.one_of(st.text(max_size=40), st.integers(0, 2**64 - 1), st.builds(uuid.UUID, st.uuids().map(str))))
    if draw(st.booleans()):
        m.subject = draw(TEXT)
    if draw(st.booleans()):
        m.reply_to = draw(TEXT)
    if draw(st.booleans()):
        m.correlation_id = draw(st.text(max_size=40))
    if draw(st.booleans()):
        m.content_type = symbol(draw(st.text(alphabet="abcdef/+-", max_size=20)))
    if draw(st.booleans()):
        m.group_id = draw(TEXT)
        m.group_sequence = draw(st.integers(0, 2**32 - 1))
    if draw(st.booleans()):
        m.creation_time = float(draw(st.integers(0, 2**40)))
    if draw(st.booleans()):
        m.durable = True
        m.priority = draw(st.integers(0, 9))
        m.ttl = draw(st.integers(0, 2**31 - 1)) / 1000
    if draw(st.booleans()):
        m.annotations = {symbol("x-opt-" + k): v for k, v in draw(st.dictionaries(st.text(alphabet="abc", min_size=1, max_size=4),
                                                                                  st.integers(0, 99), max_size=3)).items()}
    if draw(st.booleans()):
        m.instructions = {symbol("x-" + k): v for k, v in draw(st.dictionaries(st.text(alphabet="xyz", min_size=1, max_size=4),
                                                                               st.text(max_size=9), max_size=3)).items()}
    if draw(st.booleans()):
        m.properties = draw(st.dictionaries(st.text(max_size=8), st.one_of(st.integers(-2**31, 2**31 - 1), TEXT), max_size=5))
    return m


FIELDS = ("body", "id", "subject", "reply_to", "correlation_id", "content_type", "group_id", "group_sequence",
          "creation_time", "durable", "priority", "ttl", "annotations", "instructions", "properties", "user_id")


NAMES = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=300)


@given(messages(), NAMES)
@settings(max_examples=300, deadline=None)
def test_to_is_set_when_empty_and_nothing_else_changes(m: Message, to: str) -> None:
    payload = bytes(m.encode())
    out = with_to(payload, to)
    got = Message()
    got.decode(out)
    assert got.address == (m.address if m.address is not None else to)
    for f in FIELDS:
        assert getattr(got, f) == getattr(m, f), f
    if m.address is not None:
        assert out == payload  # the publisher named it: not a byte changed


def test_every_section_but_the_properties_is_copied_byte_for_byte() -> None:
    data = b"\x00\x53\x75\xa0\x03abc"  # two data sections (Proton's Message cannot hold them)
    header = b"\x00\x53\x70\xc0\x02\x01\x41"  # durable
    footer = b"\x00\x53\x78\xc1\x01\x00"
    out = with_to(header + data + data + footer, "t/a")
    assert out == header + b"\x00\x53\x73\xc0\x08\x03\x40\x40\xa1\x03t/a" + data + data + footer
    # a properties section with fewer fields than `to`'s place, in its ulong-descriptor form
    props = b"\x00\x80" + (0x73).to_bytes(8, "big") + b"\xc0\x03\x01\xa1\x00"
    out = with_to(props + data, "x")
    assert out == b"\x00\x53\x73\xc0\x07\x03\xa1\x00\x40\xa1\x01x" + data
    # a long `to` and a long list: the 4-byte forms
    out = with_to(data, "é" * 200)
    m = Message()
    m.decode(out)
    assert m.address == "é" * 200 and m.body == b"abc"


def test_bytes_that_are_not_a_message_are_left_alone() -> None:
    for junk in (b"\xff\x00", b"\x00\x53\x73\xc0\x09\x03", b"\x00\x53\x73\xa1\x01x", b"\x00\x53",
                 b"\x00\x53\x73\xc0\x02\x03\x40"):
        assert with_to(junk, "t") == junk


def test_skip_reads_widths_from_the_constructor() -> None:
    assert skip(b"\x40", 0) == 1 and skip(b"\x52\x07", 0) == 2 and skip(b"\x98" + bytes(16), 0) == 17
    assert skip(b"\xb1\x00\x00\x00\x02hi", 0) == 7 and skip(b"\x00\x53\x77\x44", 0) == 4
    for bad in (b"\x52", b"\xa1\x05ab", b"\x01"):
        try:
            skip(bad, 0)
        except Unreadable:
            continue
        raise AssertionError(bad)


@given(messages())
@settings(max_examples=200, deadline=None)
def test_read_to_reads_what_proton_wrote(m: Message) -> None:
    assert read_to(bytes(m.encode())) == m.address


def test_read_to_of_what_is_not_a_string_or_not_a_message_is_none() -> None:
    for junk in (b"", b"\xff", b"\x00\x53\x77\xa1\x01x", b"\x00\x53\x73\xc0\x04\x03\x40\x40\x44",
                 b"\x00\x53\x73\xc0\x05\x03\x40\x40\xa1\x05"):
        assert read_to(junk) is None
    assert read_to(with_to(b"\x00\x53\x77\x40", "t/a")) == "t/a"


def test_descriptors_nested_without_end_do_not_exhaust_the_stack() -> None:
    """A publisher's bytes alone must never raise out of the router (RecursionError included)."""
    for junk in (b"\x00" * 100_000, b"\x00\x53\x77" + b"\x00" * 50_000 + b"\x40", b"\x00\x53\x73" + b"\x00\x53" * 40_000):
        assert with_to(junk, "t") == junk and read_to(junk) is None
    deep = b"\x00\x53\x77" + b"\x00\x53\x70" * 20_000 + b"\x40"  # a long but well-formed chain: skipped whole
    assert skip(deep, 0) == len(deep) and read_to(with_to(deep, "t/a")) == "t/a"
