"""The vectorized kernels agree with the scalar reference on random states."""

from __future__ import annotations

import numpy as np
import pytest

from scoring.presets import PRESETS
from scoring.request import QosPolicy
from scoring.strategies import STRATEGIES, ScoringConfig, build_scorer
from tests.scoring.randstate import random_request, random_state
from tests.scoring.reference import evaluate_node

WEIGHT_SETS = [
    dict(PRESETS["default"].weights),
    dict.fromkeys(STRATEGIES, 1.0),
    *({name: 1.0} for name in STRATEGIES),
]


POLICIES = [QosPolicy(), QosPolicy(isolate_guaranteed=True, best_effort_cap_milli=1500)]


@pytest.mark.parametrize("policy", POLICIES, ids=["qos-default", "qos-isolated-oversubscribed"])
@pytest.mark.parametrize("weights", WEIGHT_SETS, ids=lambda w: "+".join(sorted(w)))
def test_kernel_matches_reference(weights: dict[str, float], policy: QosPolicy,
                                  rng: np.random.Generator) -> None:
    scorer = build_scorer(ScoringConfig(weights, qos=policy))
    checked = 0
    for _ in range(40):
        st = random_state(rng)
        for _ in range(10):
            req = random_request(rng)
            rows = rng.permutation(st.n_nodes)
            ev = scorer.evaluate(st, req, rows)
            for pos, row in enumerate(rows.tolist()):
                ref = evaluate_node(st, req, row, weights, policy)
                assert bool(ev.context.node_fits[pos]) == ref.fits
                assert int(ev.context.reason[pos]) == ref.reason
                if ref.fits:
                    assert ev.score[pos] == pytest.approx(ref.score, abs=1e-12)
                    assert tuple(ev.chosen_cols[pos].tolist()) == ref.cols
                    checked += 1
    assert checked > 500  # the random states must exercise feasible nodes, not only failures


def test_gap_fill_waste_to_go_matches_reference(rng: np.random.Generator) -> None:
    # gap_fill computes W in blocks of the smallest share; the block size runs from 1 milli
    # (1,000 blocks of one) to 1000 (one block) and must give the scalar recursion's values
    # exactly, bit for bit (the same float operations per element).
    from scoring.gap_fill import _waste_to_go
    from tests.scoring.reference import _gap_waste

    cases = [((1, 3),), ((1000, 5),), ((1, 2), (999, 4)), ((50, 7), (810, 90), (1000, 300))]
    for trial in range(200):
        pool = np.arange(1, 1001) if trial % 2 else np.array([50, 110, 160, 320, 470, 810, 1000])
        shares = np.unique(rng.choice(pool, size=int(rng.integers(1, 9))))
        counts = rng.integers(1, 60, size=shares.shape[0])
        cases.append(tuple(zip(shares.tolist(), counts.tolist(), strict=True)))
    for sizes in cases:
        pods = sum(n for _, n in sizes) + int(rng.integers(0, 400))
        assert np.array_equal(_waste_to_go(sizes, pods), np.array(_gap_waste(sizes, pods))), sizes
    assert np.array_equal(_waste_to_go((), 5), np.arange(1001.0))  # no one-GPU pods: W(f) = f
