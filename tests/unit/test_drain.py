"""Draining a router (router/drain.py) and the inter-router protocol version rule, sans-IO.

The drain's decisions are checked against their rules for every sequence of looks Hypothesis
draws; the core's side (no credit while draining, who depends on the router) one behaviour per test.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncemesh.common import errors
from oncemesh.common.ids import counter_tag, global_id
from oncemesh.common.urls import redirect_address, redirect_info
from oncemesh.interrouter.messages import PROTOCOL_VERSION, VERSION_SPAN, negotiate_version, speaks_version
from oncemesh.router.actions import GrantCredit
from oncemesh.router.drain import ConnView, Dependents, Drain, DrainPhase, core_dependents
from oncemesh.router.readiness import ready_from
from tests.unit.test_core import PL, Harness

# ---------------------------------------------------------------------- the version rule


def test_routers_one_version_apart_speak_the_lower_one() -> None:
    v = PROTOCOL_VERSION
    assert negotiate_version(v, v) == v
    assert negotiate_version(v, v + 1) == v  # a newer peer (an upgrade rolling through the mesh)
    assert negotiate_version(v, v - 1) == v - 1  # an older one (1: a router that sends no version)


@pytest.mark.parametrize(("ours", "theirs"), [(PROTOCOL_VERSION, PROTOCOL_VERSION + 2),
                                               (PROTOCOL_VERSION, PROTOCOL_VERSION + 7),
                                               (PROTOCOL_VERSION + 2, PROTOCOL_VERSION)])
def test_routers_more_than_one_version_apart_are_refused_naming_both(ours: int, theirs: int) -> None:
    with pytest.raises(errors.IncompatibleVersion) as e:
        negotiate_version(ours, theirs)
    assert e.value.condition == "amqp:not-implemented"
    assert f"version {ours}" in str(e.value) and f"version {theirs}" in str(e.value)


def test_a_router_speaks_its_newest_version_or_the_one_before_and_refuses_any_other_setting() -> None:
    """`mesh_protocol_version`: 0 is the newest; one behind speaks as a router of that version; a
    setting it could not talk to newer neighbours with (or a version it does not know) stops it at
    start, naming the range."""
    assert speaks_version(0) == PROTOCOL_VERSION
    assert speaks_version(PROTOCOL_VERSION) == PROTOCOL_VERSION
    assert speaks_version(PROTOCOL_VERSION - VERSION_SPAN) == PROTOCOL_VERSION - VERSION_SPAN
    for bad in (PROTOCOL_VERSION - VERSION_SPAN - 1, PROTOCOL_VERSION + 1, -1):
        with pytest.raises(ValueError, match=rf"mesh_protocol_version .*{PROTOCOL_VERSION - VERSION_SPAN}\.\."
                                             rf"{PROTOCOL_VERSION}, got {bad}"):
            speaks_version(bad)


@pytest.mark.parametrize("theirs", [0, -1, True, "2", 2.0, None])
def test_a_version_that_is_no_positive_integer_is_the_peers_error(theirs: object) -> None:
    with pytest.raises(errors.RemoteProtocolError) as e:
        negotiate_version(PROTOCOL_VERSION, theirs)
    assert not isinstance(e.value, errors.IncompatibleVersion)
    assert e.value.condition == "amqp:invalid-field"


def test_a_redirect_names_host_port_and_router() -> None:
    info = redirect_info("amqps://b.example.net:5671", "B")
    assert redirect_address(info) == ("b.example.net", 5671)
    assert redirect_address({}) is None


# ---------------------------------------------------------------------- the drain's decisions

GRACE, TIMEOUT = 1.0, 10.0


def test_a_publishers_connection_stays_until_its_deliveries_are_settled_subscribers_until_then() -> None:
    d = Drain(0.0, TIMEOUT, GRACE)
    pub, sub, idle = "pub", "sub", "idle"
    deps = Dependents(connections=3, publisher_deliveries=2, subscriber_links=1, driving=2)
    step = d.step(0.0, {pub: ConnView(2, False), sub: ConnView(0, True), idle: ConnView(0, False)}, deps)
    assert step.close == [idle] and not step.done and d.phase is DrainPhase.MOVING
    step = d.step(0.1, {pub: ConnView(0, False), sub: ConnView(0, True)}, deps)
    assert step.close == [pub, sub] and d.phase is DrainPhase.SETTLING and not step.done
    step = d.step(0.2, {}, Dependents(taken_over=3, suspended_here=1))
    assert step.done and d.phase is DrainPhase.DRAINED
    assert d.report is not None and d.report.remaining == {} and d.report.redirected == 3
    assert d.report.dependents == {"taken_over": 3, "suspended_here": 1}


def test_after_the_grace_every_connection_moves() -> None:
    d = Drain(0.0, TIMEOUT, GRACE)
    step = d.step(GRACE, {"pub": ConnView(5, False), "sub": ConnView(0, True)}, Dependents(connections=2))
    assert sorted(step.close) == ["pub", "sub"]


def test_a_publisher_that_left_counts_only_for_the_grace_after_the_last_client_went() -> None:
    d = Drain(0.0, TIMEOUT, GRACE)
    left = Dependents(publisher_left=1)
    assert not d.step(0.5, {}, left).done  # ours re-attach elsewhere within milliseconds
    assert not d.step(0.5 + GRACE - 0.01, {}, left).done
    step = d.step(0.5 + GRACE, {}, left)
    assert step.done and d.report is not None and d.report.outcome == "drained"
    assert d.report.dependents == {"publisher_left": 1}


def test_at_the_timeout_it_ends_reporting_what_still_depends_on_it() -> None:
    d = Drain(0.0, TIMEOUT, GRACE)
    assert not d.step(5.0, {}, Dependents(driving=1, announcements=2)).done
    step = d.step(TIMEOUT, {"late": ConnView(0, False)}, Dependents(connections=1, driving=1, announcements=2))
    assert step.done and step.close == ["late"] and d.phase is DrainPhase.TIMED_OUT
    assert d.report is not None and d.report.remaining == {"connections": 1, "driving": 1, "announcements": 2}


counts = st.integers(0, 3)
deps_st = st.builds(Dependents, connections=st.just(0), publisher_deliveries=counts, subscriber_links=counts,
                    driving=counts, publisher_left=counts, announcements=counts, frames_queued=counts,
                    taken_over=counts)
conns_st = st.dictionaries(st.integers(0, 5), st.builds(ConnView, counts, st.booleans()), max_size=4)


@given(st.lists(st.tuples(st.floats(0.0, 1.5), conns_st, deps_st), min_size=1, max_size=25))
def test_the_drain_keeps_its_rules_whatever_it_sees(looks: list[tuple[float, dict[int, ConnView], Dependents]]) -> None:
    d = Drain(0.0, TIMEOUT, GRACE)
    now, closed = 0.0, set()
    for gap, conns, deps in looks:
        now += gap
        conns = {k: c for k, c in conns.items() if k not in closed}  # a closed connection is not seen again
        deps = Dependents(**{**deps.nonzero(), "connections": len(conns)})
        before = d.report
        step = d.step(now, conns, deps)
        closed.update(step.close)
        assert set(step.close) <= set(conns)
        if before is not None:
            assert step.done and not step.close  # done stays done
            continue
        for k, c in conns.items():
            if c.waiting and now < GRACE and now < TIMEOUT:
                assert k not in step.close  # a publisher's outcomes come here while it may wait
        if now >= GRACE:
            assert set(step.close) == set(conns)  # after the grace nobody stays
        if step.done:
            assert d.report is not None
            if d.report.outcome == "drained":  # nothing it waits for is left, but what a grace let go
                assert set(step.close) == set(conns)
                assert deps.driving == deps.announcements == deps.frames_queued == 0
                assert deps.publisher_deliveries == deps.subscriber_links == 0
                assert d.clients_gone_at is not None
                assert not deps.publisher_left or now >= d.clients_gone_at + GRACE
        if now >= TIMEOUT:
            assert step.done


# ---------------------------------------------------------------------- the core's side


def test_a_draining_core_grants_publishers_no_more_credit() -> None:
    h = Harness(link_credit=4)
    h.attach_pub()
    assert h.credit == 4
    h.core.set_draining()
    for i in range(3):  # what they hold they may use: handled as ever
        h.publish(counter_tag(i))
    h.core.attach_publisher(object(), PL, "t", True, None, h.now)
    assert not [a for a in h.take() if isinstance(a, GrantCredit)]


def test_who_depends_on_a_router_its_messages_and_whom_it_handed_them_to() -> None:
    h = Harness()
    sid, link, _ = h.sub("s", credit=0)  # a local subscription that takes nothing yet: messages stay undecided
    h.attach_pub()
    for i in range(3):
        h.publish(counter_tag(i))
    assert core_dependents(h.core) == {"subscriber_links": 1, "driving": 3, "publisher_left": 0, "taken_over": 0,
                                       "destination_records": 0, "suspended_here": 0, "placeholders": 0}
    h.core.detach_publisher(h.pub_link)  # its connection went: it resends elsewhere
    h.core.detach_subscriber(link, sid, False, h.now)
    deps = core_dependents(h.core)
    assert (deps["driving"], deps["publisher_left"], deps["subscriber_links"], deps["suspended_here"]) == (0, 3, 0, 1)
    # it re-attached at router B holding two of them in doubt: B drives those now, the third it settled
    h.core.publisher_declared_elsewhere(PL, {global_id(PL, counter_tag(0)), global_id(PL, counter_tag(1))}, "B",
                                        h.now, mark=3)
    deps = core_dependents(h.core)
    assert (deps["publisher_left"], deps["taken_over"]) == (0, 2)
    assert h.core.driven_elsewhere == {global_id(PL, counter_tag(i)): "B" for i in range(2)}
    h.core.handle_final(global_id(PL, counter_tag(0)), h.now)  # B's FINAL
    h.core.tick(h.now + 1)
    assert core_dependents(h.core)["taken_over"] == 1 and len(h.core.driven_elsewhere) == 1


def test_a_pre_settled_message_is_driven_to_its_outcome_by_the_router() -> None:
    h = Harness()
    h.sub("s", credit=0)
    h.attach_pub()
    tok, gid, _ = h.publish(b"0")
    h.core.publisher_settled(tok, h.now)  # (a pre-settled transfer: settled as it came)
    h.core.detach_publisher(h.pub_link)
    assert core_dependents(h.core)["driving"] == 1
    assert h.core.records[gid].outcome is None  # (undecided: its subscription takes nothing yet)


def test_our_client_goes_where_a_redirect_points_when_that_is_one_of_its_urls() -> None:
    from oncemesh.clients.runtime import Client

    c = Client("amqp://127.0.0.1:1,amqp://127.0.0.1:2,amqp://127.0.0.1:3")
    c._url_index = 1  # connected to the first: the second is next
    c._redirected(redirect_info("amqp://127.0.0.1:3", "C"))
    assert c._url_index == 2 and c.redirects == 1
    c._redirected(redirect_info("amqp://10.9.9.9:5672", "X"))  # not one of ours: the next one of the list
    assert c._url_index == 2 and c.redirects == 2
    c._redirected({})
    assert c._url_index == 2


def test_a_draining_router_is_not_ready_for_a_load_balancer() -> None:
    mesh = {"ready": True, "converged": True, "peers": ["B"]}
    assert ready_from(True, True, mesh)[0]
    ok, why = ready_from(True, True, mesh, draining=True)
    assert not ok and why["draining"] and not why["accepting_publishers"]
