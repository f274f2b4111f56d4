"""A durable subscription claimed by another identity while its maker's claim is still travelling
(issue 31, hole 1; docs/security.md, "Threat model"). Real routers on loopback, a secured mesh of
two (a users file at both); the rule itself is tested under the simulator in every interleaving
(tests/sim/test_claim_race_sim.py) and as a pure rule (tests/unit/test_claims.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from oncemesh.clients.runtime import Client
from oncemesh.clients.subscriber import Subscriber
from oncemesh.common.errors import LinkRefused
from oncemesh.common.ids import subscription_id
from oncemesh.harness.procs import wait_for
from tests.helpers import log_has, two_router_mesh
from tests.integration.test_auth import _oncemesh
from tests.integration.test_single_router import run

SECURED_MESH = two_router_mesh('users_file = "users.json"')
DELAYS_MS = range(21)  # bob attaches 0, 1, ... 20 ms after alice's attach reached A
FROZEN_ROUNDS = 5  # and with B stopped meanwhile: his attach and her announcement reach it together


def _users(path: Path) -> None:
    for name, password in (("alice", "wonderland"), ("bob", "builder")):
        out = _oncemesh("user", "add", name, "--users-file", str(path), "--password-stdin", "--iterations", "4096",
                        stdin=password + "\n")
        assert out.returncode == 0, out.stderr


async def _in_table(table: Path, sid: str) -> None:
    """Until router A's subscription table (fsynced before the attach is answered, in the pass that
    took it) holds `sid`: alice's attach reached A and her claim is on its way to B."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        try:
            if any(e["sid"] == sid for e in json.loads(table.read_text())["subscriptions"]):
                return
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        assert loop.time() < deadline, f"{sid} never reached A's table"
        await asyncio.sleep(0.0005)


async def _sent(sub: Subscriber) -> None:
    """Until the client has begun the attach of `sub` (its frame goes out at the end of that pass)."""
    while sub.link is None:
        await asyncio.sleep(0.0005)
    await asyncio.sleep(0)


def test_another_identity_attaching_right_after_the_maker_elsewhere_is_refused(
        mesh_of: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Alice makes a durable subscription at A; bob, with valid credentials, attaches with her
    container id and link name at B 0-20 ms after her attach reached A, or while B is stopped (then
    his attach and her claim reach B together, and B takes client input first: the race). (It used
    to: her answered attach was closed with amqp:link:stolen and bob held her subscription.) Every
    time: her attach is answered and her link stays open, bob's is refused with
    amqp:unauthorized-access and logged, and her messages keep coming to her."""
    d = tmp_path / "secured"
    d.mkdir()
    (d / "mesh.toml").write_text(SECURED_MESH)
    _users(d / "users.json")
    mesh = mesh_of(d / "mesh.toml")
    a, b = mesh.urls()
    pid_b = next(s.pid for s in mesh.status() if s.id == "B")
    table_a = mesh.state_dir / "routers" / "A" / "A.subscriptions.json"
    caplog.set_level(logging.WARNING, logger="oncemesh")

    async def round_(alice: Client, bob: Client, name: str, delay_ms: int | None) -> Subscriber:
        mine = alice.subscriber("orders", name, expiry=60)
        if delay_ms is None:
            os.kill(pid_b, signal.SIGSTOP)
        try:
            await _in_table(table_a, subscription_id(alice.container_id, name, "orders"))
            if delay_ms:
                await asyncio.sleep(delay_ms / 1000)
            theirs = bob.subscriber("orders", name, expiry=60)
            await _sent(theirs)
        finally:
            if delay_ms is None:
                os.kill(pid_b, signal.SIGCONT)
        with pytest.raises(LinkRefused, match="another identity") as refused:
            await theirs.wait_attached(20)
        assert refused.value.condition == "amqp:unauthorized-access", f"{name}: {refused.value}"
        await mine.wait_attached(20)
        return mine

    async def main() -> None:
        alice = await Client(a, user="alice", password="wonderland").start()
        bob = await Client(b, user="bob", password="builder", container_id=alice.container_id).start()
        try:
            hers = [await round_(alice, bob, f"s{i}", i) for i in DELAYS_MS]
            hers += [await round_(alice, bob, f"f{i}", None) for i in range(FROZEN_ROUNDS)]
            fut = await alice.publisher("orders", "p").send("for alice")
            for sub in hers:
                got = await sub.get_many(1, timeout=20)
                assert [m.body for m in got] == ["for alice"], f"{sub.name}: {got}"
            assert (await asyncio.wait_for(fut, 20)).accepted
        finally:
            await bob.close()
            await alice.close()

    run(main(), timeout=180)
    stolen = [r.getMessage() for r in caplog.records if "amqp:link:stolen" in r.getMessage()]
    assert not stolen, f"alice's link was taken: {stolen}"
    log = mesh.log_dir / "B.router.log"
    wait_for(lambda: log_has(log, "link.refused", "condition=amqp:unauthorized-access"), 10, "bob's refusals logged")
