"""`oncemesh soak` end to end: a real router under bench-client load and a reconciled witness,
sampled while it runs.

The short run (default test run): one router, 15 s at 200 msg/s, samples every 0.5 s. The long
runs (`-m slow`): line3 in each order mode, scaled with ONCEMESH_SOAK_DURATION (seconds, default
600: memory is judged after the default warm-up, which waits for the final-gid memory to fill) and ONCEMESH_SOAK_RATE (msg/s, default 500); the figures of issue 16 come from the same
command at 600 s and 2,000 msg/s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oncemesh.harness.soak import fit_line

RATE = 200
DURATION = 15
INTERVAL = 0.5


def soak(*args: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = subprocess.run([sys.executable, "-m", "oncemesh", "soak", *args, "--json"], capture_output=True,
                          text=True, timeout=timeout, check=False)
    print(proc.stderr[-6000:])
    return proc, json.loads(proc.stdout)


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


@pytest.mark.spark
def test_short_soak_of_one_router_samples_it_and_passes(tmp_path: Path) -> None:
    work = tmp_path / "run"
    chart = tmp_path / "soak.png"
    try:
        import matplotlib  # noqa: F401

        chart_args = ["--chart", str(chart)]
    except ImportError:
        chart_args = []
    proc, r = soak("router", "--duration", str(DURATION), "--rate", str(RATE), "--interval", str(INTERVAL),
                   "--warmup", "3", "--workdir", str(work), *chart_args, timeout=400)
    assert proc.returncode == 0, (r["problems"], r["error"], r["verdict"])
    assert r["passed"] and r["verdict"] == "pass" and r["exit_code"] == 0
    assert r["connections_dropped"] == 0 and r["dropped"] == {} and not r["problems"]

    # sampled all along: a sample per interval (give or take a slow read), the last after the load
    a = r["routers"]["A"]
    assert a["samples"] >= 0.7 * DURATION / INTERVAL
    samples = [s for s in r["samples"] if s["router"] == "A"]
    assert len(samples) == a["samples"] and samples[-1]["t"] >= DURATION
    assert all(s["alive"] and s["rss_kb"] > 10_000 for s in samples)
    assert any(s["connections"] and s["connections"] >= 4 for s in samples)  # load pub+sub, witness pub+sub
    assert max(s["records"] for s in samples if s["records"] is not None) == a["records_max"]
    assert a["loop_lag_worst_ms"] is not None and a["loop_lag_worst_ms"] < 5000

    # the slopes are the least-squares fit of the samples after the warm-up, per minute
    pts = [(s["t"], s["rss_kb"] / 1024) for s in samples if s["t"] >= 3]
    fit = fit_line([t for t, _ in pts], [y for _, y in pts])
    assert fit is not None and a["rss_fit_samples"] == fit.n
    assert a["rss_slope_mb_per_min"] == pytest.approx(fit.slope * 60, abs=1e-3)
    assert a["rss_slope_ci95_mb_per_min"] == pytest.approx(fit.ci95 * 60, abs=1e-3)
    assert a["rss_slope_within_noise"] == (abs(fit.slope) <= fit.ci95)
    assert a["log_slope_mb_per_min"] > 0  # the settlement log grows with the traffic

    # counts: the bench load by its own clients, the witness by its logs and the reconciliation
    load = r["load"]
    assert load["sent"] >= 0.8 * RATE * DURATION
    assert load["sent"] == load["accepted"] == load["delivered"] and load["out_of_order"] == 0
    w = r["witness"]
    assert w["expected"] == 20 * DURATION  # the default witness rate
    assert w["published"] == w["accepted"] == w["expected"] and w["handed"] == {"w-sub-0": w["expected"]}
    rec = r["reconciliation"]
    assert rec["verdict"] == "pass" and rec["messages"] == w["expected"] and rec["ok"] == w["expected"]
    assert rec["lost"] == rec["duplicated"] == rec["unexpected"] == rec["false_accept"] == 0
    assert r["pairs"] == load["delivered"] + w["expected"]
    assert r["log_bytes_live"] == samples[-1]["log_bytes"] > 0 and r["log_bytes"] > 0
    assert r["log_bytes_per_pair_live"] == pytest.approx(r["log_bytes_live"] / r["pairs"], abs=0.1)

    # the JSON is what was printed, and what was kept; nothing started is left running
    assert json.loads((work / "soak-result.json").read_text())["routers"] == r["routers"]
    assert "RSS slope MB/min" in proc.stderr and "verdict: PASS" in proc.stderr
    assert gone(a["pid"])
    if chart_args:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("order", ["fifo", "causal", "total", "lamport"])
def test_line3_soak_in_each_order_mode(tmp_path: Path, order: str) -> None:
    """line3, load at A, a subscriber at each router, in one order mode: nothing dropped, the
    reconciliation passes, and no router's memory grows by a tenth after the warm-up (total orders:
    an expected failure; their history is compacted, docs/ordering.md "What is bounded", but their
    RSS still grows, outside the Python heap, cause not found: docs/testing.md)."""
    duration = float(os.environ.get("ONCEMESH_SOAK_DURATION", "600"))
    rate = os.environ.get("ONCEMESH_SOAK_RATE", "500")
    proc, r = soak("line3", "--order", order, "--duration", f"{duration:g}", "--rate", rate,
                   "--workdir", str(tmp_path / "run"), timeout=duration + 900)
    assert proc.returncode == 0, (r["problems"], r["error"], r["verdict"])
    assert r["connections_dropped"] == 0 and r["verdict"] == "pass"
    assert set(r["routers"]) == {"A", "B", "C"}
    assert all(gone(f["pid"]) for f in r["routers"].values())
    grown = {rid: f["rss_slope_mb_per_min"] * (duration - r["warmup_s"]) / 60 for rid, f in r["routers"].items()}
    over = {rid: round(g, 1) for rid, g in grown.items() if g >= 0.1 * r["routers"][rid]["rss_mb_max"]}
    assert not over, r["routers"]
