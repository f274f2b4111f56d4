"""Shared by the python-qpid-proton publisher and subscriber of the foreign-client tests: arguments,
the JSON-lines report, connection options (failover list, SASL PLAIN, TLS). Plain Proton
(`proton.reactor.Container`); nothing from oncemesh."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from proton import SSLDomain
from proton.reactor import Backoff


def parser(what: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=what)
    p.add_argument("--url", required=True, help="comma-separated router URLs: the failover list")
    p.add_argument("--topic", required=True)
    p.add_argument("--container", required=True, help="container id")
    p.add_argument("--link", required=True, help="link name")
    p.add_argument("--report", required=True, help="JSON-lines report file")
    p.add_argument("--second", action="store_true", help="receiver-settle-mode second")
    p.add_argument("--user")
    p.add_argument("--password")
    p.add_argument("--ca", help="CA file for amqps:// URLs")
    p.add_argument("--mech", default="PLAIN", help="SASL mechanism with --user (default PLAIN)")
    return p


class Report:
    """One JSON object per line, flushed at once: the test reads the file while the client runs,
    and a killed client must leave every line it wrote."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "a")  # noqa: SIM115 (open for the process's life)

    def line(self, ev: str, **fields: Any) -> None:
        self.f.write(json.dumps({"ev": ev, "ts": time.time(), **fields}) + "\n")
        self.f.flush()


def connect_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    """The URL list is the failover list: Proton's reconnect tries them in turn."""
    kw: dict[str, Any] = {"urls": a.url.split(","), "reconnect": Backoff(initial=0.1, factor=2, max_delay=1),
                          "heartbeat": 2}
    if a.user:
        kw.update(user=a.user, password=a.password, allowed_mechs=a.mech, sasl_enabled=True)
    if a.ca:
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(a.ca)
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
        kw["ssl_domain"] = domain
    return kw
