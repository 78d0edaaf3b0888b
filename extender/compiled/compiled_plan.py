"""The scorer's combination of the default preset's terms in one compiled pass over the rows.

``scoring.scorer.Scorer.evaluate`` scores a pod on the candidate rows by calling each weighted
strategy's ``gpu_score`` and ``node_score``, then combining them: the weighted per-GPU
preference, the GPUs it chooses, each node's weighted mean score, the keep-whole tie rank and
the chosen GPUs' memory. At one rescored row that is about a hundred numpy calls and a dozen
small arrays, most of a one-row rescoring's cost once the rest is compiled (decision records
0032, 0034). ``combine`` does the same for a plan of the strategies it knows (``COVERED``,
every term of the default preset) in one kernel, ``_plan``: gap price's per-GPU score
(``scoring.gaps.gap_score`` with one value table), the preference and the GPU choice (the
highest preference, ties to the lowest column, as ``np.argmax`` and the stable ``np.argsort``
choose), the node scores of adaptive balance, consolidation, priced stranding and spare
nodes (the first and the last by ``extender.compiled``'s own kernels, called from this one),
the weighted sum in the scorer's order, ``keep_whole_rank`` and ``Evaluation.of``'s memory.
FGD's scores come from ``extender.compiled.compiled_fgd`` and its ``to_score`` stays numpy's
(``np.exp``, whose last bit a compiled ``exp`` need not share); for a pod of several GPUs,
FGD's node score is known only once the GPUs are chosen, so a second small kernel
(``_finish``) adds it and the terms after it.

The same numbers as the reference to the bit: the same integer sums, the float operations in
the reference's order, and numpy's own order for the sums over a node's GPUs
(``_pairwise``: ``np.add.reduce`` along a row is 0 plus the pairwise sum of the row, eight
accumulators up to 128 elements). ``NUMPY_SUMS_PAIRWISE`` checks that order on the numpy in
use when the module is imported; where it differs ``combine`` declines and the reference
combines. ``combine`` declines (returns None) too for anything else it does not cover:
another strategy in the plan, no workload yet, GPUs priced by kind (``scoring.gaps.model_waste``
with more than one table), FGD with GPU memory as a dimension, more than 128 GPU columns.

``tests/extender/compiled/test_compiled_plan.py`` holds it to the reference scorer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numba
import numpy as np
from numpy.typing import NDArray

from extender.compiled import compiled_adaptive_balance, compiled_fgd, compiled_spare_nodes
from extender.compiled.jit import inline, kernel
from scoring.evaluated import BREAKS_EMPTY_SHIFT
from scoring.fit import FitContext
from scoring.gaps import model_waste
from scoring.registry import Strategy
from scoring.request import MILLI_PER_GPU
from scoring.scorer import Combined
from scoring.strategies import adaptive_balance, consolidation, fgd, priced_stranding, spare_nodes

NAME = "compiled_plan"
"""This module's slot in ``scoring.memo``."""

COVERED = ("adaptive_balance", "consolidation", "fgd", "gap_price", "priced_stranding", "spare_nodes")
"""The strategies ``combine`` scores, in the scorer's order (by name)."""

MAX_COLUMNS = 128
"""GPU columns at most (``_pairwise`` sums up to 128 elements the way numpy does)."""

_B1, _B2, _I1, _I2, _F1, _F2 = (numba.boolean[:], numba.boolean[:, :], numba.int64[:], numba.int64[:, :],
                                numba.float64[:], numba.float64[:, :])
_I, _F = numba.int64, numba.float64


@inline
def _pairwise(a: NDArray[np.float64], n: int) -> float:
    """``np.add.reduce`` of ``a[:n]`` (``n <= 128``): 0 plus numpy's pairwise sum."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[i]
        return 0.0 + res
    r0, r1, r2, r3, r4, r5, r6, r7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
    i = 8
    while i < n - (n % 8):
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[i]
        i += 1
    return float(0.0 + res)


@inline
def _clip(x: float, lo: float, hi: float) -> float:
    """``np.minimum(np.maximum(x, lo), hi)`` for a number that is not NaN."""
    return float(min(max(x, lo), hi))


@inline
def _choose(pref: NDArray[np.float64], k: int, out: NDArray[np.int64]) -> None:
    """The ``k`` columns of highest ``pref``, ties to the lowest column, in that order:
    ``np.argmax`` for one, the first ``k`` of the stable ``np.argsort(-pref)`` for more."""
    n = pref.shape[0]
    for j in range(k):
        best = -1
        for g in range(n):
            taken = False
            for q in range(j):
                if out[q] == g:
                    taken = True
                    break
            if taken:
                continue
            if best < 0 or pref[g] > pref[best]:
                best = g
        out[j] = best


@inline
def _kinds(exists: NDArray[np.bool_], model: NDArray[np.int64], codes: NDArray[np.int64],
           kind: NDArray[np.int64]) -> None:
    """``scoring.gaps.waste_by_gpu``'s table of each GPU: its kind's (``model * 4096 + GPUs of
    its node``, found in the sorted ``codes``), else the last one (padding, unknown kinds)."""
    for i in range(exists.shape[0]):
        n = 0
        for g in range(exists.shape[1]):
            n += exists[i, g]
        for g in range(exists.shape[1]):
            code = model[i, g] * 4096 + n
            at = codes.shape[0]
            for c in range(codes.shape[0]):
                if codes[c] == code:
                    at = c
                    break
            kind[i, g] = at


@inline
def _serves(cpu: int, mem: int, rho_cpu: float, rho_mem: float) -> float:
    """``priced_stranding``'s ``serves`` for one node: the share its free CPU and memory can use."""
    by_cpu = max(cpu, 0) / rho_cpu if rho_cpu > 0 else np.inf
    by_mem = max(mem, 0) / rho_mem if rho_mem > 0 else np.inf
    return min(by_cpu, by_mem)


@kernel(numba.void(
    _B2, _B1, _I2, _B2, _B2, _I2, _I2, _I1, _I1, _I1, _I1, _I1, _I1,    # the context's rows
    _I, _I, _I, _I,                                                      # k, share, CPU, memory
    _F, _F, _F, _F, _F, _F,                                              # weights (0: not in the plan)
    _F2, _F2, _I1, _F, _F, _F, _F, _I1, _F1, _I, _I,                     # the terms' inputs
    _I2, _I1, _I1, _I1, _I1, _I1, _I1,                                   # FGD's node delta (k > 1)
    _F1, _I2, _I2, _I1, _I1, _I1, _F1, _F1, _F1))                        # outputs
def _plan(gpu_fits, node_fits, free, exists, healthy, mem_req, mem_total, cpu_free, mem_free, cpu_alloc,  # type: ignore[no-untyped-def]
          mem_alloc, node_used, node_total,
          k, share, cpu, mem,
          w_ab, w_cons, w_fgd, w_gap, w_ps, w_sp,
          g_fgd, tables, codes, rho_cpu, rho_mem, two_sided, one_sided, sizes, price, cpu_ref, gpu_ref,
          model, t_milli, t_k, t_cpu, t_mem, t_count, t_mask,
          score, cols, mem_out, mem_max, rank, fgd_node, ab_out, ps_out, sp_out):
    """Everything of ``combine`` for every row but the terms ``_finish`` adds: ``score`` holds the
    sum up to consolidation's term; ``fgd_node``, ``ps_out``, ``sp_out`` the rest's inputs.
    ``tables[kind[i, g]]`` prices GPU ``g`` of row ``i`` (``_kind``)."""
    m, n_gpus = free.shape
    kind = np.zeros((m, n_gpus), dtype=np.int64)
    if codes.shape[0] > 0:
        _kinds(exists, model, codes, kind)
    pref = np.empty(n_gpus)
    g_gap = np.empty(n_gpus)
    chosen = np.zeros((m, n_gpus), dtype=np.bool_)
    buf = np.empty(n_gpus)
    buf_after = np.empty(n_gpus)
    pick = np.empty(k, dtype=np.int64)
    for i in range(m):
        for g in range(n_gpus):
            f = min(max(free[i, g], 0), MILLI_PER_GPU)
            if w_gap > 0.0:
                a = min(max(f - share, 0), MILLI_PER_GPU)
                table = tables[kind[i, g]]
                delta = table[a] - table[f]
                g_gap[g] = _clip(0.5 - delta / 2000.0, 0.0, 1.0) if gpu_fits[i, g] else 0.0
            else:
                g_gap[g] = 0.0
            p = 0.0
            if w_fgd > 0.0:
                p += w_fgd * g_fgd[i, g]
            if w_gap > 0.0:
                p += w_gap * g_gap[g]
            pref[g] = p if gpu_fits[i, g] else -np.inf
        _choose(pref, k, pick)
        fits = node_fits[i]
        for j in range(k):
            chosen[i, pick[j]] = fits
        s = 0.0
        if w_fgd > 0.0 and k == 1:  # FGD's node score is its per-GPU score there (the scorer reuses it)
            for j in range(k):
                buf[j] = g_fgd[i, pick[j]]
            s += w_fgd * (_pairwise(buf, k) / k)
        if w_gap > 0.0:
            for j in range(k):
                buf[j] = g_gap[pick[j]]
            s += w_gap * (_pairwise(buf, k) / k)
        score[i] = s
        # the keep-whole rank and the memory, with the columns of an infeasible row as -1
        empty_taken = 0
        for j in range(k):
            c = pick[j] if fits else -1
            cols[i, j] = c
            mem_out[i, j] = mem_req[i, c] if c >= 0 else 0
            if c >= 0 and free[i, c] >= MILLI_PER_GPU:
                empty_taken += 1
        most = 0
        for g in range(n_gpus):
            most = max(most, mem_total[i, g])
        mem_max[i] = most
        left = min(max(node_total[i] - node_used[i] - k * share, 0), (1 << 24) - 1)
        breaks = 1 if node_used[i] == 0 else 0
        rank[i] = (breaks << BREAKS_EMPTY_SHIFT) + (min(empty_taken, (1 << 16) - 1) << 24) + left
    if w_ab > 0.0:
        compiled_adaptive_balance._node(node_used, node_total, cpu_alloc, cpu_free, mem_alloc, mem_free,
                                        k * share, cpu, mem, two_sided, one_sided, ab_out)
    if w_sp > 0.0:
        compiled_spare_nodes._node(exists, healthy, free, chosen, sizes, price, sp_out)
    if w_fgd > 0.0 and k > 1:
        compiled_fgd._node_delta(free, exists, model, node_fits, cpu_free, mem_free, t_milli, t_k, t_cpu,
                                 t_mem, t_count, t_mask, share, cpu, mem, chosen, fgd_node)
    for i in range(m):
        s = score[i]
        if w_ab > 0.0:
            s += w_ab * ab_out[i]
        if w_cons > 0.0:
            cpu_left = max(cpu_free[i] - cpu, 0)
            gpu_left = max(node_total[i] - node_used[i] - k * share, 0)
            left_share = 0.5 * cpu_left / max(cpu_ref, 1) + 0.5 * gpu_left / max(gpu_ref, 1)
            s += w_cons * _clip(1.0 - left_share, 0.0, 1.0)
        score[i] = s
        if w_ps > 0.0:
            for g in range(n_gpus):
                f = min(max(free[i, g], 0), MILLI_PER_GPU)
                a = min(max(f - share, 0), MILLI_PER_GPU) if chosen[i, g] else f
                table = tables[kind[i, g]]
                buf[g] = f - table[f]
                buf_after[g] = a - table[a]
            value, value_after = _pairwise(buf, n_gpus), _pairwise(buf_after, n_gpus)
            before = max(value - _serves(cpu_free[i], mem_free[i], rho_cpu, rho_mem), 0.0)
            after = max(value_after - _serves(cpu_free[i] - cpu, mem_free[i] - mem, rho_cpu, rho_mem), 0.0)
            ps_out[i] = _clip(0.5 - (after - before) / 2000.0, 0.0, 1.0)


@kernel(numba.void(_F1, _B1, _F, _F1, _F, _F1, _F, _F1, _F, _I))
def _finish(score, node_fits, w_fgd, fgd_node, w_ps, ps, w_sp, sp, total_w, k):  # type: ignore[no-untyped-def]
    """The terms after consolidation in the scorer's order (FGD's node score for ``k > 1``,
    priced stranding, spare nodes), then the weighted mean clipped to [0, 1], 0 where the
    node does not fit."""
    for i in range(score.shape[0]):
        s = score[i]
        if w_fgd > 0.0 and k > 1:
            s += w_fgd * fgd_node[i]
        if w_ps > 0.0:
            s += w_ps * ps[i]
        if w_sp > 0.0:
            s += w_sp * sp[i]
        score[i] = _clip(s / total_w, 0.0, 1.0) if node_fits[i] else 0.0


def _numpy_sums_pairwise() -> bool:
    """Whether ``np.add.reduce`` along a row sums as ``_pairwise`` does, on rows of 1 to 20."""
    rng = np.random.default_rng(0)
    for n in range(1, 21):
        rows = (rng.random((3, n)) - 0.5) * 10.0 ** rng.integers(-3, 4, size=(3, n))
        rows[0] = -0.0  # the sign of an all-zero sum
        out = np.empty(3)
        _sum_rows(rows, out)
        if not np.array_equal(np.add.reduce(rows, axis=1), out):
            return False
    return True


@kernel(numba.void(_F2, _F1))
def _sum_rows(rows, out):  # type: ignore[no-untyped-def]
    for i in range(rows.shape[0]):
        out[i] = _pairwise(rows[i], rows.shape[1])


NUMPY_SUMS_PAIRWISE = _numpy_sums_pairwise()
"""The numpy in use sums a row as ``_pairwise`` (checked at import; else ``combine`` declines)."""

_NO_I1, _NO_F2 = np.zeros(0, dtype=np.int64), np.zeros((0, 0))


@dataclass(slots=True)
class _Priced:
    """The last gap tables stacked for the kernel, by the tuple ``model_waste`` returned."""

    of: tuple[NDArray[np.float64], ...] = ()
    kinds: tuple[tuple[int, int, int], ...] = ()
    stacked: NDArray[np.float64] = field(default_factory=lambda: _NO_F2)
    codes: NDArray[np.int64] = field(default_factory=lambda: _NO_I1)


def _priced(ctx: FitContext) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """``scoring.gaps.model_waste`` for the kernel: the tables stacked, and the kinds' codes
    (empty where every GPU takes the first table, as ``waste_by_gpu``'s shortcut does); kept
    in ``ctx.memo`` while ``model_waste`` answers with the same tables."""
    tables = model_waste(ctx)
    kept = ctx.memo.slot(NAME, _Priced)
    if kept.of is not tables or kept.kinds != ctx.gpus_by_kind:
        if all(t is tables[0] for t in tables[:-1]) or ctx.gpu_model is None:
            kept.stacked, kept.codes = np.array(tables[0][None, :]), _NO_I1  # a writable copy: the kernel's type
        else:
            kept.stacked = np.stack(tables)
            kept.codes = np.array([m * 4096 + n for m, n, _ in ctx.gpus_by_kind], dtype=np.int64)
        kept.of, kept.kinds = tables, ctx.gpus_by_kind
    return kept.stacked, kept.codes


@dataclass(slots=True)
class _Terms:
    """What the kernel reads of the workload and the cluster-wide terms, for one pair of them
    (the incremental scorer's frozen terms stay one object between refreshes)."""

    tasks: object = None
    of: object = None
    rho: tuple[float, float] = (0.0, 0.0)
    mix: tuple[float, float] = (0.0, 0.0)
    sizes: NDArray[np.int64] = field(default_factory=lambda: _NO_I1)
    price: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    churn: tuple[int, int] | None = None


def _terms(ctx: FitContext) -> _Terms:
    """``priced_stranding.host_per_milli``, ``adaptive_balance.mix``, spare nodes' sizes and
    prices, consolidation's scales: kept in ``ctx.memo`` while the workload and the terms are
    the same objects."""
    kept = ctx.memo.slot(NAME + ".terms", _Terms)
    if kept.tasks is ctx.tasks and kept.of is ctx.terms:
        return kept
    need = ctx.terms.get(spare_nodes.TERM, ())
    need = need if isinstance(need, tuple) else ()
    churn = ctx.terms.get(consolidation.TERM)
    kept.rho, kept.mix = priced_stranding.host_per_milli(ctx), adaptive_balance.mix(ctx)
    kept.sizes = np.array([s for s, _ in need], dtype=np.int64)
    kept.price = np.array([MILLI_PER_GPU * s * p for s, p in need], dtype=np.float64)
    kept.churn = (int(churn[1]), int(churn[2])) if isinstance(churn, tuple) else None
    kept.tasks, kept.of = ctx.tasks, ctx.terms
    return kept


def combine(ctx: FitContext, plan: Sequence[tuple[Strategy, float]]) -> Combined | None:
    """``Scorer.evaluate``'s combination of ``plan`` on ``ctx``, the same numbers; None where
    this module does not cover it (module notes: the reference combines then).

    Parameters
    ----------
    ctx : FitContext
        Of a pod of ``k >= 1`` GPUs on rows with at least ``k`` GPU columns.
    plan : sequence of (Strategy, float)
        The weighted strategies, by name (``Scorer``'s plan, each weight > 0 after its gain).

    Returns
    -------
    tuple of ndarray, or None
        ``Combined``: the node scores (m,) float64 (0 where the node does not fit), the chosen
        columns and their memory (m, k) int64 (-1 and 0 where it does not fit), each node's
        largest GPU memory (m,) int64 and the keep-whole rank (m,) int64.
    """
    weights = dict.fromkeys(COVERED, 0.0)
    names = [s.name for s, _ in plan]
    if not NUMPY_SUMS_PAIRWISE or names != sorted(names) or not set(names) <= weights.keys():
        return None
    tasks = ctx.tasks
    req = ctx.request
    m, n_gpus = ctx.free_milli.shape
    if tasks is None or n_gpus > MAX_COLUMNS or ctx.gpu_model is None or req.gpu_count < 1:
        return None
    for strat, w in plan:
        weights[strat.name] = w
    w_ab, w_cons, w_fgd, w_gap, w_ps, w_sp = (weights[n] for n in COVERED)
    tables, codes = _NO_F2, _NO_I1
    if w_gap > 0.0 or w_ps > 0.0:
        tables, codes = _priced(ctx)
    k = req.gpu_count
    g_fgd = _NO_F2
    fgd_args: tuple[object, ...] = (ctx.gpu_model, *(_NO_I1,) * 6)  # the models price by kind too
    if w_fgd > 0.0:
        if compiled_fgd._compiled(ctx) is None:
            return None
        g_fgd = compiled_fgd.gpu_score(ctx)
        if k > 1:
            fgd_args = (ctx.gpu_model, *compiled_fgd._rows_args(ctx, tasks)[6:12])
    terms = _terms(ctx)
    if w_cons > 0.0 and terms.churn is None:
        return None
    (rho_cpu, rho_mem), (two_sided, one_sided), (cpu_ref, gpu_ref) = terms.rho, terms.mix, terms.churn or (1, 1)
    sizes, price = terms.sizes, terms.price
    healthy = ctx.gpu_exists if ctx.gpu_healthy is None else ctx.gpu_exists & ctx.gpu_healthy
    score, rest = np.empty(m), np.empty((4, m))
    cols, mem = np.empty((m, k), dtype=np.int64), np.empty((m, k), dtype=np.int64)
    mem_max, rank, fgd_node = np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
    ab, ps, sp = rest[0], rest[1], rest[2]
    try:
        _plan(ctx.gpu_fits, ctx.node_fits, ctx.free_milli, ctx.gpu_exists, healthy, ctx.mem_req_mib,
              ctx.mem_total_mib, ctx.cpu_free_milli, ctx.mem_host_free_mib, ctx.cpu_alloc_milli,
              ctx.mem_host_alloc_mib, ctx.node_used_milli, ctx.node_total_milli,
              k, req.gpu_milli, req.cpu_milli, req.memory_mib,
              w_ab, w_cons, w_fgd, w_gap, w_ps, w_sp,
              g_fgd, tables, codes, rho_cpu, rho_mem, two_sided, one_sided, sizes, price, cpu_ref, gpu_ref,
              *fgd_args, score, cols, mem, mem_max, rank, fgd_node, ab, ps, sp)
        fgd_score = rest[3]
        if w_fgd > 0.0 and k > 1:
            fgd_score = np.where(ctx.node_fits, fgd.to_score(fgd_node, tasks), 0.0)
        _finish(score, ctx.node_fits, w_fgd, fgd_score, w_ps, ps, w_sp, sp, sum(w for _, w in plan) or 1.0, k)
    except TypeError:  # arrays of other dtypes: no compile on the hot path
        return None
    return score, cols, mem, mem_max, rank
