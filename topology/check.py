"""`oncemesh check TOPOLOGY`: everything a router of the mesh would load, checked before deploying.

The topology goes through the router's own loader (topology/load.py), the users file through
router/users.py, the policy through router/policy.py, every TLS file through common/tls.py's
`make_context` (what the router does at start and on SIGHUP): what they refuse is an error here.
Then what the router would find out only later, from a peer or a client, is checked with the
`cryptography` library: certificates expired or about to, chains to the CAs the peers trust,
the names the mesh needs (a router's certificate must name its id: common/tls.py `peer_names`),
keys that do not match, ports that are not free on this host. Each finding says where (file,
line or key), what is wrong and what to do.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import errno
import ipaddress
import socket
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID

from ..common.tls import TlsConfigError, TlsFiles, make_context, peer_names, router_uri
from ..router.config import RouterConfig, parse_hostport
from ..router.policy import Policy, PolicyError, load_policy
from ..router.users import UsersFileError, load_users
from .load import TopologyError, _LineIndex, load_topology
from .model import Topology

EXPIRY_WARNING_DAYS = 30
ERROR, WARNING, NOTE = "error", "warning", "note"


@dataclass(frozen=True, slots=True)
class Finding:
    level: str  # error | warning | note
    where: str  # file[:line] and key
    message: str  # what is wrong, and what to do

    def __str__(self) -> str:
        return f"{self.level.upper():7} {self.where}: {self.message}"


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    checked: set[str] = field(default_factory=set)  # files read

    def add(self, level: str, where: str, message: str) -> None:
        f = Finding(level, where, message)
        if f not in self.findings:
            self.findings.append(f)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]


# ---------------------------------------------------------------------- the topology and its settings
class _Settings:
    """Where each router's settings come from, for messages: file:line and the key's table."""

    def __init__(self, topo: Topology, path: Path) -> None:
        self.topo = topo
        self.path = path
        try:
            self.lines: _LineIndex | None = _LineIndex(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, IndexError, RecursionError):
            self.lines = None

    def where(self, rid: str | None, key: str) -> str:
        own = rid is not None and key in self.topo.routers[rid].settings
        kp: tuple[str, ...] = ("routers", rid, "settings", key) if own and rid is not None else ("defaults", key)
        line = self.lines.line(kp) if self.lines is not None else 1
        table = f"[routers.{rid}.settings]" if own else "[defaults]"
        return f"{self.path}:{line} {table} {key}"

    def file(self, rid: str, key: str) -> Path | None:
        """A file setting as the router resolves it (relative to the topology's directory)."""
        value = self.topo.router_settings(rid).get(key)
        return self.path.parent / str(value) if value else None


def check(topology: Path, policy: Path | None = None, users: Path | None = None,
          mesh_tls_dir: Path | None = None, ports: bool = True, now: datetime.datetime | None = None,
          router: str | None = None, client_tls: bool = False) -> Report:
    """Every problem a router of `topology` would meet with these files, at once. `router`: only
    what that router loads (one host of a mesh, which holds only its own key), and whether its
    certificate chains to its neighbours' mesh CA files where they are readable here. `client_tls`:
    `oncemesh up --client-tls` makes the client-listener certificates the topology does not name."""
    now = now or datetime.datetime.now(datetime.UTC)
    rep = Report()
    try:
        topo = load_topology(topology)
    except TopologyError as exc:
        for p in exc.problems:
            rep.add(ERROR, f"{exc.source}:{p.line}", p.message)
        return rep
    rep.checked.add(str(topology))
    if router is not None and router not in topo.routers:
        rep.add(ERROR, str(topology), f"no router {router!r} in the topology (routers: {', '.join(sorted(topo.routers))})")
        return rep
    st = _Settings(topo, topology)
    certs = _Certs(rep, now)
    policies: dict[Path, Policy] = {}
    users_files: dict[Path, dict[str, Any]] = {}
    for rid in sorted(topo.routers):
        if router is not None and rid != router:
            continue
        settings = topo.router_settings(rid)
        cfg = RouterConfig(id=rid)
        cfg.apply(settings)  # (the loader checked every name and type)
        _check_http(rep, st, rid, settings)
        # (with client_tls, up gives a router without tls_cert a certificate, and its CA for client certificates)
        _check_client_auth(rep, st, rid, cfg, users, certs, users_files, made_tls=client_tls and not cfg.tls_cert)
        pfile = policy or st.file(rid, "policy_file")
        if pfile is not None:
            where = "--policy" if policy else st.where(rid, "policy_file")
            loaded = _load_policy(rep, pfile, where, policies)
            ufile = users or st.file(rid, "users_file")
            if loaded is not None and ufile is not None and ufile in users_files:
                _cross_check(rep, pfile, loaded, users_files[ufile])
    _check_mesh_tls(rep, st, topo, certs, mesh_tls_dir, router)
    if ports:
        _check_ports(rep, topo, st, router)
    if policy is not None and not any(f.where.startswith("--policy") for f in rep.findings) and policy not in policies:
        _load_policy(rep, policy, "--policy", policies)
    if users is not None and users not in users_files:
        _load_users(rep, users, "--users", users_files)
    return rep


def _check_http(rep: Report, st: _Settings, rid: str, settings: dict[str, Any]) -> None:
    value = settings.get("http_listen")
    if value:
        try:
            parse_hostport(str(value))
        except ValueError as exc:
            rep.add(ERROR, st.where(rid, "http_listen"), f"router {rid}: {exc}; give HOST:PORT, e.g. 127.0.0.1:9090")
    else:
        rep.add(NOTE, f"router {rid}", "no http_listen: no /metrics, /healthz, /readyz or console for it")


def _check_client_auth(rep: Report, st: _Settings, rid: str, cfg: RouterConfig, users: Path | None,
                       certs: _Certs, users_files: dict[Path, dict[str, Any]], made_tls: bool = False) -> None:
    ufile = users or st.file(rid, "users_file")
    if ufile is not None:
        _load_users(rep, ufile, "--users" if users else st.where(rid, "users_file"), users_files)
    if made_tls:
        pass  # (made by `up --client-tls`: nothing to read yet)
    elif cfg.tls_cert or cfg.tls_key:
        cert, key = st.file(rid, "tls_cert"), st.file(rid, "tls_key")
        ca = st.file(rid, "tls_ca")
        where = st.where(rid, "tls_cert" if cfg.tls_cert else "tls_key")
        files = TlsFiles(cert, key, ca, cfg.tls_verify_clients)
        if certs.context(files, where, server=True):
            spec = st.topo.routers[rid]
            certs.leaf(files, where, what=f"router {rid}'s client listener", host=spec.host)
    elif cfg.tls_verify_clients:
        rep.add(ERROR, st.where(rid, "tls_verify_clients"), f"router {rid}: client certificates need a TLS "
                "listener: set tls_cert and tls_key (and tls_ca, the CAs of the clients' certificates)")
    elif cfg.tls_ca:
        rep.add(WARNING, st.where(rid, "tls_ca"), f"router {rid}: tls_ca is unused without tls_cert/tls_key")
    if not (ufile or cfg.tls_verify_clients or cfg.allow_anonymous):
        rep.add(NOTE, f"router {rid}", "no client authentication (users_file, tls_verify_clients) and no "
                "allow_anonymous: `oncemesh router` refuses to start without --allow-anonymous (`oncemesh up` "
                "adds it: an open mesh for trying things out)")
    if ufile is not None and not (cfg.tls_cert or made_tls):
        rep.add(NOTE, f"router {rid}", "passwords over plain TCP: only SCRAM-SHA-256 is offered (PLAIN needs TLS; "
                "set tls_cert/tls_key so that clients' traffic is encrypted too)")


def _load_users(rep: Report, path: Path, where: str, seen: dict[Path, dict[str, Any]]) -> None:
    if path in seen:
        return
    try:
        seen[path] = dict(load_users(path))
        rep.checked.add(str(path))
    except UsersFileError as exc:
        rep.add(ERROR, where, f"{exc} (make or fix it with `oncemesh user add NAME --users-file {path}`)")
        return
    _private(rep, path, "the users file (SCRAM secrets)")


def _load_policy(rep: Report, path: Path, where: str, seen: dict[Path, Policy]) -> Policy | None:
    if path in seen:
        return seen[path]
    try:
        pol = load_policy(path)
    except PolicyError as exc:
        for problem in exc.problems:
            rep.add(ERROR, f"{path} ({where})" if where != "--policy" else str(path), problem)
        return None
    rep.checked.add(str(path))
    seen[path] = pol
    return pol


def _cross_check(rep: Report, path: Path, pol: Policy, users: dict[str, Any]) -> None:
    """Names in the policy that the users file does not know: a typo grants nothing to anyone."""
    groups = {g for u in users.values() for g in u.groups}
    for name in sorted(set(pol.users) - set(users)):
        rep.add(WARNING, f"{path} [users.{name}]", f"no user {name!r} in the users file: these rules apply to nobody")
    for name in sorted(set(pol.groups) - groups):
        rep.add(WARNING, f"{path} [groups.{name}]", f"no user of the users file is in group {name!r} "
                "(oncemesh user add NAME --groups ...)")


def _private(rep: Report, path: Path, what: str) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        rep.add(WARNING, str(path), f"{what} is readable by others (mode {stat.S_IMODE(mode):o}): chmod 600 {path}")


# ---------------------------------------------------------------------- certificates
class _Certs:
    """TLS files: the router's loader first (what it accepts), then what it would learn later."""

    def __init__(self, rep: Report, now: datetime.datetime) -> None:
        self.rep = rep
        self.now = now
        self._bundles: dict[Path, list[x509.Certificate]] = {}

    def context(self, files: TlsFiles, where: str, server: bool) -> bool:
        """Would the router load these files? (common/tls.py, as at start and on SIGHUP)"""
        try:
            make_context(files, server=server)
        except TlsConfigError as exc:
            self.rep.add(ERROR, where, f"{exc}")
            return False
        for p in (files.cert, files.key, files.ca):
            if p is not None:
                self.rep.checked.add(str(p))
        if files.key is not None:
            _private(self.rep, files.key, "the private key")
        if files.ca is not None:
            self.bundle(files.ca, where)
        return True

    def bundle(self, path: Path, where: str) -> list[x509.Certificate]:
        if path not in self._bundles:
            certs = _read_certs(path)
            for c in certs:
                self._validity(c, f"{where} ({path})", f"CA {_subject(c)}")
            self._bundles[path] = certs
        return self._bundles[path]

    def leaf(self, files: TlsFiles, where: str, what: str, names: Iterable[str] = (), host: str | None = None) -> \
            list[x509.Certificate]:
        """Check a certificate chain file: dates, chain to `files.ca`, the names it must carry."""
        assert files.cert is not None
        chain = _read_certs(files.cert)
        if not chain:
            return chain
        leaf = chain[0]
        self._validity(leaf, f"{where} ({files.cert})", what)
        for c in chain[1:]:
            self._validity(c, f"{where} ({files.cert})", f"intermediate {_subject(c)}")
        if files.ca is not None:
            ca = self.bundle(files.ca, where)
            if not chains_to(chain, ca):
                self.rep.add(ERROR, where, f"{what}: certificate {files.cert} ({_subject(leaf)}, issued by "
                             f"{_issuer(leaf)}) was not issued by a CA in {files.ca}: peers that trust that file "
                             f"refuse it in the TLS handshake. Issue it from that CA, or add its CA to the bundle")
        for name in names:
            if name not in cert_names(leaf):
                self.rep.add(ERROR, where, f"{what}: certificate {files.cert} does not name {name!r} (it names "
                             f"{', '.join(sorted(cert_names(leaf))) or 'nothing'}); the peers refuse the id it "
                             f"claims. Issue it with CN={name} or SAN DNS:{name} or URI:{router_uri(name)}")
        if host is not None and host not in ("0.0.0.0", "::", "") and not matches_host(leaf, host):
            self.rep.add(WARNING, where, f"{what}: certificate {files.cert} does not name the listener's host "
                         f"{host!r}: clients that check the host name (ours do) refuse it; add it as a "
                         f"subject alternative name")
        return chain

    def _validity(self, c: x509.Certificate, where: str, what: str) -> None:
        after, before = c.not_valid_after_utc, c.not_valid_before_utc
        if after <= self.now:
            self.rep.add(ERROR, where, f"{what} expired on {after:%Y-%m-%d %H:%M} UTC: renew it (then SIGHUP the "
                         f"routers that use it)")
        elif after - self.now < datetime.timedelta(days=EXPIRY_WARNING_DAYS):
            self.rep.add(WARNING, where, f"{what} expires on {after:%Y-%m-%d} ({(after - self.now).days} days): "
                         f"renew it soon (then SIGHUP)")
        if before > self.now:
            self.rep.add(ERROR, where, f"{what} is not valid before {before:%Y-%m-%d %H:%M} UTC (a clock "
                         f"out of step, or issued for later)")


def _read_certs(path: Path) -> list[x509.Certificate]:
    try:
        return list(x509.load_pem_x509_certificates(path.read_bytes()))
    except (OSError, ValueError):
        return []  # (make_context said what is wrong with it)


def _subject(c: x509.Certificate) -> str:
    return c.subject.rfc4514_string() or "(no subject)"


def _issuer(c: x509.Certificate) -> str:
    return c.issuer.rfc4514_string() or "(no issuer)"


def chains_to(chain: list[x509.Certificate], cas: list[x509.Certificate]) -> bool:
    """Does the chain (leaf first, then intermediates) lead to one of `cas` by signatures?"""
    pool = chain[1:] + cas
    cert = chain[0]
    for _ in range(len(pool) + 1):
        if any(_issued_by(cert, ca) for ca in cas):
            return True
        parent = next((c for c in pool if c is not cert and _issued_by(cert, c)), None)
        if parent is None or parent is cert:
            return False
        cert = parent
    return False


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
        return True
    except (ValueError, TypeError, InvalidSignature):  # (another issuer's name, key type or signature)
        return False


def cert_names(c: x509.Certificate) -> set[str]:
    """The names a peer certificate proves, by the router's own rule (common/tls.py peer_names)."""
    subject = tuple((("commonName", str(a.value)),) for a in c.subject.get_attributes_for_oid(NameOID.COMMON_NAME))
    alt: list[tuple[str, str]] = []
    try:
        san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        alt = [("DNS", n) for n in san.get_values_for_type(x509.DNSName)]
        alt += [("URI", n) for n in san.get_values_for_type(x509.UniformResourceIdentifier)]
    except x509.ExtensionNotFound:
        pass
    return peer_names({"subject": subject, "subjectAltName": tuple(alt)})


def matches_host(c: x509.Certificate, host: str) -> bool:
    """Would a client's host-name check accept this certificate for `host` (DNS or IP SANs, and
    the common name only without SANs, as OpenSSL does)?"""
    try:
        san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return host in {str(a.value) for a in c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)}
    try:
        ip = ipaddress.ip_address(host)
        return ip in san.get_values_for_type(x509.IPAddress)
    except ValueError:
        pass
    for name in san.get_values_for_type(x509.DNSName):
        if name == host or (name.startswith("*.") and host.split(".", 1)[-1] == name[2:] and "." in host):
            return True
    return False


def _check_mesh_tls(rep: Report, st: _Settings, topo: Topology, certs: _Certs, mesh_tls_dir: Path | None,
                    only: str | None) -> None:
    """Each router's mesh certificate names its id, and chains to the mesh CA of every neighbour
    (`only`: that router's files, and its neighbours' CA files where readable here)."""
    if len(topo.routers) < 2:
        return
    files: dict[str, TlsFiles] = {}
    wheres: dict[str, str] = {}
    others_ca: dict[str, Path] = {}  # (with `only`) a neighbour's mesh CA file, if it is readable here
    for rid in sorted(topo.routers):
        settings = topo.router_settings(rid)
        if only is not None and rid != only:
            ca = st.file(rid, "mesh_tls_ca") or (mesh_tls_dir / "ca.pem" if mesh_tls_dir is not None else None)
            if ca is not None and ca.is_file():
                others_ca[rid] = ca
            continue
        if _truthy(settings.get("insecure_mesh")):
            rep.add(WARNING, st.where(rid, "insecure_mesh"), f"router {rid}: insecure_mesh: any process that "
                    "reaches its inter-router port can join as a router and forge acknowledgements")
            continue
        cert, key, ca = (st.file(rid, k) for k in ("mesh_tls_cert", "mesh_tls_key", "mesh_tls_ca"))
        where = st.where(rid, "mesh_tls_cert")
        if mesh_tls_dir is not None:
            cert = cert or mesh_tls_dir / f"{rid}.pem"
            key = key or mesh_tls_dir / f"{rid}.key"
            ca = ca or mesh_tls_dir / "ca.pem"
            if not settings.get("mesh_tls_cert"):
                where = f"--mesh-tls-dir {mesh_tls_dir}"
        if not (cert or key or ca):
            rep.add(NOTE, f"router {rid}", "no mesh TLS files: `oncemesh up` makes a private CA by itself; "
                    "on separate hosts name mesh_tls_cert/mesh_tls_key/mesh_tls_ca or give each router "
                    "--mesh-tls-dir (docs/security.md); `oncemesh check --mesh-tls-dir DIR` checks those")
            continue
        missing = [k for k, v in (("mesh_tls_cert", cert), ("mesh_tls_key", key), ("mesh_tls_ca", ca)) if v is None]
        if missing:
            rep.add(ERROR, where, f"router {rid}: {', '.join(missing)} not set: the router refuses to start "
                    f"(the mesh is closed: it needs its certificate, its key and the mesh CA)")
            continue
        tf = TlsFiles(cert, key, ca)
        if certs.context(tf, where, server=True):
            files[rid], wheres[rid] = tf, where
            certs.leaf(tf, where, f"router {rid}'s mesh certificate", names=[rid])
    for link in topo.links:
        for a, b in ((link.a, link.b), (link.b, link.a)):
            ca_b = files[b].ca if b in files else others_ca.get(b)
            if a in files and ca_b is not None:
                cert_a = files[a].cert
                chain = _read_certs(cert_a) if cert_a is not None else []
                if chain and not chains_to(chain, certs.bundle(ca_b, wheres.get(b, f"router {b}'s mesh_tls_ca"))):
                    rep.add(ERROR, wheres[a], f"link {link}: router {a}'s mesh certificate {files[a].cert} is not "
                            f"issued by a CA in router {b}'s mesh CA file {ca_b}: {b} refuses {a} in the TLS "
                            f"handshake. Use one mesh CA (or put both CAs in every bundle)")


def _truthy(v: Any) -> bool:
    return v is True or str(v).strip().lower() in ("true", "yes", "1", "on")


# ---------------------------------------------------------------------- ports
def _check_ports(rep: Report, topo: Topology, st: _Settings, only: str | None) -> None:
    """Listeners with a fixed port whose host is this machine: can they bind now? (A running router
    holds its own: the finding says so.) Hosts of other machines are skipped."""
    for rid in sorted(topo.routers):
        if only is not None and rid != only:
            continue
        spec = topo.routers[rid]
        addrs = [("listen", spec.host, spec.port)]
        if len(topo.routers) > 1:
            addrs.append(("inter_router", spec.inter_host, spec.inter_port))
        http = topo.router_settings(rid).get("http_listen")
        if http:
            with contextlib.suppress(ValueError):  # (said by _check_http)
                addrs.append(("http_listen", *parse_hostport(str(http))))
        for what, host, port in addrs:
            if port == 0:
                continue
            problem = bind_problem(host, port)
            if problem is not None:
                line = st.lines.line(("routers", rid, what)) if st.lines and what != "http_listen" else None
                loc = f"{st.path}:{line}" if line else f"router {rid}"
                rep.add(WARNING, f"{loc} {what}", f"router {rid}: {host}:{port} {problem}")


def bind_problem(host: str, port: int) -> str | None:
    """None when a listener could bind HOST:PORT here now (or the host is not this machine)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"does not resolve on this machine ({exc.strerror}); fine if it names another host"
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as asyncio's listeners)
        try:
            s.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return None  # another machine's address
            if exc.errno == errno.EADDRINUSE:
                return "is in use on this machine (a router already running there, or another program)"
            if exc.errno == errno.EACCES:
                return "cannot be bound here without privileges (ports below 1024)"
            return f"cannot be bound: {exc.strerror}"
    return None


# ---------------------------------------------------------------------- command line
def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check", help="check a topology and every file it names before deploying",
        description="Check everything a router of the mesh would load, as it would load it: the topology\n"
                    "file, the files it names (relative to it), certificates (readable, key matches, not\n"
                    "expired, chain to the CA the peers trust, the router id the mesh needs), ports (parsed;\n"
                    "free on this host), the users file and the policy. Every problem is listed with where\n"
                    "it is and what to do.\n\n"
                    "Exit status: 0 no errors (warnings and notes may be listed), 1 errors (or warnings with\n"
                    "--strict), 2 usage.\n\n"
                    "Examples:\n"
                    "  oncemesh check /etc/oncemesh/mesh.toml\n"
                    "  oncemesh check mesh.toml --mesh-tls-dir /etc/oncemesh/pki --no-ports\n"
                    "  oncemesh check /etc/oncemesh/mesh.toml --router r1   (on r1's host: the systemd unit does)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topology", type=Path, help="the topology file (TOML)")
    p.add_argument("--policy", type=Path, default=None, help="a policy file to check (default: the policy_file "
                                                             "the topology names)")
    p.add_argument("--users", type=Path, default=None, help="a users file to check (default: the users_file "
                                                            "the topology names)")
    p.add_argument("--mesh-tls-dir", type=Path, default=None,
                   help="the directory routers get with --mesh-tls-dir (ca.pem, ID.pem, ID.key)")
    p.add_argument("--router", metavar="ID", default=None,
                   help="check only what router ID loads (on one host of a mesh, which holds only its own key); "
                        "its certificate is still checked against its neighbours' mesh CA files where readable")
    p.add_argument("--no-ports", action="store_true", help="do not try to bind the listeners' ports here")
    p.add_argument("--strict", action="store_true", help="warnings count as errors (exit 1)")
    p.add_argument("-q", "--quiet", action="store_true", help="errors and warnings only (no notes)")
    p.set_defaults(func=cmd_check)


def grouped(findings: list[Finding]) -> list[Finding]:
    """Notes said of several routers alike, once: `routers A, B, C: ...`."""
    out: list[Finding] = []
    notes: dict[str, list[str]] = {}
    for f in findings:
        if f.level == NOTE and f.where.startswith("router "):
            notes.setdefault(f.message, []).append(f.where.removeprefix("router "))
        else:
            out.append(f)
    for message, ids in notes.items():
        out.append(Finding(NOTE, ("routers " if len(ids) > 1 else "router ") + ", ".join(ids), message))
    return out


def cmd_check(args: argparse.Namespace) -> int:
    rep = check(args.topology, args.policy, args.users, args.mesh_tls_dir, ports=not args.no_ports,
                router=args.router)
    order = {ERROR: 0, WARNING: 1, NOTE: 2}
    for f in sorted(grouped(rep.findings), key=lambda f: order[f.level]):
        if not (args.quiet and f.level == NOTE):
            print(str(f), file=sys.stderr if f.level == ERROR else sys.stdout)
    errors, warnings = len(rep.errors), sum(f.level == WARNING for f in rep.findings)
    bad = errors or (args.strict and warnings)
    print(f"oncemesh check: {args.topology}: {errors} error(s), {warnings} warning(s); "
          f"{len(rep.checked)} file(s) read" + ("" if bad else ": OK"), file=sys.stderr if bad else sys.stdout)
    return 1 if bad else 0
