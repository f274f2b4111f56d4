"""What foreign clients showed about the router, pinned with python-qpid-proton's own client (exact
control of tags and settlement) and this folder's python subscriber (it reports delivery tags).

- Qpid JMS reuses a delivery tag once its delivery is settled (AMQP allows it: a tag must be unique
  only among unsettled deliveries), and so does Proton C++ 0.37's default tag (a counter in the
  `sender` wrapper, which every event makes anew). oncemesh took (container, link, tag) for a
  message's identity forever: on one router the second message was handed under the first one's
  global id (a subscriber deduplicating by tag dropped it, though "a settled delivery means this id
  will never be handed to this subscription again": a false ACCEPTED); across a mesh the routers
  that held the first one's id as final refused the copy and the publisher never got an outcome.
  Now a tag used again on the same link after its delivery was settled names another message,
  handed under a new global id (router/identity.py).
- A publisher with receiver-settle-mode first whose connection drops after the router settled a
  message but before the outcome reached it sends it again under the same tag (as it should). On one
  router it was ACCEPTED again and handed again under the same tag; across a mesh it never got an
  outcome. Now the router that settled it answers the resend with the outcome it remembers (with
  the message's final memory), and hands nothing again.
- An empty transfer is no message: refused with amqp:decode-error, never handed or ACCEPTED
  (before: ACCEPTED and handed as an empty delivery, which crashed Proton's receiving handler).
- Qpid JMS ends a durable subscription (Session.unsubscribe) by attaching the subscription's link
  name with no source (a lookup: the peer answers with the subscription's source) and closing it.
  The router refused a link without a source address, answering with a source that has no
  address, which Qpid JMS took for the subscription found: it closed the link and reported success
  while the subscription (expiry-policy never) lived on and held every later message of its topic.
  Now the lookup is answered with the subscription's source (the closing detach ends it), or, when
  its container holds none under that name, with a null source and amqp:not-found.
- FIFO per publisher read any client's tag in counter form as its sequence number: a tag lower than
  one already handed to a subscription (random tags, tags started again) ended the message for it,
  and its publisher was told ACCEPTED without the subscriber ever getting it. Now only our clients
  (which declare their sequence at attach) are ordered by tag; any other client by arrival.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Link, Message, SSLDomain, Terminus
from proton.reactor import Container, ReceiverOption
from proton.utils import BlockingConnection, BlockingSender, LinkDetached

from oncemesh.common.pki import issue, make_ca
from oncemesh.harness.procs import Proc, wait_for
from tests.foreign.clients import Family, read_report
from tests.foreign.verdict import client_verdict

pytestmark = pytest.mark.foreign

SUBSCRIBER = Path(__file__).resolve().parent / "proton_py" / "subscriber.py"



def blocking(url: str, container: str) -> BlockingConnection:
    c = Container()
    c.container_id = container
    return BlockingConnection(url, timeout=10, container=c)


def publish(conn: BlockingConnection, snd: BlockingSender, tag: str, body: str | None = None,
            raw: bytes | None = None, wait: float = 8.0) -> tuple[int | None, Any]:
    """One transfer with this tag (a message, or `raw` bytes as they are); its outcome and condition,
    (None, None) when none came within `wait` seconds. Settled after the outcome."""
    link = snd.link
    d: Any
    if raw is None:
        d = link.send(Message(id=body, body=f"{body};"), tag=tag)
    else:
        d = link.delivery(tag)
        link.send(raw)
        link.advance()
    try:
        conn.wait(lambda: d.remote_state in (Delivery.ACCEPTED, Delivery.REJECTED, Delivery.RELEASED), timeout=wait)
    except Exception:  # (proton.Timeout, or the link closed under it)
        if d.remote_state not in (Delivery.ACCEPTED, Delivery.REJECTED, Delivery.RELEASED):
            return None, None
    state, cond = d.remote_state, d.remote.condition
    d.settle()
    return state, cond


@pytest.fixture
def subscriber(procs: Any, tmp_path: Path) -> Iterator[Any]:
    """Start this folder's python subscriber (topic t, link s) at a URL; returns its report path."""
    def start(url: str) -> Path:
        report = tmp_path / "sub.jsonl"
        procs.add(Proc([sys.executable, str(SUBSCRIBER), "--url", url, "--topic", "t", "--container", "s",
                        "--link", "s", "--expiry", "60", "--report", str(report)], tmp_path / "sub.out"))
        wait_for(lambda: any(e["ev"] == "attached" for e in read_report(report)), 30, "the subscriber attached")
        return report

    yield start


def handed(report: Path) -> list[tuple[str, str]]:
    return [(e["tag"], e["key"]) for e in read_report(report) if e["ev"] == "msg"]


def urls(where: str, make_router: Any, mesh_of: Any) -> tuple[str, str]:
    """(publisher's URL, subscriber's URL): one router, or the two ends of line3."""
    if where == "one router":
        r = make_router("A")
        return r.url, r.url
    mesh = mesh_of("line3")
    return mesh.url("A"), mesh.url("C")


@pytest.mark.parametrize("where", ["one router", "line3"])
def test_a_tag_reused_after_settlement_is_a_new_message(where: str, make_router: Any, mesh_of: Any,
                                                        subscriber: Any) -> None:
    pub_url, sub_url = urls(where, make_router, mesh_of)
    report = subscriber(sub_url)
    conn = blocking(pub_url, "reuser")
    try:
        snd = conn.create_sender("t", name="p")
        assert publish(conn, snd, "0", "m1")[0] == Delivery.ACCEPTED
        # settled: the tag is free again (what Qpid JMS does with every settled delivery)
        assert publish(conn, snd, "0", "m2")[0] == Delivery.ACCEPTED, "no outcome for the second message"
    finally:
        conn.close()
    wait_for(lambda: len(handed(report)) >= 2, 10, "both messages handed")
    (t1, k1), (t2, k2) = handed(report)[:2]
    assert (k1, k2) == ("m1", "m2")
    assert t1 != t2, f"two messages under one delivery tag {t1}: a subscriber deduplicating by tag drops m2"


@pytest.mark.parametrize("where", ["one router", "line3"])
def test_tags_that_go_down_are_handed_in_the_order_sent(where: str, make_router: Any, mesh_of: Any,
                                                        subscriber: Any) -> None:
    """Each message is accepted before the next is sent under a lower (or not counter-like) tag: all
    are handed, in the order sent (before: "3" after a handed "5" ended for the subscription)."""
    pub_url, sub_url = urls(where, make_router, mesh_of)
    report = subscriber(sub_url)
    sent = [("5", "m5"), ("3", "m3"), ("1", "m1"), ("z", "mz"), ("10", "m10"), ("2", "m2")]
    conn = blocking(pub_url, "downward")
    try:
        snd = conn.create_sender("t", name="p")
        for tag, body in sent:
            # (ACCEPTED: the subscriber accepted it, so it was handed before the next one is sent)
            assert publish(conn, snd, tag, body)[0] == Delivery.ACCEPTED, f"no outcome for {body}"
    finally:
        conn.close()
    wait_for(lambda: len(handed(report)) >= len(sent), 10, "every message handed")
    assert [k for _, k in handed(report)] == [b for _, b in sent]


@pytest.mark.parametrize("where", ["one router", "line3"])
def test_a_resend_of_a_final_message_gets_its_outcome(where: str, make_router: Any, mesh_of: Any,
                                                      subscriber: Any) -> None:
    pub_url, sub_url = urls(where, make_router, mesh_of)
    report = subscriber(sub_url)
    conn = blocking(pub_url, "resender")
    try:
        snd = conn.create_sender("t", name="p")  # receiver-settle-mode first: the router settles
        assert publish(conn, snd, "0", "m1")[0] == Delivery.ACCEPTED
    finally:
        conn.close()
    wait_for(lambda: handed(report), 10, "m1 handed")
    # the publisher did not see that outcome (say the connection dropped first): it resends
    conn = blocking(pub_url, "resender")
    try:
        snd = conn.create_sender("t", name="p")
        assert publish(conn, snd, "0", "m1")[0] == Delivery.ACCEPTED, "no outcome for the resend"
    finally:
        conn.close()
    # (the router hands a message before it can decide it: a second delivery would be in by now)
    assert [k for _, k in handed(report)] == ["m1"], f"m1 handed again: {handed(report)}"


def test_an_empty_transfer_is_refused_never_handed(make_router: Any, subscriber: Any) -> None:
    r = make_router("A")
    report = subscriber(r.url)
    conn = blocking(r.url, "empty")
    try:
        snd = conn.create_sender("t", name="p")
        state, cond = publish(conn, snd, "0", raw=b"")
        assert state == Delivery.REJECTED and cond is not None and cond.name == "amqp:decode-error", (state, cond)
        wait_for(lambda: snd.link.remote_condition is not None, 10, "the link closed")
        assert getattr(snd.link.remote_condition, "name", None) == "amqp:decode-error"
        snd2 = conn.create_sender("t", name="p2")  # the connection goes on
        assert publish(conn, snd2, "1", "after")[0] == Delivery.ACCEPTED
    finally:
        conn.close()
    wait_for(lambda: handed(report), 10, "the next message handed")
    assert [k for _, k in handed(report)] == ["after"]
    log = (r.log_dir / "A.router.log").read_text()
    assert "link.empty_transfer" in log


@pytest.mark.parametrize("where", ["one router", "line3"])
def test_qpid_jms_unsubscribe_ends_its_durable_subscription(where: str, jms: Family, make_router: Any, mesh_of: Any,
                                                            procs: Any, tmp_path: Path) -> None:
    """Subscribed at one end (C of line3), unsubscribed at the other (A): the lookup finds the
    subscription through the replicated table, and its end reaches every router."""
    here, there = urls(where, make_router, mesh_of)
    report = tmp_path / "jms.jsonl"
    options = {"topic": "t", "container": "jms-client", "link": "orders", "report": report}
    sub = procs.add(Proc(jms.command("subscriber", url=there, **options), tmp_path / "jms.out"))
    wait_for(lambda: any(e["ev"] == "attached" for e in read_report(report)), 30, "the durable subscriber")
    sub.stop(10)  # its connection closes: the subscription is suspended (expiry-policy never)
    out = Proc(jms.command("subscriber", unsubscribe=1, url=here, **options), tmp_path / "unsubscribe.out")
    assert out.wait(60) == 0, out.tail()
    assert [e["ev"] for e in read_report(report)][-1] == "unsubscribed", read_report(report)[-1]
    conn = blocking(there, "after")
    try:
        snd = conn.create_sender("t", name="p")
        # no subscription in force any more: ACCEPTED at once (docs/promises.md, promise 2)
        assert publish(conn, snd, "0", "m", wait=10)[0] == Delivery.ACCEPTED, "held for a subscription JMS ended"
    finally:
        conn.close()


def test_qpid_jms_unsubscribe_of_no_subscription_fails_and_creates_nothing(jms: Family, make_router: Any,
                                                                            procs: Any, tmp_path: Path) -> None:
    """JMS: unsubscribing a name with no durable subscription throws InvalidDestinationException.
    The router answers the lookup with a null source and amqp:not-found (before: a source without
    an address, which Qpid JMS took for a subscription found, and reported success)."""
    r = make_router("A")
    report = tmp_path / "jms.jsonl"
    out = Proc(jms.command("subscriber", unsubscribe=1, url=r.url, topic="t", container="jms-client",
                           link="nothing", report=report), tmp_path / "unsubscribe.out")
    assert out.wait(60) == 0, out.tail()
    last = read_report(report)[-1]
    assert last["ev"] == "error" and "InvalidDestinationException" in last["error"], last
    assert "no subscription named 'nothing'" in last["error"], last
    conn = blocking(r.url, "after")
    try:
        snd = conn.create_sender("t", name="p")
        assert publish(conn, snd, "0", "m", wait=5)[0] == Delivery.ACCEPTED, "a subscription was made"
    finally:
        conn.close()


class Durable(ReceiverOption):
    def apply(self, link: Link) -> None:
        link.source.durability = Terminus.DELIVERIES
        link.source.expiry_policy = Terminus.EXPIRE_NEVER


class NoSource(ReceiverOption):
    """An attach with a null source: a lookup of the subscription by link name (as Qpid JMS does)."""

    def apply(self, link: Link) -> None:
        link.source.type = Terminus.UNSPECIFIED


def test_a_lookup_finds_only_the_subscription_of_the_identity_that_made_it(make_router: Any, tmp_path: Path) -> None:
    """docs/security.md: a durable subscription belongs to the identity that created it. A lookup
    by another user under the same container id and link name is refused (amqp:unauthorized-access)
    and ends nothing; its owner's lookup gets the source, and closing that link ends it."""
    users = tmp_path / "users.json"
    for user, password in (("alice", "wonderland"), ("bob", "builder")):
        assert subprocess.run([sys.executable, "-m", "oncemesh", "user", "add", user, "--users-file", str(users),
                               "--password-stdin", "--iterations", "4096"], input=password + "\n", text=True,
                              capture_output=True, timeout=60).returncode == 0
    pki = tmp_path / "pki"
    make_ca(pki)
    cert, key = issue(pki, "server", ["127.0.0.1"])
    r = make_router("S", settings={"users_file": str(users), "tls_cert": str(cert), "tls_key": str(key)})
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki / "ca.pem"))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER)

    def login(user: str, password: str) -> BlockingConnection:
        c = Container()
        c.container_id = "shared-id"
        return BlockingConnection(r.url, timeout=10, container=c, ssl_domain=domain, user=user, password=password,
                                  allowed_mechs="PLAIN")

    conn = login("alice", "wonderland")
    conn.create_receiver("t", name="s1", options=Durable())
    conn.close()  # suspended; it never expires
    conn = login("bob", "builder")
    try:
        with pytest.raises(LinkDetached) as refused:
            conn.create_receiver(None, name="s1", options=NoSource())
        assert refused.value.condition == "amqp:unauthorized-access", refused.value
    finally:
        conn.close()
    conn = login("alice", "wonderland")
    try:
        snd = conn.create_sender("t", name="p")
        assert publish(conn, snd, "0", "held", wait=2) == (None, None), "bob's lookup ended her subscription"
        rcv = conn.create_receiver(None, name="s1", options=NoSource())
        assert rcv.link.remote_source.address == "t"
        assert rcv.link.remote_source.expiry_policy == Terminus.EXPIRE_NEVER
        rcv.close()  # unsubscribe
        assert publish(conn, snd, "1", "after", wait=10)[0] == Delivery.ACCEPTED, "the subscription lived on"
    finally:
        conn.close()


@pytest.mark.parametrize("where", ["one router", "line3"])
def test_qpid_jms_publishes_under_reused_tags(where: str, jms: Family, make_router: Any, mesh_of: Any, procs: Any,
                                              subscriber: Any, tmp_path: Path) -> None:
    """Qpid JMS takes every settled tag back into its pool: 300 messages with 20 in flight travel
    under a few dozen tags. Each is handed exactly once, under an id no other message has (the
    python subscriber reports tags), and ACCEPTED (before: across line3 the publisher stalled after
    its first window; on one router later messages went under earlier ones' ids)."""
    pub_url, sub_url = urls(where, make_router, mesh_of)
    report = subscriber(sub_url)
    pub_report = tmp_path / "pub.jsonl"
    pub = procs.add(Proc(jms.command("publisher", url=pub_url, topic="t", container="jms-pub", link="pub", count=300,
                                     window=20, report=pub_report), tmp_path / "pub.out"))
    assert pub.wait(120) == 0, pub.tail()
    wait_for(lambda: len(handed(report)) >= 300, 30, "every message handed")
    verdict = client_verdict("pub", read_report(pub_report), {"python": read_report(report)}, None, by_tag=True)
    assert verdict.problems() == [] and len(verdict.accepted) == 300, verdict.summary()
    assert verdict.subs["python"].raw == 300  # no raw duplicate either: nothing failed
