"""Topology files: the model, and every mistake the loader must catch with its line number.

Pure: parse_topology on strings, no sockets, no processes.
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncemesh.topology.launcher import RouterState, RouterStatus, _lag_of, format_table
from oncemesh.topology.load import (
    TopologyError,
    connected_components,
    example_path,
    load_topology,
    parse_topology,
    with_overrides,
)
from oncemesh.topology.model import LinkSpec, Order, TopicSpec, TotalOrder

EXAMPLES = example_path()

LINE3 = """\
[mesh]
name = "t"

[routers.A]
listen = "127.0.0.1:0"
inter_router = "127.0.0.1:0"

[routers.B]
listen = "127.0.0.1:0"
inter_router = "127.0.0.1:0"

[routers.C]
listen = "127.0.0.1:0"
inter_router = "127.0.0.1:0"

[[links]]
between = ["A", "B"]

[[links]]
between = ["B", "C"]
"""


def errors(text: str, source: str = "<string>") -> list[str]:
    """The problems parse_topology reports for `text`, one `source:line: message` each."""
    with pytest.raises(TopologyError) as info:
        parse_topology(text, source)
    return str(info.value).splitlines()


def only_error(text: str) -> str:
    errs = errors(text)
    assert len(errs) == 1, errs
    return errs[0]


def routers(*ids: str, extra: str = "") -> str:
    return "".join(f'[routers.{r}]\nlisten = "127.0.0.1:0"\ninter_router = "127.0.0.1:0"\n{extra}\n' for r in ids)


def link(a: str, b: str, extra: str = "") -> str:
    return f'[[links]]\nbetween = ["{a}", "{b}"]\n{extra}\n'


# ---------------------------------------------------------------------- examples and defaults
@pytest.mark.parametrize("name", ["single", "line3", "triangle", "mesh4", "hubs"])
def test_each_example_loads_with_ports_0_on_loopback(name: str) -> None:
    t = load_topology(EXAMPLES / f"{name}.toml")
    assert t.name == name
    assert t.source == EXAMPLES / f"{name}.toml"
    assert nx.is_connected(t.graph())
    for r in t.routers.values():
        assert (r.host, r.port, r.inter_host, r.inter_port) == ("127.0.0.1", 0, "127.0.0.1", 0)


def test_examples_have_the_documented_shapes() -> None:
    shape = {n: sorted((lk.a, lk.b) for lk in load_topology(EXAMPLES / f"{n}.toml").links)
             for n in ("single", "line3", "triangle")}
    assert shape == {"single": [], "line3": [("A", "B"), ("B", "C")],
                     "triangle": [("A", "B"), ("A", "C"), ("B", "C")]}
    hubs = load_topology(EXAMPLES / "hubs.toml")
    assert hubs.neighbours("H1") == ("H2", "S11", "S12", "S13")
    assert hubs.neighbours("H2") == ("H1", "S21", "S22")
    assert all(len(hubs.neighbours(r)) == 1 for r in hubs.routers if r.startswith("S"))


def test_mesh4_shortest_paths_avoid_the_direct_links() -> None:
    g = load_topology(EXAMPLES / "mesh4.toml").graph()
    assert nx.shortest_path(g, "A", "D", weight="cost") == ["A", "B", "C", "D"]
    assert nx.shortest_path(g, "A", "C", weight="cost") == ["A", "B", "C"]
    assert nx.shortest_path(g, "B", "D", weight="cost") == ["B", "C", "D"]
    assert all(g.has_edge(a, b) for a, b in (("A", "D"), ("A", "C"), ("B", "D")))


def test_defaults_timing_cost_name_and_topics() -> None:
    t = parse_topology(routers("A", "B") + link("A", "B"))
    assert (t.name, t.hello_interval, t.dead_after) == ("mesh", 1.0, 3.0)
    assert t.links == (LinkSpec("A", "B", 1.0),)
    assert t.topic("anything") == TopicSpec("anything", Order.FIFO, None, None)
    assert t.source is None


def test_single_router_needs_no_inter_router_listener() -> None:
    t = parse_topology('[routers.A]\nlisten = "10.0.0.1:5672"\n')
    assert (t.routers["A"].inter_host, t.routers["A"].inter_port) == ("10.0.0.1", 0)
    assert t.neighbours("A") == ()


def test_ipv6_addresses() -> None:
    t = parse_topology('[routers.A]\nlisten = "[::1]:5672"\ninter_router = "[::1]:5673"\n')
    assert (t.routers["A"].host, t.routers["A"].port, t.routers["A"].listen) == ("::1", 5672, "[::1]:5672")


def test_inline_links_and_inline_router_tables() -> None:
    t = parse_topology('routers.A = { listen = "h:1", inter_router = "h:2" }\n'
                       'routers.B = { listen = "h:3", inter_router = "h:4" }\n'
                       'links = [{ between = ["B", "A"], cost = 2.5 }]\n')
    assert t.links == (LinkSpec("A", "B", 2.5),)


# ---------------------------------------------------------------------- model
def test_graph_carries_costs_and_every_router() -> None:
    t = load_topology(EXAMPLES / "mesh4.toml")
    g = t.graph()
    assert sorted(g.nodes) == ["A", "B", "C", "D"]
    assert g["A"]["D"]["cost"] == 5.0 and g["D"]["A"]["cost"] == 5.0
    assert g.number_of_edges() == 6
    g.remove_node("A")
    assert "A" in t.graph()  # each call is a fresh graph


def test_neighbours_sorted_and_unknown_router_named() -> None:
    t = parse_topology(LINE3)
    assert t.neighbours("B") == ("A", "C")
    assert t.neighbours("A") == ("B",)
    with pytest.raises(KeyError, match=r"router 'Z' is not in topology 't' \(routers: A, B, C\)"):
        t.neighbours("Z")


def test_router_settings_merge_defaults_with_the_routers_own() -> None:
    t = parse_topology("[defaults]\nmax_inflight_messages = 100\nidle_timeout = 4.0\n" + routers("A", "B")
                       + "[routers.B.settings]\nmax-inflight-messages = 7\n" + link("A", "B"))
    assert t.router_settings("A") == {"max_inflight_messages": 100, "idle_timeout": 4.0}
    assert t.router_settings("B") == {"max_inflight_messages": 7, "idle_timeout": 4.0}


def test_topic_settings() -> None:
    t = parse_topology(routers("A") + '[topics.orders]\norder = "total"\n[topics.votes]\norder = "total"\n'
                       'total = "lamport"\n[topics.inv]\norder = "causal"\ncausal_group = "shop"\n'
                       '[topics.plain]\n')
    assert t.topic("orders") == TopicSpec("orders", Order.TOTAL, TotalOrder.SEQUENCER)
    assert t.topic("votes").total is TotalOrder.LAMPORT
    assert t.topic("inv") == TopicSpec("inv", Order.CAUSAL, None, "shop")
    assert t.topic("plain").order == "fifo"


def test_a_topic_identified_by_message_id() -> None:
    t = parse_topology(routers("A") + '[topics.orders]\nidentity = "message-id"\n[topics.plain]\n')
    assert t.topic("orders").identity == "message-id" and t.topic("plain").identity == "tag"
    assert t.msgid_topics() == frozenset({"orders"})
    assert errors(routers("A") + '[topics.orders]\nidentity = "message_id"\n', "m.toml") == [
        "m.toml:6: topic 'orders': identity must be \"tag\" or \"message-id\", got the string 'message_id' "
        "(did you mean 'message-id'?)"]


def test_the_lexically_smaller_id_dials() -> None:
    t = parse_topology(routers("A", "B", "C") + link("C", "A") + link("B", "C"))
    assert t.dialer("A", "C") == t.dialer("C", "A") == "A"
    assert t.dialer("C", "B") == "B"
    with pytest.raises(ValueError, match="no link A–B"):
        t.dialer("A", "B")


# ---------------------------------------------------------------------- validation, with lines
def test_unknown_router_in_a_link_names_file_line_and_routers() -> None:
    text = LINE3 + "\n" + link("A", "D")  # the between line of the third link is line 23
    assert "mesh.toml:23: link A–D: unknown router 'D' (routers: A, B, C)" in errors(text, "mesh.toml")


def test_self_link() -> None:
    assert only_error(routers("A", "B") + link("A", "B") + link("B", "B")) == \
        "<string>:13: link B–B: a router cannot link to itself"


def test_duplicate_link_either_way_round() -> None:
    assert only_error(routers("A", "B") + link("A", "B") + link("B", "A")) == \
        "<string>:13: link B–A: duplicate of link A–B (line 9); give each pair of routers one link"


def test_duplicate_router_id_is_said_plainly() -> None:
    text = routers("A", "B") + link("A", "B") + routers("A")
    assert only_error(text) == "<string>:12: router 'A' is defined twice (first at line 1); router ids must be unique"


def test_other_toml_duplicates_and_syntax_errors_keep_their_line() -> None:
    assert only_error('[mesh]\nname = "x"\n[mesh]\n') == \
        "<string>:3: table [mesh] is declared twice (first at line 1); merge the two"
    assert only_error(routers("A").replace('listen = "127.0.0.1:0"\n', 'listen = "a:1"\nlisten = "a:2"\n')) == \
        "<string>:3: key 'listen' is set twice in the same table"
    assert only_error('[mesh]\nname = \n') == "<string>:2:8: invalid TOML: Invalid value"


@pytest.mark.parametrize(("a", "b", "line", "message"), [
    ('listen = "127.0.0.1:5000"', 'listen = "127.0.0.1:5000"', 5,
     "router B: listen 127.0.0.1:5000 clashes with router A's listen 127.0.0.1:5000 (line 2)"),
    ('inter_router = "10.0.0.1:6000"', 'inter_router = "10.0.0.1:6000"', 6,
     "router B: inter_router 10.0.0.1:6000 clashes with router A's inter_router 10.0.0.1:6000 (line 3)"),
    ('inter_router = "127.0.0.1:5000"', 'listen = "127.0.0.1:5000"', 5,
     "router B: listen 127.0.0.1:5000 clashes with router A's inter_router 127.0.0.1:5000 (line 3)"),
    ('listen = "0.0.0.0:5000"', 'inter_router = "10.1.2.3:5000"', 6,
     "router B: inter_router 10.1.2.3:5000 clashes with router A's listen 0.0.0.0:5000 (line 2)"),
    ('listen = "localhost:5000"', 'listen = "127.0.0.1:5000"', 5,
     "router B: listen 127.0.0.1:5000 clashes with router A's listen localhost:5000 (line 2)"),
])
def test_duplicate_addresses(a: str, b: str, line: int, message: str) -> None:
    def router(rid: str, override: str) -> str:
        lines = {"listen": 'listen = "127.0.0.1:0"', "inter_router": 'inter_router = "127.0.0.1:0"'}
        lines[override.split(" ")[0]] = override
        return f"[routers.{rid}]\n{lines['listen']}\n{lines['inter_router']}\n"
    assert only_error(router("A", a) + router("B", b) + link("A", "B")) == f"<string>:{line}: {message}"


def test_same_router_listen_and_inter_router_clash_but_port_0_never_does() -> None:
    assert only_error('[routers.A]\nlisten = "h:7"\ninter_router = "h:7"\n') == \
        "<string>:3: router A: listen and inter_router are both h:7"
    parse_topology(routers("A", "B", "C") + link("A", "B") + link("B", "C"))  # all on 127.0.0.1:0


@pytest.mark.parametrize(("value", "message"), [
    ('"127.0.0.1"', "router A: listen '127.0.0.1' is not HOST:PORT"),
    ('":5672"', "router A: listen ':5672' is not HOST:PORT"),
    ('"h:port"', "router A: listen 'h:port': port 'port' is not a number"),
    ('"h:65536"', "router A: listen 'h:65536': port 65536 is out of range 0..65535"),
    ('"h:-1"', "router A: listen 'h:-1': port '-1' is not a number"),
    ("5672", 'router A: listen must be a string "HOST:PORT", got the number 5672'),
])
def test_bad_addresses(value: str, message: str) -> None:
    assert only_error(f"[routers.A]\nlisten = {value}\n").startswith(f"<string>:2: {message}")


def test_missing_listeners() -> None:
    errs = errors('[routers.A]\ninter_router = "h:1"\n[routers.B]\nlisten = "h:2"\n' + link("A", "B"))
    assert errs[0].startswith("<string>:1: router A: listen is missing: give HOST:PORT")
    assert errs[1].startswith("<string>:3: router B: inter_router is missing")


@pytest.mark.parametrize(("cost", "shown"), [("0", "the number 0"), ("-2", "the number -2"),
                                             ('"1"', "the string '1'"), ("true", "the boolean true"),
                                             ("inf", "the number inf"), ("nan", "the number nan")])
def test_bad_costs(cost: str, shown: str) -> None:
    assert only_error(routers("A", "B") + link("A", "B", f"cost = {cost}")) == \
        f"<string>:11: link A–B: cost must be a positive number, got {shown}"


@pytest.mark.parametrize("between", ['["A"]', '["A", "B", "C"]', '"A-B"', "[1, 2]"])
def test_malformed_between(between: str) -> None:
    assert only_error(routers("A", "B") + f"[[links]]\nbetween = {between}\n").startswith(
        "<string>:10: link #1: between must be two router ids")


def test_disconnected_mesh_names_its_parts() -> None:
    text = routers("A", "B", "C", "D", "E") + link("A", "B") + link("C", "D")
    assert only_error(text) == (
        "<string>:9: the mesh is not connected: 3 separate parts {A, B}, {C, D} and {E}; add links so that "
        "every router can reach every other (e.g. between = [\"B\", \"C\"])")


@pytest.mark.parametrize(("text", "message"), [
    ("[mesh]\nhelo_interval = 2\n" + routers("A"),
     "<string>:2: unknown key 'helo_interval' in [mesh] (did you mean 'hello_interval'?)"),
    ('[mesh]\ncolour = "red"\n' + routers("A"),
     "<string>:2: unknown key 'colour' in [mesh] (valid: dead_after, hello_interval, name)"),
    ("[router.A]\n" + routers("A"), "<string>:1: unknown key 'router' at the top level (did you mean 'routers'?)"),
    (routers("A").replace("inter_router", "inter-router"),
     "<string>:3: unknown key 'inter-router' in [routers.A] (did you mean 'inter_router'?)"),
    (routers("A", "B") + link("A", "B", "costs = 2"),
     "<string>:11: unknown key 'costs' in link A–B (did you mean 'cost'?)"),
    (routers("A") + '[topics.t]\nordering = "fifo"\n',
     "<string>:6: unknown key 'ordering' in [topics.t] (did you mean 'order'?)"),
    ("[defaults]\nmax_inflight_mesages = 5\n" + routers("A"),
     "<string>:2: [defaults]: unknown setting 'max_inflight_mesages' (did you mean 'max_inflight_messages'?)"),
    (routers("A") + "[routers.A.settings]\nidle_timeot = 1\n",
     "<string>:6: [routers.A.settings]: unknown setting 'idle_timeot' (did you mean 'idle_timeout'?)"),
])
def test_unknown_keys_anywhere_with_a_suggestion(text: str, message: str) -> None:
    assert only_error(text) == message


@pytest.mark.parametrize(("setting", "message"), [
    ('max_inflight_messages = "lots"',
     "[defaults]: setting max_inflight_messages must be a whole number >= 0, got the string 'lots'"),
    ("max_inflight_messages = 1.5",
     "[defaults]: setting max_inflight_messages must be a whole number >= 0, got the number 1.5"),
    ("idle_timeout = -1", "[defaults]: setting idle_timeout must be a number >= 0, got the number -1"),
    ("idle_timeout = true", "[defaults]: setting idle_timeout must be a number >= 0, got the boolean true"),
    ('state_dir = "/x"', "'state_dir' cannot be set in [defaults]: it is per process: oncemesh router --state-dir"),
    ('listen = "h:1"', "'listen' cannot be set in [defaults]: give the client listener as listen"),
])
def test_bad_settings(setting: str, message: str) -> None:
    assert only_error(f"[defaults]\n{setting}\n" + routers("A")).startswith(f"<string>:2: {message}")


def test_good_settings_of_router_and_core_are_accepted() -> None:
    t = parse_topology("[defaults]\nidle_timeout = 5\nmax_frame = 65536\nlink_credit = 100\n" + routers("A"))
    assert t.router_settings("A") == {"idle_timeout": 5, "max_frame": 65536, "link_credit": 100}


@pytest.mark.parametrize(("body", "message"), [
    ('order = "totl"', "topic 'x': order must be \"fifo\", \"causal\" or \"total\", got the string 'totl' "
                       "(did you mean 'total'?)"),
    ('order = 3', "topic 'x': order must be \"fifo\", \"causal\" or \"total\", got the number 3"),
    ('total = "lamport"', "topic 'x': total = 'lamport' only applies with order = \"total\" (order is \"fifo\")"),
    ('order = "total"\ntotal = "paxos"', "topic 'x': total must be \"sequencer\" or \"lamport\", got the string 'paxos'"),
    ('order = "total"\ncausal_group = "g"', "topic 'x': causal_group only applies with order = \"causal\""),
    ('order = "causal"\ncausal_group = ""', "topic 'x': causal_group must be a non-empty name"),
])
def test_bad_topic_settings(body: str, message: str) -> None:
    err = only_error(routers("A") + f"[topics.x]\n{body}\n")
    assert err.split(": ", 1)[1].startswith(message), err
    assert err.startswith(f"<string>:{6 + body.count(chr(10))}:")


def test_reserved_topic_names() -> None:
    assert only_error(routers("A") + '[topics."$sys"]\n') == \
        "<string>:5: topic '$sys': addresses starting with '$' or '_' (or empty) are reserved for the routers"


@pytest.mark.parametrize(("mesh", "message"), [
    ("hello_interval = 0", "<string>:2: mesh.hello_interval must be a positive number of seconds, got the number 0"),
    ('dead_after = "3s"', "<string>:2: mesh.dead_after must be a positive number of seconds, got the string '3s'"),
    ("hello_interval = 2.0\ndead_after = 2.0", "<string>:3: mesh.dead_after (2 s) must be longer than "
                                               "mesh.hello_interval (2 s), or routers are declared dead "
                                               "between two hellos"),
    ("name = 7", "<string>:2: mesh.name must be a non-empty string, got the number 7"),
])
def test_bad_mesh_settings(mesh: str, message: str) -> None:
    assert only_error(f"[mesh]\n{mesh}\n" + routers("A")) == message


def test_bad_router_ids_and_no_routers() -> None:
    assert only_error('[routers."a b"]\nlisten = "h:0"\n').startswith("<string>:1: router id 'a b' is not valid")
    assert only_error('[mesh]\nname = "x"\n').startswith("<string>:1: no routers: add at least one")
    assert only_error('routers = 3\n') == "<string>:1: routers must be a table, got the number 3"


def test_all_problems_at_once_in_line_order() -> None:
    text = ('[mesh]\nhello_interval = -1\n' + routers("A", "B") + link("A", "Q") + link("A", "B", "cost = 0"))
    lines = [e.split(":")[1] for e in errors(text)]
    assert lines == ["2", "12", "16"]


def test_inline_array_of_links_reports_the_elements_line() -> None:
    text = 'links = [\n  { between = ["A", "B"] },\n  { between = ["A", "Z"] },\n]\n' + routers("A", "B")
    assert only_error(text) == "<string>:3: link A–Z: unknown router 'Z' (routers: A, B)"


def test_unreadable_file_is_a_topology_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(TopologyError, match=r"nope\.toml:1: cannot read topology file: No such file"):
        load_topology(missing)
    bad = tmp_path / "bad.toml"
    bad.write_text(routers("A") + link("A", "X"))
    with pytest.raises(TopologyError, match=r"bad\.toml:6: link A–X: unknown router 'X'") as info:
        load_topology(bad)
    assert info.value.source == str(bad) and info.value.line == 6


# ---------------------------------------------------------------------- properties
IDS = [f"R{i}" for i in range(8)]


@st.composite
def graphs(draw: st.DrawFn) -> tuple[list[str], list[tuple[str, str]]]:
    nodes = draw(st.lists(st.sampled_from(IDS), min_size=1, max_size=8, unique=True))
    pairs = [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:]]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    return nodes, edges


@given(graphs())
@settings(max_examples=200, deadline=None)
def test_connected_components_agree_with_networkx(graph: tuple[list[str], list[tuple[str, str]]]) -> None:
    nodes, edges = graph
    g = nx.Graph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    expected = sorted(tuple(sorted(c)) for c in nx.connected_components(g))
    assert connected_components(nodes, edges) == expected


@given(graphs(), st.data())
@settings(max_examples=100, deadline=None)
def test_loader_accepts_exactly_the_connected_meshes(graph: tuple[list[str], list[tuple[str, str]]],
                                                     data: st.DataObject) -> None:
    nodes, edges = graph
    costs = [data.draw(st.integers(1, 9)) for _ in edges]
    text = routers(*nodes) + "".join(link(a, b, f"cost = {c}") for (a, b), c in zip(edges, costs, strict=True))
    g = nx.Graph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    if nx.is_connected(g):
        t = parse_topology(text)
        assert {(lk.a, lk.b): lk.cost for lk in t.links} == \
            {tuple(sorted(e)): float(c) for e, c in zip(edges, costs, strict=True)}
        assert {tuple(sorted(e)) for e in t.graph().edges} == {tuple(sorted(e)) for e in g.edges}
    else:
        (err,) = errors(text)
        assert "the mesh is not connected" in err


@given(st.lists(st.sampled_from(IDS), min_size=2, max_size=6, unique=True), st.data())
@settings(max_examples=100, deadline=None)
def test_an_unknown_key_is_reported_on_its_own_line(nodes: list[str], data: st.DataObject) -> None:
    victim = data.draw(st.sampled_from(nodes))
    text = routers(*nodes) + "".join(link(a, b) for a, b in zip(nodes, nodes[1:], strict=False))
    lines = text.splitlines()
    at = lines.index(f"[routers.{victim}]") + data.draw(st.integers(1, 2))
    lines.insert(at, "# a comment\nbogus = [1,\n  2]")
    err = only_error("\n".join(lines) + "\n")
    assert err.startswith(f"<string>:{at + 2}: unknown key 'bogus' in [routers.{victim}]")


# awkward but valid TOML around the tables: strings holding '#', brackets, quotes and escapes
TRICKY = st.text(alphabet=st.sampled_from(list("ab #[]{}=,.'\"\\\t") + ["é", "\u2013"]), max_size=12)


def _basic(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t") + '"'


@st.composite
def layouts(draw: st.DrawFn) -> tuple[str, dict[str, int]]:
    """A valid 3-router line topology written in a random layout, and the line of each marker:
    `bad_key` (an unknown key in router B) and `bad_link` (a link to an unknown router)."""
    name = "n" + draw(TRICKY)
    out: list[str] = []
    marks: dict[str, int] = {}

    def emit(text: str, mark: str | None = None) -> None:
        if mark:
            marks[mark] = len(out) + 1 + text[:text.index(mark)].count("\n")
        out.extend(text.split("\n"))

    emit(f"# {draw(TRICKY)}")
    inline_links = draw(st.booleans())
    if inline_links:  # top-level keys come before the first table
        emit('links = [  # the links\n  { between = ["A", "B"] },\n  { between = ["B", "C"], cost = 2.5 }, '
             '# ,]\n  { between = ["C", "Q"] },', "Q")
        marks["bad_link"] = marks.pop("Q")
        emit("]")
    if draw(st.booleans()):
        emit(f"[mesh]\nname = {_basic(name)}  # {draw(TRICKY)}")
    elif "'" not in name:
        emit(f"mesh = {{ name = \'\'\'{name}\'\'\' }}")
    else:
        emit(f"mesh.name = {_basic(name)}")
    inline = [rid for rid in "AC" if draw(st.booleans())]
    if inline:
        emit("[routers]")
        for rid in inline:
            emit(f'{rid} = {{ listen = "127.0.0.1:0", inter_router = "127.0.0.1:0" }}  # {_basic(draw(TRICKY))}')
    for rid in sorted(set("ABC") - set(inline)):
        emit(f"[routers.{rid}]  # {_basic(draw(TRICKY))}")
        emit('listen = "127.0.0.1:0"\n"inter_router" = "127.0.0.1:0"')
        if rid == "B":
            emit(f"bad_key = {_basic(draw(TRICKY))}", "bad_key")
        emit(f"[routers.{rid}.settings]\nlink_credit = {draw(st.integers(1, 999))}")
    if not inline_links:
        emit('[[links]]\nbetween = ["A", "B"]\n\n[[links]]\nbetween = [\n  "B",\n  "C",\n]\n[[links]]')
        emit('between = ["C", "Q"]', "between")
        marks["bad_link"] = marks.pop("between")
    return "\n".join(out) + "\n", marks


@given(layouts())
@settings(max_examples=150, deadline=None)
def test_lines_are_right_whatever_the_layout(layout: tuple[str, dict[str, int]]) -> None:
    text, marks = layout
    assert "B" in parse_topology(text.replace("bad_key", "# bad_key").replace('"Q"', '"A"')).routers
    errs = errors(text)
    assert errs == [
        f"<string>:{marks['bad_key']}: unknown key 'bad_key' in [routers.B] (valid: inter_router, listen, settings)",
        f"<string>:{marks['bad_link']}: link C–Q: unknown router 'Q' (routers: A, B, C)",
    ] or errs == [  # when the links come first
        f"<string>:{marks['bad_link']}: link C–Q: unknown router 'Q' (routers: A, B, C)",
        f"<string>:{marks['bad_key']}: unknown key 'bad_key' in [routers.B] (valid: inter_router, listen, settings)",
    ], text


def test_status_lists_topic_orders_and_the_sequencer_the_routers_see() -> None:
    from oncemesh.topology.launcher import RouterState, RouterStatus, format_topics

    topo = parse_topology(
        '[routers.A]\nlisten = "127.0.0.1:0"\ninter_router = "127.0.0.1:0"\n'
        '[routers.B]\nlisten = "127.0.0.1:0"\ninter_router = "127.0.0.1:0"\n'
        '[[links]]\nbetween = ["A", "B"]\n'
        '[topics.ledger]\norder = "total"\n[topics.shop]\norder = "causal"\n')

    def status_of(rid: str, leader: str, n: int) -> RouterStatus:
        return RouterStatus(rid, RouterState.RUNNING, order={"ledger": {"sequencer": leader, "numbered": n}})

    agreed = format_topics(topo, [status_of("A", "B", 7), status_of("B", "B", 9)])
    assert "topic ledger: order total (sequencer); sequencer B, numbered 9" in agreed
    assert "topic shop: order causal" in agreed and "not enforced" not in agreed
    split = format_topics(topo, [status_of("A", "A", 3), status_of("B", "B", 3)])
    assert "sequencer A at A; B at B, numbered 3" in split


def test_status_lists_the_lamport_view_the_routers_see() -> None:
    from oncemesh.topology.launcher import RouterState, RouterStatus, format_topics

    topo = parse_topology(
        '[routers.A]\nlisten = "127.0.0.1:0"\ninter_router = "127.0.0.1:0"\n'
        '[routers.B]\nlisten = "127.0.0.1:0"\ninter_router = "127.0.0.1:0"\n'
        '[[links]]\nbetween = ["A", "B"]\n'
        '[topics.ledger]\norder = "total"\ntotal = "lamport"\n')

    def status_of(rid: str, view: list[object] | None, state: str, n: int) -> RouterStatus:
        return RouterStatus(rid, RouterState.RUNNING, order={"ledger": {
            "algorithm": "lamport", "view": view, "members": ["A", "B"], "state": state, "numbered": n}})

    agreed = format_topics(topo, [status_of("A", [3, "A"], "normal", 5), status_of("B", [3, "A"], "normal", 5)])
    assert "topic ledger: order total (lamport); Lamport view 3.A of A,B, numbered 5" in agreed
    split = format_topics(topo, [status_of("A", [3, "A"], "frozen", 5), status_of("B", None, "frozen", 0)])
    assert "Lamport joining at B; view 3.A of A,B (changing) at A, numbered 5" in split


def test_status_table_shows_each_routers_loop_lag() -> None:
    lag = _lag_of({"loop_lag_max_ms": 812.4, "loop_lag_p99_ms": 3.2})
    table = format_table([RouterStatus("A", RouterState.RUNNING, 42, url="amqp://127.0.0.1:1", converged=True,
                                       loop_lag_ms=lag),
                          RouterStatus("B", RouterState.STOPPED)])
    header, a, b = table.splitlines()
    assert "LOOP LAG MAX/P99" in header and "812/3 ms" in a and " - " in b
    assert _lag_of({}) is None


def test_overrides_set_mesh_and_default_keys_over_the_files_and_are_checked(tmp_path: Path) -> None:
    """`with_overrides` (`oncemesh bench --set` on a topology): [mesh] keys and [defaults] settings
    replace the file's, a [defaults] table is added where the file has none, text that reads as a
    number stays a number (--set gives text), a router's own settings still win, and the copy is
    checked like any topology file."""
    src = tmp_path / "t.toml"
    src.write_text((EXAMPLES / "line3.toml").read_text() + '\n[routers.B.settings]\nidle_timeout = 7.0\n')
    t = load_topology(with_overrides(src, tmp_path / "o.toml", mesh={"dead_after": 60.0},
                                     defaults={"idle_timeout": "30", "mesh_protocol_version": "5"}))
    assert (t.hello_interval, t.dead_after) == (1.0, 60.0)  # (line3 sets dead_after 3.0: replaced)
    assert t.router_settings("A") == {"idle_timeout": 30, "mesh_protocol_version": 5}
    assert t.router_settings("B")["idle_timeout"] == 7.0
    twice = with_overrides(tmp_path / "o.toml", tmp_path / "p.toml", defaults={"idle_timeout": 9})
    assert load_topology(twice).router_settings("A")["idle_timeout"] == 9  # (an existing [defaults] key replaced)
    with pytest.raises(TopologyError, match="no_such_setting"):
        with_overrides(src, tmp_path / "bad.toml", defaults={"no_such_setting": 1})
