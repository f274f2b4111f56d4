"""The Lamport total-order core's messages in control frames (`LamportOrder`, `interrouter.lamportcodec`).

An `LO` item is one frame of a reliable session (`interrouter.channel`):
`["LO", src, dst, topic, epoch, seq, ack_epoch, ack, msg]`, `msg` null exactly for an acknowledgement
only (seq 0). Round trips go through the whole path, `encode_control([LamportOrder(...)])` -> bytes ->
`decode_control`. Decoded values must equal the originals and be hashable (keys are dict keys and heap
items in `LamportNode`). Garbage must come out as `codec.FrameError` and nothing else; what the decoder
accepts must be exactly an encoding (it re-encodes to the same bytes), so a mutation is either refused
or harmless.
"""

from __future__ import annotations

import heapq
import json
import types
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncemesh.interrouter import codec
from oncemesh.interrouter.lamportcodec import lamport_from_list, lamport_to_list
from oncemesh.interrouter.messages import (
    Acks,
    Control,
    Finals,
    Hello,
    LamportOrder,
    LinkState,
    Order,
    Queries,
)
from oncemesh.interrouter.ordercodec import wire_from_list
from oncemesh.router.order import lamport
from oncemesh.router.order.lamport import (
    GENESIS,
    MIN_KEY,
    Accept,
    Accepted,
    Ack,
    Base,
    Commit,
    Data,
    Decision,
    Entry,
    Floor,
    Key,
    Prepare,
    Promise,
    Refuse,
    Wire,
)
from oncemesh.router.order.total import Checkpoint
from tests.unit.test_order_lamport import Net, floors

# ---------------------------------------------------------------------- strategies

BIG = 1_700_000_000_000_000  # an incarnation: a microsecond timestamp
nats = st.integers(min_value=0, max_value=2**64) | st.integers(min_value=0, max_value=5) | st.just(BIG)
names = st.text(max_size=8)
ballots = st.tuples(nats, names) | st.just(GENESIS)
views = ballots | st.just((-1, ""))  # a key's view: MIN_KEY's is round -1
keys = st.tuples(views, nats, names) | st.just(MIN_KEY)
entries = st.builds(Entry, keys, names, st.binary(max_size=40))
entry_tuples = st.lists(entries, max_size=3).map(tuple)
members = st.lists(st.tuples(names, nats), max_size=4).map(tuple)
numbered = st.lists(st.tuples(names, nats), max_size=3).map(tuple)
checkpoints = st.builds(Checkpoint, nats, numbered, numbered)
bases = st.builds(Base, keys, checkpoints)
decisions = st.builds(Decision, ballots, ballots, members, keys, entry_tuples, entry_tuples, st.none() | bases)
commits = st.builds(Commit, ballots, decisions)

MESSAGES: dict[type, st.SearchStrategy[Any]] = {
    Data: st.builds(Data, entries),
    Ack: st.builds(Ack, keys, nats),
    Prepare: st.builds(Prepare, ballots, st.none() | keys),
    Promise: st.builds(Promise, ballots, nats, st.none() | ballots, members, keys, entry_tuples, entry_tuples,
                       st.none() | bases, st.none() | st.tuples(ballots, decisions), st.none() | commits),
    Refuse: st.builds(Refuse, ballots, ballots),
    Accept: st.builds(Accept, ballots, decisions),
    Accepted: st.builds(Accepted, ballots),
    Commit: commits,
    Floor: st.builds(Floor, nats, nats),
}
TAGS = {Data: "D", Ack: "A", Prepare: "P", Promise: "PM", Refuse: "R", Accept: "AC", Accepted: "AD",
        Commit: "C", Floor: "F"}  # as in docs/wire-protocol.md
messages = st.one_of(*MESSAGES.values())
epochs = nats | st.integers(min_value=BIG, max_value=2**70)  # a session id: at least the time in microseconds
seqs = st.integers(min_value=1, max_value=2**64) | st.integers(min_value=1, max_value=5)


def framed(msgs: st.SearchStrategy[Any]) -> st.SearchStrategy[LamportOrder]:
    """Frames carrying a message (seq >= 1) of `msgs`, with any acknowledgement riding on them."""
    return st.builds(LamportOrder, names, names, names, epochs, seqs, epochs | st.just(0), nats, msgs)


acks_only = st.builds(LamportOrder, names, names, names, epochs, st.just(0), epochs | st.just(0), nats, st.none())
orders = framed(messages) | acks_only

M = 8  # the index of the message in an LO item
SESSION = {"epoch": 4, "seq": 5, "ack_epoch": 6, "ack": 7}  # the indexes of the session fields
LAYOUT = "expected [kind, src, dst, topic, epoch, seq, ack_epoch, ack, msg]"


def lo(msg: Wire | None, epoch: int = BIG, seq: int | None = None, ack_epoch: int = 0, ack: int = 0,
       dst: str = "B", src: str = "A", topic: str = "t") -> LamportOrder:
    """A frame from A to B; seq 1 for a message, 0 (an acknowledgement only) without."""
    return LamportOrder(dst, src, topic, epoch, (0 if msg is None else 1) if seq is None else seq, ack_epoch, ack,
                        msg)


def check(v: Any, hint: Any, where: str) -> None:
    """v is a value of type `hint` as `LamportNode` makes them: no bool for an int, no negative number
    (but the round of a key's view, -1 in MIN_KEY), tuples, not lists."""
    if hint == Key:
        assert type(v) is tuple and len(v) == 3, where
        view, ts, origin = v
        assert type(view) is tuple and len(view) == 2, where
        assert type(view[0]) is int and view[0] >= -1 and type(view[1]) is str, where
        assert type(ts) is int and ts >= 0 and type(origin) is str, where
    elif typing.get_origin(hint) in (types.UnionType, typing.Union):
        if v is not None:
            (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
            check(v, inner, where)
    elif typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        assert type(v) is tuple, where
        if len(args) == 2 and args[1] is Ellipsis:
            for k, i in enumerate(v):
                check(i, args[0], f"{where}[{k}]")
        else:
            assert len(v) == len(args), where
            for k, (i, h) in enumerate(zip(v, args, strict=True)):
                check(i, h, f"{where}[{k}]")
    elif hint is int:
        assert type(v) is int and v >= 0, where
    elif hint in (str, bytes):
        assert type(v) is hint, where
    else:
        assert type(v) is hint, where
        for name, h in typing.get_type_hints(hint, vars(lamport)).items():
            check(getattr(v, name), h, f"{where}.{name}")


def well_formed(m: Wire) -> None:
    assert type(m) in MESSAGES
    check(m, type(m), type(m).__name__)
    hash(m)


def well_formed_order(o: Any) -> None:
    """A decoded frame: strings, session fields ints >= 0 (no bool), a message exactly when seq > 0."""
    assert type(o) is LamportOrder
    assert type(o.dst) is str and type(o.src) is str and type(o.topic) is str
    for name in SESSION:
        v = getattr(o, name)
        assert type(v) is int and v >= 0, name
    if o.seq == 0:
        assert o.msg is None
    else:
        well_formed(o.msg)
    hash(o)


def frame_of(item: Any) -> bytes:
    return b"C" + json.dumps([item], separators=(",", ":")).encode()


def only_lists(x: Any) -> bool:
    return not isinstance(x, tuple) and (not isinstance(x, list) or all(only_lists(i) for i in x))


def test_the_strategies_and_tags_cover_every_message_type() -> None:
    assert set(MESSAGES) == set(TAGS) == set(typing.get_args(Wire))


def test_the_checker_catches_what_it_is_for() -> None:
    e = Entry(((1, "A"), 1, "A"), "g", b"x")
    well_formed(Data(e))
    well_formed(Ack(MIN_KEY, 0))
    for bad in (Ack(((1, "A"), True, "A"), 1), Ack(((1, "A"), 1, "A"), -1), Refuse((-1, ""), GENESIS),
                Data(Entry([[1, "A"], 1, "A"], "g", b"x")),  # type: ignore[arg-type]
                Data(Entry(((1, "A"), 1, "A"), "g", bytearray(b"x")))):  # type: ignore[arg-type]
        with pytest.raises((AssertionError, TypeError)):
            well_formed(bad)


# ---------------------------------------------------------------------- round trips


@pytest.mark.parametrize("cls", list(MESSAGES), ids=lambda c: c.__name__)
@given(data=st.data())
def test_every_message_type_round_trips_through_a_control_frame(cls: type, data: st.DataObject) -> None:
    o = data.draw(framed(MESSAGES[cls]))
    frame = codec.encode_control([o])
    item = json.loads(frame[1:])[0]
    assert item[:M] == ["LO", o.src, o.dst, o.topic, o.epoch, o.seq, o.ack_epoch, o.ack]
    assert item[M][0] == TAGS[cls]
    back = codec.decode_control(frame)
    assert back == [o]
    assert type(back[0]) is LamportOrder and type(back[0].msg) is cls
    well_formed_order(back[0])
    assert hash(back[0]) == hash(o)
    assert codec.encode_control(back) == frame


@given(acks_only)
def test_an_acknowledgement_only_round_trips(o: LamportOrder) -> None:
    frame = codec.encode_control([o])
    assert frame.endswith(b",0," + str(o.ack_epoch).encode() + b"," + str(o.ack).encode() + b",null]]")
    assert json.loads(frame[1:])[0] == ["LO", o.src, o.dst, o.topic, o.epoch, 0, o.ack_epoch, o.ack, None]
    back = codec.decode_control(frame)
    assert back == [o] and back[0].msg is None and back[0].seq == 0
    well_formed_order(back[0])
    assert hash(back[0]) == hash(o)
    assert codec.encode_control(back) == frame


@pytest.mark.parametrize("big", [BIG, BIG + 123_456_789, 2**53 + 1, 2**63 - 1, 2**64, 10**30],
                         ids=lambda v: f"{v.bit_length()}bits")
@pytest.mark.parametrize("with_msg", [False, True], ids=["ack-only", "message"])
def test_large_epochs_and_numbers_pass_exactly(big: int, with_msg: bool) -> None:
    """Epochs are microsecond timestamps (about 1.7e15, above 2**50) or more: they must stay ints,
    exact to the last digit (not floats: 2**53 + 1 has no float), in every session field."""
    m = Ack(((big, "A"), big, "A"), big) if with_msg else None
    o = LamportOrder("B", "A", "t", big, big if m else 0, big + 1, big - 1, m)
    frame = codec.encode_control([o])
    assert str(big).encode() + b"," + (str(big).encode() if m else b"0") + b"," + str(big + 1).encode() in frame
    (back,) = codec.decode_control(frame)
    assert back == o
    well_formed_order(back)
    assert [type(getattr(back, n)) for n in SESSION] == [int] * 4
    assert (back.epoch, back.ack_epoch, back.ack) == (big, big + 1, big - 1)
    assert codec.encode_control([back]) == frame


@given(messages)
def test_the_encoding_is_lists_all_the_way_down_and_decodes_without_json(m: Wire) -> None:
    x = lamport_to_list(m)
    assert only_lists(x)
    assert json.loads(json.dumps(x)) == x  # what the JSON decoder hands back is what was encoded
    back = lamport_from_list(x)
    assert back == m and hash(back) == hash(m)
    assert lamport_to_list(back) == x


@given(st.lists(keys, min_size=1, max_size=8))
def test_decoded_keys_are_equal_hashable_and_ordered_like_the_originals(ks: list[Key]) -> None:
    decoded = [typing.cast(Ack, codec.decode_control(codec.encode_control(
        [lo(Ack(k, 1))]))[0].msg).key for k in ks]  # type: ignore[union-attr]
    assert decoded == ks
    assert all(type(k) is tuple and type(k[0]) is tuple for k in decoded)
    table = {k: i for i, k in enumerate(ks)}
    assert [table[k] for k in decoded] == [table[k] for k in ks]  # a decoded key finds the original's entry
    heap = list(ks)
    heapq.heapify(heap)
    for k in decoded:  # mixed with the originals in one heap
        heapq.heappush(heap, k)
    assert [heapq.heappop(heap) for _ in range(len(heap))] == sorted(ks + decoded)


@given(st.lists(orders, max_size=3), st.lists(names, max_size=3))
def test_lamport_orders_share_a_control_frame_with_other_messages(ords: list[LamportOrder],
                                                                   gids: list[str]) -> None:
    seq = Order("B", "A", "t", wire_from_list([2, [1, 2], ["AD", [3, 1, 2], 5, 6]]))
    msgs: list[Control] = [Hello("A", "1"), *ords, LinkState("A", "1", 3, {"B": 1.0}), seq,
                           Finals("A", "B", gids), Acks("B", "A", [("g", "s", 2, None)]), *ords[::-1],
                           Queries("B", "C", gids)]
    frame = codec.encode_control(msgs)
    back = codec.decode_control(frame)
    assert back == msgs
    assert [type(m) for m in back] == [type(m) for m in msgs]  # "LO" is not LinkState's "L"
    # an unknown kind from a newer version in between is skipped, the lamport orders survive
    items = json.loads(frame[1:])
    items.insert(1, ["ZZ", 1, [2]])
    assert codec.decode_control(b"C" + json.dumps(items).encode()) == msgs


E1 = Entry(((3, "B"), 7, "C"), "g1", b"\x00hi")
E2 = Entry(((3, "B"), 8, "A"), "g2", b"")
CP = Checkpoint(12, (("~s1~1.5", 3),), (("abcdefghijkl", 40),))
B1 = Base(((3, "B"), 1, "B"), CP)
D1 = Decision((4, "A"), (3, "B"), (("A", 0), ("B", BIG)), MIN_KEY, (E1,), (E2,), B1)


def test_the_layout_is_the_documented_one() -> None:
    o = LamportOrder("B", "A", "t", BIG, 3, 5, 2, Data(E1))
    assert codec.encode_control([o]) == \
        b'C[["LO","A","B","t",1700000000000000,3,5,2,["D",[[[3,"B"],7,"C"],"g1","AGhp"]]]]'
    ack = LamportOrder("A", "B", "t", 5, 0, BIG, 3, None)  # B acknowledges A's 1..3, sends nothing
    assert codec.encode_control([ack]) == b'C[["LO","B","A","t",5,0,1700000000000000,3,null]]'
    assert codec.encode_control([o, ack]) == \
        b'C[["LO","A","B","t",1700000000000000,3,5,2,["D",[[[3,"B"],7,"C"],"g1","AGhp"]]],' \
        b'["LO","B","A","t",5,0,1700000000000000,3,null]]'
    assert lamport_to_list(Ack(MIN_KEY, 9)) == ["A", [[-1, ""], 0, ""], 9]
    assert lamport_to_list(Prepare((5, "A"), None)) == ["P", [5, "A"], None]
    assert lamport_to_list(Refuse((5, "A"), (6, "B"))) == ["R", [5, "A"], [6, "B"]]
    assert lamport_to_list(Accepted((5, "A"))) == ["AD", [5, "A"]]
    d = [[4, "A"], [3, "B"], [["A", 0], ["B", BIG]], [[-1, ""], 0, ""], [[[[3, "B"], 7, "C"], "g1", "AGhp"]],
         [[[[3, "B"], 8, "A"], "g2", ""]], [[[3, "B"], 1, "B"], [12, [["~s1~1.5", 3]], [["abcdefghijkl", 40]]]]]
    assert lamport_to_list(Floor(BIG, 7)) == ["F", BIG, 7]
    assert lamport_to_list(Accept((4, "A"), D1)) == ["AC", [4, "A"], d]
    assert lamport_to_list(Commit((4, "A"), D1)) == ["C", [4, "A"], d]
    p = Promise((5, "C"), BIG, (4, "A"), (("A", 0),), ((4, "A"), 2, "A"), (E1,), (), None, ((5, "B"), D1),
                Commit((4, "A"), D1))
    assert lamport_to_list(p) == ["PM", [5, "C"], BIG, [4, "A"], [["A", 0]], [[4, "A"], 2, "A"],
                                  [[[[3, "B"], 7, "C"], "g1", "AGhp"]], [], None, [[5, "B"], d], [[4, "A"], d]]
    assert lamport_from_list(lamport_to_list(p)) == p


def test_encoding_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not a lamport message"):
        lamport_to_list(E1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a lamport message"):
        lamport_to_list(wire_from_list([2, [1], ["AD", [3, 1, 2], 5, 6]]))  # type: ignore[arg-type]


class WireNet(Net):
    """`Net` whose every frame travels as bytes through the codec, numbered as a session would number
    it (an epoch per sender's incarnation, seq per channel, the acknowledgement of the way back), each
    answered by an acknowledgement only; keeps what it carried."""

    def __init__(self, ids: str = "ABC", **kw: object) -> None:
        super().__init__(ids, **kw)
        self.carried: list[Wire] = []
        self.seqs: dict[tuple[str, str], int] = {}

    def epoch(self, r: str) -> int:
        return BIG + 1_000_000 * self.inc[r] + ord(r)

    def through(self, o: LamportOrder) -> LamportOrder:
        frame = codec.encode_control([o])
        (back,) = codec.decode_control(frame)
        assert back == o and codec.encode_control([back]) == frame
        well_formed_order(back)
        return typing.cast(LamportOrder, back)

    def step(self, a: str, b: str) -> Wire | None:
        ch = self.chan[(a, b)]
        if not ch:
            return None
        seq = self.seqs[(a, b)] = self.seqs.get((a, b), 0) + 1
        got = self.seqs.get((b, a), 0)
        back = self.through(LamportOrder(b, a, "t", self.epoch(a), seq, self.epoch(b) if got else 0, got,
                                         ch.popleft()))
        assert back.msg is not None and back.seq == seq
        self.carried.append(back.msg)
        self.through(LamportOrder(a, b, "t", self.epoch(b), 0, self.epoch(a), seq, None))
        self.apply(b, self.nodes[b].handle(a, back.msg, self.now))
        return back.msg


def test_what_real_lamport_nodes_send_passes_through_the_codec() -> None:
    """Three routers order messages; one crashes (a view change), restarts with a timestamp for its
    incarnation (a second one, carrying history and the last commit), and a stale Prepare is refused:
    every message travels as bytes, and every router delivers the same order."""
    net = WireNet()
    for k, r in enumerate("ABCABC"):
        net.publish(r, f"g{k}")
    net.drain()
    net.publish("C", "lost?")
    net.crash("C")
    net.settle()
    net.publish("A", "g6")
    net.drain()
    net.inc["C"] = BIG - 1  # restart makes it BIG
    net.restart("C")
    net.settle()
    for r in "AB":
        net.publish(r, f"after-{r}")
    net.drain()
    net.apply("B", net.nodes["B"].handle("A", Prepare((0, "A"), None), net.now))  # below B's promise
    net.drain()
    carried = net.carried
    assert {type(m) for m in carried} == set(MESSAGES)
    assert any(isinstance(m, Promise) and m.commit is not None and m.accepted is None for m in carried)
    assert any(isinstance(m, Prepare) and m.after is not None for m in carried)
    assert any(isinstance(m, Commit) and m.decision.history for m in carried)
    assert any(isinstance(m, Commit) and ("C", BIG) in m.decision.members for m in carried)
    first = net.delivered("A")
    assert net.delivered("B") == first
    assert net.delivered("C") == first  # the restarted one too: the history came with the commit
    assert sorted(first[-2:]) == ["after-A", "after-B"]
    assert {f"g{k}" for k in range(7)} <= set(first)


def test_a_checkpoint_sent_to_a_restarted_router_passes_through_the_codec() -> None:
    net = WireNet()
    for k, r in enumerate("ABC"):
        net.publish(r, f"g{k}")
    net.settle()
    floors(net)  # every router compacts what all of them delivered
    net.crash("C")
    net.publish("A", "after")
    net.settle()
    net.restart("C")
    net.settle()
    assert any(isinstance(m, Floor) for m in net.carried)
    assert any(isinstance(m, Commit) and m.decision.floor is not None and m.decision.floor.cp.number == 3
               for m in net.carried)
    assert net.delivered("C") == ["after"] and net.nodes["C"].count == net.nodes["A"].count == 4


# ---------------------------------------------------------------------- garbage


def good() -> list[Any]:
    """[kind, src, dst, topic, epoch, seq, ack_epoch, ack, msg] as it comes out of the JSON decoder: a
    Promise with every field set, in a frame carrying an acknowledgement."""
    p = Promise((5, "C"), BIG, (4, "A"), (("A", 0), ("C", 3)), ((4, "A"), 2, "A"), (E1,), (E2,),
                B1, ((5, "B"), D1), Commit((4, "A"), D1))
    return typing.cast(list[Any], json.loads(codec.encode_control([lo(p, BIG, 4, BIG + 7, 2)])[1:])[0])


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


# ["LO", src, dst, topic, epoch, seq, ack_epoch, ack,
#  ["PM", ballot, incarnation, installed, view_members, last, held, history, floor, [ballot, decision] accepted,
#   [ballot, decision] commit]]                                   (the message at index M = 8)
# decision = [view, base, members, upto, extra, history, floor]; entry = [key, gid, payload]
GARBAGE: list[tuple[str, Mutation]] = [
    (f"{LAYOUT}, got 10 fields", add((), "extra")),
    (f"{LAYOUT}, got 8 fields", drop(())),
    ("src: expected a string, got int", put((1,), 7)),
    ("dst: expected a string, got bool", put((2,), True)),
    ("topic: expected a string, got NoneType", put((3,), None)),
    ("epoch: expected an int >= 0, got float 1700000000000000.0", put((4,), 1.7e15)),
    ("seq: expected an int >= 0, got int -4", put((5,), -4)),
    ("ack_epoch: expected an int >= 0, got str '1700000000000007'", put((6,), str(BIG + 7))),
    ("ack: expected an int >= 0, got bool True", put((7,), True)),
    ("seq 4 without a message", put((M,), None)),
    ("seq 0 with a message", put((5,), 0)),
    ("lamport: expected a list, got dict of 1", put((M,), {"tag": "PM"})),
    ("lamport: expected a list, got str 'PM'", put((M,), "PM")),
    ("lamport: empty", put((M,), [])),
    ("lamport: unknown tag str 'ZZ'", put((M, 0), "ZZ")),
    ("lamport: unknown tag str 'O'", put((M, 0), "O")),
    ("lamport: unknown tag list of 1", put((M, 0), ["PM"])),
    ("lamport: unknown tag NoneType", put((M, 0), None)),
    ("Promise (PM): expected 10 fields, got 11", add((M,), None)),
    ("Promise (PM): expected 10 fields, got 9", drop((M,))),
    ("Accepted (AD): expected 1 fields, got 10", put((M, 0), "AD")),
    ("Promise.ballot: expected 2 elements, got 3", add((M, 1), 0)),
    ("Promise.ballot: expected a list, got NoneType", put((M, 1), None)),
    ("Promise.ballot.round: expected an int >= 0, got int -1", put((M, 1, 0), -1)),
    ("Promise.ballot.round: expected an int >= 0, got bool True", put((M, 1, 0), True)),
    ("Promise.ballot.round: expected an int >= 0, got float 5.0", put((M, 1, 0), 5.0)),
    ("Promise.ballot.coordinator: expected a string, got int 3", put((M, 1, 1), 3)),
    ("Promise.incarnation: expected an int >= 0, got int -1", put((M, 2), -1)),
    ("Promise.incarnation: expected an int >= 0, got bool False", put((M, 2), False)),
    ("Promise.incarnation: expected an int >= 0, got float 1700000000000000.0", put((M, 2), 1.7e15)),
    ("Promise.incarnation: expected an int >= 0, got str '5'", put((M, 2), "5")),
    ("Promise.incarnation: expected an int >= 0, got int of 71 bits", put((M, 2), -(2**70))),
    ("Promise.installed: expected 2 elements, got 0", put((M, 3), [])),
    ("Promise.installed.round: expected an int >= 0, got int -1", put((M, 3, 0), -1)),  # -1: in keys only
    ("Promise.view_members: expected a list, got dict of 0", put((M, 4), {})),
    ("Promise.view_members[1]: expected 2 elements, got 1", put((M, 4, 1), ["C"])),
    ("Promise.view_members[0].router: expected a string, got NoneType", put((M, 4, 0, 0), None)),
    ("Promise.view_members[1].incarnation: expected an int >= 0, got int -3", put((M, 4, 1, 1), -3)),
    ("Promise.last: expected a list, got NoneType", put((M, 5), None)),  # not optional
    ("Promise.last: expected 3 elements, got 2", drop((M, 5))),
    ("Promise.last.view: expected 2 elements, got 3", add((M, 5, 0), "x")),
    ("Promise.last.view.round: expected an int >= -1, got int -2", put((M, 5, 0, 0), -2)),
    ("Promise.last.view.coordinator: expected a string, got list of 0", put((M, 5, 0, 1), [])),
    ("Promise.last.ts: expected an int >= 0, got int -1", put((M, 5, 1), -1)),
    ("Promise.last.origin: expected a string, got int 0", put((M, 5, 2), 0)),
    ("Promise.held: expected a list, got str 'x'", put((M, 6), "x")),
    ("Promise.held[1]: expected a list, got int 0", add((M, 6), 0)),
    ("Promise.held[0]: expected 3 elements, got 2", drop((M, 6, 0))),
    ("Promise.held[0].gid: expected a string, got int 5", put((M, 6, 0, 1), 5)),
    ("Promise.held[0].payload: expected a string, got list of 1", put((M, 6, 0, 2), [65])),
    ("Promise.held[0].payload: expected base64, got str 'not base64!'", put((M, 6, 0, 2), "not base64!")),
    ("Promise.held[0].payload: expected base64, got str 'QQ'", put((M, 6, 0, 2), "QQ")),  # no padding
    ("Promise.held[0].payload: expected base64, got str 'QQ==\\n'", put((M, 6, 0, 2), "QQ==\n")),
    ("Promise.held[0].payload: expected base64, got str 'AGhp\xe9'", put((M, 6, 0, 2), "AGhp\xe9")),
    ("Promise.held[0].payload: expected canonical base64, got str 'QR=='", put((M, 6, 0, 2), "QR==")),
    ("Promise.history[0].key.ts: expected an int >= 0, got bool True", put((M, 7, 0, 0, 1), True)),
    ("Promise.floor: expected a list, got int 0", put((M, 8), 0)),
    ("Promise.floor.key.view.round: expected an int >= -1, got float 3.5", put((M, 8, 0, 0, 0), 3.5)),
    ("Promise.floor: expected 2 elements, got 3", put((M, 8), [[[3, "B"], 1, "B"], 1, 2])),
    ("Promise.floor.cp: expected 3 elements, got 2", drop((M, 8, 1))),
    ("Promise.floor.cp.number: expected an int >= 0, got int -1", put((M, 8, 1, 0), -1)),
    ("Promise.floor.cp.starts[0]: expected 2 elements, got 3", add((M, 8, 1, 1, 0), 1)),
    ("Promise.floor.cp.starts[0][0]: expected a string, got int 5", put((M, 8, 1, 1, 0, 0), 5)),
    ("Promise.floor.cp.marks[0][1]: expected an int >= 0, got bool True", put((M, 8, 1, 2, 0, 1), True)),
    ("Promise.floor.cp.marks: expected a list, got NoneType", put((M, 8, 1, 2), None)),
    ("Promise.accepted: expected 2 elements, got 1", drop((M, 9))),
    ("Promise.accepted[0].round: expected an int >= 0, got int -1", put((M, 9, 0, 0), -1)),
    ("Promise.accepted[1]: expected 7 elements, got 8", add((M, 9, 1), None)),
    ("Promise.accepted[1].view.round: expected an int >= 0, got bool True", put((M, 9, 1, 0, 0), True)),
    ("Promise.accepted[1].base: expected a list, got NoneType", put((M, 9, 1, 1), None)),
    ("Promise.accepted[1].members[0].incarnation: expected an int >= 0, got float 1.5",
     put((M, 9, 1, 2, 0, 1), 1.5)),
    ("Promise.accepted[1].upto.ts: expected an int >= 0, got NoneType", put((M, 9, 1, 3, 1), None)),
    ("Promise.accepted[1].floor: expected a list, got str 'x'", put((M, 9, 1, 6), "x")),
    ("Promise.commit: expected 2 elements, got 3", put((M, 10), ["C", [4, "A"], at(good(), (M, 10, 1))])),
    ("Promise.commit.ballot.coordinator: expected a string, got bool False", put((M, 10, 0, 1), False)),
    ("Promise.commit.decision.extra[0].key.view.round: expected an int >= -1, got int -5",
     put((M, 10, 1, 4, 0, 0, 0, 0), -5)),
    ("Promise.commit.decision.history[0].payload: expected base64, got str '====", put((M, 10, 1, 5, 0, 2), "====")),
    ("Promise.commit.decision.history: expected a list, got dict of 0", put((M, 10, 1, 5), {})),
]


@pytest.mark.parametrize(("expected", "mutate"), GARBAGE, ids=[g[0] for g in GARBAGE])
def test_garbage_is_a_frame_error_naming_what_is_wrong(expected: str, mutate: Mutation) -> None:
    x = good()
    assert codec.decode_control(frame_of(x))  # the unchanged one is fine
    mutate(x)
    with pytest.raises(codec.FrameError) as exc:
        codec.decode_control(frame_of(x))
    assert str(exc.value).startswith("malformed lamport message: ")
    assert expected in str(exc.value)


BAD_NUMBERS: list[tuple[Any, str]] = [
    (-1, "int -1"), (-BIG, "int -1700000000000000"), (True, "bool True"), (False, "bool False"),
    (1.0, "float 1.0"), (0.0, "float 0.0"), (1.7e15, "float 1700000000000000.0"), ("1", "str '1'"),
    ("0", "str '0'"), (None, "NoneType None"), ([1], "list"), ({}, "dict"),
]


@pytest.mark.parametrize("field", list(SESSION))
@pytest.mark.parametrize(("bad", "shown"), BAD_NUMBERS, ids=[s for _, s in BAD_NUMBERS])
@pytest.mark.parametrize("with_msg", [True, False], ids=["message", "ack-only"])
def test_a_session_field_that_is_not_an_int_from_zero_is_refused(field: str, bad: Any, shown: str,
                                                                   with_msg: bool) -> None:
    """No bool for an int (True == 1 in Python), no float even when whole, no string of digits, no
    null, no negative number: in a frame with a message and in an acknowledgement only."""
    x = good()
    if not with_msg:
        x[5], x[M] = 0, None
    assert codec.decode_control(frame_of(x))  # the unchanged one is fine
    x[SESSION[field]] = bad
    with pytest.raises(codec.FrameError) as exc:
        codec.decode_control(frame_of(x))
    expected = f"malformed lamport message: {field}: expected an int >= 0, got {shown}"
    assert str(exc.value) == expected or isinstance(bad, list | dict) and str(exc.value).startswith(expected + " ")


@pytest.mark.parametrize("seq", [1, 2, BIG])
def test_a_message_exactly_when_seq_is_not_zero(seq: int) -> None:
    with_msg, ack_only = good(), good()
    with_msg[5] = seq
    ack_only[5], ack_only[M] = 0, None
    assert codec.decode_control(frame_of(with_msg))[0].seq == seq  # type: ignore[union-attr]
    assert codec.decode_control(frame_of(ack_only))[0].msg is None  # type: ignore[union-attr]
    with_msg[M] = None  # a numbered frame without its message
    with pytest.raises(codec.FrameError, match=f"^malformed lamport message: seq {seq} without a message$"):
        codec.decode_control(frame_of(with_msg))
    ack_only[M] = good()[M]  # an acknowledgement only with a message
    with pytest.raises(codec.FrameError, match="^malformed lamport message: seq 0 with a message$"):
        codec.decode_control(frame_of(ack_only))
    for empty in ([], 0, "", False, {}):  # "no message" is null and nothing else
        ack_only[M] = empty
        with pytest.raises(codec.FrameError):
            codec.decode_control(frame_of(ack_only))


def test_the_wrong_number_of_fields_is_refused_naming_the_layout() -> None:
    x = good()
    old = ["LO", "A", "B", "t", x[M]]  # a message without its session fields
    ack_only = ["LO", "A", "B", "t", BIG, 0, 0, 0, None]
    assert codec.decode_control(frame_of(ack_only)) == [LamportOrder("B", "A", "t", BIG, 0, 0, 0, None)]
    cases = [old, x[:M], [*x, None], ack_only[:M], [*ack_only[:M], 0, None], ["LO"], x[:4], [*x, *x[5:M]]]
    assert [len(y) for y in cases] == [5, 8, 10, 8, 10, 1, 4, 12]
    for y in cases:
        with pytest.raises(codec.FrameError) as exc:
            codec.decode_control(frame_of(y))
        assert str(exc.value) == f"malformed lamport message: {LAYOUT}, got {len(y)} fields"


def test_one_message_type_where_another_is_expected_is_an_error() -> None:
    good_key, good_entry = [[1, "A"], 1, "A"], [[[1, "A"], 1, "A"], "g", ""]
    assert lamport_from_list(["A", good_key, 1]) == Ack(((1, "A"), 1, "A"), 1)
    assert lamport_from_list(["D", good_entry]) == Data(Entry(((1, "A"), 1, "A"), "g", b""))
    for x in (["D", good_key],  # a key for an entry
              ["A", good_entry, 1],  # an entry for a key
              ["A", [[1, "A"], 1], 1],  # a ballot and a ts for a key
              ["P", good_key, None],  # a key for a ballot
              ["AD", [[1, "A"], 1, "A"]],
              ["R", [1, "A"], None],  # Refuse.promised is not optional
              ["C", [1, "A"], None],  # nor is a Commit's decision
              ["D", [good_key, "g", None]],  # nor a payload
              ["PM", [1, "A"], 0, None, [], good_key, [], [], None, None, ["C", [1, "A"]]]):
        with pytest.raises(codec.FrameError):
            lamport_from_list(x)


def test_optional_fields_take_null_and_nothing_else_empty() -> None:
    x = ["PM", [1, "A"], 0, None, [], [[-1, ""], 0, ""], [], [], None, None, None]
    m = lamport_from_list(x)
    assert m == Promise((1, "A"), 0, None, (), MIN_KEY, (), (), None, None, None)
    assert lamport_from_list(["P", [1, "A"], None]) == Prepare((1, "A"), None)
    for i in (3, 8, 9, 10):  # installed, floor, accepted, commit: [] is not null
        y = list(x)
        y[i] = []
        with pytest.raises(codec.FrameError, match="expected 2 elements|expected 3 elements"):
            lamport_from_list(y)


def test_deep_nesting_is_a_frame_error() -> None:
    for head in (b'C[["LO","A","B","t",', b'C[["LO","A","B","t",1,1,0,0,'):
        with pytest.raises(codec.FrameError):
            codec.decode_control(head + b"[" * 100_000)
    deep: list[Any] = []
    for _ in range(100_000):  # deeper than the recursion limit: the decoder never descends into it
        deep = [deep]
    for x in (deep, ["D", deep], ["A", deep, 1], ["PM", *[deep] * 10], ["AC", [1, "A"], [deep] * 7],
              ["C", [1, "A"], [[1, "A"], [1, "A"], [deep], [[1, "A"], 1, "A"], [deep], [], None]]):
        with pytest.raises(codec.FrameError):
            lamport_from_list(x)
        with pytest.raises(codec.FrameError):
            codec._from_list(["LO", "A", "B", "t", 1, 1, 0, 0, x])
    deep_json = b"[" * 100_000 + b"]" * 100_000
    for i in range(4, M):  # where a session field is due
        fields = [b"1" if j != i else deep_json for j in range(4, M)]
        with pytest.raises(codec.FrameError):
            codec.decode_control(b'C[["LO","A","B","t",' + b",".join(fields) + b',["AD",[1,"A"]]]]')


def test_what_is_not_a_list_is_a_frame_error() -> None:
    for x in (None, 0, True, 1.5, "D", b"D", {"D": 1}, {"D"}, object()):
        with pytest.raises(codec.FrameError, match="lamport: expected a list"):
            lamport_from_list(x)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=3) | st.sampled_from([*TAGS.values(), "AA==", "", "QR=="]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner, max_size=2),
    max_leaves=12)


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
    if type(v) is str:
        return [[v], 0, None, v + "A", v[:-1], v + "=="]
    if v is None:
        return [[], 0, ""]
    return [v[:-1], [*v, 0], [*v, v[-1] if v else "x"], {}, None] if isinstance(v, list) else [0]


@pytest.mark.parametrize("cls", [*MESSAGES, None], ids=lambda c: c.__name__ if c else "ack-only")
@settings(max_examples=150)
@given(data=st.data())
def test_mutated_encodings_are_refused_or_exactly_an_encoding(cls: type | None, data: st.DataObject) -> None:
    o = data.draw(framed(MESSAGES[cls]) if cls else acks_only)
    x = json.loads(codec.encode_control([o])[1:])[0]
    for _ in range(data.draw(st.sampled_from([1, 1, 1, 1, 2, 3]))):
        inner = len(x) == 9 and type(x[M]) is list and data.draw(st.integers(0, 7))  # mostly in the message
        where = positions(x[M], (M,)) if inner else positions(x)  # else anywhere, the session fields too
        if not where:
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
    if x[0] != "LO":  # the kind itself changed: another kind or one skipped
        return
    assert len(back) == 1
    well_formed_order(back[0])  # accepted: a valid value ...
    assert codec.encode_control(back) == frame  # ... and exactly its encoding


EXAMPLES: list[Wire] = [
    Data(E1), Ack(((3, "B"), 7, "C"), 12), Prepare((5, "A"), MIN_KEY), Refuse((5, "A"), (6, "B")),
    Accept((4, "A"), D1), Accepted((5, "A")), Commit((4, "A"), D1),
    Promise((5, "C"), BIG, (4, "A"), (("A", 0),), ((4, "A"), 2, "A"), (E1,), (E2,), B1,
            ((5, "B"), D1), Commit((4, "A"), D1)),
    Floor(BIG, 12),
]


EXAMPLE_ORDERS = [lo(m, BIG, 3, BIG + 1, 2) for m in EXAMPLES] + [lo(None, 5, 0, BIG, 3)]


@pytest.mark.parametrize("o", EXAMPLE_ORDERS, ids=lambda o: type(o.msg).__name__ if o.msg else "ack-only")
def test_every_single_wrong_field_is_refused_or_harmless(o: LamportOrder) -> None:
    """Exhaustive: each element of each list (the kinds and tags too, the session fields too), changed
    to each near value, removed, or with one more element after it: refused, or still a valid frame
    that is exactly its encoding. A scalar turned into another JSON type is always refused: no field
    takes two kinds of scalar."""
    assert {type(m) for m in EXAMPLES} == set(MESSAGES)
    x = json.loads(codec.encode_control([o])[1:])[0]
    variants: list[tuple[tuple[int, ...], str, int, Any]] = []  # (list, how, index, value)
    for *parent, i in positions(x):
        v, p = at(x, (*parent, i)), tuple(parent)
        variants += [(p, "set", i, new) for new in near(v) + (list(TAGS.values()) if type(v) is str else [])]
        variants += [(p, "delete", i, None), (p, "insert", i + 1, 0)]
    refused = 0
    for p, how, i, new in variants:
        y = json.loads(json.dumps(x))
        target = at(y, p)
        old = target[i] if how != "insert" else None
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
        if y[0] != "LO":  # the kind itself changed: skipped as unknown, or another kind
            continue
        assert not (how == "set" and type(old) in (int, str) and type(new) is not type(old)), y
        assert len(back) == 1, y
        well_formed_order(back[0])
        assert codec.encode_control(back) == frame, y
    # most of them are wrong (a name changed to another string is not: router ids, topics, gids)
    renamed = sum(1 for p, how, i, new in variants if how == "set" and type(new) is str and type(at(x, p)[i]) is str)
    assert refused > (len(variants) - renamed) // 2


@given(json_values)
def test_any_json_value_is_a_message_or_a_frame_error(v: Any) -> None:
    try:
        m = lamport_from_list(v)
    except codec.FrameError:
        return
    well_formed(m)
    assert json.dumps(lamport_to_list(m)) == json.dumps(v)


@given(st.sampled_from(list(TAGS.values())), st.lists(json_values, max_size=11))
def test_any_fields_after_a_known_tag_are_a_message_or_a_frame_error(tag: str, fields: list[Any]) -> None:
    v = [tag, *fields]
    try:
        m = lamport_from_list(v)
    except codec.FrameError:
        return
    well_formed(m)
    assert lamport_to_list(m) == v


near_header = st.tuples(  # mostly right, sometimes not: so that some are accepted
    *[names | json_values] * 3, *[st.integers(-2, 3) | nats | json_values] * 4,
    st.none() | messages.map(lamport_to_list) | json_values)


@given(st.lists(json_values, max_size=10) | near_header.map(list))
def test_any_lamport_item_is_a_lamport_order_or_a_frame_error(fields: list[Any]) -> None:
    frame = frame_of(["LO", *fields])
    try:
        back = codec.decode_control(frame)
    except codec.FrameError:
        return
    assert len(back) == 1
    well_formed_order(back[0])
    assert codec.encode_control(back) == frame


@given(st.integers(-3, 3) | epochs, st.integers(-3, 3) | seqs, st.integers(-3, 3) | epochs,
       st.integers(-3, 3) | nats, st.booleans())
def test_session_fields_are_accepted_exactly_when_valid(epoch: int, seq: int, ack_epoch: int, ack: int,
                                                        with_msg: bool) -> None:
    msg = lamport_to_list(Accepted((1, "A"))) if with_msg else None
    frame = frame_of(["LO", "A", "B", "t", epoch, seq, ack_epoch, ack, msg])
    valid = min(epoch, seq, ack_epoch, ack) >= 0 and with_msg == (seq > 0)
    try:
        (back,) = codec.decode_control(frame)
    except codec.FrameError:
        assert not valid
        return
    assert valid
    assert back == LamportOrder("B", "A", "t", epoch, seq, ack_epoch, ack, Accepted((1, "A")) if with_msg else None)
    assert codec.encode_control([back]) == frame


@given(st.binary(max_size=200))
def test_random_bytes_are_a_frame_error_or_a_control_frame(b: bytes) -> None:
    for frame in (b"C" + b, b'C[["LO","A","B","t",' + b, b'C[["LO","A","B","t",1,1,0,0,' + b,
                  b'C[["LO","A","B","t",1,1,0,0,["PM",[1,"A"],' + b, b'C[["LO","A","B","t",1,0,1,' + b):
        try:
            msgs = codec.decode_control(frame)
        except codec.FrameError:
            continue
        assert isinstance(msgs, list)


# ---------------------------------------------------------------------- the snapshot on disk

snapshots = st.builds(lamport.Snapshot, ballots, ballots, ballots, members,
                      st.none() | st.tuples(ballots, decisions), st.none() | commits,
                      st.lists(nats, max_size=3).map(tuple))


@given(snapshots)
def test_a_snapshot_round_trips_through_json(snap: lamport.Snapshot) -> None:
    from oncemesh.interrouter.lamportcodec import snapshot_from_json, snapshot_to_json

    doc = json.loads(json.dumps(snapshot_to_json(snap)))
    assert snapshot_from_json(doc) == snap and doc["version"] == 2


def test_a_version_1_file_reads_when_its_decisions_have_no_floor() -> None:
    """Version 1 had a key where a decision's floor is now a `Base`; routers never set it (null)."""
    from oncemesh.interrouter.lamportcodec import decisions_from_json, decisions_to_json

    d = Decision((4, "A"), (3, "B"), (("A", 0),), MIN_KEY, (E1,), (), None)
    doc = json.loads(json.dumps(decisions_to_json(((5, "B"), d), Commit((4, "A"), d))))
    doc["version"] = 1
    assert decisions_from_json(doc) == (((5, "B"), d), Commit((4, "A"), d))
    doc["commit"][1][6] = [[3, "B"], 1, "B"]  # a version 1 floor (a key): not a base
    with pytest.raises(codec.FrameError, match="floor"):
        decisions_from_json(doc)


@pytest.mark.parametrize("doc", [None, [], {"version": 3, "lamport": []}, {"version": 1},
                                 {"version": 1, "lamport": [[0, ""], [0, ""]]},
                                 {"version": 1, "lamport": [[0, ""], [0, ""], [-1, ""], [], None, None]}])
def test_a_damaged_or_foreign_snapshot_is_a_frame_error(doc: Any) -> None:
    from oncemesh.interrouter.lamportcodec import snapshot_from_json

    with pytest.raises(codec.FrameError):
        snapshot_from_json(doc)
