"""Shared subscriptions with a real router (router/groups.py): several members, ours and Proton's
with Qpid JMS's link form, split one subscription's messages; each is accepted by one member; what a
member leaves without accepting goes to another; members at other routers are relayed to the home."""

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


def test_members_at_different_routers_split_the_messages(mesh_of: Any, tmp_path: Path) -> None:
    """Members attach wherever their clients connect (interrouter/members.py): ours at A (the home)
    and at C (relayed by C to A), a Proton member at D (relayed too, Qpid JMS's link form); a
    publisher at B. Each message goes to one member, once; every member has a share; all accepted."""
    from proton.utils import BlockingConnection

    mesh = mesh_of("mesh4")
    n = 120
    stop, attached = threading.Event(), threading.Event()
    proton_got: list[str] = []

    def proton_member() -> None:
        conn = BlockingConnection(mesh.url("D"), timeout=30, container_id="proton-d")
        try:
            rcv = conn.create_receiver("work/t", name="work|global7", credit=5, options=_shared_option())
            attached.set()
            while not stop.is_set():
                try:
                    m = rcv.receive(timeout=0.2)
                except Exception:  # (proton.Timeout)
                    continue
                proton_got.append(str(m.body))
                rcv.accept()
        finally:
            conn.close()

    async def main() -> tuple[dict[str, list[str]], list[bool], str | None]:
        a = await start(mesh.url("A"), tmp_path, "a")
        ma = a.subscriber("work/t", "work", shared=True, credit=5)
        await ma.wait_attached(20)
        c = await start(mesh.url("C"), tmp_path, "c")
        mc = c.subscriber("work/t", "work", shared=True, credit=5)
        await mc.wait_attached(30)
        where = c.router_id
        th = threading.Thread(target=proton_member, daemon=True)
        th.start()
        pub = await start(mesh.url("B"), tmp_path, "pub")
        p = pub.publisher("work/t", "p")
        loop = asyncio.get_running_loop()
        assert await asyncio.to_thread(attached.wait, 30)
        futs = [await p.send(f"m{k}") for k in range(n)]
        got: dict[str, list[str]] = {"A": [], "C": []}
        deadline = loop.time() + 60
        while sum(map(len, got.values())) + len(proton_got) < n and loop.time() < deadline:
            got["A"] += [d.body for d in await ma.get_many(50, timeout=0.2)]
            got["C"] += [d.body for d in await mc.get_many(50, timeout=0.2)]
        results = await asyncio.gather(*futs)
        stop.set()
        await asyncio.to_thread(th.join, 30)
        for cl in (a, c, pub):
            await cl.close()
        return got, [r.accepted for r in results], where

    got, accepted, where = run(main(), timeout=150)
    assert where == "C"  # relayed, not redirected
    every = got["A"] + got["C"] + proton_got
    assert sorted(every) == sorted(f"m{k}" for k in range(n))  # each once, across the members
    assert got["A"] and got["C"] and proton_got, (len(got["A"]), len(got["C"]), len(proton_got))  # a share each
    assert all(accepted)
