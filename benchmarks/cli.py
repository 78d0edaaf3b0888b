"""``python -m benchmarks`` (``benchmarks.cli``): every benchmark, one verb each.

``replay`` (placement quality on openb, ``--compare`` for several policies), ``churn`` (pods
that leave: pending time and allocation over time), ``cold-start``,
``floor`` (the bounds no placement beats), ``soak``, ``bench core|http|scheduler|startup|watchers|binding``
(costs), ``check-placements`` (the independent check of a replay's output),
``noop-extender`` (the baseline server the cost benchmarks compare against) and
``pod-watcher`` (a second pod watch beside it, in JSON or protobuf). Run from the
repository root (the benchmarks are not part of the installed product).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from benchmarks import (
    bench_binding,
    bench_core,
    bench_http,
    bench_scheduler,
    bench_startup,
    bench_watchers,
    check_placements,
    churn,
    cold_start,
    compare,
    floor,
    noop_extender,
    picture,
    pod_watcher,
    replay,
    soak,
)
from benchmarks.errors import UsageError
from podspec.cli_help import describe_subcommands


def _replay(args: argparse.Namespace) -> int:
    if args.compare:  # several policies over several variants: compare drives replay
        return compare.run(args, replay.profile_from_args(args))
    return replay.run(args, picture.picture)


def _check(args: argparse.Namespace) -> int:
    problems = check_placements.check(args.nodes, args.pods, args.placements,
                                      replicas_per_gpu=args.replicas_per_gpu)
    for p in problems[:50]:
        print(p)
    print(f"{args.placements}: {'OK' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    """The benchmarks' argument parser."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("replay", help="replay an openb trace through the extender's HTTP verbs")
    replay.add_arguments(rep)
    rep.set_defaults(func=_replay)

    cold = sub.add_parser("cold-start", help="a fresh cluster filled with one pod shape: where the next shape fits")
    cold_start.add_arguments(cold)
    cold.set_defaults(func=cold_start.run)

    sk = sub.add_parser("soak", help="pods created and deleted for minutes on the real control plane, a fault "
                                     "every minute; then no over-commit, no leaked hold")
    soak.add_arguments(sk)
    sk.set_defaults(func=soak.run)

    ch = sub.add_parser("churn", help="pods arrive and leave at a load factor of the trace's own lifetimes: "
                                      "allocation over time, pending time per pod class, fragmentation delay")
    churn.add_arguments(ch)
    ch.set_defaults(func=churn.run)

    fl = sub.add_parser("floor", help="the least unallocated share any placement, and any work-conserving "
                                      "scheduler, can leave once GPU demand reaches capacity (cutting-stock LPs)")
    floor.add_arguments(fl)
    fl.set_defaults(func=floor.run)

    bench = sub.add_parser("bench", help="what gpufrac costs: the core decision, HTTP latency, kube-scheduler's "
                                         "throughput, start-up")
    costs = bench.add_subparsers(dest="bench", required=True)
    for name, module, what in (
            ("core", bench_core, "thread CPU of one pod's evaluation on every node, 100 to 10,000 nodes"),
            ("http", bench_http, "p50/p99 of filter and prioritize as kube-scheduler sees them, against the "
                                 "no-op extender"),
            ("scheduler", bench_scheduler, "pods/s through a real kube-scheduler: no extender, the no-op "
                                           "extender, gpufrac"),
            ("startup", bench_startup, "loading a 5,000-node cluster file; cluster mode's first list of "
                                       "50,000 pods"),
            ("watchers", bench_watchers, "the API server's CPU per pod update with one more pod watch, in JSON "
                                         "or protobuf"),
            ("binding", bench_binding, "CPU per Binding written, by HTTP client: the kubernetes client in a "
                                       "worker, LoopApi, aiohttp, httpx")):
        cost = costs.add_parser(name, help=what)
        module.add_arguments(cost)
        cost.set_defaults(func=module.run)

    nx = sub.add_parser("noop-extender", help="serve the no-op extender (the cost benchmarks' baseline)")
    noop_extender.add_arguments(nx)
    nx.set_defaults(func=noop_extender.run)

    pw = sub.add_parser("pod-watcher", help="watch every pod in JSON or protobuf, dropping the events "
                                            "(bench scheduler's second-watcher setups)")
    pod_watcher.add_arguments(pw)
    pw.set_defaults(func=pod_watcher.run)

    chk = sub.add_parser("check-placements", help="independent feasibility check of a placements CSV")
    chk.add_argument("placements", type=Path)
    chk.add_argument("--nodes", type=Path, required=True)
    chk.add_argument("--pods", type=Path, required=True)
    chk.add_argument("--replicas-per-gpu", type=int, default=20)
    chk.set_defaults(func=_check)

    describe_subcommands(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (UsageError, ValueError) as exc:
        parser.error(str(exc))


