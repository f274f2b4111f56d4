"""The Lamport total-order core's messages (`router.order.lamport.Wire`) as plain values for a control
frame (`codec`, kind "LO"), and back.

    msg      = [tag, field...]              fields in the dataclass's order, tags in `_MESSAGES`
    ballot   = [round, coordinator]         round >= 0
    key      = [view, ts, origin]           view: a ballot whose round may also be -1 (MIN_KEY)
    members  = [[router, incarnation]...]
    entry    = [key, gid, payload]          payload: the bytes as standard base64 (padded)
    checkpoint = [number, [[start key, number]...], [[publisher link, counter]...]]
    base     = [key, checkpoint]            where a history begins (`lamport.Base`)
    decision = [view, base, members, upto, [entry...] extra, [entry...] history, floor (base or null)]
    commit   = [ballot, decision]           Promise.commit: a Commit's fields, without its tag
    accepted = [ballot, decision]           Promise.accepted
    optional fields (Prepare.after, Promise.installed / floor / accepted / commit, Decision.floor): null
    Floor    = [incarnation, floor]

Encoding trusts our own (typed) values and makes lists all the way down (no tuples), so what the
JSON decoder hands back compares equal to what was encoded. Decoding trusts nothing: a value of the
wrong kind (a bool is not an int, a float is not an int), a list of the wrong length, a negative
number where none can be (a round of -1 only inside a key), a payload that is not canonical base64
or an unknown tag raises `codec.FrameError` naming the field; nothing else escapes, whatever the
nesting. The decoder follows the fixed layout and never recurses into what it was given. Decoded
values are the dataclasses with tuples where they hold tuples (keys, ballots, members, entries):
equal to the originals and hashable. A decoded value encodes back to exactly what was decoded.
Whether the values make sense to the stream (members sorted, keys in this view) is for
`LamportNode.handle` to judge: the codec knows only the layout.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import fields
from typing import Any, NamedTuple

from ..router.order.lamport import (
    Accept,
    Accepted,
    Ack,
    Ballot,
    Base,
    Commit,
    Data,
    Decision,
    Entry,
    Floor,
    Key,
    Members,
    Prepare,
    Promise,
    Refuse,
    Snapshot,
    Wire,
)
from .ordercodec import checkpoint_from_list, checkpoint_to_list
from .strict import Fields, show

_F = Fields("lamport")
_bad, _str, _seq, _int_from = _F.bad, _F.string, _F.seq, _F.int_from
_nat = _int_from(0)
_show = show


class _Kind(NamedTuple):
    """How one field travels: `enc` our typed value -> plain lists; `dec` (value, where) -> typed value."""

    enc: Callable[[Any], Any]
    dec: Callable[[object, str], Any]


# ---------------------------------------------------------------------- scalars


def _same(v: Any) -> Any:
    return v


def _payload_to(p: bytes) -> str:
    return base64.b64encode(p).decode("ascii")


def _payload(v: object, where: str) -> bytes:
    s = _str(v, where)
    try:
        b = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):  # ValueError: not ASCII
        _bad(f"{where}: expected base64, got {_show(s)}")
    if base64.b64encode(b).decode("ascii") != s:  # e.g. "QR==": b"A" too, but not what we send
        _bad(f"{where}: expected canonical base64, got {_show(s)}")
    return b


NAT = _Kind(_same, _nat)
STR = _Kind(_same, _str)
PAYLOAD = _Kind(_payload_to, _payload)


# ---------------------------------------------------------------------- compound values


def _ballot_kind(low: int) -> _Kind:
    dec_round = _int_from(low)

    def enc(b: Ballot) -> list[Any]:
        return [b[0], b[1]]

    def dec(v: object, where: str) -> Ballot:
        rnd, coord = _seq(v, where, 2)
        return (dec_round(rnd, f"{where}.round"), _str(coord, f"{where}.coordinator"))
    return _Kind(enc, dec)


BALLOT = _ballot_kind(0)
_VIEW = _ballot_kind(-1)  # in keys only: MIN_KEY = ((-1, ""), 0, "")


def _key_to(k: Key) -> list[Any]:
    (rnd, coord), ts, origin = k
    return [[rnd, coord], ts, origin]


def _key(v: object, where: str) -> Key:
    view, ts, origin = _seq(v, where, 3)
    return (_VIEW.dec(view, f"{where}.view"), _nat(ts, f"{where}.ts"), _str(origin, f"{where}.origin"))


KEY = _Kind(_key_to, _key)


def _members(v: object, where: str) -> Members:
    out = []
    for k, m in enumerate(_seq(v, where)):
        w = f"{where}[{k}]"
        router, inc = _seq(m, w, 2)
        out.append((_str(router, f"{w}.router"), _nat(inc, f"{w}.incarnation")))
    return tuple(out)


MEMBERS = _Kind(lambda ms: [[r, i] for r, i in ms], _members)


def _optional(kind: _Kind) -> _Kind:
    enc, dec = kind
    return _Kind(lambda v: None if v is None else enc(v), lambda v, where: None if v is None else dec(v, where))


def _many(kind: _Kind) -> _Kind:
    enc, dec = kind
    return _Kind(lambda vs: [enc(v) for v in vs],
                 lambda vs, where: tuple(dec(v, f"{where}[{k}]") for k, v in enumerate(_seq(vs, where))))


def _record(cls: type, *kinds: _Kind) -> _Kind:
    """A dataclass as the list of its fields, in their order."""
    names = [f.name for f in fields(cls)]
    if len(names) != len(kinds):
        raise AssertionError(f"{cls.__name__}: {len(names)} fields, {len(kinds)} kinds")
    spec = tuple(zip(names, kinds, strict=True))

    def enc(v: Any) -> list[Any]:
        return [k.enc(getattr(v, n)) for n, k in spec]

    def dec(v: object, where: str) -> Any:
        items = _seq(v, where, len(spec))
        return cls(*[k.dec(i, f"{where}.{n}") for (n, k), i in zip(spec, items, strict=True)])

    return _Kind(enc, dec)


def _pair(first: _Kind, second: _Kind) -> _Kind:
    def dec(v: object, where: str) -> tuple[Any, Any]:
        a, b = _seq(v, where, 2)
        return (first.dec(a, f"{where}[0]"), second.dec(b, f"{where}[1]"))
    return _Kind(lambda p: [first.enc(p[0]), second.enc(p[1])], dec)


ENTRY = _record(Entry, KEY, STR, PAYLOAD)
ENTRIES = _many(ENTRY)
CHECKPOINT = _Kind(checkpoint_to_list, lambda v, where: checkpoint_from_list(v, where, _F))
BASE = _record(Base, KEY, CHECKPOINT)
DECISION = _record(Decision, BALLOT, BALLOT, MEMBERS, KEY, ENTRIES, ENTRIES, _optional(BASE))
COMMIT = _record(Commit, BALLOT, DECISION)  # nested in a Promise: without its tag

# ---------------------------------------------------------------------- the messages

# tag, class, the kind of each field in the dataclass's order (checked against it below)
_MESSAGES: tuple[tuple[str, type, tuple[_Kind, ...]], ...] = (
    ("D", Data, (ENTRY,)),
    ("A", Ack, (KEY, NAT)),
    ("P", Prepare, (BALLOT, _optional(KEY))),
    ("PM", Promise, (BALLOT, NAT, _optional(BALLOT), MEMBERS, KEY, ENTRIES, ENTRIES, _optional(BASE),
                     _optional(_pair(BALLOT, DECISION)), _optional(COMMIT))),
    ("R", Refuse, (BALLOT, BALLOT)),
    ("AC", Accept, (BALLOT, DECISION)),
    ("AD", Accepted, (BALLOT,)),
    ("C", Commit, (BALLOT, DECISION)),
    ("F", Floor, (NAT, NAT)),
)


def _tables() -> tuple[dict[type, tuple[str, _Kind]], dict[str, tuple[str, int, _Kind]]]:
    """class -> (tag, record); tag -> (class name, number of fields, record)."""
    enc: dict[type, tuple[str, _Kind]] = {}
    dec: dict[str, tuple[str, int, _Kind]] = {}
    for tag, cls, kinds in _MESSAGES:
        if tag in dec or cls in enc:
            raise AssertionError(f"_MESSAGES: {cls.__name__} or tag {tag!r} twice")
        rec = _record(cls, *kinds)
        enc[cls], dec[tag] = (tag, rec), (cls.__name__, len(kinds), rec)
    return enc, dec


_ENCODE, _DECODE = _tables()


# ---------------------------------------------------------------------- the interface


def lamport_to_list(msg: Wire) -> list[Any]:
    """`msg` as (nested) lists, ints, strings and None: [tag, field...]."""
    spec = _ENCODE.get(type(msg))
    if spec is None:
        raise TypeError(f"not a lamport message: {msg!r}")
    tag, rec = spec
    return [tag, *rec.enc(msg)]


def lamport_from_list(x: object) -> Wire:
    """The message that `lamport_to_list` made `x` from; `codec.FrameError` if `x` is not one."""
    x = _seq(x, "lamport")
    if not x:
        _bad("lamport: empty, expected [tag, field...]")
    tag = x[0]
    spec = _DECODE.get(tag) if type(tag) is str else None
    if spec is None:
        _bad(f"lamport: unknown tag {_show(tag)}")
    name, n, rec = spec
    if len(x) != 1 + n:
        _bad(f"{name} ({tag}): expected {n} fields, got {len(x) - 1}")
    msg: Wire = rec.dec(x[1:], name)
    return msg


# ---------------------------------------------------------------------- what a router keeps on disk

SNAPSHOT_VERSION = 2  # 2: a decision's floor is a `Base` (a checkpoint); 1 had a key there, always null
_READS = (1, 2)  # a version 1 file with a null floor reads the same
_SNAPSHOT = _record(Snapshot, BALLOT, BALLOT, BALLOT, MEMBERS, _optional(_pair(BALLOT, DECISION)),
                    _optional(COMMIT), _many(NAT))


def snapshot_to_json(snap: Snapshot) -> dict[str, Any]:
    """A member's durable part (`LamportNode.snapshot`) as a JSON document, versioned:
    {"version": 2, "lamport": [promised, seen, installed, members, accepted, commit, [life...]]}."""
    return {"version": SNAPSHOT_VERSION, "lamport": _SNAPSHOT.enc(snap)}


def snapshot_from_json(doc: object) -> Snapshot:
    """The snapshot `snapshot_to_json` made `doc` from; `codec.FrameError` for anything else (a file of
    another version, or damaged)."""
    if not isinstance(doc, dict) or doc.get("version") not in _READS or "lamport" not in doc:
        _bad(f"lamport snapshot: expected {{'version': {SNAPSHOT_VERSION}, 'lamport': [...]}}")
    snap: Snapshot = _SNAPSHOT.dec(doc["lamport"], "snapshot")
    return snap


_ACCEPTED = _optional(_pair(BALLOT, DECISION))
_COMMIT = _optional(COMMIT)


def decisions_to_json(accepted: tuple[Ballot, Decision] | None, commit: Commit | None) -> dict[str, Any]:
    """A snapshot's big part (decisions carry histories), kept in a file of its own so that a new
    promise, the frequent change, rewrites only the small part: {"version": 2, "accepted", "commit"}."""
    return {"version": SNAPSHOT_VERSION, "accepted": _ACCEPTED.enc(accepted), "commit": _COMMIT.enc(commit)}


def decisions_from_json(doc: object) -> tuple[tuple[Ballot, Decision] | None, Commit | None]:
    if not isinstance(doc, dict) or doc.get("version") not in _READS or not {"accepted", "commit"} <= set(doc):
        _bad(f"lamport decisions: expected {{'version': {SNAPSHOT_VERSION}, 'accepted': ..., 'commit': ...}}")
    return _ACCEPTED.dec(doc["accepted"], "accepted"), _COMMIT.dec(doc["commit"], "commit")
