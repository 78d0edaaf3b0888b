"""The extender scores with the compiled kernels, and a cache it was handed with its own."""

from __future__ import annotations

import logging

import numba
import pytest

from extender.app import create_app
from extender.cache import GpuCache
from extender.compiled import compiled_fgd, compiled_fit
from extender.settings import Settings
from scoring.fit import fit
from scoring.presets import PRESETS
from scoring.scorer import build_scorer


def _settings() -> Settings:
    return Settings(mode="standalone", host="127.0.0.1", port=8888, log_level="warning")


def test_the_extender_scores_with_the_compiled_kernels(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="extender.app"):
        app = create_app(_settings())
    assert f"scoring with numba {numba.__version__}" in caplog.text
    _, _, scorer = app.state.cache.defrag_snapshot()
    assert scorer._fit is compiled_fit.fit
    assert scorer.weights(next(iter(scorer._plans))) == dict(PRESETS["default"].weights)
    assert any(strat.gpu_score is compiled_fgd.gpu_score for plan in scorer._plans.values() for strat, _ in plan)


def test_a_cache_handed_in_keeps_its_own_scorer(caplog: pytest.LogCaptureFixture) -> None:
    # The demo and the tests hand create_app a cache with its scorer: nothing is compiled for it.
    cache = GpuCache(build_scorer(PRESETS["default"]))
    with caplog.at_level(logging.INFO, logger="extender.app"):
        create_app(_settings(), cache=cache)
    assert "scoring with numpy" in caplog.text
    assert cache.defrag_snapshot()[2]._fit is fit
