"""The router's operational log has a bound on disk: rotated at `router_log_bytes` into at most
`router_log_backups` older files, the oldest dropped (the settlement log has its own segments)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncemesh.router.config import RouterConfig
from oncemesh.router.server import configure_logging


@pytest.fixture
def restore_root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_the_operational_log_rotates_and_keeps_a_bounded_number_of_files(tmp_path: Path,
                                                                        restore_root_logging: None) -> None:
    configure_logging(tmp_path, "A", "INFO", max_bytes=4096, backups=2)
    log = logging.getLogger("oncemesh.router")
    for i in range(400):
        log.info("test.line n=%d %s", i, "x" * 40)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["A.router.log", "A.router.log.1", "A.router.log.2"]
    assert all((tmp_path / f).stat().st_size <= 4096 for f in files)
    last = json.loads((tmp_path / "A.router.log").read_text().splitlines()[-1])
    assert last["event"].startswith("test.line n=399 ") and last["router"] == "A"  # the newest lines stay


def test_rotation_is_on_by_default_and_zero_turns_it_off(tmp_path: Path, restore_root_logging: None) -> None:
    cfg = RouterConfig(id="A")
    assert cfg.router_log_bytes > 0 and cfg.router_log_backups > 0
    configure_logging(tmp_path, "A", "INFO", max_bytes=0)
    log = logging.getLogger("oncemesh.router")
    for i in range(200):
        log.info("test.line n=%d %s", i, "x" * 40)
    assert [p.name for p in tmp_path.iterdir()] == ["A.router.log"]


def test_stderr_can_carry_only_warnings_while_the_file_has_every_line(tmp_path: Path, restore_root_logging: None,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """With a log directory the router writes only warnings and errors to stderr (`--stderr-level`,
    default WARNING there): `oncemesh up` keeps stderr in ID.out, which does not rotate."""
    configure_logging(tmp_path, "A", "INFO", max_bytes=1 << 20, backups=1, stderr_level="WARNING")
    log = logging.getLogger("oncemesh.router")
    log.info("test.routine n=1")
    log.warning("test.problem n=2")
    err = capsys.readouterr().err
    assert "test.problem" in err and "test.routine" not in err
    events = [json.loads(x)["event"] for x in (tmp_path / "A.router.log").read_text().splitlines()]
    assert events == ["test.routine n=1", "test.problem n=2"]
    configure_logging(None, "A", "INFO")  # no directory: stderr is the log, every line
    log.info("test.routine n=3")
    assert "test.routine n=3" in capsys.readouterr().err
