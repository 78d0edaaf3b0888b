"""Invariants every registered strategy and the scorer must keep (sklearn test_common style)."""

from __future__ import annotations

import numpy as np
import pytest

from scoring.evaluated import Evaluation
from scoring.fit import fit
from scoring.registry import STRATEGIES
from scoring.scorer import ScoringConfig, build_scorer
from tests.randstate import random_request, random_state


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_scores_bounded_and_shaped(name: str, rng: np.random.Generator) -> None:
    strat = STRATEGIES[name]
    for _ in range(30):
        st = random_state(rng)
        req = random_request(rng)
        ctx = fit(st, req, np.arange(st.n_nodes))
        chosen = np.zeros(ctx.gpu_fits.shape, dtype=bool)
        if strat.gpu_score is not None:
            s = strat.gpu_score(ctx)
            assert s.shape == ctx.gpu_fits.shape
            assert s.dtype == np.float64
            assert not s[~ctx.gpu_fits].any()  # 0 where the GPU does not fit
        else:
            assert strat.node_score is not None
            s = strat.node_score(ctx, chosen)
            assert s.shape == (st.n_nodes,)
            assert s.dtype == np.float64
        assert np.isfinite(s).all() and (s >= 0).all() and (s <= 1).all()


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_permutation_equivariance(name: str, rng: np.random.Generator) -> None:
    scorer = build_scorer(ScoringConfig({name: 1.0}))
    for _ in range(30):
        st = random_state(rng)
        req = random_request(rng)
        rows = np.arange(st.n_nodes)
        perm = rng.permutation(st.n_nodes)
        a, b = scorer.evaluate(st, req, rows), scorer.evaluate(st, req, perm)
        np.testing.assert_array_equal(a.score[perm], b.score)
        np.testing.assert_array_equal(a.reason[perm], b.reason)
        np.testing.assert_array_equal(a.chosen_cols[perm], b.chosen_cols)
        best_a, best_b = a.best(), b.best()
        assert (best_a < 0 and best_b < 0) or rows[best_a] == perm[best_b]


def test_best_breaks_ties_by_lowest_row(rng: np.random.Generator) -> None:
    from scoring.request import PodRequest
    from scoring.state import ClusterState
    from tests.conftest import gpu_node

    st = ClusterState.from_nodes([gpu_node(f"n{i}", 2) for i in range(5)])
    ev = build_scorer(ScoringConfig({"node_packing": 1.0})).evaluate(st, PodRequest(1), np.array([3, 1, 4]))
    # all three score (0 + 1000) / 2000 = 0.5: the lowest cluster row (1) wins, at position 1
    assert ev.score.tolist() == [0.5, 0.5, 0.5]
    assert ev.best() == 1


def test_take_equals_evaluating_the_subset(rng: np.random.Generator) -> None:
    scorer = build_scorer(ScoringConfig({"gpu_best_fit": 2.0, "node_packing": 1.0}))
    st = random_state(rng)
    req = random_request(rng)
    full = scorer.evaluate(st, req, np.arange(st.n_nodes))
    pos = np.array([5, 0, 7])
    sub = scorer.evaluate(st, req, pos)
    np.testing.assert_array_equal(full.take(pos).score, sub.score)
    np.testing.assert_array_equal(full.take(pos).chosen_cols, sub.chosen_cols)


def test_best_ranks_nan_below_every_score_and_infinities_as_the_extremes() -> None:
    from dataclasses import replace

    from scoring.request import PodRequest
    from scoring.state import ClusterState
    from tests.conftest import gpu_node

    st = ClusterState.from_nodes([gpu_node(f"n{i}", 2) for i in range(4)])
    ev = build_scorer(ScoringConfig({"node_packing": 1.0})).evaluate(st, PodRequest(1), np.arange(4))
    assert ev.node_fits.all()

    def with_score(*s: float) -> Evaluation:
        return replace(ev, score=np.array(s, dtype=np.float64))

    assert with_score(np.nan, -5.0, np.nan, -7.0).best() == 0  # NaN counts as -1.0, above -5
    assert with_score(np.nan, 0.2, np.nan, 0.1).best() == 1
    assert with_score(np.nan, np.inf, 0.9, np.inf).best() == 1  # +inf the largest, ties by row
    assert with_score(-np.inf, np.nan, -np.inf, -np.inf).best() == 1  # NaN (-1) above -inf
    assert with_score(0.3, 0.3, 0.3, 0.3).best() == 0
