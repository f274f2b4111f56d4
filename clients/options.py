"""The security options every client command shares (put, get, subscribe, unsubscribe, stat), and
the credentials they give."""

from __future__ import annotations

import argparse
import getpass
import os
from pathlib import Path

from ..common.tls import TlsFiles


def security_arguments(p: argparse.ArgumentParser) -> None:
    """--user, --password-env, --ca, --cert, --key (put/get/subscribe/unsubscribe and stat)."""
    sec = p.add_argument_group("security (docs/security.md)")
    sec.add_argument("--user", default=None, help="log in as USER (SCRAM-SHA-256, or PLAIN over TLS); the "
                                                  "password from $ONCEMESH_PASSWORD (--password-env) or a prompt")
    sec.add_argument("--password-env", default="ONCEMESH_PASSWORD", metavar="VAR",
                     help="environment variable holding the password (default ONCEMESH_PASSWORD; "
                          "never on the command line, where other users could read it)")
    sec.add_argument("--ca", type=Path, default=None,
                     help="CA file (PEM) to trust for amqps:// routers (default: the system's)")
    sec.add_argument("--cert", type=Path, default=None,
                     help="client certificate (PEM), for routers that ask for one (SASL EXTERNAL without --user)")
    sec.add_argument("--key", type=Path, default=None, help="the client certificate's key (PEM)")


def client_credentials(args: argparse.Namespace) -> tuple[TlsFiles | None, str | None, str | None]:
    """(TLS files, user, password) from `security_arguments`: the password from the environment
    variable or, failing that, a prompt (never a command-line argument)."""
    password = None
    if args.user is not None:
        password = os.environ.get(args.password_env)
        if password is None:
            password = getpass.getpass(f"password for {args.user}: ")
    tls = TlsFiles(args.cert, args.key, args.ca) if (args.ca or args.cert or args.key) else None
    return tls, args.user, password
