"""Shared subscriptions with a real router (router/groups.py): several members, ours and Proton's
with Qpid JMS's link form, split one subscription's messages; each is accepted by one member; what a
member leaves without accepting goes to another; a member at a second router is redirected."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from oncemesh.harness.logsummary import LogSummary
from tests.integration.test_mesh import start
from tests.integration.test_single_router import run

N = 90


def _shared_option() -> Any:
    """A Proton receiver option: the source capabilities `shared` and `global` (a member of a global
    shared subscription, as Qpid JMS asks), and a durable source (unsettled-state)."""
    from proton import Data, symbol
    from proton.reactor import ReceiverOption

    class Shared(ReceiverOption):
        def apply(self, receiver: Any) -> None:
            caps = receiver.source.capabilities
            caps.put_array(False, Data.SYMBOL)
            caps.enter()
            caps.put_symbol(symbol("shared"))
            caps.put_symbol(symbol("global"))
            caps.exit()
            receiver.source.durability = 2

    return Shared()


def _proton_member(url: str, name: str, take: int, attached: threading.Event, done: threading.Event,
                   out: dict[str, Any]) -> None:
    """A Proton receiver joining shared subscription "work" (capabilities shared + global, link name
    `work|global<name>` as Qpid JMS names its members): it receives `take` messages, accepts none,
    and detaches (an AMQP detach): what it held goes to the other members."""
    from proton.utils import BlockingConnection


    conn = BlockingConnection(url, timeout=30, container_id=f"proton-{name}")
    try:
        rcv = conn.create_receiver("work/t", name=f"work|global{name}", credit=0, options=_shared_option())
        rcv.link.flow(take)  # (no prefetch: Proton's own tops the window up as messages come)
        remote = rcv.link.remote_source.capabilities
        remote.rewind()
        remote.next()
        obj = remote.get_object()
        out["caps"] = sorted(str(c) for c in getattr(obj, "elements", obj or ()))
        attached.set()
        # its window is `take`: it holds that many (received, never accepted; not `receive`d either,
        # which would grant more credit)
        fetcher = rcv.fetcher
        assert fetcher is not None
        conn.wait(lambda: len(fetcher.incoming) >= take, timeout=30, msg="the member was handed too little")
        out["held"] = [m.body for m, _ in fetcher.incoming]
        conn.wait(done.is_set, timeout=60, msg="the test never let the Proton member go")
        rcv.close()
    finally:
        conn.close()


def test_members_split_a_shared_subscription_and_each_message_is_accepted_once(router: Any, tmp_path: Path) -> None:
    attached, done, out = threading.Event(), threading.Event(), {}
    th = threading.Thread(target=_proton_member, args=(router.url, "9", 5, attached, done, out), daemon=True)
    th.start()
    assert attached.wait(30)

    async def main() -> tuple[dict[str, list[str]], list[bool]]:
        clients = [await start(router.url, tmp_path, f"m{i}") for i in range(2)]
        members = [c.subscriber("work/t", "work", shared=True, credit=10) for c in clients]
        for m in members:
            await m.wait_attached(20)
        pub = await start(router.url, tmp_path, "pub")
        p = pub.publisher("work/t", "p")
        futs = [await p.send(f"m{k}") for k in range(N)]
        got: dict[str, list[str]] = {f"m{i}": [] for i in range(2)}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while sum(map(len, got.values())) < N - 5 and loop.time() < deadline:
            for i, m in enumerate(members):
                got[f"m{i}"] += [d.body for d in await m.get_many(50, timeout=0.2)]
        # the Proton member leaves (detach) with 5 it never accepted: they go to ours
        done.set()
        while sum(map(len, got.values())) < N and loop.time() < deadline:
            for i, m in enumerate(members):
                got[f"m{i}"] += [d.body for d in await m.get_many(50, timeout=0.2)]
        results = await asyncio.gather(*futs)
        for m in members:
            assert await m.get_many(1, timeout=0.3) == []  # nothing more
        for c in [*clients, pub]:
            await c.close()
        return got, [r.accepted for r in results]

    got, accepted = run(main(), timeout=120)
    th.join(30)
    assert out["caps"] == ["global", "shared"]  # the router answers with the capabilities it applied
    assert len(out["held"]) == 5
    every = [b for bodies in got.values() for b in bodies]
    assert sorted(every) == sorted(f"m{k}" for k in range(N))  # each once, across the members
    assert set(out["held"]) <= set(every)  # what the Proton member held went to another member
    assert all(len(b) > 0 for b in got.values())  # both of ours had a share
    assert all(accepted)
    logs = LogSummary(tmp_path / "clientlogs")
    handed = {s: logs.handed_to(s) for s in logs.subs()}
    assert len(handed) == 1  # our members log one subscription (the shared one), each message handed once
    assert all(n == 1 for h in handed.values() for n in h.values()) and sum(map(len, handed.values())) == N


def test_a_member_at_another_router_is_redirected_to_where_the_members_are(mesh_of: Any, tmp_path: Path) -> None:
    """Members attach at one router at a time: a Proton member at C is refused with amqp:link:redirect
    whose info names A's address; our client (given both addresses) follows it and joins at A."""
    from proton.utils import BlockingConnection, LinkDetached

    mesh = mesh_of("mesh4")


    def proton_member() -> tuple[str, str, dict[Any, Any]]:
        conn = BlockingConnection(mesh.url("C"), timeout=30, container_id="proton-c")
        try:
            conn.create_receiver("work/t", name="work|global7", options=_shared_option())
            return "attached", "", {}
        except LinkDetached as exc:
            cond = exc.link.remote_condition
            return str(cond.name), str(cond.description), dict(cond.info or {})
        finally:
            conn.close()

    async def main() -> tuple[tuple[str, str, dict[Any, Any]], str | None]:
        a = await start(mesh.url("A"), tmp_path, "a")
        ma = a.subscriber("work/t", "work", shared=True)
        await ma.wait_attached(20)
        refused = await asyncio.to_thread(proton_member)
        c = await start([mesh.url("C"), mesh.url("A")], tmp_path, "c")
        mc = c.subscriber("work/t", "work", shared=True)
        await mc.wait_attached(30)
        where = c.router_id
        await c.close()
        await a.close()
        return refused, where

    (cond, desc, info), where = run(main(), timeout=90)
    assert cond == "amqp:link:redirect" and "router A" in desc, (cond, desc)
    assert info.get("port") == int(mesh.url("A").rsplit(":", 1)[1]), (info, desc)  # (A is C's neighbour in mesh4)
    assert where == "A"
