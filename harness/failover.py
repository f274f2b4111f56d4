"""Failover figures: how long traffic stops when a router is SIGKILLed or SIGSTOPped.

    python -m oncemesh.harness.failover --fault kill --repeat 5
    python -m oncemesh.harness.failover --fault freeze --topology mesh4 --publisher A --subscriber C --victim B

Why a separate tool: the chaos runner answers "were the promises kept", not "how long did the
outage last". Here one fault at a time hits a steady stream, and the outage is read from the client
settlement logs (exact, flushed before acting), as a subscriber on another router sees it:

- `resume`: from the fault to the first hand-over of a message first sent after the fault (new
  traffic flows again end to end);
- `gap`: the longest pause between two consecutive hand-overs around the fault.

Default scenario: triangle A-B-C, publisher on A (URLs A, B, C), subscriber on B, victim A: the
publisher must notice (a closed connection for SIGKILL, its idle timeout for SIGSTOP), fail over to
B and resend what was in doubt. Each repetition uses a new publisher; the victim is restarted or
thawed, and the mesh converged again, in between.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..topology.launcher import Mesh
from ..topology.load import with_topic_order
from .chaos import resolve_topology
from .procs import Proc, python_cmd, wait_for
from .progress import ClientLogs


@dataclass(frozen=True, slots=True)
class Outage:
    fault: str
    resume: float  # seconds from the fault to the first new message handed over
    gap: float  # longest pause between hand-overs around the fault

    def to_json(self) -> dict[str, object]:
        return {"fault": self.fault, "resume": round(self.resume, 3), "gap": round(self.gap, 3)}


def _worker(kind: str, args: list[str], out: Path) -> Proc:
    return Proc(python_cmd("-m", "oncemesh.harness.worker", kind, *args), out)


def measure(topology: str | Path, fault: str, *, repeat: int = 3, publisher: str = "A", subscriber: str = "B",
            victim: str | None = None, rate: float = 200.0, state_dir: Path | None = None,
            say: Callable[[str], None] = print, order: str = "fifo") -> list[Outage]:
    """Run `repeat` outages of kind `fault` (kill | freeze) and return what the subscriber saw."""
    if fault not in ("kill", "freeze"):
        raise ValueError("fault must be kill or freeze")
    victim = victim or publisher
    if victim == subscriber:
        raise ValueError("the subscriber must be on another router than the victim")
    tmp = state_dir or Path(tempfile.mkdtemp(prefix="oncemesh-failover-"))
    logs = tmp / "clientlogs"
    topo = resolve_topology(topology)
    if order != "fifo":  # the measured topic in another order (total: by the sequencer)
        topo = with_topic_order(topo, ["f"], order, tmp / f"{topo.stem}-{order}.toml")
    mesh = Mesh(topo, tmp / "mesh")
    procs: list[Proc] = []
    out: list[Outage] = []
    try:
        mesh.up(timeout=60)
        routers = sorted(mesh.topology.routers)

        def urls(first: str) -> str:
            return ",".join(mesh.url(r) for r in [first, *(r for r in routers if r != first)])

        watch = ClientLogs(logs)
        sub = _worker("consume", ["--url", urls(subscriber), "--topic", "f", "--name", "sub",
                                  "--state-dir", str(tmp / "sub"), "--log-dir", str(logs)], tmp / "sub.out")
        procs.append(sub)

        def subscribed() -> bool:
            watch.poll()
            found = watch.by_link("sub")
            return found is not None and found.started is not None

        wait_for(subscribed, 30, "the subscription")
        s = watch.by_link("sub")
        assert s is not None

        def transit(rid: str) -> int:
            """Copies the router passed on without a record (its ready file's mesh counters)."""
            info = json.loads(mesh.ready_file(rid).read_text() or "{}")
            return int(info.get("mesh", {}).get("transit", 0))

        def handed_at_least(n: int) -> Callable[[], bool]:
            def check() -> bool:
                watch.poll()
                return len(s.handed) >= n
            return check
        import networkx as nx

        # the routers between publisher and subscriber; any other victim is a bystander on the data
        # path (with --order total it may be the sequencer)
        on_path = set(nx.shortest_path(mesh.topology.graph(), publisher, subscriber, weight="cost"))
        for i in range(repeat):
            pub = _worker("publish", ["--url", urls(publisher), "--topic", "f", "--name", f"pub-{i}",
                                      "--count", str(int(rate * 120)), "--rate", str(rate),
                                      "--state-dir", str(tmp / f"pub-{i}"), "--log-dir", str(logs)],
                          tmp / f"pub-{i}.out")
            procs.append(pub)
            wait_for(lambda: len(mesh.live_links()) == len(mesh.topology.links), 60,
                     "every link up (else traffic may not cross the victim)")
            wait_for(handed_at_least(len(s.handed) + int(rate * 2)), 30, "steady traffic")
            if victim in on_path and victim not in (publisher, subscriber):  # a transit router: traffic must cross it now
                start = transit(victim)

                def crossed(n: int = start) -> bool:
                    return transit(victim) >= n + rate / 2

                wait_for(crossed, 30, f"traffic to cross {victim}")
            t_fault = time.time()
            if fault == "kill":
                mesh.kill_router(victim)
            else:
                mesh.freeze(victim)

            def new_traffic(t: float = t_fault) -> float | None:
                watch.poll()
                firsts = [h for g, h in s.handed.items() if watch.published.get(g, 0.0) > t]
                return min(firsts) if len(firsts) >= int(rate) else None

            first_new = wait_for(new_traffic, 60, "traffic to flow again")
            resume = first_new - t_fault
            window = sorted(x for x in s.times if t_fault - 1.0 <= x <= first_new + 1.0)
            gap = max((b - a for a, b in zip(window, window[1:], strict=False)), default=0.0)
            outage = Outage(fault, resume, gap)
            out.append(outage)
            say(f"{fault} {victim} #{i + 1}: traffic flowing again after {resume:.3f}s (longest gap {gap:.3f}s)")
            pub.stop(5)
            if fault == "kill":
                mesh.up(timeout=60)
            else:
                mesh.thaw(victim)
                mesh.wait_converged(60)
        return out
    finally:
        for p in procs:
            if p.alive():
                p.stop(5)
        mesh.down(timeout=10)
        if state_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oncemesh.harness.failover", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fault", choices=["kill", "freeze"], default="kill")
    p.add_argument("--topology", default="triangle")
    p.add_argument("--publisher", default="A", help="router the publisher uses first (default A)")
    p.add_argument("--subscriber", default="B", help="router the subscriber uses (default B)")
    p.add_argument("--victim", default=None, help="router to kill or freeze (default: the publisher's)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rate", type=float, default=200.0, help="messages per second (default 200)")
    p.add_argument("--state-dir", type=Path, default=None, help="keep the run's logs here")
    p.add_argument("--order", choices=["fifo", "causal", "total", "lamport"], default="fifo",
                   help="the order of the measured topic (total: by the sequencer, the highest live router; "
                        "kill it with --victim to measure a sequencer failover; lamport: total by Lamport "
                        "clocks, every router a member: any victim costs a view change)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    outages = measure(args.topology, args.fault, repeat=args.repeat, publisher=args.publisher,
                      subscriber=args.subscriber, victim=args.victim, rate=args.rate, state_dir=args.state_dir,
                      say=(lambda t: print(t, file=sys.stderr)) if args.json else print, order=args.order)
    resumes = [o.resume for o in outages]
    summary = {"fault": args.fault, "topology": args.topology, "order": args.order, "victim": args.victim or args.publisher,
               "subscriber": args.subscriber, "repeat": args.repeat, "rate": args.rate,
               "resume_median": round(statistics.median(resumes), 3), "resume_min": round(min(resumes), 3),
               "resume_max": round(max(resumes), 3), "runs": [o.to_json() for o in outages]}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{args.fault}: traffic flowing again after median {summary['resume_median']}s "
              f"(min {summary['resume_min']}s, max {summary['resume_max']}s) over {args.repeat} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
