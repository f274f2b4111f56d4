"""`oncemesh audit` beside a live mesh: plain Proton clients publish over line3 (segments closed every
second), the audit, started once every router has closed a segment past the last outcome, judges
every pair from the closed segments while the routers go on closing one a second, then a forged
closed segment says a subscription was handed a message again on a later link and accepted it a
second time: the audit reports that violation within a segment period or two.

    A (sA) --- B (sB) --- C (sC)      plain Proton publisher at A; `Audit` streams over the log dir

The audit starts after the traffic, not before it: its first micro-batch (a cold JVM's) then judges
every pair, where started first it judged them one or two micro-batches later (up to 80 s each on a
loaded 2-core machine). The forged segment is still one the audit sees appear, in a micro-batch
after the ones that judged the pairs (whose events it holds as state).
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from oncemesh.harness.procs import wait_for
from oncemesh.spark.audit import Audit, AuditConfig, start
from tests.conftest import EXAMPLES
from tests.helpers import wait_progressing
from tests.spark.test_foreign_clients import fan_out

pytestmark = pytest.mark.spark

N = 20
# The waits on the audit end by what it does, not by a total: each fails at once when the audit has
# done what must have produced the awaited result (a watermark, a count of micro-batches), and
# otherwise only when Spark does nothing at all for SPARK_STALL seconds: no micro-batch ends, no
# job starts, no task finishes. A micro-batch took up to 80 s on a loaded 2-core machine
# (spark/audit.py, `Audit.tune`), while its tasks, each on a few segments, kept finishing.
SPARK_STALL = 120.0


def spark_progress(spark: SparkSession, audit: Audit) -> tuple[int, int, int]:
    """(micro-batches ended, the latest job running, tasks finished in the stages running)."""
    tracker = spark.sparkContext.statusTracker()
    stages = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
    return (audit.status.batches, max(tracker.getActiveJobsIds(), default=-1),
            sum(st.numCompletedTasks for st in stages if st is not None))


def segments(log_dir: Path, node: str) -> list[Path]:
    """The closed segments of `node`'s settlement log (gzipped, renamed into place whole)."""
    return list(log_dir.glob(f"{node}.settlement.*.jsonl.gz"))


def forge_segment(log_dir: Path, node: str, lines: list[dict[str, Any]]) -> Path:
    """A closed, gzipped v2 segment of a made-up incarnation of `node` (its header an hour back, so
    that the router's real incarnation stays its latest), renamed into place like a real one."""
    t0 = int((time.time() - 3600) * 1e6)
    now = int(time.time() * 1e6) - t0
    header = {"v": 2, "h": "segment", "t0": t0, "src": "router", "node": node, "inc": "forged", "seg": 1}
    body = [header, *({"t": now + i, **x} for i, x in enumerate(lines)),
            {"t": now + len(lines), "e": "segment_closed", "seg": 1}]
    path = log_dir / f"{node}.settlement.forged.000001.jsonl.gz"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gzip.compress("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in body).encode()))
    tmp.rename(path)
    return path


def test_the_live_audit_judges_a_running_mesh_and_reports_a_forged_duplicate(
        spark: SparkSession, mesh_of: Any, tmp_path: Path) -> None:
    topo = tmp_path / "line3.toml"
    topo.write_text("[defaults]\nlog_segment_seconds = 1\n\n" + (EXAMPLES / "line3.toml").read_text())
    mesh = mesh_of(topo)
    urls = {s.id: str(s.url) for s in mesh.status()}
    logs = Path(mesh.log_dir)
    out = tmp_path / "audit"
    cfg = AuditConfig([str(logs)], str(out), trigger=1.0, grace=0.5, router_timeout=60)
    got = fan_out(urls, "plain", N)  # (its waits are per message: each receive and send, TIMEOUT)
    assert all(len(v) == N for v in got.values())
    told = time.time()  # every outcome was logged before its publisher was told: before now
    # the second segment each router closes from now ends a segment period (1 s) after `told`, past
    # `told + grace`: with it, the audit's first micro-batch can judge every pair
    closed = {r: len(segments(logs, r)) for r in urls}
    wait_for(lambda: all(len(segments(logs, r)) >= closed[r] + 2 for r in urls), 60,
             "every router closing two segments after the traffic")
    query, audit = start(spark, cfg)
    progress = lambda: spark_progress(spark, audit)  # noqa: E731
    try:

        def all_ok() -> bool:
            with audit.lock:
                ok, wm, status = audit.status.pairs.get("ok", 0), audit.status.watermark, audit.status.to_dict()
            # a micro-batch whose watermark passed every outcome by `grace` judged every message
            # (spark/audit.py, steps 2 and 3): nothing more is to come
            assert ok >= 3 * N or wm is None or wm < told + cfg.grace, status
            return ok >= 3 * N

        wait_progressing(all_ok, progress, SPARK_STALL, "every pair judged ok by the audit")
        assert audit.status.violations == 0 and audit.status.unjudged == 0, audit.status.to_dict()

        ok = spark.read.parquet(str(out / "verdicts")).where("class = 'ok' and home = 'B'").first()
        assert ok is not None
        gid, sub = ok["gid"], ok["sub"]
        forged_at = time.monotonic()
        forge_segment(logs, "B", [{"e": "delivered", "p": "plain", "s": sub, "g": [gid], "i": "redelivery"},
                                  {"e": "accepted", "p": "plain", "s": sub, "g": [gid]}])
        after = audit.status.batches

        def reported() -> bool:
            with audit.lock:
                seen, batches, status = audit.status.violations, audit.status.batches, audit.status.to_dict()
            # the first micro-batch that starts after the rename lists the forged segment and judges
            # its gid again; the batch running now may have listed the files before it: so the
            # second batch to end from here has reported it
            assert seen >= 1 or batches < after + 2, status
            return seen >= 1

        wait_progressing(reported, progress, SPARK_STALL, "the forged duplicate reported")
        took = time.monotonic() - forged_at
        [v] = audit.status.recent_violations
        assert (v["gid"], v["sub"], v["class"], v["home"]) == (gid, sub, "duplicated", "B")
        status = json.loads((out / "status.json").read_text())
        assert status["violations"] == 1 and status["pairs"]["duplicated"] == 1
        assert status["pairs"]["ok"] == 3 * N - 1 and status["last_segment"] and status["watermark"]
        prom = (out / "metrics.prom").read_text()
        assert "oncemesh_audit_violations 1.0" in prom and 'oncemesh_audit_pairs{class="duplicated"} 1.0' in prom
        print(f"forged duplicate reported {took:.1f} s after its segment appeared")
    finally:
        audit.stop(query)
