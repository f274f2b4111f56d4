"""Synthetic settlement logs with a known verdict: N publishers, M subscriptions, K routers, and
anomalies of each class injected in exact numbers. Used by the tests and by `spark/bench.py`.

    python -m spark.synth --out DIR --messages 100000 --publishers 4 --subscriptions 3 --routers 3 \\
        --anomaly lost=2 --anomaly duplicated=1 --stuck-dead 5

writes DIR/*.jsonl and DIR/expected.json (the counts `oncemesh reconcile DIR` must report).

Shape of the run. Message n is published by publisher n % P on topic t(n % T) at t0 + n/rate, enters
at router (n % P) % K, and is owed to every normal subscription on its topic (subscription i: topic
t(i % T), router i % K, in force from before the first message, never ends). A normal message is
handed once to each, accepted, then ACCEPTED is told to the publisher and the record settles; when a
subscription sits on another router the entry router forwards one copy per router. An injected
anomaly takes a message out of the normal flow onto topic `anomaly` (one subscription, so that one
injection is one pair), or for ended_before_delivery onto a topic of its own whose subscription ends
right after the first send. Lines are written with plain string formatting, one process per chunk.
"""

from __future__ import annotations

import argparse
import bisect
import json
import multiprocessing
import os
import random
import sys
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from ..common.settlement_log import SettlementLog
from .schema import CLASSES

ANOMALIES = tuple(c for c in CLASSES if c != "ok")
ANOMALY_TOPIC = "anomaly"
ANOMALY_SUB = "s-anomaly"


@dataclass(frozen=True, slots=True)
class SynthConfig:
    messages: int = 1000
    publishers: int = 2
    subscriptions: int = 2
    routers: int = 1
    topics: int = 1
    anomalies: Mapping[str, int] = field(default_factory=dict)  # class -> pairs to inject
    stuck_dead: int = 0  # records left unsettled in a router incarnation that then died
    stuck_live: int = 0  # records left unsettled in a live incarnation
    malformed: int = 0  # garbage lines
    newer: int = 0  # lines of a schema version newer than the reader knows (3)
    rate: float = 1000.0  # messages per second
    t0: float = 1_700_000_000.0
    seed: int = 1
    chunks: int = 0  # 0: one per CPU

    def validate(self) -> None:
        for k, n in self.anomalies.items():
            if k not in ANOMALIES:
                raise ValueError(f"unknown anomaly {k!r} (one of {', '.join(ANOMALIES)})")
            if n < 0:
                raise ValueError(f"anomaly {k}: negative count")
        if min(self.publishers, self.subscriptions, self.routers, self.topics) < 1:
            raise ValueError("publishers, subscriptions, routers and topics must be >= 1")
        special = sum(self.anomalies.values()) + self.stuck_dead + self.stuck_live
        if special > self.messages:
            raise ValueError(f"{special} injected anomalies/stuck records need at least as many messages")
        if self.stuck_dead + self.stuck_live and self.messages < 2 * special:
            raise ValueError("stuck records need messages >= 2 x (anomalies + stuck records)")


@dataclass(frozen=True, slots=True)
class Plan:
    """Which message gets what (indices into 0..messages-1), decided once from the seed."""

    anomaly_of: dict[int, str]
    stuck_dead: frozenset[int]
    stuck_live: frozenset[int]
    restart_at: float | None  # when router R0's first incarnation dies (stuck_dead)


def plan(cfg: SynthConfig) -> Plan:
    rng = random.Random(cfg.seed)
    dt = 1.0 / cfg.rate
    half = cfg.messages // 2
    anomaly_of: dict[int, str] = {}
    stuck_dead: set[int] = set()
    stuck_live: set[int] = set()
    taken: set[int] = set()
    restart_at = None
    if cfg.stuck_dead:
        # router R0 restarts half way: stuck records are R0 entries in the first half
        restart_at = cfg.t0 + half * dt - dt / 8
        first = [n for n in range(half) if _entry(cfg, n) == 0]
        if len(first) < cfg.stuck_dead:
            raise ValueError("not enough messages entering router R0 before its restart")
        stuck_dead = set(rng.sample(first, cfg.stuck_dead))
        taken |= stuck_dead
    if cfg.stuck_live:
        last = [n for n in range(half, cfg.messages) if _entry(cfg, n) == 0 and n not in taken]
        if len(last) < cfg.stuck_live:
            raise ValueError("not enough messages entering router R0")
        stuck_live = set(rng.sample(last, cfg.stuck_live))
        taken |= stuck_live
    free = [n for n in range(cfg.messages) if n not in taken] if taken else range(cfg.messages)
    picks = rng.sample(free, sum(cfg.anomalies.values()))
    i = 0
    for cls in ANOMALIES:
        for _ in range(cfg.anomalies.get(cls, 0)):
            anomaly_of[picks[i]] = cls
            i += 1
    return Plan(anomaly_of, frozenset(stuck_dead), frozenset(stuck_live), restart_at)


def _entry(cfg: SynthConfig, n: int) -> int:
    return (n % cfg.publishers) % cfg.routers


def _subs_of_topic(cfg: SynthConfig) -> list[list[int]]:
    by_topic: list[list[int]] = [[] for _ in range(cfg.topics)]
    for i in range(cfg.subscriptions):
        by_topic[i % cfg.topics].append(i)
    return by_topic


# Hand-overs per message to its subscription(s), by class (normal messages: 1).
_HANDS = {"lost": 0, "in_doubt": 0, "duplicated": 2}


def _order_expected(cfg: SynthConfig, p: Plan) -> dict[str, int]:
    """The order counts. Every subscription is handed its messages in publish order, except on the
    anomaly topic: there a `lost` or `in_doubt` message with a later message of its publisher handed
    (published: not `unexpected`) is a FIFO gap. A `false_accept` message is handed late; with one
    or two publishers a later anomaly of its publisher may come first (a reversal, depending on the
    random latencies): then `fifo_reversals` is left out (not predicted)."""
    anomaly = sorted((n, c) for n, c in p.anomaly_of.items() if c != "ended_before_delivery")
    handed = [(n, c) for n, c in anomaly if _HANDS.get(c, 1) and c != "unexpected"]
    gaps = sum(1 for n, c in anomaly if c in ("lost", "in_doubt")
               and any(m > n and m % cfg.publishers == n % cfg.publishers for m, _ in handed))
    risky = any(c == "false_accept" and any(n < m <= n + 2 and m % cfg.publishers == n % cfg.publishers
                                            for m, _ in handed) for n, c in handed)
    # publishers and subscribers are different clients: no message has a causal dependency
    counts = {"fifo_gaps": gaps, "total_order_disagreements": 0, "causal_violations": 0}
    return counts if risky else {"fifo_reversals": 0, **counts}


def expected(cfg: SynthConfig, p: Plan) -> dict[str, int]:
    """The counts the reconciliation must find."""
    by_topic = _subs_of_topic(cfg)
    counts = dict.fromkeys(CLASSES, 0)
    normal_per_topic = [0] * cfg.topics
    for t in range(cfg.topics):
        normal_per_topic[t] = len(range(t, cfg.messages, cfg.topics))
    for n in p.anomaly_of:
        normal_per_topic[n % cfg.topics] -= 1
    counts["ok"] = sum(normal_per_topic[t] * len(by_topic[t]) for t in range(cfg.topics))
    for cls in p.anomaly_of.values():
        counts[cls] += 1
    unexpected = counts["unexpected"]
    # in_doubt and recovered records never settle at their entry router
    live, dead = cfg.stuck_live, cfg.stuck_dead
    for n, cls in p.anomaly_of.items():
        if cls in ("in_doubt", "recovered"):
            if _inc(p, _entry(cfg, n), cfg.t0 + n / cfg.rate) == "R0-1" and p.restart_at is not None:
                dead += 1
            else:
                live += 1
    return {**counts,
            "messages": cfg.messages - unexpected,
            "messages_in_doubt": counts["in_doubt"] + counts["recovered"],
            "pairs": sum(counts.values()),
            "malformed_lines": cfg.malformed,
            "newer_version_lines": cfg.newer,
            "unsettled_live": live,
            "unsettled_dead": dead,
            **_order_expected(cfg, p)}


# ================================================================ hand-built logs
class LogBook:
    """Hand-written settlement logs through the real writer (`SettlementLog`): one file per
    (source, node, incarnation), lines with the timestamps you give. For tests and examples.

        with LogBook(tmp) as book:
            book.write("publisher", "P", "published", 10.0, gid="g1", topic="t", pub="p", seq=1)
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        self._logs: dict[tuple[str, str, str], SettlementLog] = {}

    def write(self, src: str, node: str, ev: str, ts: float, *, inc: str = "1", gid: str | None = None,
              topic: str | None = None, sub: str | None = None, **fields: Any) -> None:
        key = (src, node, inc)
        log = self._logs.get(key)
        if log is None:
            log = self._logs[key] = SettlementLog(self.out / f"{node}.{src}.{inc}.jsonl", src, node, inc)
        log.write(ev, ts, gid, topic, sub, **fields)

    def raw(self, name: str, text: str) -> None:
        """Append `text` as is to the file `name` (bad lines, future versions)."""
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / name, "a", encoding="utf-8") as f:
            f.write(text)

    def close(self) -> None:
        for log in self._logs.values():
            log.close()
        self._logs.clear()

    def __enter__(self) -> LogBook:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# ================================================================ synthetic runs
def _inc(p: Plan, r: int, t_msg: float) -> str:
    """A message's lines at a router all belong to the incarnation that received it."""
    if r == 0 and p.restart_at is not None and t_msg >= p.restart_at:
        return "R0-2"
    return f"R{r}-1"


def _write_chunk(args: tuple[SynthConfig, Plan, int, int, int, str]) -> int:
    cfg, p, chunk, lo, hi, out = args
    dt = 1.0 / cfg.rate
    by_topic = _subs_of_topic(cfg)
    rng = random.Random(cfg.seed * 1_000_003 + chunk)
    rbuf: list[str] = []
    pbuf: list[str] = []
    sbuf: list[str] = []
    head = '{"v":1,"ts":'
    # `n` of the handed lines: a subscription's hand-overs before message n, counted without the
    # other chunks (a normal subscription gets every message of its topic but the anomalies; the
    # anomaly subscription the anomalies, by their hand-overs)
    anomalous = sorted(p.anomaly_of)
    by_residue = [[a for a in anomalous if a % cfg.topics == t] for t in range(cfg.topics)]
    anomaly_handed = [a for a in anomalous if p.anomaly_of[a] != "ended_before_delivery"]
    anomaly_before = [0]
    for a in anomaly_handed:
        anomaly_before.append(anomaly_before[-1] + _HANDS.get(p.anomaly_of[a], 1))

    for n in range(lo, hi):
        pi = n % cfg.publishers
        r0 = pi % cfg.routers
        topic_i = n % cfg.topics
        t = cfg.t0 + n * dt

        def rl(ts: float, r: int, rest: str, t: float = t) -> None:
            rbuf.append(f'{head}{ts:.6f},"src":"router","node":"R{r}","inc":"{_inc(p, r, t)}",{rest}}}\n')

        lat = dt * (0.2 + 4.8 * rng.random())  # this message's latency scale, < 5 dt
        gid = f"p{pi}:{n}"
        pubh = f'"src":"publisher","node":"pubc-{pi}","inc":"run-{pi}","ev":'
        pubf = f'"pub":"p{pi}","link":"put:t","seq":{n}'
        cls = p.anomaly_of.get(n)
        if cls is None:
            topic = f"t{topic_i}"
            subs = [(f"s{i}", i % cfg.routers) for i in by_topic[topic_i]]
        elif cls == "ended_before_delivery":
            topic = f"ended{n}"
            subs = [(f"s-ended{n}", r0)]
        else:
            topic = ANOMALY_TOPIC
            subs = [(ANOMALY_SUB, 0)]
        if cls != "unexpected":
            pbuf.append(f'{head}{t:.6f},{pubh}"published","gid":"{gid}","topic":"{topic}",{pubf},"size":64}}\n')
        rl(t + 0.05 * lat, r0, f'"ev":"received","gid":"{gid}","topic":"{topic}","size":64,"count":{len(subs)}')
        if cls == "ended_before_delivery":
            sid = subs[0][0]
            start, end = t - dt / 4, t + 0.25 * lat
            for ts, ev in ((start, "subscribed"), (end, "unsubscribed")):
                rl(ts, r0, f'"ev":"{ev}","topic":"{topic}","sub":"{sid}","container":"subc-{sid}","link":"l"')
                sbuf.append(f'{head}{ts:.6f},"src":"subscriber","node":"subc-{sid}","inc":"run","ev":"{ev}",'
                            f'"topic":"{topic}","sub":"{sid}","container":"subc-{sid}","link":"l"}}\n')
            rl(t + 0.26 * lat, r0, f'"ev":"ended","gid":"{gid}","topic":"{topic}","sub":"{sid}","info":"unsubscribed"')
            rl(t + 0.4 * lat, r0, f'"ev":"outcome","gid":"{gid}","topic":"{topic}","outcome":"ACCEPTED","count":1')
            pbuf.append(f'{head}{t + 0.5 * lat:.6f},{pubh}"outcome","gid":"{gid}","topic":"{topic}",{pubf},'
                        f'"outcome":"ACCEPTED"}}\n')
            rl(t + 0.6 * lat, r0, f'"ev":"settled","gid":"{gid}","topic":"{topic}"')
            continue
        handed_at = t + 0.2 * lat
        told_at = t + 0.5 * lat
        if cls == "false_accept":
            handed_at, told_at = t + 0.5 * lat, t + 0.3 * lat
        remote = sorted({r for _, r in subs if r != r0})
        for r in remote:
            rl(t + 0.07 * lat, r0, f'"ev":"forwarded","gid":"{gid}","topic":"{topic}","peer":"R{r}"')
            rl(t + 0.09 * lat, r, f'"ev":"forward_received","gid":"{gid}","topic":"{topic}","peer":"R{r0}"')
        hand = 1 if cls is None else _HANDS.get(cls, 1)
        if cls is None:
            before = len(range(topic_i, n, cfg.topics)) - bisect.bisect_left(by_residue[topic_i], n)
        else:
            before = anomaly_before[bisect.bisect_left(anomaly_handed, n)]
        for sid, r in subs:
            rl(t + 0.1 * lat, r, f'"ev":"delivered","gid":"{gid}","topic":"{topic}","sub":"{sid}"')
            for k in range(hand):
                sbuf.append(f'{head}{handed_at + k * 0.01 * lat:.6f},"src":"subscriber","node":"subc-{sid}",'
                            f'"inc":"run","ev":"handed","gid":"{gid}","topic":"{topic}","sub":"{sid}","link":"l",'
                            f'"n":{before + k + 1}}}\n')
            if hand:
                rl(handed_at + 0.05 * lat, r, f'"ev":"accepted","gid":"{gid}","topic":"{topic}","sub":"{sid}"')
        if cls in ("in_doubt", "recovered"):
            continue  # the publisher never hears: no outcome, the record stays (stuck in doubt)
        rl(told_at - 0.05 * lat, r0,
           f'"ev":"outcome","gid":"{gid}","topic":"{topic}","outcome":"ACCEPTED","count":{len(subs)}')
        if cls != "unexpected":
            pbuf.append(f'{head}{told_at:.6f},{pubh}"outcome","gid":"{gid}","topic":"{topic}",{pubf},'
                        f'"outcome":"ACCEPTED"}}\n')
        if n in p.stuck_dead or n in p.stuck_live:
            continue
        rl(told_at + 0.1 * lat, r0, f'"ev":"settled","gid":"{gid}","topic":"{topic}"')
        for r in remote:
            rl(told_at + 0.12 * lat, r, f'"ev":"settled","gid":"{gid}","topic":"{topic}"')
    base = Path(out)
    for name, buf in (("routers", rbuf), ("publishers", pbuf), ("subscribers", sbuf)):
        with open(base / f"{name}-{chunk:04d}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(buf)
    return len(rbuf) + len(pbuf) + len(sbuf)


def _preamble(cfg: SynthConfig, p: Plan) -> list[str]:
    """Router starts, subscription lifecycle, bad lines."""
    t = cfg.t0
    lines = []
    for r in range(cfg.routers):
        lines.append(f'{{"v":1,"ts":{t - 2:.6f},"src":"router","node":"R{r}","inc":"R{r}-1","ev":"router_started"}}\n')
    if p.restart_at is not None:
        lines.append(f'{{"v":1,"ts":{p.restart_at:.6f},"src":"router","node":"R0","inc":"R0-2",'
                     f'"ev":"router_started"}}\n')
    subs = [(f"s{i}", f"t{i % cfg.topics}", i % cfg.routers) for i in range(cfg.subscriptions)]
    if any(c != "ended_before_delivery" for c in p.anomaly_of.values()):
        subs.append((ANOMALY_SUB, ANOMALY_TOPIC, 0))
    for sid, topic, r in subs:
        fields = f'"topic":"{topic}","sub":"{sid}","container":"subc-{sid}","link":"l"'
        lines.append(f'{{"v":1,"ts":{t - 1:.6f},"src":"router","node":"R{r}","inc":"R{r}-1",'
                     f'"ev":"subscribed",{fields}}}\n')
        lines.append(f'{{"v":1,"ts":{t - 0.999:.6f},"src":"subscriber","node":"subc-{sid}","inc":"run",'
                     f'"ev":"subscribed",{fields}}}\n')
    for i in range(cfg.malformed):
        lines.append(['{"v":1,"ts":"not a number","src":"router","node":"R0","inc":"x","ev":"received"}\n',
                      'this is not json\n', '{"v":1,"ts":1.0,"src":"router"\n'][i % 3])
    for i in range(cfg.newer):
        lines.append(f'{{"v":3,"ts":{t:.6f},"src":"router","node":"R0","inc":"R0-1","ev":"teleported",'
                     f'"gid":{{"new":"shape{i}"}}}}\n')
    return lines


def generate(cfg: SynthConfig, out: Path) -> dict[str, int]:
    """Write the logs under `out` and `out/expected.json`; returns the expected counts (with the
    number of lines written as `log_lines`)."""
    cfg.validate()
    p = plan(cfg)
    out.mkdir(parents=True, exist_ok=True)
    pre = _preamble(cfg, p)
    (out / "lifecycle.jsonl").write_text("".join(pre), encoding="utf-8")
    chunks = cfg.chunks or max(1, min(os.cpu_count() or 1, cfg.messages // 50_000 or 1))
    step = -(-cfg.messages // chunks)
    jobs = [(cfg, p, c, c * step, min(cfg.messages, (c + 1) * step), str(out))
            for c in range(chunks) if c * step < cfg.messages]
    if len(jobs) == 1:
        written = [_write_chunk(jobs[0])]
    else:
        # spawn, not fork: the caller may be a multi-threaded process (a Spark driver)
        with ProcessPoolExecutor(max_workers=len(jobs), mp_context=multiprocessing.get_context("spawn")) as ex:
            written = list(ex.map(_write_chunk, jobs))
    exp = expected(cfg, p)
    exp["log_lines"] = len(pre) + sum(written)
    (out / "expected.json").write_text(
        json.dumps({"config": {**asdict(cfg), "anomalies": dict(cfg.anomalies)}, "expected": exp},
                   indent=2) + "\n")
    return exp


def _anomaly(text: str) -> tuple[str, int]:
    name, _, n = text.partition("=")
    if name not in ANOMALIES:
        raise argparse.ArgumentTypeError(f"unknown anomaly {name!r} (one of {', '.join(ANOMALIES)})")
    try:
        return name, int(n or "1")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected CLASS=N") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spark.synth", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--subscriptions", type=int, default=2)
    ap.add_argument("--routers", type=int, default=1)
    ap.add_argument("--topics", type=int, default=1)
    ap.add_argument("--anomaly", type=_anomaly, action="append", default=[], metavar="CLASS=N",
                    help=f"inject N pairs of CLASS (repeatable): {', '.join(ANOMALIES)}")
    ap.add_argument("--all-anomalies", type=int, default=0, metavar="N", help="N of every class")
    ap.add_argument("--stuck-dead", type=int, default=0)
    ap.add_argument("--stuck-live", type=int, default=0)
    ap.add_argument("--malformed", type=int, default=0)
    ap.add_argument("--newer", type=int, default=0)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--chunks", type=int, default=0)
    a = ap.parse_args(argv)
    anomalies = dict.fromkeys(ANOMALIES, a.all_anomalies) if a.all_anomalies else {}
    for name, n in a.anomaly:
        anomalies[name] = n
    cfg = SynthConfig(messages=a.messages, publishers=a.publishers, subscriptions=a.subscriptions,
                      routers=a.routers, topics=a.topics, anomalies=anomalies, stuck_dead=a.stuck_dead,
                      stuck_live=a.stuck_live, malformed=a.malformed, newer=a.newer, rate=a.rate,
                      seed=a.seed, chunks=a.chunks)
    try:
        exp = generate(cfg, a.out)
    except ValueError as exc:
        print(f"spark.synth: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(exp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
