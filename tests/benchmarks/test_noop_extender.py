"""The no-op extender the cost benchmarks compare against, started as they start it."""

from __future__ import annotations

import httpx

from benchmarks.bench_http import start_noop


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
