"""The sequencer's messages in control frames (`Order`, `interrouter.ordercodec`).

Round trips go through the whole path, `encode_control([Order(...)])` -> bytes -> `decode_control`.
Garbage must come out as `codec.FrameError` and nothing else; what the decoder accepts must be exactly
an encoding (it re-encodes to the same bytes), so a mutation is either refused or harmless.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncemesh.interrouter import codec
from oncemesh.interrouter.messages import Acks, Control, Finals, Hello, LinkState, Order, Queries
from oncemesh.interrouter.ordercodec import wire_from_list, wire_to_list
from oncemesh.router.order.sequencer import (
    NO_BALLOT,
    Accept,
    Accepted,
    Answer,
    Ballot,
    Body,
    Coordinator,
    CvQuery,
    CvReply,
    Delivered,
    Election,
    Entry,
    Floor,
    Nack,
    Prepare,
    Promise,
    Recover,
    RecoverReply,
    Request,
    Restore,
    SendTo,
    SequencerNode,
    Sync,
    SyncAck,
    Wire,
)
from oncemesh.router.order.total import Checkpoint

# ---------------------------------------------------------------------- strategies

nats = st.integers(min_value=0, max_value=2**64) | st.integers(min_value=0, max_value=5)
names = st.text(max_size=8)
ballots = st.tuples(nats, st.integers(min_value=-1, max_value=2**31), nats) | st.just(NO_BALLOT)
entries = st.builds(Entry, nats, ballots, nats, st.lists(names, max_size=4).map(tuple))
entry_tuples = st.lists(entries, max_size=3).map(tuple)
numbered = st.lists(st.tuples(names, nats), max_size=3).map(tuple)
checkpoints = st.none() | st.builds(Checkpoint, nats, numbered, numbered)

BODIES: dict[type, st.SearchStrategy[Any]] = {
    Election: st.just(Election()),
    Answer: st.just(Answer()),
    Coordinator: st.just(Coordinator()),
    CvQuery: st.builds(CvQuery, names),
    CvReply: st.builds(CvReply, names),
    Recover: st.builds(Recover, names),
    RecoverReply: st.builds(RecoverReply, names, ballots, nats, nats, entry_tuples, entry_tuples, checkpoints),
    Prepare: st.builds(Prepare, ballots, nats),
    Promise: st.builds(Promise, ballots, nats, nats, nats, entry_tuples, entry_tuples, checkpoints),
    Nack: st.builds(Nack, ballots, ballots),
    Accept: st.builds(Accept, ballots, entries),
    Accepted: st.builds(Accepted, ballots, nats, nats),
    Sync: st.builds(Sync, entry_tuples, nats, nats, nats, nats, st.booleans(), checkpoints),
    SyncAck: st.builds(SyncAck, nats, ballots),
    Request: st.builds(Request, names, nats),
    Floor: st.builds(Floor, nats),
}
TAGS = {Election: "E", Answer: "AN", Coordinator: "C", CvQuery: "CQ", CvReply: "CR", Recover: "R",
        RecoverReply: "RR", Prepare: "PR", Promise: "PM", Nack: "N", Accept: "AC", Accepted: "AD", Sync: "S",
        SyncAck: "SA", Request: "RQ", Floor: "FL"}  # as in docs/wire-protocol.md


def wires(body: st.SearchStrategy[Any]) -> st.SearchStrategy[Wire]:
    return st.builds(Wire, st.integers(min_value=-1, max_value=2**40),
                     st.lists(nats, max_size=6).map(tuple), body)


orders = st.builds(Order, names, names, names, wires(st.one_of(*BODIES.values())))


def check(v: Any, hint: Any, where: str) -> None:
    """v is a value of type `hint` as the sequencer makes them: no bool for an int, no negative
    number (but a ballot's member index -1, NO_BALLOT), tuples, not lists."""
    if hint == Ballot:
        assert type(v) is tuple and len(v) == 3 and all(type(i) is int for i in v), where
        assert v[0] >= 0 and v[1] >= -1 and v[2] >= 0, where
    elif typing.get_origin(hint) in (types.UnionType, typing.Union):  # X | None
        if v is not None:
            (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
            check(v, inner, where)
    elif typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        assert type(v) is tuple, where
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]
            for k, i in enumerate(v):
                check(i, args[0], f"{where}[{k}]")
        else:
            assert len(v) == len(args), where
            for k, (i, h) in enumerate(zip(v, args, strict=True)):
                check(i, h, f"{where}[{k}]")
    elif hint is int:
        assert type(v) is int and v >= 0, where
    elif hint in (str, bool):
        assert type(v) is hint, where
    else:
        assert type(v) is hint, where
        for name, h in typing.get_type_hints(hint).items():
            check(getattr(v, name), h, f"{where}.{name}")


def well_formed(w: Wire) -> None:
    assert type(w) is Wire and type(w.life) is int and w.life >= -1
    check(w.cv, tuple[int, ...], "cv")
    assert type(w.body) in BODIES
    check(w.body, type(w.body), type(w.body).__name__)


def frame_of(item: Any) -> bytes:
    return b"C" + json.dumps([item], separators=(",", ":")).encode()


def test_the_strategies_and_tags_cover_every_body_type() -> None:
    assert set(BODIES) == set(TAGS) == set(typing.get_args(Body))


# ---------------------------------------------------------------------- round trips


@pytest.mark.parametrize("cls", list(BODIES), ids=lambda c: c.__name__)
@given(data=st.data())
def test_every_body_type_round_trips_through_a_control_frame(cls: type, data: st.DataObject) -> None:
    o = data.draw(st.builds(Order, names, names, names, wires(BODIES[cls])))
    frame = codec.encode_control([o])
    assert json.loads(frame[1:])[0][4][2][0] == TAGS[cls]
    back = codec.decode_control(frame)
    assert back == [o]
    assert type(back[0].wire.body) is cls  # type: ignore[union-attr]
    well_formed(back[0].wire)  # type: ignore[union-attr]
    assert codec.encode_control(back) == frame


@given(st.lists(orders, max_size=3), st.lists(names, max_size=3))
def test_orders_share_a_control_frame_with_other_messages(ords: list[Order], gids: list[str]) -> None:
    msgs: list[Control] = [Hello("A", "1"), *ords, Finals("A", "B", gids), LinkState("A", "1", 3, {"B": 1.0}),
                           Acks("B", "A", [("g", "s", 2, None)]), *ords[::-1], Queries("B", "C", gids)]
    frame = codec.encode_control(msgs)
    assert codec.decode_control(frame) == msgs
    # an unknown kind from a newer version in between is skipped, the orders survive
    items = json.loads(frame[1:])
    items.insert(1, ["ZZ", 1, [2]])
    assert codec.decode_control(b"C" + json.dumps(items).encode()) == msgs


def test_the_layout_is_the_documented_one() -> None:
    o = Order("B", "A", "t", Wire(2, (1, 2), Accept((3, 1, 2), Entry(5, (3, 1, 2), 9, ("g", "h")))))
    assert codec.encode_control([o]) == b'C[["O","A","B","t",[2,[1,2],["AC",[3,1,2],[5,[3,1,2],9,["g","h"]]]]]]'
    s = Wire(-1, (0, 0), Sync((), 1, 1, 1, 1, True, None))
    assert wire_to_list(s) == [-1, (0, 0), ["S", [], 1, 1, 1, 1, True, None]]
    cp = Checkpoint(8, (("~s~1.5", 2),), (("abcdefghijkl", 30),))
    r = Wire(3, (1, 3), RecoverReply("B.1", (2, 1, 1), 4, 9, (), (), cp))
    assert wire_to_list(r) == [3, (1, 3), ["RR", "B.1", (2, 1, 1), 4, 9, [], [],
                                           [8, [["~s~1.5", 2]], [["abcdefghijkl", 30]]]]]
    assert wire_from_list(json.loads(json.dumps(wire_to_list(r)))) == r
    assert wire_to_list(Wire(0, (0,), Floor(12))) == [0, (0,), ["FL", 12]]
    assert wire_from_list(wire_to_list(s)) == s  # also without JSON in between (tuples as lists)


def test_what_real_sequencers_send_passes_through_the_codec() -> None:
    """Three routers number gids, one restarts (life, recovery), and one gets a stale Accept (Nack):
    every message travels as bytes, and the numbering comes out whole."""
    ids = "ABC"
    nodes = {r: SequencerNode(r, ids, f"{r}.0", 0.0, bootstrap=True) for r in ids}
    seen: set[type] = set()
    delivered: dict[str, list[str]] = {r: [] for r in ids}
    restored: dict[str, int] = {}

    def pump(now: float) -> None:
        moved = True
        while moved:
            moved = False
            for r, n in nodes.items():
                out, n.out = n.out, []
                for a in out:
                    if isinstance(a, SendTo):
                        o = Order(a.to, r, "t", a.msg)
                        (back,) = codec.decode_control(codec.encode_control([o]))
                        assert back == o
                        seen.add(type(a.msg.body))
                        nodes[a.to].handle(r, back.wire, now)
                        moved = True
                    elif isinstance(a, Delivered):
                        delivered[r].append(a.gid)
                    elif isinstance(a, Restore):
                        restored[r] = a.cp.number

    def run(t0: float, t1: float) -> float:
        t = t0
        while t < t1:
            for n in nodes.values():
                n.tick(t)
            pump(t)
            t += 0.05
        return t

    for r in ids:
        for p in ids:
            if p != r:
                nodes[r].peer_up(p, 0.0)
    t = run(0.0, 2.0)
    for k, r in enumerate(ids * 3):
        nodes[r].submit(f"g{k}", t)
    t = run(t, t + 2.0)
    for _ in range(2):  # every member reports its floor, then compacts what all of them passed
        for n in nodes.values():
            n.note_floor(n.next_num - 1, t)
        pump(t)
    for n in nodes.values():
        n.compact(Checkpoint(n.safe_floor(), (), ()))
    assert all(n.base > 1 for n in nodes.values())
    nodes["A"] = SequencerNode("A", ids, "A.1", t)
    for p in "BC":
        nodes["A"].peer_up(p, t)
    t = run(t, t + 3.0)
    nodes["C"].handle("B", Wire(0, (0, 0, 0), Accept((0, 1, 0), Entry(1, (0, 1, 0), 1, ("x",)))), t)
    pump(t)
    assert seen == set(typing.get_args(Body))
    assert delivered["B"] == delivered["C"] and sorted(delivered["B"]) == sorted(f"g{k}" for k in range(9))
    assert restored == {"A": 9}  # A's new life went on from the others' checkpoint


# ---------------------------------------------------------------------- garbage


def good() -> list[Any]:
    """[kind, src, dst, topic, wire] as it comes out of the JSON decoder."""
    e = Entry(5, (3, 1, 2), 9, ("g",))
    o = Order("B", "A", "t", Wire(2, (1, 2, 0), Promise((3, 1, 2), 4, 1, 1, (e,), (e,),
                                                        Checkpoint(3, (("~s~1.5", 2),), (("p", 7),)))))
    return typing.cast(list[Any], json.loads(codec.encode_control([o])[1:])[0])


def at(x: list[Any], path: tuple[int, ...]) -> list[Any]:
    for i in path:
        x = x[i]
    return x


Mutation = typing.Callable[[list[Any]], None]


def put(path: tuple[int, ...], v: Any) -> Mutation:
    def f(x: list[Any]) -> None:
        at(x, path[:-1])[path[-1]] = v
    return f


def add(path: tuple[int, ...], v: Any) -> Mutation:
    return lambda x: at(x, path).append(v)


def drop(path: tuple[int, ...]) -> Mutation:
    return lambda x: at(x, path).pop()


# [kind, src, dst, topic, [life, cv, ["PM", ballot, frontier, base, base_num, [entry], [entry], checkpoint]]]
GARBAGE: list[tuple[str, Mutation]] = [
    ("expected [kind, src, dst, topic, wire], got 6 fields", add((), "extra")),
    ("src: expected a string, got int", put((1,), 7)),
    ("topic: expected a string, got NoneType", put((3,), None)),
    ("wire: expected a list, got dict", put((4,), {"life": 1})),
    ("wire: expected 3 elements, got 4", add((4,), 0)),
    ("wire.life: expected an int >= -1, got bool True", put((4, 0), True)),
    ("wire.life: expected an int >= -1, got int -2", put((4, 0), -2)),
    ("wire.cv[1]: expected an int >= 0, got float 2.0", put((4, 1, 1), 2.0)),
    ("wire.cv[0]: expected an int >= 0, got int -1", put((4, 1, 0), -1)),
    ("wire.cv: expected a list, got str '120'", put((4, 1), "120")),
    ("wire.body: unknown tag str 'ZZ'", put((4, 2, 0), "ZZ")),
    ("wire.body: unknown tag list of 1", put((4, 2, 0), ["PM"])),
    ("wire.body: empty", put((4, 2), [])),
    ("Promise (PM): expected 7 fields, got 8", add((4, 2), 0)),
    ("Nack (N): expected 2 fields, got 7", put((4, 2, 0), "N")),
    ("Promise.ballot: expected 3 elements, got 2", drop((4, 2, 1))),
    ("Promise.ballot.round: expected an int >= 0, got int -1", put((4, 2, 1, 0), -1)),
    ("Promise.ballot.member: expected an int >= -1, got int -2", put((4, 2, 1, 1), -2)),
    ("Promise.ballot.life: expected an int >= 0, got bool False", put((4, 2, 1, 2), False)),
    ("Promise.frontier: expected an int >= 0, got NoneType", put((4, 2, 2), None)),
    ("Promise.base_num: expected an int >= 0, got str '1'", put((4, 2, 4), "1")),
    ("Promise.chosen: expected a list, got dict", put((4, 2, 5), {})),
    ("Promise.chosen[0]: expected 4 elements, got 3", drop((4, 2, 5, 0))),
    ("Promise.chosen[0].slot: expected an int >= 0, got int -5", put((4, 2, 5, 0, 0), -5)),
    ("Promise.accepted[0].ballot.round: expected an int >= 0, got float", put((4, 2, 6, 0, 1, 0), 3.5)),
    ("Promise.accepted[0].first: expected an int >= 0, got bool", put((4, 2, 6, 0, 2), True)),
    ("Promise.accepted[0].gids: expected a list, got str", put((4, 2, 6, 0, 3), "g")),
    ("Promise.accepted[0].gids[0]: expected a string, got int 3", put((4, 2, 6, 0, 3, 0), 3)),
    ("Promise.accepted[0].gids[0]: expected a string, got list of 0", put((4, 2, 6, 0, 3, 0), [])),
    ("Promise.cp: expected a list, got int 3", put((4, 2, 7), 3)),
    ("Promise.cp: expected 3 elements, got 2", drop((4, 2, 7))),
    ("Promise.cp.number: expected an int >= 0, got float 3.0", put((4, 2, 7, 0), 3.0)),
    ("Promise.cp.starts[0]: expected 2 elements, got 1", drop((4, 2, 7, 1, 0))),
    ("Promise.cp.starts[0][0]: expected a string, got NoneType", put((4, 2, 7, 1, 0, 0), None)),
    ("Promise.cp.marks[0][1]: expected an int >= 0, got int -7", put((4, 2, 7, 2, 0, 1), -7)),
]


@pytest.mark.parametrize(("expected", "mutate"), GARBAGE, ids=[g[0] for g in GARBAGE])
def test_garbage_is_a_frame_error_naming_what_is_wrong(expected: str, mutate: Mutation) -> None:
    x = good()
    assert codec.decode_control(frame_of(x))  # the unchanged one is fine
    mutate(x)
    with pytest.raises(codec.FrameError) as exc:
        codec.decode_control(frame_of(x))
    assert expected in str(exc.value)


def test_a_body_type_where_another_is_expected_is_an_error() -> None:
    # Sync's `beat` is a bool, Request's gid a string: an int or a bool will not do for the other
    for wire in ([0, [0], ["S", [], 1, 1, 1, 1, 1]], [0, [0], ["RQ", True, 1]], [0, [0], ["AC", [1, 0, 0], 5]]):
        with pytest.raises(codec.FrameError):
            wire_from_list(wire)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=3) | st.sampled_from(list(TAGS.values())),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner, max_size=2),
    max_leaves=8)


def positions(x: Any, path: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Paths of every element of every list nested in x."""
    out = []
    if isinstance(x, list):
        for i, v in enumerate(x):
            out.append((*path, i))
            out.extend(positions(v, (*path, i)))
    return out


def near(v: Any) -> list[Any]:
    """Values a buggy peer might send instead of v: off by one, a sign, a bool for an int, ..."""
    if type(v) is int:
        return [v + 1, v - 1, -v - 1, bool(v % 2), float(v), str(v), None]
    if type(v) is bool:
        return [int(v), str(v).lower()]
    if type(v) is str:
        return [[v], 0, None]
    return [v[:-1], [*v, 0], [*v, v[-1] if v else "x"], {}] if isinstance(v, list) else [0]


@pytest.mark.parametrize("cls", list(BODIES), ids=lambda c: c.__name__)
@given(data=st.data())
def test_mutated_encodings_are_refused_or_exactly_an_encoding(cls: type, data: st.DataObject) -> None:
    o = data.draw(st.builds(Order, names, names, names, wires(BODIES[cls])))
    x = json.loads(codec.encode_control([o])[1:])[0]
    for _ in range(data.draw(st.sampled_from([1, 1, 1, 1, 2, 3]))):
        # mostly inside the body (most of the fields are there); the outer fields: the table above
        inner = type(x[4]) is list and len(x[4]) == 3 and type(x[4][2]) is list and data.draw(st.integers(0, 3))
        where = positions(x[4][2], (4, 2))[1:] if inner else positions(x[4], (4,))  # [1:]: not the tag
        if not where:  # nothing left inside
            break
        *parent, i = data.draw(st.sampled_from(where))
        target = at(x, tuple(parent))
        how = data.draw(st.sampled_from(["replace", "delete", "insert", "near", "near"]))
        if how == "replace":
            target[i] = data.draw(json_values)
        elif how == "delete":
            del target[i]
        elif how == "insert":
            target.insert(i, data.draw(json_values))
        else:
            target[i] = data.draw(st.sampled_from(near(target[i])))
    frame = frame_of(x)
    try:
        back = codec.decode_control(frame)
    except codec.FrameError:
        return
    assert len(back) == 1 and type(back[0]) is Order
    well_formed(back[0].wire)  # accepted: a valid value ...
    assert codec.encode_control(back) == frame  # ... and exactly its encoding


E1, E2 = Entry(5, (3, 1, 2), 9, ("g", "h")), Entry(6, NO_BALLOT, 11, ())
EXAMPLES = [Election(), Answer(), Coordinator(), CvQuery("A.1"), CvReply("A.1"), Recover("A.1"),
            RecoverReply("A.1", (3, 1, 2), 4, 7, (E1,), (E2,), Checkpoint(6, (("~s~1.5", 2),), (("p", 7),))),
            Prepare((3, 1, 2), 4), Promise((3, 1, 2), 4, 1, 1, (E1,), (E1, E2), None), Nack((3, 1, 2), (4, 0, 1)),
            Accept((3, 1, 2), E1), Accepted((3, 1, 2), 5, 6), Sync((E1, E2), 7, 1, 1, 1, True, None),
            SyncAck(4, (3, 1, 2)), Request("g", 4), Floor(9)]


@pytest.mark.parametrize("body", EXAMPLES, ids=lambda b: type(b).__name__)
def test_every_single_wrong_field_is_refused_or_harmless(body: Body) -> None:
    """Exhaustive: each element of each list (the tag too), changed to each near value, removed,
    or with one more element after it: refused, or still a valid message that is exactly its encoding."""
    assert {type(b) for b in EXAMPLES} == set(BODIES)
    x = json.loads(codec.encode_control([Order("B", "A", "t", Wire(2, (1, 2, 0), body))])[1:])[0]
    variants: list[tuple[tuple[int, ...], str, int, Any]] = []  # (list, how, index, value)
    for *parent, i in positions(x[4], (4,)):
        v, p = at(x, (*parent, i)), tuple(parent)
        variants += [(p, "set", i, new) for new in near(v) + (list(TAGS.values()) if type(v) is str else [])]
        variants += [(p, "delete", i, None), (p, "insert", i + 1, 0)]
    refused = 0
    for p, how, i, new in variants:
        y = json.loads(json.dumps(x))
        target = at(y, p)
        if how == "set":
            target[i] = new
        elif how == "delete":
            del target[i]
        else:
            target.insert(i, new)
        frame = frame_of(y)
        try:
            back = codec.decode_control(frame)
        except codec.FrameError:
            refused += 1
            continue
        assert len(back) == 1 and type(back[0]) is Order, y
        well_formed(back[0].wire)
        assert codec.encode_control(back) == frame, y
    assert refused > len(variants) // 2  # most of them are wrong


@given(json_values)
def test_any_json_value_is_a_wire_or_a_frame_error(v: Any) -> None:
    try:
        w = wire_from_list(v)
    except codec.FrameError:
        return
    well_formed(w)
    assert json.dumps(wire_to_list(w)) == json.dumps(v)


@given(st.lists(json_values, max_size=6))
def test_any_order_item_is_an_order_or_a_frame_error(fields: list[Any]) -> None:
    frame = frame_of(["O", *fields])
    try:
        back = codec.decode_control(frame)
    except codec.FrameError:
        return
    assert len(back) == 1 and type(back[0]) is Order
    well_formed(back[0].wire)
    assert codec.encode_control(back) == frame


@given(st.binary(max_size=200))
def test_random_bytes_are_a_frame_error_or_a_control_frame(b: bytes) -> None:
    for frame in (b"C" + b, b'C[["O","A","B","t",' + b, b'C[["O","A","B","t",[0,[1,2],' + b):
        try:
            msgs = codec.decode_control(frame)
        except codec.FrameError:
            continue
        assert isinstance(msgs, list)


def test_deep_nesting_is_a_frame_error() -> None:
    with pytest.raises(codec.FrameError):
        codec.decode_control(b'C[["O","A","B","t",' + b"[" * 100_000)
