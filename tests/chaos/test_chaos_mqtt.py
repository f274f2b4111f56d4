"""`oncemesh chaos --mqtt`: MQTT 5 QoS 2 clients (harness/mqttworker.py) among the AMQP publishers
and subscribers of a chaos run, through router kills and their own SIGKILLs, judged by the router
view of the reconciliation and by their reports.

Seed 162 on line3 (12 s, kills and client kills, a fault every 1.5 s on average): router C (the MQTT
publisher's home) is killed at 2.1 s, the MQTT publisher at 3.1 s (while it is away from its home),
the MQTT subscriber at 7.2 s, router A (the MQTT subscriber's home) at 8.1 s. Before a restarted
worker went back to where its session was last taken (harness/mqttworker.py, `where.json`), the
publisher restarted at 4.6 s connected to C, just restarted itself with no peer yet and neither the
session's keeper (A) nor its neighbour: CONNACK session present 0, and its in-flight message was
delivered twice (the test caught it from the reports; the router view saw two messages, each ok).
"""

from __future__ import annotations

import json
from pathlib import Path

from oncemesh.harness.chaos import ChaosConfig, ChaosResult, _Client, _Run, run_chaos
from oncemesh.harness.faults import FaultKind, Limits
from oncemesh.harness.mqttworker import ReportReader
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
    # sub-0 took chaos (pub-1, AMQP) and chaos-mqtt (pub-0, MQTT): each message once
    assert sub["distinct"] == sub["delivered"] == 2 * total and sub["duplicates"] == sub["lost"] == 0, sub
    assert sub["missing"] == sub["unexpected"] == sub["session_lost"] == 0 and sub["connections"] >= 2, sub
    assert result.published == result.accepted == total  # the AMQP publisher's, from its settlement log
    assert result.handed == {"sub-0": 2 * total, "sub-1": total, "sub-2": total}
    s = result.summary
    assert s is not None and s.failures == 0 and s.malformed_lines == 0  # (the reports are no settlement logs)
    # the client view judged the AMQP subscriptions; the MQTT session's two subscriptions only the router view
    assert s.subscriptions == 2 and s.unobserved_subscriptions == 2
    assert s.router_view.failures == 0
    rv = dict(s.router_view.counts)
    assert rv["ok"] == s.router_view.pairs == 4 * total, s.router_view  # pub-1 x 3 subscriptions, pub-0 x 1
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
