"""The python-qpid-proton subscriber of the foreign-client tests (tests/foreign/proton_py/subscriber.py),
reporting a binary body's bytes: a message an MQTT client published reaches AMQP as one `data`
section (docs/mqtt.md, "The mapping"), which python-qpid-proton 0.40 hands over as a memoryview, and
the family's subscriber reports str(body) ("<memory at 0x...>"). This one is that subscriber with
`msg` carrying `key` (the payload before its first ';', as the MQTT reports' `k`), `size` and `hex`
of the body's bytes, and `body_type` (the Python type proton gave). Everything else is the family's
own code: same options, same report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from proton import Delivery
from proton.reactor import Container

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "proton_py"))
import subscriber as family  # noqa: E402  (tests/foreign/proton_py/subscriber.py)

from common import parser  # noqa: E402  (tests/foreign/proton_py/common.py)


class BytesSubscriber(family.Subscriber):  # type: ignore[misc]
    def on_message(self, event: Any) -> None:
        d = event.delivery
        body = event.message.body
        data = bytes(body) if isinstance(body, (bytes, memoryview)) else str(body).encode()
        self.rep.line("msg", tag=str(d.tag), id=str(event.message.id), key=data.split(b";", 1)[0].decode(errors="replace"),
                      size=len(data), hex=data.hex() if len(data) <= 512 else None, body_type=type(body).__name__)
        d.update(Delivery.ACCEPTED)
        if not self.a.second:
            d.settle()


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--expiry", type=int, default=600)
    p.add_argument("--credit", type=int, default=100)
    p.add_argument("--drain", action="store_true")
    a = p.parse_args()
    c = Container(BytesSubscriber(a))
    c.container_id = a.container
    c.run()


if __name__ == "__main__":
    main()
