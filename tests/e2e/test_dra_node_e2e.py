"""gpufrac's DRA driver on a real kubelet + containerd node: registration, prepare with CDI.

The agent runs as the DRA driver ``gpu.gpufrac.io`` (``--dra-driver``, fake NVML: two 24 GiB
A10s) and as the device plugin beside the real kubelet of ``harness/node.py``: it publishes the
ResourceSlice, registers in kubelet's plugin registry and prepares claims with CDI specs that
containerd applies. Claims are allocated by kube-scheduler's own DRA allocator (the
DynamicResources plugin of the session's kube-scheduler profile); gpufrac does not choose the
device of a claim yet (docs/dra.md), but with ``--resource-claims`` counts what claims hold in
the book its annotation pods are placed by. What each container got is read back with
``kubectl logs``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.utils.quantity import parse_quantity

from agent.dra.kubelet_plugin import cdi_spec_path
from agent.dra.slice import slice_name
from harness.helm import helm
from harness.node import BUSYBOX_IMAGE, DEVICE_PLUGIN_DIR, NODE_NAME, NOT_READY_TOLERATION, RealNode
from harness.processes import Proc, start, wait_until
from podspec.claims import DRIVER
from tests.e2e.conftest import Cluster, unique
from tests.e2e.helpers import SCHEDULER, new_namespace

pytestmark = pytest.mark.e2e

GPUS, GPU_MIB = 2, 24576
DEVICE_CLASS = "gpu.gpufrac.io"
RESOURCE = ("resource.k8s.io", "v1")
ROOT = Path(__file__).resolve().parents[2]
ALLOCATE_CLAIMS_PLUGINS = {"multiPoint": {"disabled": [{"name": "DynamicResources"}]}}
"""What the chart's profile says with ``extender.allocateClaims``."""


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[RealNode]:
    real = RealNode.up(cluster.cp)
    yield real
    cluster.cp.kubectl("delete", "pods", "--all-namespaces", "--field-selector", f"spec.nodeName={NODE_NAME}",
                       "--grace-period=0", "--force", "--wait=false", check=False)
    real.down()
    cluster.cp.kubectl("delete", "node", NODE_NAME, "--wait=false", check=False)
    cluster.wait(lambda: not any(a["node"] == NODE_NAME for a in cluster.allocations()), 60,
                 "the real node's pods gone from gpufrac")


def start_agent(cluster: Cluster, node: RealNode, fake_gpus: str, name: str = "gpufrac-dra-agent") -> Proc:
    """The agent as the DRA driver and the device plugin on the real node, its GPUs the fake
    NVML config ``fake_gpus`` (YAML)."""
    fake = node.workdir / f"{name}-gpus.yaml"
    fake.write_text(fake_gpus)
    mps = node.workdir / "dra-mps-pipe"
    mps.mkdir(exist_ok=True)
    (mps / "control").write_text("")  # stands for the MPS control daemon's pipe
    return cluster.cp.track(start(name, [
        sys.executable, "-m", "agent", "--node-name", NODE_NAME, "--kubeconfig", str(cluster.cp.admin_kubeconfig),
        "--nvml", "fake", "--fake-config", str(fake), "--replicas", "4", "--heartbeat-s", "5",
        "--min-interval-s", "1", "--plugin-dir", str(DEVICE_PLUGIN_DIR), "--dra-driver",
        "--dra-registry-dir", str(node.plugins_registry), "--dra-plugin-dir", str(node.workdir / "dra-plugin"),
        "--cdi-dir", str(node.cdi_dir), "--mps-pipe-dir", str(mps), "--metrics-port", "0",
        "--log-level", "info"], node.workdir))


@pytest.fixture(scope="module")
def driver(cluster: Cluster, node: RealNode) -> Iterator[Proc]:
    """The agent as the DRA driver and the device plugin, and the DeviceClass that selects it."""
    proc = start_agent(cluster, node, f"gpus:\n- {{name: NVIDIA A10, memory_mib: {GPU_MIB}, count: {GPUS}}}\n")
    objects = client.CustomObjectsApi(cluster.api.api_client)
    # The DeviceClass as the chart ships it with agent.draDriver on.
    rendered = helm("template", "gpufrac", str(ROOT / "deploy/helm/gpufrac"), "--namespace", "gpufrac-system",
                    "--kube-version", "1.36.3", "--set", "agent.draDriver=true",
                    "--show-only", "templates/dra.yaml").stdout
    (device_class,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "DeviceClass"]
    assert device_class["metadata"]["name"] == DEVICE_CLASS
    objects.create_cluster_custom_object(*RESOURCE, "deviceclasses", device_class)
    yield proc
    objects.delete_cluster_custom_object(*RESOURCE, "deviceclasses", DEVICE_CLASS)
    proc.stop()


@pytest.fixture(scope="module")
def claim_controller(cluster: Cluster) -> Iterator[Proc]:
    """kube-controller-manager's resourceclaim controller alone (the session's other tests
    expect no other controller): it makes pods' claims from templates, deallocates a claim
    whose pod is gone and lifts its finalizer when it is deleted."""
    proc = cluster.cp.start_controller_manager(only=["resourceclaim-controller"])
    yield proc
    proc.stop()


def clean_up(cluster: Cluster, ns: str) -> None:
    """Delete the namespace's pods and claims and wait until its claims are gone, so that the
    next test finds the GPUs free (no namespace controller runs: the namespace stays)."""
    objects = client.CustomObjectsApi(cluster.api.api_client)
    cluster.api.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    objects.delete_collection_namespaced_custom_object(*RESOURCE, ns, "resourceclaims")
    wait_until(lambda: not objects.list_namespaced_custom_object(*RESOURCE, ns, "resourceclaims")["items"], 120,
               f"the claims of {ns} deleted")


def claim(name: str, share_milli: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DEVICE_CLASS, "capacity": {"requests": {"share": str(share_milli)}}}}]}}}


def pod(name: str, claim_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            # Pinned to the real node: fake nodes of other modules may publish slices of the
            # driver too (test_dra_e2e's), and nothing runs a pod there.
            "spec": {"schedulerName": SCHEDULER, "hostNetwork": True, "tolerations": [NOT_READY_TOLERATION],
                     "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
                     "terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
                     "automountServiceAccountToken": False,
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                     "containers": [{"name": "c", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["/bin/sh", "-c", "env | sort; echo END-OF-ENV; sleep 3600"],
                                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                                                   "claims": [{"name": "gpu"}]}}]}}


def env_of(cl: Cluster, ns: str, name: str) -> dict[str, str] | None:
    out = cl.cp.kubectl("logs", name, "-n", ns, check=False).stdout
    if "END-OF-ENV" not in out:
        return None
    return dict(line.split("=", 1) for line in out.split("END-OF-ENV")[0].splitlines() if "=" in line)


def read_claim(objects: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = objects.get_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", name)
        return found
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_claims_for_shares_of_a_gpu_are_prepared_with_cdi_and_released(cluster: Cluster, node: RealNode,
                                                                        driver: Proc, claim_controller: Proc) -> None:
    objects = client.CustomObjectsApi(cluster.api.api_client)
    wait_until(lambda: "registered with kubelet as DRA driver gpu.gpufrac.io" in driver.tail(100_000), 60,
               "kubelet registering the DRA driver", driver)

    def published() -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = objects.get_cluster_custom_object(*RESOURCE, "resourceslices", slice_name(NODE_NAME))
            return got if len(got["spec"]["devices"]) == GPUS else None
        except ApiException:
            return None
    wait_until(published, 60, "the driver's ResourceSlice (kubelet wipes a node's slices when it starts)", driver)
    ns = new_namespace(cluster.api, unique("dra-node"))
    shares = {"quarter": 250, "half": 500, "quarter-2": 250}
    for name, share in shares.items():
        objects.create_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", claim(name, share))
        cluster.api.create_namespaced_pod(ns, pod(name, name))

    envs = {name: wait_until(lambda name=name: env_of(cluster, ns, name), 120, f"pod {name} running with its env",
                             driver) for name in shares}
    used: dict[str, int] = {}
    for name, share in shares.items():
        got = read_claim(objects, ns, name)
        assert got is not None
        [result] = got["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["request"]) == (DRIVER, NODE_NAME, "gpu")
        assert parse_quantity(result["consumedCapacity"]["share"]) == share
        used[result["device"]] = used.get(result["device"], 0) + share
        index = int(result["device"].removeprefix("gpu-"))
        # What the CDI spec gave the container: the allocated GPU, MPS limits of its share.
        env = envs[name]
        assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{NODE_NAME}-{index}", env
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(share // 10)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpufrac/mps"
        spec = json.loads(cdi_spec_path(node.cdi_dir, got["metadata"]["uid"]).read_text())
        assert spec["devices"][0]["name"] == f"{got['metadata']['uid']}-gpu"
    assert all(v <= 1000 for v in used.values()), used  # never over-committed

    # Deleting a pod: kubelet unprepares its claim, the CDI spec goes.
    uid = read_claim(objects, ns, "half")["metadata"]["uid"]  # type: ignore[index]
    cluster.api.delete_namespaced_pod("half", ns, grace_period_seconds=0)
    wait_until(lambda: not cdi_spec_path(node.cdi_dir, uid).exists(), 60, "the claim unprepared", driver)
    assert "unprepared claim" in driver.tail(100_000)
    clean_up(cluster, ns)


def test_the_shipped_claim_templates_are_accepted_and_select_by_model(cluster: Cluster, node: RealNode,
                                                                      driver: Proc, claim_controller: Proc) -> None:
    # deploy/dra/claim-templates.yaml as a user applies it: the API server keeps all three; a
    # pod of "whole-gpu" runs on a whole GPU (no MPS limit); one of "quarter-of-an-a100" finds
    # no device on this node of A10s and waits, with kube-scheduler's reason.
    # kube-controller-manager's resourceclaim controller makes each pod's claim from its template.
    objects = client.CustomObjectsApi(cluster.api.api_client)
    ns = new_namespace(cluster.api, unique("dra-templates"))
    templates = [d for d in yaml.safe_load_all((ROOT / "deploy/dra/claim-templates.yaml").read_text()) if d]
    for template in templates:
        objects.create_namespaced_custom_object(*RESOURCE, ns, "resourceclaimtemplates", template)
    assert {t["metadata"]["name"] for t in objects.list_namespaced_custom_object(
        *RESOURCE, ns, "resourceclaimtemplates")["items"]} == {"quarter-of-an-a100", "l4-8gib", "whole-gpu"}
    for name, template in (("whole", "whole-gpu"), ("a100", "quarter-of-an-a100")):
        body = pod(name, "")
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
        cluster.api.create_namespaced_pod(ns, body)
    env = wait_until(lambda: env_of(cluster, ns, "whole"), 120, "the whole-GPU pod running", driver)
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith(f"GPU-fake-{NODE_NAME}-")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env

    def refused() -> str | None:
        events = cluster.api.list_namespaced_event(ns, field_selector="involvedObject.name=a100").items
        found = [e.message for e in events if e.reason == "FailedScheduling"]
        return found[0] if found else None
    message = wait_until(refused, 60, "the A100 pod's FailedScheduling event", driver)
    assert "claim" in message, message
    assert cluster.api.read_namespaced_pod("a100", ns).spec.node_name is None
    clean_up(cluster, ns)


def annotation_pod(name: str, fraction: str) -> dict[str, Any]:
    """A pod of today's API (``gpufrac.io/gpu`` and the fraction annotation) for the real node."""
    body = pod(name, "")
    del body["spec"]["resourceClaims"]
    body["metadata"]["annotations"] = {"gpufrac.io/fraction": fraction}
    body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "10m", "memory": "16Mi"},
                                                 "limits": {"gpufrac.io/gpu": "1"}}
    return body


def claims_of_driver(objects: client.CustomObjectsApi) -> list[dict[str, Any]]:
    """Every allocated claim holding a device of the driver on the real node."""
    items = objects.list_cluster_custom_object(*RESOURCE, "resourceclaims")["items"]
    return [c for c in items if any(r["driver"] == DRIVER and r["pool"] == NODE_NAME for r in (
        ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []))]


def test_claims_and_annotation_pods_are_counted_in_one_book(cluster: Cluster, node: RealNode, driver: Proc,
                                                            claim_controller: Proc) -> None:
    # gpufrac with --resource-claims (as the chart runs it with agent.draDriver) behind the
    # session's kube-scheduler: what kube-scheduler's allocator gave claims is in gpufrac's
    # book, so an annotation pod never lands on a GPU claims filled; deleting a claim's pod
    # (kube-controller-manager's resourceclaim controller deallocates the claim) frees its
    # share in gpufrac too, and the next annotation pod may take it.
    objects = client.CustomObjectsApi(cluster.api.api_client)
    with gpufrac_with(cluster, objects, driver, ["--resource-claims"]):
        one_book(cluster, objects, driver)


@contextmanager
def gpufrac_with(cluster: Cluster, objects: client.CustomObjectsApi, driver: Proc, flags: list[str]) -> Iterator[None]:
    """The session's gpufrac restarted with ``flags`` for one test, once the device plugin's
    resource is on the node and no earlier test's claim is left; then restarted as it was."""
    wait_until(lambda: (cluster.api.read_node(NODE_NAME).status.allocatable or {}).get("gpufrac.io/gpu") == str(GPUS * 4),
               60, "the device plugin's gpufrac.io/gpu on the node", driver)
    assert not claims_of_driver(objects), "earlier tests' claims left allocated"
    cluster.gpufrac.stop()
    cluster.start_gpufrac(flags)
    try:
        yield
    finally:
        cluster.gpufrac.stop()
        cluster.start_gpufrac()


def one_book(cluster: Cluster, objects: client.CustomObjectsApi, driver: Proc) -> None:
    ns = new_namespace(cluster.api, unique("dra-book"))
    for name in ("a", "b"):
        objects.create_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", claim(name, 500))
        cluster.api.create_namespaced_pod(ns, pod(name, name))
    for name in ("a", "b"):
        wait_until(lambda name=name: env_of(cluster, ns, name), 120, f"claim pod {name} running", driver)
    claims = {n: read_claim(objects, ns, n) for n in ("a", "b")}

    def held_by_claims() -> dict[str, int]:
        """GPU UUID -> share the claims of this namespace hold, from their status."""
        held: dict[str, int] = {}
        for c in claims_of_driver(objects):
            if c["metadata"]["namespace"] == ns:
                for r in c["status"]["allocation"]["devices"]["results"]:
                    uuid = f"GPU-fake-{NODE_NAME}-{int(r['device'].removeprefix('gpu-'))}"
                    held[uuid] = held.get(uuid, 0) + int(parse_quantity(r["consumedCapacity"]["share"]))
        return held

    def book() -> dict[str, tuple[str, list[str], int, str]] | None:
        """gpufrac's records of this namespace's claims, by claim name, once both are there."""
        got = {a["name"].split("/")[1]: (a["node"], a["gpu_uuids"], a["gpu_milli"], a["overcommit"])
               for a in cluster.allocations() if a["uid"].startswith("resourceclaim/") and a["namespace"] == ns}
        return got if len(got) == len(claims) else None

    # gpufrac counts each claim where kube-scheduler's allocator put it, as its status says.
    counted = cluster.wait(book, 60, "gpufrac's records of the claims")
    for name, got in claims.items():
        assert got is not None
        [result] = got["status"]["allocation"]["devices"]["results"]
        uuid = f"GPU-fake-{NODE_NAME}-{int(result['device'].removeprefix('gpu-'))}"
        assert counted[name] == (NODE_NAME, [uuid], 500, ""), counted
    claim_shares = held_by_claims()
    assert sum(claim_shares.values()) == 1000

    # A whole-GPU annotation pod through gpufrac's profile: only a GPU no claim holds fits it.
    cluster.api.create_namespaced_pod(ns, annotation_pod("whole", "1"))
    env = wait_until(lambda: env_of(cluster, ns, "whole"), 120, "the whole-GPU annotation pod running", driver)
    whole_gpu = cluster.api.read_namespaced_pod("whole", ns).metadata.annotations["gpufrac.io/assigned-gpus"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == whole_gpu
    assert whole_gpu not in claim_shares, (whole_gpu, claim_shares)

    # A third claim of half a GPU: the claims leave the whole pod's GPU free in kube-scheduler's
    # view, so its allocator may take it; gpufrac refuses the node, saying why.
    objects.create_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", claim("c", 500))
    cluster.api.create_namespaced_pod(ns, pod("c", "c"))
    message = cluster.wait(lambda: next((e.message for e in cluster.api.list_namespaced_event(
        ns, field_selector="involvedObject.name=c,reason=FailedScheduling").items
        if "DRA allocator may take device" in e.message), None), 60, "gpufrac's refusal of pod c")
    assert whole_gpu in message, message
    assert (read_claim(objects, ns, "c") or {}).get("status", {}).get("allocation") is None

    # Deleting claim a's pod: the claim is deallocated and gpufrac frees its share. The whole
    # pod's GPU is still one the allocator may take (kube-scheduler's view of the claims may lag
    # gpufrac's: with first fit replayed, the allocator gave pod c that GPU here), so pod c runs
    # only once the whole pod is gone, and no GPU is over-committed.
    cluster.api.delete_namespaced_pod("a", ns, grace_period_seconds=0)
    cluster.wait(lambda: (read_claim(objects, ns, "a") or {}).get("status", {}).get("allocation") is None, 90,
                 "claim a deallocated once its pod is gone")
    cluster.wait(lambda: not any(a["name"] == "resourceclaim/a/gpu" and a["namespace"] == ns
                                 for a in cluster.allocations()), 60, "claim a's share freed in gpufrac")
    assert cluster.api.read_namespaced_pod("c", ns).spec.node_name is None
    cluster.api.delete_namespaced_pod("whole", ns, grace_period_seconds=0)
    env = wait_until(lambda: env_of(cluster, ns, "c"), 120, "claim pod c running", driver)
    now_held = held_by_claims()
    assert env["NVIDIA_VISIBLE_DEVICES"] in now_held and all(v <= 1000 for v in now_held.values()), now_held
    assert sum(now_held.values()) == 1000, now_held
    clean_up(cluster, ns)


DRA_PROFILE = "gpufrac-dra"
"""The profile of the kube-scheduler that leaves claims to gpufrac (``--allocate-claims``)."""


def allocating_scheduler_config(workdir: Path) -> Path:
    """The project's kube-scheduler configuration with the profile the chart renders for
    ``extender.allocateClaims``: no DynamicResources plugin (tests/deploy/test_helm_render.py
    checks the chart's profile against ``ALLOCATE_CLAIMS_PLUGINS``)."""
    cfg = yaml.safe_load((ROOT / "scheduler-config.yaml").read_text())
    cfg["profiles"][0]["plugins"] = ALLOCATE_CLAIMS_PLUGINS
    path = workdir / "scheduler-config-allocate-claims.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_gpufrac_allocates_claims_to_the_gpus_its_core_chooses(cluster: Cluster, node: RealNode, driver: Proc,
                                                               claim_controller: Proc) -> None:
    # gpufrac with --allocate-claims behind a kube-scheduler profile without DynamicResources:
    # a half-GPU annotation pod, then claims for 0.25 (a claim), 0.5 (from a template) and 0.25
    # of a GPU. gpufrac's core places each share on a GPU and writes it into the claim; the
    # agent prepares it (CDI); nothing is over-committed; deleting a pod frees its share.
    objects = client.CustomObjectsApi(cluster.api.api_client)
    with gpufrac_with(cluster, objects, driver, ["--allocate-claims"]):
        scheduler = cluster.cp.start_scheduler(cluster.url, name="kube-scheduler-dra", profile=DRA_PROFILE,
                                               config=allocating_scheduler_config(cluster.cp.workdir))
        try:
            allocated_by_gpufrac(cluster, objects, driver, scheduler)
        finally:
            scheduler.stop()


def allocated_by_gpufrac(cluster: Cluster, objects: client.CustomObjectsApi, driver: Proc, scheduler: Proc) -> None:
    ns = new_namespace(cluster.api, unique("dra-alloc"))
    cluster.api.create_namespaced_pod(ns, annotation_pod("annotated", "0.5"))
    wait_until(lambda: env_of(cluster, ns, "annotated"), 120, "the annotation pod running", driver)
    annotated = cluster.api.read_namespaced_pod("annotated", ns).metadata.annotations["gpufrac.io/assigned-gpus"]
    objects.create_namespaced_custom_object(*RESOURCE, ns, "resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "half"},
        "spec": {"spec": claim("unused", 500)["spec"]}})
    shares = {"a": 250, "b": 500, "c": 250}
    placed: dict[str, str] = {}
    for name, share in shares.items():
        body = pod(name, name)
        body["spec"]["schedulerName"] = DRA_PROFILE
        if name == "b":
            body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "half"}]
        else:
            objects.create_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", claim(name, share))
        cluster.api.create_namespaced_pod(ns, body)
        env = wait_until(lambda name=name: env_of(cluster, ns, name), 120, f"claim pod {name} running", driver)
        claim_name = name if name != "b" else cluster.api.read_namespaced_pod(
            name, ns).status.resource_claim_statuses[0].resource_claim_name
        got = read_claim(objects, ns, claim_name)
        assert got is not None
        [result] = got["status"]["allocation"]["devices"]["results"]
        uuid = f"GPU-fake-{NODE_NAME}-{int(result['device'].removeprefix('gpu-'))}"
        assert (result["driver"], result["pool"], result["request"]) == (DRIVER, NODE_NAME, "gpu")
        assert parse_quantity(result["consumedCapacity"]["share"]) == share and result["shareID"]
        assert got["status"]["reservedFor"] == [{"resource": "pods", "name": name,
                                                 "uid": cluster.api.read_namespaced_pod(name, ns).metadata.uid}]
        assert "resource.kubernetes.io/delete-protection" in got["metadata"]["finalizers"]
        # The GPU in the claim is the one gpufrac's book holds the share on, and the container's.
        [record] = [a for a in cluster.allocations() if a["name"] == f"resourceclaim/{claim_name}/gpu"]
        assert (record["node"], record["gpu_uuids"], record["gpu_milli"]) == (NODE_NAME, [uuid], share)
        assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(share // 10)
        # No memory asked (consumedCapacity 1Mi, the slice's default): the share's part of it.
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={GPU_MIB * share // 1000}M"
        pod_anns = cluster.api.read_namespaced_pod(name, ns).metadata.annotations or {}
        assert "gpufrac.io/assigned-gpus" not in pod_anns  # the claim is the record, counted once
        placed[name] = uuid
    # gpufrac's core packed the quarters beside the annotation pod and kept the other GPU for
    # the half: one GPU full, the other half used. (The DRA allocator's first fit does not
    # see the annotation pod: its first quarter would go to gpu-0 whichever GPU that is.)
    assert placed["a"] == placed["c"] == annotated != placed["b"], (placed, annotated)
    held: dict[str, int] = {}
    for a in cluster.allocations():
        if a["namespace"] == ns:
            for uuid, milli in zip(a["gpu_uuids"], a["held_milli"], strict=True):
                held[uuid] = held.get(uuid, 0) + milli
    assert held == {annotated: 1000, placed["b"]: 500}, held
    # gpufrac wrote the three claims (kube-scheduler's allocator is not in this profile).
    written = [line for line in cluster.gpufrac.tail(200_000).splitlines() if "allocated claim" in line]
    assert len([w for w in written if f"{ns}/" in w]) == 3, written

    # Deleting a claim pod: kube-controller-manager deallocates its claim, gpufrac frees the share.
    cluster.api.delete_namespaced_pod("a", ns, grace_period_seconds=0)
    cluster.wait(lambda: (read_claim(objects, ns, "a") or {}).get("status", {}).get("allocation") is None, 90,
                 "claim a deallocated once its pod is gone")
    cluster.wait(lambda: not any(a["name"] == "resourceclaim/a/gpu" for a in cluster.allocations()), 60,
                 "claim a's share freed in gpufrac")
    clean_up(cluster, ns)


def test_an_unhealthy_gpu_leaves_the_slice_and_gpufrac_allocates_it_no_claim(cluster: Cluster, node: RealNode,
                                                                             driver: Proc, claim_controller: Proc) -> None:
    # Last in the module: the agent is restarted with GPU 1 reporting XID 79 (fallen off the
    # bus). The slice keeps gpu-0 only; gpufrac, allocating claims, puts a 0.75 claim on GPU 0
    # and leaves a second one pending with its reason, though GPU 1 has all its share.
    objects = client.CustomObjectsApi(cluster.api.api_client)
    assert not claims_of_driver(objects), "earlier tests' claims left allocated"
    driver.stop()
    agent = start_agent(cluster, node, f"gpus:\n- {{name: NVIDIA A10, memory_mib: {GPU_MIB}, count: 1}}\n"
                                       f"- {{name: NVIDIA A10, memory_mib: {GPU_MIB}, count: 1, xid: 79}}\n",
                        name="gpufrac-dra-agent-xid")

    def devices() -> list[str] | None:
        try:
            got = objects.get_cluster_custom_object(*RESOURCE, "resourceslices", slice_name(NODE_NAME))
        except ApiException:
            return None
        names = [d["name"] for d in got["spec"]["devices"]]
        return names if names == ["gpu-0"] else None
    wait_until(devices, 90, "the slice without the unhealthy GPU", agent)
    cluster.gpufrac.stop()
    cluster.start_gpufrac(["--allocate-claims"])
    scheduler = cluster.cp.start_scheduler(cluster.url, name="kube-scheduler-dra-xid", profile=DRA_PROFILE,
                                           config=allocating_scheduler_config(cluster.cp.workdir))
    ns = new_namespace(cluster.api, unique("dra-xid"))
    try:
        for name in ("x", "y"):  # one after the other: which of two racing pods wins is not the point
            objects.create_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", claim(name, 750))
            body = pod(name, name)
            body["spec"]["schedulerName"] = DRA_PROFILE
            cluster.api.create_namespaced_pod(ns, body)
            if name == "x":
                env = wait_until(lambda: env_of(cluster, ns, "x"), 120, "claim pod x running", agent)
                assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{NODE_NAME}-0"
        message = cluster.wait(lambda: next((e.message for e in cluster.api.list_namespaced_event(
            ns, field_selector="involvedObject.name=y,reason=FailedScheduling").items if "gpufrac" in e.message),
            None), 60, "pod y's FailedScheduling from gpufrac")
        assert cluster.api.read_namespaced_pod("y", ns).spec.node_name is None, message
        assert (read_claim(objects, ns, "y") or {}).get("status", {}).get("allocation") is None
        assert not any(f"GPU-fake-{NODE_NAME}-1" in a["gpu_uuids"] for a in cluster.allocations()), cluster.allocations()
        # x gone (its claim deallocated by kube-controller-manager, freed in gpufrac's book):
        # gpufrac requeues y, which takes GPU 0 without waiting for kube-scheduler's flush.
        cluster.api.delete_namespaced_pod("x", ns, grace_period_seconds=0)
        env = wait_until(lambda: env_of(cluster, ns, "y"), 90, "claim pod y running once x is gone", agent)
        assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{NODE_NAME}-0"
    finally:
        scheduler.stop()
        clean_up(cluster, ns)
        cluster.gpufrac.stop()
        cluster.start_gpufrac()
        agent.stop()
