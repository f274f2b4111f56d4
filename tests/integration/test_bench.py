"""`oncemesh bench`: the command runs, and its --json has the documented keys with plausible values.

The quick tests use tiny counts (a few seconds in all); the full benchmark, which prints the figures
of docs/performance.md, is marked `bench` and `slow` (excluded by default: `pytest -m bench`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest

from oncemesh.harness.bench import (
    Case,
    Mosquitto,
    RabbitMQ,
    _callgrind_total,
    _ok_text,
    _summarise,
    format_report,
    install_baselines,
    median_of,
    mqtt_violations,
    summarise_profile,
)
from oncemesh.harness.benchclients import FLAG_LAST, HEADER, MAGIC, MIN_SIZE, message_template, percentiles
from oncemesh.harness.mqttload import Tally, run_sub
from oncemesh.harness.procs import Proc, RouterProcess, python_cmd, read_json, wait_for
from oncemesh.router.mqtt.codec import Decoder, encode
from oncemesh.router.mqtt.packets import Connack, Connect, Publish, Pubrec, Pubrel, Suback, Subscribe
from oncemesh.topology.load import example_path

CASE_KEYS = {"published_msg_s", "delivered_msg_s_per_sub", "delivered_msg_s_min_sub", "delivered_msg_s_total",
             "latency_ms", "server_cpu_us_per_msg_hop", "server_cpu_us_per_delivery", "server_cpu_util",
             "server_peak_rss_kb", "pub_cpu_us_per_msg", "sub_cpu_us_per_msg", "ok_runs", "runs"}


def bench(*args: str, timeout: float = 240) -> dict:
    out = subprocess.run([sys.executable, "-m", "oncemesh", "bench", "--json", *args],
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"exit {out.returncode}\nstdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-3000:]}"
    report: dict = json.loads(out.stdout)
    return report


def test_message_template_is_the_requested_size_and_carries_the_header() -> None:
    for size in (MIN_SIZE, 100, 255, 256, 300, 4096):
        buf, off = message_template(size)
        assert len(buf) == size
        HEADER.pack_into(buf, off, MAGIC, 123, 7, 2, 1)
        assert HEADER.unpack_from(bytes(buf), bytes(buf).find(MAGIC)) == (MAGIC, 123, 7, 2, 1)
    with pytest.raises(ValueError):
        message_template(MIN_SIZE - 1)


def test_percentiles_use_nearest_rank_in_milliseconds() -> None:
    samples = array("q", [i * 1_000_000 for i in range(1, 1001)])  # 1..1000 ms
    p = percentiles(samples)
    assert (p["p50"], p["p99"], p["p999"], p["max"]) == (500.0, 990.0, 999.0, 1000.0)
    assert percentiles(array("q"))["p50"] is None


def test_profile_summary_counts_self_and_inclusive_time(tmp_path: Path) -> None:
    raw = tmp_path / "p.raw"
    raw.write_text("main (router/cli.py:1);run (router/server.py:5);write (router/settlement_log.py:9) 3\n"
                   "main (router/cli.py:1);run (router/server.py:5) 1\n")
    s = summarise_profile(raw)
    assert s["samples"] == 4
    assert s["self"][0] == ["write (router/settlement_log.py)", 75.0]
    assert ["run (router/server.py)", 100.0] in s["inclusive"]
    assert not any("cli.py" in f for f, _ in s["inclusive"])  # the entry point is always 100%: left out


def test_bench_json_has_the_documented_keys_and_plausible_values() -> None:
    rep = bench("--count", "300", "--warmup", "0", "--repeat", "1", "--subscribers", "2",
                "--baselines", "direct,container", "--latency-rate", "500")
    assert rep["version"] == 1
    assert {"cpu", "cores", "python", "proton"} <= set(rep["machine"])
    assert rep["scenario"]["mode"] == "exactly-once" and rep["scenario"]["size"] == 100
    assert "lean engine clients" in rep["clients"]
    t = rep["throughput"]
    assert set(t) == {"router", "router-1:1", "direct", "container"}
    for name, case in t.items():
        m = case["median"]
        assert set(m) >= CASE_KEYS, name
        assert m["ok_runs"] == 1, case["runs"]
        run = case["runs"][0]
        assert run["published"] == 300
        assert run["delivered"] == 300 * (2 if name == "router" else 1)
        assert 0 < m["delivered_msg_s_per_sub"] < 10_000_000
        assert 0 < m["pub_cpu_us_per_msg"] < 100_000
    for name in ("router", "router-1:1", "container"):
        m = t[name]["median"]
        assert 0 < m["server_cpu_us_per_msg_hop"] < 100_000, name
        assert m["server_peak_rss_kb"] > 1000
    assert t["router"]["median"]["server_cpu_us_per_delivery"] < t["router"]["median"]["server_cpu_us_per_msg_hop"]
    assert t["direct"]["median"]["server_cpu_us_per_msg_hop"] is None  # nothing in the middle
    lat = rep["latency"]
    assert set(lat) == {"router@rate", "direct@rate", "container@rate"}
    for case in lat.values():
        q = case["median"]["latency_ms"]
        assert 0 < q["p50"] <= q["p99"] <= q["p999"] <= q["max"] < 10_000
    assert set(rep["ratios"]) >= {"router / direct", "router-1:1 / direct", "router / container"}
    assert all(v > 0 for v in rep["ratios"].values())
    names = {x["target"] for x in rep["targets"]}
    assert any("CPU-us per message per hop" in n for n in names)
    assert any("router / container" in n for n in names)


def test_bench_on_a_topology_counts_every_router_a_message_crosses() -> None:
    line = example_path("line3.toml")
    rep = bench("--topology", str(line), "--pub-at", "A", "--sub-at", "C", "--count", "200", "--warmup", "0",
                "--repeat", "1", "--baselines", "", "--latency-rate", "0")
    run = rep["throughput"]["mesh"]["runs"][0]
    assert run["ok"], run
    assert run["delivered"] == 200
    # three routers on the path: per hop is a third of the routers' CPU per delivery
    assert run["server_cpu_us_per_msg_hop"] == pytest.approx(run["server_cpu_us_per_delivery"] / 3, rel=0.02)


def test_bench_shared_case_splits_the_messages_between_the_members_beside_the_one_to_one_case() -> None:
    """--shared: the subscribers are the members of one shared subscription; together they get each
    message once (the run fails otherwise), each a share; the 1:1 case runs beside it."""
    rep = bench("--subscribers", "3", "--shared", "--count", "600", "--warmup", "0", "--repeat", "1",
                "--baselines", "", "--latency-rate", "0")
    assert set(rep["throughput"]) == {"router", "router-1:1"}
    case = rep["throughput"]["router"]
    assert "shared subscription of 3 members" in case["label"]
    run = case["runs"][0]
    assert run["ok"], run
    assert run["published"] == run["delivered"] == 600
    assert len(run["shares"]) == 3 and min(run["shares"]) > 0, run["shares"]
    assert rep["throughput"]["router-1:1"]["runs"][0]["ok"]


def test_bench_wan_scenario_runs_beside_its_lan_twin_and_reports_links_and_each_subscriber() -> None:
    """--wan: every inter-router link through a proxy with delay, jitter and loss; the same mesh on
    plain links beside it; traffic per link and latency per subscriber (the path to its router)."""
    line = example_path("line3.toml")
    rep = bench("--topology", str(line), "--pub-at", "A", "--sub-at", "A,C", "--count", "200", "--rate", "100",
                "--warmup", "0", "--repeat", "1", "--baselines", "", "--latency-rate", "0",
                "--wan", "30ms,5ms,0.1%", timeout=400)
    assert rep["scenario"]["wan"] == {"delay": 0.03, "jitter": 0.005, "loss": 0.001, "rate": 0.0}
    assert set(rep["throughput"]) == {"mesh", "mesh-lan"}
    for case in rep["throughput"].values():
        assert case["median"]["ok_runs"] == 1, case["runs"]
    wan = rep["throughput"]["mesh"]["median"]
    assert "WAN links 30 ms +- 5 ms, 0.1 % loss" in rep["throughput"]["mesh"]["label"]
    assert set(wan["links"]) == {"A-B", "B-C"} and all(v["up_bytes_s"] > 0 for v in wan["links"].values())
    by_sub = {e["at"]: e for e in wan["latency_by_sub"]}
    assert by_sub["A"]["p50"] < 25 < by_sub["C"]["p50"]  # C is two WAN links (>= 2 x 25 ms) away, A none
    assert "links" not in rep["throughput"]["mesh-lan"]["median"]


def test_bench_latency_curve_measures_each_rate_and_draws_it(tmp_path: Path) -> None:
    chart = tmp_path / "curve.png"
    rep = bench("--no-main", "--latency-curve", "200,400", "--duration", "1", "--warmup", "0.2", "--repeat", "1",
                "--subscribers", "1", "--chart", str(chart))
    pts = rep["latency_curve"]["points"]
    assert [p["rate"] for p in pts] == [200.0, 400.0]
    for pt in pts:
        assert pt["median"]["ok_runs"] == 1, pt["runs"]
        q = pt["median"]["latency_ms"]
        assert 0 < q["p50"] <= q["p99"] <= q["p999"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_wan_option_is_parsed_with_units_and_refused_when_wrong() -> None:
    from oncemesh.harness.bench import Wan, parse_wan

    assert parse_wan("20ms,5ms,0.1%") == Wan(0.02, 0.005, 0.001)
    assert parse_wan("0.05") == Wan(0.05)
    assert parse_wan("10ms,0,0,10M") == Wan(0.01, 0.0, 0.0, 10e6)
    for bad in ("", "x", "20ms,5ms,150%", "1,2,3,4,5", "-5ms"):
        with pytest.raises(ValueError):
            parse_wan(bad)


def test_a_failed_case_is_reported_failed_never_with_figures() -> None:
    """A run whose connections closed once printed "published msg/s 1,233,750,000,000,000"."""
    failed = {"ok": False, "published_msg_s": 1.23375e15, "delivered_msg_s_per_sub": 16_000.0,
              "latency_ms": {"p50": 1.0, "p99": 2.0, "p999": 3.0, "max": 4.0}}
    good = {**failed, "ok": True, "published_msg_s": 16_000.0}
    md = median_of([failed])
    assert md["published_msg_s"] is None and md["delivered_msg_s_per_sub"] is None
    assert md["latency_ms"]["p99"] is None and _ok_text(md) == "0/1 FAILED"
    md = median_of([failed, good])
    assert md["published_msg_s"] == 16_000.0 and _ok_text(md) == "1/2"


def test_callgrind_total_is_read_from_the_summary_line(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text("version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nfn=x\n1 5\nsummary: 123456\ntotals: 123456\n")
    assert _callgrind_total(out) == 123456


def test_the_fan_out_instruction_count_is_printed_per_message_and_per_delivery() -> None:
    """`--instructions-fanout K`: the 1 -> K figure beside the 1:1 one, per delivery and its ratio."""
    ins = {"messages": [100, 600], "instructions": [1, 2], "per_message": 180_000, "per_message_loop": 179_000,
           "per_message_workers": 1_000, "rate": None,
           "fanout": {"messages": [100, 600], "instructions": [1, 3], "per_message": 300_000, "per_message_loop": 0,
                      "per_message_workers": 0, "subscribers": 3, "per_delivery": 100_000},
           "fanout_delivery_ratio": 0.556}
    text = format_report(_bare_report(ins))
    assert "router instructions per message (callgrind, 1:1 exactly-once" in text and "180,000" in text
    assert ("1 pub -> router -> 3 subs (each its own durable subscription, same runs' sizes): 300,000 per message, "
            "100,000 per delivery; per delivery / 1:1 message: 0.556") in text
    failed = {**ins, "fanout": {"error": "the run of 100 messages (1 pub -> router -> 3 sub) failed: x"}}
    assert "fan-out instructions: the run of 100 messages" in format_report(_bare_report(failed))


def _bare_report(instructions: dict[str, Any]) -> dict[str, Any]:
    """A report of `oncemesh bench --no-main --instructions ...` (no cases) around `instructions`."""
    return {"scenario": {"mode": "exactly-once", "size": 100, "count": 0, "duration": 3.0},
            "machine": {"cpu": "x", "cores": 2, "python": "3.11", "proton": "0.40.0", "kernel": "6",
                        "loadavg_at_start": 1.0},
            "clients": "lean", "repeat": 3, "throughput": {}, "latency": {}, "ratios": {},
            "instructions": instructions}


def test_the_fan_out_instruction_count_needs_instructions_and_two_subscribers() -> None:
    for args in (["--instructions-fanout", "3"], ["--instructions", "100", "--instructions-fanout", "1"]):
        out = subprocess.run([sys.executable, "-m", "oncemesh", "bench", "--no-main", *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "--instructions-fanout K needs --instructions" in out.stderr, out


@pytest.mark.slow  # ~2 min under valgrind; the parsing of its output is checked above in the default run
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_bench_counts_the_routers_instructions_per_message_under_callgrind() -> None:
    rep = bench("--no-main", "--instructions", "100", "--instructions-fanout", "2", timeout=800)
    ins = rep["instructions"]
    assert ins["messages"] == [100, 600]
    assert ins["instructions"][1] > ins["instructions"][0] > 0
    # the router's work per message is tens of thousands of instructions to a few million, not start-up
    assert 10_000 < ins["per_message"] < 5_000_000
    # 1 -> 2 on the same router: a message costs more than at 1:1 (two deliveries), a delivery less than a
    # whole 1:1 message (the record, the owed set, the publisher's side are done once)
    fan = ins["fanout"]
    assert fan["subscribers"] == 2 and fan["messages"] == [100, 600]
    assert ins["per_message"] < fan["per_message"] < 2 * ins["per_message"]
    assert fan["per_delivery"] == round(fan["per_message"] / 2)
    assert 0.5 < ins["fanout_delivery_ratio"] < 1.0


@pytest.mark.skipif(RabbitMQ.unavailable() is not None, reason=str(RabbitMQ.unavailable()))
def test_bench_against_rabbitmq_runs_it_at_least_once_and_cleans_up() -> None:
    rep = bench("--count", "300", "--warmup", "0", "--repeat", "1", "--subscribers", "1", "--baselines",
                "rabbitmq", "--latency-rate", "0", timeout=300)
    rab = rep["throughput"]["rabbitmq"]
    assert rab["median"]["ok_runs"] == 1, rab["runs"]
    assert "at-least-once" in rab["label"]
    assert rab["runs"][0]["delivered"] == 300
    assert "router-1:1-alo / rabbitmq" in rep["ratios"]
    assert any("refuses receiver-settle-mode second" in n for n in rep["notes"])


def test_bench_mqtt_cases_run_beside_the_amqp_one_to_one_case_and_print_their_figures() -> None:
    """--mqtt: MQTT 5 QoS 2 and QoS 1, 1:1 through the router's MQTT listener (harness/mqttload.py),
    in the same rounds as the AMQP 1:1 case, and again at the latency pass's rate; the text report
    has the "MQTT beside AMQP" tables.
    (30 messages: twice that is within the subscription's first credit of 64, which the QoS 1 case
    needs: see the QoS 1 test below.)"""
    rep = bench("--mqtt", "--subscribers", "1", "--count", "30", "--warmup", "0", "--repeat", "1", "--baselines", "",
                "--latency-rate", "500")
    t = rep["throughput"]
    assert set(t) == {"router", "mqtt-qos2-1:1", "mqtt-qos1-1:1"}
    for name, qos in (("mqtt-qos2-1:1", 2), ("mqtt-qos1-1:1", 1)):
        case = t[name]
        assert case["protocol"] == "mqtt" and case["qos"] == qos and f"MQTT 5 QoS {qos}" in case["label"]
        run = case["runs"][0]
        assert run["ok"], run
        assert run["published"] == 30 and run["delivered"] >= 30
        assert run["mqtt"]["missing"] == 0 and run["mqtt"]["window"] == [100]
        assert 0 < run["server_cpu_us_per_msg_hop"] < 100_000 and run["delivered_msg_s_per_sub"] > 0
    assert t["mqtt-qos2-1:1"]["runs"][0]["mqtt"]["duplicates"] == 0
    mq = rep["mqtt"]
    assert mq["reference"] == "router"
    for c in mq["cases"].values():
        assert c["msg_s_ratio"] > 0 and c["cpu_ratio"] > 0 and len(c["rounds"]) == 1
    at_rate = rep["mqtt_at_rate"]  # the same beside the AMQP case at the latency pass's rate
    assert at_rate["reference"] == "router@rate" and set(at_rate["cases"]) == {"mqtt-qos2@rate", "mqtt-qos1@rate"}
    assert all(c["ok_runs"] == 1 for c in at_rate["cases"].values()), at_rate
    text = format_report(rep)  # (what the command prints without --json)
    assert "MQTT beside AMQP (1:1" in text and "MQTT beside AMQP at 500 msg/s" in text
    assert "[MQTT 5 QoS 2]" in text and "[MQTT 5 QoS 1]" in text


def _payload(seq: int, last: bool = False) -> bytes:
    return HEADER.pack(MAGIC, 0, seq, 0, FLAG_LAST if last else 0) + b"x" * 20


def test_the_mqtt_exactly_once_check_fails_on_a_duplicate_or_a_missing_message() -> None:
    t = Tally()
    for seq in (0, 1, 1, 3):  # 1 twice, 2 missing, 3 the last
        t.add(_payload(seq, last=seq == 3))
    assert (t.distinct, t.duplicates, t.expected, t.missing()) == (3, 1, 4, 1)
    v2 = t.violations(2, 1)
    assert any("duplicate" in v for v in v2) and any("1 of 4 messages missing" in v for v in v2)
    v1 = t.violations(1, 1)
    assert len(v1) == 1 and "missing" in v1[0]  # QoS 1: a duplicate is its at-least-once, a loss is not
    # the bench fails the run on it, even when a subscriber's own list is empty (counts are checked too)
    sub = {"index": 0, "distinct": 3, "duplicates": 1, "missing": 0, "received": 4, "expected": 3, "complete": True,
           "violations": [], "msg_s": 10.0}
    assert mqtt_violations(2, [sub]) == ["sub 0: QoS 2: 1 duplicate deliveries (not exactly once)"]
    assert mqtt_violations(1, [sub]) == []
    case = Case("mqtt-qos2-1:1", "router", ["A"], ["A"], ["t"], ["t"], protocol="mqtt", qos=2)
    run = _summarise(case, [{"outcomes": 3, "msg_s": 10.0}], [sub], [{}], [{}], {1: 0.01}, 0, 1.0, 3, None)
    assert not run["ok"] and "duplicate" in run["errors"][0]
    assert _ok_text(median_of([run])) == "0/1 FAILED"


async def _broker_that_hands_a_message_twice(sends: list[tuple[int, bytes, bool]]) -> tuple[asyncio.Server, int]:
    """A fake MQTT 5 server (our codec, server side): CONNACK, SUBACK QoS 2, then `sends` as QoS 2
    PUBLISHes (packet id, payload, DUP); PUBREL for each PUBREC."""

    class Peer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.t = transport
            self.d = Decoder()

        def data_received(self, data: bytes) -> None:
            for p in self.d.feed(data):
                if isinstance(p, Connect):
                    self.t.write(encode(Connack(), 5))
                elif isinstance(p, Subscribe):
                    self.t.write(encode(Suback(p.packet_id, (2,)), 5))
                    for pid, payload, dup in sends:
                        self.t.write(encode(Publish(topic="t", payload=payload, qos=2, dup=dup, packet_id=pid), 5))
                elif isinstance(p, Pubrec):
                    self.t.write(encode(Pubrel(p.packet_id), 5))

    server = await asyncio.get_running_loop().create_server(Peer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_the_mqtt_subscriber_counts_a_resend_once_and_a_second_handing_as_a_duplicate(tmp_path: Path) -> None:
    """QoS 2 at the subscriber: a PUBLISH again under a packet id awaiting PUBREL (DUP) is the same
    message; the same payload under another packet id is a duplicate, and fails the check."""
    sends = [(1, _payload(0), False), (2, _payload(1), False), (2, _payload(1), True),  # a resend: the same
             (3, _payload(1), False),  # handed again under a new packet id: a duplicate
             (4, _payload(2, last=True), False)]
    args = argparse.Namespace(kind="sub", topic="t", qos=2, client_id="c", window=100, expiry=300, stall=2.0,
                              publishers=1, timeout=20.0, index=0, ready=tmp_path / "r.json",
                              result=tmp_path / "res.json")

    async def main() -> int:
        server, port = await _broker_that_hands_a_message_twice(sends)
        args.url = f"127.0.0.1:{port}"
        try:
            return await run_sub(args)
        finally:
            server.close()

    assert asyncio.run(main()) == 1
    res = json.loads(args.result.read_text())
    assert (res["distinct"], res["duplicates"], res["resent_same_packet_id"], res["missing"]) == (3, 1, 1, 0)
    assert res["complete"] and any("duplicate" in v for v in res["violations"]), res


def test_mqtt_qos1_subscription_takes_more_than_its_credit(procs: Any, tmp_path: Path) -> None:
    """The bench's MQTT QoS 1 case in small: 300 QoS 1 messages, 1:1 through the router."""
    r: RouterProcess = procs.router("A", settings={"mqtt_listen": "127.0.0.1:0"})
    url = r.status()["mqtt"]
    files = {k: tmp_path / f"{k}.json" for k in ("sr", "sres", "pr", "pres")}
    common = ["-m", "oncemesh.harness.mqttload"]
    sub = procs.add(Proc(python_cmd(*common, "sub", "--url", url, "--topic", "q1", "--qos", "1", "--stall", "3",
                                    "--ready", str(files["sr"]), "--result", str(files["sres"]), "--timeout", "60"),
                         tmp_path / "sub.out"))
    wait_for(lambda: read_json(files["sr"]), 30, "the subscriber")
    pub = procs.add(Proc(python_cmd(*common, "pub", "--url", url, "--topic", "q1", "--qos", "1", "--count", "300",
                                    "--warmup", "0", "--ready", str(files["pr"]), "--result", str(files["pres"]),
                                    "--timeout", "60"), tmp_path / "pub.out"))
    wait_for(lambda: read_json(files["pr"]), 30, "the publisher")
    pub.signal(signal.SIGUSR1)
    wait_for(lambda: not sub.alive() and not pub.alive(), 90, "the clients to end", 0.05)
    res = read_json(files["sres"])
    assert res is not None and res["complete"] and res["distinct"] == 300, res


def test_install_baselines_says_what_it_cannot_do_and_installs_nothing_already_there(monkeypatch: Any) -> None:
    import oncemesh.harness.bench as b

    monkeypatch.setattr(b.Mosquitto, "unavailable", staticmethod(lambda: "Mosquitto is not installed"))
    monkeypatch.setattr(b.RabbitMQ, "unavailable", staticmethod(lambda: None))
    monkeypatch.setattr(b.os, "geteuid", lambda: 1000)
    ran: list[list[str]] = []
    monkeypatch.setattr(b.subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    notes = install_baselines(["rabbitmq", "mosquitto", "direct"])
    assert notes == ["--install-baselines: needs apt-get as root; install by hand: apt-get install -y mosquitto"]
    assert ran == []  # (nothing run; RabbitMQ, already there, not even asked for)


def test_bench_against_mosquitto_runs_mqtt_qos2_with_the_same_clients() -> None:
    # the bench's own set-up installs Debian's mosquitto where it is missing (as root: CI's machine)
    notes = install_baselines(["mosquitto"])
    if Mosquitto.unavailable() is not None:
        pytest.skip(f"{Mosquitto.unavailable()} ({'; '.join(notes)})")
    rep = bench("--count", "300", "--warmup", "0", "--repeat", "1", "--subscribers", "1", "--baselines",
                "mosquitto", "--latency-rate", "0", "--install-baselines", timeout=300)
    mos = rep["throughput"]["mosquitto"]
    assert mos["median"]["ok_runs"] == 1, mos["runs"]
    assert "Mosquitto" in mos["label"] and "MQTT 5 QoS 2" in mos["label"]
    run = mos["runs"][0]
    assert run["published"] == run["delivered"] == 300 and run["mqtt"]["duplicates"] == 0
    assert run["server_cpu_us_per_msg_hop"] > 0
    assert rep["machine"]["mosquitto"]
    assert "router / mosquitto" in rep["ratios"] and rep["mqtt"]["cases"]["mosquitto"]["msg_s_ratio"] > 0


@pytest.mark.bench
@pytest.mark.slow
def test_full_benchmark_prints_the_figures_of_docs_performance() -> None:
    """The run docs/performance.md reports (several minutes): every case completes."""
    rep = bench("--scale-out", "--memory", "--profile", "5", timeout=3600)
    for sec in ("throughput", "latency"):
        for name, case in rep[sec].items():
            assert case["median"]["ok_runs"] == case["median"]["runs"], name
    assert rep["memory"]["connections"]["ok"]
    print(json.dumps(rep, indent=2))
