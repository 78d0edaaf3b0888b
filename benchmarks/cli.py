"""``python -m benchmarks`` (``benchmarks.cli``): the replay benchmark and the independent placement check.

Run from the repository root (the benchmarks are not part of the installed product).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from benchmarks import check_placements, cold_start, compare, replay, soak
from podspec.cli_help import describe_subcommands


def _replay(args: argparse.Namespace) -> int:
    if args.compare:  # several policies over several variants: compare drives replay
        return compare.run(args, replay.profile_from_args(args))
    return replay.run(args)


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
    args = build_parser().parse_args(argv)
    return int(args.func(args))


