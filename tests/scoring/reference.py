"""Slow scalar reference of fit, scoring and GPU choice (tests only).

Written node by node and GPU by GPU in plain Python from the formulas in the strategy
docstrings, so the vectorized kernels can be checked against it (like SciPy's ``dist_func``
beside ``cdist``). Not used by the extender.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from scoring.fit import Reason
from scoring.request import MILLI_PER_GPU, PodRequest, QoSClass, QoSPolicy
from scoring.state import ClusterState


@dataclass(frozen=True)
class ReferenceResult:
    """One node's answer: feasibility, reason, score in [0, 1], chosen GPU columns."""

    fits: bool
    reason: Reason
    score: float
    cols: tuple[int, ...]


def _frag(free: list[int], cpu_free: int, mem_free: int, state: ClusterState, row: int,
          gpu_mem_free: list[int]) -> int:
    """``N * F_n`` of ``scoring.strategies.fgd`` (``N`` pods in the workload), task by task, GPU by GPU."""
    tasks = state.workload.task_types()
    assert tasks is not None
    models = [int(state.gpu_model[row, c]) for c in range(len(free))]
    total = 0
    for t in range(tasks.popularity.shape[0]):
        r, k = int(tasks.gpu_milli[t]), int(tasks.gpu_count[t])
        mask = -1 if tasks.model_mask is None else int(tasks.model_mask[t])
        need = None if tasks.gpu_memory_mib is None else int(tasks.gpu_memory_mib[t])
        usable = [f >= r and (mask >> max(mdl, 0)) & 1 == 1 and (need is None or m >= need)
                  for f, mdl, m in zip(free, models, gpu_mem_free, strict=True)]
        runs = sum(usable) >= k and cpu_free >= int(tasks.cpu_milli[t]) and mem_free >= int(tasks.memory_mib[t])
        part = sum(f for f, u in zip(free, usable, strict=True) if not u) if runs else sum(free)
        total += int(tasks.count[t]) * part
    return total


def _fgd_score(state: ClusterState, row: int, req: PodRequest, cols: tuple[int, ...]) -> float:
    """``scoring.strategies.fgd`` for the pod on ``cols`` of ``row`` (1/2 without a workload)."""
    if state.workload.task_types() is None:
        return 0.5
    free = [_free(state, row, c) if state.gpu_exists[row, c] else 0 for c in range(state.max_gpus)]
    cpu = int(state.cpu_alloc_milli[row]) - int(state.cpu_used_milli[row])
    mem = int(state.mem_alloc_mib[row]) - int(state.mem_used_mib[row])
    after = [f - req.gpu_milli if c in cols else f for c, f in enumerate(free)]
    gpu_mem = [int(state.gpu_mem_free_mib[row, c]) for c in range(state.max_gpus)]
    taken = [req.gpu_memory_mib if req.gpu_memory_mib is not None
             else req.gpu_milli * int(state.gpu_mem_total_mib[row, c]) // MILLI_PER_GPU for c in range(state.max_gpus)]
    gpu_mem_after = [m - taken[c] if c in cols else m for c, m in enumerate(gpu_mem)]
    tasks = state.workload.task_types()
    assert tasks is not None
    pods = int(tasks.count.sum())
    delta = (_frag(after, cpu - req.cpu_milli, mem - req.memory_mib, state, row, gpu_mem_after)
             - _frag(free, cpu, mem, state, row, gpu_mem)) / pods
    return math.trunc(100 / (1.0 + math.exp(delta / 1000.0))) / 100


@functools.cache
def _priced_u(key: tuple[tuple[int, int], ...], n_gpus: int) -> tuple[float, ...]:
    """``U(0..1000)`` of ``scoring.strategies.gap_price`` for (share, rounded log count) pairs."""
    from scoring.cutting_stock import shadow_prices

    u = [float(f) for f in range(MILLI_PER_GPU + 1)]
    if not key:
        return tuple(u)
    sizes = [s for s, _ in key]
    _, price = shadow_prices(np.array(sizes, dtype=np.int64), np.array([1.05 ** q for _, q in key]), n_gpus)
    for f in range(1, MILLI_PER_GPU + 1):
        u[f] = min([float(f), *(round(float(y), 6) + u[f - s] for s, y in zip(sizes, price, strict=True)
                                if s <= f)])
    return tuple(u)


@functools.cache
def _joint_priced_u(key: tuple[tuple[int, int, int], ...], n_gpus: tuple[int, ...], kind: int) -> tuple[float, ...]:
    """``U_i(0..1000)`` for (share, accepted-kind bits, rounded log count) classes: one LP with
    a bin per set of kinds the same classes accept (merged, as ``scoring.gaps`` does); the
    duals from ``scoring.cutting_stock.shadow_prices_by_model``."""
    from scoring.cutting_stock import shadow_prices_by_model

    u = [float(f) for f in range(MILLI_PER_GPU + 1)]
    accepts = [tuple((m >> i) & 1 == 1 for _, m, _ in key) for i in range(len(n_gpus))]  # per kind
    if not key or n_gpus[kind] == 0 or not any(accepts[kind]):
        return tuple(u)
    bins = sorted(set(accepts))
    gpus = [float(sum(n for a, n in zip(accepts, n_gpus, strict=True) if a == b)) for b in bins]
    allowed = np.array([[b[c] for b in bins] for c in range(len(key))])
    _, price = shadow_prices_by_model(np.array([s for s, _, _ in key], dtype=np.int64), allowed,
                                      np.array([1.05 ** q for _, _, q in key]), np.array(gpus))
    on = [(s, round(float(y), 6)) for (s, m, _), y in zip(key, price, strict=True) if (m >> kind) & 1]
    for f in range(1, MILLI_PER_GPU + 1):
        u[f] = min([float(f), *(y + u[f - s] for s, y in on if s <= f)])
    return tuple(u)


def _gap_price_u(state: ClusterState, row: int, col: int) -> tuple[float, ...]:
    """``U(0..1000)`` of ``scoring.strategies.gap_price`` for the GPU's kind (model, GPUs of its
    node): scaled counts and rounding written out here; the LP duals from
    ``scoring.cutting_stock`` (checked against HiGHS in its own tests). While every type may
    use every kind, one LP over every healthy GPU; otherwise one LP with a bin per kind, over
    (share, kinds it may use) classes."""
    tasks = state.workload.task_types()
    assert tasks is not None
    node_gpus = [sum(1 for c in range(state.max_gpus) if state.gpu_exists[r, c]) for r in range(state.n_nodes)]
    kinds = sorted({(int(state.gpu_model[r, c]), node_gpus[r]) for r in range(state.n_nodes)
                    for c in range(state.max_gpus) if state.gpu_healthy[r, c]})
    per_kind = tuple(sum(1 for r in range(state.n_nodes) for c in range(state.max_gpus) if state.gpu_healthy[r, c]
                         and (int(state.gpu_model[r, c]), node_gpus[r]) == kd) for kd in kinds)
    # the most memory a healthy GPU of each kind has; a type asking more (rounded up to GiB)
    # may not use the kind
    kind_mib = [max(int(state.gpu_mem_total_mib[r, c]) for r in range(state.n_nodes) for c in range(state.max_gpus)
                    if state.gpu_healthy[r, c] and (int(state.gpu_model[r, c]), node_gpus[r]) == kd) for kd in kinds]
    masks = [-1] * tasks.count.shape[0] if tasks.model_mask is None else [int(m) for m in tasks.model_mask]
    asked = [0] * tasks.count.shape[0] if tasks.gpu_memory_mib is None else [
        -(-int(g) // 1024) * 1024 for g in tasks.gpu_memory_mib]
    demand = [(int(tasks.gpu_count[t]), min(int(tasks.gpu_milli[t]), MILLI_PER_GPU), masks[t], asked[t],
               int(tasks.count[t])) for t in range(tasks.count.shape[0])]
    pods: dict[tuple[int, int], int] = {}
    for k, r, mask, g, n in demand:
        accepted = 0
        for i, (model, ng) in enumerate(kinds):  # ids past 62: only a mask of every model accepts them
            if ng >= k and (mask == -1 or (model <= 62 and (mask >> model) & 1)) and kind_mib[i] >= g:
                accepted |= 1 << i
        if k > 0 and accepted:
            pods[(r, accepted)] = pods.get((r, accepted), 0) + k * n
    total_share = sum(s * n for (s, _), n in pods.items())
    n_gpus = sum(per_kind)
    if n_gpus == 0 or total_share == 0:
        return tuple(float(f) for f in range(MILLI_PER_GPU + 1))
    scale = 1.0 * MILLI_PER_GPU * n_gpus / total_share  # the cluster's share, SATURATION = 1
    every = (1 << len(kinds)) - 1
    restricted = tasks.model_mask is not None or any(g > min(kind_mib, default=0) for _, _, _, g, _ in demand)
    if not restricted or all(m == every for _, m in pods):  # no model or memory restricted: one LP
        by_size: dict[int, int] = {}
        for k, r, _, _, n in demand:
            if k > 0:
                by_size[r] = by_size.get(r, 0) + k * n
        total = sum(s * n for s, n in by_size.items())
        scale = 1.0 * MILLI_PER_GPU * n_gpus / total
        return _priced_u(tuple((s, round(math.log(n * scale) / math.log(1.05))) for s, n in sorted(by_size.items())),
                         n_gpus)
    here = (int(state.gpu_model[row, col]), node_gpus[row])
    if here not in kinds:
        return tuple(float(f) for f in range(MILLI_PER_GPU + 1))
    key = tuple((s, m, round(math.log(n * scale) / math.log(1.05))) for (s, m), n in sorted(pods.items()))
    return _joint_priced_u(key, per_kind, kinds.index(here))


def _gap_price_score(state: ClusterState, row: int, col: int, req: PodRequest) -> float:
    """``scoring.strategies.gap_price`` for one GPU."""
    if state.workload.task_types() is None:
        return 0.5
    u = _gap_price_u(state, row, col)
    free = min(_free(state, row, col), MILLI_PER_GPU)
    after = max(free - req.gpu_milli, 0)
    return min(max(0.5 - (u[after] - u[free]) / 2000.0, 0.0), 1.0)


def _priced_stranding_score(state: ClusterState, row: int, req: PodRequest, cols: tuple[int, ...]) -> float:
    """``scoring.strategies.priced_stranding`` for the pod on ``cols`` of ``row``, GPU by GPU."""
    tasks = state.workload.task_types()
    if tasks is None:
        return 0.5
    share = cpu_sum = mem_sum = 0
    for t in range(tasks.count.shape[0]):
        k, n = int(tasks.gpu_count[t]), int(tasks.count[t])
        if k > 0:
            share += n * k * min(int(tasks.gpu_milli[t]), MILLI_PER_GPU)
            cpu_sum += n * int(tasks.cpu_milli[t])
            mem_sum += n * int(tasks.memory_mib[t])
    rho_cpu = cpu_sum / share if share else 0.0
    rho_mem = mem_sum / share if share else 0.0

    def stranded(cpu: int, mem: int, free: list[int]) -> float:
        value = sum(f - _gap_price_u(state, row, c)[f] for c, f in enumerate(free) if state.gpu_exists[row, c])
        serves = min(max(cpu, 0) / rho_cpu if rho_cpu > 0 else math.inf,
                     max(mem, 0) / rho_mem if rho_mem > 0 else math.inf)
        return max(value - serves, 0.0)

    cpu = int(state.cpu_alloc_milli[row]) - int(state.cpu_used_milli[row])
    mem = int(state.mem_alloc_mib[row]) - int(state.mem_used_mib[row])
    free = [min(_free(state, row, c), MILLI_PER_GPU) for c in range(state.max_gpus)]
    after = [max(f - req.gpu_milli, 0) if c in cols else f for c, f in enumerate(free)]
    delta = stranded(cpu - req.cpu_milli, mem - req.memory_mib, after) - stranded(cpu, mem, free)
    return min(max(0.5 - delta / 2000.0, 0.0), 1.0)


def _spare_nodes_score(state: ClusterState, row: int, req: PodRequest, cols: tuple[int, ...]) -> float:
    """``scoring.strategies.spare_nodes`` for the pod on ``cols`` of ``row``, written out."""
    tasks = state.workload.task_types()
    if tasks is None:
        return 0.5
    whole = [[bool(state.gpu_healthy[r, c]) and _free(state, r, c) >= MILLI_PER_GPU for c in range(state.max_gpus)]
             for r in range(state.n_nodes)]
    free = sum(min(max(_free(state, r, c), 0), MILLI_PER_GPU) for r in range(state.n_nodes)
               for c in range(state.max_gpus) if state.gpu_healthy[r, c])
    demand = {int(k): 0 for k in tasks.gpu_count.tolist()}
    for t in range(tasks.count.shape[0]):
        k = int(tasks.gpu_count[t])
        demand[k] += int(tasks.count[t]) * k * min(int(tasks.gpu_milli[t]), MILLI_PER_GPU)
    total = sum(demand.values())
    before = sum(whole[row])
    after = before - sum(1 for c in cols if whole[row][c])
    cost = 0.0
    for k in sorted(demand):
        if k < 2:
            continue
        mu = demand[k] / total * free / (MILLI_PER_GPU * k)
        spare = sum(sum(whole[r]) // k for r in range(state.n_nodes))  # k-GPU slots
        p = 0.0 if mu <= 0 else min(max(0.5 * math.erfc((spare - 0.5 - mu) / math.sqrt(2 * mu)), 0.0), 1.0)
        cost += (before // k - after // k) * MILLI_PER_GPU * k * p
    return min(max(0.5 - cost / 2000.0, 0.0), 1.0)


def _splitmix64(x: int) -> int:
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def _random_draw(state: ClusterState, row: int, col: int, req: PodRequest) -> float:
    """``scoring.strategies.random_fit`` for one GPU, in Python integers wrapped to 64 bits."""
    mask = (1 << 64) - 1
    pod_key = (req.cpu_milli * 8_191 + req.gpu_milli * 131 + req.gpu_count) & mask
    cell = row * state.max_gpus + col
    cpu_free = int(state.cpu_alloc_milli[row]) - int(state.cpu_used_milli[row])
    local = (int(state.gpu_free_milli[row, col]) * 1_000_003 + cpu_free) & mask
    draw = _splitmix64(_splitmix64(cell) ^ _splitmix64(local) ^ pod_key)
    return (draw >> 11) / float(1 << 53)


def _free(state: ClusterState, row: int, col: int) -> int:
    """Free share: ``1000 - used``, 0 where best-effort pods oversubscribe the GPU."""
    return max(MILLI_PER_GPU - int(state.gpu_used_milli[row, col]), 0)


def _gpu_terms(state: ClusterState, row: int, col: int, req: PodRequest) -> dict[str, float]:
    free = _free(state, row, col)
    tight = min(1.0 - (free - req.gpu_milli) / MILLI_PER_GPU, 1.0)  # 1 when squeezing best-effort
    g = int(state.gpu_qos_pods[row, col, QoSClass.GUARANTEED])
    b = int(state.gpu_qos_pods[row, col, QoSClass.BEST_EFFORT])
    conflict = (req.qos == QoSClass.BEST_EFFORT and g > 0) or (req.qos == QoSClass.GUARANTEED and b > 0)
    return {
        "gpu_best_fit": tight,
        "best_fit": tight,
        "qos_interference": 0.0 if conflict else 1.0,
        "fgd": _fgd_score(state, row, req, (col,)),
        "random_fit": _random_draw(state, row, col, req),
        "gap_price": _gap_price_score(state, row, col, req),
    }


def _node_terms(state: ClusterState, row: int, req: PodRequest) -> dict[str, float]:
    n_gpus = sum(bool(x) for x in state.gpu_exists[row])
    total = MILLI_PER_GPU * n_gpus
    used = sum(int(state.gpu_used_milli[row, c]) for c in range(state.max_gpus) if state.gpu_exists[row, c])
    after = used + req.gpu_count * req.gpu_milli
    util = min(after / total, 1.0) if total else 0.0
    ca, ma = int(state.cpu_alloc_milli[row]), int(state.mem_alloc_mib[row])
    balance = stranding = 0.0
    if total and ca and ma:
        u_cpu = (int(state.cpu_used_milli[row]) + req.cpu_milli) / ca
        u_mem = (int(state.mem_used_mib[row]) + req.memory_mib) / ma
        u_gpu = after / total
        balance = min(max(1.0 - max(abs(u_cpu - u_gpu), abs(u_mem - u_gpu)), 0.0), 1.0)
        stranding = min(max(1.0 - max(0.0, u_cpu - u_gpu, u_mem - u_gpu), 0.0), 1.0)
    gpu_free = sum(_free(state, row, c) for c in range(state.max_gpus) if state.gpu_exists[row, c])
    left = ((int(state.cpu_alloc_milli[row]) - int(state.cpu_used_milli[row]) - req.cpu_milli) / 128_000 * 0.5
            + (gpu_free - req.gpu_count * req.gpu_milli) / 8_000 * 0.5)
    tasks = state.workload.task_types()
    share = 0.0
    if tasks is not None:
        demand = [float(tasks.popularity[t]) * int(tasks.gpu_count[t]) * int(tasks.gpu_milli[t])
                  for t in range(tasks.popularity.shape[0])]
        multi = sum(d for t, d in enumerate(demand) if int(tasks.gpu_count[t]) >= 2)
        share = multi / sum(demand) if sum(demand) > 0 else 0.0
    lam = min(1.0, share / 0.3)  # adaptive_balance: one-sided from a multi-GPU share of 0.3
    gpu_rows = [r for r in range(state.n_nodes) if int(state.node_gpu_total_milli[r]) > 0]
    cpu_total = sum(int(state.cpu_alloc_milli[r]) for r in gpu_rows)
    gpu_total = sum(int(state.node_gpu_total_milli[r]) for r in gpu_rows)
    pressure = 0.0
    if cpu_total > 0 and gpu_total > 0:  # scoring.fit.cpu_pressure
        u_gpu = sum(int(state.node_gpu_used_milli[r]) for r in range(state.n_nodes)) / gpu_total
        pressure = sum(int(state.cpu_used_milli[r]) for r in gpu_rows) / cpu_total / max(u_gpu, 0.1)
    gain = 1.0 + min(1.0, max(0.0, (pressure - 0.9) / 0.1))  # two-sided term x1 .. x2 over p 0.9..1
    cpu_ref = max((int(state.cpu_alloc_milli[r]) for r in gpu_rows), default=0)
    gpu_ref = max((int(state.node_gpu_total_milli[r]) for r in range(state.n_nodes)), default=0)
    room = (0.5 * max(int(state.cpu_alloc_milli[row]) - int(state.cpu_used_milli[row]) - req.cpu_milli, 0) / max(cpu_ref, 1)
            + 0.5 * max(total - used - req.gpu_count * req.gpu_milli, 0) / max(gpu_ref, 1))
    return {
        "consolidation": min(max(1.0 - room, 0.0), 1.0),
        "best_fit": min(max(math.trunc((1.0 - left) * 100) / 100, 0.0), 1.0),
        "multi_gpu_reserve": util * min(1.0, (share / 0.5) ** 2),
        "node_packing": util,
        "spread": 1.0 - util if total else 0.0,
        "resource_balance": balance,
        "stranding": stranding,
        "adaptive_balance": ((1.0 - lam) * gain * balance + 2.0 * lam * stranding) / 2.0,
    }


def _share_ok(state: ClusterState, row: int, col: int, req: PodRequest, policy: QoSPolicy) -> bool:
    used = int(state.gpu_used_milli[row, col])
    reserved = used - int(state.gpu_best_effort_milli[row, col])
    holds_g = int(state.gpu_qos_pods[row, col, QoSClass.GUARANTEED]) > 0
    if req.qos == QoSClass.GUARANTEED:
        return used + req.gpu_milli <= MILLI_PER_GPU
    if req.qos == QoSClass.BURSTABLE:
        return reserved + req.gpu_milli <= MILLI_PER_GPU and (
            not holds_g or used + req.gpu_milli <= MILLI_PER_GPU)
    cap = MILLI_PER_GPU if holds_g else policy.best_effort_cap_milli
    return used + req.gpu_milli <= cap


def _isolation_ok(state: ClusterState, row: int, col: int, req: PodRequest, policy: QoSPolicy) -> bool:
    if not policy.isolate_guaranteed or req.qos == QoSClass.BURSTABLE:
        return True
    other = QoSClass.BEST_EFFORT if req.qos == QoSClass.GUARANTEED else QoSClass.GUARANTEED
    return int(state.gpu_qos_pods[row, col, other]) == 0


def _mem_free(state: ClusterState, row: int, col: int, req: PodRequest) -> int:
    total = int(state.gpu_mem_total_mib[row, col])
    used = int(state.gpu_mem_used_mib[row, col])
    if req.qos == QoSClass.GUARANTEED:
        used = max(used, int(state.gpu_mem_nvml_used_mib[row, col]))
    return total - used


def _checks_passed(state: ClusterState, row: int, col: int, req: PodRequest, policy: QoSPolicy) -> int:
    """How many of the nested GPU checks (in ``fit``'s order) one GPU passes, 0..7."""
    mem_req = (req.gpu_memory_mib if req.gpu_memory_mib is not None
               else req.gpu_milli * int(state.gpu_mem_total_mib[row, col]) // MILLI_PER_GPU)
    checks: tuple[Callable[[], bool], ...] = (
        lambda: bool(state.gpu_exists[row, col]),
        lambda: req.allowed_models is None or int(state.gpu_model[row, col]) in req.allowed_models,
        lambda: bool(state.gpu_healthy[row, col]),
        lambda: _isolation_ok(state, row, col, req, policy),
        lambda: _share_ok(state, row, col, req, policy),
        lambda: _mem_free(state, row, col, req) >= mem_req,
        lambda: int(state.gpu_pods[row, col]) < int(state.gpu_replicas[row, col]),
    )
    passed = 0
    for ok in checks:  # in order: a padding column never reaches the later checks
        if not ok():
            break
        passed += 1
    return passed


REFERENCE_TERMS = frozenset({
    "gpu_best_fit", "best_fit", "qos_interference", "fgd", "random_fit", "gap_price",  # per GPU
    "multi_gpu_reserve", "node_packing", "spread", "resource_balance", "stranding",  # per node
    "adaptive_balance", "priced_stranding", "spare_nodes", "consolidation",
})


def _gained(state: ClusterState, weights: Mapping[str, float]) -> dict[str, float]:
    """The weights as the scorer applies them: ``consolidation``'s times the workload's churn
    and ``room = clip(2 free / waiting - 1, 0, 1)`` (``scoring.utilization.room_for_waiting``),
    ``adaptive_balance``'s times ``1 - churn * (1 - room)``, a weight of 0 left out."""
    free = sum(min(max(int(state.gpu_free_milli[r, c]), 0), MILLI_PER_GPU) for r in range(state.n_nodes)
               for c in range(state.max_gpus) if state.gpu_healthy[r, c] and state.node_ready[r])
    waiting = state.workload.pending_share()
    churn = state.workload.churn()
    room = 1.0 if waiting <= free else min(max(2.0 * free / waiting - 1.0, 0.0), 1.0)
    gains = {"consolidation": churn * room, "adaptive_balance": 1.0 - churn * (1.0 - room)}
    out = {n: w * gains.get(n, 1.0) for n, w in weights.items()}
    return {n: w for n, w in out.items() if w > 0}
"""Every strategy this module has a scalar version of."""


def evaluate_node(state: ClusterState, req: PodRequest, row: int,
                  weights: Mapping[str, float], policy: QoSPolicy | None = None) -> ReferenceResult:
    """Reference evaluation of one pod on one node (weights: strategy -> weight > 0)."""
    return evaluate_node_all(state, req, row, [weights], policy)[0]


def evaluate_node_all(state: ClusterState, req: PodRequest, row: int,
                      weight_sets: Sequence[Mapping[str, float]],
                      policy: QoSPolicy | None = None) -> list[ReferenceResult]:
    """``evaluate_node`` for several weight sets at once: the fit checks and every term are
    computed once per node; the terms that depend on the chosen GPUs once per choice."""
    for weights in weight_sets:
        missing = sorted(set(weights) - REFERENCE_TERMS)
        assert not missing, (f"no scalar reference for strategy {missing}: add its formula to "
                             "tests/scoring/reference.py (_gpu_terms or _node_terms)")
    policy = policy if policy is not None else QoSPolicy()
    weight_sets = [_gained(state, w) for w in weight_sets]
    k = req.gpu_count
    gpu_checks = [_checks_passed(state, row, col, req, policy) for col in range(state.max_gpus)]
    reason = Reason.FITS
    if k > 0 and not state.node_ready[row]:
        reason = Reason.NODE_NOT_READY
    elif int(state.cpu_alloc_milli[row]) - int(state.cpu_used_milli[row]) < req.cpu_milli:
        reason = Reason.INSUFFICIENT_CPU
    elif int(state.mem_alloc_mib[row]) - int(state.mem_used_mib[row]) < req.memory_mib:
        reason = Reason.INSUFFICIENT_MEMORY
    elif k > 0:
        order = (Reason.TOO_FEW_GPUS, Reason.GPU_MODEL_MISMATCH, Reason.GPU_UNHEALTHY,
                 Reason.QOS_ISOLATION, Reason.INSUFFICIENT_GPU_SHARE, Reason.INSUFFICIENT_GPU_MEMORY, Reason.NO_REPLICA_SLOT)
        for stage, code in enumerate(order, start=1):
            if sum(1 for p in gpu_checks if p >= stage) < k:
                reason = code
                break
    if reason != Reason.FITS:
        return [ReferenceResult(False, reason, 0.0, ()) for _ in weight_sets]
    base = _node_terms(state, row, req)
    by_cols: dict[tuple[int, ...], dict[str, float]] = {}

    def node_terms(cols: tuple[int, ...]) -> dict[str, float]:
        # fgd and priced_stranding score the node with the pod on the chosen GPUs.
        if cols not in by_cols:
            by_cols[cols] = {**base, "fgd": _fgd_score(state, row, req, cols),
                             "priced_stranding": _priced_stranding_score(state, row, req, cols),
                             "spare_nodes": _spare_nodes_score(state, row, req, cols)}
        return by_cols[cols]

    out = []
    if k == 0:  # CPU-only: only the node-level terms score; per-GPU terms count 0
        node = node_terms(())
        for weights in weight_sets:
            names = sorted(w for w in weights if weights[w] > 0)
            total = sum(weights[n] * node[n] for n in names if n in node)
            out.append(ReferenceResult(True, reason, min(max(total / (sum(weights[n] for n in names) or 1.0), 0.0), 1.0), ()))
        return out
    fitting = [c for c, p in enumerate(gpu_checks) if p == 7]
    terms = {c: _gpu_terms(state, row, c, req) for c in fitting}
    for weights in weight_sets:
        names = sorted(w for w in weights if weights[w] > 0)
        pref = dict.fromkeys(fitting, 0.0)
        for name in names:
            for c in fitting:
                if name in terms[c]:
                    pref[c] += weights[name] * terms[c][name]
        cols = tuple(sorted(fitting, key=lambda c: (-pref[c], c))[:k])
        node = node_terms(cols)
        total = 0.0
        for name in names:
            if name in node:
                total += weights[name] * node[name]
            else:
                total += weights[name] * sum(terms[c][name] for c in cols) / len(cols)
        score = min(max(total / (sum(weights[n] for n in names) or 1.0), 0.0), 1.0)
        out.append(ReferenceResult(True, reason, score, cols))
    return out
