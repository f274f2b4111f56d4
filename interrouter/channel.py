"""Reliable FIFO sessions between two routers for one ordered stream (sans-IO, time is a parameter).

Theory of operation
-------------------
The Lamport total-order core (`router.order.lamport`) assumes FIFO channels between members that
lose nothing while connected, and that a break is reported to both ends. Routed control messages
give neither on their own: they go hop by hop, a connection that breaks anywhere on the path loses
what was in it without either end noticing (both may stay reachable over another path), and a path
that changes (a shorter one comes up) can overtake what is still on the old one.

So each sender numbers its messages to each destination within a *session*: `(epoch, seq)`, seq 1,
2, 3, ... The receiver hands them on in seq order, exactly once, buffers what comes early, drops
duplicates and anything of an older epoch, and acknowledges cumulatively (`ack_epoch`, `ack`: every
seq up to `ack` of that session arrived). The sender keeps what is not acknowledged and sends it
again after `retry` without progress, then after twice as long each time nothing was acknowledged
meanwhile (up to `MAX_RETRY`): a peer busy reading a big message is not buried under copies of it. Acknowledgements ride on every message to that peer; a peer we
owe one and send nothing to gets an acknowledgement of its own (seq 0, no body).

A session ends (`reset`) when the peer is reported unreachable or comes back as a new incarnation:
what is unacknowledged is dropped and the next message opens a new epoch. (Only the sender ends its
session: the receiver goes on with it until a higher epoch comes.) Epochs only grow (a new
one is above both the last one and the current time in microseconds, so also above those of an
earlier life of this router). A receiver that sees a new epoch from a peer reports it (`broken`): the
peer may have dropped messages of the old session, and the ordered stream must treat that as a break
of the channel (a view change), exactly as if the connection had dropped.

Bounds. A receiver keeps at most `max_early` messages that came early; one more is dropped
unacknowledged (its sender still holds it and sends it again). A sender keeps at most
`max_unacked` messages a peer has not acknowledged: one more refuses the send (`send` returns
False, having ended the session): the adapter reports the break to the stream, which changes the
view without that peer until it catches up (a peer that reads nothing is not buffered forever).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

M = TypeVar("M")

MAX_EARLY = 65_536
MAX_UNACKED = 200_000
RETRY = 0.3  # seconds without an acknowledgement before the unacknowledged messages go again
MAX_RETRY = 10.0  # ... doubling after each resend that brought no acknowledgement, up to this


@dataclass(frozen=True, slots=True)
class Frame(Generic[M]):
    """What goes to `dst`: its message (None: an acknowledgement only) and the session fields."""

    dst: str
    epoch: int
    seq: int  # 0: no message
    ack_epoch: int  # the peer's session this acknowledges (0: none yet)
    ack: int
    msg: M | None


@dataclass(slots=True)
class _Out(Generic[M]):
    epoch: int
    next_seq: int = 1
    unacked: deque[tuple[int, M]] = field(default_factory=deque)
    sent_at: float = 0.0  # when unacknowledged messages last went out (or progress was made)
    wait: float = RETRY  # how long to wait for an acknowledgement before sending them again


@dataclass(slots=True)
class _In(Generic[M]):
    epoch: int
    got: int = 0  # every seq up to this one was handed on
    early: dict[int, M] = field(default_factory=dict)
    ack_owed: bool = False


class Sessions(Generic[M]):
    """One router's sessions with its peers for one stream. Inputs: `send`, `receive`, `reset`,
    `tick`; outputs: frames in `out` (for the adapter to route) and, from `receive`, the messages to
    hand on in order."""

    def __init__(self, retry: float = RETRY, window: int = 16, max_early: int = MAX_EARLY,
                 max_unacked: int = MAX_UNACKED) -> None:
        self.retry = retry
        self.max_early, self.max_unacked = max_early, max_unacked
        # at most this many unacknowledged messages go again at once, from the oldest: the receiver
        # keeps what comes early, so the oldest is what unblocks it; each acknowledgement brings the
        # wait back to `retry` for the next ones (messages can be big: whole histories)
        self.window = window
        self._out: dict[str, _Out[M]] = {}
        self._in: dict[str, _In[M]] = {}
        self._last_epoch = 0
        self.out: list[Frame[M]] = []
        self.stats = {"resent": 0, "duplicates": 0, "early": 0, "stale": 0, "acks_only": 0, "broken": 0,
                      "early_dropped": 0, "overflows": 0}

    # ------------------------------------------------------------------ sending
    def send(self, dst: str, msg: M, now: float) -> bool:
        """Send `msg` to `dst` in our session with it. False: `dst` holds `max_unacked` messages of
        ours unacknowledged; the session is ended and `msg` not sent (report a break of the channel)."""
        o = self._out.get(dst)
        if o is not None and len(o.unacked) >= self.max_unacked:
            self.stats["overflows"] += 1
            self.reset(dst)
            return False
        if o is None:
            self._last_epoch = max(self._last_epoch + 1, int(now * 1_000_000))
            o = self._out[dst] = _Out(self._last_epoch, sent_at=now, wait=self.retry)
        seq = o.next_seq
        o.next_seq += 1
        if not o.unacked:
            o.sent_at = now
        o.unacked.append((seq, msg))
        self.out.append(self._frame(dst, o.epoch, seq, msg))
        return True

    def _frame(self, dst: str, epoch: int, seq: int, msg: M | None) -> Frame[M]:
        i = self._in.get(dst)
        if i is None:
            return Frame(dst, epoch, seq, 0, 0, msg)
        i.ack_owed = False
        return Frame(dst, epoch, seq, i.epoch, i.got, msg)

    def reset(self, peer: str) -> None:
        """The peer is unreachable or restarted: end our session toward it (the next message opens a
        new epoch). Its session toward us goes on as long as it does: it ends it, and a new life of
        it opens a higher epoch (forgetting it here would make us wait for a seq 1 that never comes)."""
        self._out.pop(peer, None)

    # ------------------------------------------------------------------ receiving
    def receive(self, src: str, epoch: int, seq: int, ack_epoch: int, ack: int, msg: M | None, now: float
                ) -> tuple[list[M], bool]:
        """A frame from `src`: the messages now to hand on, in order, and whether `src` opened a new
        session (then the old one may have lost messages: a break to report)."""
        o = self._out.get(src)
        if o is not None and ack_epoch == o.epoch:
            progressed = False
            while o.unacked and o.unacked[0][0] <= ack:
                o.unacked.popleft()
                progressed = True
            if progressed:
                o.sent_at = now
                o.wait = self.retry
        if seq == 0:
            return [], False
        # (a frame numbered above 0 carries its message: the codec refuses one without)
        assert msg is not None, "a frame with a seq above 0 and no message"
        broken = False
        i = self._in.get(src)
        if i is None or epoch > i.epoch:
            # a session we knew is over: messages of it may be lost. (A session we never saw that
            # starts mid-way went to an earlier life of ours: its sender opens a new one when it
            # learns our new incarnation; until then what comes waits for a seq 1.)
            broken = i is not None
            i = self._in[src] = _In(epoch)
            if broken:
                self.stats["broken"] += 1
        elif epoch < i.epoch:
            self.stats["stale"] += 1
            return [], False
        i.ack_owed = True
        if seq <= i.got or seq in i.early:
            self.stats["duplicates"] += 1
            return [], broken
        ready: list[M] = []
        if seq != i.got + 1:
            if len(i.early) >= self.max_early:
                self.stats["early_dropped"] += 1  # not acknowledged: its sender sends it again
                return ready, broken
            self.stats["early"] += 1
            i.early[seq] = msg
            return ready, broken
        ready.append(msg)
        i.got = seq
        while (nxt := i.early.pop(i.got + 1, None)) is not None:
            ready.append(nxt)
            i.got += 1
        return ready, broken

    # ------------------------------------------------------------------ time
    def flush_acks(self) -> None:
        """End of a pass: an acknowledgement for every peer we owe one and sent nothing to."""
        for src, i in self._in.items():
            if i.ack_owed:
                o = self._out.get(src)
                self.stats["acks_only"] += 1
                self.out.append(self._frame(src, o.epoch if o is not None else 0, 0, None))

    def tick(self, now: float) -> None:
        for dst, o in self._out.items():
            if o.unacked and now - o.sent_at >= o.wait:
                # a peer that is slow to answer (a restarted member reads the whole history in one
                # message) must not be buried under copies of what it is still reading
                o.sent_at = now
                o.wait = min(o.wait * 2, MAX_RETRY)
                for k, (seq, msg) in enumerate(o.unacked):
                    if k >= self.window:
                        break
                    self.stats["resent"] += 1
                    self.out.append(self._frame(dst, o.epoch, seq, msg))

    def unacked(self) -> int:
        return sum(len(o.unacked) for o in self._out.values())
