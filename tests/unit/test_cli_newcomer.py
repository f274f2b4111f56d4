"""The command line as a newcomer meets it (issue 31, items 9 and 12): what it says, and how it
ends, where it used to say nothing, the wrong thing, or a traceback. No router needed."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from oncemesh.cli import build_parser
from oncemesh.clients.state import ClientState
from oncemesh.router.management import not_ready_reasons
from oncemesh.topology.launcher import RouterState, RouterStatus, format_table

LINE3 = Path(__file__).resolve().parents[2] / "topology" / "examples" / "line3.toml"


def oncemesh(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncemesh", *args], capture_output=True, text=True, timeout=60,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL, cwd=cwd)


def test_get_from_a_subscription_this_state_does_not_hold_says_so_and_makes_none(tmp_path: Path) -> None:
    state = ClientState(tmp_path / "sub")
    state.remember_subscription("sid-1", "news", "s1", 60.0)
    state.close()
    # (the URL has no router: the answer comes before any connection)
    p = oncemesh("get", "news", "--subscription", "s1", "--url", "amqp://127.0.0.1:1", "--state-dir",
                 str(tmp_path / "other"), "--connect-timeout", "1")
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert "no subscription 's1' on 'news'" in p.stderr and "oncemesh subscribe news --subscription s1" in p.stderr
    assert "--state-dir" in p.stderr and not (tmp_path / "other").exists()  # (and no state made by asking)
    p = oncemesh("get", "sport", "--subscription", "s1", "--url", "amqp://127.0.0.1:1", "--state-dir",
                 str(tmp_path / "sub"), "--connect-timeout", "1")
    assert p.returncode == 2 and "it has 's1' on 'news'" in p.stderr, p.stderr
    # the state that holds it goes on to connect (and here finds no router)
    p = oncemesh("get", "news", "--subscription", "s1", "--url", "amqp://127.0.0.1:1", "--state-dir",
                 str(tmp_path / "sub"), "--connect-timeout", "1")
    assert p.returncode == 1 and "no router reachable" in p.stderr, p.stderr


def _actions(parser: argparse.ArgumentParser, path: str = "oncemesh") -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _actions(sub, f"{path} {name}")
        else:
            out.append((path, action))
    return out


def test_every_option_and_argument_says_what_it_is() -> None:
    parser = build_parser()
    bare = [f"{path}: {a.option_strings or a.dest}" for path, a in _actions(parser)
            if not a.help and not isinstance(a, argparse._HelpAction)]
    assert bare == []
    names = {path.split()[1] for path, _ in _actions(parser) if " " in path}
    assert {"put", "get", "subscribe", "stat", "user", "demo", "up"} <= names  # (every command was looked at)


def test_version() -> None:
    p = oncemesh("--version")
    assert p.returncode == 0 and p.stdout.startswith("oncemesh ") and len(p.stdout.split()) >= 2, p


def test_stat_takes_connect_timeout_like_every_client_command_and_timeout_still() -> None:
    parser = build_parser("stat")
    assert parser.parse_args(["stat", "--url", "amqp://h:1", "--connect-timeout", "3"]).timeout == 3.0
    assert parser.parse_args(["stat", "--url", "amqp://h:1", "--timeout", "4"]).timeout == 4.0


def test_user_add_at_the_end_of_input_says_so_without_a_traceback(tmp_path: Path) -> None:
    p = oncemesh("user", "add", "alice", "--users-file", str(tmp_path / "users.json"))  # (stdin: /dev/null)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "input ended" in p.stderr, p.stderr
    assert not (tmp_path / "users.json").exists()


def test_output_cut_short_by_its_reader_ends_quietly() -> None:
    read, write = os.pipe()
    os.close(read)  # (the reader is gone before the first line: `oncemesh ... | head -0`)
    try:
        p = subprocess.run([sys.executable, "-m", "oncemesh", "up", "--check", str(LINE3)], stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
    assert p.returncode == 141


def test_up_checks_the_files_a_topology_names_before_starting_any_router(tmp_path: Path) -> None:
    topo = tmp_path / "bad.toml"
    topo.write_text('[mesh]\nname = "bad"\n[routers.A]\nlisten = "127.0.0.1:0"\ninter_router = "127.0.0.1:0"\n'
                    '[routers.A.settings]\npolicy_file = "no-such-policy.json"\n')
    p = oncemesh("up", str(topo), "--state-dir", str(tmp_path / "mesh"), "--timeout", "30")
    assert p.returncode == 2 and "no-such-policy.json" in p.stderr and "no router started" in p.stderr, p.stderr
    assert not (tmp_path / "mesh").exists()


def test_the_router_view_says_not_ready_for_what_keeps_it_from_ready_only() -> None:
    calm = {"table_synced": True, "log_writable": True, "accepting_publishers": True, "draining": False,
            "peers_known": True, "mesh_converged": False, "peers": ["B"]}
    assert not_ready_reasons(calm) == []
    assert not_ready_reasons({**calm, "draining": True, "accepting_publishers": False}) == ["draining"]
    assert not_ready_reasons({**calm, "table_synced": False}) == ["table_synced"]


def test_status_shows_where_metrics_are_served() -> None:
    table = format_table([RouterStatus("A", RouterState.RUNNING, 42, url="amqp://127.0.0.1:1", converged=True,
                                       http="127.0.0.1:9100"),
                          RouterStatus("B", RouterState.STOPPED)])
    header, a, b = table.splitlines()
    assert "METRICS" in header and "http://127.0.0.1:9100/metrics" in a
    assert "METRICS" not in format_table([RouterStatus("B", RouterState.STOPPED)])
