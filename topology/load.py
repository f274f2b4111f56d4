"""Reading and validating topology files (the format is documented in docs/topology.md).

Everything an operator can get wrong in a topology file is caught here, before any router starts,
and reported as `file:line: what is wrong`, all problems at once so that a file is fixed in one
pass. `tomllib` parses; `_LineIndex` finds the line of each key in the raw text (tomllib keeps no
positions); `_Checker` walks the parsed document and collects problems.
"""

from __future__ import annotations

import ast
import difflib
import json
import math
import re
import tomllib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from ..common.vocab import IDENTITIES, TAG
from ..router.config import RouterConfig
from ..router.core import CoreConfig
from .model import (
    DEFAULT_COST,
    DEFAULT_DEAD_AFTER,
    DEFAULT_HELLO_INTERVAL,
    LinkSpec,
    Order,
    RouterSpec,
    TopicSpec,
    Topology,
    TotalOrder,
)

KeyPath = tuple[str | int, ...]

TOP_KEYS = ("mesh", "defaults", "routers", "links", "topics")
MESH_KEYS = ("name", "hello_interval", "dead_after")
ROUTER_KEYS = ("listen", "inter_router", "settings")
LINK_KEYS = ("between", "cost")
TOPIC_KEYS = ("order", "total", "causal_group", "identity")

# ids name files (state, logs, status) and appear in every log line: keep them plain
ROUTER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_ADDRESS = re.compile(r"\[(?P<v6>[0-9A-Fa-f:.]+)\]:(?P<p6>[^:]*)|(?P<host>[^\s:\[\]]+):(?P<port>[^:]*)")
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "*"})
_HOST_ALIASES = {"localhost": "127.0.0.1", "::1": "127.0.0.1"}

# RouterConfig fields that are per process, not per topology, and why
_NOT_SETTINGS = {
    "id": "the router id is the name of its [routers.ID] table",
    "listen": "give the client listener as listen = \"HOST:PORT\" in the router's table",
    "state_dir": "it is per process: oncemesh router --state-dir (the launcher sets it)",
    "log_dir": "it is per process: oncemesh router --log-dir (the launcher sets it)",
    "ready_file": "it is per process: oncemesh router --ready-file (the launcher sets it)",
    "core": "name the core settings themselves, e.g. max_inflight_messages",
    "topology": "it is this file",
    "mesh_view": "it is made from this file (routers, links, HTTP listeners)",
}


@dataclass(frozen=True, slots=True)
class Problem:
    line: int
    message: str
    column: int | None = None


class TopologyError(Exception):
    """The topology file is wrong (the operator's to fix, not a bug): every problem with its line.

    `str(exc)` is one `SOURCE:LINE: message` per problem, ordered by line.
    """

    def __init__(self, source: str, problems: Iterable[Problem]) -> None:
        self.source = source
        self.problems = sorted(problems, key=lambda p: p.line)
        super().__init__("\n".join(
            f"{source}:{p.line}:{'' if p.column is None else f'{p.column}:'} {p.message}" for p in self.problems))

    @property
    def line(self) -> int:
        return self.problems[0].line


def example_path(name: str = "") -> Path:
    """An example topology shipped with oncemesh (`topology/examples/NAME`), or their folder.

    Read through `importlib.resources`, so that it is found in an installed wheel as in a checkout."""
    return Path(str(resources.files(__package__ or __name__.rpartition(".")[0]).joinpath("examples", name)))


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file. Raises TopologyError (also when it cannot be read)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TopologyError(str(path), [Problem(1, f"cannot read topology file: {reason}")]) from None
    return _parse(text, str(path), p)


def parse_topology(text: str, source: str = "<string>") -> Topology:
    """Validate topology text; `source` names it in error messages."""
    return _parse(text, source, None)


def connected_components(nodes: Iterable[str], edges: Iterable[tuple[str, str]]) -> list[tuple[str, ...]]:
    """The connected parts of an undirected graph, each sorted, ordered by their smallest id."""
    adjacent: dict[str, set[str]] = {n: set() for n in nodes}
    for a, b in edges:
        adjacent.setdefault(a, set()).add(b)
        adjacent.setdefault(b, set()).add(a)
    seen: set[str] = set()
    parts: list[tuple[str, ...]] = []
    for start in sorted(adjacent):
        if start in seen:
            continue
        seen.add(start)
        stack, part = [start], [start]
        while stack:
            for nxt in adjacent[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
                    part.append(nxt)
        parts.append(tuple(sorted(part)))
    return parts


def _parse(text: str, source: str, path: Path | None) -> Topology:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(source, [_syntax_problem(exc, text)]) from None
    c = _Checker(text)
    default_name = path.stem if path is not None else "mesh"
    c.known_keys(doc, (), TOP_KEYS, "at the top level")
    name, hello, dead = c.mesh(doc.get("mesh", {}), default_name)
    defaults = c.settings(doc.get("defaults", {}), ("defaults",), "[defaults]")
    routers = c.routers(doc.get("routers"))
    links = c.links(doc.get("links", []))
    topics = c.topics(doc.get("topics", {}))
    if not c.problems:
        c.connected(routers, links)
    if c.problems:
        raise TopologyError(source, c.problems)
    return Topology(name=name, routers=routers, links=tuple(links), topics=topics, hello_interval=hello,
                    dead_after=dead, defaults=defaults, source=path)


# ---------------------------------------------------------------------- checks
def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"{value!r}"


def _suggest(word: str, valid: Collection[str]) -> str:
    close = difflib.get_close_matches(word, list(valid), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (valid: {', '.join(sorted(valid))})"


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _setting_names() -> set[str]:
    names = {f.name for f in fields(RouterConfig)} | {f.name for f in fields(CoreConfig)}
    return names - set(_NOT_SETTINGS)


def _check_setting(key: str, value: Any) -> str | None:
    """None if RouterConfig accepts `key = value`, else what is wrong with it."""
    cfg = RouterConfig(id="topology-check")
    try:
        cfg.apply({key: value})
    except ValueError as exc:
        if str(exc).startswith("unknown router setting"):
            return f"unknown setting {key!r}{_suggest(key, _setting_names())}"
    except TypeError:
        pass  # a known name with a value of the wrong type: said below
    default = getattr(RouterConfig(id="topology-check").core, key, None)
    if default is None:
        default = getattr(RouterConfig(id="topology-check"), key)
    if isinstance(default, bool):
        ok = isinstance(value, bool)
        expected = "true or false"
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        expected = "a whole number >= 0"
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
        expected = "a number >= 0"
    else:
        ok, expected = isinstance(value, type(default)), type(default).__name__
    return None if ok else f"setting {key} must be {expected}, got {_kind(value)}"


def _same_host(a: str, b: str) -> bool:
    """Would listeners on these hosts (same port) clash? Wildcards clash with everything."""
    a, b = a.lower(), b.lower()
    if a in _WILDCARD_HOSTS or b in _WILDCARD_HOSTS:
        return True
    return _HOST_ALIASES.get(a, a) == _HOST_ALIASES.get(b, b)


class _Checker:
    def __init__(self, text: str) -> None:
        try:
            self.lines = _LineIndex(text)
        except (IndexError, ValueError, RecursionError, tomllib.TOMLDecodeError):
            self.lines = _LineIndex("")  # a scanner bug must not hide the problems: report line 1
        self.problems: list[Problem] = []
        self.declared: set[str] = set()  # every router id in the file, valid or not

    def error(self, path: KeyPath, message: str) -> None:
        self.problems.append(Problem(self.lines.line(path), message))

    def table(self, value: Any, path: KeyPath, what: str) -> dict[str, Any] | None:
        if isinstance(value, dict):
            return value
        self.error(path, f"{what} must be a table, got {_kind(value)}")
        return None

    def known_keys(self, table: dict[str, Any], path: KeyPath, valid: Collection[str], where: str) -> None:
        for key in table:
            if key not in valid:
                self.error((*path, key), f"unknown key {key!r} {where}{_suggest(key, valid)}")

    def seconds(self, value: Any, path: KeyPath, what: str) -> float | None:
        if not _positive(value):
            self.error(path, f"{what} must be a positive number of seconds, got {_kind(value)}")
            return None
        return float(value)

    # -------------------------------------------------------------- [mesh], settings
    def mesh(self, value: Any, default_name: str) -> tuple[str, float, float]:
        m = self.table(value, ("mesh",), "mesh") or {}
        self.known_keys(m, ("mesh",), MESH_KEYS, "in [mesh]")
        name = m.get("name", default_name)
        if not isinstance(name, str) or not name.strip():
            self.error(("mesh", "name"), f"mesh.name must be a non-empty string, got {_kind(name)}")
            name = default_name
        hello = self.seconds(m.get("hello_interval", DEFAULT_HELLO_INTERVAL), ("mesh", "hello_interval"),
                             "mesh.hello_interval")
        dead = self.seconds(m.get("dead_after", DEFAULT_DEAD_AFTER), ("mesh", "dead_after"), "mesh.dead_after")
        if hello is not None and dead is not None and dead <= hello:
            self.error(("mesh", "dead_after") if "dead_after" in m else ("mesh", "hello_interval"),
                       f"mesh.dead_after ({dead:g} s) must be longer than mesh.hello_interval ({hello:g} s), "
                       f"or routers are declared dead between two hellos")
        return name, hello or DEFAULT_HELLO_INTERVAL, dead or DEFAULT_DEAD_AFTER

    def settings(self, value: Any, path: KeyPath, where: str) -> dict[str, Any]:
        table = self.table(value, path, where)
        out: dict[str, Any] = {}
        for k, v in (table or {}).items():
            key = k.replace("-", "_")
            if key in _NOT_SETTINGS:
                self.error((*path, k), f"{k!r} cannot be set in {where}: {_NOT_SETTINGS[key]}")
                continue
            problem = _check_setting(key, v)
            if problem is not None:
                self.error((*path, k), f"{where}: {problem}")
                continue
            out[key] = v
        return out

    # -------------------------------------------------------------- routers
    def routers(self, value: Any) -> dict[str, RouterSpec]:
        table = self.table(value, ("routers",), "routers") if value is not None else {}
        if not table:
            if table is not None:
                self.error(("routers",), "no routers: add at least one, e.g. [routers.A] with "
                                         "listen = \"127.0.0.1:5672\"")
            return {}
        self.declared = set(table)
        single = len(table) == 1
        specs: dict[str, RouterSpec] = {}
        for rid, body in table.items():
            path: KeyPath = ("routers", rid)
            where = f"[routers.{rid}]"
            if not ROUTER_ID.fullmatch(rid):
                self.error(path, f"router id {rid!r} is not valid: use at most 64 letters, digits, '_' or '-', "
                                 f"starting with a letter or digit (ids name files and appear in logs)")
            r = self.table(body, path, where)
            if r is None:
                continue
            self.known_keys(r, path, ROUTER_KEYS, f"in {where}")
            listen = self.address(r.get("listen"), (*path, "listen"), f"router {rid}: listen")
            if "inter_router" not in r and single:
                inter = (listen[0], 0) if listen else None  # unused by a one-router mesh
            else:
                inter = self.address(r.get("inter_router"), (*path, "inter_router"), f"router {rid}: inter_router")
            settings = self.settings(r.get("settings", {}), (*path, "settings"), f"[routers.{rid}.settings]")
            if listen and inter:
                specs[rid] = RouterSpec(rid, listen[0], listen[1], inter[0], inter[1], settings)
        self.unique_addresses(specs)
        return specs

    def address(self, value: Any, path: KeyPath, what: str) -> tuple[str, int] | None:
        if value is None:
            self.error(path, f"{what} is missing: give HOST:PORT, e.g. \"127.0.0.1:5672\" (port 0: any free port)")
            return None
        if not isinstance(value, str):
            self.error(path, f"{what} must be a string \"HOST:PORT\", got {_kind(value)}")
            return None
        m = _ADDRESS.fullmatch(value.strip())
        if m is None:
            self.error(path, f"{what} {value!r} is not HOST:PORT (e.g. \"127.0.0.1:5672\"; IPv6 \"[::1]:5672\")")
            return None
        host, port = (m["v6"], m["p6"]) if m["v6"] is not None else (m["host"], m["port"])
        if not port.isdigit():
            self.error(path, f"{what} {value!r}: port {port!r} is not a number")
            return None
        if int(port) > 65535:
            self.error(path, f"{what} {value!r}: port {int(port)} is out of range 0..65535")
            return None
        return host, int(port)

    def unique_addresses(self, specs: dict[str, RouterSpec]) -> None:
        """Two listeners on one non-zero host:port cannot both bind; port 0 never clashes."""
        bound: list[tuple[str, str, str, int]] = []
        for rid, spec in specs.items():
            for kind, host, port in (("listen", spec.host, spec.port),
                                     ("inter_router", spec.inter_host, spec.inter_port)):
                if port == 0:
                    continue
                for other_id, other_kind, other_host, other_port in bound:
                    if other_port == port and _same_host(host, other_host):
                        addr = getattr(spec, kind)
                        if other_id == rid:
                            msg = f"router {rid}: listen and inter_router are both {addr}"
                        else:
                            first = self.lines.line(("routers", other_id, other_kind))
                            msg = (f"router {rid}: {kind} {addr} clashes with router {other_id}'s {other_kind} "
                                   f"{getattr(specs[other_id], other_kind)} (line {first})")
                        self.error(("routers", rid, kind), msg)
                        break
                bound.append((rid, kind, host, port))

    # -------------------------------------------------------------- links
    def links(self, value: Any) -> list[LinkSpec]:
        if not isinstance(value, list):
            self.error(("links",), "links must be an array of tables: write each link as a [[links]] table "
                                   "with between = [\"A\", \"B\"]")
            return []
        out: list[LinkSpec] = []
        seen: dict[tuple[str, str], int] = {}  # pair -> index of its first link
        for i, item in enumerate(value):
            path: KeyPath = ("links", i)
            if not isinstance(item, dict):
                self.error(path, f"link #{i + 1} must be a table with between = [\"A\", \"B\"], got {_kind(item)}")
                continue
            between = item.get("between")
            if not (isinstance(between, list) and len(between) == 2 and all(isinstance(x, str) for x in between)):
                self.known_keys(item, path, LINK_KEYS, f"in link #{i + 1}")
                self.error((*path, "between") if "between" in item else path,
                           f"link #{i + 1}: between must be two router ids, e.g. between = [\"A\", \"B\"], "
                           f"got {'nothing' if between is None else _kind(between)}")
                continue
            a, b = between
            label = f"link {a}–{b}"
            self.known_keys(item, path, LINK_KEYS, f"in {label}")
            ok = True
            for rid in dict.fromkeys((a, b)):
                if rid not in self.declared:
                    self.error((*path, "between"), f"{label}: unknown router {rid!r} "
                                                   f"(routers: {', '.join(sorted(self.declared)) or 'none'})")
                    ok = False
            if a == b:
                self.error((*path, "between"), f"{label}: a router cannot link to itself")
                ok = False
            cost = item.get("cost", DEFAULT_COST)
            if not _positive(cost):
                self.error((*path, "cost"), f"{label}: cost must be a positive number, got {_kind(cost)}")
                ok = False
            lo, hi = sorted((a, b))
            if (lo, hi) in seen:
                j = seen[(lo, hi)]
                self.error((*path, "between"), f"{label}: duplicate of link {value[j]['between'][0]}–"
                                               f"{value[j]['between'][1]} (line {self.lines.line(('links', j))}); "
                                               f"give each pair of routers one link")
                ok = False
            seen.setdefault((lo, hi), i)
            if ok:
                out.append(LinkSpec(lo, hi, float(cost)))
        return out

    def connected(self, routers: dict[str, RouterSpec], links: list[LinkSpec]) -> None:
        parts = connected_components(routers, ((link.a, link.b) for link in links))
        if len(parts) <= 1:
            return
        shown = ["{" + ", ".join(p) + "}" for p in parts]
        listing = ", ".join(shown[:-1]) + " and " + shown[-1]
        self.error(("routers", parts[1][0]),
                   f"the mesh is not connected: {len(parts)} separate parts {listing}; add links so that every "
                   f"router can reach every other (e.g. between = [\"{parts[0][-1]}\", \"{parts[1][0]}\"])")

    # -------------------------------------------------------------- topics
    def topics(self, value: Any) -> dict[str, TopicSpec]:
        table = self.table(value, ("topics",), "topics") or {}
        out: dict[str, TopicSpec] = {}
        for name, body in table.items():
            path: KeyPath = ("topics", name)
            where = f"[topics.{name}]" if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f"[topics.{name!r}]"
            label = f"topic {name!r}"
            if not name or name[0] in "$_":
                self.error(path, f"{label}: addresses starting with '$' or '_' (or empty) are reserved for the "
                                 f"routers")
            elif len(name) > 1024 or any(ord(ch) < 0x20 for ch in name):
                self.error(path, f"{label}: a topic is at most 1024 printable characters")
            t = self.table(body, path, where)
            if t is None:
                continue
            self.known_keys(t, path, TOPIC_KEYS, f"in {where}")
            order_text = t.get("order", Order.FIFO.value)
            valid_orders = [o.value for o in Order]
            if order_text not in valid_orders:
                hint = _suggest(order_text, valid_orders) if isinstance(order_text, str) else ""
                self.error((*path, "order"), f"{label}: order must be \"fifo\", \"causal\" or \"total\", "
                                             f"got {_kind(order_text)}{hint}")
                continue
            order = Order(order_text)
            total: TotalOrder | None = TotalOrder.SEQUENCER if order is Order.TOTAL else None
            if "total" in t:
                valid_totals = [o.value for o in TotalOrder]
                if order is not Order.TOTAL:
                    self.error((*path, "total"), f"{label}: total = {t['total']!r} only applies with "
                                                 f"order = \"total\" (order is \"{order}\")")
                elif t["total"] not in valid_totals:
                    self.error((*path, "total"), f"{label}: total must be \"sequencer\" or \"lamport\", "
                                                 f"got {_kind(t['total'])}")
                else:
                    total = TotalOrder(t["total"])
            group = t.get("causal_group")
            if group is not None:
                if not isinstance(group, str) or not group.strip():
                    self.error((*path, "causal_group"), f"{label}: causal_group must be a non-empty name, "
                                                        f"got {_kind(group)}")
                    group = None
                elif order is not Order.CAUSAL:
                    self.error((*path, "causal_group"), f"{label}: causal_group only applies with "
                                                        f"order = \"causal\" (order is \"{order}\")")
                    group = None
            identity = t.get("identity", TAG)
            if identity not in IDENTITIES:
                hint = _suggest(identity, list(IDENTITIES)) if isinstance(identity, str) else ""
                self.error((*path, "identity"), f"{label}: identity must be \"tag\" or \"message-id\", "
                                                f"got {_kind(identity)}{hint}")
                identity = TAG
            out[name] = TopicSpec(name, order, total, group, identity)
        return out


# ---------------------------------------------------------------------- TOML syntax errors
_LOCATION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$|\s*\(at end of document\)$")


def _syntax_problem(exc: tomllib.TOMLDecodeError, text: str) -> Problem:
    """tomllib's message, reworded where a person would not recognise the cause (duplicates)."""
    message = str(exc)
    m = _LOCATION.search(message)
    base = message[:m.start()] if m else message
    line, column = (int(m[1]), int(m[2])) if m and m[1] else (text.count("\n") + 1, None)
    dup = re.match(r"Cannot declare (\(.*\)) twice", base)
    if dup:
        try:
            key = tuple(ast.literal_eval(dup[1]))
        except (ValueError, SyntaxError):
            key = ()
        first = _first_header(text, key, line)
        where = f" (first at line {first})" if first else ""
        if len(key) == 2 and key[0] == "routers":
            return Problem(line, f"router {key[1]!r} is defined twice{where}; router ids must be unique")
        if len(key) == 2 and key[0] == "topics":
            return Problem(line, f"topic {key[1]!r} is defined twice{where}")
        return Problem(line, f"table [{'.'.join(map(str, key))}] is declared twice{where}; merge the two")
    if base.startswith("Cannot overwrite a value"):
        lines = text.splitlines()
        src = lines[line - 1] if 0 < line <= len(lines) else ""
        k = re.match(r"\s*([^=\[]+?)\s*=", src)
        what = f"key {k[1].strip()!r}" if k else "a key"
        return Problem(line, f"{what} is set twice in the same table")
    return Problem(line, f"invalid TOML: {base}", column)


def _first_header(text: str, key: tuple[Any, ...], before: int) -> int | None:
    for n, raw in enumerate(text.splitlines()[:before - 1], start=1):
        m = re.match(r"\s*\[([^\[\]]+)\]\s*(#.*)?$", raw)
        if not m:
            continue
        try:
            node: Any = tomllib.loads(f"[{m[1]}]\n")
        except tomllib.TOMLDecodeError:
            continue
        path: list[str] = []
        while isinstance(node, dict) and len(node) == 1:
            (k, node), = node.items()
            path.append(k)
        if tuple(path) == key:
            return n
    return None


# ---------------------------------------------------------------------- key -> line
_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class _LineIndex:
    """The line on which each key path first appears in a (valid) TOML text.

    Paths are like `("routers", "A", "listen")`, `("links", 2, "cost")` for the third `[[links]]`
    table, `("links", 1)` for the second element of an inline array. `line(path)` falls back to the
    longest recorded prefix. It runs only on text tomllib accepted, so it skips a parser's checks.
    """

    def __init__(self, text: str) -> None:
        self._s = text
        self._i = 0
        self._line = 1
        self._first: dict[KeyPath, int] = {}
        self._scan()

    def line(self, path: KeyPath) -> int:
        for n in range(len(path), 0, -1):
            found = self._first.get(path[:n])
            if found is not None:
                return found
        return 1

    def _peek(self, k: int = 0) -> str:
        return self._s[self._i + k] if self._i + k < len(self._s) else ""

    def _advance(self, n: int = 1) -> None:
        for _ in range(n):
            if self._i < len(self._s):
                self._line += self._s[self._i] == "\n"
                self._i += 1

    def _record(self, path: KeyPath) -> None:
        for n in range(1, len(path) + 1):
            self._first.setdefault(path[:n], self._line)

    def _skip_space(self, newlines: bool) -> None:
        while self._i < len(self._s):
            c = self._peek()
            if c in " \t\r" or (newlines and c == "\n"):
                self._advance()
            elif c == "#":
                while self._peek() not in ("\n", ""):
                    self._advance()
            else:
                return

    def _scan(self) -> None:
        table: KeyPath = ()
        arrays: dict[KeyPath, int] = {}  # array-of-tables path -> index of its current element
        while True:
            self._skip_space(newlines=True)
            if self._i >= len(self._s):
                return
            if self._peek() == "[":
                is_array = self._peek(1) == "["
                self._advance(2 if is_array else 1)
                key = self._key()
                resolved: list[str | int] = []
                for n, part in enumerate(key):
                    resolved.append(part)
                    last = n == len(key) - 1
                    if tuple(resolved) in arrays and not (last and is_array):
                        resolved.append(arrays[tuple(resolved)])
                table = tuple(resolved)
                if is_array:
                    arrays[table] = arrays.get(table, -1) + 1
                    table = (*table, arrays[table])
                self._record(table)
                while self._peek() not in ("\n", ""):
                    self._advance()
            else:
                key = self._key()
                self._skip_space(newlines=False)
                self._advance()  # '='
                self._record((*table, *key))
                self._value((*table, *key))

    def _key(self) -> tuple[str, ...]:
        parts: list[str] = []
        while True:
            self._skip_space(newlines=False)
            if self._peek() == '"':
                parts.append(self._basic_string())
            elif self._peek() == "'":
                self._advance()
                start = self._i
                while self._peek() not in ("'", ""):
                    self._advance()
                parts.append(self._s[start:self._i])
                self._advance()
            else:
                start = self._i
                while self._peek() != "" and self._peek() in _BARE:
                    self._advance()
                parts.append(self._s[start:self._i])
            self._skip_space(newlines=False)
            if self._peek() != ".":
                return tuple(parts)
            self._advance()

    def _basic_string(self) -> str:
        start = self._i
        self._advance()
        while self._peek() not in ('"', ""):
            self._advance(2 if self._peek() == "\\" else 1)
        self._advance()
        return str(tomllib.loads(f"k = {self._s[start:self._i]}")["k"])  # tomllib decodes the escapes

    def _value(self, path: KeyPath) -> None:
        self._skip_space(newlines=False)
        c = self._peek()
        if self._s.startswith(('"""', "'''"), self._i):
            quote = self._s[self._i:self._i + 3]
            self._advance(3)
            while self._i < len(self._s) and not self._s.startswith(quote, self._i):
                self._advance(2 if quote == '"""' and self._peek() == "\\" else 1)
            self._advance(3)
            while self._peek() == quote[0]:  # up to two more quotes belong to the content
                self._advance()
        elif c == '"':
            self._basic_string()
        elif c == "'":
            self._advance()
            while self._peek() not in ("'", ""):
                self._advance()
            self._advance()
        elif c in ("[", "{"):
            self._advance()
            close, n = ("]", 0) if c == "[" else ("}", -1)
            while True:
                self._skip_space(newlines=True)
                if self._peek() in (close, ""):
                    self._advance()
                    return
                before = self._i
                if n >= 0:  # array element
                    self._record((*path, n))
                    self._value((*path, n))
                    n += 1
                else:  # inline table entry
                    key = self._key()
                    self._advance()  # '='
                    self._record((*path, *key))
                    self._value((*path, *key))
                self._skip_space(newlines=True)
                if self._peek() == ",":
                    self._advance()
                elif self._i == before:
                    self._advance()  # never loop in place, whatever the text
        else:  # number, boolean, date/time: runs to a delimiter
            while self._peek() not in (",", "]", "}", "\n", "#", ""):
                self._advance()


def with_overrides(path: str | Path, dest: Path, mesh: Mapping[str, Any] | None = None,
                   defaults: Mapping[str, Any] | None = None) -> Path:
    """A copy of topology file `path` at `dest` with keys of `[mesh]` (`mesh`: hello_interval,
    dead_after) and of `[defaults]` (router settings for every router) set to these values, over any
    the file gives (a router's own `settings` still win over `[defaults]`). For benchmarks and
    measurements (`oncemesh bench --set` on a topology). Checked like any topology file."""
    def toml(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        text = str(v)  # (from --set: a number or a yes/no as text goes as that)
        if re.fullmatch(r"[+-]?\d+(\.\d*)?([eE][+-]?\d+)?", text) or text in ("true", "false"):
            return text
        return json.dumps(text)  # (a JSON string is a TOML basic string)

    out: list[str] = []
    table = None
    seen: set[str] = set()
    wanted = {"mesh": dict(mesh or {}), "defaults": dict(defaults or {})}
    for line in Path(path).read_text().splitlines():
        head = re.match(r"\s*\[\s*([A-Za-z0-9_.\"-]+)\s*\]\s*(#.*)?$", line)
        if head or re.match(r"\s*\[\[", line):
            table = head.group(1) if head else None
            out.append(line)
            if table in wanted:
                seen.add(table)
                out += [f"{k} = {toml(v)}" for k, v in wanted[table].items()]
            continue
        key = re.match(r"\s*([A-Za-z0-9_-]+)\s*=", line)
        if table in wanted and key and key.group(1) in wanted[table]:
            continue  # (given above, right under the table's header)
        out.append(line)
    for name in ("mesh", "defaults"):
        if name not in seen and wanted[name]:
            out += ["", f"[{name}]", *(f"{k} = {toml(v)}" for k, v in wanted[name].items())]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join(out) + "\n")
    load_topology(dest)  # raises TopologyError for an unknown setting or a bad value
    return dest


def with_topic_order(path: str | Path, topics: Iterable[str], order: str, dest: Path) -> Path:
    """A copy of topology file `path` at `dest` where `topics` have `order` ("fifo", "total" for the
    sequencer, "lamport", "causal"), for benchmarks and measurements that pick topic names at run
    time. Checked like any topology file; a topic the file already lists is an error."""
    text = Path(path).read_text()
    extra = {"fifo": 'order = "fifo"', "total": 'order = "total"\ntotal = "sequencer"',
             "lamport": 'order = "total"\ntotal = "lamport"', "causal": 'order = "causal"'}.get(order)
    if extra is None:
        raise ValueError(f"unknown order {order!r} (fifo, total, lamport, causal)")
    sections = "".join(f'\n[topics."{t}"]\n{extra}\n' for t in sorted(set(topics)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text.rstrip("\n") + "\n" + sections)
    load_topology(dest)  # raises TopologyError for a duplicate topic or a bad name
    return dest

