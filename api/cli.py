"""`oncemesh`: the one command-line entry point and the composition root.

Each subcommand's arguments and work live next to what it runs; this module only puts them together
(and composes the `router` command: configuration, topology, router). Only the module of the
subcommand being run is imported (`COMMANDS`): a router process loads no tool (bench, chaos, demo,
soak) and no Spark code, and a host without pyspark runs every command that does not judge."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the router's modules load only for `oncemesh router`: every other command starts sooner)
    from .interrouter.mesh import MeshTls
    from .router.config import RouterConfig
    from .router.meshport import MeshPort
    from .topology.model import Topology

DESCRIPTION = """\
oncemesh: a federated network of AMQP 1.0 routers with exactly-once publish/subscribe.

Any AMQP 1.0 client can connect to any router. A publisher is told ACCEPTED only after every
subscription in force for its message accepted it; subscribers get each message exactly once,
across router crashes, failover and their own restarts (with a state directory).

Start here:   oncemesh demo          (a demo mesh on loopback, publishes and checks delivery)
"""

def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "router", help="run one router",
        description="Run one oncemesh router in the foreground until SIGTERM/SIGINT (stop now, cleanly) or\n"
                    "SIGUSR1 (drain: move every client to another router, wait until nothing depends on\n"
                    "this one, at most drain_timeout, then exit; `oncemesh drain` sends it).\n\n"
                    "Standalone:  oncemesh router --id A --listen 127.0.0.1:5672 --state-dir ./state "
                    "--allow-anonymous\n"
                    "In a mesh:   oncemesh router --topology mesh.toml --id A\n\n"
                    "Port 0 picks a free port; --ready-file receives JSON {id, pid, listen, url, ...} once "
                    "the router accepts connections.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--id", required=True, help="router id (unique in the mesh)")
    p.add_argument("--listen", default=None, help="client listener HOST:PORT (default 127.0.0.1:5672; "
                                                   "from the topology file in a mesh)")
    p.add_argument("--topology", type=Path, default=None, help="topology file (TOML): run as part of a mesh")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="where the subscription table is persisted (without it, a restart forgets "
                        "subscriptions: use one in production)")
    p.add_argument("--log-dir", type=Path, default=None,
                   help="where the settlement log and the router log are written")
    p.add_argument("--ready-file", type=Path, default=None,
                   help="write JSON status here once ready (rewritten as the mesh view changes)")
    p.add_argument("--peers-dir", type=Path, default=None,
                   help="directory of the other routers' status files, to find peers whose "
                        "inter-router port is 0 in the topology (default: the ready file's directory)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="override a setting, e.g. --set max_inflight_messages=50000 (repeatable); "
                        "see docs/operations.md for the list")
    p.add_argument("--mesh-tls-dir", type=Path, default=None,
                   help="directory holding ca.pem (the mesh CA), ID.pem and ID.key (this router's "
                        "certificate and key) for inter-router TLS, unless the topology's settings name "
                        "mesh_tls_cert/mesh_tls_key/mesh_tls_ca ('oncemesh up' makes one by itself)")
    p.add_argument("--allow-anonymous", action="store_true",
                   help="let clients connect without credentials (an open router: anyone who reaches the "
                        "port may publish and subscribe). Without users_file or tls_verify_clients a router "
                        "needs this to start (docs/security.md)")
    p.add_argument("--insecure-mesh", action="store_true",
                   help="run a mesh without inter-router TLS: any process that reaches the inter-router "
                        "port can join as a router and forge acknowledgements. For experiments only; "
                        "logged and shown in the status as INSECURE")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="the operational log's level (default INFO)")
    p.add_argument("--stderr-level", default=None, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="the least level also written to stderr (default: WARNING with --log-dir, whose "
                        "ID.router.log has every line and rotates; else the --log-level): under 'oncemesh up' "
                        "stderr goes to logs/ID.out, which does not rotate")
    p.set_defaults(func=cmd_router)


def cmd_router(args: argparse.Namespace) -> int:
    import faulthandler

    from .router.config import RouterConfig, parse_hostport
    from .router.server import configure_logging

    faulthandler.enable()  # a crash in C code (SIGSEGV) leaves every thread's stack on stderr
    cfg = RouterConfig(id=args.id)
    topo: Topology | None = None
    if args.topology is not None:
        from .topology.load import TopologyError, load_topology
        from .topology.views import mesh_view

        try:
            topo = load_topology(args.topology)
        except TopologyError as exc:
            print(f"oncemesh router: {exc}", file=sys.stderr)
            return 2
        if args.id not in topo.routers:
            print(f"oncemesh router: router {args.id!r} is not in {args.topology} "
                  f"(routers: {', '.join(sorted(topo.routers))})", file=sys.stderr)
            return 2
        r = topo.routers[args.id]
        cfg.listen = (r.host, r.port)
        cfg.mesh_view = mesh_view(topo)  # (management views and the console)
        try:
            cfg.apply(topo.router_settings(args.id))
        except ValueError as exc:
            print(f"oncemesh router: {args.topology}: {exc}", file=sys.stderr)
            return 2
    if args.listen:
        try:
            cfg.listen = parse_hostport(args.listen)
        except ValueError as exc:
            print(f"oncemesh router: --listen: {exc}", file=sys.stderr)
            return 2
    cfg.peers_dir = args.peers_dir or (args.ready_file.parent if args.ready_file else None)
    cfg.state_dir = args.state_dir
    cfg.log_dir = args.log_dir
    cfg.ready_file = args.ready_file
    try:
        cfg.apply(dict(kv.split("=", 1) for kv in args.set))
    except ValueError as exc:
        print(f"oncemesh router: --set: {exc}", file=sys.stderr)
        return 2
    base = args.topology.parent if args.topology is not None else Path.cwd()
    for key in ("mesh_tls_cert", "mesh_tls_key", "mesh_tls_ca", "tls_cert", "tls_key", "tls_ca", "users_file",
                "policy_file", "audit_status_file"):
        if getattr(cfg, key):  # relative paths are read from the topology file's directory
            setattr(cfg, key, str(base / getattr(cfg, key)))
    if args.mesh_tls_dir is not None:
        d = args.mesh_tls_dir
        cfg.mesh_tls_cert = cfg.mesh_tls_cert or str(d / f"{cfg.id}.pem")
        cfg.mesh_tls_key = cfg.mesh_tls_key or str(d / f"{cfg.id}.key")
        cfg.mesh_tls_ca = cfg.mesh_tls_ca or str(d / "ca.pem")
    cfg.insecure_mesh = cfg.insecure_mesh or args.insecure_mesh
    cfg.allow_anonymous = cfg.allow_anonymous or args.allow_anonymous
    mesh_tls = None
    if topo is not None and not cfg.insecure_mesh:
        from .common.tls import TlsConfigError
        from .interrouter.mesh import MeshTls

        missing = [k for k in ("mesh_tls_cert", "mesh_tls_key", "mesh_tls_ca") if not getattr(cfg, k)]
        if missing:
            print(f"oncemesh router: the mesh is closed: inter-router connections need TLS, and "
                  f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set. Name the files in "
                  f"the topology ([routers.{cfg.id}.settings] or [defaults]), or give --mesh-tls-dir; "
                  f"'oncemesh up' makes a private CA by itself. --insecure-mesh runs without (any process "
                  f"could join as a router).", file=sys.stderr)
            return 2
        try:
            mesh_tls = MeshTls(Path(cfg.mesh_tls_cert), Path(cfg.mesh_tls_key), Path(cfg.mesh_tls_ca))
        except TlsConfigError as exc:
            print(f"oncemesh router: inter-router TLS: {exc}", file=sys.stderr)
            return 2
    stderr_level = args.stderr_level or ("WARNING" if cfg.log_dir is not None else None)
    configure_logging(cfg.log_dir, cfg.id, args.log_level, cfg.router_log_bytes, cfg.router_log_backups,
                      stderr_level)
    try:
        asyncio.run(run_router(cfg, topo, mesh_tls))
    except ValueError as exc:  # (TlsConfigError: the client listener's files)
        print(f"oncemesh router: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"oncemesh router: cannot listen on {cfg.listen[0]}:{cfg.listen[1]}: {exc}", file=sys.stderr)
        return 1
    return 0


async def run_router(cfg: RouterConfig, topo: Topology | None = None, mesh_tls: MeshTls | None = None) -> None:
    """Compose and run one router until SIGTERM/SIGINT: in a mesh (`topo`), its core learns the
    topology's ordered topics and the router gets its mesh layer (`mesh_tls`: its inter-router TLS;
    None only for an insecure mesh). SIGHUP reloads certificates, keys and CAs for new connections;
    SIGUSR1 drains the router, which then exits."""
    from .common.engine import tune_gc
    from .interrouter.mesh import Mesh, total_topics
    from .router.server import Router

    tune_malloc(cfg.malloc_mmap_threshold)
    mesh: Callable[[Router], MeshPort] | None = None
    if topo is not None:
        mesh_topo = topo
        cfg.core.total_topics = total_topics(topo)
        cfg.core.causal_groups = topo.causal_groups()
        cfg.core.msgid_topics = topo.msgid_topics()
        mesh = lambda router: Mesh(router, mesh_topo, cfg.state_dir, cfg.peers_dir, mesh_tls)  # noqa: E731

    router = Router(cfg, mesh)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, router.request_stop)

    def reload() -> None:  # certificates, keys, CAs (for new connections) and the users file
        router.reload()
        if mesh_tls is not None:
            mesh_tls.reload()

    loop.add_signal_handler(signal.SIGHUP, reload)
    # drain: move every client to another router, wait until nothing depends on this one, then exit
    # (docs/operations.md, "Rolling restart and upgrade"; SIGTERM during a drain stops at once)
    loop.add_signal_handler(signal.SIGUSR1, router.begin_drain)
    await router.start()
    tune_gc()
    await router.serve_forever()


def tune_malloc(mmap_threshold: int) -> None:
    """Fix the C allocator's mmap threshold for this router process (`malloc_mmap_threshold`; 0
    leaves glibc's own). Before the router allocates its tables, so that every large one is mmapped."""
    import logging

    from .common.cmalloc import MAX_MMAP_THRESHOLD, set_mmap_threshold

    log = logging.getLogger("oncemesh.router")
    if not mmap_threshold:
        log.info("router.malloc mmap_threshold=glibc")
        return
    try:
        applied = set_mmap_threshold(mmap_threshold)
    except ValueError:
        raise ValueError(f"malloc_mmap_threshold: {mmap_threshold} is not 0 (glibc's own) or in "
                         f"1..{MAX_MMAP_THRESHOLD} bytes") from None
    if applied:
        log.info("router.malloc mmap_threshold=%d", mmap_threshold)
    else:
        log.warning("router.malloc mmap_threshold=%d not applied: the C library has no mallopt (not glibc); "
                    "large freed blocks may stay resident", mmap_threshold)


# The modules that define the other subcommands (each a `register(sub)` that adds its parsers and
# their `func`), with the commands each registers, in `oncemesh --help` order.
# tests/unit/test_product_imports.py checks this table against what the modules register.
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("harness.demo", ("demo",)),
    ("clients.cli", ("put", "subscribe", "get", "unsubscribe")),
    ("topology.launcher", ("up", "status", "down", "drain", "roll")),
    ("topology.check", ("check",)),
    ("spark.job", ("reconcile",)),
    ("spark.audit", ("audit",)),
    ("harness.chaos", ("chaos",)),
    ("harness.bench", ("bench",)),
    ("harness.soak", ("soak",)),
    ("router.users", ("user",)),
    ("clients.stat", ("stat",)),
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. Given the `command` about to run, only its module is imported
    (none for `router`); without one (`oncemesh --help`, an unknown command) every module is."""
    parser = argparse.ArgumentParser(prog="oncemesh", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"oncemesh {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register(sub)  # oncemesh router
    known = command == "router" or any(command in names for _, names in COMMANDS)
    for module, names in COMMANDS:
        if not known or command in names:
            importlib.import_module(f".{module}", __package__).register(sub)
    return parser


def version() -> str:
    """The installed distribution's version (a source tree without metadata says so)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("oncemesh")
    except PackageNotFoundError:
        return "(not installed: no version metadata)"


def main(argv: list[str] | None = None) -> int:
    """The command line; output cut short by its reader (`oncemesh up ... | head`) ends it quietly."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # (the reader left: say nothing more on stdout, and do not let Python's exit flush fail again)
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # as a shell reports a process ended by SIGPIPE (128 + 13)


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc: int = args.func(args)
    except ModuleNotFoundError as exc:  # pyspark, on a path that does not check for it up front
        from .spark import pyspark_missing

        missing = pyspark_missing(f"oncemesh {args.command}")
        if missing is None or (exc.name or "").partition(".")[0] != "pyspark":
            raise
        print(missing, file=sys.stderr)
        return 2
    return rc


if __name__ == "__main__":
    sys.exit(main())
