"""The protobuf pod watch on a real kube-apiserver (issue 55, item 1): the API server's own
protobuf encoding of each pod reads as its JSON does.

Every cluster-mode e2e test runs gpufrac's pod watch in protobuf as well; this one compares
the two encodings field by field on the pods of ``tests/pod_variants.py``. (A watch from a
compacted revision is not played here: the API server's watch cache serves old revisions
from memory, so etcd's compaction does not reach the watch; the ``ERROR`` event's decoding
is tested on its ``meta.v1.Status`` in ``tests/extender/cluster/test_protobuf_watch.py``.)
"""

from __future__ import annotations

import copy
import json
from functools import partial
from typing import Any

from kubernetes import client, config

from extender.cluster.protobuf_watch import KubeProtos, PodWatch
from harness.controlplane import ControlPlane
from harness.processes import wait_until
from podspec.pods import pod_intent
from tests.pod_variants import variants


def creatable(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A variant as a user would create it: an image, no uid or status (the server's)."""
    pod = copy.deepcopy(pod)
    meta = pod["metadata"]
    meta.pop("uid", None), meta.pop("creationTimestamp", None)
    meta["namespace"] = namespace
    for ref in meta.get("ownerReferences", []):
        ref["uid"] = f"{ref['uid']}-{meta['name']}"
    for key in ("containers", "initContainers"):
        for c in pod["spec"].get(key, []):
            c["image"] = "registry.k8s.io/pause:3.10"
    if pod["spec"].pop("priority", 0):  # the Priority admission plugin sets it from the class
        pod["spec"]["priorityClassName"] = PRIORITY_CLASS
    # No scheduler of the session's cluster takes them, and none is bound to its nodes: the
    # other e2e tests share this control plane and gpufrac's cache.
    pod["spec"]["schedulerName"] = "protobuf-watch-nobody"
    if "nodeName" in pod["spec"]:
        pod["spec"]["nodeName"] = "protobuf-watch-nowhere"
    pod.pop("status", None)
    return pod


PRIORITY_CLASS = "protobuf-watch-1000"
"""The class of the variant with a priority (``priority: 1000``)."""



def test_every_pod_reads_the_same_in_protobuf_as_in_json(control_plane: ControlPlane) -> None:
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(control_plane.admin_kubeconfig)))
    ns = "protobuf-watch"
    api.create_namespace({"metadata": {"name": ns}})
    client.SchedulingV1Api(api.api_client).create_priority_class(
        {"metadata": {"name": PRIORITY_CLASS}, "value": 1000})
    start = json.loads(api.list_namespaced_pod(ns, _preload_content=False).data)["metadata"]["resourceVersion"]
    try:
        compare_encodings(api, ns, start)
    finally:  # gone before the next test reads the cluster (no controller-manager empties namespaces)
        api.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        wait_until(lambda: not api.list_namespaced_pod(ns).items, 60, f"pods of {ns} deleted")
        api.delete_namespace(ns)
        client.SchedulingV1Api(api.api_client).delete_priority_class(PRIORITY_CLASS)


def compare_encodings(api: client.CoreV1Api, ns: str, start: str) -> None:
    pods = [creatable(p, ns) for p in variants()]
    for pod in pods:
        api.create_namespaced_pod(ns, pod)
    listed = {p["metadata"]["name"]: p for p in json.loads(api.list_namespaced_pod(ns, _preload_content=False).data)["items"]}
    assert len(listed) == len(pods)

    watched: dict[str, dict[str, Any]] = {}
    w = PodWatch(KubeProtos())
    for event in w.stream(partial(api.list_namespaced_pod, ns), resource_version=start, timeout_seconds=10,
                          _request_timeout=(10, 30)):
        assert event["type"] == "ADDED"
        watched[event["object"]["metadata"]["name"]] = event["object"]
        if len(watched) == len(pods):
            w.stop()
    assert watched.keys() == listed.keys()
    for name, obj in watched.items():
        assert pod_intent(obj) == pod_intent(listed[name]), name
    # The fields that only some variants set made it through the API server.
    intents = {name: pod_intent(obj) for name, obj in watched.items()}
    assert intents["owned"].controller == "ReplicaSet/rs" and intents["priority"].priority == 1000
    assert intents["selector"].node_selector == (("gpu", "t4"), ("zone", "a"))
    assert intents["node-affinity"].placement_rules and not intents["preferred-only"].placement_rules
    assert intents["spread-donotschedule"].placement_rules and not intents["spread-scheduleanyway"].placement_rules
    assert intents["claims"].resource_claims == ("claim-a", "", "") and intents["labels"].created_at
    assert intents["bound"].node_name == "protobuf-watch-nowhere" and intents["bound"].assigned_gpus == ("GPU-a",)
    assert intents["p"].scheduler_name == "protobuf-watch-nobody" and intents["p"].gpu_milli == 250

