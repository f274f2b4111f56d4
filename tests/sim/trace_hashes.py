"""Trace hashes of the mesh simulation, seed by seed: the tool that shows a refactoring changed no
behaviour. Each simulation's hash covers every step the kernel ran (its time and the function that
ran) and what every subscription was handed, in order, and every publisher's outcome.

    python -m tests.sim.trace_hashes --seeds 20 > before.txt      # on the base commit
    python -m tests.sim.trace_hashes --seeds 20 --compare before.txt  # after the change

A seed's run does not depend on the interpreter's hash seed (tests/sim/test_edge_sim.py runs a few
under two); the tool still sets PYTHONHASHSEED=0 for itself when it is not set, so that outputs of
versions from before that compare. Cases: the default run's (tests/sim/test_sim.py) without the
stall faults: no faults, each fault, drains, and the three ordering modes; `--stalls` adds the stall
faults' cases, `--cases a,b` picks some.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Iterator

CASES: list[tuple[str, str, bool | str, bool]] = [  # (name, faults, total, causal)
    ("mesh", "", False, False),
    ("kill", "kill", False, False),
    ("freeze", "freeze", False, False),
    ("partition", "partition", False, False),
    ("loss", "loss", False, False),
    ("all", "kill,freeze,partition,loss", False, False),
    ("drain", "drain,kill,freeze,partition,loss", False, False),
    ("total", "kill,freeze,partition,loss", True, False),
    ("lamport", "kill,freeze,partition,loss", "lamport", False),
    ("causal", "kill,freeze,partition,loss", False, True),
]
# the stall faults' cases (`--stalls`; not in the default list, whose hashes predate them)
STALL_CASES: list[tuple[str, str, bool | str, bool]] = [
    ("stop", "stop", False, False),
    ("starve", "starve", False, False),
    ("stalls", "stop,starve,kill,freeze,partition,loss", False, False),
]


def trace_hash(seed: int, faults: str, total: bool | str, causal: bool) -> str:
    from tests.sim.simulator import Faults, Simulation
    from tests.sim.test_sim import TOPOLOGIES, graph

    topology = sorted(TOPOLOGIES)[seed % len(TOPOLOGIES)]
    duration = 6.0 if not faults else 8.0
    sim = Simulation(seed, graph(topology), faults=Faults.parse(faults), duration=duration, messages=30,
                     total=total, causal=causal)
    sim.k.trace()
    try:
        sim.run()
        verdict = "ok"
    except AssertionError as exc:  # a violation is part of the behaviour too
        verdict = f"violation {type(exc).__name__}"
    h = hashlib.blake2b(digest_size=8)
    h.update(sim.k.digest().encode())
    for sid in sorted(sim.sequence):
        h.update(f"{sid}:{','.join(sim.sequence[sid])}\n".encode())
    for gid in sorted(sim.outcomes):
        h.update(f"{gid}={sim.outcomes[gid]}\n".encode())
    return f"{h.hexdigest()} steps={sim.k.steps} {verdict}"


def lines(seeds: int, cases: list[tuple[str, str, bool | str, bool]] = CASES) -> Iterator[str]:
    for name, faults, total, causal in cases:
        for seed in range(1, seeds + 1):
            yield f"{name} {seed} {trace_hash(seed, faults, total, causal)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20, help="seeds 1..N of every case (default 20)")
    ap.add_argument("--compare", metavar="FILE", help="a previous output: print the cases whose hash differs")
    ap.add_argument("--stalls", action="store_true", help="the stall faults' cases too")
    ap.add_argument("--cases", help="only these cases (names, comma-separated)")
    args = ap.parse_args(argv)
    cases = CASES + (STALL_CASES if args.stalls else [])
    if args.cases:
        wanted = args.cases.split(",")
        cases = [c for c in CASES + STALL_CASES if c[0] in wanted]
    if "PYTHONHASHSEED" not in os.environ:  # the same iteration order in every run of the tool
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tests.sim.trace_hashes", *(argv or sys.argv[1:])])
    before: dict[str, str] = {}
    if args.compare:
        with open(args.compare) as f:
            for line in f:
                name, seed, rest = line.rstrip("\n").split(" ", 2)
                before[f"{name} {seed}"] = rest
    differ = 0
    for line in lines(args.seeds, cases):
        print(line, flush=True)
        name, seed, rest = line.split(" ", 2)
        key = f"{name} {seed}"
        if args.compare and before.get(key) != rest:
            differ += 1
            print(f"DIFFERS {key}: before {before.get(key)}", file=sys.stderr, flush=True)
    if args.compare:
        print(f"{differ} differ of {len(cases) * args.seeds}", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
