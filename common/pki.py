"""A private certificate authority for a mesh: what `oncemesh up` makes by itself, so that a local
mesh is closed without anything to configure (docs/security.md).

Files in one directory: `ca.pem` / `ca.key` (the mesh CA), `<id>.pem` / `<id>.key` per router (its
certificate names the router id as common name, DNS name and URI `urn:oncemesh:router:<id>`).
Keys are EC P-256, written 0600; existing files are kept (a restart keeps its identity). Uses the
`cryptography` library (pyca), the well-kept standard for X.509 in Python.

With `oncemesh up --client-tls`, the client side in another directory (`make_client_pki`): a CA of
its own (`ca.pem`, the file clients trust: `--ca`), a certificate per router's client listener
(`routers/<id>.pem` / `.key`, naming the host names clients dial: 127.0.0.1, ::1, localhost, and the
listener's host) and, asked for by name, client certificates (`users/<name>.pem` / `.key`, the name
as common name: the identity SASL EXTERNAL gives). Never the mesh CA: a router trusts every
certificate of the mesh CA as a possible router, so a client's certificate from it could claim a
router id.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .tls import router_uri

LOCAL_NAMES = ("127.0.0.1", "::1", "localhost")  # what a client on this machine dials

VALID_DAYS = 825


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def make_ca(directory: Path, name: str = "oncemesh mesh CA") -> tuple[Path, Path]:
    """The CA in `directory` (made if absent). Returns (ca.pem, ca.key)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "ca.pem", directory / "ca.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def issue(directory: Path, stem: str, names: Iterable[str], common_name: str | None = None,
          ca_dir: Path | None = None, valid_days: float = VALID_DAYS, start_days: float = 0.0) -> tuple[Path, Path]:
    """A certificate and key `<stem>.pem` / `<stem>.key` in `directory`, signed by the CA in
    `ca_dir` (default: `directory`), naming `names` (IP addresses, URIs when they contain ':', else
    DNS names), for both server and client use, valid from `start_days` from now (negative: in the
    past) for `valid_days`. Replaces files of that stem."""
    ca_dir = ca_dir or directory
    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    ca_key = _load_key(ca_dir / "ca.key")
    names = list(names)
    key = ec.generate_private_key(ec.SECP256R1())
    cn = common_name if common_name is not None else (names[0] if names else stem)
    alt: list[x509.GeneralName] = [_general_name(n) for n in names]
    start = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=start_days)
    builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(start - datetime.timedelta(minutes=5))
               .not_valid_after(start + datetime.timedelta(days=valid_days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.UniformResourceIdentifier(name) if ":" in name else x509.DNSName(name)


def make_mesh_pki(directory: Path, router_ids: Iterable[str]) -> Path:
    """The mesh CA and a certificate per router in `directory`, made where absent. Returns it."""
    make_ca(directory)
    for rid in router_ids:
        if not ((directory / f"{rid}.pem").exists() and (directory / f"{rid}.key").exists()):
            issue(directory, rid, [rid, router_uri(rid)], common_name=rid)
    return directory


def _names_of(cert_path: Path) -> set[str]:
    """The subject alternative names (IP, DNS, URI) of a certificate, as text; empty if unreadable."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return set()
    return {str(n.value) for n in alt}


def make_client_pki(directory: Path, listeners: dict[str, Iterable[str]]) -> Path:
    """The client side of a local mesh's TLS in `directory` (made where absent): the client CA and,
    per router id in `listeners`, a listener certificate naming LOCAL_NAMES and the given host names
    (wildcards such as 0.0.0.0 left out). A certificate that no longer names them all (the topology
    moved a listener) is issued again. Returns `directory`."""
    make_ca(directory, "oncemesh client CA")
    routers = directory / "routers"
    for rid, hosts in listeners.items():
        names = list(dict.fromkeys([*LOCAL_NAMES, *(h for h in hosts if h not in ("", "0.0.0.0", "::"))]))
        cert = routers / f"{rid}.pem"
        if not (cert.exists() and (routers / f"{rid}.key").exists() and set(names) <= _names_of(cert)):
            issue(routers, rid, names, common_name=names[-1] if len(names) > len(LOCAL_NAMES) else "localhost",
                  ca_dir=directory)
    return directory


def make_client_cert(directory: Path, name: str) -> tuple[Path, Path]:
    """A client certificate for `name` (its common name: the identity SASL EXTERNAL gives) from the
    client CA in `directory`, `users/<name>.pem` / `.key`; an existing one is kept."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"{name!r} cannot name a certificate file (no '/', not empty, no leading '.')")
    users = directory / "users"
    cert, key = users / f"{name}.pem", users / f"{name}.key"
    if cert.exists() and key.exists():
        return cert, key
    return issue(users, name, [], common_name=name, ca_dir=directory)
