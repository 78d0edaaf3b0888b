"""Start-up cost at scale: the cluster file, and cluster mode's first Node and Pod lists.

Times (wall, one process) each step a restarted extender takes before ``/readyz``:

- compiling the scoring kernels (``extender.compiled.kernels()``: numba's import and
  compile, in a child process whose ``NUMBA_CACHE_DIR`` is empty, as in the image, where
  nothing compiled is kept; ``numpy`` and no time without numba);
- loading a cluster file of ``--nodes`` synthetic 8-GPU nodes, as JSON and as YAML
  (``extender.clusterfile.load_cluster_file``: pydantic's JSON parser, libyaml's C loader);
- building the ``ClusterState`` from the node specs (``GpuCache.set_nodes``);
- reading ``--pods`` Pod objects into ``PodIntent`` (``podspec.pods.pod_intent``, what the
  pod list goes through), and accounting them (``GpuCache.set_pods``): the bound ones (placed
  first-fit up to ``--load-pct`` of the GPU share) with their ``gpufrac.io/assigned-gpus``
  record, read back and checked as after a restart; the rest pending.

The JSON transfer and decoding of the API server's list are not included (orjson, outside
gpufrac's code). Writes JSON after every step.

Run: ``python -m benchmarks bench startup [--nodes 5000] [--pods 50000]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import yaml

from benchmarks import bench_core, trace
from benchmarks.bench_http import synthetic_cluster
from benchmarks.replay import source_commit
from extender.admin_config import scoring_config
from extender.cache import GpuCache
from extender.clusterfile import load_cluster_file
from podspec import annotations as ann
from podspec.pods import pod_intent
from scoring.scorer import build_scorer
from scoring.state import ClusterState

COMPILE = ("import time; from extender import compiled; t = time.perf_counter(); k = compiled.kernels(); "
           "print(time.perf_counter() - t, k.backend)")


def compile_kernels(cache_dir: str) -> tuple[float, str]:
    """Seconds ``extender.compiled.kernels()`` takes a fresh process with nothing kept on
    disk (its import of numba included; timed in the child, so the interpreter's own start is
    not counted), and the backend it reports."""
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
    out = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, check=True,
                         timeout=600).stdout.split()
    return float(out[0]), " ".join(out[1:])


def pod_objects(specs: list[Any], n_pods: int, load_pct: float, seed: int) -> tuple[list[dict[str, Any]], int]:
    """``n_pods`` openb Pod objects: the first ones bound (first-fit to ``load_pct``), with
    their allocation record, the rest pending; and how many are bound."""
    state = ClusterState.from_nodes(specs)
    placed: list[tuple[trace.TracePod, int, tuple[int, ...]]] = []
    bench_core.fill(state, trace.load_pods(trace.DEFAULT_PODS), load_pct, np.random.default_rng(seed), placed)
    pods = [p for p in trace.load_pods(trace.DEFAULT_PODS) if p.num_gpu]
    out = []
    for i in range(n_pods):
        if i < len(placed):
            tp, row, cols = placed[i]
        else:
            tp = pods[i % len(pods)]
        pod = tp.pod_object(seed)
        pod["metadata"]["name"], pod["metadata"]["uid"] = f"p-{i}", f"u-{i}"
        if i < len(placed):
            pod["spec"]["nodeName"] = state.node_names[row]
            pod["metadata"]["annotations"][ann.ASSIGNED_GPUS] = ",".join(state.gpu_uuid[row][c] for c in cols)
            pod["status"] = {"phase": "Running"}
        out.append(pod)
    return out, min(len(placed), n_pods)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks bench startup``."""
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods", type=int, default=50000)
    p.add_argument("--load-pct", type=float, default=98.0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/startup.json"))


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a Markdown table; write JSON."""
    meta = {"machine": f"{platform.machine()}, {platform.system()}", "python": platform.python_version(),
            "commit": source_commit(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "nodes": args.nodes, "pods": args.pods}
    steps: list[dict[str, Any]] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def timed(step: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        result = fn()
        steps.append({"step": step, "seconds": round(time.perf_counter() - t0, 3)})
        args.out.write_text(json.dumps({"meta": meta, "steps": steps}, indent=1))
        print(f"{step}: {steps[-1]['seconds']:.2f} s", flush=True)
        return result

    with tempfile.TemporaryDirectory() as tmp:
        seconds, used = compile_kernels(tmp)
        steps.append({"step": f"scoring kernels ({used}, nothing kept on disk)", "seconds": round(seconds, 3)})
        print(f"{steps[-1]['step']}: {seconds:.2f} s", flush=True)
        as_json = synthetic_cluster(Path(tmp) / "cluster.json", args.nodes)
        as_yaml = Path(tmp) / "cluster.yaml"
        as_yaml.write_text(yaml.safe_dump(orjson.loads(as_json.read_bytes()), sort_keys=False))
        specs = timed(f"cluster file, JSON, {args.nodes:,} nodes", lambda: load_cluster_file(as_json))
        timed(f"cluster file, YAML, {args.nodes:,} nodes", lambda: load_cluster_file(as_yaml))
    objects, bound = pod_objects(specs, args.pods, args.load_pct, seed=1)
    cache = GpuCache(build_scorer(scoring_config("default")))
    timed(f"node set ({args.nodes:,} nodes, {8 * args.nodes:,} GPUs)", lambda: cache.set_nodes(specs))
    intents = timed(f"pod list read ({args.pods:,} Pods)", lambda: [pod_intent(o) for o in objects])
    timed(f"pod list accounted ({bound:,} bound with records, {args.pods - bound:,} pending)",
          lambda: cache.set_pods(intents))
    summary = cache.summary()
    meta["pods_bound"], meta["overcommitted"] = summary["pods_bound"], summary["pods_overcommitted"]
    args.out.write_text(json.dumps({"meta": meta, "steps": steps}, indent=1))
    print("| step | seconds |\n|---|---|")
    for s in steps:
        print(f"| {s['step']} | {s['seconds']:.2f} |")
    return 0

