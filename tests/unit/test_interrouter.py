"""The sans-IO inter-router pieces: hello, link state and paths, gossip, the frame codec."""

from __future__ import annotations

import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st

from oncemesh.interrouter import codec
from oncemesh.interrouter.gossip import Gossip
from oncemesh.interrouter.hello import HelloMonitor
from oncemesh.interrouter.linkstate import LinkStateDb
from oncemesh.interrouter.members import Settle
from oncemesh.interrouter.messages import (
    Acks,
    Bye,
    Copy,
    Finals,
    Hello,
    Holds,
    LinkState,
    MemberFrame,
    Probes,
    PubDeclare,
    Queries,
    SubAck,
    SubUpdate,
    TableSync,
)
from oncemesh.router.subscriptions import SubscriptionTable, SubState

# ---------------------------------------------------------------------- hello


def test_neighbour_is_dead_after_dead_after_of_silence() -> None:
    h = HelloMonitor({"B": 1.0, "C": 1.0}, interval=1.0, dead_after=3.0)
    assert h.heard("B", "1", 0.0) is True  # becomes live
    assert h.heard("B", "1", 1.0) is False  # nothing changed
    assert h.heard("X", "1", 1.0) is False  # not a neighbour of ours
    assert h.tick(3.9) == []
    assert h.tick(4.0) == ["B"]
    assert h.live() == {}


def test_a_new_incarnation_is_a_change() -> None:
    h = HelloMonitor({"B": 2.0}, interval=1.0, dead_after=3.0)
    h.heard("B", "1", 0.0)
    assert h.heard("B", "2", 0.5) is True
    assert h.live() == {"B": 2.0}
    assert h.lost("B") is True and h.lost("B") is False


# ---------------------------------------------------------------------- link state and paths


def mesh_of(edges: list[tuple[str, str, float]]) -> dict[str, LinkStateDb]:
    """Every router's database after flooding converged (each advertises its live neighbours)."""
    g = nx.Graph()
    for a, b, c in edges:
        g.add_edge(a, b, cost=c)
    dbs = {r: LinkStateDb(r, "1") for r in g.nodes}
    ads = [dbs[r].set_neighbours({n: g[r][n]["cost"] for n in g.neighbors(r)}) for r in g.nodes]
    for db in dbs.values():
        for ad in ads:
            assert ad is not None
            db.update(ad)
    return dbs


def test_line_next_hops() -> None:
    """
        A --- B --- C
    """
    dbs = mesh_of([("A", "B", 1), ("B", "C", 1)])
    r = dbs["A"].routes()
    assert set(r.reachable) == {"A", "B", "C"}
    assert r.next_hop == {"B": "B", "C": "B"}
    assert dbs["B"].routes().next_hop == {"A": "A", "C": "C"}


def test_costs_pick_the_cheap_way_round() -> None:
    """
        A --1-- B --1-- C --1-- D
        |_______________5_______|     A reaches D through B and C (3 < 5)
    """
    dbs = mesh_of([("A", "B", 1), ("B", "C", 1), ("C", "D", 1), ("A", "D", 5)])
    assert dbs["A"].routes().next_hop["D"] == "B"
    assert dbs["A"].routes().distance["D"] == 3
    assert dbs["D"].routes().next_hop["A"] == "C"


def test_a_link_counts_only_when_both_ends_advertise_it() -> None:
    """
        A --- B        B stops advertising A (it declared A dead): A is unreachable from B,
                       even though A still advertises B.
    """
    dbs = mesh_of([("A", "B", 1)])
    ad = dbs["B"].set_neighbours({})
    assert ad is not None
    dbs["A"].update(ad)
    assert set(dbs["A"].routes().reachable) == {"A"}
    assert set(dbs["B"].routes().reachable) == {"B"}


def test_older_advertisements_never_replace_newer_ones() -> None:
    db = LinkStateDb("A", "1")
    assert db.update(LinkState("B", "5", 2, {"A": 1.0}))
    assert not db.update(LinkState("B", "5", 1, {}))  # older seq
    assert not db.update(LinkState("B", "4", 9, {}))  # older incarnation
    assert db.update(LinkState("B", "6", 1, {}))  # B restarted


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(1, 9)), min_size=1, max_size=15))
def test_paths_agree_with_networkx_and_never_loop(edges: list[tuple[int, int, int]]) -> None:
    es = [(f"R{a}", f"R{b}", float(c)) for a, b, c in edges if a != b]
    if not es:
        return
    dbs = mesh_of(es)
    g = nx.Graph()
    for a, b, c in es:
        if not g.has_edge(a, b):
            g.add_edge(a, b, cost=c)
        else:
            g[a][b]["cost"] = c
    for r, db in dbs.items():
        routes = db.routes()
        assert set(routes.reachable) == set(nx.node_connected_component(g, r))
        for dst in routes.reachable:
            if dst == r:
                continue
            # following next hops reaches the destination without a loop, along a shortest path
            seen, cur, dist = {r}, r, 0.0
            while cur != dst:
                nxt = dbs[cur].routes().next_hop[dst]
                assert nxt not in seen, f"loop toward {dst}: {seen}"
                dist += g[cur][nxt]["cost"]
                seen.add(nxt)
                cur = nxt
            assert abs(dist - nx.shortest_path_length(g, r, dst, weight="cost")) < 1e-9


# ---------------------------------------------------------------------- gossip


def pair() -> tuple[Gossip, Gossip, SubscriptionTable, SubscriptionTable]:
    ta, tb = SubscriptionTable(), SubscriptionTable()
    a = Gossip("A", "1", ta, {"A", "B", "C"})
    b = Gossip("B", "1", tb, {"A", "B", "C"})
    a.reachable_changed({"A": "1", "B": "1"})
    b.reachable_changed({"A": "1", "B": "1"})
    return a, b, ta, tb


def test_a_new_subscription_waits_for_every_router_of_the_topology() -> None:
    a, b, ta, tb = pair()
    ta.attach("s1", "t", "c", "l", 60.0, "A", 1.0)
    req = a.announce("s1", wait=True, new_life=True)
    assert req is not None
    [upd] = [m for m in a.out if isinstance(m, SubUpdate)]
    a.out.clear()
    assert b.handle_update(upd) is not None and tb.get("s1") is not None
    [ack] = [m for m in b.out if isinstance(m, SubAck)]
    a.handle_ack(ack)
    assert a.completed() == []  # C (unreachable) has not acknowledged: in force only once it did
    a.reachable_changed({"A": "1", "B": "1", "C": "7"})  # C comes back: it gets the announcement
    assert any(isinstance(m, SubUpdate) and m.dst == "C" for m in a.out)
    a.handle_ack(SubAck("C", "A", "s1", req, True))
    [done] = a.completed()
    assert done.sid == "s1" and done.refused is None


def test_a_resume_waits_only_for_reachable_routers_and_can_be_refused() -> None:
    a, b, ta, tb = pair()
    ta.attach("s1", "t", "c", "l", 60.0, "A", 1.0)
    tb.merge(ta.get("s1"))  # type: ignore[arg-type]
    tb.end("s1", 2.0, "expired")  # B ended that life meanwhile
    ta.attach("s1", "t", "c", "l", 60.0, "A", 3.0)  # resume of the same life
    req = a.announce("s1", wait=True, new_life=False)
    [upd] = [m for m in a.out if isinstance(m, SubUpdate)]
    assert b.handle_update(upd) is None  # refused: END is final for a life
    [ack] = [m for m in b.out if isinstance(m, SubAck)]
    assert not ack.ok and "ended" in (ack.reason or "")
    a.handle_ack(ack)
    [done] = a.completed()
    assert done.req == req and done.refused


def test_announcements_are_sent_again_until_acknowledged() -> None:
    a, b, ta, tb = pair()
    ta.attach("s1", "t", "c", "l", 60.0, "A", 1.0)
    ta.suspend("s1", 2.0)
    a.announce("s1", wait=False, new_life=False)
    a.out.clear()  # lost with a connection
    a.resend()
    [again] = [m for m in a.out if isinstance(m, SubUpdate)]
    b.handle_update(again)
    assert tb.get("s1").state is SubState.SUSPENDED  # type: ignore[union-attr]
    a.handle_ack(next(m for m in b.out if isinstance(m, SubAck)))
    a.out.clear()
    a.resend()
    assert a.out == []


def test_table_sync_asks_for_the_other_table_and_marks_synced() -> None:
    a, b, ta, tb = pair()
    ta.attach("s1", "t", "c", "l", 60.0, "A", 1.0)
    tb.attach("s2", "t", "c", "m", 60.0, "B", 1.0)
    b.handle_sync(a.sync_message("B", "1"))
    [reply] = [m for m in b.out if isinstance(m, TableSync)]
    assert not reply.reply and tb.get("s1") is not None
    a.handle_sync(reply)
    assert ta.get("s2") is not None
    assert a.synced_with_reachable() and b.synced_with_reachable()


# ---------------------------------------------------------------------- codec


def test_every_control_message_round_trips() -> None:
    msgs = [
        Hello("A", "1"), Bye("A", "1"), LinkState("A", "1", 3, {"B": 1.0, "C": 2.5}),
        SubUpdate("A", "B", {"sid": "s", "x": [1, 2]}, 7, ("g1", "g2")), SubUpdate("A", "B", {"sid": "s"}, None),
        SubAck("B", "A", "s", 7, False, "ended"), TableSync("A", "B", "1", [{"sid": "s"}], True),
        Acks("B", "A", [("g", "s", 2, None), ("h", "s", 3, ("app:bad", "no"))]), Finals("A", "B", ["g"]),
        Probes("B", "A", ["g"], "17"), Queries("B", "C", ["g"]), PubDeclare("A", "B", "plid", ["g"]),
        Holds("B", "A", ["g"]), MemberFrame("A", "C", 17, 2, 5, 1, Settle("m", "g")),
        MemberFrame("A", "C", 17, 0, 5, 3, None),
    ]
    assert codec.decode_control(codec.encode_control(msgs)) == msgs


def test_unknown_kinds_are_skipped_and_garbage_is_an_error() -> None:
    frame = b'C[["ZZ",1,2],["H","A","1"]]'
    assert codec.decode_control(frame) == [Hello("A", "1")]
    for bad in [b"C{not json", b"C[[\"A\"]]", b"D\x00\x05abc"]:
        try:
            if bad[:1] == b"D":
                codec.decode_copy(bad)
            else:
                codec.decode_control(bad)
        except codec.FrameError:
            continue
        raise AssertionError(f"{bad!r} was accepted")


@given(st.binary(max_size=300), st.dictionaries(st.sampled_from("ABCD"), st.lists(st.text(max_size=5), max_size=3)))
def test_copies_round_trip_with_their_payload_untouched(payload: bytes, dests: dict[str, list[str]]) -> None:
    c = Copy("A", "12", "p:1", "topic", {k: tuple(v) for k, v in dests.items()}, payload)
    assert codec.decode_copy(codec.encode_copy(c)) == c


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["Q", "F", "H"]), st.lists(st.text(min_size=1, max_size=60), max_size=40)),
                min_size=1, max_size=120), st.integers(min_value=64, max_value=4096))
def test_control_frames_keep_every_message_in_order_within_the_size_limit(
        spec: list[tuple[str, list[str]]], limit: int) -> None:
    from oncemesh.interrouter.node import control_frames

    kinds = {"Q": lambda g: Queries("A", "B", g), "F": lambda g: Finals("A", "B", g), "H": lambda g: Holds("A", "B", g)}
    msgs = [kinds[k](gids) for k, gids in spec]
    frames = control_frames(msgs, limit)
    decoded = [codec.decode_control(f) for f in frames]
    assert [m for ms in decoded for m in ms] == msgs  # nothing lost, repeated or reordered
    for f, ms in zip(frames, decoded, strict=True):
        assert len(f) <= limit or len(ms) == 1  # only a single message larger than the limit goes over it


def test_a_busy_pass_sends_small_control_frames() -> None:
    """Proton keeps each delivery's buffer at the largest size it ever held (its delivery pool), so
    large frames leave large buffers behind: a pass with thousands of acknowledgements and finals
    must still go out in frames of at most MAX_CONTROL_FRAME bytes (each message at most
    MAX_CONTROL_ITEMS gids), all of them delivered."""
    from oncemesh.interrouter.node import MAX_CONTROL_FRAME, MAX_CONTROL_ITEMS, MeshNode
    from oncemesh.router.core import CoreConfig, DeliveryCore

    table = SubscriptionTable()
    core = DeliveryCore("A", table, CoreConfig())
    node = MeshNode("A", "2000", core, table, {"A", "B"}, {"B": 1.0}, 1.0, 3.0, 0.0)
    node.peer_up("B", "1000", 0.0)
    node.frame("B", codec.encode_control([LinkState("B", "1000", 1, {"A": 1.0})]), 0.1)
    node.sends.clear()
    gids = [f"{'p' * 20}:{i:08d}" for i in range(3000)]
    node._acks["B"] = [(g, "sub-1", 2, None) for g in gids]
    node._finals["B"] = list(gids)
    node.flush()
    frames = [f for peer, f in node.sends if peer == "B"]
    assert len(frames) > 10 and all(len(f) <= MAX_CONTROL_FRAME for f in frames)
    msgs = [m for f in frames for m in codec.decode_control(f)]
    acks = [i for m in msgs if isinstance(m, Acks) for i in m.items]
    finals = [g for m in msgs if isinstance(m, Finals) for g in m.gids]
    assert [a[0] for a in acks] == gids and finals == gids
    assert max(len(m.items) if isinstance(m, Acks) else len(m.gids) for m in msgs
               if isinstance(m, Acks | Finals)) <= MAX_CONTROL_ITEMS


# ---------------------------------------------------------------------- probes


def test_only_the_incarnation_that_forwarded_a_copy_answers_a_probe() -> None:
    """A restarted origin has no record of anything: that must not read as 'final' (seed 12397)."""
    from oncemesh.interrouter.node import MeshNode
    from oncemesh.router.actions import SendFinal
    from oncemesh.router.core import CoreConfig, DeliveryCore

    def finals_after(probe_inc: str) -> list[str]:
        table = SubscriptionTable()
        core = DeliveryCore("A", table, CoreConfig())
        node = MeshNode("A", "2000", core, table, {"A", "B"}, {"B": 1.0}, 1.0, 3.0, 0.0)
        node.peer_up("B", "1000", 0.0)
        node.frame("B", codec.encode_control([Probes("B", "A", ["p:1"], probe_inc)]), 0.1)
        return [a.gid for a in core.out if isinstance(a, SendFinal) and a.to == "B"]

    assert finals_after("2000") == ["p:1"]  # this life forwarded it and has no record: final
    assert finals_after("1000") == []  # an earlier life did: we cannot know


# ---------------------------------------------------------------------- the links' credit window
class _FakeLink:
    """What PeerHandler touches of an incoming `$mesh` link."""

    def __init__(self, conn: object) -> None:
        self.conn = conn
        self.ctx: object = None
        self.local_uninit = True
        self.is_sender = False
        self.remote_target_address = "$mesh"
        self.credit = 0
        self.granted: list[int] = []

    def set_target(self, address: str) -> None: ...

    def set_source(self, address: str) -> None: ...

    def set_settle_modes(self, snd: int, rcv: int) -> None: ...

    def open(self) -> None:
        self.local_uninit = False

    def flow(self, n: int) -> None:
        self.granted.append(n)
        self.credit += n


def test_an_incoming_link_gets_the_configured_credit_window_topped_up_at_half() -> None:
    """`mesh_link_credit`: a long link needs more than the default 5,000 frames per round trip."""
    from types import SimpleNamespace

    from oncemesh.interrouter.links import CREDIT_WINDOW, Peer, PeerHandler

    frames: list[bytes] = []
    handler = PeerHandler("A", "1", {"B"}, lambda p: None, lambda p, f: frames.append(f), lambda p, c: None,
                          verify_identity=False, credit_window=40)
    conn = SimpleNamespace()
    conn.ctx = Peer(conn, "B", "2")  # type: ignore[arg-type]
    link = _FakeLink(conn)
    handler.on_link_open(link)  # type: ignore[arg-type]
    assert link.granted == [40]
    for i in range(21):  # 40 -> 19 left: below half, topped up to 40 again
        link.credit -= 1
        handler.on_message(link, None, b"", b"f%d" % i, True)  # type: ignore[arg-type]
    assert link.granted == [40, 21] and link.credit == 40 and len(frames) == 21
    assert PeerHandler("A", "1", set(), print, print, print).credit_window == CREDIT_WINDOW == 5000
