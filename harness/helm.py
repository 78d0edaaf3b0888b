"""Helm for the chart tests, built from its Go module (``harness/helm/go.mod``).

Built once into the same cache as the kube binaries (``build_go_commands``), keyed by the
go.mod/go.sum pair, so a later run reuses it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.builds import build_go_commands
from harness.processes import ControlPlaneError

HARNESS = Path(__file__).resolve().parent


def helm_version() -> str:
    """The ``helm.sh/helm/v3`` version pinned in ``harness/helm/go.mod``."""
    for line in (HARNESS / "helm" / "go.mod").read_text().splitlines():
        if line.startswith("require helm.sh/helm/v3 "):
            return line.split()[-1]
    raise ControlPlaneError("harness/helm/go.mod does not require helm.sh/helm/v3")


def build_helm() -> Path:
    """Path of the ``helm`` binary, built on first use.

    Raises
    ------
    ControlPlaneError
        If ``go`` is missing or the build fails.
    """
    return build_go_commands(HARNESS / "helm", {"helm": "helm.sh/helm/v3/cmd/helm"}, f"helm-{helm_version()}")["helm"]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``helm`` with ``args`` (HOME-independent: caches under the build's temp dir)."""
    proc = subprocess.run([str(build_helm()), *args], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise ControlPlaneError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc
