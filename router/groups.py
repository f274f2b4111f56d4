"""Shared subscriptions: the member links of one subscription that split its messages.

Theory of operation
-------------------
A shared subscription is one subscription of the table (one `sid`, one entry, one home router, one
life): the mesh owes it each message once, exactly as it owes a subscription with one link, and
the records, their states, the copies, the claims and the log are the same. What differs is only
at its home: several links (its *members*) are attached to it there, and each message QUEUED for it
is handed to one member that has credit (`Group.hand`, round robin over the members with credit:
work follows credit, a member that grants none gets none). The subscription's runtime
(`state.SubRuntime`) counts the members' credit as its own and names the group as its link while
any member is attached.

A message handed to a member stays that member's until it is resolved (accepted, rejected:
final for the subscription) or given back:
- the member releases or modifies it: back in the subscription's queue, for any member;
- the member's link detaches (an AMQP detach: the client sent every disposition before it, so what
  it did not accept it did not accept): back in the queue at once;
- the member's connection drops, or the link is taken by a newer attach of the same member: what it
  held is *in doubt* (it may have accepted a message whose disposition was lost). It waits, SENT,
  for that member to come back: a member that comes back presents what it accepted (our clients
  do; router/core.py counts those accepted) and the rest goes back to the queue; a member that does
  not come back within `CoreConfig.shared_member_grace` seconds is given up, and what it held goes
  back to the queue then (a foreign client that accepted a message and vanished before its
  disposition left may then see that message taken by another member: docs/promises.md, "Shared
  subscriptions").
So a message is handed to one member at a time, and a second member gets it only once the first
cannot have accepted it, or has been given up.

Members attach anywhere. A member attaching at another router that reaches the home is relayed
there by that router (interrouter/members.py: its link token here is a `RemoteLink`, and the rules
below apply to it as to any member); the subscription moves to another router only
when its home has been out of reach there for twice `CoreConfig.shared_lease`, and a home hands its
shared subscriptions' messages only while it has reached a majority of the mesh within
`shared_lease` (`DeliveryCore.lease_held`): at most one side of a partition hands. The new home
waits for the members the table lists (`DeliveryCore._await_former`).

Pure: the state of one router's groups; `router/core.py` drives it.
"""

from __future__ import annotations

from typing import Any

from ..common.ids import GLOBAL, NAME_DELIMITER, SHARED, group_key

__all__ = ["GLOBAL", "NAME_DELIMITER", "SHARED", "Group", "Member", "group_key"]

class Member:
    """One member link of a shared subscription."""

    __slots__ = ("mid", "name", "link", "credit", "drain", "held", "dropped")

    def __init__(self, mid: str, name: str, link: Any) -> None:
        self.mid = mid  # its own id (container, link name, topic: common/ids.py)
        self.name = name  # its link name
        self.link: Any = link  # the adapter's token; None once it dropped
        self.credit = 0
        self.drain = False
        self.held: set[str] = set()  # gids handed on its link and not settled yet
        self.dropped: float | None = None  # when its connection dropped (what it held is in doubt)


class Group:
    """The members of one shared subscription homed here."""

    __slots__ = ("sid", "members", "holder", "capable", "notify", "awaiting", "hold_until", "_turn")

    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.members: dict[str, Member] = {}  # mid -> member, attached or dropped (in doubt)
        # gid -> the mid it was handed to (or that presented it as accepted), until settled
        self.holder: dict[str, str] = {}
        self.capable: set[str] = set()  # members that take FINAL notifications (our clients)
        # per member: ids it accepted whose settlement it did not see on a link (it left, or
        # presented them), final since: told with NotifyFinal once it has credit
        self.notify: dict[str, list[str]] = {}
        # members the table lists that this runtime never had (attached at the subscription's
        # previous home, or before this router restarted): nothing is handed until each came back
        # (presenting what it accepted) or `hold_until` passed
        self.awaiting: set[str] = set()
        self.hold_until = 0.0
        self._turn = 0

    def listed(self) -> tuple[str, ...]:
        """The members the table lists: attached, in doubt, and awaited."""
        return tuple(sorted(set(self.members) | self.awaiting))

    def attached(self) -> list[Member]:
        return [m for m in self.members.values() if m.link is not None]

    def credit(self) -> int:
        return sum(m.credit for m in self.members.values() if m.link is not None)

    def hand(self, gid: str) -> str:
        """Hand `gid` to the next member with credit (the caller checked the group's sum): its mid."""
        ms = [m for m in self.members.values() if m.link is not None and m.credit > 0]
        m = ms[self._turn % len(ms)]
        self._turn += 1
        m.credit -= 1
        m.held.add(gid)
        self.holder[gid] = m.mid
        return m.mid

    def settled(self, gid: str) -> str:
        """`gid` is settled: the mid of the member that held it ("" none)."""
        mid = self.holder.pop(gid, "")
        m = self.members.get(mid)
        if m is not None:
            m.held.discard(gid)
        return mid

    def let_go(self, m: Member) -> set[str]:
        """Forget member `m`: the gids it held (the caller decides what becomes of them)."""
        self.members.pop(m.mid, None)
        held, m.held = m.held, set()
        for gid in held:
            if self.holder.get(gid) == m.mid:
                del self.holder[gid]
        return held

    def given_up(self, now: float, grace: float) -> list[Member]:
        """Dropped members that did not come back within `grace` seconds."""
        return [m for m in self.members.values() if m.dropped is not None and now - m.dropped >= grace]
