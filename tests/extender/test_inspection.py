"""``gpufrac inspect`` from API objects: over-committed GPUs and unreadable pods are shown."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from extender import inspection
from extender.admin_config import scoring_config
from extender.cache import GpuCache
from extender.cli import main
from podspec import annotations as ann
from podspec.nodes import node_observation
from podspec.pods import allocation_annotations, pod_intent
from scoring.scorer import build_scorer
from tests.conftest import pod_json
from tests.extender.helpers import LiveServer

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


# -- inspect --url: what a running gpufrac serves ------------------------------------------------

def test_inspect_url_shows_what_the_api_table_shows(capsys: pytest.CaptureFixture[str]) -> None:
    # The same nodes and bound pods, read two ways: from the API objects (gather) and from a
    # running standalone gpufrac's /nodes and /allocations (inspect --url): the same table.
    nodes = [node("n"), node("m")]
    pods = [bound("a", 500, 4096), bound("b", 250, 2048, "guaranteed")]
    cache = GpuCache(build_scorer(scoring_config("default")))
    cache.set_nodes([node_observation(n).spec(NOW, 180.0) for n in nodes])
    cache.set_pods([pod_intent(p) for p in pods])
    want = inspection.render_table(inspection.gather(nodes, pods, stale_after_s=1e9))
    with LiveServer(cache, mode="standalone") as srv:
        assert main(["inspect", "--url", srv.url]) == 0
        assert capsys.readouterr().out.rstrip("\n") == want
        assert main(["inspect", "--url", srv.url + "/", "--json", "-n", "default", "--node", "n"]) == 0
        (shown,) = json.loads(capsys.readouterr().out)
        assert [p["pod"] for p in shown["gpus"][0]["pods"]] == ["default/a", "default/b"]
        # No plan in standalone mode: the endpoint's own words, exit status 1, no traceback.
        with pytest.raises(SystemExit, match="HTTP 404: the defragmentation plan is made in cluster mode only"):
            main(["inspect", "--url", srv.url, "--defrag"])
        with pytest.raises(SystemExit, match="--tenant and --config read the API"):
            main(["inspect", "--url", srv.url, "--tenant", "t"])
    with pytest.raises(SystemExit, match=r"gpufrac inspect: http://127\.0\.0\.1:9/nodes: .*refused"):
        main(["inspect", "--url", "http://127.0.0.1:9"])


def test_a_body_that_is_not_gpufracs_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not what gpufrac's /nodes and /allocations serve"):
        inspection.served([{"name": "n"}], [])
    with pytest.raises(ValueError, match="not what gpufrac's"):
        inspection.served([{"name": "n", "ready": True, "gpus": []}], [{"gpu_uuids": ["x"]}])
