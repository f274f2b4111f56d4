"""`oncemesh reconcile` as a user meets it: a few Spark jobs whatever the input, the whole verdict
at the top (each view named, a view that judged nothing says so), and results where --out says or
in a fresh temporary directory it names -- never ./reconcile-out unasked."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from oncemesh.cli import main as oncemesh
from oncemesh.spark.schema import CLASSES
from tests.spark import forge
from tests.spark.test_job import clean_logs

pytestmark = pytest.mark.spark

MAX_JOBS = 10  # docs/reconcile.md, "What a run costs"


def reconcile_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object], str]:
    rc = oncemesh(["reconcile", *args, "--json", "--no-chart"])
    cap = capsys.readouterr()
    lines = cap.out.strip().splitlines()
    assert len(lines) == 1, cap.out
    return rc, json.loads(lines[0]), cap.err


def test_a_small_run_and_forged_histories_each_take_at_most_ten_spark_jobs(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean_logs(tmp_path / "small", 4)
    rc, got, _ = reconcile_json([str(tmp_path / "small"), "--out", str(tmp_path / "out-small")], capsys)
    assert rc == 0 and got["ok"] == 4
    assert isinstance(got["spark_jobs"], int) and 0 < got["spark_jobs"] <= MAX_JOBS, got["spark_jobs"]
    # summary.json says the same (it is written last, with the job that writes summary.parquet counted)
    written = json.loads((tmp_path / "out-small" / "summary.json").read_text())
    assert written["spark_jobs"] == got["spark_jobs"]

    # every forged mutation at once (router logs only): judged exactly as the histories say, in as few jobs
    histories = forge.forge(forge.MUTATIONS, tmp_path / "forged")
    rc, got, _ = reconcile_json([str(tmp_path / "forged"), "--out", str(tmp_path / "out-forged")], capsys)
    assert 0 < int(got["spark_jobs"]) <= MAX_JOBS, got["spark_jobs"]  # type: ignore[call-overload]
    expected = Counter(c for h in histories for c in h.expected.values())
    view = got["router_view"]
    assert isinstance(view, dict)
    assert {c: view[c] for c in expected if c != "unjudged"} == {c: n for c, n in expected.items() if c != "unjudged"}
    assert view["unjudged"] == expected.get("unjudged", 0) and view["pairs"] == sum(expected.values())
    assert rc == 1 and got["verdict"] == "fail"


def test_router_logs_alone_the_top_says_the_router_view_and_that_the_client_view_was_not_judged(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    h = forge.history("q_", random.Random(3), subs=2, messages=2)
    forge.write(h, tmp_path / "logs")
    pairs = len(h.expected)
    assert pairs == 4 and set(h.expected.values()) == {"ok"}
    monkeypatch.chdir(tmp_path)

    rc, got, err = reconcile_json([str(tmp_path / "logs")], capsys)
    assert rc == 0 and got["verdict"] == "pass"
    views = got["views"]
    assert isinstance(views, dict)
    assert views["router"]["judged"] and views["router"]["verdict"] == "pass"
    assert (views["router"]["pairs"], views["router"]["ok"]) == (pairs, pairs)
    assert views["client"] == {"source": views["client"]["source"], "judged": False,
                               "note": "no client logs: not judged"}
    assert got["headline"] == (f"PASS: router view: PASS: {pairs} pair(s): ok {pairs}; "
                               "client view: no client logs: not judged")
    # the client view's counts are not a verdict of 0: null, at the top and in client_view
    assert all(got[c] is None for c in (*CLASSES, "pairs", "owed_pairs", "subscriptions"))
    assert got["client_view"]["judged"] is False and got["client_view"]["ok"] is None  # type: ignore[index]
    # results in a fresh temporary directory, named; nothing in the current directory
    out = Path(str(got["out"]))
    assert out.is_dir() and (out / "summary.json").exists() and not out.is_relative_to(tmp_path)
    assert f"results: {out}" in err and not (tmp_path / "reconcile-out").exists()

    rc = oncemesh(["reconcile", str(tmp_path / "logs"), "--no-chart", "--out", str(tmp_path / "o")])
    text = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert text[0] == "verdict: PASS"
    assert text[1].startswith("  router view (the routers' settlement logs alone): PASS: 4 pair(s): ok 4")
    assert text[2] == "  client view (our clients' settlement logs): no client logs: not judged"
    # no table of zeros for the view that judged nothing
    assert not any(ln.strip().startswith("in_doubt ") for ln in text)
    assert f"results: {tmp_path / 'o'}" in text[-1]
