"""The vectorized kernels agree with the scalar reference on random states."""

from __future__ import annotations

import numpy as np
import pytest

from scoring.presets import PRESETS
from scoring.request import QosPolicy
from scoring.scorer import STRATEGIES, ScoringConfig, build_scorer
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
