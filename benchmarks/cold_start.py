"""``python -m benchmarks cold-start``: a fresh cluster fills with one pod shape; where does the next shape fit?

A platform team's first weeks are rarely the trace's mix: a new cluster fills with notebooks
(quarter GPUs) long before its first 8-GPU training job arrives. A scheduler that learns the
workload from the pods it has seen has seen only notebooks then. This benchmark measures
what that costs, as kube-scheduler drives the verbs:

1. an empty cluster of ``--nodes`` nodes of ``--gpus-per-node`` A100s;
2. pods of one shape class (the *seen* shape: 0.25, 0.5, 1, 2, 4 or 8 GPUs) arrive until
   they ask for ``load`` of the GPU capacity (6 % and 50 %); each goes through the pod-event
   path, the emulated kube-scheduler's in-tree filter, ``filter``, ``prioritize`` and ``bind``
   (``benchmarks.replay``'s loop, the shipped ``scheduler-config.yaml``);
3. then, for each *next* shape class, the number of nodes where one such pod fits (the
   extender's own feasibility, on every node) and the nodes the seen pods touched.

With ``--first 8`` each fill is also run after one pod of 8 GPUs came first (``first`` in the
table): a learned workload that has seen a whole-node pod once must still keep nodes whole
for the next one while hundreds of small pods arrive.

Policies: gpufrac's ``default`` and ``bestfit`` presets, and kube-scheduler's default spread
(the extender's prioritize weight 0: the in-tree ``NodeResourcesFit`` LeastAllocated and
``NodeResourcesBalancedAllocation`` scores with random ties choose the node; gpufrac only
filters and picks the GPUs on it).

Pods of ``s`` GPUs ask for ``CPU_PER_GPU_MILLI * s`` CPU and ``MEMORY_PER_GPU_MIB * s`` memory
(at least one core and 4 GiB): nodes are sized so that an 8-GPU pod takes 2/3 of a node's
CPU, as a training job with its data loaders does.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import extender_client, replay, scheduler_emulation
from benchmarks.scheduler_emulation import Profile, SchedulerView
from extender.admin_config import AdminConfig, scoring_config
from extender.translate import inbound
from scoring.specs import GpuSpec, NodeSpec

SHAPES_GPU = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
"""The shape classes, in GPUs per pod (below 1: a share of one GPU)."""

LOADS = (0.06, 0.5)
"""Share of the cluster's GPU capacity the seen shape asks for before the next one comes."""

POLICIES = ("default", "bestfit", "kube-scheduler")
"""gpufrac's presets by name, and ``kube-scheduler``: its default spread (see module notes)."""

CPU_PER_GPU_MILLI = 8_000
MEMORY_PER_GPU_MIB = 64 * 1024
NODE_CPU_MILLI = 96_000
NODE_MEMORY_MIB = 1024 * 1024
A100_MEMORY_MIB = 81_920


def cluster(n_nodes: int, gpus_per_node: int) -> list[NodeSpec]:
    """``n_nodes`` empty nodes of ``gpus_per_node`` A100 80GB (one replica slot per 1/20 GPU)."""
    return [NodeSpec(f"node-{i:05d}", NODE_CPU_MILLI, NODE_MEMORY_MIB, tuple(
        GpuSpec(g, f"GPU-cold-{i:05d}-{g}", "A100", A100_MEMORY_MIB, replicas=20)
        for g in range(gpus_per_node))) for i in range(n_nodes)]


def host_requests(shape_gpu: float) -> tuple[int, int]:
    """CPU (milli-cores) and memory (MiB) of a pod of ``shape_gpu`` GPUs (module notes)."""
    return max(1000, int(CPU_PER_GPU_MILLI * shape_gpu)), max(4096, int(MEMORY_PER_GPU_MIB * shape_gpu))


def pod(shape_gpu: float, name: str) -> dict[str, Any]:
    """The pending Pod JSON of one pod of ``shape_gpu`` GPUs (a share below 1)."""
    whole = shape_gpu >= 1
    gpus = int(shape_gpu) if whole else 1
    annotations = {} if whole else {"gpufrac.io/fraction": f"{shape_gpu:g}"}
    cpu, mem = host_requests(shape_gpu)
    return {
        "metadata": {"name": name, "namespace": "cold", "uid": f"uid-{name}", "annotations": annotations},
        "spec": {"schedulerName": "gpufrac-scheduler", "containers": [{"name": "main", "resources": {
            "requests": {"cpu": f"{cpu}m", "memory": f"{mem}Mi", "gpufrac.io/gpu": str(gpus)},
            "limits": {"gpufrac.io/gpu": str(gpus)}}}]},
        "status": {"phase": "Pending"},
    }


@dataclass(frozen=True)
class ColdStartResult:
    """One (policy, seen shape, load) run."""

    policy: str
    seen_gpu: float
    load: float
    first_gpu: int
    """GPUs of the one pod placed before the seen ones (0: none)."""
    pods: int
    placed: int
    nodes_touched: int
    fits_next: dict[str, int]
    """Next shape (GPUs, as text) -> nodes where one pod of it fits."""
    seconds: float


def run_one(policy: str, seen_gpu: float, load: float, n_nodes: int, gpus_per_node: int,
            seed: int = 42, first_gpu: int = 0) -> ColdStartResult:
    """Fill a fresh cluster with ``seen_gpu``-GPU pods up to ``load`` (after one pod of
    ``first_gpu`` GPUs when not 0); count where each shape fits."""
    specs = cluster(n_nodes, gpus_per_node)
    base = Profile.from_file(replay.DEFAULT_SCHEDULER_CONFIG)
    spread = policy == "kube-scheduler"
    profile = Profile(**{**base.__dict__, "extender_weight": 0 if spread else base.extender_weight})
    # Spread: every feasible node must reach kube-scheduler's scoring (gpufrac decides nothing).
    client = extender_client.InProcessClient(specs, AdminConfig(scoring_config("default" if spread else policy)),
                                    decision="prioritize" if spread else "filter")
    names = scheduler_emulation.ClusterNames.build(specs, profile.node_cache_capable)
    view = SchedulerView(np.array([s.cpu_milli for s in specs]), np.array([s.memory_mib for s in specs]),
                         np.array([sum(g.replicas for g in s.gpus) for s in specs]), profile,
                         np.random.default_rng(seed))
    n_pods = math.floor(load * n_nodes * gpus_per_node / seen_gpu)
    placed = 0
    start = time.perf_counter()
    shapes = [(float(first_gpu), "first")] if first_gpu else []
    shapes += [(seen_gpu, f"seen-{i:06d}") for i in range(n_pods)]
    for shape, name in shapes:
        p = pod(shape, name)
        cpu, mem = host_requests(shape)
        gpus = max(1, int(shape))
        client.pod_events([{"type": "ADDED", "object": p}])
        feasible = view.feasible(cpu, mem, gpus)
        node = scheduler_emulation.schedule_with_extender(client, view, names, p, cpu, mem, feasible, profile)
        if node >= 0 and not client.bind(p, names.names[node]):
            view.assume(node, cpu, mem, gpus)
            placed += name != "first"
        else:  # a pod that fits nowhere must not stay pending in the workload
            client.pod_events([{"type": "DELETED", "object": p}])
    seconds = time.perf_counter() - start
    touched = len({a["node"] for a in client.get("allocations")})
    all_names = names.names
    fits: dict[str, int] = {}
    for shape in SHAPES_GPU:
        intent, _ = inbound.extender_args(pod(shape, "probe"), None, all_names)
        fits[f"{shape:g}"] = int(client.cache.evaluate(intent, all_names).evaluation.node_fits.sum())
    return ColdStartResult(policy, seen_gpu, load, first_gpu, n_pods, placed, touched, fits, seconds)


def table(results: list[ColdStartResult]) -> str:
    """Markdown: one row per (load, seen shape), nodes where each next shape fits per policy."""
    by = {(r.policy, r.first_gpu, r.seen_gpu, r.load): r for r in results}
    policies = list(dict.fromkeys(r.policy for r in results))
    loads = sorted({r.load for r in results})
    seen = sorted({r.seen_gpu for r in results})
    firsts = sorted({r.first_gpu for r in results})
    head = "| load | seen first | " + " | ".join(
        f"next {s:g} GPU: " + " / ".join(policies) for s in SHAPES_GPU) + " | nodes touched |"
    lines = [head, "|" + "---|" * (len(SHAPES_GPU) + 3)]
    for first in firsts:
        for load in loads:
            for s in seen:
                rs = [by.get((p, first, s, load)) for p in policies]
                if not any(rs):
                    continue
                cells = [" / ".join(str(r.fits_next[f"{n:g}"]) if r else "-" for r in rs) for n in SHAPES_GPU]
                touched = " / ".join(str(r.nodes_touched) if r else "-" for r in rs)
                what = f"{first} GPU, then {s:g} GPU" if first else f"{s:g} GPU"
                lines.append(f"| {load:.0%} | {what} | " + " | ".join(cells) + f" | {touched} |")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks cold-start``."""
    p.add_argument("--nodes", type=int, default=500, help="nodes in the fresh cluster (default 500)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="A100s per node (default 8)")
    p.add_argument("--seen", default=",".join(f"{s:g}" for s in SHAPES_GPU),
                   help="comma-separated shapes seen first, in GPUs (default all six)")
    p.add_argument("--loads", default=",".join(f"{x:g}" for x in LOADS),
                   help="comma-separated loads as fractions of GPU capacity (default 0.06,0.5)")
    p.add_argument("--first", default="0",
                   help="comma-separated GPUs of one pod placed before the seen ones, 0 for none "
                        "(default 0; 0,8 runs each fill without and after an 8-GPU pod)")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help=f"comma-separated, of {', '.join(POLICIES)} or any preset (default all three)")
    p.add_argument("--out", type=Path, default=Path("cold-start-out"),
                   help="folder for result.json and table.md (default cold-start-out)")


def run(args: argparse.Namespace) -> int:
    """Run every (policy, seen, load); write ``result.json`` and ``table.md``; print the table."""
    seen = [float(x) for x in args.seen.split(",") if x]
    bad = [s for s in seen if s <= 0 or s > args.gpus_per_node or (s > 1 and s != int(s))]
    if bad:
        raise SystemExit(f"--seen: shapes must be in (0, 1] or whole GPUs up to --gpus-per-node, got {bad}")
    loads = [float(x) for x in args.loads.split(",") if x]
    if any(not 0 < x <= 1 for x in loads):
        raise SystemExit(f"--loads: each must be in (0, 1], got {args.loads}")
    firsts = [int(x) for x in args.first.split(",") if x]
    if any(not 0 <= f <= args.gpus_per_node for f in firsts):
        raise SystemExit(f"--first: GPUs in 0..--gpus-per-node, got {args.first}")
    results = []
    for first in firsts:
        for load in loads:
            for s in seen:
                for policy in [p for p in args.policies.split(",") if p]:
                    r = run_one(policy, s, load, args.nodes, args.gpus_per_node, first_gpu=first)
                    print(f"{policy:>14} first {first} seen {s:g} GPU at {load:.0%}: {r.placed}/{r.pods} placed on "
                          f"{r.nodes_touched} nodes; next fits on {r.fits_next} ({r.seconds:.1f} s)", flush=True)
                    results.append(r)
    args.out.mkdir(parents=True, exist_ok=True)
    md = table(results)
    (args.out / "table.md").write_text(md + "\n")
    (args.out / "result.json").write_text(json.dumps({
        "command": "python -m benchmarks cold-start " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("func", "command")),
        "commit": replay.source_commit(), "nodes": args.nodes, "gpus_per_node": args.gpus_per_node,
        "results": [r.__dict__ for r in results]}, indent=1) + "\n")
    print(md)
    return 0
