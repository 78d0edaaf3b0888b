"""What a release is made of: one version everywhere it is written, a changelog entry for it,
and the license the package declares."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_one_version_in_the_package_the_chart_and_the_kustomize_images() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((REPO / "deploy" / "helm" / "gpufrac" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == version
    images = re.findall(r"image: ghcr\.io/gpufrac/gpufrac(?:-agent)?:(\S+)",
                        (REPO / "deploy" / "base" / "deployment.yaml").read_text()
                        + (REPO / "deploy" / "agent" / "daemonset.yaml").read_text())
    assert len(images) == 2 and set(images) == {version}
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[?{re.escape(version)}\]?", changelog, re.M), f"CHANGELOG.md has no section for {version}"


def test_the_license_is_the_one_the_package_declares() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]["text"]
    assert declared == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_install_md_names_the_helm_version_the_tests_run() -> None:
    pinned = next(line.split()[-1] for line in (REPO / "harness" / "helm" / "go.mod").read_text().splitlines()
                  if line.startswith("require helm.sh/helm/v3 "))
    assert f"the tests run Helm {pinned.removeprefix('v')}" in " ".join((REPO / "docs" / "install.md").read_text().split())
