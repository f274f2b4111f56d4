"""Identities on the wire: publisher links, subscriptions and global message ids.

A message's global id (gid) must fit an AMQP delivery tag (<= 32 bytes) and stay ASCII (Proton 0.40
raises on reading a non-UTF-8 tag, PROTON-2531), so that transit hops and foreign subscribers can use
it as a tag without decoding anything. It is derived only from what the publisher controls:
(container-id, link name, delivery tag); a resend with the same tag on the same link name yields the
same gid at any router.

    gid = plid ":" tag                 when the tag is short printable ASCII (readable logs)
    gid = plid "#" base32(hash(tag))   otherwise
    gid = plid "~" base32(hash(...))   a new identity a router gave a message whose tag its publisher
                                       reused (router/identity.py): never a counter, never a tag

where plid is a 12-character hash of (container-id, link name). Control tags sent by routers start
with "$" and can never collide with a gid (base32 never produces "$").
"""

from __future__ import annotations

import base64
import hashlib
import re

GID_MAX = 32
PLID_LEN = 12
_TAG_MAX_PLAIN = GID_MAX - PLID_LEN - 1


def _b32(data: bytes) -> str:
    return base64.b32encode(data).decode("ascii").rstrip("=").lower()


def publisher_link_id(container_id: str, link_name: str) -> str:
    h = hashlib.blake2b(f"{container_id}\0{link_name}".encode(), digest_size=8).digest()
    return _b32(h)[:PLID_LEN]


def subscription_id(container_id: str, link_name: str, topic: str) -> str:
    h = hashlib.blake2b(f"{container_id}\0{link_name}\0{topic}".encode(), digest_size=10).digest()
    return _b32(h)[:16]


SHARED = "shared"  # the source capability of a shared subscription's member link (Qpid JMS's)
GLOBAL = "global"  # ... and of one whose name is not scoped to the client's container id
NAME_DELIMITER = "|"  # a member link's name is the subscription's name, then '|' and what tells members apart


def group_key(link_name: str, capabilities: tuple[str, ...] | list[str], container: str) -> tuple[str, str] | None:
    """The (scope, name) of the shared subscription a receiver attach joins, or None when it is
    not shared (no `shared` source capability). The name is the link name up to its first '|'
    (Qpid JMS names its members `name`, `name|2`, ... or `name|global`, `name|global2`, ...);
    the scope is the client's container id, or "" for a global subscription (`global`)."""
    if SHARED not in capabilities:
        return None
    name = link_name.split(NAME_DELIMITER, 1)[0]
    return ("" if GLOBAL in capabilities else container, name)


def shared_subscription_id(scope: str, name: str, topic: str) -> str:
    """The id of shared subscription `name` on `topic`, scoped to container id `scope` ("" global;
    router/groups.py): never the id of a subscription of one link (a NUL no container id holds)."""
    return subscription_id(f"\0shared\0{scope}", name, topic)


_PLAIN_TAG = re.compile(rb'[\x21\x23-\x5b\x5d-\x7e]{1,%d}' % _TAG_MAX_PLAIN)  # printable, no " or \\


def global_id(plid: str, tag: bytes) -> str:
    # (the usual tag is short and alphanumeric, which bytes.isalnum checks in ASCII: no regex for it)
    if (len(tag) <= _TAG_MAX_PLAIN and tag.isalnum()) or _PLAIN_TAG.fullmatch(tag):
        return f"{plid}:{tag.decode('ascii')}"
    h = hashlib.blake2b(tag, digest_size=12).digest()
    return f"{plid}#{_b32(h)[: GID_MAX - PLID_LEN - 1]}"


def new_identity(plid: str, tag: bytes, salt: str) -> str:
    """A global id for a message its publisher sent under a tag that already named another message
    (AMQP lets a sender reuse a tag once its delivery is settled). `salt` is unique to the router's
    incarnation and to this message there, so the id is unique mesh-wide; the plid stays in front
    (the publisher link's order and declarations still apply), and the "~" keeps it apart from every
    id `global_id` makes: it never parses as a counter tag (`counter_seq` is None)."""
    h = hashlib.blake2b(tag + b"\0" + salt.encode(), digest_size=12).digest()
    return f"{plid}~{_b32(h)[: GID_MAX - PLID_LEN - 1]}"


def payload_digest(payload: bytes) -> str:
    """A short digest of a message's bytes: a resend carries the same bytes (router/identity.py)."""
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


def plid_of(gid: str) -> str:
    return gid[:PLID_LEN]


def is_control_tag(tag: bytes) -> bool:
    return tag[:1] == b"$"


_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


_COUNTER = re.compile(r"(?:0|[1-9a-z][0-9a-z]*)")


def counter_seq(gid: str) -> int | None:
    """The sequence number of a gid made from a `counter_tag` tag (None: some other tag)."""
    if gid[PLID_LEN:PLID_LEN + 1] != ":":
        return None
    tag = gid[PLID_LEN + 1:]
    if tag.isascii() and tag.isalnum() and (tag.islower() or tag.isdigit()):  # no regex for the usual
        return int(tag, 36) if tag[0] != "0" or tag == "0" else None
    return int(tag, 36) if _COUNTER.fullmatch(tag) else None


def counter_tag(n: int) -> bytes:
    """Compact ASCII delivery tags for our publishers (base36 counter)."""
    if n == 0:
        return b"0"
    out = []
    while n:
        n, r = divmod(n, 36)
        out.append(_ALPHABET[r])
    return "".join(reversed(out)).encode("ascii")


# ---------------------------------------------------------------- identity by message-id (opt-in)
# A publisher whose library chooses its delivery tags itself (from the link's delivery count) cannot
# resend a message under its old tag after a failover: for it the message's identity is the
# `message-id` of its properties section instead (docs/clients.md, "Identity by message-id"):
#
#     gid = scope "=" base32(hash(message-id))
#
# where scope is a 12-character hash of (topic, user): every publisher link of one authenticated user
# on one topic, on any router, under any container id, link name or tag, gives one message-id one
# gid. "=" never appears in the other forms (no counter, no "#", no "~"): `is_msgid_gid`.

MSGID_SEP = "="


def identity_scope(topic: str, user: str) -> str:
    """The scope of message-id identities of `user`'s publishers on `topic` (it stands where a
    publisher link id stands in a gid: a publisher link of the scope, for order and the chain)."""
    h = hashlib.blake2b(f"message-id\0{topic}\0{user}".encode(), digest_size=8).digest()
    return _b32(h)[:PLID_LEN]


def msgid_gid(scope: str, key: bytes) -> str:
    """The gid of the message whose message-id is `key` (`message_id_key`) in `scope`."""
    h = hashlib.blake2b(key, digest_size=12).digest()
    return f"{scope}{MSGID_SEP}{_b32(h)[: GID_MAX - PLID_LEN - 1]}"


def is_msgid_gid(gid: str) -> bool:
    return gid[PLID_LEN:PLID_LEN + 1] == MSGID_SEP


class BadMessage(ValueError):
    """The bytes of a message could not be read as far as its properties (a malformed encoding)."""


# AMQP 1.0 types by constructor: fixed widths (by the high nibble) and the variable-width ones
_FIXED = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
_PROPERTIES = 0x73
_BARE_AFTER = frozenset({0x74, 0x75, 0x76, 0x77, 0x78})  # application-properties, body, footer


def _skip(b: bytes, i: int) -> int:
    """The offset after the AMQP value that starts at `i`."""
    code = b[i]
    if code == 0x00:  # described: the descriptor, then the value
        return _skip(b, _skip(b, i + 1))
    hi = code >> 4
    if hi in _FIXED:
        return i + 1 + _FIXED[hi]
    if hi in (0xA, 0xC, 0xE):
        return i + 2 + b[i + 1]
    if hi in (0xB, 0xD, 0xF):
        return i + 5 + int.from_bytes(b[i + 1:i + 5], "big")
    raise BadMessage(f"unknown AMQP constructor 0x{code:02x} at byte {i}")


def _message_id_at(b: bytes, i: int) -> bytes | None:
    """The message-id key of the properties list that starts at `i` (None: no message-id)."""
    code = b[i]
    if code == 0x45:  # list0: no fields
        return None
    if code == 0xC0:
        i, count = i + 3, b[i + 2]
    elif code == 0xD0:
        i, count = i + 9, int.from_bytes(b[i + 5:i + 9], "big")
    else:
        raise BadMessage(f"properties are not a list (constructor 0x{code:02x})")
    if count == 0:
        return None
    code = b[i]
    end = _skip(b, i)
    if end > len(b):
        raise BadMessage("message-id runs past the end of the message")
    if code == 0x40:
        return None
    if code in (0x44, 0x53, 0x80):  # ulong
        return b"n" + str(int.from_bytes(b[i + 1:end], "big")).encode()
    if code == 0x98:  # uuid
        return b"u" + b[i + 1:end]
    if code in (0xA0, 0xB0):  # binary
        return b"b" + b[i + (2 if code == 0xA0 else 5):end]
    if code in (0xA1, 0xB1):  # string
        return b"s" + b[i + (2 if code == 0xA1 else 5):end]
    raise BadMessage(f"message-id of a type AMQP does not allow (constructor 0x{code:02x})")


def message_id_key(payload: bytes) -> bytes | None:
    """The message-id of an encoded AMQP message, as a key: its type (n: ulong, u: uuid, b: binary,
    s: string) then its bytes, so that the string "1" and the number 1 are two ids. None when the
    message has no properties section or no message-id; `BadMessage` when the bytes cannot be read.
    Reads the sections before the bare message's properties only, skipping their values."""
    i, n = 0, len(payload)
    try:
        while i < n:
            if payload[i] != 0x00 or i + 2 > n:
                raise BadMessage(f"no section at byte {i}")
            d = payload[i + 1]
            if d == 0x53:
                code, at = payload[i + 2], i + 3
            elif d == 0x80:
                code, at = int.from_bytes(payload[i + 2:i + 10], "big"), i + 10
            else:
                raise BadMessage(f"a section descriptor of constructor 0x{d:02x}")
            if code == _PROPERTIES:
                return _message_id_at(payload, at)
            if code in _BARE_AFTER:
                return None
            i = _skip(payload, at)
    except IndexError:
        raise BadMessage("the message ends inside a section") from None
    return None
