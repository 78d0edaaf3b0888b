"""Latency of ``/filter`` and ``/prioritize`` over HTTP, as kube-scheduler sees it.

For each cluster (the 1,213 openb GPU nodes; a synthetic 5,000 nodes x 8 GPUs) the script
starts a standalone extender, loads it to about 70% GPU allocation with bound pods sent
through the pod-event path (the placements come from an in-process cache with the same
scorer), then times ``filter`` then ``prioritize`` for sampled openb pods, with
``nodeCacheCapable`` true (names) and false (full Node objects). Timed on the client, per
call: encoding the request, loopback transfer, the extender's work, and decoding the reply
(building the Python argument lists is left out: kube-scheduler builds them in Go). Before
timing, each extender gets one untimed filter per distinct openb pod shape (126), as a
running extender has seen them; pods are not bound between samples (``bench_core`` and
``bench_scheduler`` measure the cost of what a bind changes).

Run: ``python -m benchmarks bench http [--samples 300] [--out benchmarks/results/http-latency.json]``
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import bench_core, trace
from benchmarks.extender_client import REPO_ROOT, ExtenderClient, start_extender, wait_ok
from benchmarks.procstat import cpu_s
from benchmarks.replay import source_commit
from benchmarks.scheduler_emulation import ClusterNames
from extender.clusterfile import load_cluster_file, synthetic_uuid
from harness.processes import free_port
from podspec import annotations as ann
from scoring.specs import NodeSpec
from scoring.state import ClusterState


def synthetic_cluster(path: Path, n_nodes: int, gpus: int = 8) -> Path:
    """Write a JSON cluster file of identical ``gpus``-GPU nodes (96 cores, 768 GiB, G2-like)."""
    nodes = [{
        "name": f"syn-node-{i:05d}", "cpu_milli": 96000, "memory_mib": 786432,
        "gpus": [{"index": g, "uuid": synthetic_uuid(f"syn-node-{i:05d}", g), "model": "G2",
                  "memory_mib": 16384, "replicas": 20} for g in range(gpus)],
    } for i in range(n_nodes)]
    path.write_bytes(orjson.dumps({"nodes": nodes}))
    return path


def load_to(client: ExtenderClient, specs: list[NodeSpec], pods: list[trace.TracePod],
            target_pct: float, seed: int) -> float:
    """Bind openb pods until ``target_pct`` of the GPU share is allocated: placed first-fit on
    random nodes (``bench_core.fill``: no scoring, so 5,000 nodes load in seconds) and sent
    as bound pods with their allocation record through the pod-event path, which the
    extender accounts as it would after a restart. Returns the allocated % it reports."""
    state = ClusterState.from_nodes(specs)
    placed: list[tuple[trace.TracePod, int, tuple[int, ...]]] = []
    bench_core.fill(state, pods, target_pct, np.random.default_rng(seed), placed)
    batch: list[dict[str, Any]] = []
    for i, (tp, row, cols) in enumerate(placed):
        pod = tp.pod_object(seed)
        pod["metadata"]["name"] = f"load-{i}"
        pod["metadata"]["uid"] = f"load-{seed}-{i}"
        pod["spec"]["nodeName"] = state.node_names[row]
        pod["metadata"]["annotations"][ann.ASSIGNED_GPUS] = ",".join(state.gpu_uuid[row][c] for c in cols)
        pod["status"] = {"phase": "Running"}
        batch.append({"type": "ADDED", "object": pod})
        if len(batch) == 500:
            client.pod_events(batch)
            batch = []
    if batch:
        client.pod_events(batch)
    capacity = 1000 * sum(len(s.gpus) for s in specs)
    return 100.0 * float(client.get("readyz")["gpu_allocated_milli"]) / capacity


def time_calls(client: ExtenderClient, cluster: ClusterNames, pods: list[trace.TracePod],
               samples: int, seed: int, server_pid: int) -> tuple[dict[str, list[float]], float]:
    """Filter then prioritize (on the nodes filter passed) for sampled GPU pods, as
    kube-scheduler's cycle calls them: per-call wall times (ms) on the client, and the
    server's CPU per pod (ms, filter and prioritize together; ``/proc/<pid>/stat``)."""
    rng = np.random.default_rng(seed)
    gpu_pods = [p for p in pods if p.num_gpu]
    every = np.arange(len(cluster.names))
    out: dict[str, list[float]] = {"filter": [], "prioritize": []}
    # Warm, untimed: one filter per distinct openb pod shape, as a running extender has seen
    # them (gpufrac keeps every node's result per shape; scoring.incremental).
    shapes = {(p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib): p for p in gpu_pods}
    for k, tp in enumerate(shapes.values()):
        pod = tp.pod_object(seed)
        pod["metadata"]["uid"] = f"warm-{k}"
        client.filter(cluster.args(pod, every))
    cpu_before = cpu_s(server_pid)
    for j in range(samples):
        tp = gpu_pods[int(rng.integers(len(gpu_pods)))]
        pod = tp.pod_object(seed)
        pod["metadata"]["uid"] = f"bench-{j}"
        args = cluster.args(pod, every)
        t0 = time.perf_counter()  # timed: encode, send, extender work, receive, decode
        res = client.filter(args)
        t1 = time.perf_counter()
        passed = res.get("NodeNames")
        if passed is None:
            passed = [it["metadata"]["name"] for it in (res.get("Nodes") or {}).get("items") or []]
        if len(passed) > 1:
            args = cluster.args(pod, np.array([cluster.pos[n] for n in passed]))
            t2 = time.perf_counter()
            client.prioritize(args)
            out["prioritize"].append(1e3 * (time.perf_counter() - t2))
        out["filter"].append(1e3 * (t1 - t0))
    return out, 1e3 * (cpu_s(server_pid) - cpu_before) / samples


def start_noop() -> tuple[subprocess.Popen[bytes], ExtenderClient]:
    """The no-op extender (``benchmarks/noop_extender.py``) on a free loopback port, ready."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks", "noop-extender", str(port)], cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    wait_ok(proc, f"{url}/healthz", 60, "no-op extender")
    return proc, ExtenderClient(url)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks bench http``."""
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--load-pct", type=float, default=70.0)
    p.add_argument("--synthetic-nodes", type=int, default=5000)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/http-latency.json"))


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a Markdown table; write JSON."""
    pods = trace.load_pods(trace.DEFAULT_PODS)
    rows: list[dict[str, Any]] = []
    meta = {"machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
            "python": platform.python_version(), "samples": args.samples, "commit": source_commit()}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        # After every measured row group: a run that dies later keeps what it measured.
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    with tempfile.TemporaryDirectory() as tmp:
        clusters = {
            "openb 1,213 nodes": trace.DEFAULT_NODES,
            f"synthetic {args.synthetic_nodes:,} x 8 GPUs":
                synthetic_cluster(Path(tmp) / "syn.json", args.synthetic_nodes),
        }
        for label, path in clusters.items():
            specs = load_cluster_file(path, replicas_per_gpu=20)
            for server in ("gpufrac", "no-op extender"):
                proc, client = start_extender(path, "default", 20) if server == "gpufrac" else start_noop()
                try:
                    reached = load_to(client, specs, pods, args.load_pct, seed=7) if server == "gpufrac" else None
                    for cache_capable in (True, False):
                        cluster = ClusterNames.build(specs, cache_capable)
                        body = len(orjson.dumps(cluster.args(pods[0].pod_object(0), np.arange(len(specs)))))
                        times, cpu_ms = time_calls(client, cluster, pods, args.samples, 11, proc.pid)
                        for verb, ms in times.items():
                            a = np.array(ms) if ms else np.zeros(1)
                            rows.append({"cluster": label, "server": server, "nodeCacheCapable": cache_capable,
                                         "verb": verb, "calls": len(ms), "p50_ms": float(np.percentile(a, 50)),
                                         "p99_ms": float(np.percentile(a, 99)), "request_bytes": body,
                                         "server_cpu_ms_per_pod": cpu_ms,
                                         "gpu_allocated_pct": None if reached is None else round(reached, 1)})
                        save()
                finally:
                    client.http.close()
                    proc.terminate()
                    proc.wait(timeout=30)
    save()
    print("| cluster | server | nodeCacheCapable | verb | calls | p50 ms | p99 ms | server CPU ms per pod | request bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['cluster']} | {r['server']} | {str(r['nodeCacheCapable']).lower()} | {r['verb']} | {r['calls']} | "
              f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['server_cpu_ms_per_pod']:.2f} | {r['request_bytes']:,} |")
    return 0

