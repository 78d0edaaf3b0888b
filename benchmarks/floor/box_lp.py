"""The per-model floor's two pieces of work: the arrived pods as classes, and the LP of a box.

``ArrivalClasses`` groups the arrived GPU pods by (per-GPU share, GPUs, accepted kinds) with
prefix counts, and gives a box's bounds; ``BoxLp`` is the LP of one threshold, kept in one
HiGHS model across boxes. The search over boxes and the formulas are in
``benchmarks.floor.per_model``, whose notes these docstrings cite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from benchmarks import trace
from benchmarks.floor.demand import MILLI_PER_GPU
from benchmarks.floor.lp import best_pattern, new_highs

EXTRA_GPU_COST = 10.0 * MILLI_PER_GPU
"""The price of one GPU beyond a kind's ``G_b``: above what a GPU can hold (``benchmarks.floor.per_model``'s notes)."""


class ArrivalClasses:
    """The arrived pods grouped by (per-GPU share, GPUs, accepted kinds), with prefix counts.

    Attributes
    ----------
    share : ndarray of shape (c,), int64
        Per-GPU share of each class, milli (1000 for whole pods).
    gpus : ndarray of shape (c,), int64
        GPUs per pod.
    kinds : ndarray of shape (c, b), bool
        Kinds each class may use.
    may : ndarray of shape (c, g), bool
        Groups of models with a kind the class may use.
    sure : ndarray of shape (c, g), bool
        Groups whose every kind the class may use, for pods of one GPU (only they are sure to
        fit on a GPU of the group with ``theta`` free).
    before : ndarray of shape (N + 1, c), int32
        Pods of each class among the first ``t`` arrivals, ``t = 0..N``.
    """

    def __init__(self, arrived: Sequence[trace.TracePod], kinds: Sequence[tuple[str, int]],
                 group_of_kind: NDArray[np.int64]) -> None:
        keys: dict[tuple[int, int, frozenset[int]], int] = {}
        ids = np.empty(len(arrived), dtype=np.int64)
        for i, p in enumerate(arrived):
            spec = set(p.gpu_spec.split("|")) if p.gpu_spec else None
            ok = frozenset(b for b, (m, n) in enumerate(kinds) if (spec is None or m in spec) and n >= p.num_gpu)
            share = p.gpu_milli if p.gpu_milli < MILLI_PER_GPU else MILLI_PER_GPU
            ids[i] = keys.setdefault((share, p.num_gpu if share == MILLI_PER_GPU else 1, ok), len(keys))
        order = list(keys)
        self.share = np.array([s for s, _, _ in order], dtype=np.int64)
        self.gpus = np.array([k for _, k, _ in order], dtype=np.int64)
        self.kinds = np.zeros((len(order), len(kinds)), dtype=bool)
        for c, (_, _, ok) in enumerate(order):
            self.kinds[c, sorted(ok)] = True
        in_group = np.arange(int(group_of_kind.max()) + 1)[:, None] == group_of_kind[None, :]
        self.may = (self.kinds.astype(np.int64) @ in_group.T.astype(np.int64)) > 0
        self.sure = (self.gpus[:, None] == 1) & ((~self.kinds).astype(np.int64) @ in_group.T.astype(np.int64) == 0)
        onehot = np.zeros((len(arrived) + 1, len(order)), dtype=np.int32)
        onehot[np.arange(1, len(arrived) + 1), ids] = 1
        self.before = np.cumsum(onehot, axis=0, dtype=np.int32)

    def earliest(self, group_gpus: NDArray[np.int64], theta: int) -> NDArray[np.int64]:
        """The least ``t_g`` per group, shape (g,): some GPU of the group has ``theta`` free
        until the pods that may use it, among the first ``t_g``, could cover each of its GPUs
        (``group_gpus``) with more than ``1000 - theta`` milli."""
        using = self.may.astype(np.int64)
        gpus_before = self.before @ (using * self.gpus[:, None])
        milli_before = self.before @ (using * (self.gpus * self.share)[:, None])
        ready = (gpus_before >= group_gpus) & (milli_before >= group_gpus * (MILLI_PER_GPU + 1 - theta))
        n = self.before.shape[0] - 1
        return np.asarray(np.where(ready.any(axis=0), np.argmax(ready, axis=0), n), dtype=np.int64)

    def bounds(self, lo: NDArray[np.int64], hi: NDArray[np.int64],
               theta: int) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """``L``, ``U`` (shape (c,)) and ``V`` (shape (c, g)) of ``benchmarks.floor.per_model``'s notes for the box.

        ``lo`` and ``hi`` have shape (g + 1,): the groups' points, then their maximum ``T``
        (``work_conserving``'s ``a``): every ``t_g <= T``, and a pod sure on every group is
        sure before ``T``."""
        n = self.before.shape[0] - 1
        lo_t, hi_t = int(lo[-1]), int(hi[-1])
        lo, hi = lo[:-1], np.minimum(hi[:-1], hi_t)
        last_lo = np.where(self.sure, lo[None, :], 0).max(axis=1)
        last_lo = np.where(self.sure.all(axis=1), np.maximum(last_lo, lo_t), last_lo)
        last_hi = np.minimum(np.where(self.may, hi[None, :], 0).max(axis=1), hi_t)
        cols = np.arange(self.share.shape[0])
        total = self.before[n].astype(np.int64)
        capped = self.share >= theta
        upper = np.where(capped, self.before[last_hi, cols], total).astype(np.int64)
        lower = np.where(self.share <= theta, self.before[last_lo, cols], 0).astype(np.int64)
        per_group = np.where(capped[:, None] & self.may, self.before[hi].T, upper[:, None]).astype(np.int64)
        return lower, upper, per_group


class BoxLp:
    """The LP of ``benchmarks.floor.per_model``'s notes for one threshold and any box's bounds, kept in one HiGHS
    model: a box changes row bounds, pricing adds columns, and each solve starts from the
    last basis.

    Rows: one per kind (``<= G_b``), one per class (``L_c <= placed_c <= U_c``), one per
    (class, group) where the class is capped at ``theta`` and may use the group
    (``<= V_cg``). Columns: patterns, whole pods per (class, kind), an extra GPU per kind.
    """

    def __init__(self, classes: ArrivalClasses, gpus_of_kind: NDArray[np.int64], group_of_kind: NDArray[np.int64],
                 theta: int) -> None:
        self.classes = classes
        self.group_of = group_of_kind
        self.frac = np.flatnonzero(classes.share < MILLI_PER_GPU)
        sizes = classes.share[self.frac]
        self.step = math.gcd(MILLI_PER_GPU, *sizes.tolist()) if sizes.size else MILLI_PER_GPU
        n_kinds, n_classes = gpus_of_kind.shape[0], classes.share.shape[0]
        capped = np.argwhere((classes.share >= theta)[:, None] & classes.may)
        self.pair_row = np.full(classes.may.shape, -1, dtype=np.int64)
        self.pair_row[capped[:, 0], capped[:, 1]] = n_kinds + n_classes + np.arange(capped.shape[0])
        self.pairs = capped
        self.n_kinds, self.n_classes = n_kinds, n_classes
        self.h = new_highs()
        self.inf = self.h.inf
        n_rows = n_kinds + n_classes + capped.shape[0]
        upper = np.concatenate([gpus_of_kind.astype(float), np.full(n_rows - n_kinds, self.inf)])
        self.h.addRows(n_rows, np.full(n_rows, -self.inf), upper, 0, np.zeros(0, dtype=np.int32),
                       np.zeros(0, dtype=np.int32), np.zeros(0))
        self.gain: list[float] = []
        # One pod per bin for every kind a fractional class may use; whole pods; extra GPUs.
        f_idx, kinds = np.nonzero(classes.kinds[self.frac])
        counts = np.zeros((f_idx.shape[0], self.frac.shape[0]), dtype=np.int64)
        counts[np.arange(f_idx.shape[0]), f_idx] = 1
        self._add_patterns(kinds.astype(np.int64), counts)
        whole = np.flatnonzero(classes.share >= MILLI_PER_GPU)
        for cls, b in zip(*np.nonzero(classes.kinds[whole]), strict=True):
            c, pair = int(whole[cls]), int(self.pair_row[int(whole[cls]), group_of_kind[b]])
            rows, values = [int(b), n_kinds + c], [float(classes.gpus[c]), 1.0]
            if pair >= 0:
                rows.append(pair)
                values.append(1.0)
            self._add_column(rows, values, MILLI_PER_GPU * float(classes.gpus[c]))
        self.extra = np.arange(len(self.gain), len(self.gain) + n_kinds)
        for b in range(n_kinds):
            self._add_column([b], [-1.0], -EXTRA_GPU_COST)

    def _add_column(self, rows: list[int], values: list[float], gain: float) -> None:
        self.h.addCols(1, np.array([-gain]), np.zeros(1), np.full(1, self.inf), len(rows), np.zeros(1, dtype=np.int32),
                       np.array(rows, dtype=np.int32), np.array(values, dtype=float))
        self.gain.append(gain)

    def _add_patterns(self, kinds: NDArray[np.int64], counts: NDArray[np.int64]) -> None:
        share = self.classes.share[self.frac]
        for b, row in zip(kinds.tolist(), counts, strict=True):
            on = np.flatnonzero(row)
            cls = self.frac[on]
            pair = self.pair_row[cls, self.group_of[b]]
            rows = [b, *(self.n_kinds + cls).tolist(), *pair[pair >= 0].tolist()]
            values = [1.0, *row[on].astype(float).tolist(), *row[on][pair >= 0].astype(float).tolist()]
            self._add_column(rows, values, float(row[on] @ share[on]))

    def unallocated_pct(self, lower: NDArray[np.int64], upper: NDArray[np.int64], per_group: NDArray[np.int64],
                        capacity_milli: int) -> float:
        """The box's floor, % of capacity; inf if its lower bounds need more GPUs than there are."""
        got, extra = self.solve(lower, upper, per_group)
        return math.inf if extra > 1e-6 else 100.0 * (capacity_milli - got) / capacity_milli

    def solve(self, lower: NDArray[np.int64], upper: NDArray[np.int64], per_group: NDArray[np.int64],
              max_rounds: int = 10_000) -> tuple[float, float]:
        """Column generation for the box's bounds: the optimum (milli-GPU) and the extra GPUs
        it needed."""
        n_k, n_c = self.n_kinds, self.n_classes
        rows = np.arange(n_k, n_k + n_c + self.pairs.shape[0], dtype=np.int32)
        tight = per_group[self.pairs[:, 0], self.pairs[:, 1]].astype(float)
        self.h.changeRowsBounds(rows.shape[0], rows, np.concatenate([lower.astype(float), np.full(tight.shape[0], -self.inf)]),
                                np.concatenate([upper.astype(float), tight]))
        for _ in range(max_rounds):
            self.h.run()
            status = self.h.modelStatusToString(self.h.getModelStatus())
            if status != "Optimal":
                raise RuntimeError(f"LP solver failed: {status}")
            solution = self.h.getSolution()
            if not self._price(np.asarray(solution.row_dual), upper):
                x = np.asarray(solution.col_value)
                extra = float(x[self.extra].sum())
                return float(np.asarray(self.gain) @ x) + EXTRA_GPU_COST * extra, extra
        raise RuntimeError(f"column generation did not converge in {max_rounds} rounds")

    def _price(self, dual: NDArray[np.float64], upper: NDArray[np.int64]) -> bool:
        """Add, per kind, the best pattern if its reduced cost is negative; True if any was.
        Row duals are HiGHS's for the minimisation of ``-gain``: <= 0 on a row at its upper bound."""
        c = self.classes
        sizes = c.share[self.frac]
        class_dual = dual[self.n_kinds + self.frac]
        new_kind, new_counts = [], []
        priced: dict[tuple[int, bytes], tuple[float, NDArray[np.int64]]] = {}
        for b in range(self.n_kinds):
            on = c.kinds[self.frac, b]
            if not on.any():
                continue
            # Kinds of one group that hold the same classes (a model's node sizes, for pods of
            # one GPU) price the same knapsack; only their GPU rows' duals differ.
            key = (int(self.group_of[b]), on.tobytes())
            if key not in priced:
                pair = self.pair_row[self.frac, self.group_of[b]]
                values = sizes + class_dual + np.where(pair >= 0, dual[np.maximum(pair, 0)], 0.0)
                priced[key] = best_pattern(sizes, np.where(on, values, 0.0), np.where(on, upper[self.frac], 0),
                                           self.step)
            value, counts = priced[key]
            if value + dual[b] > 1e-6:
                new_kind.append(b)
                new_counts.append(counts)
        if new_kind:
            self._add_patterns(np.array(new_kind, dtype=np.int64), np.array(new_counts, dtype=np.int64))
        return bool(new_kind)
