"""Pods that use each field gpufrac reads of a Pod, one or two at a time: the protobuf pod
watch must read each as the JSON one does (``tests/extender/cluster/test_protobuf_watch.py``
on ``json_format``'s encoding, ``tests/e2e/test_protobuf_watch.py`` on the API server's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from podspec import annotations as ann
from tests.conftest import pod_json


def variants() -> list[dict[str, Any]]:
    """Pods that use each field ``pod_fields`` carries, one or two at a time."""
    base = pod_json("p", annotations={ann.FRACTION: "0.25"})
    out = [base, pod_json("cpu-only", gpus=None), pod_json("two", gpus=2, cpu="250m", memory="512Mi"),
           pod_json("bound", node="n1", phase="Running", annotations={
               ann.ASSIGNED_GPUS: "GPU-a", ann.ASSIGNED_FRACTION: "0.5", ann.ASSIGNED_MEMORY: "8192Mi",
               ann.ASSIGNED_AT: "2026-11-29T20:41:41Z"}),
           pod_json("done", node="n1", phase="Succeeded"),
           pod_json("mem", annotations={ann.MEMORY: "8Gi", ann.GPU_MODEL: "T4|A10", ann.QOS: "guaranteed"})]

    def with_(name: str, edit: Callable[[dict[str, Any]], None]) -> None:
        pod = pod_json(name, annotations={ann.FRACTION: "0.5"})
        edit(pod)
        out.append(pod)

    with_("init", lambda p: p["spec"].update(initContainers=[
        {"name": "i", "resources": {"limits": {"gpufrac.io/gpu": "1"}, "requests": {"cpu": "3", "memory": "4Gi"}}}]))
    with_("limits-only", lambda p: p["spec"]["containers"][0].update(
        resources={"limits": {"cpu": "2", "memory": "3Gi", "gpufrac.io/gpu": "1"}}))
    with_("priority", lambda p: p["spec"].update(priority=1000, schedulerName="gpufrac-scheduler"))
    with_("priority-0", lambda p: p["spec"].update(priority=0))
    with_("labels", lambda p: p["metadata"].update(labels={"app": "x"}, creationTimestamp="2026-11-29T20:41:41Z"))
    with_("epoch", lambda p: p["metadata"].update(creationTimestamp="1970-01-01T00:00:00Z"))
    with_("owned", lambda p: p["metadata"].update(ownerReferences=[
        {"apiVersion": "v1", "kind": "Node", "name": "x", "uid": "u0", "controller": False},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1", "controller": True}]))
    with_("owned-no-controller", lambda p: p["metadata"].update(ownerReferences=[
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1"}]))
    with_("selector", lambda p: p["spec"].update(nodeSelector={"zone": "a", "gpu": "t4"}))
    with_("node-affinity", lambda p: p["spec"].update(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}))
    with_("preferred-only", lambda p: p["spec"].update(affinity={"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}))
    with_("anti-affinity", lambda p: p["spec"].update(affinity={"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]}}))
    for when in ("ScheduleAnyway", "DoNotSchedule"):
        spread: list[dict[str, Any]] = [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": when}]

        def spreads(p: dict[str, Any], c: list[dict[str, Any]] = spread) -> None:
            p["spec"]["topologySpreadConstraints"] = c

        with_(f"spread-{when.lower()}", spreads)
    def claims(p: dict[str, Any]) -> None:
        p["spec"]["resourceClaims"] = [{"name": "a", "resourceClaimName": "claim-a"},
                                       {"name": "b", "resourceClaimTemplateName": "t"},
                                       {"name": "c", "resourceClaimTemplateName": "t"}]
        p["status"]["resourceClaimStatuses"] = [{"name": "b", "resourceClaimName": "made-b"}, {"name": "c"}]

    with_("claims", claims)
    return out
