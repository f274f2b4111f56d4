"""The settlement log writer: the hot-path shapes write exactly what the generic path writes."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from oncemesh.common.settlement_log import FIELDS, AcceptedBy, SettlementLog, SizeCount

ids = st.from_regex(r"[a-z0-9]{1,12}:[a-z0-9]{1,6}", fullmatch=True)
topics = st.text(min_size=1, max_size=20)  # any text: topics are JSON-escaped


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
    from oncemesh.harness.testing import LogSummary

    def handed(ts: float, n: int, gid: str) -> str:
        return json.dumps({"v": 1, "ts": ts, "src": "subscriber", "ev": "handed", "gid": gid, "sub": "s", "n": n})

    p = "abcdefghijkl"
    (tmp_path / "a.subscriber.jsonl").write_text("\n".join([
        handed(1.0, 1, f"{p}:1"), handed(1.0, 2, f"{p}:2"), handed(2.0, 3, f"{p}:5")]) + "\n")
    (tmp_path / "b.subscriber.jsonl").write_text(handed(3.0, 1, f"{p}:6") + "\n")  # a later process
    assert LogSummary(tmp_path).check_fifo(["s"]) == []
    (tmp_path / "c.subscriber.jsonl").write_text(handed(4.0, 1, f"{p}:4") + "\n")
    [problem] = LogSummary(tmp_path).check_fifo(["s"])
    assert f"{p}:4" in problem and "1 handed after" in problem
