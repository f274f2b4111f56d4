"""Gossip convergence figures: how long the mesh takes to agree again after a router dies or joins.

    python -m oncemesh.harness.convergence                              # line3, victim C, 5 rounds
    python -m oncemesh.harness.convergence --topology mesh4 --victim B --repeat 3 --json

Each round, on a converged mesh, with the routers' own timing settings from the topology file:

- `death`: the victim is SIGKILLed (or, with `--fault freeze`, SIGSTOPped; `--fault stop`: SIGTERM,
  a clean leave); measured from the signal until every surviving router shows exactly the peers it
  can still reach and says it has converged (its status file, rewritten by the router when its view
  changes);
- `join`: the victim is started again (a new incarnation) and measured from the moment its process
  is ready (accepting connections) until every router, the newcomer included, has converged and
  sees every other one: the newcomer learned the link state and synced the full subscription table,
  the others learned the new incarnation. `start` adds the process start-up before it (Python
  imports, state load, binding).

A frozen victim is thawed and killed before it is started again. The figures are read by polling
the status files every 5 ms, so they are upper bounds by that much.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..topology.launcher import Mesh, MeshError
from .chaos import resolve_topology

POLL = 0.005


@dataclass(frozen=True, slots=True)
class Round:
    death: float  # fault -> survivors agree
    join: float  # newcomer ready -> everyone agrees
    start: float  # process start -> newcomer ready

    def to_json(self) -> dict[str, float]:
        return {"death": round(self.death, 4), "join": round(self.join, 4), "start": round(self.start, 4)}


def _until_converged(mesh: Mesh, up: list[str], timeout: float) -> float:
    t0 = time.monotonic()
    while mesh.convergence_problems(up):
        if time.monotonic() - t0 > timeout:
            raise MeshError("no convergence within {:g} s: {}".format(timeout, "; ".join(mesh.convergence_problems(up))))
        time.sleep(POLL)
    return time.monotonic()


def measure(topology: str | Path, victim: str, *, fault: str = "kill", repeat: int = 5,
            state_dir: Path | None = None, timeout: float = 30.0) -> list[Round]:
    """Run `repeat` death-and-join rounds of `victim` on a mesh started for the purpose."""
    path = resolve_topology(str(topology))
    work = state_dir or Path(tempfile.mkdtemp(prefix="oncemesh-convergence-"))
    rounds: list[Round] = []
    with Mesh(path, work) as mesh:
        mesh.topology.router(victim)  # fails clearly for an unknown id
        if len(mesh.topology.routers) < 2:
            raise MeshError("convergence needs at least two routers")
        everyone = sorted(mesh.topology.routers)
        survivors = [r for r in everyone if r != victim]
        mesh.up(timeout=timeout)
        mesh.wait_converged(timeout)
        for _ in range(repeat):
            t0 = time.monotonic()
            if fault == "kill":
                mesh.kill_router(victim)
            elif fault == "freeze":
                mesh.freeze(victim)
            else:
                mesh.stop_router(victim)
            t_dead = _until_converged(mesh, survivors, timeout)
            if fault == "freeze":
                mesh.kill_router(victim, signal.SIGKILL)
            t1 = time.monotonic()
            mesh.start_router(victim, wait=timeout)
            t_ready = time.monotonic()
            t_all = _until_converged(mesh, everyone, timeout)
            rounds.append(Round(t_dead - t0, t_all - t_ready, t_ready - t1))
    return rounds


def _stats(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:8.0f} ms  ({min(xs) * 1000:.0f}–{max(xs) * 1000:.0f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oncemesh.harness.convergence", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default="line3", help="a topology file or example name (default line3)")
    p.add_argument("--victim", default=None, help="the router that dies and joins (default: the last one)")
    p.add_argument("--fault", choices=["kill", "freeze", "stop"], default="kill",
                   help="how it dies: SIGKILL (default), SIGSTOP (noticed by heartbeats), SIGTERM (leave)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--state-dir", type=Path, default=None, help="keep the mesh's files here")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    victim = a.victim
    if victim is None:
        from ..topology.load import load_topology
        victim = sorted(load_topology(resolve_topology(a.topology)).routers)[-1]
    try:
        rounds = measure(a.topology, victim, fault=a.fault, repeat=a.repeat, state_dir=a.state_dir)
    except (MeshError, ValueError, KeyError) as e:
        print(f"convergence: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"topology": str(a.topology), "victim": victim, "fault": a.fault,
                          "rounds": [r.to_json() for r in rounds]}))
        return 0
    print(f"{a.topology}, victim {victim}, fault {a.fault}, {len(rounds)} rounds (median, min–max):")
    print(f"  death: survivors agree after   {_stats([r.death for r in rounds])}")
    print(f"  join:  all agree after ready   {_stats([r.join for r in rounds])}")
    print(f"  start: process start to ready  {_stats([r.start for r in rounds])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
