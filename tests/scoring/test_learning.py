"""The learned workload from arrivals (scoring.workload.Learning): worked cases with the arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from scoring.arrivals import ARRIVAL_UNITS, Learning, TaskKey
from scoring.fragmentation import TaskTypes
from scoring.request import ANY_MODEL_MASK
from scoring.shape_prior import NO_PRIOR
from scoring.state import ClusterState
from scoring.workload import WorkloadModel
from tests.conftest import gpu_node

SHORT: TaskKey = (1, 250, 1000, 4096, ANY_MODEL_MASK, 0)
LONG: TaskKey = (8, 1000, 64_000, 262_144, ANY_MODEL_MASK, 0)


def model(learning: Learning) -> WorkloadModel:
    wl = WorkloadModel()
    wl.set_prior(NO_PRIOR, [8])
    wl.set_learning(learning)
    return wl


def popularity(wl: WorkloadModel, key: TaskKey) -> float:
    tasks = wl.task_types()
    assert tasks is not None
    for row in range(tasks.count.shape[0]):
        got = (int(tasks.gpu_count[row]), int(tasks.gpu_milli[row]), int(tasks.cpu_milli[row]),
               int(tasks.memory_mib[row]))
        if got == key[:4]:
            return float(tasks.popularity[row])
    return 0.0


def test_the_running_count_over_represents_long_lived_pods_the_arrivals_do_not() -> None:
    # 90 short pods arrive and leave at once; 10 long ones arrive and stay. The running count
    # holds the 10 long ones only; the arrivals (a half-life far longer than 100 arrivals:
    # weights within 2 ** (100 / 2 ** 20) of each other) count 90 short for 10 long.
    running, arrivals = model(Learning("running", 1 << 20)), model(Learning("arrivals", 1 << 20))
    for wl in (running, arrivals):
        for _ in range(90):
            wl.arrive(SHORT)
            wl.add(SHORT, 1)
            wl.add(SHORT, -1)
            wl.depart()
        for _ in range(10):
            wl.arrive(LONG)
            wl.add(LONG, 1)
    assert popularity(running, LONG) == 1.0
    assert popularity(arrivals, LONG) == pytest.approx(0.1, abs=1e-4)
    assert popularity(arrivals, SHORT) == pytest.approx(0.9, abs=1e-4)


def test_an_arrival_weighs_half_after_one_half_life() -> None:
    # Half-life 4 arrivals: 4 LONG then 4 SHORT. Weights of arrival n: 2 ** (n / 4); relative to
    # the newest (n = 8): LONG 2**(-7/4) + 2**(-6/4) + 2**(-5/4) + 2**(-4/4) = 0.2973 + 0.3536
    # + 0.4204 + 0.5 = 1.5713, SHORT 2**(-3/4) + 2**(-2/4) + 2**(-1/4) + 1 = 0.5946 + 0.7071 +
    # 0.8409 + 1 = 3.1426 (twice as much: they are one half-life younger). In 1/64 pod:
    # round(1.5713 * 64) = 101 and round(3.1426 * 64) = 201.
    wl = model(Learning("arrivals", 4))
    for key in [LONG] * 4 + [SHORT] * 4:
        wl.arrive(key)
    tasks = wl.task_types()
    assert tasks is not None
    assert sorted(tasks.count.tolist()) == [101, 201]
    assert popularity(wl, SHORT) == pytest.approx(201 / 302)


def test_a_waiting_pod_counts_as_a_fresh_arrival_while_it_waits() -> None:
    # Half-life 1: of 3 LONG arrivals only the newest weighs 1 (then 1/2, 1/4): 1.75 pods, 112
    # units. One SHORT waiting adds one pod, 64 units, as long as it waits, whatever its age.
    wl = model(Learning("arrivals", 1))
    for _ in range(3):
        wl.arrive(LONG)
    wl.add(SHORT, 1, pending=True)
    tasks = wl.task_types()
    assert tasks is not None
    assert sorted(tasks.count.tolist()) == [ARRIVAL_UNITS, 112]
    wl.add(SHORT, -1, pending=True)
    assert popularity(wl, SHORT) == 0.0


def test_churn_is_departures_over_arrivals() -> None:
    wl = model(Learning("running", 1 << 20))
    assert wl.churn() == 0.0  # nothing arrived
    for _ in range(100):
        wl.arrive(SHORT)
    assert wl.churn() == 0.0  # pods that never leave: an arrivals-only cluster
    for _ in range(50):
        wl.depart()
    assert wl.churn() == pytest.approx(0.5, abs=1e-4)
    for _ in range(80):
        wl.depart()
    assert wl.churn() == 1.0  # clipped


def test_the_history_survives_a_rebuild_with_model_ids_moved() -> None:
    # A state rebuilt with a new node of a new model ahead of the old one (models are numbered
    # in node order): T4 was id 0, is id 1 now.
    old = ClusterState.from_nodes([gpu_node("b", 2, model="T4")])
    new = ClusterState.from_nodes([gpu_node("a", 2, model="A10"), gpu_node("b", 2, model="T4")])
    assert old.models == ["T4"] and new.models == ["A10", "T4"]
    t4_only: TaskKey = (1, 500, 0, 0, 1, 0)  # bit 0: T4 in the old state
    old.workload.set_learning(Learning("arrivals", 64))
    old.workload.arrive(t4_only)
    old.workload.depart()
    new.workload.carry_history(old.workload, lambda m: new.model_mask_from(m, old.models))
    assert new.workload.learning == Learning("arrivals", 64)
    assert new.workload.churn() == 1.0
    tasks = new.workload.task_types()
    assert tasks is not None and tasks.model_mask is not None
    assert tasks.model_mask.tolist() == [0b10]  # T4 is bit 1 now


def test_learning_validation() -> None:
    with pytest.raises(ValueError, match="learn_from"):
        Learning("survivors")
    with pytest.raises(ValueError, match="half_life_pods"):
        Learning("arrivals", 0)


def same_types(a: TaskTypes | None, b: TaskTypes | None) -> bool:
    assert a is not None and b is not None
    return a.demand == b.demand and all(np.array_equal(getattr(a, f), getattr(b, f)) for f in (
        "gpu_count", "gpu_milli", "cpu_milli", "memory_mib", "count"))


def test_a_pod_placed_from_waiting_keeps_the_running_task_types_object() -> None:
    # Between two filters the extender moves the bound pod from waiting to placed: the counts
    # net to nothing, so the task types are the same object (the incremental scorer's terms
    # and the strategies' memos stay valid) and not computed again.
    wl = model(Learning("running", 64))
    for _ in range(3):
        wl.add(SHORT, 1, pending=True)
    wl.add(LONG, 1)
    first = wl.task_types()
    wl.add(SHORT, -1, pending=True)
    wl.add(SHORT, 1)
    assert wl.task_types() is first
    wl.add(LONG, -1)  # a real change: computed anew
    second = wl.task_types()
    assert second is not first and not same_types(second, first)
    wl.add(LONG, 1)
    wl.add(LONG, -1)  # back and forth: nothing netted
    assert wl.task_types() is second


def test_an_uncount_below_zero_is_not_read_as_netting_to_nothing() -> None:
    # Uncounting a type never counted is clamped to nothing; counting it afterwards is a change.
    wl = model(Learning("running", 64))
    wl.add(LONG, 1)
    first = wl.task_types()
    wl.add(SHORT, -1)
    wl.add(SHORT, 1)
    fresh = model(Learning("running", 64))
    fresh.add(LONG, 1)
    fresh.add(SHORT, 1)
    got = wl.task_types()
    assert got is not first and same_types(got, fresh.task_types())


def test_the_arrival_mix_is_computed_anew_on_every_count() -> None:
    # Learning from arrivals reads the waiting pods too: moving one to placed is a change there.
    wl = model(Learning("arrivals", 64))
    wl.arrive(SHORT)
    wl.add(SHORT, 1, pending=True)
    first = wl.task_types()
    wl.add(SHORT, -1, pending=True)
    wl.add(SHORT, 1)
    assert wl.task_types() is not first
