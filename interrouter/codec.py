"""Frames on the inter-router link: each AMQP transfer carries one frame.

    data frame:     b"D" | u16 header length | header (JSON) | payload (the message, untouched)
    control frame:  b"C" | JSON array of messages, each [kind, field...]
                    (an Order's sequencer message, kind "O": `ordercodec`;
                    a LamportOrder's Lamport message, kind "LO": `lamportcodec`)

From protocol version 6 (`messages.COMPACT_VERSION`), to a neighbour that speaks it, the compact forms
(docs/wire-protocol.md, "Compact frames"): no JSON on the per-message path.

    data frame:     b"d" | u16 header length | header (fields joined by US, 0x1F) | payload
    control frame:  b"c" | records joined by RS (0x1E): an Acks record "A" US src US dst, then per item
                    GS (0x1D) gid US sid US state [US condition US description]; a Finals record without
                    notes "F" US src US dst GS gid US gid ...; any other message "J" + its JSON array

A string that holds one of the three separators cannot go compact: that message (or copy) goes in
the JSON form, which every version-6 router reads too (JSON escapes every control character, so a
"J" record never holds a separator). The decoders take both forms whatever was agreed.

A transit router reads only the short header of a data frame and slices the payload out without
copying its contents into anything else. Unknown message kinds are skipped (forward compatibility);
a malformed frame raises `FrameError` and the adapter closes that connection.
"""

from __future__ import annotations

import json
import struct
from typing import Any, assert_never

from .lamportcodec import lamport_from_list, lamport_to_list
from .members import msg_from_list, msg_to_list
from .messages import (
    Acks,
    Bye,
    Control,
    Copy,
    Finals,
    Hello,
    Holds,
    LamportOrder,
    LinkState,
    MemberFrame,
    Order,
    Probes,
    PubDeclare,
    Queries,
    SubAck,
    SubUpdate,
    TableSync,
)
from .ordercodec import wire_from_list, wire_to_list
from .strict import Fields, FrameError

_HDR = struct.Struct(">H")
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode
_loads = json.JSONDecoder().decode


def encode_copy_header(origin: str, inc: str, gid: str, topic: str, dests: dict[str, tuple[str, ...]],
                       preds: tuple[str, ...] = (), deps: tuple[tuple[str, str], ...] = (),
                       by_arrival: bool = False) -> bytes:
    fields: list[Any] = [origin, inc, gid, topic, {k: list(v) for k, v in dests.items()}]
    if preds or deps or by_arrival:
        fields.append(list(preds))
    if deps or by_arrival:
        fields.append([[g, t] for g, t in deps])
    if by_arrival:
        # (1: its publisher declared no order, its tag is none; absent for ours, and a router of an
        # earlier version ignores it: docs/wire-protocol.md)
        fields.append(1)
    header = _dumps(fields).encode()
    if len(header) > 0xFFFF:
        raise ValueError(f"copy header of {len(header)} bytes exceeds 65535 (too many subscriptions)")
    return b"D" + _HDR.pack(len(header)) + header


_US, _GS, _RS = "\x1f", "\x1d", "\x1e"


def encode_copy_header_compact(origin: str, inc: str, gid: str, topic: str, dests: dict[str, tuple[str, ...]],
                               preds: tuple[str, ...] = (), deps: tuple[tuple[str, str], ...] = (),
                               by_arrival: bool = False) -> bytes:
    """The version-6 header ("d"): [origin, inc, gid, topic, flags, routers, (router, n, sid...)...,
    and with flag 2: n, pred..., n, (dep gid, dep topic)...] joined by US. Flag 1: by arrival. A
    field holding US falls back to the JSON form ("D"), which version 6 reads too."""
    ordered = bool(preds or deps)
    fields = [origin, inc, gid, topic, "3" if by_arrival and ordered else "2" if ordered else "1" if by_arrival
              else "0", str(len(dests))]
    for router, sids in dests.items():
        fields.append(router)
        fields.append(str(len(sids)))
        fields.extend(sids)
    if ordered:
        fields.append(str(len(preds)))
        fields.extend(preds)
        fields.append(str(len(deps)))
        for g, t in deps:
            fields.append(g)
            fields.append(t)
    text = _US.join(fields)
    if text.count(_US) != len(fields) - 1:
        return encode_copy_header(origin, inc, gid, topic, dests, preds, deps, by_arrival)
    header = text.encode()
    if len(header) > 0xFFFF:
        raise ValueError(f"copy header of {len(header)} bytes exceeds 65535 (too many subscriptions)")
    return b"d" + _HDR.pack(len(header)) + header


def encode_copy(c: Copy, compact: bool = False) -> bytes:
    enc = encode_copy_header_compact if compact else encode_copy_header
    return enc(c.origin, c.inc, c.gid, c.topic, c.dests, c.preds, c.deps, c.by_arrival) + c.payload


CopyFields = tuple[str, str, str, str, dict[str, tuple[str, ...]], bytes, tuple[str, ...], tuple[tuple[str, str], ...],
                   bool]
"""A copy's fields in `Copy`'s order, as a plain tuple (`decode_copy_fields`)."""


def _decode_compact_copy(frame: bytes) -> CopyFields:
    (n,) = _HDR.unpack_from(frame, 1)
    if len(frame) < 3 + n:
        raise ValueError("header longer than the frame")
    f = frame[3:3 + n].decode().split(_US)
    origin, inc, gid, topic, flags = f[0], f[1], f[2], f[3], int(f[4])
    if not 0 <= flags <= 3:
        raise ValueError(f"flags {flags}")
    dests: dict[str, tuple[str, ...]] = {}
    k = 6
    for _ in range(int(f[5])):
        c = int(f[k + 1])
        if c < 0 or k + 2 + c > len(f):
            raise ValueError("destination list past the header")
        dests[f[k]] = tuple(f[k + 2:k + 2 + c])
        k += 2 + c
    preds: tuple[str, ...] = ()
    deps: tuple[tuple[str, str], ...] = ()
    if flags & 2:
        c = int(f[k])
        if c < 0 or k + 1 + c > len(f):
            raise ValueError("predecessors past the header")
        preds = tuple(f[k + 1:k + 1 + c])
        k += 1 + c
        c = int(f[k])
        if c < 0 or k + 1 + 2 * c > len(f):
            raise ValueError("dependencies past the header")
        deps = tuple((f[k + 1 + 2 * i], f[k + 2 + 2 * i]) for i in range(c))
        k += 1 + 2 * c
    if k != len(f):
        raise ValueError(f"{len(f) - k} field(s) after the header's last")
    return origin, inc, gid, topic, dests, frame[3 + n:], preds, deps, bool(flags & 1)


def decode_copy_fields(frame: bytes) -> CopyFields:
    """A data frame, either form ("D" JSON, "d" compact), as `Copy`'s fields in a tuple: what a
    router reads per copy (the frozen `Copy` costs nine `object.__setattr__` calls to build)."""
    if frame[:1] == b"d":
        try:
            return _decode_compact_copy(frame)
        except (struct.error, ValueError, IndexError) as exc:
            raise FrameError(f"malformed data frame: {exc}") from None
    try:
        (n,) = _HDR.unpack_from(frame, 1)
        origin, inc, gid, topic, dests, *rest = _loads(frame[3:3 + n].decode())
        return (str(origin), str(inc), str(gid), str(topic),
                {str(k): tuple(str(s) for s in v) for k, v in dests.items()}, frame[3 + n:],
                tuple(str(p) for p in rest[0]) if rest and rest[0] else (),
                tuple((str(g), str(t)) for g, t in rest[1]) if len(rest) > 1 and rest[1] else (),
                len(rest) > 2 and rest[2] == 1)
    except (struct.error, ValueError, TypeError, AttributeError) as exc:
        raise FrameError(f"malformed data frame: {exc}") from None


def decode_copy(frame: bytes) -> Copy:
    """A data frame, either form ("D" JSON, "d" compact)."""
    return Copy(*decode_copy_fields(frame))


def _to_list(m: Control) -> list[Any]:
    # `type(m) is C` on final classes: mypy narrows it, and assert_never checks that every kind has
    # its case. The kinds most frequent under load come first (each miss costs a `type` call).
    if type(m) is Acks:
        return ["A", m.src, m.dst, [[g, s, st, list(e) if e else None] for g, s, st, e in m.items]]
    if type(m) is Finals:
        if m.notes:
            return ["F", m.src, m.dst, m.gids, [[g, p, o, list(e) if e else None, d] for g, p, o, e, d in m.notes]]
        return ["F", m.src, m.dst, m.gids]
    if type(m) is LamportOrder:
        return ["LO", m.src, m.dst, m.topic, m.epoch, m.seq, m.ack_epoch, m.ack,
                None if m.msg is None else lamport_to_list(m.msg)]
    if type(m) is MemberFrame:
        return ["M", m.src, m.dst, m.epoch, m.seq, m.ack_epoch, m.ack, None if m.msg is None else msg_to_list(m.msg)]
    if type(m) is Order:
        return ["O", m.src, m.dst, m.topic, wire_to_list(m.wire)]
    if type(m) is Probes:
        return ["P", m.src, m.dst, m.gids, m.inc]
    if type(m) is Holds:
        return ["HO", m.src, m.dst, m.gids]
    if type(m) is Queries:
        return ["Q", m.src, m.dst, m.gids]
    if type(m) is PubDeclare:
        return ["PD", m.src, m.dst, m.plid, m.gids, m.mark]
    if type(m) is Hello:
        return ["H", m.src, m.inc]
    if type(m) is LinkState:
        return ["L", m.origin, m.inc, m.seq, m.neighbours]
    if type(m) is SubUpdate:
        return ["S", m.src, m.dst, m.entry, m.req, list(m.presented)]
    if type(m) is SubAck:
        return ["SA", m.src, m.dst, m.sid, m.req, m.ok, m.reason]
    if type(m) is TableSync:
        return ["T", m.src, m.dst, m.inc, m.entries, m.reply]
    if type(m) is Bye:
        return ["B", m.src, m.inc]
    assert_never(m)


def _from_list(x: list[Any]) -> Control | None:
    kind = x[0]
    if kind == "A":
        return Acks(x[1], x[2], [(g, s, int(st), (e[0], e[1]) if e else None) for g, s, st, e in x[3]])
    if kind == "F":
        return Finals(x[1], x[2], list(x[3]), _notes_from_list(x[4]) if len(x) > 4 else ())
    if kind == "P":
        return Probes(x[1], x[2], list(x[3]), str(x[4]) if len(x) > 4 else "")
    if kind == "H":
        return Hello(x[1], x[2])
    if kind == "L":
        return LinkState(x[1], x[2], int(x[3]), {str(k): float(v) for k, v in x[4].items()})
    if kind == "S":
        return SubUpdate(x[1], x[2], dict(x[3]), x[4], tuple(x[5]) if len(x) > 5 and x[5] else ())
    if kind == "SA":
        return SubAck(x[1], x[2], x[3], int(x[4]), bool(x[5]), x[6])
    if kind == "T":
        return TableSync(x[1], x[2], x[3], list(x[4]), bool(x[5]) if len(x) > 5 else False)
    if kind == "B":
        return Bye(x[1], x[2])
    if kind == "PD":
        return PubDeclare(x[1], x[2], x[3], list(x[4]), int(x[5]) if len(x) > 5 and x[5] is not None else None)
    if kind == "HO":
        return Holds(x[1], x[2], list(x[3]))
    if kind == "Q":
        return Queries(x[1], x[2], list(x[3]))
    if kind == "O":
        return _order_from_list(x)
    if kind == "LO":
        return _lamport_from_list(x)
    if kind == "M":
        return _member_from_list(x)
    return None  # a kind from a newer version: skipped


_FINALS = Fields("finals")
_NOTE_OUTCOME = _FINALS.int_from(1)


def _notes_from_list(x: object) -> tuple[tuple[str, str, int, tuple[str, str] | None, str | None], ...]:
    """The optional fifth field of a FINAL: [[gid, plain gid, outcome, [condition, description] or
    null, digest or null], ...]; strict, nothing coerced."""
    out = []
    for i, n in enumerate(_FINALS.seq(x, "notes")):
        gid, plain, outcome, error, digest = _FINALS.seq(n, f"notes[{i}]", 5)
        if error is not None:
            cond, desc = _FINALS.seq(error, f"notes[{i}].error", 2)
            error = (_FINALS.string(cond, f"notes[{i}].error"), _FINALS.string(desc, f"notes[{i}].error"))
        if digest is not None:
            _FINALS.string(digest, f"notes[{i}].digest")
        out.append((_FINALS.string(gid, f"notes[{i}].gid"), _FINALS.string(plain, f"notes[{i}].plain"),
                    _NOTE_OUTCOME(outcome, f"notes[{i}].outcome"), error, digest))
    return tuple(out)


def _order_from_list(x: list[Any]) -> Order:
    """Strict, unlike the older kinds: exactly [kind, src, dst, topic, wire], nothing coerced."""
    if not isinstance(x, list) or len(x) != 5:
        got = f"{len(x)} fields" if isinstance(x, list) else type(x).__name__
        raise FrameError(f"malformed order message: expected [kind, src, dst, topic, wire], got {got}")
    _, src, dst, topic, wire = x
    for name, v in (("src", src), ("dst", dst), ("topic", topic)):
        if type(v) is not str:
            raise FrameError(f"malformed order message: {name}: expected a string, got {type(v).__name__}")
    return Order(dst, src, topic, wire_from_list(wire))


_LAMPORT = Fields("lamport")
_MEMBER = Fields("member")


def _session_frame(fields: Fields, x: object, names: tuple[str, ...]) -> tuple[list[str], int, int, int, int, Any]:
    """A frame of a reliable session (interrouter/channel.py), strict: exactly [kind, *names (strings),
    epoch, seq, ack_epoch, ack, msg], nothing coerced; a message exactly when seq > 0. Returns the
    strings, the four numbers and the message as it came."""
    if not isinstance(x, list) or len(x) != len(names) + 6:
        got = f"{len(x)} fields" if isinstance(x, list) else type(x).__name__
        fields.bad(f"expected [kind, {', '.join(names)}, epoch, seq, ack_epoch, ack, msg], got {got}")
    strings = [fields.string(v, name) for name, v in zip(names, x[1:], strict=False)]
    nat = fields.int_from(0)
    epoch, seq, ack_epoch, ack = (nat(v, name) for name, v in zip(("epoch", "seq", "ack_epoch", "ack"),
                                                                   x[len(names) + 1:], strict=False))
    msg = x[-1]
    if (msg is None) != (seq == 0):
        fields.bad(f"seq {seq} with{'out' if msg is None else ''} a message")
    return strings, epoch, seq, ack_epoch, ack, msg


def _lamport_from_list(x: list[Any]) -> LamportOrder:
    """Strict like `_order_from_list`: exactly [kind, src, dst, topic, epoch, seq, ack_epoch, ack, msg]."""
    (src, dst, topic), epoch, seq, ack_epoch, ack, msg = _session_frame(_LAMPORT, x, ("src", "dst", "topic"))
    return LamportOrder(dst, src, topic, epoch, seq, ack_epoch, ack, None if msg is None else lamport_from_list(msg))


def _member_from_list(x: list[Any]) -> MemberFrame:
    """Strict: exactly [kind, src, dst, epoch, seq, ack_epoch, ack, msg] (interrouter/members.py,
    `msg_from_list`)."""
    (src, dst), epoch, seq, ack_epoch, ack, msg = _session_frame(_MEMBER, x, ("src", "dst"))
    return MemberFrame(dst, src, epoch, seq, ack_epoch, ack, None if msg is None else msg_from_list(msg))


def encode_control(msgs: list[Control]) -> bytes:
    return b"C" + _dumps([_to_list(m) for m in msgs]).encode()


def _compact_record(m: Control) -> str:
    """One message of a compact control frame: Acks and Finals (without notes) in fields, the rest,
    and any whose strings hold a separator, as "J" + JSON."""
    if type(m) is Acks:
        parts = ["A", _US, m.src, _US, m.dst]
        us = 2
        for g, s, st, e in m.items:
            if e is None:
                parts += (_GS, g, _US, s, _US, str(st))
                us += 2
            else:
                parts += (_GS, g, _US, s, _US, str(st), _US, e[0], _US, e[1])
                us += 4
        text = "".join(parts)
        if text.count(_US) == us and text.count(_GS) == len(m.items) and _RS not in text:
            return text
    elif type(m) is Finals and not m.notes:
        text = f"F{_US}{m.src}{_US}{m.dst}{_GS}{_US.join(m.gids)}"
        if text.count(_US) == 1 + len(m.gids) and text.count(_GS) == 1 and _RS not in text:
            return text
    return "J" + _dumps(_to_list(m))


def encode_control_compact(msgs: list[Control]) -> bytes:
    """A version-6 control frame ("c"): `msgs` in order, one record each."""
    return b"c" + _RS.join([_compact_record(m) for m in msgs]).encode()


def _decode_compact_control(frame: bytes, order: bool) -> list[Control]:
    out: list[Control] = []
    for rec in frame[1:].decode().split(_RS):
        kind = rec[:1]
        if kind == "A":
            head, *items = rec.split(_GS)
            _, src, dst = head.split(_US)
            acks: list[tuple[str, str, int, tuple[str, str] | None]] = []
            for it in items:
                f = it.split(_US)
                if len(f) == 3:
                    acks.append((f[0], f[1], int(f[2]), None))
                elif len(f) == 5:
                    acks.append((f[0], f[1], int(f[2]), (f[3], f[4])))
                else:
                    raise ValueError(f"an acknowledgement of {len(f)} fields")
            out.append(Acks(src, dst, acks))
        elif kind == "F":
            head, gids = rec.split(_GS)
            _, src, dst = head.split(_US)
            out.append(Finals(src, dst, gids.split(_US)))
        elif kind == "J":
            _json_item(_loads(rec[1:]), order, out)
        # (any other kind: from a newer version, skipped)
    return out


def _json_item(x: Any, order: bool, out: list[Control]) -> None:
    """One message in its JSON form onto `out`: not an order message from a neighbour too old for
    them (`order` False), nor a kind from a newer version (skipped)."""
    if not order and isinstance(x, list) and x[:1] in (["O"], ["LO"]):
        return
    m = _from_list(x)
    if m is not None:
        out.append(m)


def decode_control(frame: bytes, order: bool = True) -> list[Control]:
    """The messages of a control frame, either form ("C" JSON, "c" compact). `order` False (a
    neighbour speaking a protocol version older than `messages.ORDER_VERSION`): its order messages
    (O, LO) are skipped undecoded, since they have the older layout the strict order codecs refuse."""
    if frame[:1] == b"c":
        try:
            return _decode_compact_control(frame, order)
        except FrameError:
            raise
        except (RecursionError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
            raise FrameError(f"malformed control frame: {exc}") from None
    try:
        out: list[Control] = []
        for x in _loads(frame[1:].decode()):
            _json_item(x, order, out)
        return out
    except FrameError:
        raise
    except (RecursionError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise FrameError(f"malformed control frame: {exc}") from None
