"""Pure pieces of the client library."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message

from oncemesh.clients.publisher import encode_body


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


def test_a_clients_causal_past_is_what_its_subscribers_were_handed_and_its_publishers_sent() -> None:
    from oncemesh.clients.runtime import Client
    from oncemesh.common.ids import counter_tag, global_id

    client = Client("amqp://127.0.0.1:1", container_id="c1")
    sub = client.subscriber("t", "s")
    pub = client.publisher("u", "p")
    assert client.causal_past() == []
    a1, a2 = global_id("aaaaaaaaaaaa", counter_tag(1)), global_id("aaaaaaaaaaaa", counter_tag(2))
    b = global_id("bbbbbbbbbbbb", counter_tag(5))
    sub._note_handed([a2, b, a1])  # (a1 came late: a2 stays the latest of its link)
    assert sorted(client.causal_past()) == sorted([[a2, "t"], [b, "t"]])
    pub._latest_sent = (4, global_id(pub.plid, counter_tag(4)))
    assert [global_id(pub.plid, counter_tag(4)), "u"] in client.causal_past()
