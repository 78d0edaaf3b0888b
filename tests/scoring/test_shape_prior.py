"""The shape prior of the learned workload, and ties that keep capacity whole (issue 36)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from scoring.evaluated import BREAKS_EMPTY_SHIFT, Evaluation
from scoring.fit import cluster_terms, fit
from scoring.presets import PRESETS
from scoring.request import ANY_MODEL_MASK, PodRequest, QoSClass
from scoring.scorer import KEEP_WHOLE_BAND, ScoringConfig, Ties, build_scorer, keep_whole_rank
from scoring.shape_prior import NO_PRIOR, ShapePrior
from scoring.specs import Allocation
from scoring.state import ClusterState
from scoring.workload import WorkloadModel
from tests.conftest import gpu_node

QUARTER = (1, 250, 2000, 16384, ANY_MODEL_MASK, 0)
"""A quarter-GPU notebook's task key."""


def test_automatic_shapes_follow_node_sizes() -> None:
    # Node sizes {8}: whole node 8, half node 4, whole GPU 1, and 500 / 250 of one GPU.
    assert ShapePrior().resolve([8, 8, 8]) == (
        (1, 250, 1), (1, 500, 1), (1, 1000, 1), (4, 1000, 1), (8, 1000, 1))
    # Sizes {1, 2, 4, 8} (openb): halves 0 (dropped), 1, 2, 4 merge with the sizes.
    got = {k for k, m, _ in ShapePrior().resolve([1, 2, 4, 8, 0]) if m == 1000}
    assert got == {1, 2, 4, 8}
    assert ShapePrior().resolve([0, 0]) == ()  # no GPU node: no shape to expect
    assert NO_PRIOR.resolve([8]) == ()
    given = ShapePrior(((8, 1000, 3), (1, 250, 1)))
    assert given.resolve([2]) == ((1, 250, 1), (8, 1000, 3))  # admin shapes win over node sizes


def test_prior_counts_arithmetic() -> None:
    shapes = ShapePrior().resolve([8])  # 5 shapes of weight 1
    prior = ShapePrior((), 8, 0.05)
    # N = 0: T = max(8, ceil(0.05 * 0)) = 8; 8 / 5 = 1.6 -> round 2 each.
    assert prior.counts(shapes, 0) == [2] * 5
    # N = 960 quarter notebooks: T = max(8, ceil(48.0)) = 48; 48 / 5 = 9.6 -> 10 each, so the
    # 8-GPU shape holds 10 / (960 + 50) = 0.99 % of the pods.
    assert prior.counts(shapes, 960) == [10] * 5
    # Weights deal T in proportion: 3 : 1 of T = 8 -> 6 and 2.
    assert ShapePrior((), 8, 0.0).counts(((1, 250, 1), (8, 1000, 3)), 10_000) == [2, 6]
    # Every shape keeps at least one pseudo-pod; a shape counted pods already hold keeps one.
    assert ShapePrior((), 1, 0.0).counts(shapes, 0) == [1] * 5
    assert prior.counts(shapes, 960, (True, True, False, False, False)) == [1, 1, 10, 10, 10]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"pods": -1}, "pods"),
    ({"floor": 0.6}, "floor"),
    ({"floor": float("nan")}, "floor"),
    ({"shapes": ((0, 1000, 1),)}, r"shapes\[0\]"),
    ({"shapes": ((2, 500, 1),)}, "whole GPUs"),
    ({"shapes": ((1, 1001, 1),)}, r"shapes\[0\]"),
    ({"shapes": ((1, 250, 0),)}, r"shapes\[0\]"),
])
def test_prior_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ShapePrior(**kwargs)  # type: ignore[arg-type]


def test_workload_starts_from_the_prior_and_real_demand_outgrows_it() -> None:
    wl = WorkloadModel()
    assert wl.task_types() is None  # no prior set yet: nothing known
    wl.set_prior(ShapePrior(), [8] * 4)
    tasks = wl.task_types()
    assert tasks is not None
    assert sorted(tasks.gpu_count.tolist()) == [1, 1, 1, 4, 8]
    for _ in range(960):
        wl.add(QUARTER, 1)
    tasks = wl.task_types()
    assert tasks is not None
    # T = max(8, ceil(0.05 * 960)) = 48, 48 / 5 = 9.6 -> 10 pseudo-pods for each unseen shape
    # (whole GPU, 4 and 8 GPUs); the fractions are seen (the notebooks), 1 each. 960 + 2 + 30
    # = 992 pods: the 8-GPU type has 10 / 992.
    eight = tasks.popularity[tasks.gpu_count == 8]
    assert eight.tolist() == [pytest.approx(10 / 992)]
    # share_by_gpu_count: 960 * 250 + 250 + 500 + 10 * 1000 for one GPU; 10 * 4000; 10 * 8000.
    assert wl.share_by_gpu_count() == {1: 240_000 + 750 + 10_000, 4: 40_000, 8: 80_000}
    # The cutting-stock demand sees the pseudo-pods too.
    assert (8, 1000, ANY_MODEL_MASK, 0, 10) in (tasks.demand or ())


def test_workload_is_the_same_whatever_the_order_of_the_pods() -> None:
    keys = [QUARTER] * 5 + [(1, 1000, 4000, 8192, ANY_MODEL_MASK, 0)] * 5 + [(8, 1000, 0, 0, ANY_MODEL_MASK, 0)] * 5
    seen = set()
    for perm in itertools.islice(itertools.permutations(range(len(keys))), 0, 50_000, 7_919):
        wl = WorkloadModel()
        wl.set_prior(ShapePrior(), [8])
        for i in perm:
            wl.add(keys[i], 1)
        t = wl.task_types()
        assert t is not None
        seen.add((t.gpu_count.tobytes(), t.gpu_milli.tobytes(), t.cpu_milli.tobytes(), t.count.tobytes(), t.demand))
    assert len(seen) == 1


def _state(used_first: bool) -> ClusterState:
    """Two 4-GPU nodes; with ``used_first`` node ``a`` (row 0) holds a quarter pod on GPU 0."""
    state = ClusterState.from_nodes([gpu_node("a", 4), gpu_node("b", 4)])
    if used_first:
        state.apply(Allocation("a", (0,), 250, (4096,), QoSClass.BURSTABLE, 1000, 1024, in_workload=False))
    return state


def _flat_scorer(ties: Ties) -> ScoringConfig:
    # fgd with no workload known (no prior, no counted pod) scores every node 1/2: a tie.
    return ScoringConfig({"fgd": 1.0}, prior=NO_PRIOR, ties=ties)


def test_keep_whole_prefers_the_used_node_on_a_tie() -> None:
    state = ClusterState.from_nodes([gpu_node("a", 4), gpu_node("b", 4)])
    state.apply(Allocation("b", (0,), 250, (4096,), QoSClass.BURSTABLE, 1000, 1024, in_workload=False))
    req = PodRequest(gpu_count=1, gpu_milli=250, cpu_milli=1000, memory_mib=1024)
    rows = np.arange(2)
    keep = build_scorer(_flat_scorer(Ties.KEEP_WHOLE)).evaluate(state, req, rows)
    row = build_scorer(_flat_scorer(Ties.ROW)).evaluate(state, req, rows)
    assert keep.score.tolist() == row.score.tolist() == [0.5, 0.5]
    # Ranks: a (empty node) = 1 * 2**40 + 1 empty GPU taken * 2**24 + (4000 - 250) left;
    #        b (holds 250 on GPU 0, chosen: the same GPU, fgd's tie goes to column 0)
    #          = 0 + 0 * 2**24 + (4000 - 250 - 250) left.
    assert keep.tie_rank.tolist() == [2**40 + 2**24 + 3750, 3500]
    assert keep.best() == 1  # b: the empty node stays whole
    assert row.best() == 0  # the simulator's rule: the lowest row


def test_keep_whole_band_holds_until_whole_node_pods_are_worth_the_prior() -> None:
    # Best node empty (a), a used node (b) 4e-4 behind: inside KEEP_WHOLE_BAND (2e-3), so b
    # wins while the pods that take a whole node of the largest size are few (below).
    rank = np.array([(1 << BREAKS_EMPTY_SHIFT) + 7, 3, (1 << BREAKS_EMPTY_SHIFT)], dtype=np.int64)
    ev = Evaluation(PodRequest(1, 250), np.arange(3), np.ones(3, dtype=bool), np.zeros(3, dtype=np.int8),
                    np.array([0.5004, 0.5000, 0.4]), np.zeros((3, 1), dtype=np.int64),
                    np.zeros((3, 1), dtype=np.int64), np.zeros(3, dtype=np.int64), rank,
                    tie_band=KEEP_WHOLE_BAND)
    assert ev.best() == 1
    assert replace(ev, tie_band=0.0).best() == 0  # no band: the higher score
    far = replace(ev, score=np.array([0.5004, 0.4980, 0.4]))  # 2.4e-3 behind: outside
    assert far.best() == 0
    assert ev.take(np.array([2, 1, 0])).best() == 1  # the order of the candidates is irrelevant

    # The band holds until the whole-node pods (4 GPUs here) counted, or arrived, are worth
    # as much as the prior (ShapePrior.pods = 8): one such pod among many small ones is not
    # yet the evidence the prior is (decision 0022; before, one counted pod ended the band).
    state = ClusterState.from_nodes([gpu_node("a", 4), gpu_node("b", 2), *(gpu_node(f"c{i}", 4) for i in range(7))])
    state.workload.set_prior(ShapePrior(), [4, 2] + [4] * 7)
    assert cluster_terms(state).whole_node_unseen
    state.apply(Allocation("b", (0, 1), 1000, (0, 0), QoSClass.BURSTABLE, 1000, 1024))  # 2 GPUs: not 4
    assert cluster_terms(state).whole_node_unseen
    whole: tuple[int, int, int, int, int, int] = (4, 1000, 1000, 1024, -1, 0)
    for node in ["a", *(f"c{i}" for i in range(6))]:
        state.apply(Allocation(node, (0, 1, 2, 3), 1000, (0,) * 4, QoSClass.BURSTABLE, 1000, 1024))
    assert cluster_terms(state).whole_node_unseen  # 7 counted
    state.apply(Allocation("c6", (0, 1, 2, 3), 1000, (0,) * 4, QoSClass.BURSTABLE, 1000, 1024))
    assert not cluster_terms(state).whole_node_unseen  # 8
    # Where pods leave, the arrivals count: 8 arrived, one still running, is evidence enough.
    churned = ClusterState.from_nodes([gpu_node("a", 4), gpu_node("b", 2)])
    churned.workload.set_prior(ShapePrior(), [4, 2])
    for _ in range(7):
        churned.workload.arrive(whole)
    churned.workload.arrive(whole)
    churned.apply(Allocation("a", (0, 1, 2, 3), 1000, (0,) * 4, QoSClass.BURSTABLE, 1000, 1024))
    assert not cluster_terms(churned).whole_node_unseen
    scorer = build_scorer(PRESETS["default"])
    req = PodRequest(gpu_count=1, gpu_milli=250, cpu_milli=1000, memory_mib=1024)
    assert scorer.evaluate(state, req, np.arange(2)).tie_band == 0.0


def test_keep_whole_rank_counts_empty_gpus_and_share_left() -> None:
    state = ClusterState.from_nodes([gpu_node("a", 4), gpu_node("b", 4)])
    # a: GPUs 0 and 1 at 500; b: GPU 0 at 250. A 2-GPU whole pod takes two empty GPUs on
    # either; a leaves 4000 - 1000 - 2000 = 1000, b leaves 4000 - 250 - 2000 = 1750.
    state.apply(Allocation("a", (0, 1), 500, (8192, 8192), QoSClass.BURSTABLE, 1000, 1024, in_workload=False))
    state.apply(Allocation("b", (0,), 250, (4096,), QoSClass.BURSTABLE, 1000, 1024, in_workload=False))
    req = PodRequest(gpu_count=2, gpu_milli=1000, cpu_milli=1000, memory_mib=1024)
    ctx = fit(state, req, np.arange(2), terms=cluster_terms(state))
    cols = np.array([[2, 3], [2, 3]])
    assert keep_whole_rank(ctx, cols).tolist() == [2 * 2**24 + 1000, 2 * 2**24 + 1750]


def test_presets_prior_and_ties() -> None:
    for name in ("default", "balance", "packing"):
        assert PRESETS[name].prior == ShapePrior() and PRESETS[name].ties == Ties.KEEP_WHOLE
    for name in ("random", "bestfit", "fgd", "spread"):  # the baselines as published
        assert PRESETS[name].prior == NO_PRIOR and PRESETS[name].ties == Ties.ROW
