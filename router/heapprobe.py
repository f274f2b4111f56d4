"""An opt-in probe of where a router's memory is, for diagnosing slow growth in a long run.

`ONCEMESH_HEAP_PROBE=SECONDS` makes the router append, every SECONDS, one JSON line to
`<log_dir>/<id>.heap.jsonl` with:

- `containers`: the length of every dict, list, set, deque and bytes-like object reachable from the
  router through attributes of our own objects (dotted paths, e.g. `core.records`,
  `mesh.node.streams[news].seq`), at least `MIN_LEN` long. Small dicts and lists are entered
  (a topic's stream, a connection); large ones are only measured: a walk never visits one object
  per message. Objects of ours with a `probe_fields()` add what they hold outside Python (a
  Proton link's unsettled and queued deliveries: `...links[NAME].unsettled`).
- `blocks`: `sys.getallocatedblocks()`, the interpreter's live memory blocks (Python objects);
  `objects`: how many objects the cyclic collector tracks, and the most numerous types among them
  (one pass of `gc.get_objects()`, tens of milliseconds on a large heap: a diagnosis tool, not a
  production setting);
- `malloc`: glibc's `mallinfo2()` (arena bytes in use and free, mmapped bytes), so that growth of
  the C side (Proton, OpenSSL) and fragmentation can be told from Python objects.

Growth of the RSS with flat `blocks` and flat `malloc.in_use` is fragmentation or pages the C
library keeps; growth of one container is a structure that is not bounded. Off by default.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..common.cmalloc import mallinfo_reader

ENV = "ONCEMESH_HEAP_PROBE"
MIN_LEN = 32  # containers shorter than this are not reported
ENTER_LEN = 16  # dicts and lists up to this many items are entered (their values walked)
MAX_DEPTH = 6
TOP_TYPES = 25
_SIZED = (dict, list, set, frozenset, deque, bytes, bytearray, memoryview)


def interval_from_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> float | None:
    """The probe's interval in seconds, or None when it is off (unset, empty, 0). A value that is
    not a number is an error the operator should see at start, not a probe silently off."""
    raw = environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: expected seconds between samples (e.g. 60), or 0 for off") from None
    return seconds if seconds > 0 else None


def _ours(obj: Any) -> bool:
    return type(obj).__module__.startswith("oncemesh.")


def _attrs(obj: Any) -> Iterator[tuple[str, Any]]:
    d = getattr(obj, "__dict__", None)
    if d is not None:
        yield from d.items()
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name != "__dict__" and hasattr(obj, name):
                yield name, getattr(obj, name)


def _label(key: Any, value: Any) -> str:
    """A dict key in a path: itself when it is a string or a number, else the value's name (a
    link keyed by its Proton pointer is named by its link name)."""
    if isinstance(key, str | int):
        return str(key)
    name = getattr(value, "name", None)
    return str(name) if isinstance(name, str) else type(key).__name__


def container_sizes(roots: dict[str, Any], min_len: int = MIN_LEN) -> dict[str, int]:
    """Lengths of the containers reachable from `roots` (see the module's docstring), by path.
    Each object is visited once (the first path that reaches it names it)."""
    out: dict[str, int] = {}
    seen: set[int] = set()
    stack: list[tuple[str, Any, int]] = [(name, obj, 0) for name, obj in reversed(list(roots.items()))]
    while stack:
        path, obj, depth = stack.pop()
        if id(obj) in seen or depth > MAX_DEPTH:
            continue
        seen.add(id(obj))
        if isinstance(obj, _SIZED):
            n = len(obj)
            if n >= min_len:
                out[path] = n
            if n <= ENTER_LEN and isinstance(obj, dict):
                for k, v in obj.items():
                    if _ours(v) or isinstance(v, _SIZED):
                        stack.append((f"{path}[{_label(k, v)}]", v, depth + 1))
            elif n <= ENTER_LEN and isinstance(obj, list | deque):
                for i, v in enumerate(obj):
                    if _ours(v) or isinstance(v, _SIZED):
                        stack.append((f"{path}[{i}]", v, depth + 1))
            continue
        if not _ours(obj):
            continue
        fields = getattr(obj, "probe_fields", None)  # what an object of ours holds outside Python (Proton's)
        if callable(fields):
            out.update({f"{path}.{k}": n for k, n in fields().items() if n})
        for name, v in _attrs(obj):
            if isinstance(v, _SIZED) or _ours(v):
                stack.append((f"{path}.{name}", v, depth + 1))
    return out


class HeapProbe:
    """Samples into a JSON-lines file every `interval` seconds (`maybe_sample`, from the router's tick)."""

    def __init__(self, path: Path, interval: float, roots: Callable[[], dict[str, Any]]) -> None:
        self.path = path
        self.interval = interval
        self.roots = roots
        self._next = 0.0
        self._mallinfo = mallinfo_reader()

    def maybe_sample(self, now: float) -> bool:
        if now < self._next:
            return False
        self._next = now + self.interval
        self.sample(now)
        return True

    def sample(self, now: float) -> dict[str, Any]:
        started = time.perf_counter()
        objs = gc.get_objects()
        types = Counter(type(o).__name__ for o in objs)
        line: dict[str, Any] = {
            "t": round(now, 3),
            "blocks": sys.getallocatedblocks(),
            "objects": len(objs),
            "types": dict(types.most_common(TOP_TYPES)),
            "malloc": self._mallinfo() if self._mallinfo is not None else None,
            "containers": container_sizes(self.roots()),
        }
        del objs
        line["probe_ms"] = round((time.perf_counter() - started) * 1000, 1)
        with self.path.open("a") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
        return line
