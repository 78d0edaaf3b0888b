"""Config validation with field paths; state bookkeeping; the fragmentation measure."""

from __future__ import annotations

import numpy as np
import pytest

from scoring.fit import Reason
from scoring.fragmentation import TaskTypes, fragmentation_rate, node_fragmentation_milli
from scoring.presets import PRESETS
from scoring.request import PodRequest, QoSClass
from scoring.scorer import ScoringConfig, build_scorer, validate_config
from scoring.specs import Allocation, GpuSpec, NodeSpec
from scoring.state import ClusterState
from tests.conftest import gpu_node


@pytest.mark.parametrize(("config", "message"), [
    (ScoringConfig({"nope": 1.0}), "scoring.weights.nope: unknown strategy"),
    (ScoringConfig({"spread": -1.0}), "scoring.weights.spread: must be a finite number >= 0, got -1.0"),
    (ScoringConfig({"spread": float("nan")}), "scoring.weights.spread: must be a finite number >= 0"),
    (ScoringConfig({"spread": True}), "scoring.weights.spread: must be a number"),
    (ScoringConfig({"spread": 0.0}), "scoring.weights: at least one weight must be > 0"),
    (ScoringConfig({"spread": 1.0}, {"gold": {"spread": 1.0}}), "scoring.qos_overrides.gold: unknown QoS class"),
    (ScoringConfig({"spread": 1.0}, {"best-effort": {"spread": 0.0}}),
     "scoring.qos_overrides.best-effort: at least one weight must be > 0"),
])
def test_invalid_config_names_the_field(config: ScoringConfig, message: str) -> None:
    errors = validate_config(config)
    assert any(message in e for e in errors), errors
    with pytest.raises(ValueError, match="scoring"):
        build_scorer(config)


def test_qos_override_changes_only_that_class() -> None:
    scorer = build_scorer(ScoringConfig({"node_packing": 1.0}, {"best-effort": {"spread": 2.0}}))
    assert scorer.weights(QoSClass.BURSTABLE) == {"node_packing": 1.0}
    assert scorer.weights(QoSClass.BEST_EFFORT) == {"node_packing": 1.0, "spread": 2.0}


def test_apply_and_release_round_trip() -> None:
    st = ClusterState.from_nodes([gpu_node("a", 2)])
    empty = st.copy()
    alloc = Allocation("a", (1,), 250, (4096,), QoSClass.BEST_EFFORT, 500, 1024)
    st.apply(alloc)
    assert st.gpu_used_milli.tolist() == [[0, 250]]
    assert st.gpu_qos_pods[0, 1].tolist() == [0, 0, 1]
    st.apply(alloc, sign=-1)
    for name in ("gpu_used_milli", "gpu_mem_used_mib", "gpu_pods", "gpu_qos_pods", "cpu_used_milli"):
        np.testing.assert_array_equal(getattr(st, name), getattr(empty, name))
    with pytest.raises(ValueError, match="does not hold"):
        st.apply(alloc, sign=-1)


def test_state_rejects_bad_inventory() -> None:
    with pytest.raises(ValueError, match="duplicate node names"):
        ClusterState.from_nodes([gpu_node("a", 1), gpu_node("a", 1)])
    with pytest.raises(ValueError, match="duplicate UUID"):
        ClusterState.from_nodes([NodeSpec("a", 1, 1, (GpuSpec(0, "u", "T4", 1), GpuSpec(1, "u", "T4", 1)))])
    with pytest.raises(ValueError, match="memory_mib must be > 0"):
        ClusterState.from_nodes([NodeSpec("a", 1, 1, (GpuSpec(0, "u", "T4", 0),))])


def test_gpu_index_gaps_map_to_columns() -> None:
    # NVML lost GPU 1: indices {0, 2} pack into columns 0 and 1, gpu_index maps back
    st = ClusterState.from_nodes([NodeSpec("a", 1, 1, (GpuSpec(0, "u0", "T4", 1), GpuSpec(2, "u2", "T4", 1)))])
    assert st.gpu_index.tolist() == [[0, 2]]


def test_mig_devices_of_one_gpu_share_its_index_and_are_columns_of_their_own() -> None:
    # The agent publishes a MIG GPU's devices under the GPU's index (the inventory allows it);
    # each is a placement unit, in inventory order, beside the node's whole GPUs.
    st = ClusterState.from_nodes([NodeSpec("a", 1, 1, (
        GpuSpec(0, "MIG-x", "A100 MIG 3g.40gb", 40960), GpuSpec(0, "MIG-y", "A100 MIG 3g.40gb", 40960),
        GpuSpec(1, "GPU-z", "A100", 81920)))])
    assert st.gpu_index.tolist() == [[0, 0, 1]]
    assert st.gpu_uuid == [["MIG-x", "MIG-y", "GPU-z"]]
    assert st.gpu_mem_total_mib.tolist() == [[40960, 40960, 81920]]


def test_pod_request_validation() -> None:
    with pytest.raises(ValueError, match="gpu_milli: must be 1000 when gpu_count > 1"):
        PodRequest(2, 500)
    with pytest.raises(ValueError, match="gpu_milli"):
        PodRequest(1, 0)


def test_fragmentation_worked_example() -> None:
    # one node, GPUs free 1000 and 300 milli; plenty of CPU and memory.
    # task A: 1 GPU x 500 milli (p = 0.5): GPU1 (300 < 500) is a fragment -> 300
    # task B: 2 whole GPUs (p = 0.5): only 1 GPU has 1000 free -> cannot run -> 1300
    # F = 0.5 * 300 + 0.5 * 1300 = 800 ; rate = 800 / 1300
    tasks = TaskTypes.from_counts(np.array([[1, 500, 0, 0], [2, 1000, 0, 0], [0, 1000, 8, 8]]))
    free = np.array([[1000, 300]])
    big = np.array([10**6])
    assert node_fragmentation_milli(free, big, big, tasks).tolist() == [800.0]
    assert fragmentation_rate(free, big, big, tasks) == pytest.approx(800 / 1300)
    # no CPU at all: neither task runs -> everything free is fragmented
    assert fragmentation_rate(free, np.array([0]), big, TaskTypes.from_counts(np.array([[1, 500, 1, 0]]))) == 1.0


def test_derived_arrays_track_allocations(rng: np.random.Generator) -> None:
    from tests.randstate import random_state

    oversubscribed = 0
    for _ in range(20):
        st = random_state(rng)
        # free share is clipped at 0 where best-effort pods oversubscribe a GPU
        np.testing.assert_array_equal(st.gpu_free_milli,
                                      np.where(st.gpu_exists, np.maximum(1000 - st.gpu_used_milli, 0), 0))
        assert (st.gpu_best_effort_milli <= st.gpu_used_milli).all()
        oversubscribed += int((st.gpu_used_milli > 1000).sum())
        np.testing.assert_array_equal(st.gpu_mem_free_mib, st.gpu_mem_total_mib - st.gpu_mem_used_mib)
        np.testing.assert_array_equal(st.gpu_slots_free, st.gpu_replicas - st.gpu_pods)
        np.testing.assert_array_equal(st.node_gpu_total_milli, 1000 * st.gpu_exists.sum(axis=1))
        np.testing.assert_array_equal(st.node_gpu_used_milli, st.gpu_used_milli.sum(axis=1))
    assert oversubscribed > 0  # the random states include best-effort oversubscription


@pytest.mark.parametrize("k", [1, 2])
def test_cluster_without_enough_gpu_columns_fails_every_node_without_crashing(k: int) -> None:
    # Nodes whose inventory has not arrived have no GPU columns at all (max_gpus = 0), or
    # fewer than the pod's k: every node is TOO_FEW_GPUS and nothing is chosen.
    nodes = [NodeSpec("cpu-only", 8000, 32768)] if k == 1 else [gpu_node("one-gpu", 1)]
    state = ClusterState.from_nodes(nodes)
    ev = build_scorer(PRESETS["default"]).evaluate(state, PodRequest(gpu_count=k, gpu_milli=1000),
                                                   np.arange(1))
    assert ev.reason.tolist() == [Reason.TOO_FEW_GPUS]
    assert ev.best() == -1 and ev.chosen_cols.tolist() == [[-1] * k]
