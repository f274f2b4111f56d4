"""`oncemesh reconcile`: exit codes, --json, the files under --out, and synthetic runs whose verdict is
known in advance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from oncemesh.cli import main as oncemesh
from oncemesh.spark import chart
from oncemesh.spark.job import UsageError, find_logs, is_uri, parse_since
from oncemesh.spark.schema import CLASSES
from oncemesh.spark.synth import LogBook, SynthConfig, generate

pytestmark = pytest.mark.spark

TOTALS = ("messages", "pairs", "log_lines", "malformed_lines", "newer_version_lines")
# with lost and in_doubt messages on the anomaly topic, a later anomaly of the same publisher that was
# handed makes them FIFO gaps: the generator counts those
ORDER = ("fifo_reversals", "fifo_gaps", "total_order_disagreements", "causal_violations")


def clean_logs(out: Path, n: int = 3) -> None:
    """One subscription, n messages, every one handed once before ACCEPTED. The subscriber's
    container id has a ':' (so has its file name), which Hadoop paths cannot carry."""
    with LogBook(out) as b:
        b.write("router", "A", "subscribed", 1.0, topic="t", sub="s", container="c", link="l")
        b.write("subscriber", "host:c", "subscribed", 1.01, topic="t", sub="s", container="c", link="l")
        for i in range(n):
            t = 2.0 + i
            b.write("publisher", "P", "published", t, gid=f"g{i}", topic="t", pub="p", link="pl", seq=i)
            b.write("router", "A", "received", t + 0.01, gid=f"g{i}", topic="t", size=1, count=1)
            b.write("subscriber", "host:c", "handed", t + 0.1, gid=f"g{i}", topic="t", sub="s", link="l")
            b.write("publisher", "P", "outcome", t + 0.2, gid=f"g{i}", topic="t", pub="p", link="pl", seq=i,
                    outcome="ACCEPTED")
            b.write("router", "A", "settled", t + 0.3, gid=f"g{i}", topic="t")


def test_find_logs_searches_directories_and_passes_uris_through(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.jsonl").write_text("")
    (tmp_path / "a" / "y.log").write_text("")
    (tmp_path / "z.txt").write_text("")
    got = find_logs([tmp_path / "a", tmp_path / "z.txt", "hdfs://nn:8020/runs/42", f"file://{tmp_path}/a"])
    assert got == [str(tmp_path / "a" / "b" / "x.jsonl"), str(tmp_path / "z.txt"), "hdfs://nn:8020/runs/42"]
    assert is_uri("s3a://bucket/logs") and not is_uri("/tmp/a:b") and not is_uri("file:///tmp")


def test_since_takes_unix_seconds_or_an_iso_date() -> None:
    assert parse_since("1700000000.5") == 1700000000.5
    assert parse_since("2023-11-14T22:13:20+00:00") == 1700000000.0
    assert parse_since(None) is None
    with pytest.raises(UsageError):
        parse_since("last tuesday")


def test_no_logs_found_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "A.router.log").write_text("not a settlement log\n")
    p = subprocess.run([sys.executable, "-m", "oncemesh", "reconcile", str(tmp_path / "empty")],
                       capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert p.returncode == 2
    assert "no settlement logs" in p.stderr and str(tmp_path / "empty") in p.stderr


def test_missing_path_and_bad_since_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    assert oncemesh(["reconcile", str(tmp_path / "nope")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    clean_logs(tmp_path / "logs")
    assert oncemesh(["reconcile", str(tmp_path / "logs"), "--since", "yesterday-ish"]) == 2
    assert "--since" in capsys.readouterr().err


def test_clean_run_exits_0_prints_a_table_and_writes_the_results(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    clean_logs(tmp_path / "state" / "deep" / "logs")  # found recursively
    monkeypatch.setattr(chart, "available", lambda: False)
    out = tmp_path / "out"
    assert oncemesh(["reconcile", str(tmp_path / "state"), "--out", str(out)]) == 0
    cap = capsys.readouterr()
    assert "verdict: PASS" in cap.out
    # the client view's table, then the router view's (these v1 router lines name no owed set)
    assert [ln.split() for ln in cap.out.splitlines() if ln.strip().startswith("ok ")] == [["ok", "3"], ["ok", "0"]]
    assert "unjudged: no_owed_set" in cap.out and "3 pair(s) judged by at least one view, 0 by neither" in cap.out
    assert "matplotlib is not installed" in cap.err
    assert not (out / "reconcile.png").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert {c: summary[c] for c in CLASSES} == {c: (3 if c == "ok" else 0) for c in CLASSES}
    assert spark.read.parquet(str(out / "anomalies.parquet")).count() == 0
    row = spark.read.parquet(str(out / "summary.parquet")).first()
    assert row is not None and (row["ok"], row["messages"], row["verdict"]) == (3, 3, "pass")


def test_synthetic_run_with_every_anomaly_exits_1_and_json_matches_the_known_verdict(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = SynthConfig(messages=600, publishers=3, subscriptions=4, routers=3, topics=2,
                      anomalies={"lost": 1, "duplicated": 2, "unexpected": 1, "in_doubt": 3, "recovered": 1,
                                 "ended_before_delivery": 2, "false_accept": 1},
                      stuck_dead=2, stuck_live=1, malformed=3, newer=2, chunks=2, seed=7)
    expected = generate(cfg, tmp_path / "logs")
    out = tmp_path / "out"
    assert oncemesh(["reconcile", str(tmp_path / "logs"), "--json", "--out", str(out)]) == 1
    cap = capsys.readouterr()
    lines = cap.out.strip().splitlines()
    assert len(lines) == 1  # --json: one object on stdout, the human text goes to stderr
    got = json.loads(lines[0])
    for key in (*CLASSES, *TOTALS, "messages_in_doubt", "unsettled_live", "unsettled_dead", *ORDER):
        assert got[key] == expected[key], key
    assert got["verdict"] == "fail" and got["failures"] == 5
    assert "newer schema version" in cap.err and "malformed" in cap.err
    anomalies = spark.read.parquet(str(out / "anomalies.parquet"))
    assert anomalies.count() == sum(expected[c] for c in CLASSES if c != "ok")
    assert spark.read.json(str(out / "anomalies.json")).count() == anomalies.count()
    if chart.available():
        assert (out / "reconcile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # a JVM of its own: ~2 CPU-minutes on this machine
def test_spark_submit_runs_the_installed_job(tmp_path: Path) -> None:
    """spark/submit.py is what docs/reconcile.md hands to spark-submit: it finds the job by the package's
    one import name (no checkout path), runs it, and its exit status is the verdict."""
    import oncemesh.spark.submit as submit

    clean_logs(tmp_path / "logs")
    spark_submit = Path(sys.executable).parent / "spark-submit"
    p = subprocess.run([str(spark_submit), "--master", "local[1]", submit.__file__, str(tmp_path / "logs"),
                        "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "PYSPARK_PYTHON": sys.executable,
                            "PYSPARK_DRIVER_PYTHON": sys.executable})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "verdict: PASS" in p.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {c: summary[c] for c in CLASSES} == {c: (3 if c == "ok" else 0) for c in CLASSES}
