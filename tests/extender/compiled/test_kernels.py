"""The extender scores with the compiled kernels, and a cache it was handed with its own."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from pathlib import Path
from typing import cast

import numba
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from extender import compiled
from extender.app import create_app
from extender.cache import GpuCache
from extender.compiled import compiled_fgd, compiled_fit
from extender.settings import Settings
from scoring.drift import DEFAULT_TOLERANCE
from scoring.fit import fit
from scoring.incremental import IncrementalScorer
from scoring.presets import PRESETS
from scoring.registry import STRATEGIES
from scoring.request import QoSClass
from scoring.scorer import Scorer, Ties, build_scorer
from tests.randstate import random_request, random_state


def _settings() -> Settings:
    return Settings(mode="standalone", host="127.0.0.1", port=8888, log_level="warning")


def _scorer(app: FastAPI) -> Scorer:
    return cast(Scorer, app.state.cache.defrag_snapshot()[2])


def test_the_extender_scores_with_the_compiled_kernels_once_compiled(caplog: pytest.LogCaptureFixture) -> None:
    # The numpy reference scores from the start; the kernels, compiled beside it while the
    # extender starts, take its place under the same policy.
    app = create_app(_settings())
    assert _scorer(app)._fit is fit
    seen: set[str] = set()
    with caplog.at_level(logging.INFO, logger="extender.app"), TestClient(app) as http:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            seen.add(http.get("/readyz").json()["scoring"])
            if f"numba {numba.__version__}" in seen:
                break
            time.sleep(0.05)
        scorer = _scorer(app)  # /readyz names the kernels once they score
        metrics = http.get("/metrics").text
    assert f'gpufrac_scoring_info{{backend="numba {numba.__version__}"}} 1.0' in metrics
    assert seen <= {"numpy, compiling", f"numba {numba.__version__}"} and f"numba {numba.__version__}" in seen
    assert f"scoring with numba {numba.__version__}" in caplog.text
    assert scorer._fit is compiled_fit.fit
    assert scorer.weights(QoSClass.BURSTABLE) == dict(PRESETS["default"].weights)
    assert any(strat.gpu_score is compiled_fgd.gpu_score for plan in scorer._plans.values() for strat, _ in plan)


def test_the_kernels_score_the_admin_configs_policy(tmp_path: Path) -> None:
    # The swap builds the scorer from the policy in force (here the admin config's), not
    # from the default.
    config = tmp_path / "gpufrac.yaml"
    config.write_text("scoring:\n  preset: fgd\n")
    app = create_app(Settings(mode="standalone", host="127.0.0.1", port=8888, log_level="warning",
                              config_file=config))
    with TestClient(app):
        deadline = time.monotonic() + 120
        while _scorer(app)._fit is not compiled_fit.fit and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _scorer(app)._fit is compiled_fit.fit
        assert _scorer(app).weights(QoSClass.BURSTABLE) == {"fgd": 1.0} and _scorer(app).ties == Ties.ROW


def test_a_cache_handed_in_keeps_its_own_scorer(caplog: pytest.LogCaptureFixture) -> None:
    # The demo and the tests hand create_app a cache with its scorer: nothing is compiled for it.
    cache = GpuCache(build_scorer(PRESETS["default"]))
    with caplog.at_level(logging.INFO, logger="extender.app"), TestClient(create_app(_settings(), cache=cache)) as http:
        assert http.get("/readyz").json()["scoring"] == "the scorer of the cache handed in"
    assert "scoring with" not in caplog.text
    assert cache.defrag_snapshot()[2]._fit is fit


def test_the_registry_swaps_only_the_compiled_strategies_score_functions() -> None:
    kernels = compiled.kernels()
    registry = kernels.strategies
    assert set(registry) == set(STRATEGIES) and set(compiled.COMPILED) <= set(STRATEGIES)
    for name, path in compiled.COMPILED.items():
        module = importlib.import_module(path)
        swapped = {f: getattr(module, f) for f in ("gpu_score", "node_score") if hasattr(module, f)}
        assert swapped and all(getattr(registry[name], f) is fn for f, fn in swapped.items())
        # everything else about the strategy (its term, gain, flags) is the reference's
        assert dataclasses.replace(registry[name], **{f: getattr(STRATEGIES[name], f) for f in swapped}) \
            == STRATEGIES[name]
    assert all(registry[n] is STRATEGIES[n] for n in STRATEGIES if n not in compiled.COMPILED)
    assert kernels.feasibility is compiled_fit.fit
    assert kernels.backend == f"numba {numba.__version__}" and compiled.REFERENCE.backend == "numpy"


def test_swapping_in_the_same_numbers_keeps_every_kept_score(rng: np.random.Generator) -> None:
    # A config reload drops what the incremental scorer keeps (its terms may differ); the
    # compiled kernels are the same numbers, swapped into the scorer in place, so nothing
    # kept is dropped and the placements of a run do not depend on when the compile finished.
    k = compiled.kernels()
    st = random_state(rng, n_nodes=30)
    scorer = build_scorer(PRESETS["default"])
    inc = IncrementalScorer(scorer, DEFAULT_TOLERANCE)
    rows = np.arange(st.n_nodes, dtype=np.int64)
    requests = [random_request(rng) for _ in range(12)]
    before = [inc.evaluate(st, r, rows) for r in requests]
    full = inc.stats.full
    k.swap_into(scorer)
    assert scorer._fit is compiled_fit.fit
    after = [inc.evaluate(st, r, rows) for r in requests]
    assert inc.stats.full == full  # nothing evaluated again from scratch
    for a, b in zip(before, after, strict=True):
        assert np.array_equal(a.score, b.score) and np.array_equal(a.chosen_cols, b.chosen_cols)
    # and what it computes from scratch now is what the reference computes
    fresh = build_scorer(PRESETS["default"])
    for r in requests:
        assert np.array_equal(scorer.evaluate(st, r, rows).score, fresh.evaluate(st, r, rows).score)


def test_without_the_kernels_readyz_says_numpy_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    # numba absent or failing (kernels() returns the reference): the compile ends, the
    # reference keeps scoring, and /readyz says so instead of "compiling" for ever.
    monkeypatch.setattr("extender.app.kernels", lambda: compiled.REFERENCE)
    app = create_app(_settings())
    with TestClient(app) as http:
        deadline = time.monotonic() + 30
        while http.get("/readyz").json()["scoring"] != "numpy" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert http.get("/readyz").json()["scoring"] == "numpy"
        assert 'gpufrac_scoring_info{backend="numpy"} 1.0' in http.get("/metrics").text
    assert _scorer(app)._fit is fit
