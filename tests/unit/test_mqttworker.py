"""The MQTT chaos worker's client-side session state (harness/mqttworker.py): which packets go again
after a reconnect, what is saved before which packet, and a restart from the saved state; what the
chaos judge reads back: a report's first-delivery order, an AMQP consumer's payload notes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oncemesh.harness.mqttworker import (
    PACKET_ID_NOT_FOUND,
    Publisher,
    ReportReader,
    Subscriber,
    fifo_reversals,
    key_of,
    load_json,
    payload_of,
    save_json,
)
from oncemesh.harness.worker import BodyReader, _note_bodies, payload_key
from oncemesh.router.mqtt.packets import Pubcomp, Publish, Pubrec, Pubrel, Suback, Subscribe


class Disk:
    """What the worker saved (each snapshot, as JSON text: later changes cannot alter it) and reported."""

    def __init__(self) -> None:
        self.saved: list[dict[str, Any]] = []
        self.lines: list[dict[str, Any]] = []

    def save(self, d: dict[str, Any]) -> None:
        self.saved.append(json.loads(json.dumps(d)))

    def report(self, e: dict[str, Any]) -> None:
        self.lines.append(e)

    @property
    def last(self) -> dict[str, Any]:
        return self.saved[-1]


def publisher(disk: Disk, count: int = 5) -> Publisher:
    return Publisher("pub-0", "t", count, 16, disk.save, disk.report)


def subscriber(disk: Disk) -> Subscriber:
    return Subscriber("sub-0", ("t", "u"), disk.save, disk.report)


def test_payloads_name_the_publisher_and_the_number() -> None:
    assert payload_of("pub-1", 17, 20) == b"pub-1:17:" + b"x" * 11
    assert key_of(payload_of("pub-1", 17, 64)) == ("pub-1", 17)
    assert key_of(b"pub-1:17:") == ("pub-1", 17)
    assert key_of(b"hello") is None and key_of(b"a:b:c") is None


def test_a_publish_is_saved_before_it_goes_and_pubrel_only_after_pubrec_is_saved() -> None:
    disk = Disk()
    pub = publisher(disk)
    assert pub.connected(False) == [] and disk.last["started"]
    p = pub.new_message()
    assert isinstance(p, Publish) and p.qos == 2 and not p.dup and p.payload.startswith(b"pub-0:0:")
    assert disk.last["next"] == 1 and disk.last["inflight"] == {str(p.packet_id): [0, False]}
    out = pub.pubrec(Pubrec(p.packet_id))
    assert out == [Pubrel(p.packet_id)] and disk.last["inflight"] == {str(p.packet_id): [0, True]}
    assert pub.pubrec(Pubrec(p.packet_id)) == [Pubrel(p.packet_id)]  # PUBREC again: PUBREL again
    pub.pubcomp(Pubcomp(p.packet_id))
    assert disk.last["inflight"] == {} and pub.completed == 1
    assert [e["ev"] for e in disk.lines] == ["published", "completed"]
    pub.pubcomp(Pubcomp(p.packet_id))  # for nothing in flight: counted, nothing else
    assert pub.unexpected == 1 and pub.completed == 1


def test_a_reconnect_sends_publish_with_dup_before_pubrec_and_pubrel_after_never_publish_again() -> None:
    disk = Disk()
    pub = publisher(disk)
    pub.connected(False)
    a, b, c = (pub.new_message() for _ in range(3))
    assert a is not None and b is not None and c is not None
    pub.pubrec(Pubrec(b.packet_id))
    assert b.packet_id is not None
    again = pub.connected(True)
    assert again == [Publish("t", a.payload, 2, dup=True, packet_id=a.packet_id), Pubrel(b.packet_id),
                     Publish("t", c.payload, 2, dup=True, packet_id=c.packet_id)]
    assert pub.session_lost == 0


def test_a_refused_publish_ends_its_exchange() -> None:
    disk = Disk()
    pub = publisher(disk, count=1)
    pub.connected(False)
    p = pub.new_message()
    assert p is not None and pub.pubrec(Pubrec(p.packet_id, 0x87)) == []
    assert pub.done and pub.refused == 1 and disk.lines[-1] == {"ev": "refused", "n": 0, "reason": 0x87}


def test_a_restarted_publisher_continues_its_numbering_and_its_exchanges() -> None:
    disk = Disk()
    pub = publisher(disk)
    pub.connected(False)
    a, b = pub.new_message(), pub.new_message()
    assert a is not None and b is not None and b.packet_id is not None
    pub.pubrec(Pubrec(b.packet_id))
    again = Publisher("pub-0", "t", 5, 16, disk.save, disk.report)  # (SIGKILL; the same state dir)
    again.restore(disk.last)
    assert again.started and again.next == 2
    assert again.connected(True) == [Publish("t", a.payload, 2, dup=True, packet_id=a.packet_id), Pubrel(b.packet_id)]
    c = again.new_message()
    assert c is not None and key_of(c.payload) == ("pub-0", 2) and c.packet_id not in (a.packet_id, b.packet_id)


def test_a_resume_without_the_session_is_reported() -> None:
    disk = Disk()
    pub = publisher(disk)
    pub.connected(False)
    pub.new_message()
    pub.connected(False)
    assert pub.session_lost == 1 and {"ev": "session_lost", "inflight": 1} in disk.lines


def test_a_delivery_is_committed_before_pubrec_and_a_held_packet_id_is_not_delivered_again() -> None:
    disk = Disk()
    sub = subscriber(disk)
    out = sub.connected(False)
    assert len(out) == 1 and isinstance(out[0], Subscribe) and [f for f, _ in out[0].subscriptions] == ["t", "u"]
    assert sub.suback(Suback(1, (2, 1))) is not None  # QoS 1 granted: refused
    assert sub.suback(Suback(1, (2, 2))) is None and disk.last["subscribed"]
    p = Publish("t", payload_of("pub-0", 7, 16), 2, packet_id=9)
    assert sub.publish(p) == [Pubrec(9)]
    assert disk.last["awaiting"] == {"9": [0, "pub-0", 7]} and disk.last["xid"] == 1
    assert sub.publish(Publish("t", p.payload, 2, dup=True, packet_id=9)) == [Pubrec(9)]  # the same message
    assert sub.delivered == 1 and sub.resent == 1
    assert sub.pubrel(Pubrel(9)) == [Pubcomp(9)] and disk.last["awaiting"] == {}
    assert sub.pubrel(Pubrel(9)) == [Pubcomp(9, PACKET_ID_NOT_FOUND)]
    assert sub.publish(Publish("t", payload_of("pub-0", 8, 16), 2, packet_id=9)) == [Pubrec(9)]  # a new one
    assert [(e["ev"], e.get("n")) for e in disk.lines] == [("subscribed", None), ("delivered", 7), ("delivered", 8)]
    assert sub.connected(True) == []  # resumed: the subscription is the session's


def test_a_subscriber_killed_between_its_commit_and_its_report_line_reports_it_once(tmp_path: Path) -> None:
    disk = Disk()
    sub = subscriber(disk)
    sub.connected(False)
    sub.suback(Suback(1, (2, 2)))
    sub.publish(Publish("t", payload_of("pub-0", 0, 16), 2, packet_id=1))
    committed = disk.saved[-1]
    report = tmp_path / "sub-0.report.jsonl"
    # the report as a SIGKILL right after the commit of the second delivery left it (its line never written)
    sub.publish(Publish("t", payload_of("pub-0", 1, 16), 2, packet_id=2))
    report.write_text("".join(json.dumps(e) + "\n" for e in disk.lines[:-1]) + '{"ev": "deliv')  # (a torn line)
    disk2 = Disk()
    again = Subscriber("sub-0", ("t", "u"), disk2.save, disk2.report)
    again.restore(disk.last)
    reader = ReportReader(report)
    reader.poll()
    again.recover(reader.xids)
    assert [(e["p"], e["n"], e["xid"]) for e in disk2.lines] == [("pub-0", 1, 1)]
    # the server resends both under their ids (no PUBREL yet): neither is delivered again
    assert again.connected(True) == []
    assert again.publish(Publish("t", payload_of("pub-0", 0, 16), 2, dup=True, packet_id=1)) == [Pubrec(1)]
    assert again.publish(Publish("t", payload_of("pub-0", 1, 16), 2, dup=True, packet_id=2)) == [Pubrec(2)]
    assert again.delivered == 0 and again.resent == 2
    with report.open("a") as f:
        f.write("\n" + "".join(json.dumps(e) + "\n" for e in disk2.lines))
    reader.poll()
    assert reader.duplicates() == {} and sorted(reader.delivered) == [("pub-0", 0), ("pub-0", 1)]
    assert committed["xid"] == 1  # (the first commit held one delivery)


def test_a_subscriber_resumed_without_its_session_forgets_its_held_ids_and_subscribes_again() -> None:
    disk = Disk()
    sub = subscriber(disk)
    sub.connected(False)
    sub.suback(Suback(1, (2, 2)))
    sub.publish(Publish("t", payload_of("pub-0", 0, 16), 2, packet_id=1))
    out = sub.connected(False)
    assert sub.session_lost == 1 and disk.last["awaiting"] == {} and isinstance(out[0], Subscribe)
    assert sub.publish(Publish("t", payload_of("pub-0", 5, 16), 2, packet_id=1)) == [Pubrec(1)]
    assert sub.delivered == 2


def test_the_report_reader_counts_a_message_delivered_twice_once_per_delivery(tmp_path: Path) -> None:
    report = tmp_path / "r.jsonl"
    lines = [{"ev": "delivered", "p": "pub-0", "n": 1, "xid": 0}, {"ev": "delivered", "p": "pub-0", "n": 1, "xid": 0},
             {"ev": "delivered", "p": "pub-1", "n": 1, "xid": 1}, {"ev": "delivered", "p": "pub-1", "n": 1, "xid": 2},
             {"ev": "published", "n": 3}, {"ev": "completed", "n": 3}, {"ev": "session_lost"}]
    report.write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"ev": "comp')
    r = ReportReader(report)
    assert r.poll() == len(lines)
    assert r.duplicates() == {("pub-1", 1): 1} and r.distinct_of("pub-0") == {1}
    assert r.published == r.completed == {3} and r.session_lost == 1
    with report.open("a") as f:
        f.write('leted", "n": 4}\n')
    assert r.poll() == 1 and r.completed == {3, 4}


def test_state_is_saved_atomically(tmp_path: Path) -> None:
    path = tmp_path / "mqtt-state.json"
    assert load_json(path) is None
    save_json(path, {"a": 1})
    save_json(path, {"a": 2})
    assert load_json(path) == {"a": 2} and [p.name for p in tmp_path.iterdir()] == ["mqtt-state.json"]


def test_fifo_reversals_are_the_numbers_that_come_after_a_higher_one() -> None:
    assert fifo_reversals([]) == [] and fifo_reversals([0, 1, 2, 5, 9]) == []
    assert fifo_reversals([0, 2, 1, 3]) == [1]
    assert fifo_reversals([3, 0, 1, 2, 4]) == [0, 1, 2]  # (each counts: as the reconciliation's fifo_reversals)


def test_the_report_reader_orders_first_deliveries_by_delivery_number_and_keeps_the_times(tmp_path: Path) -> None:
    report = tmp_path / "r.jsonl"
    lines = [{"ev": "delivered", "p": "pub-0", "n": 0, "xid": 0}, {"ev": "delivered", "p": "pub-1", "n": 0, "xid": 1},
             {"ev": "delivered", "p": "pub-0", "n": 2, "xid": 3},
             {"ev": "delivered", "p": "pub-0", "n": 1, "xid": 2, "recovered": True},  # (written late, after a restart)
             {"ev": "delivered", "p": "pub-0", "n": 0, "xid": 4},  # a duplicate: it does not move 0
             {"ev": "published", "n": 7, "ts": 5.0}, {"ev": "completed", "n": 7, "ts": 6.0},
             {"ev": "completed", "n": 7, "ts": 9.0}]
    report.write_text("".join(json.dumps(e) + "\n" for e in lines))
    r = ReportReader(report)
    r.poll()
    assert r.order_of("pub-0") == [0, 1, 2] and r.reversals("pub-0") == [] and r.order_of("pub-1") == [0]
    assert r.published_at == {7: 5.0} and r.completed_at == {7: 6.0}
    with report.open("a") as f:
        f.write(json.dumps({"ev": "delivered", "p": "pub-1", "n": 3, "xid": 5}) + "\n"
                + json.dumps({"ev": "delivered", "p": "pub-1", "n": 2, "xid": 6}) + "\n")
    r.poll()
    assert r.order_of("pub-1") == [0, 3, 2] and r.reversals("pub-1") == [2]


def test_an_amqp_consumer_names_each_message_by_its_payload_whichever_protocol_sent_it(tmp_path: Path) -> None:
    """`--bodies`: an AMQP publisher's string body and an MQTT publisher's payload (one data section, as
    router/mqtt/mapping.py makes it) name (publisher, number) alike; the notes read back in order."""
    from proton import Message

    from oncemesh.clients.subscriber import Delivered
    from oncemesh.router.mqtt.mapping import MqttContent, to_amqp

    amqp = Delivered("P1:0", Message(body="pub-1:3:xxxx").encode(), "chaos")
    mqtt = Delivered("M:0", to_amqp("chaos", MqttContent(payload_of("pub-0", 17, 64)), 0), "chaos")
    other = Delivered("X:0", Message(body={"a": 1}).encode(), "chaos")
    assert [payload_key(d.body) for d in (amqp, mqtt, other)] == [("pub-1", 3), ("pub-0", 17), None]
    assert payload_key(b"pub-0:x:") is None and payload_key("no colons") is None
    path = tmp_path / "sub-1.bodies"
    with path.open("a") as f:
        _note_bodies(f, [amqp, mqtt])
        _note_bodies(f, [other])
    with path.open("a") as f:
        f.write('{"g": "torn')
    b = BodyReader(path)
    assert b.poll() == 3
    assert b.handed == [("P1:0", "pub-1", 3), ("M:0", "pub-0", 17), ("X:0", None, None)] and b.malformed == 0


def test_a_publisher_killed_between_its_commit_and_its_published_line_reports_it_once(tmp_path: Path) -> None:
    disk = Disk()
    pub = publisher(disk)
    pub.connected(False)
    a, b = pub.new_message(), pub.new_message()
    assert a is not None and b is not None and a.packet_id is not None
    pub.pubrec(Pubrec(a.packet_id))
    report = tmp_path / "pub-0.report"
    # the report as a SIGKILL right after the commit of message 1 left it (its `published` line never written)
    report.write_text("".join(json.dumps({**e, "ts": 10.0}) + "\n" for e in disk.lines[:-1]))
    reader = ReportReader(report)
    reader.poll()
    assert reader.published == {0}
    disk2 = Disk()
    again = Publisher("pub-0", "t", 5, 16, disk2.save, disk2.report)
    again.restore(disk.last)
    again.recover(reader.published | reader.completed)
    assert disk2.lines == [{"ev": "published", "n": 1, "recovered": True}]
    with report.open("a") as f:
        f.write("".join(json.dumps({**e, "ts": 20.0}) + "\n" for e in disk2.lines))
    reader.poll()
    assert reader.published == {0, 1} and reader.published_at == {0: 10.0}  # (no time for a recovered line)
    again.recover(reader.published)
    assert len(disk2.lines) == 1  # (reported once)
