"""`oncemesh chaos --mqtt`: MQTT 5 QoS 2 clients (harness/mqttworker.py) among the AMQP publishers
and subscribers of a chaos run, all on one topic, through router kills and their own SIGKILLs: an MQTT
subscriber judged by the router view and the workers' reports, an MQTT publisher's messages at the
AMQP subscribers by both views of the reconciliation and by payload (`mqtt_at_amqp`).

Seed 162 on line3 (12 s, kills and client kills, a fault every 1.5 s on average): router C (the MQTT
publisher's home) is killed at 2.1 s, the MQTT publisher at 3.1 s (while it is away from its home),
the MQTT subscriber at 7.2 s, router A (the MQTT subscriber's home) at 8.1 s. Before a restarted
worker went back to where its session was last taken (harness/mqttworker.py, `where.json`), the
publisher restarted at 4.6 s connected to C, just restarted itself with no peer yet and neither the
session's keeper (A) nor its neighbour: CONNACK session present 0, and its in-flight message was
delivered twice (the test caught it from the reports; the router view saw two messages, each ok).
When the MQTT publisher's messages first went to the AMQP subscribers too, AMQP subscriber sub-2,
SIGKILLed at 3.4 s, had been handed pub-0:76..80 0.3 to 0.4 s before (its settlement log says so) but
had not noted their payloads yet (it held them while `get_many` waited for more, up to 1 s): the
judge, reading hand-overs from the notes, called them lost. Hand-overs now come from the settlement
log, only the names from the notes (anyone's), and a consumer with `--bodies` notes every 50 ms.
"""

from __future__ import annotations

import json
from pathlib import Path

from oncemesh.common.settlement_log import read_events
from oncemesh.harness.chaos import (
    ChaosConfig,
    ChaosResult,
    _Client,
    _Run,
    mqtt_at_amqp,
    name_mqtt_gids,
    payload_names,
    run_chaos,
    write_mqtt_publisher_logs,
)
from oncemesh.harness.faults import FaultKind, Limits
from oncemesh.harness.mqttworker import ReportReader
from oncemesh.harness.progress import ClientLogs, Subscription
from oncemesh.harness.worker import BodyReader
from tests.chaos.test_chaos import processes_of


def test_mqtt_clients_keep_exactly_once_through_router_and_client_kills(tmp_path: Path) -> None:
    state = tmp_path / "run"
    said: list[str] = []
    result = run_chaos("line3", duration=12, seed=162, faults=[FaultKind.KILL, FaultKind.CLIENT_KILL], state_dir=state,
                       limits=Limits(mean_gap=1.5), mqtt=1, say=said.append)
    print("\n".join(said))
    assert result.exit_code == 0, result.verdict()
    assert result.injected == {"kill": 2, "client-kill": 3}, result.injected
    total = 30 * 12  # rate x duration, per publisher
    pub, sub = result.mqtt["pub-0"], result.mqtt["sub-0"]
    assert pub["published"] == pub["completed"] == total and pub["refused"] == pub["session_lost"] == 0, pub
    assert pub["connections"] >= 2  # (it failed over from C, and was restarted)
    # every subscriber took chaos, on which pub-0 (MQTT) and pub-1 (AMQP) published: each message once
    assert sub["distinct"] == sub["delivered"] == 2 * total and sub["duplicates"] == sub["lost"] == 0, sub
    assert sub["missing"] == sub["unexpected"] == sub["session_lost"] == sub["fifo_reversals"] == 0, sub
    assert sub["connections"] >= 2, sub
    assert result.published == result.accepted == total  # the AMQP publisher's, from its settlement log
    assert result.handed == {"sub-0": 2 * total, "sub-1": 2 * total, "sub-2": 2 * total}
    # the MQTT publisher's messages at the AMQP subscribers, by payload: each once, in order
    clean = {"distinct": total, "duplicates": 0, "lost": 0, "unexpected": 0, "fifo_reversals": 0}
    assert result.mqtt_at_amqp == {"sub-1": clean, "sub-2": clean} and result.mqtt_reversals == 0
    s = result.summary
    assert s is not None and s.failures == 0 and s.malformed_lines == 0  # (the reports are no settlement logs)
    # the client view judged the AMQP subscriptions, the MQTT publisher's messages included (its log, written
    # from its report and the gids the AMQP subscribers' payloads name); the MQTT session only the router view
    assert s.subscriptions == 2 and s.unobserved_subscriptions == 1
    assert s.messages == 2 * total and s.ok == 2 * 2 * total and s.false_accept == 0 and s.fifo_reversals == 0
    assert [result.subscriptions[n].get("ok") for n in ("sub-1", "sub-2")] == [2 * total] * 2, result.subscriptions
    assert s.router_view.failures == 0 and s.agreement.disagreements == 0
    rv = dict(s.router_view.counts)
    assert rv["ok"] == s.router_view.pairs == 6 * total, s.router_view  # 2 publishers x 3 subscriptions
    saved = json.loads((state / "chaos-result.json").read_text())
    assert saved["mqtt"] == result.mqtt and json.loads((state / "chaos.json").read_text())["mqtt"] == 1
    assert (state / "clients" / "sub-0" / "mqtt-state.json").exists()
    assert processes_of(state) == []


def _reported(path: Path, *events: dict[str, object]) -> ReportReader:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    r = ReportReader(path)
    r.poll()
    return r


def test_the_mqtt_verdict_fails_a_duplicate_a_loss_a_refusal_and_a_lost_session(tmp_path: Path) -> None:
    """`_Run.mqtt_violations` over made-up reports (no processes): one AMQP publisher (finished: told
    ACCEPTED for its 2 messages), one MQTT publisher (2 messages), one MQTT subscriber."""
    def violations(pub: list[dict[str, object]], sub: list[dict[str, object]]) -> list[str]:
        run = _Run.__new__(_Run)
        run.cfg = ChaosConfig(Path("line3.toml"), duration=1.0, publishers=2, subscribers=1, rate=2.0, mqtt=1)
        run.result = ChaosResult(1, tmp_path, [])
        run.clients = [
            _Client("sub-0", "consume", "A", [], Path("sub-0.out"), protocol="mqtt",
                    report=_reported(tmp_path / "sub-0.report", *sub)),
            _Client("pub-0", "publish", "C", [], Path("pub-0.out"), protocol="mqtt",
                    report=_reported(tmp_path / "pub-0.report", *pub)),
            _Client("pub-1", "publish", "B", [], Path("pub-1.out"), finished=True)]
        return run.mqtt_violations()

    pub = [{"ev": "published", "n": n} for n in (0, 1)] + [{"ev": "completed", "n": n} for n in (0, 1)]
    sub = [{"ev": "delivered", "p": p, "n": n, "xid": x} for x, (p, n) in
           enumerate([("pub-0", 0), ("pub-1", 0), ("pub-0", 1), ("pub-1", 1)])]
    assert violations(pub, sub) == []
    assert violations(pub, [*sub, {**sub[0], "xid": 0}]) == []  # (the same delivery reported again)
    v = violations(pub, [*sub, {**sub[0], "xid": 9}])
    assert len(v) == 1 and "sub-0: 1 message(s) delivered more than once, e.g. ['pub-0:0']" in v[0]
    v = violations(pub, sub[:3])
    assert len(v) == 1 and "never delivered that their publisher was told were taken, e.g. ['pub-1:1']" in v[0]
    v = violations(pub, [*sub, {"ev": "delivered", "p": "pub-7", "n": 0, "xid": 5}])
    assert len(v) == 1 and "no publisher sent" in v[0]
    v = violations([*pub, {"ev": "refused", "n": 1, "reason": 0x87}, {"ev": "session_lost"}], sub)
    assert len(v) == 2 and "resume(s) without the session" in v[0] and "refused" in v[1]
    # not yet told: not missing (a liveness matter, for quiescence), not lost
    assert violations(pub[:3], [sub[0], sub[1], sub[3]]) == []  # (pub-0:1 without its PUBCOMP yet)


def _noted(path: Path, *handed: tuple[str, str | None, int | None]) -> BodyReader:
    """An AMQP subscriber's `--bodies` notes: (gid, publisher, number) per message, in hand-over order."""
    path.write_text("".join(json.dumps({"g": g, "p": p, "n": n}) + "\n" for g, p, n in handed))
    b = BodyReader(path)
    b.poll()
    return b


def _mqtt_publisher(path: Path, sent: range, told: range) -> ReportReader:
    return _reported(path, *[{"ev": "published", "n": n, "ts": 100.0 + n} for n in sent],
                     *[{"ev": "completed", "n": n, "ts": 100.5 + n} for n in told])


# pub-0 (MQTT) sent 0..3, each PUBCOMP'd; pub-1 (AMQP) has its gids P1:0, P1:1 in its settlement log
HANDED = [("M:0", "pub-0", 0), ("P1:0", "pub-1", 0), ("M:1", "pub-0", 1), ("M:2", "pub-0", 2), ("P1:1", "pub-1", 1),
          ("M:3", "pub-0", 3)]


def test_mqtt_published_messages_at_an_amqp_subscriber_are_judged_by_payload(tmp_path: Path) -> None:
    """`mqtt_at_amqp` over made-up notes of one AMQP subscriber: a loss, a duplicate (one number under
    two gids), an out-of-order pair and numbers nobody sent are each flagged; the AMQP publisher's
    messages are left to the reconciliation (whatever their order here)."""
    pub = _mqtt_publisher(tmp_path / "pub-0.report", range(4), range(4))

    def judge(*handed: tuple[str, str | None, int | None]) -> tuple[list[str], dict[str, int], int]:
        names = payload_names([_noted(tmp_path / "sub-1.bodies", *handed)])
        v, counts, reversals = mqtt_at_amqp({"sub-1": [g for g, _, _ in handed]}, names, {"pub-0": pub},
                                            {"P1:0", "P1:1"}, count=4)
        return v, counts["sub-1"], reversals

    clean = {"distinct": 4, "duplicates": 0, "lost": 0, "unexpected": 0, "fifo_reversals": 0}
    assert judge(*HANDED) == ([], clean, 0)
    amqp_swapped = [HANDED[0], HANDED[4], *HANDED[2:4], HANDED[1], HANDED[5]]
    assert judge(*amqp_swapped) == ([], clean, 0)  # (pub-1's 1 before its 0: the reconciliation's to judge)
    v, c, _ = judge(*[h for h in HANDED if h[0] != "M:2"])
    assert c["lost"] == 1 and v == ["AMQP subscriber sub-1: 1 MQTT-published message(s) never handed that their "
                                    "publisher was told were taken (PUBCOMP), e.g. ['pub-0:2']"]
    v, c, _ = judge(*HANDED, ("M:9", "pub-0", 1))  # the same message under a second gid: the router's view of two
    assert c["duplicates"] == 1 and len(v) == 1 and "handed more than once, e.g. ['pub-0:1']" in v[0]
    v, c, _ = judge(*HANDED, ("M:1", "pub-0", 1))  # the same gid handed again
    assert c["duplicates"] == 1 and len(v) == 1 and "handed more than once" in v[0]
    v, c, reversals = judge(HANDED[0], HANDED[3], HANDED[2], *HANDED[4:])  # 2 before 1
    assert reversals == c["fifo_reversals"] == 1 and c["lost"] == 0
    assert v == ["AMQP subscriber sub-1: 1 message(s) of MQTT publisher pub-0 handed after a later one of pub-0 "
                 "(FIFO), e.g. pub-0:[1]"]
    v, c, _ = judge(*HANDED, ("M:7", "pub-0", 7), ("M:4", "pub-0", 3 + 1), ("X", None, None), ("P9:0", "pub-9", 0))
    assert c["unexpected"] == 4 and len(v) == 1 and "4 message(s) handed that no publisher sent" in v[0]
    # what was handed is the settlement log's; a note names a gid whoever wrote it; a gid nothing names
    names = payload_names([_noted(tmp_path / "a.bodies", *HANDED[:3]), _noted(tmp_path / "b.bodies", *HANDED[3:])])
    handed = {"sub-1": [g for g, _, _ in HANDED], "sub-2": [g for g, _, _ in HANDED] + ["M:5"]}
    v, counts, _ = mqtt_at_amqp(handed, names, {"pub-0": pub}, {"P1:0", "P1:1"}, 4)
    assert counts["sub-1"] == clean and counts["sub-2"] == {**clean, "unexpected": 1}
    assert v == ["AMQP subscriber sub-2: 1 message(s) handed that no publisher sent, e.g. ['gid M:5']"]
    # not yet told (no PUBCOMP for 3): not lost, a liveness matter
    told3 = _mqtt_publisher(tmp_path / "pub-0b.report", range(4), range(3))
    v, counts, _ = mqtt_at_amqp({"sub-1": [g for g, _, _ in HANDED[:5]]}, names, {"pub-0": told3}, {"P1:0", "P1:1"}, 4)
    assert v == [] and counts["sub-1"]["lost"] == 0


def _mixed_run(tmp_path: Path, sub: list[dict[str, object]], amqp_sub: list[tuple[str, str | None, int | None]]) -> _Run:
    """A run of made-up reports: pub-0 (MQTT, 2 messages, both PUBCOMP'd), pub-1 (AMQP, finished, gids P1:0
    and P1:1 in its settlement log), sub-0 (MQTT), sub-1 (AMQP, its `--bodies` notes)."""
    run = _Run.__new__(_Run)
    run.cfg = ChaosConfig(Path("line3.toml"), duration=1.0, publishers=2, subscribers=2, rate=2.0, mqtt=1)
    run.result = ChaosResult(1, tmp_path, [])
    run.watch = ClientLogs(tmp_path / "clientlogs")
    run.watch.published = {"P1:0": 1.0, "P1:1": 1.5}
    run.watch.subs["s1"] = Subscription("s1", link="sub-1", topic="chaos", started=0.5,
                                        handed={g: 2.0 + i for i, (g, _, _) in enumerate(amqp_sub)})
    amqp = _Client("sub-1", "consume", "B", [], Path("sub-1.out"), link="sub-1")
    amqp.bodies = _noted(tmp_path / "sub-1.bodies", *amqp_sub)
    run.clients = [
        _Client("sub-0", "consume", "A", [], Path("sub-0.out"), protocol="mqtt",
                report=_reported(tmp_path / "sub-0.report", *sub)), amqp,
        _Client("pub-0", "publish", "C", [], Path("pub-0.out"), protocol="mqtt",
                report=_mqtt_publisher(tmp_path / "pub-0.report", range(2), range(2))),
        _Client("pub-1", "publish", "B", [], Path("pub-1.out"), finished=True)]
    return run


def test_the_verdict_fails_on_order_at_an_mqtt_subscriber_and_on_mqtt_messages_lost_at_an_amqp_one(
        tmp_path: Path) -> None:
    """FIFO at an MQTT subscriber by its first deliveries' numbers (xid: a recovered line keeps its place),
    and `mqtt_at_amqp` at the AMQP one, both in the run's verdict (exit 1, an order failure)."""
    ok_amqp = [("M:0", "pub-0", 0), ("P1:0", "pub-1", 0), ("M:1", "pub-0", 1), ("P1:1", "pub-1", 1)]
    line = [{"ev": "delivered", "p": p, "n": n, "xid": x} for x, (p, n) in
            enumerate([("pub-0", 0), ("pub-1", 0), ("pub-0", 1), ("pub-1", 1)])]
    run = _mixed_run(tmp_path, [line[1], line[2], line[3], {**line[0], "recovered": True}], ok_amqp)
    assert run.mqtt_violations() == [] and run.result.mqtt_reversals == 0  # (0 was delivered first: xid 0)
    assert run.result.mqtt_at_amqp["sub-1"] == {"distinct": 2, "duplicates": 0, "lost": 0, "unexpected": 0,
                                                "fifo_reversals": 0}
    # pub-1's 1 delivered before its 0 at the MQTT subscriber (AMQP-published: the MQTT view judges it)
    swapped = [line[0], {**line[3], "xid": 1}, line[2], {**line[1], "xid": 3}]
    run = _mixed_run(tmp_path, swapped, ok_amqp)
    v = run.mqtt_violations()
    assert v == ["MQTT subscriber sub-0: 1 message(s) of pub-1 delivered after a later one of pub-1 (FIFO), "
                 "e.g. pub-1:[0]"]
    assert run.result.mqtt["sub-0"]["fifo_reversals"] == run.result.mqtt_reversals == 1
    run.result.client_violations = v
    run.result.quiescent = True
    assert run.result.order_failures == 1 and run.result.exit_code == 1
    # pub-0's 1 never handed to the AMQP subscriber, though PUBCOMP'd
    run = _mixed_run(tmp_path, line, ok_amqp[:2] + ok_amqp[3:])
    v = run.mqtt_violations()
    assert len(v) == 1 and v[0].startswith("AMQP subscriber sub-1: 1 MQTT-published message(s) never handed")
    assert run.result.mqtt_at_amqp["sub-1"]["lost"] == 1 and run.result.mqtt_reversals == 0
    # no order promised with --shared; without a reconciliation the workers' reversals still count
    assert ChaosResult(1, tmp_path, [], shared=True, mqtt_reversals=2).order_failures == 0
    assert ChaosResult(1, tmp_path, [], mqtt_reversals=2).order_failures == 2


def test_an_mqtt_publishers_settlement_log_names_its_messages_by_the_gids_the_amqp_subscribers_saw(
        tmp_path: Path) -> None:
    """`name_mqtt_gids` (any subscriber's note names a gid) and `write_mqtt_publisher_logs`: what the
    reconciliation's client view reads of an MQTT publisher: `published` at its report's time, ACCEPTED at
    PUBCOMP's, REJECTED for a refused PUBLISH, nothing while in doubt, nothing for a number never sent."""
    rep = _reported(tmp_path / "pub-0.report", *[{"ev": "published", "n": n, "ts": 100.0 + n} for n in range(4)],
                    {"ev": "completed", "n": 0, "ts": 100.5}, {"ev": "completed", "n": 1, "ts": 101.5},
                    {"ev": "completed", "n": 1, "ts": 109.0}, {"ev": "refused", "n": 2, "reason": 0x87})
    sub1 = _noted(tmp_path / "sub-1.bodies", ("M:0", "pub-0", 0), ("P1:0", "pub-1", 0), ("M:3", "pub-0", 3))
    sub2 = _noted(tmp_path / "sub-2.bodies", ("M:0", "pub-0", 0), ("M:1", "pub-0", 1), ("M:2", "pub-0", 2),
                  ("M:8", "pub-0", 8))
    names = name_mqtt_gids(payload_names([sub1, sub2]), {"pub-0"}, {"P1:0"})
    assert names == {"pub-0": {"M:0": 0, "M:3": 3, "M:1": 1, "M:2": 2, "M:8": 8}}
    [path] = write_mqtt_publisher_logs(tmp_path / "mqttlogs", {"pub-0": rep}, names, "chaos", 64)
    assert path.name == "pub-0.publisher.jsonl"
    got = [(e["ev"], e["gid"], e["ts"], e.get("outcome")) for e in read_events(path)]
    assert got == [("published", "M:0", 100.0, None), ("outcome", "M:0", 100.5, "ACCEPTED"),
                   ("published", "M:1", 101.0, None), ("outcome", "M:1", 101.5, "ACCEPTED"),
                   ("published", "M:2", 102.0, None), ("outcome", "M:2", 102.0, "REJECTED"),
                   ("published", "M:3", 103.0, None)]
    first = next(iter(read_events(path)))
    assert first["src"] == "publisher" and first["pub"] == "mqtt:pub-0" and first["topic"] == "chaos"
    assert "seq" not in first  # (their order is `mqtt_at_amqp`'s: not counted twice)
