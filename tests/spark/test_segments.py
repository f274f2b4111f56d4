"""The reconciliation reads segmented, gzipped logs exactly as the plain files they were cut from:
the same run judged both ways gets identical verdicts, counts and per-subscription results."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from oncemesh.common.settlement_log import compress_segment
from oncemesh.spark.job import find_logs, reconcile_paths
from oncemesh.spark.schema import CLASSES
from oncemesh.spark.synth import SynthConfig, generate

pytestmark = pytest.mark.spark


def cut_into_segments(src: Path, dst: Path, lines_per_segment: int) -> None:
    """Each log file of `src` as a series of segments in `dst`: every one but the last gzipped (the
    last one is the open segment, plain). The first segment also stays behind as plain (a crash
    between writing its .gz and removing it): readers must take it once."""
    dst.mkdir(parents=True)
    for f in sorted(src.glob("*.jsonl")):
        lines = f.read_bytes().splitlines(keepends=True)
        chunks = [lines[i:i + lines_per_segment] for i in range(0, len(lines), lines_per_segment)] or [[]]
        stem = f.name[:-len(".jsonl")]
        for n, chunk in enumerate(chunks, 1):
            seg = dst / f"{stem}.9.{n:06d}.jsonl"
            seg.write_bytes(b"".join(chunk))
            if n < len(chunks):
                plain = seg.read_bytes()
                compress_segment(seg)
                if n == 1:
                    seg.write_bytes(plain)


def test_the_same_run_gets_identical_verdicts_from_plain_files_and_gzipped_segments(
        spark: SparkSession, tmp_path: Path) -> None:
    """...and a torn tail of an open segment (a SIGKILL in the middle of a write) is one malformed
    line, nothing else: the segments get one, with everything else identical (one reconciliation
    per side; the torn tail was a test and a third reconciliation of its own)."""
    cfg = SynthConfig(messages=400, publishers=2, subscriptions=3, routers=3, topics=2,
                      anomalies={"lost": 1, "duplicated": 1, "unexpected": 1, "in_doubt": 2, "recovered": 1,
                                 "ended_before_delivery": 1, "false_accept": 1},
                      stuck_dead=1, stuck_live=1, malformed=2, newer=1, chunks=1, seed=11)
    expected = generate(cfg, tmp_path / "plain")
    (tmp_path / "plain" / "expected.json").unlink(missing_ok=True)
    cut_into_segments(tmp_path / "plain", tmp_path / "segs", lines_per_segment=97)
    files = find_logs([tmp_path / "segs"])
    assert any(f.endswith(".jsonl.gz") for f in files)
    assert not any(f + ".gz" in files for f in files)  # the crash leftover is not read twice
    with gzip.open(next(f for f in files if f.endswith(".gz")), "rt") as g:
        assert g.readline().startswith("{")  # really gzipped lines
    open_segs = [f for f in (tmp_path / "segs").glob("*.jsonl") if not f.with_name(f.name + ".gz").exists()]
    with open(max(open_segs, key=lambda f: f.stat().st_size), "ab") as f:
        f.write(b'{"v":1,"ts":1700000999.5,"src":"rou')  # SIGKILL in the middle of a write

    plain = reconcile_paths([tmp_path / "plain"], spark=spark, keep_session=True, chart=False)
    segs = reconcile_paths([tmp_path / "segs"], spark=spark, keep_session=True, chart=False)
    assert plain.class_counts() == segs.class_counts()
    assert plain.class_counts() == {c: expected[c] for c in CLASSES}
    for key in ("messages", "pairs", "owed_pairs", "subscriptions", "valid_lines",
                "newer_version_lines", "unsettled_live", "unsettled_dead", "passed"):
        assert getattr(plain, key) == getattr(segs, key), key
    assert (segs.malformed_lines, segs.log_lines) == (plain.malformed_lines + 1, plain.log_lines + 1)
    assert plain.to_dict()["per_subscription"] == segs.to_dict()["per_subscription"]
