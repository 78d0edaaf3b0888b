"""priced_stranding: worked tables (the arithmetic in the comments) and the reference."""

from __future__ import annotations

import numpy as np
import pytest

from scoring.fit import fit
from scoring.request import PodRequest, QoSClass
from scoring.specs import Allocation
from scoring.state import ClusterState
from scoring.strategies import priced_stranding
from tests.conftest import gpu_node
from tests.scoring.reference import _priced_stranding_score


def _state() -> ClusterState:
    # a: 2 GPUs, 64 cores, GPU0 holds a 700-milli pod (7 cores), GPU1 a 300 (3 cores).
    # b: 3 GPUs, 64 cores, GPU0 holds a 700 (7 cores). small: 1 GPU, 8 cores. lean: 1 GPU,
    # 4 cores. 7 GPUs. Workload {700: 2, 300: 1}: rho_cpu = (2 * 7000 + 3000) / 1700 = 10
    # CPU milli per milli-GPU; memory (1 GiB a pod, 256 GiB hosts) never binds.
    # gap_price's LP: share 1700 scaled to 7000, n_700 = 8.24 -> 1.05^43 = 8.15, n_300 = 4.12
    # -> 1.05^29 = 4.12; 4.12 GPUs of 700 + 300, 2.88 of lone 700s, 700s left over:
    # y_G = 700, y_700 = 0, y_300 = 300. U(300) = 300, U(700) = 0, U(1000) = 300, so
    # V(f) = f - U(f): V(0) = V(300) = 0, V(700) = V(1000) = 700.
    st = ClusterState.from_nodes([gpu_node("a", 2), gpu_node("b", 3), gpu_node("small", 1, cpu_milli=8000),
                                  gpu_node("lean", 1, cpu_milli=4000)])
    for node, col, milli, cpu in (("a", 0, 700, 7000), ("a", 1, 300, 3000), ("b", 0, 700, 7000)):
        st.apply(Allocation(node, (col,), milli, (0,), QoSClass.BURSTABLE, cpu, 1024))
    return st


def _chosen(st: ClusterState, cols: dict[int, int]) -> np.ndarray:
    chosen = np.zeros((st.n_nodes, st.max_gpus), dtype=bool)
    for row, col in cols.items():
        chosen[row, col] = True
    return chosen


@pytest.mark.parametrize(("milli", "cpu", "cols", "expected"), [
    # A 300-milli pod asking 8 cores:
    #   a (54 cores, GPU0 300 free): value V(300) + V(700) = 700 before and V(0) + V(700) =
    #     700 after; 5,400 and 4,600 milli served by CPU: nothing stranded -> 0.5
    #   b (57 cores): V(300) + 2 V(1000) = 1400 before and after, 5,700 / 4,900 served -> 0.5
    #   small (8 cores): V(1000) = 700 <= 800 served before; V(700) = 700 and 0 cores after:
    #     delta = 700 -> 0.5 - 700/2000 = 0.15
    #   lean (4 cores): the pod does not fit; stranding before 700 - 400 = 300, after 700 - 0:
    #     delta = 400 -> 0.3 (masked by the scorer)
    (300, 8000, {0: 0, 1: 0, 2: 0, 3: 0}, [0.5, 0.5, 0.15, 0.3]),
    # A 700-milli pod asking 1 core, on an empty GPU where there is one:
    #   small: 700 - 800 < 0 before; V(300) = 0 after -> 0.5
    #   lean: 700 - 400 = 300 stranded before, V(300) = 0 after: delta = -300 -> 0.65, the pod
    #     uses GPU share the node's CPU could not have served
    (700, 1000, {0: 1, 1: 1, 2: 0, 3: 0}, [0.5, 0.5, 0.5, 0.65]),
    # A 300-milli pod asking 1 core:
    #   small: after V(700) = 700, 7 cores serve 700 -> 0.5
    #   lean: after V(700) = 700, 3 cores serve 300: 400 stranded, 300 before -> 0.45
    (300, 1000, {0: 0, 1: 0, 2: 0, 3: 0}, [0.5, 0.5, 0.5, 0.45]),
])
def test_priced_stranding_worked_table(milli: int, cpu: int, cols: dict[int, int], expected: list[float]) -> None:
    st = _state()
    req = PodRequest(1, milli, gpu_memory_mib=0, cpu_milli=cpu)
    ctx = fit(st, req, np.arange(st.n_nodes))
    assert priced_stranding.host_per_milli(ctx)[0] == pytest.approx(10.0)
    chosen = _chosen(st, cols)
    score = priced_stranding.node_score(ctx, chosen)
    np.testing.assert_allclose(score, expected)
    ref = [_priced_stranding_score(st, r, req, (cols[r],)) for r in range(st.n_nodes)]
    np.testing.assert_allclose(ref, expected)


def test_priced_stranding_is_neutral_without_a_workload() -> None:
    st = ClusterState.from_nodes([gpu_node("small", 1, cpu_milli=8000)])
    ctx = fit(st, PodRequest(1, 300, cpu_milli=8000), np.arange(1))
    assert priced_stranding.node_score(ctx, _chosen(st, {0: 0})).tolist() == [0.5]
