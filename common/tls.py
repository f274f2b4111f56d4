"""TLS at the I/O edge: contexts built from files, rebuilt on reload, and the names a peer's
certificate proves.

TLS runs in the event loop's own TLS layer (asyncio over Python's `ssl`, i.e. OpenSSL), under the
AMQP engine: Proton sees plain AMQP. A listener upgrades each accepted connection with the context
current at that moment (`listen(..., tls=...)` in common/engine.py), so a reload (SIGHUP) takes
new certificates, keys and trusted CAs for new connections while established ones keep theirs.
Retiring a certificate: remove its CA from the trusted file (or stop using its key) and reload.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("oncemesh.tls")


class TlsConfigError(ValueError):
    """A certificate, key or CA file that cannot be used, with what to do about it."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The files of one TLS endpoint. `cert`/`key`: our certificate chain (PEM) and its key;
    `ca`: the CAs we trust for the peer's certificate (PEM bundle); `verify_peer`: the peer must
    present a certificate signed by one of them (a server asks its clients for one)."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    verify_peer: bool = True

    def describe(self) -> str:
        return f"cert={self.cert} key={self.key} ca={self.ca} verify_peer={self.verify_peer}"


def make_context(files: TlsFiles, server: bool, check_hostname: bool = False) -> ssl.SSLContext:
    """A context for one side. A client checks the server's host name against its certificate
    only with `check_hostname` (applications connecting to a router by name); routers check the
    names that matter themselves (`peer_names`: a router id), since peers are often dialed by IP."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if not server:
        ctx.check_hostname = check_hostname and files.verify_peer
    if files.cert is not None or files.key is not None:
        if files.cert is None or files.key is None:
            raise TlsConfigError(f"a certificate needs its key and a key its certificate ({files.describe()})")
        try:
            ctx.load_cert_chain(str(files.cert), str(files.key))
        except FileNotFoundError as exc:
            # (ssl leaves exc.filename None: name the file that is missing)
            missing = exc.filename or next((p for p in (files.cert, files.key) if not p.exists()), files.cert)
            raise TlsConfigError(f"cannot read {missing}: no such file") from None
        except (ssl.SSLError, OSError) as exc:
            raise TlsConfigError(f"certificate {files.cert} with key {files.key}: {exc}") from None
    elif server:
        raise TlsConfigError("a TLS listener needs a certificate and its key")
    if files.ca is not None:
        try:
            ctx.load_verify_locations(cafile=str(files.ca))
        except FileNotFoundError:
            raise TlsConfigError(f"cannot read CA file {files.ca}: no such file") from None
        except (ssl.SSLError, OSError) as exc:
            raise TlsConfigError(f"CA file {files.ca}: {exc}") from None
    elif files.verify_peer:
        if server:
            raise TlsConfigError("verifying peers' certificates needs a CA file (ca)")
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if not ctx.check_hostname:
        ctx.verify_mode = ssl.CERT_REQUIRED if files.verify_peer else ssl.CERT_NONE
    return ctx


class TlsProvider:
    """The context for new connections of one endpoint, rebuilt from its files on `reload()`.
    A reload that fails keeps the context in use (and says why): a typo in a renewed file must
    not take a router off the network."""

    def __init__(self, files: TlsFiles, server: bool, what: str) -> None:
        self.files = files
        self.server = server
        self.what = what
        self._ctx = make_context(files, server)
        self.generation = 1

    def context(self) -> ssl.SSLContext:
        return self._ctx

    def reload(self) -> bool:
        try:
            ctx = make_context(self.files, self.server)
        except TlsConfigError as exc:
            log.error("tls.reload_failed endpoint=%s error=%s (the previous certificates stay in use)",
                      self.what, exc)
            return False
        self._ctx = ctx
        self.generation += 1
        log.info("tls.reloaded endpoint=%s generation=%d %s", self.what, self.generation, self.files.describe())
        return True


def peer_names(peercert: dict[str, Any] | None) -> set[str]:
    """The names a verified peer certificate carries: its subject's common name and its subject
    alternative names (DNS and URI). Empty for no (or an unverified) certificate."""
    if not peercert:
        return set()
    names: set[str] = set()
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.add(value)
    for kind, value in peercert.get("subjectAltName", ()):
        if kind in ("DNS", "URI"):
            names.add(value)
    return names


def peer_common_name(peercert: dict[str, Any] | None) -> str | None:
    """The subject common name of a verified peer certificate (a client's identity for SASL
    EXTERNAL), None without one."""
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def router_uri(router_id: str) -> str:
    """The subject alternative name (URI) that names a router in the certificates we make."""
    return f"urn:oncemesh:router:{router_id}"
