"""What each term of the default reads from the learned workload: the running mix against the arrival mix.

The learned workload (``scoring.workload.WorkloadModel``) keeps both counts side by side: the
pods running and waiting, and the arrivals, decayed (``Learning``). ``readings`` takes one
state and reads, for each mix, the quantity each strategy of the default takes from it:

- ``fgd``: the popularity of the task types that take a whole node of the largest size (the
  weight FGD's fragmentation gives to keeping such nodes whole);
- ``adaptive_balance``: the multi-GPU share of the GPU demand ``s`` (two-sided balance below
  ``S_ONE_SIDED``, one-sided above);
- ``gap_price``: ``U(1000)``, the priced waste of an empty GPU in the cutting-stock LP of the
  demand (``scoring.gaps.gap_waste``; 0: an empty GPU is worth a pod, 1000: worth nothing);
- ``priced_stranding``: ``rho_cpu``, the demand's CPU milli per milli-GPU;
- ``spare_nodes``: ``P_k`` of the largest pod size ``k``, the chance that every free slot of
  that size will be needed.

``python -m benchmarks churn --terms`` averages them over the measured window of the first
policy's runs (``RunResult.terms``) and the report prints them side by side.
"""

from __future__ import annotations

import numpy as np

from scoring.arrivals import LEARN_FROM, Learning
from scoring.gaps import gap_waste
from scoring.request import MILLI_PER_GPU
from scoring.state import ClusterState
from scoring.strategies.spare_nodes import spare_need
from scoring.utilization import multi_gpu_share

READINGS = ("fgd", "adaptive_balance", "gap_price", "priced_stranding", "spare_nodes")
"""The strategies read, in the order the report prints them."""


def readings(state: ClusterState) -> dict[str, dict[str, float]]:
    """Per ``Learning.learn_from`` mix, per strategy, the quantity it reads (module notes).

    Parameters
    ----------
    state : ClusterState
        Read only (its workload is copied for each mix).

    Returns
    -------
    dict of str to dict of str to float
        ``{"running": {...}, "arrivals": {...}}``; a mix without any counted pod is absent.
    """
    healthy_free = np.where(state.gpu_healthy, np.clip(state.gpu_free_milli, 0, MILLI_PER_GPU), 0)
    whole_free = (healthy_free >= MILLI_PER_GPU).sum(axis=1)
    sizes = state.gpu_exists.sum(axis=1)
    largest = int(sizes.max(initial=0))
    n_gpus = int((state.gpu_exists & state.gpu_healthy).sum())
    out: dict[str, dict[str, float]] = {}
    for mix in LEARN_FROM:
        wl = state.workload.copy()
        wl.set_learning(Learning(mix, state.workload.learning.half_life_pods))
        tasks = wl.task_types()
        if tasks is None:
            continue
        gpu = tasks.gpu_count > 0
        share = float((tasks.count * tasks.gpu_count * np.minimum(tasks.gpu_milli, MILLI_PER_GPU))[gpu].sum())
        whole_node = (tasks.gpu_count >= largest) & (tasks.gpu_milli >= MILLI_PER_GPU)
        need = dict(spare_need(wl.share_by_gpu_count(), float(healthy_free.sum()), np.bincount(whole_free).tolist()))
        out[mix] = {
            "fgd": float(tasks.popularity[whole_node].sum()),
            "adaptive_balance": multi_gpu_share(tasks),
            "gap_price": float(gap_waste(tasks, max(n_gpus, 1))[MILLI_PER_GPU]),
            "priced_stranding": float((tasks.count * tasks.cpu_milli)[gpu].sum()) / share if share else 0.0,
            "spare_nodes": float(need[max(need)]) if need else 0.0,
        }
    return out
