"""Delivery core, causal order: a client's causal past (what it was handed and what it published,
with what those depended on) travels with what it publishes, and a subscription is handed a
message only after the messages of its own topic that it depends on."""

from __future__ import annotations

from oncemesh.common.ids import counter_tag, global_id, publisher_link_id, subscription_id
from oncemesh.router.actions import Deliver, Forward, SendQuery
from oncemesh.router.core import CoreConfig, DeliveryCore
from oncemesh.router.state import S
from oncemesh.router.subscriptions import SubscriptionTable

GROUPS = {"t": "group g", "u": "group g", "v": "topic v"}


class Causal:
    """One router (or a destination with mesh_size 2) with causal topics t, u (one group) and v."""

    def __init__(self, mesh: bool = False) -> None:
        self.core = DeliveryCore("R", SubscriptionTable(), CoreConfig(causal_groups=dict(GROUPS)))
        if mesh:
            self.core.mesh_size = 2
            self.core.reachable = {"R": "", "O": "o1"}
        self.now = 0.0
        self.links: dict[tuple[str, str], object] = {}
        self.seqs: dict[tuple[str, str], int] = {}

    def take(self) -> list[object]:
        out, self.core.out = self.core.out, []
        return out

    def sub(self, client: str, topic: str, credit: int = 100) -> str:
        sid = subscription_id(client, f"s-{topic}", topic)
        self.core.attach_subscriber(object(), sid, topic, client, f"s-{topic}", 60.0, True, None, self.now)
        self.core.subscriber_credit(sid, credit)
        self.take()
        return sid

    def publish(self, client: str, topic: str) -> str:
        key = (client, topic)
        if key not in self.links:
            self.links[key] = tok = object()
            self.core.attach_publisher(tok, publisher_link_id(client, f"p-{topic}"), topic, True, None, self.now,
                                       client=client)
        self.seqs[key] = n = self.seqs.get(key, 0) + 1
        return self.core.publish(self.links[key], object(), counter_tag(n), b"x", self.now)


def handed(acts: list[object]) -> list[tuple[str, str]]:
    return [(a.sid, a.gid) for a in acts if isinstance(a, Deliver)]



# the first message of two publisher links: a (by p), and b (by x, whose client was handed a)
A1 = global_id(publisher_link_id("p", "l"), counter_tag(1))
B1 = global_id(publisher_link_id("x", "l"), counter_tag(1))


def test_what_a_client_was_handed_travels_with_what_it_publishes() -> None:
    h = Causal()
    h.sub("x", "t")
    a = h.publish("p", "t")
    assert handed(h.take())  # handed to x
    b = h.publish("x", "u")  # another topic of the same group
    assert h.core.records[b].deps == ((a, "t"),)
    assert a not in h.core.records[b].preds  # another topic: nobody waits for it at b's subscriptions
    c = h.publish("x", "t")
    assert dict(h.core.records[c].deps) == {a: "t", b: "u"}  # what it published itself counts too
    assert a in h.core.records[c].preds and b not in h.core.records[c].preds


def test_the_past_is_transitive_across_clients_and_topics() -> None:
    """a -> (x) -> b on u -> (y) -> c: c depends on a although y never saw a."""
    h = Causal()
    h.sub("x", "t")
    h.sub("y", "u")
    a = h.publish("p", "t")
    b = h.publish("x", "u")
    h.take()
    c = h.publish("y", "t")
    deps = dict(h.core.records[c].deps)
    assert deps == {a: "t", b: "u"}
    assert a in h.core.records[c].preds


def test_only_the_latest_message_of_each_link_is_kept() -> None:
    h = Causal()
    h.sub("x", "t")
    h.publish("p", "t")
    a2 = h.publish("p", "t")
    h.take()
    b = h.publish("x", "u")
    assert h.core.records[b].deps == ((a2, "t"),)


def test_another_group_is_not_a_dependency() -> None:
    h = Causal()
    h.sub("x", "v")
    h.publish("p", "v")
    h.take()
    b = h.publish("x", "t")
    assert h.core.records[b].deps == ()


def test_final_messages_stay_until_they_are_older_than_we_remember_finals() -> None:
    """A final message is still a dependency (its publisher may resend it for a subscription that
    came in force since); entries leave the past after `final_memory`."""
    h = Causal()
    h.sub("x", "t")
    a = h.publish("p", "t")
    h.take()
    h.core.recent_final[a] = h.now
    b = h.publish("x", "u")
    assert h.core.records[b].deps == ((a, "t"),)
    h.now += h.core.cfg.final_memory + 1
    h.core._now = h.now
    c = h.publish("x", "u")
    assert h.core.records[c].deps == ()
    assert all(e[1] != a for e in h.core.causal_order.pasts[("x", "group g")].values())


def test_deps_travel_in_copies() -> None:
    """An origin routes a message with its dependencies to the subscription's home."""
    h = Causal()
    h.sub("x", "t")
    a = h.publish("p", "t")
    assert handed(h.take())
    h.core.mesh_size = 2
    h.core.reachable = {"R": "", "O": "o1"}
    h.core.table.attach(subscription_id("z", "s", "t"), "t", "z", "s", 60.0, "O", h.now)
    b = h.publish("x", "t")
    fwd = [act for act in h.take() if isinstance(act, Forward) and act.gid == b]
    assert fwd and fwd[0].deps == ((a, "t"),) and a in fwd[0].preds


def test_a_copy_waits_for_a_dependency_of_its_topic_from_another_publisher() -> None:
    """b (published by x after it was handed a) reaches s's home before a: s gets a first."""
    h = Causal(mesh=True)
    s = h.sub("s", "t")
    a, b = A1, B1
    h.core.receive_copy("O", "o1", b, "t", [s], b"b", h.now, (), ((a, "t"),))
    acts = h.take()
    assert handed(acts) == [] and any(isinstance(q, SendQuery) and q.gid == a for q in acts)
    h.core.receive_copy("O", "o1", a, "t", [s], b"a", h.now)
    assert handed(h.take()) == [(s, a)]
    h.core.tick(h.now)
    assert handed(h.take()) == [(s, b)]


def test_a_dependency_on_another_topic_does_not_hold_a_copy_back() -> None:
    h = Causal(mesh=True)
    s = h.sub("s", "t")
    a, b = A1, B1
    h.core.receive_copy("O", "o1", b, "t", [s], b"b", h.now, (), ((a, "u"),))
    assert handed(h.take()) == [(s, b)]


def test_a_dependency_not_owed_here_releases_the_copy_once_final() -> None:
    """s started after a: it is not owed a, whose FINAL (from the mesh) releases b."""
    h = Causal(mesh=True)
    s = h.sub("s", "t")
    a, b = A1, B1
    h.core.receive_copy("O", "o1", b, "t", [s], b"b", h.now, (), ((a, "t"),))
    assert handed(h.take()) == []
    h.core.handle_final(a, h.now)
    h.core.tick(h.now)
    assert handed(h.take()) == [(s, b)]


def test_handing_a_copy_extends_its_clients_past_with_its_deps() -> None:
    h = Causal(mesh=True)
    h.sub("y", "t")
    a, b = A1, B1
    h.core.recent_final[a] = h.now  # (so that b is not held back here)
    h.core.receive_copy("O", "o1", b, "t", [subscription_id("y", "s-t", "t")], b"b", h.now, (), ((a, "u"),))
    assert handed(h.take())
    past = h.core.causal_order.pasts[("y", "group g")]
    assert {e[1] for e in past.values()} == {a, b}


def test_a_dependency_not_handed_ends_if_it_comes_after_what_depends_on_it() -> None:
    """s was handed b, which depends on a2, without a2 (final, not owed to s when published). a2's
    publisher then resends it for s (re-originated, owed now), and a1 too: handing either after b
    would break causal order, so both end for s."""
    h = Causal(mesh=True)
    s = h.sub("s", "t")
    p = publisher_link_id("p", "l")
    a1, a2 = global_id(p, counter_tag(1)), global_id(p, counter_tag(2))
    b = global_id(publisher_link_id("x", "l"), counter_tag(1))
    h.core.recent_final[a2] = h.now
    h.core.receive_copy("O", "o1", b, "t", [s], b"b", h.now, (), ((a2, "t"),))
    assert handed(h.take()) == [(s, b)]
    del h.core.recent_final[a2]  # (forgotten: final_memory later, or at a router that never knew)
    h.core.receive_copy("O", "o1", a1, "t", [s], b"a1", h.now)
    h.core.receive_copy("O", "o1", a2, "t", [s], b"a2", h.now)
    h.core.tick(h.now)
    assert handed(h.take()) == []
    assert h.core.records[a1].owed[s] is S.ENDED and h.core.records[a2].owed[s] is S.ENDED


def test_a_dependency_without_a_counter_tag_ends_too() -> None:
    h = Causal(mesh=True)
    s = h.sub("s", "t")
    a = global_id(publisher_link_id("p", "l"), b"\x00binary")
    b = global_id(publisher_link_id("x", "l"), counter_tag(1))
    h.core.recent_final[a] = h.now
    h.core.receive_copy("O", "o1", b, "t", [s], b"b", h.now, (), ((a, "t"),))
    assert handed(h.take()) == [(s, b)]
    del h.core.recent_final[a]
    h.core.receive_copy("O", "o1", a, "t", [s], b"a", h.now)
    h.core.tick(h.now)
    assert handed(h.take()) == [] and h.core.records[a].owed[s] is S.ENDED


def test_a_resend_declared_in_doubt_gets_no_new_dependencies() -> None:
    """What its client was handed since it first sent the message is not in its past: a resend
    through another router must not pick it up (it could close a cycle of waits)."""
    h = Causal()
    h.sub("x", "t")
    h.publish("p", "t")
    h.take()
    tok = object()
    pl = publisher_link_id("x", "p-t")
    h.core.attach_publisher(tok, pl, "t", True, [counter_tag(7)], h.now, 8, client="x")
    gid = h.core.publish(tok, object(), counter_tag(7), b"again", h.now)
    assert h.core.records[gid].deps == ()
    fresh = h.core.publish(tok, object(), counter_tag(8), b"new", h.now)
    assert h.core.records[fresh].deps  # a new message does get them


def test_two_messages_waiting_for_each_other_do_not_wait_forever() -> None:
    h = Causal(mesh=True)
    s = h.sub("s", "t", credit=0)
    a, b = A1, B1
    h.core.receive_copy("O", "o1", a, "t", [s], b"a", h.now, (), ((b, "t"),))
    h.core.receive_copy("O", "o1", b, "t", [s], b"b", h.now, (), ((a, "t"),))
    h.core.subscriber_credit(s, 10)
    h.core.tick(h.now)
    assert sorted(g for _, g in handed(h.take())) == sorted([a, b])
    assert h.core.stats()["causal_cycles"] == 1


def test_a_publisher_presents_its_clients_past_to_a_router_it_moved_to() -> None:
    """The client was handed a through another router (this one knows nothing of it): our clients
    present [gid, topic] of their causal past when a publisher attaches; other groups are ignored."""
    h = Causal()
    a = global_id(publisher_link_id("p", "l"), counter_tag(3))
    v = global_id(publisher_link_id("q", "l"), counter_tag(1))
    tok = object()
    h.core.attach_publisher(tok, publisher_link_id("x", "p-t"), "t", True, [], h.now, 0, client="x",
                            past=[(a, "u"), (v, "v")])
    b = h.core.publish(tok, object(), counter_tag(0), b"b", h.now)
    assert h.core.records[b].deps == ((a, "u"),)
