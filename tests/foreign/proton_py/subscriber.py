"""python-qpid-proton subscriber for the foreign-client tests: a receiver link named --link from
--topic (source timeout --expiry seconds, -1: expiry-policy never), reporting every delivery (its
tag, the message id and body size) as JSON lines (--report) before it accepts it. With --second it
asks for receiver-settle-mode second: it accepts without settling and settles when the router
does. Proton's reconnect brings the connection back (the next URL of --url) and attaches the
receiver again with the same name and source: the same subscription, resumed. With --drain it
grants no credit window: every 200 ms it grants --credit and drains (a pull consumer)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from proton import Delivery, Link, Terminus
from proton.handlers import MessagingHandler
from proton.reactor import Container, ReceiverOption

sys.path.insert(0, str(Path(__file__).parent))
from common import Report, connect_kwargs, parser  # noqa: E402


class Durable(ReceiverOption):
    def __init__(self, expiry: int, second: bool) -> None:
        self.expiry = expiry
        self.second = second

    def apply(self, link: Link) -> None:
        src = link.source
        src.durability = Terminus.DELIVERIES
        if self.expiry < 0:
            src.expiry_policy = Terminus.EXPIRE_NEVER
        else:
            src.expiry_policy = Terminus.EXPIRE_WITH_LINK
            src.timeout = self.expiry
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_SECOND if self.second else Link.RCV_FIRST


class Subscriber(MessagingHandler):  # type: ignore[misc]
    def __init__(self, a: Any) -> None:
        super().__init__(prefetch=0 if a.drain else a.credit, auto_accept=False)
        self.a = a
        self.rep = Report(a.report)
        self.receiver: Any = None
        self.ticking = False

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(**connect_kwargs(self.a))
        self.receiver = event.container.create_receiver(conn, self.a.topic, name=self.a.link,
                                                        options=Durable(self.a.expiry, self.a.second))

    def on_connection_opened(self, event: Any) -> None:
        props = event.connection.remote_properties or {}
        self.rep.line("connected", router=props.get("oncemesh.router"))

    def on_link_opened(self, event: Any) -> None:
        self.rep.line("attached", timeout=event.link.remote_source.timeout,
                      rcv_settle_mode=int(event.link.remote_rcv_settle_mode))
        if self.a.drain and not self.ticking:
            self.ticking = True
            self.on_timer_task(event)

    def on_link_flow(self, event: Any) -> None:
        # (the router's flow answering a drain: it returned the credit it had nothing for)
        if self.a.drain and event.link.credit == 0 and not event.link.draining():
            self.rep.line("drained", credit=event.link.credit)

    def on_timer_task(self, event: Any) -> None:
        # every 200 ms: once the credit is used up (by messages, or returned by the router's answer
        # to the drain), grant --credit again and drain
        r = self.receiver
        if r.state & r.LOCAL_ACTIVE and r.credit == 0:
            r.drain(self.a.credit)
        event.container.schedule(0.2, self)

    def on_message(self, event: Any) -> None:
        d = event.delivery
        body = str(event.message.body)
        self.rep.line("msg", tag=str(d.tag), id=str(event.message.id), key=body.split(";")[0], size=len(body))
        d.update(Delivery.ACCEPTED)
        if not self.a.second:
            d.settle()

    def on_settled(self, event: Any) -> None:
        event.delivery.settle()  # (mode second: the router settled: the message is final)

    def on_disconnected(self, event: Any) -> None:
        self.rep.line("disconnected", error=str(event.transport.condition if event.transport else None))

    def on_link_error(self, event: Any) -> None:
        self.rep.line("link_error", error=str(event.link.remote_condition))

    def on_connection_error(self, event: Any) -> None:
        self.rep.line("error", error=str(event.connection.remote_condition))


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--expiry", type=int, default=600)
    p.add_argument("--credit", type=int, default=100)
    p.add_argument("--drain", action="store_true")
    a = p.parse_args()
    c = Container(Subscriber(a))
    c.container_id = a.container
    c.run()


if __name__ == "__main__":
    main()
