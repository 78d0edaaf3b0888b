"""gpufrac installed as a platform team installs it: images built from ``deploy/Dockerfile``,
imported into the node's containerd, ``helm install`` of the package ``helm package`` makes of ``deploy/helm/gpufrac``, and the
chart's own pods running on a real kubelet.

The cluster: etcd, kube-apiserver with the ServiceAccount admission plugin (pods get tokens),
kube-controller-manager (Deployments, ReplicaSets, the DaemonSet, service accounts, the
root CA ConfigMap), the cluster's default kube-scheduler (it places the chart's pods), and
one real node (kubelet, containerd, runc: ``harness/node.py``). The chart's
kube-scheduler (from an image of the harness's own binary), both gpufrac replicas and the
agent DaemonSet (fake NVML: no GPU here) run as pods there.

What this machine cannot give, and the values that stand in (each a documented value of the
chart, the same a cluster without kube-proxy or a CNI would set):

- no CNI: every pod of the chart runs with ``hostNetwork``; its servers bind 127.0.0.1
  (``listenAddress``) and kube-scheduler calls gpufrac at ``https://127.0.0.1:<port>``
  (``extender.url``, with 127.0.0.1 in the generated certificate's names);
- no kube-proxy: the pods reach the API server at its address (``apiServer.host``/``port``);
- one node: two host-network replicas of a Deployment cannot share the node's ports, so the
  default scheduler keeps the second of each Pending (its NodePorts filter). That second
  extender replica is the one that takes over when the running one is deleted.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import docs
from harness import images as img
from harness.controlplane import ControlPlane
from harness.helm import build_helm, helm
from harness.node import BUSYBOX_IMAGE, NODE_NAME, NOT_READY_TOLERATION, RealNode
from harness.processes import LOOPBACK, free_port, wait_until
from tests.e2e.conftest import Images

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpufrac"
NS = "gpufrac-system"
INSTALL_MD, ADMIN_MD, DRA_MD = "docs/install.md", "docs/admin.md", "docs/dra.md"
GPUS, GPU_MIB = 2, 24576


@dataclass
class Installed:
    """The cluster, its node and the release's ports and values file."""

    cp: ControlPlane
    node: RealNode
    values: Path
    ports: dict[str, int]

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.cp.kubectl(*args, "-o", "json").stdout)

    def helm(self, *args: str, check: bool = True) -> Any:
        return helm(*args, "--kubeconfig", str(self.cp.admin_kubeconfig), check=check)

    def sh(self, command: str, check: bool = True, timeout_s: float = 300,
           cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
        """A docs command on this cluster, with kubectl and helm on PATH (``docs.run``)."""
        return docs.run(command, self.cp.admin_kubeconfig, (self.cp.bins["kubectl"], build_helm()),
                        cwd=cwd, check=check, timeout_s=timeout_s)

    def pods(self, component: str) -> list[dict[str, Any]]:
        return list(self.kubectl_json("get", "pods", "-n", NS, "-l",
                                      f"app.kubernetes.io/component={component}")["items"])

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the running gpufrac's /metrics (host network: its port on loopback)."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.ports['metrics']}/metrics", timeout=5) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return 0.0

    def logs(self, ns: str, pod: str, container: str | None = None) -> str:
        args = ["logs", "-n", ns, pod, *(["-c", container] if container else [])]
        return self.cp.kubectl(*args, check=False).stdout

    def debug(self) -> str:
        """What a person would look at when the install does not come up."""
        out = [self.cp.kubectl("get", "pods,events", "-n", NS, "-o", "wide", check=False).stdout]
        for pod in self.kubectl_json("get", "pods", "-n", NS)["items"]:
            out.append(f"--- {pod['metadata']['name']} ---\n{self.logs(NS, pod['metadata']['name'])[-2000:]}")
        return "\n".join(out)


def running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["status"].get("phase") == "Running" and all(
        c.get("ready") for c in p["status"].get("containerStatuses", []))]


def values_file(path: Path, cp: ControlPlane, images: Images, mps_image: str, ports: dict[str, int]) -> Path:
    """The values a team on a cluster like this one writes (see the module docstring)."""
    extender_repo, tag = images.extender.rsplit(":", 1)
    values = {
        "image": {"repository": extender_repo, "agentRepository": images.agent.rsplit(":", 1)[0], "tag": tag,
                  "pullPolicy": "Never"},
        "apiServer": {"host": LOOPBACK, "port": int(cp.server.rsplit(":", 1)[1])},
        "listenAddress": LOOPBACK,
        # The tag is left to the chart: the cluster's version, which the image carries.
        "scheduler": {"image": {"repository": images.scheduler.rsplit(":", 1)[0]},
                      "hostNetwork": True, "securePort": ports["scheduler"],
                      "tolerations": [NOT_READY_TOLERATION]},
        "extender": {"port": ports["verbs"], "metricsPort": ports["metrics"], "hostNetwork": True,
                     "url": f"https://{LOOPBACK}:{ports['verbs']}", "tls": {"extraSANs": [LOOPBACK]},
                     "tolerations": [NOT_READY_TOLERATION], "inventoryStaleAfterS": 60},
        "agent": {"runtimeClassName": "", "hostNetwork": True, "metricsPort": ports["agent"], "heartbeatS": 5,
                  "fakeGpus": [{"name": "NVIDIA A10", "memory_mib": GPU_MIB, "count": GPUS}]},
        # The optional MPS control daemon, with a stand-in of nvidia-cuda-mps-control (no GPU).
        "mps": {"controlDaemon": {"enabled": True, "image": mps_image, "runtimeClassName": "",
                                  "pipeDir": str(path.parent / "mps-pipe"), "logDir": str(path.parent / "mps-log")}},
    }
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, images: Images) -> Iterator[Installed]:
    work = Path(tmp_path_factory.mktemp("install"))
    cp = ControlPlane.up(work / "kube", service_accounts=True)
    node: RealNode | None = None
    try:
        cp.start_controller_manager()
        cp.start_scheduler(None, name="default-scheduler", profile="default-scheduler")
        node = RealNode.up(cp)
        cp.kubectl("label", "node", NODE_NAME, "gpufrac.io/gpu-node=true")
        mps_image = img.mps_standin_image()
        for ref in (images.extender, images.agent, images.scheduler, mps_image):
            archive = img.archive(ref, work / (ref.rsplit("/", 1)[-1].replace(":", "-") + ".tar"))
            node.ctr("images", "import", "--local", "--platform", "linux/amd64", "--snapshotter", "native",
                     str(archive))
            archive.unlink()  # half a gigabyte each; containerd holds the image now
        ports = {k: free_port() for k in ("verbs", "metrics", "scheduler", "agent")}
        inst = Installed(cp, node, values_file(work / "values.yaml", cp, images, mps_image, ports), ports)
        # docs/install.md's quick start, with this cluster's values file: the chart packaged by
        # the doc's own command (in a directory of its own, the checkout's deploy/ linked, so
        # dist/ lands there) and the package installed, not the folder.
        checkout = work / "checkout"
        checkout.mkdir()
        (checkout / "deploy").symlink_to(ROOT / "deploy")
        inst.sh(docs.command(INSTALL_MD, "helm package deploy/helm/gpufrac"), cwd=checkout)
        quick_start = docs.command(INSTALL_MD, "helm install gpufrac")
        assert "dist/gpufrac-0.1.0.tgz" in quick_start and "deploy/helm/gpufrac" not in quick_start
        notes = inst.sh(quick_start.replace("my-values.yaml", str(inst.values)), cwd=checkout).stdout
        # NOTES.txt: what to check next; no warning about MPS, since this install runs the daemon
        assert "kubectl -n gpufrac-system rollout status" in notes and "MPS control daemon" not in notes
        try:
            for component in ("extender", "scheduler", "agent", "mps-control-daemon"):
                wait_until(lambda c=component: running(inst.pods(c)), 180, f"a {component} pod running and ready")
        except Exception as exc:
            raise AssertionError(f"{exc}\n{inst.debug()}") from None
        inst.sh(docs.command(INSTALL_MD, "kubectl -n gpufrac-system rollout status ds/gpufrac-agent"), timeout_s=120)
        yield inst
    finally:
        if node is not None:
            cp.kubectl("delete", "pods", "--all-namespaces", "--all", "--grace-period=0", "--force",
                       "--wait=false", check=False)
            node.down()
        cp.down()


def fractional_pod(name: str, fraction: str = "0.25") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"gpufrac.io/fraction": fraction}},
            "spec": {"schedulerName": "gpufrac-scheduler", "hostNetwork": True,
                     "tolerations": [NOT_READY_TOLERATION], "terminationGracePeriodSeconds": 0,
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["/bin/sh", "-c", "env | sort; test -p $CUDA_MPS_PIPE_DIRECTORY/control "
                                                 "&& echo MPS-PIPE-SEEN; echo END-OF-ENV; sleep 3600"],
                                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                                                   "limits": {"gpufrac.io/gpu": "1"}}}]}}


def run_pod(inst: Installed, ns: str, name: str, timeout_s: float = 120) -> tuple[dict[str, Any], dict[str, str]]:
    """Create a fractional pod; wait until the installed scheduler and gpufrac bound it and
    kubelet started it. The pod and its container's environment (with ``MPS-PIPE-SEEN`` as a
    key when the container found the daemon's named pipe)."""
    inst.cp.kubectl("apply", "-n", ns, "-f", "-", input_text=json.dumps(fractional_pod(name)))

    def started() -> tuple[dict[str, Any], dict[str, str]] | None:
        pod = inst.kubectl_json("get", "pod", name, "-n", ns)
        out = inst.logs(ns, name)
        if pod["status"].get("phase") != "Running" or "END-OF-ENV" not in out:
            return None
        lines = out.split("END-OF-ENV")[0].splitlines()
        env = dict(line.split("=", 1) for line in lines if "=" in line)
        env.update({line: "" for line in lines if line == "MPS-PIPE-SEEN"})
        return pod, env
    try:
        return wait_until(started, timeout_s, f"pod {ns}/{name} running", interval_s=0.5)  # type: ignore[no-any-return]
    except Exception as exc:
        events = inst.cp.kubectl("get", "events", "-n", ns, check=False).stdout
        raise AssertionError(f"{exc}\n{events}\n{inst.debug()}") from None


def test_the_chart_runs_its_own_pods_on_the_node(installed: Installed) -> None:
    inst = installed
    # One of each host-network Deployment runs; its second replica waits for a node with
    # free ports (the default scheduler's NodePorts filter), as the module docstring says.
    for component in ("extender", "scheduler"):
        pods = inst.pods(component)
        assert len(pods) == 2 and len(running(pods)) == 1
        pending = [p for p in pods if p["status"].get("phase") == "Pending"]
        assert len(pending) == 1 and "free ports" in json.dumps(pending[0]["status"].get("conditions", []))
    # The scheduler's tag came from the cluster's version (.Capabilities.KubeVersion).
    server_version = json.loads(inst.cp.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    assert running(inst.pods("scheduler"))[0]["spec"]["containers"][0]["image"] == \
        f"{img.SCHEDULER_IMAGE}:{server_version}"
    # The agent registered the device plugin with kubelet and published the inventory.
    # kubelet posts the plugin's devices with its next node status.
    node = wait_until(lambda: (n := inst.kubectl_json("get", "node", NODE_NAME))["status"]["allocatable"].get(
        "gpufrac.io/gpu") == str(GPUS * 4) and n, 60, "the agent's devices in the node's allocatable")
    inventory = json.loads(node["metadata"]["annotations"]["gpufrac.io/inventory"])
    assert len(inventory["gpus"]) == GPUS
    # Pods got their service-account tokens: the extender reads the API (it is ready).
    assert inst.metric("gpufrac_config_valid") == 1.0
    # docs/install.md: `kubectl gpufrac inspect` lists the node with its GPUs.
    table = inst.sh(docs.command(INSTALL_MD, "kubectl gpufrac inspect")).stdout
    assert NODE_NAME in table and "NVIDIA A10" in table and "stale" not in table, table


def test_a_fractional_pod_is_placed_by_the_installed_gpufrac(installed: Installed) -> None:
    inst = installed
    inst.cp.kubectl("create", "namespace", "team-a")
    pod, env = run_pod(inst, "team-a", "quarter")
    chosen = pod["metadata"]["annotations"]["gpufrac.io/assigned-gpus"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == chosen
    assert pod["spec"]["nodeName"] == NODE_NAME
    # The chart's MPS control daemon runs; the agent (mpsPipeDir defaulted to the daemon's pipe
    # directory) mounted that directory into the container, with the quarter's limits.
    assert "MPS-PIPE-SEEN" in env and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={GPU_MIB // 4}M"
    assert "stand-in MPS control daemon started" in (inst.values.parent / "mps-log" / "control.log").read_text()
    assert inst.metric("gpufrac_bind_total", result="ok") == 1  # the installed gpufrac bound it


def test_helm_upgrade_reloads_the_config_without_restarting(installed: Installed) -> None:
    inst = installed
    before = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"]
              for p in running(inst.pods("extender")) + running(inst.pods("scheduler"))}
    reloads = inst.metric("gpufrac_config_reloads_total", result="applied")
    # docs/admin.md, "Changing the config": check the values file, then upgrade with it.
    mine = inst.values.parent / "my-values.yaml"
    validate = docs.command(ADMIN_MD, "gpufrac config validate --helm-values").replace("my-values.yaml", str(mine))
    mine.write_text("config:\n  scoring:\n    weigths: {spread: 2}\n")
    typo = inst.sh(validate, check=False)
    assert typo.returncode == 2 and "did you mean 'weights'?" in typo.stderr
    mine.write_text("config:\n  scoring:\n    weights: {spread: 2}\n")
    inst.sh(validate)
    inst.sh(docs.command(ADMIN_MD, "helm upgrade gpufrac").replace("my-values.yaml", str(mine)))
    # The ConfigMap carries the weight; kubelet refreshes the mounted file, gpufrac applies it.
    cm = inst.kubectl_json("get", "configmap", "gpufrac-config", "-n", NS)
    assert yaml.safe_load(cm["data"]["gpufrac-config.yaml"])["scoring"]["weights"] == {"spread": 2}
    wait_until(lambda: inst.metric("gpufrac_config_reloads_total", result="applied") > reloads, 120,
               "gpufrac reloading the upgraded config")
    pod = running(inst.pods("extender"))[0]["metadata"]["name"]
    assert "config reloaded" in inst.logs(NS, pod)
    after = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"]
             for p in running(inst.pods("extender")) + running(inst.pods("scheduler"))}
    assert after == before  # the same pods, none restarted
    # A bad value is refused by the chart's schema before anything reaches the cluster, on
    # upgrade and on install alike.
    bad = inst.helm("upgrade", "gpufrac", str(CHART), "-n", NS, "-f", str(inst.values),
                    "--set", "config.scoring.weights.nonsense=-3", check=False)
    assert bad.returncode != 0 and "/config/scoring/weights/nonsense" in bad.stderr
    bad = inst.helm("install", "other", str(CHART), "-n", "other", "--create-namespace",
                    "--set", "extender.replicas=abc", check=False)
    assert bad.returncode != 0 and "at '/extender/replicas': got string, want integer" in bad.stderr
    assert inst.helm("list", "-A", "-q").stdout.split() == ["gpufrac"]


def test_scheduling_goes_on_when_the_running_extender_replica_is_deleted(installed: Installed) -> None:
    inst = installed
    old = running(inst.pods("extender"))[0]["metadata"]["name"]
    inst.cp.kubectl("delete", "pod", "-n", NS, old, "--grace-period=5")
    wait_until(lambda: [p for p in running(inst.pods("extender")) if p["metadata"]["name"] != old], 180,
               "the other extender replica running and ready")
    inst.cp.kubectl("create", "namespace", "team-b")
    pod, env = run_pod(inst, "team-b", "after-failover")
    assert env["NVIDIA_VISIBLE_DEVICES"] == pod["metadata"]["annotations"]["gpufrac.io/assigned-gpus"]


def test_helm_uninstall_removes_what_the_docs_say(installed: Installed) -> None:
    inst = installed
    # docs/install.md's rollout check of the Deployments completes once each has only the
    # replicas this one host-network node can run (the module docstring says why not two).
    inst.cp.kubectl("scale", "-n", NS, "deploy/gpufrac-extender", "deploy/gpufrac-scheduler", "--replicas=1")
    inst.sh(docs.command(INSTALL_MD, "kubectl -n gpufrac-system rollout status deploy/"), timeout_s=180)
    inst.sh(docs.command(INSTALL_MD, "helm uninstall gpufrac"))
    wait_until(lambda: not inst.pods("extender") and not inst.pods("agent"), 120, "the chart's pods gone")
    left = inst.cp.kubectl("get", "deploy,ds,svc,cm,secret,sa,pdb", "-n", NS, "-l",
                           "app.kubernetes.io/instance=gpufrac", "-o", "name").stdout.split()
    assert left == []
    cluster_wide = inst.cp.kubectl("get", "clusterroles,clusterrolebindings,validatingadmissionpolicies", "-o",
                                   "name").stdout.split()
    assert not [n for n in cluster_wide if "gpufrac" in n]
    # docs/install.md: the claim ledgers' namespace is kept by helm uninstall.
    assert inst.cp.kubectl("get", "namespace", "gpufrac-claims", "-o", "name").stdout.strip()
    # Running GPU pods keep running (docs/install.md, "Uninstall").
    assert inst.kubectl_json("get", "pod", "quarter", "-n", "team-a")["status"]["phase"] == "Running"
    # The rest of the doc's uninstall: the claims namespace and the inventory annotations.
    inst.sh(docs.command(INSTALL_MD, "kubectl delete namespace gpufrac-claims"))
    inst.sh(docs.command(INSTALL_MD, "kubectl annotate nodes --all gpufrac.io/inventory-"))
    assert "gpufrac.io/inventory" not in inst.kubectl_json("get", "node", NODE_NAME)["metadata"].get("annotations", {})


def claim_pod(name: str, claim: str) -> dict[str, Any]:
    """A pod of the chart's profile using the ResourceClaim ``claim`` (no gpufrac annotation)."""
    pod = fractional_pod(name)
    del pod["metadata"]["annotations"]
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "10m", "memory": "16Mi"},
                                                 "claims": [{"name": "gpu"}]}
    return pod


def test_dra_mode_the_installed_profile_and_gpufrac_allocate_claims(installed: Installed) -> None:
    # After the uninstall above, the chart installed again in DRA mode with docs/dra.md's
    # command (agent.draDriver, extender.allocateClaims; this node's kubelet root and CDI
    # directory as values). An annotation pod and claims for 0.25, 0.5 and 0.25 of a GPU go
    # through the chart's kube-scheduler profile (no DynamicResources plugin): the installed,
    # fenced gpufrac writes the GPUs its core chose into the claims, the installed agent
    # prepares them, each container gets that GPU and its MPS limit, and no GPU holds more
    # than all of it, counting the claims and the annotation pods (two from before the
    # reinstall among them).
    inst = installed
    wait_until(lambda: not inst.cp.kubectl("get", "namespace", "gpufrac-claims", "-o", "name",
                                          check=False).stdout.strip(), 120, "the old claims namespace gone")
    command = docs.command(DRA_MD, "helm install gpufrac").replace("my-values.yaml", str(inst.values))
    inst.sh(f"{command} --set agent.kubeletDir={inst.node.plugins_registry.parent} "
            f"--set agent.cdiDir={inst.node.cdi_dir}", cwd=inst.values.parent / "checkout")
    try:
        for component in ("extender", "scheduler", "agent"):
            wait_until(lambda c=component: running(inst.pods(c)), 180, f"a {component} pod running and ready")
        wait_until(lambda: inst.kubectl_json("get", "resourceslices")["items"], 120, "the agent's ResourceSlice")
    except Exception as exc:
        raise AssertionError(f"{exc}\n{inst.debug()}") from None
    ns = "team-dra"
    inst.cp.kubectl("create", "namespace", ns)
    run_pod(inst, ns, "annotated")
    shares = {"a": 250, "b": 500, "c": 250}
    for name, share in shares.items():
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                     "deviceClassName": "gpu.gpufrac.io", "capacity": {"requests": {"share": str(share)}}}}]}}}
        inst.cp.kubectl("apply", "-n", ns, "-f", "-", input_text=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [claim, claim_pod(name, name)]}))

        def started(name: str = name) -> dict[str, str] | None:
            out = inst.logs(ns, name)
            return dict(line.split("=", 1) for line in out.split("END-OF-ENV")[0].splitlines()
                        if "=" in line) if "END-OF-ENV" in out else None
        try:
            env = wait_until(started, 180, f"claim pod {name} running", interval_s=0.5)
        except Exception as exc:
            events = inst.cp.kubectl("get", "events", "-n", ns, check=False).stdout
            raise AssertionError(f"{exc}\n{events}\n{inst.debug()}") from None
        got = inst.kubectl_json("get", "resourceclaim", name, "-n", ns)
        [result] = got["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == ("gpu.gpufrac.io", NODE_NAME)
        assert result["consumedCapacity"]["share"] == str(share)
        uuid = f"GPU-fake-{NODE_NAME}-{int(result['device'].removeprefix('gpu-'))}"
        assert env["NVIDIA_VISIBLE_DEVICES"] == uuid and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(share // 10)
        bound = inst.kubectl_json("get", "pod", name, "-n", ns)
        assert [r["uid"] for r in got["status"]["reservedFor"]] == [bound["metadata"]["uid"]]
        assert "gpufrac.io/assigned-gpus" not in bound["metadata"].get("annotations", {})
        # The GPU gpufrac's core chose, as its bind logged it, is the claim's.
        logs = "".join(inst.logs(NS, p["metadata"]["name"]) for p in running(inst.pods("extender")))
        assert f"allocated claim(s) {ns}/{name} of pod {ns}/{name} on {NODE_NAME}: GPUs {uuid}" in logs
    held: dict[str, int] = {}
    for pod in inst.kubectl_json("get", "pods", "-A")["items"]:
        notes = pod["metadata"].get("annotations", {})
        if pod["status"].get("phase") == "Running" and "gpufrac.io/assigned-gpus" in notes:
            uuid = notes["gpufrac.io/assigned-gpus"]
            held[uuid] = held.get(uuid, 0) + round(float(notes["gpufrac.io/assigned-fraction"]) * 1000)
    for c in inst.kubectl_json("get", "resourceclaims", "-A")["items"]:
        for r in c["status"]["allocation"]["devices"]["results"]:
            uuid = f"GPU-fake-{NODE_NAME}-{int(r['device'].removeprefix('gpu-'))}"
            held[uuid] = held.get(uuid, 0) + int(r["consumedCapacity"]["share"])
    assert sum(held.values()) == 4 * 250 + 500 + 250 and max(held.values()) <= 1000, held
