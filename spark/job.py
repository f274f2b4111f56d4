"""`oncemesh reconcile`: read every settlement log, judge the run, write the results.

The I/O edge around `spark/reconcile.py`: finds the logs, starts (or reuses) a quiet Spark session,
writes Parquet/JSON/PNG under --out, prints the summary and turns the verdict into an exit code
(0 pass, 1 something lost/duplicated/unexpected/falsely accepted, 2 usage). The same file runs on a
cluster: `spark-submit --py-files oncemesh-spark.zip spark/job.py LOGDIR... --master yarn`
(docs/reconcile.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from .reconcile import Reconciliation, Summary

DEFAULT_MASTER = "local[*]"
LOG_SUFFIX = ".jsonl"
GZ_SUFFIX = ".gz"  # a closed, compressed segment: Spark (Hadoop's gzip codec) reads it as text
# Characters a Hadoop path cannot carry in a file name (':' breaks its URI parsing) or that it
# would take for a glob pattern.
_HADOOP_UNSAFE = set(':*?[]{}\\')

_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.spark.name = org.apache.spark
logger.spark.level = error
"""


class UsageError(Exception):
    """The command line or the inputs make no sense (exit code 2)."""


@dataclass(frozen=True, slots=True)
class Outputs:
    """Where the results were written (local paths, or URIs under a remote --out)."""

    out: str
    summary_json: str
    summary_parquet: str
    subscriptions_parquet: str
    anomalies_parquet: str
    anomalies_json: str
    chart: str | None
    order_anomalies_parquet: str | None = None
    order_disagreements_parquet: str | None = None
    causal_violations_parquet: str | None = None
    router_anomalies_parquet: str | None = None
    disagreements_parquet: str | None = None


# ================================================================ inputs
def is_uri(text: str) -> bool:
    """A Hadoop file system URI (hdfs://, s3a://, gs://, abfss://, ...), not a local path."""
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text) is not None and not text.startswith("file://")


def find_logs(paths: Iterable[Path | str]) -> list[str]:
    """Every *.jsonl and *.jsonl.gz file under the given local directories (recursively; without a
    plain segment whose .gz exists) and every local file given by name, as absolute paths; URIs (hdfs://..., s3a://...) are kept as they are, for Spark to
    search. Raises UsageError for a local path that does not exist or when nothing is found."""
    from ..common.settlement_log import log_files

    found: list[Path] = []
    uris: list[str] = []
    missing: list[str] = []
    for raw in paths:
        if is_uri(str(raw)):
            uris.append(str(raw))
            continue
        p = Path(str(raw)[len("file://"):] if str(raw).startswith("file://") else raw)
        if p.is_dir():
            found.extend(log_files(p))  # plain and gzipped segments (common.settlement_log)
        elif p.is_file():
            found.append(p)
        else:
            missing.append(str(p))
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(missing)}")
    unique = list(dict.fromkeys(str(f.resolve()) for f in found)) + uris
    if not unique:
        raise UsageError(f"no settlement logs (*{LOG_SUFFIX} files) found under "
                         f"{', '.join(str(p) for p in paths) or '(no paths given)'}")
    return unique


def parse_since(text: str | None) -> float | None:
    """Unix seconds, or an ISO 8601 date/time (without a zone: local time)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise UsageError(f"--since: {text!r} is neither unix seconds nor an ISO 8601 date") from None


@contextmanager
def hadoop_safe(files: Sequence[str]) -> Iterator[list[str]]:
    """Path strings Spark can read: a local file whose name Hadoop cannot parse (a ':' or a glob
    character) is read through a symlink with a plain name in a temporary directory."""
    tmp: str | None = None
    out: list[str] = []
    try:
        for i, f in enumerate(files):
            if is_uri(f) or _HADOOP_UNSAFE.isdisjoint(f):
                out.append(f)
                continue
            if tmp is None:
                tmp = tempfile.mkdtemp(prefix="oncemesh-reconcile-")
            link = Path(tmp) / f"log{i:06d}{GZ_SUFFIX if f.endswith(GZ_SUFFIX) else LOG_SUFFIX}"
            link.symlink_to(f)
            out.append(str(link))
        yield out
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def read_logs(spark: SparkSession, sources: Sequence[str]) -> DataFrame:
    """Every line, parsed with the schema and a status (`reconcile.with_status`): local files as
    listed, URIs searched recursively for *.jsonl and *.jsonl.gz. Blank lines are skipped."""
    from . import reconcile as R
    from . import schema as S

    def reader() -> Any:
        return (spark.read.schema(S.PARSE_SCHEMA).option("mode", "PERMISSIVE")
                .option("columnNameOfCorruptRecord", S.CORRUPT))

    from pyspark.sql import functions as F

    def text_reader() -> Any:
        return spark.read

    def uri_options(r: Any) -> Any:
        return (r.option("recursiveFileLookup", "true")
                .option("pathGlobFilter", f"*{{{LOG_SUFFIX},{LOG_SUFFIX}{GZ_SUFFIX}}}"))

    def with_file(df: DataFrame) -> DataFrame:
        return df.withColumn("file", F.col("_metadata.file_path"))

    local = [f for f in sources if not is_uri(f)]
    uris = [f for f in sources if is_uri(f)]
    frames = [with_file(reader().json(local))] if local else []
    texts = [with_file(text_reader().text(local))] if local else []
    for uri in uris:
        frames.append(with_file(uri_options(reader()).json(uri)))
        texts.append(with_file(uri_options(text_reader()).text(uri)))
    fields, text = frames[0], texts[0]
    for f, t in zip(frames[1:], texts[1:], strict=True):
        fields, text = fields.unionByName(f), text.unionByName(t)
    # v2 lines take their writer from their file's header: headers come from a text scan (a filter
    # on the raw text first, so only header lines are parsed twice)
    return R.with_status(fields, R.headers(text))


# ================================================================ Spark
def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def local_cores(master: str) -> int:
    """The worker threads of a local master: local -> 1, local[N] -> N, local[*] -> all CPUs."""
    if master == "local":
        return 1
    inner = master[len("local["):].split(",")[0].rstrip("]")
    return (os.cpu_count() or 2) if inner == "*" else max(1, int(inner))


def submitted() -> bool:
    """Run by spark-submit (the JVM started first and handed us its gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


RETAIN = {"spark.sql.ui.retainedExecutions": "20", "spark.ui.retainedJobs": "100",
          "spark.ui.retainedStages": "100", "spark.ui.retainedTasks": "1000"}


# The JVM of a short local run (`spark_session(..., short=True)`): a few seconds of Spark are mostly
# the driver analysing and planning queries in a cold JVM, and the optimizing JIT compiler (C2)
# spends more CPU compiling that code than it saves in so short a run: the quick compiler only (C1),
# and one GC thread instead of a pool competing for the same cores. Measured on the demo's logs:
# about 40% less CPU before the first task runs (docs/reconcile.md, "What a run costs").
SHORT_RUN_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


# PySpark (4.x) records the Python call site of every DataFrame and Column operation in the JVM,
# for error messages: four more Py4J round trips around each call (the active session, a setting,
# set, clear). A reconcile builds its plans in thousands of such calls (the demo's logs: ~13,000
# round trips, ~10,000 of them these). PySpark reads the setting once per process, from the first
# session it sees: it holds for sessions this module starts (and spark-submit's).
NO_CALL_SITES = ("spark.python.sql.dataFrameDebugging.enabled", "false")


def spark_session(master: str | None = None, driver_memory: str | None = None,
                  shuffle_partitions: int | None = None, app_name: str = "oncemesh-reconcile",
                  short: bool = False, make_archive: bool = False) -> tuple[SparkSession, bool]:
    """The active session if there is one (then `master` is not applied), else a new quiet one.
    Returns (session, created). `master` None: spark-submit's --master under spark-submit, else
    local[*]. Local masters bind to loopback and need no network. `short`: the session is for a
    short run (small logs): a local master's JVM gets SHORT_RUN_JVM. A new local session maps the
    class archive when there is one; else, with `make_archive`, its JVM writes one at exit (stop
    the session with `classarchive.stop` to have it adopted)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    if submitted():
        b = (SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.debug.maxToStringFields", "200").config(*NO_CALL_SITES))
        if master:
            b = b.master(master)
        if shuffle_partitions:
            b = b.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        spark = b.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        return spark, True
    master = master or DEFAULT_MASTER
    conf_dir = Path(tempfile.gettempdir()) / "oncemesh-spark"
    conf_dir.mkdir(parents=True, exist_ok=True)
    log4j = conf_dir / "log4j2.properties"
    if not log4j.exists() or log4j.read_text() != _LOG4J:
        # written whole and renamed into place: another process starting a session at the same
        # moment reads the old file or the new one, never half of one
        tmp = conf_dir / f".log4j2.{os.getpid()}.tmp"
        tmp.write_text(_LOG4J)
        os.replace(tmp, log4j)
    from . import classarchive as CA

    cds, _ = CA.flags(make=make_archive) if is_local(master) else ("", None)
    b = (SparkSession.builder.appName(app_name).master(master)
         .config("spark.ui.showConsoleProgress", "false")
         # -Xss: Spark compiles generated code on the thread that runs a query, a stream's among
         # them, and the live audit's wide plans overflowed a default (1 MB) thread stack there
         .config("spark.driver.extraJavaOptions", f"-Xss16m -Dlog4j2.configurationFile={log4j.as_uri()}"
                 + (f" {SHORT_RUN_JVM}" if short and is_local(master) else "") + (f" {cds}" if cds else ""))
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.debug.maxToStringFields", "200").config(*NO_CALL_SITES))
    # what the status store keeps of finished queries, jobs and stages (the UI is off, the store is
    # not): with the defaults (1,000 SQL executions and their plan metrics) a session that runs many
    # wide queries -- the live audit's micro-batches, the test suite -- filled a 2 GB heap with them
    # (SQLPlanMetric, metric arrays) and spent its time in GC
    for key, value in RETAIN.items():
        b = b.config(key, value)
    if is_local(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        cores = local_cores(master)
        b = (b.config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 4 * cores)))
    elif shuffle_partitions:
        b = b.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if driver_memory:
        b = b.config("spark.driver.memory", driver_memory)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark, True


# ================================================================ the run
def reconcile_paths(paths: Iterable[Path | str], *, out: Path | str | None = None,
                    master: str | None = None, since: float | str | None = None,
                    skew: float = 0.0, chart: bool = True, driver_memory: str | None = None,
                    spark: SparkSession | None = None, keep_session: bool = False,
                    warn_to: TextIO | None = None, accept_partial: bool = False,
                    make_archive: bool = False) -> Summary:
    """Reconcile the settlement logs under `paths` and return the verdict (`Summary.passed`).

    The chaos runner calls this in-process. With `out`, the anomalous pairs, the summary and the
    chart are written there. A session this call starts is stopped at the end unless
    `keep_session`; a given or already active session is left running. Raises UsageError when no
    log is found. `accept_partial`: a verdict on partial evidence may pass (`--accept-partial`).
    `make_archive`: a short run's session started and stopped here leaves the class archive behind
    when there is none yet (`classarchive`)."""
    files = find_logs(paths)
    since_ts = parse_since(since) if isinstance(since, str) else since
    created = False
    if spark is None:
        spark, created = spark_session(master, driver_memory, short=is_small(files),
                                       make_archive=make_archive and not keep_session and is_small(files))
    try:
        with hadoop_safe(files) as readable:
            summary, _ = run(spark, readable, out=out,
                             since=since_ts, skew=skew, chart=chart, warn_to=warn_to,
                             n_files=len(files), accept_partial=accept_partial)
        return summary
    finally:
        if created and not keep_session:
            from . import classarchive as CA

            CA.stop(spark)


# What a reconcile's queries run with (set for the run, restored after): one action is one Spark
# job. Adaptive execution runs every shuffle stage as a job of its own, and a broadcast join runs
# one to collect its small side; a planned sort-merge join and a static plan run inside the job of
# the action. The one broadcast kept is the files' headers (`reconcile.with_status`: joining every
# line by file name through a shuffle would put a file's lines in one partition). A long list of
# files is listed on the driver, not by a job.
PLANNED = {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "-1",
           "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000"}
# And for a short run (`is_small`): time goes to planning and compiling, not to rows. Generated code
# is compiled per stage (the one collect has ~90) and per expression, where a small run's rows are
# evaluated as quickly without (the live audit's micro-batches run so too, audit.AUDIT_CONF); and
# constraint propagation infers filters over wide plans at every optimization (it only ever adds
# null checks and filters: no result depends on it).
# And one partition throughout (`reconcile.keep` makes every kept frame one partition): the joins and
# aggregations of frames that are each one partition need no exchange, so the collect is a few
# stages instead of ~90. A join takes its sides as they are only when the planner's estimate of
# each is under spark.sql.maxSinglePartitionBytes, and a checkpoint has no estimate (it counts as
# huge): no bound for a short run, whose logs are one partition's worth anyway.
SHORT_RUN = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN",
             "spark.sql.constraintPropagation.enabled": "false",
             "spark.sql.maxSinglePartitionBytes": str(2**63 - 1)}
# Anomalous pairs brought to the driver with the summary (for anomalies.json and the chart): with
# more, those two are made by Spark (three more jobs).
ANOMALY_ROWS = 50_000


# Without adaptive execution nothing merges small shuffle partitions: a run's logs get one per
# this many bytes of lines (a closed segment's gzip counted GZ_RATIO times its size), never more
# than the session's spark.sql.shuffle.partitions. Tasks and their scheduling, not data, are what
# a small run costs.
BYTES_PER_PARTITION = 64 << 20
GZ_RATIO = 8


def log_bytes(files: Sequence[str]) -> int | None:
    """The lines' size of local logs (a gzipped segment counted GZ_RATIO times its size); None when
    a URI is among them (its size is not looked up)."""
    if any(is_uri(f) for f in files):
        return None
    return sum(os.path.getsize(f) * (GZ_RATIO if f.endswith(GZ_SUFFIX) else 1) for f in files)


def shuffle_partitions(files: Sequence[str], configured: int) -> int:
    """Shuffle partitions for these logs: by their local size, at most `configured` (URIs: their
    size is not looked up, `configured`)."""
    size = log_bytes(files)
    if size is None:
        return configured
    return max(1, min(configured, -(-size // BYTES_PER_PARTITION)))


def is_small(files: Sequence[str]) -> bool:
    """Local logs that fit one shuffle partition: a short run (`spark_session(short=True)`)."""
    size = log_bytes(files)
    return size is not None and size <= BYTES_PER_PARTITION


@contextmanager
def planned(spark: SparkSession, files: Sequence[str] = ()) -> Iterator[None]:
    """The session's SQL settings as PLANNED (and shuffle partitions for `files`, and SHORT_RUN when
    they are small) for the duration, then as they were."""
    settings = dict(PLANNED)
    if files:
        configured = int(spark.conf.get("spark.sql.shuffle.partitions") or "200")
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions(files, configured))
        if is_small(files):
            settings |= SHORT_RUN
    old = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, was in old.items():
            if was is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, was)


class JobCounter:
    """Counts the Spark jobs run on this thread while it is active: they run under a job group of
    its own (the previous group is put back after), and the status tracker lists the group's jobs."""

    def __init__(self, spark: SparkSession) -> None:
        self.sc = spark.sparkContext
        self.group = f"oncemesh-reconcile-{os.getpid()}-{time.monotonic_ns()}"
        self.old: tuple[str | None, str | None] = (None, None)

    def __enter__(self) -> JobCounter:
        self.old = (self.sc.getLocalProperty("spark.jobGroup.id"),
                    self.sc.getLocalProperty("spark.job.description"))
        self.sc.setJobGroup(self.group, "oncemesh reconcile")
        return self

    def __exit__(self, *exc: object) -> None:
        group, desc = self.old
        self.sc.setLocalProperty("spark.jobGroup.id", group)  # type: ignore[arg-type]  # pyspark annotates the value as str, yet None is how Spark unsets a local property (the group was none)
        self.sc.setLocalProperty("spark.job.description", desc)  # type: ignore[arg-type]  # (the same: None unsets it)

    def submit(self, fn: Callable[..., None], *args: Any) -> Future[None]:
        """`fn(*args)` on a thread of its own, its jobs in this group (a job group is the JVM
        thread's: PySpark gives each Python thread its own)."""
        def in_group() -> None:
            self.sc.setJobGroup(self.group, "oncemesh reconcile")
            fn(*args)

        pool = ThreadPoolExecutor(1, thread_name_prefix="oncemesh-reconcile")
        try:
            return pool.submit(in_group)
        finally:
            pool.shutdown(wait=False)

    def count(self) -> int:
        """Jobs of the group so far (the status store learns of a job from the listener bus: wait
        until the bus has delivered what was posted)."""
        from py4j.protocol import Py4JError

        # an internal method: without it the count might miss a job that just ended
        with suppress(Py4JError):
            self.sc._jsc.sc().listenerBus().waitUntilEmpty(10_000)
        return len(self.sc.statusTracker().getJobIdsForGroup(self.group))


def run(spark: SparkSession, files: Sequence[str], *, out: Path | str | None, since: float | None,
        skew: float, chart: bool, warn_to: TextIO | None = None, n_files: int | None = None,
        accept_partial: bool = False) -> tuple[Summary, Outputs | None]:
    """Judge the logs: a few Spark jobs (PLANNED): the logs are read and parsed once and kept, the
    frames several results use are kept, every count of the summary comes back in one action
    (`verdict.collect_pieces`), and each file under `out` is one write. The summary's `extra`
    says how many jobs ran (`spark_jobs`), how long it took and where the results are."""
    with planned(spark, files), JobCounter(spark) as jobs:
        summary, outputs = _run(spark, files, out=out, since=since, skew=skew, chart=chart, warn_to=warn_to,
                                n_files=n_files, accept_partial=accept_partial, jobs=jobs)
    return summary, outputs


def _run(spark: SparkSession, files: Sequence[str], *, out: Path | str | None, since: float | None,
         skew: float, chart: bool, warn_to: TextIO | None, n_files: int | None, accept_partial: bool,
         jobs: JobCounter) -> tuple[Summary, Outputs | None]:
    from dataclasses import replace

    from . import reconcile as R
    from . import verdict as V

    say = warn_to or sys.stderr
    started = time.monotonic()
    target = out_dir(out) if out is not None else None
    # parsed once, kept (only the columns used) for every result below
    parsed = (read_logs(spark, files).select(*R.USED, "status")
              .transform(R.keep))
    rec: Reconciliation | None = None
    frames: Future[None] | None = None
    try:
        rec = R.reconcile(parsed, since=since, skew=skew, persist=True)
        pieces = R.summary_pieces(rec)
        if target is not None:
            pieces.append((ANOMALIES, anomalies_ordered(rec).limit(ANOMALY_ROWS + 1)))
            # the files made of the frames alone are written while the summary is collected: a
            # short run's driver plans on one core and its tasks run one at a time, so they fill
            # the other (a checkpoint both need is computed once: the second waits for its blocks)
            frames = jobs.submit(write_frames, rec, target)
        rows = V.collect_pieces(pieces)
        summary = R.summary_from(rec, rows, accept_partial=accept_partial)
        extra: dict[str, Any] = {"files": n_files if n_files is not None else len(files)}
        if target is not None:
            extra["out"] = target
        summary = replace(summary, extra=extra)
        if summary.newer_version_lines:
            print(f"oncemesh reconcile: warning: {summary.newer_version_lines} line(s) of a newer "
                  f"schema version than {R.S.SCHEMA_VERSION} were skipped: upgrade the reconciliation",
                  file=say)
        if summary.malformed_lines:
            print(f"oncemesh reconcile: warning: {summary.malformed_lines} malformed line(s) skipped",
                  file=say)
        outputs = None
        if target is not None:
            outputs = write_outputs(spark, rec, summary, target, chart, say, rows.get(ANOMALIES, []),
                                    lambda s: replace(s, extra={**s.extra, **measured(jobs, started)}),
                                    frames=frames)
        summary = replace(summary, extra={**summary.extra, **measured(jobs, started)})
        return summary, outputs
    finally:
        if frames is not None:  # done before the frames are freed (on failure too; its error is then secondary)
            with suppress(Exception):
                frames.result()
        R.release(parsed)
        if rec is not None:
            R.unpersist(rec)


def measured(jobs: JobCounter, started: float) -> dict[str, Any]:
    """The cost so far: Spark jobs run, seconds."""
    return {"spark_jobs": jobs.count(), "seconds": round(time.monotonic() - started, 3)}


ANOMALIES = "anomalies"
ANOMALY_ORDER = ("class", "t_pub", "gid", "sub")


def anomalies_ordered(rec: Reconciliation) -> DataFrame:
    from . import reconcile as R

    return R.anomalies(rec.pairs).orderBy(*ANOMALY_ORDER)


def out_dir(out: Path | str) -> str:
    """The results' directory: a URI as it is, a local path made and made absolute."""
    if is_uri(str(out)):
        return str(out).rstrip("/")
    local = Path(str(out)[len("file://"):] if str(out).startswith("file://") else out)
    local.mkdir(parents=True, exist_ok=True)
    return str(local.resolve())


def _write(df: DataFrame, path: str, *order: str) -> None:
    """One file of results, in one job: one partition, sorted within it (a global `orderBy` would
    sample its input in a job of its own first)."""
    df.coalesce(1).sortWithinPartitions(*order).write.mode("overwrite").parquet(path)


def _json_lines(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as Spark's JSON writer writes them: one object a line, null fields left out."""
    return "".join(json.dumps({k: v for k, v in r.items() if v is not None}, separators=(",", ":")) + "\n"
                   for r in rows)


def _sort_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """ANOMALY_ORDER, nulls first (as Spark sorts ascending)."""
    return tuple((row.get(k) is not None, row.get(k) if row.get(k) is not None else 0) for k in ANOMALY_ORDER)


def write_frames(rec: Reconciliation, target: str) -> None:
    """The results under `target` made of the reconciliation's frames alone (not of its summary):
    anomalies.parquet, order_anomalies.parquet, order_disagreements.parquet,
    router_anomalies.parquet, disagreements.parquet, causal_violations.parquet: one write each."""
    from . import reconcile as R

    _write(R.anomalies(rec.pairs), f"{target}/anomalies.parquet", *ANOMALY_ORDER)
    _write(R.order_anomalies(rec.order), f"{target}/order_anomalies.parquet", "sub", "pub")
    _write(rec.sub_pairs.where("disagree"), f"{target}/order_disagreements.parquet", "topic", "sub_a", "sub_b")
    _write(rec.router_pairs.where("class != 'ok'"), f"{target}/router_anomalies.parquet",
           "class", "t_recv", "gid", "sub")
    _write(rec.agreement.where("why is not null"), f"{target}/disagreements.parquet", "gid", "sub")
    _write(R.causal_anomalies(rec.causal), f"{target}/causal_violations.parquet", "topic", "sub")


def write_outputs(spark: SparkSession, rec: Reconciliation, summary: Summary, target: str, chart: bool,
                  say: TextIO, anomaly_rows: Sequence[dict[str, Any]] = (),
                  final: Callable[[Summary], Summary] | None = None,
                  frames: Future[None] | None = None) -> Outputs:
    """Under `target` (a local directory, or a URI such as hdfs://.../run42): anomalies.parquet and
    anomalies.json (the non-ok pairs), summary.json, summary.parquet (its scalars),
    subscriptions.parquet, order_anomalies.parquet (the (subscription, publisher link) rows with a
    reversal or a gap), order_disagreements.parquet (the pairs of subscriptions handed messages in
    opposite orders), causal_violations.parquet (the subscriptions with a causal violation),
    router_anomalies.parquet and disagreements.parquet, and reconcile.png (local `target` only).
    `anomaly_rows`: the anomalous pairs already collected (all of them when there are at most
    ANOMALY_ROWS: then anomalies.json and the chart need no Spark job). `final`: the summary as
    summary.json says it (with the cost of the whole run)."""
    from . import chart as C
    from . import reconcile as R

    remote = is_uri(target)
    collected = len(anomaly_rows) <= ANOMALY_ROWS and summary.pairs - summary.ok == len(anomaly_rows)
    png: str | None = None
    drawing: Future[Path] | None = None
    if chart and remote:
        print("oncemesh reconcile: no chart for a remote --out", file=say)
    elif chart and not C.available():
        print("oncemesh reconcile: matplotlib is not installed: no chart (pip install 'oncemesh[chart]')",
              file=say)
    elif chart:
        curves = sorted((C.HopCurve(q.kind, q.name, q.n, q.curve) for q in summary.latencies),
                        key=lambda c: (C.KIND_ORDER.get(c.kind, 9), c.hop))
        times = ([(str(r["class"]), float(t)) for r in anomaly_rows
                  if (t := r.get("t_pub") if r.get("t_pub") is not None else r.get("t_handed")) is not None]
                 if collected else None)
        bucket, timeline = anomaly_timeline(rec, times)
        title = f"oncemesh reconciliation: {summary.verdict.upper()}"
        # drawn while Spark writes the Parquet files below (the JVM's work: Python only waits there)
        pool = ThreadPoolExecutor(1, thread_name_prefix="oncemesh-chart")
        drawing = pool.submit(C.render, curves, timeline, Path(target) / "reconcile.png", bucket=bucket,
                              title=title)
        pool.shutdown(wait=False)
    if frames is None:
        write_frames(rec, target)
    a_parquet, a_json = f"{target}/anomalies.parquet", f"{target}/anomalies.json"
    if collected and not remote:
        Path(a_json).mkdir(parents=True, exist_ok=True)
        for old in Path(a_json).iterdir():
            old.unlink()
        (Path(a_json) / "part-00000.json").write_text(_json_lines(sorted(anomaly_rows, key=_sort_key)))
        (Path(a_json) / "_SUCCESS").write_text("")
    else:
        (R.anomalies(rec.pairs).coalesce(1).sortWithinPartitions(*ANOMALY_ORDER)
         .write.mode("overwrite").json(a_json))
    o_parquet, d_parquet = f"{target}/order_anomalies.parquet", f"{target}/order_disagreements.parquet"
    r_parquet, g_parquet = f"{target}/router_anomalies.parquet", f"{target}/disagreements.parquet"
    c_parquet = f"{target}/causal_violations.parquet"
    s_parquet, subs_parquet = f"{target}/summary.parquet", f"{target}/subscriptions.parquet"
    subs_frame(spark, summary).coalesce(1).write.mode("overwrite").parquet(subs_parquet)
    if frames is not None:
        frames.result()  # its error, if any, is this run's
    if drawing is not None:
        png = str(drawing.result())
    # the summary's files last, so that they count every job (summary.parquet's own included)
    d = (final(summary) if final else summary).to_dict()
    d["spark_jobs"] = d.get("spark_jobs", 0) + 1 + (1 if remote else 0)
    summary_frame(spark, d).coalesce(1).write.mode("overwrite").parquet(s_parquet)
    s_json = f"{target}/summary.json"
    text = json.dumps(d, indent=2) + "\n"
    if remote:  # a directory with one part file, like the others
        from pyspark.sql.types import StringType, StructField, StructType

        (local_frame(spark, [(text,)], StructType([StructField("value", StringType())]))
         .coalesce(1).write.mode("overwrite").text(s_json))
    else:
        Path(s_json).write_text(text)
    return Outputs(target, s_json, s_parquet, subs_parquet, a_parquet, a_json, png, o_parquet, d_parquet,
                   c_parquet, r_parquet, g_parquet)


def anomaly_timeline(rec: Reconciliation, times: Sequence[tuple[str, float]] | None = None
                     ) -> tuple[float, dict[str, list[tuple[float, int]]]]:
    """(bucket seconds, class -> [(bucket start, pairs)]): from the anomalies' (class, time) when
    they were collected (`times`), else bucketed by Spark."""
    from . import chart as C
    from . import reconcile as R

    timeline: dict[str, list[tuple[float, int]]] = {}
    if times is not None:
        ts = [t for _, t in times]
        bucket = C.bucket_for(max(ts) - min(ts) if ts else 0.0)
        counts: dict[tuple[str, float], int] = {}
        for cls, t in times:
            key = (cls, math.floor(t / bucket) * bucket)
            counts[key] = counts.get(key, 0) + 1
        for (cls, t), k in sorted(counts.items()):
            timeline.setdefault(cls, []).append((t, k))
        return bucket, timeline
    bucket = C.bucket_for(R.anomaly_span(rec.pairs))
    for row in R.anomaly_timeline(rec.pairs, bucket).collect():
        timeline.setdefault(row["class"], []).append((float(row["t"]), int(row["n"])))
    return bucket, timeline


def local_frame(spark: SparkSession, rows: Sequence[Sequence[Any]], schema: StructType) -> DataFrame:
    """A few rows made on the driver as a frame, built in the JVM from their JSON text:
    `createDataFrame` of Python rows hands them to a Python worker process, whose start is seconds
    of a short run (the demo's logs: 2.4 s for subscriptions.parquet). A value that does not fit
    its field's type fails the query (FAILFAST) instead of becoming null."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType

    text = json.dumps([dict(zip(schema.fieldNames(), row, strict=True)) for row in rows], allow_nan=True)
    parsed = F.from_json(F.lit(text), ArrayType(schema), {"mode": "FAILFAST"})
    return spark.range(0, 1, 1, 1).select(F.inline(parsed))


def subs_frame(spark: SparkSession, summary: Summary) -> DataFrame:
    """The per-subscription counts of a summary as a frame."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from .schema import CLASSES

    schema = StructType([StructField("sub", StringType()), StructField("topic", StringType()),
                         *[StructField(c, LongType()) for c in ("pairs", "owed", *CLASSES)]])
    rows = [(s.sub, s.topic, s.pairs, s.owed, *(n for _, n in s.counts)) for s in summary.per_subscription]
    return local_frame(spark, rows, schema)


def summary_frame(spark: SparkSession, d: dict[str, Any]) -> DataFrame:
    """The scalar entries of a summary dict as a one-row frame (ints as long, floats as double)."""
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    scalars = {k: v for k, v in d.items() if not isinstance(v, list | dict)}
    types = {bool: StringType(), int: LongType(), float: DoubleType(), str: StringType()}
    # a null (`since` unset; the client view's counts when it judged nothing) keeps its column's type
    fields = [StructField(k, DoubleType() if k in ("since", "seconds")
                          else LongType() if v is None else types.get(type(v), StringType()))
              for k, v in scalars.items()]
    row = tuple(float(v) if isinstance(f.dataType, DoubleType) and v is not None
                else (str(v) if isinstance(f.dataType, StringType) and v is not None else v)
                for f, v in zip(fields, scalars.values(), strict=True))
    return local_frame(spark, [row], StructType(fields))


# ================================================================ presentation
def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def format_summary(s: Summary) -> str:
    """A table a person reads."""
    from .schema import CLASSES, FAILURES

    lines = [*top_lines(s), "",
             f"logs: {s.extra.get('files', '?')} file(s), {s.log_lines} event(s): {s.malformed_lines} malformed, "
             f"{s.newer_version_lines} of a newer schema, {s.unknown_event_lines} unknown event(s)"
             + (f", {s.ignored_lines} before --since" if s.since is not None else ""),
             f"messages: {s.messages} published, {s.messages_in_doubt} without a final outcome"
             + (f"; pairs: {s.pairs} ({s.owed_pairs} owed); subscriptions: {s.subscriptions}"
                if s.client_judged else "")
             + (f" (+{s.unobserved_subscriptions} without a subscriber log, not judged)"
                if s.unobserved_subscriptions else ""),
             ""]
    if s.client_judged:
        lines += ["client view (what our subscribers handed to their applications):",
                  f"  {'class':<24}{'pairs':>10}"]
        for c in CLASSES:
            n = getattr(s, c)
            flag = "  <-- FAIL" if c in FAILURES and n else ""
            lines.append(f"  {c:<24}{n:>10}{flag}")
    else:
        lines.append(f"client view: {s.client_note}")
    lines += router_view_lines(s)
    lines += ["", "order (reported, not part of the verdict):",
              f"  {'fifo_reversals':<28}{s.fifo_reversals:>6}  handed after a higher seq of the same publisher",
              f"  {'fifo_gaps':<28}{s.fifo_gaps:>6}  skipped: a later message of the publisher was handed",
              f"  {'total_order_disagreements':<28}{s.total_order_disagreements:>6}  subscription pairs of a "
              f"topic in opposite orders"]
    for t in s.order_per_topic:
        if t.disagreements:
            lines.append(f"    topic {t.topic}: {t.disagreements} of {t.compared} subscription pair(s)")
    lines.append(f"  {'causal_violations':<28}{s.causal_violations:>6}  handed before a message its sender "
                 f"had been handed")
    for tc in s.causal_per_topic:
        if tc.violations:
            lines.append(f"    topic {tc.topic}: {tc.violations} of {tc.checked} checked hand-over(s)")
    if s.per_subscription:
        lines += ["", "per subscription:",
                  f"  {'sub':<20}{'topic':<16}{'pairs':>8}{'ok':>8}  anomalies"]
        for sc in s.per_subscription:
            counts = dict(sc.counts)
            bad = ", ".join(f"{c}={counts[c]}" for c in CLASSES if c != "ok" and counts[c])
            lines.append(f"  {sc.sub:<20}{(sc.topic or '-'):<16}{sc.pairs:>8}{counts['ok']:>8}  {bad or '-'}")
    if s.routers:
        lines += ["", "routers (settle latency received -> settled, ms):",
                  f"  {'router':<12}{'incs':>5}{'records':>10}{'unsettled live':>16}{'dead':>7}"
                  f"{'p50':>9}{'p99':>9}{'p99.9':>9}"]
        for r in s.routers:
            lines.append(f"  {r.node:<12}{r.incarnations:>5}{r.records:>10}{r.unsettled_live:>16}"
                         f"{r.unsettled_dead:>7}{_ms(r.settle.p50):>9}{_ms(r.settle.p99):>9}"
                         f"{_ms(r.settle.p999):>9}")
    if s.latencies:
        lines += ["", "latency (ms):",
                  f"  {'hop':<32}{'n':>10}{'p50':>9}{'p99':>9}{'p99.9':>9}{'max':>9}"]
        for q in s.latencies:
            lines.append(f"  {q.name:<32}{q.n:>10}{_ms(q.p50):>9}{_ms(q.p99):>9}{_ms(q.p999):>9}"
                         f"{_ms(q.max):>9}")
    lines += ["", f"verdict: {verdict_line(s)}"]
    return "\n".join(lines)


def top_lines(s: Summary) -> list[str]:
    """The whole verdict first: the run's, then each view's, named, then what it cost."""
    from . import reconcile as R

    out = [f"verdict: {s.verdict.upper()}"]
    for name, v in s.views().items():
        out.append(f"  {name} view ({v['source']}): {R.view_text(v)}")
    if "spark_jobs" in s.extra:
        out.append(f"  judged in {s.extra.get('seconds', 0):.1f} s, {s.extra['spark_jobs']} Spark job(s)")
    return out


def verdict_line(s: Summary) -> str:
    from .routerview import FAILURES as ROUTER_FAILURES
    from .schema import FAILURES

    if s.exit_status == 1:
        parts = ([f"client view: {getattr(s, c)} {c}" for c in FAILURES if getattr(s, c)]
                 + [f"router view: {s.router_view.count(c)} {c}" for c in ROUTER_FAILURES if s.router_view.count(c)]
                 + ([f"{s.agreement.disagreements} disagreement(s)"] if s.agreement.disagreements else []))
        return "FAIL: " + ", ".join(parts)
    if s.partial:
        what = (f"{s.unjudged_pairs} pair(s) judged by neither view" if s.judged_pairs
                else "nothing was judged")
        if s.accept_partial:
            return f"PASS on partial evidence ({what}; --accept-partial)"
        return f"PARTIAL: {what} (exit 3; --accept-partial to pass on what was judged)"
    return "PASS"


def router_view_lines(s: Summary) -> list[str]:
    """The router view, the agreement, and what neither view could judge."""
    from .routerview import CLASSES as ROUTER_CLASSES
    from .routerview import FAILURES as ROUTER_FAILURES

    rv = s.router_view
    out = ["", f"router view (from the routers' logs alone): {rv.pairs} pair(s) of {rv.messages} message(s) "
               f"({rv.messages_with_owed_set} with an owed set), {rv.judged} judged, {rv.unjudged} not",
           f"  {'class':<24}{'pairs':>10}"]
    for c in ROUTER_CLASSES:
        n = rv.count(c)
        out.append(f"  {c:<24}{n:>10}{'  <-- FAIL' if c in ROUTER_FAILURES and n else ''}")
    for reason, n in rv.reasons:
        if n:
            out.append(f"  {'unjudged: ' + reason:<24}{n:>10}")
    if rv.per_router:
        out.append(f"  {'router':<12}{'incs':>5}{'events':>10}{'origin':>10}{'home':>10}{'judged':>10}  partial")
        for r in rv.per_router:
            out.append(f"  {r.node:<12}{r.incarnations:>5}{r.events:>10}{r.origin_pairs:>10}{r.home_pairs:>10}"
                       f"{r.judged_pairs:>10}  {'; '.join(r.reasons) or '-'}")
    a = s.agreement
    out += ["", f"agreement: {a.compared} pair(s) judged by both views, {a.disagreements} disagreement(s)"
            + ("  <-- FAIL" if a.disagreements else "")]
    for e in a.examples[:5]:
        out.append(f"  {e['gid']} {e['sub']}: router {e['router_class']}, client {e['client_class']}: {e['why']}")
    out.append(f"evidence: {s.judged_pairs} pair(s) judged by at least one view, {s.unjudged_pairs} by neither")
    return out


# ================================================================ command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logdirs", nargs="+", metavar="LOGDIR",
                   help="directories searched recursively for *.jsonl and *.jsonl.gz settlement logs (or log files)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where results are written (default: a new temporary directory, named in the output)")
    p.add_argument("--master", default=None,
                   help=f"Spark master URL (default {DEFAULT_MASTER}; under spark-submit, its --master)")
    p.add_argument("--since", default=None, metavar="T",
                   help="judge only messages first seen at or after T (unix seconds or ISO 8601 date)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    p.add_argument("--skew", type=float, default=0.0, metavar="S",
                   help="clock difference tolerated between hosts when comparing hand-over and "
                        "outcome times (seconds, default 0)")
    p.add_argument("--driver-memory", default=None, metavar="SIZE",
                   help="Spark driver memory, e.g. 4g (local masters: the whole job runs in it)")
    p.add_argument("--no-chart", action="store_true", help="do not draw reconcile.png")
    p.add_argument("--accept-partial", action="store_true",
                   help="pass on partial evidence: pairs neither view could judge (no owed set, a router's "
                        "log missing or cut short) are reported, not failed on (default: exit 3)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "reconcile", help="judge a run: reconcile all settlement logs with Spark",
        description="Read every settlement log (*.jsonl, *.jsonl.gz) under LOGDIR... and judge every "
                    "(message, subscription) pair twice:\n\n"
                    "  router view: from the routers' logs alone, for any client: the origin router's owed "
                    "set against the home routers' delivered/accepted lines: ok, lost, duplicated, "
                    "false_accept, unexpected, unresolved, ended;\n"
                    "  client view: from our clients' logs: ok, lost, duplicated, unexpected, in_doubt, "
                    "recovered, ended_before_delivery, false_accept.\n\n"
                    "Where both views judged a pair they must agree. A pair neither view can judge (no "
                    "owed set, a router's log missing or cut short) makes the evidence partial, and so "
                    "does a run where nothing was judged: that never passes without --accept-partial. "
                    "Writes the anomalous pairs and the summary (Parquet and JSON) and a chart under "
                    "--out (docs/reconcile.md).\n\nExit status: 0 pass; 1 a failure in either view "
                    "(lost, duplicated, unexpected, false accept) or a disagreement; 2 usage error (e.g. "
                    "no logs found); 3 partial evidence (nothing failed in what was judged).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=cmd_reconcile)


def cmd_reconcile(args: argparse.Namespace) -> int:
    from . import pyspark_missing

    missing = pyspark_missing("oncemesh reconcile")
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    try:
        files = find_logs(args.logdirs)
        since = parse_since(args.since)
    except UsageError as exc:
        print(f"oncemesh reconcile: {exc}", file=sys.stderr)
        return 2
    human = sys.stderr if args.json else sys.stdout
    out = args.out if args.out is not None else tempfile.mkdtemp(prefix="oncemesh-reconcile-")
    if not args.no_chart:
        from . import chart as C

        C.preload()
    spark, created = spark_session(args.master, args.driver_memory, short=is_small(files),
                                   make_archive=is_small(files))
    try:
        with hadoop_safe(files) as readable:
            summary, outputs = run(spark, readable, out=out, since=since, skew=args.skew,
                                   chart=not args.no_chart, n_files=len(files),
                                   accept_partial=args.accept_partial)
        # the verdict before the session's stop (the JVM's end is no part of the judging)
        if args.json:
            print(json.dumps(summary.to_dict(), separators=(",", ":")), flush=True)
        else:
            print(format_summary(summary), file=human)
        if outputs is not None:
            print(f"results: {outputs.out}" + (f" (chart {Path(outputs.chart).name})" if outputs.chart else ""),
                  file=human, flush=True)
    finally:
        if created:
            from . import classarchive as CA

            CA.stop(spark)
    return summary.exit_status


def main(argv: list[str] | None = None) -> int:
    """Entry point for `python -m oncemesh.spark.job` and `spark-submit spark/submit.py`."""
    parser = argparse.ArgumentParser(prog="oncemesh reconcile")
    add_arguments(parser)
    return cmd_reconcile(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
