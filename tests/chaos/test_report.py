"""What the chaos report prints when the router view fails: the routers' log lines of the failing
pairs, so that a run whose directory is gone (a CI run) still says what happened."""

from __future__ import annotations

from pathlib import Path

from oncemesh.harness.chaos import router_evidence
from tests.spark import forge


def test_the_evidence_of_a_duplicated_pair_lists_its_deliveries_and_acceptance_in_time_order(tmp_path: Path) -> None:
    (h,) = forge.forge(["duplicate_delivery"], tmp_path)
    ((gid, sub),) = [k for k, c in h.expected.items() if c == "duplicated"]
    home = h.subs[sub]
    row = {"gid": gid, "sub": sub, "class": "duplicated", "home": home, "origin": "?", "deliveries": 2,
           "dispositions": 1, "delivered_after": 1}
    head, *body = router_evidence([row], tmp_path, t0=forge.BASE)
    assert head.startswith(f"duplicated: {gid} for {sub} (home {home}")
    times = [float(line.split()[0].rstrip("s")) for line in body]
    assert times == sorted(times)
    at_home = [line.split()[2] for line in body if line.split()[1].startswith(f"{home}/")]
    # the home's lines of this pair in time order: handed, accepted, handed again
    assert [e for e in at_home if e in ("delivered", "accepted")] == ["delivered", "accepted", "delivered"]
    assert any(" subscribed" in line and line.split()[1].startswith(f"{home}/") for line in body)  # its lifecycle
    assert not any(f" {other}" in line for other in h.subs if other != sub for line in body)


def test_a_shared_run_judges_no_order_and_its_members_name_one_subscription(tmp_path: Path) -> None:
    """`oncemesh chaos --shared`: the subscribers are members of one shared subscription (their worker's
    --name is its name, with --shared); FIFO reversals are no failure there (no order is promised),
    and are one elsewhere."""
    from oncemesh.harness.chaos import SHARED_NAME, ChaosConfig, ChaosResult, _Run
    from oncemesh.spark.reconcile import Summary
    from oncemesh.topology.load import example_path

    for shared in (True, False):
        r = ChaosResult(1, tmp_path, [], shared=shared)
        r.summary = Summary(ok=10, fifo_reversals=3)
        r.quiescent = True
        assert (r.exit_code, r.order_failures) == ((0, 0) if shared else (1, 3))
    run = _Run(ChaosConfig(example_path() / "line3.toml", 5.0, 1, (), tmp_path / "state", 1, 3, 1.0,
                           shared=True), lambda text: None)
    subs = [c for c in run.clients if c.kind == "consume"]
    assert {c.link for c in subs} == {SHARED_NAME} and len(subs) == 3
    assert all("--shared" in c.args and c.args[c.args.index("--name") + 1] == SHARED_NAME for c in subs)
