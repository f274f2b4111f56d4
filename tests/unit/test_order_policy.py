"""Ordering as a per-topic policy (router/order/policy.py, router/order/modes.py): each topic gets the
policy of its mode, the pump asks it, and a new mode is one policy class plus its entry in `MODES`."""

from __future__ import annotations

import pytest

from oncemesh.router.actions import Deliver
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.order import modes
from oncemesh.router.order.causal_policy import CausalOrder
from oncemesh.router.order.fifo import FifoOrder
from oncemesh.router.order.policy import OrderPolicy, Verdict, late
from oncemesh.router.order.total_policy import TotalOrder
from oncemesh.router.state import Record, S, SubRuntime

from .test_core import Harness


def test_each_topic_gets_the_policy_of_its_mode_fifo_by_default() -> None:
    core = DeliveryCore("R", config=CoreConfig(total_topics=frozenset({"t1"}), causal_groups={"c1": "topic c1"}))
    assert set(core.orders) == {"t1", "c1"}  # (the default mode is not listed)
    assert isinstance(core.orders["t1"], TotalOrder) and isinstance(core.orders["c1"], CausalOrder)
    assert type(core.fifo) is FifoOrder
    assert core.orders["t1"].walks and not core.fifo.walks


def test_a_mode_that_is_not_registered_is_refused() -> None:
    with pytest.raises(ValueError, match="no order mode 'lottery'"):
        DeliveryCore("R", config=CoreConfig(topic_orders={"t": "lottery"}))


class EvenOnly(OrderPolicy):
    """A toy mode: messages with an odd counter tag end for every subscriber, the rest go."""

    name = "even-only"
    ODD = late(0, "even-only: odd")

    def may_hand(self, rt: SubRuntime, rec: Record, redelivery: bool) -> Verdict | None:
        return self.ODD if (rec.seq or 0) % 2 else None


def test_a_new_mode_is_a_policy_and_its_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(modes.MODES, EvenOnly.name, EvenOnly)
    h = Harness(topic_orders={"t": EvenOnly.name})
    h.attach_pub(in_doubt=[])
    sid, _, _ = h.sub("a", credit=10)
    published = [h.publish(tag) for tag in (b"1", b"2", b"3", b"4")]
    gids = [g for _, g, _ in published]
    handed = [a.gid for _, _, acts in published for a in acts if isinstance(a, Deliver)]
    assert handed == [gids[1], gids[3]]  # what the policy lets go is handed, in order
    states = {g: h.core.records[g].owed[sid] for g in gids}
    assert states == {gids[0]: S.ENDED, gids[1]: S.SENT, gids[2]: S.ENDED, gids[3]: S.SENT}
    assert [e[4] for e in h.core.log if e[0] == "ended" and e[3] == sid] == ["even-only: odd"] * 2
