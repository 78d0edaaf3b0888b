"""Every compiled strategy (``extender.compiled.COMPILED``) gives its reference's scores to the bit."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from extender.compiled import COMPILED
from scoring.fit import fit
from scoring.presets import PRESETS
from scoring.registry import STRATEGIES
from scoring.request import QoSPolicy
from scoring.scorer import build_scorer
from tests.randstate import random_request, random_state


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_scores_equal_the_reference_on_random_states(name: str, rng: np.random.Generator) -> None:
    # Random states and pods as in the reference's own tests, with the cluster-wide terms the
    # default scorer computes (CPU pressure, spare-node need, churn), and chosen GPUs drawn at
    # random among those that fit.
    module, reference = importlib.import_module(COMPILED[name]), STRATEGIES[name]
    terms_of = build_scorer(PRESETS["default"])
    compared = 0
    for _ in range(50):
        st = random_state(rng, n_nodes=int(rng.integers(1, 24)))
        terms = terms_of.cluster_terms(st)
        for _ in range(10):
            req = random_request(rng)
            policy = QoSPolicy(isolate_guaranteed=bool(rng.random() < 0.5), best_effort_cap_milli=1500)
            ctx = fit(st, req, rng.permutation(st.n_nodes).astype(np.int64), policy, terms)
            chosen = ctx.gpu_fits & (rng.random(ctx.gpu_fits.shape) < 0.5)
            if hasattr(module, "gpu_score"):
                assert reference.gpu_score is not None
                assert np.array_equal(module.gpu_score(ctx), reference.gpu_score(ctx))
            if hasattr(module, "node_score"):
                assert reference.node_score is not None
                assert np.array_equal(module.node_score(ctx, chosen), reference.node_score(ctx, chosen))
            compared += int(ctx.node_fits.any())
    assert compared > 200  # feasible candidates, not only refusals
