"""Members of a shared subscription that attach at a router other than its home: relayed members.

Theory of operation
-------------------
A shared subscription (router/groups.py) has one home, where its group lives: the queue, which
member holds which message, the grace of a member that dropped. A member whose client connected to
another router C is *relayed* by C: C keeps the member's AMQP link and speaks for it to the home A,
and A's delivery core treats it as one more member, whose link token is a `RemoteLink` naming C.
Every rule that decides what a member is handed, and when a message it held goes to another member,
stays in A's core; C only carries what happens on the link.

    relay C -> home A   Join (the attach; what the member presents as accepted), Credit,
                        Disposition, Left (the link detached, or its connection dropped)
    home A -> relay C   Joined, Refused (the attach refused, or the link detached by the core),
                        Hand (a message, the payload with it), Settle (final: settle on the link),
                        Notify (ids accepted before, final since), Drained (use up the credit)

These travel in a reliable session between the two routers (`interrouter.channel`: numbered,
acknowledged, sent again, in order), so a hop that drops what it carried loses nothing, and the
dispositions of a member reach the home before its Left, as an AMQP detach follows them. When the
session breaks (the other router is unreachable, restarted, or opened a new session, which may have
lost messages):

- the home takes it as the connection of each member relayed by C dropping: what they held waits,
  in doubt, for them to come back or for `shared_member_grace` (router/groups.py);
- the relay detaches each of its members there with amqp:link:redirect (to the subscription's home
  as it knows it): the member attaches again, presenting what it accepted, as after a dropped
  connection. Its link cannot go on: deliveries it holds and has not accepted may be handed to
  another member once the home counts it dropped, and it could still accept them there. The same
  when the subscription's home changes (it moved because its home went down), the new home being
  this router or another.

Pure: time is a parameter; the outputs are lists the adapter drains: `Relay.out` (actions for links
here, the delivery core's own action classes, addressed by member id), `Relay.answered`, and the
session frames of `MemberSessions.out` (routed to their destination as `MemberFrame` controls).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, final

from ..common import errors
from ..common.errors import OncemeshError
from ..common.vocab import Outcome
from ..router.actions import Deliver, DetachLink, DrainCredit, NotifyFinal, SettleDelivery
from ..router.core import SubscriberAttach
from .channel import Sessions
from .keeper import KeepMsg, is_keep_list, keep_from_list, keep_to_list
from .strict import Fields, show

__all__ = ["TO_HOME", "Credit", "Disposition", "Drained", "Hand", "Join", "Joined", "Left", "MemberHome", "MemberMsg",
           "Notify", "Refused", "Relay", "RemoteLink", "Settle", "join_of", "msg_from_list", "msg_to_list"]

# a Join the home has not answered in this long is given up: the member is refused with a redirect
# to the home (a home or a router on the way that does not speak relayed members drops the Join)
JOIN_TIMEOUT = 10.0


# ---------------------------------------------------------------------- the messages
@final
@dataclass(frozen=True, slots=True)
class Join:
    sid: str
    mid: str
    name: str  # the member's link name
    topic: str
    container: str  # the subscription's scope
    link_name: str  # the subscription's name
    expiry: float
    capable: bool
    selector: str
    owner: str
    presented: tuple[str, ...]
    epoch: int | None


@final
@dataclass(frozen=True, slots=True)
class Credit:
    mid: str
    credit: int
    drain: bool


@final
@dataclass(frozen=True, slots=True)
class Disposition:
    mid: str
    gid: str
    outcome: int
    settled: bool
    error: tuple[str, str] | None
    undeliverable: bool


@final
@dataclass(frozen=True, slots=True)
class Left:
    mid: str
    closed: bool  # the client closed the link (unsubscribe for a plain subscription)
    clean: bool  # an AMQP detach (every disposition came before it); False: its connection dropped


@final
@dataclass(frozen=True, slots=True)
class Joined:
    mid: str


@final
@dataclass(frozen=True, slots=True)
class Refused:
    mid: str
    condition: str
    description: str


@final
@dataclass(frozen=True, slots=True)
class Hand:
    mid: str
    gid: str
    payload: bytes
    redelivery: bool


@final
@dataclass(frozen=True, slots=True)
class Settle:
    mid: str
    gid: str


@final
@dataclass(frozen=True, slots=True)
class Notify:
    mid: str
    gids: tuple[str, ...]


@final
@dataclass(frozen=True, slots=True)
class Drained:
    mid: str


def join_of(att: SubscriberAttach) -> Join:
    """The Join of a member's attach (`att.member` set: the core raised `RelayMember` for it)."""
    return Join(att.sid, att.member, att.member_name, att.topic, att.container, att.link_name, att.expiry,
                att.capable, att.selector, att.owner, tuple(att.presented or ()), att.epoch)


# (the member sessions carry the MQTT sessions' keepers too: interrouter/keeper.py)
RelayMsg = Join | Credit | Disposition | Left | Joined | Refused | Hand | Settle | Notify | Drained
MemberMsg = RelayMsg | KeepMsg
TO_HOME = (Join, Credit, Disposition, Left)  # the kinds a relay sends to a home (the rest go back)
MemberSessions = Sessions[MemberMsg]


def msg_to_list(m: MemberMsg) -> list[Any]:
    if type(m) is Hand:
        return ["H", m.mid, m.gid, base64.b64encode(m.payload).decode(), m.redelivery]
    if type(m) is Disposition:
        return ["D", m.mid, m.gid, m.outcome, m.settled, list(m.error) if m.error else None, m.undeliverable]
    if type(m) is Settle:
        return ["S", m.mid, m.gid]
    if type(m) is Credit:
        return ["C", m.mid, m.credit, m.drain]
    if type(m) is Notify:
        return ["N", m.mid, list(m.gids)]
    if type(m) is Drained:
        return ["DR", m.mid]
    if type(m) is Join:
        return ["J", m.sid, m.mid, m.name, m.topic, m.container, m.link_name,
                None if m.expiry == float("inf") else m.expiry, m.capable, m.selector, m.owner,
                list(m.presented), m.epoch]
    if type(m) is Joined:
        return ["OK", m.mid]
    if type(m) is Refused:
        return ["R", m.mid, m.condition, m.description]
    if type(m) is Left:
        return ["L", m.mid, m.closed, m.clean]
    return keep_to_list(m)


_F = Fields("member")
_nat = _F.int_from(0)
_s, _b = _F.string, _F.boolean


def _strs(v: object, what: str) -> tuple[str, ...]:
    return tuple(_s(x, what) for x in _F.seq(v, what))


_ARITY = {"H": 5, "D": 7, "S": 3, "C": 4, "N": 3, "DR": 2, "J": 13, "OK": 2, "R": 4, "L": 4}


def msg_from_list(x: object) -> MemberMsg:
    """Strict: exactly the fields of its kind, nothing coerced (`FrameError` otherwise)."""
    if is_keep_list(x):
        assert type(x) is list
        return keep_from_list(x)
    if type(x) is not list or not x or type(x[0]) is not str or _ARITY.get(x[0]) != len(x):
        _F.bad(f"expected one of {sorted(_ARITY)} with its fields, got {show(x)}")
    k = x[0]
    mid = _s(x[1], "mid") if k != "J" else ""
    if k == "H":
        try:
            payload = base64.b64decode(_s(x[3], "payload"), validate=True)
        except ValueError:
            _F.bad("payload: not base64")
        return Hand(mid, _s(x[2], "gid"), payload, _b(x[4], "redelivery"))
    if k == "D":
        err = x[5]
        if err is not None:
            cond, desc = _F.seq(err, "error", 2)
            err = (_s(cond, "error"), _s(desc, "error"))
            if not cond:
                _F.bad("error: an empty condition")
        outcome = _nat(x[3], "outcome")
        if outcome not in (Outcome.ACCEPTED, Outcome.REJECTED, Outcome.RELEASED, Outcome.MODIFIED):
            _F.bad(f"outcome: expected 1 to 4, got {outcome}")
        return Disposition(mid, _s(x[2], "gid"), outcome, _b(x[4], "settled"), err, _b(x[6], "undeliverable"))
    if k == "S":
        return Settle(mid, _s(x[2], "gid"))
    if k == "C":
        return Credit(mid, _nat(x[2], "credit"), _b(x[3], "drain"))
    if k == "N":
        return Notify(mid, _strs(x[2], "gids"))
    if k == "DR":
        return Drained(mid)
    if k == "OK":
        return Joined(mid)
    if k == "R":
        return Refused(mid, _s(x[2], "condition"), _s(x[3], "description"))
    if k == "L":
        return Left(mid, _b(x[2], "closed"), _b(x[3], "clean"))
    # k == "J"
    expiry = x[7]
    if expiry is not None and (type(expiry) not in (int, float) or expiry < 0):
        _F.bad(f"expiry: expected a number >= 0 or null, got {show(expiry)}")
    epoch = x[12]
    if epoch is not None:
        epoch = _nat(epoch, "epoch")
    return Join(_s(x[1], "sid"), _s(x[2], "mid"), _s(x[3], "name"), _s(x[4], "topic"), _s(x[5], "container"),
                _s(x[6], "link_name"), float("inf") if expiry is None else float(expiry), _b(x[8], "capable"),
                _s(x[9], "selector"), _s(x[10], "owner"), _strs(x[11], "presented"), epoch)


# ---------------------------------------------------------------------- at the relay
@dataclass(slots=True)
class _Relayed:
    join: Join
    home: str
    link: Any
    credit: int = 0
    drain: bool = False
    joined: bool = False
    asked_at: float = 0.0  # when the pending Join went
    held: set[str] = field(default_factory=set)  # handed on the link, not settled yet


class Relay:
    """The members this router relays to their subscriptions' homes. Inputs from the adapter:
    `attach`, `credit`, `disposition`, `detach`; from the mesh: `receive` (a home's messages),
    `home_changed`, `session_broken`; time: `tick`. Outputs: `out` (Deliver / SettleDelivery /
    NotifyFinal / DrainCredit / DetachLink, with the member id as their `sid`), `answered` (member ids
    whose ATTACH may be answered now); frames in `sessions.out`."""

    def __init__(self, me: str, sessions: MemberSessions) -> None:
        self.me = me
        self.sessions = sessions
        self.members: dict[str, _Relayed] = {}  # mid -> relayed member
        self.out: list[Deliver | SettleDelivery | NotifyFinal | DrainCredit | DetachLink] = []
        self.answered: list[str] = []

    def relays(self, mid: str) -> bool:
        return mid in self.members

    def attach(self, link: Any, join: Join, home: str, now: float) -> None:
        old = self.members.get(join.mid)
        if old is not None and old.link is not link:  # a newer attach of the same member takes its place
            self.out.append(DetachLink(join.mid, old.link, errors.LinkStolen.condition, "a newer link of this member"))
        self.members[join.mid] = _Relayed(join, home, link, asked_at=now)
        self.sessions.send(home, join, now)

    def credit(self, mid: str, credit: int, drain: bool, now: float) -> None:
        r = self.members.get(mid)
        if r is None:
            return
        r.credit, r.drain = max(credit, 0), drain
        if r.joined:
            self.sessions.send(r.home, Credit(mid, r.credit, drain), now)

    def disposition(self, mid: str, gid: str, outcome: Outcome, settled: bool, error: tuple[str, str] | None,
                    undeliverable: bool, now: float) -> None:
        r = self.members.get(mid)
        if r is None or gid not in r.held:
            return
        if outcome is Outcome.RELEASED or outcome is Outcome.MODIFIED:
            r.held.discard(gid)  # given back: no longer the member's
        self.sessions.send(r.home, Disposition(mid, gid, int(outcome), settled, error, undeliverable), now)

    def detach(self, link: Any, mid: str, closed: bool, clean: bool, now: float) -> None:
        r = self.members.get(mid)
        if r is None or r.link is not link:
            return
        del self.members[mid]
        self.sessions.send(r.home, Left(mid, closed, clean), now)

    def receive(self, src: str, msg: RelayMsg, now: float) -> None:
        mid = msg.mid  # (every message a home sends names its member)
        r = self.members.get(mid)
        if r is None or r.home != src:
            return  # (a member that left, or moved to another home: its old home's leftovers)
        if type(msg) is Hand:
            if msg.gid in r.held:  # (never twice on one link)
                return
            r.held.add(msg.gid)
            self.out.append(Deliver(mid, msg.gid, msg.payload, msg.redelivery))
        elif type(msg) is Settle:
            r.held.discard(msg.gid)
            self.out.append(SettleDelivery(mid, msg.gid))
        elif type(msg) is Notify:
            self.out.append(NotifyFinal(mid, msg.gids))
        elif type(msg) is Drained:
            self.out.append(DrainCredit(mid))
        elif type(msg) is Joined:
            if not r.joined:
                r.joined = True
                self.answered.append(mid)
                if r.credit or r.drain:
                    self.sessions.send(src, Credit(mid, r.credit, r.drain), now)
        elif type(msg) is Refused:
            del self.members[mid]
            self.out.append(DetachLink(mid, r.link, msg.condition, msg.description))

    def home_changed(self, sid: str, home: str | None, now: float) -> None:
        """Subscription `sid` has a new home (None: it ended): its members here attach again (at
        the new home, through us or not: their client says what it accepted, as after a drop)."""
        for mid, r in list(self.members.items()):
            if r.join.sid == sid and r.home != home:
                self._let_go(mid, r, f"shared subscription {sid} moved to router {home}: attach again"
                             if home is not None else f"shared subscription {sid} ended")

    def session_broken(self, home: str, now: float, reset: bool = True) -> None:
        """Our session with `home` broke (it is unreachable, restarted, or opened a new session that
        may have lost messages): our members there attach again (`home` counts them dropped).
        `reset`: our session towards it ends too (not when only it opened a new one)."""
        if reset:
            self.sessions.reset(home)
        for mid, r in list(self.members.items()):
            if r.home == home:
                self._let_go(mid, r, f"router {home}, the home of shared subscription {r.join.sid}, was out of "
                                     f"reach or restarted: attach again")

    def _let_go(self, mid: str, r: _Relayed, why: str) -> None:
        del self.members[mid]
        self.out.append(DetachLink(mid, r.link, errors.LinkRedirect.condition, why))

    def tick(self, now: float) -> None:
        for mid, r in list(self.members.items()):
            if not r.joined and now - r.asked_at >= JOIN_TIMEOUT:
                self._let_go(mid, r, f"shared subscription {r.join.sid} has its home at router {r.home}, which "
                                     f"did not answer for this member within {JOIN_TIMEOUT:g} s: attach there")


# ---------------------------------------------------------------------- at the home
@final
@dataclass(frozen=True, slots=True)
class RemoteLink:
    """The link token of a relayed member in the home's core: the relay and the member."""

    relay: str
    mid: str


class MemberCore(Protocol):
    """What of the delivery core (router/core.py) the home side drives."""

    def attach_subscriber(self, link: Any, sid: str, topic: str, container: str, link_name: str,
                          expiry: float, capable: bool, presented: Any, now: float, epoch: int | None = None,
                          handed_last: Any = (), owner: str = "", selector: str = "", member: str = "",
                          member_name: str = "") -> bool: ...

    def subscriber_credit(self, sid: str, credit: int, drain: bool = False) -> None: ...

    def subscriber_outcome(self, sid: str, gid: str, outcome: Outcome, settled: bool,
                           error: tuple[str, str] | None, undeliverable: bool, now: float) -> None: ...

    def detach_subscriber(self, link: Any, sid: str, closed: bool, now: float, clean: bool = False) -> None: ...


class MemberHome:
    """The members other routers relay to shared subscriptions homed here. Inputs: `receive`
    (a relay's messages), `relay_lost`; `perform` for the core's actions addressed to a relayed
    member (`remote` holds their ids); frames in `sessions.out`."""

    def __init__(self, core: MemberCore, sessions: MemberSessions) -> None:
        self.core = core
        self.sessions = sessions
        self.remote: dict[str, RemoteLink] = {}  # mid -> its link token in the core
        # joins the core took this pass (answered at its end: `answer`), and those waiting for the
        # mesh to acknowledge their subscription's announcement (as a local ATTACH does)
        self.joined: list[tuple[str, str, str]] = []  # (relay, mid, sid)
        self.waiting: dict[str, list[tuple[str, str]]] = {}  # sid -> [(relay, mid)]

    def receive(self, src: str, msg: RelayMsg, now: float) -> None:
        core = self.core
        if type(msg) is Disposition:
            if self._from(src, msg.mid):
                core.subscriber_outcome(msg.mid, msg.gid, Outcome(msg.outcome), msg.settled, msg.error,
                                        msg.undeliverable, now)
        elif type(msg) is Credit:
            if self._from(src, msg.mid):
                core.subscriber_credit(msg.mid, msg.credit, msg.drain)
        elif type(msg) is Join:
            self._join(src, msg, now)
        elif type(msg) is Left:
            link = self.remote.get(msg.mid)
            if link is not None and link.relay == src:
                del self.remote[msg.mid]
                core.detach_subscriber(link, msg.mid, msg.closed, now, clean=msg.clean)

    def _from(self, src: str, mid: str) -> bool:
        link = self.remote.get(mid)
        return link is not None and link.relay == src

    def _join(self, src: str, j: Join, now: float) -> None:
        old = self.remote.get(j.mid)
        link = RemoteLink(src, j.mid)
        self.remote[j.mid] = link
        try:
            self.core.attach_subscriber(link, j.sid, j.topic, j.container, j.link_name, j.expiry, j.capable,
                                        j.presented, now, j.epoch, (), j.owner, j.selector, member=j.mid,
                                        member_name=j.name)
        except OncemeshError as exc:
            if old is not None:
                self.remote[j.mid] = old
            else:
                del self.remote[j.mid]
            self.sessions.send(src, Refused(j.mid, exc.condition, str(exc)), now)
            return
        self.joined.append((src, j.mid, j.sid))

    def answer(self, pending: Callable[[str], bool], now: float) -> None:
        """End of a pass: answer the joins of this pass whose subscription the mesh need not
        acknowledge (`pending(sid)` False); the others wait for `attach_done`."""
        joined, self.joined = self.joined, []
        for relay, mid, sid in joined:
            if self.remote.get(mid) != RemoteLink(relay, mid):
                continue  # (gone meanwhile)
            if pending(sid):
                self.waiting.setdefault(sid, []).append((relay, mid))
            else:
                self.sessions.send(relay, Joined(mid), now)

    def attach_done(self, sid: str, refused: str | None, now: float) -> None:
        """The mesh acknowledged (or refused) the announcement of subscription `sid`: the joins that
        waited for it are answered (refused: the member attaches again, and its attach is judged anew)."""
        for relay, mid in self.waiting.pop(sid, []):
            link = self.remote.get(mid)
            if link != RemoteLink(relay, mid):
                continue
            if refused is None:
                self.sessions.send(relay, Joined(mid), now)
            else:
                del self.remote[mid]
                self.core.detach_subscriber(link, mid, False, now, clean=True)
                self.sessions.send(relay, Refused(mid, errors.LinkRedirect.condition,
                                                  f"the mesh refused the attach ({refused}): attach again"), now)

    def relay_lost(self, relay: str, now: float, reset: bool = True) -> None:
        """Our session with `relay` broke: its members' connections count as dropped (what they
        held waits, in doubt, for them to come back: they join again). `reset`: our session
        towards it ends too (not when only it opened a new one)."""
        if reset:
            self.sessions.reset(relay)
        for mid, link in list(self.remote.items()):
            if link.relay == relay:
                del self.remote[mid]
                self.core.detach_subscriber(link, mid, False, now, clean=False)

    def perform(self, act: Deliver | SettleDelivery | NotifyFinal | DrainCredit | DetachLink, now: float) -> None:
        """One of the core's actions for a relayed member (`act.sid` in `remote`)."""
        mid = act.sid
        link = self.remote.get(mid)
        if link is None:
            return
        if type(act) is Deliver:
            self.sessions.send(link.relay, Hand(mid, act.gid, act.payload, act.redelivery), now)
        elif type(act) is SettleDelivery:
            self.sessions.send(link.relay, Settle(mid, act.gid), now)
        elif type(act) is NotifyFinal:
            self.sessions.send(link.relay, Notify(mid, act.gids), now)
        elif type(act) is DrainCredit:
            self.sessions.send(link.relay, Drained(mid), now)
        elif type(act) is DetachLink and act.link is link:
            del self.remote[mid]
            self.sessions.send(link.relay, Refused(mid, act.condition, act.description), now)
