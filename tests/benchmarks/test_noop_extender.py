"""The no-op extender the cost benchmarks compare against, started as they start it."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from benchmarks.bench_http import start_noop
from benchmarks.bench_scheduler import tcp_passive_opens
from benchmarks.extender_client import REPO_ROOT, wait_ok
from harness.controlplane import ExtenderTls
from harness.pki import make_pki
from harness.processes import LOOPBACK, free_port


def test_noop_extender_passes_every_node_and_scores_them_zero() -> None:
    # `python -m benchmarks noop-extender PORT`, as bench http and bench scheduler run it.
    proc, client = start_noop()
    try:
        base = client.url
        args = {"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a", "b"]}
        got = httpx.post(f"{base}/filter", json=args, timeout=10).json()
        assert got["NodeNames"] == ["a", "b"] and got["FailedNodes"] == {} and got["Error"] == ""
        ranked = httpx.post(f"{base}/prioritize", json=args, timeout=10).json()
        assert ranked == [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 0}]
        assert httpx.post(f"{base}/bind", json={}, timeout=10).status_code == 404  # binds only with --bind
    finally:
        client.http.close()
        proc.terminate()
        proc.wait(timeout=30)


def test_noop_extender_over_mutual_tls_answers_only_clients_with_a_certificate(tmp_path: Path) -> None:
    # `noop-extender PORT --tls CERT KEY CLIENT_CA`, as `bench scheduler --transports tls` runs it.
    tls = ExtenderTls.of(make_pki(tmp_path / "pki"))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks", "noop-extender", str(port),
                             "--tls", str(tls.cert), str(tls.key), str(tls.client_ca)], cwd=REPO_ROOT)
    url = f"https://{LOOPBACK}:{port}"
    try:
        wait_ok(proc, f"{url}/healthz", 60, "no-op extender", tls.client_context())
        args = {"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a"]}
        got = httpx.post(f"{url}/filter", json=args, timeout=10, verify=tls.client_context()).json()
        assert got["NodeNames"] == ["a"]
        no_certificate = ssl.create_default_context(cafile=str(tls.client_ca))
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            httpx.post(f"{url}/filter", json=args, timeout=10, verify=no_certificate)
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            httpx.get(f"http://{LOOPBACK}:{port}/healthz", timeout=5)  # plain HTTP is not spoken
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_tcp_passive_opens_counts_an_accepted_connection() -> None:
    with socket.create_server((LOOPBACK, 0)) as server:
        before = tcp_passive_opens()
        with socket.create_connection(server.getsockname()):
            conn, _ = server.accept()
            conn.close()
        # Machine-wide: other processes may accept connections meanwhile, never fewer.
        assert tcp_passive_opens() >= before + 1
