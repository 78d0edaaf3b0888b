"""``python -m benchmarks replay``: the openb trace through the extender's HTTP verbs, as kube-scheduler would.

For each pod: the pod-event endpoint hears of it (as the pod watch would), the emulated
kube-scheduler filters CPU/memory/slots in-tree, then calls ``/filter``, ``/prioritize``
(skipped when one node is left, as kube-scheduler does) and ``/bind``, and combines scores
as ``benchmarks.scheduler_emulation`` describes. Under a profile whose extender lists
``managedResources`` (gpufrac.io/gpu) CPU-only pods are placed by the in-tree plugins alone
and reported to the extender as bound; the shipped profile lists none, so they go through
the extender too. After each seed every pod is deleted through the same event path, and
the extender must be back to empty.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
from tqdm import tqdm

from benchmarks import constrain, memory, trace
from benchmarks.dra_allocator import FirstFitDevicesClient, split_device_choice
from benchmarks.extender_client import REPO_ROOT, ExtenderClient, InProcessClient, start_extender
from benchmarks.scheduler_emulation import ClusterNames, Profile, SchedulerView, schedule_with_extender
from extender.admin_config import AdminConfig, load_admin_config, scoring_config
from extender.clusterfile import load_cluster_file
from scoring.fragmentation import TaskTypes, fragmentation_rate
from scoring.specs import NodeSpec

DEFAULT_SCHEDULER_CONFIG = REPO_ROOT / "scheduler-config.yaml"
MARKS = (50, 90, 100, 130)
GRID = np.arange(0, 130.5, 0.5)


@dataclass
class SeedResult:
    """What one seed's replay measured."""

    seed: int
    pods: int
    gpu_pods_failed: int
    cpu_pods_failed: int
    bind_errors: int
    allocation_pct: dict[int, float]
    unallocated_pct_100: float
    unallocated_pct_130: float
    fragmentation_rate_100: float
    seconds: float
    pods_per_s: float
    curve: list[float] = field(repr=False)
    arrived_pct: float = 130.0
    """GPU share requested by the pods replayed, % of capacity: below 130 the trace was cut
    short (``--limit``), and the marks it did not reach hold the allocation when it stopped."""


def _free_gpu_from_allocations(specs: list[NodeSpec], allocs: list[dict[str, Any]]) -> np.ndarray:
    index = {s.name: i for i, s in enumerate(specs)}
    max_gpus = max(len(s.gpus) for s in specs)
    free = np.zeros((len(specs), max_gpus), dtype=np.int64)
    col_of: dict[tuple[int, int], int] = {}
    for i, s in enumerate(specs):
        for c, g in enumerate(sorted(s.gpus, key=lambda g: g.index)):
            free[i, c] = 1000
            col_of[(i, g.index)] = c
    for a in allocs:
        row = index[a["node"]]
        for gi in a["gpu_indices"]:
            free[row, col_of[(row, gi)]] -= a["gpu_milli"]
    return free


def replay_seed(client: ExtenderClient | InProcessClient, specs: list[NodeSpec], pods: list[trace.TracePod],
                tasks: TaskTypes, seed: int, profile: Profile, out: Path,
                progress: bool = True, limit: int | None = None, position: int = 0) -> SeedResult:
    """Replay one seed; write ``placements-<seed>.csv`` (the end) and
    ``placements-<seed>-at100.csv`` (when the arrived GPU demand first reaches capacity, the
    point ``unallocated_pct_100`` reads); leave the extender empty."""
    cluster = ClusterNames.build(specs, profile.node_cache_capable)
    names = cluster.names
    capacity = 1000 * sum(len(s.gpus) for s in specs)
    view = SchedulerView(
        np.array([s.cpu_milli for s in specs]), np.array([s.memory_mib for s in specs]),
        np.array([sum(g.replicas for g in s.gpus) for s in specs]), profile,
        np.random.default_rng(seed))
    seq = trace.arrival_sequence(pods, seed, capacity)[:limit]
    arrived = allocated = 0
    gpu_failed = cpu_failed = bind_errors = 0
    marks: dict[int, float] = {}
    frag_100 = float("nan")
    curve_x: list[float] = [0.0]
    curve_y: list[float] = [0.0]
    sent: list[dict[str, Any]] = []  # every pod, placed or not: all are deleted at the end
    start = time.perf_counter()
    for tp in tqdm(seq, desc=f"seed {seed}", unit="pod", disable=not progress, mininterval=1.0,
                   position=position, leave=position == 0):
        pod = tp.pod_object(seed)
        sent.append(pod)
        client.pod_events([{"type": "ADDED", "object": pod}])
        arrived += tp.gpu_request_milli
        feasible = view.feasible(tp.cpu_milli, tp.memory_mib, tp.num_gpu)
        node = -1
        if feasible.shape[0] and tp.num_gpu == 0 and not profile.extender_all_pods:
            node = view.select(feasible, view.in_tree_scores(feasible, tp.cpu_milli, tp.memory_mib))
            bound = {**pod, "spec": {**pod["spec"], "nodeName": names[node]},
                     "status": {"phase": "Running"}}
            client.pod_events([{"type": "MODIFIED", "object": bound}])
        elif feasible.shape[0]:
            node = schedule_with_extender(client, view, cluster, pod, tp.cpu_milli, tp.memory_mib, feasible, profile)
            if node >= 0:
                err = client.bind(pod, names[node])
                if err:
                    bind_errors += 1
                    node = -1
        if node >= 0:
            view.assume(node, tp.cpu_milli, tp.memory_mib, tp.num_gpu)
            allocated += tp.gpu_request_milli
        elif tp.num_gpu:
            gpu_failed += 1
        else:
            cpu_failed += 1
        pct = 100.0 * arrived / capacity
        curve_x.append(pct)
        curve_y.append(100.0 * allocated / capacity)
        for m in MARKS:
            if m not in marks and pct >= m:
                marks[m] = 100.0 * allocated / capacity
                if m == 100:
                    at_100 = client.get("allocations")
                    _write_placements(out / f"placements-{seed}-at100.csv", at_100)
                    free = _free_gpu_from_allocations(specs, at_100)
                    frag_100 = fragmentation_rate(free, view.cpu_alloc - view.cpu_req,
                                                  view.mem_alloc - view.mem_req, tasks)
    seconds = time.perf_counter() - start
    for m in MARKS:  # a trace cut short (--limit): what was allocated when it stopped
        marks.setdefault(m, 100.0 * allocated / capacity)
    allocs = client.get("allocations")
    _write_placements(out / f"placements-{seed}.csv", allocs)
    # Leave the extender empty, through the same event path the pod watch uses. Pods that
    # failed are deleted too: a pending pod left behind would still count in the next seed's
    # FGD workload (the demand).
    for i in range(0, len(sent), 500):
        client.pod_events([{"type": "DELETED", "object": p} for p in sent[i:i + 500]])
    left = client.get("readyz")
    if left.get("pods") or left.get("pods_bound") or left.get("gpu_allocated_milli"):
        raise RuntimeError(f"extender not empty after deleting every pod: {left}")
    curve = np.interp(GRID, np.array(curve_x), np.array(curve_y)).round(3).tolist()
    return SeedResult(seed, len(seq), gpu_failed, cpu_failed, bind_errors, marks,
                      100.0 - marks[100], 100.0 - marks[130], frag_100, seconds,
                      len(seq) / seconds, curve, 100.0 * arrived / capacity)


def _write_placements(path: Path, allocs: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["pod_name", "node", "gpu_indices", "gpu_milli"])
        for a in sorted(allocs, key=lambda a: a["name"]):
            w.writerow([a["name"], a["node"], "|".join(str(i) for i in a["gpu_indices"]),
                        a["gpu_milli"]])


def parse_seeds(text: str) -> list[int]:
    """``42-51`` or ``42,45,50`` -> list of ints."""
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    if not out:
        raise argparse.ArgumentTypeError(f"no seeds in {text!r}")
    return out


def summarize(results: list[SeedResult]) -> dict[str, Any]:
    """Medians over seeds of the headline numbers."""
    def med(f: Any) -> float:
        return float(statistics.median(f(r) for r in results))
    return {
        "allocation_pct": {str(m): med(lambda r, m=m: r.allocation_pct[m]) for m in MARKS},
        "unallocated_pct_100": med(lambda r: r.unallocated_pct_100),
        "unallocated_pct_130": med(lambda r: r.unallocated_pct_130),
        "fragmentation_rate_100": med(lambda r: r.fragmentation_rate_100),
        "gpu_pods_failed": med(lambda r: r.gpu_pods_failed),
        "pods_per_s": med(lambda r: r.pods_per_s),
        "seconds": sum(r.seconds for r in results),
    }


def report_table(policy: str, results: list[SeedResult], summary: dict[str, Any]) -> str:
    """The Markdown table printed at the end."""
    head = ("| seed | alloc @50% | @90% | @100% | @130% | unalloc @100% | frag rate @100% "
            "| GPU pods failed | pods/s |\n|---|---|---|---|---|---|---|---|---|")
    rows = [f"| {r.seed} | {r.allocation_pct[50]:.2f} | {r.allocation_pct[90]:.2f} | "
            f"{r.allocation_pct[100]:.2f} | {r.allocation_pct[130]:.2f} | "
            f"{r.unallocated_pct_100:.2f} | {100 * r.fragmentation_rate_100:.1f}% | "
            f"{r.gpu_pods_failed} | {r.pods_per_s:.0f} |" for r in results]
    a = summary["allocation_pct"]
    rows.append(f"| **median** | {a['50']:.2f} | {a['90']:.2f} | {a['100']:.2f} | {a['130']:.2f} "
                f"| **{summary['unallocated_pct_100']:.2f}** | "
                f"{100 * summary['fragmentation_rate_100']:.1f}% | {summary['gpu_pods_failed']:.0f} "
                f"| {summary['pods_per_s']:.0f} |")
    return f"policy `{policy}`: GPU allocation % of capacity at arrived workload\n\n" + "\n".join([head, *rows])


def plot(out: Path, curves: dict[str, list[list[float]]], title: str) -> None:
    """Allocation ratio vs arrived workload, one line (median over seeds) per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(GRID, np.minimum(GRID, 100), color="0.7", linestyle="--", label="ideal")
    for policy, per_seed in curves.items():
        ax.plot(GRID, np.median(np.array(per_seed), axis=0), label=policy)
    ax.set_xlabel("arrived workload (% of GPU capacity)")
    ax.set_ylabel("GPU allocation ratio (%)")
    ax.set_xlim(0, 130)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The replay's command line (a contract other tools rely on)."""
    p.add_argument("--nodes", type=Path, default=trace.DEFAULT_NODES, help="node list CSV/YAML")
    p.add_argument("--pods", type=Path, default=trace.DEFAULT_PODS, help="openb pod list CSV")
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    p.add_argument("--model-constrained", type=float, default=0.0, metavar="PCT",
                   help="restrict PCT %% of the GPU pods to 1-3 GPU models (benchmarks/constrain.py); "
                        "a variant named <variant>-m<PCT> does the same")
    p.add_argument("--gpu-memory", choices=("openb", "mixed"), default="openb",
                   help="GPU memory per model: openb's (clusterfile.OPENB_GPU_MEMORY_MIB) or the "
                        "mixed-memory cluster of benchmarks/memory.py (16, 24, 32, 80 GiB)")
    p.add_argument("--memory-requests", type=float, default=0.0, metavar="PCT",
                   help="PCT %% of the GPU pods ask for GPU memory (benchmarks/memory.py); a variant named "
                        "<variant>-g<PCT> does the same on the mixed-memory cluster")
    p.add_argument("--constrain-seed", type=int, default=0,
                   help="seed of the model-constraint and memory-request rules")
    p.add_argument("--preset", "--policy", dest="preset", default="default",
                   help="scoring preset, as `gpufrac serve --preset` (scoring.presets; --policy: its older name); "
                        "PRESET+dra-first-fit: the GPUs on the node it chooses are taken first fit, as "
                        "kube-scheduler's DRA allocator takes devices (benchmarks/dra_allocator.py; --in-process)")
    p.add_argument("--out", type=Path, default=Path("replay-out"))
    p.add_argument("--url", help="use a running standalone extender instead of starting one (its "
                   "--events-token read from $GPUFRAC_EVENTS_TOKEN)")
    p.add_argument("--config", type=Path,
                   help="admin config file for the extender (scoring weights; overrides --preset)")
    p.add_argument("--in-process", action="store_true",
                   help="pure-core replay: the extender's cache and translation in this process, "
                        "no HTTP (same decisions, seconds per seed)")
    p.add_argument("--scheduler-config", type=Path, default=DEFAULT_SCHEDULER_CONFIG)
    p.add_argument("--decision", choices=("filter", "prioritize"), default="filter",
                   help="the extender's --decision: filter returns only the chosen node (default), "
                        "prioritize passes every feasible node and ranks them")
    p.add_argument("--replicas-per-gpu", type=int, default=20)
    p.add_argument("--node-cache-capable", choices=("true", "false"),
                   help="override the scheduler config's nodeCacheCapable")
    p.add_argument("--percentage-of-nodes-to-score", type=int,
                   help="override the scheduler config's percentageOfNodesToScore")
    p.add_argument("--limit", type=int, help="replay only the first N pods of each seed (smoke runs)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="seeds replayed in parallel, each against its own extender (1 with --url)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--compare", type=lambda t: [x for x in t.split(",") if x],
                   help="comma-separated policies (presets, or admin config files) to compare "
                        "side by side, each optionally @ a scheduler config to replay it under "
                        "(bestfit@benchmarks/scheduler-config-simulator.yaml); writes compare.md, "
                        "compare.json and two plots")
    p.add_argument("--variants", type=lambda t: [x for x in t.split(",") if x], default=["default"],
                   help="with --compare: openb pod-list variants (default, cpu050, gpushare40, ...) "
                        "or 'all' for default and the twelve the paper reports")


def _run_job(args: argparse.Namespace, profile: Profile, seeds: list[int], position: int) -> list[SeedResult]:
    """One job: its seeds in order, each on a fresh extender (unless ``--url``): an extender that
    replayed a seed has seen every pod of it arrive and leave, and the churn it learned from
    that (``scoring.workload.WorkloadModel.churn``) would follow it into the next seed."""
    return [result for seed in seeds for result in _run_seeds(args, profile, [seed], position)]


def _run_seeds(args: argparse.Namespace, profile: Profile, seeds: list[int], position: int) -> list[SeedResult]:
    """``seeds`` in order on one extender (its own unless ``--url``)."""
    preset, first_fit_devices = split_device_choice(args.preset)
    if first_fit_devices and not args.in_process:
        raise ValueError(f"--preset {args.preset}: the DRA allocator is emulated in process only (--in-process)")
    specs = load_cluster_file(args.nodes, replicas_per_gpu=args.replicas_per_gpu)
    pods = trace.load_pods(args.pods)
    if args.model_constrained:
        pods = constrain.restrict_models(pods, args.model_constrained, specs, args.constrain_seed)
    if args.memory_requests:
        pods = memory.request_memory(pods, args.memory_requests, specs, args.constrain_seed)
    tasks = TaskTypes.from_counts(np.array(
        [(p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib) for p in pods], dtype=np.int64))
    proc = None
    client: ExtenderClient | InProcessClient
    if args.in_process:
        policy = load_admin_config(args.config) if args.config else AdminConfig(scoring_config(preset))
        client = (FirstFitDevicesClient if first_fit_devices else InProcessClient)(specs, policy, args.decision)
    else:
        if args.url is None:
            proc, client = start_extender(args.nodes, args.preset, args.replicas_per_gpu, args.config,
                                          decision=args.decision)
        else:
            client = ExtenderClient(args.url, events_token=os.environ.get("GPUFRAC_EVENTS_TOKEN"))
    try:
        return [replay_seed(client, specs, pods, tasks, seed, profile, args.out,
                            progress=not args.no_progress, limit=args.limit, position=position)
                for seed in seeds]
    finally:
        client.close()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


def profile_from_args(args: argparse.Namespace) -> Profile:
    """The scheduler profile the replay emulates: the config file, with command-line overrides."""
    profile = Profile.from_file(args.scheduler_config)
    if args.node_cache_capable is not None:
        profile = Profile(**{**asdict(profile), "node_cache_capable": args.node_cache_capable == "true"})
    if args.percentage_of_nodes_to_score is not None:
        profile = Profile(**{**asdict(profile),
                             "percentage_of_nodes_to_score": args.percentage_of_nodes_to_score})
    return profile


def replay_seeds(args: argparse.Namespace, profile: Profile) -> list[SeedResult]:
    """Every seed of ``args.seeds`` for ``args.preset`` (or ``args.config``) on ``args.pods``.

    Seeds are dealt round-robin to ``args.jobs`` processes, each seed on its own extender; each
    seed still replays strictly in order, so results do not depend on the number of jobs.
    """
    args.out.mkdir(parents=True, exist_ok=True)
    if args.gpu_memory == "mixed" and not str(args.nodes).endswith(".mixed-memory.json"):
        nodes = memory.mixed_memory_nodes(load_cluster_file(args.nodes, replicas_per_gpu=args.replicas_per_gpu))
        args.nodes = memory.write_cluster_file(nodes, args.out / f"{Path(args.nodes).stem}.mixed-memory.json")
    jobs = 1 if args.url else max(1, min(args.jobs, len(args.seeds)))
    if jobs == 1:
        return _run_job(args, profile, args.seeds, 0)
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_run_job, args, profile, args.seeds[j::jobs], j) for j in range(jobs)]
        return sorted((r for f in futures for r in f.result()), key=lambda r: r.seed)


def source_commit() -> str:
    """The checkout's ``git describe --always --dirty`` (``unknown`` outside a git checkout)."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10, check=False)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def json_safe(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float as None (JSON has no NaN: ``json.dumps`` would
    write a bare ``NaN`` that strict parsers refuse), recursively through dicts and lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as strict JSON (NaN as null, ``json_safe``)."""
    path.write_text(json.dumps(json_safe(obj), indent=1, allow_nan=False))


def result_record(args: argparse.Namespace, profile: Profile, results: list[SeedResult],
                  wall_s: float) -> dict[str, Any]:
    """What ``result.json`` holds for one policy on one pod list."""
    specs = load_cluster_file(args.nodes, replicas_per_gpu=args.replicas_per_gpu)
    summary = summarize(results)
    summary["wall_seconds"] = wall_s
    return {
        "policy": str(args.config) if args.config else args.preset, "nodes": str(args.nodes),
        "pods": str(args.pods), "model_constrained_pct": args.model_constrained,
        "gpu_memory": args.gpu_memory, "memory_requests_pct": args.memory_requests,
        "constrain_seed": args.constrain_seed, "gpus": sum(len(s.gpus) for s in specs), "profile": asdict(profile),
        # What results/MANIFEST.md asks of a kept result: the code and the day it measured.
        "commit": source_commit(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "median": summary,
        "seeds": {str(r.seed): {k: v for k, v in asdict(r).items() if k != "curve"} for r in results},
        "curve_grid_pct": GRID.tolist(),
        "curves": {str(r.seed): r.curve for r in results},
    }


Picture: TypeAlias = Callable[[Path, argparse.Namespace, dict[str, Any], list["SeedResult"]], dict[str, float]]
"""Draws ``allocation.png`` and returns the marks it read the run against (``benchmarks.picture``)."""


def run(args: argparse.Namespace, picture: Picture | None = None) -> int:
    """Run the replay; print the report; write result.json, placements, allocation.png.

    ``picture`` draws ``allocation.png`` (``benchmarks.cli`` passes ``benchmarks.picture``:
    two panels, floors and baselines); without it, the plain plot. A ``--limit`` run is
    recorded as a smoke run (``smoke`` in result.json). ``--compare`` goes to
    ``benchmarks.compare.run`` instead: ``benchmarks.cli`` picks.
    """
    profile = profile_from_args(args)
    started = time.perf_counter()
    results = replay_seeds(args, profile)
    wall = time.perf_counter() - started
    result = result_record(args, profile, results, wall)
    arrived = min(r.arrived_pct for r in results)
    result["smoke"] = None if args.limit is None else {"limit": args.limit, "arrived_pct": arrived}
    if picture is not None:
        result["references"] = picture(args.out / "allocation.png", args, result, results)
    else:
        plot(args.out / "allocation.png", {result["policy"]: [r.curve for r in results]},
             f"{args.pods.name}, seeds {args.seeds[0]}..{args.seeds[-1]}")
    write_json(args.out / "result.json", result)
    print(report_table(result["policy"], results, result["median"]))
    for label, pct in (result.get("references") or {}).items():
        print(f"{label}: {pct:.2f} % unallocated at 100 % arrived")
    if args.limit is not None:
        print(f"\n--limit {args.limit}: each seed replayed only its first {args.limit} pods, and the trace "
              f"stopped at {arrived:.1f} % of GPU capacity arrived: the columns for marks beyond that show "
              f"the allocation when it stopped (so 'unallocated' there is mostly capacity never asked "
              f"for), and the fragmentation rate at 100 % is not measured (nan here, null in result.json). "
              f"A smoke run, not a result.")
    print(f"\n{len(results)} seeds in {wall:.0f} s wall; wrote {args.out}/result.json, "
          f"placements-<seed>.csv, allocation.png")
    return 0
