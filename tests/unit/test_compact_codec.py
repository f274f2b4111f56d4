"""The compact frames of inter-router protocol version 6 (interrouter/codec.py, docs/wire-protocol.md
"Compact frames"): copies and control messages round-trip whatever their strings hold (a string
with a separator falls back to the JSON form, which version 6 reads too), garbage is a FrameError
and never anything else, and the forms are smaller than the JSON ones."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from oncemesh.interrouter import codec
from oncemesh.interrouter.messages import Acks, Copy, Finals, Hello, Holds, LinkState, Probes, Queries, SubAck
from oncemesh.interrouter.strict import FrameError

SEPS = "\x1d\x1e\x1f"
# strings that now and then hold a separator (or look like a number, or are empty)
text = st.one_of(st.text(max_size=12), st.text(alphabet="ab" + SEPS, max_size=4), st.sampled_from(["", "0", "-1"]))
ids = st.text(alphabet="ABCxyz:0123456789-", min_size=1, max_size=12)


def _clean(*strings: str) -> bool:
    return not any(c in s for s in strings for c in SEPS)


@settings(max_examples=300, deadline=None)
@given(text, text, text, text, st.dictionaries(text, st.lists(text, max_size=3).map(tuple), max_size=3),
       st.binary(max_size=50), st.lists(text, max_size=3).map(tuple),
       st.lists(st.tuples(text, text), max_size=2).map(tuple), st.booleans())
def test_copies_round_trip_in_the_compact_form_or_fall_back_to_json(
        origin: str, inc: str, gid: str, topic: str, dests: dict[str, tuple[str, ...]], payload: bytes,
        preds: tuple[str, ...], deps: tuple[tuple[str, str], ...], by_arrival: bool) -> None:
    c = Copy(origin, inc, gid, topic, dests, payload, preds, deps, by_arrival)
    frame = codec.encode_copy(c, compact=True)
    back = codec.decode_copy(frame)
    every = [origin, inc, gid, topic, *dests, *(s for v in dests.values() for s in v), *preds,
             *(x for d in deps for x in d)]
    assert frame[:1] == (b"D" if any("\x1f" in s for s in every) else b"d")  # (only US separates a header)
    assert back == c
    assert back.payload == payload


acks = st.builds(Acks, ids, ids, st.lists(st.tuples(text, text, st.integers(-5, 2**40),
                                                    st.none() | st.tuples(text, text)), min_size=1, max_size=5))
finals = st.builds(Finals, ids, ids, st.lists(text, min_size=1, max_size=5))
noted = st.builds(Finals, ids, ids, st.lists(ids, min_size=1, max_size=2),
                  st.lists(st.tuples(ids, ids, st.integers(1, 4), st.none() | st.tuples(text, text),
                                     st.none() | ids), min_size=1, max_size=2).map(tuple))
others = st.one_of(st.builds(Probes, ids, ids, st.lists(text, max_size=3), ids),
                   st.builds(Holds, ids, ids, st.lists(text, max_size=3)),
                   st.builds(Queries, ids, ids, st.lists(text, max_size=3)),
                   st.builds(Hello, ids, ids), st.builds(SubAck, ids, ids, text, st.integers(0, 99), st.booleans(),
                                                         st.none() | text),
                   st.builds(LinkState, ids, ids, st.integers(0, 99), st.dictionaries(ids, st.floats(0, 9))))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(acks, finals, noted, others), min_size=1, max_size=8))
def test_control_messages_round_trip_in_order_in_the_compact_form(msgs: list) -> None:
    frame = codec.encode_control_compact(msgs)
    assert frame[:1] == b"c"
    assert codec.decode_control(frame) == msgs
    # each Acks or Finals without notes and without a separator in its strings is a record of its
    # own kind; everything else goes as JSON ("J")
    records = frame[1:].decode().split("\x1e")
    assert len(records) == len(msgs)
    for m, r in zip(msgs, records, strict=True):
        if type(m) is Acks and _clean(*(s for g, sid, _, e in m.items for s in (g, sid, *(e or ())))):
            assert r[:1] == "A"
        elif type(m) is Finals and not m.notes and _clean(*m.gids):
            assert r[:1] == "F"
        else:
            assert r[:1] == "J"


def test_unknown_record_kinds_are_skipped_and_garbage_is_a_frame_error() -> None:
    good = codec.encode_control_compact([Finals("A", "B", ["g1", "g2"])])
    assert codec.decode_control(good + b"\x1eZfrom\x1fa newer version") == [Finals("A", "B", ["g1", "g2"])]
    assert codec.decode_control(b"c") == []
    bad_control = [b"cA\x1fA", b"cA\x1fA\x1fB\x1dg\x1fs", b"cA\x1fA\x1fB\x1dg\x1fs\x1fnot a number",
                   b"cF\x1fA\x1fB", b"cF\x1fA\x1fB\x1dg\x1dh", b"cJ{not json", b"cJ[\"A\"]", b"c\xff\xfe"]
    hdr = codec.encode_copy_header_compact("A", "1", "g", "t", {"B": ("s",)})
    bad_copy = [b"d\x00\x05abc", b"d\x00", b"d\x00\x03a\x1fb", hdr[:-2], hdr[:3] + hdr[3:].replace(b"\x1f1\x1f", b"\x1f7\x1f"),
                b"d" + hdr[1:3] + hdr[3:].replace(b"\x1f0\x1f", b"\x1f9\x1f"), hdr[:3] + b"\xff" * (len(hdr) - 3)]
    for frame in bad_control:
        try:
            codec.decode_control(frame)
        except FrameError:
            continue
        raise AssertionError(f"{frame!r} was accepted")
    for frame in bad_copy:
        try:
            codec.decode_copy(frame)
        except FrameError:
            continue
        raise AssertionError(f"{frame!r} was accepted")


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=80), st.sampled_from([b"c", b"d"]))
def test_any_bytes_decode_or_raise_a_frame_error(junk: bytes, kind: bytes) -> None:
    try:
        if kind == b"c":
            codec.decode_control(kind + junk)
        else:
            codec.decode_copy(kind + junk)
    except FrameError:
        pass


def test_the_compact_forms_are_smaller_than_the_json_ones() -> None:
    dests = {"B": ("9f8e7d6c5b4a3921",), "C": ("1a2b3c4d5e6f7a8b", "2b3c4d5e6f7a8b9c")}
    json_hdr = codec.encode_copy_header("A", "3f9a1c2b7d4e", "k3J9aQ2x:1234567", "orders", dests)
    compact = codec.encode_copy_header_compact("A", "3f9a1c2b7d4e", "k3J9aQ2x:1234567", "orders", dests)
    assert len(compact) < 0.9 * len(json_hdr), (len(compact), len(json_hdr))
    items = [(f"k3J9aQ2x:{i}", "9f8e7d6c5b4a3921", 0, None) for i in range(20)]
    msgs = [Acks("B", "A", items), Finals("A", "B", [g for g, *_ in items])]
    assert len(codec.encode_control_compact(msgs)) < 0.8 * len(codec.encode_control(msgs))  # type: ignore[arg-type]
