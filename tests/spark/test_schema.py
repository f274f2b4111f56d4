"""The Spark schema and the writer's schema are the same, and what the writer writes reads back."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from oncemesh.clients.subscriber import SETTLEMENT_FIELDS as SUBSCRIBER_FIELDS
from oncemesh.common import settlement_log as W
from oncemesh.spark import reconcile as R
from oncemesh.spark import schema as S

pytestmark = pytest.mark.spark


def test_struct_type_has_one_column_per_writer_field_in_order_with_the_json_type() -> None:
    """The common writer's fields, then the subscriber's own (`n` of `handed`), none twice."""
    writers = {**W.FIELDS, **SUBSCRIBER_FIELDS}
    assert len(writers) == len(W.FIELDS) + len(SUBSCRIBER_FIELDS)
    assert [f.name for f in S.LOG_SCHEMA.fields] == list(writers)
    assert {f.name: f.dataType for f in S.LOG_SCHEMA.fields} == {
        name: S.JSON_TYPES[kind] for name, kind in writers.items()}
    assert S.SCHEMA_VERSION == W.SCHEMA_VERSION


def test_event_names_are_the_writers() -> None:
    assert S.EVENTS_BY_SOURCE == {"router": W.ROUTER_EVENTS, "publisher": W.PUBLISHER_EVENTS,
                                  "subscriber": W.SUBSCRIBER_EVENTS}
    assert S.ROUTER_READ <= W.ROUTER_EVENTS
    assert S.PUBLISHER_READ <= W.PUBLISHER_EVENTS
    assert S.SUBSCRIBER_READ <= W.SUBSCRIBER_EVENTS


def test_lines_of_the_real_writer_read_back_with_the_schema(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    log = W.SettlementLog(path, src="router", node="A", inc="i1")
    log.write("received", 12.5, "g1", "orders", None, size=10, count=2)
    log.write_core_event(13.0, ("rejected", "g1", "orders", "s1", ("amqp:x", "no thanks")))
    log.write_core_event(13.25, ("ended", "g1", "orders", "s2", "expired"))
    log.write("forwarded", 14.0, "g1", "orders", None, peer="B")
    log.close()
    plog = W.SettlementLog(tmp_path / "p.jsonl", src="publisher", node="C", inc="r1")
    plog.write("published", 11.0, "g1", "orders", None, pub="p", link="l", seq=7, size=10)
    plog.write("outcome", 15.0, "g1", "orders", None, pub="p", link="l", seq=7, outcome="REJECTED",
               error="oncemesh:subscriber-rejected: rejected by subscription(s) s1")
    plog.close()
    got = spark.read.schema(S.LOG_SCHEMA).json([str(path), str(tmp_path / "p.jsonl")])
    common = {f: None for f in (*W.FIELDS, *SUBSCRIBER_FIELDS)}

    def row(**kw: object) -> Row:
        return Row(**{**common, "v": 1, **kw})

    expected = [
        row(ts=12.5, src="router", node="A", inc="i1", ev="received", gid="g1", topic="orders", size=10,
            count=2),
        row(ts=13.0, src="router", node="A", inc="i1", ev="rejected", gid="g1", topic="orders", sub="s1",
            error="amqp:x: no thanks"),
        row(ts=13.25, src="router", node="A", inc="i1", ev="ended", gid="g1", topic="orders", sub="s2",
            info="expired"),
        row(ts=14.0, src="router", node="A", inc="i1", ev="forwarded", gid="g1", topic="orders", peer="B"),
        row(ts=11.0, src="publisher", node="C", inc="r1", ev="published", gid="g1", topic="orders", pub="p",
            link="l", seq=7, size=10),
        row(ts=15.0, src="publisher", node="C", inc="r1", ev="outcome", gid="g1", topic="orders", pub="p",
            link="l", seq=7, outcome="REJECTED",
            error="oncemesh:subscriber-rejected: rejected by subscription(s) s1"),
    ]
    assertDataFrameEqual(got, spark.createDataFrame(expected, S.LOG_SCHEMA))
    # and the reconciliation's parser takes every one of them as a valid line
    parsed = R.parse(spark.read.text([str(path), str(tmp_path / "p.jsonl")]))
    assert {r["status"] for r in parsed.select("status").collect()} == {R.OK}


def test_the_subscriber_numbers_its_hand_overs_across_batches(spark: SparkSession, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`n` of the `handed` lines: 1, 2, ... in hand-over order, across batches (which share a ts)."""
    from types import SimpleNamespace

    import oncemesh.clients.subscriber as sub_mod

    path = tmp_path / "c.subscriber.jsonl"
    slog = W.SettlementLog(path, src="subscriber", node="c", inc="r1")
    state = SimpleNamespace(durable=False, remember_subscription=lambda *a: None, hand_over=lambda *a: None,
                            handed=lambda sub: [])
    client = SimpleNamespace(container_id="c", state=state, settlement_log=lambda role: slog,
                             add_owner=lambda owner: None)
    monkeypatch.setattr(sub_mod.amqp, "update", lambda d, s: None)
    s = sub_mod.Subscriber(client, "t", "l")  # type: ignore[arg-type]
    for batch in (["g1", "g2", "g3"], ["g4", "g5"]):
        s._buffer.extend((g, f"d-{g}", b"") for g in batch)
        s._buffered.update(f"d-{g}" for g in batch)
        assert [m.gid for m in s._hand_over(10)] == batch
    slog.close()
    rows = spark.read.schema(S.LOG_SCHEMA).json(str(path)).select("gid", "ts", "n").collect()
    assert [(r["gid"], r["n"]) for r in rows] == [("g1", 1), ("g2", 2), ("g3", 3), ("g4", 4), ("g5", 5)]
    assert len({r["ts"] for r in rows[:3]}) == 1


def test_parse_counts_bad_lines_and_ignores_unknown_fields(spark: SparkSession) -> None:
    lines = [
        '{"v":1,"ts":1.0,"src":"router","node":"A","inc":"1","ev":"settled","gid":"g","future":{"x":[1]}}',
        '{"v":3,"ts":"2024-01-01","src":"router","node":"A","inc":"1","ev":"settled","gid":{"new":1}}',
        '{"v":1,"ts":"soon","src":"router","node":"A","inc":"1","ev":"settled"}',  # wrong type
        '{"v":1,"ts":1.0,"src":"router","node":"A","ev":"settled"}',  # no inc
        '{"v":1,"ts":1.0,"src":"router","node":"A","inc":"1","ev":"sett',  # torn by a SIGKILL
        'not json',
        '{"v":1,"ts":1.0,"src":"router","node":"A","inc":"1","ev":"teleported"}',  # unknown event
        '{"v":1,"ts":1.0,"src":"publisher","node":"A","inc":"1","ev":"settled"}',  # not a publisher event
        '   ',
    ]
    parsed = R.parse(spark.createDataFrame([(x,) for x in lines], "value string"))
    statuses = [r["status"] for r in parsed.select("status").collect()]
    assert statuses == [R.OK, R.NEWER, R.MALFORMED, R.MALFORMED, R.MALFORMED, R.MALFORMED,
                        R.UNKNOWN_EVENT, R.UNKNOWN_EVENT, R.BLANK]
    first = parsed.where("status = 'ok'").select("gid", "ts").first()
    assert first is not None and (first["gid"], first["ts"]) == ("g", 1.0)


def test_v2_segments_read_back_the_same_in_spark_and_in_python(spark: SparkSession, tmp_path: Path) -> None:
    """A router's v2 segments (header, grouped ids, short keys, trailer) give the same events to the
    Spark reader as to `read_events`, and each grouped id is one event."""
    log = W.SettlementLog(tmp_path / "A.settlement.jsonl", src="router", node="A", inc="i1",
                          segments=W.Segments(max_bytes=400, max_seconds=0, compress=True))
    owed = W.Owed([("s1", "A"), ("s2", "B")])
    log.write("router_started", 100.0, info="listen")
    for k in range(6):
        g = [f"abcdefghijkl:{k}{j}" for j in range(3)]
        log.write_core_events(100.5 + k, [("received", x, "t", None, owed) for x in g]
                              + [("delivered", x, "t", "s1", None) for x in g]
                              + [("forwarded", g[0], "t", None, W.Peer("B")),
                                 ("rejected", g[1], "t", "s1", ("amqp:x", "no"))])
        log.write_core_events(100.75 + k, [("accepted", x, "t", "s1", "remote") for x in g]
                              + [("outcome", x, "t", None, W.AcceptedBy(2)) for x in g])
        log.flush()
    log.write("router_stopped", 110.0)
    log.close()
    files = W.log_files(tmp_path)
    assert len(files) > 2 and all(f.name.endswith(".jsonl.gz") for f in files)
    py = [e for f in files for e in W.read_events(f)]
    assert sum(e["ev"] == "received" for e in py) == 18 and sum(e["ev"] == "segment_opened" for e in py) == len(files)
    assert all(e["owed"] == {"A": "s1", "B": "s2"} for e in py if e["ev"] == "received")
    from oncemesh.spark.job import read_logs

    rows = read_logs(spark, [str(f) for f in files]).collect()
    assert {r["status"] for r in rows} == {R.OK}
    cols = ("ts", "src", "node", "inc", "ev", "gid", "topic", "sub", "peer", "outcome", "error", "info", "seg")

    def key(e: dict[str, object]) -> tuple[object, ...]:
        return tuple(round(e[c], 6) if c == "ts" and e.get(c) is not None else e.get(c)  # type: ignore[call-overload]
                     for c in cols)

    assert sorted(map(key, py), key=repr) == sorted((key(r.asDict()) for r in rows), key=repr)
    owed_rows = [r["owed"] for r in rows if r["ev"] == "received"]
    assert owed_rows == [{"A": "s1", "B": "s2"}] * 18
