"""How the replicated subscription table scales: a mesh of many routers with many subscriptions,
measured in one process on the routers' own pure parts (router/subscriptions.py, interrouter/gossip.py,
the inter-router codec), with no sockets.

    python -m oncemesh.harness.tablescale                         # 100 routers, 100,000 subscriptions
    python -m oncemesh.harness.tablescale --routers 20 --subscriptions 10000 --wildcards 0.2 --json

Every router holds the whole table (docs/architecture.md, "The subscription table"): what one
subscription costs is paid at every router, and a router that restarts learns the whole table again.
The figures:

- `table_bytes_per_subscription`: the Python heap one table entry takes (tracemalloc over building a
  table of N entries: the entry, its JSON-able fields, the indexes by topic and by filter);
- `update_bytes` / `ack_bytes`: one announcement of a new subscription (a SubUpdate control frame)
  and its acknowledgement, as encoded on an inter-router link; `bytes_per_change` is what one new
  subscription puts on the mesh's links: an announcement to, and an ack from, each other router
  (routing hops not counted: in a full mesh each is one hop);
- `sync_bytes`, `sync_encode_s`, `sync_merge_s`: one whole-table sync (TableSync of N entries)
  encoded, and merged by a router that lost its table (a restart), measured; `restart_catch_up_s`
  is what a restarted router spends merging the tables of its peers: each of the R-1 others sends
  it its whole table when they see it again (gossip.py, `handle_sync`), R-1 merges of N entries,
  plus answering each with its own (R-1 encodes). Derived from the measured rates, on one core,
  with the routers' loops doing nothing else;
- `match_us`: `live_for_topic` of a message's topic against the full table (literal and wildcard
  filters, the per-topic cache cold), CPU-µs per call.

Where it stops scaling is the restart: the catch-up grows with routers x subscriptions.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
import tracemalloc
from typing import Any

from ..interrouter.codec import encode_control
from ..interrouter.gossip import Gossip
from ..interrouter.messages import SubAck, SubUpdate, TableSync
from ..router.subscriptions import SubscriptionTable


def _filters(n: int, wildcards: float, rng: random.Random) -> list[str]:
    """N subscription topics over a tree of 3 levels: a share `wildcards` of them filters."""
    out = []
    for _ in range(n):
        a, b, c = rng.randrange(100), rng.randrange(100), rng.randrange(10)
        if rng.random() < wildcards:
            out.append(rng.choice((f"t{a}/+/l{c}", f"t{a}/#", f"+/s{b}/l{c}", f"t{a}/s{b}/+")))
        else:
            out.append(f"t{a}/s{b}/l{c}")
    return out


def _table(routers: list[str], filters: list[str]) -> SubscriptionTable:
    table = SubscriptionTable()
    for i, f in enumerate(filters):
        home = routers[i % len(routers)]
        table.attach(f"sid{i:08d}", f, f"client-{i}", f"sub-{i}", 3600.0, home, 1_900_000_000.0 + i,
                     owner=f"user{i % 50}", inc="inc-1")
    return table


def measure(routers: int, subscriptions: int, wildcards: float, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    names = [f"R{i:03d}" for i in range(routers)]
    filters = _filters(subscriptions, wildcards, rng)

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    table = _table(names, filters)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per_sub = (after - before) / subscriptions

    entry = next(iter(table)).to_json()
    update = len(encode_control([SubUpdate(names[0], names[1], entry, 7)]))
    ack = len(encode_control([SubAck(names[1], names[0], str(entry["sid"]), 7, True)]))

    t = time.process_time()
    sync = TableSync(names[0], names[1], "inc-1", [s.to_json() for s in table], False)
    frame = encode_control([sync])
    encode_s = time.process_time() - t

    fresh = Gossip(names[1], "inc-2", SubscriptionTable(), set(names))
    t = time.process_time()
    fresh.handle_sync(sync)
    merge_s = time.process_time() - t
    assert len(fresh.table) == subscriptions

    t = time.process_time()
    again = fresh.handle_sync(TableSync(names[2], names[1], "inc-1", sync.entries, False))  # nothing new
    merge_known_s = time.process_time() - t
    assert not again

    topics = [f"t{rng.randrange(100)}/s{rng.randrange(100)}/l{rng.randrange(10)}" for _ in range(2000)]
    owed = 0
    t = time.process_time()
    for topic in topics:
        table._matched.clear()  # (cold: the per-topic cache of live_for_topic)
        owed += len(tuple(table.live_for_topic(topic)))
    match_us = (time.process_time() - t) / len(topics) * 1e6

    return {
        "routers": routers, "subscriptions": subscriptions, "wildcard_share": wildcards,
        "table_bytes_per_subscription": round(per_sub), "table_mb": round((after - before) / 1e6, 1),
        "update_bytes": update, "ack_bytes": ack, "bytes_per_change": (update + ack) * (routers - 1),
        "sync_bytes": len(frame), "sync_encode_s": round(encode_s, 3), "sync_merge_s": round(merge_s, 3),
        "sync_merge_known_s": round(merge_known_s, 3),
        "restart_catch_up_s": round((routers - 1) * (merge_known_s + encode_s) + merge_s, 1),
        "restart_sync_mb_in": round((routers - 1) * len(frame) / 1e6, 1),
        "match_us": round(match_us, 2), "owed_per_message": round(owed / len(topics), 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oncemesh.harness.tablescale",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--routers", type=int, default=100, help="routers in the mesh (default 100)")
    p.add_argument("--subscriptions", type=int, default=100_000, help="subscriptions, spread over the routers "
                                                                       "(default 100,000)")
    p.add_argument("--wildcards", type=float, default=0.1, help="share of subscriptions to wildcard filters "
                                                                 "(default 0.1)")
    p.add_argument("--seed", type=int, default=1, help="seed of the topics and filters (default 1)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    if args.routers < 3 or args.subscriptions < 1 or not 0 <= args.wildcards <= 1:
        p.error("--routers at least 3, --subscriptions at least 1, --wildcards between 0 and 1")
    r = measure(args.routers, args.subscriptions, args.wildcards, args.seed)
    if args.json:
        print(json.dumps(r))
    else:
        for k, v in r.items():
            print(f"{k:32} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
