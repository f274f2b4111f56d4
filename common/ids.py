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
