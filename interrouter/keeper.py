"""Keepers of MQTT sessions: another router holds a copy of each MQTT session's state, so that the
client can resume it at any router when its own router dies.

Theory of operation
-------------------
An MQTT client's session (router/mqtt/session.py) holds what says which message a packet is: the
tag its router gave each PUBLISH still in flight, the packet id under which each delivery went
out, what the client accepted. The router the client is connected to (its *home*) keeps it in
memory; if that router dies, that state would die with it, and a QoS 2 client that resumes
elsewhere could see a message again under another packet id, or have a resent PUBLISH taken for a
new message. So each session has a *keeper*: one other router that holds the session's latest
image. The session's own rules decide what may go out before the keeper holds the change it
depends on (session.py, `MqttConnection._emit`: a new PUBLISH's name before the message exists, a
delivery's packet id before it is sent, an acceptance before the mesh learns it); here is only the
keeping:

- **Put** (home -> keeper): the session's image, numbered (`seq`, which only grows, also across
  homes: a restored session goes on from its image's number). The keeper keeps the newest and
  answers **Ack** (`seq`). The image goes in the member sessions (interrouter/channel.py:
  numbered, acknowledged, sent again, in order), one Put per session per pass at most (`put`
  replaces what is waiting).
- **The keeper**: of the routers reachable, the one with the highest hash of (client id, router
  id): a function of the reachable set, so anyone who knows which routers are up knows where a
  session is kept (a client's failover list may name it second). It moves when that set changes:
  away from a router out of reach, and back to it when it returns (the image is put there, and
  the keeper before drops its copy only once the new one acknowledged: a copy is never dropped
  before another holds the session). Found by `oncemesh chaos --mqtt` (line3, seed 77): a keeper
  that stayed where a partition had sent it was, after the partition healed, on the other side of
  the home from where its clients resumed when the home died (sessions begun anew, duplicates).
  When the session with the
  keeper breaks (it is unreachable, restarted, or its session may have lost messages), or a Put is
  not answered within `ACK_TIMEOUT` (an older router on the way drops these kinds), the home
  chooses again among the others and sends the image there; what waited, waits for that one.
  With no other router reachable the home says so (`lonely`): the session runs without a copy
  until one can be had (logged by the edge).
- **Fetch** (a new home -> every router it can ask): a client resumes a session this router does
  not hold: each answers **Image** with what it keeps (or none); the newest (`seq`) wins, after
  every router asked answered or `FETCH_TIMEOUT`. Asked are all the routers reachable now whose
  path starts at a neighbour that speaks the keeper's version (`fetchable`, set by the node), not
  only the neighbours: the session's keeper is a neighbour of its *old* home, which need not be one
  of the new home's (line3: B's sessions kept at C, the client resumes at A). A router that
  becomes reachable while a fetch is open is asked too. A fetch is not answered before the router
  knows its peers (`ready`, the node's: every router of the topology heard from, or its grace
  passed): a router just restarted would otherwise find nobody to ask and begin the session anew.
  (In a mesh mid-upgrade, a router on the way one version behind cannot carry these messages: the
  router before it drops them, the fetch ends at its timeout without that router's answer, and
  the member session to that router resends them once the way is upgraded.)
- **A patient fetch**: a router that holds the client's session from a connection that ended may
  hold an old state of it (the client went on at another router since, and that router's copy is
  newer). If not every router of the mesh can be asked (one is out of reach: dead, or beyond a
  partition), the fetch waits for them, asking each as it comes, up to `RESUME_WAIT`; then the
  router resumes what it holds. Found by the MQTT simulator (line3 seed 17): a subscriber left A
  for C, took a message there, left C; B died (its keeper, and the way from A to C); at A, whose
  fetch reached nobody, its old state resumed, and the message came again under a new packet id.
- **Candidates** (`reachable`, set by the node): the reachable neighbours that speak the keeper's
  protocol version (interrouter/messages.py, KEEPER_VERSION): a session is kept next door, and
  its Puts never cross an older router.
- **Drop** (home -> keeper): the session ended.
- A kept image not refreshed for the session's expiry and `KEEP_SLACK` is forgotten; a home puts
  each of its sessions again every `REFRESH` seconds.
- **Stale copies**: a copy is the newest only while its home puts there. A home that chooses
  another keeper tells the one before to drop its copy as soon as it can reach it (a Put of no
  image); and a keeper whose home was out of reach and comes back *as the same life* drops what it
  keeps for it (that home held its sessions all along and may have kept them elsewhere meanwhile;
  it puts them again here if this is still their keeper). A home that comes back as a new life
  lost its sessions: the copies here are what is left of them, and stay. Found by `oncemesh chaos
  --mqtt` (line3, seed 77): a link A-B cut and restored, B's sessions kept at C since, B killed
  later; A restored two sessions from its image of 25 s before, reused their old message names
  and packet ids, and delivered messages twice.
- **Orphaned**: when a kept session's home is out of reach, the keeper says what the session's
  publisher links would declare if its client attached (`orphaned`, once per image): which of
  its messages its client still holds in doubt, so that the rest is known settled (final) although
  the router that held them is gone and the client may never come back (a subscriber that accepted
  one of them presents it elsewhere, and its QoS 2 PUBREL waits for that; router/core.py,
  `publisher_gone`).

Pure: time is a parameter; outputs are `kept` ((client id, seq) acknowledged), `fetched` ((client
id, image or None)), `lonely` (client ids with no keeper), `orphaned` ((client id, image) of a
kept session whose home is out of reach) and the frames in `sessions.out`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, final

from .channel import Sessions
from .strict import Fields, show

ACK_TIMEOUT = 5.0  # a Put unanswered this long: another keeper
FETCH_TIMEOUT = 2.0  # a Fetch's answers waited for at most this long
RESUME_WAIT = 10.0  # a patient Fetch waits at most this long for the routers out of reach
REFRESH = 60.0  # a home puts each session's image again this often
KEEP_SLACK = 3 * REFRESH  # a kept image lives its session's expiry and this much since it was last put
MAX_IMAGE = 4 * 1024 * 1024  # bytes of one image's JSON; larger: refused as malformed


# ---------------------------------------------------------------------- the messages
@final
@dataclass(frozen=True, slots=True)
class KeepPut:
    cid: str
    seq: int
    image: str | None  # the session's image as JSON; None: the session ended (drop it)


@final
@dataclass(frozen=True, slots=True)
class KeepAck:
    cid: str
    seq: int


@final
@dataclass(frozen=True, slots=True)
class KeepFetch:
    cid: str


@final
@dataclass(frozen=True, slots=True)
class KeepImage:
    cid: str
    seq: int
    image: str | None  # None: not kept here


KeepMsg = KeepPut | KeepAck | KeepFetch | KeepImage
KEEP_KINDS = (KeepPut, KeepAck, KeepFetch, KeepImage)

_F = Fields("keeper")
_nat = _F.int_from(0)


def keep_to_list(m: KeepMsg) -> list[Any]:
    if type(m) is KeepPut:
        return ["KP", m.cid, m.seq, m.image]
    if type(m) is KeepAck:
        return ["KA", m.cid, m.seq]
    if type(m) is KeepFetch:
        return ["KF", m.cid]
    if type(m) is KeepImage:
        return ["KI", m.cid, m.seq, m.image]
    raise TypeError(f"not a keeper message: {m!r}")


_ARITY = {"KP": 4, "KA": 3, "KF": 2, "KI": 4}


def is_keep_list(x: object) -> bool:
    return type(x) is list and bool(x) and type(x[0]) is str and x[0] in _ARITY


def keep_from_list(x: list[Any]) -> KeepMsg:
    """Strict: exactly the fields of its kind (`FrameError` otherwise)."""
    k = x[0]
    if _ARITY.get(k) != len(x):
        _F.bad(f"expected one of {sorted(_ARITY)} with its fields, got {show(x)}")
    cid = _F.string(x[1], "cid")
    if k == "KF":
        return KeepFetch(cid)
    seq = _nat(x[2], "seq")
    if k == "KA":
        return KeepAck(cid, seq)
    image = x[3]
    if image is not None and (type(image) is not str or len(image) > MAX_IMAGE):
        _F.bad(f"image: expected a JSON string of at most {MAX_IMAGE} characters or null, got {show(image)}")
    return KeepPut(cid, seq, image) if k == "KP" else KeepImage(cid, seq, image)


def keeper_of(cid: str, candidates: Iterable[str]) -> str | None:
    """The keeper of session `cid` among `candidates` (rendezvous hashing: the highest hash)."""
    best: tuple[bytes, str] | None = None
    for r in candidates:
        h = hashlib.blake2b(f"{cid}\0{r}".encode(), digest_size=8).digest()
        if best is None or (h, r) > best:
            best = (h, r)
    return None if best is None else best[1]


# ---------------------------------------------------------------------- state
@dataclass(slots=True)
class _Ours:
    """A session homed here: where its image is kept."""

    keeper: str | None
    seq: int  # the newest image's
    image: str
    acked: int = 0
    waiting_since: float | None = None  # when the oldest Put its keeper has not answered went
    put_at: float = 0.0  # when it was last put (for the refresh)
    tried: set[str] = field(default_factory=set)  # keepers that failed it since it was last acknowledged
    former: set[str] = field(default_factory=set)  # keepers it had before: told to drop it once reachable


@dataclass(slots=True)
class _Kept:
    """A session kept here for another router."""

    home: str
    seq: int
    image: str
    expiry: float  # seconds (inf: none)
    at: float  # when it was last put
    home_inc: str = ""  # the life of its home that put it (the incarnation, "" unknown)
    lost: bool = False  # its home was out of reach since it was last put (said once: `Keeper.orphaned`)


@dataclass(slots=True)
class _Fetch:
    waiting: set[str]
    best: tuple[int, str] | None
    until: float
    asked: set[str] = field(default_factory=set)  # every router asked (those that answered too)
    patient_until: float = 0.0  # a patient fetch: it waits for the routers out of reach until then


class Keeper:
    """One router's part: the sessions homed here (`put`, `drop`, `fetch`) and those it keeps for
    others (`receive`). The adapter routes `sessions.out` and reads `kept`, `fetched`, `lonely`."""

    def __init__(self, me: str, sessions: Sessions[Any]) -> None:
        self.me = me
        self.sessions = sessions
        self.ours: dict[str, _Ours] = {}
        self.kept_here: dict[str, _Kept] = {}
        self.fetches: dict[str, _Fetch] = {}
        self.kept: list[tuple[str, int]] = []
        self.fetched: list[tuple[str, dict[str, Any] | None]] = []
        self.lonely: list[str] = []
        self.orphaned: list[tuple[str, dict[str, Any]]] = []
        self.reachable: tuple[str, ...] = ()  # the neighbours that may keep a session now (the node says)
        self.fetchable: tuple[str, ...] = ()  # every other router a fetch may ask now (the node says)
        self.ready = True  # the router knows its peers (the node says): fetches may end
        self.others: frozenset[str] = frozenset()  # every other router of the mesh (the node says)
        self.incarnations: dict[str, str] = {}  # their lives, as the node last said

    # ------------------------------------------------------------ at the home
    def put(self, cid: str, seq: int, image: dict[str, Any], now: float) -> None:
        """The session's image as of `seq`: to its keeper."""
        text = json.dumps(image, separators=(",", ":"))
        o = self.ours.get(cid)
        if o is None:
            o = self.ours[cid] = _Ours(None, seq, text)
        o.seq, o.image, o.put_at = seq, text, now
        if o.keeper is None or o.keeper not in self.reachable:
            self._choose(cid, o, now)
        else:
            self._send(cid, o, now)

    def drop(self, cid: str, now: float) -> None:
        """The session ended here: its keeper forgets it."""
        o = self.ours.pop(cid, None)
        if o is not None and o.keeper is not None:
            self.sessions.send(o.keeper, KeepPut(cid, o.seq + 1, None), now)
        if o is not None:
            self._drop_former(cid, o, now, ended=True)  # (those out of reach: they drop it when this life is back)

    def _choose(self, cid: str, o: _Ours, now: float) -> None:
        candidates = [r for r in self.reachable if r not in o.tried]
        old, o.keeper = o.keeper, keeper_of(cid, candidates)
        if old is not None and old != o.keeper:
            o.former.add(old)  # (its copy is older than what follows: dropped once we reach it)
        o.former.discard(o.keeper or "")
        self._drop_former(cid, o, now)
        if o.keeper is None:
            o.tried.clear()
            self.lonely.append(cid)
            return
        self._send(cid, o, now)

    def _drop_former(self, cid: str, o: _Ours, now: float, ended: bool = False) -> None:
        """Former keepers of `cid` that are reachable drop their (older) copy: once the keeper now
        acknowledged an image (until then a former copy may be the only one), or the session ended."""
        if not ended and not o.acked:
            return
        for r in sorted(o.former & set(self.reachable)):
            o.former.discard(r)
            self.sessions.send(r, KeepPut(cid, o.seq + 1, None), now)

    def _send(self, cid: str, o: _Ours, now: float) -> None:
        assert o.keeper is not None
        if not self.sessions.send(o.keeper, KeepPut(cid, o.seq, o.image), now):
            o.tried.add(o.keeper)  # (its session overflowed and ended: another)
            self._choose(cid, o, now)
            return
        if o.waiting_since is None:  # (the timeout counts from the oldest Put not answered)
            o.waiting_since = now

    def fetch(self, cid: str, now: float, patient: bool = False) -> None:
        """A client resumes session `cid`, not held here (`patient`: held here from a connection
        that ended, perhaps older than elsewhere): ask every reachable router."""
        if cid in self.fetches:
            return
        local = self.kept_here.get(cid)
        best = (local.seq, local.image) if local is not None else None
        # (a copy kept here whose home went out of reach may be older than one the home put
        # elsewhere since, at a router it could reach and we cannot: patient too, when a router
        # besides the home is out of reach. Only the home gone (it died, the common failover):
        # no other router holds a newer copy, and the fetch ends as soon as the others answered)
        patient = patient or (local is not None and local.lost
                              and bool(self.others - set(self.reachable) - set(self.fetchable) - {local.home}))
        f = self.fetches[cid] = _Fetch(set(), best, now + FETCH_TIMEOUT,
                                       patient_until=now + RESUME_WAIT if patient else 0.0)
        self._ask(cid, f, now)
        if self._answered(f, now):
            self._fetch_done(cid)

    def _answered(self, f: _Fetch, now: float) -> bool:
        """A fetch may end: every router asked answered, the router knows its peers, and a patient
        one asked every router of the mesh (or waited long enough)."""
        return (not f.waiting and self.ready
                and (now >= f.patient_until or not (self.others - f.asked)))

    def _ask(self, cid: str, f: _Fetch, now: float) -> None:
        """Ask the routers a fetch may ask now and has not asked yet."""
        for r in sorted((set(self.reachable) | set(self.fetchable)) - f.asked):
            f.asked.add(r)
            f.waiting.add(r)
            self.sessions.send(r, KeepFetch(cid), now)

    def _fetch_done(self, cid: str) -> None:
        f = self.fetches.pop(cid)
        image: dict[str, Any] | None = None
        if f.best is not None:
            try:
                image = json.loads(f.best[1])
            except ValueError:
                image = None
        self.fetched.append((cid, image if isinstance(image, dict) else None))

    # ------------------------------------------------------------ from the mesh
    def receive(self, src: str, msg: KeepMsg, now: float) -> None:
        if type(msg) is KeepPut:
            self._kept_put(src, msg, now)
        elif type(msg) is KeepAck:
            o = self.ours.get(msg.cid)
            if o is not None and o.keeper == src and msg.seq > o.acked:
                o.acked = msg.seq
                o.tried.clear()
                o.waiting_since = None if msg.seq >= o.seq else now
                self.kept.append((msg.cid, msg.seq))
                if o.former:
                    self._drop_former(msg.cid, o, now)  # (the new keeper holds it: the old copies may go)
        elif type(msg) is KeepFetch:
            k = self.kept_here.get(msg.cid)
            o = self.ours.get(msg.cid)  # (a home asked: its client moved away from us)
            if o is not None and (k is None or o.seq >= k.seq):
                self.sessions.send(src, KeepImage(msg.cid, o.seq, o.image), now)
            else:
                self.sessions.send(src, KeepImage(msg.cid, k.seq if k else 0, k.image if k else None), now)
        elif type(msg) is KeepImage:
            f = self.fetches.get(msg.cid)
            if f is None or src not in f.waiting:
                return
            f.waiting.discard(src)
            if msg.image is not None and (f.best is None or msg.seq > f.best[0]):
                f.best = (msg.seq, msg.image)
            if self._answered(f, now):
                self._fetch_done(msg.cid)

    def _kept_put(self, src: str, msg: KeepPut, now: float) -> None:
        k = self.kept_here.get(msg.cid)
        if msg.image is None:
            if k is not None and k.seq < msg.seq:
                del self.kept_here[msg.cid]
            return
        if k is None or msg.seq >= k.seq:
            try:
                expiry = json.loads(msg.image).get("expiry")
            except (ValueError, AttributeError):
                return  # (not an image: nothing kept, nothing acknowledged)
            self.kept_here[msg.cid] = _Kept(src, msg.seq, msg.image,
                                            float("inf") if expiry is None else float(expiry), now,
                                            home_inc=self.incarnations.get(src, ""))
        self.sessions.send(src, KeepAck(msg.cid, msg.seq), now)

    def set_reachable(self, others: Iterable[str], now: float, incarnations: dict[str, str] | None = None,
                      fetchable: Iterable[str] | None = None) -> None:
        """The neighbours that may keep a session now (and their lives, when the node knows them),
        and every router a fetch may ask (`fetchable`; None: the same as `others`); a session whose
        keeper is no longer among them chooses another (and sends its image there)."""
        self.reachable = tuple(sorted(others))
        self.fetchable = self.reachable if fetchable is None else tuple(sorted(fetchable))
        if incarnations is not None:
            self.incarnations = dict(incarnations)
        for cid, o in sorted(self.ours.items()):
            if o.keeper is not None and o.keeper != keeper_of(cid, (r for r in self.reachable if r not in o.tried)):
                self._rekeep(cid, o, now)  # (out of reach, or the one it would be is back)
            elif o.keeper is None and self.reachable:
                self._choose(cid, o, now)
            elif o.former:
                self._drop_former(cid, o, now)
        askable = set(self.reachable) | set(self.fetchable)
        for cid, f in sorted(self.fetches.items()):
            f.waiting &= askable
            f.asked &= askable  # (one that went and comes back is asked again: it may have restarted)
            self._ask(cid, f, now)
            if self._answered(f, now):
                self._fetch_done(cid)
        for cid, k in sorted(self.kept_here.items()):
            if k.home in self.reachable:
                inc = self.incarnations.get(k.home, "")
                if k.lost and inc and inc == k.home_inc:
                    del self.kept_here[cid]  # (the same life is back: it holds the session, see above)
                continue
            if k.lost:
                continue
            k.lost = True
            try:
                image = json.loads(k.image)
            except ValueError:
                continue
            if isinstance(image, dict):
                self.orphaned.append((cid, image))

    def set_ready(self, now: float) -> None:
        """The router knows its peers now: the fetches asked of them may end (and have their
        `FETCH_TIMEOUT` from now at least: a router asked just before may answer still)."""
        if self.ready:
            return
        self.ready = True
        for cid, f in sorted(self.fetches.items()):
            f.until = max(f.until, now + FETCH_TIMEOUT)
            if self._answered(f, now):
                self._fetch_done(cid)

    def session_broken(self, peer: str, now: float) -> None:
        """The member session with `peer` broke (messages may have been lost): what it kept for us
        goes to it again or elsewhere; what we keep for it stays (it may be gone for good)."""
        for cid, o in sorted(self.ours.items()):
            if o.keeper == peer:
                self._rekeep(cid, o, now)

    def _rekeep(self, cid: str, o: _Ours, now: float) -> None:
        o.acked = 0
        if o.keeper is not None:
            o.former.add(o.keeper)  # (dropped there once reachable, unless it is chosen again)
        o.keeper = None
        o.waiting_since = None
        self._choose(cid, o, now)

    def tick(self, now: float) -> None:
        for cid, o in sorted(self.ours.items()):
            if o.keeper is not None and o.waiting_since is not None and now - o.waiting_since > ACK_TIMEOUT:
                o.tried.add(o.keeper)  # (an older router on the way drops these: another keeper)
                self._rekeep(cid, o, now)
            elif o.keeper is not None and now - o.put_at > REFRESH:
                o.put_at = now
                self._send(cid, o, now)
        for cid, f in sorted(self.fetches.items()):
            if self.ready and ((now >= f.until and (now >= f.patient_until or not (self.others - f.asked)))
                               or self._answered(f, now)):
                self._fetch_done(cid)
        for cid, k in list(self.kept_here.items()):
            if now - k.at > k.expiry + KEEP_SLACK:
                del self.kept_here[cid]
