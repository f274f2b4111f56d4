"""The Spark JVM's class archive (spark/classarchive.py): made once by a short reconcile, adopted
only when whole, mapped by the sessions after it, and never a reason for a run to fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oncemesh.spark import classarchive as CA

JAVA = shutil.which("java")
pytestmark = pytest.mark.skipif(JAVA is None, reason="needs java")


@pytest.fixture
def archive_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "archives"
    monkeypatch.setenv(CA.DIR_ENV, str(d))
    monkeypatch.delenv(CA.ENABLED_ENV, raising=False)
    return d


def test_flags_make_one_when_asked_then_map_it(archive_dir: Path) -> None:
    assert CA.flags(make=False) == ("", None)  # nothing to map, not asked to make one
    jvm, part = CA.flags(make=True)
    assert part is not None and part.parent == archive_dir and part.name.endswith(CA.PART)
    assert f"-XX:ArchiveClassesAtExit={part}" in jvm
    target = CA.archive()
    assert target is not None and CA.target_of(part) == target
    target.write_bytes(b"x")
    jvm, part = CA.flags(make=True)
    assert part is None and f"-XX:SharedArchiveFile={target}" in jvm and CA.QUIET in jvm


def test_turned_off_maps_and_makes_nothing(archive_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CA.ENABLED_ENV, "0")
    assert CA.archive() is None
    assert CA.flags(make=True) == ("", None)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_whole_archive_is_adopted_and_a_torn_one_is_not(archive_dir: Path, tmp_path: Path) -> None:
    assert JAVA is not None
    archive_dir.mkdir(parents=True)
    target = CA.archive()
    assert target is not None
    # a real archive: a JVM that writes one at exit (the classes of `java -version`)
    part = target.with_name(f".{target.name}.1-1{CA.PART}")
    made = subprocess.run([JAVA, f"-XX:ArchiveClassesAtExit={part}", "-cp", str(tmp_path), "-version"],
                          capture_output=True, timeout=120)
    assert made.returncode == 0 and part.stat().st_size > 0, made.stderr
    torn = target.with_name(f".{target.name}.2-2{CA.PART}")
    torn.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    # a torn archive crashes a JVM that maps it: never adopted, and removed
    assert not CA.adopt(_dead_pid(), torn, JAVA, str(tmp_path), wait=5)
    assert not torn.exists() and not target.exists()
    assert not list(Path.cwd().glob("hs_err_pid*.log"))  # the crash it made left no report behind
    olds = [archive_dir / f"{CA.PREFIX}old{i}.jsa" for i in range(CA.KEEP + 1)]
    for i, old in enumerate(olds):  # archives of other places of the jars, oldest first
        old.write_bytes(b"old")
        os.utime(old, (1_000_000 + i, 1_000_000 + i))
    assert CA.adopt(_dead_pid(), part, JAVA, str(tmp_path), wait=5)
    assert target.is_file() and not part.exists()
    # at most KEEP archives stay: the adopted one and the newest others
    assert sorted(archive_dir.glob("*.jsa")) == sorted([target, *olds[-(CA.KEEP - 1):]])
    # a JVM maps it and runs
    ran = subprocess.run([JAVA, f"-XX:SharedArchiveFile={target}", "-Xshare:on", "-cp", str(tmp_path), "-version"],
                         capture_output=True, timeout=120)
    assert ran.returncode == 0, ran.stderr


def test_a_live_jvm_is_waited_for(archive_dir: Path, tmp_path: Path) -> None:
    archive_dir.mkdir(parents=True)
    part = archive_dir / f".spark-classes-x.jsa.3-3{CA.PART}"
    part.write_bytes(b"not yet")
    assert not CA.adopt(os.getpid(), part, str(JAVA), str(tmp_path), wait=0.5)  # this process lives on
    # left alone (still being written): not checked, not adopted, not deleted
    assert part.read_bytes() == b"not yet" and not (archive_dir / "spark-classes-x.jsa").exists()


# a session as `oncemesh reconcile` starts it for a short run, one query, stopped as it stops it
_SESSION = """
import sys
from oncemesh.spark import classarchive as CA
from oncemesh.spark.job import spark_session
spark, created = spark_session("local[1]", short=True, make_archive=True)
assert created and (CA._writing is not None) == bool(int(sys.argv[1])), CA._writing
print(spark.range(10).selectExpr("sum(id)").collect()[0][0], flush=True)
CA.stop(spark)
"""


@pytest.mark.spark
def test_a_session_leaves_an_archive_behind_that_the_next_one_maps(archive_dir: Path) -> None:
    """A short run's own session (its own process: the tests' session is not involved) has its JVM
    write the archive as it exits; the waiter adopts it; the next session is given it to map."""
    env = {**os.environ, CA.DIR_ENV: str(archive_dir)}
    env.pop(CA.ENABLED_ENV, None)

    def session(making: int) -> None:
        done = subprocess.run([sys.executable, "-c", _SESSION, str(making)], capture_output=True, text=True,
                              env=env, timeout=600)
        assert done.returncode == 0 and done.stdout.strip() == "45", done.stderr[-3000:]

    session(making=1)
    deadline = time.monotonic() + 600  # the JVM writes it after the query, then the waiter checks it
    while not list(archive_dir.glob("spark-classes-*.jsa")) and time.monotonic() < deadline:
        time.sleep(0.5)
    adopted = list(archive_dir.glob("spark-classes-*.jsa"))
    assert len(adopted) == 1, sorted(p.name for p in archive_dir.iterdir())
    assert not list(archive_dir.glob(f"*{CA.PART}"))
    jvm, part = CA.flags(make=True)  # the next session maps it (a JVM mapping one: the test above)
    assert part is None and f"-XX:SharedArchiveFile={adopted[0]}" in jvm
