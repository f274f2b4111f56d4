"""The core's snapshot (router/snapshot.py): what the status, /metrics, /readyz, the management views
and the console see of the delivery core, and the rule that they see nothing else (no module outside
the core reads its private attributes; the readers read `snapshot` only). The core is driven
through its inputs, as the router drives it."""

from __future__ import annotations

import ast
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncemesh.common.ids import publisher_link_id, subscription_id
from oncemesh.common.vocab import Outcome
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.snapshot import CoreSnapshot, Page, Parts, TopicOrder
from oncemesh.router.subscriptions import SubscriptionTable, SubState

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("router", "interrouter", "harness", "api", "clients", "common", "topology", "spark")
# the delivery core's own files: they may read its state (everything else asks it)
CORE_FILES = frozenset({"router/core.py", "router/handing.py", "router/identity.py", "router/meshside.py",
                        "router/sweeps.py", "router/state.py", "router/finals.py", "router/subscriptions.py"})
CORE_DIRS = ("router/order/",)
# modules that only look at the core: `snapshot` is all they may use of it
READERS = ("router/management.py", "router/http.py", "router/statusfile.py", "router/console.py",
           "router/mgmtlink.py")


# ---------------------------------------------------------------------------- the rule, by the source


def _core_named(node: ast.expr, aliases: set[str]) -> bool:
    """`core`, `self.core`, `r.core`, `h.core`, or a name bound to one of those."""
    if isinstance(node, ast.Name):
        return "core" in node.id.lower() or node.id in aliases
    return isinstance(node, ast.Attribute) and "core" in node.attr.lower()


def core_reads(source: str) -> list[tuple[int, str]]:
    """(line, attribute) of every attribute read of something that names the delivery core."""
    tree = ast.parse(source)
    aliases: set[str] = set()
    for node in ast.walk(tree):  # (`c = self.core`: `c` names it too)
        if isinstance(node, ast.Assign) and _core_named(node.value, set()):
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _core_named(node.value, aliases):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr") \
                and len(node.args) >= 2 and _core_named(node.args[0], aliases) \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            found.append((node.lineno, node.args[1].value))
    return sorted(found)


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def _outside_the_core() -> Iterator[tuple[str, str]]:
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in CORE_FILES and not rel.startswith(CORE_DIRS):
                yield rel, path.read_text()


def test_the_scan_finds_a_read_however_it_is_spelt() -> None:
    src = ("core._blocked\nself.core._x\nr.core.records\nc = self.router.core\nc._y\n"
           "getattr(core, '_z')\ncfg.core.total_topics\nother._w\n")
    assert core_reads(src) == [(1, "_blocked"), (2, "_x"), (3, "records"), (5, "_y"), (6, "_z"),
                               (7, "total_topics")]


def test_no_module_outside_the_core_reads_its_private_attributes() -> None:
    found = [f"{rel}:{line} .{attr}" for rel, src in _outside_the_core()
             for line, attr in core_reads(src) if _private(attr)]
    assert not found, f"private attributes of the delivery core read outside it: {found} (ask the core: " \
                      f"its snapshot for a reader, its inputs for the mesh side)"


@pytest.mark.parametrize("rel", READERS)
def test_readers_use_the_snapshot_and_nothing_else_of_the_core(rel: str) -> None:
    src = (ROOT / rel).read_text()
    used = {attr for _, attr in core_reads(src)} - {"snapshot"}
    assert not used, f"{rel} reads {sorted(used)} of the delivery core; readers see it through snapshot()"
    imports = {n.module for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)}
    assert "core" not in imports, f"{rel} imports the delivery core (it needs only router/snapshot.py)"


def test_the_status_reads_the_core_through_its_snapshot() -> None:
    """`Router.ready_info` is the status file, the router view and the stats of /metrics."""
    tree = ast.parse((ROOT / "router/server.py").read_text())
    (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "ready_info"]
    assert {attr for _, attr in core_reads(ast.unparse(fn))} == {"snapshot"}


# ---------------------------------------------------------------------------- what it shows


class Traffic:
    """One core, what its adapter gave it:

    topic t:  a (active, credit 2), b (suspended, never expires), e (ended), r (homed at S)
    topic tc: c (active, causal order)
    topic tt: no subscription (total order); publisher q sent 2, the first numbered
    publisher p on t sent 3; the budget (5 messages) leaves both publishers short of credit
    """

    def __init__(self) -> None:
        table = SubscriptionTable()
        self.r = subscription_id("x", "r", "t")
        table.attach(self.r, "t", "x", "r", 30.0, "S", 0.1)
        self.core = core = DeliveryCore("R", table, CoreConfig(
            link_credit=3, max_inflight_messages=5, total_topics=frozenset({"tt"}), causal_groups={"tc": "g"}))
        self.a, self.b, self.e, self.c = (subscription_id("c", n, t) for n, t in
                                          (("a", "t"), ("b", "t"), ("e", "t"), ("c", "tc")))
        la, lb, le = object(), object(), object()
        core.attach_subscriber(la, self.a, "t", "c", "a", 60.0, True, None, 0.0)
        core.subscriber_credit(self.a, 2)
        core.attach_subscriber(lb, self.b, "t", "c", "b", math.inf, True, None, 0.5)
        core.detach_subscriber(lb, self.b, False, 1.0)
        core.attach_subscriber(le, self.e, "t", "c", "e", 60.0, True, None, 0.2)
        core.detach_subscriber(le, self.e, True, 0.3)
        core.attach_subscriber(object(), self.c, "tc", "c", "c", 60.0, True, None, 0.4)
        self.p, self.q = object(), object()
        core.attach_publisher(self.p, publisher_link_id("p", "p"), "t", True, None, 1.0)
        core.attach_publisher(self.q, publisher_link_id("p", "q"), "tt", True, None, 1.0)
        self.gids = [core.publish(self.p, object(), f"m{i}".encode(), b"x" * 10, 2.0 + i) for i in range(3)]
        self.tgids = [core.publish(self.q, object(), f"n{i}".encode(), b"y" * 5, 6.0 + i) for i in range(2)]
        core.ordered("tt", 1, self.tgids[0], 8.0)
        core.out.clear()

    def snap(self, parts: Parts) -> CoreSnapshot:
        return self.core.snapshot(10.0, parts)


def test_counts_are_the_core_statistics_in_their_order() -> None:
    t = Traffic()
    counts = t.snap(Parts(counts=True)).counts
    assert counts is not None and list(counts.as_dict().items()) == list(t.core.stats().items())
    assert (counts.records, counts.undecided, counts.subscriptions, counts.local_subscriptions,
            counts.publisher_links) == (5, 4, 4, 3, 2)


def test_the_free_fields_follow_the_inputs() -> None:
    t = Traffic()
    snap = t.snap(Parts())
    assert (snap.at, snap.ready, snap.log_writable, snap.blocked_publishers) == (10.0, True, True, 2)
    t.core.set_ready(False)
    t.core.set_log_writable(False)
    assert (t.snap(Parts()).ready, t.snap(Parts()).log_writable) == (False, False)
    t.core.detach_publisher(t.p)
    t.core.detach_publisher(t.q)
    assert t.snap(Parts()).blocked_publishers == 0


def test_topics_aggregate_subscriptions_publishers_and_records_with_their_order() -> None:
    rows = {r.topic: r for r in Traffic().snap(Parts(topics=True)).topics or ()}
    assert [(r.order, r.subscriptions, r.active, r.homed_here, r.publishers_here, r.records, r.undecided, r.backlog)
            for r in rows.values()] == [
        (TopicOrder.FIFO, 3, 2, 2, 1, 3, 3, 6),  # t: a, b, r live (a, r active); a and b owed 3 each
        (TopicOrder.CAUSAL, 1, 1, 1, 0, 0, 0, 0),
        (TopicOrder.TOTAL, 0, 0, 0, 1, 2, 1, 0),  # tt: the numbered one was decided (nobody subscribed)
    ]
    assert list(rows) == ["t", "tc", "tt"]


def test_links_are_shown_for_the_keys_asked() -> None:
    t = Traffic()
    snap = t.snap(Parts(publishers=[t.p, t.q, object()], subscribers=[t.a, t.b, t.c, t.e, t.r, "none"]))
    assert {tok: (row.topic, row.outstanding, row.blocked) for tok, row in snap.publishers.items()} == {
        t.p: ("t", 0, True), t.q: ("tt", 1, True)}  # (q got 1 more when its numbered message was decided)
    assert dict(snap.backlogs) == {t.a: 3, t.b: 3, t.c: 0}  # homed here and not ended
    assert t.snap(Parts(publishers=[t.q])).publishers.keys() == {t.q}


def test_a_page_of_subscriptions_by_topic_then_sid() -> None:
    t = Traffic()
    page = t.snap(Parts(subscriptions=Page(0, 10, include_ended=True))).subscriptions
    assert page is not None and page.total == 5
    by_topic = [s for _, s in sorted([("t", t.a), ("t", t.b), ("t", t.e), ("t", t.r), ("tc", t.c)])]
    assert [r.sid for r in page.rows] == by_topic
    rows = {r.sid: r for r in page.rows}
    a, b, e, r = rows[t.a], rows[t.b], rows[t.e], rows[t.r]
    assert (a.state, a.since_s, a.expiry_s, a.backlog, a.queued, a.on_link) == (SubState.ACTIVE, 10.0, 60.0, 3, 1, 2)
    assert (b.state, b.since_s, b.expiry_s, b.backlog, b.queued, b.on_link) == (SubState.SUSPENDED, 9.0, None, 3, 0, 0)
    assert (e.state, e.end_reason, e.backlog, e.queued) == (SubState.ENDED, "unsubscribed", 0, None)
    assert (r.home, r.backlog, r.queued, r.on_link) == ("S", 3, None, None)  # this origin's 3 pending for it
    live = t.snap(Parts(subscriptions=Page(1, 2))).subscriptions
    assert live is not None and live.total == 4
    assert [x.sid for x in live.rows] == [s for s in by_topic if s != t.e][1:3]


def test_a_page_of_records_oldest_first() -> None:
    t = Traffic()
    page = t.snap(Parts(records=Page(0, 10))).records
    assert page is not None and page.total == 5
    assert [(r.gid, r.topic, r.age_s, r.outcome, r.pending, r.parts, r.number) for r in page.rows] == [
        (t.gids[0], "t", 8.0, None, 3, 3, None), (t.gids[1], "t", 7.0, None, 3, 3, None),
        (t.gids[2], "t", 6.0, None, 3, 3, None), (t.tgids[0], "tt", 4.0, Outcome.ACCEPTED, 0, 0, 1),
        (t.tgids[1], "tt", 3.0, None, 0, 0, None)]
    assert all(r.origin is None and r.publisher for r in page.rows)
    cut = t.snap(Parts(records=Page(3, 1))).records
    assert cut is not None and [r.gid for r in cut.rows] == [t.tgids[0]] and cut.total == 5


def test_unnumbered_records_are_counted_for_the_topics_asked() -> None:
    t = Traffic()
    assert dict(t.snap(Parts(unnumbered={"tt"})).unnumbered) == {"tt": 1}
    assert dict(t.snap(Parts(unnumbered={"tt", "t", "tc"})).unnumbered) == {"tt": 1, "t": 3}


def test_parts_not_asked_for_are_not_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """/readyz asks for nothing: it must not scan 100,000 subscriptions."""
    t = Traffic()

    def scan(self: SubscriptionTable) -> Iterator[object]:
        raise AssertionError("the subscription table was scanned")

    monkeypatch.setattr(SubscriptionTable, "live", scan)
    monkeypatch.setattr(SubscriptionTable, "__iter__", scan)
    snap = t.snap(Parts())
    assert (snap.counts, snap.topics, snap.subscriptions, snap.records) == (None, None, None, None)
    assert not snap.publishers and not snap.backlogs and not snap.unnumbered


def test_a_snapshot_is_a_value() -> None:
    """It does not change with the core after it was made (nothing in it is the core's own object)."""
    t, twin = Traffic(), Traffic()

    def everything(tr: Traffic) -> Parts:
        return Parts(counts=True, topics=True, publishers=[tr.p], subscribers=[tr.a, tr.c],
                     subscriptions=Page(0, 10, include_ended=True), records=Page(), unnumbered={"tt"})

    before = t.snap(everything(t))
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.ready = False  # type: ignore[misc]
    t.core.subscriber_outcome(t.a, t.gids[0], Outcome.ACCEPTED, True, None, False, 11.0)
    t.core.detach_subscriber(object(), t.c, True, 11.0)
    t.core.publish(t.q, object(), b"n9", b"z", 12.0)
    assert t.snap(everything(t)) != before  # (the core moved on)
    same = twin.snap(everything(twin))  # (the same inputs, and nothing after)
    assert list(before.publishers.values()) == list(same.publishers.values())
    assert dataclasses.replace(before, publishers={}) == dataclasses.replace(same, publishers={})
