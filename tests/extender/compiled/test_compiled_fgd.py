"""FGD compiled (``extender.compiled.compiled_fgd``) gives the reference's numbers to the bit."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import sys

import numpy as np
import pytest

from extender import compiled
from extender.compiled import compiled_fgd as fgd
from scoring.fit import fit
from scoring.presets import PRESETS
from scoring.registry import STRATEGIES
from scoring.request import QoSPolicy
from scoring.scorer import ScoringConfig, build_scorer
from scoring.strategies import fgd as reference
from tests.randstate import random_request, random_state


def test_scores_equal_the_reference_on_random_states(rng: np.random.Generator) -> None:
    # Random states (GPU counts 0-8, three models, unhealthy GPUs, nodes not ready, pods
    # that accept only some models, best-effort oversubscription, waiting and departed
    # pods) and random pods (CPU-only, shares, 1-8 GPUs, model- and memory-bound): the
    # per-GPU and the node score of every candidate, chosen GPUs drawn at random.
    kernel = {"gpu": 0, "node": 0}
    for _ in range(60):
        st = random_state(rng, n_nodes=int(rng.integers(1, 24)))
        for _ in range(12):
            req = random_request(rng)
            policy = QoSPolicy(isolate_guaranteed=bool(rng.random() < 0.5), best_effort_cap_milli=1500)
            ctx = fit(st, req, rng.permutation(st.n_nodes).astype(np.int64), policy)
            chosen = ctx.gpu_fits & (rng.random(ctx.gpu_fits.shape) < 0.5)
            assert np.array_equal(fgd.gpu_score(ctx), reference.gpu_score(ctx))
            assert np.array_equal(fgd.node_score(ctx, chosen), reference.node_score(ctx, chosen))
            if fgd._compiled(ctx) is not None and ctx.node_fits.any():
                kernel["gpu"] += int(ctx.gpu_fits.any())
                kernel["node"] += 1
    # the kernels themselves ran on many feasible candidate sets, not only the fallbacks
    assert min(kernel.values()) > 100, kernel


def test_the_default_scorer_decides_the_same(rng: np.random.Generator) -> None:
    # Everything an evaluation answers, with the extender's kernels (FGD and feasibility
    # compiled) and with the reference, under the default preset (FGD, and five terms beside
    # it) and FGD alone.
    kernels = compiled.kernels()
    for weights in (PRESETS["default"].weights, {"fgd": 1.0}):
        ours = build_scorer(ScoringConfig(weights), kernels.strategies, kernels.feasibility)
        theirs = build_scorer(ScoringConfig(weights))
        for _ in range(30):
            st = random_state(rng)
            for _ in range(8):
                req = random_request(rng)
                rows = rng.permutation(st.n_nodes).astype(np.int64)
                a, b = ours.evaluate(st, req, rows), theirs.evaluate(st, req, rows)
                for f in ("node_fits", "reason", "score", "chosen_cols", "chosen_mem_mib", "tie_rank"):
                    assert np.array_equal(getattr(a, f), getattr(b, f)), f
                assert a.best() == b.best()


def test_what_the_kernels_do_not_cover_is_the_reference(rng: np.random.Generator) -> None:
    # No workload known yet, and GPU memory as a dimension, go to the reference; arrays of
    # another dtype too (numba would compile again on the request's thread).
    st = random_state(rng)
    req = random_request(rng)
    ctx = fit(st, req, np.arange(st.n_nodes, dtype=np.int64))
    none = dataclasses.replace(ctx, tasks=None)
    assert fgd._compiled(none) is None
    assert np.array_equal(fgd.gpu_score(none), np.where(ctx.gpu_fits, 0.5, 0.0))
    assert np.array_equal(fgd.node_score(none, ctx.gpu_fits), np.full(st.n_nodes, 0.5))
    if ctx.tasks is not None:
        narrow = dataclasses.replace(ctx, free_milli=ctx.free_milli.astype(np.int32))
        assert np.array_equal(fgd.gpu_score(narrow), reference.gpu_score(narrow))
        assert np.array_equal(fgd.node_score(narrow, ctx.gpu_fits), reference.node_score(narrow, ctx.gpu_fits))
        asks = dataclasses.replace(ctx.tasks, gpu_memory_mib=np.ones_like(ctx.tasks.count))
        assert fgd._compiled(dataclasses.replace(ctx, tasks=asks)) is None


def test_without_numba_the_reference_scores(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Not installed: the reference, silently. Installed but failing to load (an unsupported
    # numpy or CPU): the reference, and a warning that says why.
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert compiled.kernels() is compiled.REFERENCE
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "extender.compiled.compiled_fgd", None)  # import raises ImportError
    with caplog.at_level(logging.WARNING, logger="extender.compiled"):
        assert compiled.kernels() is compiled.REFERENCE
    assert "scoring with numpy" in caplog.text
    assert compiled.REFERENCE.strategies is STRATEGIES and compiled.REFERENCE.feasibility is fit
