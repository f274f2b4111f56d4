"""The MQTT packets as values: one frozen dataclass per control packet, the MQTT 5 properties, the
reason codes, and the tables the codec checks them against (MQTT 3.1.1 = level 4, MQTT 5.0 = level 5).

The packets are the MQTT 5 shape; a level-4 packet is the same object with what 3.1.1 cannot carry
left at its default (no properties, reason code 0, `Unsuback.reason_codes` empty). A `Connack`
always holds the MQTT 5 reason: the codec maps it to and from the 3.1.1 return code at level 4
(`connack_code`, `REASON_FOR_311`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import ClassVar, Final, Literal, NamedTuple


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class Reason(IntEnum):
    """MQTT 5 reason codes (spec 2.4). 0x00 has three names by packet: SUCCESS, NORMAL_DISCONNECTION,
    GRANTED_QOS_0 (aliases of one member)."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class Connack311(IntEnum):
    """The MQTT 3.1.1 CONNACK return codes (3.1.1 spec 3.2.2.3)."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USER_NAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


R = Reason
# Which reason codes each packet may carry (MQTT 5 spec, the Reason Code tables of each packet).
REASONS: Final[dict[PacketType, frozenset[int]]] = {
    PacketType.CONNACK: frozenset({
        R.SUCCESS, R.UNSPECIFIED_ERROR, R.MALFORMED_PACKET, R.PROTOCOL_ERROR, R.IMPLEMENTATION_SPECIFIC_ERROR,
        R.UNSUPPORTED_PROTOCOL_VERSION, R.CLIENT_IDENTIFIER_NOT_VALID, R.BAD_USER_NAME_OR_PASSWORD,
        R.NOT_AUTHORIZED, R.SERVER_UNAVAILABLE, R.SERVER_BUSY, R.BANNED, R.BAD_AUTHENTICATION_METHOD,
        R.TOPIC_NAME_INVALID, R.PACKET_TOO_LARGE, R.QUOTA_EXCEEDED, R.PAYLOAD_FORMAT_INVALID,
        R.RETAIN_NOT_SUPPORTED, R.QOS_NOT_SUPPORTED, R.USE_ANOTHER_SERVER, R.SERVER_MOVED,
        R.CONNECTION_RATE_EXCEEDED}),
    PacketType.PUBACK: frozenset({
        R.SUCCESS, R.NO_MATCHING_SUBSCRIBERS, R.UNSPECIFIED_ERROR, R.IMPLEMENTATION_SPECIFIC_ERROR,
        R.NOT_AUTHORIZED, R.TOPIC_NAME_INVALID, R.PACKET_IDENTIFIER_IN_USE, R.QUOTA_EXCEEDED,
        R.PAYLOAD_FORMAT_INVALID}),
    PacketType.PUBREL: frozenset({R.SUCCESS, R.PACKET_IDENTIFIER_NOT_FOUND}),
    PacketType.SUBACK: frozenset({
        R.GRANTED_QOS_0, R.GRANTED_QOS_1, R.GRANTED_QOS_2, R.UNSPECIFIED_ERROR, R.IMPLEMENTATION_SPECIFIC_ERROR,
        R.NOT_AUTHORIZED, R.TOPIC_FILTER_INVALID, R.PACKET_IDENTIFIER_IN_USE, R.QUOTA_EXCEEDED,
        R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
        R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED}),
    PacketType.UNSUBACK: frozenset({
        R.SUCCESS, R.NO_SUBSCRIPTION_EXISTED, R.UNSPECIFIED_ERROR, R.IMPLEMENTATION_SPECIFIC_ERROR,
        R.NOT_AUTHORIZED, R.TOPIC_FILTER_INVALID, R.PACKET_IDENTIFIER_IN_USE}),
    PacketType.DISCONNECT: frozenset({
        R.NORMAL_DISCONNECTION, R.DISCONNECT_WITH_WILL_MESSAGE, R.UNSPECIFIED_ERROR, R.MALFORMED_PACKET,
        R.PROTOCOL_ERROR, R.IMPLEMENTATION_SPECIFIC_ERROR, R.NOT_AUTHORIZED, R.SERVER_BUSY,
        R.SERVER_SHUTTING_DOWN, R.KEEP_ALIVE_TIMEOUT, R.SESSION_TAKEN_OVER, R.TOPIC_FILTER_INVALID,
        R.TOPIC_NAME_INVALID, R.RECEIVE_MAXIMUM_EXCEEDED, R.TOPIC_ALIAS_INVALID, R.PACKET_TOO_LARGE,
        R.MESSAGE_RATE_TOO_HIGH, R.QUOTA_EXCEEDED, R.ADMINISTRATIVE_ACTION, R.PAYLOAD_FORMAT_INVALID,
        R.RETAIN_NOT_SUPPORTED, R.QOS_NOT_SUPPORTED, R.USE_ANOTHER_SERVER, R.SERVER_MOVED,
        R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, R.CONNECTION_RATE_EXCEEDED, R.MAXIMUM_CONNECT_TIME,
        R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED, R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED}),
    PacketType.AUTH: frozenset({R.SUCCESS, R.CONTINUE_AUTHENTICATION, R.RE_AUTHENTICATE}),
}
REASONS[PacketType.PUBREC] = REASONS[PacketType.PUBACK]
REASONS[PacketType.PUBCOMP] = REASONS[PacketType.PUBREL]

SUBACK_311: Final = frozenset({0x00, 0x01, 0x02, 0x80})

# 3.1.1 return code -> the MQTT 5 reason a decoded level-4 CONNACK holds.
REASON_FOR_311: Final[dict[int, Reason]] = {
    Connack311.ACCEPTED: R.SUCCESS,
    Connack311.UNACCEPTABLE_PROTOCOL_VERSION: R.UNSUPPORTED_PROTOCOL_VERSION,
    Connack311.IDENTIFIER_REJECTED: R.CLIENT_IDENTIFIER_NOT_VALID,
    Connack311.SERVER_UNAVAILABLE: R.SERVER_UNAVAILABLE,
    Connack311.BAD_USER_NAME_OR_PASSWORD: R.BAD_USER_NAME_OR_PASSWORD,
    Connack311.NOT_AUTHORIZED: R.NOT_AUTHORIZED,
}
_TO_311: Final[dict[int, int]] = {int(r): c for c, r in REASON_FOR_311.items()} | {
    R.BAD_AUTHENTICATION_METHOD: Connack311.BAD_USER_NAME_OR_PASSWORD,
    R.BANNED: Connack311.NOT_AUTHORIZED,
    R.TOPIC_NAME_INVALID: Connack311.NOT_AUTHORIZED,  # the will topic refused: the nearest is "not authorized"
}


def connack_code(reason: Reason | int, level: int) -> int:
    """The CONNACK code to write for `reason` at `level`: the reason itself at level 5; at level 4 the
    nearest 3.1.1 return code (every failure 3.1.1 cannot name is "server unavailable"). A reason no
    CONNACK may carry is a ValueError (a 3.1.1 code passed by mistake, say)."""
    if reason not in REASONS[PacketType.CONNACK]:
        raise ValueError(f"CONNACK: reason code {reason:#04x} is not a CONNACK reason")
    if level == 5:
        return int(reason)
    if level == 4:
        return int(_TO_311.get(int(reason), Connack311.SERVER_UNAVAILABLE))
    raise ValueError(f"protocol level {level!r}: expected 4 or 5")


class Wire(Enum):
    """The data types of property values (spec 1.5)."""

    BYTE = "byte"
    TWO_BYTE = "two-byte int"
    FOUR_BYTE = "four-byte int"
    VARINT = "varint"
    UTF8 = "utf8 string"
    UTF8_PAIR = "utf8 pair"
    BINARY = "binary"


WILL: Final = "will"
"""Where will properties are allowed, next to packet types in `PropertySpec.allowed`."""

Where = PacketType | Literal["will"]


class PropertySpec(NamedTuple):
    field: str
    wire: Wire
    allowed: frozenset[Where]


P = PacketType
_ACKS: Final = (P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP)


def _spec(name: str, wire: Wire, *where: Where) -> PropertySpec:
    return PropertySpec(name, wire, frozenset(where))


# MQTT 5 spec 2.2.2.2, Table 2-4: id -> field of `Properties`, wire type, where it may appear.
PROPERTIES: Final[dict[int, PropertySpec]] = {
    0x01: _spec("payload_format_indicator", Wire.BYTE, P.PUBLISH, WILL),
    0x02: _spec("message_expiry_interval", Wire.FOUR_BYTE, P.PUBLISH, WILL),
    0x03: _spec("content_type", Wire.UTF8, P.PUBLISH, WILL),
    0x08: _spec("response_topic", Wire.UTF8, P.PUBLISH, WILL),
    0x09: _spec("correlation_data", Wire.BINARY, P.PUBLISH, WILL),
    0x0B: _spec("subscription_identifiers", Wire.VARINT, P.PUBLISH, P.SUBSCRIBE),
    0x11: _spec("session_expiry_interval", Wire.FOUR_BYTE, P.CONNECT, P.CONNACK, P.DISCONNECT),
    0x12: _spec("assigned_client_identifier", Wire.UTF8, P.CONNACK),
    0x13: _spec("server_keep_alive", Wire.TWO_BYTE, P.CONNACK),
    0x15: _spec("authentication_method", Wire.UTF8, P.CONNECT, P.CONNACK, P.AUTH),
    0x16: _spec("authentication_data", Wire.BINARY, P.CONNECT, P.CONNACK, P.AUTH),
    0x17: _spec("request_problem_information", Wire.BYTE, P.CONNECT),
    0x18: _spec("will_delay_interval", Wire.FOUR_BYTE, WILL),
    0x19: _spec("request_response_information", Wire.BYTE, P.CONNECT),
    0x1A: _spec("response_information", Wire.UTF8, P.CONNACK),
    0x1C: _spec("server_reference", Wire.UTF8, P.CONNACK, P.DISCONNECT),
    0x1F: _spec("reason_string", Wire.UTF8, P.CONNACK, *_ACKS, P.SUBACK, P.UNSUBACK, P.DISCONNECT, P.AUTH),
    0x21: _spec("receive_maximum", Wire.TWO_BYTE, P.CONNECT, P.CONNACK),
    0x22: _spec("topic_alias_maximum", Wire.TWO_BYTE, P.CONNECT, P.CONNACK),
    0x23: _spec("topic_alias", Wire.TWO_BYTE, P.PUBLISH),
    0x24: _spec("maximum_qos", Wire.BYTE, P.CONNACK),
    0x25: _spec("retain_available", Wire.BYTE, P.CONNACK),
    0x26: _spec("user_properties", Wire.UTF8_PAIR, P.CONNECT, P.CONNACK, P.PUBLISH, WILL, *_ACKS, P.SUBSCRIBE,
                P.SUBACK, P.UNSUBSCRIBE, P.UNSUBACK, P.DISCONNECT, P.AUTH),
    0x27: _spec("maximum_packet_size", Wire.FOUR_BYTE, P.CONNECT, P.CONNACK),
    0x28: _spec("wildcard_subscription_available", Wire.BYTE, P.CONNACK),
    0x29: _spec("subscription_identifier_available", Wire.BYTE, P.CONNACK),
    0x2A: _spec("shared_subscription_available", Wire.BYTE, P.CONNACK),
}
USER_PROPERTY: Final = 0x26
SUBSCRIPTION_IDENTIFIER: Final = 0x0B
# byte properties whose only values are 0 and 1, and integers that may not be 0 (a Protocol Error)
BOOLEAN_PROPERTIES: Final = frozenset({0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A})
NONZERO_PROPERTIES: Final = frozenset({0x0B, 0x21, 0x27})
VARINT_MAX: Final = 268_435_455


@dataclass(frozen=True, slots=True, kw_only=True)
class Properties:
    """The MQTT 5 properties of one packet (or of a will); None is absent. A PUBLISH to a client may
    carry several subscription identifiers; user properties keep their order and may repeat."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __repr__(self) -> str:  # only what is present: 27 Nones would hide it
        shown = ", ".join(f"{spec.field}={getattr(self, spec.field)!r}" for spec in PROPERTIES.values()
                          if getattr(self, spec.field) not in (None, ()))
        return f"Properties({shown})"


EMPTY: Final = Properties()


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Connect:
    """`level` is the protocol level on the wire (4 or 5); `clean_start` is 3.1.1's clean session."""

    TYPE: ClassVar[PacketType] = PacketType.CONNECT
    level: int = 5
    clean_start: bool = True
    keep_alive: int = 60
    client_id: str = ""
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Connack:
    """`reason_code` is the MQTT 5 reason at both levels (see `connack_code`)."""

    TYPE: ClassVar[PacketType] = PacketType.CONNACK
    session_present: bool = False
    reason_code: int = Reason.SUCCESS
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Publish:
    TYPE: ClassVar[PacketType] = PacketType.PUBLISH
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Puback:
    TYPE: ClassVar[PacketType] = PacketType.PUBACK
    packet_id: int
    reason_code: int = Reason.SUCCESS
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Pubrec:
    TYPE: ClassVar[PacketType] = PacketType.PUBREC
    packet_id: int
    reason_code: int = Reason.SUCCESS
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Pubrel:
    TYPE: ClassVar[PacketType] = PacketType.PUBREL
    packet_id: int
    reason_code: int = Reason.SUCCESS
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Pubcomp:
    TYPE: ClassVar[PacketType] = PacketType.PUBCOMP
    packet_id: int
    reason_code: int = Reason.SUCCESS
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class SubOptions:
    """A subscription's options; at level 4 only `qos` exists."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    TYPE: ClassVar[PacketType] = PacketType.SUBSCRIBE
    packet_id: int
    subscriptions: tuple[tuple[str, SubOptions], ...]
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Suback:
    TYPE: ClassVar[PacketType] = PacketType.SUBACK
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    TYPE: ClassVar[PacketType] = PacketType.UNSUBSCRIBE
    packet_id: int
    filters: tuple[str, ...]
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Unsuback:
    """`reason_codes` is empty at level 4 (3.1.1's UNSUBACK has none)."""

    TYPE: ClassVar[PacketType] = PacketType.UNSUBACK
    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Pingreq:
    TYPE: ClassVar[PacketType] = PacketType.PINGREQ


@dataclass(frozen=True, slots=True)
class Pingresp:
    TYPE: ClassVar[PacketType] = PacketType.PINGRESP


@dataclass(frozen=True, slots=True)
class Disconnect:
    TYPE: ClassVar[PacketType] = PacketType.DISCONNECT
    reason_code: int = Reason.NORMAL_DISCONNECTION
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Auth:
    """MQTT 5 only."""

    TYPE: ClassVar[PacketType] = PacketType.AUTH
    reason_code: int = Reason.SUCCESS
    properties: Properties = EMPTY


Packet = (Connect | Connack | Publish | Puback | Pubrec | Pubrel | Pubcomp | Subscribe | Suback | Unsubscribe
          | Unsuback | Pingreq | Pingresp | Disconnect | Auth)
