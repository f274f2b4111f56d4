"""An MQTT PUBLISH's content as the bytes of an AMQP 1.0 message, and back (pure, sans-IO).

Theory of operation
-------------------
The router stores and forwards every message as the encoded AMQP bare message its publisher sent, and
AMQP subscribers get those bytes unchanged. So an MQTT publisher's message becomes such bytes once,
where it comes in (``to_amqp``), and a message becomes what a PUBLISH carries only where it goes out to
an MQTT subscriber (``from_amqp``). Both run once per message. They encode and read by hand (no Proton
objects) and handle the payload only as one slice or one join, never byte by byte. The other sections
are walked one item at a time, in loops bounded by the bytes (``common.amqpmsg.skip``), with no
recursion. That matters because a message's nesting is whatever its publisher chose.

MQTT to AMQP, ``to_amqp(topic, content, now_ms)``; sections are written in the spec's order::

    MQTT PUBLISH                    AMQP bare message
    ------------------------------  ----------------------------------------------------------------
    topic name                      properties.to (string)
    payload                         one data section, also when the payload is empty
    content type                    properties.content-type (symbol); if not ASCII, the message
                                    annotation x-opt-mqtt-content-type (string) instead
    response topic                  properties.reply-to (string)
    correlation data                properties.correlation-id (binary)
    user properties                 application-properties (string -> string), a name's first value;
                                    when a name repeats, the whole list too, in the message annotation
                                    x-opt-mqtt-user-properties (a list of [name, value] lists)
    message expiry interval (s)     header: durable true, ttl s*1000 ms (at most 2**32-1, a uint);
                                    properties.creation-time now_ms, absolute-expiry-time now_ms+s*1000
    payload format indicator        message annotation x-opt-mqtt-payload-format (ubyte 0 or 1)

AMQP to MQTT, ``from_amqp(data, now_ms)``. This reads any bare message: the sections may be in any
order; delivery-annotations, footer and sections this module does not know are passed over; when a
header, properties, message-annotations or application-properties section repeats, the last counts::

    AMQP bare message                              MQTT PUBLISH
    ---------------------------------------------  -------------------------------------------------
    data sections                                  payload: their bytes, joined
    one amqp-value section holding a string        payload: its UTF-8 bytes; payload format 1
    one amqp-value section holding binary          payload: its bytes
    one amqp-value section holding null; no body   empty payload
    any other body (see below)                     payload: the body sections' bytes as they came;
                                                   content type application/x-amqp-body
    properties.content-type (symbol or string)     content type; without it, the annotation
                                                   x-opt-mqtt-content-type (string)
    properties.reply-to (string)                   response topic, if it is a valid MQTT topic name
    properties.correlation-id                      correlation data (the forms are given below)
    annotation x-opt-mqtt-user-properties          user properties, exactly as listed, if it agrees
                                                   with application-properties (see below)
    application-properties                         otherwise, user properties in the map's order
    properties.absolute-expiry-time                expiry: seconds left, rounded up; 0 when past
    header.ttl (no absolute-expiry-time)           expiry: ceil(ttl / 1000) seconds
    annotation x-opt-mqtt-payload-format (0 or 1)  payload format; without it, the string rule above

The rules chosen, and why
-------------------------
- **Repeated user property names.** An AMQP map's keys are unique, but MQTT user properties are an
  ordered list in which a name may repeat. AMQP readers (selectors, JMS's getStringProperty) look up
  one value per name, so application-properties holds each name once, with its *first* value: the
  one a reader scanning the MQTT list for that name finds. When a name repeats, the exact list also goes into the message annotation, so an MQTT subscriber gets the
  list back in order. That costs nothing when no name repeats, which is the common case: the map's
  order is the list's order.
  ``from_amqp`` believes the annotation only when it agrees with application-properties (the same
  first value under each name). A Proton client that decodes a message, edits its properties and
  sends it on also sends the old annotations. That client's edit wins over the stale list.
- **Bodies other than data, a string or binary** (an amqp-value that holds a map, a list, a number, a
  described value..., amqp-sequence sections, or a mix of kinds that the spec forbids). MQTT has only
  bytes, and rendering such values as JSON would lose information: binary versus string, symbols,
  UUIDs, timestamps, non-string map keys, described types. Nothing here should depend on how deeply a
  publisher nests its values. So the payload is the body sections exactly as they were encoded,
  descriptors included, and the content type is ``AMQP_BODY_CONTENT_TYPE``. The value is lossless and
  self-describing: any AMQP library reads it back, e.g. ``proton.Message().decode(payload).body``. It
  is also cheap, because it is a slice. The publisher's own content type, if it gave one, described
  the value, not these bytes, so it is replaced.
- **Correlation ids.** AMQP allows four types. Binary is taken as it is, and a string as its UTF-8
  bytes. A ulong becomes its 8 bytes big-endian, and a uuid its 16 bytes in RFC 4122 order. For those
  two, that means the value's bytes as AMQP encodes them after the constructor. These bytes are fixed
  in width, lossless and unique per id; MQTT treats correlation data as opaque bytes. ``to_amqp``
  always writes binary. An AMQP requester whose replies come from an MQTT responder should therefore
  compare ids by their bytes.
- **Application property values that are not strings.** Symbols and chars become their text. Integers
  of every width become ``str(n)``. Booleans become ``true``/``false``, not Python's ``True``: that is
  the text Java (JMS getStringProperty) and JSON give, and MQTT clients are rarely Python. A double
  becomes its shortest round-trip text (``repr``: ``1.5``, ``1e+20``, ``inf``, ``nan``), and a float
  the shortest text that reads back as the same 32-bit float (``0.1``, not ``0.10000000149011612``).
  Null, binary, uuid, timestamp, decimals, lists, maps, arrays and described values are left out: MQTT
  has no text for them that every reader would agree on.
- **Expiry.** ``absolute-expiry-time`` comes first, because it stays right however long the message
  waited in the mesh. It is given as whole seconds left, rounded up, so a live message gets at least
  1; when it is due or past, the value is 0, and the caller drops such messages. A ttl with no
  absolute time can only be taken as it stands (``ceil(ttl/1000)``). A ttl or absolute-expiry-time of 0
  reads as unset, the way Proton reads it (Proton writes 0 for unset and never writes an explicit 0).
  Dropping the messages of a writer that meant "no expiry" would be the worse mistake. The header's ttl
  is a uint of milliseconds and caps at about 49.7 days. A longer MQTT expiry (up to 2**32-1 s) is
  exact in the absolute-expiry-time, which ``from_amqp`` prefers. The result is capped at
  ``MAX_EXPIRY``.
- **Content type** is an MQTT UTF-8 string but an AMQP symbol, and symbols are ASCII. A MIME type is
  ASCII, so the common case is exact. A symbol holding UTF-8 would not be safe: Proton's ``Data``
  decodes symbols as ASCII and raises on anything else. So a content type that is not ASCII goes into
  a message annotation, as a string, and AMQP readers see no content-type at all. A symbol that holds
  UTF-8 from another writer is still read. When a message has both the properties' content-type and
  the annotation, the content-type wins: an AMQP client set it.
- **What MQTT cannot carry is left out, never sent malformed.** An MQTT string (content type, response
  topic, user property names and values) has no U+0000, is well-formed UTF-8, and is at most 65,535
  bytes; MQTT binary data (correlation data) is at most 65,535 bytes. A field or property that breaks
  one of these is dropped, not the message. A reply-to becomes a response topic only if it is a topic
  name MQTT allows (``common.topics.check_name``: not empty, no ``+`` or ``#``). A string body is
  payload format 1 only if it is valid UTF-8, because MQTT receivers may check that.
- **Errors.** ``from_amqp`` raises ``NotAMessage`` (a ``ValueError``), and nothing else, when the bytes
  are not a sequence of described sections that can be read to their end, or when a section the
  mapping reads has the wrong shape: a header or properties section that is not a list, annotations or
  application-properties that are not a map, a data section that is not binary. ``to_amqp`` raises
  ``ValueError`` for a content that no MQTT packet can hold (an expiry outside 0..2**32-1, a payload
  format other than 0 or 1).

``from_amqp(to_amqp(topic, c, now), now) == c`` for every content an MQTT packet can carry.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ...common.amqpmsg import HEADER, MESSAGE_ANNOTATIONS, PROPERTIES, Unreadable, skip
from ...common.topics import check_name

MAX_EXPIRY = 0xFFFF_FFFF
"""The longest MQTT message expiry interval, in seconds (a four-byte integer)."""
MQTT_MAX_STRING = 65_535
"""The longest MQTT string or binary data, in bytes (a two-byte length; MQTT 5 sections 1.5.4, 1.5.6)."""
USER_PROPERTIES_ANNOTATION = "x-opt-mqtt-user-properties"
CONTENT_TYPE_ANNOTATION = "x-opt-mqtt-content-type"
PAYLOAD_FORMAT_ANNOTATION = "x-opt-mqtt-payload-format"
AMQP_BODY_CONTENT_TYPE = "application/x-amqp-body"
"""The content type of a payload that is an AMQP message's body sections as encoded (see the rules)."""

APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78
_SECTION_NAMES = {
    b"amqp:header:list": HEADER, b"amqp:delivery-annotations:map": 0x71,
    b"amqp:message-annotations:map": MESSAGE_ANNOTATIONS, b"amqp:properties:list": PROPERTIES,
    b"amqp:application-properties:map": APPLICATION_PROPERTIES, b"amqp:data:binary": DATA,
    b"amqp:amqp-sequence:list": AMQP_SEQUENCE, b"amqp:amqp-value:*": AMQP_VALUE, b"amqp:footer:map": FOOTER,
}
_UINT_MAX = 0xFFFF_FFFF
_LIST8, _MAP8 = 0xC0, 0xC1  # their 4-byte-size forms are 0x10 above


@dataclass(frozen=True, slots=True)
class MqttContent:
    """What a PUBLISH carries besides its topic and delivery flags (MQTT 3.1.1 has the payload only)."""

    payload: bytes
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    message_expiry: int | None = None  # seconds left, MQTT 5 Message Expiry Interval
    payload_format: int | None = None  # MQTT 5 Payload Format Indicator: 1 = UTF-8 text


class NotAMessage(ValueError):
    """Bytes that do not read as an AMQP bare message: not described sections end to end, or a
    section the mapping reads in the wrong shape. The message's publisher is at fault, not the MQTT
    subscriber it was going to; the caller decides what becomes of it."""


# ------------------------------------------------------------------------------------ encoding

_NULL, _TRUE = b"\x40", b"\x41"
_HEADER_AT = bytes((0x00, 0x53, HEADER))
_ANNOTATIONS_AT = bytes((0x00, 0x53, MESSAGE_ANNOTATIONS))
_PROPERTIES_AT = bytes((0x00, 0x53, PROPERTIES))
_APPLICATION_PROPERTIES_AT = bytes((0x00, 0x53, APPLICATION_PROPERTIES))
_DATA_AT = bytes((0x00, 0x53, DATA))
# the constructor and 1-byte size of a vbin8, str8 or sym8 of each length, made once
_BIN8, _STR8, _SYM8 = ([bytes((c, n)) for n in range(0x100)] for c in (0xA0, 0xA1, 0xA3))


def _sized(head8: list[bytes], data: bytes) -> bytes:
    """A variable-width value: its 1-byte-size form (`head8` by length) or, when longer, the 4-byte one."""
    n = len(data)
    if n <= 0xFF:
        return head8[n] + data
    return bytes((head8[0][0] | 0x10,)) + n.to_bytes(4, "big") + data


def _string(s: str) -> bytes:
    return _sized(_STR8, s.encode("utf-8"))


def _symbol(s: str) -> bytes:
    return _sized(_SYM8, s.encode("utf-8"))


def _compound(small: int, items: list[bytes]) -> bytes:
    """A list (`_LIST8`) or map (`_MAP8`, keys and values alternating in `items`) of encoded items."""
    body = b"".join(items)
    n, count = len(body), len(items)
    if n < 0xFF and count <= 0xFF:
        return bytes((small, n + 1, count)) + body
    return bytes((small | 0x10,)) + (n + 4).to_bytes(4, "big") + count.to_bytes(4, "big") + body


def _uint(n: int) -> bytes:
    if n == 0:
        return b"\x43"
    if n <= 0xFF:
        return bytes((0x52, n))
    return b"\x70" + n.to_bytes(4, "big")


def _timestamp(ms: int) -> bytes:
    return b"\x83" + ms.to_bytes(8, "big", signed=True)


_PAYLOAD_FORMAT_KEY = _symbol(PAYLOAD_FORMAT_ANNOTATION)
_USER_PROPERTIES_KEY = _symbol(USER_PROPERTIES_ANNOTATION)
_CONTENT_TYPE_KEY = _symbol(CONTENT_TYPE_ANNOTATION)


def to_amqp(topic: str, c: MqttContent, now_ms: int) -> bytes:
    """The AMQP bare message for `c` published to `topic` at `now_ms` (milliseconds since the epoch)."""
    out: list[bytes] = []
    expiry = c.message_expiry
    if expiry is not None:
        if not 0 <= expiry <= MAX_EXPIRY:
            raise ValueError(f"a message expiry interval is 0..{MAX_EXPIRY} seconds, not {expiry}")
        out.append(_HEADER_AT + _compound(_LIST8, [_TRUE, _NULL, _uint(min(expiry * 1000, _UINT_MAX))]))
    annotations: list[bytes] = []
    if c.payload_format is not None:
        if c.payload_format not in (0, 1):
            raise ValueError(f"a payload format indicator is 0 or 1, not {c.payload_format}")
        annotations += (_PAYLOAD_FORMAT_KEY, bytes((0x50, c.payload_format)))
    content_type = c.content_type
    if content_type is not None and not content_type.isascii():
        annotations += (_CONTENT_TYPE_KEY, _string(content_type))
        content_type = None
    first: dict[str, str] = {}
    for name, value in c.user_properties:
        first.setdefault(name, value)
    if len(first) < len(c.user_properties):
        pairs = [_compound(_LIST8, [_string(name), _string(value)]) for name, value in c.user_properties]
        annotations += (_USER_PROPERTIES_KEY, _compound(_LIST8, pairs))
    if annotations:
        out.append(_ANNOTATIONS_AT + _compound(_MAP8, annotations))
    fields = [_NULL, _NULL, _string(topic), _NULL,
              _NULL if c.response_topic is None else _string(c.response_topic),
              _NULL if c.correlation_data is None else _sized(_BIN8, c.correlation_data),
              _NULL if content_type is None else _symbol(content_type)]
    if expiry is not None:  # content-encoding, absolute-expiry-time, creation-time
        fields += (_NULL, _timestamp(now_ms + expiry * 1000), _timestamp(now_ms))
    else:
        while fields[-1] == _NULL:  # trailing nulls are left out (the spec allows it; Proton does it)
            fields.pop()
    out += (_PROPERTIES_AT, _compound(_LIST8, fields))
    if first:
        out += (_APPLICATION_PROPERTIES_AT, _compound(_MAP8, [_string(s) for entry in first.items() for s in entry]))
    n = len(c.payload)  # the payload is copied once, by the join
    out += (_DATA_AT, _BIN8[n] if n <= 0xFF else b"\xb0" + n.to_bytes(4, "big"), c.payload)
    return b"".join(out)


# ------------------------------------------------------------------------------------ decoding

# constructor -> AMQP type, for the types a field or property may hold here; any other value is "other"
_KINDS = {
    0x40: "null", 0x41: "boolean", 0x42: "boolean", 0x56: "boolean",
    0x50: "ubyte", 0x60: "ushort", 0x70: "uint", 0x52: "uint", 0x43: "uint", 0x80: "ulong", 0x53: "ulong",
    0x44: "ulong", 0x51: "byte", 0x61: "short", 0x71: "int", 0x54: "int", 0x81: "long", 0x55: "long",
    0x83: "timestamp", 0x72: "float", 0x82: "double", 0x73: "char", 0x98: "uuid",
    0xA0: "binary", 0xB0: "binary", 0xA1: "string", 0xB1: "string", 0xA3: "symbol", 0xB3: "symbol",
    0x45: "list", 0xC0: "list", 0xD0: "list",
}
_SIGNED = frozenset({0x51, 0x61, 0x71, 0x54, 0x81, 0x55, 0x83})
_INTEGERS = frozenset({"ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long"})
_INSTANTS = _INTEGERS | {"timestamp"}
_TEXTS = frozenset({"string", "symbol"})
_VARIABLE8 = {0xA0: "binary", 0xA1: "string", 0xA3: "symbol"}
_FLOAT, _DOUBLE = struct.Struct(">f"), struct.Struct(">d")
_PAYLOAD_FORMAT_NAME, _USER_PROPERTIES_NAME, _CONTENT_TYPE_NAME = (
    name.encode() for name in (PAYLOAD_FORMAT_ANNOTATION, USER_PROPERTIES_ANNOTATION, CONTENT_TYPE_ANNOTATION))

_Scalar = tuple[str, object]
"""(an AMQP type, its value): see `_value`."""


def _value(b: bytes, i: int, end: int) -> _Scalar:
    """The value at `i`, which ends at `end` (already bounded by `skip`). Integers and timestamps come
    as int, booleans as bool, float and double as float, and null as None. String, symbol and binary
    come as their bytes, decoded by whoever needs the text; char and uuid also come as their bytes. A
    list comes as its offset `i`, to be read with `_scalars`. Anything else is ("other", None)."""
    c = b[i]
    kind = _KINDS.get(c)
    if kind is None:
        return "other", None
    if c >= 0xA0 and kind != "list":
        return kind, b[i + (2 if c < 0xB0 else 5):end]
    if kind in _INSTANTS:
        return kind, int.from_bytes(b[i + 1:end], "big", signed=c in _SIGNED)
    if kind == "boolean":
        return kind, c == 0x41 or (c == 0x56 and b[i + 1] != 0)
    if kind == "float":
        return kind, _FLOAT.unpack(b[i + 1:end])[0]
    if kind == "double":
        return kind, _DOUBLE.unpack(b[i + 1:end])[0]
    if kind == "null":
        return kind, None
    if kind == "list":
        return kind, i
    return kind, b[i + 1:end]  # char, uuid


def _scalars(b: bytes, i: int, small: int) -> list[_Scalar]:
    """The items, as `_value` gives them, of the list (`small` = `_LIST8`) or map (`_MAP8`: keys and
    values alternating) at `i`. Each item takes a byte at least and must end inside the compound, so
    the walk is bounded by the bytes whatever count the compound claims."""
    c = b[i]
    n = len(b)
    if c == 0x45 and small == _LIST8:  # list0
        return []
    if c == small and i + 3 <= n:
        end, count, j = i + 2 + b[i + 1], b[i + 2], i + 3
    elif c == small | 0x10 and i + 9 <= n:
        end, count, j = i + 5 + int.from_bytes(b[i + 1:i + 5], "big"), int.from_bytes(b[i + 5:i + 9], "big"), i + 9
    else:
        raise Unreadable(f"a {'list' if small == _LIST8 else 'map'} expected at {i} (0x{c:02x})")
    if end > n or j > end:
        raise Unreadable(f"compound at {i}: its size does not fit (ends at {end} of {n})")
    if small == _MAP8 and count % 2:
        raise Unreadable(f"map at {i}: an odd number of items ({count})")
    items: list[_Scalar] = []
    for _ in range(count):
        c = b[j] if j < end else -1
        kind = _VARIABLE8.get(c)
        if kind is not None and j + 1 < end:  # the common case, read here: str8, sym8, vbin8
            k = j + 2 + b[j + 1]
            items.append((kind, b[j + 2:k]))
        elif c < 0:
            raise Unreadable(f"compound at {i}: fewer than its {count} items")
        else:
            k = skip(b, j)
            items.append(_value(b, j, k))
        j = k
    if j != end:
        raise Unreadable(f"compound at {i}: its items end at {j}, not at its end {end}")
    return items


def _text(raw: bytes) -> str | None:
    """`raw` as an MQTT string, or None when MQTT cannot carry it (a NUL, too long, not UTF-8)."""
    if len(raw) > MQTT_MAX_STRING or b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _float32_text(x: float) -> str:
    """The shortest text that reads back as the same 32-bit float."""
    packed = _FLOAT.pack(x)
    for digits in range(6, 10):  # 9 significant digits always suffice for a float32
        text = repr(float(f"{x:.{digits}g}"))
        if _FLOAT.pack(float(text)) == packed:
            return text
    return repr(x)  # a NaN whose payload differs: any NaN reads as NaN


def _rendered(kind: str, v: object) -> str | None:
    """An application property's value as a user property's value, or None to leave it out."""
    if isinstance(v, bytes):
        if kind in _TEXTS:
            return _text(v)
        if kind == "char":
            code = int.from_bytes(v, "big")
            return chr(code) if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else None
        return None  # binary, uuid
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int) and kind in _INTEGERS:  # not timestamps, not a list's offset
        return str(v)
    if isinstance(v, float):
        return repr(v) if kind == "double" else _float32_text(v)
    return None


def _ttl(b: bytes, at: int) -> int | None:
    fields = _scalars(b, at, _LIST8)
    if len(fields) > 2:
        kind, v = fields[2]
        if kind in _INTEGERS and isinstance(v, int) and v > 0:
            return v
    return None


def _properties(b: bytes, at: int) -> tuple[str | None, str | None, bytes | None, int | None]:
    """(content type, response topic, correlation data, absolute expiry time) of a properties list."""
    fields = _scalars(b, at, _LIST8)
    n = len(fields)
    content_type: str | None = None
    response_topic: str | None = None
    correlation: bytes | None = None
    expires: int | None = None
    if n > 4:
        kind, v = fields[4]
        if kind == "string" and isinstance(v, bytes):
            response_topic = _text(v)
            if response_topic is not None and check_name(response_topic) is not None:
                response_topic = None
    if n > 5:
        kind, v = fields[5]
        if isinstance(v, bytes) and kind in ("binary", "string", "uuid"):
            correlation = v if len(v) <= MQTT_MAX_STRING else None
        elif kind == "ulong" and isinstance(v, int):
            correlation = v.to_bytes(8, "big")
    if n > 6:
        kind, v = fields[6]
        if kind in _TEXTS and isinstance(v, bytes):
            content_type = _text(v)
    if n > 8:
        kind, v = fields[8]
        if kind in _INSTANTS and isinstance(v, int) and v != 0:
            expires = v
    return content_type, response_topic, correlation, expires


def _user_properties(b: bytes, at: int) -> list[tuple[str, str]] | None:
    """The exact list carried in our annotation (a list at `at`), or None when it is not one (someone
    else's annotation of that name): a list of [string, string] lists, each string one MQTT can carry."""
    pairs = []
    for kind, v in _scalars(b, at, _LIST8):
        if kind != "list" or not isinstance(v, int):
            return None
        pair = _scalars(b, v, _LIST8)
        if len(pair) != 2:
            return None
        (nkind, name), (vkind, value) = pair
        if nkind != "string" or vkind != "string" or not isinstance(name, bytes) or not isinstance(value, bytes):
            return None
        ntext, vtext = _text(name), _text(value)
        if ntext is None or vtext is None:
            return None
        pairs.append((ntext, vtext))
    return pairs


def _annotations(b: bytes, at: int) -> tuple[int | None, list[tuple[str, str]] | None, str | None]:
    """(payload format, user properties, content type) from our message annotations, each None when
    absent or not in the form we write."""
    items = _scalars(b, at, _MAP8)
    payload_format: int | None = None
    user_properties: list[tuple[str, str]] | None = None
    content_type: str | None = None
    for (kind, key), (vkind, v) in zip(items[::2], items[1::2], strict=True):
        if kind not in _TEXTS:
            continue
        if key == _PAYLOAD_FORMAT_NAME:
            if vkind in _INTEGERS and isinstance(v, int) and v in (0, 1):
                payload_format = v
        elif key == _USER_PROPERTIES_NAME and vkind == "list" and isinstance(v, int):
            user_properties = _user_properties(b, v)
        elif key == _CONTENT_TYPE_NAME and vkind == "string" and isinstance(v, bytes):
            content_type = _text(v)
    return payload_format, user_properties, content_type


def _application_properties(b: bytes, at: int) -> list[tuple[str, str]]:
    items = _scalars(b, at, _MAP8)
    pairs = []
    for (kind, key), (vkind, v) in zip(items[::2], items[1::2], strict=True):
        if kind in _TEXTS and isinstance(key, bytes):
            name = _text(key)
            value = _text(v) if vkind == "string" and isinstance(v, bytes) else _rendered(vkind, v)
            if name is not None and value is not None:
                pairs.append((name, value))
    return pairs


def _first(pairs: list[tuple[str, str]]) -> dict[str, str]:
    first: dict[str, str] = {}
    for name, value in pairs:
        first.setdefault(name, value)
    return first


def _section(b: bytes, i: int) -> tuple[int | None, int]:
    """(the code of the section at `i`, or None for a descriptor not known here; where its value is)."""
    if b[i] != 0x00:
        raise Unreadable(f"a section expected at {i}, found 0x{b[i]:02x}")
    if i + 3 < len(b) and b[i + 1] == 0x53:  # smallulong: nearly every section
        return b[i + 2], i + 3
    at = skip(b, i + 1)  # the descriptor, its bounds checked
    d = b[i + 1]
    if d == 0x80:
        return int.from_bytes(b[i + 2:at], "big"), at
    if d in (0xA3, 0xB3):
        return _SECTION_NAMES.get(b[i + (3 if d == 0xA3 else 6):at]), at
    return None, at


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def from_amqp(data: bytes, now_ms: int) -> MqttContent:
    """What an MQTT subscriber is sent for the AMQP bare message `data`, at `now_ms` (milliseconds since
    the epoch). Raises `NotAMessage` when `data` does not read as one. A bytearray or memoryview is
    copied once into bytes (Proton's `Message.encode` gives a bytearray), so the fields are bytes."""
    if type(data) is not bytes:
        data = bytes(data)
    try:
        return _from_amqp(data, now_ms)
    except (Unreadable, IndexError, struct.error) as exc:  # IndexError, struct.error: a last guard
        raise NotAMessage(str(exc) or type(exc).__name__) from exc


class Decoded:
    """The MQTT content of AMQP messages a router made (`to_amqp`) or read once already, by the
    payload object itself: a message published by an MQTT client and delivered to MQTT subscribers
    at the same router, or one delivered to several, is read once. Only contents without an
    expiry (theirs does not change with time; the round trip gives the content back exactly:
    tests/unit/test_mqtt_mapping.py), only `bytes` (immutable), at most `MAX_ENTRIES` payloads of
    at most `MAX_BYTES` each (then it starts again empty). An entry holds its payload, so the
    payload's id is never another object's while it is here."""

    MAX_ENTRIES = 1024
    MAX_BYTES = 16384

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[bytes, MqttContent]] = {}

    def remember(self, data: bytes, c: MqttContent) -> None:
        if c.message_expiry is None and type(data) is bytes and len(data) <= self.MAX_BYTES:
            by_id = self._by_id
            if len(by_id) >= self.MAX_ENTRIES:
                by_id.clear()
            by_id[id(data)] = (data, c)

    def content(self, data: bytes, now_ms: int) -> MqttContent:
        """`from_amqp(data, now_ms)`, read once per payload object."""
        e = self._by_id.get(id(data))
        if e is not None and e[0] is data:
            return e[1]
        c = from_amqp(data, now_ms)
        self.remember(data, c)
        return c


def _from_amqp(b: bytes, now_ms: int) -> MqttContent:
    n = len(b)
    if n == 0:
        raise Unreadable("no sections")
    ttl: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation: bytes | None = None
    expires: int | None = None
    payload_format: int | None = None
    annotated: list[tuple[str, str]] | None = None
    annotated_type: str | None = None
    pairs: list[tuple[str, str]] = []
    data: list[bytes] = []
    bodies: list[tuple[int, int]] = []  # (start, end) of every body section
    value_at = -1  # the value of the last amqp-value section
    i = 0
    while i < n:
        code, at = _section(b, i)
        end = skip(b, at)
        if code == PROPERTIES:
            content_type, response_topic, correlation, expires = _properties(b, at)
        elif code == DATA:
            kind, raw = _value(b, at, end)
            if not isinstance(raw, bytes) or kind != "binary":
                raise Unreadable(f"a data section at {i} holds {kind}, not binary")
            data.append(raw)
            bodies.append((i, end))
        elif code == APPLICATION_PROPERTIES:
            pairs = _application_properties(b, at)
        elif code == HEADER:
            ttl = _ttl(b, at)
        elif code == MESSAGE_ANNOTATIONS:
            payload_format, annotated, annotated_type = _annotations(b, at)
        elif code in (AMQP_VALUE, AMQP_SEQUENCE):
            bodies.append((i, end))
            if code == AMQP_VALUE:
                value_at = at
        i = end

    if content_type is None:
        content_type = annotated_type
    if len(data) == len(bodies):  # data sections only, or no body at all
        payload = b"".join(data)
    else:
        kind, raw = ("other", None) if len(bodies) != 1 or value_at < 0 else _value(b, value_at, bodies[0][1])
        if kind == "string" and isinstance(raw, bytes):
            payload = raw
            if payload_format is None and _utf8(raw):
                payload_format = 1
        elif kind == "binary" and isinstance(raw, bytes):
            payload = raw
        elif kind == "null":
            payload = b""
        else:
            payload = b"".join(b[start:end] for start, end in bodies)
            content_type = AMQP_BODY_CONTENT_TYPE
            payload_format = None  # whatever an annotation said, it did not say it of these bytes

    if expires is not None:
        left = expires - now_ms
        message_expiry = 0 if left <= 0 else min(-(-left // 1000), MAX_EXPIRY)
    elif ttl is not None:
        message_expiry = min(-(-ttl // 1000), MAX_EXPIRY)
    else:
        message_expiry = None
    user_properties = annotated if annotated is not None and _first(annotated) == _first(pairs) else pairs
    return MqttContent(payload=payload, content_type=content_type, response_topic=response_topic,
                       correlation_data=correlation, user_properties=tuple(user_properties),
                       message_expiry=message_expiry, payload_format=payload_format)
