"""Feasibility compiled (``extender.compiled.compiled_fit``) is the reference's ``FitContext``."""

from __future__ import annotations

import dataclasses

import numba
import numpy as np
import pytest

from extender.compiled import compiled_fit, jit
from scoring import fit as reference
from scoring.fit import FitContext, Reason
from scoring.request import QoSPolicy
from tests.randstate import random_request, random_state


def _same(a: FitContext, b: FitContext) -> None:
    for f in dataclasses.fields(FitContext):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and (x.dtype, x.shape) == (y.dtype, y.shape), f.name
            assert np.array_equal(x, y), f.name
        elif f.name != "memo":
            assert x == y, f.name


def test_every_field_equals_the_reference_on_random_states(rng: np.random.Generator) -> None:
    # Random states (GPU counts 0-8, models, unhealthy GPUs, nodes not ready, NVML-used
    # memory, best-effort oversubscription, pods of every QoS class), random pods (CPU-only,
    # shares, 1-8 GPUs, model- and memory-bound, every QoS class), both isolation settings
    # and three oversubscription caps, and candidate lists of every length, in any order.
    reasons: set[int] = set()
    for _ in range(150):
        st = random_state(rng, n_nodes=int(rng.integers(1, 20)))
        for _ in range(10):
            req = random_request(rng)
            policy = QoSPolicy(isolate_guaranteed=bool(rng.random() < 0.5),
                               best_effort_cap_milli=int(rng.choice([1000, 1500, 4000])))
            rows = rng.permutation(st.n_nodes).astype(np.int64)[:int(rng.integers(0, st.n_nodes + 1))]
            ctx = compiled_fit.fit(st, req, rows, policy)
            _same(ctx, reference.fit(st, req, rows, policy))
            reasons.update(ctx.reason.tolist())
    assert reasons == {int(r) for r in Reason}  # every check decided some node


def test_the_reason_table_is_the_references() -> None:
    assert compiled_fit._REASON_BY_STAGE == tuple(reference._REASON_BY_STAGE.tolist())


def test_a_state_of_other_dtypes_is_checked_by_the_reference(rng: np.random.Generator) -> None:
    st = random_state(rng)
    narrow = dataclasses.replace(st, gpu_free_milli=st.gpu_free_milli.astype(np.int32))
    req = random_request(rng)
    rows = np.arange(st.n_nodes, dtype=np.int64)
    _same(compiled_fit.fit(narrow, req, rows), reference.fit(narrow, req, rows))


def test_a_file_system_numba_cannot_write_compiles_without_keeping(monkeypatch: pytest.MonkeyPatch) -> None:
    # numba refuses cache=True where no cache directory is writable (an image's read-only
    # root file system): the kernels are then compiled in memory, not refused.
    def refuse(*args: object, **kwargs: object) -> object:
        raise RuntimeError("cannot cache function '_probe': no locator available for file")

    monkeypatch.setattr(numba, "njit", refuse)
    assert jit.can_cache() is False
