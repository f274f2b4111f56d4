"""The table-scale figures (harness/tablescale.py) on a small mesh: they are measured on the real
parts (a whole-table sync merged into an empty table fills it; a second adds nothing) and add up."""

from __future__ import annotations

from oncemesh.harness.tablescale import main, measure


def test_the_figures_add_up_on_a_small_mesh(capsys: object) -> None:
    r = measure(routers=5, subscriptions=400, wildcards=0.25)
    assert r["bytes_per_change"] == (r["update_bytes"] + r["ack_bytes"]) * 4
    assert 200 < r["table_bytes_per_subscription"] < 5000
    assert r["sync_bytes"] > 400 * 100 and r["restart_sync_mb_in"] == round(4 * r["sync_bytes"] / 1e6, 1)
    assert r["owed_per_message"] > 0 and r["match_us"] > 0
    assert main(["--routers", "3", "--subscriptions", "50", "--json"]) == 0
