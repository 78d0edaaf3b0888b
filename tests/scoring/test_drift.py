"""``DriftWatch``: decides as ``drifted`` at every evaluation, computing the distance rarely."""

from __future__ import annotations

import numpy as np
import pytest

from scoring import drift
from scoring.drift import DEFAULT_TOLERANCE, DriftWatch, Tolerance, drifted, workload_drift
from scoring.fragmentation import TaskTypes
from scoring.presets import PRESETS
from scoring.request import ANY_MODEL_MASK
from scoring.scorer import build_scorer
from scoring.state import ClusterState
from tests.conftest import gpu_node

TERMS = build_scorer(PRESETS["default"]).terms
SHAPES = [(1, 250, 2000, 4096, ANY_MODEL_MASK, 0), (1, 500, 4000, 8192, ANY_MODEL_MASK, 0),
          (1, 1000, 8000, 16384, 6, 0), (2, 1000, 16000, 32768, ANY_MODEL_MASK, 0),
          (1, 300, 1000, 2048, ANY_MODEL_MASK, 8192), (8, 1000, 64000, 262144, ANY_MODEL_MASK, 0)]


@pytest.mark.parametrize("bound", [0.0, 0.002, 0.01, 0.05])
def test_the_watch_decides_as_drifted_at_every_step(rng: np.random.Generator, bound: float,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A workload that moves by one pod a step (arrivals, departures, pods waiting, now and
    # then a burst of one shape), watched against frozen terms refreshed on each drift.
    calls: list[float] = []

    def counted(a: TaskTypes | None, b: TaskTypes | None) -> float:
        calls.append(workload_drift(a, b))
        return calls[-1]

    monkeypatch.setattr(drift, "workload_drift", counted)
    scorer = build_scorer(PRESETS["default"])
    st = ClusterState.from_nodes([gpu_node(f"n{i}", 8) for i in range(40)])
    held = dict.fromkeys(SHAPES, 300)
    for shape in SHAPES:
        for _ in range(300):
            st.workload.add(shape, 1)
    tolerance = Tolerance(bound, DEFAULT_TOLERANCE.terms)
    watch = DriftWatch(tolerance, TERMS)
    frozen = scorer.cluster_terms(st)
    watch.freeze(frozen)
    refreshes = computed = 0
    for step in range(600):
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        burst = 60 if rng.random() < 0.02 else 1
        if rng.random() < 0.3 and held[shape] > 1:
            st.workload.add(shape, -1)
            held[shape] -= 1
        else:
            for _ in range(burst):
                st.workload.add(shape, 1, pending=rng.random() < 0.2)
            held[shape] += burst
        now = scorer.cluster_terms(st)
        want = drifted(frozen, now, tolerance, TERMS)
        before = len(calls)
        assert watch.drifted(frozen, now) == want, step
        computed += len(calls) - before
        if want:
            refreshes += 1
            frozen = now
            watch.freeze(frozen)
    assert refreshes > (3 if bound < 0.05 else 0)  # the tolerance was crossed; both agreed there too
    if bound >= 0.01:  # the bound spared most distances (here the types swap places often: 118 of 600)
        assert computed < 600 / 3, computed


def _one_bind_apart() -> tuple[ClusterState, TaskTypes | None, TaskTypes | None]:
    """A workload of the test shapes, then one more pod of a shape already counted: the two
    ``task_types`` and the state."""
    st = ClusterState.from_nodes([gpu_node("n", 8)])
    for i, shape in enumerate(SHAPES):
        for _ in range(10 + 7 * i):
            st.workload.add(shape, 1)
    a = st.workload.task_types()
    st.workload.add(SHAPES[2], 1)
    return st, a, st.workload.task_types()


def test_the_aligned_step_is_the_distance() -> None:
    st, a, b = _one_bind_apart()
    assert a is not None and b is not None and a.count.tobytes() != b.count.tobytes()
    step = drift._aligned_drift(a, b)
    assert step is not None and step == pytest.approx(workload_drift(a, b), abs=1e-15) and step > 0
    for _ in range(200):
        st.workload.add(SHAPES[0], 1)  # SHAPES[0] overtakes the others: another order, no step
    c = st.workload.task_types()
    assert c is not None and drift._aligned_drift(b, c) is None


def test_workloads_of_the_same_types_share_their_arrays_and_the_step_reads_them() -> None:
    # A bind of a shape already counted changes the counts only: the model hands the next
    # workload the same type arrays and demand classes, which the step compares by identity;
    # its distance is the one the tuples give (the demand classes rebuilt from scratch).
    _, a, b = _one_bind_apart()
    assert a is not None and b is not None
    assert a.gpu_milli is b.gpu_milli and a.cpu_milli is b.cpu_milli and a.demand_keys is b.demand_keys
    assert a.demand is not None and a.demand_count is not None and b.demand_count is not None
    assert a.demand_count.tolist() == [c for *_, c in a.demand] and a.demand_keys == tuple(d[:4] for d in a.demand)
    fresh = TaskTypes(b.gpu_count.copy(), b.gpu_milli.copy(), b.cpu_milli.copy(), b.memory_mib.copy(),
                      b.popularity, b.count, b.model_mask, b.gpu_memory_mib, b.demand)  # no shared layout
    shared, rebuilt = drift._aligned_drift(a, b), drift._aligned_drift(a, fresh)
    assert shared is not None and shared == rebuilt and shared > 0
