"""``compiled_plan.combine``: the scorer with it evaluates as the numpy reference does, to the bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from extender.compiled import compiled_plan, kernels
from scoring.evaluated import Evaluation
from scoring.fit import fit
from scoring.presets import PRESETS
from scoring.request import PodRequest, QoSClass, QoSPolicy
from scoring.scorer import ScoringConfig, Ties, build_scorer
from scoring.specs import Allocation, GpuSpec, NodeSpec
from scoring.state import ClusterState
from tests.randstate import random_request, random_state

FIELDS = ("node_fits", "reason", "score", "chosen_cols", "chosen_mem_mib", "gpu_mem_max_mib", "tie_rank")


def same(a: Evaluation, b: Evaluation) -> None:
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), f
    assert a.tie_band == b.tie_band


CONFIGS = {
    "default": PRESETS["default"],
    "default, row ties": dataclasses.replace(PRESETS["default"], ties=Ties.ROW),
    "fgd": PRESETS["fgd"],
    "fgd and gap price": ScoringConfig({"fgd": 1.0, "gap_price": 3.0}),
    "priced stranding alone": ScoringConfig({"priced_stranding": 1.0}),
    "no FGD": ScoringConfig({"gap_price": 6.0, "adaptive_balance": 0.2, "spare_nodes": 2.0, "consolidation": 2.0}),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_combined_evaluation_is_the_references(name: str, rng: np.random.Generator) -> None:
    k = kernels()
    ours, reference = k.scorer(CONFIGS[name]), build_scorer(CONFIGS[name])
    covered = 0
    for _ in range(60):
        st = random_state(rng, n_nodes=int(rng.integers(1, 24)))
        terms = reference.cluster_terms(st)
        for _ in range(8):
            req = random_request(rng)
            rows = rng.permutation(st.n_nodes).astype(np.int64)
            same(ours.evaluate(st, req, rows, terms), reference.evaluate(st, req, rows, terms))
            policy = QoSPolicy()
            ctx = k.feasibility(st, req, rows, policy, terms, None)
            plan = ours._plans[req.qos]
            if req.gpu_count and ctx.gpu_fits.shape[1] >= req.gpu_count and compiled_plan.combine(ctx, plan) is not None:
                covered += int(ctx.node_fits.any())
    assert covered > 60  # combined where something fits, not only declined or refused


def test_several_gpus_equal_preferences_and_padding_columns(rng: np.random.Generator) -> None:
    # Ties between GPUs (an empty node: every GPU scores alike) choose the lowest columns, as
    # the stable argsort does, for pods of 1 to 8 GPUs; nodes of fewer GPUs pad their rows.
    ours, reference = kernels().scorer(PRESETS["default"]), build_scorer(PRESETS["default"])
    for _ in range(30):
        st = random_state(rng, n_nodes=8)
        for gpus in (1, 2, 3, 4, 8):
            req = PodRequest(gpus, 1000, None, None, QoSClass.BURSTABLE, 1000, 1024)
            rows = np.arange(st.n_nodes, dtype=np.int64)
            same(ours.evaluate(st, req, rows), reference.evaluate(st, req, rows))


def test_an_unrestricted_workload_is_combined_with_its_one_gap_table() -> None:
    # No pod restricted to some models (openb's lists): one value table prices every GPU, and
    # ``model_waste`` hands it out read-only; the kernel gets a writable copy (a read-only
    # array is another numba type: refused with TypeError, the reference would combine).
    rng = np.random.default_rng(11)
    ours, reference = kernels().scorer(PRESETS["default"]), build_scorer(PRESETS["default"])
    st = ClusterState.from_nodes([NodeSpec(f"n{i}", 64_000, 262_144, tuple(
        GpuSpec(g, f"GPU-{i}-{g}", "A10", 24_576, 8) for g in range(8))) for i in range(6)])
    for i in range(12):
        st.apply(Allocation(f"n{i % 6}", (i % 8,), int(rng.integers(100, 900)), (2048,), QoSClass.BURSTABLE, 2000, 4096))
    rows = np.arange(6, dtype=np.int64)
    for req in (PodRequest(1, 300, None, None, QoSClass.BURSTABLE, 1000, 1024),
                PodRequest(2, 1000, None, None, QoSClass.BURSTABLE, 8000, 8192)):
        terms = reference.cluster_terms(st)
        ctx = kernels().feasibility(st, req, rows, QoSPolicy(), terms, None)
        plan = tuple((s, w * s.gain(terms.strategy_terms) if s.gain is not None else w) for s, w in ours._plans[req.qos])
        assert compiled_plan.combine(ctx, tuple((s, w) for s, w in plan if w > 0)) is not None
        same(ours.evaluate(st, req, rows, terms), reference.evaluate(st, req, rows, terms))


def test_what_it_does_not_cover_is_declined() -> None:
    st = random_state(np.random.default_rng(3), n_nodes=6)
    req = PodRequest(1, 500, None, None, QoSClass.BURSTABLE, 1000, 1024)
    rows = np.arange(st.n_nodes, dtype=np.int64)
    scorer = build_scorer(ScoringConfig({"fgd": 1.0, "best_fit": 1.0}))
    ctx = fit(st, req, rows, QoSPolicy(), scorer.cluster_terms(st))
    assert compiled_plan.combine(ctx, scorer._plans[req.qos]) is None  # best_fit is not covered
    default = build_scorer(PRESETS["default"])
    no_workload = dataclasses.replace(fit(st, req, rows, QoSPolicy(), default.cluster_terms(st)), tasks=None)
    assert compiled_plan.combine(no_workload, default._plans[req.qos]) is None
    unsorted = tuple(reversed(default._plans[req.qos]))
    assert compiled_plan.combine(fit(st, req, rows, QoSPolicy(), default.cluster_terms(st)), unsorted) is None


def test_numpy_sums_a_row_as_the_kernel_does() -> None:
    assert compiled_plan.NUMPY_SUMS_PAIRWISE
    rows = np.random.default_rng(5).random((4, 64)) - 0.5
    for n in (1, 2, 7, 8, 9, 15, 16, 17, 63, 64):
        out = np.empty(4)
        compiled_plan._sum_rows(np.ascontiguousarray(rows[:, :n]), out)
        assert np.array_equal(out, np.add.reduce(rows[:, :n], axis=1)), n
