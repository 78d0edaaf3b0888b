"""Two fenced gpufrac replicas allocating ResourceClaims at once, on the real control plane.

Each replica is a pair: a gpufrac with ``--fence-namespace`` and ``--allocate-claims``, and a
real kube-scheduler whose profile leaves claims to gpufrac (no DynamicResources plugin, as
the chart renders it with ``extender.allocateClaims``), leader election off: both schedule the
same pods at once, each gpufrac deciding from a cache the other's binds and claim writes
reach late. The fence and the claim book must never let them allocate one share twice.
"""

from __future__ import annotations

import re

import pytest
from kubernetes import client

from harness.invariants import check_invariants
from harness.processes import LOOPBACK, Proc, free_port
from podspec.claims import DRIVER
from tests.e2e.conftest import Cluster, unique
from tests.e2e.helpers import gpu_pod, make_nodes, new_namespace, race_pairs
from tests.e2e.test_dra_node_e2e import RESOURCE, allocating_scheduler_config

pytestmark = pytest.mark.e2e

CLAIM_PODS, ANNOTATION_PODS, NODES = 200, 20, 14
"""220 quarter-GPU pods onto 14 nodes of 4 GPUs (224 quarters): 200 claims, 20 annotation pods."""


def start_pair(cl: Cluster, fence_ns: str, name: str, profile: str) -> tuple[Proc, Proc]:
    port = free_port()
    gpufrac = cl.cp.start_gpufrac(port, name=f"gpufrac-{name}", extra=[
        "--inventory-stale-after-s", "600", "--fence-namespace", fence_ns, "--allocate-claims",
        "--log-level", "info"])  # each allocation logged: a violation names who allocated what
    sched = cl.cp.start_scheduler(f"http://{LOOPBACK}:{port}", name=f"kube-scheduler-{name}", qps=200,
                                  profile=profile, config=allocating_scheduler_config(cl.cp.workdir))
    return gpufrac, sched


def claim_pod(name: str, group: str, profile: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": profile, "nodeSelector": {"gpufrac.io/test-group": group},
                     "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                                                   "claims": [{"name": "gpu"}]}}]}}


def test_two_replicas_allocating_200_claims_at_once_never_overcommit(cluster: Cluster) -> None:
    cl = cluster
    objects = client.CustomObjectsApi(cl.api.api_client)
    group, ns, fence_ns = unique("dra-race"), new_namespace(cl.api, unique("dra-race")), new_namespace(
        cl.api, unique("fence"))
    make_nodes(cl.api, group, NODES, gpus=4, replicas=4)
    profile = unique("gpufrac-dra-race")
    pairs = [start_pair(cl, fence_ns, n, profile) for n in ("r1", "r2")]

    def create() -> None:
        for i in range(CLAIM_PODS):
            objects.create_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": f"c{i:03d}"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": DRIVER, "capacity": {"requests": {"share": "250"}}}}]}}})
        claimed = iter(range(CLAIM_PODS))
        for i in range(CLAIM_PODS + ANNOTATION_PODS):
            if i % 11 == 10:  # every eleventh an annotation pod, the rest claim pods, in one stream
                cl.api.create_namespaced_pod(ns, gpu_pod(f"a{i:03d}", group, fraction="0.25", scheduler=profile))
            else:
                cl.api.create_namespaced_pod(ns, claim_pod(f"c{next(claimed):03d}", group, profile))
    race_pairs(cl.api, ns, pairs, create, CLAIM_PODS + ANNOTATION_PODS, 300)
    claims = objects.list_namespaced_custom_object(*RESOURCE, ns, "resourceclaims")["items"]
    pods = {p.metadata.name: p for p in cl.api.list_namespaced_pod(ns).items}
    assert len(claims) == CLAIM_PODS
    for c in claims:
        name = c["metadata"]["name"]
        [result] = c["status"]["allocation"]["devices"]["results"]  # allocated once
        assert (result["driver"], result["pool"]) == (DRIVER, pods[name].spec.node_name), (name, result)
        assert [r["uid"] for r in c["status"]["reservedFor"]] == [pods[name].metadata.uid]
        assert "gpufrac.io/assigned-gpus" not in (pods[name].metadata.annotations or {})
    # Per GPU: claims' consumedCapacity plus annotation pods' shares <= 1000, replica slots kept.
    violations = check_invariants(cl.api, claims)
    gpus = set(re.findall(r"GPU (\S+) on ", " ".join(violations)))
    assert violations == [], [*violations, *(f"{g.name}: {line}" for g, _ in pairs
                                            for line in g.log.read_text(errors="replace").splitlines()
                                            if any(u in line for u in gpus))]
    logs = "".join(sched.log.read_text(errors="replace") for _, sched in pairs)
    print(f"\nclaims raced: {logs.count('another gpufrac instance bound there first')} binds refused by the fence, "
          f"{logs.count('claim watch has not shown allocated yet')} waiting for a claim watch")
