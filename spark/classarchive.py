"""A class archive for the local Spark JVM: its start and its first queries without loading Spark's
classes from the jars each time.

A local session's JVM loads some 20,000 classes of Spark's jars before and while its first queries
are analysed: seconds of every short run (the demo's logs: the session's start 9 s -> 4 s, and the
run a few seconds less). The JVM's class data sharing keeps them in an archive: the classes one run
loaded, parsed and verified, mapped by the next JVM's start instead. `oncemesh reconcile` (and the
demo's reconciliation) makes the archive at the end of its first short run on a machine: its JVM
writes it as it exits, after the results are out, in the background; a waiter process adopts it
(renames it into place) only once the JVM has exited and a JVM started with it and with every
region's checksum verified says it is whole, since a torn archive crashes the JVM that maps it.
Every local session started after that maps it.

The archive belongs to one Java and one set of Spark's jars in one place (`archive()`: their key
is in its name); a JVM refuses one that does not match, quietly, and runs without. It takes ~180
MB under `archive_dir()`, where at most KEEP archives are kept (the newest).
ONCEMESH_SPARK_CLASS_ARCHIVE=0 turns it off (no archive mapped or made).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENABLED_ENV = "ONCEMESH_SPARK_CLASS_ARCHIVE"
DIR_ENV = "ONCEMESH_SPARK_CLASS_ARCHIVE_DIR"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # a refused archive is no one's business
PART = ".part"
PREFIX = "spark-classes-"
KEEP = 3  # archives kept in the directory (`prune`)
EXIT_WAIT = 600.0  # the waiter gives up on a JVM that has not exited after this many seconds


def enabled() -> bool:
    return os.environ.get(ENABLED_ENV, "1").strip().lower() not in ("0", "no", "false", "off")


def archive_dir() -> Path:
    """$ONCEMESH_SPARK_CLASS_ARCHIVE_DIR, else oncemesh's directory in the user's cache."""
    given = os.environ.get(DIR_ENV)
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "oncemesh"


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    found = shutil.which("java", path=str(Path(home) / "bin")) if home else shutil.which("java")
    return os.path.realpath(found) if found else None


def archive() -> Path | None:
    """The archive for this Java and this PySpark's jars (None when turned off or not knowable)."""
    if not enabled():
        return None
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    java = _java()
    try:
        listing = sorted((j.name, j.stat().st_size) for j in jars.iterdir()) if jars.is_dir() else []
        java_id = (java, os.stat(java).st_mtime_ns) if java else None
    except OSError:
        return None
    # the JVM checks the class path an archive was made with: the jars' place is part of the key
    key = hashlib.sha256(repr((pyspark.__version__, str(jars), listing, java_id)).encode()).hexdigest()[:16]
    return archive_dir() / f"{PREFIX}{key}.jsa"


# the archive the JVM this process launched writes as it exits (one JVM per process: PySpark's
# gateway), for `stop`
_writing: Path | None = None


def flags(make: bool) -> tuple[str, Path | None]:
    """(JVM flags, the archive the JVM will write at exit or None): map the archive when there is
    one; else, with `make`, have the JVM write one when it exits, under a temporary name that
    `stop` adopts. For the JVM about to be launched: call it once per launch."""
    global _writing
    _writing = None
    target = archive()
    if target is None:
        return "", None
    if target.is_file():
        return f"-XX:SharedArchiveFile={target} {QUIET}", None
    if not make:
        return "", None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return "", None
    part = target.with_name(f".{target.name}.{os.getpid()}-{time.monotonic_ns()}{PART}")
    _writing = part
    return f"-XX:ArchiveClassesAtExit={part} {QUIET}", part


def target_of(part: Path) -> Path:
    """The archive a temporary one becomes: `.NAME.jsa.PID-NS.part` -> `NAME.jsa`."""
    return part.with_name(part.name[1:].split(".jsa.", 1)[0] + ".jsa")


def stop(spark: SparkSession) -> None:
    """Stop a session this process started. When its JVM writes an archive at exit (`flags`): end
    the JVM now (its gateway's input closed, as when Python exits; it writes the archive, which
    takes it tens of seconds) and leave a waiter behind to adopt it; a later session in this
    process starts a JVM of its own."""
    global _writing
    part, _writing = _writing, None
    if part is None:
        spark.stop()
        return
    from pyspark import SparkContext

    jvm = spark._jvm
    assert jvm is not None
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    java = str(Path(str(jvm.java.lang.System.getProperty("java.home"))) / "bin" / "java")
    class_path = str(jvm.java.lang.System.getProperty("java.class.path"))
    spark.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:  # not a JVM this process launched
        with suppress(OSError):
            part.unlink()
        return
    with suppress(Exception):
        gateway.shutdown()
    with suppress(OSError, ValueError):
        proc.stdin.close()
    SparkContext._gateway = None
    SparkContext._jvm = None
    with suppress(OSError):
        subprocess.Popen([sys.executable, "-m", __spec__.name if __spec__ else "oncemesh.spark.classarchive",
                          "adopt", str(pid), str(part), java, class_path],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def adopt(pid: int, part: Path, java: str, class_path: str, wait: float = EXIT_WAIT) -> bool:
    """Once JVM `pid` has exited, rename its archive into place if a JVM can map it with every
    region's checksum verified; else delete it. True when adopted."""
    deadline = time.monotonic() + wait
    while _alive(pid):
        if time.monotonic() > deadline:
            return False  # still writing, or hung: leave it; a later run makes another
        time.sleep(0.5)
    try:
        if not part.is_file() or part.stat().st_size == 0:
            return False
        # (a torn archive crashes this JVM: no crash report for it)
        check = subprocess.run([java, "-XX:+SuppressFatalErrorMessage", "-Xshare:on", "-XX:+VerifySharedSpaces",
                                f"-XX:SharedArchiveFile={part}", "-cp", class_path, "-version"],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        if check.returncode != 0:
            return False
        target = target_of(part)
        os.replace(part, target)
        prune(target.parent, keep=target)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        with suppress(OSError):
            part.unlink()


def prune(directory: Path, keep: Path, most: int = KEEP) -> None:
    """Leave at most `most` archives in `directory`, `keep` and the newest others: an archive is
    for one place of Spark's jars, and every venv or upgrade makes another."""
    others = sorted((a for a in directory.glob(f"{PREFIX}*.jsa") if a != keep),
                    key=lambda a: a.stat().st_mtime, reverse=True)
    for old in others[max(0, most - 1):]:
        with suppress(OSError):
            old.unlink()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oncemesh.spark.classarchive",
                                description="Adopt the class archive a Spark JVM writes as it exits "
                                            "(started by `oncemesh reconcile`; not for use by hand).")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("adopt", help="wait for JVM PID to exit, check ARCHIVE, rename it into place")
    a.add_argument("pid", type=int)
    a.add_argument("archive", type=Path)
    a.add_argument("java")
    a.add_argument("class_path")
    args = p.parse_args(argv)
    return 0 if adopt(args.pid, args.archive, args.java, args.class_path) else 1


if __name__ == "__main__":
    sys.exit(main())
