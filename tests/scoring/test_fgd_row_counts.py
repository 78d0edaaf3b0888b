"""FGD's kept per-node counts (``fgd._RowCounts``) never serve a stale row; its GPU classes
are one partition however they are grouped."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
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
        # The node score reads the same kept counts ("before"): with the pod on the first
        # GPUs it fits on each node, equal to the one computed from scratch.
        chosen = ctx.gpu_fits & (np.cumsum(ctx.gpu_fits, axis=1) <= req.gpu_count)
        assert np.array_equal(fgd.node_score(ctx, chosen), fgd.node_score(replace(ctx, memo=Memo()), chosen)), step
        compared += 1
        placeable = np.flatnonzero(ctx.node_fits & (ctx.gpu_fits.sum(axis=1) >= req.gpu_count))
        if placeable.size:
            place(st, ctx, int(placeable[int(rng.integers(placeable.size))]))
    assert compared == 160


def test_gpu_classes_are_the_same_partition_by_dictionary_and_by_sort(rng: np.random.Generator,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Up to FEW_CELLS cells are grouped in a dictionary, more with np.unique: the two must
    # give the same classes (cells alike in row, share, model and memory together), each
    # with a representative of its own class, whatever the order of the classes.
    for trial in range(40):
        m, g = int(rng.integers(1, 12)), 8
        free = rng.choice(np.array([-500, 0, 250, 500, 1000], dtype=np.int32), size=(m, g))
        model = rng.integers(0, 3, size=(m, g)).astype(np.int64)
        mem = rng.choice(np.array([0, 8192, 16384]), size=(m, g)).astype(np.int64)
        r_all, c_all = np.nonzero(rng.random((m, g)) < 0.7)
        cells = (r_all.astype(np.intp), c_all.astype(np.intp))
        for mem_free in (None, mem):
            answers = []
            for few in (10_000, 0):
                monkeypatch.setattr(fgd, "FEW_CELLS", few)
                pr, pg, cls = fgd._classes(free, model, cells, mem_free)
                r, c = cells
                key = np.stack([r, free[r, c], model[r, c], (mem_free if mem_free is not None else mem * 0)[r, c]], 1)
                rep = np.stack([pr, free[pr, pg], model[pr, pg],
                                (mem_free if mem_free is not None else mem * 0)[pr, pg]], 1)
                assert np.array_equal(rep[cls], key), trial  # every cell is alike its representative
                answers.append(cls)
            by_dict, by_sort = answers
            same_dict = by_dict[:, None] == by_dict[None, :]
            assert np.array_equal(same_dict, by_sort[:, None] == by_sort[None, :]), trial
            assert len(set(by_dict.tolist())) == int(np.unique(by_dict).size) == int(by_dict.max(initial=-1)) + 1
