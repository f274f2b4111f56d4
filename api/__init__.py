"""oncemesh: exactly-once publish/subscribe over a federated network of AMQP 1.0 routers.

Blocking use (scripts, threads)::

    import oncemesh

    with oncemesh.connect("amqp://127.0.0.1:5672,amqp://127.0.0.1:5673", state_dir="./me") as client:
        sub = client.subscriber("orders", "billing", expiry=3600)        # durable for an hour
        sub.wait_attached()                                              # in force: owed what follows
        sent = client.publisher("orders", "orders-pub").send({"id": 1})  # a future of the outcome
        for msg in sub.iter(timeout=1):
            print(msg.gid, msg.body)                                     # each exactly once
        print(sent.result(timeout=10).outcome.name)                     # ACCEPTED: every subscription took it

`put` publishes and waits for the outcome: ACCEPTED comes only once every subscription in force has
taken the message, so do not wait for it in the thread that reads one of those subscriptions.

asyncio use: `AsyncClient(urls, state_dir=...)`, `await client.start()`, then
`client.publisher(...)` (an `AsyncPublisher`: `await pub.put(body)`) and `client.subscriber(...)`
(an `AsyncSubscriber`: `await sub.get()`). `connect` and `Client` are the blocking face of the same
client: it runs an `AsyncClient` on a private event-loop thread.

Errors: every exception oncemesh raises is an `OncemeshError` and carries the AMQP condition it stands
for (`condition`); the client's own are `ClientError`s (`NoRouterAvailable`, `LinkRefused` with the
condition the router gave).

The routers, the mesh layer, the launcher and the reconciliation are the subpackages
(`oncemesh.router`, `oncemesh.interrouter`, `oncemesh.topology`, `oncemesh.spark`); the command line
is `oncemesh --help`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .common.errors import (
    ClientError,
    LinkRefused,
    LinkStolen,
    LocalError,
    MessageTooLarge,
    NoRouterAvailable,
    OncemeshError,
    PublishError,
    RemoteProtocolError,
    ResourceLimitExceeded,
)
from .common.vocab import Outcome

if TYPE_CHECKING:
    from .clients.blocking import BlockingClient as Client
    from .clients.blocking import BlockingPublisher as Publisher
    from .clients.blocking import BlockingSubscriber as Subscriber
    from .clients.blocking import connect
    from .clients.publisher import Publisher as AsyncPublisher
    from .clients.publisher import Result
    from .clients.runtime import Client as AsyncClient
    from .clients.subscriber import Delivered
    from .clients.subscriber import Subscriber as AsyncSubscriber

# The client (Proton, tenacity) is imported when one of its names is first used, not by `import
# oncemesh`: importing a subpackage runs this file first, and the sans-IO core (`oncemesh.router.core`),
# a router process and the tools must not load the client for it.
_CLIENT: dict[str, tuple[str, str]] = {
    "Client": ("clients.blocking", "BlockingClient"),
    "Publisher": ("clients.blocking", "BlockingPublisher"),
    "Subscriber": ("clients.blocking", "BlockingSubscriber"),
    "connect": ("clients.blocking", "connect"),
    "AsyncPublisher": ("clients.publisher", "Publisher"),
    "Result": ("clients.publisher", "Result"),
    "AsyncClient": ("clients.runtime", "Client"),
    "Delivered": ("clients.subscriber", "Delivered"),
    "AsyncSubscriber": ("clients.subscriber", "Subscriber"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _CLIENT[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value  # (the next use is a plain attribute)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_CLIENT})


__all__ = [
    "AsyncClient",
    "AsyncPublisher",
    "AsyncSubscriber",
    "Client",
    "ClientError",
    "Delivered",
    "LinkRefused",
    "LinkStolen",
    "LocalError",
    "MessageTooLarge",
    "NoRouterAvailable",
    "OncemeshError",
    "Outcome",
    "PublishError",
    "Publisher",
    "RemoteProtocolError",
    "ResourceLimitExceeded",
    "Result",
    "Subscriber",
    "connect",
]
