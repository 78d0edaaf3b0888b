"""deploy/ stays consistent with the repository's own files (the e2e applies it for real)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "base"


def test_deployed_scheduler_config_is_the_repository_one() -> None:
    # kustomize reads files inside its folder only, so deploy/base keeps a copy.
    assert (BASE / "scheduler-config.yaml").read_text() == (ROOT / "scheduler-config.yaml").read_text()


def test_sidecar_listens_where_kube_scheduler_calls() -> None:
    cfg = yaml.safe_load((ROOT / "scheduler-config.yaml").read_text())
    (ext,) = cfg["extenders"]
    deployment = yaml.safe_load((BASE / "deployment.yaml").read_text())
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    args = containers["gpufrac"]["command"]
    assert ext["urlPrefix"] == "http://127.0.0.1:8888"
    assert "--host=127.0.0.1" in args and "--port=8888" in args and "--mode=cluster" in args
    profile = cfg["profiles"][0]["schedulerName"]
    assert profile == "gpufrac-scheduler"


def test_extender_role_grants_only_what_cluster_mode_calls() -> None:
    docs = list(yaml.safe_load_all((BASE / "rbac.yaml").read_text()))
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpufrac-extender"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    # extender/kube.py: list/watch nodes and pods, read a pod at bind, create the Binding
    # (which carries the allocation annotations), patch pending pods' requeue annotation,
    # list/watch namespaces (tenant_label).
    assert granted == {("nodes", "get"), ("nodes", "list"), ("nodes", "watch"),
                       ("pods", "get"), ("pods", "list"), ("pods", "watch"), ("pods", "patch"),
                       ("pods/binding", "create"), ("namespaces", "list"), ("namespaces", "watch")}
