"""``python -m benchmarks floor``: both floors per openb variant and seed, as a table."""

from __future__ import annotations

import argparse
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from benchmarks import compare, constrain, trace
from benchmarks.errors import UsageError
from benchmarks.floor.demand import MILLI_PER_GPU, arrived_demand, arrived_model_demand
from benchmarks.floor.models import max_allocated_milli_by_model
from benchmarks.floor.per_model import PerModelFloor, work_conserving_floor_by_model_pct
from benchmarks.floor.share import max_allocated_milli
from benchmarks.floor.work_conserving import work_conserving_floor_pct
from benchmarks.replay import parse_seeds
from extender.clusterfile import load_cluster_file


def unallocated_floor_pct(pods: Sequence[trace.TracePod], seed: int,
                          gpus: int | Mapping[tuple[str, int], int]) -> float:
    """The floor for one openb pod list and seed.

    Parameters
    ----------
    pods : sequence of TracePod
        An openb pod list (``trace.load_pods``), possibly model-constrained
        (``benchmarks.constrain``).
    seed : int
        Arrival-order seed, as in ``python -m benchmarks replay``.
    gpus : int or mapping of (str, int) to int
        GPUs in the cluster (``bundled_gpu_count()``: GPU share only), or GPUs per kind,
        (model, GPUs of the node) (``bundled_gpu_kinds()``), to respect the pods'
        ``gpu_spec`` and that a pod of ``k`` GPUs needs a node of ``k`` or more.

    Returns
    -------
    float
        Unallocated GPU share at the 100 % point no placement can go below, % of capacity.
    """
    n_gpus = sum(gpus.values()) if isinstance(gpus, Mapping) else gpus
    capacity = MILLI_PER_GPU * n_gpus
    seq = trace.arrival_sequence(list(pods), seed, capacity)
    if not isinstance(gpus, Mapping):
        best = max_allocated_milli(arrived_demand(seq, capacity), n_gpus)
    else:
        names = {f"{m}/{n}": (m, n) for m, n in gpus}
        model_demand = arrived_model_demand(seq, capacity, names)
        plain = model_demand.any_model(sorted(names))
        best = (max_allocated_milli(plain, n_gpus) if plain is not None
                else max_allocated_milli_by_model(model_demand, {b: gpus[k] for b, k in names.items()}))
    return 100.0 * (capacity - best) / capacity


def bundled_gpu_count() -> int:
    """GPUs of the bundled openb node list (6,212)."""
    return sum(len(s.gpus) for s in load_cluster_file(trace.DEFAULT_NODES, replicas_per_gpu=1))


def bundled_gpu_kinds() -> dict[tuple[str, int], int]:
    """GPUs of each kind, (model, GPUs of the node), in the bundled openb node list."""
    return dict(Counter((g.model, len(s.gpus)) for s in load_cluster_file(trace.DEFAULT_NODES, replicas_per_gpu=1)
                        for g in s.gpus))


def table(floors: Mapping[str, Sequence[float]], seeds: Sequence[int],
          work_conserving: Mapping[str, Sequence[float]] | None = None,
          within: Mapping[str, Sequence[float]] | None = None) -> str:
    """Markdown: median (min-max) floor per variant, the work-conserving floor where given
    (for a model-constrained list the per-model one, with ``within``: how far above it the
    exact least LP may be on the worst seed), next to the published FGD."""
    def spread(vals: Sequence[float]) -> str:
        return f"{float(np.median(vals)):.2f} ({min(vals):.2f}-{max(vals):.2f})"

    lines = [f"Lower bound on unallocated GPU % at 100 % arrived (cutting-stock LP: GPU share, models, GPUs per node), "
             f"seeds {seeds[0]}..{seeds[-1]}. Work-conserving: for schedulers that place every pod some GPU "
             f"can hold (GPU share only; for a model-constrained list, a GPU of a model the pod accepts, with a "
             f"saturation point per model: benchmarks/floor/per_model.py).", "",
             "| variant | floor, median (min-max) | work-conserving floor | per-model search within | published FGD |",
             "|---|---|---|---|---|"]
    for v, vals in floors.items():
        wc = (work_conserving or {}).get(v, [])
        gap = (within or {}).get(v, [])
        lines.append(f"| {v} | {spread(vals)} | {spread(wc) if wc else '-'} | {f'{max(gap):.3f}' if gap else '-'} | "
                     f"{compare.PUBLISHED_FGD_UNALLOCATED_PCT.get(v, float('nan')):.2f} |")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks floor``."""
    p.add_argument("--variants", nargs="+", default=["default"], help="openb variants, or 'all'")
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="processes for the per-model floors of model-constrained lists (about 1-2 min a seed)")


def run(args: argparse.Namespace) -> int:
    """``python -m benchmarks floor --variants all --seeds 42-51``: print the table."""
    try:
        variants = compare.variant_names(args.variants)
    except ValueError as e:
        raise UsageError(str(e)) from None
    gpus = bundled_gpu_kinds()
    floors, work_conserving, within = {}, {}, {}
    constrained = [(v, s) for v in variants if compare.parse_variant(v)[1] for s in args.seeds]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        per_model = dict(zip(constrained, pool.map(_per_model_floor, *zip(*constrained, strict=True)), strict=True)
                         ) if constrained else {}
        for v in variants:
            pods = _variant_pods(v)
            floors[v] = [unallocated_floor_pct(pods, s, gpus) for s in args.seeds]
            # Both are floors for a model-constrained list; the larger holds.
            work_conserving[v] = [max(work_conserving_floor_pct(pods, s, sum(gpus.values())),
                                      per_model[(v, s)].unallocated_pct if (v, s) in per_model else -math.inf)
                                  for s in args.seeds]
            if compare.parse_variant(v)[1]:
                within[v] = [per_model[(v, s)].within_pct for s in args.seeds]
    print(table(floors, args.seeds, work_conserving, within))
    return 0


def _variant_pods(variant: str) -> list[trace.TracePod]:
    """An openb variant's pods, model-constrained by its ``-m<PCT>``; GPU memory (``-g<PCT>``)
    is not in the LPs (a valid, weaker floor)."""
    pods = trace.load_pods(compare.pods_path(variant))
    pct = compare.parse_variant(variant)[1]
    if pct:
        pods = constrain.restrict_models(pods, pct, load_cluster_file(trace.DEFAULT_NODES, replicas_per_gpu=1))
    return pods


def _per_model_floor(variant: str, seed: int) -> PerModelFloor:
    """``work_conserving_floor_by_model_pct`` for one variant and seed (a worker's task)."""
    return work_conserving_floor_by_model_pct(_variant_pods(variant), seed, bundled_gpu_kinds())
