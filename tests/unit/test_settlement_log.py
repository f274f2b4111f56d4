"""The settlement log writer: the hot-path shapes write exactly what the generic path writes."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncemesh.common.settlement_log import (
    FIELDS,
    GID_PREFIX,
    AcceptedBy,
    Segments,
    SettlementLog,
    SizeCount,
    _gid_groups,
    _gid_runs,
    expand_gids,
)

ids = st.from_regex(r"[a-z0-9]{1,12}:[a-z0-9]{1,6}", fullmatch=True)
topics = st.text(min_size=1, max_size=20)  # any text: topics are JSON-escaped


# ids of a few publisher links, each prefix of GID_PREFIX characters or a little shorter or longer, and
# ids that are a prefix themselves: the edges of the one-run shortcut
_prefixes = st.sampled_from(["abcdefghijkl:", "abcdefghijkl", "abcdefghijk:", "zbcdefghijkl:", "abcdefghijkl:x"])
_grouped_ids = st.lists(st.builds(lambda p, t: p + t, _prefixes, st.from_regex(r"[a-z0-9:]{0,4}", fullmatch=True)),
                        min_size=1, max_size=12)


@settings(max_examples=400, deadline=None)
@given(gids=_grouped_ids)
def test_gid_groups_one_run_shortcut_writes_what_the_id_by_id_path_writes(gids: list[str]) -> None:
    assert len("abcdefghijkl:") == GID_PREFIX
    text = _gid_groups(gids)
    assert text == _gid_runs(gids) if len(gids) > 1 else text == json.dumps(gids, separators=(",", ":"))
    assert expand_gids(json.loads(text)) == gids


def test_gid_groups_of_one_publisher_link_are_one_run() -> None:
    gids = [f"abcdefghijkl:{i}" for i in range(1, 5)]
    assert _gid_groups(gids) == '["abcdefghijkl:1 2 3 4"]'
    assert _gid_groups([*gids, "zbcdefghijkl:9", "abcdefghijkl:5"]) == \
        '["abcdefghijkl:1 2 3 4","zbcdefghijkl:9","abcdefghijkl:5"]'


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text("utf-8").split("\n") if line]  # not splitlines(): U+0085 is no line end here


@settings(max_examples=60, deadline=None)
@given(gid=ids, topic=topics, sid=st.one_of(st.none(), st.from_regex(r"[a-z0-9]{16}", fullmatch=True)),
       size=st.integers(0, 10**9), count=st.integers(0, 10**4))
def test_fast_shapes_equal_the_generic_ones(tmp_path_factory, gid: str, topic: str, sid: str | None,
                                            size: int, count: int) -> None:
    path = tmp_path_factory.mktemp("log") / "r.jsonl"
    log = SettlementLog(path, src="router", node="A", inc="7")
    log.write_core_events(1.5, [
        ("received", gid, topic, None, SizeCount((size, count))),
        ("received", gid, topic, None, {"size": size, "count": count}),
        ("outcome", gid, topic, None, AcceptedBy(count)),
        ("outcome", gid, topic, None, {"outcome": "ACCEPTED", "count": count, "error": None}),
        ("delivered", gid, topic, sid, None),
        ("delivered", gid, topic, sid, {}),
    ])
    log.close()
    lines = read(path)
    assert lines[0] == lines[1] and lines[2] == lines[3] and lines[4] == lines[5]
    assert lines[0]["size"] == size and lines[0]["count"] == count and lines[0]["topic"] == topic
    assert lines[2]["outcome"] == "ACCEPTED" and lines[2]["gid"] == gid
    assert lines[4].get("sub") == sid
    assert all(set(line) <= set(FIELDS) for line in lines)


def test_handed_in_log_reads_backwards_across_chunks_and_stops_at_older_lines(tmp_path: Path) -> None:
    from oncemesh.clients.subscriber import handed_in_log

    path = tmp_path / "c.subscriber.jsonl"
    assert handed_in_log(path.open("w").name, "s", {"g"}, since=0) is None  # empty: no evidence
    log = SettlementLog(path, src="subscriber", node="c", inc="r1")
    for i in range(200):
        log.write("handed", 1000.0 + i, f"p:{i}", "t", "s", link="l")
        log.write("handed", 1000.0 + i, f"p:{i}", "t", "other", link="l")
    log.flush()
    with open(path, "ab") as f:
        f.write(b'{"v":1,"ts":1199.5,"ev":"hand')  # a line cut by a SIGKILL
    got = handed_in_log(path, "s", {"p:199", "p:150", "p:3", "p:999"}, since=1100.0, chunk=97)
    assert got == {"p:199", "p:150"}  # p:3 is older than `since`: not looked for; p:999 never handed
    assert handed_in_log(path, "s", {"p:3"}, since=0.0, chunk=97) == {"p:3"}
    assert handed_in_log(path, "other", {"p:3", "p:4"}, since=0.0, chunk=1 << 20) == {"p:3", "p:4"}


def test_log_summary_finds_fifo_reversals_across_processes(tmp_path: Path) -> None:
    """The failover tests' FIFO check: hand-overs ordered by (ts, n) across a subscriber's
    processes; a message handed after a later one of its publisher is reported."""
    from tests.helpers import OrderSummary

    def handed(ts: float, n: int, gid: str) -> str:
        return json.dumps({"v": 1, "ts": ts, "src": "subscriber", "ev": "handed", "gid": gid, "sub": "s", "n": n})

    p = "abcdefghijkl"
    (tmp_path / "a.subscriber.jsonl").write_text("\n".join([
        handed(1.0, 1, f"{p}:1"), handed(1.0, 2, f"{p}:2"), handed(2.0, 3, f"{p}:5")]) + "\n")
    (tmp_path / "b.subscriber.jsonl").write_text(handed(3.0, 1, f"{p}:6") + "\n")  # a later process
    assert OrderSummary(tmp_path).check_fifo(["s"]) == []
    (tmp_path / "c.subscriber.jsonl").write_text(handed(4.0, 1, f"{p}:4") + "\n")
    [problem] = OrderSummary(tmp_path).check_fifo(["s"])
    assert f"{p}:4" in problem and "1 handed after" in problem


# ---------------------------------------------------------------------- segments, full disk
def read_segments(directory: Path) -> list[dict]:
    """Every event of every segment (plain and gzipped), in segment order, v1-shaped, without the
    segment boundaries."""
    from oncemesh.common.settlement_log import log_files, read_events

    return [e for f in log_files(directory) for e in read_events(f)
            if e["ev"] not in ("segment_opened", "segment_closed")]


def gids(lines: list[dict]) -> list[str]:
    return [line["gid"] for line in lines if "gid" in line]


def test_segments_rotate_by_size_and_closed_ones_are_gzipped_without_losing_a_line(tmp_path: Path) -> None:
    log = SettlementLog(tmp_path / "A.settlement.jsonl", src="router", node="A", inc="7",
                        segments=Segments(max_bytes=2000, max_seconds=0))
    for i in range(100):
        log.write_core_events(1.0 + i, [("delivered", f"p:{i}", "t", "s" * 16, None)])
        log.flush()
    log.close()
    names = sorted(f.name for f in tmp_path.iterdir())
    assert len(names) > 3 and all(n.startswith("A.settlement.7.") and n.endswith(".jsonl.gz") for n in names)
    assert all(f.stat().st_size < 2000 for f in tmp_path.iterdir())  # gzipped: smaller than a segment
    assert gids(read_segments(tmp_path)) == [f"p:{i}" for i in range(100)]


def test_a_segment_older_than_max_seconds_is_closed_at_the_next_flush(tmp_path: Path) -> None:
    log = SettlementLog(tmp_path / "A.settlement.jsonl", src="router", node="A", inc="7",
                        segments=Segments(max_bytes=0, max_seconds=60, compress=False))
    log.write("router_started", 1.0)
    log.flush()
    first = log.open_segment
    log.flush()
    assert log.open_segment == first  # young: kept
    log._seg_opened -= 61  # the clock moved on a minute
    log.flush()
    assert log.open_segment != first and first is not None and first.exists()
    log.write("router_stopped", 2.0)
    log.close()
    assert [x["ev"] for x in read_segments(tmp_path)] == ["router_started", "router_stopped"]


def test_a_segment_that_cannot_rotate_keeps_its_lines_and_says_so_once_a_minute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """No room for a new file (a full directory, a quota): the open segment takes the lines; the
    warning does not repeat at every flush (every 0.2 s), and rotation is tried again later."""
    log = SettlementLog(tmp_path / "A.settlement.jsonl", src="router", node="A", inc="7",
                        segments=Segments(max_bytes=500, max_seconds=0, compress=False))
    real = SettlementLog._open_next

    def no_room(self: SettlementLog) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SettlementLog, "_open_next", no_room)
    with caplog.at_level("WARNING", logger="oncemesh.settlement_log"):
        for i in range(40):
            log.write_core_events(1.0 + i, [("delivered", f"p:{i}", "t", "s" * 16, None)])
            log.flush()
    assert sum("rotate_failed" in r.getMessage() for r in caplog.records) == 1
    stuck = log.open_segment
    monkeypatch.setattr(SettlementLog, "_open_next", real)
    log._rotate_retry_at = 0.0  # (a minute later)
    log.write_core_events(99.0, [("delivered", "p:99", "t", "s" * 16, None)])
    log.flush()
    assert log.open_segment != stuck
    log.close()
    assert gids(read_segments(tmp_path)) == [f"p:{i}" for i in range(40)] + ["p:99"]


def test_retention_deletes_the_oldest_closed_segments_only_when_configured(tmp_path: Path) -> None:
    def run(directory: Path, segments: Segments) -> list[str]:
        log = SettlementLog(directory / "A.settlement.jsonl", src="router", node="A", inc="7",
                            segments=segments)
        for i in range(60):
            log.write_core_events(1.0 + i, [("delivered", f"p:{i}", "t", "s" * 16, None)])
            log.flush()
        log.close()
        return gids(read_segments(directory))

    keep = run(tmp_path / "keep", Segments(max_bytes=1000, max_seconds=0, compress=False))
    assert keep == [f"p:{i}" for i in range(60)]  # default: every segment kept
    kept = run(tmp_path / "cut", Segments(max_bytes=1000, max_seconds=0, retention_bytes=3000, compress=False))
    assert 0 < len(kept) < 60 and kept == [f"p:{i}" for i in range(60 - len(kept), 60)]  # the newest
    assert sum(f.stat().st_size for f in (tmp_path / "cut").iterdir()) <= 3000


def test_retention_by_age(tmp_path: Path) -> None:
    log = SettlementLog(tmp_path / "A.settlement.jsonl", src="router", node="A", inc="7",
                        segments=Segments(max_bytes=100, max_seconds=0, retention_seconds=3600, compress=False))
    log.write_core_events(1.0, [("delivered", "p:0", "t", "s" * 16, None)] * 3)
    log.flush()
    assert log._keeper is not None
    log._keeper.jobs.join()
    [old] = [f for f in tmp_path.iterdir() if f != log.open_segment]
    os.utime(old, (time.time() - 7200, time.time() - 7200))  # last written two hours ago
    log.write_core_events(2.0, [("delivered", "p:1", "t", "s" * 16, None)] * 3)
    log.close()
    assert not old.exists() and gids(read_segments(tmp_path)) == ["p:1"] * 3


def test_a_restart_finishes_what_a_crash_left_half_done(tmp_path: Path) -> None:
    """A crash while compressing leaves X.jsonl with X.jsonl.gz (complete) or X.jsonl.gz.tmp: the
    reader and the next start take the .gz; a plain segment of a dead incarnation is compressed."""
    from oncemesh.common.settlement_log import compress_segment, log_files, segment_name

    def seg(inc: str, n: int, gid: str) -> Path:
        p = tmp_path / segment_name("A.settlement", inc, n)
        p.write_text(json.dumps({"v": 1, "ts": 1.0, "src": "router", "node": "A", "inc": inc,
                                 "ev": "delivered", "gid": gid}) + "\n")
        return p

    both = seg("1", 1, "g1")
    copy = both.read_bytes()
    compress_segment(both)
    both.write_bytes(copy)  # the crash came before the plain one was removed
    seg("1", 2, "g2").with_name(segment_name("A.settlement", "1", 2) + ".gz.tmp").write_bytes(b"\x1f\x8b")
    seg("1", 3, "g3")
    assert gids(read_segments(tmp_path)) == ["g1", "g2", "g3"]  # read once each, .tmp ignored
    log = SettlementLog(tmp_path / "A.settlement.jsonl", src="router", node="A", inc="2", segments=Segments())
    log.write("router_started", 5.0)
    log.close()
    assert all(f.name.endswith(".jsonl.gz") for f in tmp_path.iterdir())
    assert len(log_files(tmp_path)) == 4
    assert gids(read_segments(tmp_path)) == ["g1", "g2", "g3"]


class FullDisk:
    """A write function over a disk with `room` bytes left; `room = None`: no limit."""

    def __init__(self, room: int | None) -> None:
        self.room = room

    def __call__(self, fd: int, data: memoryview) -> int:
        if self.room is not None and self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = len(data) if self.room is None else min(len(data), self.room)
        if self.room is not None:
            self.room -= n
        return os.write(fd, data[:n])


def test_a_full_disk_holds_every_line_blocks_and_resumes_without_a_torn_line(tmp_path: Path) -> None:
    disk = FullDisk(room=500)
    events: list[bool] = []
    log = SettlementLog(tmp_path / "A.settlement.jsonl", src="router", node="A", inc="7",
                        segments=Segments(compress=False), hold=True, on_writable=events.append,
                        write_fn=disk)
    for i in range(20):
        log.write_core_events(1.0 + i, [("delivered", f"p:{i}", "t", "s" * 16, None)])
        log.flush()  # in hold mode a full disk does not raise
    assert events == [False] and not log.writable and log.pending_bytes > 0
    assert log.stats()["log_writable"] is False and "No space" in log.stats()["log_blocked_reason"]
    log.flush()
    assert events == [False]  # still full: no flapping
    disk.room = None  # space returns
    log.flush()
    assert events == [False, True] and log.writable and log.pending_bytes == 0
    log.close()
    assert gids(read_segments(tmp_path)) == [f"p:{i}" for i in range(20)]  # none lost, none torn


def test_free_space_below_the_floor_holds_the_log_like_a_full_disk(tmp_path: Path) -> None:
    free = [10_000]
    events: list[bool] = []
    log = SettlementLog(tmp_path / "A.settlement.jsonl", src="router", node="A", inc="7",
                        segments=Segments(compress=False, free_floor_bytes=1_000_000), hold=True,
                        on_writable=events.append, free_bytes_fn=lambda _d: free[0])
    log.write("router_started", 1.0)
    log.flush()
    assert events == [False] and "below the floor" in log.block_reason
    assert log.open_segment is not None and log.open_segment.stat().st_size == 0
    free[0] = 2_000_000
    log.flush()
    assert events == [False, True]
    log.close()
    assert [x["ev"] for x in read_segments(tmp_path)] == ["router_started"]


def test_a_client_log_raises_on_a_full_disk_but_keeps_the_line_for_a_retry(tmp_path: Path) -> None:
    """Clients flush before they act: the flush must fail (so the client does not act), and the
    line must still be written by a later flush."""
    disk = FullDisk(room=0)
    path = tmp_path / "c.subscriber.jsonl"
    log = SettlementLog(path, src="subscriber", node="c", inc="r1", write_fn=disk)
    log.write("handed", 1.0, "p:1", "t", "s", link="l", n=1)
    with pytest.raises(OSError) as err:
        log.flush()
    assert err.value.errno == errno.ENOSPC and not log.writable
    disk.room = None
    log.flush()
    log.close()
    assert gids(read(path)) == ["p:1"]


def test_oncemesh_status_shows_a_blocked_settlement_log() -> None:
    from oncemesh.topology.launcher import Mesh, RouterState, RouterStatus, format_table

    assert Mesh is not None
    ok = RouterStatus("A", RouterState.RUNNING, 1, url="amqp://h:1", converged=True)
    full = RouterStatus("B", RouterState.RUNNING, 2, url="amqp://h:2", converged=True,
                        log_blocked="No space left on device")
    table = format_table([ok, full])
    [a_row] = [r for r in table.splitlines() if r.startswith("A ")]
    [b_row] = [r for r in table.splitlines() if r.startswith("B ")]
    assert "LOG BLOCKED" not in a_row and "LOG BLOCKED: No space left on device" in b_row


def test_the_core_grants_no_publisher_credit_while_the_log_cannot_be_written() -> None:
    """set_log_writable(False) stops credit (separately from `ready`); True tops the links up."""
    from oncemesh.common.ids import publisher_link_id
    from oncemesh.router.actions import GrantCredit
    from oncemesh.router.core import CoreConfig, DeliveryCore
    from oncemesh.router.subscriptions import SubscriptionTable

    core = DeliveryCore("R", SubscriptionTable(), CoreConfig(link_credit=8))
    link = object()

    def credit() -> int:
        out, core.out = core.out, []
        return sum(a.credit for a in out if isinstance(a, GrantCredit))

    core.set_log_writable(False)
    core.attach_publisher(link, publisher_link_id("pub", "p"), "t", True, None, 0.0)
    assert credit() == 0 and core.ready  # ready, yet no credit: the log is blocked
    core.set_ready(True)
    assert credit() == 0
    core.set_log_writable(True)
    assert credit() == 8


def _rotated_ten_times(tmp_path: Path) -> SettlementLog:
    """A segmented log that rotated (and handed closed segments to its worker) about ten times, closed."""
    log = SettlementLog(tmp_path / "A.settlement.jsonl", src="router", node="A", inc="7",
                        segments=Segments(max_bytes=300, max_seconds=0))
    for i in range(10):
        log.write_core_events(1.0 + i, [("delivered", f"p:{i}", "t", "s" * 16, None)] * 2)
        log.flush()
    log.close()
    return log


def test_compression_runs_on_the_housekeeping_thread_not_the_writers(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import oncemesh.common.settlement_log as sl

    threads: list[int] = []
    real = sl.compress_segment

    def spy(path: Path) -> Path:
        threads.append(threading.get_ident())
        return real(path)

    monkeypatch.setattr(sl, "compress_segment", spy)
    _rotated_ten_times(tmp_path)
    assert len(threads) >= 3 and threading.get_ident() not in threads


def test_the_housekeeper_hands_freed_memory_back_after_each_job(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """After each compression the housekeeping thread calls malloc_trim (glibc): a new worker
    thread's malloc arena otherwise kept what the compression freed (RSS steps of 2-7 MB in line3
    soaks). On glibc the real function is found."""
    import platform
    import threading

    import oncemesh.common.settlement_log as sl

    if platform.libc_ver()[0] == "glibc":
        assert sl.release_free_memory is not None and sl.release_free_memory() in (0, 1)
    trimmed: list[int] = []
    monkeypatch.setattr(sl, "release_free_memory", lambda: trimmed.append(threading.get_ident()) or 1)
    _rotated_ten_times(tmp_path)
    compressed = [f for f in tmp_path.iterdir() if f.name.endswith(".jsonl.gz")]
    assert len(trimmed) >= len(compressed) >= 3 and threading.get_ident() not in trimmed


def test_a_segment_larger_than_the_read_buffer_compresses_to_the_same_bytes(tmp_path: Path) -> None:
    import gzip
    import random

    from oncemesh.common.settlement_log import compress_segment

    rng = random.Random(7)
    data = b"".join(b'{"v":2,"n":%d,"x":"%s"}\n' % (i, rng.randbytes(20).hex().encode()) for i in range(60_000))
    assert len(data) > 3 * (1 << 20)  # several reads of the 1 MiB buffer, the last one partial
    seg = tmp_path / "A.settlement.7.000001.jsonl"
    seg.write_bytes(data)
    gz = compress_segment(seg)
    assert not seg.exists() and gz.name == seg.name + ".gz" and gzip.decompress(gz.read_bytes()) == data


# ---------------------------------------------------------------------- schema v2 (segmented logs)
plids = st.sampled_from(["abcdefghijkl", "mnopqrstuvwx", "a"])  # ("a": a gid too short to share a prefix)
v2_ids = st.builds(lambda p, sep, tag: p + sep + tag, plids, st.sampled_from([":", "#"]),
                   st.from_regex(r"[a-z0-9]{0,6}", fullmatch=True))
v2_entries = st.lists(st.tuples(
    st.sampled_from(["received", "delivered", "accepted", "outcome", "settled", "ended", "rejected",
                     "released", "placeholder", "forwarded"]),
    v2_ids, st.sampled_from(["t", "orders/é", None]), st.sampled_from([None, "s" * 16, "z" * 16]),
    st.sampled_from([None, "remote", "redelivery", "owed", "accepted_by", "peer", "count", "error"])),
    max_size=25)


def _info(kind: str | None) -> Any:
    from oncemesh.common.settlement_log import Owed, Peer

    return {"owed": Owed([("s1", "A"), ("s2", None)]), "accepted_by": AcceptedBy(2), "peer": Peer("B,C"),
            "count": {"count": 3}, "error": ("amqp:x", "no \"thanks\"")}.get(kind or "", kind)


def _expected(ev: str, gid: str, topic: str | None, sid: str | None, kind: str | None) -> dict[str, Any]:
    e: dict[str, Any] = {"ev": ev, "gid": gid}
    if topic is not None:
        e["topic"] = topic
    if sid is not None:
        e["sub"] = sid
    e.update({"owed": {"owed": {"A": "s1", "": "s2"}}, "accepted_by": {"outcome": "ACCEPTED"},
              "peer": {"peer": "B,C"}, "count": {"count": 3}, "error": {"error": 'amqp:x: no "thanks"'},
              None: {}}.get(kind, {"info": kind}))
    return e


@settings(max_examples=40, deadline=None)
@given(passes=st.lists(st.tuples(st.floats(0, 5), v2_entries), min_size=1, max_size=4))
def test_v2_lines_read_back_as_the_events_written(tmp_path_factory: Any,
                                                  passes: list[tuple[float, list[tuple[Any, ...]]]]) -> None:
    """Whatever the core hands the writer in a flush pass comes back from `read_events` as one
    event per id, with the writer's fields from the header and the pass's latest time."""
    from oncemesh.common.settlement_log import log_files, read_events

    d = tmp_path_factory.mktemp("v2")
    log = SettlementLog(d / "A.settlement.jsonl", src="router", node="A", inc="7",
                        segments=Segments(max_bytes=0, max_seconds=0, compress=False))
    t = 1_800_000_000.0
    want: list[tuple[float, dict[str, Any]]] = []
    for dt, entries in passes:
        t += dt
        log.write_core_events(t, [(ev, g, topic, sid, _info(kind)) for ev, g, topic, sid, kind in entries])
        log.flush()
        want += [(t, _expected(*e)) for e in entries]
    log.close()
    [f] = log_files(d)
    got = [e for e in read_events(f) if e["ev"] not in ("segment_opened", "segment_closed")]
    assert all(e["v"] == 2 and e["src"] == "router" and e["node"] == "A" and e["inc"] == "7" for e in got)
    norm = sorted((json.dumps({k: v for k, v in e.items() if k not in ("v", "ts", "src", "node", "inc")},
                              sort_keys=True), e["ts"]) for e in got)
    expected = sorted((json.dumps(e, sort_keys=True), ts) for ts, e in want)
    assert [e for e, _ in norm] == [e for e, _ in expected]
    assert all(abs(a - b) < 2e-6 for (_, a), (_, b) in zip(norm, expected, strict=True))  # microseconds


def test_every_v2_segment_has_its_header_and_a_closed_one_its_trailer(tmp_path: Path) -> None:
    from oncemesh.common.settlement_log import log_files, read_lines

    log = SettlementLog(tmp_path / "A.settlement.jsonl", src="router", node="A", inc="7",
                        segments=Segments(max_bytes=300, max_seconds=0, compress=False))
    for i in range(30):
        log.write_core_events(1.0 + i, [("delivered", f"abcdefghijkl:{i}", "t", "s" * 16, None)])
        log.flush()
    log.flush()
    open_seg = log.open_segment
    files = log_files(tmp_path)
    assert len(files) > 3
    for n, f in enumerate(files, 1):
        lines = [json.loads(x) for x in read_lines(f)]
        assert lines[0] == {"v": 2, "h": "segment", "t0": lines[0]["t0"], "src": "router", "node": "A",
                            "inc": "7", "seg": n}
        assert (lines[-1].get("e") == "segment_closed" and lines[-1]["seg"] == n) == (f != open_seg)
    # an idle segment is not empty: it rotates by age like any other (a live audit's watermark)
    idle = SettlementLog(tmp_path / "B.settlement.jsonl", src="router", node="B", inc="1",
                         segments=Segments(max_bytes=0, max_seconds=60, compress=False))
    idle.flush()
    first = idle.open_segment
    idle._seg_opened -= 61
    idle.flush()
    assert idle.open_segment != first
    idle.close()


def test_the_engine_writes_the_log_before_any_connection_is_flushed() -> None:
    """Write-ahead evidence: within a loop pass, the after-pass work (the router's drain, which
    writes the core's log lines into the buffer) runs first, then the `before_output` hooks (the
    settlement log's flush), then every dirty connection is flushed."""
    import asyncio

    from oncemesh.common.engine import Engine

    order: list[str] = []

    class Conn:
        dirty = True

        def flush(self) -> None:
            order.append("output")

    async def main() -> None:
        eng = Engine(asyncio.get_running_loop())
        eng.before_output.append(lambda: order.append("log written"))
        eng.mark_dirty(Conn())  # type: ignore[arg-type]
        eng.call_after_pass(lambda: order.append("drain"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert order == ["drain", "log written", "output"]


def test_core_events_a_stall_split_keep_their_own_times(tmp_path: Path) -> None:
    """Within one flush, events decided before a stall (SIGSTOP, a starved CPU) are not stamped
    with the time of events after it: a router frozen mid-pass must not date a hand-over it decided
    before the freeze to after the freeze (docs/settlement-log.md, "Times"). Events close together
    still share one line."""
    from oncemesh.common.settlement_log import STALL_GAP, log_files, read_events

    log = SettlementLog(tmp_path / "A.settlement.jsonl", src="router", node="A", inc="7",
                        segments=Segments(max_bytes=0, max_seconds=0, compress=False))
    t = 1_800_000_000.0
    log.write_core_events(t, [("delivered", "abcdefghijkl:1", "t", "s" * 16, None)])
    log.write_core_events(t + STALL_GAP / 10, [("delivered", "abcdefghijkl:2", "t", "s" * 16, None)])
    log.write_core_events(t + 3.8, [("delivered", "abcdefghijkl:3", "t", "s" * 16, None)])
    log.flush()
    log.close()
    [f] = log_files(tmp_path)
    got = {e["gid"]: e["ts"] for e in read_events(f) if e["ev"] == "delivered"}
    assert got["abcdefghijkl:1"] == got["abcdefghijkl:2"] == pytest.approx(t + STALL_GAP / 10, abs=2e-6)
    assert got["abcdefghijkl:3"] == pytest.approx(t + 3.8, abs=2e-6)


def test_the_router_dates_what_it_decided_before_performing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Router.drain`: the core's events from before the drain are written first, stamped when
    the drain began (or when the input that made them was taken); a freeze while the actions are
    performed dates only what the actions made meanwhile after it."""
    from types import SimpleNamespace

    from oncemesh.router import server

    clock = [1_800_000_000.0]
    monkeypatch.setattr(server.time, "time", lambda: clock[0])
    written: list[tuple[float, list[Any]]] = []

    class Fake:
        core = SimpleNamespace(log=[("delivered", "g:1", "t", "s", None)], out=[object()])
        _pending_opens: list[Any] = []
        table = SimpleNamespace(version=1)
        _saved_version = 1
        engine: Any = None
        _decided: float | None = None

        def _perform(self, out: list[Any]) -> None:
            clock[0] += 3.8  # frozen while the hand-over is performed
            self.core.log.append(("ended", "g:0", "t", "s", "final elsewhere"))

        def _write_core_log(self, stamp: float, entries: list[Any]) -> None:
            written.append((stamp, [e[0] for e in entries]))

    server.Router.drain(Fake())  # type: ignore[arg-type]
    assert written == [(1_800_000_000.0, ["delivered"]), (1_800_000_003.8, ["ended"])]
    written.clear()
    Fake.core.log.append(("delivered", "g:2", "t", "s", None))
    server.Router.drain(Fake(), decided=1_800_000_001.0)  # type: ignore[arg-type]
    assert written[0] == (1_800_000_001.0, ["delivered"])
    # with an engine: the time this pass's latest input was taken (a client's transfer, read and
    # decided before the freeze, drained after it)
    written.clear()
    fake = Fake()
    fake.engine = SimpleNamespace(input_time=lambda: 1_800_000_000.5)
    fake.core.log.append(("delivered", "g:3", "t", "s", None))
    server.Router.drain(fake)  # type: ignore[arg-type]
    assert written[0] == (1_800_000_000.5, ["delivered"])
    # mesh frames taken earlier in the pass wait for this drain (`Router.taking`): dated by their
    # read, not by a later read of the pass
    written.clear()
    fake._decided = 1_800_000_000.2
    fake.core.log.append(("delivered", "g:4", "t", "s", None))
    server.Router.drain(fake)  # type: ignore[arg-type]
    assert written[0] == (1_800_000_000.2, ["delivered"]) and fake._decided is None


def test_a_routers_total_order_journal_is_not_taken_for_a_settlement_log(tmp_path: Path) -> None:
    # (a chaos run of mesh4, whose topic `orders` is in total order: reconcile warned of 22 malformed
    # lines, the journals' votes, `A.order.orders.seq.jsonl` among the routers' logs)
    from oncemesh.common.settlement_log import log_files

    (tmp_path / "A").mkdir()
    (tmp_path / "A" / "A.order.orders.seq.jsonl").write_text('{"base": 0}\n')
    (tmp_path / "A" / "A.order.a%2Fb.seq.jsonl").write_text('{"base": 0}\n')
    log = tmp_path / "A" / "A.settlement.1.000001.jsonl"
    log.write_text("")
    client = tmp_path / "c1.subscriber.jsonl"
    client.write_text("")
    assert log_files(tmp_path) == sorted([log, client])
