"""Bytes of settlement log on disk per (message, subscription) pair, network-wide.

    python -m oncemesh.harness.logbytes [--messages N] [--topology line3] [--keep DIR]

Starts the topology (`oncemesh up`), makes one durable subscription per router (s1 on the first
router, s2 on the second, ...), publishes N messages from the first router with `oncemesh put`,
receives them all with `oncemesh get`, stops the mesh (`oncemesh down`), and divides the bytes of
every settlement log file under the mesh's log directory (router and client logs, plain and
compressed segments) by N x subscriptions; `bytes_per_pair_all_gzipped` is the same with every
plain file gzipped as a closed segment would be. docs/settlement-log.md quotes the figures.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from ..topology.load import example_path

SETTLEMENT_SUFFIXES = (".jsonl", ".jsonl.gz")


def oncemesh(*args: str, timeout: float = 300.0) -> str:
    p = subprocess.run([sys.executable, "-m", "oncemesh", *args], capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"oncemesh {' '.join(args[:2])} ...: rc {p.returncode}\n{p.stderr[-2000:]}")
    return p.stdout


def log_bytes(log_dir: Path) -> dict[str, int]:
    """Bytes per settlement-log file (name relative to log_dir)."""
    return {str(f.relative_to(log_dir)): f.stat().st_size for f in sorted(log_dir.rglob("*"))
            if f.is_file() and f.name.endswith(SETTLEMENT_SUFFIXES)}


def measure(topology: Path, messages: int, work: Path) -> dict[str, object]:
    state = work / "mesh"
    logs = work / "client-logs"
    oncemesh("up", str(topology), "--state-dir", str(state))
    try:
        status = json.loads(oncemesh("status", "--state-dir", str(state), "--json"))
        rows = status if isinstance(status, list) else status.get("routers", [])
        urls = [str(r["url"]) for r in rows]
        subs = [f"s{i + 1}" for i in range(len(urls))]
        for i, (url, sub) in enumerate(zip(urls, subs, strict=True)):
            oncemesh("subscribe", "t", "--subscription", sub, "--url", url,
                     "--state-dir", str(work / f"sub{i}"), "--log-dir", str(logs))
        getters = [subprocess.Popen(
            [sys.executable, "-m", "oncemesh", "get", "t", "--subscription", sub, "--count",
             str(messages), "--timeout", "300", "--url", url, "--state-dir", str(work / f"sub{i}"),
             "--log-dir", str(logs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i, (url, sub) in enumerate(zip(urls, subs, strict=True))]
        try:
            # the put waits for every outcome: the subscribers must be attached meanwhile
            oncemesh("put", "t", *(f"m{i}" for i in range(messages)), "--url", urls[0],
                     "--state-dir", str(work / "pub"), "--log-dir", str(logs))
            for sub, g in zip(subs, getters, strict=True):
                out, err = g.communicate(timeout=300)
                if g.returncode != 0 or len(out.split()) != messages:
                    raise RuntimeError(f"{sub}: rc {g.returncode}, got {len(out.split())} of "
                                       f"{messages}\n{err[-2000:]}")
        finally:
            for g in getters:
                if g.poll() is None:
                    g.kill()
                    g.wait()
    finally:
        oncemesh("down", "--state-dir", str(state))
    files = {**{f"mesh/{k}": v for k, v in log_bytes(state / "logs").items()},
             **{f"clients/{k}": v for k, v in log_bytes(logs).items()}}
    total = sum(files.values())
    pairs = messages * len(subs)
    # what the same lines take once every file is a closed, gzipped segment (the steady state of a
    # long run: only the open segment of each writer is plain)
    closed = sum(len(gzip.compress(f.read_bytes(), 6)) if f.name.endswith(".jsonl") else f.stat().st_size
                 for d in (state / "logs", logs) for f in d.rglob("*") if f.name.endswith(SETTLEMENT_SUFFIXES))
    return {"messages": messages, "subscriptions": len(subs), "pairs": pairs, "bytes": total,
            "bytes_per_pair": round(total / pairs, 1),
            "bytes_per_pair_all_gzipped": round(closed / pairs, 1), "files": files,
            "log_dirs": [str(state / "logs"), str(logs)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oncemesh.harness.logbytes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--topology", default="line3", help="file, or a name in topology/examples")
    ap.add_argument("--keep", type=Path, help="work directory (kept); default: a temporary one")
    args = ap.parse_args(argv)
    topo = Path(args.topology)
    if not topo.exists():
        topo = example_path() / f"{args.topology}.toml"
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        result = measure(topo, args.messages, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="oncemesh-logbytes-") as tmp:
            result = measure(topo, args.messages, Path(tmp))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
