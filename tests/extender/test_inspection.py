"""``gpufrac inspect`` from API objects: over-committed GPUs and unreadable pods are shown."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from extender import inspection
from podspec import annotations as ann
from podspec.pods import allocation_annotations
from tests.conftest import pod_json

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)


def node(name: str) -> dict[str, Any]:
    inv = ann.NodeInventory(node=name, heartbeat=NOW, gpus=[
        ann.GpuInventory(index=0, uuid=f"GPU-{name}-0", model="T4", memory_mib=16384, replicas=2)])
    return {"metadata": {"name": name, "annotations": {ann.INVENTORY: ann.dump_inventory(inv)}},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}}


def bound(name: str, milli: int, mib: int, qos: str = "burstable") -> dict[str, Any]:
    record = allocation_annotations(["GPU-n-0"], milli, [mib], NOW)
    return pod_json(name, node="n", phase="Running", annotations={**record, ann.QOS: qos})


def test_a_gpu_holding_more_than_it_has_is_flagged_and_unreadable_pods_are_listed() -> None:
    # 600 + 600 reserved milli on one GPU: no allocation gpufrac makes, so a forged record.
    pods = [bound("a", 600, 4096), bound("b", 600, 4096),
            pod_json("poison", annotations={ann.FRACTION: "1e-1000030"}),
            pod_json("cpu-only", gpus=None, cpu="bogus")]  # not gpufrac's business: not listed
    (report,) = inspection.gather([node("n")], pods, stale_after_s=60, now=NOW)
    (gpu,) = report.gpus
    assert (gpu.share_used_milli, gpu.reserved_milli, gpu.overcommitted) == (1200, 1200, True)
    assert gpu.as_dict()["overcommitted"] is True
    rejected = inspection.rejected_pods(pods)
    assert [key for key, _ in rejected] == ["default/poison"]
    table = inspection.render_table([report], rejected)
    assert "T4 OVERCOMMIT" in table and "default/poison: gpufrac.io/fraction" in table


def test_best_effort_share_past_the_gpu_is_not_an_overcommit() -> None:
    # 1000 burstable + 500 best-effort: best-effort is squeezed, not reserved (QoSPolicy).
    (report,) = inspection.gather([node("n")], [bound("a", 1000, 8192), bound("b", 500, 4096, "best-effort")],
                                  stale_after_s=60, now=NOW)
    assert report.gpus[0].reserved_milli == 1000 and not report.gpus[0].overcommitted
