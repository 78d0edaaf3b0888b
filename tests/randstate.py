"""Random cluster states and pods for property tests (seeded, reproducible)."""

from __future__ import annotations

import numpy as np

from scoring.request import ANY_MODEL_MASK, PodRequest, QoSClass, model_mask
from scoring.specs import Allocation, GpuSpec, NodeSpec
from scoring.state import ClusterState

MODELS = ("T4", "V100M32", "A10")
MEM = {"T4": 16384, "V100M32": 32768, "A10": 24576}


def random_state(rng: np.random.Generator, n_nodes: int = 12) -> ClusterState:
    """Nodes of 0..8 GPUs, some unhealthy or not ready, filled with random allocations."""
    nodes = []
    for i in range(n_nodes):
        model = MODELS[int(rng.integers(len(MODELS)))]
        n_gpus = int(rng.choice([0, 1, 2, 4, 8]))
        # NVML sees some memory in use on a third of the GPUs (counted for guaranteed pods)
        gpus = tuple(GpuSpec(g, f"GPU-{i}-{g}", model, MEM[model], int(rng.integers(1, 6)),
                             bool(rng.random() > 0.1),
                             int(rng.integers(0, MEM[model])) if rng.random() < 0.3 else 0)
                     for g in range(n_gpus))
        nodes.append(NodeSpec(f"n{i:02d}", int(rng.integers(8, 97)) * 1000,
                              int(rng.integers(32, 513)) * 1024, gpus, bool(rng.random() > 0.05)))
    st = ClusterState.from_nodes(nodes)
    asks_memory = rng.random() < 0.5  # half the states hold pods that ask for GPU memory
    for _ in range(n_nodes * 4):
        row = int(rng.integers(n_nodes))
        n_gpus = int(st.gpu_exists[row].sum())
        cpu = int(rng.integers(0, 8)) * 1000
        mem = int(rng.integers(0, 32)) * 1024
        if cpu > st.cpu_alloc_milli[row] - st.cpu_used_milli[row] or mem > st.mem_alloc_mib[row] - st.mem_used_mib[row]:
            continue
        cols: tuple[int, ...] = ()
        milli = 0
        empty = [c for c in range(n_gpus) if st.gpu_used_milli[row, c] == 0 and st.gpu_pods[row, c] < st.gpu_replicas[row, c]]
        if len(empty) >= 2 and rng.random() < 0.15:  # a multi-GPU pod (whole GPUs)
            cols, milli = tuple(sorted(int(c) for c in rng.choice(empty, size=2, replace=False))), 1000
        elif n_gpus and rng.random() < 0.8:
            col = int(rng.integers(n_gpus))
            qos = QoSClass(int(rng.integers(3)))
            # best-effort pods may oversubscribe a GPU up to 1.5x (QoSPolicy.best_effort_cap_milli)
            cap = 1500 if qos == QoSClass.BEST_EFFORT else 1000
            free = cap - int(st.gpu_used_milli[row, col])
            if free <= 0 or st.gpu_pods[row, col] >= st.gpu_replicas[row, col]:
                continue
            milli = int(rng.integers(1, free + 1))
            cols = (col,)
        # memory is never oversubscribed: at most what is free
        mem_gpu = tuple(int(min(milli * st.gpu_mem_total_mib[row, c] // 1000, st.gpu_mem_free_mib[row, c]))
                        for c in cols)
        if len(cols) != 1:
            qos = QoSClass(int(rng.integers(3)))
        # a third of the pods accept only some models (gpu_spec), as in openb
        mask = model_mask(frozenset(int(x) for x in rng.choice(len(st.models), size=int(rng.integers(
            1, len(st.models) + 1)), replace=False))) if st.models and rng.random() < 0.35 else ANY_MODEL_MASK
        explicit = 0
        if asks_memory and cols and rng.random() < 0.4:  # gpufrac.io/memory: the same on every GPU
            room = min(int(st.gpu_mem_free_mib[row, c]) for c in cols)
            if room > 0:
                explicit = int(rng.integers(1, room + 1))
                mem_gpu = (explicit,) * len(cols)
        st.apply(Allocation(st.node_names[row], cols, milli, mem_gpu, qos, cpu, mem, mask,
                            gpu_memory_request_mib=explicit))
        if cols:
            st.workload.arrive((len(cols), milli, cpu, mem, mask, explicit))
    # Pods that held GPUs and left before: the churn in [0, 1], 0 (arrivals only) a fifth of the time.
    if rng.random() < 0.8:
        for _ in range(int(rng.integers(1, n_nodes * 4))):
            st.workload.depart()
    # GPU pods waiting, asking from none to several times the free share.
    for _ in range(int(rng.integers(0, n_nodes * 2)) if rng.random() < 0.6 else 0):
        k = int(rng.choice([1, 1, 2, 4, 8]))
        st.workload.add((k, 1000 if k > 1 else int(rng.integers(1, 1001)), 1000, 1024, ANY_MODEL_MASK, 0), 1, pending=True)
    return st


def random_request(rng: np.random.Generator) -> PodRequest:
    """A pod: CPU-only, a share, or 1/2/4/8 whole GPUs, sometimes model- or memory-bound."""
    kind = rng.random()
    k = 0 if kind < 0.1 else (1 if kind < 0.8 else int(rng.choice([1, 2, 4, 8])))
    milli = int(rng.integers(1, 1001)) if k == 1 and rng.random() < 0.6 else 1000
    models = frozenset(int(x) for x in rng.choice(3, size=int(rng.integers(1, 3)), replace=False)) \
        if rng.random() < 0.3 else None
    mem = int(rng.integers(1, 40000)) if rng.random() < 0.2 else None
    return PodRequest(k, milli, mem, models, QoSClass(int(rng.integers(3))),
                      int(rng.integers(0, 16)) * 1000, int(rng.integers(0, 64)) * 1024)
