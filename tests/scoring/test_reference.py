"""The vectorized kernels agree with the scalar reference on random states."""

from __future__ import annotations

import numpy as np
import pytest

from scoring.presets import PRESETS
from scoring.registry import STRATEGIES
from scoring.request import QoSPolicy
from scoring.scorer import ScoringConfig, build_scorer
from tests.randstate import random_request, random_state
from tests.scoring.reference import evaluate_node_all

WEIGHT_SETS = [
    dict(PRESETS["default"].weights),
    dict.fromkeys(STRATEGIES, 1.0),
    *({name: 1.0} for name in STRATEGIES),
]


POLICIES = [QoSPolicy(), QoSPolicy(isolate_guaranteed=True, best_effort_cap_milli=1500)]


@pytest.mark.parametrize("policy", POLICIES, ids=["qos-default", "qos-isolated-oversubscribed"])
def test_kernel_matches_reference(policy: QoSPolicy, rng: np.random.Generator) -> None:
    # Every weight set (the default, all strategies at once, each strategy alone) on the
    # same 400 random (state, pod) pairs; the scalar reference computes a node's terms once
    # for all of them (``evaluate_node_all``), the kernel evaluates each set on its own.
    labels = ["+".join(sorted(w)) for w in WEIGHT_SETS]
    scorers = [build_scorer(ScoringConfig(w, qos=policy)) for w in WEIGHT_SETS]
    checked = dict.fromkeys(labels, 0)
    for _ in range(40):
        st = random_state(rng)
        for _ in range(10):
            req = random_request(rng)
            rows = rng.permutation(st.n_nodes)
            evs = [scorer.evaluate(st, req, rows) for scorer in scorers]
            for pos, row in enumerate(rows.tolist()):
                refs = evaluate_node_all(st, req, row, WEIGHT_SETS, policy)
                for label, ev, ref in zip(labels, evs, refs, strict=True):
                    assert bool(ev.node_fits[pos]) == ref.fits, label
                    assert int(ev.reason[pos]) == ref.reason, label
                    if ref.fits:
                        assert ev.score[pos] == pytest.approx(ref.score, abs=1e-12), label
                        assert tuple(ev.chosen_cols[pos].tolist()) == ref.cols, label
                        checked[label] += 1
    # the random states must exercise feasible nodes, not only failures, for every set
    assert min(checked.values()) > 500, checked
