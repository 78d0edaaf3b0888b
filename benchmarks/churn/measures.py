"""What one churn run measured (``RunResult``) and the pending-time statistics behind it.

``benchmarks.churn.queue`` runs the emulation and fills a ``RunResult``; ``benchmarks.churn.report``
sums the runs up. Pending time is reported per pod class (``POD_CLASSES``); a pod still waiting
at the end of a run counts its wait so far, so a policy cannot look better by leaving pods
unplaced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from benchmarks.churn.workload import Arrival

POD_CLASSES = ("fractional", "whole-1", "multi-gpu", "cpu-only")
"""Pending time is reported per class: a fraction of one GPU, one whole GPU, several GPUs, none."""


def pod_class(num_gpu: int, gpu_milli: int) -> str:
    """The ``POD_CLASSES`` entry of a pod shape."""
    if num_gpu == 0:
        return "cpu-only"
    if num_gpu > 1:
        return "multi-gpu"
    return "whole-1" if gpu_milli >= 1000 else "fractional"


@dataclass
class RunResult:
    """What one churn run measured (``benchmarks.churn.report`` sums them up)."""

    preset: str
    load: float
    seed: int
    arrivals: int
    allocation_pct: float
    """Time-weighted GPU allocation, % of capacity, over the measured window."""
    fragmentation_delay_pct: float
    """% of the measured window in which some GPU pod waited while the cluster's free GPU share
    (summed over every GPU) was at least its request."""
    waiting_pct: float
    """% of the measured window in which some GPU pod waited at all."""
    fragmentation_waiting_pods: float
    """Time-average number of GPU pods waiting while the free GPU share summed over the
    cluster was at least their request (the measure behind ``fragmentation_delay_pct``)."""
    waiting_gpu_pods: float
    """Time-average number of GPU pods waiting."""
    pending: dict[str, dict[str, float]]
    """Per ``POD_CLASSES`` entry: pods arrived in the window (``n``), ``p50_s``/``p99_s``/``max_s``
    of their pending time (a pod still waiting at the end counts its wait so far), ``never_ran``."""
    cycles: int
    """Scheduling cycles that reached the extender (or the in-tree plugins for CPU-only pods)."""
    retries_skipped: int
    """Retries the emulation failed without a cycle (nothing freed for them since their last)."""
    seconds: float
    series: dict[str, list[float]] = field(repr=False)
    """``t_h``, ``allocation_pct``, ``pending_pods``, ``pending_gpu_pods`` sampled through the run."""
    reservations_made: int = 0
    """Nodes reserved by starvation protection over the run."""
    evictions_per_hour: float = 0.0
    """Evictions made acting on the defragmentation plan, per hour of the measured window."""
    moved_pending: dict[str, float] = field(default_factory=dict)
    """The evicted pods' replacements in the window: ``n``, ``p50_s``/``max_s`` of their pending time."""
    terms: dict[str, dict[str, float]] = field(default_factory=dict)
    """With ``ChurnSim(terms=True)``: per learned mix, what each strategy reads
    (``benchmarks.churn.terms.readings``), averaged over the measured window."""


def window_waits(arrive_s: NDArray[np.float64], start_s: NDArray[np.float64], run_s: float,
                 warmup_s: float) -> dict[str, float]:
    """``n``, ``p50_s``, ``max_s`` of the pending time of the pods arrived in the window (one
    still waiting counts until ``run_s``)."""
    inside = (arrive_s >= warmup_s) & (arrive_s < run_s)
    waits = np.where(np.isnan(start_s), run_s, start_s)[inside] - arrive_s[inside]
    if not waits.shape[0]:
        return {"n": 0.0, "p50_s": 0.0, "max_s": 0.0}
    return {"n": float(waits.shape[0]), "p50_s": float(np.median(waits)), "max_s": float(waits.max())}


def pending_stats(arrivals: list[Arrival], arrive_s: NDArray[np.float64], start_s: NDArray[np.float64],
                  run_s: float, warmup_s: float) -> dict[str, dict[str, float]]:
    """Pending time per pod class of the pods that arrived in ``[warmup_s, run_s)``.

    A pod that never started counts ``run_s - arrival`` (a lower bound of its wait), so a policy
    that leaves pods waiting cannot look better by dropping them from the percentiles.
    """
    classes = np.array([pod_class(a.pod.num_gpu, a.pod.gpu_milli) for a in arrivals])
    waited = np.where(np.isnan(start_s), run_s - arrive_s, start_s - arrive_s)
    out: dict[str, dict[str, float]] = {}
    for c in POD_CLASSES:
        m = (classes == c) & (arrive_s >= warmup_s)
        w = waited[m]
        out[c] = {"n": int(m.sum()), "never_ran": int(np.isnan(start_s[m]).sum()),
                  "p50_s": float(np.percentile(w, 50)) if w.shape[0] else 0.0,
                  "p99_s": float(np.percentile(w, 99)) if w.shape[0] else 0.0,
                  "max_s": float(w.max()) if w.shape[0] else 0.0}
    return out
