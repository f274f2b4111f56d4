"""`oncemesh soak`'s pure parts: the least-squares slope and its noise, the warm-up cut, the figures
per router, the log-byte and router-log counts, and when a run counts as failed."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncemesh.cli import build_parser
from oncemesh.harness.soak import (
    Sample,
    SoakConfig,
    SoakError,
    SoakResult,
    after_warmup,
    count_events,
    default_warmup,
    dir_bytes,
    fit_line,
    router_figures,
    rss_growth_at_highs,
    run_soak,
    t975,
)


def test_t_quantiles_are_the_table_values_and_never_narrower_between_entries() -> None:
    assert t975(1) == 12.706 and t975(2) == 4.303 and t975(10) == 2.228 and t975(120) == 1.980
    assert t975(11) == t975(10)  # between 10 and 12: the larger (10's) value
    assert t975(1000) == 1.96
    values = [t975(df) for df in range(1, 200)]
    assert values == sorted(values, reverse=True)
    with pytest.raises(ValueError):
        t975(0)


def test_fit_of_four_points_by_hand() -> None:
    """x 0..3, y 1 3 2 4: slope 4/5, intercept 1.3, residuals ±0.3 ±0.9 (SSR 1.8), s = sqrt(0.9),
    stderr s/sqrt(5), interval t(2) = 4.303 times that: 0.8 lies within noise of 0."""
    fit = fit_line([0, 1, 2, 3], [1, 3, 2, 4])
    assert fit is not None
    assert fit.n == 4
    assert fit.slope == pytest.approx(0.8)
    assert fit.intercept == pytest.approx(1.3)
    assert fit.residual_std == pytest.approx(math.sqrt(0.9))
    assert fit.slope_stderr == pytest.approx(math.sqrt(0.9) / math.sqrt(5))
    assert fit.ci95 == pytest.approx(4.303 * math.sqrt(0.9) / math.sqrt(5))
    assert fit.within_noise


def test_an_exact_line_has_no_noise_and_its_slope_is_not_zero() -> None:
    fit = fit_line([0, 1, 2, 3, 4], [10, 12, 14, 16, 18])
    assert fit is not None
    assert fit.slope == pytest.approx(2.0) and fit.intercept == pytest.approx(10.0)
    assert fit.residual_std == pytest.approx(0.0, abs=1e-9) and fit.ci95 == pytest.approx(0.0, abs=1e-9)
    assert not fit.within_noise


def test_too_few_points_or_no_spread_give_no_fit() -> None:
    assert fit_line([], []) is None
    assert fit_line([1, 2], [3, 4]) is None
    assert fit_line([5, 5, 5], [1, 2, 3]) is None
    with pytest.raises(ValueError):
        fit_line([1, 2, 3], [1, 2])


def test_flat_noise_is_within_noise_and_a_small_leak_under_the_same_noise_is_not() -> None:
    rng = random.Random(7)
    xs = [float(i) for i in range(600)]  # ten minutes, a sample a second
    noise = [rng.gauss(0.0, 0.5) for _ in xs]
    flat = fit_line(xs, [100 + e for e in noise])
    leak = fit_line(xs, [100 + 0.01 * x + e for x, e in zip(xs, noise, strict=True)])  # 0.6 MB/min
    assert flat is not None and leak is not None
    assert flat.within_noise and abs(flat.slope) < flat.ci95
    assert not leak.within_noise and leak.slope == pytest.approx(0.01, abs=leak.ci95)
    assert flat.residual_std == pytest.approx(0.5, rel=0.15)


@given(st.floats(-100, 100), st.floats(-1e4, 1e4),
       st.lists(st.integers(0, 10_000), min_size=3, max_size=40, unique=True))
def test_points_on_a_line_give_that_line(slope: float, intercept: float, xs_int: list[int]) -> None:
    xs = [float(x) for x in xs_int]
    fit = fit_line(xs, [intercept + slope * x for x in xs])
    assert fit is not None
    assert fit.slope == pytest.approx(slope, abs=1e-6 * (1 + abs(slope)))
    assert fit.ci95 <= 1e-6 * (1 + abs(slope) + abs(intercept))


def test_scaling_a_fit_scales_slope_and_noise() -> None:
    fit = fit_line([0, 1, 2, 3], [1, 3, 2, 4])
    assert fit is not None
    per_min = fit.scaled(60)
    assert per_min.slope == pytest.approx(48) and per_min.ci95 == pytest.approx(fit.ci95 * 60)
    assert per_min.within_noise == fit.within_noise


def test_warmup_drops_the_early_points() -> None:
    assert after_warmup([(0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0)], 2.0) == ([2.0, 3.0], [3.0, 4.0])


def test_default_warmup_covers_the_final_gid_memory_filling_up() -> None:
    assert default_warmup(1800, 300) == 360  # 30 min: past the 300 s window, a minute more
    assert default_warmup(3600, 300) == 720  # a fifth of a long run
    assert default_warmup(600, 300) == 300  # at most half the run
    assert default_warmup(15, 300) == 7.5
    assert SoakConfig("router", duration=1800).warmup_s == 360
    assert SoakConfig("router", duration=1800, router_settings=(("final_memory", "30"),)).warmup_s == 360
    assert SoakConfig("router", duration=600, router_settings=(("final_memory", "30"),)).warmup_s == 120
    assert SoakConfig("router", duration=1800, warmup=10).warmup_s == 10


def _sample(t: float, rss_mb: float, log: int = 0, lag: float = 1.0, records: int = 0, alive: bool = True) -> Sample:
    return Sample(t, "A", alive, int(rss_mb * 1024) if alive else None, log, lag, lag / 2, lag, 0.5, records,
                  records, records * 100, 2, 0.1)


def test_router_figures_give_maxima_and_slopes_after_the_warmup() -> None:
    """RSS climbs 10 MB in the first 60 s (warm-up), then stays at 60 MB give or take 0.1; the log
    grows 1 MB a minute."""
    rng = random.Random(3)
    samples = [_sample(t, 50 + t / 6 if t < 60 else 60 + rng.uniform(-0.1, 0.1), log=int(t / 60 * 1024 * 1024),
                       lag=40.0 if t == 100 else 2.0, records=int(t) % 7)
               for t in range(0, 300)]
    f = router_figures(samples, warmup=60)
    assert f["samples"] == 300
    assert f["rss_fit_samples"] == 240
    assert f["rss_slope_within_noise"] is True
    assert abs(f["rss_slope_mb_per_min"]) <= f["rss_slope_ci95_mb_per_min"]
    assert f["log_slope_mb_per_min"] == pytest.approx(1.0, abs=0.01) and f["log_slope_within_noise"] is False
    assert f["loop_lag_max_ms"] == 40.0 and f["records_max"] == 6 and f["connections_max"] == 2
    assert f["rss_mb_first"] == 50.0 and f["rss_mb_max"] >= 59.9
    assert f["exited"] is False and f["log_segments_deleted"] is None
    # the same run without a warm-up: the early climb is a slope
    assert router_figures(samples, warmup=0)["rss_slope_within_noise"] is False


def test_rss_growth_is_split_into_steps_at_new_in_flight_highs_and_the_rest() -> None:
    """Flat at 60 MB after the warm-up; +2 MB when records reach a new high (300, the sample after
    the step), +0.5 MB at a level of records seen before (a leak's kind of step), then a spike to
    200 records (not a new high: 300 came first) with a 1 MB step that stays."""
    records = {0: 10, 30: 250}  # the warm-up's high: 250
    rss = 60.0
    samples = []
    for t in range(0, 120):
        rss += {70: 2.0, 90: 0.5, 105: 1.0}.get(t, 0.0)
        rec = {71: 300, 105: 200}.get(t, records.get(t, 20))
        samples.append(_sample(t, rss, records=rec))
    grown, at_highs = rss_growth_at_highs(samples, warmup=60)  # type: ignore[misc]
    assert grown == pytest.approx(3.5) and at_highs == pytest.approx(2.0)
    f = router_figures(samples, warmup=60)
    assert f["rss_growth_after_warmup_mb"] == 3.5 and f["rss_growth_at_inflight_highs_mb"] == 2.0
    # a high in the warm-up counts against later spikes: the same run whose warm-up saw 400
    samples[30] = _sample(30, samples[30].rss_kb / 1024, records=400)  # type: ignore[operator]
    assert rss_growth_at_highs(samples, warmup=60) == (pytest.approx(3.5), 0.0)
    # nothing after the warm-up: no figure
    assert rss_growth_at_highs(samples, warmup=200) is None
    assert router_figures(samples, warmup=200)["rss_growth_after_warmup_mb"] is None


def test_a_router_that_exited_is_noted() -> None:
    f = router_figures([_sample(0, 50), _sample(1, 50), _sample(2, 0, alive=False)], warmup=0)
    assert f["exited"] is True and f["rss_fit_samples"] == 2 and f["rss_slope_mb_per_min"] is None


def test_dir_bytes_counts_every_file_of_a_router_plain_or_compressed(tmp_path: Path) -> None:
    (tmp_path / "A.settlement.1.000001.jsonl.gz").write_bytes(b"x" * 100)
    (tmp_path / "A.settlement.1.000002.jsonl").write_bytes(b"x" * 30)
    (tmp_path / "A.router.log").write_bytes(b"x" * 5)
    (tmp_path / "B.settlement.jsonl").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "A.old").write_bytes(b"x" * 7)
    assert dir_bytes(tmp_path, "A.") == 142
    assert dir_bytes(tmp_path) == 1142
    assert dir_bytes(tmp_path / "nowhere") == 0


def test_count_events_reads_only_the_named_events_in_the_window(tmp_path: Path) -> None:
    log = tmp_path / "A.router.log"
    lines = [{"ts": 10.0, "event": "connection.closed peer=x condition=('amqp:x', 'y')"},
             {"ts": 20.0, "event": "connection.closed peer=y"},
             {"ts": 21.0, "event": "mesh.peer_down peer=B"},
             {"ts": 22.0, "event": "router.loop_lag window_s=60"},
             {"ts": 99.0, "event": "mesh.peer_down peer=B"}]
    log.write_text("\n".join(json.dumps(e) for e in lines) + "\nnot json\n")
    got = count_events(log, ("connection.closed", "mesh.peer_down"), since=15, until=50)
    assert got == {"connection.closed": 1, "mesh.peer_down": 1}
    assert count_events(tmp_path / "missing.log", ("x",), 0, 1) == {}


def test_a_run_fails_on_a_dropped_connection_a_problem_or_a_setup_error(tmp_path: Path) -> None:
    cfg = SoakConfig("router", reconcile=False)
    ok = SoakResult(cfg, tmp_path, samples=[_sample(0, 50)])
    assert ok.exit_code == 0 and ok.verdict == "skipped"
    assert SoakResult(cfg, tmp_path, samples=[_sample(0, 50)], dropped={"router:connection.closed": 1}).exit_code == 1
    assert SoakResult(cfg, tmp_path, samples=[_sample(0, 50)], problems=["witness: short"]).exit_code == 1
    assert SoakResult(cfg, tmp_path, error="the router did not start").exit_code == 2
    unjudged = SoakResult(SoakConfig("router"), tmp_path, samples=[_sample(0, 50)])
    assert unjudged.verdict == "none" and unjudged.exit_code == 1  # reconciliation asked for, none came


def test_soak_is_a_subcommand_whose_help_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["soak", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for word in ("--duration", "--rate", "--order", "--clients", "--json", "--chart", "--no-reconcile",
                 "Exit status", "RSS", "loop lag", "slopes"):
        assert word in text, word
    args = build_parser().parse_args(["soak", "line3", "--order", "lamport", "--rate", "2000"])
    assert (args.target, args.order, args.rate, args.clients) == ("line3", "lamport", 2000.0, "bench")


def test_a_run_that_cannot_be_set_up_says_why_and_starts_nothing(tmp_path: Path) -> None:
    said: list[str] = []
    r = run_soak(SoakConfig("router", order="causal", workdir=tmp_path / "a", reconcile=False), said.append)
    assert r.exit_code == 2 and "--order needs a topology" in str(r.error) and not r.samples
    assert not (tmp_path / "a" / "router").exists()
    r = run_soak(SoakConfig(str(tmp_path / "nowhere.toml"), workdir=tmp_path / "b"), said.append)
    assert r.exit_code == 2 and "no topology file" in str(r.error)
    assert json.loads((tmp_path / "b" / "soak-result.json").read_text())["exit_code"] == 2
    with pytest.raises(SoakError, match="--duration"):
        run_soak(SoakConfig("router", duration=0))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "old").write_text("x")
    with pytest.raises(SoakError, match="not empty"):
        run_soak(SoakConfig("router", workdir=tmp_path / "c"))
