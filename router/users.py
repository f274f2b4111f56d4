"""The users file: who may log in with a password, and their groups (docs/security.md).

JSON, written atomically with mode 0600; per user the SCRAM-SHA-256 secret of the password (salt,
iteration count, stored key, server key: enough to check a password or run SCRAM, never the
password) and a list of groups (for the authorization policy). `oncemesh user add/remove/list`
edits it; a router re-reads it on SIGHUP.

    {"version": 1, "users": {"alice": {"scram": {...}, "groups": ["ops"]}}, "decoy_key": "..."}

`decoy_key` (random, made by `user add`) keys the salts a router shows for user names the file does
not have: stable across restarts and across the routers that share the file, like a real user's.
"""


from __future__ import annotations

import argparse
import base64
import getpass
import hashlib
import hmac
import json
import logging
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..common.sasl import ScramSecret

log = logging.getLogger("oncemesh.users")
VERSION = 1
DEFAULT_ITERATIONS = 100_000


class UsersFileError(ValueError):
    """A users file that cannot be used, with what is wrong."""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    secret: ScramSecret
    groups: tuple[str, ...] = ()


def load_users(path: Path) -> dict[str, User]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsersFileError(f"users file {path} does not exist (create it: oncemesh user add NAME "
                             f"--users-file {path})") from None
    except (OSError, ValueError) as exc:
        raise UsersFileError(f"users file {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("users"), dict):
        raise UsersFileError(f"users file {path}: expected {{\"version\": {VERSION}, \"users\": {{...}}}}")
    users = {}
    for name, entry in doc["users"].items():
        try:
            users[name] = User(name, ScramSecret.from_json(entry["scram"]),
                               tuple(str(g) for g in entry.get("groups", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsersFileError(f"users file {path}: user {name!r}: bad entry ({exc})") from None
    return users


def load_decoy_key(path: Path, users: dict[str, User]) -> bytes:
    """The file's `decoy_key`; a file written before it had one: a key derived from its users'
    server keys (secret, and stable while the file is)."""
    try:
        key = json.loads(path.read_text()).get("decoy_key")
        if isinstance(key, str) and key:
            return base64.b64decode(key)
    except (OSError, ValueError, AttributeError):
        pass
    return hashlib.sha256(b"oncemesh-decoy\0" + b"".join(u.secret.server_key for u in
                                                          sorted(users.values(), key=lambda u: u.name))).digest()


def common_iterations(users: dict[str, User]) -> int:
    """The users' most common PBKDF2 iteration count (the larger one on a tie; the default for none):
    what a decoy shows, so that the count tells no real user from a made-up one."""
    counts = Counter(u.secret.iterations for u in users.values())
    if not counts:
        return DEFAULT_ITERATIONS
    return max(counts, key=lambda n: (counts[n], n))


def save_users(path: Path, users: dict[str, User]) -> None:
    key: str | None = None
    if path.exists():
        try:
            old = json.loads(path.read_text()).get("decoy_key")
            key = old if isinstance(old, str) and old else None
        except (OSError, ValueError, AttributeError):
            key = None
    doc = {"version": VERSION, "users": {u.name: {"scram": u.secret.to_json(), "groups": list(u.groups)}
                                         for u in sorted(users.values(), key=lambda u: u.name)},
           "decoy_key": key or base64.b64encode(os.urandom(32)).decode()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Users:
    """A router's view of its users file, re-read on `reload()` (a broken file keeps the old)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.users = load_users(path)
        self._decoy_key = load_decoy_key(path, self.users)
        self._decoy_iterations = common_iterations(self.users)

    def secret(self, name: str) -> ScramSecret | None:
        u = self.users.get(name)
        return u.secret if u is not None else None

    def decoy(self, name: str) -> ScramSecret:
        """The secret shown for a user name the file does not have: a salt stable per name, the
        users' most common iteration count, keys that match no password."""
        salt = hmac.digest(self._decoy_key, name.encode(), "sha256")[:16]
        return ScramSecret(salt, self._decoy_iterations, os.urandom(32), os.urandom(32))

    def groups(self, name: str) -> tuple[str, ...]:
        u = self.users.get(name)
        return u.groups if u is not None else ()

    def reload(self) -> bool:
        try:
            self.users = load_users(self.path)
        except UsersFileError as exc:
            log.error("users.reload_failed error=%s (the previous users stay in force)", exc)
            return False
        self._decoy_key = load_decoy_key(self.path, self.users)
        self._decoy_iterations = common_iterations(self.users)
        log.info("users.reloaded users=%d", len(self.users))
        return True


# ---------------------------------------------------------------------------------- command line
def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("user", help="manage the users file (password logins)",
                       description="Add, remove and list the users who may log in with a password "
                                   "(SASL SCRAM-SHA-256, or PLAIN over TLS). The file keeps salted "
                                   "SCRAM keys, never passwords; routers read it with the setting "
                                   "users_file and re-read it on SIGHUP.")
    ops = p.add_subparsers(dest="op", metavar="OP", required=True)
    a = ops.add_parser("add", help="add a user, or set a user's password and groups")
    a.add_argument("name", help="the user name (no commas, '=', NUL or outer spaces)")
    a.add_argument("--users-file", type=Path, required=True, help="the users file (JSON; made by the first `user add`)")
    a.add_argument("--password-stdin", action="store_true",
                   help="read the password from the first line of stdin (default: prompt twice)")
    a.add_argument("--groups", default="", help="comma-separated groups (for the authorization policy)")
    a.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                   help=f"PBKDF2 iterations of the SCRAM secret (default {DEFAULT_ITERATIONS}, at least 4096)")
    a.set_defaults(func=cmd_user_add)
    r = ops.add_parser("remove", help="remove a user")
    r.add_argument("name", help="the user to remove")
    r.add_argument("--users-file", type=Path, required=True, help="the users file (JSON; made by the first `user add`)")
    r.set_defaults(func=cmd_user_remove)
    ls = ops.add_parser("list", help="list users and their groups")
    ls.add_argument("--users-file", type=Path, required=True, help="the users file (JSON; made by the first `user add`)")
    ls.add_argument("--json", action="store_true", help="print the users as JSON")
    ls.set_defaults(func=cmd_user_list)


def _existing(path: Path) -> dict[str, User]:
    return load_users(path) if path.exists() else {}


def cmd_user_add(args: argparse.Namespace) -> int:
    if not args.name or any(c in args.name for c in ",=\0") or args.name != args.name.strip():
        print(f"oncemesh user add: bad user name {args.name!r} (no commas, '=', NUL or outer spaces)",
              file=sys.stderr)
        return 2
    if args.iterations < 4096:
        print("oncemesh user add: --iterations must be at least 4096 (RFC 7677)", file=sys.stderr)
        return 2
    try:
        if args.password_stdin:
            password = sys.stdin.readline().rstrip("\n")
        else:
            password = getpass.getpass(f"password for {args.name}: ")
            if getpass.getpass("again: ") != password:
                print("oncemesh user add: the passwords differ", file=sys.stderr)
                return 2
    except EOFError:
        print("\noncemesh user add: no password: the input ended (give it at the prompt, or on the first "
              "line of stdin with --password-stdin)", file=sys.stderr)
        return 2
    if not password:
        print("oncemesh user add: an empty password is not a password", file=sys.stderr)
        return 2
    try:
        users = _existing(args.users_file)
    except UsersFileError as exc:
        print(f"oncemesh user add: {exc}", file=sys.stderr)
        return 2
    groups = tuple(g.strip() for g in args.groups.split(",") if g.strip())
    others = {n: u for n, u in users.items() if n != args.name}
    common = common_iterations(others) if others else args.iterations
    if args.iterations != common:
        print(f"oncemesh user add: note: {args.name} gets {args.iterations} iterations where the file's other "
              f"users have mostly {common}: a SCRAM challenge shows the count, so it tells {args.name} apart "
              f"from a made-up name (routers show made-up names the most common count)", file=sys.stderr)
    users[args.name] = User(args.name, ScramSecret.from_password(password, args.iterations), groups)
    save_users(args.users_file, users)
    print(f"user {args.name} set in {args.users_file} (groups: {', '.join(groups) or '-'}); "
          f"routers using it take it on SIGHUP")
    return 0


def cmd_user_remove(args: argparse.Namespace) -> int:
    try:
        users = _existing(args.users_file)
    except UsersFileError as exc:
        print(f"oncemesh user remove: {exc}", file=sys.stderr)
        return 2
    if users.pop(args.name, None) is None:
        print(f"oncemesh user remove: no user {args.name!r} in {args.users_file}", file=sys.stderr)
        return 1
    save_users(args.users_file, users)
    print(f"user {args.name} removed from {args.users_file}; routers using it take it on SIGHUP")
    return 0


def cmd_user_list(args: argparse.Namespace) -> int:
    try:
        users = _existing(args.users_file)
    except UsersFileError as exc:
        print(f"oncemesh user list: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([{"name": u.name, "groups": list(u.groups)} for u in users.values()], indent=1))
    else:
        for u in sorted(users.values(), key=lambda u: u.name):
            print(f"{u.name}\t{','.join(u.groups) or '-'}")
    return 0
