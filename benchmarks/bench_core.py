"""Cost of the placement decision alone, as the cluster grows (``python -m benchmarks bench core``).

For each cluster size (identical 8-GPU, 96-core nodes, as ``bench_http``'s synthetic
cluster), the state is filled to ``--load-pct`` of its GPU share with openb pods placed
first-fit on random nodes (``ClusterState.apply``: no scoring, so filling 10,000 nodes takes
seconds), then ``--samples`` openb GPU pods are evaluated on every node by the default
scorer (``Scorer.evaluate``: feasibility, every term, the GPU choice), the pods drawn with a
fixed seed, and each is then placed where the scorer chose (untimed), so every evaluation
sees the node the previous pod changed, as in a scheduler. Timed with ``time.thread_time``
around each evaluation: CPU of the deciding thread, what one filter's decision costs
kube-scheduler without HTTP or JSON. Writes JSON
after every size, so a long run keeps what it measured.

Each pod is evaluated three times, side by side: by ``Scorer.evaluate`` (every node from
scratch, ``full_*``), by the extender's ``scoring.incremental.IncrementalScorer`` with the
shipped tolerance (``incremental_*``: only the nodes whose row moved since the same shape's
last evaluation, and everything when the cluster-wide terms drift), and by a second
incremental scorer with the numpy reference strategies (``numpy_incremental_*``), the two
incremental ones first in turn; it is placed where the incremental one chose, as the
extender would (the reference must choose the same node, or the run stops). The scorer is
the extender's: ``extender.compiled.kernels()`` (``meta.compiled`` names what compiled
it, ``numpy`` without numba). Before timing, every openb GPU pod shape is evaluated once by
both incremental scorers (a running extender has seen them: 126 shapes);
``incremental_full_pct`` is the share of timed evaluations that still scored every node
(a term refresh).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import trace
from benchmarks.replay import source_commit
from extender.admin_config import scoring_config
from extender.clusterfile import synthetic_uuid
from extender.compiled import kernels
from scoring.drift import DEFAULT_TOLERANCE
from scoring.incremental import IncrementalScorer
from scoring.request import MILLI_PER_GPU, PodRequest, QoSClass
from scoring.scorer import build_scorer
from scoring.specs import Allocation, GpuSpec, NodeSpec
from scoring.state import ClusterState


def synthetic_nodes(n_nodes: int, gpus: int = 8) -> list[NodeSpec]:
    """``n_nodes`` identical nodes of ``gpus`` G2-like GPUs, 96 cores, 768 GiB."""
    return [NodeSpec(f"syn-node-{i:05d}", 96_000, 786_432, tuple(
        GpuSpec(g, synthetic_uuid(f"syn-node-{i:05d}", g), "G2", 16384, 20) for g in range(gpus)))
        for i in range(n_nodes)]


def request_of(pod: trace.TracePod) -> PodRequest:
    """The scoring request of a trace pod (no model constraint: the openb lists carry none)."""
    milli = pod.gpu_milli if pod.num_gpu else MILLI_PER_GPU
    return PodRequest(gpu_count=pod.num_gpu, gpu_milli=min(milli, MILLI_PER_GPU), qos=QoSClass.BURSTABLE,
                      cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib)


def fill(state: ClusterState, pods: list[trace.TracePod], load_pct: float, rng: np.random.Generator,
         placed: list[tuple[trace.TracePod, int, tuple[int, ...]]] | None = None) -> float:
    """Place random GPU pods first-fit on random nodes until ``load_pct`` of the GPU share is
    allocated (or 20 misses in a row); the allocated %. ``placed`` collects each placement
    (the pod, its state row, its GPU columns)."""
    capacity = MILLI_PER_GPU * int(state.gpu_exists.sum())
    gpu_pods = [p for p in pods if p.num_gpu]
    target, misses = load_pct / 100 * capacity, 0
    while int(state.gpu_used_milli.sum()) < target and misses < 20:
        pod = gpu_pods[int(rng.integers(len(gpu_pods)))]
        req = request_of(pod)
        row = int(rng.integers(state.n_nodes))
        free = MILLI_PER_GPU - state.gpu_used_milli[row]
        cols = np.flatnonzero(state.gpu_exists[row] & (free >= req.gpu_milli)
                              & (state.gpu_slots_free[row] > 0))[:req.gpu_count]
        if (cols.size < req.gpu_count or state.cpu_alloc_milli[row] - state.cpu_used_milli[row] < req.cpu_milli
                or state.mem_alloc_mib[row] - state.mem_used_mib[row] < req.memory_mib):
            misses += 1
            continue
        misses = 0
        chosen = tuple(int(c) for c in cols)
        mem = tuple(req.gpu_milli * int(state.gpu_mem_total_mib[row, c]) // MILLI_PER_GPU for c in chosen)
        state.apply(Allocation(state.node_names[row], chosen, req.gpu_milli, mem,
                               req.qos, req.cpu_milli, req.memory_mib))
        if placed is not None:
            placed.append((pod, row, chosen))
    return 100.0 * int(state.gpu_used_milli.sum()) / capacity


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks bench core``."""
    p.add_argument("--nodes", default="100,1000,5000,10000", help="cluster sizes, comma-separated")
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--load-pct", type=float, default=70.0)
    p.add_argument("--preset", default="default")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/core-decision.json"))


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a Markdown table; write JSON."""
    pods = trace.load_pods(trace.DEFAULT_PODS)
    compiled = kernels()
    scorer = compiled.scorer(scoring_config(args.preset))
    reference = build_scorer(scoring_config(args.preset))
    meta = {"machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
            "python": platform.python_version(), "numpy": np.__version__, "commit": source_commit(),
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "preset": args.preset,
            "samples": args.samples, "load_pct": args.load_pct, "compiled": compiled.backend}
    rows: list[dict[str, Any]] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for n in (int(x) for x in args.nodes.split(",")):
        rng = np.random.default_rng(7)
        state = ClusterState.from_nodes(synthetic_nodes(n))
        reached = fill(state, pods, args.load_pct, rng)
        all_rows = np.arange(state.n_nodes, dtype=np.int64)
        all_rows.flags.writeable = False  # as the extender's candidate rows (inbound.candidates)
        gpu_pods = [q for q in pods if q.num_gpu]
        inc = IncrementalScorer(scorer, DEFAULT_TOLERANCE)
        inc_numpy = IncrementalScorer(reference, DEFAULT_TOLERANCE)
        for shape in sorted({request_of(q) for q in gpu_pods}, key=repr):  # warm: every shape seen once
            inc.evaluate(state, shape, all_rows)
            inc_numpy.evaluate(state, shape, all_rows)
        warm = replace(inc.stats)
        full_ms: list[float] = []
        inc_ms: list[float] = []
        numpy_ms: list[float] = []
        for i in range(args.samples):
            req = request_of(gpu_pods[int(rng.integers(len(gpu_pods)))])
            t0 = time.thread_time()
            scorer.evaluate(state, req, all_rows)
            full_ms.append(1000 * (time.thread_time() - t0))
            # The shipped scorer and the numpy reference on the same state, first in turn
            # (the second finds the state's rows in cache).
            evs = {}
            for which, times in ((inc, inc_ms), (inc_numpy, numpy_ms))[::1 if i % 2 == 0 else -1]:
                t1 = time.thread_time()
                evs[id(which)] = which.evaluate(state, req, all_rows)
                times.append(1000 * (time.thread_time() - t1))
            ev = evs[id(inc)]
            best = ev.best()
            if best != evs[id(inc_numpy)].best():
                raise AssertionError(f"sample {i}: the shipped scorer and the numpy reference chose apart")
            if best >= 0:  # place it there, as the scheduler would (untimed)
                cols = tuple(int(c) for c in ev.chosen_cols[best])
                mem = tuple(int(m) for m in ev.chosen_mem_mib[best])
                state.apply(Allocation(state.node_names[int(all_rows[best])], cols, req.gpu_milli, mem,
                                       req.qos, req.cpu_milli, req.memory_mib))
        a, b, c = np.array(full_ms), np.array(inc_ms), np.array(numpy_ms)
        rows.append({"nodes": n, "gpus": int(state.gpu_exists.sum()), "gpu_allocated_pct": round(reached, 1),
                     "full_p50_ms": float(np.percentile(a, 50)), "full_p99_ms": float(np.percentile(a, 99)),
                     "full_mean_ms": float(a.mean()),
                     "incremental_p50_ms": float(np.percentile(b, 50)),
                     "incremental_p99_ms": float(np.percentile(b, 99)), "incremental_mean_ms": float(b.mean()),
                     "numpy_incremental_p50_ms": float(np.percentile(c, 50)),
                     "numpy_incremental_p99_ms": float(np.percentile(c, 99)),
                     "incremental_full_pct": 100.0 * (inc.stats.full - warm.full) / args.samples,
                     "incremental_rows_rescored_mean": (inc.stats.rows_rescored - warm.rows_rescored) / args.samples})
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        r = rows[-1]
        print(f"{n:>6} nodes: full p50 {r['full_p50_ms']:.2f} ms, p99 {r['full_p99_ms']:.2f} ms; incremental "
              f"p50 {r['incremental_p50_ms']:.2f} ms, p99 {r['incremental_p99_ms']:.2f} ms (numpy: "
              f"{r['numpy_incremental_p50_ms']:.2f}, {r['numpy_incremental_p99_ms']:.2f}; thread CPU), "
              f"{r['gpu_allocated_pct']} % allocated", flush=True)
    print(f"Scored with {meta['compiled']} (`extender.compiled`); numpy: the reference alone, same samples.")
    print("| nodes | GPUs | allocated | full p50 ms | full p99 ms | incremental p50 ms | incremental p99 ms "
          "| numpy incremental p50 ms | numpy incremental p99 ms | full passes | rows rescored |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['nodes']:,} | {r['gpus']:,} | {r['gpu_allocated_pct']} % | {r['full_p50_ms']:.2f} "
              f"| {r['full_p99_ms']:.2f} | {r['incremental_p50_ms']:.3f} | {r['incremental_p99_ms']:.3f} "
              f"| {r['numpy_incremental_p50_ms']:.3f} | {r['numpy_incremental_p99_ms']:.3f} "
              f"| {r['incremental_full_pct']:.1f} % | {r['incremental_rows_rescored_mean']:.1f} |")
    return 0

