"""The product apart from its tools: what a router process, `import oncemesh`, the client and the
sans-IO core load, each seen in a fresh interpreter's `sys.modules`.

- `import oncemesh` and the client load no tool (`oncemesh.harness`: bench, chaos, demo, soak, ...)
  and nothing of Spark; `import oncemesh` alone loads not even the client (Proton, tenacity) until one
  of its names is used.
- `import oncemesh.router.core` loads no Proton and no tenacity: the core is sans-IO.
- A real `oncemesh router` process loads no tool and nothing of Spark: the command line imports only
  the module of the subcommand it runs (`oncemesh.cli.COMMANDS`).
- Without pyspark (an extra, `oncemesh[spark]`), the commands that judge say how to install it.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from oncemesh import cli
from oncemesh.harness.procs import Proc, read_json, wait_for

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("oncemesh.harness", "oncemesh.spark", "pyspark")
PROTON = ("proton", "cproton", "_cproton", "cproton_ffi", "tenacity")


def loaded_by(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running `code`."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print('\\n'.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return out.split()


def among(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def test_import_oncemesh_and_the_client_load_no_tool_no_spark_and_the_client_only_when_used() -> None:
    bare = loaded_by("import oncemesh")
    assert not among(bare, TOOLS + PROTON + ("oncemesh.clients",)), among(bare, TOOLS + PROTON + ("oncemesh.clients",))
    used = loaded_by("import oncemesh, oncemesh.clients; oncemesh.connect; from oncemesh import AsyncClient, Client")
    assert {"oncemesh.clients.blocking", "oncemesh.clients.runtime", "proton", "tenacity"} <= set(used)
    assert not among(used, TOOLS), among(used, TOOLS)


def test_the_sans_io_core_loads_no_proton_and_no_tenacity() -> None:
    got = loaded_by("import oncemesh.router.core")
    assert "oncemesh.router.core" in got
    assert not among(got, PROTON), among(got, PROTON)
    assert not among(got, TOOLS + ("oncemesh.clients",)), among(got, TOOLS + ("oncemesh.clients",))


# Runs `python -m oncemesh ARGS...` and, at exit, writes the modules the process had loaded to OUT.
ROUTER_WRAPPER = textwrap.dedent("""\
    import atexit, runpy, sys
    out = sys.argv.pop(1)
    atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
    runpy.run_module("oncemesh", run_name="__main__", alter_sys=True)
""")


def test_a_router_process_loads_no_tool_and_nothing_of_spark(tmp_path: Path) -> None:
    out, ready = tmp_path / "modules.txt", tmp_path / "A.ready.json"
    proc = Proc([sys.executable, "-c", ROUTER_WRAPPER, str(out), "router", "--id", "A", "--listen", "127.0.0.1:0",
                 "--state-dir", str(tmp_path / "state"), "--log-dir", str(tmp_path / "logs"),
                 "--ready-file", str(ready), "--allow-anonymous"], tmp_path / "A.out")
    try:
        wait_for(lambda: not proc.alive() or (read_json(ready) or {}).get("pid") == proc.pid, 30,
                 "the router's ready file")
        assert proc.alive(), proc.tail()
        proc.signal(signal.SIGTERM)  # a clean stop: the handler ends the loop, atexit writes the list
        assert proc.wait(30) == 0, proc.tail()
    finally:
        proc.kill()
    modules = out.read_text().split()
    assert "oncemesh.router.server" in modules  # (it ran a router)
    others = ("oncemesh.clients.cli", "oncemesh.clients.stat", "oncemesh.topology.launcher",
              "oncemesh.topology.check")  # other subcommands' modules (router.users: the users file)
    assert not among(modules, TOOLS + others), among(modules, TOOLS + others)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_subcommand_is_in_the_table_and_its_help_is_the_same_when_loaded_alone() -> None:
    every = subcommands(cli.build_parser())
    assert list(every) == ["router", *(name for _, names in cli.COMMANDS for name in names)]
    for name, parser in every.items():
        alone = subcommands(cli.build_parser(name))
        assert alone[name].format_help() == parser.format_help(), name
        assert set(alone) <= {"router", *next((n for _, n in cli.COMMANDS if name in n), ())}, name


def test_pyspark_is_an_extra_that_the_test_extra_includes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("pyspark")]  # a router host
    extras = project["optional-dependencies"]
    assert [d for d in extras["spark"] if d.lower().startswith("pyspark")]
    assert [d for d in extras["test"] if d.lower().startswith("pyspark")]  # the README's two commands


WITHOUT_PYSPARK = "import sys; sys.modules['pyspark'] = None; from oncemesh.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize("command", [["reconcile"], ["audit"], ["chaos", "line3", "--duration", "1"]])
def test_a_command_that_judges_says_how_to_install_pyspark_when_it_is_missing(
        command: list[str], tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "A.settlement.jsonl").write_text(json.dumps({"v": 1, "ts": 1.0, "src": "router", "ev": "started"}) + "\n")
    args = [*command, str(logs)] if command[0] != "chaos" else [*command, "--state-dir", str(tmp_path / "run")]
    r = subprocess.run([sys.executable, "-c", WITHOUT_PYSPARK, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "pip install 'oncemesh[spark]'" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()  # (chaos: nothing started)


def test_bench_and_soak_check_for_matplotlib_without_pyspark() -> None:
    r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['pyspark'] = None\n"
                        "from oncemesh.harness import soak; from oncemesh.spark import chart\n"
                        "print(chart.available(), soak.chart_available())"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["True", "True"], r.stderr


def test_a_path_that_meets_no_pyspark_midway_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def needs(name: str) -> None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    parser = argparse.ArgumentParser(prog="oncemesh")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("judge").set_defaults(func=lambda args: needs("pyspark.sql"))
    sub.add_parser("other").set_defaults(func=lambda args: needs("nosuchmodule"))
    monkeypatch.setattr(cli, "build_parser", lambda command=None: parser)
    monkeypatch.setitem(sys.modules, "pyspark", None)  # (not installed, as far as find_spec can tell)
    assert cli.main(["judge"]) == 2
    assert "oncemesh judge needs pyspark" in capsys.readouterr().err
    with pytest.raises(ModuleNotFoundError):  # any other missing module is a bug: its traceback shows
        cli.main(["other"])
