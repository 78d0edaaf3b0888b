"""FGD's kept per-node counts (``fgd._RowCounts``) never serve a stale row."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from scoring.fit import FitContext, fit
from scoring.memo import Memo
from scoring.request import PodRequest, QoSPolicy
from scoring.specs import Allocation
from scoring.state import ClusterState
from scoring.strategies import fgd
from tests.conftest import gpu_node


def fresh_score(ctx: FitContext) -> NDArray[np.float64]:
    """The score computed with nothing kept (a new memo: an empty row-count store)."""
    return fgd.gpu_score(replace(ctx, memo=Memo()))


def place(st: ClusterState, ctx: FitContext, pos: int) -> None:
    """Put the context's pod on the first GPUs it fits at candidate ``pos``."""
    req = ctx.request
    cols = tuple(int(c) for c in np.flatnonzero(ctx.gpu_fits[pos])[:req.gpu_count])
    row = int(ctx.rows[pos])
    st.apply(Allocation(st.node_names[row], cols, req.gpu_milli,
                        tuple(int(ctx.mem_req_mib[pos, c]) for c in cols), req.qos, req.cpu_milli,
                        req.memory_mib))


MENU = [PodRequest(1, 250, cpu_milli=2000, memory_mib=4096), PodRequest(1, 500, cpu_milli=4000, memory_mib=8192),
        PodRequest(1, 750, cpu_milli=1000, memory_mib=2048), PodRequest(2, 1000, cpu_milli=8000, memory_mib=16384),
        PodRequest(1, 1000, cpu_milli=4000, memory_mib=8192)]
"""A fixed set of pod shapes: once each was placed, the learned shares stay the same set, so
the store keeps its counts across evaluations (random shapes would reset it every time)."""


def test_kept_counts_follow_every_change_of_every_state(rng: np.random.Generator) -> None:
    # Two copies of one state (same nodes, same learned shares: to the store their rows are
    # the same rows), evaluated in turn and each changed between its evaluations by a
    # placement: the score with kept counts equals the score computed from scratch, to the
    # bit, every time.
    memo = Memo()  # one owner's, kept across every evaluation below
    nodes = [gpu_node(f"n{i:02d}", (8, 4, 2)[i % 3], model=("T4", "A10")[i % 2]) for i in range(18)]
    first = ClusterState.from_nodes(nodes)
    for i, req in enumerate(MENU):  # every shape known from the start
        ctx = fit(first, req, np.array([i]), QoSPolicy())
        place(first, ctx, 0)
    states = [first, first.copy()]
    compared = 0
    for step in range(160):
        st = states[step % 2]
        req = MENU[int(rng.integers(len(MENU)))]
        ctx = fit(st, req, rng.permutation(st.n_nodes), QoSPolicy(), memo=memo)
        assert np.array_equal(fgd.gpu_score(ctx), fresh_score(ctx)), step
        compared += 1
        placeable = np.flatnonzero(ctx.node_fits & (ctx.gpu_fits.sum(axis=1) >= req.gpu_count))
        if placeable.size:
            place(st, ctx, int(placeable[int(rng.integers(placeable.size))]))
    assert compared == 160
