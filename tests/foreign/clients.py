"""Foreign AMQP clients for the tests: installed and built once per machine, run as processes.

Four client families, none written against oncemesh: Qpid Proton C++ (Debian's
libqpid-proton-cpp12-dev), rhea (npm), Qpid JMS (Maven Central) and python-qpid-proton (already a
dependency). For each, a publisher and a subscriber of our own (tests/foreign/<family>/) with one
command line and one JSON-lines report, so that one test drives them all:

    publisher  --url U1[,U2...] --topic T --container C --link L --report F
               [--count N] [--window W] [--size BYTES] [--rate MSG/S] [--second]
               [--user U --password P (SASL PLAIN)] [--ca CA.pem | --truststore P12 (JMS)]
    subscriber --url U1[,U2...] --topic T --container C --link L --report F
               [--expiry SECONDS (-1: never)] [--credit N] [--drain] [--second] [...]

Report lines: connected, attached, sent {k, tag}, outcome {k, tag, outcome}, msg {tag, id, key,
size}, disconnected, drained, link_error, error, done. `tag` is hex on the publisher's side and the
delivery tag as text (the global id) on the subscriber's; JMS hides tags (null).

Installation is loud: a failing command fails the test that needs it, with the command and its
output. ONCEMESH_FOREIGN_SKIP=all (or a comma list of cpp, rhea, jms) skips those families
explicitly, for machines that cannot reach the package registries. Builds are cached under
ONCEMESH_FOREIGN_CACHE (default ~/.cache/oncemesh/foreign), keyed by a hash of the client sources,
built in a temporary folder and renamed into place under a lock (several test runs may share a
machine).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SKIP_ENV = "ONCEMESH_FOREIGN_SKIP"
CACHE_ENV = "ONCEMESH_FOREIGN_CACHE"
CPP_PACKAGE = "libqpid-proton-cpp12-dev"
RHEA_VERSION = "3.0.5"  # (pinned in js/package.json and js/package-lock.json)
JMS_VERSION = "2.10.0"  # (pinned in jms/pom.xml)


class InstallFailed(Exception):
    """A command of a client's installation or build failed: the message holds it and its output."""


@dataclass(frozen=True)
class Family:
    """One client family, ready to run."""

    name: str
    version: str
    publisher: tuple[str, ...]  # command prefix; the options follow
    subscriber: tuple[str, ...]
    tags: bool  # the application sees delivery tags (JMS: no, it deduplicates by message id)
    second: bool  # the client can ask for receiver-settle-mode second
    truststore: bool = False  # TLS trust from a PKCS12 trust store (--truststore), not a CA file (--ca)
    setup_seconds: float = 0.0  # what installing and building took in this run (0: cached)
    env: dict[str, str] = field(default_factory=dict)

    def command(self, role: str, **options: Any) -> list[str]:
        cmd = list(self.publisher if role == "publisher" else self.subscriber)
        for k, v in options.items():
            if v is None or v is False:
                continue
            cmd.append(f"--{k.replace('_', '-')}")
            if v is not True:
                cmd.append(str(v))
        return cmd


def skipped(family: str) -> bool:
    wanted = {w.strip() for w in os.environ.get(SKIP_ENV, "").split(",") if w.strip()}
    return "all" in wanted or family in wanted


def cache_root() -> Path:
    base = os.environ.get(CACHE_ENV)
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "oncemesh" / "foreign"


def run(cmd: list[str], cwd: Path | None = None, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    """Run an installation step; InstallFailed with the command and its output when it fails."""
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **(env or {})})
    except FileNotFoundError as e:
        raise InstallFailed(f"$ {' '.join(cmd)}\n{e} (is it installed? the CI machine has it)") from None
    except subprocess.TimeoutExpired as e:
        said = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (e.stdout, e.stderr) if x)
        raise InstallFailed(f"$ {' '.join(cmd)}\ntimed out after {timeout} s\n{said}") from None
    if p.returncode != 0:
        raise InstallFailed(f"$ {' '.join(cmd)}  (in {cwd or os.getcwd()})\nexit status {p.returncode}\n"
                            f"{p.stdout}{p.stderr}")
    return p.stdout


def _digest(files: list[Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for f in sorted(files):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cached_build(name: str, sources: list[Path], build: Any, extra: str = "") -> tuple[Path, float]:
    """The folder holding `name`'s build for these sources: built now by `build(tmp_folder)` unless
    a complete one is cached. Returns it and the seconds spent building (0 when cached)."""
    root = cache_root()
    final = root / f"{name}-{_digest(sources, extra)}"
    with _locked(root / f".{name}.lock"):
        if (final / ".complete").exists():
            return final, 0.0
        t0 = time.monotonic()
        tmp = root / f".{final.name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            build(tmp)
            (tmp / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final, time.monotonic() - t0


# ---------------------------------------------------------------------- Qpid Proton C++
def _cpp_headers() -> bool:
    return Path("/usr/include/proton/messaging_handler.hpp").exists()


def apt_install(package: str, present: Callable[[], bool], family: str) -> float:
    """Debian's `package` unless `present()`; `apt-get update` first only if the install fails.
    Returns the seconds spent (0: it was there)."""
    if present():
        return 0.0
    t0 = time.monotonic()
    if os.geteuid() != 0:
        raise InstallFailed(f"{package} is not installed and this is not root: "
                            f"run `apt-get install -y {package}` (or set {SKIP_ENV}={family})")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        run(["apt-get", "install", "-y", package], env=env)
    except InstallFailed:
        run(["apt-get", "update"], env=env)
        run(["apt-get", "install", "-y", package], env=env)
    return time.monotonic() - t0


def ensure_cpp_package() -> float:
    """Qpid Proton C++ from Debian (seconds spent installing it)."""
    return apt_install(CPP_PACKAGE, _cpp_headers, "cpp")


def cpp_version() -> str:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "libqpid-proton-cpp12"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "?"


def build_cpp() -> Family:
    spent = ensure_cpp_package()
    src = HERE / "cpp"
    sources = sorted(src.glob("*.[ch]pp"))

    def build(tmp: Path) -> None:
        for prog in ("publisher", "subscriber"):
            run(["g++", "-std=c++17", "-O1", "-Wall", "-o", str(tmp / prog), str(src / f"{prog}.cpp"),
                 "-lqpid-proton-cpp"], cwd=src)

    out, built = cached_build("cpp", sources, build, extra=cpp_version())
    return Family("Proton C++", cpp_version(), (str(out / "publisher"),), (str(out / "subscriber"),),
                  tags=True, second=False, setup_seconds=spent + built)


# ---------------------------------------------------------------------- rhea
def build_rhea() -> Family:
    src = HERE / "js"
    sources = sorted(src.glob("*.js")) + [src / "package.json", src / "package-lock.json"]

    def build(tmp: Path) -> None:
        for f in sources:
            shutil.copy(f, tmp / f.name)
        run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=tmp)

    out, built = cached_build("rhea", sources, build)
    version = json.loads((out / "node_modules" / "rhea" / "package.json").read_text())["version"]
    return Family("rhea", version, ("node", str(out / "publisher.js")), ("node", str(out / "subscriber.js")),
                  tags=True, second=True, setup_seconds=built)


# ---------------------------------------------------------------------- Qpid JMS
def build_jms() -> Family:
    src = HERE / "jms"
    sources = sorted(src.glob("*.java")) + [src / "pom.xml"]

    def build(tmp: Path) -> None:
        shutil.copy(src / "pom.xml", tmp / "pom.xml")
        run(["mvn", "-B", "-q", "dependency:copy-dependencies", "-DoutputDirectory=lib"], cwd=tmp)
        run(["javac", "-d", str(tmp / "classes"), "-cp", str(tmp / "lib" / "*"),
             *(str(f) for f in src.glob("*.java"))], cwd=tmp)

    out, built = cached_build("jms", sources, build)
    cp = f"{out / 'classes'}:{out / 'lib' / '*'}"
    java = ("java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-cp", cp)
    return Family("Qpid JMS", JMS_VERSION, (*java, "Publisher"), (*java, "Subscriber"),
                  tags=False, second=False, truststore=True, setup_seconds=built)


# ---------------------------------------------------------------------- python-qpid-proton
def proton_python() -> Family:
    import proton

    src = HERE / "proton_py"
    version = ".".join(str(x) for x in proton.VERSION)
    return Family("python-qpid-proton", version, (sys.executable, str(src / "publisher.py")),
                  (sys.executable, str(src / "subscriber.py")), tags=True, second=True)


BUILDERS = {"cpp": build_cpp, "rhea": build_rhea, "jms": build_jms, "proton_py": proton_python}


def family(name: str) -> Family:
    """The family ready to run; skips (explicitly asked for) or fails with the installation's
    command and output."""
    if name != "proton_py" and skipped(name):
        pytest.skip(f"{name} client skipped by {SKIP_ENV}={os.environ.get(SKIP_ENV)}")
    try:
        return BUILDERS[name]()
    except InstallFailed as e:
        pytest.fail(f"installing the {name} client failed (set {SKIP_ENV}={name} to skip it on a machine "
                    f"that cannot reach the registries):\n{e}", pytrace=False)


# ---------------------------------------------------------------------- reports
def read_report(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a report (a line being written is left for the next read)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


STALL = 20.0  # seconds without progress that fail a wait (a router restarts in ~1-2 s)


def wait_progress(measure: Callable[[], int], goal: int, what: str, stall: float = STALL) -> None:
    """Wait until measure() >= goal; fail when it has not moved for `stall` seconds (a deadline on
    progress: a slow machine is given time, a stalled client is not)."""
    last, since = -1, time.monotonic()
    while True:
        v = measure()
        if v >= goal:
            return
        if v != last:
            last, since = v, time.monotonic()
        elif time.monotonic() - since > stall:
            raise AssertionError(f"{what}: stalled at {v} of {goal} for {stall:g} s")
        time.sleep(0.05)
