"""The opt-in heap probe (router/heapprobe.py): what it measures and what it leaves alone."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import pytest

from oncemesh.router.heapprobe import MIN_LEN, HeapProbe, container_sizes, interval_from_env
from oncemesh.router.looplag import LoopLag  # any object of ours with plain attributes


class _Stream:
    __slots__ = ("seq", "marks")

    def __init__(self, n: int) -> None:
        self.seq = list(range(n))
        self.marks: dict[int, int] = {}


_Stream.__module__ = "oncemesh.test"  # (the walk enters objects of our own modules only)


def _root(n: int) -> LoopLag:
    root = LoopLag()
    root._lags = [0.0] * n  # a large list on an object of ours
    root.streams = {"news": _Stream(n), "sport": _Stream(1)}  # type: ignore[attr-defined]
    root.big = {i: _Stream(n) for i in range(100)}  # type: ignore[attr-defined]
    return root


def test_containers_are_measured_by_path_and_large_ones_are_not_entered() -> None:
    sizes = container_sizes({"r": _root(500)})
    assert sizes["r._lags"] == 500
    assert sizes["r.streams[news].seq"] == 500  # a small dict is entered, slots are read
    assert "r.streams[sport].seq" not in sizes  # below MIN_LEN
    assert sizes["r.big"] == 100
    assert not any(path.startswith("r.big[") for path in sizes)  # one object per item: never walked


def test_growth_shows_in_the_path_that_grew() -> None:
    before, after = container_sizes({"r": _root(100)}), container_sizes({"r": _root(400)})
    grown = {p for p in after if after[p] > before.get(p, 0)}
    assert grown == {"r._lags", "r.streams[news].seq"}


def test_an_object_reached_twice_is_counted_once() -> None:
    root = LoopLag()
    shared = deque(range(MIN_LEN))
    root._lags = shared  # type: ignore[assignment]
    root.again = shared  # type: ignore[attr-defined]
    assert sum(1 for n in container_sizes({"r": root}).values() if n == MIN_LEN) == 1


def test_interval_from_the_environment() -> None:
    assert interval_from_env({}) is None
    assert interval_from_env({"ONCEMESH_HEAP_PROBE": "0"}) is None
    assert interval_from_env({"ONCEMESH_HEAP_PROBE": " 30 "}) == 30.0
    with pytest.raises(ValueError, match="ONCEMESH_HEAP_PROBE='soon'"):
        interval_from_env({"ONCEMESH_HEAP_PROBE": "soon"})


def test_the_probe_appends_a_line_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "A.heap.jsonl"
    probe = HeapProbe(path, 60.0, lambda: {"r": _root(64)})
    assert [probe.maybe_sample(t) for t in (0.0, 30.0, 60.0, 61.0)] == [True, False, True, False]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2
    assert lines[0]["containers"]["r._lags"] == 64
    assert lines[0]["blocks"] > 0 and lines[0]["objects"] > 0 and "dict" in lines[0]["types"]


class _Link:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def probe_fields(self) -> dict[str, int]:
        return {"unsettled": 7, "queued": 0}


_Link.__module__ = "oncemesh.test"


def test_what_an_object_holds_outside_python_is_reported_under_its_name() -> None:
    root = LoopLag()
    root.links = {object(): _Link("control")}  # type: ignore[attr-defined]
    sizes = container_sizes({"r": root})
    assert sizes["r.links[control].unsettled"] == 7
    assert "r.links[control].queued" not in sizes  # (nothing held: not reported)
