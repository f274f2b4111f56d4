"""A topic in causal order with real router processes and a slow link: a relay client is handed a
message quickly over one path and publishes a reply; the reply reaches a third router before the
original (which takes the slow link there). The third router holds the reply back until the
original is handed first. Verdicts come from the client settlement logs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oncemesh.harness.procs import wait_for
from oncemesh.topology.launcher import Mesh
from tests.helpers import OrderSummary
from tests.integration.test_failover import run_all
from tests.integration.test_total_order import count_events, worker

TOPIC = "ledger"  # (the name test_total_order's workers use)


def triangle(tmp: Path) -> Path:
    text = ['[mesh]\nname = "triangle-causal"\nhello_interval = 0.5\ndead_after = 2.0\n']
    for r in "ABC":
        text.append(f'[routers.{r}]\nlisten = "127.0.0.1:0"\ninter_router = "127.0.0.1:0"\n')
    for a, b in (("A", "B"), ("B", "C"), ("A", "C")):
        text.append(f'[[links]]\nbetween = ["{a}", "{b}"]\n')
    text.append(f'[topics.{TOPIC}]\norder = "causal"\n')
    path = tmp / "triangle-causal.toml"
    path.write_text("\n".join(text))
    return path


def test_a_reply_that_overtakes_what_it_answers_is_held_back(tmp_path: Path,
                                                             mesh_of: Callable[..., Any]) -> None:
    """
        A ──── slow (0.3 s) ──── C      the publisher on A, the subscriber on C
         \\                     /
          B ── the relay ─────        the relay on B: handed each message, it publishes a reply
    """
    del mesh_of  # (this test needs link proxies: its own Mesh)
    mesh = Mesh(triangle(tmp_path), tmp_path / "mesh", proxies=True)
    try:
        mesh.up(timeout=60)
        mesh.delay_link("A", "C", 0.3)
        logs = tmp_path / "logs"
        n = 60
        sub = worker(tmp_path, logs, "consume", [mesh.url("C")], "sub-C", 2 * n)
        relay = worker(tmp_path, logs, "relay", [mesh.url("B")], "relay-B", n)
        try:
            wait_for(lambda: count_events(logs, "subscribed") >= 2, 30, "subscriptions in force")
            pub = worker(tmp_path, logs, "publish", [mesh.url("A")], "pub-A", n, "--rate", "20")
            run_all([pub, relay, sub], 120)
        finally:
            sub.stop(5)
            relay.stop(5)
        s = OrderSummary(logs)
        assert len(s.published) == 2 * n and set(s.outcome.values()) == {"ACCEPTED"}
        subs = s.subs()
        assert len(subs) == 2
        assert not s.check_exactly_once(subs)
        assert not s.check_fifo(subs)
        deps = s.causal_deps()
        replies = [g for g, d in deps.items() if d]
        assert len(replies) == n  # every reply depends on what the relay had been handed
        problems = s.check_causal(subs)
        assert not problems, problems
        # the scenario did bite: replies carried their dependencies, reached C first and waited there
        # (the ready files are refreshed about every second)
        def stat(r: str, name: str) -> int:
            return int(json.loads(mesh.ready_file(r).read_text())["stats"][name])

        # (a message already final at B when its reply is published is no dependency: C has it)
        wait_for(lambda: stat("B", "causal_deps") >= n // 2, 10, "B's status: dependencies attached to replies")
        assert stat("C", "fifo_holds") > 0
    finally:
        mesh.down(timeout=10)
