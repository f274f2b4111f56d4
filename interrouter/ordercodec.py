"""The total-order sequencer's messages (`router.order.sequencer.Wire`) as plain values for a control
frame (`codec`, kind "O"), and back.

    wire   = [life, [cv...], body]
    body   = [tag, field...]            fields in the dataclass's order, tags in `_BODIES`
    ballot = [round, member index, life]
    entry  = [slot, ballot, first, [gid...]]
    checkpoint = [number, [[start key, number]...], [[publisher link, counter]...]]   (or null)

Encoding trusts our own (typed) values. Decoding trusts nothing: a value of the wrong kind (a bool is
not an int, a float is not an int), a list of the wrong length, a negative number where none can be,
or an unknown body tag raises `codec.FrameError` naming the field; nothing else escapes. A decoded
value encodes back to exactly what was decoded. Whether the values make sense to a group (crash vector
length, member indexes) is for `SequencerNode.handle` to judge: the codec knows nothing of members.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from ..router.order.sequencer import (
    Accept,
    Accepted,
    Answer,
    Ballot,
    Body,
    Coordinator,
    CvQuery,
    CvReply,
    Election,
    Entry,
    Floor,
    Journal,
    Nack,
    Prepare,
    Promise,
    Promised,
    Recover,
    RecoverReply,
    Request,
    SeqState,
    Sync,
    SyncAck,
    Voted,
    Wire,
)
from ..router.order.total import Checkpoint
from .strict import Fields, show

_F = Fields("order")
_bad, _str, _bool, _seq = _F.bad, _F.string, _F.boolean, _F.seq
_nat = _F.int_from(0)
_show = show


def _ballot(v: object, where: str) -> Ballot:
    rnd, idx, life = _seq(v, where, 3)
    if type(rnd) is not int or rnd < 0:
        _bad(f"{where}.round: expected an int >= 0, got {_show(rnd)}")
    if type(idx) is not int or idx < -1:  # -1: NO_BALLOT, nobody's
        _bad(f"{where}.member: expected an int >= -1, got {_show(idx)}")
    if type(life) is not int or life < 0:
        _bad(f"{where}.life: expected an int >= 0, got {_show(life)}")
    return (rnd, idx, life)


def _entry(v: object, where: str) -> Entry:
    slot, ballot, first, gids = _seq(v, where, 4)
    gids = _seq(gids, f"{where}.gids")
    for k, g in enumerate(gids):
        if type(g) is not str:
            _bad(f"{where}.gids[{k}]: expected a string, got {_show(g)}")
    return Entry(_nat(slot, f"{where}.slot"), _ballot(ballot, f"{where}.ballot"), _nat(first, f"{where}.first"),
                 tuple(gids))


def _entries(v: object, where: str) -> tuple[Entry, ...]:
    return tuple(_entry(e, f"{where}[{k}]") for k, e in enumerate(_seq(v, where)))


# ---------------------------------------------------------------------- a checkpoint (both order codecs)


def checkpoint_to_list(cp: Checkpoint) -> list[Any]:
    """`total.Checkpoint` as [number, [[start key, number]...], [[publisher link, counter]...]]."""
    return [cp.number, [[k, n] for k, n in cp.starts], [[p, c] for p, c in cp.marks]]


def checkpoint_from_list(v: object, where: str, f: Fields = _F) -> Checkpoint:
    """The checkpoint `checkpoint_to_list` made `v` from; `f.bad` (a `FrameError`) names what is not."""
    number, starts, marks = f.seq(v, where, 3)
    nat = f.int_from(0)

    def pairs(x: object, w: str) -> tuple[tuple[str, int], ...]:
        out = []
        for k, item in enumerate(f.seq(x, w)):
            a, n = f.seq(item, f"{w}[{k}]", 2)
            out.append((f.string(a, f"{w}[{k}][0]"), nat(n, f"{w}[{k}][1]")))
        return tuple(out)

    return Checkpoint(nat(number, f"{where}.number"), pairs(starts, f"{where}.starts"), pairs(marks, f"{where}.marks"))


def _cp_to(cp: Checkpoint | None) -> list[Any] | None:
    return None if cp is None else checkpoint_to_list(cp)


def _cp(v: object, where: str) -> Checkpoint | None:
    return None if v is None else checkpoint_from_list(v, where)


# ---------------------------------------------------------------------- the bodies

_Dec = Callable[[object, str], Any]
_Enc = Callable[[Any], Any] | None  # None: the value itself (ints, strings, bools, ballot tuples)


def _entry_to(e: Entry) -> list[Any]:
    return [e.slot, e.ballot, e.first, e.gids]


def _entries_to(es: tuple[Entry, ...]) -> list[Any]:
    return [[e.slot, e.ballot, e.first, e.gids] for e in es]


_NAT: tuple[_Enc, _Dec] = (None, _nat)
_STR: tuple[_Enc, _Dec] = (None, _str)
_BOOL: tuple[_Enc, _Dec] = (None, _bool)
_BALLOT: tuple[_Enc, _Dec] = (None, _ballot)
_ENTRY: tuple[_Enc, _Dec] = (_entry_to, _entry)
_ENTRIES: tuple[_Enc, _Dec] = (_entries_to, _entries)
_CP: tuple[_Enc, _Dec] = (_cp_to, _cp)  # optional: null when nothing is compacted

# tag, class, the kind of each field in the dataclass's order (checked against it below)
_BODIES: tuple[tuple[str, type[Body], tuple[tuple[_Enc, _Dec], ...]], ...] = (
    ("E", Election, ()),
    ("AN", Answer, ()),
    ("C", Coordinator, ()),
    ("CQ", CvQuery, (_STR,)),
    ("CR", CvReply, (_STR,)),
    ("R", Recover, (_STR,)),
    ("RR", RecoverReply, (_STR, _BALLOT, _NAT, _NAT, _ENTRIES, _ENTRIES, _CP)),
    ("PR", Prepare, (_BALLOT, _NAT)),
    ("PM", Promise, (_BALLOT, _NAT, _NAT, _NAT, _ENTRIES, _ENTRIES, _CP)),
    ("N", Nack, (_BALLOT, _BALLOT)),
    ("AC", Accept, (_BALLOT, _ENTRY)),
    ("AD", Accepted, (_BALLOT, _NAT, _NAT)),
    ("S", Sync, (_ENTRIES, _NAT, _NAT, _NAT, _NAT, _BOOL, _CP)),
    ("SA", SyncAck, (_NAT, _BALLOT)),
    ("RQ", Request, (_STR, _NAT)),
    ("FL", Floor, (_NAT,)),
)


def _tables() -> tuple[dict[type, tuple[str, tuple[tuple[str, _Enc], ...]]],
                       dict[str, tuple[type[Body], tuple[tuple[_Dec, str], ...]]]]:
    """type -> (tag, ((field name, encoder), ...)); tag -> (class, ((decoder, "Class.field"), ...))."""
    enc: dict[type, tuple[str, tuple[tuple[str, _Enc], ...]]] = {}
    dec: dict[str, tuple[type[Body], tuple[tuple[_Dec, str], ...]]] = {}
    for tag, cls, kinds in _BODIES:
        names = [f.name for f in fields(cls)]
        if len(names) != len(kinds) or tag in dec:
            raise AssertionError(f"_BODIES: {cls.__name__}: {len(names)} fields, {len(kinds)} kinds, tag {tag!r}")
        enc[cls] = (tag, tuple((n, e) for n, (e, _) in zip(names, kinds, strict=True)))
        dec[tag] = (cls, tuple((d, f"{cls.__name__}.{n}") for n, (_, d) in zip(names, kinds, strict=True)))
    return enc, dec


_ENCODE, _DECODE = _tables()


# ---------------------------------------------------------------------- the interface


def wire_to_list(w: Wire) -> list[Any]:
    """`w` as lists, tuples, ints, strings and bools (tuples encode as JSON arrays)."""
    spec = _ENCODE.get(type(w.body))
    if spec is None:
        raise TypeError(f"not a sequencer message body: {w.body!r}")
    tag, encs = spec
    body: list[Any] = [tag]
    for name, enc in encs:
        v = getattr(w.body, name)
        body.append(v if enc is None else enc(v))
    return [w.life, w.cv, body]


def wire_from_list(x: object) -> Wire:
    """The `Wire` that `wire_to_list` made `x` from; `codec.FrameError` if `x` is not one."""
    life, cv, body = _seq(x, "wire", 3)
    if type(life) is not int or life < -1:  # -1: the sender does not know its life yet
        _bad(f"wire.life: expected an int >= -1, got {_show(life)}")
    cv = _seq(cv, "wire.cv")
    for k, c in enumerate(cv):
        if type(c) is not int or c < 0:
            _bad(f"wire.cv[{k}]: expected an int >= 0, got {_show(c)}")
    body = _seq(body, "wire.body")
    if not body:
        _bad("wire.body: empty, expected [tag, field...]")
    tag = body[0]
    spec = _DECODE.get(tag) if type(tag) is str else None
    if spec is None:
        _bad(f"wire.body: unknown tag {_show(tag)}")
    cls, decs = spec
    if len(body) != 1 + len(decs):
        _bad(f"{cls.__name__} ({tag}): expected {len(decs)} fields, got {len(body) - 1}")
    return Wire(life, tuple(cv), cls(*[dec(v, where) for (dec, where), v in zip(decs, body[1:], strict=True)]))


# ---------------------------------------------------------------------- what a router keeps on disk

SEQ_STATE_VERSION = 2  # (the order messages' version: their entries and ballots)


def _cv(v: object, where: str) -> tuple[int, ...]:
    return tuple(_nat(c, f"{where}[{k}]") for k, c in enumerate(_seq(v, where)))


def seqstate_to_json(st: SeqState) -> dict[str, Any]:
    """A member's votes as the first line of its journal file:
    {"version": 2, "sequencer": [life, [cv...], promised, base, base_num, checkpoint or null, [entry...]]}."""
    return {"version": SEQ_STATE_VERSION, "sequencer": [st.life, list(st.cv), list(st.promised), st.base,
                                                       st.base_num, _cp_to(st.cp), _entries_to(st.votes)]}


def journal_to_json(j: Journal) -> dict[str, Any]:
    """One line of a journal: {"voted": [entry...]}, {"promised": ballot} or {"cv": [life...]}."""
    if isinstance(j, Voted):
        return {"voted": _entries_to(j.entries)}
    if isinstance(j, Promised):
        return {"promised": list(j.ballot)}
    return {"cv": list(j.cv)}


def seqstate_from_json(lines: list[object]) -> SeqState:
    """The votes a journal file holds: its first line with every later one applied; `FrameError`
    for anything else (another version, damage)."""
    if not lines:
        _bad("sequencer state: empty")
    head = lines[0]
    if not isinstance(head, dict) or head.get("version") != SEQ_STATE_VERSION or "sequencer" not in head:
        _bad(f"sequencer state: expected {{'version': {SEQ_STATE_VERSION}, 'sequencer': [...]}}")
    life, cv, promised, base, base_num, cp, votes = _seq(head["sequencer"], "sequencer", 7)
    if type(life) is not int or life < -1:
        _bad(f"sequencer.life: expected an int >= -1, got {_show(life)}")
    cvs = _cv(cv, "sequencer.cv")
    ballot = _ballot(promised, "sequencer.promised")
    acc = {e.slot: e for e in _entries(votes, "sequencer.votes")}
    for k, line in enumerate(lines[1:], 1):
        if not isinstance(line, dict) or len(line) != 1:
            _bad(f"sequencer journal line {k}: expected one of voted, promised, cv")
        ((what, v),) = line.items()
        if what == "voted":
            for e in _entries(v, f"journal[{k}].voted"):
                acc[e.slot] = e
        elif what == "promised":
            ballot = max(ballot, _ballot(v, f"journal[{k}].promised"))
        elif what == "cv":
            cvs = tuple(max(a, b) for a, b in zip(cvs, _cv(v, f"journal[{k}].cv"), strict=False))
        else:
            _bad(f"sequencer journal line {k}: unknown {_show(what)}")
    return SeqState(life, cvs, ballot, _nat(base, "sequencer.base"), _nat(base_num, "sequencer.base_num"),
                    _cp(cp, "sequencer.cp"), tuple(acc[s] for s in sorted(acc)))
