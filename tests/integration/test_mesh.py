"""Real router processes in a mesh, real clients: exactly once across routers.

    line3:     A --- B --- C
    triangle:  A --- B, B --- C, A --- C
    mesh4:     A-B (1), B-C (1), C-D (1), A-D (5): A reaches D through B and C
    hubs:      H1 --- H2, spokes S1, S2 on H1 and S3, S4 on H2
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncemesh.clients.runtime import Client
from oncemesh.clients.subscriber import Subscriber
from oncemesh.harness.logsummary import LogSummary
from tests.integration.test_single_router import run


async def start(url: str | list[str], tmp: Path, name: str, **kw: Any) -> Client:
    return await Client(url, state_dir=tmp / name, log_dir=tmp / "clientlogs", **kw).start()


async def drain(subs: list[Subscriber], n: int, timeout: float = 30.0) -> list[list[Any]]:
    """Collect n messages from each subscriber concurrently."""
    async def one(s: Subscriber) -> list[Any]:
        got: list[Any] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(got) < n and loop.time() < deadline:
            got += await s.get_many(n - len(got), timeout=max(0.1, deadline - loop.time()))
        return got

    return list(await asyncio.gather(*(one(s) for s in subs)))


def check_logs(tmp: Path, n_subs: int, n_msgs: int) -> None:
    logs = LogSummary(tmp / "clientlogs")
    assert len(logs.published) == n_msgs
    assert set(logs.outcome.values()) == {"ACCEPTED"} and len(logs.outcome) == n_msgs
    subs = logs.subs()
    assert len(subs) == n_subs
    assert not logs.check_exactly_once(subs)


def test_line_publishers_on_a_and_c_subscribers_on_every_router(mesh_of: Callable[..., Any],
                                                                tmp_path: Path) -> None:
    mesh = mesh_of("line3")

    async def main() -> None:
        subs_c = {r: await start(mesh.url(r), tmp_path, f"sub-{r}") for r in "ABC"}
        subs = [c.subscriber("orders", f"s-{r}") for r, c in subs_c.items()]
        for s in subs:
            await s.wait_attached(20)
        pubs_c = {r: await start(mesh.url(r), tmp_path, f"pub-{r}") for r in "AC"}
        pubs = {r: c.publisher("orders", f"p-{r}") for r, c in pubs_c.items()}
        futs = [await p.send(f"{r}:{k}") for k in range(300) for r, p in pubs.items()]
        got = await drain(subs, 600)
        results = await asyncio.gather(*futs)
        assert all(x.accepted for x in results)
        want = sorted(f"{r}:{k}" for k in range(300) for r in "AC")
        for g in got:
            assert sorted(m.body for m in g) == want
            for r in "AC":  # per publisher, in publish order, at every router
                seq = [int(m.body.split(":")[1]) for m in g if m.body.startswith(f"{r}:")]
                assert seq == sorted(seq)
        for c in [*subs_c.values(), *pubs_c.values()]:
            await c.close()

    run(main(), timeout=120)
    check_logs(tmp_path, 3, 600)


@pytest.mark.parametrize("topology", ["triangle", "mesh4", "hubs"])
def test_every_router_publishes_to_subscribers_on_every_router(mesh_of: Callable[..., Any], tmp_path: Path,
                                                               topology: str) -> None:
    mesh = mesh_of(topology)
    routers = sorted(s.id for s in mesh.status())

    async def main() -> None:
        subs_c = {r: await start(mesh.url(r), tmp_path, f"sub-{r}") for r in routers}
        subs = [c.subscriber("t", f"s-{r}") for r, c in subs_c.items()]
        for s in subs:
            await s.wait_attached(20)
        pubs_c = {r: await start(mesh.url(r), tmp_path, f"pub-{r}") for r in routers}
        pubs = {r: c.publisher("t", f"p-{r}") for r, c in pubs_c.items()}
        futs = [await p.send(f"{r}:{k}") for k in range(100) for r, p in pubs.items()]
        got = await drain(subs, 100 * len(routers))
        assert all(x.accepted for x in await asyncio.gather(*futs))
        for g in got:
            assert len(g) == 100 * len(routers) and len({m.gid for m in g}) == len(g)
        for c in [*subs_c.values(), *pubs_c.values()]:
            await c.close()

    run(main(), timeout=120)
    check_logs(tmp_path, len(routers), 100 * len(routers))
    if topology == "mesh4":  # A reaches D through B and C (cost 3 < 5): B and C carried transit copies
        st = {s.id: s for s in mesh.status()}
        assert all(st[r].alive for r in "ABCD")


def test_subscriber_moves_to_another_router_mid_stream(mesh_of: Callable[..., Any], tmp_path: Path) -> None:
    mesh = mesh_of("line3")

    async def main() -> None:
        # the subscriber starts on C and fails over to A (the next URL of its list) mid-stream
        sc = await start([mesh.url("C"), mesh.url("A")], tmp_path, "sub", reconnect_timeout=30)
        sub = sc.subscriber("t", "mover", expiry=600, credit=50)
        await sub.wait_attached(20)
        pc = await start(mesh.url("A"), tmp_path, "pub")
        pub = pc.publisher("t", "p")
        futs = []
        got: list[Any] = []
        for k in range(600):
            futs.append(await pub.send(f"m{k}"))
            if k % 50 == 0:
                got += await sub.get_many(100, timeout=0.01)
            if k == 300:
                sc.drop_connection()
        while len(got) < 600:
            batch = await sub.get_many(600 - len(got), timeout=20)
            assert batch, f"stalled at {len(got)}"
            got += batch
        assert sc.router_id == "A", "the subscriber did not move"
        assert sorted(int(m.body[1:]) for m in got) == list(range(600))
        assert all(x.accepted for x in await asyncio.gather(*futs))
        assert await sub.get(timeout=0.5) is None
        await sc.close()
        await pc.close()

    run(main(), timeout=120)
    check_logs(tmp_path, 1, 600)


def test_publish_right_after_a_remote_attach_reaches_it(mesh_of: Callable[..., Any], tmp_path: Path) -> None:
    """A subscription is in force once its ATTACH is answered: a message published on another
    router right after that must be owed to it (never ACCEPTED for nobody)."""
    mesh = mesh_of("line3")

    async def main() -> None:
        pc = await start(mesh.url("A"), tmp_path, "pub")
        pub = pc.publisher("race", "p")
        await pub.wait_attached(10)
        sc = await start(mesh.url("C"), tmp_path, "sub")
        for i in range(20):
            sub = sc.subscriber("race", f"s{i}", expiry=60)
            await sub.wait_attached(20)
            fut = await pub.send(f"first-for-{i}")  # right after the ATTACH came back
            [m] = await sub.get_many(1, timeout=10)
            assert m.body == f"first-for-{i}"
            assert (await asyncio.wait_for(fut, 10)).accepted
            await sub.unsubscribe()
        await sc.close()
        await pc.close()

    run(main(), timeout=120)


def test_router_stopped_cleanly_and_restarted(mesh_of: Callable[..., Any], tmp_path: Path) -> None:
    """B leaves (SIGTERM) while traffic flows: what is owed to B's subscriber waits for it; the
    others carry on; B comes back and its subscriber resumes and gets everything exactly once."""
    mesh = mesh_of("triangle")

    async def main() -> None:
        subs_c = {r: await start(mesh.url(r), tmp_path, f"sub-{r}", reconnect_timeout=60) for r in "ABC"}
        subs = {r: c.subscriber("t", f"s-{r}", expiry=600) for r, c in subs_c.items()}
        for s in subs.values():
            await s.wait_attached(20)
        pc = await start(mesh.url("A"), tmp_path, "pub")
        pub = pc.publisher("t", "p")
        futs = [await pub.send(f"m{k}") for k in range(200)]
        first = await drain(list(subs.values()), 200)
        assert all(len(g) == 200 for g in first)
        assert all(x.accepted for x in await asyncio.gather(*futs))
        await asyncio.to_thread(mesh.stop_router, "B")
        futs = [await pub.send(f"n{k}") for k in range(200)]
        others = await drain([subs["A"], subs["C"]], 200)
        assert all(len(g) == 200 for g in others)
        await asyncio.sleep(0.5)
        assert not any(f.done() for f in futs), "ACCEPTED while B's subscription had not got them"
        await asyncio.to_thread(mesh.up, True, 60)
        [late] = await drain([subs["B"]], 200, timeout=60)
        assert sorted(m.body for m in late) == sorted(f"n{k}" for k in range(200))
        assert all(x.accepted for x in await asyncio.gather(*futs))
        for c in [*subs_c.values(), pc]:
            await c.close()

    run(main(), timeout=180)
    check_logs(tmp_path, 3, 400)
