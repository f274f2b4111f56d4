"""Pure pieces of the client library."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message

from clients.publisher import encode_body


@settings(max_examples=300)
@given(st.one_of(st.binary(max_size=700), st.text(max_size=400), st.sampled_from([b"x" * 255, b"x" * 256, "é" * 128])))
def test_fast_body_encoding_is_protons_byte_for_byte(body: bytes | str) -> None:
    assert encode_body(body) == bytes(Message(body=body).encode())
    m = Message()
    m.decode(encode_body(body))
    assert m.body == body


def test_other_bodies_and_messages_go_through_proton() -> None:
    for body in ({"a": 1}, [1, 2], 7, None):
        assert encode_body(body) == bytes(Message(body=body).encode())
    m = Message(body="x", subject="s", properties={"k": "v"})
    assert encode_body(m) == bytes(m.encode())
