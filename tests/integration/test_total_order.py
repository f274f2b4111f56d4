"""A topic in total order (by the sequencer, or by Lamport clocks) with real router processes: every
subscription is handed the topic's messages in one order, whoever published them and wherever, also
while the sequencer's router (or any member of the Lamport stream) is killed mid-stream. Verdicts
come from the client settlement logs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oncemesh.harness.procs import Proc, python_cmd, wait_for
from tests.helpers import OrderSummary
from tests.integration.test_failover import run_all

TOPIC = "ledger"


def topology(tmp: Path, name: str, links: list[tuple[str, str]], algorithm: str = "sequencer") -> Path:
    routers = sorted({r for link in links for r in link})
    text = [f'[mesh]\nname = "{name}"\nhello_interval = 0.5\ndead_after = 1.5\n']
    for r in routers:
        text.append(f'[routers.{r}]\nlisten = "127.0.0.1:0"\ninter_router = "127.0.0.1:0"\n')
    for a, b in links:
        text.append(f'[[links]]\nbetween = ["{a}", "{b}"]\n')
    text.append(f'[topics.{TOPIC}]\norder = "total"\ntotal = "{algorithm}"\n')
    path = tmp / f"{name}.toml"
    path.write_text("\n".join(text))
    return path


def worker(tmp: Path, logs: Path, kind: str, urls: list[str], name: str, count: int, *extra: str) -> Proc:
    return Proc(python_cmd("-m", "oncemesh.harness.worker", kind, "--url", ",".join(urls), "--topic", TOPIC,
                           "--name", name, "--state-dir", str(tmp / name), "--log-dir", str(logs),
                           "--count", str(count), "--reconnect-timeout", "60", *extra), tmp / f"{name}.out")


def count_events(logs: Path, ev: str) -> int:
    return sum(1 for f in logs.glob("*.subscriber.jsonl") for line in open(f) if f'"ev":"{ev}"' in line)


def verdict(logs: Path, n_subs: int, n_msgs: int) -> OrderSummary:
    s = OrderSummary(logs)
    assert len(s.published) == n_msgs
    assert len(s.outcome) == n_msgs and set(s.outcome.values()) == {"ACCEPTED"}
    subs = s.subs()
    assert len(subs) == n_subs
    problems = s.check_exactly_once(subs)
    assert not problems, problems
    order = s.check_total(subs)
    assert not order, order
    return s


def interleaved(s: OrderSummary) -> bool:
    """Did the publishers' messages interleave in the order (so that the check could fail)?"""
    [sub, *_] = sorted(s.subs())
    pubs = [g.split(":")[0] for _, _, g in sorted(s.hand_order[sub])]
    return sum(1 for a, b in zip(pubs, pubs[1:], strict=False) if a != b) > 5


def test_publishers_on_two_routers_subscribers_on_three_get_one_order(mesh_of: Callable[..., Any],
                                                                       tmp_path: Path) -> None:
    mesh = mesh_of(topology(tmp_path, "line3-total", [("A", "B"), ("B", "C")]))
    logs = tmp_path / "logs"
    n = 200
    subs = [worker(tmp_path, logs, "consume", [mesh.url(r)], f"sub-{r}", 2 * n) for r in "ABC"]
    try:
        wait_for(lambda: count_events(logs, "subscribed") >= 3, 30, "subscriptions in force")
        pubs = [worker(tmp_path, logs, "publish", [mesh.url(r)], f"pub-{r}", n, "--rate", "60") for r in "AC"]
        run_all([*pubs, *subs], 120)
    finally:
        for p in subs:
            p.stop(5)
    s = verdict(logs, 3, 2 * n)
    assert interleaved(s)

    def numbered() -> int:  # the ready file (what `oncemesh status` shows) is refreshed about every second
        order = json.loads(mesh.ready_file("B").read_text()).get("order", {}).get(TOPIC, {})
        assert order.get("algorithm") == "sequencer" and order.get("sequencer") == "C", order
        return int(order.get("numbered", 0))

    wait_for(lambda: numbered() == 2 * n + 3, 10, "B's status: 400 messages and 3 subscription starts numbered")


def test_the_sequencers_router_killed_mid_stream(mesh_of: Callable[..., Any], tmp_path: Path) -> None:
    """Bully elects the highest live router: C numbers until it is killed; A and B elect B, which
    takes over from what a majority committed (no gap, no number twice); C comes back and rejoins."""
    mesh = mesh_of(topology(tmp_path, "triangle-total", [("A", "B"), ("B", "C"), ("A", "C")]))
    logs = tmp_path / "logs"
    n = 300
    subs = [worker(tmp_path, logs, "consume", [mesh.url(r)], f"sub-{r}", 2 * n) for r in "AB"]
    try:
        wait_for(lambda: count_events(logs, "subscribed") >= 2, 30, "subscriptions in force")
        pubs = [worker(tmp_path, logs, "publish", [mesh.url(r)], f"pub-{r}", n, "--rate", "100") for r in "AB"]
        wait_for(lambda: count_events(logs, "handed") >= 2 * n // 2, 60, "a quarter of the stream")
        mesh.kill_router("C")
        wait_for(lambda: count_events(logs, "handed") >= 2 * n, 60, "delivery goes on without C")
        mesh.up(timeout=60)  # C restarts and recovers its part of the numbering from A and B
        run_all([*pubs, *subs], 120)
    finally:
        for p in subs:
            p.stop(5)
    s = verdict(logs, 2, 2 * n)
    assert interleaved(s)


def test_lamport_publishers_on_two_routers_a_member_killed_and_back(mesh_of: Callable[..., Any],
                                                                    tmp_path: Path) -> None:
    """Total order by Lamport clocks on the line: publishers at both ends, a subscriber on every
    router. The middle router (on the data path, a member whose acknowledgements every delivery
    needs) is killed mid-stream: A and C cannot reach each other, so nothing is delivered (the
    stream needs a majority view) until B restarts without its part of the stream, rejoins in a new
    view and learns the history; then everything is delivered, in one order everywhere."""
    mesh = mesh_of(topology(tmp_path, "line3-lamport", [("A", "B"), ("B", "C")], "lamport"))
    logs = tmp_path / "logs"
    n = 200
    subs = [worker(tmp_path, logs, "consume", [mesh.url(r)], f"sub-{r}", 2 * n) for r in "ABC"]
    try:
        wait_for(lambda: count_events(logs, "subscribed") >= 3, 30, "subscriptions in force")
        pubs = [worker(tmp_path, logs, "publish", [mesh.url(r)], f"pub-{r}", n, "--rate", "100") for r in "AC"]
        wait_for(lambda: count_events(logs, "handed") >= 3 * n // 2, 60, "a quarter of the stream")
        mesh.kill_router("B")
        mesh.up(timeout=60)  # B restarts as a new incarnation (state dir kept: a restarted member)
        run_all([*pubs, *subs], 120)
    finally:
        for p in subs:
            p.stop(5)
    s = verdict(logs, 3, 2 * n)
    assert interleaved(s)

    def status(r: str) -> dict[str, Any]:
        return dict(json.loads(mesh.ready_file(r).read_text()).get("order", {}).get(TOPIC, {}))

    def agreed() -> bool:
        seen = [status(r) for r in "ABC"]
        assert all(o.get("algorithm") == "lamport" for o in seen), seen
        return (len({o.get("numbered") for o in seen}) == 1 and seen[0].get("numbered") == 2 * n + 3
                and len({json.dumps(o.get("view")) for o in seen}) == 1 and seen[0].get("state") == "normal")

    wait_for(agreed, 10, "one view everywhere, 400 messages and 3 subscription starts numbered")
