"""Benchmark of the reconciliation: a synthetic run of ~10 million log records, judged on local[2].

    python -m spark.bench                       # 10M records, local[2], data cached in /tmp
    python -m spark.bench --records 1e6 --master 'local[4]' --driver-memory 4g

Prints the generation time, the job's wall time (Spark session start excluded and shown apart),
records/s, and peak memory: the Python driver's and the JVM's (peak resident set, VmHWM), which on a
local master holds the whole job. The verdict is checked against the generator's expected counts, so
a fast wrong answer fails the benchmark (exit 1).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from .synth import ANOMALIES, SynthConfig, generate

DEFAULT_DATA = Path(tempfile.gettempdir()) / "oncemesh-bench"
CHECKED = (*("ok", *ANOMALIES), "messages", "pairs", "log_lines", "unsettled_live", "unsettled_dead")


def base_config(seed: int = 1) -> SynthConfig:
    """4 publishers, 2 routers, 2 subscriptions on one topic (one per router: half the messages
    cross the mesh), 10 pairs of every anomaly class, a router restart with stuck records."""
    return SynthConfig(messages=1000, publishers=4, subscriptions=2, routers=2, topics=1,
                       anomalies=dict.fromkeys(ANOMALIES, 10), stuck_dead=10, stuck_live=10,
                       malformed=10, newer=10, rate=5000.0, seed=seed)


def lines_per_message(cfg: SynthConfig) -> float:
    """Measured on a small sample of the same shape."""
    tmp = Path(tempfile.mkdtemp(prefix="oncemesh-bench-cal-"))
    try:
        a = generate(replace(cfg, messages=4000, chunks=1), tmp / "a")["log_lines"]
        b = generate(replace(cfg, messages=8000, chunks=1), tmp / "b")["log_lines"]
        return (b - a) / 4000
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare(records: int, data: Path, seed: int) -> tuple[dict[str, Any], float]:
    """Synthetic logs of about `records` lines under `data` (reused when the same config is there).
    Returns (expected counts, seconds spent generating: 0 when reused)."""
    cfg = base_config(seed)
    cfg = replace(cfg, messages=math.ceil(records / lines_per_message(cfg)))
    want = {**asdict(cfg), "anomalies": dict(cfg.anomalies)}
    meta = data / "expected.json"
    if meta.exists():
        saved = json.loads(meta.read_text())
        if saved.get("config") == want:
            return saved["expected"], 0.0
    shutil.rmtree(data, ignore_errors=True)
    t = time.monotonic()
    exp = generate(cfg, data)
    return exp, time.monotonic() - t


def vm_hwm_kb(pid: int) -> int:
    """Peak resident set size of a process (Linux /proc), in KiB; 0 when unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spark.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=float, default=10_000_000, help="log records (default 1e7)")
    ap.add_argument("--data", type=Path, default=None, help=f"where the logs go (default {DEFAULT_DATA}-N)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--shuffle-partitions", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="also write the results (default: summary only)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    records = int(a.records)
    data = a.data or Path(f"{DEFAULT_DATA}-{records}")

    from .job import find_logs, hadoop_safe, run, spark_session

    expected, gen_s = prepare(records, data, a.seed)
    lines = int(expected["log_lines"])
    print(f"data: {data} ({lines:,} lines, {sum(f.stat().st_size for f in data.glob('*.jsonl')) / 2**20:,.0f} MiB"
          + (f", generated in {gen_s:.1f} s = {lines / gen_s:,.0f} lines/s)" if gen_s else ", reused)"))
    t0 = time.monotonic()
    spark, _ = spark_session(a.master, a.driver_memory, a.shuffle_partitions, app_name="oncemesh-bench")
    start_s = time.monotonic() - t0
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "a live Spark session has its JVM gateway"
    jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
    files = find_logs([data])
    try:
        t1 = time.monotonic()
        with hadoop_safe(files) as readable:
            summary, _ = run(spark, readable, out=a.out, since=None, skew=0.0, chart=a.out is not None,
                             n_files=len(files))
        job_s = time.monotonic() - t1
        jvm_kb = vm_hwm_kb(jvm_pid)
    finally:
        spark.stop()
    py_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    got = summary.to_dict()
    wrong = {k: (got[k], expected[k]) for k in CHECKED if got[k] != expected[k]}
    print(f"master {a.master}, driver memory {a.driver_memory}, shuffle partitions {partitions}")
    print(f"spark session start: {start_s:.1f} s")
    print(f"reconcile: {lines:,} records in {job_s:.1f} s = {lines / job_s:,.0f} records/s")
    print(f"peak memory: driver (python) {py_kb / 1024:,.0f} MiB + JVM {jvm_kb / 1024:,.0f} MiB "
          f"= {(py_kb + jvm_kb) / 1024:,.0f} MiB")
    print(f"verdict: {got['verdict']} ({', '.join(f'{k}={got[k]}' for k in ('ok', *ANOMALIES))})")
    if wrong:
        print(f"WRONG: {wrong}", file=sys.stderr)
        return 1
    print("counts match the generator's expected counts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
