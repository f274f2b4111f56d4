"""The router's HTTP listener: /metrics (Prometheus text), /healthz, /readyz. The event counters
match the settlement log's lines after a run; the listener survives bad requests."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from oncemesh.clients.runtime import Client
from oncemesh.common.settlement_log import read_events
from oncemesh.harness.procs import wait_for
from tests.conftest import EXAMPLES
from tests.integration.test_single_router import run


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def log_events(log_dir: Path, rid: str) -> Counter[str]:
    """Events of a router's settlement log, every segment (plain or gzipped)."""
    counts: Counter[str] = Counter()
    for f in sorted(log_dir.glob(f"{rid}.settlement.*")):
        for e in read_events(f):  # (v2 lines group ids: one event per id; a torn last line is skipped)
            if e.get("ev"):
                counts[e["ev"]] += 1
    return counts


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_match_the_settlement_log_and_health_answers(make_router: Any) -> None:
    r = make_router("M", settings={"http_listen": "127.0.0.1:0"})
    base = f"http://{r.status()['http']}"
    assert get(f"{base}/healthz") == (200, '{"alive": true}\n')
    code, body = get(f"{base}/readyz")
    assert code == 200 and json.loads(body)["ready"] is True

    async def main() -> None:
        c = await Client(r.url).start()
        try:
            subs = [c.subscriber("m", f"s{i}", expiry=0) for i in range(2)]
            for s in subs:
                await s.wait_attached(10)
            pub = c.publisher("m", "p")
            futs = [await pub.send(f"m{i}") for i in range(50)]
            for s in subs:
                assert len(await s.get_many(50, timeout=20)) == 50
            for f in futs:
                assert (await asyncio.wait_for(f, 20)).accepted
        finally:
            await c.close()

    run(main())

    def matches() -> bool:
        m, logged = scrape(base), log_events(r.log_dir, "M")
        return all(m.get(("oncemesh_events_total", (("event", ev),)), -1) == logged[ev]
                   for ev in ("received", "delivered", "accepted", "outcome", "settled")) and logged["received"] == 50

    wait_for(matches, 10, "the counters to match the settlement log")
    m = scrape(base)
    assert m[("oncemesh_events_total", (("event", "delivered"),))] == 100
    assert m[("oncemesh_outcomes_sent_total", (("outcome", "accepted"),))] == 50
    assert m[("oncemesh_outcomes_sent_total", (("outcome", "rejected"),))] == 0
    assert m[("oncemesh_router_info", (("client_auth", "anonymous"), ("id", "M"),
                                       ("incarnation", r.status()["incarnation"]),
                                       ("mesh_security", "standalone")))] == 1
    assert m[("oncemesh_connections", ())] == 0 and m[("oncemesh_ready", ())] == 1
    assert m[("oncemesh_log_writable", ())] == 1 and m[("oncemesh_log_bytes", ())] > 0
    assert m[("oncemesh_rss_bytes", ())] > 10e6
    # not a path, not a method, not HTTP: answered, and the router goes on
    assert get(f"{base}/nope")[0] == 404
    req = urllib.request.Request(f"{base}/metrics", method="POST", data=b"x")
    assert _post_status(req) == 405
    host, port = r.status()["http"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"\x00\xff garbage\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    assert get(f"{base}/healthz")[0] == 200


def _post_status(req: urllib.request.Request) -> int:
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_a_mesh_router_reports_its_peers_and_readiness(mesh_of: Any, tmp_path: Path) -> None:
    topo = tmp_path / "line3.toml"
    topo.write_text('[defaults]\nhttp_listen = "127.0.0.1:0"\n\n' + (EXAMPLES / "line3.toml").read_text())
    mesh = mesh_of(topo)
    info = json.loads(mesh.ready_file("B").read_text())
    base = f"http://{info['http']}"
    code, body = get(f"{base}/readyz")
    assert code == 200 and json.loads(body) == {"ready": True, "table_synced": True, "log_writable": True,
                                                "accepting_publishers": True, "draining": False, "peers_known": True,
                                                "mesh_converged": True, "peers": ["A", "C"]}
    m = scrape(base)
    assert m[("oncemesh_peer_up", (("peer", "A"),))] == 1 and m[("oncemesh_peer_up", (("peer", "C"),))] == 1
    assert m[("oncemesh_neighbour_up", (("peer", "A"),))] == 1 and m[("oncemesh_neighbour_up", (("peer", "C"),))] == 1
    assert m[("oncemesh_mesh_converged", ())] == 1 and m[("oncemesh_gossip_unsynced_peers", ())] == 0
    assert m[("oncemesh_router_info", (("client_auth", "anonymous"), ("id", "B"), ("incarnation", info["incarnation"]),
                                       ("mesh_security", "mutual-tls")))] == 1
    # a peer dies: B says so, and stays ready (it serves its side; no load balancer flap)
    mesh.kill_router("C")

    def c_down() -> bool:
        m = scrape(base)
        return m[("oncemesh_peer_up", (("peer", "C"),))] == 0 and m[("oncemesh_neighbour_up", (("peer", "C"),))] == 0

    wait_for(c_down, 20, "B to see C down")
    code, body = get(f"{base}/readyz")
    assert code == 200 and json.loads(body)["peers"] == ["A"]


def test_an_order_stream_reports_its_lag(mesh_of: Any, tmp_path: Path) -> None:
    topo = tmp_path / "tri.toml"
    topo.write_text('[defaults]\nhttp_listen = "127.0.0.1:0"\n\n' + (EXAMPLES / "triangle.toml").read_text()
                    + '\n[topics.ledger]\norder = "total"\n')
    mesh = mesh_of(topo)
    base = f"http://{json.loads(mesh.ready_file('A').read_text())['http']}"

    async def main() -> None:
        c = await Client(mesh.urls()[0]).start()
        try:
            sub = c.subscriber("ledger", "s", expiry=0)
            await sub.wait_attached(20)
            pub = c.publisher("ledger", "p")
            futs = [await pub.send(f"m{i}") for i in range(5)]
            assert len(await sub.get_many(5, timeout=20)) == 5
            for f in futs:
                assert (await asyncio.wait_for(f, 20)).accepted
        finally:
            await c.close()

    run(main())
    m = scrape(base)
    assert m[("oncemesh_order_numbered", (("algorithm", "sequencer"), ("topic", "ledger")))] >= 6  # 5 + the start
    assert m[("oncemesh_order_waiting", (("topic", "ledger"),))] == 0
    # the same stream in `oncemesh stat orders`
    out = subprocess.run([sys.executable, "-m", "oncemesh", "stat", "orders", "--json", "--url", mesh.urls()[0]],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["orders"]["rows"]
    assert (row["topic"], row["algorithm"], row["waiting_here"]) == ("ledger", "sequencer", 0)
    assert row["numbered"] == m[("oncemesh_order_numbered", (("algorithm", "sequencer"), ("topic", "ledger")))]
