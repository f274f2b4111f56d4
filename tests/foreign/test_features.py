"""What each foreign client can do with oncemesh, tried for real (docs/clients.md says it for users):
large messages, receiver-settle-mode second, drain, and the resume of a durable subscription after
the subscriber process is SIGKILLed; all of it over TLS with a SASL PLAIN login from the router's
users file (docs/security.md). Failover lists and the loss of a router: test_fanout.py.

One router for the module (S, amqps://, users file with alice); each test its own topic.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from oncemesh.common.pki import issue, make_ca
from oncemesh.common.settlement_log import log_files, read_events
from oncemesh.harness.procs import Proc, RouterProcess
from tests.foreign.clients import Family, read_report, wait_progress
from tests.foreign.verdict import client_verdict, gid_for
from tests.helpers import log_has

pytestmark = pytest.mark.foreign

FAMILIES = ["cpp", "rhea", "jms", "proton_py"]
MiB = 1024 * 1024


@dataclass(frozen=True)
class Secured:
    router: RouterProcess
    ca: Path
    truststore: Path | None  # the CA in a PKCS12 trust store, for Java (keytool)

    def options(self, fam: Family) -> dict[str, Any]:
        """How this family reaches the router: TLS trust and a PLAIN login as alice."""
        trust = {"truststore": self.truststore} if fam.truststore else {"ca": self.ca}
        return {"url": self.router.url, "user": "alice", "password": "wonderland", **trust}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    d = tmp_path_factory.mktemp("secured")
    make_ca(d / "pki")
    cert, key = issue(d / "pki", "router", ["127.0.0.1"])
    users = d / "users.json"
    subprocess.run([sys.executable, "-m", "oncemesh", "user", "add", "alice", "--users-file", str(users),
                    "--password-stdin", "--iterations", "4096"], input="wonderland\n", text=True, check=True,
                   capture_output=True, timeout=60)
    truststore = None
    if shutil.which("keytool"):
        truststore = d / "truststore.p12"
        subprocess.run(["keytool", "-importcert", "-noprompt", "-alias", "oncemesh-ca", "-file", str(d / "pki" / "ca.pem"),
                        "-keystore", str(truststore), "-storetype", "PKCS12", "-storepass", "changeit"],
                       check=True, capture_output=True, timeout=60)
    # (a shared subscription's member that is killed: what it held goes to the others after 3 s)
    r = RouterProcess("S", d / "router", settings={"users_file": users, "tls_cert": cert, "tls_key": key,
                                                   "shared_member_grace": 3.0}).start()
    try:
        yield Secured(r, d / "pki" / "ca.pem", truststore)
    finally:
        r.stop()


class Clients:
    """The processes of one test, each with its report."""

    def __init__(self, fam: Family, secured: Secured, procs: Any, tmp: Path, topic: str) -> None:
        self.fam, self.secured, self.procs, self.tmp, self.topic = fam, secured, procs, tmp, topic

    def start(self, role: str, name: str, **options: Any) -> tuple[Proc, Path]:
        report = self.tmp / f"{name}.jsonl"
        cmd = self.fam.command(role, topic=self.topic, container=f"{self.topic}-{name}", link=name,
                               report=report, **self.secured.options(self.fam), **options)
        return self.procs.add(Proc(cmd, self.tmp / f"{name}.out")), report

    def subscriber(self, name: str, **options: Any) -> tuple[Proc, Path]:
        proc, report = self.start("subscriber", name, **options)
        wait_progress(lambda: int(any(e["ev"] == "attached" for e in read_report(report))), 1,
                      f"{name} attached")
        return proc, report

    def publish(self, count: int, **options: Any) -> Path:
        proc, report = self.start("publisher", "pub", count=count, **options)
        wait_progress(lambda: sum(e["ev"] in ("outcome", "done") for e in read_report(report)), count + 1,
                      "the publisher's outcomes")
        assert proc.wait(30) == 0, proc.tail()
        return report

    def dump(self) -> str:
        """The clients' reports and the router's log lines of this test's connections (on failure)."""
        parts = [f"--- report {p.name} ---\n{_tail(p, 40)}" for p in sorted(self.tmp.glob("*.jsonl"))]
        log = self.secured.router.log_dir / f"{self.secured.router.id}.router.log"
        parts.append(f"--- router {self.secured.router.id}, lines naming {self.topic} ---\n"
                     f"{_tail(log, 60, lambda line: self.topic in line)}")
        parts.append(f"--- router {self.secured.router.id}, its last lines ---\n{_tail(log, 30)}")
        events = [e for f in log_files(self.secured.router.log_dir) for e in read_events(f)
                  if e.get("topic") == self.topic or self.topic in str(e.get("container", ""))]
        parts.append(f"--- router {self.secured.router.id}, its settlement log on {self.topic} ---\n" + "\n".join(
            " ".join(f"{k}={e[k]}" for k in ("ts", "ev", "sub", "gid", "container", "link", "outcome", "info") if e.get(k))
            for e in events[-60:]))
        return "\n".join(parts)

    def verdict(self, pub: Path, subs: dict[str, Path]) -> Any:
        v = client_verdict("pub", read_report(pub), {n: read_report(p) for n, p in subs.items()},
                           gid_for(f"{self.topic}-pub", "pub") if self.fam.tags else None, by_tag=self.fam.tags)
        assert v.problems() == [], v.summary()
        return v


@pytest.fixture(params=FAMILIES)
def clients(request: pytest.FixtureRequest, secured: Secured, procs: Any, tmp_path: Path) -> Iterator[Clients]:
    fam: Family = request.getfixturevalue(request.param)
    if fam.truststore and secured.truststore is None:
        pytest.fail("keytool (the JDK's) is needed to give Qpid JMS the CA")
    c = Clients(fam, secured, procs, tmp_path, f"feat.{request.node.originalname}.{request.param}")
    yield c
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:  # the module's router is not the test's: what it said of this test
        print(c.dump())


def _tail(path: Path, n: int, keep: Any = None) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(none)"
    return "\n".join([line for line in lines if keep is None or keep(line)][-n:])


def test_large_messages_over_tls_with_a_plain_login(clients: Clients) -> None:
    """1.5 MiB messages: more than the router's max frame (1 MiB), so each spans frames."""
    _, sub = clients.subscriber("sub", expiry=60)
    pub = clients.publish(3, size=3 * MiB // 2)
    v = clients.verdict(pub, {"sub": sub})
    assert len(v.accepted) == 3
    assert [e["size"] for e in read_report(sub) if e["ev"] == "msg"] == [3 * MiB // 2] * 3
    log = clients.secured.router.log_dir / "S.router.log"
    assert log_has(log, "connection.authenticated", "user=alice", "mechanism=PLAIN")


def test_receiver_settle_mode_second(clients: Clients) -> None:
    """The exactly-once handshake on both links: the router sends the outcome (to the publisher) and
    settles deliveries (to the subscriber) only when the other side's settlement allows it."""
    if not clients.fam.second:
        pytest.skip(f"{clients.fam.name} cannot ask for receiver-settle-mode second (docs/clients.md)")
    _, sub = clients.subscriber("sub", expiry=60, second=True)
    pub = clients.publish(50, second=True)
    v = clients.verdict(pub, {"sub": sub})
    assert len(v.accepted) == 50
    for report in (sub, pub):  # the router granted mode second (1) on both links
        assert [e.get("rcv_settle_mode") for e in read_report(report) if e["ev"] == "attached"] == [1]


def test_drain(clients: Clients) -> None:
    """A pull consumer: credit N and drain; the router answers a drain with nothing queued by
    returning the credit (the client sees the drain end), and hands what is queued when asked."""
    _, sub = clients.subscriber("sub", expiry=60, drain=True, credit=3)

    def drained() -> int:
        return sum(e["ev"] == "drained" for e in read_report(sub))

    wait_progress(drained, 1, "a drain answered with nothing queued")
    before = drained()
    pub = clients.publish(5)
    clients.verdict(pub, {"sub": sub})  # all 5 handed, each pulled by a drain of 3
    wait_progress(drained, before + 1, "a drain after the messages")
    events = [e["ev"] for e in read_report(sub) if e["ev"] in ("msg", "drained")]
    assert events.index("msg") > 0 and "drained" in events[events.index("msg"):], events


def test_durable_resume_after_the_subscriber_is_killed(clients: Clients) -> None:
    """The subscriber process is SIGKILLed mid-stream and started again under the same container id
    and link name: the subscription held what came meanwhile, and what was in doubt comes again
    under the same delivery tag (deduplicated)."""
    sub_proc, sub = clients.subscriber("sub", expiry=60)
    pub_proc, pub = clients.start("publisher", "pub", count=100, rate=40)
    wait_progress(lambda: sum(e["ev"] == "msg" for e in read_report(sub)), 15, "messages before the kill")
    sub_proc.kill()
    handed_before = sum(e["ev"] == "msg" for e in read_report(sub))
    # more is published while it is away (up to the publisher's window: outcomes wait for it)
    wait_progress(lambda: sum(e["ev"] == "sent" for e in read_report(pub)), handed_before + 20, "sent while away")
    clients.subscriber("sub", expiry=60)  # (the report is appended to)
    wait_progress(lambda: sum(e["ev"] in ("outcome", "done") for e in read_report(pub)), 101, "the outcomes")
    assert pub_proc.wait(30) == 0, pub_proc.tail()
    v = clients.verdict(pub, {"sub": sub})
    assert len(v.accepted) == 100 and handed_before < 100
    print(f"{clients.fam.name}: {handed_before} handed before the kill; {v.summary()}")


def test_rhea_subscribes_to_a_wildcard_filter_and_reads_each_topic_from_to(secured: Secured, procs: Any,
                                                                           tmp_path: Path, rhea: Family) -> None:
    """A rhea receiver whose source is a filter (docs/clients.md, "Topics and wildcard filters"): it
    gets the messages of every topic the filter matches, each once, each with its topic in `to`
    (set by the router: rhea's publisher leaves it empty), and none of a topic it does not match."""
    base = "feat.wild.rhea"
    sub_dir = tmp_path / "sub"
    sub_dir.mkdir()
    _, sub = Clients(rhea, secured, procs, sub_dir, base + "/+").subscriber("sub", expiry=60)
    for t, n in (("a", 5), ("b", 3), ("c/deeper", 2)):
        d = tmp_path / t.replace("/", "-")
        d.mkdir()
        report = Clients(rhea, secured, procs, d, f"{base}/{t}").publish(n)
        assert [e["outcome"] for e in read_report(report) if e["ev"] == "outcome"] == ["ACCEPTED"] * n, t
    wait_progress(lambda: sum(e["ev"] == "msg" for e in read_report(sub)), 8, "the subscriber's messages")
    msgs = [e for e in read_report(sub) if e["ev"] == "msg"]
    assert sorted(e["to"] for e in msgs) == [f"{base}/a"] * 5 + [f"{base}/b"] * 3
    assert len({e["tag"] for e in msgs}) == 8  # each once


def test_qpid_jms_members_split_a_shared_durable_subscription_with_a_selector(secured: Secured, procs: Any,
                                                                            tmp_path: Path, jms: Family) -> None:
    """Three Qpid JMS processes are members of one shared durable subscription with a selector
    (`createSharedDurableConsumer(topic, "work", "k >= 20")`, no client id: a global name;
    docs/clients.md, "Shared subscriptions"): each message the selector selects is handed to one
    member, none it does not select; one member is SIGKILLed mid-stream, and what it held goes to the
    others after `shared_member_grace` (3 s here). Qpid JMS acknowledges after its listener returns:
    a message the killed member reported but whose acknowledgement died with it may be reported by
    another member too (a client that cannot present what it accepted: docs/promises.md), and only
    such a message."""
    c = Clients(jms, secured, procs, tmp_path, "feat.shared.jms")
    members = {f"m{i}": c.subscriber(f"m{i}", shared="work", selector="k >= 20", no_client_id=True, credit=5)
               for i in range(3)}
    pub_proc, pub = c.start("publisher", "pub", count=120, rate=60)
    wait_progress(lambda: sum(e["ev"] == "msg" for e in read_report(members["m0"][1])), 5, "m0's first messages")
    members["m0"][0].kill()
    wait_progress(lambda: sum(e["ev"] in ("outcome", "done") for e in read_report(pub)), 121, "the outcomes")
    assert pub_proc.wait(30) == 0, pub_proc.tail()
    assert {e["outcome"] for e in read_report(pub) if e["ev"] == "outcome"} == {"ACCEPTED"}
    want = {f"pub:{k}" for k in range(20, 120)}
    wait_progress(lambda: len(want & {e["key"] for n in ("m1", "m2") for e in read_report(members[n][1])
                                       if e["ev"] == "msg"} | {e["key"] for e in read_report(members["m0"][1])
                                                               if e["ev"] == "msg"}), len(want), "every key")
    got = {n: [e["key"] for e in read_report(r) if e["ev"] == "msg"] for n, (_, r) in members.items()}
    every = [k for keys in got.values() for k in keys]
    assert set(every) == want, sorted(set(every) ^ want)[:10]  # what the selector selects, nothing else
    twice = {k for k in every if every.count(k) > 1}
    assert twice <= set(got["m0"]), sorted(twice - set(got["m0"]))  # only what the killed member had
    assert got["m1"] and got["m2"] and len(set(got["m1"]) & set(got["m2"])) == 0
    print(f"Qpid JMS shared: {len(got['m0'])} to m0 (killed), {len(got['m1'])} to m1, {len(got['m2'])} to m2, "
          f"{len(twice)} reported twice")
