"""ClientLogs, the run monitor: incremental reading of client settlement logs, and what it flags.

Synthetic lines in the schema of docs/settlement-log.md; no processes.
"""

from __future__ import annotations

import json
from pathlib import Path

from oncemesh.harness.progress import ClientLogs


def line(src: str, ev: str, ts: float, **kw: object) -> str:
    return json.dumps({"v": 1, "ts": ts, "src": src, "node": "n", "inc": "1", "ev": ev, "topic": "t", **kw}) + "\n"


def test_reads_only_complete_new_lines_and_follows_a_subscription(tmp_path: Path) -> None:
    pub, sub = tmp_path / "p.publisher.jsonl", tmp_path / "s.subscriber.jsonl"
    (tmp_path / "r.settlement.jsonl").write_text(line("router", "received", 1.0, gid="g0"))  # not a client log
    sub.write_text(line("subscriber", "subscribed", 1.0, sub="S", link="sub-0"))
    pub.write_text(line("publisher", "published", 2.0, gid="g1") + line("publisher", "published", 2.1, gid="g2"))
    w = ClientLogs(tmp_path)
    assert w.poll() == 3
    s = w.by_link("sub-0")
    assert s is not None and s.started == 1.0
    assert w.missing(s) == {"g1", "g2"} and w.in_doubt() == {"g1", "g2"}
    with sub.open("a") as f:
        f.write(line("subscriber", "handed", 2.2, gid="g1", sub="S"))
        f.write(line("subscriber", "handed", 2.3, gid="g2", sub="S")[:-10])  # a line being written
    assert w.poll() == 1 and w.missing(s) == {"g2"}
    with sub.open("a") as f:
        f.write(line("subscriber", "handed", 2.3, gid="g2", sub="S")[-10:])
    assert w.poll() == 1 and w.missing(s) == set() and w.poll() == 0
    assert w.last_handed() == 2.3


def test_flags_duplicates_and_acceptance_before_hand_over(tmp_path: Path) -> None:
    (tmp_path / "p.publisher.jsonl").write_text(
        line("publisher", "published", 2.0, gid="g1") + line("publisher", "outcome", 3.0, gid="g1", outcome="ACCEPTED")
        + line("publisher", "published", 2.0, gid="g2") + line("publisher", "outcome", 3.0, gid="g2", outcome="ACCEPTED")
        + line("publisher", "published", 2.0, gid="g3") + line("publisher", "outcome", 3.0, gid="g3", outcome="ACCEPTED"))
    (tmp_path / "s.subscriber.jsonl").write_text(
        line("subscriber", "subscribed", 1.0, sub="S", link="sub-0")
        + line("subscriber", "handed", 2.5, gid="g1", sub="S") + line("subscriber", "handed", 2.6, gid="g1", sub="S")
        + line("subscriber", "handed", 4.0, gid="g2", sub="S"))  # g2 handed after ACCEPTED; g3 never
    (tmp_path / "e.subscriber.jsonl").write_text(  # an ended subscription is owed nothing more
        line("subscriber", "subscribed", 1.0, sub="E", link="sub-1") + line("subscriber", "unsubscribed", 1.5, sub="E"))
    w = ClientLogs(tmp_path)
    w.poll()
    assert w.duplicates() == ["subscription sub-0: 1 message(s) handed more than once, e.g. ['g1']"]
    v = w.violations()
    assert len(v) == 2 and "sub-0: 2 message(s) told ACCEPTED before it had them" in v[1] and "'g2', 'g3'" in v[1]
    assert w.in_doubt() == set()


def test_a_torn_or_garbled_line_is_skipped_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "s.subscriber.jsonl").write_text("{not json\n" + line("subscriber", "subscribed", 1.0, sub="S", link="x"))
    w = ClientLogs(tmp_path)
    assert w.poll() == 1 and w.malformed == 1 and w.by_link("x") is not None


def test_a_subscription_to_a_filter_is_owed_what_the_filter_matches(tmp_path: Path) -> None:
    def sub(topic: str, ts: float, **kw: object) -> str:
        return json.dumps({"v": 1, "ts": ts, "src": "subscriber", "node": "n", "inc": "1", "topic": topic, **kw}) + "\n"

    pubs = "".join(line("publisher", "published", 2.0, gid=g, topic=t)
                   for g, t in (("a", "c/p0"), ("b", "c/p1"), ("c", "c/p1/x"), ("d", "other")))
    (tmp_path / "p.publisher.jsonl").write_text(pubs)
    (tmp_path / "s.subscriber.jsonl").write_text(
        sub("c/+", 1.0, ev="subscribed", sub="W", link="wild") + sub("c/p1/#", 1.0, ev="subscribed", sub="R", link="rest")
        + sub("c/p0", 1.0, ev="subscribed", sub="N", link="name"))
    w = ClientLogs(tmp_path)
    w.poll()
    owed = {link: w.owed(s) for link in ("wild", "rest", "name") if (s := w.by_link(link)) is not None}
    assert owed == {"wild": {"a", "b"}, "rest": {"b", "c"}, "name": {"a"}}
