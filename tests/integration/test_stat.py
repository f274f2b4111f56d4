"""`oncemesh stat` and the `$management` address (docs/operations.md, "oncemesh stat"): real routers,
the command as a user runs it; a foreign AMQP client (Proton's own request/response with a dynamic
reply queue); TLS with a password; a user the policy does not grant `manage` is refused."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection, LinkDetached, SyncRequestResponse

from oncemesh.clients.runtime import Client
from oncemesh.clients.stat import Management
from oncemesh.common.pki import issue, make_ca
from oncemesh.harness.procs import wait_for
from tests.helpers import log_has
from tests.integration.test_auth import _oncemesh, users_file  # noqa: F401  (a fixture)
from tests.integration.test_single_router import run


async def stat(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`oncemesh stat ARGS` as a subprocess, without blocking the loop (our clients keep talking)."""
    p = await asyncio.create_subprocess_exec(sys.executable, "-m", "oncemesh", "stat", *args,
                                             stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                             env={**os.environ, **(env or {})})
    out, err = await asyncio.wait_for(p.communicate(), 60)
    return int(p.returncode or 0), out.decode(), err.decode()


async def views(url: str, *names: str) -> dict[str, Any]:
    rc, out, err = await stat(*names, "--url", url, "--json")
    assert rc == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def test_stat_shows_a_line3_mesh_with_subscriptions_and_messages_in_flight(mesh_of: Any) -> None:
    """line3: A - B - C. A subscription of C's is suspended while A's publisher sends: the messages
    wait in flight at their origin A, owed to it. stat at A and at C shows them; then it resumes."""
    mesh = mesh_of("line3")
    url_a, url_b, url_c = mesh.urls()

    async def main() -> None:
        sub_c = await Client(url_c).start()
        pub_c = await Client(url_a).start()
        try:
            sub = sub_c.subscriber("news", "s1", expiry=120)
            await sub.wait_attached(20)
            sid = sub.sid
            await sub.detach()  # suspended: what is published now waits for it
            pub = pub_c.publisher("news", "p")
            futs = [await pub.send(f"m{i}") for i in range(20)]

            async def in_flight() -> dict[str, Any]:
                v = await views(url_a, "inflight", "subscriptions", "topics", "links")
                return v if v["inflight"]["total"] == 20 else {}

            deadline = asyncio.get_running_loop().time() + 20
            a: dict[str, Any] = {}
            while not a and asyncio.get_running_loop().time() < deadline:
                a = await in_flight()
            assert a, "20 records in flight at A"
            recs = a["inflight"]["rows"]
            assert {r["origin"] for r in recs} == {"here"} and all(r["pending"] == 1 and r["outcome"] is None
                                                                  and r["publisher"] for r in recs)
            (s,) = [r for r in a["subscriptions"]["rows"] if r["sid"] == sid]
            assert (s["topic"], s["home"], s["state"], s["backlog"], s["link"]) == ("news", "C", "suspended", 20, "s1")
            (t,) = a["topics"]["rows"]
            assert (t["topic"], t["order"], t["subscriptions"], t["publishers_here"], t["undecided"]) == (
                "news", "fifo", 1, 1, 20)
            (pl,) = [r for r in a["links"]["rows"] if r["role"] == "publisher"]
            assert (pl["name"], pl["topic"], pl["unsettled"]) == ("p", "news", 20)
            # peers: A reaches both, but has a link to B only (line3)
            peers = {r["router"]: r for r in (await views(url_a, "peers"))["peers"]["rows"]}
            assert peers["B"]["reachable"] and peers["B"]["link_up"] and peers["B"]["synced"]
            assert peers["C"]["reachable"] and peers["C"]["link_up"] is None
            # C is the subscription's home: it knows the same subscription
            c_subs = (await views(url_c, "subscriptions"))["subscriptions"]["rows"]
            assert [(r["sid"], r["home"]) for r in c_subs] == [(sid, "C")]
            # a view read page by page (7 rows at a time) is the view read at once
            mc = await Client(url_a).start()
            try:
                paged = await Management(mc).view("inflight", limit=100, page_size=7)
                assert [r[0] for r in paged["rows"]] == [r["gid"] for r in recs] and paged["truncated"] is False
                cut = await Management(mc).view("inflight", limit=10, page_size=7)
                assert (len(cut["rows"]), cut["total"], cut["truncated"]) == (10, 20, True)
            finally:
                await mc.close()
            # a cut view says so
            rc, out, err = await stat("inflight", "--url", url_a, "--limit", "5")
            assert rc == 0 and "inflight (router A): 5 of 20 rows (--limit)" in out, out + err
            # the subscription resumes: everything is delivered, decided and the records go
            sub = sub_c.subscriber("news", "s1", expiry=120)
            assert len(await sub.get_many(20, timeout=30)) == 20
            for f in futs:
                assert (await asyncio.wait_for(f, 30)).accepted
            while (await views(url_a, "inflight"))["inflight"]["total"] and \
                    asyncio.get_running_loop().time() < deadline + 30:
                await asyncio.sleep(0.2)
            assert (await views(url_a, "inflight"))["inflight"]["total"] == 0
            # the text form of a table and of the router view
            rc, out, _ = await stat("subscriptions", "router", "--url", url_c)
            assert rc == 0 and "subscriptions (router C)" in out and "active" in out and sid in out
            assert "  ready           yes" in out and "  peers           A,B" in out
        finally:
            await pub_c.close()
            await sub_c.close()

    run(main(), timeout=120)


def test_a_foreign_client_asks_with_a_dynamic_reply_queue(make_router: Any) -> None:
    """Any AMQP 1.0 client: Proton's own SyncRequestResponse (a dynamic receiver for replies)."""
    r = make_router("F")
    conn = BlockingConnection(r.url, timeout=10)
    try:
        client = SyncRequestResponse(conn, "$management")
        assert client.reply_to.startswith("$management/reply/")
        reply = client.call(Message(properties={"operation": "QUERY", "type": "connections"}, body={"limit": 10}))
        assert reply.properties["statusCode"] == 200 and reply.body["router"] == "F"
        assert reply.body["columns"][0] == "peer" and len(reply.body["rows"]) == 1  # (this connection)
        bad = client.call(Message(properties={"operation": "QUERY", "type": "nope"}))
        assert bad.properties["statusCode"] == 404 and "views: router, connections" in bad.properties[
            "statusDescription"]
        write = client.call(Message(properties={"operation": "DELETE", "type": "subscriptions"}))
        assert write.properties["statusCode"] == 400 and "read-only" in write.properties["statusDescription"]
        # a reply address of its own under $management/, unique on the connection
        replies = conn.create_receiver("$management/mine", credit=1, name="mine-1")
        conn.create_sender("$management", name="requests-2").send(Message(reply_to="$management/mine", correlation_id="c1",
                                                        properties={"operation": "QUERY", "type": "router"}))
        got = replies.receive(timeout=10)
        assert got.correlation_id == "c1" and got.body["rows"][0][0] == "F"
        with pytest.raises(LinkDetached, match="in use by another link on this connection"):
            conn.create_receiver("$management/mine", name="mine-2")
    finally:
        conn.close()
    wait_for(lambda: log_has(r.log_dir / "F.router.log", "management.request", "view=nope", "status=404"), 10, "log")


POLICY = """
[groups.ops]
publish = ["#"]
subscribe = ["#"]
manage = true

[defaults]
subscribe = ["public/#"]
"""


def test_stat_over_tls_with_a_password_and_a_user_without_manage_is_refused(
        make_router: Any, users_file: Path, tmp_path: Path) -> None:  # noqa: F811
    pki = tmp_path / "pki"
    make_ca(pki)
    cert, key = issue(pki, "server", ["127.0.0.1"])
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    r = make_router("T", settings={"users_file": str(users_file), "tls_cert": str(cert), "tls_key": str(key),
                                   "policy_file": str(policy)})
    assert r.url.startswith("amqps://")
    common = ["--url", r.url, "--ca", str(pki / "ca.pem"), "--timeout", "10"]

    async def main() -> None:
        # alice (group ops: manage = true) over TLS with a password from $ONCEMESH_PASSWORD
        rc, out, err = await stat("connections", "router", *common, "--user", "alice",
                                  env={"ONCEMESH_PASSWORD": "wonderland"})
        assert rc == 0, err
        assert "alice" in out and "yes" in out  # her connection: user alice, TLS yes
        assert "  client_auth     sasl" in out
        # bob logs in, but the policy does not grant him manage: refused, and he is told why
        rc, out, err = await stat(*common, "--user", "bob", env={"ONCEMESH_PASSWORD": "builder"})
        assert rc == 1 and "amqp:unauthorized-access" in err and "may not use $management" in err, err
        assert "manage = true" in err
        # a wrong password
        rc, out, err = await stat(*common, "--user", "alice", env={"ONCEMESH_PASSWORD": "nope"})
        assert rc == 1 and "authentication failed" in err, err
        # without trusting the router's CA
        rc, out, err = await stat("--url", r.url, "--timeout", "3", "--user", "alice",
                                  env={"ONCEMESH_PASSWORD": "wonderland"})
        assert rc == 1 and "CERTIFICATE_VERIFY_FAILED" in err, err

    run(main(), timeout=120)
    log = r.log_dir / "T.router.log"
    assert log_has(log, "link.refused", "user 'bob' may not use $management")
    assert log_has(log, "management.request", "user=alice", "view=connections", "status=200")
    out = _oncemesh("stat", "--help")
    assert out.returncode == 0 and "manage permission" in out.stdout


@pytest.mark.parametrize("anonymous_manage", [False, True])
def test_anonymous_management_only_where_the_policy_says(make_router: Any, tmp_path: Path,
                                                         anonymous_manage: bool) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(f"[defaults]\nmanage = true\n[anonymous]\nmanage = {str(anonymous_manage).lower()}\n")
    r = make_router("N", settings={"policy_file": str(policy)})  # an open router with a policy

    async def main() -> None:
        rc, out, err = await stat("--url", r.url)
        assert (rc == 0) == anonymous_manage, err
        if not anonymous_manage:
            assert "user 'anonymous' may not use $management" in err

    run(main(), timeout=60)
