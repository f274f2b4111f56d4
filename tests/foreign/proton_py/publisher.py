"""python-qpid-proton publisher for the foreign-client tests: sends --count messages to --topic on a
sender link named --link, at most --window unsettled, reporting every transfer and outcome as JSON
lines (--report). Proton's reconnect brings the connection back (the next URL of --url) and
attaches the link again by itself; what was unsettled on the lost connection is in doubt (Proton
forgets those deliveries) and is sent again under the same delivery tag, the identity oncemesh
recognises (docs/wire-protocol.md, "Publishing"). Tags are the message numbers in decimal ASCII.
--rate caps new messages per second (0: as fast as credit allows), so that a test can act
mid-stream.

--fresh-tags plays a library that picks each tag itself (from a counter of transfers) and cannot
resend under the old one: a resend goes under a fresh tag. With it the link asks to be identified by
the message-id (link property oncemesh.identity, docs/clients.md) unless --no-identity."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from proton import Delivery, Link, Message, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container, SenderOption

sys.path.insert(0, str(Path(__file__).parent))
from common import Report, connect_kwargs, parser  # noqa: E402


class Modes(SenderOption):
    def __init__(self, second: bool, by_id: bool = False) -> None:
        self.second = second
        self.by_id = by_id

    def apply(self, link: Link) -> None:
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_SECOND if self.second else Link.RCV_FIRST
        if self.by_id:
            link.properties = {symbol("oncemesh.identity"): "message-id"}


def tag_bytes(tag: str | bytes) -> bytes:
    """A delivery's tag as bytes (Proton gives back the str it was sent with)."""
    return tag if isinstance(tag, bytes) else tag.encode()


class Publisher(MessagingHandler):  # type: ignore[misc]
    def __init__(self, a: Any) -> None:
        super().__init__(auto_settle=False)
        self.a = a
        self.rep = Report(a.report)
        self.next = 0
        self.unsettled: dict[int, Delivery] = {}
        self.outcomes: dict[int, str] = {}
        self.resend: list[int] = []
        self.sender: Any = None
        self.start = time.monotonic()
        self.container: Any = None
        self.wakeup = False
        # the link is attached on a live connection: Proton keeps a lost link's credit, and what is
        # sent meanwhile it sends by itself first on the next link, where our resend of the same tag
        # (in doubt) would be a second transfer under a tag still open: another message to a router
        self.up = False
        self.transfers = 0  # --fresh-tags: the tag of the next transfer, whatever message it carries
        self.k_of: dict[bytes, int] = {}  # tag -> message number

    def on_start(self, event: Any) -> None:
        self.container = event.container
        conn = event.container.connect(**connect_kwargs(self.a))
        self.sender = event.container.create_sender(conn, self.a.topic, name=self.a.link,
                                                    options=Modes(self.a.second,
                                                                  self.a.fresh_tags and not self.a.no_identity))

    def on_connection_opened(self, event: Any) -> None:
        props = event.connection.remote_properties or {}
        self.rep.line("connected", router=props.get("oncemesh.router"))

    def on_link_opened(self, event: Any) -> None:
        self.rep.line("attached", rcv_settle_mode=int(event.link.remote_rcv_settle_mode))
        # also after a reconnect (Proton attaches the link again): what was in flight is in doubt
        self.up = True
        self.resend = sorted(set(self.resend) | set(self.unsettled))
        self.unsettled.clear()
        self.send()

    def on_sendable(self, event: Any) -> None:
        self.send()

    def on_timer_task(self, event: Any) -> None:
        self.wakeup = False
        self.send()

    def send(self) -> None:
        s = self.sender
        while self.up and s is not None and s.credit > 0 and len(self.unsettled) < self.a.window:
            again = bool(self.resend)
            if again:
                k = self.resend.pop(0)
                if k in self.outcomes:
                    continue
            elif self.next < self.a.count and (self.a.rate <= 0 or
                                               self.next < (time.monotonic() - self.start) * self.a.rate + 1):
                k = self.next
                self.next += 1
            else:
                if self.next < self.a.count and not self.wakeup:  # paced: come back in 10 ms
                    self.wakeup = True
                    self.container.schedule(0.01, self)
                break
            mid = f"{self.a.link}:{k}"
            body = f"{mid};".ljust(self.a.size, "x")
            tag = str(self.transfers if self.a.fresh_tags else k)
            self.transfers += 1
            self.k_of[tag.encode()] = k
            d = s.send(Message(id=mid, body=body, durable=True), tag=tag)
            self.unsettled[k] = d
            self.rep.line("sent", k=k, tag=tag.encode().hex(), resend=again)

    def outcome(self, event: Any, what: str) -> None:
        d = event.delivery
        k = self.k_of.get(tag_bytes(d.tag), -1)  # (the message its tag carried)
        u = self.unsettled.get(k)
        if u is None or tag_bytes(u.tag) != tag_bytes(d.tag):
            return  # a delivery of an earlier connection (already resent)
        del self.unsettled[k]
        if not self.a.never_settle:
            d.settle()
        if what == "RELEASED":
            self.resend.append(k)  # "try again": same tag
        else:
            self.outcomes[k] = what
            self.rep.line("outcome", k=k, tag=tag_bytes(d.tag).hex(), outcome=what)
        if len(self.outcomes) == self.a.count:
            self.rep.line("done")
            if not self.a.never_settle:  # (closing would settle nothing either: it stays until stopped)
                event.connection.close()
            return
        self.send()

    def on_accepted(self, event: Any) -> None:
        self.outcome(event, "ACCEPTED")

    def on_rejected(self, event: Any) -> None:
        self.outcome(event, "REJECTED")

    def on_released(self, event: Any) -> None:
        self.outcome(event, "RELEASED")

    def on_disconnected(self, event: Any) -> None:
        self.up = False
        # What we sent that had not left before the connection broke, Proton would send by itself
        # on the next connection, and our resend of it (in doubt) would be a second transfer under
        # a tag still open there: another message to a router. Abort them all (Proton drops an
        # aborted delivery it never sent); every one is resent once, from `resend`, on reattach.
        for d in self.unsettled.values():
            d.abort()
        self.rep.line("disconnected", error=str(event.transport.condition if event.transport else None))

    def on_link_error(self, event: Any) -> None:
        self.rep.line("link_error", error=str(event.link.remote_condition))

    def on_connection_error(self, event: Any) -> None:
        self.rep.line("error", error=str(event.connection.remote_condition))


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--window", type=int, default=50)
    p.add_argument("--size", type=int, default=0)
    p.add_argument("--rate", type=float, default=0, help="new messages per second at most (0: no cap)")
    p.add_argument("--never-settle", action="store_true",
                   help="a library bug: see each outcome, never settle the delivery (nothing becomes final)")
    p.add_argument("--fresh-tags", action="store_true", help="a fresh tag for every transfer, resends too")
    p.add_argument("--no-identity", action="store_true", help="with --fresh-tags: no oncemesh.identity property")
    a = p.parse_args()
    c = Container(Publisher(a))
    c.container_id = a.container
    c.run()


if __name__ == "__main__":
    main()
