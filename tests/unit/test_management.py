"""Management answers (router/management.py): requests parsed with errors a person can act on, and
views computed from a real delivery core driven through its API (no I/O)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncemesh.common import mgmtwire as W
from oncemesh.common.ids import publisher_link_id, subscription_id
from oncemesh.router.core import DeliveryCore
from oncemesh.router.management import (
    ConnInfo,
    LinkInfo,
    ManagementError,
    MeshView,
    Request,
    answer,
    parse_request,
    peer_rows,
)
from oncemesh.router.subscriptions import SubscriptionTable


class State:
    """The adapter's part (router/mgmtlink.py gathers it from engine objects)."""

    def __init__(self, conns: list[ConnInfo], status: dict[str, Any]) -> None:
        self.conns = conns
        self.status = status

    @property
    def id(self) -> str:
        return "R"

    @property
    def incarnation(self) -> str:
        return "1000000"

    def management_connections(self) -> list[ConnInfo]:
        return self.conns

    def management_status(self) -> dict[str, Any]:
        return self.status


def core_with_traffic() -> tuple[DeliveryCore, object, str, str]:
    """Two subscriptions of topic t (one suspended), a publisher that sent 3 messages."""
    core = DeliveryCore("R", SubscriptionTable())
    s1, s2 = subscription_id("c", "s1", "t"), subscription_id("c", "s2", "t")
    core.attach_subscriber(object(), s1, "t", "c", "s1", 60.0, True, None, 0.0)
    core.subscriber_credit(s1, 2)
    link2 = object()
    core.attach_subscriber(link2, s2, "t", "c", "s2", 60.0, True, None, 0.0)
    core.detach_subscriber(link2, s2, False, 0.5)
    pub = object()
    core.attach_publisher(pub, publisher_link_id("p", "p"), "t", True, None, 1.0)
    for i in range(3):
        core.publish(pub, object(), f"m{i}".encode(), b"x" * 10, 1.0 + i)
    core.out.clear()
    return core, pub, s1, s2


def ask(core: DeliveryCore, view: str, state: State | None = None, **opts: Any) -> dict[str, Any]:
    ans = answer(parse_request({"operation": "QUERY", "type": view}, opts or None), core,
                 state or State([], {}), None, 10.0)
    assert ans.status == 200 and ans.body is not None
    body = ans.body
    return {**body, "objects": [dict(zip(body["columns"], row, strict=True)) for row in body["rows"]]}


def test_views_read_the_core() -> None:
    core, pub, s1, s2 = core_with_traffic()
    subs = {r["sid"]: r for r in ask(core, "subscriptions")["objects"]}
    assert (subs[s1]["state"], subs[s1]["backlog"], subs[s1]["on_link"], subs[s1]["queued"]) == ("active", 3, 2, 1)
    assert (subs[s2]["state"], subs[s2]["backlog"], subs[s2]["home"]) == ("suspended", 3, "R")
    (t,) = ask(core, "topics")["objects"]
    assert t == {"topic": "t", "order": "fifo", "subscriptions": 2, "active": 1, "homed_here": 2,
                 "publishers_here": 1, "records": 3, "undecided": 3, "backlog": 6}
    recs = ask(core, "inflight")["objects"]
    assert [r["age_s"] for r in recs] == [9.0, 8.0, 7.0]  # oldest first
    assert all(r["origin"] == "here" and r["pending"] == 2 and r["publisher"] for r in recs)
    cut = ask(core, "inflight", limit=2)
    assert (len(cut["rows"]), cut["total"], cut["truncated"]) == (2, 3, True)
    rest = ask(core, "inflight", limit=2, offset=2)
    assert [r["age_s"] for r in rest["objects"]] == [7.0] and rest["truncated"] is False
    page = ask(core, "subscriptions", limit=1, offset=1)
    assert [r["sid"] for r in page["objects"]] == [sorted([s1, s2])[1]] and page["total"] == 2
    assert ask(core, "topics", offset=5)["rows"] == []
    conn = ConnInfo("1.2.3.4:5", "p", "alice", True, (LinkInfo("p", "publisher", "t", None, 0, 3, token=pub),))
    (link,) = ask(core, "links", State([conn], {}))["objects"]
    assert (link["role"], link["credit"], link["unsettled"], link["blocked"]) == ("publisher", 497, 3, False)


def test_peers_list_every_router_of_the_topology() -> None:
    """line3 seen from A: B linked and up, C reachable through B, D in the topology and gone."""
    mesh = MeshView(("A", "B", "C", "D"), (("A", "B"), ("B", "C"), ("A", "D")))
    status = {"neighbours": ["B"], "mesh": {"reachable": {"A": "1", "B": "2", "C": "3"}, "synced": {"B": "2", "C": "0"}}}
    rows = {r[0]: r[1:] for r in peer_rows("A", status, mesh)}
    assert rows == {"B": [True, True, "2", True], "C": [True, None, "3", False], "D": [False, False, None, False]}


@given(st.dictionaries(st.sampled_from(["operation", "type", "x"]), st.one_of(st.text(max_size=8), st.integers())),
       st.one_of(st.none(), st.dictionaries(st.sampled_from(["limit", "offset", "all", "nope"]),
                                            st.one_of(st.integers(-5, 5000), st.booleans(), st.text(max_size=3)))))
def test_any_request_is_parsed_or_refused_with_a_status(props: dict[str, Any], body: Any) -> None:
    try:
        req = parse_request(props, body)
    except ManagementError as exc:
        assert exc.status in (W.BAD_REQUEST, W.NOT_FOUND) and str(exc)
        return
    assert isinstance(req, Request) and req.view in W.VIEWS and 1 <= req.limit <= W.PAGE_MAX and req.offset >= 0


@pytest.mark.parametrize(("props", "body", "status", "words"), [
    ({"operation": "UPDATE", "type": "router"}, None, 400, "only 'QUERY'"),
    ({"operation": "QUERY", "type": "queues"}, None, 404, "views: router, connections"),
    ({"operation": "QUERY", "type": "router"}, {"limit": 0}, 400, "limit must be a whole number from 1"),
    ({"operation": "QUERY", "type": "router"}, {"limit": 2001}, 400, "ask for the next page with offset"),
    ({"operation": "QUERY", "type": "router"}, {"offset": -1}, 400, "offset must be a whole number >= 0"),
    ({"operation": "QUERY", "type": "router"}, {"sort": 1}, 400, "unknown option(s) sort"),
    ({"operation": "QUERY", "type": "router"}, [1], 400, "must be a map of options"),
])
def test_bad_requests_say_what_to_do(props: dict[str, Any], body: Any, status: int, words: str) -> None:
    with pytest.raises(ManagementError) as ei:
        parse_request(props, body)
    assert ei.value.status == status and words in str(ei.value)
