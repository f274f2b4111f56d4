"""`DeliveryCore.subscriber_outcomes` (a pass's dispositions of one link in one call) does what a
`subscriber_outcome` call per item does, in order: the same actions, log entries and states, for
any mix of outcomes, settled or not, repeated, unknown, on plain and shared subscriptions."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from oncemesh.common.ids import publisher_link_id, subscription_id
from oncemesh.common.vocab import Outcome
from oncemesh.router.actions import Deliver
from oncemesh.router.core import CoreConfig, DeliveryCore, OutcomeItem

PL = publisher_link_id("pub", "p")
PUB_LINK = object()
SUB_LINKS = [object() for _ in range(3)]
TOKENS = [object() for _ in range(8)]
NAMES = ["a", "b", "$share/g/m1"]


def _core(n_msgs: int, shared: bool) -> tuple[DeliveryCore, list[str], list[str]]:
    """A core with two subscriptions of topic t (and, if `shared`, a member of a shared one) and
    `n_msgs` messages handed to them all."""
    core = DeliveryCore("R", table(), CoreConfig(max_redeliveries=2))
    sids = []
    for i, name in enumerate(NAMES if shared else NAMES[:2]):
        sid = subscription_id("c", name, "t")
        core.attach_subscriber(SUB_LINKS[i], sid, "t", "c", name, 60.0, True, None, 0.0)
        core.subscriber_credit(sid, 20)
        sids.append(sid)
    core.attach_publisher(PUB_LINK, PL, "t", True, None, 0.0)
    gids = [core.publish(PUB_LINK, TOKENS[i], b"%d" % i, b"body", 0.0) for i in range(n_msgs)]
    # the ids the dispositions name: the shared one's member id where its member got the message
    handed = [sid for sid in sids]
    for a in core.out:
        if isinstance(a, Deliver) and a.sid not in handed:
            handed.append(a.sid)
    core.out.clear()
    core.log.clear()
    return core, gids, handed


def table() -> Any:
    from oncemesh.router.subscriptions import SubscriptionTable
    return SubscriptionTable()


def _state(core: DeliveryCore) -> Any:
    return sorted((gid, sorted((k, int(v)) for k, v in rec.owed.items()), rec.pending, rec.outcome)
                  for gid, rec in core.records.items())


_ERRORS = st.sampled_from([None, ("app:bad", "no")])
_ITEM = st.tuples(st.integers(0, 5), st.sampled_from(list(Outcome)), st.booleans(), _ERRORS, st.booleans(),
                  st.booleans())


@settings(max_examples=300, deadline=None)
@given(n_msgs=st.integers(1, 5), shared=st.booleans(), which=st.integers(0, 3),
       items=st.lists(_ITEM, max_size=12))
def test_a_batch_is_the_items_one_by_one(n_msgs: int, shared: bool, which: int,
                                         items: list[tuple[int, Outcome, bool, Any, bool, bool]]) -> None:
    one, gids, sids = _core(n_msgs, shared)
    many, gids2, sids2 = _core(n_msgs, shared)
    assert gids == gids2 and sids == sids2
    sid = sids[which % len(sids)]
    batch: list[str | OutcomeItem] = []
    for i, outcome, settled, error, undeliverable, bare in items:
        gid = gids[i] if i < len(gids) else "unknown:1"
        one.subscriber_outcome(sid, gid, outcome, settled, error, undeliverable, 5.0)
        if bare and outcome is Outcome.ACCEPTED and not settled and error is None and not undeliverable:
            batch.append(gid)
        else:
            batch.append((gid, outcome, settled, error, undeliverable))
    many.subscriber_outcomes(sid, batch, 5.0)
    assert many.out == one.out
    assert many.log == one.log
    assert _state(many) == _state(one)


def test_a_batch_of_acceptances_decides_each_message_as_the_calls_do() -> None:
    one, gids, sids = _core(3, False)
    many, _, _ = _core(3, False)
    for core in (one, many):
        for gid in gids:
            core.subscriber_outcome(sids[1], gid, Outcome.ACCEPTED, False, None, False, 1.0)
    for gid in gids:
        one.subscriber_outcome(sids[0], gid, Outcome.ACCEPTED, False, None, False, 2.0)
    many.subscriber_outcomes(sids[0], list(gids), 2.0)
    assert many.out == one.out and many.log == one.log
    assert [e[:2] for e in many.log if e[0] == "accepted" and e[3] == sids[0]] == [("accepted", g) for g in gids]
    assert all(rec.pending == 0 and rec.outcome is Outcome.ACCEPTED for rec in many.records.values())
