"""One real router process, real clients: exactly-once end to end, durable subscriptions, crashes.

In-process clients (asyncio) where the test steers them step by step; client *processes*
(`harness.worker`) where a test kills them. Verdicts come from the client settlement logs.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from oncemesh.clients.publisher import Publisher
from oncemesh.clients.runtime import Client
from oncemesh.common.cmalloc import trimmer
from oncemesh.common.vocab import Outcome
from oncemesh.harness.logsummary import LogSummary
from oncemesh.harness.procs import RouterProcess, wait_for
from tests.helpers import worker

T = TypeVar("T")


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


async def client(url: str, tmp: Path, name: str, **kw: Any) -> Client:
    c = Client(url, state_dir=tmp / name, log_dir=tmp / "clientlogs", **kw)
    return await c.start()


async def pub_and_sub(url: str, tmp: Path, topic: str) -> tuple[Client, Any, Client, Any]:
    """A subscriber client with subscription "s" on `topic` (attached), then a publisher client
    with publisher "p": (sub client, subscriber, pub client, publisher)."""
    sc = await client(url, tmp, "sub")
    sub = sc.subscriber(topic, "s")
    await sub.wait_attached(10)
    pc = await client(url, tmp, "pub")
    return sc, sub, pc, pc.publisher(topic, "p")


def test_several_publishers_and_subscribers_get_everything_exactly_once(router: RouterProcess,
                                                                       tmp_path: Path) -> None:
    async def main() -> None:
        subs_c = [await client(router.url, tmp_path, f"sub{i}") for i in range(2)]
        subs = [c.subscriber("orders", f"s{i}") for i, c in enumerate(subs_c)]
        other = subs_c[0].subscriber("other-topic", "o")
        for s in [*subs, other]:
            await s.wait_attached(10)
        pubs_c = [await client(router.url, tmp_path, f"pub{i}") for i in range(3)]
        pubs = [c.publisher("orders", f"p{i}") for i, c in enumerate(pubs_c)]
        futs = [await p.send(f"{i}-{k}") for k in range(200) for i, p in enumerate(pubs)]
        got = [await s.get_many(600, timeout=20) for s in subs]
        results = await asyncio.gather(*futs)
        assert all(r.outcome is Outcome.ACCEPTED for r in results)
        for g in got:
            assert sorted(m.body for m in g) == sorted(f"{i}-{k}" for k in range(200) for i in range(3))
            assert len({m.gid for m in g}) == 600
        # per publisher, each subscription gets messages in publish order
        for g in got:
            for i in range(3):
                seq = [int(m.body.split("-")[1]) for m in g if m.body.startswith(f"{i}-")]
                assert seq == sorted(seq)
        assert await other.get(timeout=0.3) is None  # nothing crosses topics
        for s in subs:
            assert await s.get(timeout=0.3) is None  # nothing more
        for c in [*subs_c, *pubs_c]:
            await c.close()

    run(main())
    logs = LogSummary(tmp_path / "clientlogs")
    assert len(logs.published) == 600
    subs = logs.subs()
    assert len(subs) == 2
    assert not logs.check_exactly_once(subs)


def test_durable_subscription_holds_messages_while_detached(router: RouterProcess, tmp_path: Path) -> None:
    async def main() -> None:
        sc = await client(router.url, tmp_path, "sub")
        s = sc.subscriber("news", "durable", expiry=600)
        await s.wait_attached(10)
        await s.detach()
        pc = await client(router.url, tmp_path, "pub")
        p = pc.publisher("news", "p")
        futs = [await p.send(f"m{k}") for k in range(50)]
        await asyncio.sleep(0.3)
        assert not any(f.done() for f in futs), "ACCEPTED while the only subscription was suspended"
        s2 = sc.subscriber("news", "durable", expiry=600)
        await s2.wait_attached(10)
        assert s2.resumed is True
        got = await s2.get_many(50, timeout=10)
        assert [m.body for m in got] == [f"m{k}" for k in range(50)]
        results = await asyncio.gather(*futs)
        assert all(r.accepted for r in results)
        assert await s2.get(timeout=0.3) is None
        await s2.unsubscribe()
        # after UNSUBSCRIBE nothing is held for it: a new message is ACCEPTED for nobody at once
        r = await p.put("after", timeout=5)
        assert r.accepted
        await sc.close()
        await pc.close()

    run(main())


def test_resume_presents_handed_ids_so_nothing_is_handed_twice(router: RouterProcess, tmp_path: Path) -> None:
    """The subscriber hands messages over, then its connection drops before ACCEPTED reaches the
    router; after the resume, those messages must not be handed over again."""

    async def main() -> None:
        sc = await client(router.url, tmp_path, "sub", reconnect_timeout=30)
        s = sc.subscriber("t", "s", expiry=600, credit=20)
        await s.wait_attached(10)
        pc = await client(router.url, tmp_path, "pub")
        p = pc.publisher("t", "p")
        futs = [await p.send(f"m{k}") for k in range(40)]
        got = await s.get_many(20, timeout=10)  # handed over: committed to the dedup store
        sc.drop_connection()  # before the ACCEPTED dispositions are flushed
        await sc.wait_connected(10)
        got += await s.get_many(40, timeout=10)
        bodies = [m.body for m in got]
        assert sorted(bodies) == sorted(f"m{k}" for k in range(40)), bodies
        assert all(r.accepted for r in await asyncio.gather(*futs))
        await sc.close()
        await pc.close()

    run(main())
    logs = LogSummary(tmp_path / "clientlogs")
    assert len(logs.handed) == 40 and all(n == 1 for n in logs.handed.values())


def test_unknown_publisher_outcome_after_a_connection_drop_is_recovered_by_resend(
        router: RouterProcess, tmp_path: Path) -> None:
    async def main() -> None:
        sc = await client(router.url, tmp_path, "sub")
        s = sc.subscriber("t", "s", expiry=600)
        await s.wait_attached(10)
        pc = await client(router.url, tmp_path, "pub", reconnect_timeout=30)
        p = pc.publisher("t", "p")
        futs = [await p.send(f"m{k}") for k in range(100)]
        got = await s.get_many(30, timeout=10)
        pc.drop_connection()  # outcomes in flight are lost: the publisher resends with the same tags
        got += await s.get_many(70, timeout=10)
        results = await asyncio.gather(*futs)
        assert all(r.accepted for r in results)
        assert p.resends > 0
        assert sorted(m.body for m in got) == sorted(f"m{k}" for k in range(100))
        assert await s.get(timeout=0.5) is None
        await sc.close()
        await pc.close()

    run(main())


def last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise AssertionError(f"no JSON report in:\n{text}")


def _handed_lines(logdir: Path) -> int:
    return sum(1 for f in logdir.glob("*.subscriber.jsonl") for line in open(f) if '"ev":"handed"' in line)


def test_subscriber_killed_mid_stream_resumes_from_its_state_dir(router: RouterProcess, tmp_path: Path,
                                                                 procs: Any) -> None:
    logs = tmp_path / "logs"
    sub_args = ["--url", router.url, "--topic", "t", "--name", "s", "--state-dir", str(tmp_path / "sub"),
                "--log-dir", str(logs), "--credit", "50", "--delay", "0.001"]
    cons = procs.add(worker("consume", *sub_args, workdir=tmp_path, name="consumer1"))
    wait_for(lambda: any(logs.glob("*.subscriber.jsonl")), 15, "subscriber attached")
    pub = procs.add(worker("publish", "--url", router.url, "--topic", "t", "--count", "1500", "--rate", "1000",
                           "--state-dir", str(tmp_path / "pub"), "--log-dir", str(logs), workdir=tmp_path,
                           name="publisher"))
    wait_for(lambda: _handed_lines(logs) >= 400, 30, "400 messages handed over")
    cons.signal(signal.SIGKILL)
    cons.wait(10)
    procs.add(worker("consume", *sub_args, "--count", "1", workdir=tmp_path, name="consumer2"))
    cons3 = None
    wait_for(lambda: _handed_lines(logs) >= 401, 30, "the restarted subscriber resumed")
    cons3 = procs.add(worker("consume", *sub_args, "--idle-exit", "3", workdir=tmp_path, name="consumer3"))
    assert pub.wait(60) == 0, pub.tail()
    assert cons3.wait(60) == 0
    summary = LogSummary(logs)
    assert len(summary.published) == 1500
    assert all(v == "ACCEPTED" for v in summary.outcome.values()) and len(summary.outcome) == 1500
    [sub] = summary.subs()
    assert not summary.check_exactly_once([sub])


def test_router_killed_and_restarted_while_publishers_resend(router: RouterProcess, tmp_path: Path,
                                                             procs: Any) -> None:
    logs = tmp_path / "logs"
    cons = procs.add(worker("consume", "--url", router.url, "--topic", "t", "--name", "s", "--state-dir",
                            str(tmp_path / "sub"), "--log-dir", str(logs), "--idle-exit", "5",
                            workdir=tmp_path, name="consumer"))
    wait_for(lambda: any(logs.glob("*.subscriber.jsonl")), 15, "subscriber attached")
    pubs = [procs.add(worker("publish", "--url", router.url, "--topic", "t", "--count", "1500", "--rate", "600",
                             "--name", f"p{i}", "--state-dir", str(tmp_path / f"pub{i}"), "--log-dir", str(logs),
                             workdir=tmp_path, name=f"publisher{i}")) for i in range(2)]
    wait_for(lambda: _handed_lines(logs) >= 600, 30, "traffic flowing")
    router.kill()
    router.start()  # same port, same state dir: the subscription table survives
    assert router.stats()["subscriptions"] == 1, "the restarted router forgot the subscription"
    for p in pubs:
        assert p.wait(90) == 0, p.tail()
    assert cons.wait(60) == 0, cons.tail()
    summary = LogSummary(logs)
    assert len(summary.published) == 3000
    assert len(summary.outcome) == 3000 and set(summary.outcome.values()) == {"ACCEPTED"}
    [sub] = summary.subs()
    assert not summary.check_exactly_once([sub])


def test_publisher_killed_and_restarted_with_its_outbox(router: RouterProcess, tmp_path: Path,
                                                        procs: Any) -> None:
    logs = tmp_path / "logs"
    # a consumer slower than the publisher, so that outcomes lag and the outbox holds messages in doubt
    cons = procs.add(worker("consume", "--url", router.url, "--topic", "t", "--name", "s", "--state-dir",
                            str(tmp_path / "sub"), "--log-dir", str(logs), "--idle-exit", "4",
                            "--delay", "0.002", "--credit", "20", workdir=tmp_path, name="consumer"))
    wait_for(lambda: any(logs.glob("*.subscriber.jsonl")), 15, "subscriber attached")
    args = ["--url", router.url, "--topic", "t", "--count", "1200", "--rate", "800", "--name", "p",
            "--state-dir", str(tmp_path / "pub"), "--log-dir", str(logs)]
    p1 = procs.add(worker("publish", *args, workdir=tmp_path, name="publisher1"))
    wait_for(lambda: _handed_lines(logs) >= 300, 30, "traffic flowing")
    p1.signal(signal.SIGKILL)
    p1.wait(10)
    p2 = procs.add(worker("publish", *args, workdir=tmp_path, name="publisher2"))
    assert p2.wait(60) == 0, p2.tail()
    report = last_json(p2.tail())
    assert report["resent"] > 0  # it found messages in doubt in its outbox
    assert cons.wait(60) == 0
    summary = LogSummary(logs)
    assert len(summary.published) == 1200
    assert len(summary.outcome) == 1200 and set(summary.outcome.values()) == {"ACCEPTED"}
    [sub] = summary.subs()
    assert not summary.check_exactly_once([sub])


def test_backpressure_bounds_memory_with_a_stalled_subscriber(make_router: Any, tmp_path: Path) -> None:
    r: RouterProcess = make_router("BP", settings={"max_inflight_messages": 300, "link_credit": 100})

    async def main() -> None:
        sc = await client(r.url, tmp_path, "sub")
        s = sc.subscriber("big", "slow", expiry=600, credit=100)
        await s.wait_attached(10)
        pc = await client(r.url, tmp_path, "pub")
        p: Publisher = pc.publisher("big", "p", window=100_000)
        await asyncio.sleep(0.5)
        base = r.rss_kb()
        payload = "x" * 20_000
        futs = [await p.send(payload) for _ in range(3000)]  # 60 MB if the router held them all
        await asyncio.to_thread(wait_for, lambda: r.stats().get("records", 0) >= 300, 20, "budget full")
        await asyncio.sleep(1.0)
        stats = r.stats()
        assert stats["records"] <= 300 and stats["reserved_credit"] == 0
        sent = p.sent_count
        assert sent <= 300, f"publisher got credit for {sent} > budget"
        grown = r.rss_kb() - base
        assert grown < 40_000, f"router grew by {grown} kB with a stalled subscriber"
        got = 0
        while got < 3000:
            got += len(await s.get_many(500, timeout=20))
        results = await asyncio.gather(*futs)
        assert all(x.accepted for x in results)
        await asyncio.to_thread(wait_for, lambda: r.stats().get("records", 1) == 0, 10, "records freed")
        await sc.close()
        await pc.close()

    run(main(), timeout=120)


def test_cli_operations_put_get_subscribe_unsubscribe(router: RouterProcess, tmp_path: Path) -> None:
    def om(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cp = subprocess.run([*om_cmd, *args, "--url", router.url], capture_output=True, text=True, timeout=60)
        if check and cp.returncode != 0:
            pytest.fail(f"oncemesh {' '.join(args)} -> {cp.returncode}\n{cp.stderr}")
        return cp

    import sys
    om_cmd = [sys.executable, "-m", "oncemesh"]
    sub_dir, pub_dir = str(tmp_path / "subst"), str(tmp_path / "pubst")
    om("subscribe", "news", "--subscription", "s1", "--state-dir", sub_dir)
    msgs = [f"message-{i}" for i in range(100)]
    om("put", "news", *msgs, "--no-wait", "--state-dir", pub_dir)
    got = om("get", "news", "--subscription", "s1", "--count", "100", "--timeout", "20", "--state-dir", sub_dir)
    assert got.stdout.splitlines() == msgs
    again = om("get", "news", "--subscription", "s1", "--timeout", "1", "--state-dir", sub_dir)
    assert again.stdout == ""
    # a waiting put resends what the outbox holds in doubt, and exits 0 once all are ACCEPTED
    bg = subprocess.Popen([*om_cmd, "get", "news", "--subscription", "s1", "--count", "1", "--timeout", "20",
                           "--url", router.url, "--state-dir", sub_dir], stdout=subprocess.PIPE, text=True)
    put = om("put", "news", "last one", "--state-dir", pub_dir, "--timeout", "20")
    assert "101 of 101 message(s) ACCEPTED" in put.stderr
    out, _ = bg.communicate(timeout=30)
    assert out == "last one\n"
    om("unsubscribe", "news", "--subscription", "s1", "--state-dir", sub_dir)
    # no subscription now: ACCEPTED for nobody, immediately
    assert "1 of 1" in om("put", "news", "to nobody", "--state-dir", pub_dir, "--timeout", "10").stderr
    bad = om("put", "$reserved", "x", "--state-dir", pub_dir, "--timeout", "10", check=False)
    assert bad.returncode == 1 and "amqp:unauthorized-access" in bad.stderr


def test_messages_of_every_size_cross_the_router_intact(router: RouterProcess, tmp_path: Path) -> None:
    """Bodies around the engine's 64 KiB read buffer (the router reads a transfer without asking its
    size first, and reads the rest of a larger one in a second call), and an empty one."""
    sizes = [0, 1, 65_000, 65_536, 65_537, 300_000]

    async def main() -> None:
        sc, sub, pc, pub = await pub_and_sub(router.url, tmp_path, "sizes")
        bodies = [bytes((i * 7 + k) % 251 for k in range(n)) for i, n in enumerate(sizes)]
        futs = [await pub.send(b) for b in bodies]
        got = await sub.get_many(len(bodies), timeout=20)
        assert all(r.outcome is Outcome.ACCEPTED for r in await asyncio.gather(*futs))
        assert [m.body for m in got] == bodies
        await sc.close()
        await pc.close()

    run(main())


def test_a_subscriber_whose_link_was_taken_attaches_again_and_goes_on(router: RouterProcess,
                                                                     tmp_path: Path) -> None:
    """Another attach of the same subscription (here: a second client with the same container id
    and link name, which then goes away) takes the first client's link. The first client is alive:
    it attaches again by itself and gets what is published afterwards. (In chaos, line3 seed 8, the
    other attach was a killed earlier process of the same client, announced late by a frozen router;
    the worker died on the `stolen` refusal.)"""
    async def main() -> None:
        first = await client(router.url, tmp_path, "first", container_id="same-client")
        sub = first.subscriber("steal", "s", expiry=60)
        await sub.wait_attached(10)
        other = await client(router.url, tmp_path, "other", container_id="same-client")
        thief = other.subscriber("steal", "s", expiry=60)
        await thief.wait_attached(10)
        await wait_until(lambda: sub.link is None, 10)  # taken
        other.drop_connection()  # the thief goes away (its link suspends the subscription)
        await other.close()
        await wait_until(lambda: sub.link is not None and sub.resumed is True, 10)  # attached again
        pc = await client(router.url, tmp_path, "pub")
        pub = pc.publisher("steal", "p")
        futs = [await pub.send(f"m{i}") for i in range(20)]
        got = await sub.get_many(20, timeout=20)
        assert [m.body for m in got] == [f"m{i}" for i in range(20)]
        assert all(r.outcome is Outcome.ACCEPTED for r in await asyncio.gather(*futs))
        for c in (first, pc):
            await c.close()

    run(main())


async def wait_until(cond: Any, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.02)


def test_the_router_fixes_the_c_allocators_mmap_threshold_at_start(make_router: Any) -> None:
    """`malloc_mmap_threshold` reaches glibc (common/cmalloc.py) and the log says so; 0 leaves glibc's own."""
    for rid, value, said in (("MM", 262144, "mmap_threshold=262144"), ("MG", 0, "mmap_threshold=glibc")):
        r: RouterProcess = make_router(rid, settings={"malloc_mmap_threshold": value})
        log = r.log_dir / f"{rid}.router.log"
        [line] = wait_for(lambda: [x for x in log.read_text().splitlines() if "router.malloc" in x], 10,  # noqa: B023
                          "the allocator's line in the log")
        assert said in line and json.loads(line)["level"] == "INFO"


def test_the_router_reports_a_stall_of_its_event_loop_in_its_log_and_status(make_router: Any) -> None:
    """A router frozen for a while (SIGSTOP: the event loop runs nothing) reports the lag at once in
    its log, then in the window's summary, and in its status."""
    r: RouterProcess = make_router("LAG", settings={"loop_lag_window": 1.0, "loop_stall": 0.3})
    log = r.log_dir / "LAG.router.log"
    wait_for(lambda: r.stats().get("loop_lag_samples", 0) > 0, 10, "a first lag sample")
    r.freeze()
    try:
        time.sleep(1.5)  # the fault itself: frozen for 1.5 s, its next tick (every 0.5 s) runs >= 1 s late
    finally:
        r.thaw()

    def lines(marker: str, field: str) -> list[dict[str, Any]]:
        found = [json.loads(x) for x in log.read_text().splitlines() if marker in x]
        return [d for d in found if float(d["event"].split(field)[1].split()[0]) >= 900]

    [stall, *_] = wait_for(lambda: lines("router.loop_stall", "lag_ms="), 10, "the stall in the log")
    assert stall["level"] == "WARNING"
    wait_for(lambda: r.stats().get("loop_lag_worst_ms", 0) >= 900, 10, "the stall in the status")
    [summary, *_] = wait_for(lambda: lines("router.loop_lag ", "max_ms="), 10, "the window's summary")
    assert "p99_ms=" in summary["event"] and "gc_pause_max_ms=" in summary["event"]
    assert r.stats()["loop_lag_max_ms"] >= 0 and "gc_pause_max_ms" in r.stats()


def test_delivery_pools_cut_back_under_traffic_lose_nothing(make_router: Any, tmp_path: Path) -> None:
    """The router cuts every connection's pool of freed Proton deliveries (here to nothing, every
    50 ms) while messages large and small cross it: each is handed once and intact, and the pools
    were cut (the status counts the deliveries freed, and the trims of the C heap after each cut)."""
    r: RouterProcess = make_router("POOL", settings={"delivery_pool_trim_interval": 0.05, "delivery_pool_keep": 0,
                                                     "tick_interval": 0.05})
    sizes = [10, 70_000, 200, 5_000, 1]

    async def main() -> None:
        sc, sub, pc, pub = await pub_and_sub(r.url, tmp_path, "pool")
        for rnd in range(6):  # bursts with pauses between them: trims during and between the bursts
            bodies = [bytes((rnd + i + k) % 251 for k in range(sizes[(rnd + i) % len(sizes)])) for i in range(60)]
            futs = [await pub.send(b) for b in bodies]
            got = await sub.get_many(len(bodies), timeout=20)
            assert [m.body for m in got] == bodies
            assert all(x.outcome is Outcome.ACCEPTED for x in await asyncio.gather(*futs))
            await asyncio.sleep(0.12)
        assert await sub.get(timeout=0.3) is None
        await sc.close()
        await pc.close()

    run(main())
    stats = r.stats()
    assert stats["pooled_deliveries_freed"] > 0
    assert stats["c_heap_trims"] > 0 or trimmer() is None  # (the C heap handed back after each cut)


def test_a_plain_subscribers_settled_dispositions_each_reach_the_publisher(router: RouterProcess) -> None:
    """A Proton receiver that settles as it disposes (receiver-settle-mode first, Proton's default):
    each disposition arrives settled, the router's reading of every outcome other than the usual
    ACCEPTED-unsettled one (router/server.py, `_read_outcome`, on the engine's runs of updates):
    REJECTED reaches the publisher as REJECTED, RELEASED and MODIFIED hand the message again on the
    same link, and the next ACCEPTED reaches the publisher as ACCEPTED."""
    import threading

    from proton import Disposition, Message
    from proton.utils import BlockingConnection, SendException

    bodies = ("ok", "rej", "rel", "mod", "ok2")
    sub_conn = BlockingConnection(router.url, timeout=30)
    try:
        rcv = sub_conn.create_receiver("disp/t", name="d", credit=10)
        outcomes: dict[str, str] = {}

        def publish() -> None:
            conn = BlockingConnection(router.url, timeout=30)
            try:
                snd = conn.create_sender("disp/t")
                for body in bodies:
                    try:
                        snd.send(Message(body=body))  # (waits for the outcome)
                        outcomes[body] = "ACCEPTED"
                    except SendException as exc:
                        outcomes[body] = "REJECTED" if exc.state == Disposition.REJECTED else str(exc.state)
            finally:
                conn.close()

        t = threading.Thread(target=publish, daemon=True)
        t.start()
        seen: list[str] = []
        while len([b for b in seen if b in ("ok", "ok2")]) < 2 or "rej" not in seen or seen.count("rel") < 2 \
                or seen.count("mod") < 2:
            m = rcv.receive(timeout=30)
            seen.append(m.body)
            if m.body == "rej":
                rcv.reject()
            elif m.body == "rel" and seen.count("rel") == 1:
                rcv.release(delivered=False)  # RELEASED
            elif m.body == "mod" and seen.count("mod") == 1:
                rcv.release(delivered=True)  # MODIFIED (delivery-failed)
            else:
                rcv.accept()
        t.join(30)
        assert not t.is_alive()
    finally:
        sub_conn.close()
    assert seen == ["ok", "rej", "rel", "rel", "mod", "mod", "ok2"], seen
    assert outcomes == {"ok": "ACCEPTED", "rej": "REJECTED", "rel": "ACCEPTED", "mod": "ACCEPTED",
                        "ok2": "ACCEPTED"}, outcomes
