"""`oncemesh audit`: the router view, live, on Spark Structured Streaming over the routers' log
segments as they are closed.

Theory of operation. A router closes a segment every `log_segment_seconds` (or `log_segment_bytes`)
and gzips it; the `.jsonl.gz` appears at once, complete (renamed into place), and never changes.
The stream's file source picks up new closed segments each trigger; each micro-batch goes through
`foreachBatch`:

1. The batch's lines are parsed exactly as `oncemesh reconcile` parses them (`reconcile.parse`:
   a segment arrives whole, header included) and the router events are added to the audit's state:
   the events of messages not judged for good yet, and every lifecycle and segment event.
2. **Watermark.** A router's evidence is complete up to the end of its latest closed segment (the
   trailer's time: write-ahead, everything it did until then is on record). The watermark is the
   minimum of that over the routers whose latest incarnation is live; a router silent for longer
   than `router_timeout` behind the others (crashed and not back: its open segment is never
   closed) no longer holds it back.
3. **Ready messages.** The protocol puts every resolution of a message before its origin's
   outcome, so a message's evidence for lost / false accept is complete once the watermark passes
   its first outcome by `grace`; a message without an outcome is judged (unresolved, or whatever
   its evidence says) once its last event is `horizon` behind the watermark. A ready message is
   judged when it is first ready and again whenever a new segment brings an event of it (a
   duplicate delivery can come later).
4. **Judging** is `routerview.router_pairs` on the ready messages' events: the same rules as the
   batch reconciliation, no second copy. A pair whose class is new or changed is appended to the
   verdicts (Parquet, with the batch and the time); violations are logged at once on stderr and kept
   in the status file.
5. Events of messages judged and `horizon` behind the watermark are dropped from the state.

Outputs under `--out`: `verdicts/` (Parquet, appended), `state/` (the events kept, one generation
per batch), `checkpoint/` (the stream's), `status.json` (counts, last segment seen, watermark,
violations; rewritten atomically each batch) and `metrics.prom` (the same counts in the Prometheus
text format, for node_exporter's textfile collector); `--metrics-port` also serves them over HTTP on
127.0.0.1. docs/reconcile.md, "Live audit".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

SEGMENT_GLOB = "*.jsonl.gz"  # closed router segments (the open one is plain .jsonl)
DEFAULT_OUT = Path("audit-out")
RECENT_VIOLATIONS = 50
AUDIT_CONF = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN",
              "spark.sql.adaptive.enabled": "false", "spark.sql.debug.maxToStringFields": "25"}


@dataclass(slots=True)
class AuditConfig:
    logdirs: Sequence[str]
    out: str
    trigger: float = 5.0  # seconds between micro-batches
    grace: float = 1.0  # seconds after a message's outcome before it is judged (clock skew, acks)
    horizon: float = 600.0  # seconds a judged message's events are kept for late evidence
    router_timeout: float = 120.0  # a router this far behind the others no longer holds the watermark
    skew: float = 0.0  # clock difference tolerated between routers (as reconcile --skew)
    metrics_port: int | None = None


@dataclass(slots=True)
class AuditStatus:
    """What status.json and metrics.prom say (cumulative over the audit's life)."""

    started: float = field(default_factory=time.time)
    updated: float = 0.0
    batches: int = 0
    segments: int = 0
    last_segment: str | None = None
    watermark: float | None = None
    pairs: dict[str, int] = field(default_factory=dict)  # pairs by their current class
    judgements: int = 0  # verdict rows written (a pair's first class, and every change)
    violations: int = 0  # pairs that became a failure
    unjudged: int = 0  # pairs currently unjudged
    silent_routers: list[str] = field(default_factory=list)
    partial_incarnations: list[dict[str, str]] = field(default_factory=list)
    recent_violations: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        from .routerview import CLASSES, UNJUDGED

        return {"started": self.started, "updated": self.updated, "batches": self.batches,
                "segments": self.segments, "last_segment": self.last_segment, "watermark": self.watermark,
                "lag_seconds": (self.updated - self.watermark) if self.watermark else None,
                "pairs": {c: self.pairs.get(c, 0) for c in (*CLASSES, UNJUDGED)},
                "judgements": self.judgements, "violations": self.violations, "unjudged": self.unjudged,
                "silent_routers": self.silent_routers,
                "partial_incarnations": self.partial_incarnations,
                "recent_violations": self.recent_violations}


# ================================================================ pure frames (watermark, readiness)
def incarnation_ends(events: DataFrame) -> DataFrame:
    """Per router incarnation: node, inc, first_ts, state (`reconcile.incarnations`), closed_to (the
    latest `segment_closed` time: its evidence is complete up to there)."""
    from pyspark.sql import functions as F

    from . import reconcile as R

    r = events.where(F.col("src") == "router")
    closed = (r.where(F.col("ev") == "segment_closed").groupBy("node", "inc").agg(F.max("ts").alias("closed_to")))
    return R.incarnations(r).join(closed, ["node", "inc"], "left").select("node", "inc", "first_ts", "state",
                                                                             "closed_to")


def watermark(incs: Sequence[Any], router_timeout: float) -> tuple[float | None, list[str]]:
    """(watermark, silent routers) from `incarnation_ends` rows: the minimum over the routers
    whose latest incarnation lives of how far their closed segments reach. A stopped router holds
    nothing back; a live one whose closed segments lag the most advanced router's by more than
    `router_timeout` (crashed, not back) is silent and holds nothing back either; a live one that
    has not closed a segment yet blocks (None). With no router holding anything back, the latest
    segment end seen."""
    latest: dict[str, Any] = {}
    for r in incs:
        cur = latest.get(r["node"])
        if cur is None or (r["first_ts"], r["inc"]) > (cur["first_ts"], cur["inc"]):
            latest[r["node"]] = r
    ends = [r["closed_to"] for r in incs if r["closed_to"] is not None]
    front = max(ends) if ends else None
    covered: list[float] = []
    silent: list[str] = []
    for node, r in sorted(latest.items()):
        if r["state"] != "live":
            continue
        reach = r["closed_to"] if r["closed_to"] is not None else r["first_ts"]
        if front is not None and reach < front - router_timeout:
            silent.append(node)
        elif r["closed_to"] is None:
            return None, silent
        else:
            covered.append(r["closed_to"])
    if covered:
        return min(covered), silent
    return front, silent


def ready_messages(events: DataFrame, watermark: float, grace: float, horizon: float) -> DataFrame:
    """gid: messages whose evidence can no longer change what the rules say of them (module
    docstring, step 3), and done (bool: also `horizon` behind the watermark: their events may go)."""
    from pyspark.sql import functions as F

    ev = F.col("ev")
    per = (events.where(F.col("gid").isNotNull() & (F.col("src") == "router"))
           .groupBy("gid")
           .agg(F.min(F.when((ev == "outcome") & F.col("outcome").isin("ACCEPTED", "REJECTED"), F.col("ts")))
                .alias("t_out"), F.max("ts").alias("t_last")))
    ready = ((F.col("t_out").isNotNull() & (F.col("t_out") + grace <= watermark))
             | (F.col("t_last") + horizon <= watermark))
    return per.where(ready).select("gid", (F.col("t_last") + horizon <= watermark).alias("done"))


# ================================================================ the job
class Audit:
    """The foreachBatch side of the stream: state, judging, outputs. Usable without a stream
    (`process` takes any frame of lines with `value` and `file`), which is how its unit test drives it."""

    def __init__(self, spark: SparkSession, cfg: AuditConfig, say: Any = None) -> None:
        self.spark = spark
        self.cfg = cfg
        self.say = say or sys.stderr
        self.out = cfg.out.rstrip("/")
        self.local = not _is_uri(self.out)
        if self.local:
            Path(self.out).mkdir(parents=True, exist_ok=True)
        self.status = AuditStatus()
        self.lock = threading.Lock()  # status read by the metrics server's thread
        self._state_gen: int | None = self._latest_generation()
        self._reported_df: DataFrame | None = None
        self._load_status()
        self.registry: Any = None
        self._gauges: dict[str, Any] = {}
        self._setup_metrics()

    # -------------------------------------------------------------- the session
    def tune(self) -> None:
        """Session settings for many small batches (restored by `stop`): micro-batches are tiny, so
        compiling generated code and re-planning adaptively cost more than they save (measured: a
        batch of 19 segments took 60-80 s with them and 27-37 s without, on a loaded 2-core
        machine); and plans printed with few fields (200, the batch job's setting, made strings
        long enough for a regular expression Spark runs over them to overflow a thread's stack)."""
        self._saved = {}
        for k, v in AUDIT_CONF.items():
            self._saved[k] = self.spark.conf.get(k, None)
            self.spark.conf.set(k, v)

    def stop(self, query: StreamingQuery | None = None) -> None:
        """Stop the stream (if given) and restore the session's settings."""
        if query is not None:
            query.stop()
        for k, v in getattr(self, "_saved", {}).items():
            if v is None:
                self.spark.conf.unset(k)
            else:
                self.spark.conf.set(k, v)
        self._saved = {}

    # -------------------------------------------------------------- state on disk
    def _path(self, *parts: str) -> str:
        return "/".join([self.out, *parts])

    def _latest_generation(self) -> int | None:
        if not self.local:
            return None  # (a remote --out starts from the checkpoint's files, with no state kept)
        gens = sorted(int(p.name.split("-")[1]) for p in Path(self.out, "state").glob("gen-*")
                      if (p / "_SUCCESS").exists())
        return gens[-1] if gens else None

    def _state(self) -> DataFrame:
        from . import reconcile as R
        from . import schema as S

        if self._state_gen is None:
            return self.spark.createDataFrame([], S.LOG_SCHEMA).select(*R.USED)
        return self.spark.read.parquet(self._path("state", f"gen-{self._state_gen:09d}"))

    # -------------------------------------------------------------- one micro-batch
    def process(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from . import reconcile as R
        from . import routerview as RV

        cfg = self.cfg
        lines = batch.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            files = [r["file"] for r in lines.select("file").distinct().collect()]
            # checkpointed (lineage cut): the plans judging builds on them stay small, which the
            # stream's thread needs (deep plans overflow its stack while Spark plans them)
            new = R.valid_events(R.parse(lines)).where(F.col("src") == "router").select(*R.USED).localCheckpoint()
            events = self._state().unionByName(new).localCheckpoint()
            try:
                incs = incarnation_ends(events).collect()
                wm, silent = watermark(incs, cfg.router_timeout)
                counts: list[Any] = []
                violations: list[dict[str, Any]] = []
                if wm is not None:
                    ready = ready_messages(events, wm, cfg.grace, cfg.horizon).localCheckpoint()
                    touched = new.where(F.col("gid").isNotNull()).select("gid").distinct()
                    reported = self._reported()
                    fresh = ready.join(reported.select("gid").distinct(), "gid", "left_anti").select("gid")
                    again = ready.join(touched, "gid", "left_semi").select("gid")
                    todo = fresh.unionByName(again).distinct()
                    mine = events.where(F.col("gid").isNull()).unionByName(events.join(todo, "gid", "left_semi"))
                    pairs = RV.router_pairs(mine, R.lives(mine.where(F.col("src") == "router")), cfg.skew)
                    changed = self._record(pairs, reported, batch_id)
                    counts = changed.groupBy("class", "before").agg(F.count(F.lit(1)).alias("n")).collect()
                    bad = changed.where(F.col("class").isin(*RV.FAILURES))
                    violations = [r.asDict() for r in bad.select("gid", "sub", "class", "reason", "home", "origin",
                                                                 "t_recv").limit(RECENT_VIOLATIONS).collect()]
                    done = ready.where("done").select("gid")
                    self._reported_df = (reported.join(changed.select("gid", "sub"), ["gid", "sub"], "left_anti")
                                         .unionByName(changed.select("gid", "sub", "class"))
                                         .join(done, "gid", "left_anti").localCheckpoint())
                    changed.unpersist()
                    keep = events.join(done, "gid", "left_anti")
                else:
                    keep = events
                gaps = [r.asDict() for r in RV.incarnation_gaps(events).collect()]
                self._save_state(keep, batch_id)
                self._update_status(files, wm, silent, gaps, counts, violations, batch_id)
            finally:
                events.unpersist()
                new.unpersist()  # (the checkpoints' blocks)
        finally:
            lines.unpersist()

    def _reported(self) -> DataFrame:
        """The latest class of each pair judged and still held (gid, sub, class): kept in memory
        between batches; at start, read back from the verdicts written before."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        if self._reported_df is not None:
            return self._reported_df
        p = Path(self.out, "verdicts") if self.local else None
        if p is None or not (p.exists() and any(p.glob("*.parquet"))):
            self._reported_df = self.spark.createDataFrame([], "gid string, sub string, class string")
            return self._reported_df
        v = self.spark.read.parquet(self._path("verdicts"))
        w = Window.partitionBy("gid", "sub").orderBy(F.col("batch").desc(), F.col("judged_at").desc())
        self._reported_df = (v.withColumn("k", F.row_number().over(w)).where("k = 1")
                             .select("gid", "sub", "class").localCheckpoint())
        return self._reported_df

    def _record(self, pairs: DataFrame, reported: DataFrame, batch_id: int) -> DataFrame:
        """Append the pairs whose class is new or changed; returns them."""
        from pyspark.sql import functions as F

        old = reported.select("gid", "sub", F.col("class").alias("before"))
        changed = (pairs.join(old, ["gid", "sub"], "left")
                   .where(F.col("before").isNull() | (F.col("before") != F.col("class")))
                   .withColumn("batch", F.lit(batch_id)).withColumn("judged_at", F.lit(time.time())))
        changed = changed.localCheckpoint()  # (computed once: written, counted, and kept as reported)
        changed.write.mode("append").parquet(self._path("verdicts"))
        return changed

    def _save_state(self, keep: DataFrame, batch_id: int) -> None:
        target = self._path("state", f"gen-{batch_id:09d}")
        keep.write.mode("overwrite").parquet(target)
        old, self._state_gen = self._state_gen, batch_id
        if self.local and old is not None and old != batch_id:
            import shutil

            shutil.rmtree(Path(self.out, "state", f"gen-{old:09d}"), ignore_errors=True)

    # -------------------------------------------------------------- status and metrics
    def _load_status(self) -> None:
        """A restarted audit goes on counting from its last status file."""
        path = Path(self.out, "status.json")
        if not self.local or not path.exists() or self._state_gen is None:
            return
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            return
        s = self.status
        s.started = float(doc.get("started") or s.started)
        s.batches, s.segments = int(doc.get("batches", 0)), int(doc.get("segments", 0))
        s.pairs = {k: int(v) for k, v in (doc.get("pairs") or {}).items()}
        s.judgements, s.violations = int(doc.get("judgements", 0)), int(doc.get("violations", 0))
        s.recent_violations = list(doc.get("recent_violations") or [])

    def _update_status(self, files: list[str], wm: float | None, silent: list[str], gaps: list[dict[str, Any]],
                       counts: list[Any], violations: list[dict[str, Any]], batch_id: int) -> None:
        from . import routerview as RV

        for v in violations:
            v["batch"] = batch_id
        with self.lock:
            s = self.status
            s.updated = time.time()
            s.batches += 1
            s.segments += len(files)
            if files:
                s.last_segment = sorted(files)[-1]
            s.watermark = wm
            for r in counts:  # pairs by their latest class: a change moves a pair from one to the other
                s.pairs[r["class"]] = s.pairs.get(r["class"], 0) + int(r["n"])
                if r["before"] is not None:
                    s.pairs[r["before"]] = s.pairs.get(r["before"], 0) - int(r["n"])
                s.judgements += int(r["n"])
            s.violations += len(violations)
            s.unjudged = s.pairs.get(RV.UNJUDGED, 0)
            s.silent_routers = silent
            s.partial_incarnations = gaps
            s.recent_violations = (s.recent_violations + violations)[-RECENT_VIOLATIONS:]
            doc = s.to_dict()
        for v in violations:
            print(f"oncemesh audit: VIOLATION {v['class']} gid={v['gid']} sub={v['sub']} home={v['home']} "
                  f"origin={v['origin']}", file=self.say, flush=True)
        if self.local:
            _write_atomic(Path(self.out, "status.json"), json.dumps(doc, indent=1) + "\n")
            self._write_metrics(doc)

    def _setup_metrics(self) -> None:
        from prometheus_client import CollectorRegistry, Gauge

        from .routerview import CLASSES, UNJUDGED

        reg = self.registry = CollectorRegistry()
        g = self._gauges
        g["pairs"] = Gauge("oncemesh_audit_pairs", "Pairs judged by the live audit, by current class", ["class"],
                           registry=reg)
        for c in (*CLASSES, UNJUDGED):
            g["pairs"].labels(c).set(0)
        for name, doc in (("violations", "Pairs that became a failure (lost, duplicated, false accept, unexpected)"),
                          ("judgements", "Verdict rows written (first classes and changes)"),
                          ("batches", "Micro-batches processed"), ("segments", "Closed segments read"),
                          ("watermark_timestamp_seconds", "Time up to which every live router's evidence is in"),
                          ("lag_seconds", "How far the watermark is behind the last batch")):
            g[name] = Gauge(f"oncemesh_audit_{name}", doc, registry=reg)
        if self.cfg.metrics_port is not None:
            from prometheus_client import start_http_server

            start_http_server(self.cfg.metrics_port, addr="127.0.0.1", registry=reg)

    def _write_metrics(self, doc: dict[str, Any]) -> None:
        from prometheus_client import write_to_textfile

        g = self._gauges
        for c, n in doc["pairs"].items():
            g["pairs"].labels(c).set(n)
        for name in ("violations", "judgements", "batches", "segments"):
            g[name].set(doc[name])
        g["watermark_timestamp_seconds"].set(doc["watermark"] or 0)
        g["lag_seconds"].set(doc["lag_seconds"] or 0)
        write_to_textfile(str(Path(self.out, "metrics.prom")), self.registry)


def _is_uri(text: str) -> bool:
    from .job import is_uri

    return is_uri(text)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def start(spark: SparkSession, cfg: AuditConfig, say: Any = None) -> tuple[StreamingQuery, Audit]:
    """Start the stream over `cfg.logdirs` (closed segments, recursively); returns the running
    query and its `Audit` (status). Stop it with `audit.stop(query)`."""
    from pyspark.sql import functions as F

    audit = Audit(spark, cfg, say)
    audit.tune()
    streams = []
    for d in cfg.logdirs:
        streams.append(spark.readStream.format("text").option("recursiveFileLookup", "true")
                       .option("pathGlobFilter", SEGMENT_GLOB).load(str(d))
                       .select("value", F.col("_metadata.file_path").alias("file")))
    lines = streams[0]
    for s in streams[1:]:
        lines = lines.unionByName(s)
    query = (lines.writeStream.foreachBatch(audit.process)
             .option("checkpointLocation", audit._path("checkpoint"))
             .trigger(processingTime=f"{cfg.trigger} seconds").start())
    return query, audit


# ================================================================ command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logdirs", nargs="+", metavar="LOGDIR",
                   help="directories (or URIs) where routers write their segments; searched recursively "
                        f"for closed segments ({SEGMENT_GLOB})")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"verdicts, state, status (default ./{DEFAULT_OUT})")
    p.add_argument("--master", default=None, help="Spark master URL (default local[*]; under spark-submit, its --master)")
    p.add_argument("--trigger", type=float, default=5.0, metavar="S", help="seconds between micro-batches (default 5)")
    p.add_argument("--grace", type=float, default=1.0, metavar="S",
                   help="seconds past a message's outcome before it is judged (default 1)")
    p.add_argument("--horizon", type=float, default=600.0, metavar="S",
                   help="seconds a judged message is kept for late evidence, and after which a message "
                        "without an outcome is judged anyway (default 600)")
    p.add_argument("--router-timeout", type=float, default=120.0, metavar="S",
                   help="a router whose closed segments lag the others by more than S seconds (crashed, not "
                        "back) no longer holds the watermark back (default 120)")
    p.add_argument("--skew", type=float, default=0.0, metavar="S", help="clock difference tolerated between routers")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="also serve the counts in the Prometheus format on 127.0.0.1:PORT (0: any port)")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds (default: run until interrupted)")
    p.add_argument("--driver-memory", default=None, metavar="SIZE", help="Spark driver memory (local masters)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "audit", help="judge a live mesh continuously: the router view on Spark Structured Streaming",
        description="Watch the routers' settlement-log directories and judge every (message, subscription) "
                    "pair from the closed segments as they appear, with the rules of `oncemesh reconcile`'s "
                    "router view (ok, lost, duplicated, false_accept, unexpected, unresolved, ended; "
                    "docs/reconcile.md). A message is judged once every live router's closed segments "
                    "cover its outcome (the watermark), and again if a later segment brings new evidence "
                    "of it. Writes verdicts (Parquet, appended) under --out/verdicts, status.json (counts, "
                    "last segment seen, watermark, recent violations) and metrics.prom (Prometheus text); "
                    "a violation is printed on stderr as it is found.\n\nRuns until interrupted (or "
                    "--duration). Exit status: 0 no violation, 1 a violation was found, 2 usage error.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    from . import pyspark_missing
    from .job import spark_session

    no_spark = pyspark_missing("oncemesh audit")
    if no_spark is not None:
        print(no_spark, file=sys.stderr)
        return 2
    missing = [d for d in args.logdirs if not _is_uri(d) and not Path(d).is_dir()]
    if missing:
        print(f"oncemesh audit: no such directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    cfg = AuditConfig([d if _is_uri(d) else str(Path(d).resolve()) for d in args.logdirs], args.out,
                      args.trigger, args.grace, args.horizon, args.router_timeout, args.skew, args.metrics_port)
    spark, created = spark_session(args.master, args.driver_memory, app_name="oncemesh-audit")
    try:
        query, audit = start(spark, cfg)
        print(f"oncemesh audit: watching {', '.join(cfg.logdirs)}; status in {audit._path('status.json')}",
              file=sys.stderr)
        with contextlib.suppress(KeyboardInterrupt):  # (Ctrl-C: stop the stream, report)
            query.awaitTermination(args.duration)
        audit.stop(query)
        return 1 if audit.status.violations else 0
    finally:
        if created:
            spark.stop()


def main(argv: list[str] | None = None) -> int:
    """Entry point for spark-submit (`spark/submit_audit.py`)."""
    parser = argparse.ArgumentParser(prog="oncemesh audit")
    add_arguments(parser)
    return cmd_audit(parser.parse_args(argv))
