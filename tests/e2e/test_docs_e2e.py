"""Every shell command of the README, docs/ and deploy/README is run by a test, or exempt
with the reason this machine cannot run it (``harness/docs.py``); the ones no other
test runs are run here, as written.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import docs
from harness.controlplane import ControlPlane
from harness.processes import LOOPBACK, ROOT, free_port, start, wait_until

pytestmark = pytest.mark.e2e

PRODUCT = ("pyproject.toml", "README.md", "scoring", "extender", "podspec", "agent")
SERVER_NAME = "gpufrac-extender.gpufrac-system.svc"  # the name deploy/README's certificate carries


def test_every_docs_command_is_run_by_a_test_or_exempt_with_a_reason() -> None:
    keys = list(docs.RUN_BY) + list(docs.EXEMPT)
    unaccounted, ambiguous = [], []
    used: set[tuple[str, str]] = set()
    for doc in docs.DOCS:
        for command in docs.commands(doc):
            matches = [k for k in keys if k[0] == doc and command.startswith(k[1])]
            if not matches:
                unaccounted.append((doc, command))
            elif len(matches) > 1:
                ambiguous.append((doc, command, matches))
            used.update(matches)
    assert unaccounted == [], "add a test that runs these (harness/docs.py RUN_BY), or say why not (EXEMPT)"
    assert ambiguous == []
    assert set(keys) - used == set(), "entries for commands the docs no longer have"
    # The file named as the runner takes that command from the doc by its start.
    for (doc, start_text), runner in docs.RUN_BY.items():
        text = (ROOT / runner).read_text()
        assert start_text.split(" -")[0].split(" &&")[0] in text or start_text in text, (doc, start_text, runner)
    assert all(len(why) > 40 for why in docs.EXEMPT.values())


def test_the_readmes_install_command_is_install_mds() -> None:
    """README's install lines are the ones the tests run from docs/install.md (the package
    installed by test_install_e2e, the release script by harness/images.py)."""
    for line in ("deploy/release.sh ", "helm install gpufrac"):
        assert docs.command("README.md", line) == docs.command("docs/install.md", line)


def test_ci_runs_the_readme_test_command() -> None:
    command = docs.command("README.md", 'python3 -m venv .venv && .venv/bin/pip install -q -e ".[dev]"')
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_readme_demo_command_works_in_a_fresh_checkout(tmp_path: Path) -> None:
    """README command 1, as written, in a copy of the product files (a new venv, pip)."""
    for name in PRODUCT:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "_v1beta1"))
        else:
            shutil.copy(src, tmp_path / name)
    command = docs.command("README.md", "python3 -m venv .venv && .venv/bin/pip install -q -e . &&")
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "3 nodes, 10 GPUs" in proc.stdout and "Next: docs/install.md" in proc.stdout


def test_endpoints_doc_looks_at_a_running_standalone_gpufrac() -> None:
    """docs/endpoints.md's standalone commands as written (serve on openb's node list, curl,
    ``inspect --url``), on a free port instead of 8888."""
    port = str(free_port())
    serve, ready, nodes, inspect = (docs.command("docs/endpoints.md", start).replace("8888", port) for start in (
        "gpufrac serve --cluster-file", "curl -s http://127.0.0.1:8888/readyz", "curl -s http://127.0.0.1:8888/nodes",
        "gpufrac inspect --url"))
    script = (f"{serve}\ntrap 'kill %1' EXIT\n"
              f"for i in $(seq 100); do {ready} >/dev/null && break; sleep 0.2; done\n"
              f"{ready}; echo; {nodes}; echo; {inspect}\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    readyz, head, table = proc.stdout.split("\n", 2)
    assert json.loads(readyz)["nodes"] == 1213 and head.startswith('[{"name":')
    assert table.splitlines()[0].startswith("NODE") and "openb-node-0227" in table
    assert "1 nodes, " in table and "0.000 GPUs allocated" in table


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own: deploy/README's commands create gpufrac-system as written."""
    cp = ControlPlane.up(Path(tmp_path_factory.mktemp("docs-kube")))
    yield cp
    cp.down()


def sh(cp: ControlPlane, command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return docs.run(command, cp.admin_kubeconfig, (cp.bins["kubectl"],), cwd=cwd, timeout_s=120)


def test_deploy_readme_certificates_secrets_and_kustomize(bare_cluster: ControlPlane, tmp_path: Path) -> None:
    """deploy/README.md's openssl and kubectl commands as written (in a scratch directory, where
    the certificates land), then ``kubectl apply -k deploy/base`` and ``gpufrac inspect`` from
    the repository root. The certificates must give mutual TLS that works: gpufrac serving
    with the Secret's files, a client with the scheduler's, checking the server's name."""
    cp = bare_cluster
    for command in docs.block("deploy/README.md", ("openssl ", "kubectl create namespace gpufrac-system",
                                                   "kubectl -n gpufrac-system create secret")):
        sh(cp, command, tmp_path)
    sh(cp, docs.command("deploy/README.md", "kubectl apply -k deploy/base"), ROOT)
    assert cp.kubectl("get", "deploy", "gpufrac-extender", "-n", "gpufrac-system", "-o", "name").stdout.strip()
    table = sh(cp, docs.command("deploy/README.md", "gpufrac inspect"), ROOT).stdout
    assert "0 nodes" in table, table  # the API answered: a cluster with no GPU node yet

    # The Secrets hold what the Deployment mounts: check them against a gpufrac serving them.
    files = {}
    for secret in ("gpufrac-extender-tls", "gpufrac-scheduler-client-tls"):
        data = json.loads(cp.kubectl("get", "secret", secret, "-n", "gpufrac-system", "-o", "json").stdout)["data"]
        for key in ("tls.crt", "tls.key", "ca.crt"):
            files[(secret, key)] = tmp_path / f"{secret}-{key}"
            files[(secret, key)].write_bytes(base64.b64decode(data[key]))
    port = free_port()
    server = start("gpufrac-tls", [
        sys.executable, "-m", "extender", "serve", "--mode", "standalone", "--host", LOOPBACK, "--port", str(port),
        "--tls-cert-file", str(files[("gpufrac-extender-tls", "tls.crt")]),
        "--tls-key-file", str(files[("gpufrac-extender-tls", "tls.key")]),
        "--tls-client-ca-file", str(files[("gpufrac-extender-tls", "ca.crt")])], tmp_path)
    try:
        def get(with_client_cert: bool) -> str:
            ctx = ssl.create_default_context(cafile=str(files[("gpufrac-scheduler-client-tls", "ca.crt")]))
            if with_client_cert:
                ctx.load_cert_chain(str(files[("gpufrac-scheduler-client-tls", "tls.crt")]),
                                    str(files[("gpufrac-scheduler-client-tls", "tls.key")]))
            with socket.create_connection((LOOPBACK, port), timeout=5) as raw, \
                    ctx.wrap_socket(raw, server_hostname=SERVER_NAME) as tls:
                tls.sendall(f"GET /healthz HTTP/1.1\r\nHost: {SERVER_NAME}\r\nConnection: close\r\n\r\n".encode())
                return tls.recv(4096).decode(errors="replace")
        assert wait_until(lambda: get(True).startswith("HTTP/1.1 200"), 30, "gpufrac over mutual TLS", server)
        # No client certificate: refused in the handshake (TLS 1.3: an alert or EOF at the first read).
        try:
            refused = get(False)
        except (ssl.SSLError, ConnectionError) as exc:
            refused = repr(exc)
        # Same server, same request: only the missing certificate differs, and no HTTP answer comes.
        assert not refused.startswith("HTTP/"), refused
    finally:
        server.stop()
