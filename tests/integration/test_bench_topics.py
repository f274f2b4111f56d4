"""`oncemesh bench --topic-match`: the topic index's figures are well-formed, agree with a naive scan
where one runs beside them, and the command prints them (tiny sizes, except the one command run)."""

from __future__ import annotations

import json
import subprocess
import sys

from oncemesh.harness.bench import _topic_match_text, topic_match_suite


def test_topic_match_figures_are_well_formed_and_agree_with_the_scan() -> None:
    tm = topic_match_suite(sizes=(1, 40, 300), messages=400, scan_messages=400)
    assert set(tm["cases"]) == {"1", "40", "300"}
    assert abs(sum(tm["mix"].values()) - 1) < 1e-9 and tm["tree_levels"] == [8, 10, 50, 50]
    for n, c in tm["cases"].items():
        assert c["subscriptions"] == int(n) and 0 < c["entries"] <= int(n)
        assert 0 < c["cpu_us_per_match"] < 10_000
        assert c["build_s"] >= 0 and c["trie_nodes"] >= 0
        # the index reaches, on average, exactly as many subscriptions as a scan of every filter
        assert c["scan_messages"] == 400
        assert c["matched_per_message"] == c["scan_matched_per_message"]
    assert tm["cases"]["300"]["matched_per_message"] > 0  # the mix makes matches happen
    mem = tm["memory"]
    assert mem["subscriptions"] == 300 and 0 < mem["bytes_per_subscription"] < 100_000
    text = "\n".join(_topic_match_text(tm))
    assert "CPU-us per match" in text and "300" in text and "B per subscription" in text


def test_bench_topic_match_alone_prints_its_section() -> None:
    out = subprocess.run([sys.executable, "-m", "oncemesh", "bench", "--json", "--no-main", "--baselines", "",
                          "--topic-match"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads(out.stdout)
    assert rep["throughput"] == {} and rep["latency"] == {}
    cases = rep["topic_match"]["cases"]
    assert set(cases) == {"1", "1000", "100000"}
    assert all(c["cpu_us_per_match"] > 0 for c in cases.values())
    assert rep["topic_match"]["memory"]["subscriptions"] == 100_000
