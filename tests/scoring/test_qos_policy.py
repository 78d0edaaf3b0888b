"""QoS classes enforced by placement (``QoSPolicy`` in ``scoring.fit``), worked case by case.

One node, one GPU of 16384 MiB with 8 replica slots; the pods already there are listed as
(class, share milli). ``used`` is their total share, ``reserved`` the part not best-effort.
"""

from __future__ import annotations

import numpy as np
import pytest

from scoring.fit import Reason, fit
from scoring.request import PodRequest, QoSClass, QoSPolicy
from scoring.specs import Allocation, GpuSpec, NodeSpec
from scoring.state import ClusterState

G, B, BE = QoSClass.GUARANTEED, QoSClass.BURSTABLE, QoSClass.BEST_EFFORT
OVERSUB = QoSPolicy(best_effort_cap_milli=1500)
ISOLATED = QoSPolicy(isolate_guaranteed=True, best_effort_cap_milli=1500)


def one_gpu(held: list[tuple[QoSClass, int]], nvml_used_mib: int = 0) -> ClusterState:
    st = ClusterState.from_nodes([NodeSpec("n0", 64000, 262144, (
        GpuSpec(0, "GPU-0", "T4", 16384, 8, True, nvml_used_mib),))])
    for qos, milli in held:
        st.apply(Allocation("n0", (0,), milli, (milli * 16384 // 4000,), qos, 0, 0))
    return st


CASES = [
    # (held, pod class, pod share, policy, expected reason)
    # guaranteed never oversubscribed: used 600 + 500 = 1100 > 1000
    ([(B, 600)], G, 500, OVERSUB, Reason.INSUFFICIENT_GPU_SHARE),
    # used 600 + 400 = 1000: fits exactly
    ([(B, 600)], G, 400, OVERSUB, Reason.FITS),
    # best-effort borrowed: used 700 + 300 = 1000 for G is fine without isolation...
    ([(BE, 700)], G, 300, OVERSUB, Reason.FITS),
    # ...and refused with isolation, whatever the share
    ([(BE, 100)], G, 100, ISOLATED, Reason.QOS_ISOLATION),
    # best-effort oversubscribes up to 1500: used 1000 + 500 = 1500
    ([(B, 1000)], BE, 500, OVERSUB, Reason.FITS),
    # 1000 + 501 = 1501 > 1500
    ([(B, 1000)], BE, 501, OVERSUB, Reason.INSUFFICIENT_GPU_SHARE),
    # without oversubscription (cap 1000): 1000 + 1 > 1000
    ([(B, 1000)], BE, 1, QoSPolicy(), Reason.INSUFFICIENT_GPU_SHARE),
    # a guaranteed pod's GPU is never oversubscribed: cap falls back to 1000 (900 + 200 > 1000)
    ([(G, 900)], BE, 200, OVERSUB, Reason.INSUFFICIENT_GPU_SHARE),
    # isolation keeps best-effort off a guaranteed pod's GPU even with room (100 + 100)
    ([(G, 100)], BE, 100, ISOLATED, Reason.QOS_ISOLATION),
    # burstable reserves share: reserved 600 + 400 = 1000 fits although used is 600+500+400 = 1500
    ([(B, 600), (BE, 500)], B, 400, OVERSUB, Reason.FITS),
    # reserved 600 + 401 = 1001 > 1000
    ([(B, 600), (BE, 300)], B, 401, OVERSUB, Reason.INSUFFICIENT_GPU_SHARE),
    # burstable on a guaranteed pod's GPU: used 500 + 300 (best-effort) + 300 = 1100 > 1000
    ([(G, 500), (BE, 300)], B, 300, QoSPolicy(), Reason.INSUFFICIENT_GPU_SHARE),
    # burstable may share with anyone, isolation or not
    ([(G, 300), (BE, 300)], B, 300, ISOLATED, Reason.FITS),
]


@pytest.mark.parametrize(("held", "qos", "milli", "policy", "expected"), CASES)
def test_share_rules(held: list[tuple[QoSClass, int]], qos: QoSClass, milli: int, policy: QoSPolicy,
                     expected: Reason) -> None:
    st = one_gpu(held)
    ctx = fit(st, PodRequest(1, milli, qos=qos), np.array([0]), policy)
    assert Reason(int(ctx.reason[0])) == expected


def test_guaranteed_memory_counts_what_nvml_sees() -> None:
    # allocated 2048 MiB (a 500-milli pod at 16384 // 4000 per milli), NVML sees 12000 MiB used:
    # guaranteed needs 8192 MiB; 16384 - max(2048, 12000) = 4384 < 8192 -> refused;
    st = one_gpu([(B, 500)], nvml_used_mib=12000)
    need = PodRequest(1, 500, gpu_memory_mib=8192, qos=G)
    assert Reason(int(fit(st, need, np.array([0])).reason[0])) == Reason.INSUFFICIENT_GPU_MEMORY
    # burstable reserves share only: 16384 - 2048 = 14336 >= 8192 -> fits
    assert fit(st, PodRequest(1, 500, gpu_memory_mib=8192, qos=B), np.array([0])).node_fits[0]
    # with NVML at 2000 MiB (below the allocation), guaranteed fits too: 16384 - 2048 >= 8192
    assert fit(one_gpu([(B, 500)], nvml_used_mib=2000), need, np.array([0])).node_fits[0]


def test_oversubscribed_free_share_is_clipped_for_the_strategies() -> None:
    st = one_gpu([(B, 900), (BE, 400)])  # used 1300
    assert int(st.gpu_used_milli[0, 0]) == 1300
    assert int(st.gpu_best_effort_milli[0, 0]) == 400
    assert int(st.gpu_free_milli[0, 0]) == 0
    st.apply(Allocation("n0", (0,), 400, (400 * 16384 // 4000,), BE, 0, 0), sign=-1)
    assert (int(st.gpu_used_milli[0, 0]), int(st.gpu_free_milli[0, 0])) == (900, 100)
    assert int(st.gpu_best_effort_milli[0, 0]) == 0
