"""A plain blocking API for scripts: the async client runs on a private event-loop thread.

    from oncemesh import connect
    with connect("amqp://127.0.0.1:5672", state_dir="./me") as client:
        client.publisher("orders").put({"id": 1})
        sub = client.subscriber("orders", "billing")
        for msg in sub.iter(timeout=5):
            print(msg.body)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .publisher import Publisher, Result
from .runtime import Client
from .subscriber import Delivered, Subscriber

T = TypeVar("T")


class BlockingClient:
    """A connection to a mesh (with failover across `urls`) for code that blocks; `oncemesh.Client`.

    Make it with `oncemesh.connect(urls, state_dir=...)`; keyword arguments are those of the asyncio
    client (`oncemesh.AsyncClient`). Use it as a context manager, or call `close()`."""

    def __init__(self, urls: str | Sequence[str], **kw: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="oncemesh-client", daemon=True)
        self._thread.start()
        self._client = Client(urls, **kw)
        try:
            self._call(self._client.start())
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"timed out after {timeout}s") from None

    @property
    def client(self) -> Client:
        """The asyncio client underneath (it runs on this object's private event-loop thread)."""
        return self._client

    @property
    def container_id(self) -> str:
        """The AMQP container id: with a state directory, the same across restarts."""
        return self._client.container_id

    def publisher(self, topic: str, name: str | None = None, **kw: Any) -> BlockingPublisher:
        """A publisher on `topic`. Give a stable `name` when using a durable outbox (its in-doubt
        messages are resent under the same ids after a crash)."""
        async def make() -> Publisher:
            return self._client.publisher(topic, name, **kw)

        return BlockingPublisher(self, self._call(make()))

    def subscriber(self, topic: str, name: str, **kw: Any) -> BlockingSubscriber:
        """The subscription `name` on `topic` (created, or resumed with what it was owed meanwhile).
        `expiry=` seconds keeps it while detached (durable); 0 ends it when the link goes."""
        async def make() -> Subscriber:
            return self._client.subscriber(topic, name, **kw)

        return BlockingSubscriber(self, self._call(make()))

    def close(self) -> None:
        """Detach every link (subscriptions stay, suspended, until they expire) and disconnect."""
        try:
            self._call(self._client.close(), timeout=10)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class BlockingPublisher:
    """Publishes to one topic; `oncemesh.Publisher`. Every outcome is the truth: ACCEPTED only once
    every subscription in force accepted the message (or ended)."""

    def __init__(self, owner: BlockingClient, pub: Publisher) -> None:
        self._owner = owner
        self.pub = pub

    def __repr__(self) -> str:
        return f"<oncemesh.Publisher topic={self.pub.topic!r} name={self.pub.name!r}>"

    def put(self, body: Any, timeout: float | None = None, raw: bool = False) -> Result:
        """Publish and wait for the outcome."""
        return self._owner._call(self.pub.put(body, raw=raw, timeout=timeout))

    def send(self, body: Any, raw: bool = False) -> concurrent.futures.Future[Result]:
        """Publish without waiting; the future completes with the outcome."""
        async def go() -> asyncio.Future[Result]:
            return await self.pub.send(body, raw=raw)

        inner = self._owner._call(go())
        out: concurrent.futures.Future[Result] = concurrent.futures.Future()

        def done(f: asyncio.Future[Result]) -> None:
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(f.result())

        self._owner._loop.call_soon_threadsafe(inner.add_done_callback, done)
        return out

    def flush(self, timeout: float | None = None) -> list[Result]:
        """Wait for the outcomes of everything sent so far."""
        return self._owner._call(self.pub.flush(timeout))

    def close(self) -> None:
        """Detach the publisher's link (after waiting for nothing: flush first to wait for outcomes)."""
        self._owner._call(self.pub.close())


class BlockingSubscriber:
    """One subscription; `oncemesh.Subscriber`. Each message is handed over exactly once, across
    router failures and restarts of this process (with its state directory)."""

    def __init__(self, owner: BlockingClient, sub: Subscriber) -> None:
        self._owner = owner
        self.sub = sub

    def get(self, timeout: float | None = None) -> Delivered | None:
        """The next message, or None after `timeout` seconds (None: wait for ever)."""
        return self._owner._call(self.sub.get(timeout))

    def get_many(self, n: int, timeout: float | None = None) -> list[Delivered]:
        """Up to `n` messages: those that arrive within `timeout` seconds."""
        return self._owner._call(self.sub.get_many(n, timeout))

    def iter(self, timeout: float | None = None) -> Iterator[Delivered]:
        """Messages until none arrives for `timeout` seconds (forever when None)."""
        while True:
            m = self.get(timeout)
            if m is None:
                return
            yield m

    def wait_attached(self, timeout: float | None = 10.0) -> None:
        """Wait until the subscription is in force (the router answered the attach): every message
        published from then on is owed to it."""
        self._owner._call(self.sub.wait_attached(timeout))

    def unsubscribe(self, timeout: float = 10.0) -> None:
        """End the subscription (close its link): nothing more is owed to it."""
        self._owner._call(self.sub.unsubscribe(timeout))

    def detach(self) -> None:
        """Leave without ending: the subscription is suspended and holds what is published until it
        resumes (here or at any router) or expires."""
        self._owner._call(self.sub.detach())


def connect(urls: str | Sequence[str], *, state_dir: Path | str | None = None, **kw: Any) -> BlockingClient:
    """Connect to a mesh: `urls` is one router URL, a comma-separated list or a sequence (failover goes
    through them in turn). `state_dir` keeps the client's identity, dedup store and outbox across
    restarts: without it, exactly-once holds only while this process lives."""
    return BlockingClient(urls, state_dir=state_dir, **kw)
