"""``python -m benchmarks churn``: placement where pods leave.

The arrivals-only replay measures the allocation at one instant; a platform team feels how long
pods wait as pods of different shapes come and go. This replay plays an offered load of trace
pods (``benchmarks.churn.workload``: Poisson arrivals, each pod for its trace lifetime, the rate
set so that GPU demand is ``--loads`` times capacity) through kube-scheduler's queue
(``benchmarks.churn.queue``: back-off, retries when capacity frees) and the extender's verbs in
process, for every ``--presets`` entry on the same arrivals, and reports per policy
(``benchmarks.churn.report``): time-weighted GPU allocation, the time some GPU pod waited while
enough total share was free (fragmentation delay), pending time per pod class, pods that never ran.

The cluster is every ``--node-stride``-th node of the node list sorted by (GPU model, GPU count,
CPU, memory), from the ``--node-offset``-th: a stratified sample with the full list's mix at a
fraction of the cost (1: every node); another offset is another sample of the same mix. A pod list
without lifetimes (``multigpu*``) borrows them from the default list
(``benchmarks.churn.workload.borrow_lifetimes``).

``--tuning-seeds``: the seeds a default was tuned on; the report then has a table for those and
one for the others (held out), besides all together.

``--merge DIR ...``: one report (``churn.md``, ``churn.png``, and a ``churn.json`` of every run
without the series the picture draws) from the ``churn.json`` of several runs of this command,
e.g. one per load; nothing is replayed. A later folder's run replaces an earlier folder's run of
the same preset, load and seed (a changed policy re-run alone; the commits of every folder kept
are recorded). A merged folder merges again; ``--tuning-seeds`` given with ``--merge`` replaces
the first folder's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import trace
from benchmarks.churn import report
from benchmarks.churn.measures import RunResult
from benchmarks.churn.queue import ChurnSim
from benchmarks.churn.workload import borrow_lifetimes, offered_arrivals
from benchmarks.extender_client import InProcessClient
from benchmarks.replay import DEFAULT_SCHEDULER_CONFIG, json_safe, parse_seeds, source_commit
from benchmarks.scheduler_emulation import Profile
from extender.admin_config import AdminConfig, load_admin_config, scoring_config
from extender.cache import NO_RESERVATIONS, DefragPolicy, StarvationPolicy
from extender.clusterfile import load_cluster_file
from scoring.specs import NodeSpec

QUICK = {"hours": 2.0, "warmup_hours": 1.0, "lifetime_cap_hours": 1.0, "node_stride": 16}
"""What ``--quick`` sets (and it keeps only the first seed)."""


def subset_nodes(specs: list[NodeSpec], stride: int, offset: int = 0) -> list[NodeSpec]:
    """Every ``stride``-th node in (GPU model, GPU count, CPU, memory, name) order, from the
    ``offset``-th.

    Raises
    ------
    ValueError
        For a stride below 1, an offset outside ``0..stride-1``, or a sample without GPU nodes.
    """
    if stride < 1:
        raise ValueError(f"--node-stride must be at least 1, got {stride}")
    if not 0 <= offset < stride:
        raise ValueError(f"--node-offset must be in 0..{stride - 1}, got {offset}")
    ordered = sorted(specs, key=lambda s: (s.gpus[0].model if s.gpus else "", len(s.gpus), s.cpu_milli,
                                           s.memory_mib, s.name))
    out = ordered[offset::stride]
    if not any(s.gpus for s in out):
        raise ValueError(f"--node-stride {stride} leaves no GPU node of {len(specs)}")
    return out


def _floats(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from exc
    if not out or min(out) <= 0:
        raise argparse.ArgumentTypeError(f"loads must be positive: {text!r}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The churn replay's command line."""
    p.add_argument("--nodes", type=Path, default=trace.DEFAULT_NODES, help="node list CSV/YAML")
    p.add_argument("--pods", type=Path, default=trace.DEFAULT_PODS,
                   help="openb pod list with creation_time and deletion_time")
    p.add_argument("--presets", type=lambda t: [x for x in t.split(",") if x],
                   default=["default", "fgd", "bestfit", "spread"],
                   help="scoring presets or admin config files (.yaml) to compare; <preset>+reserve<seconds> "
                        "adds starvation protection (extender/cache/reservations.py) after that wait; "
                        "<preset>+defrag<seconds> acts on the defragmentation plan (evictions) after that wait")
    p.add_argument("--max-reserved-nodes", type=int, default=1, help="with +reserve: reservations at once")
    p.add_argument("--reservation-ttl-s", type=float, default=3600.0, help="with +reserve: longest a "
                   "reservation holds")
    p.add_argument("--no-capacity-gate", action="store_true", help="with +reserve: hold nodes even while the "
                   "pending GPU pods ask for more than is free in sum (StarvationPolicy.capacity_gate off)")
    p.add_argument("--max-evictions-per-hour", type=int, default=12,
                   help="with +defrag: evictions at most in any hour (extender/cache/defrag.py)")
    p.add_argument("--loads", type=_floats, default=[0.7, 0.9, 1.0, 1.2],
                   help="offered GPU load, fraction of capacity (comma-separated)")
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    p.add_argument("--tuning-seeds", type=parse_seeds, default=None,
                   help="the seeds the policies were tuned on: the report adds a table for them and one "
                        "for the other seeds (held out)")
    p.add_argument("--hours", type=float, default=12.0, help="length of each run, simulated hours")
    p.add_argument("--lifetime-cap-hours", type=float, default=4.0,
                   help="pods run their trace lifetime, at most this long (benchmarks/churn/workload.py)")
    p.add_argument("--warmup-hours", type=float, default=4.0,
                   help="measured from here on (the cluster starts empty; at least the lifetime cap "
                        "for a stationary load)")
    p.add_argument("--node-stride", type=int, default=8, help="every N-th node (module docstring); 1: all")
    p.add_argument("--node-offset", type=int, default=0, help="the sample's first node, 0..stride-1")
    p.add_argument("--replicas-per-gpu", type=int, default=20)
    p.add_argument("--scheduler-config", type=Path, default=DEFAULT_SCHEDULER_CONFIG)
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="runs in parallel")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke run: the first seed, {QUICK['hours']:g} h, lifetimes cut at "
                        f"{QUICK['lifetime_cap_hours']:g} h, every {QUICK['node_stride']}th node")
    p.add_argument("--terms", action="store_true",
                   help="the first policy's runs also read what each strategy takes from the running and the "
                        "arrival mix of the learned workload (benchmarks/churn/terms.py)")
    p.add_argument("--no-picture", action="store_true", help="write no churn.png")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="DIR",
                   help="instead of replaying: one report from the churn.json of these earlier --out folders")
    p.add_argument("--out", type=Path, default=Path("churn-out"))


def policy_of(spec: str, args: argparse.Namespace) -> AdminConfig:
    """``default``, ``default+reserve600``, ``default+defrag600`` (both may be given) or an admin
    config file (``my-config.yaml``, with its ``starvation`` and ``defragmentation`` sections)
    -> the extender's admin config.

    Raises
    ------
    ValueError
        For an unknown preset, an invalid config file, or a suffix other than
        ``+reserve<seconds>`` or ``+defrag<seconds>``.
    """
    base, *extras = spec.split("+")
    # The baselines (fgd, bestfit, spread...) are the published policies: their runs have no
    # starvation protection, which is gpufrac's own (on in its default admin config).
    config = (load_admin_config(Path(base)) if base.endswith((".yaml", ".yml"))
              else AdminConfig(scoring_config(base)) if base == "default"
              else AdminConfig(scoring_config(base), starvation=NO_RESERVATIONS))
    for extra in extras:
        kind = "reserve" if extra.startswith("reserve") else "defrag" if extra.startswith("defrag") else None
        if kind is None:
            raise ValueError(f"--presets {spec!r}: a suffix is +reserve<seconds> or +defrag<seconds>")
        try:
            after = float(extra[len(kind):])
        except ValueError as exc:
            raise ValueError(f"--presets {spec!r}: +{kind} takes seconds, e.g. +{kind}600") from exc
        if kind == "reserve":
            config = dataclasses.replace(config, starvation=StarvationPolicy(
                after, args.max_reserved_nodes, args.reservation_ttl_s, not args.no_capacity_gate))
        else:
            config = dataclasses.replace(config, defrag=DefragPolicy(True, after, args.max_evictions_per_hour))
    return config


def run_cell(args: argparse.Namespace, spec: str, load: float, seed: int) -> RunResult:
    """One (preset, load, seed) run on its own in-process extender."""
    specs = subset_nodes(load_cluster_file(args.nodes, replicas_per_gpu=args.replicas_per_gpu), args.node_stride,
                         args.node_offset)
    pods = trace.load_pods(args.pods)
    if not any(p.lifetime_s for p in pods):
        pods = borrow_lifetimes(pods, trace.load_pods(trace.DEFAULT_PODS))
    run_s = 3600.0 * args.hours
    capacity = 1000 * sum(len(s.gpus) for s in specs)
    arrivals = offered_arrivals(pods, capacity, load, run_s, 3600.0 * args.lifetime_cap_hours, seed)
    config = policy_of(spec, args)
    client = InProcessClient(specs, config)
    sim = ChurnSim(client, specs, Profile.from_file(args.scheduler_config), seed, config.starvation, config.defrag,
                   terms=args.terms and spec == args.presets[0])
    return sim.run(arrivals, spec, load, run_s, 3600.0 * args.warmup_hours)


def _said(r: RunResult) -> RunResult:
    print(f"{r.preset} at load {r.load:g}, seed {r.seed}: {r.arrivals} arrivals, {r.allocation_pct:.2f} % "
          f"allocated, {r.cycles} cycles, {r.seconds:.0f} s", flush=True)
    return r


def _results(record: dict[str, Any]) -> list[RunResult]:
    """The runs of a ``churn.json`` as ``RunResult`` (their series are not kept there)."""
    return [RunResult(**{**r, "series": {}}) for r in record["runs"]]


def merge(args: argparse.Namespace) -> int:
    """``--merge``: one report from several ``churn.json`` (module notes)."""
    records = [json.loads((d / "churn.json").read_text()) for d in args.merge]
    base = records[0]
    keys = ("nodes", "gpus", "quick")
    for d, r in zip(args.merge, records, strict=True):
        # The pod list by its file name: the same list read from another checkout is the same list.
        same = {k: r[k] for k in keys} == {k: base[k] for k in keys} and all(
            r["command"][k] == base["command"][k] for k in ("node_stride", "hours", "warmup_hours",
                                                             "lifetime_cap_hours")) and \
            Path(r["command"]["pods"]).name == Path(base["command"]["pods"]).name
        if not same:
            raise ValueError(f"--merge: {d} replayed another cluster, pod list or window than {args.merge[0]}")
    latest: dict[tuple[str, float, int], tuple[int, dict[str, Any]]] = {}
    for i, rec in enumerate(records):
        for run_ in rec["runs"]:
            latest[(run_["preset"], run_["load"], run_["seed"])] = (i, run_)
    kept = sorted({i for i, _ in latest.values()})
    records = [{**rec, "runs": [r for j, r in latest.values() if j == i]} for i, rec in enumerate(records) if i in kept]
    # The report compares the first preset with the others: keep the folders' preset order
    # (the first folder's first), whichever folder a run now comes from.
    presets = list(dict.fromkeys(p for r in records for p in r["command"]["presets"]))
    order = {p: i for i, p in enumerate(presets)}
    results = sorted((x for r in records for x in _results(r)), key=lambda x: order.get(x.preset, len(order)))
    series = {k: v for r in records for k, v in r.get("series", {}).items()}
    command = {**base["command"], "loads": sorted({x.load for x in results}), "presets": presets,
               "merged": [str(d) for i, d in enumerate(args.merge) if i in kept]}
    # A folder may be a merge itself (its commits and dates are lists): it merges again.
    record = {**{k: base[k] for k in keys}, "command": command,
              "commits": sorted({c for r in records for c in r.get("commits", [r.get("commit")])}),
              "commit": base["commit"],
              "dates": sorted({d for r in records for d in r.get("dates", [r.get("date")])}),
              "wall_seconds": sum(r["wall_seconds"] for r in records),
              "runs": sorted((r for rec in records for r in rec["runs"]), key=lambda r: order.get(r["preset"], len(order))),
              "series": series}
    tuned = args.tuning_seeds or base["command"].get("tuning_seeds")
    record["command"]["tuning_seeds"] = tuned
    _write(args, results, record, tuned, keep_series=False)
    print(f"merged {len(results)} runs of {len(args.merge)} folders; wrote {args.out}/churn.json, churn.md"
          + ("" if args.no_picture else ", churn.png"))
    return 0


def _write(args: argparse.Namespace, results: list[RunResult], record: dict[str, Any],
           tuned: list[int] | None, keep_series: bool = True) -> str:
    """churn.json (compact; the series the picture draws kept unless ``keep_series`` is False),
    churn.md (with the tuning and held-out seeds apart when ``tuned``) and churn.png under
    ``--out``; the markdown."""
    args.out.mkdir(parents=True, exist_ok=True)
    kept = record if keep_series else {k: v for k, v in record.items() if k != "series"}
    (args.out / "churn.json").write_text(json.dumps(json_safe(kept), separators=(",", ":"), allow_nan=False))
    table = report.markdown(results, record, "All seeds" if tuned else "")
    if tuned:
        for title, held_out in (("Tuning seeds", False), ("Held-out seeds", True)):
            part = [r for r in results if (r.seed in set(tuned)) != held_out]
            if part:
                table += "\n" + report.markdown(part, record, title)
    (args.out / "churn.md").write_text(table)
    if not args.no_picture:
        report.plot(args.out / "churn.png", record)
    return table


def run(args: argparse.Namespace) -> int:
    """Run every (load, preset, seed); write churn.json, churn.md, churn.png under ``--out``."""
    if args.merge:
        return merge(args)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
        args.seeds = args.seeds[:1]
    if args.warmup_hours >= args.hours:
        raise ValueError(f"--warmup-hours {args.warmup_hours} must be below --hours {args.hours}")
    for spec in args.presets:
        policy_of(spec, args)  # an unknown preset fails here, not in a worker
    args.out.mkdir(parents=True, exist_ok=True)
    cells = [(preset, load, seed) for load in args.loads for preset in args.presets for seed in args.seeds]
    commit = source_commit()  # the code that runs (read before: the tree may change during a long run)
    started = time.perf_counter()
    jobs = max(1, min(args.jobs, len(cells)))
    if jobs == 1:
        results = [_said(run_cell(args, *c)) for c in cells]
    else:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(run_cell, args, *c) for c in cells]
            for f in as_completed(futures):
                _said(f.result())
            results = [f.result() for f in futures]
    wall = time.perf_counter() - started
    specs = subset_nodes(load_cluster_file(args.nodes, replicas_per_gpu=args.replicas_per_gpu), args.node_stride,
                         args.node_offset)
    record = {
        "command": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "func"},
        "nodes": len(specs), "gpus": sum(len(s.gpus) for s in specs), "quick": bool(args.quick),
        "commit": commit, "date": time.strftime("%Y-%m-%d", time.gmtime()), "wall_seconds": wall,
        "runs": [{k: v for k, v in asdict(r).items() if k != "series"} for r in results],
        "series": {f"{r.preset}@{r.load:g}": r.series for r in results if r.seed == args.seeds[0]},
    }
    table = _write(args, results, record, args.tuning_seeds)
    print(table)
    print(f"\n{len(cells)} runs in {wall:.0f} s wall; wrote {args.out}/churn.json, churn.md"
          + ("" if args.no_picture else ", churn.png"))
    return 0
