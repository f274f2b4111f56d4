"""The MQTT packet codec, sans-IO: `Decoder.feed(bytes) -> [packets]` and `encode(packet, level)`.

Theory of operation. The decoder buffers what it is fed, reads a fixed header as soon as one is
there (the type, flags and announced size are checked before the body arrives), and decodes each
complete packet into a value of `packets`. It owns one piece of state that the bytes decide: the
protocol level, which the first CONNECT sets on a server-side decoder (the caller gives it to a
client-side one). Everything that is a session's business (a second CONNECT, topic alias ranges,
packet identifiers in flight, topic filter syntax, a payload's format) is left to the session: the
codec rejects only what MQTT says no receiver can take.

Errors say whose fault it is by their type: `MqttError` and its children are the peer's, each with the
MQTT 5 reason code to close with; a `ValueError` from `encode` is ours (a packet MQTT cannot carry).
After an `MqttError` the decoder is spent: the stream is out of step and every further `feed` raises
the same error again.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar, Final, NoReturn

from .packets import (
    BOOLEAN_PROPERTIES,
    EMPTY,
    NONZERO_PROPERTIES,
    PROPERTIES,
    REASON_FOR_311,
    REASONS,
    SUBACK_311,
    SUBSCRIPTION_IDENTIFIER,
    USER_PROPERTY,
    VARINT_MAX,
    WILL,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Reason,
    Suback,
    SubOptions,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Where,
    Will,
    Wire,
    connack_code,
)

P = PacketType


class MqttError(Exception):
    """The peer sent what MQTT does not allow; `reason` is the MQTT 5 reason code to answer with (a
    CONNACK before the session is up, a DISCONNECT after; at level 4 the connection is just closed)."""

    reason: ClassVar[int] = Reason.UNSPECIFIED_ERROR


class MalformedPacket(MqttError):
    """The bytes do not parse as the packet they claim to be (MQTT 5 spec 4.13: Malformed Packet)."""

    reason = Reason.MALFORMED_PACKET


class ProtocolError(MqttError):
    """The packet parses, but breaks a rule: wrong in this place, twice what may come once, a value out
    of its range (MQTT 5 spec 4.13: Protocol Error)."""

    reason = Reason.PROTOCOL_ERROR


class PacketTooLarge(MqttError):
    """A packet larger than the decoder's `max_packet_size`, refused from its fixed header."""

    reason = Reason.PACKET_TOO_LARGE


class UnsupportedProtocolVersion(MqttError):
    """A CONNECT of a protocol level other than 4 or 5 (MQTT 3.1's "MQIsdp" is level 3). `level` is
    the level seen: answer it with a 3.1.1 CONNACK code 1, or an MQTT 5 CONNACK 0x84 for level 5."""

    reason = Reason.UNSUPPORTED_PROTOCOL_VERSION

    def __init__(self, message: str, level: int) -> None:
        super().__init__(message)
        self.level = level


def _show(v: str | bytes) -> str:
    """A value for an error message, briefly: input may be huge."""
    return repr(v[:40]) + ("..." if len(v) > 40 else "")


# --- reading fields: each takes the buffer, the position and the end of what it may read ----------

def _varint(mv: memoryview, pos: int, end: int, where: str) -> tuple[int, int]:
    value = shift = 0
    for i in range(4):
        if pos >= end:
            raise MalformedPacket(f"{where}: variable byte integer runs past its end")
        b = mv[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if b == 0 and i:
                raise MalformedPacket(f"{where}: variable byte integer not in its shortest form")
            return value, pos
        shift += 7
    raise MalformedPacket(f"{where}: variable byte integer of more than 4 bytes")


def _u16(mv: memoryview, pos: int, end: int, where: str) -> int:
    if pos + 2 > end:
        raise MalformedPacket(f"{where}: the packet ends inside it")
    return (mv[pos] << 8) | mv[pos + 1]


def _packet_id(mv: memoryview, pos: int, end: int, where: str) -> int:
    pid = _u16(mv, pos, end, where)
    if not pid:
        raise MalformedPacket(f"{where}: packet identifier 0")
    return pid


def _string(mv: memoryview, pos: int, end: int, where: str) -> tuple[str, int]:
    stop = pos + 2 + _u16(mv, pos, end, where)
    if stop > end:
        raise MalformedPacket(f"{where}: string length runs past its end")
    try:
        s = str(mv[pos + 2:stop], "utf-8")
    except UnicodeDecodeError as e:
        raise MalformedPacket(f"{where}: not valid UTF-8 ({e.reason})") from None
    if "\x00" in s:
        raise MalformedPacket(f"{where}: contains U+0000")
    return s, stop


def _binary(mv: memoryview, pos: int, end: int, where: str) -> tuple[bytes, int]:
    stop = pos + 2 + _u16(mv, pos, end, where)
    if stop > end:
        raise MalformedPacket(f"{where}: binary data length runs past its end")
    return bytes(mv[pos + 2:stop]), stop


def _topic_name(topic: str, where: str) -> None:
    if not topic:
        raise ProtocolError(f"{where}: empty topic name")
    if "+" in topic or "#" in topic:
        raise ProtocolError(f"{where}: wildcard in topic name {_show(topic)}")


def _properties(mv: memoryview, pos: int, end: int, kind: Where, where: str) -> tuple[Properties, int]:
    """The properties at `pos` (their length first) of a `kind` packet, or of a will."""
    length, pos = _varint(mv, pos, end, f"{where}: property length")
    if not length:
        return EMPTY, pos
    stop = pos + length
    if stop > end:
        raise MalformedPacket(f"{where}: property length {length} runs past the packet end")
    values: dict[str, Any] = {}
    users: list[tuple[str, str]] = []
    subids: list[int] = []
    while pos < stop:
        pid, pos = _varint(mv, pos, stop, f"{where}: property identifier")
        spec = PROPERTIES.get(pid)
        if spec is None or kind not in spec.allowed:
            # spec 2.2.2.2: an identifier not valid for its packet type is a Malformed Packet
            raise MalformedPacket(f"{where}: property {pid:#04x} is not allowed here")
        name = f"{where}: {spec.field}"
        wire = spec.wire
        v: Any
        if wire is Wire.BYTE:
            if pos >= stop:
                raise MalformedPacket(f"{name}: runs past the property length")
            v = mv[pos]
            pos += 1
        elif wire is Wire.TWO_BYTE:
            v = _u16(mv, pos, stop, name)
            pos += 2
        elif wire is Wire.FOUR_BYTE:
            if pos + 4 > stop:
                raise MalformedPacket(f"{name}: runs past the property length")
            v = int.from_bytes(mv[pos:pos + 4], "big")
            pos += 4
        elif wire is Wire.VARINT:
            v, pos = _varint(mv, pos, stop, name)
        elif wire is Wire.UTF8:
            v, pos = _string(mv, pos, stop, name)
        elif wire is Wire.UTF8_PAIR:
            key, pos = _string(mv, pos, stop, name)
            val, pos = _string(mv, pos, stop, name)
            users.append((key, val))
            continue
        else:
            v, pos = _binary(mv, pos, stop, name)
        if pid in BOOLEAN_PROPERTIES and v > 1:
            raise ProtocolError(f"{name}: {v} (only 0 or 1)")
        if pid in NONZERO_PROPERTIES and not v:
            raise ProtocolError(f"{name}: 0")
        if pid == SUBSCRIPTION_IDENTIFIER:
            if subids and kind is not P.PUBLISH:
                raise ProtocolError(f"{name}: more than once")
            subids.append(v)
            continue
        if spec.field in values:
            raise ProtocolError(f"{name}: more than once")
        if pid == 0x08:
            _topic_name(v, name)
        values[spec.field] = v
    if users:
        values["user_properties"] = tuple(users)
    if subids:
        values["subscription_identifiers"] = tuple(subids)
    return Properties(**values), stop


def _no_more(pos: int, end: int, where: str) -> None:
    if pos != end:
        raise MalformedPacket(f"{where}: {end - pos} bytes left over after the last field")


def _reason(code: int, kind: PacketType) -> int:
    if code not in REASONS[kind]:
        raise ProtocolError(f"{kind.name}: reason code {code:#04x} is not one of its reason codes")
    return code


# the fixed header's flags each packet type must have (-1: PUBLISH's are its own); type 0 is reserved
_FLAGS: Final = (-1, 0, 0, -1, 0, 0, 2, 0, 2, 0, 2, 0, 0, 0, 0, 0)
_FROM_CLIENTS: Final = frozenset({1, 3, 4, 5, 6, 7, 8, 10, 12, 14, 15})
_FROM_SERVERS: Final = frozenset({2, 3, 4, 5, 6, 7, 9, 11, 13, 14, 15})
_PINGREQ: Final = Pingreq()
_PINGRESP: Final = Pingresp()
_DISCONNECT: Final = Disconnect()

_Handler = Callable[[int, memoryview, int, int], Packet]
_Ack = type[Puback] | type[Pubrec] | type[Pubrel] | type[Pubcomp]


class Decoder:
    """Bytes in, packets out. A server-side decoder (the default) takes what clients send, and its
    first packet must be a CONNECT, which sets `level`; a client-side one (`server=False`) takes what
    servers send at the `level` it is given. `max_packet_size` bounds a whole packet, fixed header
    included (what MQTT 5's Maximum Packet Size means)."""

    __slots__ = ("max_packet_size", "server", "level", "_buf", "_error", "_handlers")

    def __init__(self, max_packet_size: int = 1 << 20, *, server: bool = True, level: int | None = None) -> None:
        if server and level is not None:
            raise ValueError("a server-side decoder learns its level from the CONNECT")
        if not server and level not in (4, 5):
            raise ValueError(f"a client-side decoder needs level 4 or 5, got {level!r}")
        if max_packet_size < 2:
            raise ValueError(f"max_packet_size {max_packet_size}: no packet is that small")
        self.max_packet_size = max_packet_size
        self.server = server
        self.level: int | None = level
        self._buf = bytearray()
        self._error: MqttError | None = None
        every: dict[int, _Handler] = {
            1: self._connect, 2: self._connack, 3: self._publish,
            4: partial(self._ack, Puback), 5: partial(self._ack, Pubrec),
            6: partial(self._ack, Pubrel), 7: partial(self._ack, Pubcomp),
            8: self._subscribe, 9: self._suback, 10: self._unsubscribe, 11: self._unsuback,
            12: self._pingreq, 13: self._pingresp, 14: self._disconnect, 15: self._auth,
        }
        takes = _FROM_CLIENTS if server else _FROM_SERVERS
        self._handlers: list[_Handler | None] = [every[t] if t in takes else None for t in range(16)]

    @property
    def pending(self) -> int:
        """Bytes buffered: the start of a packet not complete yet."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Every packet completed by `data`, in order; the rest stays buffered. A bad packet raises its
        `MqttError`, and the packets before it in the same `data` go with it: the connection closes."""
        if self._error is not None:
            raise self._error
        try:
            return self._feed(data)
        except MqttError as e:
            self._error = e
            raise

    def _feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        buf = self._buf
        src: bytes | bytearray | memoryview
        if buf:
            buf += data
            src = buf
        else:
            src = data  # the common case: parse the caller's bytes in place, keep only a tail
        n = len(src)
        pos = 0
        out: list[Packet] = []
        handlers = self._handlers
        limit = self.max_packet_size
        with memoryview(src) as mv:
            while pos < n:
                b0 = mv[pos]
                kind = b0 >> 4
                handler = handlers[kind]
                if handler is None:
                    self._refuse(kind)
                want = _FLAGS[kind]
                if want >= 0 and b0 & 0x0F != want:
                    raise MalformedPacket(f"{P(kind).name}: fixed header flags {b0 & 0x0F:#06b}, must be {want:#06b}")
                if self.level is None and kind != 1:
                    raise ProtocolError(f"{P(kind).name} before CONNECT: the first packet must be CONNECT")
                if pos + 1 >= n:
                    break
                size = mv[pos + 1]
                body = pos + 2
                if size >= 0x80:
                    got = self._remaining_length(mv, pos + 1, n, kind)
                    if got is None:
                        break
                    size, body = got
                end = body + size
                if end - pos > limit:
                    raise PacketTooLarge(f"{P(kind).name}: {end - pos} bytes, more than the maximum {limit}")
                if end > n:
                    break
                out.append(handler(b0 & 0x0F, mv, body, end))
                pos = end
        if src is buf:
            del buf[:pos]
        elif pos < n:
            self._buf = bytearray(memoryview(src)[pos:])
        return out

    @staticmethod
    def _remaining_length(mv: memoryview, pos: int, n: int, kind: int) -> tuple[int, int] | None:
        """(remaining length, where the body starts), or None while its bytes are still coming."""
        value = shift = 0
        for i in range(4):
            if pos >= n:
                return None
            b = mv[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                if b == 0 and i:
                    raise MalformedPacket(f"{P(kind).name}: remaining length not in its shortest form")
                return value, pos
            shift += 7
        raise MalformedPacket(f"{P(kind).name}: remaining length of more than 4 bytes")

    def _refuse(self, kind: int) -> NoReturn:
        if kind == 0:
            raise MalformedPacket("packet type 0 is reserved")
        if self.server:
            raise ProtocolError(f"{P(kind).name} from a client: only servers send it")
        raise ProtocolError(f"{P(kind).name} from a server: only clients send it")

    # --- one method per packet type: (fixed header flags, buffer, body start, body end) ----------

    def _connect(self, flags: int, mv: memoryview, pos: int, end: int) -> Connect:
        stop = pos + 2 + _u16(mv, pos, end, "CONNECT protocol name")
        if stop + 1 > end:
            raise MalformedPacket("CONNECT: the packet ends inside the protocol name or level")
        name = bytes(mv[pos + 2:stop])
        level = mv[stop]
        pos = stop + 1
        if name == b"MQTT":
            if level != 4 and level != 5:
                raise UnsupportedProtocolVersion(f"CONNECT: protocol level {level} (4 is MQTT 3.1.1, 5 is MQTT 5)",
                                                 level)
        elif name == b"MQIsdp":
            raise UnsupportedProtocolVersion(f"CONNECT: MQTT 3.1 (protocol name 'MQIsdp', level {level})", level)
        else:
            raise ProtocolError(f"CONNECT: protocol name {_show(name)}, not MQTT")
        if pos + 3 > end:
            raise MalformedPacket("CONNECT: the packet ends inside the connect flags or keep alive")
        cf = mv[pos]
        keep_alive = (mv[pos + 1] << 8) | mv[pos + 2]
        pos += 3
        if cf & 0x01:
            raise MalformedPacket("CONNECT: the reserved connect flag (bit 0) is set")
        will_flag = cf & 0x04
        will_qos = (cf >> 3) & 3
        will_retain = bool(cf & 0x20)
        if will_flag:
            if will_qos == 3:
                raise MalformedPacket("CONNECT: will QoS 3")
        elif will_qos or will_retain:
            raise MalformedPacket("CONNECT: will QoS or will retain set without the will flag")
        has_user = cf & 0x80
        has_password = cf & 0x40
        if has_password and not has_user and level == 4:
            raise MalformedPacket("CONNECT: password flag without the user name flag (MQTT 3.1.1)")
        props = EMPTY
        if level == 5:
            props, pos = _properties(mv, pos, end, P.CONNECT, "CONNECT properties")
            if props.authentication_data is not None and props.authentication_method is None:
                raise ProtocolError("CONNECT properties: authentication data without an authentication method")
        client_id, pos = _string(mv, pos, end, "CONNECT client identifier")
        will = None
        if will_flag:
            will_props = EMPTY
            if level == 5:
                will_props, pos = _properties(mv, pos, end, WILL, "CONNECT will properties")
            topic, pos = _string(mv, pos, end, "CONNECT will topic")
            _topic_name(topic, "CONNECT will topic")
            payload, pos = _binary(mv, pos, end, "CONNECT will payload")
            will = Will(topic, payload, will_qos, will_retain, will_props)
        username: str | None = None
        password: bytes | None = None
        if has_user:
            username, pos = _string(mv, pos, end, "CONNECT user name")
        if has_password:
            password, pos = _binary(mv, pos, end, "CONNECT password")
        _no_more(pos, end, "CONNECT")
        if self.level is None:
            self.level = level
        return Connect(level, bool(cf & 0x02), keep_alive, client_id, will, username, password, props)

    def _connack(self, flags: int, mv: memoryview, pos: int, end: int) -> Connack:
        if pos + 2 > end:
            raise MalformedPacket("CONNACK: shorter than its 2 bytes")
        ack = mv[pos]
        code = mv[pos + 1]
        pos += 2
        if ack & 0xFE:
            raise MalformedPacket(f"CONNACK: reserved acknowledge flags {ack:#04x}")
        props = EMPTY
        if self.level == 5:
            reason = _reason(code, P.CONNACK)
            props, pos = _properties(mv, pos, end, P.CONNACK, "CONNACK properties")
        else:
            known = REASON_FOR_311.get(code)
            if known is None:
                raise ProtocolError(f"CONNACK: return code {code} (3.1.1 has 0 to 5)")
            reason = known
        _no_more(pos, end, "CONNACK")
        if ack and reason:
            raise ProtocolError("CONNACK: session present on a refusal")
        return Connack(bool(ack), reason, props)

    def _publish(self, flags: int, mv: memoryview, pos: int, end: int) -> Publish:
        # the per-message path: fields inline, the payload copied once
        qos = (flags >> 1) & 3
        if qos == 3:
            raise MalformedPacket("PUBLISH: QoS 3")
        if flags & 0x08 and not qos:
            raise MalformedPacket("PUBLISH: DUP set on a QoS 0 message")
        stop = pos + 2 + _u16(mv, pos, end, "PUBLISH topic name")
        if stop > end:
            raise MalformedPacket("PUBLISH topic name: string length runs past its end")
        try:
            topic = str(mv[pos + 2:stop], "utf-8")
        except UnicodeDecodeError as e:
            raise MalformedPacket(f"PUBLISH topic name: not valid UTF-8 ({e.reason})") from None
        if "\x00" in topic:
            raise MalformedPacket("PUBLISH topic name: contains U+0000")
        if "+" in topic or "#" in topic:
            raise ProtocolError(f"PUBLISH: wildcard in topic name {_show(topic)}")
        pos = stop
        packet_id = None
        if qos:
            packet_id = _packet_id(mv, pos, end, "PUBLISH packet identifier")
            pos += 2
        props = EMPTY
        if self.level == 5:
            if pos < end and not mv[pos]:
                pos += 1
            else:
                props, pos = _properties(mv, pos, end, P.PUBLISH, "PUBLISH properties")
                if props.subscription_identifiers and self.server:
                    raise ProtocolError("PUBLISH properties: a subscription identifier from a client")
            if not topic and props.topic_alias is None:
                raise ProtocolError("PUBLISH: empty topic name without a topic alias")
        elif not topic:
            raise ProtocolError("PUBLISH: empty topic name")
        return Publish(topic, bytes(mv[pos:end]), qos, bool(flags & 0x01), bool(flags & 0x08), packet_id, props)

    def _ack(self, cls: _Ack, flags: int, mv: memoryview, pos: int, end: int) -> Puback | Pubrec | Pubrel | Pubcomp:
        kind = cls.TYPE
        packet_id = _packet_id(mv, pos, end, f"{kind.name} packet identifier")
        pos += 2
        if pos == end:
            return cls(packet_id)
        if self.level != 5:
            _no_more(pos, end, kind.name)
        code = _reason(mv[pos], kind)
        pos += 1
        props = EMPTY
        if pos < end:
            props, pos = _properties(mv, pos, end, kind, f"{kind.name} properties")
            _no_more(pos, end, kind.name)
        return cls(packet_id, code, props)

    def _subscribe(self, flags: int, mv: memoryview, pos: int, end: int) -> Subscribe:
        packet_id = _packet_id(mv, pos, end, "SUBSCRIBE packet identifier")
        pos += 2
        props = EMPTY
        v5 = self.level == 5
        if v5:
            props, pos = _properties(mv, pos, end, P.SUBSCRIBE, "SUBSCRIBE properties")
        subs: list[tuple[str, SubOptions]] = []
        while pos < end:
            topic_filter, pos = _string(mv, pos, end, "SUBSCRIBE topic filter")
            if pos >= end:
                raise MalformedPacket(f"SUBSCRIBE: topic filter {_show(topic_filter)} without its options")
            o = mv[pos]
            pos += 1
            if v5:
                if o & 0xC0:
                    raise MalformedPacket(f"SUBSCRIBE: reserved bits of the subscription options {o:#04x}")
                if o & 3 == 3:
                    raise ProtocolError("SUBSCRIBE: maximum QoS 3 in the subscription options")
                retain_handling = (o >> 4) & 3
                if retain_handling == 3:
                    raise ProtocolError("SUBSCRIBE: retain handling 3 in the subscription options")
                subs.append((topic_filter, SubOptions(o & 3, bool(o & 0x04), bool(o & 0x08), retain_handling)))
            else:
                if o & 0xFC or o == 3:
                    raise MalformedPacket(f"SUBSCRIBE: requested QoS byte {o:#04x} (only 0, 1, 2)")
                subs.append((topic_filter, SubOptions(o)))
        if not subs:
            raise ProtocolError("SUBSCRIBE: no topic filter")
        return Subscribe(packet_id, tuple(subs), props)

    def _suback(self, flags: int, mv: memoryview, pos: int, end: int) -> Suback:
        packet_id = _packet_id(mv, pos, end, "SUBACK packet identifier")
        pos += 2
        props = EMPTY
        allowed: frozenset[int] = SUBACK_311
        if self.level == 5:
            props, pos = _properties(mv, pos, end, P.SUBACK, "SUBACK properties")
            allowed = REASONS[P.SUBACK]
        codes = tuple(mv[pos:end].tolist())
        if not codes:
            raise ProtocolError("SUBACK: no reason code")
        for c in codes:
            if c not in allowed:
                raise ProtocolError(f"SUBACK: reason code {c:#04x} is not one of its reason codes")
        return Suback(packet_id, codes, props)

    def _unsubscribe(self, flags: int, mv: memoryview, pos: int, end: int) -> Unsubscribe:
        packet_id = _packet_id(mv, pos, end, "UNSUBSCRIBE packet identifier")
        pos += 2
        props = EMPTY
        if self.level == 5:
            props, pos = _properties(mv, pos, end, P.UNSUBSCRIBE, "UNSUBSCRIBE properties")
        filters: list[str] = []
        while pos < end:
            topic_filter, pos = _string(mv, pos, end, "UNSUBSCRIBE topic filter")
            filters.append(topic_filter)
        if not filters:
            raise ProtocolError("UNSUBSCRIBE: no topic filter")
        return Unsubscribe(packet_id, tuple(filters), props)

    def _unsuback(self, flags: int, mv: memoryview, pos: int, end: int) -> Unsuback:
        packet_id = _packet_id(mv, pos, end, "UNSUBACK packet identifier")
        pos += 2
        if self.level != 5:
            _no_more(pos, end, "UNSUBACK")
            return Unsuback(packet_id)
        props, pos = _properties(mv, pos, end, P.UNSUBACK, "UNSUBACK properties")
        codes = tuple(mv[pos:end].tolist())
        if not codes:
            raise ProtocolError("UNSUBACK: no reason code")
        for c in codes:
            _reason(c, P.UNSUBACK)
        return Unsuback(packet_id, codes, props)

    def _pingreq(self, flags: int, mv: memoryview, pos: int, end: int) -> Pingreq:
        _no_more(pos, end, "PINGREQ")
        return _PINGREQ

    def _pingresp(self, flags: int, mv: memoryview, pos: int, end: int) -> Pingresp:
        _no_more(pos, end, "PINGRESP")
        return _PINGRESP

    def _disconnect(self, flags: int, mv: memoryview, pos: int, end: int) -> Disconnect:
        if pos == end:
            return _DISCONNECT
        if self.level != 5:
            _no_more(pos, end, "DISCONNECT")
        code = _reason(mv[pos], P.DISCONNECT)
        pos += 1
        props = EMPTY
        if pos < end:
            props, pos = _properties(mv, pos, end, P.DISCONNECT, "DISCONNECT properties")
            _no_more(pos, end, "DISCONNECT")
        return Disconnect(code, props)

    def _auth(self, flags: int, mv: memoryview, pos: int, end: int) -> Auth:
        if self.level != 5:
            raise MalformedPacket("packet type 15 (AUTH) is reserved in MQTT 3.1.1")
        if pos == end:
            return Auth()
        code = _reason(mv[pos], P.AUTH)
        pos += 1
        props = EMPTY
        if pos < end:
            props, pos = _properties(mv, pos, end, P.AUTH, "AUTH properties")
            _no_more(pos, end, "AUTH")
        return Auth(code, props)


# --- encoding ----------------------------------------------------------------------------------------

_SMALL: Final = [bytes((i,)) for i in range(128)]


def _vbi(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    if n > VARINT_MAX:
        raise ValueError(f"{n} does not fit a variable byte integer")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int(v: int, size: int, where: str) -> bytes:
    if type(v) is not int or not 0 <= v < 1 << (8 * size):
        raise ValueError(f"{where}: {v!r} is not a {size}-byte unsigned integer")
    return v.to_bytes(size, "big")


def _str(s: str, where: str) -> bytes:
    b = s.encode()  # a lone surrogate raises UnicodeEncodeError, a ValueError
    if len(b) > 0xFFFF or "\x00" in s:
        raise ValueError(f"{where}: {_show(s)} is not an MQTT string (U+0000, or over 65535 bytes)")
    return len(b).to_bytes(2, "big") + b


def _bin(b: bytes, where: str) -> bytes:
    if len(b) > 0xFFFF:
        raise ValueError(f"{where}: {len(b)} bytes, binary data holds at most 65535")
    return len(b).to_bytes(2, "big") + bytes(b)


def _pid(pid: int | None, where: str) -> bytes:
    if type(pid) is not int or not 0 < pid <= 0xFFFF:
        raise ValueError(f"{where}: packet identifier {pid!r} (1 to 65535)")
    return pid.to_bytes(2, "big")


def _props(p: Properties, kind: Where) -> bytes:
    """The properties of a `kind` packet (or will), their length first."""
    if p is EMPTY:
        return b"\x00"
    out = bytearray()
    for pid, spec in PROPERTIES.items():
        v = getattr(p, spec.field)
        if v is None or v == ():
            continue
        where = f"{kind if isinstance(kind, str) else kind.name} property {spec.field}"
        if kind not in spec.allowed:
            raise ValueError(f"{where}: not allowed there")
        if pid == USER_PROPERTY:
            for key, val in v:
                out.append(pid)
                out += _str(key, where) + _str(val, where)
            continue
        if pid == SUBSCRIPTION_IDENTIFIER:
            if len(v) > 1 and kind is not P.PUBLISH:
                raise ValueError(f"{where}: at most one")
            for s in v:
                if type(s) is not int or not 0 < s <= VARINT_MAX:
                    raise ValueError(f"{where}: {s!r} (1 to {VARINT_MAX})")
                out.append(pid)
                out += _vbi(s)
            continue
        if (pid in BOOLEAN_PROPERTIES and v not in (0, 1)) or (pid in NONZERO_PROPERTIES and v == 0):
            raise ValueError(f"{where}: {v!r} is out of its range")
        out.append(pid)
        wire = spec.wire
        if wire is Wire.BYTE:
            out += _int(v, 1, where)
        elif wire is Wire.TWO_BYTE:
            out += _int(v, 2, where)
        elif wire is Wire.FOUR_BYTE:
            out += _int(v, 4, where)
        elif wire is Wire.UTF8:
            out += _str(v, where)
        else:
            out += _bin(v, where)
    return _vbi(len(out)) + out


def _frame(b0: int, body: bytes | bytearray) -> bytes:
    return b"".join((_SMALL[b0] if b0 < 0x80 else bytes((b0,)), _vbi(len(body)), body))


def _check_topic(topic: str, where: str) -> None:
    if "+" in topic or "#" in topic:
        raise ValueError(f"{where}: wildcard in topic name {_show(topic)}")


def _enc_connect(c: Connect, level: int) -> bytes:
    if c.level != level:
        raise ValueError(f"CONNECT: its level is {c.level}, encoding at level {level}")
    flags = 0x02 if c.clean_start else 0
    will = c.will
    if will is not None:
        if will.qos not in (0, 1, 2):
            raise ValueError(f"CONNECT: will QoS {will.qos!r}")
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if c.username is not None:
        flags |= 0x80
    if c.password is not None:
        if c.username is None and level == 4:
            raise ValueError("CONNECT: a password without a user name (MQTT 3.1.1)")
        flags |= 0x40
    body = bytearray(b"\x00\x04MQTT")
    body.append(level)
    body.append(flags)
    body += _int(c.keep_alive, 2, "CONNECT keep alive")
    if level == 5:
        body += _props(c.properties, P.CONNECT)
    body += _str(c.client_id, "CONNECT client identifier")
    if will is not None:
        if level == 5:
            body += _props(will.properties, WILL)
        if not will.topic:
            raise ValueError("CONNECT: empty will topic")
        _check_topic(will.topic, "CONNECT will topic")
        body += _str(will.topic, "CONNECT will topic") + _bin(will.payload, "CONNECT will payload")
    if c.username is not None:
        body += _str(c.username, "CONNECT user name")
    if c.password is not None:
        body += _bin(c.password, "CONNECT password")
    return _frame(0x10, body)


def _enc_connack(c: Connack, level: int) -> bytes:
    code = connack_code(c.reason_code, level)
    if c.session_present and c.reason_code:
        raise ValueError("CONNACK: session present on a refusal")
    body = bytes((1 if c.session_present else 0, code))
    if level == 5:
        body += _props(c.properties, P.CONNACK)
    return _frame(0x20, body)


def _enc_publish(p: Publish, level: int) -> bytes:
    qos = p.qos
    topic = p.topic
    _check_topic(topic, "PUBLISH")
    head = bytearray(_str(topic, "PUBLISH topic name"))
    if qos:
        if qos != 1 and qos != 2:
            raise ValueError(f"PUBLISH: QoS {qos!r}")
        head += _pid(p.packet_id, "PUBLISH")
    elif p.packet_id is not None or p.dup:
        raise ValueError("PUBLISH: a packet identifier or DUP on a QoS 0 message")
    if level == 5:
        props = p.properties
        head += _props(props, P.PUBLISH)
        if not topic and props.topic_alias is None:
            raise ValueError("PUBLISH: empty topic name without a topic alias")
    elif not topic:
        raise ValueError("PUBLISH: empty topic name")
    payload = p.payload
    b0 = 0x30 | (0x08 if p.dup else 0) | (qos << 1) | (0x01 if p.retain else 0)
    return b"".join((_SMALL[b0], _vbi(len(head) + len(payload)), head, payload))


def _enc_ack(a: Puback | Pubrec | Pubrel | Pubcomp, level: int) -> bytes:
    kind = a.TYPE
    b0 = 0x62 if kind is P.PUBREL else kind << 4
    pid = _pid(a.packet_id, kind.name)
    if level == 4:
        return _frame(b0, pid)
    code = a.reason_code
    if code not in REASONS[kind]:
        raise ValueError(f"{kind.name}: reason code {code!r} is not one of its reason codes")
    props = a.properties
    if props is EMPTY or props == EMPTY:
        return _frame(b0, pid if code == 0 else pid + bytes((code,)))
    return _frame(b0, pid + bytes((code,)) + _props(props, kind))


def _enc_subscribe(s: Subscribe, level: int) -> bytes:
    if not s.subscriptions:
        raise ValueError("SUBSCRIBE: no topic filter")
    body = bytearray(_pid(s.packet_id, "SUBSCRIBE"))
    if level == 5:
        body += _props(s.properties, P.SUBSCRIBE)
    for topic_filter, o in s.subscriptions:
        body += _str(topic_filter, "SUBSCRIBE topic filter")
        if o.qos not in (0, 1, 2) or o.retain_handling not in (0, 1, 2):
            raise ValueError(f"SUBSCRIBE: options {o!r}")
        if level == 5:
            body.append(o.qos | (0x04 if o.no_local else 0) | (0x08 if o.retain_as_published else 0)
                        | (o.retain_handling << 4))
        else:
            body.append(o.qos)
    return _frame(0x82, body)


def _enc_suback(s: Suback, level: int) -> bytes:
    if not s.reason_codes:
        raise ValueError("SUBACK: no reason code")
    body = bytearray(_pid(s.packet_id, "SUBACK"))
    if level == 5:
        body += _props(s.properties, P.SUBACK)
    allowed = REASONS[P.SUBACK]
    for c in s.reason_codes:
        if c not in allowed:
            raise ValueError(f"SUBACK: reason code {c!r} is not one of its reason codes")
        body.append(c if level == 5 or c < 0x80 else 0x80)
    return _frame(0x90, body)


def _enc_unsubscribe(u: Unsubscribe, level: int) -> bytes:
    if not u.filters:
        raise ValueError("UNSUBSCRIBE: no topic filter")
    body = bytearray(_pid(u.packet_id, "UNSUBSCRIBE"))
    if level == 5:
        body += _props(u.properties, P.UNSUBSCRIBE)
    for topic_filter in u.filters:
        body += _str(topic_filter, "UNSUBSCRIBE topic filter")
    return _frame(0xA2, body)


def _enc_unsuback(u: Unsuback, level: int) -> bytes:
    body = bytearray(_pid(u.packet_id, "UNSUBACK"))
    if level == 4:
        return _frame(0xB0, body)
    if not u.reason_codes:
        raise ValueError("UNSUBACK: no reason code (MQTT 5 has one per topic filter)")
    body += _props(u.properties, P.UNSUBACK)
    for c in u.reason_codes:
        if c not in REASONS[P.UNSUBACK]:
            raise ValueError(f"UNSUBACK: reason code {c!r} is not one of its reason codes")
        body.append(c)
    return _frame(0xB0, body)


def _enc_pingreq(p: Pingreq, level: int) -> bytes:
    return b"\xc0\x00"


def _enc_pingresp(p: Pingresp, level: int) -> bytes:
    return b"\xd0\x00"


def _enc_end(kind: PacketType, code: int, props: Properties) -> bytes:
    """DISCONNECT and AUTH at level 5: nothing for success without properties, else the code."""
    if code not in REASONS[kind]:
        raise ValueError(f"{kind.name}: reason code {code!r} is not one of its reason codes")
    b0 = kind << 4
    if props is EMPTY or props == EMPTY:
        return _frame(b0, bytes((code,)) if code else b"")
    return _frame(b0, bytes((code,)) + _props(props, kind))


def _enc_disconnect(d: Disconnect, level: int) -> bytes:
    if level == 4:
        return b"\xe0\x00"
    return _enc_end(P.DISCONNECT, d.reason_code, d.properties)


def _enc_auth(a: Auth, level: int) -> bytes:
    if level == 4:
        raise ValueError("AUTH does not exist in MQTT 3.1.1")
    return _enc_end(P.AUTH, a.reason_code, a.properties)


_ENCODERS: Final[dict[type, Callable[[Any, int], bytes]]] = {
    Connect: _enc_connect, Connack: _enc_connack, Publish: _enc_publish,
    Puback: _enc_ack, Pubrec: _enc_ack, Pubrel: _enc_ack, Pubcomp: _enc_ack,
    Subscribe: _enc_subscribe, Suback: _enc_suback, Unsubscribe: _enc_unsubscribe, Unsuback: _enc_unsuback,
    Pingreq: _enc_pingreq, Pingresp: _enc_pingresp, Disconnect: _enc_disconnect, Auth: _enc_auth,
}


def encode(packet: Packet, level: int) -> bytes:
    """The bytes of `packet` at protocol `level` (4: MQTT 3.1.1, 5: MQTT 5). At level 4 what 3.1.1
    cannot carry is left out (properties, MQTT 5 subscription options, ack reason codes); a packet
    no level-`level` peer could take is a ValueError."""
    if level != 4 and level != 5:
        raise ValueError(f"protocol level {level!r}: expected 4 or 5")
    enc = _ENCODERS.get(type(packet))
    if enc is None:
        raise TypeError(f"not an MQTT packet: {type(packet).__name__}")
    return enc(packet, level)
