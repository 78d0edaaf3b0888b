"""``Evaluation``: one pod scored on its candidate rows, as the verbs read it.

``scoring.scorer.Scorer.evaluate`` makes it; ``scoring.incremental`` keeps its arrays per pod
shape and splices the rows that moved; the extender's verbs answer from it (``best``: the
chosen node, with the tie-breaks of ``scoring.scorer.Ties``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext
from scoring.reduce import take_cols
from scoring.request import PodRequest

BREAKS_EMPTY_SHIFT = 40
"""Bit of ``keep_whole_rank`` that says the node holds no GPU share yet."""


@dataclass(frozen=True, slots=True, eq=False)
class Evaluation:
    """Result of scoring one pod on ``m`` candidate nodes: what the verbs answer with.

    Attributes
    ----------
    request : PodRequest
    rows : ndarray of shape (m,), int64
        Candidate rows in the ``ClusterState``.
    node_fits : ndarray of shape (m,), bool
    reason : ndarray of shape (m,), int8
        ``scoring.fit.Reason`` per node, ``FITS`` where ``node_fits``.
    score : ndarray of shape (m,), float64
        Weighted node score in [0, 1], higher is better; 0 on infeasible rows.
    chosen_cols : ndarray of shape (m, gpu_count), int64
        GPU columns the pod would get on each node; -1 on infeasible rows.
    chosen_mem_mib : ndarray of shape (m, gpu_count), int64
        GPU memory the pod would take on each chosen GPU, MiB; 0 on infeasible rows.
    gpu_mem_max_mib : ndarray of shape (m,), int64
        The node's largest GPU memory, MiB (0 without GPUs): a ``gpu_memory_mib`` above it
        is a request no preemption can make room for.
    tie_rank : ndarray of shape (m,), int64
        Among nodes of the same score, lower is preferred (``Ties``; then the lowest row).
    context : FitContext or None
        The full feasibility context, as the strategies saw it; None on an evaluation
        kept or sliced by ``scoring.incremental`` or ``take`` (only the fields above are kept).
    tie_band : float
        ``KEEP_WHOLE_BAND`` where ``best`` keeps empty nodes through near-ties, else 0.
    """

    request: PodRequest
    rows: NDArray[np.int64]
    node_fits: NDArray[np.bool_]
    reason: NDArray[np.int8]
    score: NDArray[np.float64]
    chosen_cols: NDArray[np.int64]
    chosen_mem_mib: NDArray[np.int64]
    gpu_mem_max_mib: NDArray[np.int64]
    tie_rank: NDArray[np.int64]
    context: FitContext | None = None
    tie_band: float = 0.0

    @classmethod
    def of(cls, ctx: FitContext, score: NDArray[np.float64], cols: NDArray[np.int64],
           tie_rank: NDArray[np.int64] | None = None, tie_band: float = 0.0) -> Evaluation:
        """The evaluation of a context, its node scores, its GPU choice (-1: none), its
        tie ranks (all 0, the lowest row wins ties, by default) and tie band."""
        if cols.shape[1] and ctx.mem_req_mib.shape[1]:
            mem = np.where(cols >= 0, take_cols(ctx.mem_req_mib, np.maximum(cols, 0)), 0)
        else:
            mem = np.zeros(cols.shape, dtype=np.int64)
        rank = tie_rank if tie_rank is not None else np.zeros(ctx.rows.shape[0], dtype=np.int64)
        return cls(ctx.request, ctx.rows, ctx.node_fits, ctx.reason, score, cols, mem,
                   ctx.mem_total_mib.max(axis=1, initial=0), rank, ctx, tie_band)

    def take(self, positions: NDArray[np.int64]) -> Evaluation:
        """The evaluation restricted to some candidates (node scores do not depend on the set).

        Parameters
        ----------
        positions : ndarray of shape (p,), int64
            Positions in this evaluation's candidate list.

        Returns
        -------
        Evaluation
            Rows in the order of ``positions``; ``context`` None.
        """
        p = positions
        return Evaluation(self.request, self.rows[p], self.node_fits[p], self.reason[p], self.score[p],
                          self.chosen_cols[p], self.chosen_mem_mib[p], self.gpu_mem_max_mib[p],
                          self.tie_rank[p], tie_band=self.tie_band)

    def best(self) -> int:
        """Position (in the candidate list) of the best feasible node, or -1 if none.

        Ties are broken by the lowest ``tie_rank``, then the lowest cluster row, so the answer
        does not depend on the order in which candidates were given. With a ``tie_band``, an
        empty best node gives way to the best used node within the band (``Ties``).
        """
        score = self.score
        if not np.isfinite(score).all():  # NaN below any score; +-inf to the largest finite values
            score = np.nan_to_num(score, nan=-1.0)
        scores = np.where(self.node_fits, score, -np.inf)
        top = scores.max(initial=-np.inf)
        if top == -np.inf:
            return -1
        pick = self._first(np.flatnonzero(scores == top))
        if self.tie_band > 0 and (self.tie_rank[pick] >> BREAKS_EMPTY_SHIFT) & 1:
            used = np.flatnonzero((scores >= top - self.tie_band)
                                  & ((self.tie_rank >> BREAKS_EMPTY_SHIFT) & 1 == 0))
            if used.shape[0]:
                return self._first(used[scores[used] == scores[used].max()])
        return pick

    def _first(self, tied: NDArray[np.intp]) -> int:
        """Of candidates of equal score, the lowest ``tie_rank``, then the lowest row."""
        if tied.shape[0] == 1:
            return int(tied[0])
        return int(tied[np.lexsort((self.rows[tied], self.tie_rank[tied]))[0]])
