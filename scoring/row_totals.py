"""Cluster-wide integer sums kept by row version: a bind costs the node it changed, not the cluster.

A strategy's cluster-wide term (``scoring.registry.Term``) is computed at every evaluation
(``Scorer.cluster_terms``) and most are sums over every node of the state (the CPU and GPU
share in use, the wholly free GPUs by node). Between two evaluations one bind moves one row
(``ClusterState.row_version``, listed by ``ClusterState.journal``). ``RowTotals`` keeps each
row's contribution and the column sums, and at the next call recomputes the contributions
of the rows written since only, adding the difference. The contributions are integers, so
the sums are exact and equal, to the bit, to summing every row again in any order
(kube-scheduler's ``noderesources`` keeps its node infos the same way: by generation, the
cluster-wide sum never recounted).

A term gives its contributions twice: for many rows as arrays (``Contributions``: every row
at first, or many moved), and for one row as Python integers (``RowContribution``: the
usual bind, where a few array operations on one row cost more than the arithmetic; after
the rest of a request has run, each numpy call costs microseconds). The two must agree
(``tests/scoring/test_journal.py``).

A new ``ClusterState`` object (a rebuild: the node set, or a node's allocatable or GPUs,
changed) or another number of rows or columns starts from every row.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from scoring.state import ClusterState

Contributions = Callable[[ClusterState, NDArray[np.int64] | slice], NDArray[np.int64]]
"""``(state, rows) -> ndarray of shape (len(rows), c), int64``: each row's part of ``c`` sums."""

RowContribution = Callable[[ClusterState, int], Sequence[int]]
"""``(state, row) -> c`` integers: the same as ``Contributions``' row, one row at a time."""

FEW_MOVED = 16
"""Rows moved up to which their contributions are computed one by one (``RowContribution``)."""


class RowTotals:
    """Column sums over a state's rows of per-row integer contributions, kept by row version.

    One object per term and owner (a ``scoring.memo.Memo`` slot). Thread-safe.
    """

    __slots__ = ("_lock", "_per_row", "_state", "_total", "_writes")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: weakref.ref[ClusterState] | None = None
        self._per_row: list[list[int]] = []
        self._total: list[int] = []
        self._writes = 0

    def of(self, state: ClusterState, every: Contributions, one: RowContribution) -> tuple[int, ...]:
        """The column sums of the contributions over every row of ``state``.

        Parameters
        ----------
        state : ClusterState
            Read only; its rows written only through ``apply`` and ``set_nvml_used_mib``
            (which list them in ``ClusterState.journal``).
        every : Contributions
            A pure function of the rows it is given; always the same one for one object.
        one : RowContribution
            ``every``'s row, as integers.

        Returns
        -------
        tuple of int
            ``c`` sums.
        """
        with self._lock:
            kept = self._state() if self._state is not None else None
            moved = state.journal.since(self._writes) if kept is state else None
            self._writes = state.journal.writes
            if moved is None or len(self._per_row) != state.n_nodes:  # another state, or too far behind
                per_row = np.asarray(every(state, slice(None)), dtype=np.int64)
                self._per_row = per_row.tolist()
                self._total = per_row.sum(axis=0).tolist()
                self._state = weakref.ref(state)
                return tuple(self._total)
            rows = moved.tolist()
            new = (np.asarray(every(state, moved), dtype=np.int64).tolist() if len(rows) > FEW_MOVED
                   else [list(one(state, row)) for row in rows])
            total = self._total
            for row, now in zip(rows, new, strict=True):
                total = [t + n - o for t, n, o in zip(total, now, self._per_row[row], strict=True)]
                self._per_row[row] = now
            self._total = total
            return tuple(total)
