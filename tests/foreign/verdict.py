"""The two verdicts on a foreign-client run: the clients' own (from their reports) and the routers'
(`oncemesh reconcile --json` over the routers' settlement logs alone).

Clients' view. Every message the publisher was told ACCEPTED must reach every subscription exactly
once once the subscriber drops deliveries whose identity it has seen (docs/promises.md, promise 1: what is
in doubt after a reattach is redelivered under the same tag, the global id). The identity is the
delivery tag where the client shows it, else the message id (JMS). Raw duplicates (the same
identity again) are counted apart: they are expected after a reattach. What dedup cannot hide is a
failure: a message under two identities, two messages under one (dedup would drop one), a message
never published, or one missing.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncemesh.common.ids import global_id, publisher_link_id
from oncemesh.common.settlement_log import GID_PREFIX, expand_gids


@dataclass
class SubscriptionView:
    name: str
    raw: int = 0  # deliveries reported
    raw_duplicates: int = 0  # deliveries of an identity seen before (dedup drops them)
    distinct: int = 0
    missing: list[str] = field(default_factory=list)  # accepted, never delivered
    twice: list[str] = field(default_factory=list)  # delivered under two identities
    conflicts: list[str] = field(default_factory=list)  # one identity, two messages
    unexpected: list[str] = field(default_factory=list)  # never published
    wrong_tags: list[str] = field(default_factory=list)  # tag is not the message's global id


@dataclass
class ClientVerdict:
    sent: int
    accepted: list[str]
    other_outcomes: dict[str, str]
    without_outcome: list[str]
    subs: dict[str, SubscriptionView]

    def problems(self) -> list[str]:
        out = []
        if self.other_outcomes:
            out.append(f"outcomes other than ACCEPTED: {sorted(self.other_outcomes.items())[:5]}")
        if self.without_outcome:
            out.append(f"{len(self.without_outcome)} sent without an outcome, e.g. {self.without_outcome[:5]}")
        for v in self.subs.values():
            for what in ("missing", "twice", "conflicts", "unexpected", "wrong_tags"):
                items = getattr(v, what)
                if items:
                    out.append(f"{v.name}: {len(items)} {what}, e.g. {sorted(items)[:5]}")
        return out

    def summary(self) -> str:
        parts = [f"{len(self.accepted)}/{self.sent} accepted"]
        parts += [f"{v.name}: {v.raw} delivered, {v.raw_duplicates} raw duplicates, {v.distinct} distinct"
                  for v in self.subs.values()]
        return "; ".join(parts)


def client_verdict(link: str, pub: list[dict[str, Any]], subs: Mapping[str, list[dict[str, Any]]],
                   expected_tag: Callable[[str], str] | None, by_tag: bool) -> ClientVerdict:
    """`pub`, `subs`: the reports. `expected_tag`: the global id a subscriber should see for a
    publisher's tag (hex), None when the publisher's tags are unknown (JMS). `by_tag`: the
    subscribers deduplicate by delivery tag (else by message id)."""
    sent = {f"{link}:{e['k']}" for e in pub if e["ev"] == "sent"}
    tag_of = {f"{link}:{e['k']}": e["tag"] for e in pub if e["ev"] == "sent" and e.get("tag")}
    outcome = {f"{link}:{e['k']}": e["outcome"] for e in pub if e["ev"] == "outcome"}
    accepted = sorted(k for k, o in outcome.items() if o == "ACCEPTED")
    verdict = ClientVerdict(len(sent), accepted, {k: o for k, o in outcome.items() if o != "ACCEPTED"},
                            sorted(sent - set(outcome)), {})
    for name, events in subs.items():
        v = verdict.subs[name] = SubscriptionView(name)
        keys_of: dict[str, set[str]] = {}
        for e in events:
            if e["ev"] != "msg":
                continue
            v.raw += 1
            ident = e["tag"] if by_tag else e["id"]
            if ident in keys_of:
                v.raw_duplicates += 1
            keys_of.setdefault(ident, set()).add(e["key"])
            if by_tag and expected_tag is not None and e["key"] in tag_of and e["tag"] != expected_tag(tag_of[e["key"]]):
                v.wrong_tags.append(e["key"])
        v.distinct = len(keys_of)
        v.conflicts = [i for i, ks in keys_of.items() if len(ks) > 1]
        per_key = Counter(k for ks in keys_of.values() for k in ks)
        v.twice = [k for k, n in per_key.items() if n > 1]
        v.missing = [k for k in accepted if k not in per_key]
        v.unexpected = [k for k in per_key if k not in sent]
    return verdict


def gid_for(container: str, link: str) -> Callable[[str], str]:
    """The global id oncemesh gives a message of this publisher link with this tag (hex)."""
    plid = publisher_link_id(container, link)
    return lambda tag_hex: global_id(plid, bytes.fromhex(tag_hex))


# ---------------------------------------------------------------------- the routers' verdict
def reconcile(log_dirs: list[Path], out: Path) -> dict[str, Any]:
    """`oncemesh reconcile LOGDIR... --json`, in-process (it uses the active Spark session of the
    test run), over the routers' settlement logs only: no client writes one here."""
    from oncemesh.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        main(["reconcile", *(str(d) for d in log_dirs), "--json", "--out", str(out), "--no-chart"])
    summary: dict[str, Any] = json.loads(buf.getvalue())
    return summary


# The router-side verdict (docs/reconcile.md, "The JSON of --json"): per (message, subscription in
# force) pair, judged from the origin's owed set and the home routers' delivered/accepted lines
# alone, with what was judged counted per router.
ROUTER_VIEW = "router_view"
ROUTER_FAILURES = ("lost", "duplicated", "false_accept", "unexpected")


def failure_evidence(out: Path, log_dirs: list[Path], limit: int = 3) -> str:
    """For a failed router verdict: the first failing pairs of `out`/router_anomalies.parquet (read
    with the test run's Spark session) and every settlement-log line of their messages, by file, so
    that a failure seen once (in CI, its logs gone) can be understood from its report alone."""
    import gzip

    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        return "(no Spark session: no evidence)"
    rows = (spark.read.parquet(str(out / "router_anomalies.parquet"))
            .where(f"class in ({', '.join(repr(c) for c in ROUTER_FAILURES)})").limit(limit).collect())
    lines = []
    for r in rows:
        lines.append(f"pair {r.asDict()}")
        gid = str(r["gid"])
        for d in log_dirs:
            for f in sorted(Path(d).glob("*.settlement.*.jsonl*")):
                opener = gzip.open if f.suffix == ".gz" else open
                try:
                    with opener(f, "rt") as fh:
                        hits = [ln.rstrip() for ln in fh
                                if gid[:GID_PREFIX] in ln and gid in expand_gids(json.loads(ln).get("g") or ())]
                except (OSError, EOFError, ValueError) as exc:  # a log cut short by a SIGKILL
                    hits = [f"(unreadable past some point: {exc!r})"]
                lines += [f"  {d.parent.parent.name}/{f.name}: {h[:400]}" for h in hits]
    return "\n".join(lines)


def assert_every_pair_ok(summary: dict[str, Any], pairs: int, out: Path, log_dirs: list[Path]) -> dict[str, Any]:
    """Every one of `pairs` judged ok from the routers' logs alone (none redelivered either), nothing
    unjudged, unresolved or ended, no router missing, the run's verdict pass; on a failure of the
    router view, the evidence of `failure_evidence(out, log_dirs)` in the report. Returns the
    router view, for checks of a caller's own (the roles per router)."""
    view: dict[str, Any] = summary[ROUTER_VIEW]
    failures = {c: view.get(c) for c in ROUTER_FAILURES}
    if failures != dict.fromkeys(ROUTER_FAILURES, 0):
        raise AssertionError(f"router view failures {failures}: {view}\n{failure_evidence(out, log_dirs)}")
    assert (view.get("pairs"), view.get("judged"), view.get("ok")) == (pairs, pairs, pairs), view
    assert (view.get("unjudged"), view.get("unresolved"), view.get("ended")) == (0, 0, 0), view
    assert not view.get("missing_routers"), view
    assert summary.get("verdict") == "pass", summary
    return view


def assert_router_verdict(summary: dict[str, Any], pairs: int, routers: list[str],
                          evidence: Callable[[], str] | None = None) -> None:
    """Every one of `pairs` (accepted messages x subscriptions) judged from the routers' logs, each
    ok or redelivered (accepted at a router SIGKILLed before it told anyone, so handed again under
    the same id after the reattach: docs/promises.md, promise 1, the client deduplicates by it), nothing
    unjudged, unresolved or ended; every router that took part counted with pairs it judged; the
    run's verdict pass. `evidence`: called on a failure, its text added to the report."""
    view = summary[ROUTER_VIEW]
    failures = {c: view.get(c) for c in ROUTER_FAILURES}
    if failures != dict.fromkeys(ROUTER_FAILURES, 0):
        detail = evidence() if evidence is not None else ""
        raise AssertionError(f"router view failures {failures}: {view}\n{detail}")
    assert (view.get("pairs"), view.get("judged")) == (pairs, pairs), view
    assert view.get("ok", 0) + view.get("redelivered", 0) == pairs, view
    assert (view.get("unjudged"), view.get("unresolved"), view.get("ended")) == (0, 0, 0), view
    judged = {r["node"]: r["judged_pairs"] for r in view.get("per_router") or []}
    assert sorted(judged) == sorted(routers) and all(judged.values()), view
    assert not view.get("missing_routers"), view
    assert summary.get("verdict") == "pass", summary
