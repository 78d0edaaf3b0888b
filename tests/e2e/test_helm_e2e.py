"""The Helm chart (deploy/helm/gpufrac) and the kustomize bases, installed into the real
kube-apiserver: lint, render, server-side apply, and what each service account may do,
asked of the API server with SubjectAccessReviews.

The session's control plane has no controller-manager, so here Deployments and the
DaemonSet create no pods: what is checked is that the API server accepts every object and
that RBAC grants each component what it calls, and no more. ``test_install_e2e.py`` installs
the chart with ``helm install`` on a cluster that runs its pods.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from harness import docs
from harness.helm import build_helm, helm
from harness.processes import ROOT
from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e

CHART = ROOT / "deploy" / "helm" / "gpufrac"
NS = "gpufrac-system"
CLAIMS = "gpufrac-claims"

# (verb, resource, subresource, namespace, name): must be allowed / must be denied
SCHEDULER_MAY = [
    ("get", "configmaps", "", "kube-system", "extension-apiserver-authentication"),
    ("list", "pods", "", "", ""), ("watch", "nodes", "", "", ""),
    ("create", "pods", "binding", "default", ""),
    ("create", "leases", "", NS, ""), ("update", "leases", "", NS, "gpufrac-scheduler"),
    ("create", "tokenreviews", "", "", ""), ("create", "subjectaccessreviews", "", "", ""),
]
EXTENDER_MAY = [
    ("watch", "nodes", "", "", ""), ("list", "pods", "", "", ""), ("watch", "namespaces", "", "", ""),
    ("create", "pods", "binding", "team-a", ""), ("patch", "pods", "", "team-a", ""),
    ("create", "configmaps", "", CLAIMS, ""), ("update", "configmaps", "", CLAIMS, "gpufrac-claims-n1"),
    ("create", "events", "", "team-a", ""), ("get", "leases", "", NS, "gpufrac-scheduler"),
]
EXTENDER_MAY_NOT = [
    ("create", "configmaps", "", NS, ""), ("update", "configmaps", "", "kube-system", "x"),
    ("get", "secrets", "", NS, ""), ("delete", "pods", "", "team-a", ""), ("patch", "nodes", "", "", ""),
    ("update", "leases", "", NS, "gpufrac-scheduler"), ("create", "leases", "", NS, ""),
    ("get", "leases", "", "kube-system", "kube-scheduler"),
]
AGENT_MAY = [("get", "nodes", "", "", ""), ("patch", "nodes", "", "", ""), ("list", "pods", "", "", "")]
AGENT_MAY_NOT = [("delete", "pods", "", "team-a", ""), ("get", "secrets", "", NS, ""),
                 ("create", "pods", "binding", "team-a", "")]


def allowed(cl: Cluster, account: str, check: tuple[str, str, str, str, str]) -> bool:
    """A SubjectAccessReview for ``account`` (a service account of NS) doing ``check``."""
    verb, resource, sub, namespace, name = check
    group = "coordination.k8s.io" if resource == "leases" else (
        "authentication.k8s.io" if resource == "tokenreviews" else
        "authorization.k8s.io" if resource == "subjectaccessreviews" else "")
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=f"system:serviceaccount:{NS}:{account}",
        groups=["system:serviceaccounts", f"system:serviceaccounts:{NS}", "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(
            verb=verb, group=group, resource=resource, subresource=sub or None,
            namespace=namespace or None, name=name or None)))
    auth = client.AuthorizationV1Api(cl.api.api_client)
    return bool(auth.create_subject_access_review(review).status.allowed)


def assert_grants(cl: Cluster) -> None:
    """Every component may do what it calls, and the extender and agent nothing more."""
    denied = [(a, c) for a, checks in (("gpufrac-scheduler", SCHEDULER_MAY), ("gpufrac-extender", EXTENDER_MAY),
                                       ("gpufrac-agent", AGENT_MAY)) for c in checks if not allowed(cl, a, c)]
    assert denied == []
    over = [(a, c) for a, checks in (("gpufrac-extender", EXTENDER_MAY_NOT), ("gpufrac-agent", AGENT_MAY_NOT))
            for c in checks if allowed(cl, a, c)]
    assert over == []


@pytest.fixture
def clean_admission(cluster: Cluster) -> Iterator[None]:
    """The installs apply gpufrac's admission policies for real; the suite's own gpufrac binds
    as the admin, which they refuse: remove them afterwards."""
    yield
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        cluster.cp.kubectl("delete", kind, "gpufrac-pods", "gpufrac-bindings", "gpufrac-gpu-models",
                           "--ignore-not-found")


def render(*values: str) -> list[dict[str, Any]]:
    out = helm("template", "gpufrac", str(CHART), "--namespace", NS, "--kube-version", "1.36.3",
               *[a for v in values for a in ("--set", v)]).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_helm_lint_passes_strict() -> None:
    proc = helm("lint", str(CHART), "--strict", "--kube-version", "1.36.3", check=False)
    assert proc.returncode == 0 and "0 chart(s) failed" in proc.stdout, proc.stdout + proc.stderr


def test_chart_values_switch_the_optional_parts() -> None:
    kinds = {d["kind"] for d in render()}
    assert "ServiceMonitor" not in kinds and "DaemonSet" in kinds
    full = render("metrics.serviceMonitor.enabled=true", "metrics.dashboard.enabled=true")
    (board,) = [d for d in full if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpufrac-dashboard"]
    assert board["data"]["gpufrac.json"] == (CHART / "dashboards" / "gpufrac.json").read_text().rstrip("\n")
    assert any(d["kind"] == "ServiceMonitor" for d in full)
    assert "PrometheusRule" not in {d["kind"] for d in full}
    (rule,) = [d for d in render("metrics.prometheusRule.enabled=true") if d["kind"] == "PrometheusRule"]
    assert rule["spec"] == yaml.safe_load((CHART / "rules" / "gpufrac-rules.yaml").read_text())
    bare = {d["kind"] for d in render("agent.enabled=false", "admissionPolicy.enabled=false")}
    assert "DaemonSet" not in bare and "ValidatingAdmissionPolicy" not in bare


def test_the_dra_driver_value_mounts_kubelets_plugin_dirs_and_grants_reading_claims() -> None:
    def agent_of(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
        (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpufrac-agent"]
        return ds["spec"]["template"]["spec"], role["rules"]
    dra = render("agent.draDriver=true")
    spec, rules = agent_of(dra)
    (device_class,) = [d for d in dra if d["kind"] == "DeviceClass"]
    assert device_class["spec"]["selectors"] == [{"cel": {"expression": 'device.driver == "gpu.gpufrac.io"'}}]
    (container,) = spec["containers"]
    assert {"--dra-driver", "--dra-registry-dir=/var/lib/kubelet/plugins_registry",
            "--dra-plugin-dir=/var/lib/kubelet/plugins/gpu.gpufrac.io", "--cdi-dir=/var/run/cdi"} <= set(
        container["command"])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    for name in ("plugins-registry", "dra-plugin", "cdi"):
        assert mounts[name] == paths[name]  # the host's own path, as kubelet and containerd see it
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]} in rules
    # The extender counts the claims' shares in its book (one book), and may watch them.
    extender, extender_rules = extender_of(dra)
    assert "--resource-claims" in extender["command"]
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list", "watch"]} in extender_rules
    off = render()
    spec, rules = agent_of(off)
    assert "DeviceClass" not in {d["kind"] for d in off}
    assert not any("dra" in a for a in spec["containers"][0]["command"])
    assert not any("resource.k8s.io" in r.get("apiGroups", []) for r in rules)
    policies = {d["metadata"]["name"] for d in dra if d["kind"] == "ValidatingAdmissionPolicy"}
    assert "gpufrac-resourceclaims" in policies  # claims checked when written (test_dra_e2e.py)
    assert "gpufrac-resourceclaims" not in {d["metadata"]["name"] for d in render(
        "agent.draDriver=true", "admissionPolicy.enabled=false") if d["kind"] == "ValidatingAdmissionPolicy"}
    assert "gpufrac-resourceclaims" not in {d["metadata"]["name"] for d in off if d["kind"] == "ValidatingAdmissionPolicy"}
    extender, extender_rules = extender_of(off)
    assert "--resource-claims" not in extender["command"]
    assert not any("resource.k8s.io" in r.get("apiGroups", []) for r in extender_rules)


def test_allocate_claims_drops_dynamic_resources_from_the_profile_and_grants_the_claim_writes() -> None:
    from tests.e2e.test_dra_node_e2e import ALLOCATE_CLAIMS_PLUGINS

    docs = render("agent.draDriver=true", "extender.allocateClaims=true")
    extender, rules = extender_of(docs)
    assert "--allocate-claims" in extender["command"] and "--resource-claims" not in extender["command"]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpufrac-scheduler-config"]
    (profile,) = yaml.safe_load(cm["data"]["scheduler-config.yaml"])["profiles"]
    assert profile["plugins"] == ALLOCATE_CLAIMS_PLUGINS  # what the e2e tests' kube-scheduler runs
    for rule in ({"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list", "watch"]},
                 {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "update"]},
                 {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status", "resourceclaims/binding"],
                  "verbs": ["update"]}):
        assert rule in rules
    (off,) = [d for d in render("agent.draDriver=true") if d["kind"] == "ConfigMap"
              and d["metadata"]["name"] == "gpufrac-scheduler-config"]
    assert "plugins" not in yaml.safe_load(off["data"]["scheduler-config.yaml"])["profiles"][0]
    refused = helm("template", "gpufrac", str(CHART), "--kube-version", "1.36.3", "--set", "extender.allocateClaims=true",
                   check=False)
    assert refused.returncode != 0 and "extender.allocateClaims needs agent.draDriver" in refused.stderr


def extender_of(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The extender's container and its ClusterRole's rules in a render."""
    (deploy,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpufrac-extender"]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpufrac-extender"]
    (container,) = [c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "gpufrac"]
    return container, role["rules"]


def test_cert_manager_mode_renders_the_same_objects_every_time() -> None:
    # GitOps tools render with `helm template`: generated certificates change on every render,
    # cert-manager's Certificates do not.
    on = ("extender.tls.generate=false", "extender.tls.certManager.enabled=true")
    first, second = render(*on), render(*on)
    assert first == second
    certs = {d["metadata"]["name"]: d["spec"] for d in first if d["kind"] == "Certificate"}
    assert set(certs) == {"gpufrac-ca", "gpufrac-extender", "gpufrac-scheduler-client"}
    assert certs["gpufrac-extender"]["secretName"] == "gpufrac-extender-tls"
    assert "gpufrac-extender.gpufrac-system.svc" in certs["gpufrac-extender"]["dnsNames"]
    assert certs["gpufrac-scheduler-client"]["secretName"] == "gpufrac-scheduler-client-tls"
    assert certs["gpufrac-extender"]["issuerRef"] == certs["gpufrac-scheduler-client"]["issuerRef"] == {
        "name": "gpufrac-ca", "kind": "Issuer"}
    assert not [d for d in first if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-tls")]
    generated = ("extender.tls.generate=true",)
    assert [d for d in render(*generated) if d["kind"] == "Secret"] != [d for d in render(*generated)
                                                                       if d["kind"] == "Secret"]
    theirs = render(*on, "extender.tls.certManager.issuerRef.name=corp",
                    "extender.tls.certManager.issuerRef.kind=ClusterIssuer")
    assert {d["spec"]["issuerRef"]["name"] for d in theirs if d["kind"] == "Certificate"} == {"corp"}
    assert not [d for d in theirs if d["kind"] == "Issuer"]
    assert "needs extender.tls.generate=false" in render_error("--set", "extender.tls.certManager.enabled=true")


def test_the_packaged_chart_renders_what_the_folder_does(tmp_path: Path) -> None:
    # docs/install.md's packaging command as written, run where deploy/ is the repository's
    # (a link) so that its dist/ lands in the test's directory; the package lints and renders
    # exactly what the folder does.
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")
    command = docs.command("docs/install.md", "helm package deploy/helm/gpufrac")
    docs.run(command, tmp_path / "no-kubeconfig", (build_helm(),), cwd=tmp_path)
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    package = tmp_path / "dist" / f"gpufrac-{version}.tgz"
    assert package.is_file()
    lint = helm("lint", str(package), "--strict", "--kube-version", "1.36.3", check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    on = ("--set", "extender.tls.generate=false", "--set", "extender.tls.certManager.enabled=true")
    from_package = helm("template", "gpufrac", str(package), "--namespace", NS, "--kube-version", "1.36.3", *on)
    from_folder = helm("template", "gpufrac", str(CHART), "--namespace", NS, "--kube-version", "1.36.3", *on)
    assert from_package.stdout == from_folder.stdout


def test_the_chart_accepts_global_values_as_a_dependency_does() -> None:
    # A parent chart passes `global` to its dependencies: the schema must not refuse it.
    assert any(d["kind"] == "Deployment" for d in render("global.imageRegistry=registry.example"))


def test_the_claims_namespace_is_kept_by_helm_uninstall() -> None:
    # docs/install.md: "the claim ledgers (created by the chart, kept by helm uninstall)".
    (ns,) = [d for d in render() if d["kind"] == "Namespace" and d["metadata"]["name"] == "gpufrac-claims"]
    assert ns["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_scheduler_config_and_rbac_rules_are_the_same_as_kustomizes() -> None:
    """One product, two install paths: the chart's kube-scheduler config and ClusterRoles in
    the default namespace are deploy/base's."""
    docs = render()
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpufrac-scheduler-config"]
    chart_cfg = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    assert chart_cfg == yaml.safe_load((ROOT / "deploy" / "base" / "scheduler-config.yaml").read_text())
    base = [d for f in ("base/rbac.yaml", "agent/rbac.yaml")
            for d in yaml.safe_load_all((ROOT / "deploy" / f).read_text()) if d]
    rules = {d["metadata"]["name"]: d["rules"] for d in base if d["kind"] in ("ClusterRole", "Role")}
    assert {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] in ("ClusterRole", "Role")} == rules
    # the bindings (names, namespaces, roles, subjects) and the admission policies: the
    # chart's templates are copies of deploy/base's with the namespace and scheduler name
    # as values, and must not drift from them
    base += [d for d in yaml.safe_load_all((ROOT / "deploy" / "base" / "admission-policy.yaml").read_text()) if d]

    def same(d: dict[str, Any]) -> tuple[str, str, str | None, str]:
        body = {k: d[k] for k in ("roleRef", "subjects", "spec") if k in d}
        return d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"), json.dumps(body, sort_keys=True)
    kinds = ("ClusterRoleBinding", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    assert sorted(same(d) for d in docs if d["kind"] in kinds) == sorted(same(d) for d in base if d["kind"] in kinds)
    # The PodDisruptionBudgets: the same names and budgets (the chart's selector adds the
    # release's instance label, which kustomize has no counterpart of).
    base_pdbs = {d["metadata"]["name"]: d["spec"]["maxUnavailable"]
                 for d in yaml.safe_load_all((ROOT / "deploy" / "base" / "pdb.yaml").read_text()) if d}
    assert {d["metadata"]["name"]: d["spec"]["maxUnavailable"] for d in docs
            if d["kind"] == "PodDisruptionBudget"} == base_pdbs


def test_helm_chart_installs_into_the_real_api_server(cluster: Cluster, tmp_path: Path,
                                                      clean_admission: None) -> None:
    docs = render("metrics.dashboard.enabled=true")
    rendered = tmp_path / "gpufrac.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    cluster.cp.kubectl("create", "namespace", NS, check=False)
    out = cluster.cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager", "helm",
                             "-f", str(rendered), "-o", "name").stdout.split()
    assert len(out) == len(docs)
    for d in docs:
        meta = d["metadata"]
        args = ["get", f"{d['kind'].lower()}", meta["name"], "-o", "name"]
        if meta.get("namespace"):
            args += ["-n", meta["namespace"]]
        assert cluster.cp.kubectl(*args).stdout.strip()
    assert_grants(cluster)


def test_kustomize_installs_and_grants_the_same(cluster: Cluster, clean_admission: None) -> None:
    for base in ("base", "agent"):
        cluster.cp.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(ROOT / "deploy" / base))
    assert_grants(cluster)


def render_error(*args: str) -> str:
    """helm template's error for ``args`` (it must fail)."""
    proc = helm("template", "gpufrac", str(CHART), "--namespace", NS, "--kube-version", "1.36.3", *args, check=False)
    assert proc.returncode != 0, proc.stdout[:500]
    return proc.stderr


def test_bad_values_fail_with_the_schemas_message() -> None:
    err = render_error("--set", "extender.replicas=abc", "--set", "config.scoring.weights.nonsense=-3",
                       "--set", "extender.replica=2", "--set", "config.scoring.preset=tightest")
    assert "at '/extender/replicas': got string, want integer" in err
    assert "at '/config/scoring/weights/nonsense': minimum: got -3, want 0" in err
    assert "value must be one of 'adaptive_balance'" in err  # the strategy names
    assert "additional properties 'replica' not allowed" in err
    assert "at '/config/scoring/preset': value must be one of 'balance', 'bestfit'" in err
    # A relation between two values: the agent's heartbeat must come before the stale limit.
    err = render_error("--set", "agent.heartbeatS=500")
    assert "agent.heartbeatS (500) must be below extender.inventoryStaleAfterS (180)" in err


def test_the_values_schema_carries_the_admin_config_model() -> None:
    from extender.admin_config import config_json_schema

    committed = json.loads((CHART / "values.schema.json").read_text())
    generated = config_json_schema()
    hint = "regenerate: gpufrac config schema --values-schema deploy/helm/gpufrac/values.schema.json"
    assert committed["$defs"] == generated.pop("$defs"), hint
    assert committed["properties"]["config"] == generated, hint


@pytest.mark.parametrize(("kube_version", "tag"), [("1.36.3", "v1.36.3"), ("v1.31.4-eks-1552ad0", "v1.31.4"),
                                                   ("v1.33.2+k3s1", "v1.33.2")])
def test_the_scheduler_tag_follows_the_cluster_version(kube_version: str, tag: str) -> None:
    out = helm("template", "gpufrac", str(CHART), "--namespace", NS, "--kube-version", kube_version).stdout
    (sched,) = [d for d in yaml.safe_load_all(out) if d and d["metadata"]["name"] == "gpufrac-scheduler"
                and d["kind"] == "Deployment"]
    assert sched["spec"]["template"]["spec"]["containers"][0]["image"] == f"registry.k8s.io/kube-scheduler:{tag}"
    (pinned,) = [d for d in render("scheduler.image.tag=v1.35.0@sha256:" + "a" * 64)
                 if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpufrac-scheduler"]
    assert pinned["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":v1.35.0@sha256:" + "a" * 64)


def test_generated_tls_is_one_ca_for_both_sides() -> None:
    import base64

    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    docs = render("extender.tls.extraSANs={127.0.0.1,gpufrac.example.com}")
    secrets = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "Secret"}

    def cert(name: str, key: str) -> x509.Certificate:
        return x509.load_pem_x509_certificate(base64.b64decode(secrets[name][key]))
    server, client_cert = cert("gpufrac-extender-tls", "tls.crt"), cert("gpufrac-scheduler-client-tls", "tls.crt")
    ca = cert("gpufrac-extender-tls", "ca.crt")
    assert cert("gpufrac-scheduler-client-tls", "ca.crt") == ca
    for c in (server, client_cert):
        c.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"gpufrac-extender.{NS}.svc" in sans.get_values_for_type(x509.DNSName)
    assert "gpufrac.example.com" in sans.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    usage = client_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage
    # Bring-your-own: no Secret rendered, the pods mount the names given.
    assert not [d for d in render("extender.tls.generate=false") if d["kind"] == "Secret"]


def test_two_replicas_get_a_disruption_budget_and_spread_over_nodes() -> None:
    docs = render()
    pdbs = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PodDisruptionBudget"}
    assert pdbs == {f"gpufrac-{c}": {"maxUnavailable": 1, "selector": {"matchLabels": {
        "app.kubernetes.io/instance": "gpufrac", "app.kubernetes.io/component": c}}} for c in ("scheduler", "extender")}
    for d in docs:
        if d["kind"] == "Deployment":
            spread = d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
            assert spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"][
                "topologyKey"] == "kubernetes.io/hostname"
    single = render("extender.replicas=1", "scheduler.replicas=1")
    assert not [d for d in single if d["kind"] == "PodDisruptionBudget"]
    assert all("affinity" not in d["spec"]["template"]["spec"] for d in single if d["kind"] == "Deployment")


def test_helm_show_readme_is_the_generated_values_table() -> None:
    import runpy

    module = runpy.run_path(str(ROOT / "deploy" / "helm" / "chart_readme.py"))
    committed = (CHART / "README.md").read_text()
    assert committed == module["render"](), "regenerate: python deploy/helm/chart_readme.py > deploy/helm/gpufrac/README.md"
    shown = helm("show", "readme", str(CHART)).stdout
    assert shown.strip() == committed.strip()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for leaf in ("extender.tls.generate", "agent.timeSlicingReplicas", "mps.controlDaemon.pipeDir", "apiServer.host"):
        node = values
        for k in leaf.split("."):
            node = node[k]
        assert f"| `{leaf}` |" in committed
