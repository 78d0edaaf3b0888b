"""The shell commands of the user-facing docs, and where each one is run.

A command in the docs that no test runs is a command that will break. ``commands`` reads
every ``sh`` block of ``DOCS`` (a line ending in ``\\`` joined with the next, comment lines
and trailing ``# comments`` dropped). Every command is either run by a test, which takes it
from the doc with ``command`` (so an edited doc is what gets run), or exempt with the reason
this machine cannot run it; ``tests/e2e/test_docs_e2e.py`` checks that each command is one of
the two and that each named test names the command it runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "CONTRIBUTING.md", "deploy/README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
BLOCK = re.compile(r"^```(?:sh|bash|shell)\n(.*?)^```", re.M | re.S)
COMMENT = re.compile(r"\s+#\s.*$")

RUN_BY: dict[tuple[str, str], str] = {
    ("README.md", "python3 -m venv .venv && .venv/bin/pip install -q -e . &&"): "tests/e2e/test_docs_e2e.py",
    ("README.md", 'python3 -m venv .venv && .venv/bin/pip install -q -e ".[dev]"'): "tests/e2e/test_docs_e2e.py",
    ("deploy/README.md", "openssl "): "tests/e2e/test_docs_e2e.py",
    ("deploy/README.md", "kubectl create namespace gpufrac-system"): "tests/e2e/test_docs_e2e.py",
    ("deploy/README.md", "kubectl -n gpufrac-system create secret"): "tests/e2e/test_docs_e2e.py",
    ("deploy/README.md", "kubectl apply -k deploy/base"): "tests/e2e/test_docs_e2e.py",
    ("deploy/README.md", "gpufrac inspect"): "tests/e2e/test_docs_e2e.py",
    ("docs/install.md", "helm install gpufrac"): "tests/e2e/test_install_e2e.py",
    ("docs/dra.md", "helm install gpufrac"): "tests/e2e/test_install_e2e.py",
    ("README.md", "helm install gpufrac"): "tests/e2e/test_docs_e2e.py",
    ("README.md", "deploy/release.sh "): "tests/e2e/test_docs_e2e.py",
    ("docs/install.md", "kubectl -n gpufrac-system rollout status ds/gpufrac-agent"): "tests/e2e/test_install_e2e.py",
    ("docs/install.md", "kubectl gpufrac inspect"): "tests/e2e/test_install_e2e.py",
    ("docs/install.md", "kubectl -n gpufrac-system rollout status deploy/"): "tests/e2e/test_install_e2e.py",
    ("docs/install.md", "buildah build -f deploy/Dockerfile"): "harness/images.py",
    ("docs/install.md", "helm uninstall gpufrac"): "tests/e2e/test_install_e2e.py",
    ("docs/install.md", "helm package deploy/helm/gpufrac"): "tests/e2e/test_helm_e2e.py",
    ("docs/install.md", "deploy/release.sh "): "harness/images.py",
    ("docs/install.md", "kubectl delete namespace gpufrac-claims"): "tests/e2e/test_install_e2e.py",
    ("docs/install.md", "kubectl annotate nodes --all gpufrac.io/inventory-"): "tests/e2e/test_install_e2e.py",
    ("docs/admin.md", "gpufrac config validate --helm-values"): "tests/e2e/test_install_e2e.py",
    ("docs/admin.md", "helm upgrade gpufrac"): "tests/e2e/test_install_e2e.py",
    ("docs/admin.md", "gpufrac inspect --defrag"): "tests/e2e/test_defrag_e2e.py",
    ("docs/endpoints.md", "gpufrac serve --cluster-file"): "tests/e2e/test_docs_e2e.py",
    ("docs/endpoints.md", "curl -s http://127.0.0.1:8888/readyz"): "tests/e2e/test_docs_e2e.py",
    ("docs/endpoints.md", "curl -s http://127.0.0.1:8888/nodes"): "tests/e2e/test_docs_e2e.py",
    ("docs/endpoints.md", "gpufrac inspect --url"): "tests/e2e/test_docs_e2e.py",
    ("docs/troubleshooting.md", "kubectl -n gpufrac-system get lease gpufrac-scheduler"): "tests/e2e/test_stall_e2e.py",
    ("docs/troubleshooting.md", "kubectl -n gpufrac-system delete lease gpufrac-scheduler"):
        "tests/e2e/test_stall_e2e.py",
}
"""(doc, the start of a command) -> the file that runs it."""

EXEMPT: dict[tuple[str, str], str] = {
    ("README.md", 'python3 -m venv .venv && .venv/bin/pip install -q -e ".[bench]"'):
        "ten minutes of replay: tests/benchmarks/test_replay.py runs the same `python -m benchmarks replay` "
        "on --limit smoke runs",
    ("docs/install.md", "helm push"): "no registry here: tests/e2e/test_helm_e2e.py packages the chart with the "
                                      "doc's command and renders the package",
    ("docs/install.md", "python deploy/lock.py"):
        "rewrites the committed lock from PyPI's newest versions: tests/deploy/test_deploy.py checks the "
        "committed lock against pyproject.toml, tests/e2e/test_images_e2e.py that the images install exactly it",
    ("docs/install.md", "buildah push"): "no registry here: the suite writes the images to Docker archives for "
                                         "containerd (harness/images.py, archive)",
    ("docs/testing.md", "sudo .ci/clean-root"):
        "runs the whole suite again in a fresh Debian root (about an hour): run by hand before a stop that "
        "touches the harness, its last result written in docs/testing.md",
    ("deploy/README.md", "kubectl -n gpufrac-system rollout status deploy/"):
        "that cluster has no node for the Deployments' pods (test_install_e2e runs the chart's pods)",
}
"""(doc, the start of a command) -> why no test runs it on this machine."""


def commands(doc: str) -> list[str]:
    """The shell commands of ``doc`` (a path relative to the repository root), in order."""
    out: list[str] = []
    for block in BLOCK.findall((ROOT / doc).read_text()):
        pending = ""
        for raw in block.splitlines():
            line = raw.rstrip()
            if line.endswith("\\"):
                pending += line[:-1].rstrip() + " "
                continue
            line = (pending + line.strip()).strip()
            pending = ""
            if line and not line.startswith("#"):
                out.append(COMMENT.sub("", line))
    return out


def command(doc: str, start: str) -> str:
    """The one command of ``doc`` that begins with ``start`` (a test runs what the doc says).

    Raises
    ------
    LookupError
        None or several match: the doc changed under the test.
    """
    found = sorted({c for c in commands(doc) if c.startswith(start)})
    if len(found) != 1:
        raise LookupError(f"{doc}: expected one command starting {start!r}, found {found}")
    return found[0]


def block(doc: str, starts: tuple[str, ...]) -> list[str]:
    """Every command of ``doc`` that begins with one of ``starts``, in the doc's order."""
    return [c for c in commands(doc) if c.startswith(starts)]


def run(command: str, kubeconfig: Path, tools: Iterable[Path], cwd: Path = ROOT, check: bool = True,
        timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """Run a docs command as a user's shell would: bash in ``cwd`` (the repository root, as the
    docs' relative paths assume), the directories of ``tools`` (kubectl, helm) and this
    interpreter's console scripts (gpufrac, kubectl-gpufrac) first on PATH, ``KUBECONFIG``
    set. ``check``: a non-zero exit fails with the command's output."""
    path = os.pathsep.join([*(str(t.parent) for t in tools), str(Path(sys.executable).parent),
                            os.environ.get("PATH", "")])
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PATH": path, "KUBECONFIG": str(kubeconfig)})
    if check and proc.returncode != 0:
        raise AssertionError(f"`{command}` failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc
