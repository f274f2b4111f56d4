"""An AMQP 1.0 message's bare bytes, read and changed only where the router must (sans-IO, pure).

A router passes a message on as the bytes its publisher sent. One thing it adds: a subscriber whose
subscription is a wildcard filter (common/topics.py) must learn which topic each message was
published to, and AMQP's place for that is the `to` field of the message's properties section
(AMQP 1.0 section 3.2.4; Qpid JMS reads it as JMSDestination, rhea as `message.to`, Proton as
`Message.address`). `with_to` sets it when the publisher left it empty, and changes nothing else:
every other section and field is copied byte for byte. The same field names the topic of each
message sent on an anonymous relay link (a sender with no target): `read_to` reads it.

How the bytes are read (AMQP 1.0 sections 1.2 and 3.2): a message is a sequence of sections, each a
described value whose descriptor names it (`0x00 0x53 CODE`, or the ulong or symbol forms). The
properties section (code 0x73) is a list of 13 fields, `to` the third; it comes after the header,
delivery-annotations and message-annotations sections and before everything else. Any value is
skipped by its constructor byte alone: its top four bits say how its width is written (none, 1, 2,
4, 8 or 16 fixed bytes; a 1- or 4-byte size before variable-width, compound and array values). A
payload that does not read as such a sequence is returned unchanged: the router never refuses or
mangles a message for a field it only adds.
"""

from __future__ import annotations

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
_BEFORE_PROPERTIES = (HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS)
_SYMBOL_CODES = {b"amqp:header:list": HEADER, b"amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
                 b"amqp:message-annotations:map": MESSAGE_ANNOTATIONS, b"amqp:properties:list": PROPERTIES}
_FIXED = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}  # top four bits -> fixed width
_NULL = 0x40


class Unreadable(ValueError):
    """Bytes that are not an AMQP value where one should be."""


def skip(b: bytes, i: int) -> int:
    """The offset just after the AMQP value that starts at `i` (raises `Unreadable`). A described value
    (0x00) is its descriptor then its value, each possibly described again: counted in a loop, not by
    recursion (bytes of nothing but 0x00 must not exhaust the stack)."""
    pending = 1  # values still to skip: a described value needs two where it stood for one
    n = len(b)
    while True:
        if i >= n:
            raise Unreadable(f"value expected at {i}, the bytes end")
        c = b[i]
        if c == 0x00:
            pending += 1
            i += 1
            continue
        width = _FIXED.get(c >> 4)
        if width is not None:
            end = i + 1 + width
        elif c >> 4 in (0xA, 0xC, 0xE):  # variable, compound, array: a 1-byte size
            if i + 2 > n:
                raise Unreadable(f"size expected at {i + 1}")
            end = i + 2 + b[i + 1]
        elif c >> 4 in (0xB, 0xD, 0xF):  # the same with a 4-byte size
            if i + 5 > n:
                raise Unreadable(f"size expected at {i + 1}")
            end = i + 5 + int.from_bytes(b[i + 1:i + 5], "big")
        else:
            raise Unreadable(f"constructor 0x{c:02x} at {i}")
        if end > n:
            raise Unreadable(f"value at {i} runs past the end ({end} > {n})")
        pending -= 1
        if pending == 0:
            return end
        i = end


def _section_code(b: bytes, i: int) -> tuple[int | None, int]:
    """(the section's code, or None for a descriptor not known here; the offset of its value) of
    the section at `i`."""
    if b[i] != 0x00:
        raise Unreadable(f"section expected at {i}")
    d = b[i + 1] if i + 1 < len(b) else None
    if d == 0x53 and i + 2 < len(b):  # smallulong
        return b[i + 2], i + 3
    if d == 0x80 and i + 10 <= len(b):  # ulong
        code = int.from_bytes(b[i + 2:i + 10], "big")
        return (code if code < 0x100 else None), i + 10
    end = skip(b, i + 1)  # a symbol (or anything else): by name, if we know it
    name = b[i + 3:end] if d == 0xA3 else b[i + 6:end] if d == 0xB3 else b""
    return _SYMBOL_CODES.get(name), end


def _list_items(b: bytes, i: int) -> list[bytes]:
    """The encoded items of the list value at `i`."""
    c = b[i]
    if c == 0x45:  # list0
        return []
    if c == 0xC0:
        count, j = b[i + 2], i + 3
    elif c == 0xD0:
        count, j = int.from_bytes(b[i + 5:i + 9], "big"), i + 9
    else:
        raise Unreadable(f"a list expected at {i} (constructor 0x{c:02x})")
    end = skip(b, i)
    items = []
    for _ in range(count):
        k = skip(b, j)
        if k > end:
            raise Unreadable(f"list item at {j} runs past its list")
        items.append(b[j:k])
        j = k
    if j != end:
        raise Unreadable(f"list at {i}: {end - j} bytes after its {count} items")
    return items


def _encode_list(items: list[bytes]) -> bytes:
    body = b"".join(items)
    if len(body) + 1 <= 0xFF and len(items) <= 0xFF:
        return bytes((0xC0, len(body) + 1, len(items))) + body
    return b"\xd0" + (len(body) + 4).to_bytes(4, "big") + len(items).to_bytes(4, "big") + body


def _encode_string(s: str) -> bytes:
    data = s.encode("utf-8")
    if len(data) <= 0xFF:
        return bytes((0xA1, len(data))) + data
    return b"\xb1" + len(data).to_bytes(4, "big") + data


def _properties(payload: bytes) -> tuple[int, int | None, int]:
    """Where the properties section is: (the offset of its section, the offset of its list value,
    the offset after it); for a message without one, (where it would go, None, the same)."""
    i = 0
    n = len(payload)
    while i < n:
        code, value_at = _section_code(payload, i)
        end = skip(payload, value_at)
        if code in _BEFORE_PROPERTIES:
            i = end
            continue
        if code == PROPERTIES:
            return i, value_at, end
        break  # the first section after where the properties would be
    return i, None, i


def read_to(payload: bytes) -> str | None:
    """The `to` of the message in `payload` (its properties' third field) when it is a string; None
    when it has none, or the bytes do not read as a message."""
    try:
        _, at, _ = _properties(payload)
        if at is None:
            return None
        items = _list_items(payload, at)
        if len(items) < 3:
            return None
        to = items[2]
        if to[0] == 0xA1:
            return to[2:].decode("utf-8")
        if to[0] == 0xB1:
            return to[5:].decode("utf-8")
        return None  # null, or not a string
    except (Unreadable, IndexError, UnicodeDecodeError):
        return None


def with_to(payload: bytes, to: str) -> bytes:
    """`payload` with its properties' `to` set to `to` if it had none (a properties section made if
    it had none either); unchanged when `to` was set, or when the bytes do not read as a message."""
    try:
        i, at, end = _properties(payload)
        if at is None:
            fresh = b"\x00\x53\x73" + _encode_list([b"\x40", b"\x40", _encode_string(to)])
            return b"".join((payload[:i], fresh, payload[i:]))
        items = _list_items(payload, at)
        if len(items) > 2 and items[2][0] != _NULL:
            return payload  # the publisher named it
        items += [bytes((_NULL,))] * (3 - len(items))
        items[2] = _encode_string(to)
        return b"".join((payload[:i], b"\x00\x53\x73", _encode_list(items), payload[end:]))
    except (Unreadable, IndexError):
        return payload
