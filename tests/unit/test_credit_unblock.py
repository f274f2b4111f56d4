"""Publisher credit when the budget is spent (router/core.py, `_unblock`): links short of credit
wait in line, oldest first. A connection of a thousand such links closing used to ask every one
still waiting at each link's detach (~N²/2 calls: seconds of the router's loop for N = 1,000, which
every other client waited through; issue 31, hole 3). Once no room is left, the rest of the line is
left as it is: the same grants, in the same order, for a call or so per detach."""

from __future__ import annotations

from oncemesh.common.ids import publisher_link_id
from oncemesh.router.actions import GrantCredit
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.state import PubLink
from oncemesh.router.subscriptions import SubscriptionTable


class Counting(DeliveryCore):
    asked = 0

    def _grant(self, pl: PubLink) -> bool:
        self.asked += 1
        return super()._grant(pl)


def _links(n: int, room: int) -> tuple[Counting, list[object]]:
    core = Counting("A", SubscriptionTable(), CoreConfig(max_inflight_messages=room, link_credit=10))
    tokens = [object() for _ in range(n)]
    for i, tok in enumerate(tokens):
        core.attach_publisher(tok, publisher_link_id("c", f"p{i}"), "t", True, None, 0.0)
    return core, tokens


def test_detaching_a_thousand_links_short_of_credit_asks_about_each_a_few_times_at_most() -> None:
    n = 1000
    core, tokens = _links(n, room=50)  # the first 5 links get their 10 each; 995 wait
    assert sum(a.credit for a in core.out if isinstance(a, GrantCredit)) == 50
    core.out.clear()
    core.asked = 0
    for tok in reversed(tokens[5:]):  # the waiting ones go first: no room is freed
        core.detach_publisher(tok)
    assert core.asked <= 2 * n, f"{core.asked} grant attempts for {n} detaches"
    assert not [a for a in core.out if isinstance(a, GrantCredit)]


def test_room_freed_goes_to_the_oldest_waiting_links_first() -> None:
    core, tokens = _links(8, room=20)  # p0, p1 hold 10 each; p2..p7 wait in that order
    core.out.clear()
    for tok in tokens[:2]:  # their credit comes back to the budget when they go
        core.detach_publisher(tok)
    got = [(tokens.index(a.link), a.credit) for a in core.out if isinstance(a, GrantCredit)]
    assert got == [(2, 10), (3, 10)], got
    core.out.clear()
    core.detach_publisher(tokens[2])
    assert [(tokens.index(a.link), a.credit) for a in core.out if isinstance(a, GrantCredit)] == [(4, 10)]
