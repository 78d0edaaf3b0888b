"""``RowJournal``: which rows of a ``ClusterState`` were written, in order, the last few thousand.

Whoever keeps something per row between evaluations (``scoring.incremental``, the
cluster-wide sums of ``scoring.row_totals``) needs the rows that moved since it last looked.
Comparing every row's ``ClusterState.row_version`` with its own copy finds them, but reads
the whole cluster for the one node a bind changed: at 5,000 nodes two 40 KB arrays, which
after the rest of a request has run cost more than scoring that node (``benchmarks/README.md``,
issue 55). The journal answers from the writes themselves, as kube-scheduler's cache does
with its node list ordered by generation (``UpdateSnapshot`` walks only the nodes changed
since the snapshot's generation, ``pkg/scheduler/backend/cache``).

The journal holds the last ``CAPACITY`` writes; a reader further behind is told so and
compares versions instead.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

CAPACITY = 4096
"""Writes remembered: 32 KiB of row numbers. A reader that looks after every bind (an
extender's filter) is one to a few writes behind; one per pod shape, a few hundred."""


class RowJournal:
    """The rows written to one state, the last ``CAPACITY`` of them.

    Attributes
    ----------
    writes : int
        Writes so far (a reader keeps the number it has seen and asks ``since``).

    Notes
    -----
    The state's owner writes and reads under one lock (the extender's cache lock), as it
    does the state's arrays.
    """

    __slots__ = ("_ring", "writes")

    def __init__(self) -> None:
        self.writes = 0
        self._ring = np.zeros(CAPACITY, dtype=np.int64)

    def wrote(self, row: int) -> None:
        """Record one write to ``row``."""
        self._ring[self.writes % CAPACITY] = row
        self.writes += 1

    def since(self, writes: int) -> NDArray[np.int64] | None:
        """The rows written after the first ``writes`` writes.

        Parameters
        ----------
        writes : int
            A value ``writes`` had, read from this journal.

        Returns
        -------
        ndarray of shape (k,), int64, or None
            Distinct rows, ascending (empty when nothing was written since); None when more
            than ``CAPACITY`` writes came since, or ``writes`` is not one of this journal's
            (the reader then compares ``ClusterState.row_version``).
        """
        behind = self.writes - writes
        if behind < 0 or behind > CAPACITY:
            return None
        if behind == 0:
            return np.zeros(0, dtype=np.int64)
        start, end = writes % CAPACITY, self.writes % CAPACITY
        if behind == 1:
            return self._ring[start:start + 1].copy()
        if start < end:
            part = np.sort(self._ring[start:end])
        else:
            part = np.sort(np.concatenate([self._ring[start:], self._ring[:end]]))
        distinct: NDArray[np.int64] = part[np.concatenate(([True], part[1:] != part[:-1]))]
        return distinct
