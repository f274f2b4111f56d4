"""SASL for AMQP 1.0, sans-IO: the router's authentication layer and our client's.

The router runs SASL itself, between TLS and the AMQP engine (Proton's built-in SASL can only offer
ANONYMOUS and EXTERNAL as a server). `SaslServer.receive(bytes)` returns what to send back and, once
done, the bytes that belong to AMQP; `SaslClient` is the mirror. Mechanisms:

- `EXTERNAL`: the identity of the client's verified TLS certificate (its common name);
- `SCRAM-SHA-256` (RFC 5802, RFC 7677): the password never crosses the wire; the server-final
  message travels in the outcome's additional data;
- `PLAIN` (RFC 4616): offered only over TLS;
- `ANONYMOUS`: only where the configuration allows it.

A client that sends the AMQP header without SASL is served only where anonymous access is allowed.
Frames: the SASL header `AMQP 3.1.0.0`, then frames of type 1 with one performative each
(sasl-mechanisms 0x40, -init 0x41, -challenge 0x42, -response 0x43, -outcome 0x44).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proton import UNDESCRIBED, Array, Data, Described, symbol, ubyte, ulong

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
MECHANISMS, INIT, CHALLENGE, RESPONSE, OUTCOME = 0x40, 0x41, 0x42, 0x43, 0x44
OK, AUTH, SYS, SYS_PERM, SYS_TEMP = 0, 1, 2, 3, 4
MAX_FRAME = 64 * 1024  # a SASL frame larger than this is an attack, not a login

PLAIN, SCRAM, EXTERNAL, ANONYMOUS = "PLAIN", "SCRAM-SHA-256", "EXTERNAL", "ANONYMOUS"
_DECOY_KEY = os.urandom(32)  # unknown users' salts: stable per process, unguessable


class SaslError(Exception):
    """The peer broke the SASL protocol (not a failed login: that is an outcome)."""


# ---------------------------------------------------------------------------------- frames
def encode_frame(code: int, fields: list[Any]) -> bytes:
    d = Data()
    d.put_object(Described(ulong(code), fields))
    body = d.encode()
    return struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body


class FrameReader:
    """Whole SASL frames out of a byte stream."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> None:
        self.buf += data

    def frame(self) -> tuple[int, list[Any]] | None:
        if len(self.buf) < 8:
            return None
        size, doff, ftype, _ = struct.unpack(">IBBH", self.buf[:8])
        if size < 8 or size > MAX_FRAME or doff < 2 or ftype != 1:
            raise SaslError(f"not a SASL frame (size {size}, doff {doff}, type {ftype})")
        if len(self.buf) < size:
            return None
        body = bytes(self.buf[doff * 4:size])
        del self.buf[:size]
        if not body:
            raise SaslError("an empty SASL frame")
        d = Data()
        try:
            d.decode(body)
            d.rewind()
            d.next()
            obj = d.get_object()
        except Exception as exc:
            raise SaslError(f"undecodable SASL frame: {exc}") from None
        if not isinstance(obj, Described) or not isinstance(obj.value, list):
            raise SaslError("a SASL frame that is not a described list")
        # a numeric descriptor (a ulong); a symbolic one, or anything else, is not a SASL frame of ours
        if not isinstance(obj.descriptor, int):
            raise SaslError(f"a SASL frame with descriptor {obj.descriptor!r}")
        code = int(obj.descriptor)
        # (binary fields are views into the decoder's buffer, gone with it: copied now)
        return code, [bytes(v) if isinstance(v, memoryview) else v for v in obj.value]


def _field(fields: list[Any], i: int) -> Any:
    return fields[i] if i < len(fields) else None


def _bytes(v: Any) -> bytes:
    if v is None:
        return b""
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v)
    if isinstance(v, str):
        return v.encode()
    raise SaslError(f"expected binary, got {type(v).__name__}")


# ---------------------------------------------------------------------------------- SCRAM maths
@dataclass(frozen=True, slots=True)
class ScramSecret:
    """What a users file keeps of a password: never the password, enough to check one."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def from_password(cls, password: str, iterations: int = 100_000, salt: bytes | None = None) -> ScramSecret:
        salt = salt if salt is not None else os.urandom(16)
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        return cls(salt, iterations, hashlib.sha256(client_key).digest(), hmac.digest(salted, b"Server Key", "sha256"))

    def check_password(self, password: str) -> bool:
        other = ScramSecret.from_password(password, self.iterations, self.salt)
        return hmac.compare_digest(other.stored_key, self.stored_key)

    def to_json(self) -> dict[str, Any]:
        b64 = base64.b64encode
        return {"salt": b64(self.salt).decode(), "iterations": self.iterations,
                "stored_key": b64(self.stored_key).decode(), "server_key": b64(self.server_key).decode()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ScramSecret:
        b = base64.b64decode
        return cls(b(d["salt"]), int(d["iterations"]), b(d["stored_key"]), b(d["server_key"]))


def _scram_attrs(msg: str) -> dict[str, str]:
    out = {}
    for part in msg.split(","):
        if len(part) >= 2 and part[1] == "=":
            out[part[0]] = part[2:]
    return out


def _saslname(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


# ---------------------------------------------------------------------------------- server
@dataclass(frozen=True, slots=True)
class ServerPolicy:
    """What a listener accepts. `secrets(user)`: the user's secret, None if unknown.
    `external`: the identity of the client's verified certificate, None without one."""

    secrets: Callable[[str], ScramSecret | None]
    encrypted: bool
    external: str | None = None
    allow_anonymous: bool = False
    # password logins offered at all (SCRAM; PLAIN only over TLS): a listener without TLS may refuse them
    passwords: bool = True
    # an unknown user's stand-in secret (the same iteration count as real ones, a salt stable per
    # name): its login costs and looks the same as a known user's; None: a per-process one
    decoy: Callable[[str], ScramSecret] | None = None
    # seconds a password login of this user (from this connection's address) must wait; 0: go
    throttle: Callable[[str], float] | None = None

    def mechanisms(self) -> list[str]:
        mechs = []
        if self.external is not None:
            mechs.append(EXTERNAL)
        if self.passwords:
            mechs.append(SCRAM)
        if self.encrypted and self.passwords:
            mechs.append(PLAIN)
        if self.allow_anonymous:
            mechs.append(ANONYMOUS)
        return mechs


class SaslServer:
    """One connection's SASL exchange, server side. Feed it what the client sent; it returns what
    to send. When `done`, `user` is who logged in (or `failed` says why not) and `amqp` holds the
    bytes that followed the exchange (the start of AMQP)."""

    def __init__(self, policy: ServerPolicy) -> None:
        self.policy = policy
        self.reader = FrameReader()
        self.header_seen = False
        self.done = False
        self.user: str | None = None
        self.mechanism: str | None = None
        self.failed: str | None = None  # why the login failed (for the log)
        self.amqp = b""  # bytes after the exchange
        self.without_sasl = False  # the client went straight to AMQP (anonymous, if allowed)
        self._scram: tuple[str, str, str, ScramSecret] | None = None  # (user, client-first-bare, server-first)
        self._pending = b""
        self.login: str | None = None  # the user name a password login gave (known or not)
        self.throttled = False  # refused unheard: too many failed logins of this user or address
        self._known = False  # the user of the login is in the users file
        # a PLAIN password to check, (secret, password, user): `secret.check_password(password)`
        # then `resolve(ok)`; the exchange waits meanwhile
        self.check: tuple[ScramSecret, str, str] | None = None

    def refuse_busy(self) -> bytes:
        """Too many password checks at once: this login is told to try again (sys-temp)."""
        self.check = None
        return self._outcome(SYS_TEMP, None, "too many logins at once")

    def resolve(self, ok: bool) -> bytes:
        """The outcome of the PLAIN check asked for in `check`."""
        assert self.check is not None
        _, _, user = self.check
        self.check = None
        if not ok or not self._known:
            return self._outcome(AUTH, None, f"wrong user name or password for {user!r}")
        out = self._outcome(OK, user, None)
        self.amqp += bytes(self.reader.buf)
        self.reader.buf.clear()
        return out

    def receive(self, data: bytes) -> bytes:
        if self.done:
            self.amqp += data
            return b""
        out = []
        if not self.header_seen:
            self._pending += data
            if len(self._pending) < 8:
                return b""
            head, rest = self._pending[:8], self._pending[8:]
            self._pending = b""
            if head == AMQP_HEADER:  # no SASL: anonymous, if allowed
                self.done = True
                self.without_sasl = True
                self.mechanism = "none"
                if self.policy.allow_anonymous:
                    self.user = "anonymous"
                else:
                    self.failed = "the client skipped SASL and anonymous access is not allowed"
                self.amqp = head + rest
                return b""
            if head != SASL_HEADER:
                raise SaslError(f"not an AMQP SASL header: {head!r}")
            self.header_seen = True
            out.append(SASL_HEADER)
            out.append(encode_frame(MECHANISMS, [Array(UNDESCRIBED, Data.SYMBOL,  # type: ignore[arg-type]  # proton annotates Array's descriptor as PythonAMQPData, yet its own UNDESCRIBED (a Constant) is how it takes none
                                                       *[symbol(m) for m in self.policy.mechanisms()])]))
            data = rest
        self.reader.feed(data)
        while not self.done and self.check is None and (fr := self.reader.frame()) is not None:
            out.append(self._frame(*fr))
        if self.done:
            self.amqp += bytes(self.reader.buf)
            self.reader.buf.clear()
        return b"".join(out)

    def _outcome(self, code: int, user: str | None, why: str | None, extra: bytes | None = None) -> bytes:
        self.done = True
        self.user = user if code == OK else None
        self.failed = why if code != OK else None
        return encode_frame(OUTCOME, [ubyte(code), extra])

    def _frame(self, code: int, fields: list[Any]) -> bytes:
        if code == INIT and self.mechanism is None:
            mech = str(_field(fields, 0) or "")
            self.mechanism = mech
            resp = _bytes(_field(fields, 1))
            if mech not in self.policy.mechanisms():
                return self._outcome(AUTH, None, f"mechanism {mech!r} not offered")
            if mech == ANONYMOUS:
                return self._outcome(OK, "anonymous", None)
            if mech == EXTERNAL:
                return self._outcome(OK, self.policy.external, None)
            if mech == PLAIN:
                parts = resp.split(b"\0")
                if len(parts) != 3:
                    return self._outcome(AUTH, None, "malformed PLAIN response")
                user, password = parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
                busy = self._throttled(user)
                if busy:
                    return busy
                # checking costs a PBKDF2 (~0.1 s): the I/O edge runs it off the event loop; an
                # unknown user's password is checked against a decoy, the same work, and fails
                self.check = (self._secret(user), password, user)
                return b""
            return self._scram_first(resp)
        if code == RESPONSE and self.mechanism == SCRAM and self._scram is not None:
            return self._scram_final(_bytes(_field(fields, 0)))
        raise SaslError(f"unexpected SASL frame 0x{code:x} in the exchange")

    def _throttled(self, user: str) -> bytes:
        """The outcome for a login that must wait (too many failures), else nothing."""
        self.login = user
        wait = self.policy.throttle(user) if self.policy.throttle is not None else 0.0
        if wait <= 0:
            return b""
        self.throttled = True
        return self._outcome(SYS_TEMP, None, f"too many failed logins for {user!r} or from this address: "
                                             f"try again in {wait:.0f} s")

    def _secret(self, user: str) -> ScramSecret:
        """The user's secret, or for an unknown user a decoy that costs and looks the same."""
        secret = self.policy.secrets(user)
        self._known = secret is not None
        if secret is not None:
            return secret
        if self.policy.decoy is not None:
            return self.policy.decoy(user)
        salt = hmac.digest(_DECOY_KEY, user.encode(), "sha256")[:16]
        return ScramSecret(salt, 100_000, os.urandom(32), os.urandom(32))

    def _scram_first(self, resp: bytes) -> bytes:
        msg = resp.decode(errors="replace")
        if not msg.startswith(("n,", "y,")):
            return self._outcome(AUTH, None, "SCRAM channel binding is not supported")
        bare = msg.split(",", 2)[2] if msg.count(",") >= 2 else ""
        attrs = _scram_attrs(bare)
        user, cnonce = _saslname(attrs.get("n", "")), attrs.get("r", "")
        if not user or not cnonce:
            return self._outcome(AUTH, None, "malformed SCRAM client-first message")
        busy = self._throttled(user)
        if busy:
            return busy
        secret = self._secret(user)  # (an unknown user gets a challenge like any other, and fails later)
        user_known = self._known
        nonce = cnonce + base64.b64encode(os.urandom(18)).decode()
        first = f"r={nonce},s={base64.b64encode(secret.salt).decode()},i={secret.iterations}"
        self._scram = (user if user_known else "", bare, first, secret)
        return encode_frame(CHALLENGE, [first.encode()])

    def _scram_final(self, resp: bytes) -> bytes:
        assert self._scram is not None
        user, bare, first, secret = self._scram
        msg = resp.decode(errors="replace")
        attrs = _scram_attrs(msg)
        without_proof = msg.rsplit(",p=", 1)[0]
        if attrs.get("r") != _scram_attrs(first).get("r") or "p" not in attrs:
            return self._outcome(AUTH, None, "SCRAM nonce mismatch or no proof")
        auth = f"{bare},{first},{without_proof}".encode()
        signature = hmac.digest(secret.stored_key, auth, "sha256")
        try:
            proof = base64.b64decode(attrs["p"], validate=True)
        except ValueError:
            return self._outcome(AUTH, None, "malformed SCRAM proof")
        if len(proof) != len(signature):
            return self._outcome(AUTH, None, "malformed SCRAM proof")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not user or not hmac.compare_digest(hashlib.sha256(client_key).digest(), secret.stored_key):
            return self._outcome(AUTH, None, f"wrong user name or password for {_saslname(_scram_attrs(bare).get('n', ''))!r}")
        server_sig = hmac.digest(secret.server_key, auth, "sha256")
        return self._outcome(OK, user, None, f"v={base64.b64encode(server_sig).decode()}".encode())


# ---------------------------------------------------------------------------------- client
class SaslClient:
    """Our client's side: picks the best mechanism the server offers that its credentials allow
    (EXTERNAL with a client certificate and no password, else SCRAM-SHA-256, else PLAIN over TLS,
    else ANONYMOUS), verifies the server's SCRAM signature, then hands over to AMQP."""

    def __init__(self, user: str | None, password: str | None, encrypted: bool, certificate: bool) -> None:
        self.user = user
        self.password = password
        self.encrypted = encrypted
        self.certificate = certificate
        self.reader = FrameReader()
        self.header_seen = False
        self.done = False
        self.ok = False
        self.failed: str | None = None
        self.mechanism: str | None = None
        self.amqp = b""
        self._scram: tuple[str, str] | None = None  # (client-first-bare, nonce)
        self._server_sig: bytes | None = None
        self._pending = b""

    def start(self) -> bytes:
        return SASL_HEADER

    def receive(self, data: bytes) -> bytes:
        if self.done:
            self.amqp += data
            return b""
        if not self.header_seen:
            self._pending += data
            if len(self._pending) < 8:
                return b""
            head, data = self._pending[:8], self._pending[8:]
            self._pending = b""
            if head != SASL_HEADER:
                raise SaslError(f"the server answered {head!r}, not the SASL header")
            self.header_seen = True
        self.reader.feed(data)
        out = []
        while not self.done and (fr := self.reader.frame()) is not None:
            out.append(self._frame(*fr))
        if self.done:
            self.amqp += bytes(self.reader.buf)
            self.reader.buf.clear()
        return b"".join(out)  # (after the outcome, AMQP goes on with the engine's own header)

    def _choose(self, offered: list[str]) -> str | None:
        if self.certificate and self.password is None and EXTERNAL in offered:
            return EXTERNAL
        if self.user is not None and self.password is not None:
            if SCRAM in offered:
                return SCRAM
            if PLAIN in offered and self.encrypted:
                return PLAIN
            return None
        return ANONYMOUS if ANONYMOUS in offered else None

    def _frame(self, code: int, fields: list[Any]) -> bytes:
        if code == MECHANISMS and self.mechanism is None:
            raw = _field(fields, 0)
            if isinstance(raw, Array):
                offered = [str(m) for m in raw.elements]
            elif isinstance(raw, list | tuple):
                offered = [str(m) for m in raw]
            else:
                offered = [] if raw is None else [str(raw)]
            mech = self._choose(offered)
            if mech is None:
                self.done, self.failed = True, f"no mechanism the server offers ({', '.join(offered)}) fits " \
                    f"the credentials given"
                return b""
            self.mechanism = mech
            if mech == EXTERNAL:
                return encode_frame(INIT, [symbol(mech), b""])
            if mech == ANONYMOUS:
                return encode_frame(INIT, [symbol(mech), b"anonymous"])
            assert self.user is not None and self.password is not None
            if mech == PLAIN:
                return encode_frame(INIT, [symbol(mech), b"\0" + self.user.encode() + b"\0" + self.password.encode()])
            nonce = base64.b64encode(os.urandom(18)).decode()
            name = self.user.replace("=", "=3D").replace(",", "=2C")
            bare = f"n={name},r={nonce}"
            self._scram = (bare, nonce)
            return encode_frame(INIT, [symbol(mech), f"n,,{bare}".encode()])
        if code == CHALLENGE and self.mechanism == SCRAM and self._scram is not None and self._server_sig is None:
            bare, nonce = self._scram
            first = _bytes(_field(fields, 0)).decode(errors="replace")
            attrs = _scram_attrs(first)
            if not attrs.get("r", "").startswith(nonce):
                raise SaslError("the server's SCRAM nonce does not extend ours")
            salt, iterations = base64.b64decode(attrs.get("s", "")), int(attrs.get("i", "0"))
            if iterations < 4096:
                raise SaslError(f"SCRAM iteration count {iterations} is below 4096")
            assert self.password is not None
            salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(), salt, iterations)
            client_key = hmac.digest(salted, b"Client Key", "sha256")
            without_proof = f"c=biws,r={attrs['r']}"
            auth = f"{bare},{first},{without_proof}".encode()
            signature = hmac.digest(hashlib.sha256(client_key).digest(), auth, "sha256")
            proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
            self._server_sig = hmac.digest(hmac.digest(salted, b"Server Key", "sha256"), auth, "sha256")
            return encode_frame(RESPONSE, [f"{without_proof},p={base64.b64encode(proof).decode()}".encode()])
        if code == OUTCOME:
            self.done = True
            outcome = int(_field(fields, 0) or 0)
            if outcome != OK:
                self.failed = f"authentication failed (SASL outcome {outcome}, mechanism {self.mechanism})"
                return b""
            if self.mechanism == SCRAM:
                extra = _bytes(_field(fields, 1)).decode(errors="replace")
                v = _scram_attrs(extra).get("v")
                if self._server_sig is None or v is None or \
                        not hmac.compare_digest(base64.b64decode(v), self._server_sig):
                    self.failed = "the server did not prove it knows the password (SCRAM server signature)"
                    return b""
            self.ok = True
            return b""
        raise SaslError(f"unexpected SASL frame 0x{code:x}")
