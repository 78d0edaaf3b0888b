"""deploy/ stays consistent with the repository's own files (the e2e applies it for real)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "base"


def test_deployed_scheduler_config_is_the_repository_one() -> None:
    # kustomize reads files inside its folder only, so deploy/base keeps a copy.
    assert (BASE / "scheduler-config.yaml").read_text() == (ROOT / "scheduler-config.yaml").read_text()


def docs(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((BASE / name).read_text()))


def test_kube_scheduler_calls_the_extender_service_over_mutual_tls() -> None:
    cfg = yaml.safe_load((ROOT / "scheduler-config.yaml").read_text())
    (ext,) = cfg["extenders"]
    objs = {(d["kind"], d["metadata"]["name"]): d for d in docs("deployment.yaml")}
    extender = objs[("Deployment", "gpufrac-extender")]["spec"]["template"]["spec"]
    scheduler = objs[("Deployment", "gpufrac-scheduler")]["spec"]["template"]["spec"]
    (gpufrac,) = extender["containers"]
    (kube,) = scheduler["containers"]
    args = gpufrac["command"]
    service = objs[("Service", "gpufrac-extender")]
    port = {p["name"]: p["port"] for p in service["spec"]["ports"]}["extender"]
    assert ext["urlPrefix"] == f"https://gpufrac-extender.gpufrac-system.svc:{port}" and ext["enableHTTPS"]
    assert "--port=8888" in args and "--mode=cluster" in args and "--host=0.0.0.0" in args
    # gpufrac requires a client certificate; kube-scheduler presents one from its mounted Secret
    assert any(a.startswith("--tls-client-ca-file=") for a in args)
    tls_dir = {m["name"]: m["mountPath"] for m in kube["volumeMounts"]}["extender-client-tls"]
    assert all(ext["tlsConfig"][k].startswith(tls_dir + "/") for k in ("caFile", "certFile", "keyFile"))
    # two identities: the verbs' service account is not kube-scheduler's
    assert extender["serviceAccountName"] == "gpufrac-extender"
    assert scheduler["serviceAccountName"] == "gpufrac-scheduler"
    # probes on the plain health port, which serves nothing else
    assert "--health-port=8080" in args and gpufrac["readinessProbe"]["httpGet"]["port"] == "health"
    policy = objs[("NetworkPolicy", "gpufrac-extender")]["spec"]["ingress"][0]
    assert policy["from"][0]["podSelector"]["matchLabels"] == \
        objs[("Deployment", "gpufrac-scheduler")]["spec"]["template"]["metadata"]["labels"]
    assert cfg["profiles"][0]["schedulerName"] == "gpufrac-scheduler"


def test_admission_policy_names_the_deployed_identities() -> None:
    text = (BASE / "admission-policy.yaml").read_text()
    assert "system:serviceaccount:gpufrac-system:gpufrac-extender" in text
    assert "'gpufrac-scheduler'" in text
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs("admission-policy.yaml")}
    assert kinds == {("ValidatingAdmissionPolicy", "gpufrac-pods"), ("ValidatingAdmissionPolicyBinding", "gpufrac-pods"),
                     ("ValidatingAdmissionPolicy", "gpufrac-bindings"),
                     ("ValidatingAdmissionPolicyBinding", "gpufrac-bindings"),
                     ("ValidatingAdmissionPolicy", "gpufrac-gpu-models"),
                     ("ValidatingAdmissionPolicyBinding", "gpufrac-gpu-models"), ("ConfigMap", "gpufrac-gpu-models")}
    assert "admission-policy.yaml" in yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]


def test_extender_role_grants_only_what_cluster_mode_calls() -> None:
    rbac = docs("rbac.yaml")
    (role,) = [d for d in rbac if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpufrac-extender"]
    # bound to gpufrac's own service account only; kube-scheduler's roles to kube-scheduler's
    subjects = {(b["roleRef"]["name"], s["name"]) for b in rbac if b["kind"].endswith("Binding")
                for s in b["subjects"]}
    extender_roles = {"gpufrac-extender", "gpufrac-extender-claims", "gpufrac-extender-lease-reader",
                      "gpufrac-extender-gpu-models"}
    assert {s for r, s in subjects if r in extender_roles} == {"gpufrac-extender"}
    assert {s for r, s in subjects if r not in extender_roles} == {"gpufrac-scheduler"}
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    # extender/cluster/: list/watch nodes and pods, read a pod at bind, create the Binding
    # (which carries the allocation annotations), patch pending pods' requeue annotation,
    # list/watch namespaces (tenant_label), list PodDisruptionBudgets (the defragmentation
    # plan), create Events (a Warning on GPU pods no scheduler attempted, extender/cluster/stall.py);
    # no pods/eviction: acting on the plan is off by default.
    assert granted == {("nodes", "get"), ("nodes", "list"), ("nodes", "watch"),
                       ("pods", "get"), ("pods", "list"), ("pods", "watch"), ("pods", "patch"),
                       ("pods/binding", "create"), ("namespaces", "list"), ("namespaces", "watch"),
                       ("poddisruptionbudgets", "list"), ("events", "create")}
    # the scheduler's Lease: the extender may read that one, in its namespace, and write none
    (reader,) = [d for d in rbac if d["kind"] == "Role" and d["metadata"]["name"] == "gpufrac-extender-lease-reader"]
    assert reader["metadata"]["namespace"] == "gpufrac-system"
    assert reader["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                "resourceNames": ["gpufrac-scheduler"], "verbs": ["get"]}]
    # the admission policy's list of GPU models: that one ConfigMap, read and patched
    (models,) = [d for d in rbac if d["kind"] == "Role" and d["metadata"]["name"] == "gpufrac-extender-gpu-models"]
    assert models["metadata"]["namespace"] == "gpufrac-system"
    assert models["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                                "resourceNames": ["gpufrac-gpu-models"], "verbs": ["get", "patch"]}]
    lease_writers = {s["name"] for b in rbac if b["kind"] == "RoleBinding"
                     and b["roleRef"]["name"] == "gpufrac-scheduler-leader-election" for s in b["subjects"]}
    assert lease_writers == {"gpufrac-scheduler"}


def test_image_and_manifests_use_the_product_packages_and_entry_points() -> None:
    # The image is built from the product packages alone (no benchmarks, traces or tests),
    # and every gpufrac command a manifest runs is a console script of the product.
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages == {"scoring", "extender", "agent", "podspec"}
    dockerfile = "\n".join(line for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
                           if not line.startswith("#"))
    copied = set(re.findall(r"^COPY (\w+) \./\1$", dockerfile, flags=re.M))
    assert copied == packages, copied  # the build copies each package, nothing else
    assert "benchmarks" not in dockerfile and "tests" not in dockerfile
    # one image per role: the extender's has the base install only (no NVML, no gRPC) and a
    # non-root user; the agent's adds the [agent] extra
    stages = dict(re.findall(r"^FROM \S+ AS (\w+)\n(.*?)(?=^FROM |\Z)", dockerfile, flags=re.M | re.S))
    assert set(stages) == {"go", "stubs", "source", "extender", "agent"}  # go: the GO_BASE toolchain, copied into stubs
    assert "pip install --no-cache-dir --no-deps . " in stages["extender"] and "[agent]" not in stages["extender"]
    assert "USER 65532:65532" in stages["extender"] and '".[agent]"' in stages["agent"]
    scripts = set(project["project"]["scripts"])
    (agent,) = [d for d in yaml.safe_load_all((ROOT / "deploy" / "agent" / "daemonset.yaml").read_text())
                if d["kind"] == "DaemonSet"]
    commands = [c["command"][0] for d in docs("deployment.yaml") if d["kind"] == "Deployment"
                for c in d["spec"]["template"]["spec"]["containers"]]
    commands += [c["command"][0] for c in agent["spec"]["template"]["spec"]["containers"]]
    gpufrac_commands = {c for c in commands if c.startswith("gpufrac")}
    assert gpufrac_commands == {"gpufrac", "gpufrac-agent"}
    assert gpufrac_commands <= scripts, scripts


def test_replicas_are_fenced_and_their_grants_confined_to_the_claims_namespace() -> None:
    # More than one replica of each: kube-scheduler elects a leader on its own Lease, and
    # every gpufrac replica fences its binds in gpufrac-claims (extender/fence.py).
    objs = {(d["kind"], d["metadata"]["name"]): d for d in docs("deployment.yaml")}
    for name in ("gpufrac-scheduler", "gpufrac-extender"):
        assert objs[("Deployment", name)]["spec"]["replicas"] >= 2
        assert objs[("Deployment", name)]["spec"]["strategy"]["type"] == "RollingUpdate"
    (gpufrac,) = objs[("Deployment", "gpufrac-extender")]["spec"]["template"]["spec"]["containers"]
    assert "--fence-namespace=gpufrac-claims" in gpufrac["command"]
    cfg = yaml.safe_load((ROOT / "scheduler-config.yaml").read_text())["leaderElection"]
    assert cfg == {"leaderElect": True, "resourceNamespace": "gpufrac-system", "resourceName": "gpufrac-scheduler"}
    rbac = docs("rbac.yaml")
    roles = {d["metadata"]["name"]: d for d in rbac if d["kind"] == "Role"}
    claims = roles["gpufrac-extender-claims"]
    # extender/fence.py: read, list and watch the ledgers, create one, replace it by CAS.
    assert claims["metadata"]["namespace"] == "gpufrac-claims"
    assert {(r, v) for rule in claims["rules"] for r in rule["resources"] for v in rule["verbs"]} == {
        ("configmaps", v) for v in ("get", "list", "watch", "create", "update")}
    assert {d["metadata"]["name"] for d in docs("namespace.yaml")} == {"gpufrac-system", "gpufrac-claims"}
    # kube-scheduler may update only its own Lease (system:kube-scheduler covers "kube-scheduler").
    lease = roles["gpufrac-scheduler-leader-election"]
    assert lease["metadata"]["namespace"] == cfg["resourceNamespace"]
    assert [r.get("resourceNames") for r in lease["rules"] if "update" in r["verbs"]] == [[cfg["resourceName"]]]


def test_agent_runs_as_root_without_capabilities_for_kubelets_socket_directory() -> None:
    # kubelet's device-plugin directory and kubelet.sock are root's, mode 0755: the plugin
    # creates its socket there and dials kubelet's as their owner; nothing more.
    (ds,) = [d for d in yaml.safe_load_all((ROOT / "deploy" / "agent" / "daemonset.yaml").read_text())
             if d["kind"] == "DaemonSet"]
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    ctx = agent["securityContext"]
    assert ctx["runAsUser"] == 0 and ctx["runAsNonRoot"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]} and ctx["allowPrivilegeEscalation"] is False
    assert {"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"} in agent["volumeMounts"]



def test_kustomize_base_behaves_as_the_chart() -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    generated = {g["name"]: g for g in kustomization["configMapGenerator"]}
    # The admin config keeps its name, so an edit is reloaded in place (the chart's
    # behaviour); the scheduler config is hashed: kube-scheduler reads it only at start.
    assert generated["gpufrac-config"].get("options", {}).get("disableNameSuffixHash") is True
    assert "options" not in generated["gpufrac-scheduler-config"]
    # kube-scheduler's tag is one `images:` entry to set to the cluster's version, the same
    # as the manifest's, and within the chart's support matrix (kubeVersion >= 1.30).
    (image,) = kustomization["images"]
    deployments = {d["metadata"]["name"]: d for d in docs("deployment.yaml") if d["kind"] == "Deployment"}
    (container,) = deployments["gpufrac-scheduler"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{image['name']}:{image['newTag']}"
    major, minor = (int(x) for x in image["newTag"].lstrip("v").split(".")[:2])
    assert (major, minor) >= (1, 30)
    # A PodDisruptionBudget per Deployment of two replicas, as the chart renders them.
    pdbs = {d["metadata"]["name"]: d["spec"] for d in docs("pdb.yaml")}
    assert set(pdbs) == {f"gpufrac-{c}" for c in ("scheduler", "extender")} and "pdb.yaml" in kustomization["resources"]
    for name, spec in pdbs.items():
        assert spec["maxUnavailable"] == 1 and deployments[name]["spec"]["replicas"] == 2
        assert spec["selector"]["matchLabels"] == deployments[name]["spec"]["selector"]["matchLabels"]


def _lock(role: str) -> dict[str, str]:
    lines = [line for line in (ROOT / "deploy" / "requirements" / f"{role}.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    pins = dict(line.split("==") for line in lines)
    assert len(pins) == len(lines)  # one name==version a line, each name once
    return {canonicalize_name(n): v for n, v in pins.items()}


def test_the_images_lock_satisfies_what_the_package_asks() -> None:
    # Issue 53: images installed dependencies by minimum versions only. deploy/Dockerfile
    # installs the lock with --no-deps; every dependency pyproject.toml names must be in it,
    # at a version its specifier allows, and the agent's lock must hold the extender's plus
    # the [agent] extra; the extender's, the [compiled] one (numba: extender.compiled).
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {"extender": project["dependencies"] + project["optional-dependencies"]["compiled"],
              "agent": project["dependencies"] + project["optional-dependencies"]["agent"]}
    for role, requirements in wanted.items():
        pins = _lock(role)
        assert "gpufrac" not in pins and len(pins) > len(requirements)
        for text in requirements:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            assert name in pins, (role, text)
            assert req.specifier.contains(pins[name]), (role, text, pins[name])
    # The stubs stage's grpcio-tools generates code for the agent's own grpcio and protobuf.
    stubs, agent = _lock("stubs"), _lock("agent")
    assert "grpcio-tools" in stubs and all(stubs[p] == agent[p] for p in ("grpcio", "protobuf"))
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    for role in ("extender", "agent", "stubs"):
        assert f"--no-deps -r deploy/requirements/{role}.txt" in dockerfile
