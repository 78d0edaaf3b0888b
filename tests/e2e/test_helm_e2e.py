"""The Helm chart (deploy/helm/gpufrac) and the kustomize bases, installed into the real
kube-apiserver: lint, render, server-side apply, and what each service account may do,
asked of the API server with SubjectAccessReviews.

There is no controller-manager in the suite, so Deployments and the DaemonSet create no
pods: what is checked is that the API server accepts every object and that RBAC grants each
component what it calls, and no more.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e.conftest import Cluster
from tests.harness.controlplane import ROOT
from tests.harness.helm import helm

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
]
EXTENDER_MAY_NOT = [
    ("create", "configmaps", "", NS, ""), ("update", "configmaps", "", "kube-system", "x"),
    ("get", "secrets", "", NS, ""), ("delete", "pods", "", "team-a", ""), ("patch", "nodes", "", "", ""),
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
        cluster.cp.kubectl("delete", kind, "gpufrac-pods", "gpufrac-bindings", "--ignore-not-found")


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
    bare = {d["kind"] for d in render("agent.enabled=false", "admissionPolicy.enabled=false")}
    assert "DaemonSet" not in bare and "ValidatingAdmissionPolicy" not in bare


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
