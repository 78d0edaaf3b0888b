"""The node side against a real kubelet: the agent's device plugin, Allocate, kubelet restarts.

A real kubelet with containerd 2.x and runc (``harness/node.py``) joins the session's
control plane as node ``localhost``; the agent runs as it ships (``gpufrac agent``, fake
NVML backend of two 24 GiB GPUs, real gRPC, kubelet's real device-plugin socket). Pods are
scheduled by the session's gpufrac-scheduler, bound by gpufrac with their allocation, and
started by kubelet; what each container got is read back with ``kubectl logs``.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.node import BUSYBOX_IMAGE, DEVICE_PLUGIN_DIR, NODE_NAME, NOT_READY_TOLERATION, RealNode
from harness.processes import Proc, free_port, start, wait_until
from tests.e2e.conftest import Cluster, unique
from tests.e2e.helpers import SCHEDULER, new_namespace

pytestmark = pytest.mark.e2e

GPUS, REPLICAS, GPU_MIB = 2, 4, 24576
DEVICES_SENT = f"devices sent to kubelet, {GPUS * REPLICAS} healthy"  # agent log line: one ListAndWatch answer


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[RealNode]:
    """kubelet + containerd as node ``localhost``, for this module."""
    real = RealNode.up(cluster.cp)
    yield real
    # Whatever a failed test left on the node goes with it: no later module may meet a pod
    # bound to a node that no longer exists.
    clear_node(cluster)
    real.down()
    cluster.cp.kubectl("delete", "node", NODE_NAME, "--wait=false", check=False)
    cluster.wait(lambda: not any(a["node"] == NODE_NAME for a in cluster.allocations()), 60,
                 "the real node's pods gone from gpufrac")


def start_agent(cl: Cluster, real: RealNode, metrics_port: int) -> Proc:
    """``gpufrac agent`` for node ``localhost``: fake NVML, the real device-plugin socket."""
    fake = real.workdir / "fake-gpus.yaml"
    fake.write_text(f"gpus:\n- {{name: NVIDIA A10, memory_mib: {GPU_MIB}, count: {GPUS}}}\n")
    mps = real.workdir / "mps-pipe"  # stands for the MPS control daemon's pipe directory
    mps.mkdir(exist_ok=True)
    (mps / "control").write_text("")
    return cl.cp.track(start("gpufrac-agent", [
        sys.executable, "-m", "agent", "--node-name", NODE_NAME, "--kubeconfig", str(cl.cp.admin_kubeconfig),
        "--nvml", "fake", "--fake-config", str(fake), "--replicas", str(REPLICAS), "--heartbeat-s", "5",
        "--min-interval-s", "1", "--plugin-dir", str(DEVICE_PLUGIN_DIR), "--mps-pipe-dir", str(mps),
        "--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1", "--log-level", "info"], real.workdir))


class Agent:
    """The running agent; ``restart`` kills it (SIGKILL, as a crash) and starts another."""

    def __init__(self, cl: Cluster, real: RealNode) -> None:
        self.cl, self.real = cl, real
        self.metrics_port = free_port()
        self.proc = start_agent(cl, real, self.metrics_port)

    def tail(self, n: int = 100_000) -> str:
        return self.proc.tail(n)

    def restart(self) -> None:
        self.proc.kill()
        self.metrics_port = free_port()
        self.proc = start_agent(self.cl, self.real, self.metrics_port)

    def metric(self, name: str, **labels: str) -> float:
        """The value of the one sample ``name`` with ``labels`` on the agent's /metrics."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        values = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                  if s.name == name and s.labels == labels]
        assert len(values) == 1, f"{name}{labels} not exposed once:\n{text}"
        return float(values[0])


@pytest.fixture(scope="module")
def agent(cluster: Cluster, node: RealNode) -> Iterator[Agent]:
    handle = Agent(cluster, node)
    yield handle
    handle.proc.stop()


def capacity(cl: Cluster) -> str:
    """The node's allocatable ``gpufrac.io/gpu``: kubelet counts only healthy devices of a
    registered plugin there (capacity keeps the last count while none is registered)."""
    return str((cl.api.read_node(NODE_NAME).status.allocatable or {}).get("gpufrac.io/gpu", ""))


def workload(name: str, *, gpus: int = 1, fraction: str | None = "0.25", containers: int = 1) -> dict[str, Any]:
    """A pod for the real node: hostNetwork, the local busybox image, prints its environment."""
    annotations = {"gpufrac.io/fraction": fraction} if fraction else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
            "spec": {"schedulerName": SCHEDULER, "hostNetwork": True, "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
                     "tolerations": [NOT_READY_TOLERATION], "terminationGracePeriodSeconds": 0,
                     "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "containers": [{"name": f"c{i}", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["/bin/sh", "-c", "env | sort; echo END-OF-ENV; "
                                                 "cat ${CUDA_MPS_PIPE_DIRECTORY:-/none}/control && echo MPS-PIPE-SEEN; "
                                                 "sleep 3600"],
                                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                                                   "limits": {"gpufrac.io/gpu": str(gpus)}}}
                                    for i in range(containers)]}}


def run(cl: Cluster, ns: str, pod: dict[str, Any], timeout_s: float = 90) -> dict[str, Any]:
    """Create ``pod``, wait until kubelet runs it and every container printed its env; the pod."""
    cl.api.create_namespaced_pod(ns, pod)
    name = pod["metadata"]["name"]

    def running() -> dict[str, Any] | None:
        obj = json.loads(cl.cp.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout)
        if obj["status"].get("phase") == "Running" and all(
                "END-OF-ENV" in logs(cl, ns, name, c["name"]) for c in obj["spec"]["containers"]):
            return dict(obj)
        return None
    try:
        return dict(wait_until(running, timeout_s, f"pod {ns}/{name} running", interval_s=0.5))
    except Exception:
        events = cl.cp.kubectl("get", "events", "-n", ns, check=False).stdout
        raise AssertionError(f"pod {ns}/{name} did not run:\n{events}") from None


def clear_node(cl: Cluster) -> None:
    """Force-delete every pod bound to the real node (what a failed test left behind)."""
    cl.cp.kubectl("delete", "pods", "--all-namespaces", "--field-selector", f"spec.nodeName={NODE_NAME}",
                  "--grace-period=0", "--force", "--wait=false", check=False)


def ready(cl: Cluster, agent: Agent) -> str:
    """Wait until the node's allocatable shows every slot and gpufrac holds nothing there
    (earlier tests' pods are gone, by force if a failed test left them); a new namespace."""
    clear_node(cl)
    wait_until(lambda: capacity(cl) == str(GPUS * REPLICAS), 60, "gpufrac.io/gpu allocatable", agent.proc)
    cl.wait(lambda: not any(a["node"] == NODE_NAME for a in cl.allocations()), 60, "real node free in gpufrac")
    return new_namespace(cl.api, unique("node"))


def logs(cl: Cluster, ns: str, name: str, container: str) -> str:
    return str(cl.cp.kubectl("logs", name, "-n", ns, "-c", container, check=False).stdout)


def env_of(cl: Cluster, ns: str, name: str, container: str) -> dict[str, str]:
    out = logs(cl, ns, name, container).split("END-OF-ENV")[0]
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_device_plugin_registers_and_the_node_shows_gpus_times_replicas(cluster: Cluster, node: RealNode,
                                                                        agent: Agent) -> None:
    wait_until(lambda: capacity(cluster) == str(GPUS * REPLICAS), 60, "gpufrac.io/gpu capacity", agent.proc)
    inventory = json.loads(cluster.api.read_node(NODE_NAME).metadata.annotations["gpufrac.io/inventory"])
    assert [g["replicas"] for g in inventory["gpus"]] == [REPLICAS] * GPUS
    assert "registered gpufrac.io/gpu with kubelet" in agent.tail()


def test_fractional_pod_runs_with_its_gpu_and_mps_limits(cluster: Cluster, node: RealNode, agent: Agent) -> None:
    ns = ready(cluster, agent)
    pod = run(cluster, ns, workload("quarter"))
    chosen = pod["metadata"]["annotations"]["gpufrac.io/assigned-gpus"]
    env = env_of(cluster, ns, "quarter", "c0")
    # The GPU gpufrac chose, and MPS limits of its share: 250 milli -> 25 % of the SMs,
    # and a quarter of 24576 MiB pinned.
    assert env["NVIDIA_VISIBLE_DEVICES"] == chosen and env["GPUFRAC_ASSIGNED_GPUS"] == chosen
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={GPU_MIB // 4}M"
    # and the node's MPS pipe directory, mounted by Allocate where the variable points
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpufrac/mps"
    cluster.wait(lambda: "MPS-PIPE-SEEN" in logs(cluster, ns, "quarter", "c0"), 30, "the pipe directory seen")
    # The agent's metrics saw it: kubelet's Allocate for the container, and the GPU's NVML
    # reading (the fake backend's 24 GiB) labelled with node, UUID and model.
    assert agent.metric("gpufrac_agent_device_plugin_allocate_total", result="ok") >= 1
    assert agent.metric("gpufrac_agent_gpu_memory_total_bytes", node=NODE_NAME, gpu_uuid=chosen,
                        model="NVIDIA A10") == GPU_MIB * 2**20
    cluster.api.delete_namespaced_pod("quarter", ns, grace_period_seconds=0)


def test_two_gpu_pod_gets_both(cluster: Cluster, node: RealNode, agent: Agent) -> None:
    ns = ready(cluster, agent)
    pod = run(cluster, ns, workload("pair", gpus=2, fraction=None))
    chosen = pod["metadata"]["annotations"]["gpufrac.io/assigned-gpus"].split(",")
    env = env_of(cluster, ns, "pair", "c0")
    assert len(chosen) == 2 and sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(chosen)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env  # whole GPUs: no MPS limit
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env and "MPS-PIPE-SEEN" not in logs(cluster, ns, "pair", "c0")
    cluster.api.delete_namespaced_pod("pair", ns, grace_period_seconds=0)


def test_two_container_pod_gets_one_gpu_in_each_container(cluster: Cluster, node: RealNode, agent: Agent) -> None:
    ns = ready(cluster, agent)
    # Two containers of one whole GPU each (a share below 1 takes exactly one GPU per pod):
    # the pod holds two GPUs, container i gets the i-th.
    pod = run(cluster, ns, workload("duo", containers=2, fraction=None))
    chosen = pod["metadata"]["annotations"]["gpufrac.io/assigned-gpus"].split(",")
    assert len(chosen) == 2
    assert [env_of(cluster, ns, "duo", f"c{i}")["NVIDIA_VISIBLE_DEVICES"] for i in (0, 1)] == chosen
    cluster.api.delete_namespaced_pod("duo", ns, grace_period_seconds=0)


def survives_restart(cl: Cluster, agent: Agent, restart: Callable[[], object], what: str) -> None:
    """Around ``restart``: a running pod keeps its container (kubelet's checkpoint), the
    plugin registers again (printed: how long after the restart began), the node's
    allocatable comes back, and a new pod gets its GPU."""
    ns = ready(cl, agent)
    try:
        before = run(cl, ns, workload("before"))
        sent = agent.tail().count(DEVICES_SENT)
        t0 = time.monotonic()
        restart()
        # Registration alone is not enough: until kubelet has read the device list from the
        # new ListAndWatch stream it holds the devices unhealthy and rejects an admission
        # (UnexpectedAdmissionError, seen once on CI when the next pod came 1 s after).
        wait_until(lambda: agent.tail().count(DEVICES_SENT) > sent, 60,
                   f"the device plugin registered and listed its devices again after the {what}", agent.proc)
        print(f"\n{what}: device plugin listed its devices again {time.monotonic() - t0:.1f} s after it began")
        wait_until(lambda: capacity(cl) == str(GPUS * REPLICAS), 60, f"allocatable after the {what}", agent.proc)
        (status,) = json.loads(cl.cp.kubectl("get", "pod", "before", "-n", ns, "-o", "json").stdout)["status"][
            "containerStatuses"]
        assert status["state"].get("running") and status["restartCount"] == 0
        assert status["containerID"] == before["status"]["containerStatuses"][0]["containerID"]
        after = run(cl, ns, workload("after"))
        assert env_of(cl, ns, "after", "c0")["NVIDIA_VISIBLE_DEVICES"] == after["metadata"]["annotations"][
            "gpufrac.io/assigned-gpus"]
    finally:
        cl.cp.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", "--wait=false", check=False)


def test_agent_killed_and_restarted_reregisters_running_pods_keep_devices(cluster: Cluster, node: RealNode,
                                                                           agent: Agent) -> None:
    survives_restart(cluster, agent, agent.restart, "agent restart")  # SIGKILL: its socket left behind


def test_kubelet_restart_plugin_reregisters_running_pods_keep_devices(cluster: Cluster, node: RealNode,
                                                                      agent: Agent) -> None:
    # kubelet wipes the device-plugin directory when it starts
    survives_restart(cluster, agent, node.restart_kubelet, "kubelet restart")


def test_deleting_a_pod_frees_its_share_in_gpufrac_and_its_devices_on_the_node(cluster: Cluster, node: RealNode,
                                                                              agent: Agent) -> None:
    ns = ready(cluster, agent)
    pod = run(cluster, ns, workload("gone"))
    uid = pod["metadata"]["uid"]
    assert any(a["uid"] == uid for a in cluster.allocations())
    assert uid in checkpointed_pods()
    cluster.api.delete_namespaced_pod("gone", ns, grace_period_seconds=0)
    cluster.wait(lambda: not any(a["uid"] == uid for a in cluster.allocations()), 60, "share freed in gpufrac")
    # kubelet drops a removed pod's devices from its checkpoint at its next allocation.
    run(cluster, ns, workload("next"))
    assert uid not in checkpointed_pods()
    cluster.api.delete_namespaced_pod("next", ns, grace_period_seconds=0)


def checkpointed_pods() -> set[str]:
    """Pod UIDs holding devices in kubelet's device-manager checkpoint."""
    data = json.loads((DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint").read_text())
    return {e["PodUID"] for e in data["Data"]["PodDeviceEntries"] or []}


def test_kubelet_restarted_while_pods_are_admitted_no_pod_runs_on_a_gpu_it_was_not_given(
        cluster: Cluster, node: RealNode, agent: Agent) -> None:
    """Six quarter-GPU pods created a second apart and kubelet restarted once one of the first two
    is bound, so admissions (and their Allocate calls) straddle the restart. (A second apart: kubelet
    admits pods in creationTimestamp order, whole seconds; of two created in the same second it
    may admit either first, and Allocate does not say which: agent/deviceplugin/assign.py.)
    Each pod either runs with
    exactly the GPU gpufrac assigned it, or kubelet failed its admission and said why (a pod
    admitted before the plugin registered again); a failed pod's share is freed in gpufrac,
    and the node takes a new pod afterwards."""
    cl = cluster
    ns = ready(cl, agent)
    names = [f"adm{i}" for i in range(6)]

    def some_bound() -> bool:
        return any(p.spec.node_name for p in cl.api.list_namespaced_pod(ns).items)
    try:
        for n in names:
            cl.api.create_namespaced_pod(ns, workload(n))
            if n == names[1]:  # two created: restart kubelet once one of them is bound
                wait_until(some_bound, 60, "a pod bound", agent.proc)
                node.restart_kubelet()
            time.sleep(1.05)

        def settled() -> dict[str, dict[str, Any]] | None:
            pods = {p["metadata"]["name"]: p for p in json.loads(
                cl.cp.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]}
            done = all(p["status"].get("phase") == "Failed" or (
                p["status"].get("phase") == "Running" and "END-OF-ENV" in logs(cl, ns, n, "c0"))
                for n, p in pods.items())
            return pods if len(pods) == len(names) and done else None
        pods = cl.wait(settled, 180, "every pod running or failed by kubelet")
        running = [n for n, p in pods.items() if p["status"]["phase"] == "Running"]
        failed = {n: p["status"].get("reason", "") for n, p in pods.items() if p["status"]["phase"] == "Failed"}
        print(f"\nkubelet restart during admission: {len(running)} running, failed: {failed}")
        for n in running:
            assert env_of(cl, ns, n, "c0")["NVIDIA_VISIBLE_DEVICES"] == \
                pods[n]["metadata"]["annotations"]["gpufrac.io/assigned-gpus"], n
        assert all(reason for reason in failed.values()), failed  # kubelet named why
        uids = {pods[n]["metadata"]["uid"] for n in failed}
        cl.wait(lambda: not uids & {a["uid"] for a in cl.allocations()}, 60, "failed pods' share freed in gpufrac")
        wait_until(lambda: capacity(cl) == str(GPUS * REPLICAS), 60, "allocatable after the restart", agent.proc)
        after = run(cl, ns, workload("after"))
        assert env_of(cl, ns, "after", "c0")["NVIDIA_VISIBLE_DEVICES"] == \
            after["metadata"]["annotations"]["gpufrac.io/assigned-gpus"]
    finally:
        cl.cp.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", "--wait=false", check=False)
